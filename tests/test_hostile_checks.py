"""Checks stay truthful under hostile providers: what a provider returns, raises or produces never turns into a
crash of the check's own report, a pass of a fault, or a statistic that leaves elements out."""

from __future__ import annotations

import pytest

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
