"""The kernels' initial-state gathers (the fused Triton kernel and the PyTorch-ops copy) vs the reference
``torch.where`` snapshot, bit for bit (docs/exactness.md)."""

from __future__ import annotations

import pytest
import torch

from harness.compare import Mismatch, assert_bits_equal, assert_storage_equal, storage_bytes
from kernels.gather import gather_initial_states, gather_initial_states_torch
from reference import snapshot as torch_snapshot
from tests.support import STATE_DTYPES, index_view, paged_cache

INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
QUIET_NAN_WITH_PAYLOAD = {torch.float32: 0x7FC01234, torch.float16: 0x7E01, torch.bfloat16: 0x7FC3}
COPIES = {"fused": gather_initial_states, "torch": gather_initial_states_torch}


def _set_bits(cache, slot, flat_index, bits):
    row = cache[slot].reshape(-1)
    row.view(INT_VIEW[cache.dtype])[flat_index] = torch.tensor(bits, dtype=torch.int64).to(INT_VIEW[cache.dtype])


def _gather_case(dtype, index_dtype, layout, mask_dtype, device):
    base, cache = paged_cache(9, dtype, device, blank_slots=(2, 6))  # slots 2 and 6 hold NaN: masked rows point there
    _set_bits(cache, 4, 0, 0x80000000 if dtype == torch.float32 else 0x8000)  # -0.0 must survive the copy
    _set_bits(cache, 4, 1, QUIET_NAN_WITH_PAYLOAD[dtype])  # so must a NaN payload in a read slot
    idx = index_view([4, 2, 7, 6, 4], index_dtype, layout, device)
    mask = index_view([1, 0, 1, 0, 1], mask_dtype, layout, device, column=3)
    return base, cache, idx, mask


@pytest.mark.parametrize("dtype", STATE_DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64), ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "block_table"))
@pytest.mark.parametrize("mask_dtype", (torch.bool, torch.int32), ids=str)
@pytest.mark.parametrize("copy", list(COPIES))
def test_gather_equals_torch_where(dtype, index_dtype, layout, mask_dtype, copy, device):
    base, cache, idx, mask = _gather_case(dtype, index_dtype, layout, mask_dtype, device)
    before = storage_bytes(base)
    got = COPIES[copy](cache, idx, mask)
    want = torch_snapshot.gather_initial_states(cache, idx, mask)
    assert_bits_equal(got, want, what=f"{copy} gather vs torch.where snapshot")
    assert_storage_equal(base, before, what="cache storage after gather")
    # The masked rows point at NaN slots: zeros prove they were never read (not read-then-masked into NaN).
    assert not torch.isnan(got[1]).any() and not torch.isnan(got[3]).any()


@pytest.mark.parametrize("copy", list(COPIES))
def test_a_masked_row_never_reads_its_slot(copy, device):
    """A masked-off row's slot may be out of the cache's range (padding rows of a block table): never read."""
    base, cache = paged_cache(3, torch.float32, device)
    idx = index_view([1, 1000], torch.int64, "block_table", device)
    got = COPIES[copy](cache, idx, torch.tensor([True, False], device=device))
    assert_bits_equal(got[0], cache[1], what=f"{copy} gather, read row")
    assert_bits_equal(got[1], torch.zeros_like(cache[1]), what=f"{copy} gather, masked row")


def test_gather_check_catches_a_read_masked_slot(device):
    """Negative control: a gather that ignores the mask copies the NaN slots, and the bit comparison says so."""
    base, cache, idx, mask = _gather_case(torch.float16, torch.int64, "block_table", torch.bool, device)
    broken = gather_initial_states(cache, idx, torch.ones_like(mask))
    with pytest.raises(Mismatch, match="differ in bits"):
        assert_bits_equal(broken, torch_snapshot.gather_initial_states(cache, idx, mask), what="broken gather")


def test_gather_check_catches_a_wrong_slot(device):
    """Negative control: reading a neighbouring slot is reported."""
    base, cache, idx, mask = _gather_case(torch.bfloat16, torch.int32, "contiguous", torch.bool, device)
    broken = gather_initial_states(cache, idx + 1, mask)
    with pytest.raises(Mismatch):
        assert_bits_equal(broken, torch_snapshot.gather_initial_states(cache, idx, mask), what="broken gather")


def test_gather_rejects_non_compact_rows(device):
    base, cache = paged_cache(4, torch.float32, device)
    with pytest.raises(AssertionError, match="compact"):
        gather_initial_states(cache.transpose(2, 3), index_view([0], torch.int32, "contiguous", device),
                              torch.tensor([True], device=device))
