"""What runs the items, in whichever process runs them: the provider, the per-case CheckContext (the checks of one
case share its built inputs), and the recompile guard's warmups."""

from __future__ import annotations

from harness.checks import CheckContext, CheckResult, run_check
from harness.isolation import sticky
from harness.isolation.guarded import RecompileGuard


class Worker:
    def __init__(self, provider, device: str, provider_spec: str, *, interrupts_are_errors: bool = False,
                 warmup_first: float = 0.0):
        self.provider, self.device, self.provider_spec = provider, device, provider_spec
        # In a process that ignores SIGINT every KeyboardInterrupt comes from provider code (run_check's docstring).
        self.interrupts_are_errors = interrupts_are_errors
        self.guard = RecompileGuard(provider, device, warmup_first)
        self._case = None
        self._context: CheckContext | None = None

    def context(self, case) -> CheckContext:
        """One CheckContext per case; a case equal to the current one (sent again by the supervisor) reuses it."""
        if self._context is None or (self._case is not case and self._case != case):
            self._case, self._context = case, CheckContext(case, self.provider, self.device, self.provider_spec)
        return self._context

    def run(self, case, check: str, *, repro_device: str | None = None, guard: bool = False) -> CheckResult:
        def execute() -> CheckResult:
            return run_check(case, check, self.provider, device=self.device, provider_spec=self.provider_spec,
                             repro_device=repro_device, context=self.context(case),
                             interrupts_are_errors=self.interrupts_are_errors)

        if not guard:
            return execute()
        return self.guard.run(case, check, execute, catch=self.catchable, provider_spec=self.provider_spec,
                              repro_device=repro_device)

    @property
    def catchable(self) -> tuple:
        return (BaseException,) if self.interrupts_are_errors else (Exception, SystemExit)

    def warmup(self, case) -> str:
        """Warm the case's model configuration through the provider's hook for the recompile guard (once per
        process): the warmup's summary when this call warmed it; "" when this process had warmed it already or the
        provider has no hook (its items say so)."""
        observed, fresh = self.guard.warm(case)
        return observed.summary() if fresh else ""

    def sticky(self, result: CheckResult) -> str:
        """Non-empty (the cause) when this process must not run another item after ``result``."""
        return sticky.after_item(result, self.device)

    def sticky_text(self, error: str) -> str:
        return sticky.sticky_device_error(error, self.device)
