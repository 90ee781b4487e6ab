"""Our eager call's host time on a machine without a GPU: a proxy for the bench's ``eager_host_us`` (issue 54).

    TRITON_INTERPRET=0 python lab/host_time_proxy.py [--calls 300] [--repeats 5] [--profile VARIANT@WORKLOAD]

Every line of ours runs as on the GPU (``TRITON_INTERPRET=0``: the GPU's branches, configs and launch arguments;
``kernels.direct_launch.LaunchCache`` with the real ``TritonRuntime`` code for its checks and its launch), on the
bench workloads' inputs built on the CPU. What cannot run here is faked, and only that: the driver's current device
and stream (0), the device's compute capability (an H200's: its configs, programmatic launch on), and the compiled
binary, whose launcher is a no-op. A shape's first launch binds the fake binary where Triton would compile and
launch (the autotuner's pick: its first config after pruning, the checked-in one for ours). So the figures are our
Python's cost and the launch cache's, without Triton's C launcher (a few us per launch on the GPU) and with CPU
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

import torch  # noqa: E402

import kernels  # noqa: E402
from harness import bench  # noqa: E402
from harness.cases.builder import build_inputs  # noqa: E402
from kernels import call_replay, direct_launch  # noqa: E402

WORKLOADS = ("short-continuation", "prefill-4256", "continue-600", "mixed-3")
VARIANTS = ("indexed", "snapshot-fused")


class FakeBinary:
    """A compiled kernel whose launcher does nothing (``CompiledKernel.run``'s signature)."""

    function = packed_metadata = None

    def run(self, *args):
        pass


class ProxyRuntime(direct_launch.TritonRuntime):
    """``TritonRuntime`` with the driver faked: device 0, stream 0. Everything else is the real code."""

    def device(self) -> int:
        return 0

    def stream(self, device: int) -> int:
        return 0

    def bind(self, kernel, arguments, result, device):
        """The real binding, with every tensor taken as a GPU's (their addresses go to the fake launcher), as a
        binding of CUDA tensors is: so that ``kernels.call_replay`` replays the calls, as on the GPU."""
        binding = super().bind(kernel, arguments, result, device)
        if binding is not None:
            binding.address_names = tuple(name for name, v in arguments.items() if isinstance(v, torch.Tensor))
        return binding


class ProxyLaunchCache(direct_launch.LaunchCache):
    """A key's first launch binds a fake binary instead of compiling and launching through Triton: the autotuner's
    pick (its first config after pruning) goes into its cache as ``Autotuner.run`` would put it, the binary into the
    JIT function's device cache, so the real ``bind`` and ``current`` accept them."""

    def _through_triton(self, kernel, grid, arguments, bind_as):
        self.through_triton += 1
        tuner, jit = self.runtime.layers(kernel)
        if tuner is not None and len(tuner.configs) > 1:
            tuner.nargs = {}  # as ``Autotuner.run`` sets it for a launch by keyword
            tuner.best_config = tuner.prune_configs(dict(arguments))[0]
            tuner.nargs = None
            tuner.cache[direct_launch.tuning_key_of(tuner, arguments)] = tuner.best_config
        elif tuner is not None:
            tuner.best_config = tuner.configs[0]
        binary = FakeBinary()
        if 0 not in jit.device_caches:  # Triton's factory asks the driver for the target: only [0] is read here
            jit.device_caches[0] = ({},)
        jit.device_caches[0][0][("proxy", len(jit.device_caches[0][0]))] = binary
        if bind_as is not None:
            key, device = bind_as
            binding = self.runtime.bind(kernel, arguments, binary, device)
            if binding is None:
                raise RuntimeError(f"{jit.__name__}: the launch cache would not bind this launch")
            self._launches += 1
            self.bindings[key] = [binding, self._launches]
        return binary


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
    torch.cuda.get_device_capability = lambda *device: (9, 0)  # an H200's: its configs, programmatic launch on
    direct_launch.LAUNCHES = ProxyLaunchCache(ProxyRuntime())
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
    cache = direct_launch.LAUNCHES
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
