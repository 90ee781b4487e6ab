"""Order lab: which kernels run beside which in ``ssd_prefill`` (``kernels.ssd.LAUNCH_ORDER``), whole calls on the
bench workloads, one process, the peer's calls interleaved with ours.

    python scripts/order_lab.py [--rounds 3] [--reps 200] [--peer peers.vllm_ssd:provider] [--workload W ...]
                                [--order O ...]
    python scripts/order_lab.py --dry-run    # the same plumbing on the CPU (interpreter, small shapes, no timing)

For each workload, each order's call (indexed where the workload has one sequence; the snapshot path with the fused
gather, once with its fused states kernel and once with chunk state and the batched state passing, forced:
``OUR_VARIANTS``) runs once eagerly and must give the bits of the first variant's first order (by default "none":
bmm alone, right after the cumsum): output and cache. Then every call,
ours under each order and the peer's, is captured and timed by CUDA graph replay, round after round, every autotuner
tuning afresh for each round as the bench's do (``harness.bench.interleave``, ``tuned_afresh``), and the best and
median rounds are printed, with each against the peer's best.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORKLOADS = ["short-continuation", "prefill-4256", "continue-600", "mixed-3"]


# Our variants: (ssd_prefill's arguments, harness.bench.VARIANTS' name; the snapshot path's chunk count from which
# the pair runs, kernels.ssd.SNAPSHOT_PAIR_FROM, or None for the shipped rule). The snapshot path is timed with
# each of its two states kernels forced, whatever the call's chunk count: the fused kernel, and chunk state then
# the batched state passing.
OUR_VARIANTS = {
    "indexed": ("indexed", None),
    "snapshot-fused": ("snapshot-fused", 1 << 30),
    "snapshot-pair": ("snapshot-fused", 1),
}


@contextlib.contextmanager
def launch_order(order: str, pair_from: int | None = None):
    from kernels import ssd

    saved = ssd.SNAPSHOT_PAIR_FROM
    if pair_from is not None:
        ssd.SNAPSHOT_PAIR_FROM = pair_from
    try:
        with ssd.launched_in_order(order):
            yield
    finally:
        ssd.SNAPSHOT_PAIR_FROM = saved


def ordered_call(call, order: str, pair_from: int | None = None):
    """``call`` with ``LAUNCH_ORDER`` set to ``order`` (and the snapshot pair's threshold to ``pair_from``) while
    it launches (a graph captures the kernels it launched)."""
    def run():
        with launch_order(order, pair_from):
            call()
    return run


def written(inputs) -> dict:
    return {"out": inputs.out.clone(), "state cache": inputs.state_cache.clone()}


def bits_differ(got: dict, expected: dict, what: str) -> str | None:
    """The first line of the exact check's report (how many elements, max ulp) for the first tensor that differs."""
    from harness.compare import Mismatch, assert_bits_equal

    try:
        for name, tensor in got.items():
            assert_bits_equal(tensor, expected[name], what=f"{name}, {what}")
    except Mismatch as mismatch:
        return str(mismatch).splitlines()[0]
    return None


def small_case(workload: str):
    """The workload at an interpreter-sized shape with the same sequences' structure (two chunks a long sequence)."""
    from harness.bench import workload_case
    from harness.cases.model import Shape

    case = workload_case(workload)
    sequences = tuple(dataclasses.replace(s, context=min(s.context, 24), tokens=min(s.tokens, 20))
                      for s in case.sequences)
    return dataclasses.replace(case, shape=Shape(2, 16, 16, 1, 16), sequences=sequences)


def run(workloads: list[str], rounds: int, reps: int, peer_spec: str | None, dry_run: bool,
        orders: list[str] | None = None) -> list[dict]:
    import torch

    from harness.bench import VARIANTS, Entry, _call, interleave, tuned_afresh, workload_case
    from harness.cases.builder import build_inputs
    from harness.checks.providers import load_provider
    from harness.cuda_timing import GraphTimer
    from kernels import provider, ssd

    device = "cpu" if dry_run else "cuda"
    peer = load_provider(peer_spec) if peer_spec else None
    providers = [provider] + ([peer] if peer is not None else [])
    rows = []
    for workload in workloads:
        case = small_case(workload) if dry_run else workload_case(workload)
        inputs = build_inputs(case, device)
        variants = [v for v in OUR_VARIANTS if len(case.sequences) == 1 or v != "indexed"]
        entries, fns = [], []
        expected = None  # every variant and order must write the first one's bits (indexed == snapshot)
        for variant in variants:
            arguments, pair_from = VARIANTS[OUR_VARIANTS[variant][0]], OUR_VARIANTS[variant][1]
            for order in orders or ssd.LAUNCH_ORDERS:
                call = ordered_call(_call(provider, inputs, arguments), order, pair_from)
                call()
                if device == "cuda":
                    torch.cuda.synchronize()
                got = written(inputs)
                expected = got if expected is None else expected
                entry = Entry(workload, f"ours:{order}", variant, arguments)
                first = (orders or ssd.LAUNCH_ORDERS)[0]
                entry.error = bits_differ(got, expected, f"{variant} order {order!r} against {variants[0]} {first!r}")
                entries.append(entry)
                fns.append(call)
        if peer is not None:
            from harness.checks.providers import supported_paths

            paths = [p for p in sorted(supported_paths(peer)) if len(case.sequences) == 1 or p != "indexed"]
            for path in paths:
                entries.append(Entry(workload, "peer", path, {"path": path}))
                fns.append(_call(peer, inputs, {"path": path}))
        if not dry_run:
            interleave(entries, fns, rounds, GraphTimer(reps), fresh_tuning=functools.partial(tuned_afresh, providers))
        rows += [dict(workload=e.workload, side=e.side, variant=e.variant, best=e.best, median=e.median,
                      error=e.error) for e in entries]
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'workload':<20} {'side':<14} {'variant':<15} {'best us':>8} {'median':>8} {'best/peer':>9}  error")
    for r in rows:
        peers = [p["best"] for p in rows if p["workload"] == r["workload"] and p["side"] == "peer"
                 and p["best"] is not None]
        best = math.nan if r["best"] is None else r["best"]
        median = math.nan if r["median"] is None else r["median"]
        ratio = best / min(peers) if peers and r["side"] != "peer" else math.nan
        print(f"{r['workload']:<20} {r['side']:<14} {r['variant']:<15} {best:>8.1f} {median:>8.1f} {ratio:>9.3f}  "
              f"{r['error'] or ''}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append", choices=WORKLOADS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--peer", help="a provider spec timed beside ours, e.g. peers.vllm_ssd:provider")
    parser.add_argument("--order", action="append", help="orders to run (default every one of LAUNCH_ORDERS); the "
                        "first is the one whose bits every other must give")
    parser.add_argument("--dry-run", action="store_true", help="CPU, interpreter, small shapes: bits only")
    args = parser.parse_args(argv)
    if args.dry_run:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    rows = run(args.workload or WORKLOADS, args.rounds, args.reps, args.peer, args.dry_run, args.order)
    print_rows(rows)
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
