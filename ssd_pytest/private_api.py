"""Every use of a third-party private API in ssd_pytest, each checked before use.

- pytest-xdist's ``LoadScopeScheduling`` internals, for scheduling by case (``xdist_scheduling``): ``_split_scope``
  (an item's work unit), ``_reschedule`` (hands a node its next unit; held back for the second round),
  ``_assign_work_unit`` (feeds one node: the queue is told the node's preferred kind first),
  ``workqueue`` (scope -> {nodeid: done}, replaced by a queue that pops the costliest unit first: xdist pops it
  with ``popitem(last=False)`` in ``_assign_work_unit``) and the ``loadscopereorder`` option (its reorder by unit
  size, turned off so collection order or measured cost decides).
- pytest-xdist's worker protocol, for the early worker exit (``workers.exit_worker_now``): the worker stores the
  session's exit status in ``config.workeroutput["exitstatus"]`` when it sends ``workerfinished``, and the
  controller takes the end of a worker's channel after that message as a normal end.

Each is used only under an xdist version inside ``KNOWN_XDIST`` whose objects have the attributes. Otherwise the
plugin keeps xdist's stock behaviour (its own ``--dist`` scheduling; workers leave through the interpreter's
shutdown) and says so once per process with a ``PrivateApiChanged`` warning of one line. pytest's own private API
is not used.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import warnings
from collections import OrderedDict
from typing import Callable

# The xdist versions whose internals this module was written against: [first, last) as (major, minor).
KNOWN_XDIST = ((3, 7), (4, 0))
# LoadScopeScheduling methods that the case-scope scheduler overrides or calls.
SCHEDULER_METHODS = ("_split_scope", "_reschedule", "_assign_work_unit", "schedule")

_warned: set[str] = set()


class PrivateApiChanged(UserWarning):
    """A third-party private API that ssd_pytest relies on is not as expected; the stock behaviour is used."""


def warn_once(topic: str, message: str) -> None:
    """One warning per topic and process, on one line."""
    if topic in _warned:
        return
    _warned.add(topic)
    warnings.warn(PrivateApiChanged(" ".join(f"ssd-harness: {message}".split())), stacklevel=3)


def installed_version(distribution: str) -> tuple[int, ...] | None:
    """The leading release numbers of an installed distribution (``3.8.0rc1`` -> (3, 8, 0)); None if absent."""
    try:
        text = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    m = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(part) for part in m.group(0).split(".")) if m else None


def _xdist_version_problem() -> str | None:
    version = installed_version("pytest-xdist")
    first, last = KNOWN_XDIST
    if version is None:
        return "pytest-xdist's version is unknown"
    if not first <= version[:2] < last:
        shown = ".".join(map(str, version))
        return (f"pytest-xdist {shown} is outside the versions whose internals this plugin knows "
                f"(>= {'.'.join(map(str, first))}, < {'.'.join(map(str, last))})")
    return None


def _load_scope_class():
    try:
        from xdist.scheduler import LoadScopeScheduling
    except ImportError:
        return None
    return LoadScopeScheduling


def scheduler_problem(config) -> str | None:
    """Why the case-scope scheduler cannot be built on this xdist (None: it can)."""
    problem = _xdist_version_problem()
    if problem:
        return problem
    base = _load_scope_class()
    if base is None:
        return "xdist.scheduler.LoadScopeScheduling is missing"
    missing = [name for name in SCHEDULER_METHODS if not callable(getattr(base, name, None))]
    if not hasattr(config.option, "loadscopereorder"):
        missing.append("option loadscopereorder")
    if missing:
        return f"xdist's LoadScopeScheduling lacks {', '.join(missing)}"
    return None


@functools.cache
def _case_scope_class():
    base = _load_scope_class()

    class CaseScopeScheduling(base):
        """xdist's load-scope scheduling with the caller's work units (``scope_of``), an optional work queue that
        decides which unit goes out next, and a second round handed out in reverse node order."""

        def __init__(self, config, log, scope_of: Callable[[str], str], queue: OrderedDict | None,
                     prefer: Callable | None = None):
            super().__init__(config, log)
            config.option.loadscopereorder = False
            self._scope_of = scope_of
            self._prefer = prefer
            self._second_round: list | None = None  # nodes held back during the first hand-out (``schedule``)
            if queue is not None:
                self.workqueue = queue

        def _assign_work_unit(self, node) -> None:
            """xdist pops the next unit with ``workqueue.popitem(last=False)``; a queue with a ``prefer`` attribute
            (``harness.sharding.PreferredKindQueue``) is told first which kind this node prefers."""
            if self._prefer is not None:
                self.workqueue.prefer = self._prefer(node)
            super()._assign_work_unit(node)

        def _split_scope(self, nodeid: str) -> str:
            return self._scope_of(nodeid)

        def schedule(self) -> None:
            """xdist hands every node one unit, then (``_reschedule``, "at least two units") a second one, both
            rounds in node order: the node given the costliest first unit would also get the costliest second one.
            The second round goes in reverse: the costliest remaining unit to the node whose first is cheapest."""
            self._second_round = [] if self.collection is None else None
            super().schedule()
            second, self._second_round = self._second_round, None
            for node in reversed(second or []):
                super()._reschedule(node)

        def _reschedule(self, node) -> None:
            if self._second_round is not None:
                self._second_round.append(node)  # held back until the first round is over (``schedule``)
                return
            super()._reschedule(node)
            # A worker runs an item only once it knows the next one or is told to stop: a node holding a single
            # one-item unit (a replacement worker's first unit after a crash) would wait for ever.
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
                self._assign_work_unit(node)

        def remove_node(self, node) -> str | None:
            """xdist's, except that the item the node crashed on is not queued again: xdist reports it as crashed
            (``handle_crashitem``), and a replacement worker running it again would crash again, once per restart
            xdist allows."""
            workload = self.assigned_work.pop(node)
            if not self._pending_of(workload):
                return None
            crashitem = next(nodeid for unit in workload.values() for nodeid, done in unit.items() if not done)
            for unit in workload.values():
                if crashitem in unit:
                    unit[crashitem] = True
            self.workqueue.update({scope: unit for scope, unit in workload.items() if not all(unit.values())})
            for other in self.assigned_work:
                self._reschedule(other)
            return crashitem

    return CaseScopeScheduling


def case_scope_scheduler(config, log, scope_of: Callable[[str], str], queue: OrderedDict | None,
                         prefer: Callable | None = None):
    """A scheduler for xdist's ``pytest_xdist_make_scheduler``: work units by ``scope_of(nodeid)``, handed out in
    ``queue``'s order (default: collection order); ``prefer(node)``: the kind of unit ``node`` gets first, for a
    queue that has kinds. None, with a warning, where xdist's internals are not the known
    ones: xdist then uses its own scheduler for the ``--dist`` mode."""
    problem = scheduler_problem(config)
    if problem is None:
        scheduler = _case_scope_class()(config, log, scope_of, queue, prefer)
        if isinstance(getattr(scheduler, "workqueue", None), OrderedDict):
            return scheduler
        problem = "xdist's LoadScopeScheduling has no ordered workqueue"
    warn_once("scheduler", f"{problem}; using xdist's own --dist scheduling (a case's checks may be spread "
                           "over workers)")
    return None


def finished_worker_exit_status(config) -> int | None:
    """In an xdist worker whose session has finished: the exit status xdist reported to the controller with
    ``workerfinished``, which makes leaving now (``os._exit``) safe. None, with a warning where the protocol is not
    the known one, or where this worker has not reported (the caller then leaves through the usual shutdown)."""
    problem = _xdist_version_problem()
    output = getattr(config, "workeroutput", None)
    if problem is None and not (isinstance(output, dict) and "exitstatus" in output):
        problem = "xdist's workeroutput has no exitstatus at the worker's end"
    if problem is not None:
        warn_once("worker-exit", f"{problem}; workers leave through the interpreter's shutdown")
        return None
    return int(output["exitstatus"])
