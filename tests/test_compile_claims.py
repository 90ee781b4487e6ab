"""Compile claims (harness.compile_claims): processes warming at once compile each specialization once between them,
and every process still gets every specialization (loaded from the shared cache). A stand-in compile (a file per
spec in a shared folder, a short sleep) makes the races real on the CPU; on the GPU the suite's warmups use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness import compile_claims
from harness.compile_claims import CLAIMS_ENV, ClaimBoard, compile_claimed

ROOT = Path(__file__).resolve().parents[1]

# One racing process: warms specs 0..N-1, spec i compiling binaries i and i+1 (mod N) as two requests' specs share
# some binaries and not others, with a stand-in compile that "loads" a binary whose file exists and otherwise
# "compiles" it (sleeps, then publishes the file atomically, as Triton's cache does). Claims per binary, per spec
# (one name for all a spec's binaries), or none.
RACER = r"""
import json, os, sys, time
from pathlib import Path
from harness.compile_claims import ClaimBoard, compile_claimed

board_dir, cache, n, mode, log = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
events = []

def binaries(spec):
    return [spec, (spec + 1) % n]

def compile_one(spec):
    for b in binaries(spec):
        path = cache / f"bin{b}"
        if path.exists():
            events.append(["load", b])
            continue
        time.sleep(0.03)
        tmp = cache / f".bin{b}.{os.getpid()}"
        tmp.write_text("binary")
        os.replace(tmp, path)
        events.append(["compile", b])

names = {"binary": lambda i: [ClaimBoard.name("k", b) for b in binaries(i)],
         "spec": lambda i: [ClaimBoard.name("s", i)]}
while not Path(log).with_name("go").exists():  # all start together
    time.sleep(0.005)
if mode == "none":
    for i in range(n):
        compile_one(i)
else:
    compile_claimed([(i, names[mode](i)) for i in range(n)], list(range(n)), ClaimBoard(board_dir), compile_one)
Path(log).write_text(json.dumps(events))
"""


def race(tmp_path: Path, processes: int, specs: int, mode: str) -> list[list]:
    cache, board = tmp_path / "cache", tmp_path / "claims"
    cache.mkdir()
    logs = [tmp_path / f"log{k}.json" for k in range(processes)]
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(board), str(cache), str(specs), mode, str(log)],
                              cwd=ROOT) for log in logs]
    (tmp_path / "go").touch()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    return [json.loads(log.read_text()) for log in logs]


def compiled(logs: list[list]) -> list[int]:
    return sorted(b for events in logs for kind, b in events if kind == "compile")


def test_racing_processes_compile_each_binary_once_and_each_gets_every_binary(tmp_path):
    logs = race(tmp_path, processes=4, specs=24, mode="binary")
    assert compiled(logs) == list(range(24))  # each once, between them
    for events in logs:
        assert {b for _, b in events} == set(range(24))  # every process warmed everything


@pytest.mark.parametrize("mode", ["none", "spec"])
def test_without_claims_per_binary_the_same_race_compiles_binaries_twice(tmp_path, mode):
    """The controls: without claims, processes starting on the same spec at the same moment all compile it; with
    one claim per spec, two processes holding neighbouring specs both compile the binary those share."""
    assert len(compiled(race(tmp_path, processes=4, specs=24, mode=mode))) > 24


def test_a_claim_is_exclusive_and_done_is_seen_by_all(tmp_path):
    a, b = ClaimBoard(tmp_path), ClaimBoard(tmp_path)
    name = ClaimBoard.name("k", "key")
    assert name == ClaimBoard.name("k", "key") != ClaimBoard.name("k", "other")
    assert a.try_claim(name) and not b.try_claim(name)
    assert not b.is_done(name)
    a.finish(name)
    assert b.is_done(name) and b.wait(name, timeout=0.0) == "done"


def test_a_dead_holder_or_a_timeout_does_not_hold_anyone_up(tmp_path):
    board = ClaimBoard(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    name = ClaimBoard.name("dead")
    (tmp_path / f"{name}.claim").write_text(dead.stdout.strip())  # its holder has exited
    assert board.wait(name, timeout=60.0) == "holder died"
    alive = ClaimBoard.name("alive")
    assert board.try_claim(alive)  # held by this (living) process, never finished
    assert board.wait(alive, timeout=0.05) == "timed out"
    calls = []
    before = dict(compile_claims.stats)
    mine = compile_claimed([("spec-dead", [name]), ("spec-alive", [alive])], [0, 1], board, calls.append,
                           timeout=0.05)
    assert mine == [] and calls == ["spec-dead", "spec-alive"]  # done here instead
    assert compile_claims.stats["deferred"] == before["deferred"] + 2  # this process's share, for the report
    assert compile_claims.stats["wait_seconds"] >= before["wait_seconds"] + 0.05


def test_a_failed_compile_releases_its_claim_for_the_next_process(tmp_path):
    board = ClaimBoard(tmp_path)
    name, other = ClaimBoard.name("bad"), ClaimBoard.name("bad", 2)

    def broken(spec):
        raise RuntimeError(f"ptxas failed for {spec}")

    with pytest.raises(RuntimeError, match="ptxas failed for s"):
        compile_claimed([("s", [name, other])], [0], board, broken)
    # Both free again: the next process reports its own error.
    assert not board.is_done(name) and board.try_claim(name) and board.try_claim(other)


def test_a_claim_given_back_while_a_spec_waits_is_claimed_again_before_compiling(tmp_path):
    """A waiter that finds the claim it waited on given back (its holder could not get all it wanted, or failed)
    claims it itself: compiling unclaimed let two waiters compile the same binary (a fresh-clone CI run saw
    binary 0 compiled twice in the race above)."""
    board = ClaimBoard(tmp_path)
    name = ClaimBoard.name("given back")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f"{name}.claim").write_text(str(other.pid))  # a living process holds it
        threading.Timer(0.2, board.release, [name]).start()  # ... and gives it back, never done
        seen = []

        def compile_one(spec):
            seen.append((tmp_path / f"{name}.claim").read_text())

        before = compile_claims.stats["deferred"]
        assert compile_claimed([("s", [name])], [0], board, compile_one, timeout=30.0) == [0]
        assert seen == [str(os.getpid())]  # held here while compiling
        assert board.is_done(name) and compile_claims.stats["deferred"] == before + 1
    finally:
        other.kill()
        other.wait()


def test_overlapping_claims_are_taken_in_one_order(tmp_path):
    """Every process claims a spec's names sorted, so a blocker is always the first taken name someone holds, and
    the claims taken before it are given back."""
    board = ClaimBoard(tmp_path)
    a, b, c = sorted(ClaimBoard.name("x", k) for k in range(3))
    assert board.try_claim(b)
    assert board.claim_all([c, b, a]) == ([], b)
    assert board.try_claim(a)  # given back
    board.release(a)
    board.finish(b)
    assert board.claim_all([c, b, a]) == ([a, c], None)  # the done one is not claimed


def test_the_board_named_in_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(CLAIMS_ENV, raising=False)
    assert ClaimBoard.from_env() is None
    monkeypatch.setenv(CLAIMS_ENV, str(tmp_path / "run"))
    board = ClaimBoard.from_env()
    assert board is not None and board.folder == tmp_path / "run" and board.folder.is_dir()


def test_a_spec_with_a_binary_held_elsewhere_gives_its_other_claims_back_before_waiting(tmp_path):
    """All or nothing: holding some of a spec's binaries while waiting for the rest could make two processes wait
    on each other."""
    board = ClaimBoard(tmp_path)
    free, held = ClaimBoard.name("free"), ClaimBoard.name("held")
    assert board.try_claim(held)  # another process's (alive: this one), never finished
    calls = []
    assert compile_claimed([("s", [free, held])], [0], board, calls.append, timeout=0.05) == []
    assert calls == ["s"] and not (tmp_path / f"{free}.claim").exists()
