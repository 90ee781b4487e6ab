"""Refit the CPU tier's cost constants to a measured run (docs/checks.md#tiers).

    python -m pytest -n auto --ssd-report /tmp/cpu.json      # the whole CPU suite, as `make test` runs it
    python scripts/fit_cpu_tier.py /tmp/cpu.json [--budget 2 --budget 2.25 ...]

Per case, the measured seconds of the case items that ran are fitted by least squares to the tier's two terms
(``harness.checks.tiers``): call-blocks (each check's calls as the tier charges them, a shared call to the first check
that makes it) and states (``state_passing_exact``'s own formula). Prints the two constants, how well they predict the
cases (measured over estimated: 10th percentile, median, 90th), and for each case budget the corpus items the CPU tier
would run with them and their estimated seconds. A kernel change that moves the interpreter's cost calls for a refit.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.cases.loader import load_case_file  # noqa: E402
from harness.checks import kernel_exact, tiers  # noqa: E402

RAN = ("passed", "failed", "xfailed")


def load_cases(pattern: str = "cases/**/*.yaml") -> dict:
    return {c.id: c for path in sorted(Path(".").glob(pattern)) for c in load_case_file(path)}


def terms(case, checks: frozenset[str]) -> tuple[float, float]:
    """(call-blocks, states) the tier charges for ``checks`` of ``case``: its estimate with each term's constant set
    to 1 and the other's to 0 (``tiers._in_order`` reads the constants at call time, unlike the cached plans)."""
    names = [name for name, _ in tiers.selected_checks(case)]
    out = []
    for per_block, per_state in ((1.0, 0.0), (0.0, 1.0)):
        with tiers.costed(per_block, per_state):
            out.append(sum(tiers._in_order(case, names, checks, skipped=False).values()))
    return out[0], out[1]


def fit(report: dict, cases: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(coefficients [seconds per call-block, seconds per state], the cases' terms, their measured seconds)."""
    ran = collections.defaultdict(dict)
    for item in report["items"]:
        if item.get("case_id") in cases and item.get("check") and item["outcome"] in RAN:
            ran[item["case_id"]][item["check"]] = item["duration"] or 0.0
    if not ran:
        raise SystemExit("fit_cpu_tier: the report holds no case item that ran")
    X = np.array([terms(cases[cid], frozenset(items)) for cid, items in ran.items()])
    y = np.array([sum(items.values()) for items in ran.values()])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return coef, X, y


def budget_rows(cases: list, per_block: float, per_state: float, budgets: list[float]) -> list[tuple]:
    """(budget, items on the CPU tier, corpus items, estimated seconds) per case budget, with these constants."""
    rows = []
    for budget in budgets:
        with tiers.costed(per_block, per_state, budget):
            on_cpu, items = tiers.cpu_tier_items(cases)
            rows.append((budget, on_cpu, items, sum(tiers.cpu_plan(c).spent for c in cases)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="an --ssd-report of a whole CPU run")
    parser.add_argument("--budget", type=float, action="append", help="case budgets to tabulate (seconds)")
    args = parser.parse_args()
    cases = load_cases()
    coef, X, y = fit(json.loads(Path(args.report).read_text()), cases)
    ratio = y / np.maximum(X @ coef, 1e-9)
    print(f"{len(y)} cases: {coef[0]:.4f} s per call-block, {coef[1]:.2e} s per state; measured / estimated per case "
          f"{np.percentile(ratio, 10):.2f} (10th percentile), {np.median(ratio):.2f} (median), "
          f"{np.percentile(ratio, 90):.2f} (90th)")
    shipped = np.array([tiers.SECONDS_PER_BLOCK, kernel_exact.STATE_PASSING_SECONDS_PER_STATE])
    print(f"the shipped constants ({shipped[0]:g}, {shipped[1]:g}): measured / estimated over all cases "
          f"{y.sum() / (X @ shipped).sum():.2f}")
    corpus = [c for path in sorted(Path("cases/corpus").glob("*.yaml")) for c in load_case_file(path)]
    for budget, on_cpu, items, spent in budget_rows(corpus, coef[0], coef[1], args.budget or [tiers.CPU_CASE_SECONDS]):
        print(f"case budget {budget:g} s: {on_cpu} of {items} corpus items ({100 * on_cpu / items:.1f}%), "
              f"estimated {spent:.0f} s")


if __name__ == "__main__":
    main()
