"""Destructive-autotuning guard (docs/checks.md, issue 4).

An autotuned kernel is launched once per config (and, on the GPU, many times per config) on the first call with a
new tuning key. A kernel that reads what it writes (``x += 1``, or an initial state read from the same cache slot
the final state is written to) leaves different bytes after tuning than one clean launch would: the first call in
a fresh process then differs from every later call. Tuning results live in each autotuner's in-memory cache and in
the disk cache, so whether a call tunes at all depends on what ran before it; the guard takes that out of the
picture. ``check_autotune_safe``:

1. snapshots the storage of every tensor argument once per storage (aliases share one snapshot and are restored
   together, so a cache and a view into it stay consistent);
2. runs the call inside ``fresh_autotune_state``: every Triton autotuner the call launches, whoever's kernel it is,
   is found at its first launch (a hook on ``Autotuner.run``) and made to tune from scratch there: its in-memory
   cache emptied, the disk cache off, so a tuning key tuned earlier in the process is tuned again. Trials run
   through the deterministic ``FakeBench`` on every backend: the question is whether a trial launch changes the
   result, not which config is fastest, and Triton's GPU ``do_bench`` spends 25 + 100 ms of repetitions per config
   and picks by timing noise, where the stand-in launches each config once and picks reproducibly. Every tuner's
   benchmarker is wrapped by a ``TrialCount`` that counts the configs benchmarked and every trial launch (each
   ``kernel_call`` the benchmarker makes, with the autotuner's own pre/post hooks, e.g. ``restore_value``);
3. raises ``NothingTuned`` when the call launched no autotuner or none ran a trial: nothing was checked;
4. saves what the tuned call left, restores the snapshot and runs the call again with the chosen configs cached (a
   replay; any tuning during it is an error);
5. compares every storage byte for byte, and the returned tensors bit for bit, reporting the autotuned kernels with
   their chosen configs.

Every autotuner gets back its cache, disk-cache switch and benchmarker when the guard ends, so the rest of the
process sees none of it. The Triton internals this relies on are in ``harness.triton_autotuner``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, MutableMapping

import torch

from harness import triton_autotuner as tt
from harness.compare import Mismatch, assert_bits_equal, assert_storage_equal, storage_bytes
from harness.guards.specialization import kernel_name


class DestructiveAutotuning(AssertionError):
    """Tuning trials changed what the call leaves in memory. ``report`` (an ``AutotuneReport``) holds what was
    tuned and counted, when the call got that far."""

    def __init__(self, message: str, report: "AutotuneReport | None" = None):
        super().__init__(message)
        self.report = report


class NothingTuned(Exception):
    """The call launched no autotuner, or none ran a tuning trial: the guard had nothing to check. ``report`` says
    which autotuners were launched."""

    def __init__(self, message: str, report: "AutotuneReport"):
        super().__init__(message)
        self.report = report


class TrialCount:
    """Wraps autotuner benchmarkers: counts configs benchmarked (``configs``, one per benchmarker call) and trial
    launches (``launches``, one per ``kernel_call`` the benchmarker makes). Backend-independent: the autotuner
    hands every trial to its benchmarker (``harness.triton_autotuner``), whichever benchmarker that is."""

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


class TuningFromScratch:
    """What ``fresh_autotune_state`` yields: the autotuners launched so far (in order of first launch), the trial
    count, and the switch to replay mode."""

    def __init__(self, do_bench: Callable):
        self.tuners: list[Any] = []
        self.trials = TrialCount()
        self.tuned_in_replay: list[str] = []
        self._do_bench = do_bench
        self._saved: dict[int, tt.TunerState] = {}
        self._replaying = False

    def launched(self, tuner: Any) -> None:
        """At an autotuner's first launch inside the state: remember it as found, then make it tune from scratch."""
        if id(tuner) in self._saved:
            return
        self._saved[id(tuner)] = tt.save_state(tuner)
        self.tuners.append(tuner)
        tt.forget_tuning(tuner)
        if self._replaying:
            tt.set_benchmarker(tuner, self._no_tuning(tuner))
        else:
            tt.set_benchmarker(tuner, self.trials.wrap(self._do_bench))

    def replay(self) -> None:
        """From now on, tuning is an error: every launch must find its key tuned already."""
        self._replaying = True
        for t in self.tuners:
            tt.set_benchmarker(t, self._no_tuning(t))

    def _no_tuning(self, tuner: Any) -> Callable:
        def refuse(kernel_call, *args, **kwargs):
            self.tuned_in_replay.append(kernel_name(tuner))
            raise DestructiveAutotuning(
                f"the replay tried to tune {kernel_name(tuner)}: its tuning key changed between the tuned call and "
                "the replay (or it was not launched in the tuned call), so the chosen config cannot be re-run")

        return refuse

    def chosen(self) -> dict[str, list[str]]:
        """Kernel -> the config chosen per tuning key, for the keys tuned inside the state."""
        return {kernel_name(t): [f"key {k}: {cfg}" for k, cfg in tt.tuned_configs(t).items()] for t in self.tuners}

    def restore(self) -> None:
        for t in self.tuners:
            tt.restore_state(t, self._saved[id(t)])


@contextlib.contextmanager
def fresh_autotune_state(do_bench: Callable | None = None) -> Iterator[TuningFromScratch]:
    """Every autotuner launched inside tunes from scratch: in-memory cache emptied at its first launch, disk cache
    off, benchmarker counted: ``do_bench`` when given, else a ``FakeBench`` for every autotuner, including ones that
    bring their own benchmarker (a GPU one cannot run under the interpreter, and timing is not what is checked).
    Each one's cache, disk-cache switch and benchmarker are restored on exit.
    """
    tt.require_supported()
    if do_bench is None:
        do_bench = FakeBench()
    state = TuningFromScratch(do_bench)
    try:
        with tt.disk_cache_off(), tt.launches_reported(state.launched):
            yield state
    finally:
        state.restore()


def _named_tensors(obj: Any, name: str, out: list[tuple[str, torch.Tensor]]) -> None:
    if isinstance(obj, torch.Tensor):
        out.append((name, obj))
    elif isinstance(obj, (list, tuple)):
        for i, o in enumerate(obj):
            _named_tensors(o, f"{name}[{i}]", out)
    elif isinstance(obj, dict):
        for k, o in obj.items():
            _named_tensors(o, f"{name}[{k!r}]" if name else str(k), out)


def call_tensors(call: Callable, args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in ``args``, ``kwargs`` and, for a ``functools.partial``, its bound
    arguments: positional ones as ``argN``, keyword ones by their keyword."""
    found: list[tuple[str, torch.Tensor]] = []
    for i, a in enumerate(list(getattr(call, "args", ())) + list(args)):
        _named_tensors(a, f"arg{i}", found)
    _named_tensors({**getattr(call, "keywords", {}), **kwargs}, "", found)
    return found


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
        self.write(self.saved)

    def write(self, contents: list[torch.Tensor]) -> None:
        """Put ``contents`` (one uint8 copy per storage, as ``current`` gives) back into the storages."""
        for t, saved in zip(self.tensors, contents, strict=True):
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
    autotuners: list[str] = field(default_factory=list)  # every autotuner launched, in order of first launch

    def as_stats(self) -> dict:
        return {"autotuners": self.autotuners, "chosen": self.chosen, "trial_launches": self.trials,
                "configs_benchmarked": self.configs_benchmarked, "storages": self.storages}


def _returned_copies(returned: Any) -> list[tuple[str, torch.Tensor]]:
    found: list[tuple[str, torch.Tensor]] = []
    _named_tensors(returned, "returned", found)
    return [(name, t.detach().clone()) for name, t in found]


def _compare_returned(replayed: Any, tuned: list[tuple[str, torch.Tensor]]) -> list[str]:
    now = _returned_copies(replayed)
    if [n for n, _ in now] != [n for n, _ in tuned]:
        return [f"returned tensors: the tuned call returned {[n for n, _ in tuned]}, the replay {[n for n, _ in now]}"]
    failures = []
    for (name, got), (_, expected) in zip(now, tuned, strict=True):
        try:
            assert_bits_equal(got, expected, what=f"{name} (replay vs tuned call)")
        except Mismatch as e:
            failures.append(e.report)
    return failures


@contextlib.contextmanager
def emptied(caches: Iterable[MutableMapping]) -> Iterator[None]:
    """Each mapping empty inside the block, its content back afterwards."""
    caches = list(caches)
    saved = [dict(c) for c in caches]
    for c in caches:
        c.clear()
    try:
        yield
    finally:
        for c, content in zip(caches, saved, strict=True):
            c.clear()
            c.update(content)


def check_autotune_safe(
    call: Callable[..., Any],
    *,
    args: tuple = (),
    kwargs: dict | None = None,
    do_bench: Callable | None = None,
    own_caches: Iterable[MutableMapping] = (),
) -> AutotuneReport:
    """Run ``call(*args, **kwargs)`` with every autotuner it launches tuning from scratch and prove the trials left
    no trace.

    Tensors are found in ``args``, ``kwargs`` and, for a ``functools.partial``, its bound arguments. Raises
    ``DestructiveAutotuning`` naming the storage, the differing bytes and the kernels' chosen configs,
    ``NothingTuned`` when no autotuner ran a trial; returns what was tuned otherwise. Leaves the tensors as the
    tuned call left them. ``own_caches``: tuning results the caller's code keeps outside Triton's autotuners
    (``harness.checks.hooks.tuning_caches``), emptied for the tuned call (kept for the replay) and restored after.
    """
    kwargs = dict(kwargs or {})
    named = call_tensors(call, args, kwargs)
    if not named:
        raise ValueError("check_autotune_safe: the call has no tensor arguments to snapshot")
    snap = StorageSnapshot.take(named)
    with fresh_autotune_state(do_bench) as state, emptied(own_caches):
        returned = _returned_copies(call(*args, **kwargs))
        report = AutotuneReport(state.chosen(), state.trials.launches, len(snap.tensors), state.trials.configs,
                                [kernel_name(t) for t in state.tuners])
        if not state.tuners:
            raise NothingTuned("the call launched no Triton autotuner, so there was no tuning to check", report)
        if state.trials.launches == 0:
            raise NothingTuned(f"the call launched the autotuners {report.autotuners} but none ran a tuning trial "
                               "(one config per tuning key), so there was no tuning to check", report)
        tuned = snap.current()
        snap.restore()
        state.replay()
        try:
            replayed = call(*args, **kwargs)
        except DestructiveAutotuning as e:
            e.report = report
            raise
        if state.tuned_in_replay:  # raised inside the call, which may have swallowed it
            raise DestructiveAutotuning(f"the replay tried to tune {sorted(set(state.tuned_in_replay))}: the tuning "
                                        "keys changed between the tuned call and the replay", report)
    failures = []
    for t, name, after_tuning in zip(snap.tensors, snap.names, tuned, strict=True):
        try:
            assert_storage_equal(t, after_tuning, what=f"storage of {name} (replay vs tuned call)",
                                 element=t.dtype)
        except Mismatch as e:
            failures.append(e.report)
    failures += _compare_returned(replayed, returned)
    snap.write(tuned)  # leave the tensors as the tuned call left them
    if failures:
        configs = "\n".join(f"  {k}: " + "; ".join(v) for k, v in report.chosen.items())
        raise DestructiveAutotuning(
            "autotuning trials changed memory: replaying the chosen config(s) once from the snapshot differs from "
            f"what the tuned call left ({report.trials} trial launches over {report.configs_benchmarked} "
            f"config benchmarks)\nchosen configs:\n{configs}\n" + "\n".join(failures), report)
    return report
