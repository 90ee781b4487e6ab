"""Compile claims (harness.compile_claims): processes warming at once compile each specialization once between them,
and every process still gets every specialization (loaded from the shared cache). A stand-in compile (a file per
spec in a shared folder, a short sleep) makes the races real on the CPU; on the GPU the suite's warmups use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import compile_claims
from harness.compile_claims import CLAIMS_ENV, ClaimBoard, compile_claimed

ROOT = Path(__file__).resolve().parents[1]

# One racing process: warms specs 0..N-1 from spec ``first`` on, with a stand-in compile that "loads" a spec
# whose file exists and otherwise "compiles" it (sleeps, then publishes the file atomically, as Triton's cache does).
RACER = r"""
import json, os, sys, time
from pathlib import Path
from harness.compile_claims import ClaimBoard, compile_claimed

board_dir, cache, n, first, use_claims, log = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6]
events = []

def compile_one(spec):
    path = cache / f"spec{spec}"
    if path.exists():
        events.append(["load", spec])
        return
    time.sleep(0.03)
    tmp = cache / f".spec{spec}.{os.getpid()}"
    tmp.write_text("binary")
    os.replace(tmp, path)
    events.append(["compile", spec])

specs = [(i, ClaimBoard.name("kernel", i)) for i in range(n)]
order = list(range(first, n)) + list(range(first))
while not Path(log).with_name("go").exists():  # all start together
    time.sleep(0.005)
if use_claims:
    compile_claimed(specs, order, ClaimBoard(board_dir), compile_one)
else:
    for i in order:
        compile_one(specs[i][0])
Path(log).write_text(json.dumps(events))
"""


def race(tmp_path: Path, processes: int, specs: int, use_claims: bool) -> list[list]:
    cache, board = tmp_path / "cache", tmp_path / "claims"
    cache.mkdir()
    logs = [tmp_path / f"log{k}.json" for k in range(processes)]
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(board), str(cache), str(specs),
                               "0", "1" if use_claims else "0", str(log)], cwd=ROOT)
             for k, log in enumerate(logs)]
    (tmp_path / "go").touch()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    return [json.loads(log.read_text()) for log in logs]


def test_racing_processes_compile_each_spec_once_and_each_gets_every_spec(tmp_path):
    logs = race(tmp_path, processes=4, specs=24, use_claims=True)
    compiled = sorted(spec for events in logs for kind, spec in events if kind == "compile")
    assert compiled == list(range(24)), compiled  # each once, between them
    for events in logs:
        assert sorted(spec for _, spec in events) == list(range(24))  # every process warmed everything


def test_without_claims_the_same_race_compiles_specs_twice(tmp_path):
    """The control: processes that start on the same spec at the same moment all compile it."""
    logs = race(tmp_path, processes=4, specs=24, use_claims=False)
    compiled = [spec for events in logs for kind, spec in events if kind == "compile"]
    assert len(compiled) > 24, compiled


def test_a_claim_is_exclusive_and_done_is_seen_by_all(tmp_path):
    a, b = ClaimBoard(tmp_path), ClaimBoard(tmp_path)
    name = ClaimBoard.name("k", "key")
    assert name == ClaimBoard.name("k", "key") != ClaimBoard.name("k", "other")
    assert a.try_claim(name) and not b.try_claim(name)
    assert not b.is_done(name)
    a.finish(name)
    assert b.is_done(name) and b.wait(name, timeout=0.0)


def test_a_dead_holder_or_a_timeout_does_not_hold_anyone_up(tmp_path):
    board = ClaimBoard(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    name = ClaimBoard.name("dead")
    (tmp_path / f"{name}.claim").write_text(dead.stdout.strip())  # its holder has exited
    assert board.wait(name, timeout=60.0) is False
    alive = ClaimBoard.name("alive")
    assert board.try_claim(alive)  # held by this (living) process, never finished
    assert board.wait(alive, timeout=0.05) is False
    calls = []
    before = dict(compile_claims.stats)
    mine = compile_claimed([("spec-dead", name), ("spec-alive", alive)], [0, 1], board, calls.append, timeout=0.05)
    assert mine == [] and calls == ["spec-dead", "spec-alive"]  # done here instead
    assert compile_claims.stats["deferred"] == before["deferred"] + 2  # this process's share, for the report
    assert compile_claims.stats["wait_seconds"] >= before["wait_seconds"] + 0.05


def test_a_failed_compile_releases_its_claim_for_the_next_process(tmp_path):
    board = ClaimBoard(tmp_path)
    name = ClaimBoard.name("bad")

    def broken(spec):
        raise RuntimeError(f"ptxas failed for {spec}")

    with pytest.raises(RuntimeError, match="ptxas failed for s"):
        compile_claimed([("s", name)], [0], board, broken)
    assert not board.is_done(name) and board.try_claim(name)  # free again: the next process reports its own error


def test_the_board_named_in_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(CLAIMS_ENV, raising=False)
    assert ClaimBoard.from_env() is None
    monkeypatch.setenv(CLAIMS_ENV, str(tmp_path / "run"))
    board = ClaimBoard.from_env()
    assert board is not None and board.folder == tmp_path / "run" and board.folder.is_dir()
