"""Faults never pass: a provider that exits, crashes, hangs or poisons its device is an ERROR of the item it was
running, with the cause in one line and the repro line; every other case still runs and passes; the exit status is
non-zero and the JSON report lists every item (``harness.isolation`` behind ``python -m harness run``).

The faults end or freeze the process that runs the provider, the supervised child (``tests/faulty_providers.py``:
each faults on ``tiny-batch`` alone, the middle case of ``TINY_CASES``, so that a case runs after it). The command's
front end runs through ``cli.main`` in this process (``run_faulty``), its children forked by this process's fork
server: a front end of its own would import torch again, seconds on a busy GPU host. What needs the command as a
process (its first child forked at its start, its end on Ctrl-C or SIGTERM) runs it as one. The supervisor's API
(recompile guard in the child, per-case contexts, settings) is tested in this process.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import cli
from harness.checks import CheckResult, Status
from harness.report import Report, parts_dir
from tests import broken_providers as bp
from tests import faulty_providers as fp
from tests.support import harness

pytestmark = pytest.mark.usefixtures("children_with_one_hardware_queue")  # tests/conftest.py says why

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]

CASES = ("tiny-direct", "tiny-batch", "tiny-returned")
CLI_SECONDS = 300  # a run's wall-time bound here: each run starts torch twice (front end and child) on a busy host
# The item time limit the hang tests wait out: short, but far above the tiny cases' passing items, which must not
# reach it. The faulty providers wrap ``reference:provider`` (PyTorch ops, nothing to compile), so a passing item
# takes a fraction of a second on either device; the child's start-up, its device context included, does not count
# towards the limit (``Supervisor._exchange``). tests/test_hostile_isolation.py runs the same cases under 3 s too.
HANG_LIMIT = 3


@pytest.fixture
def tiny(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(bp.TINY_CASES)
    return path


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=_env(**env), capture_output=True,
                          text=True, timeout=CLI_SECONDS)


def faulty_run_args(tiny: Path, device: str, provider: str) -> list[str]:
    return ["run", str(tiny), "--device", device, "--provider", f"tests.faulty_providers:{provider}", "--check",
            "determinism", "--json", str(tiny.parent / "report.json")]


def run_faulty(tiny: Path, device: str, provider: str) -> tuple[subprocess.CompletedProcess, Report]:
    """``python -m harness run`` on ``tiny`` with a faulty provider, through ``cli.main`` in this process."""
    return _with_report(tiny, harness(*faulty_run_args(tiny, device, provider)))


def _with_report(tiny: Path, proc: subprocess.CompletedProcess) -> tuple[subprocess.CompletedProcess, Report]:
    report = tiny.parent / "report.json"
    assert report.is_file(), f"no report\n{proc.stdout}\n{proc.stderr}"
    return proc, Report.read(report)


def assert_only_items_of(report: Report, proc, tiny: Path, faulting: str, cause: str, spec: str) -> None:
    """Every item reported once; the faulting case's item is an ERROR with ``cause`` and its repro line; the others
    passed; exit status 1; the report's counts and exit status agree."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    by_case = {r.case_id: r for r in report.items}
    assert sorted(r.nodeid for r in report.items) == sorted(f"{tiny}::{c}::determinism" for c in CASES), out
    bad = by_case[faulting]
    assert bad.outcome == "error" and cause in bad.summary, (bad, out)
    assert "\n" not in bad.summary
    repro = f"python -m harness repro {tiny} --check determinism --case {faulting} --provider {spec}"
    assert bad.repro.startswith(repro) and f"repro: {repro}" in proc.stdout, out
    assert cause in proc.stdout
    assert {c: r.outcome for c, r in by_case.items() if c != faulting} == {c: "passed" for c in CASES if c != faulting}
    meta = report.meta
    assert (meta["collected"], meta["reported"], meta["exit_status"], meta["interrupted"]) == (3, 3, 1, False)
    assert not parts_dir(tiny.parent / "report.json").exists()  # the live part is folded into the report


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def assert_gone(pids: list[int]) -> None:
    assert pids, "the provider never noted its process"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# ---------------------------------------------------------------- faults through the CLI


@pytest.mark.parametrize(("provider", "cause", "restarts"), [
    ("exits_zero", "SystemExit: 0", 0),  # caught in the child: its process goes on
    ("exits_hard", "the process running the provider exited with status 3 during the call", 1),
    ("segfaults", "the process running the provider died: SIGSEGV (signal 11)", 1),
    ("raises_keyboard_interrupt", "KeyboardInterrupt", 0),
])
def test_a_provider_that_exits_or_crashes_fails_its_item_and_the_rest_run(tiny, provider, cause, restarts, device):
    spec = f"tests.faulty_providers:{provider}"
    proc, report = run_faulty(tiny, device, provider)
    assert_only_items_of(report, proc, tiny, fp.FAULTING_CASE, cause, spec)
    assert [r["item"] for r in report.meta["restarts"]] == [f"{fp.FAULTING_CASE}::determinism"] * restarts
    assert report.meta["processes"] == 1 + restarts
    # In this process every child comes from its fork server (the command's own start: the next test).
    assert [s["how"] for s in report.meta["starts"]] == ["fork server"] * (1 + restarts), report.meta["starts"]
    if provider == "segfaults":  # the dying child's Python stack is in the report
        (bad,) = [r for r in report.items if r.outcome == "error"]
        assert "faulty_providers.py" in bad.message and "in _segfault" in bad.message, bad.message
        assert "provider process restarts: 1" in proc.stdout


def test_the_command_forks_its_first_child_at_its_start_and_its_replacement_from_the_fork_server(tiny, device):
    """``python -m harness run`` as a process: its first child was forked right after torch's import
    (harness/__main__.py), and the one replacing it after a crash by the fork server."""
    proc, report = _with_report(tiny, run_cli(*faulty_run_args(tiny, device, "exits_hard")))
    assert_only_items_of(report, proc, tiny, fp.FAULTING_CASE, "exited with status 3 during the call",
                         "tests.faulty_providers:exits_hard")
    assert [s["how"] for s in report.meta["starts"]] == ["fork", "fork server"], report.meta["starts"]


def test_a_hung_item_is_stopped_at_the_time_limit(tiny, device, monkeypatch):
    pids = tiny.parent / "pids"
    limit = HANG_LIMIT
    monkeypatch.setenv("SSD_HARNESS_ITEM_TIMEOUT", str(limit))
    monkeypatch.setenv(fp.PID_FILE_ENV, str(pids))
    proc, report = run_faulty(tiny, device, "hangs")
    cause = f"timed out after {limit} s (limit from SSD_HARNESS_ITEM_TIMEOUT)"
    assert_only_items_of(report, proc, tiny, fp.FAULTING_CASE, cause, "tests.faulty_providers:hangs")
    (hung,) = [r for r in report.items if r.outcome == "error"]
    assert limit <= hung.duration < 60 and "where it was when stopped" in hung.message and "in _hang" in hung.message
    assert report.meta["item_timeout"] == limit and len(report.meta["restarts"]) == 1
    assert_gone(_pids(pids))


def test_a_sticky_device_error_fails_only_the_case_that_caused_it(tiny, device):
    """The provider poisons its process on tiny-batch (every later call there fails, as after a real illegal memory
    access): the child reports the error, exits, and tiny-returned runs in a fresh one."""
    proc, report = run_faulty(tiny, device, "sticky_device_error")
    assert_only_items_of(report, proc, tiny, fp.FAULTING_CASE, fp.STICKY_MESSAGE,
                         "tests.faulty_providers:sticky_device_error")
    (restart,) = report.meta["restarts"]
    assert restart["item"] == f"{fp.FAULTING_CASE}::determinism" and "sticky device error" in restart["cause"]
    assert "provider process replaced: sticky device error" in proc.stdout


def test_a_crash_that_does_not_repeat_is_reported_not_rerun_as_passed(tiny, device, monkeypatch):
    """The first call of the run kills its process; the item that made it is an ERROR, reported once, and the later
    items (each call now works) pass."""
    marker = tiny.parent / "crashed-once"
    monkeypatch.setenv(fp.CRASH_ONCE_MARKER_ENV, str(marker))
    proc, report = run_faulty(tiny, device, "crashes_once")
    assert marker.exists()
    assert_only_items_of(report, proc, tiny, "tiny-direct", "died: SIGSEGV (signal 11)",
                         "tests.faulty_providers:crashes_once")


def test_repro_of_a_crashing_item_shows_the_crash(tiny, device):
    proc = harness("repro", str(tiny), "--case", fp.FAULTING_CASE, "--check", "determinism", "--device", device,
                   "--provider", "tests.faulty_providers:segfaults")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"ERROR: {fp.FAULTING_CASE}::determinism" in proc.stdout
    assert "the process running the provider died: SIGSEGV (signal 11)" in proc.stdout
    assert "Fatal Python error: Segmentation fault" in proc.stdout and "in _segfault" in proc.stdout


@pytest.mark.parametrize("deadline", [None, 20.0])
def test_ctrl_c_that_lands_on_another_thread_still_stops_a_wait_for_the_child(deadline):
    """The kernel may deliver a process's SIGINT to any of its threads; the main thread blocked in a wait for the
    child is then not woken, and Python raises KeyboardInterrupt only when it runs again. The supervisor's waits
    come back at least every ``WAIT_SLICE_SECONDS``, so Ctrl-C stops them promptly (here: 20 s or no limit).
    Python's own SIGINT handler is installed for the test (a test runner's worker may have its own); should the
    wait not come back, the helper ends it with a message after 5 s, so the test fails instead of hanging."""
    import threading

    from harness.isolation.channel import WAIT_SLICE_SECONDS, Channel

    read_fd, write_fd = os.pipe()
    channel = Channel(read_fd, write_fd)  # nothing is written unless the wait misses the signal
    done = threading.Event()

    def interrupt_from_another_thread():
        # A thread inherits its creator's signal mask; a runner's thread may block SIGINT, this one must take it.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        if not done.wait(5.0):
            channel.send("the wait went on after the signal")

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    helper = threading.Thread(target=interrupt_from_another_thread)
    start = time.monotonic()
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            channel.recv(None if deadline is None else time.monotonic() + deadline)
        assert time.monotonic() - start < 0.3 + WAIT_SLICE_SECONDS + 2.0
    finally:
        done.set()
        helper.join()
        signal.signal(signal.SIGINT, previous)
        channel.close()


def _sigint_at_default() -> None:
    """The front end as a terminal starts it: a test run launched as a background job of a non-interactive shell
    ignores SIGINT, which its children inherit across exec (and Python keeps an inherited SIG_IGN), so the CLI
    would rightly ignore the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_run_reports_what_finished_and_says_so(tiny, how, device):
    """Ctrl-C in a terminal (SIGINT to the whole process group) or SIGTERM to the front end while tiny-batch hangs:
    the run stops, the report holds the finished item and says interrupted, the exit status is non-zero, and the
    hung child is gone."""
    report, pids = tiny.parent / "report.json", tiny.parent / "pids"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(tiny), "--device", device, "--provider",
         "tests.faulty_providers:hangs", "--check", "determinism", "--json", str(report)],
        cwd=ROOT, env=_env(SSD_TEST_PID_FILE=str(pids)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=_sigint_at_default)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "[1/3 cases" in line:  # tiny-direct, the first case, has ended
                break
        end = time.monotonic() + 120
        while not _pids(pids) and time.monotonic() < end:  # the second item is in the provider's hang
            time.sleep(0.2)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        out = "".join(lines) + proc.stdout.read()
        code = proc.wait(CLI_SECONDS)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == cli.EXIT_INTERRUPTED, out
    data = Report.read(report)
    assert [(r.case_id, r.outcome) for r in data.items] == [("tiny-direct", "passed")], out
    meta = data.meta
    assert meta["interrupted"] is True and meta["exit_status"] == code
    assert (meta["collected"], meta["reported"]) == (3, 1)
    assert meta["in_flight"] == f"{tiny}::{fp.FAULTING_CASE}::determinism"
    assert "INTERRUPTED: 1 of 3 collected items reported" in out
    assert "the run did not finish (interrupted)" in out and "no failures" not in out, out  # not a pass
    assert_gone(_pids(pids))


# ---------------------------------------------------------------- reports and options, in this process


def test_an_unwritable_report_path_is_refused_before_any_item(tmp_path, tiny, capsys, monkeypatch, device):
    monkeypatch.setenv("SSD_HARNESS_ISOLATION", "none")  # in this process: the path is refused before any child
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = cli.main(["run", str(tiny), "--device", device, "--provider", "reference:provider", "--check",
                     "determinism", "--json", str(blocker / "report.json")])
    out = capsys.readouterr()
    assert code == cli.EXIT_UNUSABLE, out.out + out.err
    assert f"--json {blocker / 'report.json'}: cannot write the report there" in out.err
    assert "[1/" not in out.out and "PASSED" not in out.out


def test_the_report_is_appended_live_while_the_run_goes_on(tiny, monkeypatch, device):
    """Each record is in ``<report>.parts/<run>.cli.jsonl`` as soon as its item ends (what a killed run leaves); the
    provider here reads that file during the second case's call."""
    from harness.report import read_live

    report = tiny.parent / "report.json"
    seen: list[list[str]] = []

    class Peeks:
        name = "peeks"

        def __init__(self):
            from harness.checks import load_provider

            self.inner = load_provider("reference:provider")
            self.supported_paths = self.inner.supported_paths

        def ssd_prefill(self, *args, **kwargs):
            (live,) = parts_dir(report).glob("*.cli.jsonl")  # <run>.cli.jsonl: this run's live part
            seen.append([r.case_id for r in read_live(live).items])
            return self.inner.ssd_prefill(*args, **kwargs)

    monkeypatch.setattr(fp, "peeks", Peeks(), raising=False)
    code = cli.main(["run", str(tiny), "--device", device, "--provider", "tests.faulty_providers:peeks",
                     "--isolation", "none", "--check", "reference_bound", "--json", str(report)])
    assert code == cli.EXIT_OK
    assert seen[0] == [] and ["tiny-direct"] in seen and ["tiny-direct", "tiny-batch"] in seen
    assert Report.read(report).meta["isolation"] == "none"


@pytest.mark.parametrize("select", [("--isolation", "none"), ("SSD_HARNESS_ISOLATION", "none")])
def test_in_process_mode_still_makes_a_provider_exit_an_error(tiny, capsys, monkeypatch, select, device):
    """--isolation none (or its environment variable) runs items in this process, for pdb: a provider's SystemExit
    is its item's ERROR there too, and the run goes on."""
    name, value = select
    args = ["run", str(tiny), "--device", device, "--provider", "tests.faulty_providers:exits_zero", "--check",
            "determinism", "--json", str(tiny.parent / "report.json")]
    if name.startswith("--"):
        args += [name, value]
    else:
        monkeypatch.setenv(name, value)
    code = cli.main(args)
    out = capsys.readouterr().out
    assert code == cli.EXIT_FAILED, out
    report = Report.read(tiny.parent / "report.json")
    assert {r.case_id: r.outcome for r in report.items} == {"tiny-direct": "passed", "tiny-batch": "error",
                                                             "tiny-returned": "passed"}
    assert report.meta["isolation"] == "none" and "isolation=none, item time limit: none" in out


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--item-timeout", "-1"], {}, "--item-timeout: expected seconds (a number >= 0; 0 = no limit), found '-1'"),
    (["--item-timeout", "soon"], {}, "--item-timeout: expected seconds"),
    ([], {"SSD_HARNESS_ITEM_TIMEOUT": "nan"}, "SSD_HARNESS_ITEM_TIMEOUT: expected seconds"),
    ([], {"SSD_HARNESS_ISOLATION": "thread"}, "SSD_HARNESS_ISOLATION: expected one of process, none, found 'thread'"),
    (["--isolation", "none", "--item-timeout", "5"], {}, "--item-timeout: with --isolation none"),
])
def test_bad_isolation_settings_exit_2_naming_the_setting(tiny, capsys, monkeypatch, args, env, message, device):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = cli.main(["run", str(tiny), "--device", device, "--provider", "reference:provider", *args])
    err = capsys.readouterr().err
    assert code == cli.EXIT_UNUSABLE and message in err, err


def test_time_limit_defaults_and_sources(monkeypatch):
    from harness.isolation import DEFAULT_TIMEOUTS, item_timeout

    assert item_timeout(None, "cpu").seconds == DEFAULT_TIMEOUTS["cpu"] == 120
    assert item_timeout(None, "cuda").seconds == DEFAULT_TIMEOUTS["cuda"]
    monkeypatch.setenv("SSD_HARNESS_ITEM_TIMEOUT", "7")
    assert item_timeout(None, "cpu").seconds == 7 and "SSD_HARNESS_ITEM_TIMEOUT" in item_timeout(None, "cpu").origin
    assert item_timeout("3", "cpu").seconds == 3 and "--item-timeout" in item_timeout("3", "cpu").origin
    assert item_timeout("0", "cpu").describe() == "none"


# ---------------------------------------------------------------- the API for pytest items and the fuzzer


def _tiny_cases(tiny: Path) -> dict:
    from harness.cases.loader import load_case_file

    return {c.id: c for c in load_case_file(tiny)}


def test_the_recompile_guard_runs_inside_the_child(tiny, device):
    """A warmup request warms the case's model request in the child; a guarded check then passes with our kernels
    and fails for a provider that launches a specialization the request does not include (interpreter: by key)."""
    from harness.isolation import Supervisor

    case = _tiny_cases(tiny)["tiny-direct"]
    with Supervisor("kernels:provider", device) as supervisor:
        assert supervisor.warmup(case).startswith("warmup: ")
        good = supervisor.run(case, "determinism", guard=True)
    assert good.status is Status.PASSED, good.message
    with Supervisor("tests.faulty_providers:launches_unwarmed", device) as supervisor:
        # guarded first: on the GPU the witness is a compile, and a child that ran the call unguarded has compiled
        # the unwarmed specialization already
        guarded = supervisor.run(case, "determinism", guard=True)  # warms the request itself
        unguarded = supervisor.run(case, "determinism")
        # re-tuning from scratch is not a serving call: the guard leaves that check's own result standing
        exempt = supervisor.run(case, "autotune_idempotent", guard=True)
    assert exempt.status is Status.PASSED, exempt.message
    assert exempt.stats["recompile_guard"].startswith("not judged: it makes every autotuner tune"), exempt.stats
    assert unguarded.status is Status.PASSED, unguarded.message
    assert guarded.status is Status.FAILED and guarded.summary.startswith("recompile guard: "), guarded.message
    assert "_chunk_scan_kernel" in guarded.message and "repro: python -m harness repro" in guarded.message
    assert supervisor.restarts == [] and supervisor.processes == 1


def test_a_supervisor_sends_its_messages_after_sys_modules_was_restored(tiny, device, monkeypatch):
    """pytester's in-process runs restore sys.modules afterwards: a submodule first imported during one leaves
    sys.modules while its package keeps it as an attribute. A supervisor made after that must send messages whose
    classes pickle finds in sys.modules (a stale protocol module fails every item with a PicklingError)."""
    import harness.isolation as package
    import harness.isolation.protocol
    import harness.isolation.supervisor  # noqa: F401 - in sys.modules and as the package's attributes

    for name in ("protocol", "supervisor"):
        monkeypatch.setattr(package, name, getattr(package, name))  # restored after the test, as is sys.modules
        monkeypatch.delitem(sys.modules, f"harness.isolation.{name}")
    from harness.isolation.supervisor import Supervisor  # as open_runner imports it

    assert package.IsolationError is sys.modules["harness.isolation.supervisor"].IsolationError  # what callers catch
    with Supervisor("kernels:provider", device) as supervisor:
        result = supervisor.run(_tiny_cases(tiny)["tiny-direct"], "gather_exact")
    assert result.status is Status.PASSED, result.message


def test_the_child_gets_this_processs_share_of_torch_threads(tiny, device):
    """A child with torch's default (one thread per core) beside N pytest workers oversubscribes the host N-fold; it
    takes the thread count of the process it stands in for."""
    import torch

    from harness.isolation import Supervisor

    case = _tiny_cases(tiny)[fp.FAULTING_CASE]
    before = torch.get_num_threads()
    torch.set_num_threads(3 if before != 3 else 2)
    try:
        with Supervisor("tests.faulty_providers:reports_threads", device) as supervisor:
            result = supervisor.run(case, "determinism")
        wanted = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert result.status is Status.ERROR, result.message
    assert f"torch threads={wanted} OMP_NUM_THREADS={wanted}" in result.message, result.message


def test_an_unloadable_provider_is_a_provider_error_not_an_item_result(tiny, device):
    from harness.checks import ProviderError
    from harness.isolation import Supervisor

    case = _tiny_cases(tiny)["tiny-direct"]
    with Supervisor("tests.faulty_providers:no_such_provider", device) as supervisor:
        with pytest.raises(ProviderError, match="has no attribute 'no_such_provider'"):
            supervisor.run(case, "determinism")


def test_the_checks_of_one_case_share_its_context_across_requests(tiny, device):
    """The child receives each case anew (pickled); an equal case keeps its CheckContext, so its inputs are built
    once per case, not once per check."""
    from harness.checks import load_provider
    from harness.isolation.worker import Worker

    cases = _tiny_cases(tiny)
    worker = Worker(load_provider("reference:provider"), device, "reference:provider")
    first = worker.context(cases["tiny-direct"])
    assert worker.context(pickle.loads(pickle.dumps(cases["tiny-direct"]))) is first
    assert worker.context(cases["tiny-batch"]) is not first


def test_sticky_errors_are_told_from_ordinary_failures():
    from harness.isolation import sticky

    def result(status: Status, summary: str) -> CheckResult:
        return CheckResult(case_id="c", check="k", status=status, summary=summary, message=summary)

    assert sticky.after_item(result(Status.ERROR, f"RuntimeError: {fp.STICKY_MESSAGE}"), "cpu")
    assert sticky.after_item(result(Status.ERROR, "RuntimeError: CUDA error: device-side assert triggered"), "cpu")
    assert not sticky.after_item(result(Status.ERROR, "ValueError: path='indexed': ineligible"), "cpu")
    assert not sticky.after_item(result(Status.PASSED, fp.STICKY_MESSAGE), "cpu")  # a pass is never sticky


def test_a_child_lost_between_items_is_replaced_without_blaming_an_item(tiny, device):
    """A child that ends while idle (killed from outside) is recorded as a restart 'between items'; the next item
    runs in a fresh child and keeps its own outcome."""
    from harness.isolation import Supervisor

    cases = _tiny_cases(tiny)
    with Supervisor("reference:provider", device) as supervisor:
        assert supervisor.run(cases["tiny-direct"], "determinism").status is Status.PASSED
        os.kill(supervisor._proc.pid, signal.SIGKILL)
        supervisor._proc.wait()
        after = supervisor.run(cases["tiny-returned"], "determinism")
    assert after.status is Status.PASSED, after.message
    assert [(r.item, r.cause) for r in supervisor.restarts] == [
        ("between items", "the process running the provider died: SIGKILL (signal 9)")]
    assert supervisor.processes == 2


# ---------------------------------------------------------------- faults through pytest


def run_pytest_faulty(pytester, tiny: Path, device: str, provider: str, *args: str):
    """An in-process pytest session over ``tiny`` with a faulting provider: the faults happen in the supervised child
    (the default isolation), so this process survives them as the CLI does. Returns (result, report)."""
    report = pytester.path / "report.json"
    result = pytester.runpytest_inprocess(
        "-p", "ssd_pytest.plugin", "--device", device, "-p", "no:cacheprovider", str(tiny), "-k", "determinism",
        "--provider", f"tests.faulty_providers:{provider}", "--ssd-report", str(report), "-rfE", *args)
    return result, Report.read(report)


@pytest.mark.parametrize(("provider", "cause"), [
    ("exits_zero", "SystemExit: 0"),
    ("segfaults", "the process running the provider died: SIGSEGV (signal 11)"),
    ("hangs", "timed out after {limit} s (limit from --item-timeout)"),
    ("sticky_device_error", fp.STICKY_MESSAGE),
])
def test_pytest_reports_a_faulting_item_as_its_failure_and_runs_the_rest(pytester, tiny, device, provider, cause):
    """The pytest front end: the faulting case's item fails with the cause on its first line and the repro, the
    other cases pass, the harness report lists every item, and the exit status is non-zero."""
    limit = HANG_LIMIT
    cause = cause.format(limit=limit)
    result, report = run_pytest_faulty(pytester, tiny, device, provider, "--item-timeout", str(limit))
    outcomes = result.parseoutcomes()
    assert result.ret == 1 and outcomes.get("failed") == 1 and outcomes.get("passed") == 2, result.stdout.str()
    result.stdout.fnmatch_lines([f"FAILED *{fp.FAULTING_CASE}::determinism*"])
    assert cause in result.stdout.str()
    by_case = {r.case_id: r.outcome for r in report.items}
    assert by_case == {"tiny-direct": "passed", fp.FAULTING_CASE: "failed", "tiny-returned": "passed"}, by_case
    (bad,) = [r for r in report.items if r.case_id == fp.FAULTING_CASE]
    assert cause in bad.message and "python -m harness repro" in bad.message, bad.message


def test_pytest_reports_a_crash_that_does_not_repeat_once_and_not_as_passed(pytester, tiny, device, monkeypatch):
    marker = tiny.parent / "crashed-once"
    monkeypatch.setenv(fp.CRASH_ONCE_MARKER_ENV, str(marker))  # the child inherits it
    result, report = run_pytest_faulty(pytester, tiny, device, "crashes_once")
    assert marker.exists()
    assert {r.case_id: r.outcome for r in report.items} == {"tiny-direct": "failed", fp.FAULTING_CASE: "passed",
                                                             "tiny-returned": "passed"}
    result.stdout.fnmatch_lines(["FAILED *tiny-direct::determinism*"])
    assert "died: SIGSEGV (signal 11)" in result.stdout.str()


FORKED_SUPERVISOR = """
import json, os, sys
import torch  # as an xdist worker's start imports it (ssd_pytest.workers.start_worker), before any op

torch.set_num_threads(1)
from harness.isolation import spare

out = {}
assert spare.prefork("test") == ""  # a spare never used: discard ends it
first = spare._spare[2][0]
spare.discard("test")
out["unused_spare_exit"] = first.returncode
out["context_wait_after_discard"] = spare.wait_for_spare_context(0)  # discard closed the signal too
assert spare.prefork("test") == ""
# Nothing the fork needs may import the kernels package, whose import asks torch for a GPU (starting the driver).
heavy = [m for m in sys.modules if m == "kernels" or m.startswith(("kernels.", "harness.checks"))]
assert not heavy, heavy
spare_pid = spare._spare[2][0].pid
from harness.isolation import supervisor
from harness import backend
from harness.cases.loader import load_case_file

device = backend.configure(sys.argv[3])
os.environ["OMP_NUM_THREADS"] = "stale"  # the child's environment is the parent's at Hello, with its thread share
cases = {c.id: c for c in load_case_file(sys.argv[1])}
with supervisor.Supervisor("tests.faulty_providers:" + sys.argv[2], device, spare_owner="test") as sup:
    sup.start()  # Hello: the child configures itself, makes its device context and says so
    out["context_made"] = spare.wait_for_spare_context(120)
    out["context_wait_again"] = spare.wait_for_spare_context(0)  # once per spare
    results = [sup.run(cases[c], "determinism") for c in ("tiny-direct", "tiny-batch", "tiny-returned")]
    out["results"] = [[r.status.value, r.summary, r.message[:300]] for r in results]
    out["describe"] = sup.describe()
try:
    os.kill(spare_pid, 0)
    out["spare_alive_after_close"] = True
except ProcessLookupError:
    out["spare_alive_after_close"] = False
# After the device started (CUDA) no fork is safe: the reason, or "" under the interpreter
out["late_prefork"] = spare.prefork("test")
spare.discard("test")
print(json.dumps(out))
"""


def _forked_supervisor(tiny: Path, provider: str, device: str) -> dict:
    import json

    proc = subprocess.run([sys.executable, "-c", FORKED_SUPERVISOR, str(tiny), provider, device], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=CLI_SECONDS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_child_forked_at_start_runs_items_and_its_crash_is_still_the_items_error(tiny, device):
    """``spare.prefork``: the child forked right after torch's import serves the first start; when it dies,
    the item is the error with the signal, and the replacement comes from the fork server (the parent may have run
    torch ops since, after which its own fork is unsafe)."""
    out = _forked_supervisor(tiny, "segfaults", device)
    statuses = [r[0] for r in out["results"]]
    assert statuses == ["passed", "error", "passed"], out
    assert "SIGSEGV (signal 11)" in out["results"][1][1], out
    starts = out["describe"]["starts"]
    assert [s["how"] for s in starts] == ["fork", "fork server"], starts
    assert "cpu" not in starts[0] and starts[1]["cpu"]["user"] > 0, starts  # the running child's CPU so far
    # A forked child imports nothing again: its configuration is quick next to a spawned one's torch import.
    phases = {"configure", "provider"} | ({"device_context"} if device == "cuda" else set())
    assert set(starts[0]["phases"]) == phases and starts[0]["waited"] >= 0, starts
    assert [r["item"] for r in out["describe"]["restarts"]] == ["tiny-batch::determinism"], out
    assert out["spare_alive_after_close"] is False and out["unused_spare_exit"] == 0, out
    assert (out["context_wait_after_discard"], out["context_made"], out["context_wait_again"]) == (False, True, False)
    late = out["late_prefork"]
    assert late.startswith("the CUDA driver is initialized") if device == "cuda" else late == "", out


def test_a_forked_child_takes_the_environment_and_thread_share_of_hello(tiny, device):
    """The fork happened before the parent configured itself: what it set since (the device's variables, here a
    changed OMP_NUM_THREADS) reaches the child with Hello, and the child takes the parent's torch thread count. So
    does what this test set before it started the parent (its one hardware queue), before the child makes its
    context."""
    out = _forked_supervisor(tiny, "reports_threads", device)
    assert out["describe"]["starts"][0]["how"] == "fork", out
    status, _, message = out["results"][1]
    assert status == "error" and "torch threads=1 OMP_NUM_THREADS=1" in message, out
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in message, out


def test_waiting_for_the_spares_context_is_bounded_and_needs_its_signal(monkeypatch):
    """``spare.wait_for_spare_context``: true only for the spare's signal byte; false at its end of file (a child that
    ended without a context), when the wait runs out, or in another process than the one that forked (a fork of a
    fork must not take its parent's signal); the descriptor is closed in every case."""
    from harness.isolation import protocol, spare

    def pipe_with(data: bytes | None, owner: int | None = None) -> int:
        r, w = os.pipe()
        if data:
            os.write(w, data)
        if data is not None:
            os.close(w)
        else:
            opened.append(w)
        monkeypatch.setattr(spare, "_context_made", (owner or os.getpid(), r))
        return r

    opened: list[int] = []
    for data, expected in ((protocol.CONTEXT_MADE, True), (b"", False), (b"x", False)):
        r = pipe_with(data)
        assert spare.wait_for_spare_context(5) is expected
        with pytest.raises(OSError):
            os.fstat(r)
    began = time.monotonic()
    pipe_with(None)  # the child still making its context
    assert spare.wait_for_spare_context(0.2) is False and 0.15 < time.monotonic() - began < 5
    r = pipe_with(protocol.CONTEXT_MADE, owner=os.getpid() + 1)
    assert spare.wait_for_spare_context(5) is False
    os.close(r)  # the forking process's to close, not this one's
    for fd in opened:
        os.close(fd)


def test_no_fork_where_the_cuda_driver_is_initialized(monkeypatch):
    """A process whose CUDA driver started cannot fork a usable child: ``prefork`` refuses, says why, and the start
    record of the owner's next child carries the reason; other owners' records do not."""
    from harness.isolation import forking, spare, supervisor

    monkeypatch.setattr(forking, "_cuda_driver_state", lambda: 0)
    monkeypatch.setattr(spare, "_refusal", None)
    monkeypatch.setattr(spare, "_spare", None)
    reason = spare.prefork("test")
    assert reason == ("the CUDA driver is initialized in this process (cuDeviceGetCount returned 0), and a forked "
                      "child cannot use it")
    assert spare._spare is None and not spare.waiting()
    monkeypatch.setattr(supervisor, "_fresh", lambda: ((_NeverStarted(), _NoChannel(), None), "fork server"))
    starts = {}
    for owner in ("test", None, spare.CLI):
        sup = supervisor.Supervisor("kernels:provider", "cpu", spare_owner=owner)
        sup.start()
        starts[owner] = sup.describe()["starts"]
    assert starts["test"] == [{"how": f"fork server (no fork at start: {reason})"}]
    # a supervisor of another owner (a test's inner CLI run in a pytest worker) would not have had the spare anyway
    assert starts[None] == starts[spare.CLI] == [{"how": "fork server"}]


class _Waiting:
    """A spare child still waiting for its Hello."""
    pid = -2

    def poll(self):
        return None


def test_a_spare_goes_only_to_its_owners_supervisor(monkeypatch):
    """A process's spare is forked for one owner (the CLI command, a pytest worker's config): a test that runs the
    CLI or an inner pytest session inside a worker must neither take nor discard the worker's spare, or the worker's
    own case items wait for a fresh child. A supervisor of another owner, or of none, starts a fresh one; the owner's
    takes it."""
    from harness.isolation import spare, supervisor

    owner = object()
    launched = (_Waiting(), _NoChannel(), None)
    monkeypatch.setattr(spare, "_spare", (os.getpid(), owner, launched))
    monkeypatch.setattr(supervisor, "_fresh", lambda: ((_NeverStarted(), _NoChannel(), None), "fork server"))
    assert spare.waiting() and spare.waiting(owner) and not spare.waiting(spare.CLI)
    assert spare.take(spare.CLI) is None and spare.take(None) is None
    spare.discard(spare.CLI)
    spare.discard(None)
    for other in (None, spare.CLI, object()):
        sup = supervisor.Supervisor("kernels:provider", "cpu", spare_owner=other)
        sup.start()
        assert sup.describe()["starts"][0]["how"] == "fork server", other
        assert spare.waiting(owner), other
    mine = supervisor.Supervisor("kernels:provider", "cpu", spare_owner=owner)
    mine.start()
    assert mine.describe()["starts"] == [{"how": "fork"}] and not spare.waiting()
    assert isinstance(mine._channel.sent, supervisor.protocol.Hello)


class _NeverStarted:
    pid = -1

    def poll(self):
        return 0


class _NoChannel:
    def send(self, message) -> None:
        self.sent = message


OPENMP_BEFORE_FORK = """
import sys, torch
from harness.isolation import spare

torch.set_num_threads(2)
x = torch.randn(512, 512)
(x * 2).sin().sum()  # a parallel op: torch's OpenMP pool now exists in this process
print(spare.prefork("test", code_ran_before=True))
torch.set_num_threads(1)  # a child that runs one thread never uses the pool
print(repr(spare.prefork("test", code_ran_before=True)))
from harness import backend
from harness.cases.loader import load_case_file
from harness.isolation.supervisor import Supervisor

case = {c.id: c for c in load_case_file(sys.argv[1])}["tiny-direct"]
with Supervisor("kernels:provider", backend.configure(sys.argv[2]), timeout=120, spare_owner="test") as sup:
    result = sup.run(case, "determinism")
    print(result.status.value, sup.describe()["starts"][0]["how"])
"""


def test_after_unknown_code_a_fork_is_made_only_for_a_one_thread_child(tiny, device):
    """libgomp's pool does not survive a fork: a child that runs two OpenMP threads after a parallel op in its parent
    hangs at its first parallel region. Where code ran before (a suite's conftest files), ``prefork`` forks only for
    a child of one thread, which never uses the pool, and that child runs items."""
    proc = subprocess.run([sys.executable, "-c", OPENMP_BEFORE_FORK, str(tiny), device], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=CLI_SECONDS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    refused, forked, ran = proc.stdout.strip().splitlines()[-3:]
    assert refused == ("the child would run 2 OpenMP threads, and code that ran here before may have started "
                       "torch's OpenMP pool, which a forked child cannot use"), proc.stdout
    assert forked == "''" and ran == "passed fork", proc.stdout


def test_a_forked_child_keeps_only_its_own_descriptors_and_reports_its_end_like_popen():
    """``forking.fork_child``: the child closes every descriptor but 0-2 and its own, so a pipe of the parent's
    reaches its end of file when the parent closes its end (another supervisor's child must see the end of its
    requests); ``ForkedProcess`` reports a signal as Popen does (negative) and its wait has a time limit."""
    from harness.isolation import forking

    other_r, other_w = os.pipe()  # the parent's: the child must not hold its write end
    mine_r, mine_w = os.pipe()  # the child's: it blocks reading until the parent closes the write end

    def child() -> int:
        os.read(mine_r, 1)
        return 7

    proc = forking.fork_child(child, keep_fds=(mine_r,))
    try:
        os.close(other_w)
        import select

        # End of file at once: no other holder of the write end (a child that kept it would leave this blocked).
        assert select.select([other_r], [], [], 10)[0] and os.read(other_r, 1) == b""
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.05)
        os.close(mine_w)
        assert proc.wait(30) == 7 and proc.returncode == 7
        proc.kill()  # after its end: nothing to do
    finally:
        for fd in (other_r, mine_r):
            os.close(fd)
        if proc.returncode is None:
            proc.kill()
    hung = forking.fork_child(lambda: time.sleep(60) or 0, keep_fds=())
    hung.kill()
    assert hung.wait(30) == -signal.SIGKILL
