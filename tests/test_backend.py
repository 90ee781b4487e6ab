"""harness.backend's refusal of an interpreter this Python cannot run: Triton <= 3.6 with numpy >= 2.4 (every CPU
item would error with a TypeError that names neither) is refused where the device is chosen, naming the numpy found,
the numpy needed and the install line, by ``configure``, the CLI and the pytest plugin (the xdist controller too).
The installed versions are stood in for: this Python's own numpy runs the interpreter."""

from __future__ import annotations

import os

import pytest

from harness import backend
from tests.support import harness

pytest_plugins = ["pytester"]


def installed(monkeypatch, **versions: str | None) -> None:
    """``backend``'s view of the installed distributions: ``numpy="2.4.1"``, ``triton="3.6.0"``."""
    real = backend._installed_version
    monkeypatch.setattr(backend, "_installed_version",
                        lambda name: versions[name] if name in versions else real(name))


def assert_names_numpy(message: str, found: str) -> None:
    assert f"found numpy {found}" in message, message
    assert "needs numpy < 2.4" in message and "pip install -e '.[cpu]'" in message, message
    assert "\n" not in message, message


def test_the_interpreter_with_numpy_2_4_is_refused_naming_numpy(monkeypatch):
    installed(monkeypatch, numpy="2.4.1", triton="3.6.0")
    before = os.environ.get("TRITON_INTERPRET")
    with pytest.raises(RuntimeError) as refused:
        backend.configure("cpu")
    assert_names_numpy(str(refused.value), "2.4.1")
    assert os.environ.get("TRITON_INTERPRET") == before  # refused before anything was set


@pytest.mark.parametrize(("numpy", "triton"), [("2.3.5", "3.6.0"), ("1.26.4", "3.6.0"), ("2.5.2", "3.7.1")])
def test_numpy_below_2_4_or_a_later_triton_pass(monkeypatch, numpy, triton):
    installed(monkeypatch, numpy=numpy, triton=triton)
    assert backend.interpreter_install_problem() is None


def test_the_check_sees_prereleases_and_a_missing_triton(monkeypatch):
    installed(monkeypatch, numpy="2.4.0rc1", triton="3.6.0")
    assert_names_numpy(backend.interpreter_install_problem(), "2.4.0rc1")
    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda name: None)
    problem = backend.interpreter_install_problem()
    assert "triton is not installed" in problem and "pip install -e '.[cpu]'" in problem, problem


def test_the_cli_exits_2_with_the_message(monkeypatch, tmp_path):
    installed(monkeypatch, numpy="2.5.2", triton="3.6.0")
    proc = harness("run", str(tmp_path), "--device", "cpu")  # refused before it looks for case files
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert_names_numpy(proc.stderr.strip().removeprefix("error: "), "2.5.2")


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist controller"])
def test_pytest_stops_with_a_usage_error_naming_numpy(monkeypatch, pytester, workers):
    """A usage error before any worker starts: under xdist the controller, which imports no torch, refuses too."""
    installed(monkeypatch, numpy="2.5.2", triton="3.6.0")
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "ssd_pytest.plugin", "--device", "cpu", "-p", "no:cacheprovider",
                                          *workers)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert_names_numpy(result.stderr.str().strip().removeprefix("ERROR: "), "2.5.2")
