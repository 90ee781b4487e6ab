"""The bit-compare helpers catch what exactness means (docs/exactness.md) and pass identical tensors."""

from __future__ import annotations

import math

import pytest
import torch

from harness.compare import (
    Mismatch,
    assert_bits_equal,
    assert_storage_equal,
    assert_within_bound,
    storage_bytes,
    ulp_distance,
)

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def next_up(t: torch.Tensor) -> torch.Tensor:
    """One ulp towards +inf for positive finite values (bit pattern + 1)."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return (t.view(ints) + 1).view(t.dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_identical_tensors_pass(dtype):
    t = torch.randn(4, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    t[0, 0] = float("nan")
    assert_bits_equal(t, t.clone())


@pytest.mark.parametrize("dtype", FLOATS)
def test_signed_zero_is_caught(dtype):
    a = torch.zeros(3, dtype=dtype)
    b = a.clone()
    b[1] = -0.0
    with pytest.raises(Mismatch) as err:
        assert_bits_equal(a, b, what="out", repro="python -m harness repro x.yaml --check c")
    report = str(err.value)
    assert "1 of 3 elements differ" in report and "at (1,)" in report
    assert "repro: python -m harness repro x.yaml --check c" in report
    assert err.value.count == 1


def test_nan_payload_is_caught_and_reported_in_hex():
    a = torch.tensor([float("nan")], dtype=torch.float32)
    b = (a.view(torch.int32) | 1).view(torch.float32)  # another quiet NaN payload
    assert math.isnan(b.item())
    with pytest.raises(Mismatch) as err:
        assert_bits_equal(a, b)
    assert "0x7fc00000" in str(err.value) and "0x7fc00001" in str(err.value)
    assert "ulp none (non-finite)" in str(err.value)  # a NaN has no ulp distance to anything


@pytest.mark.parametrize("dtype", FLOATS)
def test_one_ulp_is_caught_with_distance(dtype):
    a = torch.full((2, 3), 1.5, dtype=dtype)
    b = a.clone()
    b[1, 2] = next_up(b[1, 2].clone())
    with pytest.raises(Mismatch) as err:
        assert_bits_equal(b, a)
    assert "at (1, 2)" in str(err.value) and "ulp 1" in str(err.value)


def test_shape_and_dtype_mismatch_raise():
    with pytest.raises(Mismatch, match="shape/dtype differ"):
        assert_bits_equal(torch.zeros(2), torch.zeros(3))
    with pytest.raises(Mismatch, match="shape/dtype differ"):
        assert_bits_equal(torch.zeros(2), torch.zeros(2, dtype=torch.float64))


def test_integer_tensors_compare_values():
    with pytest.raises(Mismatch, match="at \\(2,\\): actual 7 expected 3"):
        assert_bits_equal(torch.tensor([1, 2, 7]), torch.tensor([1, 2, 3]))


def test_ulp_distance_crosses_zero():
    pos = torch.tensor([1e-45], dtype=torch.float32)  # smallest subnormal
    neg = -pos
    assert int(ulp_distance(pos, neg)) == 2  # +tiny -> 0 -> -tiny: the two zeros are one value
    assert int(ulp_distance(torch.tensor([0.0]), torch.tensor([-0.0]))) == 0


def test_storage_compare_sees_gaps_and_bytes_before_offset():
    base = torch.full((20,), 7.0)
    view = base[4:].view(4, 4)[:, :3]  # offset 4 and a gap column
    before = storage_bytes(view)
    assert before.numel() == 80
    assert_storage_equal(view, before)
    base[0] = 8.0  # before the view's offset: still the view's storage
    with pytest.raises(Mismatch, match="at \\(0,\\)"):
        assert_storage_equal(view, before, element=torch.float32)
    base[0] = 7.0
    base[7] = -1.0  # the gap column of row 0
    with pytest.raises(Mismatch, match="at \\(7,\\)"):
        assert_storage_equal(view, before, element=torch.float32)


def test_within_bound_passes_and_reports_stats():
    exp = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
    act = (exp * (1 + 2**-10)).to(torch.float32)
    stats = assert_within_bound(act, exp, torch.full((3,), 2**-9) * exp.abs())
    assert 0.4 < stats.max_bound_use < 0.6 and stats.max_rel_err == pytest.approx(2**-10, rel=1e-6)


def test_within_bound_fails_on_excess_nan_and_inf():
    exp = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    bound = torch.full((3,), 1e-3, dtype=torch.float64)
    with pytest.raises(Mismatch, match="1 of 3 elements exceed"):
        assert_within_bound(torch.tensor([1.0, 1.01, 1.0]), exp, bound)
    with pytest.raises(Mismatch, match="at \\(2,\\)"):
        assert_within_bound(torch.tensor([1.0, 1.0, float("nan")]), exp, bound)
    with pytest.raises(Mismatch):
        assert_within_bound(torch.tensor([float("inf"), 1.0, 1.0]), exp, bound)
