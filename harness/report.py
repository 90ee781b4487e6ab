"""The run report: one record per ``<file>::<case id>::<check>`` item, merged across xdist workers, as JSON, plus
the short terminal summary that groups failures by check and by case family.

Each xdist worker appends every record, as it is decided, to ``<report>.parts/<run>.<worker>.jsonl`` (so a run killed
by a time limit still leaves what it did) and writes ``<report>.parts/<run>.<worker>.json`` when its session ends;
the controller merges its own run's parts (``merge_parts``) and writes one file. ``<run>`` is unique per run
(``new_run_id``), so two runs sharing a report path never read, mix or remove each other's parts. ``read_parts``
recovers a killed run from its live files without writing anything. The CLI writes the same model, live as well
(``LiveReport``). Every file is written beside its target under a name of its own and renamed into place
(``write_atomic``); a target that is not a regular file, or not a report, is refused (``refuse_unsafe_target``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
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


class UnsafeTarget(ValueError):
    """An output path whose current content this harness must not replace."""


def refuse_unsafe_target(path: str | os.PathLike, what: str = "report", inputs: tuple = ()) -> None:
    """Raise ``UnsafeTarget`` where writing ``path`` would destroy something: a folder, a device, a FIFO or a socket
    (renaming a regular file over ``/dev/null`` replaces the null device for the whole machine), one of ``inputs``
    (the case files being run, the report being read), or, for ``what="report"``, an existing non-empty file that is
    not a report of this harness (a case file given as the report by mistake)."""
    path = Path(path)
    if any(Path(given).resolve() == path.resolve() for given in inputs):  # also a report read from its parts only
        raise UnsafeTarget(f"{path}: is also an input of this command; it is not overwritten")
    try:
        st = path.stat()
    except OSError:  # nothing there to destroy (missing, or under a file): the write itself says why it fails
        return
    if stat.S_ISDIR(st.st_mode):
        raise UnsafeTarget(f"{path}: is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeTarget(f"{path}: is not a regular file (a device, FIFO or socket); it is not replaced")
    for given in inputs:
        if Path(given).exists() and path.samefile(given):
            raise UnsafeTarget(f"{path}: is also an input of this command; it is not overwritten")
    if what == "report" and st.st_size and not _is_report(path):
        raise UnsafeTarget(f"{path}: exists and is not an ssd-harness report; it is not overwritten")


def _is_report(path: Path) -> bool:
    """The schema line comes first in every report this module writes (``Report.to_dict``, ``write_durations``)."""
    with open(path, "rb") as fh:
        head = fh.read(200)
    return REPORT_SCHEMA.split("/", 1)[0].encode() in head


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` through a file unique to this call next to ``path``, renamed into place: readers never see a
    half-written file, two writers never share the temporary file, and a failed write (a full disk) leaves the
    target as it was; the temporary file is removed on any failure. A target that is not a regular file is refused
    (``refuse_unsafe_target``), never replaced."""
    path = Path(path)
    refuse_unsafe_target(path, what="file")
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would make the file private to this user
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)
    return path


def item_count(records: list[ItemRecord]) -> int:
    """The records of items (``<file>::...``), leaving out the files that could not be collected (``<file>``)."""
    return sum(1 for r in records if "::" in r.nodeid)


def unfinished_reason(meta: dict, reported: int) -> str:
    """Why the run a report describes did not finish, from its meta, or "" where it did (or an older report does not
    say): interrupted, stopped by an error, processes that never wrote their final part (killed), or fewer items
    reported than collected."""
    reasons = []
    if meta.get("interrupted"):
        reasons.append("interrupted")
    if meta.get("aborted"):
        reasons.append(f"stopped: {meta['aborted']}")
    crashed = meta.get("crashed_workers") or {}  # their items are errors already: the run went on without them
    killed = [w for w in meta.get("unfinished_workers") or () if w not in crashed]
    if killed:
        reasons.append(f"killed before its end ({', '.join(killed)} never wrote a final part)")
    collected = meta.get("collected")
    if isinstance(collected, int) and reported < collected:
        reasons.append(f"{reported} of {collected} collected items reported")
    return "; ".join(reasons)


@dataclass
class Report:
    items: list[ItemRecord] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(r.outcome for r in self.items).items()))

    @property
    def failures(self) -> list[ItemRecord]:
        return [r for r in self.items if r.is_failure]

    @property
    def unfinished(self) -> str:
        """Why the run did not finish ("" where it did): ``unfinished_reason``."""
        return unfinished_reason(self.meta, item_count(self.items))

    def to_dict(self) -> dict:
        return {
            "schema": REPORT_SCHEMA,
            "meta": self.meta,
            "counts": self.counts(),
            "items": [asdict(r) for r in sorted(self.items, key=lambda r: r.nodeid)],
        }

    def write(self, path: str | os.PathLike) -> Path:
        """``write_atomic``, into a folder made where missing: readers never see half a report, and a failed write
        leaves the earlier file."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Report":
        data = json.loads(Path(path).read_text())
        if data.get("schema") != REPORT_SCHEMA:
            raise ValueError(f"{path}: schema: expected {REPORT_SCHEMA}, found {data.get('schema')!r}")
        return cls(items=[ItemRecord(**r) for r in data["items"]], meta=dict(data.get("meta", {})))


def write_durations(records: list[ItemRecord], path: str | os.PathLike, source: str = "", inputs: tuple = ()) -> None:
    """A compact report of node ids, outcomes and durations only (one item per line): what pytest
    ``--durations-from`` needs to order and shard a later run, small enough to keep in the repository. ``path`` is
    refused where it is one of ``inputs`` or holds something other than a report (``refuse_unsafe_target``)."""
    refuse_unsafe_target(path, inputs=tuple(p for p in inputs if p is not None))
    lines = [json.dumps({"nodeid": r.nodeid, "outcome": r.outcome, "duration": round(r.duration, 3)})
             for r in records]
    head = json.dumps({"schema": REPORT_SCHEMA, "meta": {"source": source}})[:-1]
    write_atomic(path, head + ', "items": [\n' + ",\n".join(lines) + "\n]}\n")


def holds_durations_alone(report: Report) -> bool:
    """Whether ``report`` holds no more than ``write_durations`` writes: a source line and each item's node id,
    outcome and duration. Replacing it with the durations merged from it loses nothing; replacing a whole report
    would lose its checks, stats, messages and run facts."""
    return set(report.meta) <= {"source"} and all(r == ItemRecord(r.nodeid, r.outcome, r.duration)
                                                  for r in report.items)


def longest_durations(records: list[ItemRecord], earlier: list[ItemRecord]) -> list[ItemRecord]:
    """``records`` with each duration raised to the item's duration in ``earlier`` where that was longer (and passed
    or failed, not skipped). An item that compiles kernels costs its compile time in whichever process compiles them
    first and little elsewhere, so one run's figure can put a 20 s item last; the longest seen is what to plan for."""
    measured = {r.nodeid: r.duration for r in earlier if r.outcome not in ("skipped", "unsupported")}
    return [replace(r, duration=max(r.duration, measured.get(r.nodeid, 0.0))) for r in records]


def parts_dir(report_path: str | os.PathLike) -> Path:
    return Path(str(report_path) + ".parts")


def new_run_id() -> str:
    """A name for this run's parts, unique among runs sharing a report path (at the same time or one after another):
    the process id, and random bits for process ids reused across machines or containers."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def _part_file(report_path: str | os.PathLike, run: str, worker: str, suffix: str) -> Path:
    return parts_dir(report_path) / f"{run}.{worker}{suffix}"


def _run_and_worker(part: Path) -> tuple[str, str]:
    """``<run>.<worker>.json[l]`` -> (run, worker)."""
    run, _, worker = part.name.removesuffix(".jsonl").removesuffix(".json").partition(".")
    return run, worker


def write_part(report_path: str | os.PathLike, run: str, worker: str, report: Report) -> Path:
    """A worker's share of the report, merged by its run's controller at the end."""
    return report.write(_part_file(report_path, run, worker, ".json"))


def append_live(report_path: str | os.PathLike, run: str, worker: str, record: ItemRecord) -> None:
    """One record as one JSON line, flushed at once (O_APPEND: a line is never interleaved with another's)."""
    part = _part_file(report_path, run, worker, ".jsonl")
    part.parent.mkdir(parents=True, exist_ok=True)
    with open(part, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(asdict(record)) + "\n")


def read_live(path: Path) -> Report:
    """A ``.jsonl`` live part; a last line cut by a kill is dropped."""
    items = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            items.append(ItemRecord(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return Report(items=items, meta={"worker": _run_and_worker(path)[1]})


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


def run_parts(report_path: str | os.PathLike, run: str | None = None) -> tuple[str | None, list[Path]]:
    """The part files of run ``run`` under ``<report>.parts``; with ``run`` None, of the run whose parts were
    written last (a killed run's, read by ``times`` and ``report-html``). Returns (run, files)."""
    folder = parts_dir(report_path)
    files = [p for p in folder.iterdir() if p.name.endswith((".json", ".jsonl"))] if folder.is_dir() else []
    if run is None and files:
        run = _run_and_worker(max(files, key=lambda p: p.stat().st_mtime))[0]
    return run, sorted(p for p in files if _run_and_worker(p)[0] == run)


def read_parts(report_path: str | os.PathLike, run: str | None = None, meta: dict | None = None,
               overrides: list[ItemRecord] = ()) -> tuple[Report, list[Path]]:
    """Merge run ``run``'s ``<run>.<worker>.json`` parts, and the live ``.jsonl`` of any worker that never wrote its
    ``.json`` (killed, named in meta ``unfinished_workers``); ``overrides`` (the controller's records of crashed
    workers' items) replace any worker's record of the same item. Writes nothing; returns the report and the files
    read."""
    run, files = run_parts(report_path, run)
    part_files = [p for p in files if p.name.endswith(".json")]
    finished = {_run_and_worker(p)[1] for p in part_files}
    unfinished = [p for p in files if p.name.endswith(".jsonl") and _run_and_worker(p)[1] not in finished]
    reports = [Report.read(p) for p in part_files] + [read_live(p) for p in unfinished]
    merged = merge_reports(reports, meta)
    merged.meta.setdefault("run", run)
    if unfinished:  # workers that never finished (the run was killed): their records are up to the kill
        merged.meta["unfinished_workers"] = sorted(_run_and_worker(p)[1] for p in unfinished)
    if overrides:
        by_id = {r.nodeid: r for r in merged.items}
        by_id.update({r.nodeid: r for r in overrides})
        merged.items = list(by_id.values())
    return merged, files


def merge_parts(report_path: str | os.PathLike, run: str, meta: dict | None = None,
                overrides: list[ItemRecord] = ()) -> Report:
    """``read_parts`` of run ``run``, written to ``<report>``; then that run's parts (only) are removed."""
    merged, files = read_parts(report_path, run, meta, overrides)
    merged.write(report_path)
    for p in files:
        p.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # another run's parts may still be there
        parts_dir(report_path).rmdir()
    return merged


def load_report(path: str | os.PathLike) -> tuple[Report, str]:
    """A report to read (``times``, ``report-html``): the file, or where a run's live parts are newer than it (a run
    that was killed, or is still going), those parts, merged in memory only (the parts stay, and nothing is written
    where the finished report goes). Returns (report, a note saying where it came from, or ""). FileNotFoundError
    where there is neither."""
    path = Path(path)
    run, files = run_parts(path)
    newest_part = max((p.stat().st_mtime for p in files), default=None)
    if path.is_file() and (newest_part is None or newest_part <= path.stat().st_mtime):
        return Report.read(path), ""
    if newest_part is None:
        raise FileNotFoundError(f"{path}: no such report")
    report, _ = read_parts(path, run)
    return report, f"{path}: merged from the live parts of run {run}, which did not finish"


class LiveReport:
    """A report written while its run goes on (the CLI's ``run --json``): created only where the report can be
    written, refused (OSError, ``UnsafeTarget``) before the first item otherwise; each record appended at once, as
    one line, to ``<report>.parts/<run>.<worker>.jsonl`` (what a killed run leaves: ``load_report`` reads it); the
    whole report written by ``finish``, which then removes the live part. Nothing at the path is removed or changed
    before ``finish``: a killed run leaves the earlier report in place and its live part newer than it, which
    ``load_report`` then reads instead."""

    def __init__(self, path: str | os.PathLike, worker: str = "cli", inputs: tuple = ()):
        self.path, self.worker, self.run = Path(path), worker, new_run_id()
        refuse_unsafe_target(self.path, inputs=inputs)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)  # the folder takes the temporary file that Report.write renames into place
        os.unlink(probe)
        self.live = _part_file(self.path, self.run, worker, ".jsonl")
        self.live.parent.mkdir(parents=True, exist_ok=True)
        self.live.write_text("")

    def append(self, record: ItemRecord) -> None:
        append_live(self.path, self.run, self.worker, record)

    def finish(self, report: Report) -> Path:
        path = report.write(self.path)
        self.live.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another run's parts may still be there
            self.live.parent.rmdir()
        return path


def failure_groups(records: list[ItemRecord]) -> tuple[dict[str, list[ItemRecord]], dict[str, list[ItemRecord]]]:
    by_check: dict[str, list[ItemRecord]] = defaultdict(list)
    by_family: dict[str, list[ItemRecord]] = defaultdict(list)
    for r in records:
        if r.is_failure:
            by_check[r.check or "?"].append(r)
            by_family[r.family or "?"].append(r)
    return dict(by_check), dict(by_family)


def summary_lines(records: list[ItemRecord], max_cases: int = 4, unfinished: str = "") -> list[str]:
    """Short summary: outcome counts of case items and of the other tests, then case-item failures grouped by check
    and by family (a few case ids each), then the other tests' failures by node id. ``unfinished``: why the run did
    not finish (``unfinished_reason``); its line replaces "no failures", which an unfinished run never reads as."""
    cases = [r for r in records if r.check]
    others = [r for r in records if not r.check]

    def counted(recs):
        return ", ".join(f"{n} {k}" for k, n in sorted(Counter(r.outcome for r in recs).items())) or "none"

    lines = [f"case items: {counted(cases)}"]
    if others:
        lines.append(f"other tests: {counted(others)}")
    by_check, by_family = failure_groups(cases)
    other_failures = [r.nodeid for r in others if r.is_failure]
    if unfinished:
        lines.append(f"the run did not finish ({unfinished}): not a pass, whatever the items reported say")
    if not by_check and not other_failures:
        lines.append(f"0 failures among the {len(records)} items reported" if unfinished else "no failures")
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


TIMING_GROUPS = ("check", "family", "worker", "file")


def _timing_group(record: ItemRecord, by: str) -> str:
    """The group ``record`` counts in: its file (the node id's path: a case file or a Python test file), or its
    check, family or worker ("(other tests)" for a Python test, which has no check or family)."""
    if by == "file":
        return record.nodeid.split("::", 1)[0]
    return getattr(record, by) or "(other tests)"


def timing_lines(records: list[ItemRecord], by: str = "check", top: int = 15) -> list[str]:
    """Where a suite spends its time: total, count, mean and max item seconds per ``by`` (one of ``TIMING_GROUPS``),
    slowest group first; skipped items are left out (they cost nothing and would dilute the means).
    ``ends at s``: when the group's last item ended, counted from the first item's start (by worker: when each
    worker finished; "-" for records without start times)."""
    if by not in TIMING_GROUPS:
        raise ValueError(f"timing_lines: by: expected one of {', '.join(TIMING_GROUPS)}, found {by!r}")
    groups: dict[str, list[float]] = defaultdict(list)
    ends: dict[str, float] = {}
    first_start = min((r.start for r in records if r.start is not None), default=None)
    for r in records:
        if r.outcome in ("skipped", "unsupported"):
            continue
        key = _timing_group(r, by)
        groups[key].append(r.duration)
        if r.start is not None:
            ends[key] = max(ends.get(key, 0.0), r.start + r.duration - first_start)
    total = sum(sum(v) for v in groups.values())
    lines = [f"time by {by}: {total:.1f}s in {sum(len(v) for v in groups.values())} items run"]
    ranked = sorted(groups.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
    width = max([24] + [len(key) for key, _ in ranked[:top]])  # a test file's path can be longer than a check's name
    lines.append(f"  {by:<{width}} {'total s':>9} {'share':>6} {'items':>6} {'mean s':>8} {'max s':>8} "
                 f"{'ends at s':>10}")
    for key, times in ranked[:top]:
        share = sum(times) / total if total else 0.0
        end = f"{ends[key]:.1f}" if key in ends else "-"
        lines.append(f"  {key:<{width}} {sum(times):>9.1f} {share:>6.1%} {len(times):>6} "
                     f"{sum(times) / len(times):>8.2f} {max(times):>8.2f} {end:>10}")
    rest = [t for _, times in ranked[top:] for t in times]
    if rest:
        share = sum(rest) / total if total else 0.0
        lines.append(f"  {more_rows_line(len(ranked) - top, f'{sum(rest):.1f}s, {share:.1%}', len(ranked))}")
    return lines


def more_rows_line(left_out: int, what: str, every: int) -> str:
    """The line a table cut at ``--top`` ends with: how many rows it left out and what they hold, so that no row
    is dropped unsaid."""
    return f"(+{left_out} more, {what}; --top {every} lists every one)"
