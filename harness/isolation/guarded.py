"""The recompile guard around one check: warm the case's model request once per process, then run the check with
``harness.guards.recompile.guard_no_recompile`` watching (GPU: any compile fails the item; interpreter: any launch
whose specialization key the warmup did not produce fails it).

A server warms its model configuration (shape, dtypes and D/z/dt options, with every path, mode, index and
cache-layout class), not a whole corpus, and each case is held to exactly that: the warmup is of the case's own
request (``kernels.warmup.requests_from_cases``). It runs in whichever process runs the checks, so a check in a
supervised child is guarded against that child's own compiles.
"""

from __future__ import annotations

import traceback
from typing import Callable

from harness.checks.base import CheckResult, Status


class RecompileGuard:
    def __init__(self, device: str, first: float = 0.0):
        self.device = device
        self.first = first  # where in a request's compile list to start (kernels.warmup.compile_order)
        self._warmed: dict[str, tuple[list, object]] = {}

    def warm(self, case) -> tuple[list, object, bool]:
        """(watched kernels, the WarmupReport of the case's request, whether this call warmed it)."""
        from harness import warmup

        requests = warmup.requests_from_cases([case])
        key = repr(requests)
        fresh = key not in self._warmed
        if fresh:
            report = warmup.warmup_all(self.device, requests, first=self.first)
            self._warmed[key] = (warmup.watched_kernels(), report)
        return (*self._warmed[key], fresh)

    def run(self, case, check: str, execute: Callable[[], CheckResult], *, catch: tuple = (Exception, SystemExit),
            provider_spec: str, repro_device: str | None) -> CheckResult:
        """``execute()`` (a ``run_check``) under the guard. A guard that fires fails the item with what compiled,
        added to the check's own failure if it had one; a check that did not run (skipped, unsupported) launched
        nothing, so the guard has nothing to judge. A warmup that raises is the item's ERROR."""
        from harness.checks.runner import fault_result
        from harness.guards.recompile import RecompileError, compiles_possible, guard_no_recompile

        try:
            kernels, report, _ = self.warm(case)
        except catch as exc:
            return fault_result(case, check, f"warmup for the recompile guard failed: {type(exc).__name__}: {exc}",
                                detail=traceback.format_exc(), provider_spec=provider_spec,
                                repro_device=repro_device)
        result = None
        try:
            # On the GPU the compile hook and the kernel caches are the witnesses; under the interpreter, where
            # nothing compiles, every launch's specialization key must be among the warmed keys.
            with guard_no_recompile(kernels, warmed=None if compiles_possible() else report.keys):
                result = execute()
        except RecompileError as exc:
            if result.status in (Status.SKIPPED, Status.UNSUPPORTED):
                return result
            fired = f"recompile guard (after warmup: {report.summary()}):\n{exc}"
            lines = [line.strip() for line in str(exc).splitlines()[1:]] or [str(exc)]  # after the title
            first = lines[0] if not lines[0].endswith(":") or len(lines) == 1 else f"{lines[0]} {lines[1]}"
            summary = f"recompile guard: {first}"
            if result.status.is_failure:
                result.message = f"{result.message}\n{fired}"
            else:
                result.status, result.reason, result.summary = Status.FAILED, "", summary
                result.message = (f"{check} failed\n{fired}\ncase: {case.summary()}\nrepro: {result.repro}")
        return result
