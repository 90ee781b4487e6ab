"""The harness's view of a pytest run: one ``ItemRecord`` per item as it is decided (appended live to the report's
parts with ``--ssd-report``), each process's part at its end, the merged report, and the terminal summary."""

from __future__ import annotations

import os

import pytest

from harness import DEFAULT_PROVIDER, compile_claims, timeline
from harness.report import (
    MESSAGE_CHARS,
    ItemRecord,
    Report,
    append_live,
    clear_parts,
    merge_parts,
    summary_lines,
    write_part,
)
from ssd_pytest import state
from ssd_pytest.items import runner_description
from ssd_pytest.workers import holds_cuda_context, is_xdist_controller, is_xdist_worker, process_name, worker_role

_records_key = pytest.StashKey[list]()


def report_path(config: pytest.Config) -> str | None:
    return config.getoption("ssd_report")


def configure(config: pytest.Config) -> None:
    """Start recording this process's items; the process that merges the report clears an earlier run's parts."""
    config.stash[_records_key] = []
    config.pluginmanager.register(Recorder(config), "ssd-harness-recorder")
    path = report_path(config)
    if path and not is_xdist_worker(config):
        clear_parts(path)


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

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The call phase, or setup when it did not pass, or a failing teardown. An item's duration includes its
        setup (fixtures: a module fixture's cost lands on the first item that needs it), so time reports show it."""
        config = self.config
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

    def _keep(self, record: ItemRecord) -> None:
        """With --ssd-report, every process that collects or runs items appends each record to its live part."""
        path = report_path(self.config)
        if path and not is_xdist_controller(self.config):
            append_live(path, process_name(), record)


def merged_records(config: pytest.Config) -> list[ItemRecord]:
    """Later records of a nodeid replace earlier ones (a failing teardown after a passing call)."""
    by_id: dict[str, ItemRecord] = {}
    for rec in config.stash[_records_key]:
        prior = by_id.get(rec.nodeid)
        if prior is None or rec.outcome == "error" or prior.outcome == "passed":
            by_id[rec.nodeid] = rec
    return list(by_id.values())


def write_report(session: pytest.Session) -> None:
    """With --ssd-report: each process writes its part; the process that ran alone, or the xdist controller once
    every worker has, merges the parts into the report."""
    config = session.config
    path = report_path(config)
    if not path:
        return
    phases = config.stash[state.PHASES]
    timeline.mark(phases, "session_end")
    meta = {"device": config.stash[state.DEVICE], "provider": config.getoption("provider") or DEFAULT_PROVIDER}
    ledger = config.stash[state.LEDGER]
    mine = {"phases": phases,
            "compiles": {**ledger.to_dict(), "claims": dict(compile_claims.stats)} if ledger is not None else None,
            "isolation": runner_description(config), "cpu": timeline.process_cpu()}
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if is_xdist_worker(config) and worker:
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES") if meta["device"] == "cuda" else None
        role = {"role": worker_role(config), "cuda_context": holds_cuda_context(config)}
        write_part(path, worker, Report(items=merged_records(config),
                                        meta={**meta, **mine, "worker": worker, "gpu": gpu, "role": role}))
        return
    if not is_xdist_controller(config):
        write_part(path, "main", Report(items=merged_records(config), meta={**meta, **mine, "worker": "main"}))
        merge_parts(path, meta=meta)
    else:  # the workers' parts say which device they ran on (the controller only asked the driver)
        merge_parts(path, meta={**{k: v for k, v in meta.items() if k != "device"}, "phases": phases})


def terminal_summary(terminalreporter, config: pytest.Config) -> None:
    records = merged_records(config)
    if not any(r.check for r in records):  # no case item ran: pytest's own summary says it all
        return
    terminalreporter.section("ssd-harness summary")
    for line in summary_lines(records):
        terminalreporter.write_line(line)
    path = report_path(config)
    if path and not is_xdist_worker(config):
        terminalreporter.write_line(f"json report: {path}")
