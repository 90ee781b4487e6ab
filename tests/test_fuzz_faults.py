"""The fuzzer against providers that fault on one region of the search space (``tests.faulty_providers``: a
segfault on every call with two or more sequences, a hang or an IndexError where a sequence crosses a chunk
boundary, a sticky device error that poisons its process): each fault is found, shrunk, written as a YAML case whose
description names the fault, and ``repro`` on that file shows the fault again.

The searches run their examples in supervised children, as the CLI does: a crash, a hang or a sticky device error
costs its child, and the next example runs in a fresh one. A child's start-up takes seconds on a busy GPU host (its
device context), and shrinking a crash costs one start-up per step, so the searches that lose children are bounded
by a shrinking budget (examples: seeded searches draw the same examples on any host) with a time budget behind it,
and must show the failure shrunk part of the way (a smaller case, still in the faulting region); the search whose
fault leaves its child alive shrinks to the end. Every search checks ``determinism`` alone, which applies to every
drawn case: one item per example keeps each example short.
"""

from __future__ import annotations

import io
import re
import shlex

import pytest

from harness.cases.loader import load_case_file
from harness.fuzz import Finding, NoFailure, classify, fuzz, size
from tests import faulty_providers as fp
from tests.broken_providers import TINY_CASES
from tests.support import harness

pytestmark = pytest.mark.usefixtures("children_with_one_hardware_queue")  # tests/conftest.py says why

CHECK = "determinism"
HEARTBEAT = 0.05  # several beats inside the shortest shrinking below (the crashes' three steps), on a fast host
# Examples while shrinking, for the searches that lose a child at every failing example (on a GPU each starts a CUDA
# context): with this seed each of these searches' first smaller failure is the first example after the fault (the
# crash searches' whole shrinking takes 29 examples), under the Hypothesis releases of both tiers' images. A crash's
# count leaves room for another release's shrinking order. A hang's example waits out the item limit twice (the hang
# is confirmed), so its search shrinks one example: the suite's longest item, which bounds a GPU run's wall time.
# Were a release's first step not smaller, ``_written`` fails the test, naming both cases.
LOSING_SHRINK = 3
HANG_SHRINK = 1
# Wall time behind the shrinking budget, for a host too slow to spend it: enough for the first child's start-up and
# the first fault on a busy host (a CUDA child also creates its context), then as many shrinking steps as fit. Each
# step starts a child (forked by the fork server: a fraction of a second; spawned, where it cannot fork, about 5 s
# on a busy 2-core host).
LOSING_BUDGET = {"cpu": 15, "cuda": 45}
# A hang costs the item time limit on top, at the first fault and at each confirmation and shrinking step: the
# hang search first saw its hang after about 8 s on a busy 2-core host, and had shrunk it within 12 s; 20 s leaves
# room for a host a third slower.
HANG_BUDGET = {"cpu": 20, "cuda": 45}
# The item time limit of the searches that meet hangs: far above a passing example's call, also the first call in a
# fresh child (a confirming one) when the suite starts its process tests together; 2 s was not above it on a GPU
# host (notes/gpu-runs.md).
HANG_LIMIT = 3
# The time budget the slow provider's search waits out: 25 heartbeats, and examples from the first on (that one runs
# however long the child's start-up took: on a GPU host beside the suite's process tests it took more than 5 s).
SLOW_SEARCH_BUDGET = 5


def _batch_of_two_or_more(case) -> bool:
    return case.batch >= 2


def _crosses_a_chunk_boundary(case) -> bool:
    q = case.shape.chunk_size
    return any(s.context % q + s.tokens > q for s in case.sequences)


def _search(tmp_path, device, provider: str, *, time_budget: float, shrink_budget: int | None = None,
            item_timeout: float = 60.0, isolation: str | None = None,
            provider_object=None) -> tuple[Finding | NoFailure, str]:
    log = io.StringIO()
    try:
        found = fuzz(f"tests.faulty_providers:{provider}", budget=40, out_dir=tmp_path / "found", device=device,
                     checks=[CHECK], timeout=item_timeout, time_budget=time_budget, shrink_budget=shrink_budget,
                     heartbeat=HEARTBEAT, log=log, isolation=isolation, provider=provider_object)
    finally:
        _show(log)
    return found, log.getvalue()


def _show(log: io.StringIO) -> None:
    """The search's progress lines to the test's captured output: pytest shows them with a failure, and with
    ``-rP`` for a pass (when the first fault came and how long each shrinking step took: what sizes the budgets)."""
    print(log.getvalue(), end="")


def _written(found: Finding, region) -> object:
    """The written case: one file, loading back to a case of the failing check, in the faulting region, and smaller
    than the case that showed the fault first (the search draws no minimal case first, with this seed)."""
    assert isinstance(found, Finding), found
    assert [p.name for p in found.path.parent.iterdir()] == [found.path.name]
    (case,) = load_case_file(found.path)
    assert case.checks == (CHECK,) and case.expect.kind == "pass", case
    assert region(case), case.summary()
    assert region(found.first) and size(case) < size(found.first), (case.summary(), found.first.summary())
    return case


def _heard(log: str) -> None:
    """The progress lines: the start, the first failure, and heartbeats while shrinking that name the smallest
    failure so far."""
    assert log.startswith("fuzz: searching up to 40 examples or "), log
    assert re.search(r"fuzz: found after \d+ examples \(\d+ s\): determinism failed", log), log
    assert re.search(r"fuzz: shrinking: \d+ examples, [1-9]\d* faults?, \d+ process restarts, \d+ s; "
                     r"smallest failure so far: determinism failed", log), log


def _repro_shows(path, case_id: str, provider: str, device: str, cause: str, *extra: str) -> None:
    proc = harness("repro", str(path), "--case", case_id, "--check", CHECK, "--provider",
                   f"tests.faulty_providers:{provider}", "--device", device, *extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"ERROR: {case_id}::{CHECK}" in proc.stdout and cause in proc.stdout, proc.stdout


def test_a_segfault_on_batches_is_found_shrunk_and_written_and_repro_shows_it(tmp_path, device):
    found, log = _search(tmp_path, device, "segfaults_on_batch", time_budget=LOSING_BUDGET[device],
                         shrink_budget=LOSING_SHRINK)
    case = _written(found, _batch_of_two_or_more)
    assert found.failure.kind == "crash" and found.restarts >= 1, found
    assert case.description.endswith("determinism failed with a crash (the process running the provider died: "
                                      "SIGSEGV (signal 11))"), case.description
    _heard(log)
    _repro_shows(found.path, found.case_id, "segfaults_on_batch", device,
                 "the process running the provider died: SIGSEGV (signal 11)")


def test_a_hang_across_chunks_is_found_shrunk_and_written_with_the_limit_it_was_found_under(tmp_path, device):
    """The written case is in the hanging region (``_written``), so its repro line hangs by the provider's
    definition; running such a line is the next test's, so that the two hangs' waits can run on two workers."""
    found, log = _search(tmp_path, device, "hangs_across_chunks", time_budget=HANG_BUDGET[device],
                         shrink_budget=HANG_SHRINK, item_timeout=HANG_LIMIT)
    case = _written(found, _crosses_a_chunk_boundary)
    assert found.failure.kind == "hang", found
    assert f"determinism failed with a hang (timed out after {HANG_LIMIT} s" in case.description, case.description
    repro = shlex.join(["python", "-m", "harness", "repro", str(found.path), "--check", CHECK, "--case",
                        found.case_id, "--provider", "tests.faulty_providers:hangs_across_chunks", "--device", device,
                        "--item-timeout", str(HANG_LIMIT)])
    assert found.repro == repro, found.repro  # the limit the hang was found under, last
    _heard(log)


def test_a_repro_line_with_an_item_timeout_shows_the_hang_stopped_there(tmp_path, device):
    """A repro line as the hang search writes it (above), on a case in the hanging region (``tiny-direct``'s
    sequence crosses a chunk boundary): the item is an error stopped at the ``--item-timeout`` it names."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_CASES)
    (case,) = [c for c in load_case_file(path) if c.id == "tiny-direct"]
    assert _crosses_a_chunk_boundary(case), case.summary()
    _repro_shows(path, case.id, "hangs_across_chunks", device,
                 f"timed out after {HANG_LIMIT:g} s (limit from --item-timeout)", "--item-timeout", str(HANG_LIMIT))


def test_a_hang_that_does_not_repeat_is_no_finding(tmp_path, device, monkeypatch):
    """A case's first call passes the time limit and works in the fresh child (as a first call that compiles on
    a busy host can): the search confirms each hang before it counts, so it finds nothing and writes nothing. The
    provider wraps ``reference:provider``, which compiles nothing: the confirming call in a fresh child stays under
    ``HANG_LIMIT``."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv(fp.SlowOnceAcrossChunks.MARKS_ENV, str(marks))
    log = io.StringIO()
    try:
        found = fuzz("tests.faulty_providers:slow_once_across_chunks", budget=6, out_dir=tmp_path / "found",
                     device=device, checks=[CHECK], timeout=HANG_LIMIT, time_budget=HANG_BUDGET[device] * 2,
                     heartbeat=HEARTBEAT, log=log)
    finally:
        _show(log)
    assert isinstance(found, NoFailure), found
    assert list(marks.iterdir()), "no drawn case crossed a chunk boundary: the test saw no first call time out"
    assert found.restarts >= 1, found  # the slow call's child was stopped at the limit; its confirmation passed
    assert not (tmp_path / "found").exists() or not list((tmp_path / "found").iterdir())


def test_an_exception_across_chunks_is_shrunk_to_the_end(tmp_path, device):
    """The child survives an exception, so nothing bounds the shrinking but Hypothesis: the case is the smallest
    that crosses a chunk boundary."""
    found, log = _search(tmp_path, device, "raises_across_chunks", time_budget=150)
    case = _written(found, _crosses_a_chunk_boundary)
    assert not found.stopped and found.restarts == 0, found
    assert found.failure.kind == "exception", found
    assert "determinism failed with an exception (IndexError: chunk index out of range" in case.description
    q = case.shape.chunk_size
    assert [(s.context, s.tokens) for s in case.sequences] == [(0, q + 1)] and q == 16, case.summary()
    _heard(log)
    _repro_shows(found.path, found.case_id, "raises_across_chunks", device, "IndexError: chunk index out of range")


def test_a_sticky_device_error_is_shrunk_in_healthy_processes_through_the_cli(tmp_path, device):
    """After the poisoning call every later call in the same process fails too: were examples to keep running in
    that process, every one would fail and the search would shrink to a case outside the region. The poisoned
    child is replaced, so the written case still has two sequences."""
    out, spec = tmp_path / "found", "tests.faulty_providers:sticky_on_batch"
    proc = harness("fuzz", "--budget", "40", "--time-budget", str(LOSING_BUDGET[device]), "--shrink-budget",
                   str(LOSING_SHRINK), "--heartbeat", str(HEARTBEAT), "--check", CHECK, "--provider", spec, "--device",
                   device, "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (written,) = out.glob("*.yaml")
    (case,) = load_case_file(written)
    assert case.checks == (CHECK,) and _batch_of_two_or_more(case), case.summary()
    fault = f"determinism failed with a sticky device error (RuntimeError: {fp.STICKY_MESSAGE}"
    assert fault in case.description, case.description
    assert re.search(rf"^fuzz: {re.escape(fault)}.*\); (partly )?shrunk case written to {re.escape(str(written))} ",
                     proc.stdout, flags=re.MULTILINE), proc.stdout
    assert re.search(r"^first seen on: H\d+ P\d+ .*seqs=\[.*, .*\]", proc.stdout, flags=re.MULTILINE), proc.stdout
    assert (f"repro: python -m harness repro {written} --check {CHECK} --case {written.stem} --provider {spec} "
            f"--device {device}") in proc.stdout
    assert re.search(r"^fuzz: \d+ examples, [1-9]\d* faults, [1-9]\d* provider process restarts$", proc.stdout,
                     flags=re.MULTILINE), proc.stdout
    _heard(proc.stderr)
    repro = harness("repro", str(written), "--provider", spec, "--device", device)
    assert repro.returncode == 1 and f"ERROR: {written.stem}::{CHECK}" in repro.stdout, repro.stdout + repro.stderr
    assert fp.STICKY_MESSAGE in repro.stdout and "provider process restarts: 1" in repro.stdout, repro.stdout


def test_the_cli_heartbeat_and_time_budget_with_a_slow_provider(tmp_path, device):
    """Every call of ``slow`` takes longer than Hypothesis' default deadline: no example may fail for that (the
    item time limit, not Hypothesis, stops slow items). The time budget ends the search, which reports that nothing
    failed (exit 0), and the heartbeat kept saying where it was. The budget is waited out
    (``SLOW_SEARCH_BUDGET``): many heartbeats (five asked for) and examples of the slow provider, the first at least."""
    budget = SLOW_SEARCH_BUDGET
    proc = harness("fuzz", "--budget", "1000", "--time-budget", str(budget), "--heartbeat", str(HEARTBEAT), "--check",
                   CHECK, "--provider", "tests.faulty_providers:slow", "--device", device, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"fuzz: no failure in [1-9]\d* examples, [1-9]\d* items .*; stopped early: the time budget "
                     rf"of {budget} s ran out", proc.stdout), proc.stdout
    beats = re.findall(r"^fuzz: searching: \d+ examples, 0 faults, 0 process restarts, \d+ s; no failure yet$",
                       proc.stderr, flags=re.MULTILINE)
    assert len(beats) >= 5, proc.stderr
    assert not list(tmp_path.iterdir())


def test_an_interrupted_search_writes_what_it_found(tmp_path, device):
    """Ctrl-C (or SIGTERM, which the CLI turns into the same) while shrinking: the smallest failure so far is still
    written. In this process (``isolation="none"``), where the provider's KeyboardInterrupt is the user's."""

    class InterruptsWhileShrinking(fp.RaisesAcrossChunks):
        faults = 0

        def fault(self) -> None:
            self.faults += 1
            if self.faults == 3:
                raise KeyboardInterrupt
            super().fault()

    found, _ = _search(tmp_path, device, "raises_across_chunks", time_budget=60, isolation="none",
                       provider_object=InterruptsWhileShrinking())
    _written(found, _crosses_a_chunk_boundary)
    assert found.stopped == "interrupted" and found.failure.kind == "exception", found


def test_failures_are_told_apart_by_how_they_failed():
    from harness.checks import CheckResult, Status

    def result(status: Status, summary: str) -> CheckResult:
        return CheckResult(case_id="c", check=CHECK, status=status, summary=summary)

    crash = "the process running the provider died: SIGSEGV (signal 11)"
    assert classify(result(Status.ERROR, crash), crash).signature == f"crash: {crash}"
    hang = classify(result(Status.ERROR, "timed out after 3 s (x)"), "timed out after 3 s (x)")
    assert hang.kind == "hang" and hang.fault
    sticky = classify(result(Status.ERROR, f"RuntimeError: {fp.STICKY_MESSAGE}"),
                      f"sticky device error: RuntimeError: {fp.STICKY_MESSAGE}")
    assert sticky.kind == "sticky device error" and sticky.cause == f"RuntimeError: {fp.STICKY_MESSAGE}"
    raised = classify(result(Status.ERROR, "IndexError: out of range"))
    assert raised.signature == "exception: IndexError" != classify(result(Status.ERROR, "ValueError: x")).signature
    mismatch = classify(result(Status.FAILED, "output differs"))
    assert mismatch.kind == "mismatch" and not mismatch.fault
    assert mismatch.describe() == f"{CHECK} failed (output differs)"


@pytest.mark.parametrize("option", ["--time-budget", "--heartbeat"])
def test_budgets_must_be_positive(tmp_path, device, option):
    proc = harness("fuzz", "--budget", "3", option, "0", "--out", str(tmp_path), "--device", device)
    assert proc.returncode == 2 and f"{option}: expected seconds (a number > 0), found 0" in proc.stderr


def test_the_shrinking_budget_stops_shrinking_after_that_many_examples(tmp_path, device):
    """The search finds the fault, runs exactly ``shrink_budget`` more examples, and writes the smallest failure of
    those: partly shrunk, still in the faulting region, and saying why it stopped."""
    found, log = _search(tmp_path, device, "raises_across_chunks", time_budget=150, shrink_budget=3)
    case = _written(found, _crosses_a_chunk_boundary)
    first = int(re.search(r"fuzz: found after (\d+) examples", log).group(1))
    assert found.stopped == "the shrinking budget of 3 examples ran out" and found.examples == first + 3, found
    assert [(s.context, s.tokens) for s in case.sequences] != [(0, case.shape.chunk_size + 1)], case.summary()
    assert "fuzz: stopped: the shrinking budget of 3 examples ran out" in log, log


def test_the_shrinking_budget_must_be_positive(tmp_path, device):
    proc = harness("fuzz", "--budget", "3", "--shrink-budget", "0", "--out", str(tmp_path), "--device", device)
    assert proc.returncode == 2 and "--shrink-budget: expected an integer >= 1, found 0" in proc.stderr, proc.stderr
