"""scripts/fit_cpu_tier.py: the least-squares fit recovers the constants that made a report's durations, and the
budget table it prints follows the tier's own plans (the constants restored afterwards)."""

from __future__ import annotations

import pytest

from harness.checks import kernel_exact, tiers
from tests.support import loaded_script


@pytest.fixture(scope="module")
def fit_tool():
    yield from loaded_script("fit_cpu_tier")


def _synthetic_report(fit_tool, cases: dict, per_block: float, per_state: float) -> dict:
    """Each case's selected checks, with durations that split the terms' cost between them (the fit sees sums)."""
    items = []
    for case in cases.values():
        checks = frozenset(name for name, _ in tiers.selected_checks(case))
        blocks, states = fit_tool.terms(case, checks)
        for name in checks:
            items.append({"nodeid": f"x::{case.id}::{name}", "case_id": case.id, "check": name, "outcome": "passed",
                          "duration": (per_block * blocks + per_state * states) / len(checks)})
    items.append({"nodeid": "tests/t.py::t", "case_id": None, "check": None, "outcome": "passed", "duration": 9.0})
    return {"items": items}


def test_the_fit_recovers_the_constants_that_made_the_durations(fit_tool):
    cases = dict(list(fit_tool.load_cases("cases/corpus/serving.yaml").items())
                 + list(fit_tool.load_cases("cases/corpus/multi.yaml").items())[:40])
    saved = tiers.SECONDS_PER_BLOCK, kernel_exact.STATE_PASSING_SECONDS_PER_STATE
    coef, X, y = fit_tool.fit(_synthetic_report(fit_tool, cases, 0.02, 2e-6), cases)
    assert coef[0] == pytest.approx(0.02, rel=1e-6) and coef[1] == pytest.approx(2e-6, rel=1e-6)
    assert len(y) == len(cases) and (X[:, 1] > 0).any(), "no case charged state_passing_exact's states"
    assert (tiers.SECONDS_PER_BLOCK, kernel_exact.STATE_PASSING_SECONDS_PER_STATE) == saved


def test_a_report_without_case_items_is_refused(fit_tool):
    with pytest.raises(SystemExit, match="no case item that ran"):
        fit_tool.fit({"items": [{"nodeid": "t", "case_id": None, "check": None, "outcome": "passed"}]}, {})


def test_the_budget_table_is_the_tiers_count_and_grows_with_the_budget(fit_tool):
    corpus = list(fit_tool.load_cases("cases/corpus/serving.yaml").values())
    rows = fit_tool.budget_rows(corpus, tiers.SECONDS_PER_BLOCK, kernel_exact.STATE_PASSING_SECONDS_PER_STATE,
                                [tiers.CPU_CASE_SECONDS, 100.0])
    assert rows[0][1:3] == tiers.cpu_tier_items(corpus)  # the shipped constants and budget: the tier's own count
    assert rows[1][1] > rows[0][1] and rows[1][3] > rows[0][3]
    assert tiers.cpu_tier_items(corpus) == rows[0][1:3], "the plans were left at the table's last budget"
