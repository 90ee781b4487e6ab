"""The CI workflow files are valid GitHub Actions YAML, and every harness command and pytest option they use exists."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def load(path: Path) -> dict:
    # PyYAML reads the key `on` as True (YAML 1.1); GitHub reads it as "on".
    doc = yaml.safe_load(path.read_text())
    if True in doc:
        doc["on"] = doc.pop(True)
    return doc


def run_lines(doc: dict) -> list[str]:
    lines = []
    for job in doc["jobs"].values():
        for step in job["steps"]:
            if "run" in step:
                lines.append(" ".join(step["run"].split()))
    return lines


@lru_cache(maxsize=1)
def pytest_help() -> str:
    return subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120).stdout


def test_there_are_a_cpu_and_a_nightly_gpu_workflow():
    names = {p.name for p in WORKFLOWS}
    assert {"ci-cpu.yml", "nightly-gpu.yml"} <= names


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_structure(path):
    doc = load(path)
    assert isinstance(doc.get("name"), str), f"{path.name}: name: expected a string"
    assert doc.get("on"), f"{path.name}: on: expected triggers"
    assert isinstance(doc.get("jobs"), dict) and doc["jobs"], f"{path.name}: jobs: expected a mapping"
    for job_id, job in doc["jobs"].items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", job_id), f"{path.name}: jobs.{job_id}: invalid job id"
        assert "runs-on" in job, f"{path.name}: jobs.{job_id}.runs-on: missing"
        assert isinstance(job.get("timeout-minutes"), int), f"{path.name}: jobs.{job_id}.timeout-minutes: missing"
        assert job.get("steps"), f"{path.name}: jobs.{job_id}.steps: expected a list"
        for i, step in enumerate(job["steps"]):
            assert ("run" in step) != ("uses" in step), f"{path.name}: jobs.{job_id}.steps[{i}]: exactly one of run/uses"


def test_cpu_workflow_runs_ci_entry_point_which_runs_readme_command():
    assert "bash .ci/run" in run_lines(load(ROOT / ".github/workflows/ci-cpu.yml"))
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci/run").read_text()
    assert "make test" in readme and re.search(r"^make test$", ci, re.M)


def test_nightly_uses_only_existing_harness_commands_and_pytest_options():
    lines = run_lines(load(ROOT / ".github/workflows/nightly-gpu.yml"))
    subcommands = {m.group(1) for line in lines for m in re.finditer(r"-m harness (\w+)", line)}
    assert {"warmup", "fuzz"} <= subcommands
    for sub in sorted(subcommands):
        res = subprocess.run([sys.executable, "-m", "harness", sub, "--help"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, f"python -m harness {sub} --help failed: {res.stderr[-500:]}"
    options = set()
    for line in lines:
        m = re.search(r'PYTEST_ARGS="([^"]*)"', line)
        if m:
            options |= {tok.split("=")[0] for tok in shlex.split(m.group(1)) if tok.startswith("--")}
    assert {"--device", "--recompile-guard", "--shard", "--json-report"} <= options
    help_text = pytest_help()
    missing = [opt for opt in sorted(options) if opt not in help_text]
    assert not missing, f"pytest options used by nightly-gpu.yml but not defined: {missing}"
