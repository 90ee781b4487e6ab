"""Reports never lie and never destroy (issue 52): a crashed xdist worker's item is an error in every report; a
report says whether its run finished, how many items were collected and which workers died; an output is written
beside its target and renamed, never over a device, a FIFO, an input or a file that is not a report; runs sharing a
report path keep their own parts; an I/O error ends a run with exit 2 and the report of what ran."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import cli
from harness.interrupts import sigterm_as_interrupt
from harness.report import (
    ItemRecord,
    LiveReport,
    Report,
    append_live,
    merge_parts,
    parts_dir,
    summary_lines,
    write_part,
)
from tests import broken_providers as bp
from tests.support import alive, harness, needs_cpu_interpreter

pytestmark = pytest.mark.usefixtures("children_with_one_hardware_queue")  # tests/conftest.py says why

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def _passed(nodeid: str, worker: str = "gw0") -> ItemRecord:
    return ItemRecord(nodeid, "passed", duration=0.1, worker=worker)


# ---------------------------------------------------------------- 1. a crashed worker's item


@needs_cpu_interpreter
def test_a_worker_killed_mid_item_is_an_error_and_the_report_counts_match_pytests(tmp_path):
    """``pytest -n 2 --ssd-report`` where one item SIGKILLs its own worker: pytest counts it failed; the report has
    every item pytest reported, that one an error naming the crash, and names the worker that died. xdist's
    default restart replaces the worker, which runs what the dead one had left (the crashed item never again: the
    scheduler, ``ssd_pytest.private_api``, once handed the replacement a single item and the run waited for ever)."""
    (tmp_path / "test_dies.py").write_text(
        "import os, signal\n"
        "def test_before():\n    pass\n"
        "def test_dies():\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "def test_after():\n    pass\n"
        "def test_last():\n    pass\n")
    report = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ssd_pytest.plugin", "--device", "cpu", "-n", "2",
         "-p", "no:cacheprovider", "-p", "no:randomly", "--ssd-report", str(report), "-rfE", "test_dies.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    data = json.loads(report.read_text())
    outcomes = {item["nodeid"].rsplit("::", 1)[1]: item["outcome"] for item in data["items"]}
    assert outcomes["test_dies"] == "error", (outcomes, out)
    dead = next(item for item in data["items"] if item["nodeid"].endswith("::test_dies"))
    assert "crashed while running 'test_dies.py::test_dies'" in dead["summary"], dead
    passed = sum(1 for o in outcomes.values() if o == "passed")
    assert f"1 failed, {passed} passed" in proc.stdout, out  # pytest's counts are the report's
    assert data["counts"] == {"error": 1, "passed": passed}
    assert passed == 3 and data["meta"]["collected"] == 4 and data["meta"]["exit_status"] == 1
    assert list(data["meta"]["crashed_workers"]) == [dead["worker"]], data["meta"]
    assert "no failures" not in proc.stdout and f"worker {dead['worker']} died" in proc.stdout, out


@needs_cpu_interpreter
def test_a_crashed_items_error_outlives_its_rerun_on_the_replacement_worker(pytester):
    """xdist hands a crashed worker's unfinished unit, the crashed item included, to the replacement worker, where
    it may pass: the controller's crash report (``when="???"``) stays the item's record, in its summary and in the
    merged report, whatever the replacement's part says."""
    from ssd_pytest import reporting

    report = pytester.path / "r.json"
    config = pytester.parseconfigure("-p", "ssd_pytest.plugin", "--device", "cpu", "--ssd-report", str(report))
    recorder = config.pluginmanager.get_plugin("ssd-harness-recorder")
    nodeid = "test_dies.py::test_dies"
    crash = pytest.TestReport(nodeid, ("test_dies.py", None, "test_dies.py"), {}, "failed",
                              "worker 'gw0' crashed while running 'test_dies.py::test_dies'", "???")
    rerun = pytest.TestReport(nodeid, ("test_dies.py", 3, "test_dies"), {}, "passed", None, "call")
    recorder.pytest_runtest_logreport(crash)
    recorder.pytest_runtest_logreport(rerun)
    (record,) = reporting.merged_records(config)
    assert record.outcome == "error" and record.summary.startswith("worker 'gw0' crashed"), record
    write_part(report, "run1", "gw2", Report([_passed(nodeid, "gw2")], meta={"worker": "gw2"}))
    merged = merge_parts(report, "run1", overrides=recorder.crashes)
    assert [(r.nodeid, r.outcome) for r in merged.items] == [(nodeid, "error")]


# ---------------------------------------------------------------- 2. nothing at the path is destroyed


@pytest.fixture
def tiny(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(bp.TINY_CASES)
    return path


def _run(tiny: Path, *args: str):
    return harness("run", str(tiny), "--device", "cpu", "--provider", "reference:provider", "--isolation", "none",
                   "--check", "determinism", *args)


@needs_cpu_interpreter
def test_run_json_refuses_a_fifo_and_leaves_it_in_place(tmp_path, tiny):
    """A FIFO (as a device such as the null device) given as ``--json`` is refused before anything runs, and is
    neither unlinked nor replaced by a regular file; no parts folder is made beside it."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    proc = _run(tiny, "--json", str(fifo))
    assert proc.returncode == cli.EXIT_UNUSABLE, proc.stdout + proc.stderr
    assert "is not a regular file" in proc.stderr and "nothing was run" in proc.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert not parts_dir(fifo).exists() and "PASSED" not in proc.stdout


@needs_cpu_interpreter
@pytest.mark.parametrize("which", ["the case file run", "another file"])
def test_run_json_never_overwrites_a_case_file_or_a_file_that_is_not_a_report(tmp_path, tiny, which):
    target = tiny if which == "the case file run" else tmp_path / "notes.yaml"
    if target != tiny:
        target.write_text(bp.TINY_CASES)
    before = target.read_bytes()
    proc = _run(tiny, "--json", str(target))
    assert proc.returncode == cli.EXIT_UNUSABLE, proc.stdout + proc.stderr
    assert f"--json {target}: " in proc.stderr and "it is not overwritten" in proc.stderr, proc.stderr
    assert target.read_bytes() == before


@needs_cpu_interpreter
def test_pytest_refuses_a_report_path_holding_something_else(pytester):
    """``--ssd-report`` naming a case file (or any non-empty file that is not a report) is a usage error, and the
    file is left as it was."""
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    notes = pytester.makefile(".yaml", notes=bp.TINY_CASES)
    before = notes.read_bytes()
    result = pytester.runpytest_inprocess("-p", "ssd_pytest.plugin", "--device", "cpu", "-p", "no:cacheprovider",
                                          "test_one.py", "--ssd-report", str(notes))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "is not an ssd-harness report; it is not overwritten" in result.stderr.str()
    assert notes.read_bytes() == before


def test_a_live_report_removes_nothing_before_its_run_finishes(tmp_path):
    """The earlier report, a file named like the old probe (``<report>.tmp``) and another run's parts stay as they
    are while a run goes on; ``finish`` replaces the report (renamed into place) and removes only its own part."""
    path = tmp_path / "r.json"
    Report([_passed("f::old")], meta={"run": "earlier"}).write(path)
    probe_named = tmp_path / "r.json.tmp"
    probe_named.write_text("someone's file")
    append_live(path, "other", "gw0", _passed("f::theirs"))
    live = LiveReport(path)
    live.append(_passed("f::mine", "cli"))
    assert [r.nodeid for r in Report.read(path).items] == ["f::old"]
    assert probe_named.read_text() == "someone's file"
    live.finish(Report([_passed("f::mine", "cli")], meta={"run": live.run}))
    assert [r.nodeid for r in Report.read(path).items] == ["f::mine"]
    assert [p.name for p in parts_dir(path).iterdir()] == ["other.gw0.jsonl"]


# ---------------------------------------------------------------- 3. unfinished runs never read as passes


@needs_cpu_interpreter
def test_an_interrupted_pytest_run_says_so_in_its_report_and_summary(pytester):
    """A run stopped by Ctrl-C (a test raising KeyboardInterrupt) after one item: the merged report says it was
    interrupted, with pytest's exit status and how many items were collected, and its summary does not read "no
    failures"."""
    case = pytester.makefile(".yaml", tiny=bp.TINY_CASES)
    pytester.makepyfile(test_stop="def test_stop():\n    raise KeyboardInterrupt\ndef test_never():\n    pass\n")
    report = pytester.path / "r.json"
    result = pytester.runpytest_inprocess(
        "-p", "ssd_pytest.plugin", "--device", "cpu", "-p", "no:cacheprovider", "--isolation", "none",
        "--provider", "reference:provider", f"{case.name}::tiny-direct::determinism", "test_stop.py",
        "--ssd-report", str(report), no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    data = Report.read(report)
    assert (data.meta["interrupted"], data.meta["exit_status"], data.meta["collected"]) == (True, 2, 3), data.meta
    assert "interrupted" in data.unfinished and "1 of 3 collected items reported" in data.unfinished
    text = result.stdout.str()
    assert "the run did not finish (interrupted" in text and "no failures" not in text, text


@needs_cpu_interpreter
def test_a_time_limits_sigterm_to_the_whole_run_still_writes_its_report(tmp_path):
    """``timeout`` (a CI step's limit) sends SIGTERM to pytest and then to its whole process group, xdist's worker
    included: the controller ends the session as Ctrl-C does, ignoring the second SIGTERM, so the report holds the
    item that finished and says the run was interrupted (SIGTERM's default action ended the controller before it
    wrote any report), and the worker is gone."""
    marker = tmp_path / "hanging"
    (tmp_path / "test_limit.py").write_text(
        "import os, pathlib, time\n"
        "def test_quick():\n    pass\n"
        f"def test_hangs():\n    pathlib.Path({str(marker)!r}).write_text(str(os.getpid()))\n    time.sleep(600)\n")
    report = tmp_path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "ssd_pytest.plugin", "--device", "cpu", "-n", "1",
         "-p", "no:cacheprovider", "-p", "no:randomly", "--ssd-report", str(report), "test_limit.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        assert marker.exists(), "test_hangs never started"
        time.sleep(0.5)  # the pid is written as the test starts: let the worker settle into its sleep
        # As `timeout` does: the command, then its process group; apart, so the first is handled before the second
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    data = Report.read(report)
    assert [(r.nodeid.rsplit("::", 1)[1], r.outcome) for r in data.items] == [("test_quick", "passed")], out
    assert (data.meta["interrupted"], data.meta["collected"]) == (True, 2), data.meta
    assert "interrupted" in data.unfinished and "1 of 2 collected items reported" in data.unfinished
    worker = int(marker.read_text())
    end = time.monotonic() + 10
    while alive(worker) and time.monotonic() < end:
        time.sleep(0.2)
    assert not alive(worker), "the worker outlived its run"


def test_sigterm_interrupts_once_and_the_later_ones_are_ignored_until_given_back():
    """The first SIGTERM raises KeyboardInterrupt; a later one (``timeout`` signals its command, then the command's
    process group) does nothing while the run winds down; giving the handler back restores the earlier one."""
    seen = []

    def record(signum, frame):
        seen.append(signum)

    earlier = signal.signal(signal.SIGTERM, record)
    try:
        give_back = sigterm_as_interrupt()
        with pytest.raises(KeyboardInterrupt, match="signal 15"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode; never reached
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert seen == []
        give_back()
        assert signal.getsignal(signal.SIGTERM) is record
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, earlier)


def test_an_unfinished_runs_summary_never_says_no_failures():
    records = [ItemRecord("f::c::determinism", "passed", case_id="c", check="determinism")]
    assert "no failures" in summary_lines(records)
    lines = summary_lines(records, unfinished="interrupted")
    assert not any("no failures" in line for line in lines)
    assert "the run did not finish (interrupted): not a pass, whatever the items reported say" in lines


def test_report_html_of_a_killed_run_says_so_and_writes_no_report(tmp_path):
    path = tmp_path / "r.json"
    append_live(path, "run1", "gw0", ItemRecord("f::c::determinism", "passed", case_id="c", check="determinism"))
    page = tmp_path / "page.html"
    proc = harness("report-html", str(path), "-o", str(page))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "The run did not finish" in page.read_text() and "gw0 never wrote a final part" in page.read_text()
    assert not path.exists() and (parts_dir(path) / "run1.gw0.jsonl").exists()
    assert harness("report-html", str(path), "-o", str(path)).returncode == cli.EXIT_UNUSABLE  # nor over itself
    assert not path.exists()


# ---------------------------------------------------------------- 4. runs sharing one report path


def test_runs_sharing_a_report_path_keep_their_own_parts(tmp_path):
    from harness.report import read_parts

    path = tmp_path / "r.json"
    append_live(path, "runA", "gw0", _passed("f::a"))
    write_part(path, "runA", "gw0", Report([_passed("f::a")], meta={"worker": "gw0", "provider": "A"}))
    append_live(path, "runB", "gw0", _passed("f::b"))
    merged = merge_parts(path, "runA")
    assert [r.nodeid for r in merged.items] == ["f::a"] and merged.meta["provider"] == "A"
    assert [p.name for p in parts_dir(path).iterdir()] == ["runB.gw0.jsonl"]
    other, _ = read_parts(path, "runB")
    assert [r.nodeid for r in other.items] == ["f::b"]


@needs_cpu_interpreter
def test_a_pytest_run_leaves_another_runs_parts_alone(pytester):
    """A second run on the same ``--ssd-report`` (one still going) keeps its live part: this run neither clears it
    at its start nor merges it into its own report."""
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    report = pytester.path / "r.json"
    append_live(report, "12345-abcdef01", "gw0", _passed("test_theirs.py::test_theirs"))
    result = pytester.runpytest_inprocess("-p", "ssd_pytest.plugin", "--device", "cpu", "-p", "no:cacheprovider",
                                          "--ssd-report", str(report))
    result.assert_outcomes(passed=1)
    assert [r.nodeid for r in Report.read(report).items] == ["test_mine.py::test_mine"]
    assert (parts_dir(report) / "12345-abcdef01.gw0.jsonl").exists()


# ---------------------------------------------------------------- 6. I/O errors


class _ClosedPipe:
    """A stdout whose reader has gone: every write fails as a closed pipe does."""

    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


@needs_cpu_interpreter
def test_a_closed_stdout_runs_every_item_writes_the_report_and_exits_2(tmp_path, tiny, monkeypatch, capsys):
    report = tmp_path / "r.json"
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    code = cli.main(["run", str(tiny), "--device", "cpu", "--provider", "reference:provider", "--isolation", "none",
                     "--check", "determinism", "--json", str(report)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_UNUSABLE and "Traceback" not in err, err
    assert "stdout failed (Broken pipe); the run went on: 3 of 3 items reported" in err
    data = Report.read(report)
    assert data.counts() == {"passed": 3} and data.meta["exit_status"] == cli.EXIT_UNUSABLE


@needs_cpu_interpreter
def test_a_full_disk_under_the_live_report_stops_the_run_with_its_report(tmp_path, tiny, monkeypatch):
    """The live part's write fails (ENOSPC) at the second item: the run stops there with exit 2, and the report
    of the items that ran is written where that still works."""
    from harness import report as report_module

    calls = []
    real = report_module.append_live

    def fills_up(*args):
        calls.append(args)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(*args)

    monkeypatch.setattr(report_module, "append_live", fills_up)
    report = tmp_path / "r.json"
    proc = _run(tiny, "--json", str(report))
    assert proc.returncode == cli.EXIT_UNUSABLE, proc.stdout + proc.stderr
    assert "I/O error (No space left on device) after 2 of 3 items" in proc.stderr
    data = Report.read(report)
    assert len(data.items) == 2 and "stopped: I/O error" in data.unfinished  # the second ran; its line did not fit


@needs_cpu_interpreter
def test_a_full_disk_under_a_pytest_live_part_stops_the_run_without_a_traceback(pytester):
    """In a process of its own: the full disk is a stand-in patched in by the run's conftest, which must not reach
    the report of the run this test belongs to."""
    pytester.makeconftest("import errno\n"
                          "from ssd_pytest import reporting\n"
                          "def full(*args):\n"
                          "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
                          "reporting.append_live = full\n")
    pytester.makepyfile(test_two="def test_one():\n    pass\ndef test_two():\n    pass\n")
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess("-p", "ssd_pytest.plugin", "--device", "cpu", "-p", "no:cacheprovider",
                                           "--ssd-report", str(report))
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR and "INTERNALERROR" not in text, text
    assert "cannot write this run's live part (No space left on device)" in text
    data = Report.read(report)
    assert [r.nodeid for r in data.items] == ["test_two.py::test_one"] and data.unfinished, data.meta


# ---------------------------------------------------------------- 14. the CLI's other writes


def test_generate_into_an_unwritable_place_exits_2_with_the_reason(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = harness("generate", "--out", str(blocker / "corpus"))
    assert proc.returncode == cli.EXIT_UNUSABLE and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: --out {blocker / 'corpus'}: cannot write the corpus there (")


def test_times_of_a_killed_run_that_passed_so_far_exits_130_and_writes_nothing(tmp_path):
    """What a whole run killed mid-way leaves (live parts only, no failure yet) is not a pass: ``times`` exits as an
    interrupted run does, and reads the parts without writing the report or removing them."""
    path = tmp_path / "r.json"
    append_live(path, "run1", "main", ItemRecord("f::c::determinism", "passed", case_id="c", check="determinism"))
    assert cli.main(["times", str(path)]) == cli.EXIT_INTERRUPTED
    assert not path.exists() and (parts_dir(path) / "run1.main.jsonl").exists()


@needs_cpu_interpreter
def test_a_mismatch_carries_its_first_line_as_pytests_crash_message(pytester):
    """``-rf``: pytest 8 reads an item's line from ``longrepr.reprcrash.message`` alone (a plain-text report gets
    ``FAILED <id>``); a mismatch carries its first line there, as an exception does, and its full text unchanged."""
    from harness.checks import load_provider

    load_provider("reference:provider")
    case = pytester.makefile(".yaml", tiny=bp.TINY_CASES)
    check, case_id = bp.CAUGHT_BY["wrong_slot"]
    reprec = pytester.inline_run("-p", "ssd_pytest.plugin", "--device", "cpu", "-p", "no:cacheprovider",
                                 "--isolation", "none", "--provider", "tests.broken_providers:on_reference.wrong_slot",
                                 f"{case.name}::{case_id}::{check}")
    (failed,) = reprec.getreports("pytest_runtest_logreport")[1:2]
    assert failed.failed, failed
    message = failed.longrepr.reprcrash.message
    assert message.startswith("cache storage outside written slots [2] (storage elements): "), message
    text = str(failed.longrepr)
    assert text.startswith(message + "\n") and "repro: python -m harness repro" in text, text
