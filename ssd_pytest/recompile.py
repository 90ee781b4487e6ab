"""``--recompile-guard`` for case items: before a case's first item, the provider's own warmup hook warms the case's
model configuration (``harness.guards.server_warmup``); then the check runs under the guard, which judges every
Triton kernel launched, whoever's it is."""

from __future__ import annotations

import contextlib
import os

import pytest

from ssd_pytest import state
from ssd_pytest.workers import worker_index, xdist_worker_count

_warmup_key = pytest.StashKey[dict]()


class RecompileFailed(Exception):
    """A kernel compiled, or launched a specialization that warmup did not produce, during a case item; the message
    is the full report."""


def warmup_for(config: pytest.Config, case, provider):
    """With --recompile-guard: the ``ObservedWarmup`` of this case's model configuration (its shape, dtypes and
    D/z/dt options; the provider's hook covers what a server learns only per call), warmed once per configuration,
    provider and process before the first item that needs it; or the unsupported reason (a str) when the provider
    has no warmup hook; None without the option or a usable provider. A server warms its model configuration, not
    a whole test corpus; each case is held to exactly that. Lazily, in the item's setup: a worker warms only what
    its cases need, and no worker waits for a session-wide warmup before its first test. A warmup that raised
    raises again for every item of its configuration (each one's error), without running the hook again."""
    if not config.getoption("recompile_guard") or provider is None:
        return None
    from harness import warmup
    from harness.checks.hooks import model_configs, warmup_hook
    from harness.guards.server_warmup import warm

    hook, reason = warmup_hook(provider)
    if hook is None:
        return reason
    configs = tuple(model_configs([case]))
    done = config.stash.setdefault(_warmup_key, {})
    key = (id(provider), configs)
    if key not in done:
        # Workers that warm the same configuration at once (the costliest cases go out first, together) start at
        # their own share of our registry's plan and find the others' binaries in the disk cache instead of
        # compiling the same specializations side by side (warmup.hook_strategy; other providers' hooks compile
        # however they do).
        index = worker_index(os.environ.get("PYTEST_XDIST_WORKER")) or 0
        device = config.stash[state.DEVICE]
        try:
            with warmup.hook_strategy(device, first=index / xdist_worker_count()):
                done[key] = warm(provider, configs)
        except Exception as exc:  # noqa: BLE001 - the provider's hook failed: every item of it reports the error
            done[key] = RuntimeError(f"recompile guard: the warmup hook of provider {provider!r} raised on "
                                     f"{[c.describe() for c in configs]}: {type(exc).__name__}: {exc}")
            done[key].__cause__ = exc
        else:
            print(f"\n[{os.environ.get('PYTEST_XDIST_WORKER', 'main')}] {case.id}: {done[key].summary()}")
    if isinstance(done[key], Exception):
        raise done[key]
    return done[key]


@contextlib.contextmanager
def recompile_guard(config: pytest.Config, case, provider):
    """Yields a dict: set ``status`` to the check's ``Status``. A check that did not run (skipped, unsupported)
    launched nothing and is not judged. Raises ``RecompileFailed`` when the guard fires on a check that ran; for a
    provider without a warmup hook a check that passed becomes an unsupported skip with the reason (the guard
    could not judge it), and a failing check stays failed."""
    from harness.checks import Status

    outcome = {"status": None}
    warmed = warmup_for(config, case, provider)
    if warmed is None:
        yield outcome
        return
    if isinstance(warmed, str):
        yield outcome
        if outcome["status"] is Status.PASSED:
            pytest.skip(warmed)
        return
    from harness.guards.recompile import RecompileError
    from harness.guards.server_warmup import guarded

    try:
        # On the GPU the compile hook and the kernel caches are the witnesses; under the interpreter, where
        # nothing compiles, every launch's specialization key must be among the warmed keys.
        with guarded(warmed):
            yield outcome
    except RecompileError as exc:
        if outcome["status"] not in (Status.SKIPPED, Status.UNSUPPORTED):
            raise RecompileFailed(f"recompile guard (after {warmed.summary()}):\n{exc}") from None
