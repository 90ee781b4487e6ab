"""--shard K/N: the union of shards is the whole suite, with no overlap, balanced by cost, deterministic, and a unit (a
case's items) never split."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.sharding import parse_shard, partition, partition_units, select, select_units

ids = st.lists(st.text("abcdefgh:/_", min_size=1, max_size=12), min_size=0, max_size=60, unique=True)


@settings(max_examples=150, deadline=None)
@given(names=ids, n=st.integers(1, 7), seed=st.integers(0, 10**6))
def test_union_is_everything_exactly_once(names, n, seed):
    rng = random.Random(seed)
    items = [(name, rng.choice([0.0, 1.0, 2.5, rng.random() * 100])) for name in names]
    shards = partition(items, n)
    flat = [i for s in shards for i in s]
    assert sorted(flat) == sorted(names) and len(flat) == len(set(flat))
    # determinism: the same partition from a shuffled input
    shuffled = items[:]
    rng.shuffle(shuffled)
    assert [set(s) for s in partition(shuffled, n)] == [set(s) for s in shards]
    # every K/N selection agrees with the partition
    assert set().union(*(select(items, k, n) for k in range(1, n + 1))) == set(names)


@settings(max_examples=150, deadline=None)
@given(names=ids, n=st.integers(1, 7), seed=st.integers(0, 10**6))
def test_units_stay_whole_and_the_union_is_everything_exactly_once(names, n, seed):
    rng = random.Random(seed)
    items = [(name, f"unit{rng.randrange(max(1, len(names) // 3))}", rng.choice([0.0, 1.0, rng.random() * 100]))
             for name in names]
    shards = partition_units(items, n)
    flat = [i for s in shards for i in s]
    assert sorted(flat) == sorted(names) and len(flat) == len(set(flat))
    shard_of = {i: k for k, shard in enumerate(shards) for i in shard}
    for unit in {u for _, u, _ in items}:  # a unit's items all in one shard
        assert len({shard_of[i] for i, u, _ in items if u == unit}) == 1, unit
    for shard in shards:  # in their original order
        assert shard == [i for i, _, _ in items if i in set(shard)]
    shuffled = items[:]
    rng.shuffle(shuffled)
    assert [set(s) for s in partition_units(shuffled, n)] == [set(s) for s in shards]
    assert set().union(*(select_units(items, k, n) for k in range(1, n + 1))) == set(names)


def test_units_are_balanced_by_their_summed_cost():
    """Six cases of ten checks each: whole cases go to two shards, three cases each, whatever the items' order."""
    items = [(f"c{c}::check{k}", f"c{c}", float(c + 1)) for k in range(10) for c in range(6)]
    shards = partition_units(items, 2)
    cases = [{i.split("::")[0] for i in s} for s in shards]
    assert not cases[0] & cases[1] and len(cases[0] | cases[1]) == 6
    loads = [sum(c for i, _, c in items if i in s) for s in map(set, shards)]
    assert loads == [110.0, 100.0]  # LPT over case totals 60, 50, ..., 10: {60, 30, 20} and {50, 40, 10}
    with pytest.raises(ValueError, match="duplicates"):
        partition_units([("a", "u", 1.0), ("a", "v", 1.0)], 2)


def test_balanced_by_cost():
    items = [(f"case{i}::check", float(c)) for i, c in enumerate([50, 40, 30, 20, 10] + [1] * 40)]
    loads = [sum(dict(items)[i] for i in s) for s in partition(items, 3)]
    total = sum(c for _, c in items)
    # LPT bound: no shard exceeds the mean by more than the largest single item
    assert max(loads) <= total / 3 + 50
    assert max(loads) - min(loads) <= 10


@pytest.mark.parametrize("text", ["0/3", "4/3", "1/0", "a/b", "1-3", ""])
def test_bad_shard_spec_is_rejected(text):
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)


def test_duplicate_ids_are_rejected():
    with pytest.raises(ValueError, match="duplicates"):
        partition([("a", 1.0), ("a", 2.0)], 2)


def test_longest_first_queue_hands_out_the_costliest_scope():
    from harness.sharding import LongestFirstQueue

    cost = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 2.0}.__getitem__
    q = LongestFirstQueue(cost)
    q["short"] = {"a": False}
    q["tie-first"] = {"c": False}
    q["long"] = {"b": False}
    q["tie-second"] = {"d": False}
    assert q.popitem(last=False) == ("long", {"b": False})
    assert [q.popitem(last=False)[0] for _ in range(2)] == ["tie-first", "tie-second"]  # ties: insertion order
    q.update({"requeued": {"b": False, "a": True}})  # xdist re-queues a crashed worker's units with update()
    assert q.popitem(last=False)[0] == "requeued"  # 6 (completed items still count: a unit's nominal cost)
    assert q.popitem(last=False)[0] == "short" and not q
    with pytest.raises(KeyError):
        q.popitem(last=False)


def test_measured_costs_come_from_an_earlier_report(tmp_path):
    from harness.report import ItemRecord, Report
    from harness.sharding import ItemCosts

    path = tmp_path / "r.json"
    Report([ItemRecord("t::a", "passed", duration=3.0), ItemRecord("t::b", "failed", duration=1.0),
            ItemRecord("t::c", "passed", duration=2.0), ItemRecord("t::s", "skipped", duration=50.0)]).write(path)
    costs = ItemCosts.from_report(path)
    assert (costs("t::a"), costs("t::b")) == (3.0, 1.0)
    assert costs("t::new") == 2.0 and costs("t::s") == 2.0  # median of measured items; skips measure nothing
    assert ItemCosts({})("anything") == 1.0


def test_a_shard_weighs_case_items_the_durations_report_lacks_by_their_estimate(monkeypatch):
    """``--shard`` on the GPU, its durations from a run that skipped most of the selected items (every_config unless
    named): each missing case item costs its estimate in the report's seconds (the measured items' median ratio of
    measured to estimated seconds), so the shards hold about equal work. Costed as the report's median item (small
    tests' seconds), the two measured items took shards of their own and two shards took all the rest."""
    from harness.sharding import ItemCosts
    from ssd_pytest import sharding

    class FakeCaseItem:
        config = None

        def __init__(self, nodeid: str, estimate: float):
            self.nodeid, self.estimate = nodeid, estimate

        def get_closest_marker(self, name):
            return None

    monkeypatch.setattr(sharding, "CheckItem", FakeCaseItem)
    monkeypatch.setattr(sharding, "_estimate", lambda item: item.estimate)
    measured = ItemCosts({"big-0::c": 8.0, "big-1::c": 8.0, **{f"test_x.py::t{k}": 0.01 for k in range(20)}})
    monkeypatch.setattr(sharding, "measured_costs", lambda config: measured)
    items = [FakeCaseItem("big-0::c", 10.0), FakeCaseItem("big-1::c", 10.0)]
    items += [FakeCaseItem(f"small-{k}::c", 1.0) for k in range(30)]
    costs = sharding.shard_costs(items)
    assert costs == [8.0, 8.0] + [0.8] * 30
    work = {item.nodeid: 0.8 * item.estimate for item in items}  # what each item takes, in the report's seconds
    shards = partition_units([(nodeid, nodeid, cost) for nodeid, cost in zip(work, costs, strict=True)], 4)
    loads = [sum(work[nodeid] for nodeid in shard) for shard in shards]
    assert max(loads) - min(loads) <= 0.8 + 1e-9, loads


def test_preferred_kind_queue_hands_out_the_preferred_kind_then_the_others():
    from harness.sharding import LongestFirstQueue, PreferredKindQueue

    cost = {"t1": 1.0, "t2": 5.0, "c1": 2.0, "c2": 3.0}.__getitem__
    q = PreferredKindQueue(lambda scope: scope[0], lambda: LongestFirstQueue(cost))
    for scope in ("t1", "c1", "t2", "c2"):
        q[scope] = {scope: False}
    q.prefer = "c"
    assert q.popitem(last=False)[0] == "c2"  # the costliest of the preferred kind, not the costliest overall
    q.prefer = "t"
    assert q.popitem(last=False)[0] == "t2" and len(q) == 2
    q.prefer = "c"
    assert q.popitem(last=False)[0] == "c1"
    assert q.popitem(last=False)[0] == "t1"  # the preferred kind ran out: the others, rather than nothing
    q.update({"c1": {"c1": False}})  # xdist re-queues a crashed worker's units with update()
    q.prefer = "t"
    assert q.popitem(last=False)[0] == "c1" and not q
    with pytest.raises(KeyError):
        q.popitem(last=False)


class _Config:
    """What ``durations_source`` reads of a pytest config: the option, the configuration key, its file, the device."""

    def __init__(self, inipath, *, given=None, named="", device="cuda"):
        from ssd_pytest import state

        self.inipath, self.rootpath = inipath, inipath.parent
        self._given, self._named = given, named
        self.stash = pytest.Stash()
        self.stash[state.DEVICE] = device

    def getoption(self, name):
        assert name == "durations_from"
        return self._given

    def getini(self, name):
        from ssd_pytest.sharding import GPU_DURATIONS_INI

        assert name == GPU_DURATIONS_INI
        return self._named


def test_on_the_gpu_the_configured_durations_are_the_default_and_the_option_wins(tmp_path):
    from ssd_pytest.sharding import durations_source

    ini = tmp_path / "pyproject.toml"
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "gpu.json").write_text("{}")
    named = "scripts/gpu.json"
    assert durations_source(_Config(ini, named=named)) == (str(tmp_path / named), f"ssd_gpu_durations ({ini})")
    without_file = _Config(ini, named=named)
    without_file.inipath = None  # -o ssd_gpu_durations=... with no configuration file: relative to the rootdir
    assert durations_source(without_file) == (str(tmp_path / named),
                                              "ssd_gpu_durations (set with -o, no configuration file)")
    assert durations_source(_Config(ini, named=named, given="r.json")) == ("r.json", "--durations-from")
    assert durations_source(_Config(ini, named=named, device="cpu")) is None  # the CPU tier: its own estimates
    assert durations_source(_Config(ini)) is None
    with pytest.raises(pytest.UsageError, match=r"ssd_gpu_durations \(.*pyproject.toml\): scripts/none.json: no such "
                                                r"file \(.*/scripts/none.json\); name a JSON report"):
        durations_source(_Config(ini, named="scripts/none.json"))


def test_the_project_names_a_gpu_durations_report_that_holds_its_tests(pytestconfig):
    """The key in this project's configuration names a report that reads, and its items are this suite's."""
    from pathlib import Path

    from harness.sharding import ItemCosts
    from ssd_pytest.sharding import GPU_DURATIONS_INI

    root = Path(__file__).resolve().parents[1]
    assert pytestconfig.inipath == root / "pyproject.toml"
    costs = ItemCosts.from_report(root / pytestconfig.getini(GPU_DURATIONS_INI))
    files = {nodeid.split("::", 1)[0] for nodeid in costs.durations}
    assert "tests/test_fuzz_faults.py" in files and "cases/corpus/direct.yaml" in files, sorted(files)[:10]
