"""Our eager call's host time on a machine without a GPU: a proxy for the bench's ``eager_host_us`` (issue 54).

    TRITON_INTERPRET=0 python lab/host_time_proxy.py [--calls 300] [--repeats 5] [--profile VARIANT@WORKLOAD]

Every line of ours runs as on the GPU, on the bench workloads' inputs built on the CPU; what only a GPU has is
faked (``tests/fake_gpu.py``: the driver's device and stream, an H200's compute capability, the compiled binary,
whose launcher records nothing here). So the figures are our Python's cost, the launch cache's and whole-call
replay's, without Triton's C launcher (a few us per launch on the GPU) and with CPU
tensors (``torch.empty`` on the CPU, not CUDA's caching allocator). Compare variants and changes within one run of
this script: the machine's speed moves between runs.

Not part of the product or the suite: a lab tool whose figures guide the GPU bench, never replace it.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") != "0":
    sys.exit("run with TRITON_INTERPRET=0: the proxy measures the GPU's code paths, not the interpreter's")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


import kernels  # noqa: E402
from harness import bench  # noqa: E402
from harness.cases.builder import build_inputs  # noqa: E402
from kernels import call_replay  # noqa: E402
from tests import fake_gpu  # noqa: E402

WORKLOADS = ("short-continuation", "prefill-4256", "continue-600", "mixed-3")
VARIANTS = ("indexed", "snapshot-fused")


def calls(workload: str) -> dict:
    """Variant -> a no-argument eager call of ours on the workload's inputs (CPU tensors)."""
    case = bench.workload_case(workload)
    inputs = build_inputs(case, "cpu")
    runnable, _ = bench.variants_for(kernels.provider, list(VARIANTS), case)
    return {name: bench._call(kernels.provider, inputs, call) for name, call in runnable}


def per_call_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) * 1e6 / n


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", help="VARIANT@WORKLOAD: a cProfile of that call's --calls calls, by tottime")
    args = parser.parse_args(argv)
    cache = fake_gpu.install()
    fns = {(w, v): fn for w in WORKLOADS for v, fn in calls(w).items()}
    for fn in fns.values():
        fn()  # binds every launch
    best = {key: [] for key in fns}
    for _ in range(args.repeats):  # interleaved, so that drift reaches every call alike
        for key, fn in fns.items():
            best[key].append(per_call_us(fn, args.calls))
    print(f"host us per eager call (best / median of {args.repeats} x {args.calls} calls; fake launcher, CPU tensors)")
    for (workload, variant), times in best.items():
        print(f"  {workload:20s} {variant:15s} {min(times):7.1f} / {statistics.median(times):7.1f}")
    replays = call_replay.REPLAYS.replays
    print(f"launches: {cache.direct} direct, {cache.through_triton} bound; calls replayed: {replays}")
    for reason in sorted(set(call_replay.REPLAYS.refusals.values())):
        print(f"  a signature not replayed: {reason}")
    if args.profile:
        variant, workload = args.profile.split("@")
        fn = fns[(workload, variant)]
        profile = cProfile.Profile()
        profile.runcall(per_call_us, fn, args.calls)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
