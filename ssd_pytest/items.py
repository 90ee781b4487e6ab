"""YAML case files become collectors and items: ``<file>::<case id>::<check>``. A ``CaseFile`` holds the file's
cases, a ``CaseNode`` one case (its built inputs are shared by its checks), a ``CheckItem`` runs one check."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import pytest

from harness import DEFAULT_PROVIDER
from ssd_pytest import state
from ssd_pytest.recompile import RecompileFailed, recompile_guard, warmup_for

CASE_SUFFIXES = (".yaml", ".yml")
REPO_ROOT = Path(__file__).resolve().parents[1]

_provider_key = pytest.StashKey[dict]()  # provider spec -> (provider, or None and why it is unusable)
_case_ids_key = pytest.StashKey[dict]()  # case id -> the file that defines it
_bad_files_key = pytest.StashKey["BadCaseFiles"]()


def configure(config: pytest.Config) -> None:
    config.stash[_provider_key] = {}
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
    """YAML under ``<repo>/cases`` (or ``<rootdir>/cases``), a YAML file named on the command line, or YAML under a
    folder named on the command line other than the repository itself (whose other YAML is not ours) and its
    ``tests/`` (fixtures such as the malformed files, which are cases only when named one by one)."""
    if file_path.suffix not in CASE_SUFFIXES:
        return False
    resolved = file_path.resolve()
    for root in {REPO_ROOT, Path(config.rootpath).resolve()}:
        if (root / "cases") in resolved.parents:
            return True
    fixtures = REPO_ROOT / "tests"  # the harness's own YAML fixtures (malformed files, ...): cases only by name
    for arg in _explicit_paths(config):
        if arg == resolved:
            return True
        if (arg.is_dir() and arg in resolved.parents and arg != REPO_ROOT and arg not in REPO_ROOT.parents
                and fixtures not in resolved.parents):
            return True
    return False


class BadCaseFiles:
    """The case files of this run that could not become items (bound to its config). pytest stops before the first
    item when collection had errors, unless ``--continue-on-collection-errors``; a bad case file is its one
    collection error and must not keep the other files' items from running. So when every collection error is a
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

    def context(self, provider, device: str, provider_spec: str):
        from harness.checks import CheckContext

        if self._context is None or self._context.provider is not provider:
            self._context = CheckContext(self.case, provider, device, provider_spec)
        return self._context

    def teardown(self) -> None:
        self._context = None  # release this case's tensors before the next case


class CheckFailed(Exception):
    """A check failed; its message is the full report (what differed, the case, the repro line)."""


def _provider(config: pytest.Config):
    from harness.checks.providers import load_provider

    spec = config.getoption("provider") or DEFAULT_PROVIDER
    cache = config.stash[_provider_key]
    if spec not in cache:
        try:
            cache[spec] = (load_provider(spec), None)
        except Exception as exc:  # noqa: BLE001 - every item reports why the provider is unusable
            cache[spec] = (None, f"{type(exc).__name__}: {exc}")
    return spec, cache[spec]


class CheckItem(pytest.Item):
    def __init__(self, *, check: str, explicit: bool, **kwargs):
        super().__init__(**kwargs)
        self.check = check
        self.explicit = explicit
        case = self.parent.case
        self.add_marker("ssd_case")
        self.user_properties += [("case_id", case.id), ("check", check), ("seed", case.seed),
                                 ("family", case.family)]

    @property
    def case(self):
        return self.parent.case

    def setup(self) -> None:
        super().setup()
        _, (provider, _) = _provider(self.config)
        warmup_for(self.config, self.case, provider)  # outside the guarded call; its time shows as this item's setup

    def runtest(self) -> None:
        from harness.checks import Status, run_check

        config = self.config
        spec, (provider, error) = _provider(config)
        if provider is None:
            raise CheckFailed(f"--provider {spec} is not usable: {error}")
        device = config.stash[state.DEVICE]
        requested = config.getoption("device")
        with recompile_guard(config, self.case, provider) as guarded:
            result = run_check(
                self.case, self.check, provider, device=device, provider_spec=spec,
                repro_device=None if requested == "auto" else requested,
                context=self.parent.context(provider, device, spec),
            )
            guarded["status"] = result.status
        if result.max_ulp is not None:
            self.user_properties.append(("max_ulp", result.max_ulp))
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
        if excinfo.errisinstance((CheckFailed, RecompileFailed)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.case.id}::{self.check}"
