"""Which items go to one xdist worker together, and in what order the work goes out (``-n N`` with ``--dist load``
or ``loadgroup``). The scheduler itself subclasses xdist internals and lives in ``private_api``."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import OrderedDict

import pytest

from harness.cases.files import CASE_SUFFIXES
from harness.sharding import LongestFirstQueue, PreferredKindQueue
from ssd_pytest import private_api, state, workers
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


def unit_kind(scope: str) -> str:
    """``workers.CASES`` for a YAML case's unit (``case_scope``), ``workers.TESTS`` for any other."""
    path = scope.partition("::")[0]
    return workers.CASES if not scope.startswith("xdist_group:") and path.endswith(CASE_SUFFIXES) else workers.TESTS


def expected_case_share(config: pytest.Config) -> float:
    """The case items' share of the run's expected time: from ``--durations-from``, over the items under the run's
    paths and not under ``--ignore``d ones; one half without it."""
    costs = measured_costs(config)
    if costs is None:
        return 0.5
    root = str(config.rootpath)

    def relative(path: str) -> str:
        return os.path.relpath(os.path.abspath(path.split("::", 1)[0]), root).replace(os.sep, "/")

    def under(path: str, folders: list[str]) -> bool:
        return any(top == "." or path == top or path.startswith(top + "/") for top in folders)

    selected = [relative(arg) for arg in config.args] or ["."]
    ignored = [relative(path) for path in (config.getoption("ignore") or [])]
    seconds = {workers.CASES: 0.0, workers.TESTS: 0.0}
    for nodeid, duration in costs.durations.items():
        path = nodeid.split("::", 1)[0]
        if under(path, selected) and not under(path, ignored):
            seconds[unit_kind(case_scope(nodeid))] += duration
    total = sum(seconds.values())
    return seconds[workers.CASES] / total if total > 0 else 0.5


def plan_worker_roles(config: pytest.Config, device: str) -> int | None:
    """In the xdist controller, before the workers start: give the workers roles (``workers.role_of``) where that
    saves contexts: on a GPU, with case items in child processes, at least two workers, and this plugin's scheduler
    (the one that honours roles). Returns the number of case workers, or None (no roles); the workers inherit it in
    ``workers.CASE_WORKERS_ENV``, the scheduler reads it from the stash."""
    from harness.isolation import isolation_mode

    count = workers.planned_worker_count(config)
    eligible = (device == "cuda" and count >= 2 and isolation_mode(config.getoption("isolation")) == "process"
                and config.getoption("dist", "no") in ("load", "loadgroup")
                and private_api.scheduler_problem(config) is None)
    case_workers = workers.case_worker_count(count, expected_case_share(config)) if eligible else None
    config.stash[state.CASE_WORKERS] = case_workers
    if case_workers is None:
        os.environ.pop(workers.CASE_WORKERS_ENV, None)  # a value inherited from an enclosing run is not ours
    else:
        os.environ[workers.CASE_WORKERS_ENV] = str(case_workers)
    return case_workers


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
    unit first with ``--durations-from``; where workers have roles, each worker gets units of its own kind while there
    are any (``unit_kind``, ``workers.role_of``), then the others. Other ``--dist`` modes, and an xdist whose
    internals changed, get xdist's own scheduler (None)."""
    if config.getoption("dist", "no") not in ("load", "loadgroup"):
        return None
    costs = measured_costs(config)
    queue = LongestFirstQueue(costs) if costs is not None else None
    prefer = None
    case_workers = config.stash.get(state.CASE_WORKERS, None)
    if case_workers is not None:  # roles planned (plan_worker_roles): each worker's own kind first
        queue = PreferredKindQueue(unit_kind, (lambda: LongestFirstQueue(costs)) if costs is not None else OrderedDict)

        def prefer(node) -> str | None:
            return workers.role_of(node.gateway.id, case_workers)  # xdist names a gateway by its worker id
    return private_api.case_scope_scheduler(config, log, scope_of=_CaseScopes(), queue=queue, prefer=prefer)
