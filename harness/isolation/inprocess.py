"""``--isolation none``: items run in the calling process, for pdb and for tests that monkeypatch.

Nothing here can survive a crash or stop a hang, so there is no time limit; a provider's exceptions (SystemExit
included) are still each item's ERROR (``run_check``), and Ctrl-C stops the run.
"""

from __future__ import annotations

import math
import traceback

from harness.checks.base import CheckResult
from harness.isolation.settings import TimeLimit
from harness.isolation.supervisor import IsolationError
from harness.isolation.worker import Worker


class InProcess:
    mode = "none"

    def __init__(self, provider_spec: str, device: str, *, provider=None, warmup_first: float = 0.0):
        """``provider``: the loaded provider, or None to load ``provider_spec`` at ``start``."""
        self.provider_spec, self.device, self.warmup_first = provider_spec, device, warmup_first
        self.limit = TimeLimit(math.inf, "no limit in-process")
        self.restarts: list = []
        self.processes = 0
        self._provider = provider
        self._worker: Worker | None = None

    @property
    def provider_name(self) -> str:
        from harness.checks.providers import provider_name

        return provider_name(self._provider) if self._provider is not None else ""

    def start(self) -> None:
        """Load the provider (raises ProviderError) unless it was given or loaded already."""
        if self._worker is None:
            if self._provider is None:
                from harness.checks.providers import load_provider

                self._provider = load_provider(self.provider_spec)
            self._worker = Worker(self._provider, self.device, self.provider_spec, warmup_first=self.warmup_first)

    def run(self, case, check: str, *, repro_device: str | None = None, guard: bool = False) -> CheckResult:
        self.start()
        return self._worker.run(case, check, repro_device=repro_device, guard=guard)

    def warmup(self, case) -> str:
        self.start()
        try:
            return self._worker.warmup(case)
        except Exception as exc:  # noqa: BLE001 - the same contract as Supervisor.warmup; the cause stays chained
            raise IsolationError(f"warmup of {case.id} failed: {type(exc).__name__}: {exc}".splitlines()[0],
                                 traceback.format_exc()) from exc

    def close(self) -> None:
        self._worker = None

    def __enter__(self) -> "InProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> dict:
        return {"isolation": self.mode, "item_timeout": None, "processes": 0, "restarts": [], "starts": []}
