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

import os
import statistics
import time
from collections import defaultdict

PHASES = ("process_start", "configured", "collected", "session_end")
PHASE_TITLES = {
    "process_start": "process started",
    "configured": "configured (imports done)",
    "collected": "collected",
    "session_end": "session ended",
}


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
    """A ``knobs.compilation.listener``: real compiles by binary hash ({hash: [kernel, count, seconds]}) and the
    disk-cache loads. Calls the listener it replaced, so another tool's listener keeps working."""

    def __init__(self, previous=None):
        self.previous = previous
        self.compiled: dict[str, list] = {}
        self.loaded = 0
        self.load_seconds = 0.0

    def __call__(self, *, src, metadata, metadata_group, times, cache_hit, **kwargs):
        seconds = times.total / 1e6  # CompileTimes are in microseconds
        if cache_hit:
            self.loaded += 1
            self.load_seconds += seconds
        else:
            entry = self.compiled.setdefault(str(metadata.get("hash", ""))[:16], [getattr(src, "name", "?"), 0, 0.0])
            entry[1] += 1
            entry[2] += seconds
        if self.previous is not None:
            self.previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                          cache_hit=cache_hit, **kwargs)

    def to_dict(self) -> dict:
        return {"compiled": {h: [k, n, round(s, 4)] for h, (k, n, s) in self.compiled.items()},
                "loaded": self.loaded, "load_seconds": round(self.load_seconds, 4)}


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


def compile_lines(meta: dict, top: int = 8) -> list[str]:
    """Compile time over all workers, the binaries more than one worker (or one twice) compiled and what those
    repeats cost (each binary's cheapest compile counts as needed), and the costliest kernels; [] without a
    ledger or without compiles."""
    ledgers = meta.get("worker_compiles") or {}
    per_hash: dict[str, list[float]] = defaultdict(list)
    kernel_of: dict[str, str] = {}
    loaded = sum(int(v.get("loaded", 0)) for v in ledgers.values())
    load_seconds = sum(float(v.get("load_seconds", 0.0)) for v in ledgers.values())
    for ledger in ledgers.values():
        for digest, (kernel, count, seconds) in ledger.get("compiled", {}).items():
            per_hash[digest].extend([seconds / count] * count)
            kernel_of[digest] = kernel
    if not per_hash:
        return []
    total = sum(sum(v) for v in per_hash.values())
    compiles = sum(len(v) for v in per_hash.values())
    repeats = compiles - len(per_hash)
    repeat_seconds = sum(sum(v) - min(v) for v in per_hash.values())
    lines = [f"compiles: {compiles} in {total:.1f}s over {len(ledgers)} processes, {len(per_hash)} distinct binaries;"
             f" {repeats} repeats of a binary compiled elsewhere too cost {repeat_seconds:.1f}s;"
             f" {loaded} loads from the disk cache in {load_seconds:.1f}s"]
    by_kernel: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for digest, times in per_hash.items():
        row = by_kernel[kernel_of[digest]]
        row[0] += len(times)
        row[1] += sum(times)
        row[2] += len(times) - 1
        row[3] += sum(times) - min(times)
    lines.append(f"  {'kernel':<34} {'compiles':>8} {'total s':>8} {'mean s':>7} {'repeats':>8} {'repeat s':>9}")
    for kernel, (n, seconds, reps, rep_s) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"  {kernel:<34} {n:>8} {seconds:>8.1f} {seconds / n:>7.2f} {reps:>8} {rep_s:>9.1f}")
    return lines
