"""A provider's server warmup, watched: what the recompile guard holds later calls to (docs/checks.md).

A server warms its kernels at startup for the model configurations it serves; the provider says how through its
optional ``warmup(requests)`` hook (``harness.checks.hooks``). ``warm`` calls the hook with every jit function's
runs watched (``harness.triton_launches``), so the guard needs no list of the provider's kernels and no trust in
what the hook reports: under the interpreter, where nothing compiles, the warmed specializations are the keys of
every launch and every warmup entry the hook made, whoever's kernels they are; on the GPU the compiles themselves
are the witnesses, before (counted here) and after (``guarded``: any compile fails).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from harness.checks.hooks import ModelConfig, warmup_hook
from harness.checks.providers import provider_name
from harness.guards.recompile import EVERY_KERNEL, GuardRecord, compile_events, compiles_possible, guard_no_recompile
from harness.guards.specialization import SpecKey, kernel_name, specialization_key
from harness.triton_launches import listening


@dataclass
class ObservedWarmup:
    """What one call of a provider's warmup hook did."""

    provider: str
    configs: tuple[ModelConfig, ...]
    runs: dict[str, int] = field(default_factory=dict)  # kernel -> launches and warmup entries
    keys: list[SpecKey] = field(default_factory=list)  # distinct specializations (interpreter only: none compile)
    compiled: int = 0  # in-memory compiles seen by Triton's compile hook (GPU)
    seconds: float = 0.0

    def summary(self) -> str:
        what = (f"{len(self.keys)} specializations" if not compiles_possible()
                else f"{sum(self.runs.values())} warmup entries and launches, {self.compiled} compiled")
        kernels = ", ".join(f"{k.rsplit('.', 1)[-1]}: {n}" for k, n in self.runs.items()) or "no Triton kernel"
        return (f"warmup: {what} by provider {self.provider!r}'s warmup hook on {len(self.configs)} model "
                f"config(s) in {self.seconds:.2f}s ({kernels})")


def warm(provider, configs: Iterable[ModelConfig]) -> ObservedWarmup:
    """Call the provider's warmup hook on ``configs`` and record what it ran. Raises ``NotImplementedError`` with
    the unsupported reason when the provider has no hook; whatever the hook raises propagates."""
    hook, reason = warmup_hook(provider)
    if hook is None:
        raise NotImplementedError(reason)
    observed = ObservedWarmup(provider_name(provider), tuple(configs))
    keys: dict[tuple[str, str], SpecKey] = {}
    keyed = not compiles_possible()

    def on_run(fn, args, kwargs, warmup):
        name = kernel_name(fn)
        observed.runs[name] = observed.runs.get(name, 0) + 1
        if keyed:
            try:
                key = specialization_key(fn, args, kwargs)
            except Exception:  # noqa: BLE001 - its later launches cannot be keyed either; the guard reports those
                return
            keys.setdefault((key.kernel, key.key), key)

    start = time.perf_counter()
    with compile_events() as events, listening(on_run):
        hook(list(observed.configs))
    observed.seconds = time.perf_counter() - start
    observed.keys = list(keys.values())
    observed.compiled = len(events)
    return observed


@contextlib.contextmanager
def guarded(observed: ObservedWarmup) -> Iterator[GuardRecord]:
    """``guard_no_recompile`` over every jit function, after ``observed``: on the GPU any compile fails; under the
    interpreter any launch whose specialization key the warmup did not produce fails."""
    with guard_no_recompile(EVERY_KERNEL, warmed=None if compiles_possible() else observed.keys) as record:
        yield record


__all__ = ["ObservedWarmup", "warm", "guarded"]
