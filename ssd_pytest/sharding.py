"""``--shard K/N`` and ``--durations-from``: which items this run keeps, and the expected cost of each item."""

from __future__ import annotations

import pytest

from harness.sharding import ItemCosts, parse_shard, select
from ssd_pytest.items import CheckItem

_costs_key = pytest.StashKey[ItemCosts]()


def measured_costs(config: pytest.Config) -> ItemCosts | None:
    """``ItemCosts`` from ``--durations-from`` (read once per process), or None without it."""
    path = config.getoption("durations_from")
    if not path:
        return None
    if _costs_key not in config.stash:
        try:
            config.stash[_costs_key] = ItemCosts.from_report(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise pytest.UsageError(f"--durations-from {path}: {exc}") from None
    return config.stash[_costs_key]


def item_cost(item: pytest.Item) -> float:
    """Measured seconds with ``--durations-from``; otherwise a case item's size (tokens x state elements), 1 for any
    other test."""
    measured = measured_costs(item.config)
    if measured is not None:
        return measured(item.nodeid)
    if not isinstance(item, CheckItem):
        return 1.0
    case = item.case
    return float(case.total_tokens * case.shape.state_elements)


def keep_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--shard K/N``: keep this shard's items (in place), report the others as deselected."""
    shard = config.getoption("shard")
    if not shard:
        return
    try:
        k, n = parse_shard(shard)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    keep = select([(it.nodeid, item_cost(it)) for it in items], k, n)
    deselected = [it for it in items if it.nodeid not in keep]
    items[:] = [it for it in items if it.nodeid in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
