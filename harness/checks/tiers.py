"""The CPU tier: which case items run under Triton's interpreter (docs/checks.md#tiers).

The interpreter runs every Triton program as numpy code, one after the other, so one call of a case costs about
``SECONDS_PER_BLOCK`` per interpreter block (``Case.cpu_blocks``: chunks x heads, a head of a chunk counted in
blocks of 64 chunk rows and 128 state columns), and a check costs its ``cpu_calls`` such calls. Both were measured
(docs/checks.md#tiers). An item runs on the CPU tier when its case is small (at most ``CPU_CASE_BLOCKS`` blocks: every
check of it runs) or when the item's estimated time is within ``CPU_ITEM_SECONDS`` (the cheap checks of larger
cases). A case's ``tiers.cpu`` overrides both for all its items (true: every one runs there, false: none does).
"""

from __future__ import annotations

from harness.cases.model import cpu_block_factors
from harness.checks.registry import get_check, selected_checks

# Seconds of one interpreted call per block, measured on one core (docs/checks.md#tiers).
SECONDS_PER_BLOCK = 0.066
# A case of at most this many blocks runs every check on the CPU tier.
CPU_CASE_BLOCKS = 12
# Beyond that, an item runs there when its estimated interpreter time is at most this.
CPU_ITEM_SECONDS = 1.2


def cpu_estimate(case, check_name: str) -> float:
    """Estimated seconds of ``check_name`` on ``case`` in the interpreter, on one core."""
    return get_check(check_name).cpu_calls * SECONDS_PER_BLOCK * case.cpu_blocks()


def cpu_tier_reason(case, check_name: str) -> str:
    """Why the CPU tier skips this item, or "" when it runs it. Names each limit exceeded with the case's value,
    and the override."""
    forced = case.tiers.cpu
    if forced is True:
        return ""
    where = f"in {case.source}" if case.source else "in the case"
    if forced is False:
        return f"beyond the CPU interpreter tier: tiers.cpu is false {where}; runs on the GPU tier"
    blocks = case.cpu_blocks()
    estimate = cpu_estimate(case, check_name)
    if blocks <= CPU_CASE_BLOCKS or estimate <= CPU_ITEM_SECONDS:
        return ""
    chunks, heads, rows, states = cpu_block_factors(case.shape, case.sequences)
    return (f"beyond the CPU interpreter tier: {blocks} blocks > {CPU_CASE_BLOCKS} per case ({chunks} chunks x "
            f"{heads} heads x {rows} x {states}: blocks of 64 chunk rows and 128 state columns) and {check_name} is "
            f"estimated at {estimate:.1f} s > {CPU_ITEM_SECONDS:g} s per item ({get_check(check_name).cpu_calls:g} "
            f"calls x {SECONDS_PER_BLOCK} s per block); tiers: {{cpu: true}} {where} runs it there anyway; runs on "
            f"the GPU tier")


def cpu_tier_gaps(case) -> tuple[list[str], str]:
    """(the checks of ``case`` the CPU tier skips, why in a few words); ([], "") when it runs them all."""
    skipped = [name for name, _ in selected_checks(case) if cpu_tier_reason(case, name)]
    if not skipped:
        return [], ""
    if case.tiers.cpu is False:
        return skipped, "tiers.cpu is false"
    return skipped, (f"{case.cpu_blocks()} blocks > {CPU_CASE_BLOCKS} per case, and each of these is estimated above "
                     f"{CPU_ITEM_SECONDS:g} s")


def runs_on_cpu(case, check_name: str) -> bool:
    return not cpu_tier_reason(case, check_name)


def cpu_tier_items(cases) -> tuple[int, int]:
    """(items the CPU tier runs, all items) of ``cases``: their selected checks."""
    names = [(case, name) for case in cases for name, _ in selected_checks(case)]
    return sum(runs_on_cpu(case, name) for case, name in names), len(names)
