"""A FIFO (or any special file) named like a case file is skipped and named, never opened: opening a FIFO blocks
until something writes to it, which hung ``validate`` and ``run``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broken_providers import TINY_CASES

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    """In a subprocess with a time limit: on a hang the test fails instead of hanging the suite."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=env)


@pytest.fixture
def folder_with_fifo(tmp_path):
    folder = tmp_path / "cases-here"
    folder.mkdir()
    (folder / "tiny.yaml").write_text(TINY_CASES)
    fifo = folder / "pipe.yaml"
    os.mkfifo(fifo)
    return folder, fifo


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="this platform has no FIFOs")
def test_validate_skips_a_fifo_and_says_so(folder_with_fifo):
    folder, fifo = folder_with_fifo
    proc = _cli("validate", str(folder))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"skipped {fifo}: not a regular file (a FIFO); case files are read from regular files only" in proc.stdout
    assert "ok: 3 cases in 1 files" in proc.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="this platform has no FIFOs")
def test_run_skips_a_fifo_and_says_so(folder_with_fifo, device):
    folder, fifo = folder_with_fifo
    proc = _cli("run", str(folder), "--check", "returned_shapes", "--provider", "reference:provider",
                "--isolation", "none", "--device", device)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"skipped {fifo}: not a regular file (a FIFO)" in proc.stderr
