"""ssd_pytest.private_api: third-party private APIs are used only under the xdist versions and attributes they were
written against; otherwise the stock behaviour, with one warning of one line."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from ssd_pytest import plugin, private_api, workers

PACKAGE = Path(private_api.__file__).resolve().parent


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(private_api, "_warned", set())


def scheduler_config(**option):
    options = {"dist": "load", "durations_from": None, "tx": ["2*popen"]}
    return SimpleNamespace(getoption=lambda name, default=None: options.get(name, default),
                           getvalue=lambda name: options[name], option=SimpleNamespace(**option),
                           stash=pytest.Stash())


def only_warning(record) -> str:
    assert len(record) == 1, [str(w.message) for w in record]
    text = str(record[0].message)
    assert "\n" not in text and text.startswith("ssd-harness: "), text
    return text


def test_known_xdist_gets_the_case_scope_scheduler_without_a_warning():
    config = scheduler_config(loadscopereorder=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", private_api.PrivateApiChanged)
        scheduler = plugin.pytest_xdist_make_scheduler(config, log=None)
    assert type(scheduler).__name__ == "CaseScopeScheduling"
    assert config.option.loadscopereorder is False  # xdist's reorder by unit size is off


@pytest.mark.parametrize("version", [(4, 0, 0), (3, 6, 1), None], ids=["newer", "older", "unknown"])
def test_an_unknown_xdist_version_falls_back_to_xdists_own_scheduler(monkeypatch, version):
    monkeypatch.setattr(private_api, "installed_version", lambda name: version)
    config = scheduler_config(loadscopereorder=True)
    with pytest.warns(private_api.PrivateApiChanged) as record:
        assert plugin.pytest_xdist_make_scheduler(config, log=None) is None  # None: xdist's own --dist load
        assert plugin.pytest_xdist_make_scheduler(config, log=None) is None
    text = only_warning(record)  # once per process, not once per call
    assert "pytest-xdist" in text and "using xdist's own --dist scheduling" in text
    assert config.option.loadscopereorder is True  # nothing of xdist's was touched


def test_a_missing_scheduler_attribute_falls_back_and_names_it(monkeypatch):
    from xdist.scheduler import LoadScopeScheduling

    class Changed(LoadScopeScheduling):
        _reschedule = None  # as if xdist had renamed it

    monkeypatch.setattr(private_api, "_load_scope_class", lambda: Changed)
    with pytest.warns(private_api.PrivateApiChanged) as record:
        assert plugin.pytest_xdist_make_scheduler(scheduler_config(loadscopereorder=True), log=None) is None
    assert "lacks _reschedule" in only_warning(record)


def test_an_xdist_without_the_reorder_option_falls_back():
    with pytest.warns(private_api.PrivateApiChanged) as record:
        assert plugin.pytest_xdist_make_scheduler(scheduler_config(), log=None) is None
    assert "lacks option loadscopereorder" in only_warning(record)


def test_a_scheduler_without_an_ordered_workqueue_falls_back(monkeypatch):
    from xdist.scheduler import LoadScopeScheduling

    class NoQueue(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = {}  # a plain dict: popitem(last=False) would not exist

    monkeypatch.setattr(private_api, "_load_scope_class", lambda: NoQueue)
    private_api._case_scope_class.cache_clear()
    try:
        with pytest.warns(private_api.PrivateApiChanged) as record:
            assert plugin.pytest_xdist_make_scheduler(scheduler_config(loadscopereorder=True), log=None) is None
    finally:
        private_api._case_scope_class.cache_clear()
    assert "no ordered workqueue" in only_warning(record)


def test_the_early_worker_exit_needs_the_known_protocol(monkeypatch):
    exits = []
    monkeypatch.setattr(workers.os, "_exit", exits.append)
    finished = SimpleNamespace(workeroutput={"exitstatus": 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error", private_api.PrivateApiChanged)
        workers.exit_worker_now(finished)
    assert exits == [3]
    # No exit status where xdist keeps it: the interpreter's usual shutdown, and a warning.
    with pytest.warns(private_api.PrivateApiChanged) as record:
        workers.exit_worker_now(SimpleNamespace(workeroutput={}))
    assert "no exitstatus" in only_warning(record) and exits == [3]
    # An xdist version the protocol is not known for: the same.
    private_api._warned.clear()
    monkeypatch.setattr(private_api, "installed_version", lambda name: (5, 1))
    with pytest.warns(private_api.PrivateApiChanged) as record:
        workers.exit_worker_now(finished)
    assert "pytest-xdist 5.1 is outside" in only_warning(record) and exits == [3]


def test_installed_versions_are_read_from_the_distribution_metadata():
    import xdist

    assert private_api.installed_version("pytest-xdist")[:2] == tuple(int(p) for p in xdist.__version__.split(".")[:2])
    assert private_api.installed_version("no-such-distribution-ssd") is None


PRIVATE_NAMES = {"_split_scope", "_reschedule", "_assign_work_unit", "workqueue", "loadscopereorder", "workeroutput"}


def private_uses(path: Path) -> list[str]:
    """Attributes and imports in ``path`` that belong to xdist's internals."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_NAMES:
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
        if isinstance(node, ast.Constant) and node.value in PRIVATE_NAMES:
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("xdist."):
            found.append(f"{path.name}:{node.lineno}: from {node.module}")
    return found


def test_xdist_internals_are_used_in_private_api_only():
    assert private_uses(PACKAGE / "private_api.py")  # the scan can find them
    elsewhere = [use for path in sorted(PACKAGE.glob("*.py")) if path.name != "private_api.py"
                 for use in private_uses(path)]
    assert not elsewhere, elsewhere
