"""One progress line per YAML case in a pytest run, as ``python -m harness run`` prints them (``harness.progress``):
when a case's last item ends, its items' outcomes, the cases done, the time elapsed and an estimate of the time left.

Without ``-v`` the case items' own progress letters are left out, so a file of hundreds of items (most of them skips
on the CPU tier) reads as one line per case; other tests keep pytest's letters, and every failure still gets its
report and its ``-r`` summary line. With ``-v`` pytest's line per item stays and no case line is added. Under xdist
the controller prints the lines, from the collection its workers report (``pytest_xdist_node_collection_finished``)
and the reports they forward. The estimate weighs items by ``--durations-from``'s measured seconds, else by the
CPU tier's estimate where the items are known (a run without xdist), else counts them.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import pytest

from harness.progress import CaseProgress
from ssd_pytest.items import is_case_file

XDIST_CRASH_PHASE = "???"  # the ``when`` of the report xdist's controller makes for a worker that died mid-item


class CaseKey(NamedTuple):
    """A case as ``CaseProgress`` reads it: ``id``, what its line shows (the file too where two files share an id)."""

    id: str


def case_and_check(nodeid: str, config: pytest.Config) -> tuple[str, str, str] | None:
    """(file, case id, check) of a case item's node id ``FILE::CASE::CHECK``, or None for any other test."""
    parts = nodeid.split("::")
    if len(parts) != 3 or not is_case_file(config.rootpath / parts[0], config):
        return None
    return parts[0], parts[1], parts[2]


def item_outcome(report: pytest.TestReport, so_far: str | None) -> str:
    """The item's outcome after this phase's report, in ``harness.progress.OUTCOMES``' words."""
    xfail = hasattr(report, "wasxfail")
    if report.when != "call":
        if report.failed:
            return "error"
        if report.skipped:
            return "xfailed" if xfail else "skipped"
        return so_far or "passed"
    if report.failed:
        return "failed"
    if report.skipped:
        return "xfailed" if xfail else "skipped"
    return "xpassed" if xfail else "passed"


class CaseLines:
    """The plugin object that prints the lines (registered by ``register`` on the process that reports)."""

    def __init__(self, config: pytest.Config, terminal):
        self.config, self.terminal = config, terminal
        self.progress: CaseProgress | None = None
        self.keys: dict[str, tuple[CaseKey, str]] = {}  # case item node id -> (its case, its check)
        self.outcomes: dict[str, str] = {}
        self.ended: set[str] = set()  # items whose line is counted: a crashed item re-run by xdist counts once
        self.xdist_controller = False  # set when the plan comes from the workers' collection

    def plan(self, nodeids: list[str], weight: Callable[[str], float]) -> None:
        found = [(nodeid, parsed) for nodeid in nodeids if (parsed := case_and_check(nodeid, self.config))]
        files_of: dict[str, set[str]] = {}
        for _, (file, case, _) in found:
            files_of.setdefault(case, set()).add(file)
        for nodeid, (file, case, check) in found:
            self.keys[nodeid] = (CaseKey(case if len(files_of[case]) == 1 else f"{file}::{case}"), check)
        weights = {(key.id, check): weight(nodeid) for nodeid, (key, check) in self.keys.items()}
        self.progress = CaseProgress(list(self.keys.values()), lambda key, check: weights[(key.id, check)])

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items:  # a run without xdist (an xdist controller collects nothing)
            from ssd_pytest.sharding import item_cost

            costs = {item.nodeid: item_cost(item) for item in session.items}
            self.plan(list(costs), costs.__getitem__)

    @pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        if self.progress is None:  # every worker collects the same items; the first report plans the run
            from ssd_pytest.sharding import measured_costs

            self.xdist_controller = True
            measured = measured_costs(self.config)
            self.plan(list(ids), measured if measured is not None else (lambda nodeid: 1.0))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = self.keys.get(report.nodeid)
        if found is None or self.progress is None or report.nodeid in self.ended:
            return
        self.outcomes[report.nodeid] = item_outcome(report, self.outcomes.get(report.nodeid))
        if report.when in ("teardown", XDIST_CRASH_PHASE):  # a worker that died mid-item sends no teardown
            self.ended.add(report.nodeid)
            key, check = found
            line = self.progress.item_done(key, check, self.outcomes.pop(report.nodeid))
            if line:
                self._write(line)

    def _write(self, line: str) -> None:
        # After whatever pytest left on the current line (a file's name, letters), on a line of its own. Without
        # xdist pytest writes the next case item's file name only when the file changes, and starts a new line
        # itself before its next name or summary, so the line stays open; under xdist the letters of other tests
        # follow, so it is ended here.
        prefix = "\n" if self.config.get_terminal_writer().width_of_current_line else ""
        self.terminal.write(prefix + line + ("\n" if self.xdist_controller else ""), flush=True)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report, config):
        status = yield
        if status and report.nodeid in self.keys:
            category, _, word = status
            return category, "", word
        return status


def register(config: pytest.Config) -> None:
    """Print case lines in the process that reports (not an xdist worker), unless ``-v`` or no terminal output."""
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is None or hasattr(config, "workerinput") or config.option.verbose > 0:
        return
    config.pluginmanager.register(CaseLines(config, terminal), "ssd-case-lines")
