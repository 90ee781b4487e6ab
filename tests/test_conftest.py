"""tests/conftest.py: the ``device`` fixture is the device the plugin configured, and the ``gpu`` / ``interpreter``
markers skip on the other device with their reason, and refuse to be used without one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")

MARKED = """
import pytest

def test_device_fixture(device, profile):
    print(f"DEVICE={device} PROFILE={profile}")

@pytest.mark.gpu(reason="needs a real compile")
def test_on_gpu():
    pass

@pytest.mark.interpreter(reason="stands in for a compile")
def test_under_interpreter():
    pass
"""


def _run(pytester, device: str, test_source: str):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    gpu(reason): x\n    interpreter(reason): x\n")
    pytester.makepyfile(test_marked=test_source)
    return pytester.runpytest_inprocess("-p", "ssd_pytest.plugin", "--device", device,
                                        "-p", "no:cacheprovider", "-s", "-rs")


def test_markers_skip_on_the_other_device_with_their_reason(pytester, device, profile):
    result = _run(pytester, device, MARKED)
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines([f"*DEVICE={device} PROFILE={profile}*"])
    if device == "cpu":
        result.stdout.fnmatch_lines(["SKIPPED *test_marked.py:*: runs on cuda only, this process runs on cpu: "
                                     "needs a real compile"])
    else:
        result.stdout.fnmatch_lines(["SKIPPED *test_marked.py:*: runs on cpu only, this process runs on cuda: "
                                     "stands in for a compile"])


def test_a_marker_without_a_reason_is_a_usage_error(pytester, device):
    result = _run(pytester, device, "import pytest\n\n@pytest.mark.gpu\ndef test_unexplained():\n    pass\n")
    assert result.ret == 4, result.stdout.str()  # pytest's usage-error exit status: nothing ran, nothing passed
    assert "test_unexplained: @pytest.mark.gpu needs reason=..." in result.stderr.str() + result.stdout.str()


LEAKS = """
import os
import sys

import torch

def test_leaves_a_variable_set():
    os.environ["SSD_TEST_LEAKED"] = "1"

def test_leaves_a_path_on_sys_path():
    sys.path.append("/ssd-test-nowhere")

def test_leaves_the_default_dtype():
    torch.set_default_dtype(torch.float64)

def test_leaves_a_triton_hook_set():
    from triton import knobs

    knobs.runtime.jit_cache_hook = print

def test_changes_one_and_gives_it_back(monkeypatch):
    monkeypatch.setenv("SSD_TEST_LEAKED", "2")

def test_leaves_another_directory(tmp_path):
    os.chdir(tmp_path)
"""


def test_a_test_that_leaves_the_environment_changed_errors_naming_it_and_the_change_is_given_back(pytester,
                                                                                                     device):
    cwd = Path.cwd()
    result = _run(pytester, device, LEAKS)
    result.assert_outcomes(passed=6, errors=5)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaves_a_variable_set*",
        "*the test left the process changed (given back now): SSD_TEST_LEAKED: None -> '1'",
        "*ERROR at teardown of test_leaves_a_path_on_sys_path*",
        "*the test left the process changed (given back now): sys.path: *'/ssd-test-nowhere'*",
        "*ERROR at teardown of test_leaves_the_default_dtype*",
        "*the test left the process changed (given back now): torch: (torch.float32, *) -> (torch.float64, *)",
        "*ERROR at teardown of test_leaves_a_triton_hook_set*",
        "*the test left the process changed (given back now): triton.knobs.runtime.jit_cache_hook: None -> *print*",
        "*ERROR at teardown of test_leaves_another_directory*",
        "*the test left the process changed (given back now): working directory: * -> *test_leaves_another_directory*",
    ])
    assert "SSD_TEST_LEAKED" not in os.environ and Path.cwd() == cwd
    assert "/ssd-test-nowhere" not in sys.path and torch.get_default_dtype() == torch.float32
    from triton import knobs

    assert knobs.runtime.jit_cache_hook is None


SEES_THE_HARNESS_SETTINGS = """
import os

def test_runs_without_the_callers_harness_settings():
    assert "SSD_HARNESS_ISOLATION" not in os.environ and "SSD_HARNESS_ITEM_TIMEOUT" not in os.environ
"""


def test_the_callers_harness_settings_do_not_reach_a_test_and_come_back_after_it(pytester, device, monkeypatch):
    """A caller's ``SSD_HARNESS_ISOLATION=none`` would run a test's crashing provider in the test's own process."""
    monkeypatch.setenv("SSD_HARNESS_ISOLATION", "none")
    monkeypatch.setenv("SSD_HARNESS_ITEM_TIMEOUT", "1")
    result = _run(pytester, device, SEES_THE_HARNESS_SETTINGS)
    result.assert_outcomes(passed=1)
    assert (os.environ["SSD_HARNESS_ISOLATION"], os.environ["SSD_HARNESS_ITEM_TIMEOUT"]) == ("none", "1")
