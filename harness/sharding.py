"""Split test items across N machines deterministically and evenly by expected cost (``--shard K/N``).

Greedy longest-processing-time assignment: items sorted by (cost descending, id) go one by one to the shard with the
least total cost so far (ties to the lowest shard number). The result depends only on the item ids and costs, so every
runner of a CI matrix computes the same partition, and the union of the N shards is every item exactly once.
``partition_units`` does the same with units of items that must share a shard (all checks of one YAML case, whose
inputs are built once per process), each weighing the sum of its items' costs.
"""

from __future__ import annotations

import heapq
import itertools
import re
import statistics
from collections import OrderedDict
from typing import Callable, Iterable

_SHARD = re.compile(r"^(\d+)/(\d+)$")


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` with 1 <= K <= N -> (K, N); a clear ValueError otherwise."""
    m = _SHARD.match(text.strip())
    if not m:
        raise ValueError(f"--shard: expected K/N with integers 1 <= K <= N, found {text!r}")
    k, n = int(m.group(1)), int(m.group(2))
    if not 1 <= k <= n:
        raise ValueError(f"--shard: expected 1 <= K <= N, found K={k} N={n}")
    return k, n


def _unique(ids: list[str]) -> None:
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:3]
        raise ValueError(f"shards: item ids must be unique, found duplicates {dup}")


def partition(items: Iterable[tuple[str, float]], n: int) -> list[list[str]]:
    """Assign (id, cost) items to ``n`` shards; returns the ids of each shard in their original order."""
    if n < 1:
        raise ValueError(f"shards: expected n >= 1, found {n}")
    items = list(items)
    ids = [i for i, _ in items]
    _unique(ids)
    order = {item_id: pos for pos, item_id in enumerate(ids)}
    heap = [(0.0, shard) for shard in range(n)]
    owner: dict[str, int] = {}
    for item_id, cost in sorted(items, key=lambda ic: (-float(ic[1]), ic[0])):
        load, shard = heapq.heappop(heap)
        owner[item_id] = shard
        heapq.heappush(heap, (load + float(cost), shard))
    shards: list[list[str]] = [[] for _ in range(n)]
    for item_id in sorted(owner, key=order.__getitem__):
        shards[owner[item_id]].append(item_id)
    return shards


def select(items: Iterable[tuple[str, float]], k: int, n: int) -> set[str]:
    """Ids of shard ``k`` (1-based) of ``n``."""
    return set(partition(items, n)[k - 1])


def partition_units(items: Iterable[tuple[str, str, float]], n: int) -> list[list[str]]:
    """Assign (id, unit, cost) items to ``n`` shards, every unit's items to one shard: ``partition`` over the units,
    each costing the sum of its items. Returns the ids of each shard in their original order."""
    items = list(items)
    _unique([i for i, _, _ in items])
    unit_cost: dict[str, float] = {}
    for _, unit, cost in items:
        unit_cost[unit] = unit_cost.get(unit, 0.0) + float(cost)
    owner = {unit: k for k, units in enumerate(partition(unit_cost.items(), n)) for unit in units}
    shards: list[list[str]] = [[] for _ in range(n)]
    for item_id, unit, _ in items:
        shards[owner[unit]].append(item_id)
    return shards


def select_units(items: Iterable[tuple[str, str, float]], k: int, n: int) -> set[str]:
    """Ids of shard ``k`` (1-based) of ``n``, every unit whole (``partition_units``)."""
    return set(partition_units(items, n)[k - 1])


class ItemCosts:
    """Expected seconds per test item, measured: the durations of an earlier run's JSON report (``--ssd-report``,
    passed back as ``--durations-from``). An item the report lacks (new, or skipped then) costs the median measured
    item, so it is neither hoarded first nor starved last."""

    def __init__(self, durations: dict[str, float]):
        self.durations = durations
        self.default = statistics.median(durations.values()) if durations else 1.0

    @classmethod
    def from_report(cls, path) -> "ItemCosts":
        from harness.report import Report

        report = Report.read(path)
        return cls({r.nodeid: r.duration for r in report.items if r.outcome not in ("skipped", "unsupported")})

    def __call__(self, nodeid: str) -> float:
        return self.durations.get(nodeid, self.default)


class LongestFirstQueue(OrderedDict):
    """xdist's scope work queue (scope -> {nodeid: done}) that hands out the costliest scope first when asked for
    the oldest one (``popitem(last=False)``): longest-processing-time order, so a 30 s test starts at once instead
    of wherever collection order put it and a worker is not left finishing it alone at the end."""

    def __init__(self, cost: Callable[[str], float]):
        super().__init__()
        self._cost = cost
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()

    def __setitem__(self, scope, work_unit) -> None:
        super().__setitem__(scope, work_unit)
        total = sum(self._cost(nodeid) for nodeid in work_unit)
        heapq.heappush(self._heap, (-total, next(self._seq), scope))

    def popitem(self, last: bool = True):
        if last:
            return super().popitem(last=True)
        while self._heap:
            _, _, scope = heapq.heappop(self._heap)
            if scope in self:  # entries of scopes popped or re-queued since are stale
                return scope, self.pop(scope)
        raise KeyError("popitem(): work queue is empty")


class PreferredKindQueue(OrderedDict):
    """xdist's scope work queue split by kind (``kind_of(scope)``), each kind in its own queue (``make_queue()``:
    an OrderedDict, or a ``LongestFirstQueue``). ``popitem(last=False)`` hands out the next unit of the kind in
    ``prefer`` (set by the scheduler for the node it is about to feed) and, once that kind has run out, the next unit
    of the other kinds (in the order their first unit was queued), so no unit waits while a node idles."""

    def __init__(self, kind_of: Callable[[str], str], make_queue: Callable[[], OrderedDict] = OrderedDict):
        super().__init__()
        self._kind_of = kind_of
        self._make_queue = make_queue
        self._by_kind: dict[str, OrderedDict] = {}
        self.prefer: str | None = None

    def __setitem__(self, scope, work_unit) -> None:
        super().__setitem__(scope, work_unit)
        kind = self._kind_of(scope)
        if kind not in self._by_kind:
            self._by_kind[kind] = self._make_queue()
        self._by_kind[kind][scope] = work_unit

    def popitem(self, last: bool = True):
        if last:
            raise NotImplementedError("PreferredKindQueue hands out units oldest first only (popitem(last=False))")
        kinds = sorted(self._by_kind, key=lambda kind: kind != self.prefer)  # stable: the preferred kind first
        for kind in kinds:
            queue = self._by_kind[kind]
            if queue:
                scope, work_unit = queue.popitem(last=False)
                super().pop(scope)
                return scope, work_unit
        raise KeyError("popitem(): work queue is empty")
