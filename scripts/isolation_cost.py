"""What process isolation costs a cold GPU suite, from one ``scripts/gpu_run.sh`` call's outputs (issue 15's criterion:
the same tests within 10% of the baseline's cold time).

    python scripts/isolation_cost.py OUT_DIR

OUT_DIR holds the steps' logs and reports: ``baseline*`` (the older tree's run of its own tests), ``suite-same*``
(this tree on the baseline's test files, isolated) and ``suite-same-noiso*`` (the same with ``--isolation none``),
as the ``isolation-cost`` step writes them. Per step, in the order they ran: pytest's wall time, the item time summed
over the node ids every step ran (so the tests added since the baseline do not count), split into case items and
other tests, and where the step recorded them the host's CPU (``<step>-cpu.log``: user, system and idle core seconds
from /proc/stat), the CPU of the run's own processes (the report's ``worker_cpu`` and each worker's running child)
and the CUDA contexts they made (workers that made their own, ``worker_roles``, and every child started), and the
tail: how long the last worker ran on after the median one had finished (a straggler handed out late).
Then the medians per kind of step and their ratios: one pair of steps differs by as much as isolation costs (the
same code, one call: up to 13%, docs/gpu-runs.md run 67), so only medians of alternating steps mean anything.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

KINDS = ("baseline", "suite-same-noiso", "suite-same")  # longest prefix first: a noiso step is not a suite-same one
WALL = re.compile(r" in ([0-9.]+)s(?: \(|\s*=*\s*$)")


def step_kind(name: str) -> str | None:
    return next((kind for kind in KINDS if name == kind or name.startswith(kind + "-")), None)


def pytest_wall(log: Path) -> float | None:
    """pytest's own ``in N.NNs`` from the last summary line of a step's log."""
    if not log.exists():
        return None
    found = [float(m.group(1)) for line in log.read_text(errors="replace").splitlines()
             if (m := WALL.search(line)) and ("passed" in line or "failed" in line)]
    return found[-1] if found else None


def host_cpu(log: Path) -> dict | None:
    """User, system and idle core seconds between the first and the last /proc/stat sample of ``log``."""
    if not log.exists():
        return None
    rows = []
    for line in log.read_text().splitlines():
        fields = line.split()
        if len(fields) > 6 and fields[1] == "cpu":
            rows.append([int(x) for x in fields[2:]])
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    delta = [b - a for a, b in zip(first, last, strict=True)]
    ticks = 100.0  # USER_HZ: /proc/stat counts in 1/100 s on Linux
    return {"user": (delta[0] + delta[1]) / ticks, "system": delta[2] / ticks, "idle": (delta[3] + delta[4]) / ticks}


def run_processes_cpu(meta: dict) -> dict | None:
    """The run's own processes: every worker's CPU and its running child's (user, system), summed."""
    workers = meta.get("worker_cpu") or {}
    if not workers:
        return None
    children = [w["starts"][-1].get("cpu") for w in (meta.get("worker_isolation") or {}).values()
                if w and w.get("starts")]
    every = list(workers.values()) + [c for c in children if c]
    return {"user": sum(c["user"] for c in every), "system": sum(c["system"] for c in every),
            "children": sum(1 for c in children if c)}


def contexts(meta: dict) -> int | None:
    """CUDA contexts the run made: workers that made their own (``worker_roles``) plus every child started; None
    for a report without roles (the baseline's)."""
    roles = meta.get("worker_roles")
    if not roles:
        return None
    children = sum(len(w.get("starts") or []) for w in (meta.get("worker_isolation") or {}).values() if w)
    return sum(1 for r in roles.values() if r and r.get("cuda_context")) + children


def tail(items: list[dict]) -> float | None:
    """Seconds from the median worker's last item end to the run's last item end: a straggler (an item handed out
    late that runs long) shows here, not in the item time."""
    ends: dict[str, float] = {}
    for item in items:
        if item.get("start") is not None and item.get("worker"):
            end = item["start"] + (item.get("duration") or 0.0)
            ends[item["worker"]] = max(ends.get(item["worker"], end), end)
    return max(ends.values()) - statistics.median(ends.values()) if ends else None


def load_steps(out: Path) -> list[dict]:
    """The steps found in ``out``, in the order they ran (their reports' modification times)."""
    steps = []
    for report in out.glob("*-report.json"):
        name = report.name[: -len("-report.json")]
        kind = step_kind(name)
        if kind is None:
            continue
        data = json.loads(report.read_text())
        steps.append({"name": name, "kind": kind, "mtime": report.stat().st_mtime,
                      "items": {i["nodeid"]: i.get("duration") or 0.0 for i in data.get("items", [])},
                      "wall": pytest_wall(out / f"{name}.log"), "host": host_cpu(out / f"{name}-cpu.log"),
                      "processes": run_processes_cpu(data.get("meta", {})), "contexts": contexts(data.get("meta", {})),
                      "tail": tail(data.get("items", []))})
    return sorted(steps, key=lambda s: s["mtime"])


def summarize(steps: list[dict]) -> list[str]:
    if not steps:
        return ["no baseline, suite-same or suite-same-noiso reports found"]
    common = set.intersection(*(set(s["items"]) for s in steps))
    lines = [f"{len(common)} node ids ran in every step; item seconds summed over them",
             f"{'step':<24} {'wall s':>7} {'items s':>8} {'cases s':>8} {'tests s':>8} {'host usr/sys/idle':>20} "
             f"{'procs usr/sys':>14} {'contexts':>8} {'tail s':>6}"]
    for s in steps:
        cases = sum(s["items"][k] for k in common if k.startswith("cases/"))
        total = sum(s["items"][k] for k in common)
        s["total"] = total
        host = "/".join(f"{s['host'][k]:.0f}" for k in ("user", "system", "idle")) if s["host"] else "-"
        procs = f"{s['processes']['user']:.0f}/{s['processes']['system']:.0f}" if s["processes"] else "-"
        wall = f"{s['wall']:.1f}" if s["wall"] is not None else "-"
        made = "-" if s["contexts"] is None else str(s["contexts"])
        late = "-" if s["tail"] is None else f"{s['tail']:.1f}"
        lines.append(f"{s['name']:<24} {wall:>7} {total:>8.1f} {cases:>8.1f} {total - cases:>8.1f} {host:>20} "
                     f"{procs:>14} {made:>8} {late:>6}")
    medians = {}
    for kind in KINDS:
        mine = [s for s in steps if s["kind"] == kind]
        if mine:
            walls = [s["wall"] for s in mine if s["wall"] is not None]
            medians[kind] = (statistics.median(walls) if walls else None,
                             statistics.median(s["total"] for s in mine), len(mine))
    lines.append("median per kind (wall s, items s, steps): " + ", ".join(
        f"{k} {w if w is None else round(w, 1)} / {t:.1f} / {n}" for k, (w, t, n) in medians.items()))
    for a, b in (("suite-same", "baseline"), ("suite-same", "suite-same-noiso"), ("suite-same-noiso", "baseline")):
        if a in medians and b in medians:
            wall = (f"{medians[a][0] / medians[b][0]:.2f}x" if medians[a][0] and medians[b][0] else "-")
            lines.append(f"{a} / {b}: wall {wall}, item time {medians[a][1] / medians[b][1]:.2f}x")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    print("\n".join(summarize(load_steps(Path(argv[0])))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
