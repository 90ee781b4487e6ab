"""``python -m harness bench --stages``: time each SSD stage alone, with the autotuner's choice and with every
candidate config forced, then the autotuner's choice again (two readings of one binary: the noise a forced config
must beat), to see where a call's time goes and which configs the stages should tune over.

Each stage is replayed from a CUDA graph (median of ``reps``) on the intermediates of one real call of the
workload (inputs from the case builder, as in ``harness.bench``): ``STAGE_CALLS`` launches of the stage in one
graph, the time per launch: a graph of one launch reads the floor between queued graphs rather than the stage,
whatever the config (docs/decisions.md: stage bench). Every launch does the same work on the same
inputs (where a workload's initial and final slots were one, the indexed state passing would read what the launch
before wrote: other values, the same work). A forced config whose output is not finite is
reported as such (the sm90 wgmma hazard of docs/exactness.md writes NaN rows) and never counts as the best.
Candidates beyond a stage's shipped ``CONFIGS`` are only timed here: a config joins ``CONFIGS`` with the GPU
evidence (docs/decisions.md) and then runs in tests/test_kernel_stages.py's every-config check. Where a call runs
chunk state's and bmm's programs in one kernel (``kernels.chunk_state_bmm``: the checked-in shapes), that kernel is
timed as it runs, with both stages' checked-in blocks; to sweep either stage's configs there, bench an unfused
variant (``--variant indexed-unfused`` or ``snapshot-unfused``: ``kernels.plan``'s unfused plan, every stage in a
kernel of its own). Likewise the snapshot path's cumsum and gather in one kernel (``kernels.chunk_cumsum_gather``:
caches with aligned rows) run under the cumsum's config; the unfused variants sweep the cumsum's own kernel.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
from triton.runtime.errors import OutOfResources

from harness.cuda_timing import QUEUED, time_after, time_graph

STAGE_CALLS = 20  # launches of a stage per captured graph (the module docstring says why)
FLUSHED_CALLS = 10  # launches of a stage, each after an L2 flush, per captured graph (time_one_stage_flushed)

# Candidate configs timed beyond each stage's CONFIGS (serving shape: headdim 64, dstate 128, chunk 256).
_C = triton.Config
EXTRA_CANDIDATES = {
    "chunk_scan": [
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}, num_stages=5, num_warps=2),
        _C({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, num_stages=5, num_warps=2),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, num_stages=3, num_warps=2),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=2, num_warps=2),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, num_stages=1, num_warps=4),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, num_stages=1, num_warps=8),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=1, num_warps=8),
        _C({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=1, num_warps=8),
        _C({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, num_stages=1, num_warps=4),
        _C({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}, num_stages=1, num_warps=4),
        _C({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=2),
        _C({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64}, num_stages=4, num_warps=2),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=2),
    ],
    "chunk_state": [
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=4),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, num_stages=4, num_warps=4),
        _C({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=4),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}, num_stages=4, num_warps=8),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=2, num_warps=2),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=2),
        _C({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=2),
        # vLLM 0.33.0's pick at the serving shape, and the fastest of its list on the one-chunk call from a cold L2:
        # the config a comparison with vLLM's stage would ask about first
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}, num_stages=5, num_warps=2),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, num_stages=4, num_warps=2),
    ],
    "bmm_chunk": [
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}, num_stages=3, num_warps=4),
        _C({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=4),
        _C({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=8),
        _C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128}, num_stages=2, num_warps=4),
        _C({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=2),
    ],
    "chunk_cumsum": [
        _C({"BLOCK_SIZE_H": bh}, num_warps=w) for bh in (1, 2, 4, 8, 16, 32, 64) for w in (1, 2, 4, 8)
    ],
}


# The rows of a stage as the provider runs it: the autotuner's pick (named in ``chosen``) or an untuned stage, timed
# first and read again after the forced configs (``AGAIN``): two readings of one binary, whose difference is the
# noise any forced config must beat before it means anything.
AUTO, FIXED, AGAIN = "auto", "fixed", " again"
UNFORCED = {AUTO, FIXED, AUTO + AGAIN, FIXED + AGAIN}


@dataclass
class StageTiming:
    stage: str
    config: str  # one of UNFORCED, or a forced config
    graph_us: float
    finite: bool
    shipped: bool  # the config is in the stage's CONFIGS
    chosen: str | None = None


def describe(config: triton.Config) -> str:
    blocks = " ".join(f"{k.replace('BLOCK_SIZE_', '').replace('BLOCK_SIZE', 'BS')}={v}"
                      for k, v in config.kwargs.items())
    return f"{blocks} s{config.num_stages} w{config.num_warps}"


def stage_calls(provider, inputs, path: str, **extra) -> dict:
    """One closure per stage of ``path`` (``extra``: the variant's other ``ssd_prefill`` arguments, e.g.
    ``gather``) on the intermediates of one real call (the provider's ``stage_launches`` hook): name -> (fn
    returning the stage's output, the autotuned kernel or None, its module's CONFIGS or [])."""
    from kernels import bmm_chunk, chunk_cumsum, chunk_scan, chunk_state

    tuned = {"chunk_cumsum": (chunk_cumsum.chunk_cumsum_kernel, chunk_cumsum.CONFIGS),
             "bmm_chunk": (bmm_chunk.bmm_chunk_kernel, bmm_chunk.CONFIGS),
             "chunk_state": (chunk_state.chunk_state_kernel, chunk_state.CONFIGS),
             "chunk_scan": (chunk_scan.chunk_scan_kernel, chunk_scan.CONFIGS)}
    launches = provider.stage_launches(**inputs.kwargs(path=path), **extra)
    return {name: (fn, *tuned.get(name, (None, []))) for name, fn in launches.items()}


def time_one_stage(fn, reps: int) -> float:
    """Device us per launch of one stage: ``STAGE_CALLS`` launches of ``fn`` in one CUDA graph (the module docstring
    says why not one), the median of ``reps`` replays."""
    return time_graph(fn, reps, calls=STAGE_CALLS)


@functools.cache
def _l2_flush_buffer(device: int) -> torch.Tensor:
    return torch.ones(2 * torch.cuda.get_device_properties(device).L2_cache_size // 4, dtype=torch.float32,
                      device=torch.device("cuda", device))


def l2_flush():
    """A closure reading a buffer of twice the current device's L2 (a sum): after it, L2 holds that buffer's
    lines, clean, so the next kernel finds none of its data there and writes back none of the flush's."""
    buffer = _l2_flush_buffer(torch.cuda.current_device())
    return buffer.sum


def time_one_stage_flushed(fn, reps: int) -> float:
    """Device us per launch of one stage, each launch after an L2 flush (``l2_flush``; ``FLUSHED_CALLS`` pairs a
    graph less the flushes alone: ``harness.cuda_timing.time_after``, each graph read thrice over a fifth of
    ``reps`` replays, since each holds ten flushes of tens of microseconds). Twenty launches back to back
    (``time_one_stage``) give each launch what the one before left in L2, its own inputs among it: where a stage's
    data nearly fits L2 (the batched state passing's on mixed-3), that time turns on what L2 keeps from launch to
    launch, which no call repeats."""
    return time_after(l2_flush(), fn, max(QUEUED, reps // 5), FLUSHED_CALLS)


# How a stage alone is timed (``bench --alone-timing``): name -> (timer(fn, reps) -> us per launch, what the
# heading says of it).
ALONE_TIMINGS = {
    "back-to-back": (time_one_stage, f"{STAGE_CALLS} launches a graph, each after the one before"),
    "after-L2-flush": (time_one_stage_flushed, f"{FLUSHED_CALLS} launches a graph, each after a read of twice L2, "
                                               "less the reads"),
}
DEFAULT_TIMING = "back-to-back"


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t.float()).all())


def time_stage(name: str, fn, kernel, configs: list, reps: int, timer=time_one_stage) -> list[StageTiming]:
    """The stage as the provider runs it, then (for an autotuned stage) every shipped and candidate config, then the
    stage as the provider runs it again, each timed by ``timer(fn, reps)`` (an ``ALONE_TIMINGS`` timer)."""
    out = fn()  # tunes (outside the graph) and compiles
    chosen = describe(kernel.best_config) if kernel is not None else None
    unforced = AUTO if kernel is not None else FIXED
    rows = [StageTiming(name, unforced, timer(fn, reps), _finite(out), True, chosen)]
    if kernel is not None:
        rows.extend(_forced_rows(name, fn, kernel, configs, reps, timer))
    rows.append(StageTiming(name, unforced + AGAIN, timer(fn, reps), _finite(fn()), True, chosen))
    return rows


def _forced_rows(name: str, fn, kernel, configs: list, reps: int, timer) -> list[StageTiming]:
    """Every shipped and candidate config of an autotuned stage, each forced in turn."""
    from harness.triton_autotuner import forced_config

    rows = []
    shipped = {describe(c) for c in configs}
    seen = set()
    for config in list(configs) + EXTRA_CANDIDATES.get(name, []):
        label = describe(config)
        if label in seen:
            continue
        seen.add(label)
        with forced_config(kernel, config):
            try:
                finite = _finite(fn())
                us = timer(fn, reps)
            except OutOfResources as exc:  # a candidate too big for the GPU's shared memory: reported, not fatal
                rows.append(StageTiming(name, f"{label} ({type(exc).__name__})", math.nan, False, label in shipped))
                continue
        rows.append(StageTiming(name, label, us, finite, label in shipped))
    return rows


def bench_stages(provider, workloads: dict, variant: str, call: dict, reps: int,
                 timing: str = DEFAULT_TIMING) -> dict:
    """Per workload (name -> ``Case``): the whole call's and every stage's timings, for the variant named ``variant``
    whose ``ssd_prefill`` arguments are ``call`` (``path`` and any others, e.g. ``gather``), each stage timed the
    ``ALONE_TIMINGS`` way named ``timing``."""
    from harness.cases.builder import build_inputs

    report = {}
    for workload, case in workloads.items():
        inputs = build_inputs(case, "cuda")
        path = call["path"]
        extra = {k: v for k, v in call.items() if k != "path"}
        kw = inputs.kwargs(path=path)
        whole = time_graph(functools.partial(provider.ssd_prefill, **kw, **extra), reps)
        rows = []
        for name, (fn, kernel, configs) in stage_calls(provider, inputs, path, **extra).items():
            rows.extend(time_stage(name, fn, kernel, configs, reps, ALONE_TIMINGS[timing][0]))
        report[workload] = {"variant": variant, "timing": timing, "whole_call_graph_us": whole,
                            "rows": [vars(r) for r in rows]}
    return report


def best_rows(rows: list[dict]) -> dict[str, dict]:
    """Per stage, the fastest row with finite output (the re-reading of the provider's own run is no config of its
    own: it shows the noise)."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["finite"] and not math.isnan(r["graph_us"]) and not r["config"].endswith(AGAIN):
            if r["stage"] not in best or r["graph_us"] < best[r["stage"]]["graph_us"]:
                best[r["stage"]] = r
    return best


def propose(report: dict) -> dict[str, dict]:
    """Per autotuned stage, the config with the least summed time over every workload of ``report`` (each forced
    config's time; a config not finite or not timed on some workload is out), with its times: the proposal for
    ``kernels.tuned_configs.TUNED``, one config per shape class for every number of chunks."""
    totals: dict[str, dict[str, list[float]]] = {}
    for entry in report.values():
        for r in entry["rows"]:
            if r["config"] in UNFORCED:
                continue
            ok = r["finite"] and not math.isnan(r["graph_us"])
            totals.setdefault(r["stage"], {}).setdefault(r["config"], []).append(r["graph_us"] if ok else math.inf)
    workloads = len(report)
    proposal = {}
    for stage, configs in totals.items():
        complete = {c: times for c, times in configs.items() if len(times) == workloads and math.inf not in times}
        if complete:
            best = min(complete, key=lambda c: sum(complete[c]))
            proposal[stage] = {"config": best, "us": complete[best], "sum_us": sum(complete[best])}
    return proposal


def print_stage_report(report: dict) -> None:
    for workload, entry in report.items():
        rows = entry["rows"]
        timing = f", stages {entry['timing']}" if "timing" in entry else ""  # older reports: back to back
        print(f"== {workload} ({entry['variant']}{timing}): whole call {entry['whole_call_graph_us']:.1f} us "
              "(graph replay)")
        print(f"{'stage':<22} {'config':<44} {'graph us':>9} {'finite':>6} {'shipped':>7}")
        for r in rows:
            mark = f"  <- tuner chose {r['chosen']}" if r["chosen"] else ""
            print(f"{r['stage']:<22} {r['config']:<44} {r['graph_us']:>9.1f} {str(r['finite']):>6} "
                  f"{str(r['shipped']):>7}{mark}")
        best = best_rows(rows)
        auto = {r["stage"]: r for r in rows if r["config"] in (AUTO, FIXED)}
        again = {r["stage"]: r["graph_us"] for r in rows if r["config"] in (AUTO + AGAIN, FIXED + AGAIN)}
        print(f"{'stage':<22} {'as shipped us':>13} {'again us':>9} {'best us':>9}  best config")
        for stage, r in auto.items():
            b = best.get(stage, r)
            reread = f"{again[stage]:>9.1f}" if stage in again else f"{'-':>9}"
            print(f"{stage:<22} {r['graph_us']:>13.1f} {reread} {b['graph_us']:>9.1f}  {b['config']}")
        print(f"{'sum of stages':<22} {sum(r['graph_us'] for r in auto.values()):>13.1f} "
              f"{sum(best.get(s, r)['graph_us'] for s, r in auto.items()):>9.1f}")
    proposal = propose(report)
    if proposal:
        print(f"== one config per stage for all {len(report)} workload(s): least summed time (us per workload)")
        for stage, p in proposal.items():
            print(f"{stage:<22} {p['config']:<44} {' '.join(f'{us:.1f}' for us in p['us'])}")
