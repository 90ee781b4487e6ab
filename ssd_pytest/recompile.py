"""``--recompile-guard`` for case items: a compile-only warmup of the case's model request before its first item,
then the check runs under ``harness.guards.recompile.guard_no_recompile``."""

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


def warmup_for(config: pytest.Config, case):
    """With --recompile-guard: (watched kernels, the warmup report) of this case's model request (its shape, dtypes
    and D/z/dt options, with every path, mode, index and cache-layout class), warmed once per request and process
    before the first item that needs it. A server warms its model configuration, not a whole test corpus; each case
    is held to exactly that (under the interpreter the launch keys are compared with this request's keys alone).
    Lazily, in the item's setup: a worker warms only what its cases need, and no worker waits for a session-wide
    warmup before its first test."""
    if not config.getoption("recompile_guard"):
        return None
    from harness import warmup

    requests = warmup.requests_from_cases([case])
    done = config.stash.setdefault(_warmup_key, {})
    key = repr(requests)
    if key not in done:
        # Workers that warm the same request at once (the costliest cases go out first, together) start at their
        # own share of its list and find the others' binaries in the disk cache instead of compiling the same
        # specializations side by side.
        index = worker_index(os.environ.get("PYTEST_XDIST_WORKER")) or 0
        report = warmup.warmup_all(config.stash[state.DEVICE], requests, first=index / xdist_worker_count())
        done[key] = (warmup.watched_kernels(), report)
        print(f"\n[{os.environ.get('PYTEST_XDIST_WORKER', 'main')}] {case.id}: {done[key][1].summary()}")
    return done[key]


@contextlib.contextmanager
def recompile_guard(config: pytest.Config, case):
    """Yields a dict: set ``ran`` False when the check did not run (skipped, unsupported), which launched nothing
    and so leaves the guard nothing to judge (its 'no launch happened' sanity check would otherwise fail it).
    Raises ``RecompileFailed`` when the guard fires on a check that ran."""
    outcome = {"ran": True}
    warmed = warmup_for(config, case)
    if warmed is None:
        yield outcome
        return
    from harness.guards.recompile import RecompileError, compiles_possible, guard_no_recompile

    kernels, report = warmed
    try:
        # On the GPU the compile hook and the kernel caches are the witnesses; under the interpreter, where nothing
        # compiles, every launch's specialization key must be among the warmed keys.
        with guard_no_recompile(kernels, warmed=None if compiles_possible() else report.keys):
            yield outcome
    except RecompileError as exc:
        if outcome["ran"]:
            raise RecompileFailed(f"recompile guard (after warmup: {report.summary()}):\n{exc}") from None
