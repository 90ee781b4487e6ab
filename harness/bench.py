"""``python -m harness bench``: time the SSD prefill paths on the GPU, alone or against a peer provider.

Workloads, at the serving shape nheads 64, headdim 64, dstate 128, ngroups 1, chunk 256, bf16 io and state, 64 slots,
D per head, dt_bias, softplus (``WORKLOADS``): a short continuation (one sequence, 32 new tokens after a
4224-token context), a 4256-token prefill, a longer continuation (600 new tokens after 4224) and a mixed batch of
three (32 after 4224, 600 after 4224, and 1600 new). Inputs come from the case builder (the same generator as
every case); every sequence reads its initial state from one slot and writes its final state to another, so
repeated calls see the same inputs.

Variants of ours: the snapshot path with the PyTorch ``torch.where`` gather, with the fused Triton gather, and the
indexed path (one sequence only: the mixed batch has no indexed variant). ``--peer MODULE:ATTR`` adds another
provider (e.g. ``peers.vllm_ssd:provider``), timed in the same process on the same input tensors: its supported
paths (``supported_paths``), called with ``path`` alone. Round after round (``--rounds``), both providers tune
afresh on the workload (``tuned_afresh``), every call of the workload is captured as a CUDA graph and then measured
once in turn, ours then the peer's (``harness.cuda_timing``: device time per call from ``--reps`` replays queued
back to back, one synchronized call's latency, and the host time of one eager call, enqueued behind a busy device:
``eager_host_us``), so drift over the run, and the luck of an autotuner, reach both alike. Reported: the median and
the best of the per-round figures, ours / the peer's (the peer's run of the same path, or of its first path when it
lacks ours) for the device times and the host times, the config each of our autotuned kernels ran, and the configs
each autotuner of either provider timed when it tuned afresh. ``--stages`` times each stage of ours alone
(``harness.stage_bench``); ``--stages --peer`` compares the stages of one whole call of each by profiling
(``harness.kernel_profile``), then each stage launched alone where both providers have the ``stage_launches`` hook
(``bench_stages_alone``: back to back and after an L2 flush). Performance is measured here, never in timed tests.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from harness import DEFAULT_PROVIDER
from harness.cases.model import CacheSpec, Case, Dtypes, Options, SequenceSpec, Shape
from harness.kernel_profile import ratio
from harness.stage_bench import ALONE_TIMINGS, DEFAULT_TIMING

SERVING_SHAPE = Shape(nheads=64, headdim=64, dstate=128, ngroups=1, chunk_size=256)

# name -> the call's sequences: (context tokens already cached, new tokens, initial-state slot, has an initial
# state, final-state slot). No final slot is an initial slot of the call.
WORKLOADS = {
    "short-continuation": ((4224, 32, 3, True, 5),),
    "prefill-4256": ((0, 4256, 3, False, 5),),
    "continue-600": ((4224, 600, 3, True, 5),),
    "mixed-3": ((4224, 32, 3, True, 6), (4224, 600, 4, True, 7), (0, 1600, 5, False, 8)),
}
# Variants of ours: ``ssd_prefill`` keywords (``gather`` is an extension of kernels:provider, docs/provider.md).
VARIANTS = {
    "snapshot-torch": {"path": "snapshot", "gather": "torch"},
    "snapshot-fused": {"path": "snapshot", "gather": "fused"},
    "indexed": {"path": "indexed"},
}
# Variants of a provider that takes ``path`` alone (a peer always; ours with --variant snapshot).
PATH_VARIANTS = {"snapshot": {"path": "snapshot"}, "indexed": {"path": "indexed"}}
# Ours with every stage in a kernel of its own (``kernels.plan``'s unfused plan), for ``--stages`` to sweep the
# configs of stages the shipped plan runs in one kernel; only when named.
UNFUSED_VARIANTS = {"snapshot-unfused": {"path": "snapshot", "gather": "fused", "unfused": True},
                    "indexed-unfused": {"path": "indexed", "unfused": True}}
ALL_VARIANTS = {**VARIANTS, **PATH_VARIANTS, **UNFUSED_VARIANTS}


def workload_case(name: str) -> Case:
    """The bench workload ``name`` as a case."""
    return Case.create(
        f"bench-{name}",
        description=f"bench workload {name}",
        seed=2024,
        shape=SERVING_SHAPE,
        dtype=Dtypes(io="bfloat16", state="bfloat16"),
        options=Options(D="per_head", z=False, dt_bias=True, dt_softplus=True),
        sequences=[SequenceSpec(*s) for s in WORKLOADS[name]],
        cache=CacheSpec(slots=64, fill=0.0),
        family="bench",
    )


# ---- which calls a provider makes ------------------------------------------------------------------------------------


def _takes(provider, keyword: str) -> bool:
    """Whether ``provider.ssd_prefill`` accepts ``keyword`` (by name, or through ``**kwargs``)."""
    try:
        params = inspect.signature(provider.ssd_prefill).parameters
    except (TypeError, ValueError):  # no signature to read: let the call decide
        return True
    return keyword in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def default_variants(provider) -> list[str]:
    """Ours: every variant of ``VARIANTS`` when the provider takes their keywords, else the plain paths."""
    return list(VARIANTS) if _takes(provider, "gather") else list(PATH_VARIANTS)


def variants_for(provider, names: list[str], case: Case) -> tuple[list[tuple[str, dict]], list[str]]:
    """The variants of ``names`` that ``provider`` can run on ``case``, as (name, ``ssd_prefill`` keywords), and a
    line per variant it cannot run, with the reason."""
    from harness.checks.providers import provider_name, supported_paths

    runnable, skipped = [], []
    paths, name = supported_paths(provider), provider_name(provider)
    eligible = case.indexed_eligible()
    for variant in names:
        call = ALL_VARIANTS[variant]
        missing = [k for k in call if k != "path" and not _takes(provider, k)]
        if call["path"] not in paths:
            skipped.append(f"{case.id} {variant}: provider {name!r} lacks the {call['path']} path")
        elif call["path"] == "indexed" and not eligible:
            skipped.append(f"{case.id} {variant}: {eligible.reason}")
        elif missing:
            skipped.append(f"{case.id} {variant}: provider {name!r} takes no {', '.join(missing)} keyword")
        else:
            runnable.append((variant, call))
    return runnable, skipped


def counterpart(path: str, peer_variants: list[str]) -> str | None:
    """The peer's variant an ours variant on ``path`` is compared with: the same path, else the peer's first."""
    return path if path in peer_variants else (peer_variants[0] if peer_variants else None)


# ---- whole calls, interleaved ----------------------------------------------------------------------------------------


@dataclass
class Entry:
    """One call timed: a variant of one side (``ours`` or ``peer``) on one workload."""

    workload: str
    side: str
    variant: str
    call: dict
    samples: list[float] = field(default_factory=list)  # one per round: device us per call (``timer.measure``)
    latency_samples: list[float] = field(default_factory=list)  # one per round: one call's latency (``timer.latency``)
    host_samples: list[float] = field(default_factory=list)  # one per round: an eager call's host us (``timer.host``)
    error: str | None = None
    host_error: str | None = None  # why the eager call's host time could not be measured (its device times stand)

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def best(self) -> float | None:
        return min(self.samples) if self.samples else None

    @property
    def latency(self) -> float | None:
        return statistics.median(self.latency_samples) if self.latency_samples else None

    @property
    def host_median(self) -> float | None:
        return statistics.median(self.host_samples) if self.host_samples else None

    @property
    def host_best(self) -> float | None:
        return min(self.host_samples) if self.host_samples else None


@contextlib.contextmanager
def tuned_afresh(providers: list) -> Iterator[dict[str, list[str]]]:
    """Inside the block, every autotuned kernel tunes again at its first launch: each Triton autotuner forgets what
    it chose before and neither reads nor writes the disk cache of tuning results (``TRITON_CACHE_AUTOTUNING``:
    results another process stored there would otherwise answer before any config is timed), and each provider's
    own tuning caches (the ``tuning_caches`` hook, docs/provider.md#optional-hooks) start empty. Yields what the
    block timed: kernel name -> every config timed, in order (one entry per trial), filled as the block runs.

    An autotuner keyed without the token count keeps what it tuned on whichever call came first, and on kernels of a
    few microseconds its timings are noise, so its picks differ between processes (docs/decisions.md: bench tuning
    afresh). Tuned afresh for each round, a provider's best round is its
    best tuning on that workload, and the median its typical one. Checked-in configs (ours on the serving shape)
    leave nothing to tune."""
    from harness import triton_autotuner as tt
    from harness.checks.hooks import tuning_caches

    timed: dict[str, list[str]] = {}
    try:
        tt.require_supported()
    except tt.UnsupportedTriton as exc:
        print(f"bench: not tuning afresh for this round, every autotuner keeps its first tuning: {exc}",
              file=sys.stderr)
        yield timed
        return
    for provider in providers:
        for cache in tuning_caches(provider):
            cache.clear()
    seen: set[int] = set()

    def forget(tuner) -> None:
        if id(tuner) not in seen:
            seen.add(id(tuner))
            tt.forget_tuning(tuner)

    def note(tuner, config) -> None:
        timed.setdefault(tuner.base_fn.__name__, []).append(str(config))  # as chosen_configs names it

    with tt.disk_cache_off(), tt.launches_reported(forget), tt.trials_reported(note):
        yield timed


def interleave(entries: list[Entry], fns: list, rounds: int, timer, fresh_tuning=contextlib.nullcontext) -> None:
    """For each of ``rounds`` rounds: inside ``fresh_tuning()`` prepare every call (``timer.prepare(fn)``: its
    warm-up calls tune, then the capture), then measure each prepared call once, in ``entries``' order
    (``timer.measure`` then ``timer.latency`` of its graph, then ``timer.host(fn)``, the host time of its eager
    call, tuned by the same preparation), appending to its ``samples``, ``latency_samples`` and ``host_samples``. A
    call that cannot be prepared gets its ``error`` and no samples; one whose host time cannot be measured gets its
    ``host_error`` and keeps its device samples; the others still run."""
    for _ in range(rounds):
        with fresh_tuning():
            prepared = []
            for entry, fn in zip(entries, fns, strict=True):
                handle = None
                if entry.error is None:
                    try:
                        handle = timer.prepare(fn)
                    except Exception as exc:  # a call that cannot be captured is a finding, reported in the table
                        entry.error = f"{type(exc).__name__}: {exc}"
                prepared.append(handle)
        for entry, fn, handle in zip(entries, fns, prepared, strict=True):
            if handle is not None:
                entry.samples.append(timer.measure(handle))
                entry.latency_samples.append(timer.latency(handle))
                if entry.host_error is None:
                    try:
                        entry.host_samples.append(timer.host(fn))
                    except Exception as exc:  # e.g. a call that waits for the device: reported, not fatal
                        entry.host_error = f"{type(exc).__name__}: {exc}"
        del prepared  # this round's graphs


def workload_entries(workload: str, provider, our_variants: list[str], peer) -> tuple[list[Entry], list[str]]:
    """The entries of one workload, ours first then the peer's (the paths it supports), and the lines of the
    variants skipped."""
    from harness.checks.providers import supported_paths

    case = workload_case(workload)
    ours, skipped = variants_for(provider, our_variants, case)
    entries = [Entry(workload, "ours", name, call) for name, call in ours]
    if peer is not None:
        paths = supported_paths(peer)
        theirs, peer_skipped = variants_for(peer, [v for v in PATH_VARIANTS if v in paths], case)
        entries += [Entry(workload, "peer", name, call) for name, call in theirs]
        skipped += [f"peer {line}" for line in peer_skipped]
    return entries, skipped


def _call(provider, inputs, call: dict):
    extra = {k: v for k, v in call.items() if k != "path"}
    return functools.partial(provider.ssd_prefill, **inputs.kwargs(path=call["path"]), **extra)


def bench(workloads: list[str], our_variants: list[str], provider, peer, rounds: int, timer,
          build_inputs=None, device: str = "cuda", configs: dict | None = None,
          trials: list | None = None) -> tuple[list[Entry], list[str]]:
    """Time every workload: its calls (ours, then the peer's) on one set of input tensors, interleaved over
    ``rounds``, both providers tuned afresh for each round (``tuned_afresh``). Returns the entries and the lines of
    the variants skipped; ``configs``, when given, receives every config our kernels ran (``record_configs`` after
    each round's tuning); ``trials``, when given, one ``(workload, {kernel: configs timed})`` per round, both
    providers' kernels."""
    if build_inputs is None:
        from harness.cases.builder import build_inputs
    entries, skipped = [], []
    providers = [p for p in (provider, peer) if p is not None]

    workload = None

    @contextlib.contextmanager
    def tuned_round():
        with tuned_afresh(providers) as timed:
            yield
        if configs is not None:
            record_configs(configs)
        if trials is not None:
            trials.append((workload, timed))
    for workload in workloads:
        these, lines = workload_entries(workload, provider, our_variants, peer)
        skipped += lines
        inputs = build_inputs(workload_case(workload), device)
        fns = [_call(provider if e.side == "ours" else peer, inputs, e.call) for e in these]
        interleave(these, fns, rounds, timer, fresh_tuning=tuned_round)
        entries += these
    return entries, skipped


def summarize(entries: list[Entry], skipped: list[str] | None = None) -> dict:
    """Rows (median and best of the rounds; for ours with a peer: the peer variant compared and the ratios
    ours/peer of the medians and of the bests) and the targets: issue 4's for the indexed path (medians), and with a
    peer our fastest variant's best against the peer's best."""
    by = {(e.workload, e.side, e.variant): e for e in entries}
    rows = []
    for e in entries:
        row = {"workload": e.workload, "side": e.side, "variant": e.variant, "median_us": e.median,
               "best_us": e.best, "samples_us": list(e.samples), "latency_us": e.latency,
               "latency_samples_us": list(e.latency_samples), "host_median_us": e.host_median,
               "host_best_us": e.host_best, "host_samples_us": list(e.host_samples), "error": e.error,
               "host_error": e.host_error}
        if e.side == "ours":
            peer_variants = [p.variant for p in entries if p.workload == e.workload and p.side == "peer"]
            other = by.get((e.workload, "peer", counterpart(e.call["path"], peer_variants) or ""))
            row["peer_variant"] = other.variant if other else None
            row["ratio"] = ratio(e.median, other.median) if other else None
            row["best_ratio"] = ratio(e.best, other.best) if other else None
            row["host_ratio"] = ratio(e.host_median, other.host_median) if other else None
        rows.append(row)
    targets = {}
    for workload in dict.fromkeys(e.workload for e in entries):
        idx, torch_where, fused = (by.get((workload, "ours", v))
                                   for v in ("indexed", "snapshot-torch", "snapshot-fused"))
        if idx and torch_where and idx.median and torch_where.median:
            targets[f"{workload}: indexed speedup vs torch.where (target >= 1.2)"] = torch_where.median / idx.median
        if idx and fused and idx.median and fused.median:
            targets[f"{workload}: indexed / fused gather time (target <= 1.0)"] = idx.median / fused.median
        compared = [r for r in rows if r["workload"] == workload and r.get("best_ratio") is not None]
        if compared:  # the call a serving engine would make: our fastest variant, against the peer's
            fastest = min(compared, key=lambda r: r["best_us"])
            targets[f"{workload}: our fastest ({fastest['variant']}) / the peer's, bests (target <= 0.9)"] = (
                fastest["best_ratio"])
            if fastest["host_ratio"] is not None:  # the same call's eager host time, where both sides have one
                targets[f"{workload}: our fastest ({fastest['variant']}) eager host time / the peer's, medians "
                        "(target <= 0.5)"] = fastest["host_ratio"]
    return {"rows": rows, "targets": targets, "skipped": list(skipped or [])}


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(summary: dict) -> None:
    peer = any(r["side"] == "peer" for r in summary["rows"])
    rounds = max((len(r["samples_us"]) for r in summary["rows"]), default=0)
    print(f"graph replay, device time per call (replays queued back to back): median and best of {rounds} round(s) "
          "of per-round medians; 1-call: one synchronized replay, host launch included (median); host: one eager "
          "call's host time, enqueued behind a busy device (median of the rounds)"
          + ("; ratio: ours / the peer's variant named, of the medians and of the bests; host ratio: of the host "
             "medians" if peer else ""))
    head = (f"{'workload':<20} {'side':<5} {'variant':<16} {'median us':>9} {'best us':>8} {'1-call us':>9} "
            f"{'host us':>8}")
    print(head + (f"  {'peer':<10} {'ratio':>7} {'best ratio':>10} {'host ratio':>10}" if peer else ""))

    def times(value: float | None) -> str:
        # Three decimals: a target such as 0.9x is decided in the third (0.9005 is not met).
        return "-" if value is None else f"{value:.3f}x"

    for row in summary["rows"]:
        line = (f"{row['workload']:<20} {row['side']:<5} {row['variant']:<16} {_us(row['median_us']):>9} "
                f"{_us(row['best_us']):>8} {_us(row.get('latency_us')):>9} {_us(row.get('host_median_us')):>8}")
        if peer and row["side"] == "ours":
            line += (f"  {row['peer_variant'] or '-':<10} {times(row['ratio']):>7} {times(row['best_ratio']):>10} "
                     f"{times(row.get('host_ratio')):>10}")
        print(line)
        if row["error"]:
            print(f"  graph capture failed: {row['error']}")
        if row.get("host_error"):
            print(f"  eager host time not measured: {row['host_error']}")
    for name, value in summary["targets"].items():
        print(f"{name}: {value:.4f}")
    for line in summary["skipped"]:
        print(f"skipped: {line}")


# ---- stages against a peer, by profiling -----------------------------------------------------------------------------


def _profiled_run(fn, capture, profile) -> tuple:
    """What ``--stages --peer`` profiles for the call ``fn``: (run, "graph") for a replay of its CUDA graph, or
    (fn, "eager") with the reason when the graph cannot be captured or its replay shows no device activity to the
    profiler."""
    from harness import kernel_profile

    try:
        replay = capture(fn).replay
    except Exception as exc:
        return fn, "eager", f"graph capture failed ({type(exc).__name__}: {exc})"
    if not kernel_profile.kernel_times(profile(replay)):
        return fn, "eager", "the profiler saw no device activity in a graph replay"
    return replay, "graph", None


def bench_peer_stages(workloads: list[str], our_variants: list[str], provider, peer, rounds: int,
                      capture=None, profile=None, build_inputs=None, device: str = "cuda") -> dict:
    """Per workload and variant of ours: the device time of one whole call by stage, ours against the peer's
    counterpart variant (``counterpart``), from ``rounds`` profiled calls each, alternating
    (``harness.kernel_profile``), both providers tuned afresh for each round (``tuned_afresh``). ``capture(fn)``
    returns a graph with ``replay`` (``cuda_timing.capture_graph``); a call whose graph cannot be profiled is
    profiled as eager calls, and the report says so."""
    from harness import kernel_profile
    from harness.checks.providers import provider_name

    if build_inputs is None:
        from harness.cases.builder import build_inputs
    if capture is None:
        from harness.cuda_timing import capture_graph as capture
    if profile is None:
        kernel_profile.start_profiler()
        profile = kernel_profile.profile_call
    tables, skipped = [], []
    for workload in workloads:
        entries, lines = workload_entries(workload, provider, our_variants, peer)
        skipped += lines
        peer_variants = [e.variant for e in entries if e.side == "peer"]
        if not peer_variants:
            skipped.append(f"{workload}: the peer runs no variant of it")
            continue
        inputs = build_inputs(workload_case(workload), device)
        fns = {f"{e.side} {e.variant}": _call(provider if e.side == "ours" else peer, inputs, e.call)
               for e in entries}
        calls: dict[str, list[dict]] = {label: [] for label in fns}
        eager: set[str] = set()
        for _ in range(rounds):
            with tuned_afresh([provider, peer]):
                runs = {}  # this round's graphs (the round before's are freed here)
                for label, fn in fns.items():
                    runs[label], source, why = _profiled_run(fn, capture, profile)
                    if why and label not in eager:
                        skipped.append(f"{workload} {label}: {why}; profiled as eager calls")
                    if source == "eager":
                        eager.add(label)
            for label, profiled in kernel_profile.profile_rounds(runs, 1, profile).items():
                calls[label] += profiled
        sources = {label: "eager" if label in eager else "graph" for label in fns}
        summaries = {label: kernel_profile.summarize_calls(c) for label, c in calls.items()}
        for e in entries:
            if e.side != "ours":
                continue
            ours, theirs = f"ours {e.variant}", f"peer {counterpart(e.call['path'], peer_variants)}"
            tables.append({
                "workload": workload, "variant": e.variant, "peer_variant": theirs.split(" ", 1)[1],
                "rounds": rounds, "ours_source": sources[ours], "peer_source": sources[theirs],
                "rows": kernel_profile.compare(summaries[ours], summaries[theirs]),
                "ours": summaries[ours], "peer": summaries[theirs],
            })
    return {"peer_name": provider_name(peer), "tables": tables, "skipped": skipped}


# ---- stages against a peer, each alone -------------------------------------------------------------------------------


def bench_stages_alone(workloads: list[str], our_variants: list[str], provider, peer, rounds: int, reps: int,
                       timings: dict | None = None, build_inputs=None, device: str = "cuda") -> dict:
    """Per workload and variant of ours: each stage launched alone (the ``stage_launches`` hook of both providers),
    ours against the peer's counterpart variant (``counterpart``), once per way of timing it (``timings``: name ->
    (``timer(fn, reps)``, what it does), default ``harness.stage_bench.ALONE_TIMINGS``: launches back to back, as
    ``bench --stages`` times ours, and each launch after an L2 flush). In each of ``rounds`` rounds both providers
    tune afresh (``tuned_afresh``) and every stage of every call is launched once (its tuning, outside any graph)
    and timed each way; a stage's figure is its median over the rounds, one table per way. A stage alone neither
    waits for another kernel nor shares the GPU with one: where a call runs kernels side by side, the profiled
    comparison splits their shared time by start order, this one not at all. A provider without the hook, or whose
    hook refuses a call (NotImplementedError), gets a line saying so and no table."""
    from harness import kernel_profile
    from harness.checks.hooks import stage_launches_hook
    from harness.checks.providers import provider_name

    if build_inputs is None:
        from harness.cases.builder import build_inputs
    timings = ALONE_TIMINGS if timings is None else timings
    report = {"peer_name": provider_name(peer), "rounds": rounds, "tables": [], "skipped": []}
    hooks = {}
    for side, p in (("ours", provider), ("peer", peer)):
        hooks[side], why = stage_launches_hook(p)
        if hooks[side] is None:
            report["skipped"].append(why)
    if None in hooks.values():
        return report
    for workload in workloads:
        entries, lines = workload_entries(workload, provider, our_variants, peer)
        report["skipped"] += lines
        if not any(e.side == "peer" for e in entries):
            report["skipped"].append(f"{workload}: the peer runs no variant of it")
            continue
        inputs = build_inputs(workload_case(workload), device)
        launches = {}
        for e in entries:
            label = f"{e.side} {e.variant}"
            extra = {k: v for k, v in e.call.items() if k != "path"}
            try:
                launches[label] = hooks[e.side](**inputs.kwargs(path=e.call["path"]), **extra)
            except NotImplementedError as exc:
                report["skipped"].append(f"{workload} {label}: no stage launches: {exc}")
        # timing -> label -> stage -> the round's figures
        samples: dict[str, dict[str, dict[str, list[float]]]] = {t: {label: {} for label in launches} for t in timings}
        for _ in range(rounds):
            with tuned_afresh([provider, peer]):
                for label, stages in launches.items():
                    for stage, fn in stages.items():
                        fn()
                        for timing, (timer, _) in timings.items():
                            samples[timing][label].setdefault(stage, []).append(timer(fn, reps))
        for timing, by_label in samples.items():
            medians = {label: {stage: statistics.median(us) for stage, us in stages.items()}
                       for label, stages in by_label.items()}
            peer_variants = [label.split(" ", 1)[1] for label in medians if label.startswith("peer ")]
            for e in entries:
                ours = f"ours {e.variant}"
                theirs = f"peer {counterpart(e.call['path'], peer_variants)}"
                if e.side != "ours" or ours not in medians or theirs not in medians:
                    continue
                rows = kernel_profile.stage_rows(medians[ours], medians[theirs], side_by_side=False)
                o, p = sum(medians[ours].values()), sum(medians[theirs].values())
                rows.append({"stage": "sum of stages", "ours_us": o, "peer_us": p, "ratio": ratio(o, p)})
                report["tables"].append({"workload": workload, "variant": e.variant, "peer_variant": theirs[5:],
                                         "timing": timing, "timing_note": timings[timing][1], "rows": rows,
                                         "ours": medians[ours], "peer": medians[theirs]})
    return report


def print_stages_alone(report: dict) -> None:
    from harness import kernel_profile

    for table in report["tables"]:
        print(f"== {table['workload']}: ours {table['variant']} vs {report['peer_name']} {table['peer_variant']} "
              f"(each stage alone, {table['timing']}: {table['timing_note']}; us per launch, median of "
              f"{report['rounds']} rounds)")
        kernel_profile.print_rows(table["rows"])
    for line in report["skipped"]:
        print(f"skipped (stages alone): {line}")


# ---- the command -----------------------------------------------------------------------------------------------------


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def chosen_configs() -> dict[str, dict[str, str]]:
    """The config each of our autotuned kernels runs per tuning key in this process (``Autotuner.cache``): what two
    runs compare to show that they ran the same binaries."""
    from triton.runtime.autotuner import Autotuner

    from kernels.warmup import watched_kernels

    return {kernel.base_fn.__name__: {repr(key): str(config) for key, config in sorted(kernel.cache.items(), key=repr)}
            for kernel in watched_kernels() if isinstance(kernel, Autotuner) and kernel.cache}


def record_configs(log: dict[str, dict[str, list[str]]]) -> None:
    """Add ``chosen_configs()`` to ``log`` (kernel -> tuning key -> every config it ran under that key, in order
    of first use): tuned afresh each round, a key that ran two configs in one process shows both."""
    for kernel, configs in chosen_configs().items():
        for key, config in configs.items():
            kept = log.setdefault(kernel, {}).setdefault(key, [])
            if config not in kept:
                kept.append(config)


def kernel_launches() -> dict | None:
    """How our kernels launched so far in this process (``kernels.direct_launch``): the launcher's kind, its direct
    launches and those through Triton's path; None where the module was never imported (another provider)."""
    module = sys.modules.get("kernels.direct_launch")
    if module is None:
        return None
    launches = module.LAUNCHES
    replays = sys.modules.get("kernels.call_replay")
    return {"launcher": type(launches).__name__, "direct": launches.direct, "through_triton": launches.through_triton,
            "replayed_calls": replays.REPLAYS.replays if replays is not None else 0}


def trials_by_kernel(trials: list[tuple[str, dict[str, list[str]]]]) -> dict[str, dict]:
    """``bench``'s ``trials`` per kernel: its configs timed in each round, and the distinct configs among them."""
    by_kernel: dict[str, dict] = {}
    for workload, timed in trials:
        for kernel, configs in timed.items():
            entry = by_kernel.setdefault(kernel, {"timed_per_round": [], "configs": []})
            entry["timed_per_round"].append([workload, len(configs)])
            entry["configs"] += [c for c in dict.fromkeys(configs) if c not in entry["configs"]]
    return by_kernel


def trial_lines(by_kernel: dict[str, dict]) -> list[str]:
    """What tuning afresh timed, one line per kernel: trials per round, then each distinct config timed."""
    lines = []
    for kernel, entry in by_kernel.items():
        per_round = ", ".join(str(n) for _, n in entry["timed_per_round"])
        lines.append(f"tuned afresh {kernel}: configs timed per round {per_round}")
        lines += [f"  timed {kernel}: {config}" for config in entry["configs"]]
    return lines


def _meta(args, peer) -> dict:
    from harness.checks.providers import provider_name

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "commit": os.environ.get("COMMIT") or _commit(),
            "provider": args.provider, "reps": args.reps, "rounds": args.rounds}
    if peer is not None:
        meta.update(peer=args.peer, peer_name=provider_name(peer), peer_source=str(getattr(peer, "source", "")))
    return meta


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness bench",
        description="Time the SSD prefill paths on the GPU (CUDA graph replays, medians; and each eager call's "
                    "host time), ours and optionally a peer's, on the bench workloads.")
    parser.add_argument("--workload", action="append", choices=list(WORKLOADS),
                        help="repeatable; default all (--stages without --peer: prefill-4256)")
    parser.add_argument("--variant", action="append", choices=list(ALL_VARIANTS),
                        help="variant of ours, repeatable; default snapshot-torch, snapshot-fused, indexed "
                             "(--stages: snapshot-fused); the peer runs its supported paths")
    parser.add_argument("--reps", type=int, default=200,
                        help="graph replays per measurement (queued in batches; the median batch's time per call)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="measurements of each call, alternating ours and the peer's (median and best "
                             "reported; --stages --peer: profiled calls of each)")
    parser.add_argument("--provider", default=DEFAULT_PROVIDER, metavar="MODULE:ATTR",
                        help=f"the provider to time: ours (default: {DEFAULT_PROVIDER})")
    parser.add_argument("--peer", metavar="MODULE:ATTR",
                        help="a provider to compare with, timed in the same process on the same inputs "
                             "(e.g. peers.vllm_ssd:provider)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--stages", action="store_true",
                        help="without --peer: time each stage of ours alone, as tuned and with every candidate "
                             "config forced (harness.stage_bench); with --peer: device time per stage of one whole "
                             "call of each, from torch.profiler (harness.kernel_profile), then each stage of each "
                             "launched alone (the stage_launches hook)")
    parser.add_argument("--alone-timing", action="append", choices=list(ALONE_TIMINGS),
                        help="how --stages times a stage launched alone, repeatable: back-to-back (twenty launches a "
                             "graph: each finds in L2 what the one before left) or after-L2-flush (each launch after "
                             "a read of twice L2); default: back-to-back, and with --peer both")
    return parser


def _write(path: str | None, report: dict) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(report, fh, indent=2)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from harness.checks.providers import ProviderError, check_provider_spec

    if args.rounds < 1 or args.reps < 1:
        print("bench: --rounds and --reps must be at least 1", file=sys.stderr)
        return 2
    try:
        for spec in [args.provider] + ([args.peer] if args.peer else []):
            check_provider_spec(spec)
    except ProviderError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench: needs a CUDA device (timings under the interpreter mean nothing); nothing was timed",
              file=sys.stderr)
        return 2
    with _tuning_for_itself():
        return _run(args)


@contextlib.contextmanager
def _tuning_for_itself():
    """The bench tunes for itself, at the kernels' full budget, before kernels are imported: tuning results a
    parallel test run cached (short budget, on a shared GPU) must not pick the configs it times. Both settings are
    given back at the end, so that a caller in the same process (a test) keeps its own."""
    from harness.backend import AUTOTUNE_CACHE_ENV, restore_environment
    from kernels.environment import AUTOTUNE_BUDGET_ENV

    before = dict(os.environ)
    os.environ[AUTOTUNE_CACHE_ENV] = "0"
    os.environ.pop(AUTOTUNE_BUDGET_ENV, None)
    try:
        yield
    finally:
        restore_environment(before, (AUTOTUNE_CACHE_ENV, AUTOTUNE_BUDGET_ENV))


def _run(args: argparse.Namespace) -> int:
    from harness.checks.providers import ProviderError, load_provider

    try:
        provider = load_provider(args.provider)
        peer = load_provider(args.peer) if args.peer else None
    except ProviderError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    if args.stages and peer is None:
        from harness import stage_bench

        variant = (args.variant or ["snapshot-fused"])[0]
        cases = {w: workload_case(w) for w in args.workload or ["prefill-4256"]}
        if len(args.alone_timing or []) > 1:
            print("bench: --stages without --peer times one way: give --alone-timing once", file=sys.stderr)
            return 2
        timing = (args.alone_timing or [DEFAULT_TIMING])[0]
        report = stage_bench.bench_stages(provider, cases, variant, ALL_VARIANTS[variant], args.reps, timing)
        report["meta"] = _meta(args, None)
        _write(args.json, report)
        stage_bench.print_stage_report({k: v for k, v in report.items() if k != "meta"})
        return 0
    workloads = args.workload or list(WORKLOADS)
    if args.stages:
        from harness import kernel_profile

        variants = args.variant or ["snapshot-fused"]
        report = bench_peer_stages(workloads, variants, provider, peer, args.rounds)
        timings = {name: ALONE_TIMINGS[name] for name in args.alone_timing or ALONE_TIMINGS}
        report["alone"] = bench_stages_alone(workloads, variants, provider, peer, args.rounds, args.reps, timings)
        report["meta"] = _meta(args, peer)
        _write(args.json, report)
        kernel_profile.print_comparison(report)
        print_stages_alone(report["alone"])
        return 0 if report["tables"] else 2
    from harness.cuda_timing import GraphTimer

    configs: dict[str, dict[str, list[str]]] = {}
    before = kernel_launches()
    trials: list[tuple[str, dict[str, list[str]]]] = []
    entries, skipped = bench(workloads, args.variant or default_variants(provider), provider, peer, args.rounds,
                             GraphTimer(args.reps), configs=configs, trials=trials)
    summary = summarize(entries, skipped)
    launches = kernel_launches()
    if launches is not None and before is not None:  # this run's launches: whether the direct path was taken
        launches.update(direct=launches["direct"] - before["direct"],
                        through_triton=launches["through_triton"] - before["through_triton"],
                        replayed_calls=launches["replayed_calls"] - before["replayed_calls"])
    summary["meta"] = {**_meta(args, peer), "configs": configs, "kernel_launches": launches,
                       "tuning_trials": trials_by_kernel(trials)}
    _write(args.json, summary)
    print_table(summary)
    if launches is not None:
        print(f"our kernels' launches in this run: {launches['direct']} direct, {launches['through_triton']} through "
              f"Triton's path ({launches['launcher']}); whole calls replayed: {launches['replayed_calls']}")
    for kernel, by_key in configs.items():
        for key, ran in by_key.items():
            for config in ran:
                print(f"config {kernel} {key}: {config}")
    for line in trial_lines(summary["meta"]["tuning_trials"]):
        print(line)
    if not any(e.samples for e in entries):
        return 2  # nothing was timed
    return 1 if any(e.error for e in entries) else 0

