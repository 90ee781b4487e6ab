"""Start-up phases and the compile ledger (harness.timeline): what `harness times` says about a run's time outside
its items. The xdist run in test_plugin.py checks the phases of a real controller and its workers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import triton
import triton.language as tl

from harness import cli, timeline
from harness.guards.recompile import cold_in_memory_cache
from harness.report import ItemRecord, Report, merge_reports

ROOT = Path(__file__).resolve().parents[1]


def test_process_start_time_is_when_the_os_started_the_process():
    before = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.3); from harness.timeline import "
                          "process_start_time; print(process_start_time(), time.time())"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    started, printed = float(out[0]), float(out[1])
    # One clock tick (10 ms) of resolution; the 0.3 s sleep shows it is the start, not the moment of the call.
    assert before - 0.05 <= started <= printed - 0.25, (before, started, printed)


def test_mark_names_a_known_phase():
    phases = timeline.new_phases()
    timeline.mark(phases, "collected")
    assert set(phases) == {"process_start", "collected"} and phases["collected"] >= phases["process_start"]
    with pytest.raises(ValueError, match="phase: expected one of"):
        timeline.mark(phases, "warmed")


def _times(microseconds: int):
    return SimpleNamespace(total=microseconds)


def _event(ledger, digest: str, name: str, microseconds: int, hit: bool) -> None:
    ledger(src=SimpleNamespace(name=name), metadata={"hash": digest}, metadata_group={}, times=_times(microseconds),
           cache_hit=hit)


def test_ledger_counts_compiles_by_binary_and_loads_and_calls_the_listener_it_replaced():
    seen = []
    ledger = timeline.CompileLedger(previous=lambda **kw: seen.append(kw["cache_hit"]))
    _event(ledger, "a" * 64, "chunk_scan", 1_500_000, hit=False)
    _event(ledger, "a" * 64, "chunk_scan", 500_000, hit=False)  # the same binary again (a private cache dir)
    _event(ledger, "b" * 64, "bmm", 20_000, hit=True)
    assert ledger.to_dict() == {"compiled": {"a" * 16: ["chunk_scan", 2, 2.0, "", "", ""]}, "loaded": 1,
                                "load_seconds": 0.02}
    ledger.origin = "tests/test_x.py::test_y"
    _event(ledger, "c" * 64, "bmm", 1_000_000, hit=False)
    assert ledger.to_dict()["compiled"]["c" * 16] == ["bmm", 1, 1.0, "tests/test_x.py::test_y", "", ""]
    assert seen == [False, False, True, False]


def test_installed_ledger_is_tritons_listener_and_chains_the_previous_one():
    from triton import knobs

    with knobs.compilation.scope():
        marker = lambda **kw: None  # noqa: E731
        knobs.compilation.listener = marker
        ledger = timeline.install_compile_ledger()
        assert knobs.compilation.listener is ledger and ledger.previous is marker


def test_an_uninstalled_ledger_gives_back_the_listener_it_replaced_and_only_while_it_listens():
    from triton import knobs

    with knobs.compilation.scope():
        marker = lambda **kw: None  # noqa: E731
        knobs.compilation.listener = marker
        ledger = timeline.install_compile_ledger()
        timeline.uninstall_compile_ledger(ledger)
        assert knobs.compilation.listener is marker
        later = timeline.install_compile_ledger()
        other = timeline.install_compile_ledger()
        timeline.uninstall_compile_ledger(later)  # no longer the listener: left alone
        assert knobs.compilation.listener is other


def test_a_childs_drained_record_counts_under_the_parents_current_item():
    """A supervised child runs the parent's items: its compiles join the parent's ledger under the parent's origin."""
    child, parent = timeline.CompileLedger(), timeline.CompileLedger()
    assert child.drain() is None  # nothing recorded: nothing to send
    _event(child, "a" * 64, "chunk_scan", 1_500_000, hit=False)
    _event(child, "b" * 64, "bmm", 20_000, hit=True)
    delta = child.drain()
    assert child.drain() is None and child.compiled == {}
    parent.origin = "cases/corpus/direct.yaml::d-1::determinism"
    parent.absorb(delta)
    parent.absorb({"compiled": {"a" * 16: ["chunk_scan", 1, 0.5, ""]}, "loaded": 0, "load_seconds": 0.0})
    assert parent.to_dict() == {"compiled": {"a" * 16: ["chunk_scan", 2, 2.0, parent.origin, "", ""]}, "loaded": 1,
                                "load_seconds": 0.02}


def test_the_installed_ledger_is_found_only_while_it_listens():
    from triton import knobs

    with knobs.compilation.scope():
        knobs.compilation.listener = None
        assert timeline.installed_compile_ledger() is None
        ledger = timeline.install_compile_ledger()
        assert timeline.installed_compile_ledger() is ledger


def test_compile_lines_count_what_another_worker_compiled_too():
    gw0 = {"compiled": {"a": ["chunk_scan", 1, 1.0, "cases/corpus/direct.yaml::d-1::determinism"],
                        "b": ["bmm", 1, 2.0, "tests/test_kernel_stages.py::test_bmm[fp16]"]},
           "loaded": 3, "load_seconds": 0.3}
    gw1 = {"compiled": {"a": ["chunk_scan", 1, 1.5, "tests/test_ssd_warmup.py::test_x"]}, "loaded": 1,
           "load_seconds": 0.1, "claims": {"claimed": 2, "found_done": 5, "deferred": 1, "wait_seconds": 0.25}}
    merged = merge_reports([Report([], meta={"worker": "gw0", "compiles": gw0}),
                            Report([], meta={"worker": "gw1", "compiles": gw1})])
    assert merged.meta["worker_compiles"] == {"gw0": gw0, "gw1": gw1} and "compiles" not in merged.meta
    lines = timeline.compile_lines(merged.meta)
    # 3 compiles, 2 binaries; a's cheaper compile (1.0 s) was needed, the other 1.5 s repeated it.
    assert lines[0] == ("compiles: 3 in 4.5s over 2 processes, 2 distinct binaries; 1 repeats of a binary compiled "
                        "elsewhere too cost 1.5s; 4 loads from the disk cache in 0.4s")
    assert lines[1] == ("warmup claims: 2 specs compiled under a worker's own claim, 5 found done by another, 1 put "
                        "aside while another compiled them (waited 0.2s in all)")
    by_kernel = {ln.split()[0]: ln.split()[1:] for ln in lines[3:5]}
    assert by_kernel == {"chunk_scan": ["2", "2.5", "1.25", "1", "1.5"], "bmm": ["1", "2.0", "2.00", "0", "0.0"]}
    assert lines[3].split()[0] == "chunk_scan" and lines[5].split()[:2] == ["compiled", "during"]
    by_origin = {ln[:46].strip(): ln[46:].split() for ln in lines[6:]}
    assert by_origin == {"tests/test_kernel_stages.py": ["1", "2.0", "2.00", "0", "0.0"],
                         "tests/test_ssd_warmup.py": ["1", "1.5", "1.50", "1", "1.5"],  # the repeat
                         "cases (determinism)": ["1", "1.0", "1.00", "0", "0.0"]}
    assert timeline.compile_lines({"worker_compiles": {"gw0": {"compiled": {}, "loaded": 5}}}) == []
    assert timeline.origin_group("") == "(outside items)"
    cut = timeline.compile_lines(merged.meta, top=1)
    assert cut[4] == "  (+1 more, 1 compiles, 2.0s; --top 2 lists every one)"  # bmm, below chunk_scan's 2.5 s
    assert cut[-1] == "  (+2 more, 2 compiles, 2.5s; --top 3 lists every one)"  # below test_kernel_stages.py's 2.0 s


def _jit_source(name: str, source: str, key: str):
    """What the listener gets for a jit function's compile: ``src.fn`` with its source text and cache key."""
    return SimpleNamespace(name=name, fn=SimpleNamespace(src=source, cache_key=key))


def test_compile_lines_name_a_function_the_processes_keyed_differently():
    """Two processes compiling one jit function (one source) under two cache keys each compiled what the other had
    cached: the times name it. One key across processes, or reports without the digests, name nothing."""
    ledgers = {}
    for worker, key in (("gw0", "key-1"), ("gw1", "key-2"), ("gw2", "key-1")):
        ledger = timeline.CompileLedger()
        ledger(src=_jit_source("_chunk_state_kernel", "def _chunk_state_kernel(): ...", key),
               metadata={"hash": f"{worker}:state"}, metadata_group={}, times=_times(500_000), cache_hit=False)
        ledger(src=_jit_source("_bmm_kernel", "def _bmm_kernel(): ...", "stable"),
               metadata={"hash": f"{worker}:bmm"}, metadata_group={}, times=_times(500_000), cache_hit=False)
        ledgers[worker] = ledger.to_dict()
    source, key = next(e for e in ledgers["gw0"]["compiled"].values() if e[0] == "_chunk_state_kernel")[4:]
    assert len(source) == len(key) == 12 and source != key
    lines = timeline.compile_lines({"worker_compiles": ledgers})
    assert [ln for ln in lines if ln.startswith("cache keys:")] == [
        "cache keys: _chunk_state_kernel: one source compiled under 2 keys in 3 compiles (processes disagreed on its "
        "key: each compiled what another had cached)"]
    older = {w: {"compiled": {h: e[:4] for h, e in v["compiled"].items()}} for w, v in ledgers.items()}
    assert not [ln for ln in timeline.compile_lines({"worker_compiles": older}) if ln.startswith("cache keys:")]


def test_startup_lines_put_every_phase_in_time_order_from_the_controllers_start():
    meta = {"phases": {"process_start": 100.0, "configured": 100.5, "session_end": 140.0},
            "worker_phases": {f"gw{i}": {"process_start": 101.0 + i, "configured": 104.0 + i,
                                         "collected": 106.0 + i, "session_end": 138.0 + i} for i in range(3)}}
    lines = timeline.startup_lines(meta, item_starts=[108.5, 109.0], item_ends=[130.0, 139.5])
    assert lines[0].startswith("start-up and end: s after the controller started (3 workers")
    rows = [(ln[:38].strip(), ln[38:].strip()) for ln in lines[1:]]
    assert rows == [("controller configured (imports done)", "0.5"),
                    ("workers process started", "1.0 / 2.0 / 3.0"),
                    ("workers configured (imports done)", "4.0 / 5.0 / 6.0"),
                    ("workers collected", "6.0 / 7.0 / 8.0"),
                    ("first item started", "8.5"),
                    ("workers session ended", "38.0 / 39.0 / 40.0"),
                    ("last item ended", "39.5"),
                    ("controller session ended", "40.0")]
    assert timeline.startup_lines({}, [], []) == []


def test_times_prints_start_up_and_compiles_from_a_report(tmp_path, capsys):
    path = tmp_path / "r.json"
    Report([ItemRecord("t::a", "passed", 2.0, worker="gw0", start=105.0)],
           meta={"phases": {"process_start": 100.0},
                 "worker_phases": {"gw0": {"process_start": 101.0, "collected": 104.0}},
                 "worker_compiles": {"gw0": {"compiled": {"a": ["chunk_scan", 1, 1.0]}, "loaded": 0}}}).write(path)
    assert cli.main(["times", str(path)]) == 0
    out = capsys.readouterr().out
    assert "workers collected" in out and "last item ended" in out and "compiles: 1 in 1.0s" in out


@triton.jit
def _ledger_probe_kernel(x_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) + 1)


@pytest.mark.gpu(reason="the interpreter compiles nothing, so Triton never calls the listener (its logic is tested "
                 "above with the listener's own arguments)")
def test_ledger_sees_a_real_compile_then_a_disk_cache_load(tmp_path):
    import torch
    from triton import knobs

    with knobs.cache.scope(), knobs.compilation.scope():  # both put back as they were
        knobs.cache.dir = str(tmp_path)  # a fresh disk cache: the first warmup must compile
        ledger = timeline.install_compile_ledger()
        x = torch.zeros(32, device="cuda")
        for _ in range(2):
            with cold_in_memory_cache(_ledger_probe_kernel):
                _ledger_probe_kernel.warmup(x, BLOCK=32, grid=(1,))
    compiled = ledger.to_dict()["compiled"]
    assert [entry[:2] for entry in compiled.values()] == [["_ledger_probe_kernel", 1]], compiled
    assert all(len(entry[4]) == len(entry[5]) == 12 for entry in compiled.values()), compiled  # source, key
    assert ledger.loaded == 1
