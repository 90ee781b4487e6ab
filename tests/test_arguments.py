"""``--ssd-report PATH`` and ``--durations-from PATH`` as two arguments (ssd_pytest.arguments): pytest takes an
existing PATH for a test path when it chooses its rootdir and configuration file, before the plugin's options are
known. Where that moved the rootdir off the project, the run stops with a usage error naming the fix; the one-argument
form, and runs whose test paths keep the rootdir, go on."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from harness.report import REPORT_SCHEMA
from ssd_pytest.arguments import misread_path_values, rootdir_misled

ROOT = Path(__file__).resolve().parents[1]


def test_only_existing_separate_values_outside_the_directory_count(tmp_path):
    here = tmp_path / "project"
    (here / "sub").mkdir(parents=True)
    outside, inside = tmp_path / "r.json", here / "sub" / "r.json"
    outside.write_text("{}")
    inside.write_text("{}")
    args = ["--ssd-report", str(outside), "--durations-from", str(inside), f"--ssd-report={outside}",
            "--durations-from", str(tmp_path / "missing.json"), "-k", str(outside)]
    assert misread_path_values(args, here) == [("--ssd-report", str(outside))]
    assert misread_path_values(["--durations-from", "../r.json"], here) == [("--durations-from", "../r.json")]


def test_a_rootdir_off_the_directory_or_without_its_configuration_is_misled(tmp_path):
    here = tmp_path / "project"
    here.mkdir()
    assert rootdir_misled(here, tmp_path.parent, None) is False  # no configuration file anywhere above
    assert rootdir_misled(here, tmp_path / "elsewhere", None) is True
    (here / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    assert rootdir_misled(here, here, here / "pyproject.toml") is False
    assert rootdir_misled(here, tmp_path, None) is True  # above the project, its configuration file not read


def plugin_has_an_entry_point() -> bool:
    """Whether pytest loads the plugin in every folder (a pytest11 entry point, pip install -e .), not only through
    this checkout's conftest.py (a GPU runner's source export run in place)."""
    return any(ep.value == "ssd_pytest.plugin" for ep in importlib.metadata.entry_points(group="pytest11"))


def pytest_in_the_project(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_an_existing_report_given_as_two_arguments_stops_the_run_with_the_fix(tmp_path):
    report = tmp_path / "earlier.json"
    report.write_text(json.dumps({"schema": REPORT_SCHEMA}))
    misled = pytest_in_the_project("--ssd-report", str(report))
    assert misled.returncode == 4, misled.stdout + misled.stderr
    if not plugin_has_an_entry_point():
        # Only this checkout's conftest.py loads the plugin, and pytest reads no conftest above a rootdir it moved
        # elsewhere: pytest itself refuses the option it does not know, which stops the run as well.
        assert "unrecognized arguments: --ssd-report" in misled.stderr, misled.stderr
        return
    # pytest's rootdir without a configuration file: the common folder of the project and the report, or the
    # report's own folder where that is the file system's root.
    common = Path(os.path.commonpath([ROOT, tmp_path]))
    rootdir = tmp_path if common == Path(common.anchor) else common
    assert (f"took the existing {report} for a test path: rootdir {rootdir}, configuration file none, not those of "
            f"{ROOT}") in misled.stderr
    assert f"Write it as one argument: --ssd-report={report}" in misled.stderr
    for fine in (pytest_in_the_project(f"--ssd-report={report}", "tests/test_progress.py"),
                 pytest_in_the_project("--ssd-report", str(report), "tests/test_progress.py")):
        # Node ids relative to the project: its rootdir and configuration file.
        assert fine.returncode == 0 and fine.stdout.startswith("tests/test_progress.py::"), fine.stdout + fine.stderr
