"""Where one whole call's device time goes, per stage, for any provider (``python -m harness bench --stages --peer``).

A provider need not expose its stages (``harness.stage_bench`` times ours one by one through our kernels' entry
points). This module profiles a whole call instead: ``torch.profiler`` with CUDA activity records every device
activity of the call (kernels, memsets, copies) with its name and duration; the events are grouped by name and the
names mapped to stages by ``STAGE_PATTERNS``, which knows our kernels (``kernels/``) and vLLM's
(``vllm/model_executor/layers/mamba/ops/``). A name no pattern matches (a PyTorch kernel, another engine's kernel, a
memset) is its own row under its own name, so nothing a call spends is dropped.

The profiled call is a replay of the call's CUDA graph where it could be captured: a graph replays exactly the
device work, none of the host-side work of an adapter (e.g. a device-to-host read of the slot indices made to
refuse a call). A call whose capture failed is profiled as an eager call, and the report says so. Calls of the
providers compared alternate round by round (``profile_rounds``), and each stage's figure is the median over the
rounds of its time in one call.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable

import torch
from torch.autograd import DeviceType

# (stage, kernel name pattern), matched against the whole name. Triton names a kernel after its function; older
# Triton versions append a specialization suffix (``_0d1d2d``), which the optional ``(_\w+)?`` admits.
STAGE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("gather", r"_gather_initial_states_kernel"),  # ours (kernels/gather.py) and vLLM's (gather_initial_states.py)
    ("chunk_cumsum", r"_chunk_cumsum(_fwd)?_kernel"),  # ours: _chunk_cumsum_kernel; vLLM: _chunk_cumsum_fwd_kernel
    # ours on the snapshot path where the cache's rows are aligned: the cumsum's and the gather's programs in one
    # kernel (kernels/chunk_cumsum_gather.py)
    ("chunk_cumsum_gather", r"_chunk_cumsum_gather_kernel"),
    ("chunk_state", r"_chunk_state(_fwd)?_kernel"),
    # ours where both stages' configs are fixed: chunk state's and bmm's programs in one kernel
    # (kernels/chunk_state_bmm.py)
    ("chunk_state_bmm", r"_chunk_state_bmm_kernel"),
    # ours on the snapshot path: chunk state and state passing in one kernel (kernels/chunk_state_passing.py)
    ("chunk_state_passing", r"_chunk_state_passing_kernel"),
    # ours on the indexed path: state passing that reads each initial state out of the cache by slot and stores its
    # copy as chunk 0's entering state, the gather's work, in the same kernel (kernels/state_passing_indexed.py)
    ("gather_state_passing", r"_state_passing_indexed_kernel"),
    # ours: _state_passing_batched_kernel (the snapshot path on many chunks); vLLM: _state_passing_fwd_kernel
    ("state_passing", r"_state_passing(_batched|_fwd)?_kernel"),
    ("bmm_chunk", r"_bmm_chunk(_fwd)?_kernel"),
    ("chunk_scan", r"_chunk_scan(_fwd)?_kernel"),
)
STAGES = tuple(stage for stage, _ in STAGE_PATTERNS)
# A stage that does the work of others in one kernel -> those stages. Where one side of a comparison runs the fused
# kernel, the other its parts, a row compares the two sides' sums over the fused stage and its parts.
FUSED_STAGES: dict[str, tuple[str, ...]] = {"chunk_state_passing": ("chunk_state", "state_passing"),
                                            "gather_state_passing": ("gather", "state_passing"),
                                            "chunk_state_bmm": ("chunk_state", "bmm_chunk"),
                                            "chunk_cumsum_gather": ("chunk_cumsum", "gather")}
# Stages whose kernels a call may run side by side (ours: the fused gather beside the cumsum, bmm and the chunk
# state kernel beside each other: ``kernels.ssd``). Kernels that share the GPU slow each other,
# and the added-time attribution (``kernel_times``) leaves the shared time with the kernel that started first: its
# row reads what it took beside the other, the other's row only what it ran past it. A group's row sums its stages on
# each side: what those stages cost the call, whichever ran beside which. Any provider's kernels fall into the groups
# by stage name. The indexed state passing counts whole in the states' group, the gather's read with it: that group can
# only read worse for ours, never hide a row.
SIDE_BY_SIDE: dict[str, tuple[str, ...]] = {
    "gather + chunk_cumsum": ("gather", "chunk_cumsum", "chunk_cumsum_gather"),
    "states + bmm_chunk": ("chunk_state", "chunk_state_bmm", "chunk_state_passing", "gather_state_passing",
                           "state_passing", "bmm_chunk"),
}
_COMPILED = tuple((stage, re.compile(rf"{pattern}(_\w+)?")) for stage, pattern in STAGE_PATTERNS)


def stage_of(kernel: str) -> str:
    """The stage a device activity named ``kernel`` belongs to; a name no pattern matches is its own stage."""
    for stage, pattern in _COMPILED:
        if pattern.fullmatch(kernel):
            return stage
    return kernel


def kernel_times(events: Iterable) -> dict[str, dict]:
    """Device activities grouped by name: name -> {"us": the time they add to the device's busy time, "count":
    launches}. ``events`` are ``torch.profiler``'s ``FunctionEvent``s (or anything with ``name``, ``device_type`` and
    ``time_range``); host-side events (operators, CUDA runtime calls such as ``cudaGraphLaunch``) and GPU user
    annotations are left out.

    An activity adds its duration less the part of it that overlaps activities started before it. Launched with
    programmatic dependent launch, a kernel starts while the one before it still runs and waits for it: its own
    duration would count the wait, which is the other kernel's time, twice. Without overlap the added time is the
    duration; either way the activities' added times sum to the busy part of the call's span."""
    grouped: dict[str, dict] = {}
    horizon = None  # the latest end among the activities so far
    for event in sorted(_device_events(events), key=lambda e: e.time_range.start):
        start, end = event.time_range.start, event.time_range.end
        added = end - start if horizon is None else max(0, end - max(start, horizon))
        horizon = end if horizon is None else max(horizon, end)
        entry = grouped.setdefault(event.name, {"us": 0.0, "count": 0})
        entry["us"] += float(added)
        entry["count"] += 1
    return grouped


def _device_events(events: Iterable) -> list:
    return [e for e in events
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]


def call_profile(events: Iterable) -> dict:
    """One profiled call: ``kernels`` (``kernel_times``), ``span_us`` (first device activity's start to the last
    one's end) and ``timeline``: each activity as (name, start, duration) in us, from the first start (durations as
    measured, overlaps included). The span less the activities' added times is the time the device idled inside
    the call, between its kernels."""
    device = sorted(_device_events(events), key=lambda e: e.time_range.start)
    if not device:
        return {"kernels": {}, "span_us": 0.0, "timeline": []}
    first = device[0].time_range.start
    return {
        "kernels": kernel_times(device),
        "span_us": float(max(e.time_range.end for e in device) - first),
        "timeline": [(e.name, float(e.time_range.start - first), e.time_range.elapsed_us()) for e in device],
    }


def stage_times(kernels: dict[str, dict]) -> dict[str, float]:
    """``kernel_times``' result summed per stage (``stage_of``)."""
    stages: dict[str, float] = {}
    for name, entry in kernels.items():
        stage = stage_of(name)
        stages[stage] = stages.get(stage, 0.0) + entry["us"]
    return stages


def start_profiler() -> None:
    """One empty profiling session, before any graph to be profiled is captured: the profiler's CUDA tracing
    (Kineto over CUPTI) then is initialized before the graph exists. Some torch versions faulted or hung when a graph
    captured before that first initialization was replayed under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]):
        pass


def profile_call(run: Callable[[], object]) -> list:
    """The device events of one ``run()`` (a graph replay or an eager call), recorded by ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return list(prof.events())


def profile_rounds(runs: dict[str, Callable[[], object]], rounds: int,
                   profile: Callable[[Callable[[], object]], Iterable] = profile_call) -> dict[str, list[dict]]:
    """``call_profile`` of each run, ``rounds`` times, the runs alternating within each round (A, B, A, B, ...), so
    that drift over the measurement reaches every run alike. Returns label -> one ``call_profile`` per round."""
    calls: dict[str, list[dict]] = {label: [] for label in runs}
    for _ in range(rounds):
        for label, run in runs.items():
            calls[label].append(call_profile(profile(run)))
    return calls


def summarize_calls(calls: list[dict]) -> dict:
    """One provider's profiled calls (``call_profile`` per round): per stage the median over the rounds of its time
    in a call (0 in a round without it), per kernel name the median time and launches, the median total, the
    median span and idle time (span less the activities' sum), and the first round's timeline."""
    kernels = [call["kernels"] for call in calls]
    stage_rounds = [stage_times(k) for k in kernels]
    stages = sorted({stage for call in stage_rounds for stage in call}, key=_stage_order)
    names = sorted({name for k in kernels for name in k})
    return {
        "stages": {s: statistics.median(call.get(s, 0.0) for call in stage_rounds) for s in stages},
        "kernels": {n: {"us": statistics.median(k.get(n, {"us": 0.0})["us"] for k in kernels),
                        "count": statistics.median(k.get(n, {"count": 0})["count"] for k in kernels),
                        "stage": stage_of(n)} for n in names},
        "total_us": statistics.median(sum(call.values()) for call in stage_rounds),
        "span_us": statistics.median(call["span_us"] for call in calls),
        "idle_us": statistics.median(
            call["span_us"] - sum(s.values()) for call, s in zip(calls, stage_rounds, strict=True)),
        "timeline": calls[0]["timeline"] if calls else [],
        "rounds": len(calls),
    }


def _stage_order(stage: str) -> tuple[int, str]:
    return (STAGES.index(stage), "") if stage in STAGES else (len(STAGES), stage)


def ratio(ours: float | None, peer: float | None) -> float | None:
    """ours / peer, or None where either is missing (or zero)."""
    return ours / peer if ours and peer else None


def compare(ours: dict, peer: dict) -> list[dict]:
    """Stage rows of two ``summarize_calls`` results (``stage_rows``), then the total, the idle time between
    kernels and the span."""
    rows = stage_rows(ours["stages"], peer["stages"])
    for stage, key in (("total", "total_us"), ("idle between kernels", "idle_us"), ("span", "span_us")):
        rows.append({"stage": stage, "ours_us": ours[key], "peer_us": peer[key], "ratio": ratio(ours[key], peer[key])})
    return rows


def stage_rows(ours: dict[str, float], peer: dict[str, float], side_by_side: bool = True) -> list[dict]:
    """Rows of two sides' stage times (stage -> us): known stages in call order, then other names, then (where one
    side fused stages the other runs apart: ``FUSED_STAGES``) a row of their sums, then, with ``side_by_side``, a
    row per group of stages that may run side by side (``SIDE_BY_SIDE``) where a side has more than one of them. A
    stage one side lacks has None there (and no ratio)."""
    rows = []
    for stage in sorted(set(ours) | set(peer), key=_stage_order):
        o, p = ours.get(stage), peer.get(stage)
        rows.append({"stage": stage, "ours_us": o, "peer_us": p, "ratio": ratio(o, p)})
    for fused, parts in FUSED_STAGES.items():
        if (fused in ours) != (fused in peer):
            rows.append(_sum_row(" + ".join(parts), (fused, *parts), ours, peer))
    for label, group in SIDE_BY_SIDE.items():
        if side_by_side and any(sum(s in side for s in group) > 1 for side in (ours, peer)):
            rows.append(_sum_row(label, group, ours, peer))
    return rows


def _sum_row(label: str, stages: tuple[str, ...], ours: dict[str, float], peer: dict[str, float]) -> dict:
    """A row of each side's summed time over ``stages`` (0 for a stage a side lacks)."""
    o, p = (sum(side.get(s, 0.0) for s in stages) for side in (ours, peer))
    return {"stage": label, "ours_us": o, "peer_us": p, "ratio": ratio(o, p)}


def rows_above(rows: list[dict]) -> list[dict]:
    """The rows where ours took longer than the peer's (both measured)."""
    return [r for r in rows if r["ours_us"] is not None and r["peer_us"] is not None and r["ours_us"] > r["peer_us"]]


def timeline_line(summary: dict) -> str:
    """The first profiled call's device activities in order, as ``stage start+duration`` (us), for reading where a
    call idles."""
    return "  ".join(f"{stage_of(name)} {start:.1f}+{dur:.1f}" for name, start, dur in summary["timeline"])


def short_name(name: str, width: int = 26) -> str:
    """A kernel name cut to ``width`` characters for the table (the JSON keeps the whole name)."""
    return name if len(name) <= width else name[: width - 3] + "..."


def print_comparison(report: dict) -> None:
    """The stage tables of ``harness.bench``'s ``--stages --peer`` report: one per workload and variant of ours."""
    for table in report["tables"]:
        how = {"graph": "graph replays", "eager": "eager calls"}
        sources = f"ours: {how[table['ours_source']]}, peer: {how[table['peer_source']]}"
        print(f"== {table['workload']}: ours {table['variant']} vs {report['peer_name']} {table['peer_variant']} "
              f"(device time per call by stage, median of {table['rounds']} profiled calls; {sources})")
        print_rows(table["rows"])
        print(f"timeline ours: {timeline_line(table['ours'])}")
        print(f"timeline peer: {timeline_line(table['peer'])}")
    for line in report.get("skipped", []):
        print(f"skipped: {line}")


def print_rows(rows: list[dict]) -> None:
    """A stage table (``stage_rows``' rows and any totals), then the rows where ours took longer."""
    print(f"{'stage':<28} {'ours us':>9} {'peer us':>9} {'ratio':>7}")
    for row in rows:
        o = "-" if row["ours_us"] is None else f"{row['ours_us']:.1f}"
        p = "-" if row["peer_us"] is None else f"{row['peer_us']:.1f}"
        r = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        print(f"{short_name(row['stage']):<28} {o:>9} {p:>9} {r:>7}")
    above = rows_above(rows)
    print("above the peer's: " + (", ".join(f"{r['stage']} (+{r['ours_us'] - r['peer_us']:.2f} us)" for r in above)
                                  or "none"))
