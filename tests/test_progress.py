"""Progress of ``python -m harness run`` (harness.progress): one line per case with its outcomes, elapsed time and an
ETA weighted by the items' expected cost."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.progress import CaseProgress, format_duration, format_eta


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (44.6, "45s"), (190, "3m10s"), (3900, "1h05m")])
def test_elapsed_time_reads_in_seconds_minutes_and_hours(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("seconds", "text"), [(40, "40s"), (420, "7m"), (449, "7m"), (3900, "1h05m")])
def test_the_eta_is_coarser(seconds, text):
    assert format_eta(seconds) == text


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_case_when_its_last_item_ends_with_its_outcomes_and_the_cost_weighted_eta():
    small, large = SimpleNamespace(id="small-case"), SimpleNamespace(id="a-larger-case")
    plan = [(small, "a"), (small, "b"), (large, "a"), (large, "b")]
    weights = {("small-case", "a"): 1.0, ("small-case", "b"): 1.0, ("a-larger-case", "a"): 6.0,
               ("a-larger-case", "b"): 2.0}
    clock = Clock()
    progress = CaseProgress(plan, lambda case, check: weights[(case.id, check)], clock=clock)
    clock.now += 5
    assert progress.item_done(small, "a", "passed") is None  # the case has an item left
    clock.now += 5
    # 10 s for 2 of 10 weight: 8 left take 40 s (an ETA by item count would say 10 s)
    assert progress.item_done(small, "b", "skipped") == (
        "small-case     1 passed 1 skipped  [1/2 cases, 10s elapsed, ETA 40s]")
    clock.now += 170
    assert progress.item_done(large, "b", "failed") is None
    assert progress.item_done(large, "a", "passed") == (
        "a-larger-case  1 passed 1 failed  [2/2 cases, 3m00s elapsed, done]")


def test_an_eta_before_any_weight_is_done_is_unknown():
    case = SimpleNamespace(id="c")
    progress = CaseProgress([(case, "a"), (case, "b")], lambda case, check: 0.0, clock=Clock())
    assert progress.status() == "0/1 cases, 0s elapsed, ETA unknown"
