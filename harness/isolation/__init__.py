"""Isolation and time limits: a provider's fault becomes an error of the item that caused it, and the items after
it run in a healthy process.

One mechanism for every front end (the CLI's ``run`` and ``repro``, pytest items, the fuzzer)::

    from harness.isolation import open_runner

    runner = open_runner(provider_spec, device)        # device resolved: "cpu" or "cuda"
    try:
        result = runner.run(case, check, repro_device=None, guard=False)   # -> harness.checks.CheckResult
        summary = runner.warmup(case)                  # recompile guard: warm the case's model request (optional;
                                                       # run(..., guard=True) warms it itself when needed)
    finally:
        runner.close()
    runner.restarts    # [Restart(item, cause)]: every child replaced, and why
    runner.describe()  # {"isolation", "item_timeout", "processes", "restarts", "starts"} for a report's meta

``open_runner(spec, device, isolation=None, timeout=None, provider=None, warmup_first=0.0, spare_owner=None)``
returns

- ``Supervisor`` (``isolation="process"``, the default): a child Python process (``child``) configured like the
  caller (sys.path, device, provider) runs the items, one request at a time over its own pipes, keeping one
  CheckContext per case (the checks of a case share its built inputs) and one recompile-guard warmup per model
  request. A child that dies during an item (segfault, any exit), runs past the per-item limit, or reports a sticky
  device error (``sticky``: a poisoned CUDA context) is replaced; the item is an ERROR with the cause in one line
  ("the process running the provider died: SIGSEGV (signal 11)", "timed out after 120 s (...)") and the repro
  line. It starts lazily at the first request (``start()`` starts it early without waiting). Construction never
  imports the provider; a provider that cannot load raises ``ProviderError`` at the first request, a child that
  cannot start ``IsolationError``.
- ``InProcess`` (``isolation="none"``, or ``SSD_HARNESS_ISOLATION=none``): the same calls in this process, for pdb
  and for tests that monkeypatch; no time limit, no protection from crashes.

Any exception a provider raises (``SystemExit`` included; in the child also ``KeyboardInterrupt``, since the child
ignores SIGINT) is the item's ERROR in both modes. Nothing is retried: a crashed item is reported, never re-run as
passed. ``settings``: ``isolation_mode`` (``--isolation`` / ``SSD_HARNESS_ISOLATION``) and ``item_timeout``
(``--item-timeout`` / ``SSD_HARNESS_ITEM_TIMEOUT``, defaults per device in ``DEFAULT_TIMEOUTS``).
"""

from __future__ import annotations

from harness.isolation.settings import (
    DEFAULT_TIMEOUTS,
    ISOLATION_ENV,
    TIMEOUT_ENV,
    TimeLimit,
    isolation_mode,
    item_timeout,
)


def open_runner(provider_spec: str, device: str, *, isolation: str | None = None,
                timeout: TimeLimit | float | None = None, provider=None, warmup_first: float = 0.0,
                spare_owner: object = None):
    """A ``Supervisor`` or an ``InProcess`` runner (see the module docstring). ``provider``: an already loaded
    provider, used in-process only (a child always imports ``provider_spec`` itself). ``spare_owner``: the owner
    whose forked spare child (``spare.prefork``) the supervisor's first child is, when there is one."""
    if isolation_mode(isolation) == "none":
        from harness.isolation.inprocess import InProcess

        return InProcess(provider_spec, device, provider=provider, warmup_first=warmup_first)
    from harness.isolation.supervisor import Supervisor

    return Supervisor(provider_spec, device, timeout=timeout, warmup_first=warmup_first, spare_owner=spare_owner)


def __getattr__(name: str):
    """``Supervisor``, ``InProcess``, ``IsolationError`` and ``Restart`` on first use: importing this package stays
    cheap (no torch) for processes that only read the settings."""
    if name in ("Supervisor", "IsolationError", "Restart", "describe_exit"):
        import importlib

        # Through sys.modules, not the package's attribute (see the protocol import in harness.isolation.supervisor).
        return getattr(importlib.import_module("harness.isolation.supervisor"), name)
    if name == "InProcess":
        from harness.isolation.inprocess import InProcess

        return InProcess
    raise AttributeError(f"module 'harness.isolation' has no attribute {name!r}")


__all__ = ["DEFAULT_TIMEOUTS", "ISOLATION_ENV", "TIMEOUT_ENV", "InProcess", "IsolationError", "Restart", "Supervisor",
           "TimeLimit", "isolation_mode", "item_timeout", "open_runner"]
