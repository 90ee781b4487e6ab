"""The check model: a named check, the context it runs in, and the result both pytest and the CLI report.

A check is ``applies(case, provider) -> (bool, reason)`` plus ``run(ctx) -> dict`` of measured stats that raises
``harness.compare.Mismatch`` on failure. Applicability has two layers so that nothing disappears silently:
``case_applies`` depends on the case alone and decides which checks ``checks: [all]`` expands to (collection);
``needs_paths`` / ``provider_applies`` depend on the provider and turn into an *unsupported* skip at run time.
Where only running the provider shows that there is nothing to check (a provider that launches no autotuner),
``run`` raises ``NotApplicable`` with the reason, which becomes a skip, never a pass.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

from harness.checks.providers import provider_name, supported_paths


class NotApplicable(Exception):
    """Raised by a check's ``run`` when the call it made showed that the check has nothing to judge; the message
    is the reason the skip reports."""


class NotAllRan(NotApplicable):
    """Raised by a check that stopped at its budget with part of its work undone and nothing wrong in the part it
    did: a skip whose reason says so (``reason_prefix``) and whose stats say what ran, never a pass."""

    reason_prefix = "not all ran"

    def __init__(self, message: str, stats: dict):
        super().__init__(message)
        self.stats = stats


def _always(case) -> tuple[bool, str]:
    return True, ""


def case_call_paths(case) -> frozenset[str]:
    """Paths the case's own call needs: ``auto`` works on every provider (it falls back to snapshot)."""
    path = case.call.path
    return frozenset() if path == "auto" else frozenset({path})


def _any_provider(provider, provider_spec: str) -> tuple[bool, str]:
    return True, ""


@dataclass(frozen=True)
class Check:
    name: str
    doc: str  # one line: what the check proves
    run: Callable[["CheckContext"], dict]
    case_applies: Callable[[Any], tuple[bool, str]] = _always
    needs_paths: frozenset[str] | None = None  # None: the path the case's own call asks for
    provider_applies: Callable[[Any, str], tuple[bool, str]] = _any_provider
    # The calls it reads through ``harness.checks.calls.shared_call``, by path ("case": the case's own path): made
    # once per case by the first check that asks.
    shared_calls: tuple[str, ...] = ()
    # Interpreter time of the check beyond its shared calls, in calls of the case's size (measured;
    # docs/checks.md#tiers): what the CPU tier's estimate multiplies the seconds of one call by.
    cpu_calls: float = 0.0
    # Instead, for a check whose interpreter time follows something else than the case's calls: its seconds.
    cpu_seconds: Callable[[Any], float] | None = None
    # The CPU tier gives this check only the budget the other checks of a case leave: a check added to the registry
    # then joins the tier where a case has room, and never takes an item the tier ran before off it.
    cpu_after_others: bool = False
    # Why the recompile guard does not judge this check ("" = it does): a check that makes the provider do what a
    # warmed server never does (tune from scratch) compiles by design, whatever the provider's warmup covered.
    not_a_serving_call: str = ""
    # Why a GPU run leaves this check out unless it is named ("" = it runs wherever it applies): a check whose every
    # item compiles binaries no other item needs runs on the GPU only where the run's selection (``--check``) or the
    # case's own ``checks:`` list names it (``harness.checks.tiers.gpu_default_reason``); elsewhere its GPU items are
    # skipped with this reason. The CPU tier's cost model decides there, as for every check.
    gpu_when_named: str = ""

    def applies(self, case, provider, provider_spec: str = "") -> tuple[bool, str]:
        """(True, "") or (False, reason); a reason starting with ``unsupported:`` means the provider lacks a path."""
        ok, reason = self.case_applies(case)
        if not ok:
            return False, f"not applicable: {reason}"
        needed = self.needs_paths if self.needs_paths is not None else case_call_paths(case)
        missing = sorted(needed - supported_paths(provider))
        if missing:
            return False, (
                f"unsupported: provider {provider_name(provider)!r} lacks the {'/'.join(missing)} path "
                f"(supported_paths={sorted(supported_paths(provider))}); {self.name} cannot run, so it is not passed"
            )
        ok, reason = self.provider_applies(provider, provider_spec)
        if not ok:
            return False, f"unsupported: {reason}"
        return True, ""


class Status(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"  # a Mismatch, or a wrong exception behaviour the check asserts on
    ERROR = "error"  # the check or provider raised something else
    SKIPPED = "skipped"  # not applicable to this case, or beyond this tier (harness.checks.tiers)
    UNSUPPORTED = "unsupported"  # the provider lacks a path the check needs
    XFAILED = "xfailed"  # failed, and the case says expect: xfail
    XPASSED = "xpassed"  # passed although the case expects a failure: strict, counts as a failure

    @property
    def is_failure(self) -> bool:
        return self in (Status.FAILED, Status.ERROR, Status.XPASSED)


@dataclass
class CheckResult:
    """One ``<file>::<case id>::<check>`` outcome."""

    case_id: str
    check: str
    status: Status
    source: str = ""
    family: str = ""
    seed: int | None = None
    reason: str = ""  # skip / unsupported / xfail reason
    summary: str = ""  # first line of what differed (for tables and JSON)
    message: str = ""  # the full failure report: what differed, the case summary, the repro line
    repro: str = ""
    stats: dict = field(default_factory=dict)
    duration: float = 0.0

    @property
    def max_ulp(self) -> int | None:
        value = self.stats.get("max_ulp")
        return int(value) if value is not None else None

    @property
    def bound_use(self) -> float | None:
        """A bounded check's largest error over its bound (1.0: at the bound); None for an exact check."""
        value = self.stats.get("max_bound_use")
        return float(value) if value is not None else None

    def as_dict(self) -> dict:
        return {
            "case_id": self.case_id,
            "check": self.check,
            "status": self.status.value,
            "source": self.source,
            "family": self.family,
            "seed": self.seed,
            "reason": self.reason,
            "summary": self.summary,
            "message": self.message,
            "repro": self.repro,
            "stats": _jsonable(self.stats),
            "duration": self.duration,
        }


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class CheckContext:
    """What a check runs against: one case, one provider, one device. ``inputs()`` hands out fresh deep copies of the
    case's inputs (built once from the seed), so each call starts from identical bits, layouts and aliasing.
    ``shared_calls`` holds the calls that several checks of the case make identically (``harness.checks.calls``),
    so one process makes each of them once per case."""

    def __init__(self, case, provider, device: str, provider_spec: str = ""):
        self.case = case
        self.provider = provider
        self.device = device
        self.provider_spec = provider_spec
        self._pristine = None
        self.shared_calls: dict = {}
        # ``harness.checks.bound.reference_judge``'s judge: the fp64 reference of the case's inputs and its bounds,
        # made once per case for every check that judges calls against it.
        self.reference_judge = None

    def inputs(self):
        if self._pristine is None:
            from harness.cases.builder import build_inputs

            self._pristine = build_inputs(self.case, self.device)
        return self._pristine.clone()

    def call(self, inputs, *, path: str | None = None, final_state: str | None = None):
        """``provider.ssd_prefill`` on ``inputs`` (the case's own path / final-state mode unless overridden)."""
        return self.provider.ssd_prefill(**inputs.kwargs(path=path, final_state=final_state))
