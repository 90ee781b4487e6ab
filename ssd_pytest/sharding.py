"""``--shard K/N`` and ``--durations-from``: which items this run keeps (whole cases, whole xdist groups), and the
expected cost of each item."""

from __future__ import annotations

import statistics

import pytest

from harness.sharding import ItemCosts, parse_shard, select_units
from ssd_pytest import state
from ssd_pytest.items import CheckItem

_costs_key = pytest.StashKey[ItemCosts]()


# The configuration key naming the GPU run's measured durations, the default for ``--durations-from`` on the GPU:
# there a few tests that start processes take tens of seconds each, and in collection order they can start last.
GPU_DURATIONS_INI = "ssd_gpu_durations"


def durations_source(config: pytest.Config) -> tuple[str, str] | None:
    """(report path, where it was named): ``--durations-from``; else, where this run is on the GPU, the report the
    configuration file's ``ssd_gpu_durations`` names (relative to that file); else None (the costs are estimates)."""
    given = config.getoption("durations_from")
    if given:
        return given, "--durations-from"
    if config.stash.get(state.DEVICE, None) != "cuda":
        return None
    named = config.getini(GPU_DURATIONS_INI)
    if not named:
        return None
    # ``-o ssd_gpu_durations=...`` sets it without a configuration file: then it is relative to the rootdir.
    where = f"{GPU_DURATIONS_INI} ({config.inipath or 'set with -o, no configuration file'})"
    path = (config.inipath.parent if config.inipath else config.rootpath) / named
    if not path.is_file():  # named, so meant: a run scheduled without it would be slower without saying why
        raise pytest.UsageError(f"{where}: {named}: no such file ({path}); name a JSON report of an earlier GPU run "
                                "(--ssd-report), or remove the key")
    return str(path), where


def measured_costs(config: pytest.Config) -> ItemCosts | None:
    """``ItemCosts`` from ``durations_source`` (read once per process), or None without one."""
    source = durations_source(config)
    if source is None:
        return None
    if _costs_key not in config.stash:
        path, where = source
        try:
            config.stash[_costs_key] = ItemCosts.from_report(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise pytest.UsageError(f"{where} {path}: {exc}") from None
    return config.stash[_costs_key]


# Expected seconds of a case item a tier skips (decided before anything is built), and of a test that is no
# case item, when no earlier run measured them.
SKIPPED_ITEM_SECONDS = 0.01
OTHER_TEST_SECONDS = 1.0


def item_cost(item: pytest.Item) -> float:
    """A case item skipped before it runs (its tier's skip marker, ``items.skip_by_tier``): a skip's, whatever an
    earlier run measured for it (that run may have run it); then measured seconds with ``--durations-from``;
    otherwise a case item's estimated interpreter seconds (``harness.checks.tiers``: its calls x the case's blocks;
    on the GPU a relative size), a skip's on the CPU tier, and ``OTHER_TEST_SECONDS`` for any other test."""
    if isinstance(item, CheckItem) and item.get_closest_marker("skip") is not None:
        return SKIPPED_ITEM_SECONDS
    measured = measured_costs(item.config)
    if measured is not None:
        return measured(item.nodeid)
    if not isinstance(item, CheckItem):
        return OTHER_TEST_SECONDS
    from harness.checks.tiers import runs_on_cpu

    if item.config.stash.get(state.DEVICE, None) == "cpu" and not runs_on_cpu(item.case, item.check):
        return SKIPPED_ITEM_SECONDS
    return _estimate(item)


def _estimate(item: CheckItem) -> float:
    from harness.checks.tiers import cpu_estimate

    return cpu_estimate(item.case, item.check)


def shard_costs(items: list[pytest.Item]) -> list[float]:
    """Each item's cost for ``--shard``: ``item_cost``, except a case item that runs but that the measured report
    lacks (new, or skipped in that run: every_config on the GPU unless named), which costs its estimate in the
    report's seconds: the estimate times the median ratio of measured to estimated seconds over the case items here
    the report has. The report's median item would weigh every such item alike, small case or large, and the few
    measured items would fill shards of their own while one shard took most of the rest."""
    costs = [item_cost(item) for item in items]
    measured = measured_costs(items[0].config) if items else None
    if measured is None:
        return costs
    cases = [(k, item) for k, item in enumerate(items)
             if isinstance(item, CheckItem) and item.get_closest_marker("skip") is None]
    missing = [k for k, item in cases if item.nodeid not in measured.durations]
    ratios = [measured.durations[item.nodeid] / estimate for _, item in cases
              if item.nodeid in measured.durations and (estimate := _estimate(item)) > 0]
    if missing and ratios:
        scale = statistics.median(ratios)
        for k in missing:
            costs[k] = _estimate(items[k]) * scale
    return costs


def shard_unit(item: pytest.Item) -> str:
    """What one shard keeps whole: every check of one YAML case (its inputs are built once per process), the tests
    marked ``xdist_group(name)`` (their module fixtures run once), any other test alone."""
    if isinstance(item, CheckItem):
        return item.parent.nodeid
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return f"xdist_group:{mark.args[0] if mark.args else mark.kwargs.get('name', 'default')}"
    return item.nodeid


def keep_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--shard K/N``: keep this shard's items (in place), report the others as deselected."""
    shard = config.getoption("shard")
    if not shard:
        return
    try:
        k, n = parse_shard(shard)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    costs = shard_costs(items)
    keep = select_units([(it.nodeid, shard_unit(it), cost) for it, cost in zip(items, costs, strict=True)], k, n)
    deselected = [it for it in items if it.nodeid not in keep]
    items[:] = [it for it in items if it.nodeid in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
