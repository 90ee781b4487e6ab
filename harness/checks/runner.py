"""Run one check on one case and turn the outcome into a ``CheckResult`` (honouring ``expect`` and the CPU tier,
``harness.checks.tiers``)."""

from __future__ import annotations

import shlex
import time
import traceback

from harness.cases.limits import device_fit_problem
from harness.checks.base import CheckContext, CheckResult, NotApplicable, Status
from harness.checks.providers import DEFAULT_PROVIDER, pythonpath_entry
from harness.checks.registry import get_check
from harness.checks.tiers import cpu_tier_reason, tier_reason
from harness.compare import Mismatch


def repro_line(case, check: str, provider_spec: str = DEFAULT_PROVIDER, device: str | None = None) -> str:
    """``python -m harness repro <file> --check <check> --case <id>`` (+ provider/device when not the defaults),
    run from the repository's root. A provider imported from a ``PYTHONPATH`` entry other than the repository
    puts ``PYTHONPATH=<entry>`` in front: the line then runs as printed in a shell that lacks this run's
    environment."""
    parts = ["python", "-m", "harness", "repro", str(case.source), "--check", check, "--case", case.id]
    env = ""
    if provider_spec and provider_spec != DEFAULT_PROVIDER:
        parts += ["--provider", provider_spec]
        entry = pythonpath_entry(provider_spec)
        env = f"PYTHONPATH={shlex.quote(entry)} " if entry else ""
    if device:
        parts += ["--device", device]
    return env + shlex.join(parts)


def run_check(
    case,
    check_name: str,
    provider,
    *,
    device: str,
    provider_spec: str = DEFAULT_PROVIDER,
    repro_device: str | None = None,
    context: CheckContext | None = None,
    interrupts_are_errors: bool = False,
) -> CheckResult:
    """Run ``check_name`` on ``case`` against ``provider`` on ``device`` ("cuda" or "cpu").

    ``context`` lets several checks of one case share the built inputs. Failures carry the Mismatch report, the case
    summary and the repro line; a case whose ``expect: xfail`` applies to ``provider_spec`` turns a failure into
    XFAILED and a pass into XPASSED (strict: a stale xfail does not hide). A check that finds nothing to judge
    (``NotApplicable``) is SKIPPED with its reason, whatever the case expects.

    Anything the check or provider raises is an ERROR of this item, ``SystemExit`` included (a provider calling
    ``sys.exit`` must not end the run, let alone with its status). ``KeyboardInterrupt`` is the user's Ctrl-C in
    the process that runs the front end, so it propagates; a process that ignores SIGINT (``harness.isolation``'s
    child) knows any ``KeyboardInterrupt`` came from provider code and passes ``interrupts_are_errors=True``.
    """
    check = get_check(check_name)
    result = _blank_result(case, check_name, provider_spec, repro_device)
    # The tier first: it depends on the case and the check alone, so pytest decides it at collection (a skip marker)
    # and every front end reports an item outside the CPU tier the same way, whatever the provider supports.
    tier = cpu_tier_reason(case, check_name) if device == "cpu" else ""
    if tier:
        result.status, result.reason = Status.SKIPPED, tier
        return result
    ok, reason = check.applies(case, provider, provider_spec)
    if not ok:
        result.status = Status.UNSUPPORTED if reason.startswith("unsupported") else Status.SKIPPED
        result.reason = reason
        return result

    unfit = device_fit_problem(case, device)
    if unfit:
        result.status, result.summary = Status.ERROR, unfit
        result.message = failure_message(unfit, "", case, result.repro)
        return result

    ctx = context or CheckContext(case, provider, device, provider_spec)
    start = time.perf_counter()
    try:
        result.stats = dict(check.run(ctx) or {})
    except NotApplicable as exc:
        result.status = Status.SKIPPED
        result.reason = f"{getattr(exc, 'reason_prefix', 'not applicable')}: {exc}"
        result.stats = dict(getattr(exc, "stats", {}))
        result.duration = time.perf_counter() - start
        return result
    except Mismatch as exc:
        result.status = Status.FAILED
        result.stats = dict(exc.stats)
        result.summary, result.message = exc.summary, failure_message(exc.summary, exc.details, case, result.repro)
    except BaseException as exc:  # noqa: BLE001 - a crashing provider is a finding, reported with its traceback
        if isinstance(exc, KeyboardInterrupt) and not interrupts_are_errors:
            raise
        result.status = Status.ERROR
        trace = traceback.format_exc().rstrip()
        if not isinstance(exc, Exception):
            trace += " (raised inside the check: an error of this item, not the end of the run)"
        result.summary = trace.splitlines()[-1]  # the exception's own line
        result.message = failure_message(result.summary, trace, case, result.repro)
    result.duration = time.perf_counter() - start
    return apply_expect(result, case, provider_spec, fault="exception")


def run_selected(runner, case, check_name: str, *, device: str, named, provider_spec: str = DEFAULT_PROVIDER,
                 repro_device: str | None = None) -> CheckResult:
    """A front end's item: SKIPPED with the tier's reason where the run on ``device`` leaves it out
    (``harness.checks.tiers.tier_reason``, ``named``: the checks the run's ``--check`` names), without reaching the
    provider's process; else ``runner.run`` (``harness.isolation``'s runner, which runs ``run_check``)."""
    reason = tier_reason(case, check_name, device, named)
    if reason:
        result = _blank_result(case, check_name, provider_spec, repro_device)
        result.status, result.reason = Status.SKIPPED, reason
        return result
    return runner.run(case, check_name, repro_device=repro_device)


def failure_message(summary: str, details: str, case, repro: str) -> str:
    """A failed item's full report. Its first line is ``summary``, one line of what differed (how many elements,
    the max ulp) or what was raised: the line that pytest's ``-rf`` short summary and the CLI's progress line show.
    Then the details (the rest of the comparison's report, or the traceback), the case and the repro line."""
    body = f"\n{details.rstrip()}" if details.strip() else ""
    return f"{summary}{body}\ncase: {case.summary()}\nrepro: {repro}"


def _blank_result(case, check_name: str, provider_spec: str, repro_device: str | None) -> CheckResult:
    return CheckResult(
        case_id=case.id,
        check=check_name,
        status=Status.PASSED,
        source=str(case.source),
        family=str(getattr(case, "family", "")),
        seed=getattr(case, "seed", None),
        repro=repro_line(case, check_name, provider_spec, repro_device),
    )


def fault_result(case, check_name: str, cause: str, *, fault: str = "exit", detail: str = "", duration: float = 0.0,
                 provider_spec: str = DEFAULT_PROVIDER, repro_device: str | None = None) -> CheckResult:
    """The ERROR of an item whose check never returned a result: the process running it died or was stopped
    (``harness.isolation``). ``cause`` is the one-line summary; ``detail`` what else is known (a traceback dumped by
    the dying process). ``fault``: which kind of failure it was (``FAILURE_KINDS``: "exit", the default, for a
    process that ended; "timeout", "exception"; "harness" for the harness's own failure, which no case can
    expect). The case's ``expect`` applies as for any other failure."""
    result = _blank_result(case, check_name, provider_spec, repro_device)
    result.status, result.summary, result.duration = Status.ERROR, cause, duration
    result.message = failure_message(cause, detail, case, result.repro)
    return apply_expect(result, case, provider_spec, fault=fault)


# How the line under an unexcused failure names its kind.
_FAULT_WORDS = {"mismatch": "a mismatch (fails_with: mismatch)", "exception": "an exception (fails_with: exception)",
                "exit": "its process's exit (fails_with: exit)",
                "timeout": "a timeout (fails_with: timeout)", "harness": "a failure of the harness itself",
                "": "an error of unknown kind"}


def apply_expect(result: CheckResult, case, provider_spec: str = DEFAULT_PROVIDER, *, fault: str = "") -> CheckResult:
    """The case's ``expect`` for the provider under test (``provider_spec``, as ``--provider`` names it): an xfail
    that applies to it turns a failure of a kind it names (``expect.fails_with``) into XFAILED and a pass into
    XPASSED (strict); a failure of another kind stays what it is, with a line saying the xfail does not excuse it.
    An xfail for other providers only, like ``expect: pass``, changes nothing. ``fault``: the kind of an ERROR
    (a FAILED result is a mismatch)."""
    check_name = result.check
    expect = getattr(case, "expect", None)
    if expect is None or not expect.fails_for(provider_spec):
        return result
    if expect.providers is None:
        scope, remedy = "", f"remove the stale xfail from {case.source}"
    else:
        scope = f" with --provider {provider_spec}"
        remedy = (f"remove {provider_spec} from expect.providers in {case.source} (the whole xfail if it is the "
                  "only one)")
    kind = "mismatch" if result.status is Status.FAILED else fault
    if result.status.is_failure and kind not in expect.fails_with:
        result.message = (f"{result.message}\nnot excused by the case's xfail{scope}: it expects a failure of kind "
                          f"{', '.join(expect.fails_with)} (expect.fails_with), this item ended with "
                          f"{_FAULT_WORDS.get(kind, kind)} ({expect.reason})")
        return result
    if result.status.is_failure:
        result.status, result.reason = Status.XFAILED, f"expected failure{scope}: {expect.reason}"
    else:
        result.status = Status.XPASSED
        result.summary = f"XPASS(strict): {check_name} passed but the case expects a failure{scope} ({expect.reason})"
        result.message = f"{result.summary}\n{remedy}\ncase: {case.summary()}\nrepro: {result.repro}"
    return result
