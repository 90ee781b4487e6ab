"""Checks stay truthful under hostile providers: what a provider returns, raises or produces never turns into a
crash of the check's own report, a pass of a fault, or a statistic that leaves elements out."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.cases.model import Expect
from harness.checks import Status, load_provider, run_check


class _Returns:
    """The reference provider's work, then returns ``value`` whatever the call mode asks for."""

    name = "returns-something-else"
    supported_paths = frozenset({"snapshot"})

    def __init__(self, value):
        self.value = value
        self.inner = load_provider("reference:provider")

    def ssd_prefill(self, *args, **kwargs):
        kwargs.pop("workspace_out", None)
        self.inner.ssd_prefill(*args, **kwargs)
        return self.value


@pytest.mark.parametrize("value", [(1, 2), 3.5, "state"])
def test_returned_shapes_names_a_non_tensor_of_direct_mode(tiny_cases, device, value):
    result = run_check(tiny_cases["tiny-direct"], "returned_shapes", _Returns(value), device=device)
    assert result.status is Status.FAILED, result.message
    assert result.summary == (f"returned: direct writeback must return None, found a {type(value).__name__}, "
                              "not a tensor")


def test_returned_shapes_names_a_non_tensor_of_returned_mode(tiny_cases, device):
    result = run_check(tiny_cases["tiny-returned"], "returned_shapes", _Returns([1]), device=device)
    assert result.status is Status.FAILED, result.message
    assert result.summary.endswith("found a list, not a tensor"), result.summary


# ---------------------------------------------------------------- an xfail excuses only the failure it names

VLLM_REGRESSION = Path(__file__).resolve().parents[1] / "cases" / "regressions" / "vllm-0.33-negative-final-slot.yaml"
VLLM = "peers.vllm_ssd:provider"


class _Raises:
    name = "raises"
    supported_paths = frozenset({"snapshot", "indexed"})

    def ssd_prefill(self, *args, **kwargs):
        raise IndexError("index 7 is out of bounds")


@pytest.fixture(scope="module")
def vllm_regression():
    from harness.cases.loader import load_case_file

    return {c.id: c for c in load_case_file(VLLM_REGRESSION)}["vllm-0.33-negative-final-slot"]


def test_the_shipped_vllm_regression_fails_if_vllm_crashes_hangs_or_raises(vllm_regression, device):
    """Its xfail names vLLM's stray store (a mismatch of untouched_storage); a segfault, a hang or an exception
    there is a new fault, an error, never an expected failure."""
    from harness.checks.runner import fault_result
    from harness.isolation.supervisor import describe_exit

    case = vllm_regression
    assert case.expect.fails_for(VLLM) and case.expect.fails_with == ("mismatch",)
    for cause, fault in ((describe_exit(-11), "exit"), ("timed out after 120 s (the CPU default)", "timeout")):
        result = fault_result(case, "untouched_storage", cause, fault=fault, provider_spec=VLLM)
        assert result.status is Status.ERROR, (fault, result.status)
        assert "not excused by the case's xfail with --provider peers.vllm_ssd:provider" in result.message
    raised = run_check(case, "untouched_storage", _Raises(), device=device, provider_spec=VLLM)
    assert raised.status is Status.ERROR and raised.summary == "IndexError: index 7 is out of bounds"
    assert ("this item ended with an exception (fails_with: exception)" in raised.message), raised.message


def test_an_xfail_that_names_the_fault_excuses_it_and_only_it(tiny_cases, device):
    from harness.checks.runner import fault_result

    base = tiny_cases["tiny-direct"]
    raising = replace(base, expect=Expect("xfail", "issue 9: raises on this shape", None, ("exception",)))
    assert run_check(raising, "returned_shapes", _Raises(), device=device).status is Status.XFAILED
    assert fault_result(raising, "returned_shapes", "died", fault="exit").status is Status.ERROR
    wrong = run_check(raising, "returned_shapes", _Returns(3.5), device=device)  # a mismatch: not named
    assert wrong.status is Status.FAILED and "not excused by the case's xfail: it expects a failure of kind " \
        "exception (expect.fails_with), this item ended with a mismatch" in wrong.message, wrong.message
    hangs = replace(base, expect=Expect("xfail", "issue 9: hangs", None, ("timeout", "exit")))
    assert fault_result(hangs, "returned_shapes", "timed out", fault="timeout").status is Status.XFAILED
    assert fault_result(hangs, "returned_shapes", "died", fault="exit").status is Status.XFAILED
    assert fault_result(hangs, "returned_shapes", "broke", fault="harness").status is Status.ERROR


def test_fails_with_loads_round_trips_and_rejects_unknown_kinds(tmp_path):
    from harness.cases.loader import CaseError, dump_case, load_case_file
    from tests.broken_providers import TINY_CASES

    text = TINY_CASES.replace("    call: {final_state: returned, path: auto}\n",
                              "    call: {final_state: returned, path: auto}\n"
                              "    expect: {xfail: 'issue 9: dies', fails_with: [exit, timeout]}\n")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    case = load_case_file(path)[2]
    assert case.expect == Expect("xfail", "issue 9: dies", None, ("exit", "timeout"))
    again = tmp_path / "again.yaml"
    again.write_text(dump_case(case))
    assert load_case_file(again) == [case]
    path.write_text(text.replace("[exit, timeout]", "[segfault]"))
    with pytest.raises(CaseError) as err:
        load_case_file(path)
    assert str(err.value) == (f"{path}: cases[2].expect.fails_with[0]: expected one of mismatch, exception, exit, "
                              "timeout, found 'segfault'"), str(err.value)


# ---------------------------------------------------------------- statistics that count every element


def test_an_all_nan_output_never_reads_as_zero_error(tmp_path, device):
    """The first line, the JSON report and the HTML page all say the error is unbounded, not 0."""
    import json

    from tests.broken_providers import TINY_CASES
    from tests.support import harness

    cases, report, page = tmp_path / "tiny.yaml", tmp_path / "r.json", tmp_path / "r.html"
    cases.write_text(TINY_CASES)
    proc = harness("run", str(cases), "--check", "reference_bound", "--provider", "tests.hostile_providers:writes_nan",
                   "--isolation", "none", "--device", device, "--json", str(report))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    items = json.loads(report.read_text())["items"]
    assert len(items) == 3 and {i["outcome"] for i in items} == {"failed"}
    for item in items:
        assert "max |err| 0" not in item["summary"] and "max ulp 0" not in item["summary"], item["summary"]
        assert "non-finite: NaN, or an infinity on one side only; max |err| inf, max err/bound inf" in item["summary"]
        assert item["summary"] in proc.stdout
        assert item["bound_use"] == float("inf") and item["max_ulp"] is None, item
    assert harness("report-html", str(report), "-o", str(page)).returncode == 0
    assert "<td>inf</td>" in page.read_text() and "<td>0</td>" not in page.read_text()


def test_signed_zeros_are_the_same_value_and_non_finite_pairs_have_no_ulp_distance():
    import torch

    from harness.compare import Mismatch, assert_bits_equal, assert_within_bound, ulp_distance

    zero, minus_zero = torch.tensor([0.0]), torch.tensor([-0.0])
    assert int(ulp_distance(zero, minus_zero)) == 0
    assert int(ulp_distance(torch.tensor([1e-45]), torch.tensor([-1e-45]))) == 2  # -tiny -> 0 -> +tiny
    assert assert_within_bound(minus_zero, zero.double(), torch.tensor(0.0)).max_ulp == 0
    with pytest.raises(Mismatch) as signs:
        assert_bits_equal(minus_zero, zero, what="out")
    assert signs.value.summary.endswith("the finite ones differ only in the sign of zero (0 ulp)")
    assert signs.value.details.endswith("ulp 0 (sign of zero)")
    for inf in (float("inf"), float("-inf")):
        with pytest.raises(Mismatch) as infinite:
            assert_bits_equal(torch.tensor([inf, 1.0]), torch.tensor([2.0, 1.0]), what="out")
        assert infinite.value.summary.endswith("none of them a pair of finite values (no ulp distance)")
        assert infinite.value.details.endswith("ulp none (non-finite)"), infinite.value.details
