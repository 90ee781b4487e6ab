"""Progress of ``python -m harness run``: one line per case as its last item ends, with its items' outcomes, the
cases done, the time elapsed and an estimate of the time left.

The estimate weighs every item by its expected cost (``harness.checks.tiers.cpu_estimate``: the calls the check is
first to make and its own, times the case's interpreter blocks; an item the CPU tier skips weighs almost nothing), so
that a run whose first cases are small does not promise to end early. The rate is measured from the end of the first
item on, since the first item also waits for the process that runs it to start (torch, Triton, a CUDA context): time
left = (time since the first item ended) x (weight left / weight done since).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable

# The order outcomes are listed in (the run table's columns).
OUTCOMES = ("passed", "failed", "error", "xpassed", "xfailed", "skipped", "unsupported")
# Weight of an item beyond any estimate: what starting it costs (the item's process round trip, its record).
ITEM_OVERHEAD = 0.01
ID_WIDTH = 48  # case ids are padded to the longest in the run, up to this


def item_weight(case, check: str, device: str, named=None) -> float:
    """Expected cost of an item, in estimated interpreter seconds (relative on the GPU); ``named``: the checks the
    run's ``--check`` names (an item its tier skips costs only its start)."""
    from harness.checks.tiers import cpu_estimate, tier_reason

    if tier_reason(case, check, device, named):
        return ITEM_OVERHEAD
    return ITEM_OVERHEAD + cpu_estimate(case, check)


def format_duration(seconds: float) -> str:
    """``45s``, ``3m10s``, ``1h05m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_eta(seconds: float) -> str:
    """Coarser than elapsed time (an estimate): ``40s``, ``7m``, ``1h05m``."""
    if seconds < 60:
        return f"{max(0, int(round(seconds)))}s"
    if seconds < 3600:
        return f"{int(round(seconds / 60))}m"
    return format_duration(seconds)


class CaseProgress:
    """Counts the items of a planned run as they end. ``plan``: (case, check) items, a case's items consecutive.
    ``weight(case, check)``: an item's expected cost; ``clock``: seconds (monotonic)."""

    def __init__(self, plan, weight: Callable[[object, str], float], clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.start = clock()
        self.left: Counter = Counter(case.id for case, _ in plan)
        self.cases = len(self.left)
        self.cases_done = 0
        self.outcomes: dict[str, Counter] = {}
        self.weights = {(case.id, check): weight(case, check) for case, check in plan}
        self.weight_left = sum(self.weights.values())
        self.weight_done = 0.0
        self.first: tuple[float, float] | None = None  # (when the first item ended, the weight done by then)
        self.width = min(ID_WIDTH, max((len(case_id) for case_id in self.left), default=0))

    def item_done(self, case, check: str, outcome: str) -> str | None:
        """Record an item's outcome; the case's line when this was its last item, else None."""
        weight = self.weights.pop((case.id, check), 0.0)
        self.weight_done += weight
        self.weight_left -= weight
        if self.first is None:
            self.first = (self.clock(), self.weight_done)
        self.outcomes.setdefault(case.id, Counter())[outcome] += 1
        self.left[case.id] -= 1
        if self.left[case.id] > 0:
            return None
        self.cases_done += 1
        counts = self.outcomes.pop(case.id)
        summary = " ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o])
        return f"{case.id:<{self.width}}  {summary}  [{self.status()}]"

    def status(self) -> str:
        """``12/40 cases, 3m10s elapsed, ETA 7m``."""
        now = self.clock()
        elapsed = now - self.start
        if self.cases_done == self.cases:
            eta = "done"
        elif self.first is not None and self.weight_done > self.first[1]:
            since, weight = now - self.first[0], self.weight_done - self.first[1]
            eta = "ETA " + format_eta(since * max(0.0, self.weight_left) / weight)
        else:
            eta = "ETA unknown"
        return f"{self.cases_done}/{self.cases} cases, {format_duration(elapsed)} elapsed, {eta}"
