"""Claims on compile work shared by processes that use one Triton disk cache (xdist workers warming at once).

Each process that is about to compile a warmup spec first claims every binary of it not yet done (one file per
binary, created exclusively): it compiles only when it got them all, then marks them done; otherwise it gives its
claims back, puts the spec aside, goes on with what nobody holds, and at the end loads the spec from the disk cache
once the holders are done. Without this, workers warming overlapping requests at the same moment each compiled the
same binaries (docs/decisions.md: compile claims); compiles outside the warmups are not claimed and may still
repeat.

A claim whose process has died (a crashed worker) or that outlives ``timeout`` does not hold anyone up: the waiter
compiles unclaimed. A claim given back (after a failed compile) is claimed again by a waiter, which then meets the
same error in its own test. Claims live in a folder per run (the pytest plugin makes one for each xdist
session), so nothing is left over between runs.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any, Callable

POLL_SECONDS = 0.01
# This process's share (the pytest plugin reports it per worker): specs compiled under its own claim, loaded after
# another process finished them, put aside because another held them, and the seconds spent waiting for those.
stats = {"claimed": 0, "found_done": 0, "deferred": 0, "wait_seconds": 0.0}
CLAIMS_ENV = "SSD_HARNESS_COMPILE_CLAIMS"  # the folder of this run's claims (set by the pytest plugin for xdist)


class ClaimBoard:
    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(cls) -> "ClaimBoard | None":
        folder = os.environ.get(CLAIMS_ENV)
        return cls(folder) if folder else None

    @staticmethod
    def name(*parts: object) -> str:
        """A claim's file name for what it stands for (a binary's kernel and specialization key): the same in
        every process."""
        return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]

    def _claim(self, name: str) -> Path:
        return self.folder / f"{name}.claim"

    def _done(self, name: str) -> Path:
        return self.folder / f"{name}.done"

    def is_done(self, name: str) -> bool:
        return self._done(name).exists()

    def try_claim(self, name: str) -> bool:
        """True when this process now holds the claim (and must ``finish`` or ``release`` it)."""
        try:
            fd = os.open(self._claim(name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return True

    def finish(self, name: str) -> None:
        """The work is in the disk cache."""
        self._done(name).touch()

    def release(self, name: str) -> None:
        """The work failed: let the next process try (it reports its own error)."""
        self._claim(name).unlink(missing_ok=True)

    def _holder_alive(self, name: str) -> bool:
        try:
            pid = int(self._claim(name).read_text() or "0")
        except FileNotFoundError:
            return False  # released
        except ValueError:
            return True  # the holder is between creating the file and writing its pid
        if pid <= 0:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def wait(self, name: str, timeout: float) -> str:
        """Wait on a claim another process holds, until its work is ``"done"``, the claim is ``"released"`` (its
        holder gave it back: claim it again), its ``"holder died"``, or it ``"timed out"`` (the last two: do the
        work yourself, unclaimed)."""
        deadline = time.monotonic() + timeout
        while not self.is_done(name):
            if not self._claim(name).exists():
                return "done" if self.is_done(name) else "released"
            if not self._holder_alive(name):
                return "done" if self.is_done(name) else "holder died"
            if time.monotonic() > deadline:
                return "timed out"
            time.sleep(POLL_SECONDS)
        return "done"

    def claim_all(self, names: list[str]) -> tuple[list[str], str | None]:
        """Claim every name not yet done, or none of them: ``(held, None)`` when this process now holds all those
        (``held`` is empty when all are done), else ``([], blocker)``, ``blocker`` being the first name another
        process holds (the claims taken on the way are given back). Names are taken in one order in every process,
        so of two processes that want overlapping names, one gets all of them."""
        held = []
        for name in sorted(n for n in names if not self.is_done(n)):
            if not self.try_claim(name):
                for mine in held:
                    self.release(mine)
                return [], name
            held.append(name)
        return held, None


def compile_claimed(specs: list[tuple[Any, list[str]]], order: list[int], claims: ClaimBoard,
                    compile_one: Callable[[Any], None], timeout: float = 300.0) -> list[int]:
    """Compile ``specs[i]`` (a spec, and a claim name per binary it compiles) for ``i`` in ``order``. A spec whose
    binaries are all done elsewhere is loaded; one whose missing binaries this process can claim, all of them, it
    compiles; one with a binary another process holds is put aside (its own claims given back, so no two processes
    ever wait on each other) and loaded at the end, once done. At the end a binary whose holder gave its claim back
    (a failed compile, or a process that could not get all it wanted) is claimed again, never compiled unclaimed,
    so two waiters cannot both compile it; one whose holder died or took longer than ``timeout`` s is compiled here
    unclaimed. Claims are per binary, not per spec: specs of different requests share binaries
    without sharing all of them, so a claim per spec would let every worker whose spec differs compile the shared
    binary. Returns the indices this process compiled under its own claims."""
    deferred, mine = [], []

    def compile_holding(i: int, held: list[str]) -> None:
        try:
            compile_one(specs[i][0])
        except BaseException:
            for name in held:
                claims.release(name)
            raise
        for name in held:
            claims.finish(name)
        stats["claimed"] += 1
        mine.append(i)

    for i in order:
        spec, names = specs[i]
        held, blocker = claims.claim_all(names)
        if blocker is not None:
            deferred.append(i)
        elif held:
            compile_holding(i, held)
        else:
            stats["found_done"] += 1
            compile_one(spec)  # disk-cache loads
    stats["deferred"] += len(deferred)
    for i in deferred:
        spec, names = specs[i]
        start = time.monotonic()
        while True:
            held, blocker = claims.claim_all(names)
            if blocker is None:
                stats["wait_seconds"] += time.monotonic() - start
                if held:  # a holder gave its claims back (a failed compile, or it could not get them all)
                    compile_holding(i, held)
                else:
                    compile_one(spec)  # disk-cache loads
                break
            if claims.wait(blocker, max(0.0, timeout - (time.monotonic() - start))) in ("holder died", "timed out"):
                stats["wait_seconds"] += time.monotonic() - start
                compile_one(spec)
                break
    return mine
