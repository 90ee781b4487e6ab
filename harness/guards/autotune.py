"""Destructive-autotuning guard (docs/checks.md, issue 4).

An autotuned kernel is launched once per config (and, on the GPU, many times per config) on the first call with a
new tuning key. A kernel that reads what it writes (``x += 1``, or an initial state read from the same cache slot
the final state is written to) leaves different bytes after tuning than one clean launch would: the first call in
a fresh process then differs from every later call. The guard:

1. snapshots the storage of every tensor argument once per storage (aliases share one snapshot and are restored
   together, so a cache and a view into it stay consistent);
2. clears the autotuners' in-memory caches with the disk autotune cache off, so the call really tunes;
3. runs the call (trials run; under the interpreter through a deterministic ``do_bench`` stand-in, since there is
   no GPU benchmarker there). Every tuner's benchmarker is wrapped by a ``TrialCount`` that counts the configs
   benchmarked and every trial launch (each ``kernel_call`` the benchmarker makes): on the GPU that is Triton's
   ``do_bench`` (one warmup call, five estimate calls, then as many warmup and timed repetitions as fit in 25 and
   100 ms), under the interpreter the stand-in; the count is the same mechanism on both;
4. saves what the tuned call left, restores the snapshot and runs the call again with the chosen configs cached (a
   replay; any tuning during it is an error);
5. compares every storage byte for byte, reporting the autotuned kernels with their chosen configs.

Version notes (Triton 3.4 .. 3.9): ``Autotuner.cache`` (tuning key -> Config), ``cache_results`` and the
``do_bench`` cached_property (instance ``__dict__`` override) are present throughout; ``knobs.autotuning.cache`` is
the global disk-cache switch from 3.4 on.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch
from triton import knobs

from harness.compare import Mismatch, assert_storage_equal, storage_bytes
from harness.guards.specialization import kernel_name


class DestructiveAutotuning(AssertionError):
    """Tuning trials changed what the call leaves in memory. ``report`` (an ``AutotuneReport``) holds what was
    tuned and counted, when the call got that far."""

    def __init__(self, message: str, report: "AutotuneReport | None" = None):
        super().__init__(message)
        self.report = report


class TrialCount:
    """Wraps autotuner benchmarkers: counts configs benchmarked (``configs``, one per benchmarker call) and trial
    launches (``launches``, one per ``kernel_call`` the benchmarker makes). Backend-independent: the autotuner
    hands every trial to ``self.do_bench(kernel_call, quantiles=...)`` (``Autotuner._bench``), whichever
    benchmarker that is."""

    def __init__(self):
        self.configs = 0
        self.launches = 0

    def wrap(self, bench: Callable) -> Callable:
        def counted(kernel_call, *args, **kwargs):
            self.configs += 1

            def call():
                self.launches += 1
                return kernel_call()

            return bench(call, *args, **kwargs)

        return counted


class FakeBench:
    """``do_bench`` stand-in: run each trial ``reps`` times and return deterministic timings.

    Timings rank configs by their position in ``ranking`` (config index -> time; default: list order, first wins),
    so the chosen config is reproducible; ``calls`` counts trial launches.
    """

    def __init__(self, reps: int = 1, ranking: Callable[[int], float] | None = None):
        if reps < 1:
            raise ValueError(f"reps: expected >= 1, found {reps}")
        self.reps = reps
        self.ranking = ranking or float
        self.calls = 0
        self._trial = 0

    def __call__(self, kernel_call, quantiles=(0.5, 0.2, 0.8), **_):
        for _ in range(self.reps):
            kernel_call()
            self.calls += 1
        t = self.ranking(self._trial)
        self._trial += 1
        return [t for _ in quantiles] if quantiles else t


def _no_tuning(kernel_call, quantiles=None, **_):
    raise DestructiveAutotuning("the replay tried to tune: the tuning key changed between the tuned call and the "
                                "replay, so the chosen config cannot be re-run")


def _autotuners(kernels: Iterable[Any]) -> list[Any]:
    found = []
    for k in kernels:
        if not (hasattr(k, "configs") and hasattr(k, "cache")):
            raise TypeError(f"{k!r} is not an autotuned kernel (triton.autotune)")
        found.append(k)
    return found


@contextlib.contextmanager
def fresh_autotune_state(kernels: Iterable[Any], do_bench: Callable | None = None) -> Iterator[list[Any]]:
    """Empty in-memory tuning caches, disk autotune cache off, optional ``do_bench`` stand-in; restored on exit.

    Under the interpreter ``do_bench=None`` installs a ``FakeBench`` (the GPU benchmarker does not exist there).
    """
    tuners = _autotuners(kernels)
    if do_bench is None and knobs.runtime.interpret:
        do_bench = FakeBench()
    saved = [(t, dict(t.cache), t.cache_results, t.__dict__.get("do_bench", None), "do_bench" in t.__dict__)
             for t in tuners]
    disk = knobs.autotuning.cache
    knobs.autotuning.cache = False
    try:
        for t in tuners:
            t.cache.clear()
            t.cache_results = False
            if do_bench is not None:
                t.__dict__["do_bench"] = do_bench  # overrides the cached_property for this instance
        yield tuners
    finally:
        knobs.autotuning.cache = disk
        for t, cache, cache_results, bench, had_bench in saved:
            t.cache.clear()
            t.cache.update(cache)
            t.cache_results = cache_results
            if had_bench:
                t.__dict__["do_bench"] = bench
            else:
                t.__dict__.pop("do_bench", None)


def _tensors_in(obj: Any, out: list[torch.Tensor]) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors_in(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors_in(o, out)


@dataclass
class StorageSnapshot:
    """One snapshot per distinct storage: aliased tensors share an entry."""

    tensors: list[torch.Tensor]  # one representative per storage
    names: list[str]
    saved: list[torch.Tensor]  # uint8 CPU copies of every byte

    @staticmethod
    def take(named: list[tuple[str, torch.Tensor]]) -> "StorageSnapshot":
        by_storage: dict[tuple, int] = {}
        snap = StorageSnapshot([], [], [])
        for name, t in named:
            ident = (t.device, t.untyped_storage().data_ptr())
            if ident in by_storage:
                snap.names[by_storage[ident]] += f" = {name}"
                continue
            by_storage[ident] = len(snap.tensors)
            snap.tensors.append(t)
            snap.names.append(name)
            snap.saved.append(storage_bytes(t))
        return snap

    def restore(self) -> None:
        for t, saved in zip(self.tensors, self.saved):
            whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
            whole.copy_(saved.to(t.device))

    def current(self) -> list[torch.Tensor]:
        return [storage_bytes(t) for t in self.tensors]


@dataclass
class AutotuneReport:
    chosen: dict[str, list[str]] = field(default_factory=dict)  # kernel -> chosen config per tuning key
    trials: int = 0  # trial launches (every kernel_call of every benchmarker, GPU or stand-in)
    storages: int = 0
    configs_benchmarked: int = 0  # benchmarker calls: one per (tuning key, config) tried


def _describe_choices(tuners: list[Any]) -> dict[str, list[str]]:
    return {kernel_name(t): [f"key {k}: {cfg}" for k, cfg in t.cache.items()] for t in tuners}


def check_autotune_safe(
    call: Callable[..., Any],
    kernels: Iterable[Any],
    *,
    args: tuple = (),
    kwargs: dict | None = None,
    do_bench: Callable | None = None,
) -> AutotuneReport:
    """Run ``call(*args, **kwargs)`` with tuning from scratch and prove the trials left no trace.

    kernels: the autotuned kernels (``triton.autotune`` objects) the call may tune. Tensors are found in ``args``,
    ``kwargs`` and, for a ``functools.partial``, its bound arguments. Raises ``DestructiveAutotuning`` naming the
    storage, the differing bytes and the kernels' chosen configs; returns what was tuned otherwise. Leaves the
    tensors as the tuned call left them.
    """
    kwargs = dict(kwargs or {})
    found: list[torch.Tensor] = []
    _tensors_in(list(getattr(call, "args", ())) + list(args), found)
    _tensors_in({**getattr(call, "keywords", {}), **kwargs}, found)
    if not found:
        raise ValueError("check_autotune_safe: the call has no tensor arguments to snapshot")
    named = [(f"tensor{i} {tuple(t.shape)} {t.dtype}", t) for i, t in enumerate(found)]
    snap = StorageSnapshot.take(named)
    bench = do_bench if do_bench is not None else (FakeBench() if knobs.runtime.interpret else None)
    count = TrialCount()
    with fresh_autotune_state(kernels, bench) as tuners:
        for t in tuners:
            # t.do_bench: the stand-in just installed, else the tuner's own (its do_bench= or the GPU benchmarker)
            t.__dict__["do_bench"] = count.wrap(t.do_bench)
        call(*args, **kwargs)
        chosen = _describe_choices(tuners)
        report = AutotuneReport(chosen, count.launches, len(snap.tensors), count.configs)
        if not any(chosen.values()) or count.launches == 0:
            raise DestructiveAutotuning(
                "no autotuner tuned during the call (single-config kernels or none launched): the guard checked "
                f"nothing; watched: {sorted(chosen)}", report)
        tuned = snap.current()
        snap.restore()
        for t in tuners:
            t.__dict__["do_bench"] = _no_tuning
        call(*args, **kwargs)
    failures = []
    for t, name, after_tuning in zip(snap.tensors, snap.names, tuned):
        try:
            assert_storage_equal(t, after_tuning, what=f"storage of {name} (replay vs tuned call)",
                                 element=t.dtype)
        except Mismatch as e:
            failures.append(e.report)
    # leave the tensors as the tuned call left them
    for t, after_tuning in zip(snap.tensors, tuned):
        torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).copy_(after_tuning.to(t.device))
    if failures:
        configs = "\n".join(f"  {k}: " + "; ".join(v) for k, v in chosen.items())
        raise DestructiveAutotuning(
            "autotuning trials changed memory: replaying the chosen config(s) once from the snapshot differs from "
            f"what the tuned call left ({report.trials} trial launches over {report.configs_benchmarked} "
            f"config benchmarks)\nchosen configs:\n{configs}\n" + "\n".join(failures), report)
    return report
