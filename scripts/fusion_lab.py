"""Fusion lab: chunk state + state passing as two kernels against the fused kernel
(``kernels.chunk_state_passing``, the snapshot path's) under candidate tile configs, on the bench workloads'
intermediates, one process: for choosing the fused kernel's checked-in tile, and for the indexed path's choice
between the pair (shipped there) and the fused kernel.

    python scripts/fusion_lab.py [--reps 200] [--workload W ...]   # GPU: bits against the pair, stability, us
    python scripts/fusion_lab.py --dry-run                          # the same plumbing on the CPU (interpreter, small)

For each workload and path (snapshot; indexed where the workload has one sequence) the pair runs chunk_state (its
checked-in config), then the state passing stage (state_passing_indexed on the indexed path, where the pair ships and
is timed; the fused kernel teacher-forced on the snapshot path, the bits only) and the fused kernel runs each
candidate config, into fresh outputs (the indexed path writes its final slot, never its initial one, so repeated
launches are idempotent). Each fused launch is compared with the pair bit for bit (workspace and cache), launched
three times (a result that moves is a race) and timed by CUDA graph replay (``harness.cuda_timing``).

On the snapshot path, ``batched<block>``: the pair the snapshot path ships for calls of many chunks (chunk state,
then ``kernels.state_passing_batched``: a program per block of states, sequence and head, each walking only its
own sequence's chunks), at each block of ``BATCHED_BLOCKS``, timed against the fused kernel and compared with the
teacher-forced pair's bits.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

# The kernel lab's machinery: variants, a call's intermediates, the exact comparison and the three-run loop.
from kernel_lab import (  # noqa: E402
    Rewrite,
    call_intermediates,
    load_variants,
    same_bits,
    small_cases,
    three_runs,
)

WORKLOADS = ["short-continuation", "prefill-4256", "continue-600", "mixed-3"]
# States a program of the shipped batched state passing walks (``kernels.state_passing_batched.BLOCK_SIZE``, forced
# here): the indexed kernel's 512, and vLLM's autotuned range.
BATCHED_BLOCKS = (256, 512, 1024, 2048)
# (BLOCK_SIZE_M headdim, BLOCK_SIZE_N dstate, BLOCK_SIZE_K tokens, warps, stages): the best of docs/gpu-runs.md
# runs 60 and 76 (64, 64, 256, 8, 2) and its neighbours with deeper pipelines, more or fewer programs (each program
# walks every chunk of one tile: a latency-bound loop, one or two programs per multiprocessor).
CANDIDATES = [(64, 64, 256, 8, 2), (64, 64, 256, 8, 3), (64, 64, 256, 4, 2), (64, 32, 256, 4, 2), (64, 32, 256, 4, 3),
              (32, 64, 256, 4, 2), (32, 64, 256, 4, 3), (64, 128, 128, 8, 2), (64, 128, 128, 8, 3),
              (64, 64, 128, 8, 4)]

# Variants of the fused kernel, rewritten from its source by the kernel lab's machinery (``kernel_lab.Rewrite``),
# each timed under every candidate against the shipped kernel's bits.
FUSED = {"fused": ("kernels.chunk_state_passing", "_chunk_state_passing_kernel")}
# A new sequence's initial state (and writeback scalars) loaded at the top of its first chunk's step, before the
# tokens, not at the chunk's end: the tile's load latency overlaps the token block instead of following it.
SWITCH = """            if seq != prev_seq:
                s = initial_state(init_ptr, tile, seq, init_slot_ptr, has_init_ptr, stride_init_row,
                                  stride_init_slot, stride_has_init, init_mode, mask).to(tl.float32)
                seq_last, seq_slot = writeback_target(last_chunk_ptr, final_idx_ptr, seq, stride_last_chunk,
                                                      stride_final_idx, write_cache)
            prev_seq = seq
"""
SEQ_LOAD = "        seq = tl.load(seq_idx_ptr + c * stride_seq_idx)  # before the tokens: its latency overlaps theirs\n"
INIT_EARLY = ((SWITCH, ""), (SEQ_LOAD, SEQ_LOAD + SWITCH.replace("\n    ", "\n")[4:]))


def fused_variants() -> dict:
    """{"shipped": the fused kernel, variant: its rewrite}."""
    return load_variants(["fused"], FUSED, {"fused": {"initearly": Rewrite((), INIT_EARLY)}})["fused"]


def config_of(c: tuple) -> dict:
    m, n, k, w, s = c
    return dict(BLOCK_SIZE_M=m, BLOCK_SIZE_N=n, BLOCK_SIZE_K=k, num_warps=w, num_stages=s)


def describe(c: tuple) -> str:
    m, n, k, w, s = c
    return f"M{m} N{n} K{k} w{w} s{s}"


def launches(kw: dict, ws: dict, path: str):
    """(pair launch, fused launch by config, the tensors each writes, and the batched pair's launch and tensors by
    row name: on the snapshot path one per ``BATCHED_BLOCKS``, else none): fresh workspace and, on the snapshot path,
    a fresh cache copy per launcher; the indexed path writes the call's cache in place (its final slot only)."""
    import torch
    import triton

    from kernels.chunk_state import chunk_state
    from kernels.chunk_state_passing import chunk_state_passing, launch_arguments, state_passing
    from kernels.state_passing_indexed import state_passing_indexed

    x, B, cu, seq_idx = kw["x"], kw["B"], kw["cu_chunk_seqlens"], kw["seq_idx"]
    dA, dt_out = ws["dA_cumsum"], ws["dt_out"]
    pair_out, fused_out = torch.empty_like(ws["states"]), torch.empty_like(ws["states"])
    if path == "indexed":
        pair_cache = fused_cache = kw["state_cache"]
    else:
        pair_cache, fused_cache = kw["state_cache"].clone(), kw["state_cache"].clone()

    def pair():
        states = chunk_state(B, x, dt_out, dA, cu)
        if path == "indexed":
            state_passing_indexed(states, dA, state_cache=pair_cache, init_slot_index=kw["initial_state_indices"][:1],
                                  has_initial_state=kw["has_initial_states"][:1],
                                  final_slot_index=kw["final_state_indices"][:1], out=pair_out)
        else:
            pair_out.copy_(state_passing(states, dA, seq_idx, initial_states=ws["initial_states"],
                                         out_dtype=pair_out.dtype, state_cache=pair_cache,
                                         final_state_indices=kw["final_state_indices"],
                                         last_chunk_indices=kw["last_chunk_indices"]))

    init = (dict(initial_state_indices=kw["initial_state_indices"][:1],
                 has_initial_states=kw["has_initial_states"][:1]) if path == "indexed"
            else dict(initial_states=ws["initial_states"]))

    def fused(config: dict, kernel=None):
        """The shipped launcher, or ``kernel`` (a variant) launched with the launcher's arguments."""
        if kernel is None:
            chunk_state_passing(B, x, dt_out, dA, cu, seq_idx, out=fused_out, state_cache=fused_cache,
                                final_state_indices=kw["final_state_indices"],
                                last_chunk_indices=kw["last_chunk_indices"], config=config, **init)
            return
        args = launch_arguments(B, x, dt_out, dA, cu, seq_idx, out=fused_out, state_cache=fused_cache,
                                final_state_indices=kw["final_state_indices"],
                                last_chunk_indices=kw["last_chunk_indices"], config=config, **init)
        P, N = x.shape[2], B.shape[2]
        kernel[(triton.cdiv(P, config["BLOCK_SIZE_M"]) * triton.cdiv(N, config["BLOCK_SIZE_N"]), x.shape[1])](**args)

    batched = {}
    if path == "snapshot":
        from kernels import state_passing_batched as spb

        for block in BATCHED_BLOCKS:
            out, cache = torch.empty_like(ws["states"]), kw["state_cache"].clone()

            def batched_pair(out=out, cache=cache, block=block):
                states = chunk_state(B, x, dt_out, dA, cu)
                shipped, spb.BLOCK_SIZE = spb.BLOCK_SIZE, block  # read by its launch_arguments at each launch
                try:
                    spb.state_passing_batched(states, dA, kw["last_chunk_indices"], initial_states=ws["initial_states"],
                                              out=out, state_cache=cache, final_state_indices=kw["final_state_indices"])
                finally:
                    spb.BLOCK_SIZE = shipped

            batched[f"batched{block}"] = (batched_pair, (out, cache))
    return pair, fused, (pair_out, pair_cache), (fused_out, fused_cache), batched


def run(workloads: list[str], reps: int, dry_run: bool, like: list[str] | None = None) -> list[tuple]:
    from harness.bench import workload_case
    from harness.cuda_timing import time_graph

    if dry_run:
        def time_graph(fn, reps):  # noqa: F811
            fn()
            return 0.0

    device = "cpu" if dry_run else "cuda"
    if dry_run:  # chunks of two token blocks, the last one short: the flat loop's masked block and chunk ends
        cases = {name: dataclasses.replace(case, shape=dataclasses.replace(case.shape, chunk_size=32))
                 for name, case in small_cases().items()}
    else:
        cases = {w: workload_case(w) for w in workloads}
    candidates = [(16, 16, 16, 4, 3), (16, 32, 32, 4, 3)] if dry_run else CANDIDATES
    if like:
        candidates = [c for c in candidates if describe(c).startswith(tuple(like))]
    variants = fused_variants()
    rows = []
    for workload, case in cases.items():
        for path in ("snapshot", "indexed") if len(case.sequences) == 1 else ("snapshot",):
            kw, ws = call_intermediates(case, device, path)
            pair, fused, pair_outs, fused_outs, batched = launches(kw, ws, path)
            pair()
            expected = [o.clone() for o in pair_outs]
            tag = f"{workload}/{path}"
            if path == "indexed":  # the path that ships the pair: its time is the fused kernel's to beat
                rows.append((tag, "pair", "chunk_state + state_passing", time_graph(pair, reps), "-", True))
            else:  # the pair with the teacher-forced fused kernel: the bits only
                rows.append((tag, "pair", "chunk_state + teacher-forced", math.nan, "-", True))
                for kind, (batched_pair, outs) in batched.items():
                    results = three_runs(batched_pair, list(outs), [outs[0]], device)
                    stable = all(same_bits(r, results[0]) for r in results)
                    rows.append((tag, kind, f"chunk_state + state_passing_{kind}", time_graph(batched_pair, reps),
                                 str(same_bits(results[0], expected)), stable))
            for cand in candidates:
                for name, kernel in variants.items():
                    label = describe(cand) if name == "shipped" else f"{describe(cand)} {name}"
                    launch = functools.partial(fused, config_of(cand), None if name == "shipped" else kernel)
                    try:  # the workspace poisoned before each run; the cache is what the call writes into
                        results = three_runs(launch, list(fused_outs), [fused_outs[0]], device)
                        us = time_graph(launch, reps)
                    except Exception as exc:  # out of resources, a compile error: reported, the rest go on
                        rows.append((tag, "fused", f"{label} ({type(exc).__name__}: {str(exc)[:40]})", math.nan,
                                     "-", False))
                        continue
                    stable = all(same_bits(r, results[0]) for r in results)
                    rows.append((tag, "fused", label, us, str(same_bits(results[0], expected)), stable))
    return rows


def print_rows(rows: list[tuple]) -> None:
    print(f"{'workload/path':<28} {'kernel':<6} {'config':<30} {'us':>8} {'bits=pair':>9} {'stable':>6}")
    for tag, kind, config, us, same, stable in rows:
        print(f"{tag:<28} {kind:<6} {config:<30} {us:>8.1f} {same:>9} {str(stable):>6}")
    print("== per workload/path: the pair (timed where it ships; on the snapshot path the batched pair at each block, "
          "its bits against the pair's), and the fastest three fused configs (stable only)")
    tags = dict.fromkeys(r[0] for r in rows)
    for tag in tags:
        pair = [r for r in rows if r[0] == tag and r[1] == "pair"][0]
        batched = [f"{r[1]} {r[3]:.1f} ({r[4]}, stable {r[5]})" for r in rows
                   if r[0] == tag and r[1] not in ("pair", "fused")]
        best = sorted((r for r in rows if r[0] == tag and r[1] == "fused" and r[5] and not math.isnan(r[3])),
                      key=lambda r: r[3])[:3]
        shipped = "-" if math.isnan(pair[3]) else f"{pair[3]:.1f}"
        print(f"{tag:<28} pair {shipped} | " + " | ".join(batched + [f"{r[2]} {r[3]:.1f} ({r[4]})" for r in best]))
    print("== summed over the workload paths, per fused config (the proposal for the module's TUNED); in brackets "
          "the indexed paths alone, fused against the pair")
    sums: dict = {}
    for r in rows:
        if r[1] == "fused" and r[5] and not math.isnan(r[3]):
            sums.setdefault(r[2], []).append((r[0], r[3]))
    full = max((len(v) for v in sums.values()), default=0)
    pair_sum = sum(r[3] for r in rows if r[1] == "pair" and not math.isnan(r[3]))
    for config, times in sorted(((c, t) for c, t in sums.items() if len(t) == full),
                                key=lambda ct: sum(us for _, us in ct[1])):
        indexed = sum(us for tag, us in times if tag.endswith("/indexed"))
        print(f"{config:<36} {sum(us for _, us in times):8.1f} us (indexed {indexed:.1f}, pair {pair_sum:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="bench workloads (default: all four)")
    parser.add_argument("--reps", type=int, default=200, help="graph replays per timing")
    parser.add_argument("--like", action="append",
                        help="only the candidates whose description starts with this (repeatable), e.g. 'M64 N64 K256'")
    parser.add_argument("--dry-run", action="store_true",
                        help="the plumbing on the CPU under the interpreter, small shapes, nothing timed")
    args = parser.parse_args()
    from harness.backend import configure

    configure("cpu" if args.dry_run else "cuda")
    print_rows(run(args.workload or WORKLOADS, args.reps, args.dry_run, args.like))


if __name__ == "__main__":
    main()
