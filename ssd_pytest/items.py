"""YAML case files become collectors and items: ``<file>::<case id>::<check>``. A ``CaseFile`` holds the file's
cases, a ``CaseNode`` one case (its built inputs are shared by its checks), a ``CheckItem`` runs one check.

An item's location is its case's line in the YAML file, so the skip lines of ``-rs`` point there. Items outside the
CPU tier (``harness.checks.tiers``) carry the ``gpu`` marker with the tier's reason (``-m gpu`` selects them,
``-m "not gpu"`` leaves them out); on the CPU tier they are skipped at collection with that reason, and on the GPU
the items of a check that runs there only when named (``harness.checks.tiers.tier_reason``) unless ``--check`` or the
case's ``checks:`` names it (``skip_by_tier``). ``--check NAME`` keeps only the case items of the checks it names
(``keep_named_checks``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

from harness import DEFAULT_PROVIDER
from ssd_pytest import state
from ssd_pytest.workers import TESTS, worker_index, worker_role, xdist_worker_count

_runner_key = pytest.StashKey[object]()  # harness.isolation's Supervisor or InProcess for case items
_case_ids_key = pytest.StashKey[dict]()  # case id -> the file that defines it
_bad_files_key = pytest.StashKey["BadCaseFiles"]()
# A file's answer under this run's command line, by node id's file part: every item's progress line and report
# record asks for its file again (thousands of times a run), and each answer resolves the paths anew.
_case_file_answers_key = pytest.StashKey[dict]()


def configure(config: pytest.Config) -> None:
    config.stash[_case_ids_key] = {}
    config.stash[_bad_files_key] = BadCaseFiles()
    config.pluginmanager.register(config.stash[_bad_files_key], "ssd-harness-bad-case-files")


def _explicit_paths(config: pytest.Config) -> list[Path]:
    out = []
    for arg in config.args:
        path = Path(str(arg).split("::", 1)[0])
        path = path if path.is_absolute() else Path(config.invocation_params.dir) / path
        out.append(path.resolve())
    return out


def is_case_file(file_path: Path, config: pytest.Config) -> bool:
    """The CLI's rule (``harness.cases.files``), with the paths named on this command line and pytest's rootdir,
    whose ``cases/`` folder holds cases as the repository's does."""
    from harness.cases.files import is_case_file as rule

    answers = config.stash.setdefault(_case_file_answers_key, {})
    key = str(file_path)
    if key not in answers:
        answers[key] = rule(file_path, named=_explicit_paths(config), roots=[config.rootpath])
    return answers[key]


class BadCaseFiles:
    """The case files of this run that could not become items (a plugin object per config). pytest stops before
    the first item when collection had errors, unless ``--continue-on-collection-errors``; a bad case file is its
    one collection error and must not keep the other files' items from running. So when every collection error is a
    case file's, this run continues past them (they still make its exit status non-zero); any other collection
    error stops it as usual."""

    def __init__(self):
        self.case_files: set[str] = set()
        self.others: set[str] = set()

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed and report.nodeid not in self.case_files:
            self.others.add(report.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        option = session.config.option
        if not self.case_files or self.others or option.continue_on_collection_errors:
            return (yield)
        option.continue_on_collection_errors = True
        try:
            return (yield)
        finally:
            option.continue_on_collection_errors = False


def _one_line(text: str) -> str:
    return " ".join(text.split())


class CaseFile(pytest.File):
    def collect(self):
        from harness.cases.loader import load_case_file
        from harness.cases.schema import CaseError
        from harness.checks import selected_checks

        try:
            cases = load_case_file(self.path)
        except CaseError as exc:
            self._fail(str(exc))
        except Exception as exc:  # noqa: BLE001 - whatever loading raises is this file's error, not the session's
            self._fail(f"{self.path}: (file): expected a case file, found {type(exc).__name__}: {_one_line(str(exc))}")
        seen = self.config.stash[_case_ids_key]
        nodes = []
        for case in cases:
            other = seen.setdefault(case.id, str(self.path))
            if other != str(self.path):
                self._fail(f"{self.path}: id: expected an id unique across files, found {case.id!r} also in {other}")
            try:
                checks = selected_checks(case)
            except ValueError as exc:
                self._fail(f"{self.path}: {exc}")
            nodes.append(CaseNode.from_parent(self, name=case.id, case=case, checks=checks))
        return nodes

    def _fail(self, message: str) -> NoReturn:
        """This file's one collection error: ``message`` alone (pytest shows a ``CollectError`` without a
        traceback); the other files' items still run (``BadCaseFiles``)."""
        self.config.stash[_bad_files_key].case_files.add(self.nodeid)
        raise self.CollectError(message) from None


class CaseNode(pytest.Collector):
    """One case; its children are the checks it runs. Shares built inputs among them."""

    def __init__(self, *, case, checks, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.checks = checks
        self._context = None

    def collect(self):
        for name, explicit in self.checks:
            yield CheckItem.from_parent(self, name=name, check=name, explicit=explicit)


class CheckFailed(Exception):
    """A check failed; its message is the full report (what differed, the case, the repro line)."""


def runner(config: pytest.Config):
    """This process's runner of case items (``harness.isolation``): by default a supervised child process, so a
    provider that crashes, exits, hangs or poisons its device fails the item it was running and a fresh child runs
    the rest. Opened at the first case item, closed at ``pytest_unconfigure`` (``close_runner``)."""
    if _runner_key not in config.stash:
        from harness.isolation import item_timeout, open_runner

        device = config.stash[state.DEVICE]
        limit = item_timeout(config.getoption("item_timeout"), device)
        index = worker_index(os.environ.get("PYTEST_XDIST_WORKER")) or 0
        config.stash[_runner_key] = open_runner(
            config.getoption("provider") or DEFAULT_PROVIDER, device, isolation=config.getoption("isolation"),
            timeout=limit, warmup_first=index / xdist_worker_count(), spare_owner=config)
    return config.stash[_runner_key]


def start_spare_runner(config: pytest.Config) -> None:
    """Where this worker forked its child at start (``workers.prefork_child``), configure it now, once the device is
    known: the child's imports and device context then overlap this worker's collection. Not in a test worker
    (``workers.role_of``), which starts its child only for a case item that comes to it."""
    from harness.isolation import spare

    if spare.waiting(config) and worker_role(config) != TESTS:
        runner(config).start()


def start_runner_early(session: pytest.Session) -> None:
    """Start this process's runner as soon as its items are known, when any case item will run: a supervised
    child's start-up (importing torch, the device context) then overlaps the wait for the first items and the tests
    before them, instead of stalling the first case item. Not in a test worker (``start_spare_runner``)."""
    if session.config.option.collectonly or worker_role(session.config) == TESTS:
        return
    if any(isinstance(item, CheckItem) and item.get_closest_marker("skip") is None for item in session.items):
        runner(session.config).start()


def close_runner(config: pytest.Config) -> None:
    found = config.stash.get(_runner_key, None)
    if found is not None:
        found.close()
    from harness.isolation import spare

    spare.discard(config)


def runner_description(config: pytest.Config) -> dict | None:
    """How this process ran its case items (``harness.isolation``'s ``describe``), if it ran any."""
    found = config.stash.get(_runner_key, None)
    return found.describe() if found is not None else None


class CheckItem(pytest.Item):
    def __init__(self, *, check: str, explicit: bool, **kwargs):
        super().__init__(**kwargs)
        self.check = check
        self.explicit = explicit
        case = self.parent.case
        self.add_marker("ssd_case")
        from harness.checks.tiers import cpu_tier_reason

        gpu_only = cpu_tier_reason(case, check)  # the item runs on the GPU tier only: marked gpu with the reason
        if gpu_only:
            self.add_marker(pytest.mark.gpu(reason=gpu_only))
        self.user_properties += [("case_id", case.id), ("check", check), ("seed", case.seed),
                                 ("family", case.family)]

    @property
    def case(self):
        return self.parent.case

    def setup(self) -> None:
        super().setup()
        if self.config.getoption("recompile_guard"):
            # The warmup of this case's model request, in the process that runs the check and outside the guarded
            # call: its time shows as this item's setup (once per request and process; a replaced child warms
            # again inside its next guarded item).
            from harness.checks.providers import ProviderError
            from harness.isolation import IsolationError

            try:
                summary = runner(self.config).warmup(self.case)
            except (ProviderError, IsolationError) as exc:
                raise CheckFailed(str(exc)) from None
            if summary:
                print(f"\n[{os.environ.get('PYTEST_XDIST_WORKER', 'main')}] {self.case.id}: {summary}")

    def runtest(self) -> None:
        from harness.checks import Status
        from harness.checks.providers import ProviderError
        from harness.isolation import IsolationError

        config = self.config
        requested = config.getoption("device")
        try:
            result = runner(config).run(self.case, self.check, repro_device=None if requested == "auto" else requested,
                                        guard=config.getoption("recompile_guard"))
        except ProviderError as exc:
            provider = config.getoption("provider") or DEFAULT_PROVIDER
            raise CheckFailed(f"--provider {provider} is not usable: {exc}") from None
        except IsolationError as exc:
            raise CheckFailed(f"the process running the provider could not start: {exc}") from None
        if result.max_ulp is not None:
            self.user_properties.append(("max_ulp", result.max_ulp))
        if result.bound_use is not None:
            self.user_properties.append(("bound_use", result.bound_use))
        if result.summary:
            self.user_properties.append(("mismatch", result.summary))
        self.user_properties.append(("repro", result.repro))
        if result.status in (Status.SKIPPED, Status.UNSUPPORTED):
            pytest.skip(result.reason)
        if result.status is Status.XFAILED:
            pytest.xfail(result.reason)
        if result.status.is_failure:
            raise CheckFailed(result.message)

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance(CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, self.case.line, f"{self.case.id}::{self.check}"


GPU_MARKER = ("gpu(reason): needs the GPU: real compiles on a CUDA device, or (case items) an item outside the CPU "
              "interpreter tier; skipped under the interpreter with the reason")


def check_option(config: pytest.Config) -> list[str]:
    """The checks ``--check`` names (none: every check the cases select); an unknown name is a usage error."""
    named = config.getoption("check") or []
    if named:
        from harness.checks import check_names

        unknown = [n for n in named if n not in check_names()]
        if unknown:
            raise pytest.UsageError(f"--check: unknown {unknown}; known: {', '.join(sorted(check_names()))}")
    return named


def keep_named_checks(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--check``, deselect the case items of every other check (as ``python -m harness run --check`` runs
    only those); items that are not case items stay."""
    named = check_option(config)
    if not named:
        return
    kept, dropped = [], []
    for item in items:
        (dropped if isinstance(item, CheckItem) and item.check not in named else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def skip_by_tier(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A skip marker with the tier's reason (``harness.checks.tiers.tier_reason``, as the CLI asks it) on every case
    item the run's device leaves out: on the CPU tier the items marked ``gpu``; on the GPU the items of a check that
    runs there only when named, where neither ``--check`` nor the case's ``checks:`` names it. Decided from the case,
    the device and the selection alone, before any setup (the recompile guard's warmup) or child process."""
    from harness.checks.tiers import tier_reason

    device, named = config.stash[state.DEVICE], check_option(config)
    for item in items:
        if isinstance(item, CheckItem):
            reason = tier_reason(item.case, item.check, device, named)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


def locate_skip(item: pytest.Item, report: pytest.TestReport) -> None:
    """A case item skipped while it ran (not applicable, unsupported) is reported at its case's line in the YAML
    file, as a skip marker is, rather than at the line of this plugin that raised the skip."""
    if (isinstance(item, CheckItem) and report.skipped and not hasattr(report, "wasxfail")
            and isinstance(report.longrepr, tuple)):
        report.longrepr = (str(item.path), item.case.line + 1, report.longrepr[2])
