"""The harness's view of a pytest run: one ``ItemRecord`` per item as it is decided (appended live to the report's
parts with ``--ssd-report``), each process's part at its end, the merged report, and the terminal summary."""

from __future__ import annotations

import os
import time

import pytest

from harness import DEFAULT_PROVIDER, compile_claims, timeline
from harness.report import (
    MESSAGE_CHARS,
    ItemRecord,
    Report,
    UnsafeTarget,
    append_live,
    item_count,
    merge_parts,
    new_run_id,
    refuse_unsafe_target,
    summary_lines,
    unfinished_reason,
    write_part,
)
from ssd_pytest import state
from ssd_pytest.items import runner_description
from ssd_pytest.progress import XDIST_CRASH_PHASE, case_and_check
from ssd_pytest.workers import holds_cuda_context, is_xdist_controller, is_xdist_worker, process_name, worker_role

_records_key = pytest.StashKey[list]()
_run_key = pytest.StashKey[str]()
_session_key = pytest.StashKey[pytest.Session]()
# Set by the controller (or a run without xdist) before its workers start, read by each worker: the name of this run's
# report parts (``harness.report.new_run_id``), so that runs sharing one --ssd-report never touch each other's.
RUN_ID_ENV = "SSD_HARNESS_REPORT_RUN"


def report_path(config: pytest.Config) -> str | None:
    return config.getoption("ssd_report")


def configure(config: pytest.Config) -> None:
    """Start recording this process's items, under this run's name for its report parts: a new one in the process
    that merges the report (which refuses a path it must not replace), the controller's in an xdist worker."""
    config.stash[_records_key] = []
    recorder = Recorder(config)
    config.pluginmanager.register(recorder, "ssd-harness-recorder")
    path = report_path(config)
    if is_xdist_worker(config):
        config.stash[_run_key] = os.environ.get(RUN_ID_ENV) or new_run_id()
        return
    config.stash[_run_key] = os.environ[RUN_ID_ENV] = new_run_id()  # a value from an enclosing run is not ours
    if path:
        try:
            refuse_unsafe_target(path)
        except UnsafeTarget as exc:
            raise pytest.UsageError(f"--ssd-report {exc}") from None


def _props(report: pytest.TestReport) -> dict:
    return dict(report.user_properties or ())


def _outcome(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return "unsupported" if "unsupported:" in reason else "skipped"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    return "passed"


def _reason(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail)
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return ""


class Recorder:
    """Keeps one ``ItemRecord`` per finished phase that decides an item's outcome (bound to its config)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.setups: dict[str, tuple[float, float]] = {}  # nodeid -> (setup seconds, setup start)
        self.crashes: list[ItemRecord] = []  # xdist controller: the items whose worker died while running them
        self.dead_workers: dict[str, str] = {}  # xdist controller: worker id -> why it went down
        self.collected: int | None = None
        self.write_error = ""  # the first error writing this process's live part (a full disk)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The call phase, or setup when it did not pass, or a failing teardown. An item's duration includes its
        setup (fixtures: a module fixture's cost lands on the first item that needs it), so time reports show it."""
        config = self.config
        if report.when == XDIST_CRASH_PHASE:
            self._crashed(report)
            return
        if report.when == "setup" and report.passed:
            self.setups[report.nodeid] = (float(report.duration), float(report.start))
            return
        if report.when == "call" or (report.when == "setup" and not report.passed) or (
            report.when == "teardown" and report.failed
        ):
            props = _props(report)
            setup_seconds, start = self.setups.pop(report.nodeid, (0.0, float(report.start)))
            summary = props.get("mismatch", "")
            if report.failed and not summary:
                summary = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""
            config.stash[_records_key].append(
                ItemRecord(
                    nodeid=report.nodeid,
                    outcome=_outcome(report),
                    duration=float(report.duration) + setup_seconds,
                    case_id=str(props.get("case_id", "")),
                    check=str(props.get("check", "")),
                    family=str(props.get("family", "")),
                    source=report.location[0] if report.location else "",
                    seed=props.get("seed"),
                    max_ulp=props.get("max_ulp"),
                    bound_use=props.get("bound_use"),
                    reason=_reason(report),
                    summary=summary,
                    repro=str(props.get("repro", "")),
                    worker=os.environ.get("PYTEST_XDIST_WORKER", ""),
                    message=str(report.longrepr)[-MESSAGE_CHARS:] if report.failed and report.longrepr else "",
                    start=start,
                )
            )
            self._keep(config.stash[_records_key][-1])

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A file (or other collector) that could not be collected is an error of the run, recorded under its node
        id: the summary and the report must not read "no failures" when a case file never ran."""
        if not report.failed:
            return
        text = str(report.longrepr).strip() if report.longrepr else ""
        self.config.stash[_records_key].append(
            ItemRecord(nodeid=report.nodeid, outcome="error", source=report.nodeid.split("::", 1)[0],
                       summary=text.splitlines()[-1] if text else "", message=text[-MESSAGE_CHARS:],
                       worker=os.environ.get("PYTEST_XDIST_WORKER", ""))
        )
        self._keep(self.config.stash[_records_key][-1])

    def _crashed(self, report: pytest.TestReport) -> None:
        """xdist's report of an item whose worker died: an error, kept apart so that no later record replaces it
        (xdist hands the unfinished unit, the crashed item included, to the replacement worker, where it may pass)."""
        text = str(report.longrepr).strip() if report.longrepr else "the worker running it died"
        source, case_id, check = case_and_check(report.nodeid, self.config) or (report.nodeid.split("::")[0], "", "")
        record = ItemRecord(nodeid=report.nodeid, outcome="error", source=source, case_id=case_id, check=check,
                            summary=text.splitlines()[0], message=text[-MESSAGE_CHARS:],
                            worker=node.gateway.id if (node := getattr(report, "node", None)) else "",
                            start=time.time())
        self.crashes.append(record)
        self.config.stash[_records_key].append(record)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.config.stash[_session_key] = session

    @pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
    def pytest_testnodedown(self, node, error) -> None:
        if error is not None:
            self.dead_workers[node.gateway.id] = str(error)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self.collected = len(ids)  # every worker collects the same items

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not is_xdist_controller(self.config):
            self.collected = len(session.items)

    def _keep(self, record: ItemRecord) -> None:
        """With --ssd-report, every process that collects or runs items appends each record to its live part. A
        write that fails (a full disk, a removed folder) stops the run (``session.shouldstop``): the items it ran
        are then reported at its end where the report can still be written, and pytest's status says it stopped."""
        path = report_path(self.config)
        if not path or is_xdist_controller(self.config) or self.write_error:
            return
        try:
            append_live(path, self.config.stash[_run_key], process_name(), record)
        except OSError as exc:
            self.write_error = f"--ssd-report {path}: cannot write this run's live part ({exc.strerror or exc})"
            session = self.config.stash.get(_session_key, None)
            if session is not None:
                session.shouldstop = self.write_error


def carry_first_line(report: pytest.TestReport, call: pytest.CallInfo) -> None:
    """A case item's failure is plain text whose first line says what differed. pytest before 9 shows a plain-text
    report as the node id alone in the ``-r`` short summary, where an exception gets ``FAILED <id> - <first line>``.
    So the text is carried as pytest carries an exception's report (from the public ``ExceptionInfo.getrepr``):
    printed as it is, with its first line as the crash message that the short summary, junit's failure message
    and xdist's transfer of the report read. Where that report is not shaped so, the text stays plain."""
    text = report.longrepr
    if not (report.failed and isinstance(text, str) and text.strip() and call.excinfo is not None):
        return
    try:
        carried = call.excinfo.getrepr(style="native", chain=False)
        (entry,) = carried.reprtraceback.reprentries
        entry.lines = [text if text.endswith("\n") else text + "\n"]
        carried.reprcrash.message = text.strip().splitlines()[0]
    except (AttributeError, ValueError):
        return
    report.longrepr = carried


def merged_records(config: pytest.Config) -> list[ItemRecord]:
    """Later records of a nodeid replace earlier ones (a failing teardown after a passing call)."""
    by_id: dict[str, ItemRecord] = {}
    for rec in config.stash[_records_key]:
        prior = by_id.get(rec.nodeid)
        if prior is None or rec.outcome == "error" or prior.outcome == "passed":
            by_id[rec.nodeid] = rec
    return list(by_id.values())


def _recorder(config: pytest.Config) -> Recorder:
    return config.pluginmanager.get_plugin("ssd-harness-recorder")


def run_meta(config: pytest.Config, exitstatus: int) -> dict:
    """What the merged report says about the run as a whole: its parts' name, how many items were collected, pytest's
    exit status, whether it was interrupted, and the xdist workers that died (with why)."""
    recorder = _recorder(config)
    meta = {"run": config.stash[_run_key], "collected": recorder.collected, "exit_status": int(exitstatus),
            "interrupted": int(exitstatus) == int(pytest.ExitCode.INTERRUPTED),
            "crashed_workers": dict(sorted(recorder.dead_workers.items()))}
    if recorder.write_error:
        meta["aborted"] = recorder.write_error
    return meta


def write_report(session: pytest.Session, exitstatus: int) -> None:
    """With --ssd-report: each process writes its part; the process that ran alone, or the xdist controller once
    every worker has, merges this run's parts into the report, with the records of items whose worker died. A report
    that cannot be written is said on the terminal and makes the run's status INTERNAL_ERROR ("could not run"), not
    a traceback."""
    config = session.config
    path = report_path(config)
    if not path:
        return
    phases = config.stash[state.PHASES]
    timeline.mark(phases, "session_end")
    run = config.stash[_run_key]
    meta = {"device": config.stash[state.DEVICE], "provider": config.getoption("provider") or DEFAULT_PROVIDER}
    ledger = config.stash[state.LEDGER]
    mine = {"phases": phases,
            "compiles": {**ledger.to_dict(), "claims": dict(compile_claims.stats)} if ledger is not None else None,
            "isolation": runner_description(config), "cpu": timeline.process_cpu()}
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    try:
        if is_xdist_worker(config) and worker:
            gpu = os.environ.get("CUDA_VISIBLE_DEVICES") if meta["device"] == "cuda" else None
            role = {"role": worker_role(config), "cuda_context": holds_cuda_context(config)}
            write_part(path, run, worker, Report(items=merged_records(config),
                                                 meta={**meta, **mine, "worker": worker, "gpu": gpu, "role": role}))
            return
        if not is_xdist_controller(config):
            write_part(path, run, "main", Report(items=merged_records(config),
                                                 meta={**meta, **mine, "worker": "main"}))
            merge_parts(path, run, meta={**meta, **run_meta(config, exitstatus)})
        else:  # the workers' parts say which device they ran on (the controller only asked the driver)
            merge_parts(path, run, meta={**{k: v for k, v in meta.items() if k != "device"}, "phases": phases,
                                         **run_meta(config, exitstatus)},
                        overrides=_recorder(config).crashes)
    except (OSError, ValueError) as exc:  # a full disk, an unsafe target, a part cut short
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        _recorder(config).write_error = f"--ssd-report {path}: cannot write the report ({reason})"
    if _recorder(config).write_error:
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


def terminal_summary(terminalreporter, config: pytest.Config, exitstatus: int) -> None:
    records = merged_records(config)
    recorder = _recorder(config)
    if recorder.write_error:
        terminalreporter.write_line(f"ssd-harness: error: {recorder.write_error}", red=True)
    if not any(r.check for r in records) and not recorder.dead_workers:  # pytest's own summary says it all
        return
    terminalreporter.section("ssd-harness summary")
    meta = run_meta(config, exitstatus)
    for line in summary_lines(records, unfinished=unfinished_reason(meta, item_count(records))):
        terminalreporter.write_line(line)
    for worker, why in meta["crashed_workers"].items():
        terminalreporter.write_line(f"worker {worker} died: {why}")
    path = report_path(config)
    if path and not is_xdist_worker(config) and not recorder.write_error:
        terminalreporter.write_line(f"json report: {path}")
