"""The CPU tier: which case items run under Triton's interpreter (docs/checks.md#tiers).

The interpreter runs every Triton program as numpy code, one after the other, so one call of a case costs about
``SECONDS_PER_BLOCK`` per interpreter block (``Case.cpu_blocks``: chunks x heads, a head of a chunk counted in
blocks of 64 chunk rows and 128 state columns). The checks of a case share the calls they make identically
(``harness.checks.calls.shared_call``: one call per path and case), so a check costs the shared calls it is the first
to make plus its own ``cpu_calls``; both were measured (docs/checks.md#tiers). The tier spends at most
``CPU_CASE_SECONDS`` of estimated interpreter time on one case: all its checks when they fit, else its cheapest items
within the limit (cheapest first: the checks that only read the case's one shared call cost nothing once it is made).
A case's ``tiers.cpu`` overrides this for all its items (true: every one runs there, false: none does).

The GPU tier runs every item, except those of a check that runs there only when named (``Check.gpu_when_named``:
its items compile binaries no other item needs): it runs where the run's selection (``--check``) or the case's own
``checks:`` list names it, and is skipped with the reason elsewhere (``gpu_default_reason``). ``tier_reason`` is what
every front end asks before it runs an item.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Collection, Iterator

from harness.cases.model import cpu_block_factors
from harness.checks.registry import get_check, selected_checks

# Seconds of one interpreted call per block, measured with two processes on two cores (docs/checks.md#tiers).
SECONDS_PER_BLOCK = 0.0093
# Estimated interpreter seconds the tier spends on one case.
CPU_CASE_SECONDS = 1.75


@contextlib.contextmanager
def costed(per_block: float | None = None, per_state: float | None = None,
           budget: float | None = None) -> Iterator[None]:
    """The tier decided with other constants inside the block (None keeps one): ``SECONDS_PER_BLOCK``,
    ``kernel_exact.STATE_PASSING_SECONDS_PER_STATE`` and ``CPU_CASE_SECONDS``, restored after it, the cached plans
    dropped on the way in and out. For refitting the constants and comparing tiers (``scripts/fit_cpu_tier.py``)."""
    global SECONDS_PER_BLOCK, CPU_CASE_SECONDS
    from harness.checks import kernel_exact

    saved = SECONDS_PER_BLOCK, kernel_exact.STATE_PASSING_SECONDS_PER_STATE, CPU_CASE_SECONDS
    try:
        SECONDS_PER_BLOCK = saved[0] if per_block is None else per_block
        kernel_exact.STATE_PASSING_SECONDS_PER_STATE = saved[1] if per_state is None else per_state
        CPU_CASE_SECONDS = saved[2] if budget is None else budget
        cpu_plan.cache_clear()
        yield
    finally:
        SECONDS_PER_BLOCK, kernel_exact.STATE_PASSING_SECONDS_PER_STATE, CPU_CASE_SECONDS = saved
        cpu_plan.cache_clear()


@dataclass(frozen=True)
class CpuPlan:
    """What the CPU tier runs of one case. ``seconds``: each selected check's estimated cost, in collection order,
    a shared call charged to the first check that runs and makes it (a check the tier skips: its cost on top of
    the checks that run); ``runs``: the checks the tier runs; ``spent``: their estimated total."""

    seconds: dict[str, float]
    runs: frozenset[str]
    spent: float


def shared_paths(case, check_name: str) -> frozenset[str]:
    """The paths of the shared calls ``check_name`` reads on ``case`` ("case" is the case's own path)."""
    return frozenset(case.call.path if p == "case" else p for p in get_check(check_name).shared_calls)


def _cost(case, name: str, made: set[str], call_seconds: float) -> float:
    check = get_check(name)
    own = check.cpu_seconds(case) if check.cpu_seconds else check.cpu_calls * call_seconds
    return own + len(shared_paths(case, name) - made) * call_seconds


@functools.lru_cache(maxsize=4096)
def cpu_plan(case) -> CpuPlan:
    """The case's CPU plan: every check when ``tiers.cpu`` is true or when all fit in ``CPU_CASE_SECONDS``, none when
    it is false, else the cheapest checks (the cost of each given those already chosen; ties in collection order)
    while the total stays within the limit, then the same for the checks that come after the others. The choice
    depends on the case alone, so every front end and every process skips the same items."""
    names = [name for name, _ in selected_checks(case)]
    call_seconds = SECONDS_PER_BLOCK * case.cpu_blocks()
    if case.tiers.cpu is None:
        chosen: set[str] = set()
        made: set[str] = set()
        spent = 0.0
        # Two rounds: the checks that come after the others (``Check.cpu_after_others``) get what the first leaves.
        for last in (False, True):
            rest = [name for name in names if get_check(name).cpu_after_others == last]
            while rest:
                i = min(range(len(rest)), key=lambda j: (_cost(case, rest[j], made, call_seconds), j))
                cost = _cost(case, rest[i], made, call_seconds)
                if spent + cost > CPU_CASE_SECONDS:
                    break
                spent += cost
                chosen.add(rest[i])
                made |= shared_paths(case, rest.pop(i))
        runs = frozenset(chosen)
    else:
        runs = frozenset(names) if case.tiers.cpu else frozenset()
    return CpuPlan(_in_order(case, names, runs), runs, sum(_in_order(case, names, runs, skipped=False).values()))


def _in_order(case, names: list[str], runs: frozenset[str], skipped: bool = True) -> dict[str, float]:
    """Each check's cost in collection order (the order items run in): a shared call charged to the first check of
    ``runs`` that makes it; a check outside ``runs`` (with ``skipped``) costed on top of all of ``runs``."""
    call_seconds = SECONDS_PER_BLOCK * case.cpu_blocks()
    seconds: dict[str, float] = {}
    made: set[str] = set()
    for name in names:
        if name in runs:
            seconds[name] = _cost(case, name, made, call_seconds)
            made |= shared_paths(case, name)
    if skipped:
        seconds.update({name: _cost(case, name, made, call_seconds) for name in names if name not in runs})
    return {name: seconds[name] for name in names if name in seconds}


def cpu_estimate(case, check_name: str) -> float:
    """Estimated seconds of ``check_name`` on ``case`` in the interpreter, on one core (``CpuPlan.seconds``; a check
    the case does not select: alone)."""
    seconds = cpu_plan(case).seconds
    return seconds[check_name] if check_name in seconds else _cost(case, check_name, set(),
                                                                     SECONDS_PER_BLOCK * case.cpu_blocks())


def cpu_tier_reason(case, check_name: str) -> str:
    """Why the CPU tier skips this item, or "" when it runs it. Names the limit with the case's values, the items it
    runs instead, and the override."""
    forced = case.tiers.cpu
    if forced is True:
        return ""
    where = f"in {case.source}" if case.source else "in the case"
    if forced is False:
        return f"beyond the CPU interpreter tier: tiers.cpu is false {where}; runs on the GPU tier"
    plan = cpu_plan(case)
    if check_name in plan.runs or check_name not in plan.seconds:
        return ""
    chunks, heads, rows, states = cpu_block_factors(case.shape, case.sequences)
    cheaper = ", ".join(name for name in plan.seconds if name in plan.runs) or "none"
    return (f"beyond the CPU interpreter tier: {check_name} would bring the case's estimated interpreter time to "
            f"{plan.spent + plan.seconds[check_name]:.1f} s > {CPU_CASE_SECONDS:g} s per case ({case.cpu_blocks()} "
            f"blocks = {chunks} chunks x {heads} heads x {rows} x {states}, blocks of 64 chunk rows and 128 state "
            f"columns, {SECONDS_PER_BLOCK} s per block and call; the tier runs its cheaper items: {cheaper}); "
            f"tiers: {{cpu: true}} {where} runs it there anyway; runs on the GPU tier")


def cpu_tier_gaps(case) -> tuple[list[str], str]:
    """(the checks of ``case`` the CPU tier skips, why in a few words); ([], "") when it runs them all."""
    skipped = [name for name, _ in selected_checks(case) if cpu_tier_reason(case, name)]
    if not skipped:
        return [], ""
    if case.tiers.cpu is False:
        return skipped, "tiers.cpu is false"
    plan = cpu_plan(case)
    every = sum(_in_order(case, list(plan.seconds), frozenset(plan.seconds)).values())
    ran = f"the others take {plan.spent:.1f} s" if plan.runs else "none fits"
    return skipped, (f"{case.cpu_blocks()} blocks: all its checks are estimated at {every:.1f} s > "
                     f"{CPU_CASE_SECONDS:g} s per case; {ran}")


def gpu_default_reason(case, check_name: str, named: Collection[str] | None = None) -> str:
    """Why a GPU run skips this item, or "" when it runs it: a check with ``Check.gpu_when_named`` runs on the GPU
    only where ``named`` (the run's ``--check`` selection) or the case's own ``checks:`` list names it. The reason
    says why, and how to run it."""
    check = get_check(check_name)
    if not check.gpu_when_named or check_name in (named or ()) or check_name in case.checks:
        return ""
    return (f"not run by default on the GPU: {check.gpu_when_named}; --check {check_name} runs it (pytest or "
            f"python -m harness run), as does a case whose checks: list names it")


def tier_reason(case, check_name: str, device: str, named: Collection[str] | None = None) -> str:
    """Why a run on ``device`` ("cpu": the interpreter; else the GPU) skips this item without running it, or "" when
    it runs it; ``named``: the checks the run's selection names (``--check``). The CPU tier's cost model under the
    interpreter (``cpu_tier_reason``, whatever is named); the checks that run only when named on the GPU
    (``gpu_default_reason``)."""
    if device == "cpu":
        return cpu_tier_reason(case, check_name)
    return gpu_default_reason(case, check_name, named)


def runs_on_cpu(case, check_name: str) -> bool:
    return not cpu_tier_reason(case, check_name)


def cpu_tier_items(cases) -> tuple[int, int]:
    """(items the CPU tier runs, all items) of ``cases``: their selected checks."""
    names = [(case, name) for case in cases for name, _ in selected_checks(case)]
    return sum(runs_on_cpu(case, name) for case, name in names), len(names)
