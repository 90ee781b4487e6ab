"""The Triton autotuner internals the harness relies on, in one place, checked against the running Triton.

The autotuning guard (``harness.guards.autotune``) makes every autotuner a call launches tune from scratch, counts
its trial launches and puts everything back afterwards; under the interpreter, autotuners that bring no benchmarker
of their own get a deterministic stand-in (``use_interpreter_benchmarker``); the bench makes every autotuner tune
again for each round (``harness.bench.tuned_afresh``). All three reach into
``triton.runtime.autotuner.Autotuner``, which is not a public API. What is relied on, for Triton 3.4 .. 3.9
(``kernels.triton_version.VERIFIED``, the one range the kernels' internals are checked against too;
``require_supported`` refuses other versions and a class that lacks any of it):

- ``Autotuner.run(self, *args, **kwargs)``: every launch of an autotuned kernel goes through it (``kernel[grid](...)``
  through ``KernelInterface.__getitem__``, ``triton.heuristics`` wrappers through ``self.fn.run``), so wrapping it on
  the class sees every autotuner a call launches, whoever wrote the kernel (a subclass that overrides ``run``
  without calling it would go unseen).
- ``Autotuner.cache``: dict tuning key -> chosen ``Config``; a key found there is not tuned again.
- ``Autotuner.cache_results``: the instance's switch for the disk cache of tuning results, fixed when the autotuner
  is created (from its ``cache_results=`` argument or ``knobs.autotuning.cache``, the process-wide switch, which is
  therefore not enough alone for autotuners that exist already).
- ``Autotuner.prune_configs(kwargs)``: the configs left for a launch after ``early_config_prune`` and the perf
  model, reading the positional arguments from ``Autotuner.nargs`` (``candidate_configs``); ``Autotuner.configs``,
  the instance's config list, and ``Autotuner.arg_names``.
- ``Autotuner.best_config``: the config its last launch ran (set by ``run`` before it launches).
- ``Autotuner.do_bench``: a ``functools.cached_property`` giving the benchmarker: the ``do_bench=`` argument (kept as
  ``_do_bench``), else ``driver.active.get_benchmarker()``, which needs a GPU driver and fails under the interpreter.
  An entry in the instance ``__dict__`` overrides it. ``Autotuner._bench(self, *args, config, **meta)`` hands every
  trial to ``self.do_bench(kernel_call, quantiles=...)``, one call per config benchmarked; wrapping it on the class
  sees every config any autotuner times (``trials_reported``: the bench says what tuning afresh ran).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import triton
from triton import knobs
from triton.runtime.autotuner import Autotuner

from kernels.triton_version import UnsupportedTriton, version_problem

_WHERE = "harness/triton_autotuner.py relies on Autotuner internals"
_INSTANCE_ATTRS = ("cache", "cache_results", "_do_bench", "configs", "arg_names")
_ABSENT = object()


def require_supported() -> None:
    """Raise ``UnsupportedTriton`` naming what differs, unless this Triton's ``Autotuner`` is as described above."""
    problem = version_problem(_WHERE)
    if problem is not None:
        raise UnsupportedTriton(problem)
    missing = []
    if not callable(Autotuner.__dict__.get("run")):
        missing.append("Autotuner.run")
    if not callable(Autotuner.__dict__.get("_bench")):
        missing.append("Autotuner._bench")
    if not callable(Autotuner.__dict__.get("prune_configs")):
        missing.append("Autotuner.prune_configs")
    if not isinstance(Autotuner.__dict__.get("do_bench"), functools.cached_property):
        missing.append("Autotuner.do_bench as a functools.cached_property")
    params = inspect.signature(Autotuner.__init__).parameters
    missing += [f"Autotuner(..., {p}=)" for p in ("do_bench", "cache_results") if p not in params]
    if not hasattr(knobs.autotuning, "cache"):
        missing.append("knobs.autotuning.cache")
    if not callable(getattr(knobs.autotuning, "scope", None)):
        missing.append("knobs.autotuning.scope")
    if missing:
        raise UnsupportedTriton(f"Triton {triton.__version__} lacks {', '.join(missing)}: {_WHERE}")


def _checked(tuner: Any) -> Any:
    for name in _INSTANCE_ATTRS:
        if not hasattr(tuner, name):
            raise UnsupportedTriton(f"Triton {triton.__version__}: autotuner {tuner!r} has no attribute {name!r}, "
                                    "which harness/triton_autotuner.py relies on")
    return tuner


def interpreting() -> bool:
    return bool(knobs.runtime.interpret)


@dataclass
class TunerState:
    """What the guard changes on one autotuner, as it found it."""

    cache: dict
    cache_results: bool
    bench_override: Any  # the instance's own ``do_bench`` entry, or _ABSENT


def save_state(tuner: Any) -> TunerState:
    _checked(tuner)
    return TunerState(dict(tuner.cache), tuner.cache_results, tuner.__dict__.get("do_bench", _ABSENT))


def restore_state(tuner: Any, state: TunerState) -> None:
    tuner.cache.clear()
    tuner.cache.update(state.cache)
    tuner.cache_results = state.cache_results
    if state.bench_override is _ABSENT:
        tuner.__dict__.pop("do_bench", None)
    else:
        tuner.__dict__["do_bench"] = state.bench_override


def forget_tuning(tuner: Any) -> None:
    """Make the next launch of every tuning key tune: empty in-memory cache, no disk cache."""
    tuner.cache.clear()
    tuner.cache_results = False


def tuned_configs(tuner: Any) -> dict:
    """Tuning key -> chosen config, as the autotuner holds them now."""
    return dict(tuner.cache)


def benchmarker(tuner: Any) -> Callable:
    """The benchmarker the autotuner would use now (an override, its ``do_bench=``, or Triton's default)."""
    return tuner.do_bench


def set_benchmarker(tuner: Any, bench: Callable) -> None:
    tuner.__dict__["do_bench"] = bench  # shadows the cached_property for this instance


@contextlib.contextmanager
def disk_cache_off() -> Iterator[None]:
    """Autotuners created meanwhile do not use the disk cache of tuning results (existing ones: ``forget_tuning``).
    Setting the knob also sets its environment variable; the knobs' scope gives both back as they were (the variable
    unset where it was)."""
    with knobs.autotuning.scope():
        knobs.autotuning.cache = False
        yield


@contextlib.contextmanager
def launches_reported(on_launch: Callable[..., None], arguments: bool = False,
                      on_return: Callable[[Any], None] | None = None) -> Iterator[None]:
    """Call ``on_launch(autotuner)`` at every launch of any autotuned kernel, before it tunes or runs; with
    ``arguments``, ``on_launch(autotuner, args, kwargs)`` with the launch's arguments. ``on_return(autotuner)``
    after the launch returns, when ``Autotuner.best_config`` holds the config it ran."""
    wrapped = Autotuner.__dict__["run"]

    @functools.wraps(wrapped)
    def run(self, *args, **kwargs):
        if arguments:
            on_launch(self, args, kwargs)
        else:
            on_launch(self)
        ret = wrapped(self, *args, **kwargs)
        if on_return is not None:
            on_return(self)
        return ret

    Autotuner.run = run
    try:
        yield
    finally:
        Autotuner.run = wrapped


@contextlib.contextmanager
def trials_reported(on_trial: Callable[[Any, Any], None]) -> Iterator[None]:
    """Call ``on_trial(autotuner, config)`` for every config any autotuner times (``Autotuner._bench``, one call per
    config benchmarked); a tuning answered from the disk cache of tuning results times none."""
    wrapped = Autotuner.__dict__["_bench"]

    @functools.wraps(wrapped)
    def _bench(self, *args, config, **meta):
        on_trial(self, config)
        return wrapped(self, *args, config=config, **meta)

    Autotuner._bench = _bench
    try:
        yield
    finally:
        Autotuner._bench = wrapped


@contextlib.contextmanager
def forced_config(tuner: Any, config: Any) -> Iterator[None]:
    """Run the autotuned kernel ``tuner`` with only ``config``: a one-config autotuner launches it without timing or
    pruning. Restores the configs and the tuning cache afterwards (``every_config``, ``bench --stages``, the tests
    of every config of our stages)."""
    saved_configs, saved_cache = tuner.configs, dict(tuner.cache)
    tuner.configs, tuner.cache = [config], {}
    try:
        yield
    finally:
        tuner.configs = saved_configs
        tuner.cache.clear()
        tuner.cache.update(saved_cache)


def candidate_configs(tuner: Any, args: tuple, kwargs: dict) -> list:
    """The configs the autotuner may choose from for a launch with these arguments: every config, after its
    ``early_config_prune`` and perf-model pruning (``Autotuner.prune_configs``, which reads the positional arguments
    from ``Autotuner.nargs``, as ``Autotuner.run`` sets them). A config pruned here is never benchmarked, so never
    chosen, for this launch."""
    _checked(tuner)
    if len(tuner.configs) <= 1:
        return list(tuner.configs)
    saved = getattr(tuner, "nargs", None)
    tuner.nargs = dict(zip(tuner.arg_names, args))  # noqa: B905 - as Autotuner.run: fewer args than names
    try:
        return list(tuner.prune_configs(kwargs))
    finally:
        tuner.nargs = saved


def interpreter_do_bench(kernel_call: Callable, quantiles=(0.5, 0.2, 0.8), **_):
    """Benchmarker for the interpreter, which has no GPU timer: equal times, so the first config (after pruning)
    wins, reproducibly. The trial is not launched (an interpreted trial costs as much as the call itself); what trial
    launches do to memory is checked by ``autotune_idempotent``, whose guard brings a benchmarker that runs each."""
    return [1.0] * len(quantiles) if quantiles else 1.0


class _InterpreterDefault(functools.cached_property):
    """``Autotuner.do_bench`` that falls back to ``interpreter_do_bench`` where Triton's default needs a GPU."""


def use_interpreter_benchmarker() -> None:
    """Under the interpreter, autotuners without a ``do_bench=`` of their own use ``interpreter_do_bench`` instead
    of Triton's default, which needs a GPU driver; without this every autotuned kernel that is not ours fails at its
    first launch there. Autotuners that bring a benchmarker keep it. Idempotent; a no-op outside the interpreter."""
    if not interpreting() or isinstance(Autotuner.__dict__.get("do_bench"), _InterpreterDefault):
        return
    require_supported()
    default = Autotuner.__dict__["do_bench"].func

    def do_bench(self):
        if self._do_bench is None and interpreting():
            return interpreter_do_bench
        return default(self)

    prop = _InterpreterDefault(do_bench)
    prop.__set_name__(Autotuner, "do_bench")
    Autotuner.do_bench = prop
