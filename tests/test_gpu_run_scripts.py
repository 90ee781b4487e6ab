"""The GPU runner's scripts: scripts/gpu_run.sh's step check, and scripts/isolation_cost.py (the medians of a call's
alternating baseline / isolated / non-isolated steps)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "isolation_cost", Path(__file__).resolve().parents[1] / "scripts" / "isolation_cost.py")
isolation_cost = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(isolation_cost)


def _step(out: Path, name: str, when: int, durations: dict, wall: float, meta: dict | None = None,
          cpu: list[list[int]] | None = None) -> None:
    items = [{"nodeid": k, "duration": v, "outcome": "passed", "worker": f"gw{n % 2}", "start": when * 100.0 + n}
             for n, (k, v) in enumerate(durations.items())]
    report = out / f"{name}-report.json"
    report.write_text(json.dumps({"items": items, "meta": meta or {}}))
    os.utime(report, (when, when))
    (out / f"{name}.log").write_text(f"stuff\n{len(items)} passed, 3 skipped, 2 warnings in {wall}s\n")
    if cpu:
        (out / f"{name}-cpu.log").write_text("".join(f"{t}.0 cpu {' '.join(map(str, row))}\n"
                                                     for t, row in enumerate(cpu)))


def test_medians_over_the_node_ids_every_step_ran(tmp_path):
    shared = {"cases/a.yaml::c::determinism": 1.0, "tests/test_x.py::t": 2.0}
    _step(tmp_path, "baseline", 1, shared, 30.0)
    _step(tmp_path, "suite-same", 2, {**shared, "tests/test_new.py::t": 50.0}, 36.0,
          meta={"worker_cpu": {"gw0": {"user": 10.0, "system": 1.0}, "gw1": {"user": 0.0, "system": 0.0}},
                "worker_isolation": {"gw0": {"starts": [{"how": "fork", "cpu": {"user": 5.0, "system": 2.0}}]},
                                     "gw1": None},
                "worker_roles": {"gw0": {"role": "cases", "cuda_context": False},
                                 "gw1": {"role": "tests", "cuda_context": True}}},
          cpu=[[0] * 8, [1000, 0, 200, 300, 0, 0, 0, 0]])
    _step(tmp_path, "suite-same-noiso", 3, {k: v * 0.5 for k, v in shared.items()}, 31.0)
    _step(tmp_path, "baseline-2", 4, shared, 34.0)
    _step(tmp_path, "suite-same-2", 5, {k: v * 2 for k, v in shared.items()}, 40.0)
    _step(tmp_path, "suite-same-noiso-2", 6, shared, 33.0)
    _step(tmp_path, "suite", 7, shared, 99.0)  # another kind of step: not part of the comparison
    steps = isolation_cost.load_steps(tmp_path)
    assert [s["name"] for s in steps] == ["baseline", "suite-same", "suite-same-noiso", "baseline-2", "suite-same-2",
                                          "suite-same-noiso-2"]
    lines = isolation_cost.summarize(steps)
    assert lines[0].startswith("2 node ids ran in every step")  # the test added since the baseline does not count
    row = next(line for line in lines if line.startswith("suite-same "))
    assert row.split()[1:5] == ["36.0", "3.0", "1.0", "2.0"] and "10/2/3" in row and "15/3" in row, row
    assert row.split()[-2] == "2", row  # gw0's child and gw1's own context
    # gw0 ran items 0 (1 s) and 2 (50 s, from 202), gw1 item 1 (2 s, from 201): the last end 252, the median 227.5
    assert row.split()[-1] == "24.5", row
    assert next(line for line in lines if line.startswith("baseline ")).split()[-2] == "-"
    assert "baseline 32.0 / 3.0 / 2, suite-same-noiso 32.0 / 2.2 / 2, suite-same 38.0 / 4.5 / 2" in lines[-4]
    assert lines[-3:] == ["suite-same / baseline: wall 1.19x, item time 1.50x",
                          "suite-same / suite-same-noiso: wall 1.19x, item time 2.00x",
                          "suite-same-noiso / baseline: wall 1.00x, item time 0.75x"]


def test_an_empty_folder_says_so(tmp_path, capsys):
    assert isolation_cost.main([str(tmp_path)]) == 0
    assert "no baseline, suite-same or suite-same-noiso reports found" in capsys.readouterr().out
    assert isolation_cost.main([str(tmp_path / "missing")]) == 2


def test_gpu_run_refuses_an_unknown_step_before_running_any(tmp_path):
    """scripts/gpu_run.sh checks every step name first: a misspelt one found halfway through a call (docs/gpu-runs.md
    run 68) loses the rest of the device's time. ``isolation-cost`` expands into the steps it alternates."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_run.sh"
    run = subprocess.run(["bash", str(script), "env", "peer-stages"], env={**os.environ, "OUT": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown step peer-stages; the steps are: env pyc" in run.stderr, run.stderr
    assert " isolation-cost-report " in run.stderr and not list(tmp_path.iterdir())  # env did not run


def test_gpu_run_creates_the_folder_it_is_given(tmp_path):
    """An ``OUT`` that does not exist yet is created before the first step tees its log into it (without it, every
    step of a device call ran with its log lost: docs/gpu-runs.md, run 122)."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_run.sh"
    out = tmp_path / "new" / "bench"
    env = {**os.environ, "OUT": str(out), "PY": sys.executable, "PACK": "0"}  # PACK=0: the logs stay as they are
    run = subprocess.run(["bash", str(script), "env"], env=env, capture_output=True, text=True, timeout=120)
    assert (out / "env.log").is_file(), run.stdout + run.stderr
    assert "commit" in (out / "env.log").read_text()
