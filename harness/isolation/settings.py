"""Which isolation a front end uses and how long one item may take: option first, then environment, then default."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

ISOLATION_ENV = "SSD_HARNESS_ISOLATION"
TIMEOUT_ENV = "SSD_HARNESS_ITEM_TIMEOUT"
MODES = ("process", "none")
DEFAULT_MODE = "process"

# Seconds one item may take before its process is killed. CPU: a hung item must end within two minutes; the slowest
# corpus item under Triton's interpreter (a check that calls our kernels several times on one of the larger cases)
# stays well inside that even on a host whose cores are shared several times over. CUDA: an item that meets a cold
# Triton cache first compiles, serially in its one process, every kernel specialization its calls need; the limit
# leaves room for that on a slow host, far above any warm item.
DEFAULT_TIMEOUTS = {"cpu": 120.0, "cuda": 300.0}


@dataclass(frozen=True)
class TimeLimit:
    seconds: float  # math.inf: no limit
    origin: str  # where the number came from ("limit from --item-timeout"), for an item that ran past it

    def describe(self) -> str:
        return "none" if math.isinf(self.seconds) else f"{self.seconds:g} s ({self.origin})"


def isolation_mode(value: str | None = None) -> str:
    """``value`` (an option), else ``SSD_HARNESS_ISOLATION``, else ``process``. Raises ValueError naming the source."""
    source, chosen = ("--isolation", value) if value is not None else (ISOLATION_ENV, os.environ.get(ISOLATION_ENV))
    if chosen is None or chosen == "":
        return DEFAULT_MODE
    if chosen not in MODES:
        raise ValueError(f"{source}: expected one of {', '.join(MODES)}, found {chosen!r}")
    return chosen


def item_timeout(value: float | str | None, device: str) -> TimeLimit:
    """The per-item limit: ``value`` (an option, seconds), else ``SSD_HARNESS_ITEM_TIMEOUT``, else the device's
    default. ``0`` means no limit. Raises ValueError naming the source of a value that is not a number >= 0."""
    if value is not None:
        source, raw = "--item-timeout", value
    elif os.environ.get(TIMEOUT_ENV, "").strip():
        source, raw = TIMEOUT_ENV, os.environ[TIMEOUT_ENV]
    else:
        return TimeLimit(DEFAULT_TIMEOUTS[device],
                         f"default limit on {device}; change it with --item-timeout or {TIMEOUT_ENV}")
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (seconds >= 0) or math.isinf(seconds):
        raise ValueError(f"{source}: expected seconds (a number >= 0; 0 = no limit), found {raw!r}")
    return TimeLimit(math.inf if seconds == 0 else seconds, f"limit from {source}")
