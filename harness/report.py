"""The run report: one record per ``<file>::<case id>::<check>`` item, merged across xdist workers, as JSON, plus
the short terminal summary that groups failures by check and by case family.

Each xdist worker appends every record, as it is decided, to ``<report>.parts/<worker>.jsonl`` (so a run killed by a
time limit still leaves what it did) and writes ``<report>.parts/<worker>.json`` when its session ends; the
controller merges the parts (``merge_parts``) and writes one file. ``merge_parts`` also recovers a killed run from
the live files. The CLI writes the same model, live as well (``LiveReport``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

FAILURE_OUTCOMES = ("failed", "error", "xpassed")
MESSAGE_CHARS = 8000
REPORT_SCHEMA = "ssd-harness-report/1"
# A part's meta that differs per worker, and where the merged report keeps it by worker: the GPU it was pinned to,
# its start-up phases, its compile ledger, its CPU so far (harness.timeline), and its role (which kind of items it
# was for, and whether it made a CUDA context of its own).
PER_WORKER_META = {"gpu": "worker_gpus", "phases": "worker_phases", "compiles": "worker_compiles",
                   "isolation": "worker_isolation", "cpu": "worker_cpu", "role": "worker_roles"}


@dataclass
class ItemRecord:
    """One item's outcome. ``outcome``: passed | failed | error | skipped | unsupported | xfailed | xpassed."""

    nodeid: str
    outcome: str
    duration: float = 0.0
    case_id: str = ""
    check: str = ""
    family: str = ""
    source: str = ""
    seed: int | None = None
    max_ulp: int | None = None
    bound_use: float | None = None  # a bounded check's largest error / bound (harness.compare)
    reason: str = ""  # why skipped / unsupported / xfailed
    summary: str = ""  # what differed, one line
    repro: str = ""
    worker: str = ""
    message: str = ""  # a failure's full report (capped at MESSAGE_CHARS)
    start: float | None = None  # when its setup began (epoch seconds): the report is sorted by node id, not by time

    @property
    def is_failure(self) -> bool:
        return self.outcome in FAILURE_OUTCOMES


@dataclass
class Report:
    items: list[ItemRecord] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(r.outcome for r in self.items).items()))

    @property
    def failures(self) -> list[ItemRecord]:
        return [r for r in self.items if r.is_failure]

    def to_dict(self) -> dict:
        return {
            "schema": REPORT_SCHEMA,
            "meta": self.meta,
            "counts": self.counts(),
            "items": [asdict(r) for r in sorted(self.items, key=lambda r: r.nodeid)],
        }

    def write(self, path: str | os.PathLike) -> Path:
        """Write through a file unique to this call next to ``path``, renamed into place (readers never see half a
        report, and two runs writing the same report never share the temporary file); removed on any failure."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o644)  # mkstemp's 0600 would make the report private to this user
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
            os.replace(name, path)
        finally:
            Path(name).unlink(missing_ok=True)
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Report":
        data = json.loads(Path(path).read_text())
        if data.get("schema") != REPORT_SCHEMA:
            raise ValueError(f"{path}: schema: expected {REPORT_SCHEMA}, found {data.get('schema')!r}")
        return cls(items=[ItemRecord(**r) for r in data["items"]], meta=dict(data.get("meta", {})))


def write_durations(records: list[ItemRecord], path: str | os.PathLike, source: str = "") -> None:
    """A compact report of node ids, outcomes and durations only (one item per line): what pytest
    ``--durations-from`` needs to order and shard a later run, small enough to keep in the repository."""
    lines = [json.dumps({"nodeid": r.nodeid, "outcome": r.outcome, "duration": round(r.duration, 3)})
             for r in records]
    head = json.dumps({"schema": REPORT_SCHEMA, "meta": {"source": source}})[:-1]
    Path(path).write_text(head + ', "items": [\n' + ",\n".join(lines) + "\n]}\n")


def longest_durations(records: list[ItemRecord], earlier: list[ItemRecord]) -> list[ItemRecord]:
    """``records`` with each duration raised to the item's duration in ``earlier`` where that was longer (and passed
    or failed, not skipped). An item that compiles kernels costs its compile time in whichever process compiles them
    first and little elsewhere, so one run's figure can put a 20 s item last; the longest seen is what to plan for."""
    measured = {r.nodeid: r.duration for r in earlier if r.outcome not in ("skipped", "unsupported")}
    return [replace(r, duration=max(r.duration, measured.get(r.nodeid, 0.0))) for r in records]


def parts_dir(report_path: str | os.PathLike) -> Path:
    return Path(str(report_path) + ".parts")


def write_part(report_path: str | os.PathLike, worker: str, report: Report) -> Path:
    """A worker's share of the report, merged by the controller at the end."""
    return report.write(parts_dir(report_path) / f"{worker}.json")


def append_live(report_path: str | os.PathLike, worker: str, record: ItemRecord) -> None:
    """One record as one JSON line, flushed at once (O_APPEND: a line is never interleaved with another's)."""
    folder = parts_dir(report_path)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{worker}.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(asdict(record)) + "\n")


def read_live(path: Path) -> Report:
    """A ``.jsonl`` live part; a last line cut by a kill is dropped."""
    items = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            items.append(ItemRecord(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return Report(items=items, meta={"worker": path.stem})


def merge_reports(reports: list[Report], meta: dict | None = None) -> Report:
    """One report from several; an item reported twice (a worker restarted by xdist) keeps its last record."""
    by_id: dict[str, ItemRecord] = {}
    merged_meta: dict = {"workers": []}
    for rep in reports:
        worker = rep.meta.get("worker", "")
        merged_meta["workers"].append(worker)
        for key, merged_key in PER_WORKER_META.items():
            if rep.meta.get(key) is not None:
                merged_meta.setdefault(merged_key, {})[worker] = rep.meta[key]
        for rec in rep.items:
            by_id[rec.nodeid] = rec
        for key, value in rep.meta.items():
            if key != "worker" and key not in PER_WORKER_META:
                merged_meta.setdefault(key, value)
    merged_meta["workers"] = sorted(w for w in merged_meta["workers"] if w)
    merged_meta.update(meta or {})
    return Report(items=list(by_id.values()), meta=merged_meta)


def merge_parts(report_path: str | os.PathLike, meta: dict | None = None, remove: bool = True) -> Report:
    """Merge every ``<report>.parts/<worker>.json`` into ``<report>``, and the live ``<worker>.jsonl`` of any worker
    that never wrote its ``.json`` (killed); returns the merged report."""
    folder = parts_dir(report_path)
    part_files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    live_files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    finished = {p.stem for p in part_files}
    reports = [Report.read(p) for p in part_files]
    unfinished = [p for p in live_files if p.stem not in finished]
    reports += [read_live(p) for p in unfinished]
    merged = merge_reports(reports, meta)
    if unfinished:  # workers that never finished (the run was killed): their records are up to the kill
        merged.meta["unfinished_workers"] = sorted(p.stem for p in unfinished)
    merged.write(report_path)
    if remove:
        for p in part_files + live_files:
            p.unlink()
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return merged


class LiveReport:
    """A report written while its run goes on (the CLI's ``run --json``): created only where the report can be
    written, refused (OSError) before the first item otherwise; each record appended at once, as one line, to
    ``<report>.parts/<worker>.jsonl`` (what a killed run leaves: ``merge_parts`` and ``harness times`` read it);
    the whole report written by ``finish``, which then removes the live part. A report left by an earlier run at
    the same path is removed at the start, so that a killed run never leaves one that reads as its own."""

    def __init__(self, path: str | os.PathLike, worker: str = "cli"):
        self.path, self.worker = Path(path), worker
        if self.path.is_dir():
            raise IsADirectoryError(f"{self.path}: is a folder, not a file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        probe = self.path.with_name(self.path.name + ".tmp")  # the file Report.write renames into place
        probe.write_text("")
        probe.unlink()
        self.path.unlink(missing_ok=True)
        clear_parts(self.path)
        self.live = parts_dir(self.path) / f"{worker}.jsonl"
        self.live.parent.mkdir(parents=True, exist_ok=True)
        self.live.write_text("")

    def append(self, record: ItemRecord) -> None:
        append_live(self.path, self.worker, record)

    def finish(self, report: Report) -> Path:
        path = report.write(self.path)
        self.live.unlink(missing_ok=True)
        if not any(self.live.parent.iterdir()):
            self.live.parent.rmdir()
        return path


def clear_parts(report_path: str | os.PathLike) -> None:
    """Stale parts from an earlier run must not leak into this one (called before workers start)."""
    folder = parts_dir(report_path)
    if folder.is_dir():
        for p in [*folder.glob("*.json"), *folder.glob("*.jsonl")]:
            p.unlink()


def failure_groups(records: list[ItemRecord]) -> tuple[dict[str, list[ItemRecord]], dict[str, list[ItemRecord]]]:
    by_check: dict[str, list[ItemRecord]] = defaultdict(list)
    by_family: dict[str, list[ItemRecord]] = defaultdict(list)
    for r in records:
        if r.is_failure:
            by_check[r.check or "?"].append(r)
            by_family[r.family or "?"].append(r)
    return dict(by_check), dict(by_family)


def summary_lines(records: list[ItemRecord], max_cases: int = 4) -> list[str]:
    """Short summary: outcome counts of case items and of the other tests, then case-item failures grouped by check
    and by family (a few case ids each), then the other tests' failures by node id."""
    cases = [r for r in records if r.check]
    others = [r for r in records if not r.check]

    def counted(recs):
        return ", ".join(f"{n} {k}" for k, n in sorted(Counter(r.outcome for r in recs).items())) or "none"

    lines = [f"case items: {counted(cases)}"]
    if others:
        lines.append(f"other tests: {counted(others)}")
    by_check, by_family = failure_groups(cases)
    other_failures = [r.nodeid for r in others if r.is_failure]
    if not by_check and not other_failures:
        lines.append("no failures")
        return lines
    for title, groups in (("failures by check", by_check), ("failures by case family", by_family)):
        if not groups:
            continue
        lines.append(f"{title}:")
        for key, recs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            ids = sorted({r.case_id for r in recs})
            more = f" (+{len(ids) - max_cases} more)" if len(ids) > max_cases else ""
            lines.append(f"  {key:<24} {len(recs):>4}  {', '.join(ids[:max_cases])}{more}")
    if other_failures:
        lines.append("other test failures:")
        lines.extend(f"  {nodeid}" for nodeid in other_failures[:max_cases * 5])
        if len(other_failures) > max_cases * 5:
            lines.append(f"  (+{len(other_failures) - max_cases * 5} more)")
    return lines


def timing_lines(records: list[ItemRecord], by: str = "check", top: int = 15) -> list[str]:
    """Where a suite spends its time: total, count, mean and max item seconds per ``by`` (check, family, or
    worker), slowest group first; skipped items are left out (they cost nothing and would dilute the means).
    ``ends at s``: when the group's last item ended, counted from the first item's start (by worker: when each
    worker finished; "-" for records without start times)."""
    if by not in ("check", "family", "worker"):
        raise ValueError(f"timing_lines: by: expected check, family or worker, found {by!r}")
    groups: dict[str, list[float]] = defaultdict(list)
    ends: dict[str, float] = {}
    first_start = min((r.start for r in records if r.start is not None), default=None)
    for r in records:
        if r.outcome in ("skipped", "unsupported"):
            continue
        key = getattr(r, by) or "(other tests)"
        groups[key].append(r.duration)
        if r.start is not None:
            ends[key] = max(ends.get(key, 0.0), r.start + r.duration - first_start)
    total = sum(sum(v) for v in groups.values())
    lines = [f"time by {by}: {total:.1f}s in {sum(len(v) for v in groups.values())} items run"]
    lines.append(f"  {by:<24} {'total s':>9} {'share':>6} {'items':>6} {'mean s':>8} {'max s':>8} {'ends at s':>10}")
    for key, times in sorted(groups.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:top]:
        share = sum(times) / total if total else 0.0
        end = f"{ends[key]:.1f}" if key in ends else "-"
        lines.append(f"  {key:<24} {sum(times):>9.1f} {share:>6.1%} {len(times):>6} "
                     f"{sum(times) / len(times):>8.2f} {max(times):>8.2f} {end:>10}")
    return lines
