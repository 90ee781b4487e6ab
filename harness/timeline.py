"""Where a run's wall time goes outside its items: each process's start-up, and each worker's Triton compiles.

Every pytest process (the xdist controller and each worker) notes when the OS started it, when pytest had configured
it (the plugins' imports, torch among them, are done by then), when it had collected, and when its session ended.
Each process that runs kernels also keeps a ledger of Triton's compiles (``knobs.compilation.listener``): every real
compile's binary hash, kernel and seconds, and how many binaries it loaded from the disk cache instead. The report
carries both per worker (meta ``worker_phases``, ``worker_compiles``; the controller's in ``phases``), and
``harness times`` prints them: how long the workers took to start, and how much compile time went into binaries
that another worker had compiled too (work the shared disk cache did not save, because both started it before
either had finished). Compiles in child processes (the recompile guard's own tests, ``warmup --jobs``) are not seen.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import time
from collections import defaultdict

from harness.report import more_rows_line

PHASES = ("process_start", "configured", "collected", "workers_finished", "session_end")
PHASE_TITLES = {
    "process_start": "process started",
    "configured": "configured (imports done)",
    "collected": "collected",
    "workers_finished": "heard the last worker finish",  # the controller's; its session ends once they all exited
    "session_end": "session ended",
}


def process_cpu(pid: int | str = "self") -> dict | None:
    """A process's CPU so far from /proc: user and system seconds and minor page faults (copy-on-write faults after
    a fork among them); None off Linux or once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # fields after comm start at 3
        ticks = os.sysconf("SC_CLK_TCK")
        return {"user": round(int(fields[11]) / ticks, 2), "system": round(int(fields[12]) / ticks, 2),
                "minor_faults": int(fields[7])}  # fields 14 (utime), 15 (stime), 10 (minflt)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def process_start_time() -> float | None:
    """When the OS started this process (epoch seconds, to a clock tick), from /proc; None off Linux."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            stat = fh.read()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22 (starttime); fields after comm start at 3
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - since_start


def new_phases() -> dict[str, float | None]:
    return {"process_start": process_start_time()}


def mark(phases: dict, name: str) -> None:
    if name not in PHASES:
        raise ValueError(f"timeline.mark: phase: expected one of {PHASES}, found {name!r}")
    phases[name] = time.time()


class CompileLedger:
    """A ``knobs.compilation.listener``: real compiles by binary hash ({hash: [kernel, count, seconds, origin,
    source, key]}, the origin being what ran when it was first compiled: the plugin sets ``origin`` to each item's
    node id; source and key: digests of the jit function's source text and of its Triton cache key, "" where the
    compiled thing has none) and the disk-cache loads. Calls the listener it replaced, so another tool's listener
    keeps working."""

    def __init__(self, previous=None):
        self.previous = previous
        self.compiled: dict[str, list] = {}
        self.loaded = 0
        self.load_seconds = 0.0
        self.origin = ""

    def __call__(self, *, src, metadata, metadata_group, times, cache_hit, **kwargs):
        seconds = times.total / 1e6  # CompileTimes are in microseconds
        if cache_hit:
            self.loaded += 1
            self.load_seconds += seconds
        else:
            entry = self.compiled.setdefault(str(metadata.get("hash", ""))[:16],
                                             [getattr(src, "name", "?"), 0, 0.0, self.origin, *_function_digests(src)])
            entry[1] += 1
            entry[2] += seconds
        if self.previous is not None:
            self.previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                          cache_hit=cache_hit, **kwargs)

    def to_dict(self) -> dict:
        return {"compiled": {h: [k, n, round(s, 4), *rest] for h, (k, n, s, *rest) in self.compiled.items()},
                "loaded": self.loaded, "load_seconds": round(self.load_seconds, 4)}

    def drain(self) -> dict | None:
        """What was recorded since the last drain (``to_dict``'s form), then empty; None when nothing was."""
        if not self.compiled and not self.loaded:
            return None
        delta = self.to_dict()
        self.compiled, self.loaded, self.load_seconds = {}, 0, 0.0
        return delta

    def absorb(self, delta: dict) -> None:
        """Add another process's drained record (a supervised child running this process's items) as this process's
        own, under this process's current origin."""
        for digest, (kernel, count, seconds, _, *function) in delta["compiled"].items():
            entry = self.compiled.setdefault(digest, [kernel, 0, 0.0, self.origin, *function])
            entry[1] += count
            entry[2] += seconds
        self.loaded += delta["loaded"]
        self.load_seconds += delta["load_seconds"]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12] if text else ""


def _function_digests(src) -> list[str]:
    """[source, key]: digests of the compiled jit function's source text and of its cache key (``src.fn``, which
    Triton hashed before compiling); ["", ""] for what has neither (an IR source)."""
    fn = getattr(src, "fn", None)
    return [_digest(str(getattr(fn, "src", "") or "")), _digest(str(getattr(fn, "cache_key", "") or ""))]


def installed_compile_ledger() -> CompileLedger | None:
    """This process's ledger, if ``install_compile_ledger`` ran here and it is still Triton's listener."""
    triton = sys.modules.get("triton")
    listener = getattr(getattr(getattr(triton, "knobs", None), "compilation", None), "listener", None)
    return listener if isinstance(listener, CompileLedger) else None


def install_compile_ledger() -> CompileLedger | None:
    """Listen to this process's Triton compiles; None where Triton is not importable. Under the interpreter nothing
    compiles, so the ledger stays empty."""
    try:
        from triton import knobs
    except ImportError:
        return None
    ledger = CompileLedger(knobs.compilation.listener)
    knobs.compilation.listener = ledger
    return ledger


def uninstall_compile_ledger(ledger: CompileLedger | None) -> None:
    """Give Triton back the listener ``ledger`` replaced, if ``ledger`` still listens (a pytest run inside a longer
    process, whose ledger must not stay that process's)."""
    if ledger is not None and installed_compile_ledger() is ledger:
        from triton import knobs

        knobs.compilation.listener = ledger.previous


# ---------------------------------------------------------------- reading a report


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def startup_lines(meta: dict, item_starts: list[float], item_ends: list[float]) -> list[str]:
    """Seconds from the controller's start (or the earliest worker's) to each phase, in time order: min / median /
    max over the workers, and the first item's start and the last item's end; [] for a report without phases."""
    workers = meta.get("worker_phases") or {}
    controller = meta.get("phases") or {}
    starts = [t for t in [controller.get("process_start")] + [p.get("process_start") for p in workers.values()]
              if t is not None]
    if not starts:
        return []
    zero = controller.get("process_start") or min(starts)
    rows: list[tuple[str, list[float]]] = []
    for name in PHASES[1:]:
        if controller.get(name) is not None:
            rows.append((f"controller {PHASE_TITLES[name]}", [controller[name] - zero]))
    for name in PHASES:
        values = [p[name] - zero for p in workers.values() if p.get(name) is not None]
        if values:
            rows.append((f"workers {PHASE_TITLES[name]}", values))
    if item_starts:
        rows += [("first item started", [min(item_starts) - zero]), ("last item ended", [max(item_ends) - zero])]
    rows.sort(key=lambda row: statistics.median(row[1]))
    origin = "the controller" if controller.get("process_start") else "the first worker"
    lines = [f"start-up and end: s after {origin} started ({len(workers)} workers: min / median / max)"]
    lines += [f"  {label:<36} {_spread(values):>20}" for label, values in rows]
    return lines


def origin_group(nodeid: str) -> str:
    """Where a compile came from, coarsely: the test file, or ``cases (<check>)`` for a case item (its warmup)."""
    path, _, rest = nodeid.partition("::")
    if not nodeid:
        return "(outside items)"
    if path.endswith((".yaml", ".yml")):
        return f"cases ({rest.rsplit('::', 1)[-1]})"
    return path


def _table(title: str, compiles: list[tuple[str, float, bool]], top: int) -> list[str]:
    """Rows of (group, seconds, is a repeat), summed per group, costliest first."""
    rows: dict[str, list] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for group, seconds, repeat in compiles:
        row = rows[group]
        row[0] += 1
        row[1] += seconds
        row[2] += repeat
        row[3] += seconds if repeat else 0.0
    lines = [f"  {title:<44} {'compiles':>8} {'total s':>8} {'mean s':>7} {'repeats':>8} {'repeat s':>9}"]
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][1])
    for key, (n, seconds, reps, rep_s) in ranked[:top]:
        lines.append(f"  {key:<44} {n:>8} {seconds:>8.1f} {seconds / n:>7.2f} {reps:>8} {rep_s:>9.1f}")
    rest = [row for _, row in ranked[top:]]
    if rest:
        what = f"{sum(r[0] for r in rest)} compiles, {sum(r[1] for r in rest):.1f}s"
        lines.append(f"  {more_rows_line(len(rest), what, len(ranked))}")
    return lines


def compile_lines(meta: dict, top: int = 8) -> list[str]:
    """Compile time over all workers, and the binaries more than one worker (or one twice) compiled: of a binary's
    compiles the cheapest counts as needed, the others as repeats (work the shared disk cache did not save). By
    kernel, and by what was running (``origin_group``); [] without a ledger or without compiles."""
    ledgers = meta.get("worker_compiles") or {}
    per_hash: dict[str, list[tuple[float, str, str]]] = defaultdict(list)  # digest -> [(seconds, kernel, origin)]
    loaded = sum(int(v.get("loaded", 0)) for v in ledgers.values())
    load_seconds = sum(float(v.get("load_seconds", 0.0)) for v in ledgers.values())
    for ledger in ledgers.values():
        for digest, (kernel, count, seconds, *origin) in ledger.get("compiled", {}).items():
            per_hash[digest] += [(seconds / count, kernel, origin_group(origin[0] if origin else ""))] * count
    if not per_hash:
        return []
    by_kernel, by_origin = [], []
    for compiles in per_hash.values():
        for rank, (seconds, kernel, origin) in enumerate(sorted(compiles)):
            by_kernel.append((kernel, seconds, rank > 0))
            by_origin.append((origin, seconds, rank > 0))
    total = sum(seconds for _, seconds, _ in by_kernel)
    repeats = [seconds for _, seconds, repeat in by_kernel if repeat]
    lines = [f"compiles: {len(by_kernel)} in {total:.1f}s over {len(ledgers)} processes, {len(per_hash)} distinct "
             f"binaries; {len(repeats)} repeats of a binary compiled elsewhere too cost {sum(repeats):.1f}s;"
             f" {loaded} loads from the disk cache in {load_seconds:.1f}s"]
    claims = defaultdict(float)
    for ledger in ledgers.values():
        for key, value in (ledger.get("claims") or {}).items():
            claims[key] += value
    if any(claims.values()):  # harness.compile_claims, the warmups' shared compiles
        lines.append(f"warmup claims: {claims['claimed']:.0f} specs compiled under a worker's own claim, "
                     f"{claims['found_done']:.0f} found done by another, {claims['deferred']:.0f} put aside while "
                     f"another compiled them (waited {claims['wait_seconds']:.1f}s in all)")
    return lines + _table("kernel", by_kernel, top) + _table("compiled during", by_origin, top) + _key_lines(ledgers)


def _key_lines(ledgers: dict) -> list[str]:
    """A line per jit function that one run compiled under more than one cache key for one source: the processes
    disagreed on its key (Triton keys a function hashed before the functions it calls without their constexpr
    globals; or a global it reads differed), so each compiled its binaries under its own and the shared disk cache
    could not serve the others. Ledgers of reports without the digests give nothing."""
    keys: dict[tuple[str, str], set[str]] = defaultdict(set)
    compiles: dict[tuple[str, str], int] = defaultdict(int)
    for ledger in ledgers.values():
        for kernel, count, _seconds, *rest in ledger.get("compiled", {}).values():
            source, key = (rest[1:3] + ["", ""])[:2]
            if source and key:
                keys[kernel, source].add(key)
                compiles[kernel, source] += count
    unstable = sorted((kernel, len(found), compiles[kernel, source]) for (kernel, source), found in keys.items()
                      if len(found) > 1)
    return [f"cache keys: {kernel}: one source compiled under {n} keys in {c} compiles (processes disagreed on its "
            "key: each compiled what another had cached)" for kernel, n, c in unstable]
