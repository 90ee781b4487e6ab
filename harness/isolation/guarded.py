"""The recompile guard around one check: warm the case's model configuration once per process through the provider's
``warmup(requests)`` hook (``harness.guards.server_warmup``), then run the check with every Triton kernel watched,
whoever's it is (GPU: any compile fails the item; interpreter: any launch whose specialization key the warmup did not
produce fails it).

A server warms its model configuration (shape, dtypes and D/z/dt options; the hook covers what a server learns only
per call), not a whole corpus, and each case is held to exactly that. It runs in whichever process runs the checks, so
a check in a supervised child is guarded against that child's own compiles. A provider without the hook cannot be
judged: an item that passed becomes unsupported with the reason; a failing check stays failed.
"""

from __future__ import annotations

import traceback
from typing import Callable

from harness.checks.base import CheckResult, Status


class RecompileGuard:
    def __init__(self, provider, device: str, first: float = 0.0):
        self.provider, self.device = provider, device
        self.first = first  # where in our registry's compile plan this process starts (harness.warmup.hook_strategy)
        self._warmed: dict[tuple, object] = {}  # model configs -> ObservedWarmup, or the exception the hook raised

    def warm(self, case) -> tuple[object, bool]:
        """(the ObservedWarmup of the case's model configuration, or the unsupported reason (a str) when the provider
        has no warmup hook; whether this call warmed it). A hook that raised raises again for every later item of its
        configuration, without running again."""
        from harness import warmup
        from harness.checks.hooks import model_configs, warmup_hook
        from harness.guards.server_warmup import warm

        hook, reason = warmup_hook(self.provider)
        if hook is None:
            return reason, False
        configs = tuple(model_configs([case]))
        fresh = configs not in self._warmed
        if fresh:
            try:
                with warmup.hook_strategy(self.device, first=self.first):
                    self._warmed[configs] = warm(self.provider, configs)
            except Exception as exc:  # noqa: BLE001 - every item of this configuration reports it
                error = RuntimeError(f"recompile guard: the warmup hook of provider {self.provider!r} raised on "
                                     f"{[c.describe() for c in configs]}: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
                self._warmed[configs] = error
        outcome = self._warmed[configs]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome, fresh

    def run(self, case, check: str, execute: Callable[[], CheckResult], *, catch: tuple = (Exception, SystemExit),
            provider_spec: str, repro_device: str | None) -> CheckResult:
        """``execute()`` (a ``run_check``) under the guard. A guard that fires fails the item with what compiled,
        added to the check's own failure if it had one; a check that did not run (skipped, unsupported) launched
        nothing, so the guard has nothing to judge. A warmup that raises is the item's ERROR."""
        from harness.checks.registry import get_check
        from harness.checks.runner import failure_message, fault_result
        from harness.guards.recompile import RecompileError
        from harness.guards.server_warmup import guarded

        exempt = get_check(check).not_a_serving_call
        if exempt:
            result = execute()
            result.stats["recompile_guard"] = f"not judged: {exempt}"
            return result
        try:
            observed, _ = self.warm(case)
        except catch as exc:
            return fault_result(case, check, str(exc), fault="exception", detail=traceback.format_exc(),
                                provider_spec=provider_spec, repro_device=repro_device)
        if isinstance(observed, str):
            result = execute()
            if result.status is Status.PASSED:
                result.status, result.reason = Status.UNSUPPORTED, observed
            return result
        result = None
        try:
            with guarded(observed):
                result = execute()
        except RecompileError as exc:
            if result.status in (Status.SKIPPED, Status.UNSUPPORTED):
                return result
            fired = f"recompile guard (after {observed.summary()}):\n{exc}"
            lines = [line.strip() for line in str(exc).splitlines()[1:]] or [str(exc)]  # after the title
            first = lines[0] if not lines[0].endswith(":") or len(lines) == 1 else f"{lines[0]} {lines[1]}"
            summary = f"recompile guard: {first}"
            if result.status.is_failure:
                result.message = f"{result.message}\n{fired}"
            else:
                result.status, result.reason, result.summary = Status.FAILED, "", summary
                result.message = failure_message(summary, fired, case, result.repro)
        return result
