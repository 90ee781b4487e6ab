"""``python -m harness bench``: time the SSD prefill paths on the GPU (CUDA events and CUDA graph replay, medians).

Workloads (issue 3/4): a short continuation (one sequence, 32 new tokens after a 4224-token context) and a 4256-token
prefill, at the serving shape nheads 64, headdim 64, dstate 128, ngroups 1, chunk 256, bf16 io and state, 64 slots.
Variants: the snapshot path with the PyTorch ``torch.where`` gather, with the fused Triton gather, and the indexed
path. Inputs come from the case builder (the same generator as every case). Performance is measured here, never in
timed tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass

import torch

from harness import DEFAULT_PROVIDER
from harness.cases.model import CacheSpec, Case, Dtypes, Options, SequenceSpec, Shape
from harness.cuda_timing import time_events, time_graph

SERVING_SHAPE = Shape(nheads=64, headdim=64, dstate=128, ngroups=1, chunk_size=256)

# (workload, variant) -> microseconds, graph replay, vLLM 0.33 stock Triton kernels on the same H200 (issue 3).
VLLM_REFERENCE_US = {
    ("short-continuation", "snapshot-torch"): 36.3,
    ("short-continuation", "snapshot-fused"): 29.3,
    ("prefill-4256", "snapshot-torch"): 212.0,
    ("prefill-4256", "snapshot-fused"): 203.0,
}
VARIANTS = {
    "snapshot-torch": {"path": "snapshot", "gather": "torch"},
    "snapshot-fused": {"path": "snapshot", "gather": "fused"},
    "indexed": {"path": "indexed"},
}


def workload_case(name: str) -> Case:
    """The bench workloads as cases (distinct init and final slots, so repeated calls see the same inputs)."""
    context, tokens, has_state = {"short-continuation": (4224, 32, True), "prefill-4256": (0, 4256, False)}[name]
    return Case.create(
        f"bench-{name}",
        description=f"bench workload {name}",
        seed=2024,
        shape=SERVING_SHAPE,
        dtype=Dtypes(io="bfloat16", state="bfloat16"),
        options=Options(D="per_head", z=False, dt_bias=True, dt_softplus=True),
        sequences=[SequenceSpec(context=context, tokens=tokens, init_slot=3, has_state=has_state, final_slot=5)],
        cache=CacheSpec(slots=64, fill=0.0),
        family="bench",
    )


@dataclass
class Timing:
    workload: str
    variant: str
    events_us: float
    graph_us: float
    graph_error: str | None = None


def bench(workloads: list[str], variants: list[str], reps: int, provider) -> list[Timing]:
    from harness.cases.builder import build_inputs

    results = []
    for workload in workloads:
        inputs = build_inputs(workload_case(workload), "cuda")
        for variant in variants:
            kwargs = inputs.kwargs(path=VARIANTS[variant]["path"])
            extra = {k: v for k, v in VARIANTS[variant].items() if k != "path"}

            def call(kwargs=kwargs, extra=extra):
                provider.ssd_prefill(**kwargs, **extra)

            events = time_events(call, reps)
            try:
                graph, error = time_graph(call, reps), None
            except Exception as exc:  # a path that cannot be captured is a finding, reported in the table
                graph, error = math.nan, f"{type(exc).__name__}: {exc}"
            results.append(Timing(workload, variant, events, graph, error))
    return results


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def summarize(results: list[Timing]) -> dict:
    """Ratios against vLLM's figures and the indexed-path targets (issue 4: >= 1.2x vs torch.where, <= fused)."""
    by = {(r.workload, r.variant): r for r in results}
    rows = []
    for r in results:
        ref = VLLM_REFERENCE_US.get((r.workload, r.variant))
        rows.append({
            "workload": r.workload, "variant": r.variant, "events_us": r.events_us, "graph_us": r.graph_us,
            "vllm_graph_us": ref, "vs_vllm": (r.graph_us / ref) if ref else None, "graph_error": r.graph_error,
        })
    targets = {}
    for workload in {r.workload for r in results}:
        idx, torch_where, fused = (by.get((workload, v)) for v in ("indexed", "snapshot-torch", "snapshot-fused"))
        if idx and torch_where:
            targets[f"{workload}: indexed speedup vs torch.where (target >= 1.2)"] = torch_where.graph_us / idx.graph_us
        if idx and fused:
            targets[f"{workload}: indexed / fused gather time (target <= 1.0)"] = idx.graph_us / fused.graph_us
    return {"rows": rows, "targets": targets}


def print_table(summary: dict) -> None:
    print(f"{'workload':<20} {'variant':<16} {'events us':>10} {'graph us':>10} {'vLLM us':>8} {'vs vLLM':>8}")
    for row in summary["rows"]:
        ref = f"{row['vllm_graph_us']:.1f}" if row["vllm_graph_us"] else "-"
        ratio = f"{row['vs_vllm']:.2f}x" if row["vs_vllm"] else "-"
        print(f"{row['workload']:<20} {row['variant']:<16} {row['events_us']:>10.1f} {row['graph_us']:>10.1f} "
              f"{ref:>8} {ratio:>8}")
        if row["graph_error"]:
            print(f"  graph capture failed: {row['graph_error']}")
    for name, value in summary["targets"].items():
        print(f"{name}: {value:.3f}")


def _meta(args) -> dict:
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "commit": os.environ.get("COMMIT") or _commit(),
            "provider": args.provider, "reps": args.reps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness bench",
        description="Time the SSD prefill paths on the GPU (CUDA events and CUDA graph replay, medians) at the "
                    "serving shape: a short continuation and a 4256-token prefill, each path variant.")
    parser.add_argument("--workload", action="append", choices=["short-continuation", "prefill-4256"],
                        help="repeatable; default both")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS), help="repeatable; default all")
    parser.add_argument("--reps", type=int, default=200, help="timed repetitions per variant (median reported)")
    parser.add_argument("--provider", default=DEFAULT_PROVIDER, metavar="MODULE:ATTR",
                        help=f"the provider to time (default: {DEFAULT_PROVIDER})")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--stages", action="store_true",
                        help="time each stage alone, as tuned and with every candidate config forced "
                             "(harness.stage_bench); --variant picks the path (default snapshot-fused), "
                             "--workload defaults to prefill-4256")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench: needs a CUDA device (timings under the interpreter mean nothing)", file=sys.stderr)
        return 2
    from harness.backend import AUTOTUNE_CACHE_ENV
    from kernels.environment import AUTOTUNE_BUDGET_ENV

    # The bench tunes for itself, at the kernels' full budget, before kernels are imported: tuning results a
    # parallel test run cached (short budget, on a shared GPU) must not pick the configs it times.
    os.environ[AUTOTUNE_CACHE_ENV] = "0"
    os.environ.pop(AUTOTUNE_BUDGET_ENV, None)
    from harness.checks.providers import load_provider

    provider = load_provider(args.provider)
    if args.stages:
        from harness import stage_bench

        variant = (args.variant or ["snapshot-fused"])[0]
        cases = {w: workload_case(w) for w in args.workload or ["prefill-4256"]}
        report = stage_bench.bench_stages(provider, cases, variant, VARIANTS[variant], args.reps)
        report["meta"] = _meta(args)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(report, fh, indent=2)
        stage_bench.print_stage_report({k: v for k, v in report.items() if k != "meta"})
        return 0
    results = bench(args.workload or ["short-continuation", "prefill-4256"], args.variant or list(VARIANTS),
                    args.reps, provider)
    summary = summarize(results)
    summary.update(_meta(args))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)
    print_table(summary)
    return 0
