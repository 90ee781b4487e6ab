"""tests/conftest.py: the ``device`` fixture is the device the plugin configured, and the ``gpu`` / ``interpreter``
markers skip on the other device with their reason, and refuse to be used without one."""

from __future__ import annotations

from pathlib import Path

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
