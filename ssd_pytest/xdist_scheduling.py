"""Which items go to one xdist worker together, and in what order the work goes out (``-n N`` with ``--dist load``
or ``loadgroup``). The scheduler itself subclasses xdist internals and lives in ``private_api``."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import pytest

from harness.cases.files import CASE_SUFFIXES
from harness.sharding import LongestFirstQueue
from ssd_pytest import private_api
from ssd_pytest.sharding import measured_costs

GROUPS_FILE_ENV = "SSD_HARNESS_XDIST_GROUPS"  # where workers write {nodeid: xdist_group name} for the controller


def case_scope(nodeid: str, groups: dict[str, str] | None = None) -> str:
    """The xdist work unit of an item: every check of one YAML case goes to one worker (its inputs are built once,
    its kernels compiled and tuned once); a test marked ``xdist_group(name)`` goes with its group (``groups``:
    nodeid -> name, as the workers report it), so an expensive module fixture runs in one worker; any other item
    is a unit of its own."""
    if groups and nodeid in groups:
        return f"xdist_group:{groups[nodeid]}"
    path, sep, rest = nodeid.partition("::")
    if sep and path.endswith(CASE_SUFFIXES):
        return f"{path}::{rest.split('::', 1)[0]}"
    return nodeid


def _groups_file_for_this_run() -> str:
    return os.path.join(tempfile.gettempdir(), f"ssd-harness-xdist-groups-{os.getpid()}.json")


def share_groups_file() -> None:
    """In the controller, before xdist starts the workers: the file where they will write their xdist groups."""
    os.environ[GROUPS_FILE_ENV] = _groups_file_for_this_run()


def remove_groups_file() -> None:
    """In the controller at its end: remove the groups file this run named."""
    path = os.environ.get(GROUPS_FILE_ENV)
    if path and path == _groups_file_for_this_run():
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def write_xdist_groups(session: pytest.Session) -> None:
    """In an xdist worker, before xdist reports the collection: write the ``xdist_group`` of every marked item for
    the controller's scheduler (xdist's own way, an ``@name`` id suffix, sets a private attribute that pytest 9.2
    no longer reads). Every worker collects the same items, so each writes the same file."""
    path = os.environ.get(GROUPS_FILE_ENV)
    if not path or not hasattr(session.config, "workerinput"):
        return
    groups = {}
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(groups, fh)
    os.replace(tmp, path)


def read_groups(path: str | None) -> dict[str, str]:
    if not path or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


class _CaseScopes:
    """``case_scope`` with the workers' groups, read when the scheduler first asks: once every worker has collected
    (and written the file)."""

    def __init__(self):
        self._groups: dict[str, str] | None = None

    def __call__(self, nodeid: str) -> str:
        if self._groups is None:
            self._groups = read_groups(os.environ.get(GROUPS_FILE_ENV))
        return case_scope(nodeid, self._groups)


def make_scheduler(config: pytest.Config, log):
    """``-n N`` (``--dist load``, or ``loadgroup``): load scheduling by ``case_scope`` units, in collection order (the
    Python tests, whose single items are the longest, first; the many short case units fill the end), or costliest
    unit first with ``--durations-from``. Other ``--dist`` modes, and an xdist whose internals changed, get xdist's
    own scheduler (None)."""
    if config.getoption("dist", "no") not in ("load", "loadgroup"):
        return None
    costs = measured_costs(config)
    queue = LongestFirstQueue(costs) if costs is not None else None
    return private_api.case_scope_scheduler(config, log, scope_of=_CaseScopes(), queue=queue)
