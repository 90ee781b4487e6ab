"""Progress of ``python -m harness run`` (harness.progress) and of a pytest run (ssd_pytest.progress): one line per
case with its outcomes, elapsed time and an ETA weighted by the items' expected cost."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.progress import CaseProgress, format_duration, format_eta
from tests.support import needs_cpu_interpreter

pytest_plugins = ["pytester"]


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
    clock.now += 30  # the first item also waited for its process to start: the rate is measured after it
    assert progress.item_done(small, "a", "passed") is None  # the case has an item left
    clock.now += 5
    # 5 s for 1 of the 9 weight left after the first item: the 8 left take 40 s (by item count: 5 s)
    assert progress.item_done(small, "b", "skipped") == (
        "small-case     1 passed 1 skipped  [1/2 cases, 35s elapsed, ETA 40s]")
    clock.now += 145
    assert progress.item_done(large, "b", "failed") is None
    assert progress.item_done(large, "a", "passed") == (
        "a-larger-case  1 passed 1 failed  [2/2 cases, 3m00s elapsed, done]")


def test_the_eta_is_unknown_until_an_item_after_the_first_has_ended():
    one, two = SimpleNamespace(id="one"), SimpleNamespace(id="two")
    clock = Clock()
    progress = CaseProgress([(one, "a"), (two, "a")], lambda case, check: 1.0, clock=clock)
    assert progress.status() == "0/2 cases, 0s elapsed, ETA unknown"
    clock.now += 3
    assert progress.item_done(one, "a", "passed") == "one  1 passed  [1/2 cases, 3s elapsed, ETA unknown]"


def _tiny_run(pytester, device, *args):
    from tests.broken_providers import TINY_CASES

    tiny = pytester.makefile(".yaml", tiny=TINY_CASES)
    pytester.makepyfile(test_other="def test_plain():\n    pass\n")
    return pytester.runpytest_inprocess("-p", "ssd_pytest.plugin", "--device", device, "-p", "no:cacheprovider",
                                        "--isolation", "none", "--provider", "reference:provider", str(tiny),
                                        "test_other.py", "-k", "determinism or returned_shapes or plain", *args)


def test_pytest_prints_a_line_per_case_instead_of_its_items_letters(pytester, device):
    result = _tiny_run(pytester, device)
    assert result.ret == 0, result.stdout.str()
    out = result.stdout.str()
    lines = [line for line in result.outlines if line.startswith("tiny-")]
    assert [line.split()[0] for line in lines] == ["tiny-direct", "tiny-batch", "tiny-returned"], out
    # (pytest may end the last one with its own "[ 85%]" before the next file's name)
    assert lines[0].startswith("tiny-direct    2 passed  [1/3 cases, ") and " elapsed, done]" in lines[-1], lines
    assert "tiny-returned  2 passed  [3/3 cases, " in out, out
    # the case items print no letters: the file's name once, its case lines below it; the plain test keeps its "."
    start = result.outlines.index("tiny.yaml ")
    assert result.outlines[start + 1:start + 4] == lines, result.outlines
    assert result.outlines[start + 4].startswith("test_other.py .  "), result.outlines
    result.assert_outcomes(passed=7)


def test_with_v_pytest_keeps_its_line_per_item_and_adds_no_case_line(pytester, device):
    result = _tiny_run(pytester, device, "-v")
    assert result.ret == 0, result.stdout.str()
    assert not [line for line in result.outlines if line.startswith("tiny-")]
    result.stdout.fnmatch_lines(["*tiny.yaml::tiny-direct::determinism PASSED*"])


@needs_cpu_interpreter
def test_a_crashed_items_case_line_counts_it_once_as_an_error(pytester):
    """xdist's report of an item whose worker died (``when="???"``) ends the item, as a teardown does: its case's
    line counts it as an error, and the replacement worker's re-run of it is not counted again."""
    from ssd_pytest.progress import CaseLines
    from tests.broken_providers import TINY_CASES

    pytester.makefile(".yaml", tiny=TINY_CASES)
    config = pytester.parseconfigure("-p", "ssd_pytest.plugin", "--device", "cpu")
    written: list[str] = []
    lines = CaseLines(config, SimpleNamespace(write=lambda text, flush=False: written.append(text)))
    lines.xdist_controller = True
    nodeid = "tiny.yaml::tiny-direct::determinism"
    lines.plan([nodeid, "tiny.yaml::tiny-direct::masked_state"], lambda nodeid: 1.0)

    def report(when, outcome):
        return pytest.TestReport(nodeid, ("tiny.yaml", 0, nodeid), {}, outcome, None, when)

    lines.pytest_runtest_logreport(report("???", "failed"))
    for when in ("setup", "call", "teardown"):  # the re-run, on the replacement worker
        lines.pytest_runtest_logreport(report(when, "passed"))
    assert written == []  # the case's other item has not ended
    other = "tiny.yaml::tiny-direct::masked_state"
    for when in ("setup", "call", "teardown"):
        lines.pytest_runtest_logreport(pytest.TestReport(other, ("tiny.yaml", 0, other), {}, "passed", None, when))
    assert [line.split("[")[0].split() for line in written] == [["tiny-direct", "1", "passed", "1", "error"]], written
