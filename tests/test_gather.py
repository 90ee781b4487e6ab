"""The kernels' initial-state gathers (the fused Triton kernel and the PyTorch-ops copy) vs the reference
``torch.where`` snapshot, bit for bit (docs/exactness.md).

Also home of the paged-cache and index-view builders the other kernel tests import (``from test_gather import ...``).
"""

from __future__ import annotations

import pytest
import torch

from harness.backend import configure

DEVICE = configure("auto")  # before any kernel module is imported

from harness.compare import Mismatch, assert_bits_equal, assert_storage_equal, storage_bytes  # noqa: E402
from kernels.gather import gather_initial_states, gather_initial_states_torch  # noqa: E402
from reference import snapshot as torch_snapshot  # noqa: E402

H, P, N = 3, 5, 16
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
QUIET_NAN_WITH_PAYLOAD = {torch.float32: 0x7FC01234, torch.float16: 0x7E01, torch.bfloat16: 0x7FC3}
COPIES = {"fused": gather_initial_states, "torch": gather_initial_states_torch}


def paged_cache(slots, dtype, *, heads=H, headdim=P, dstate=N, row_pad=24, offset=7, fill=float("nan"), seed=0,
                blank_slots=()):
    """A (slots, H, P, N) cache view over a larger storage: ``offset`` elements before it, ``row_pad`` sentinel
    elements after every slot row, a sentinel tail. Slots hold finite random values except ``blank_slots`` (left at
    ``fill``). Returns (base, cache): ``base`` owns the storage, ``cache`` is the strided view kernels see."""
    row = heads * headdim * dstate
    stride0 = row + row_pad
    base = torch.full((offset + slots * stride0 + 11,), fill, dtype=dtype)
    cache = base.as_strided((slots, heads, headdim, dstate), (stride0, headdim * dstate, dstate, 1), offset)
    g = torch.Generator().manual_seed(seed)
    for s in range(slots):
        if s not in blank_slots:
            cache[s] = torch.randn(heads, headdim, dstate, generator=g).to(dtype)
    base = base.to(DEVICE)  # filled on the CPU (seeded), then the same layout re-viewed on the device
    return base, base.as_strided(cache.shape, cache.stride(), cache.storage_offset())


def index_view(values, dtype, layout, *, column=1, columns=5, rows_before=3, junk=-7):
    """``values`` as a (batch,) index tensor: ``contiguous``, or ``block_table``: one column of a
    (rows_before + batch, columns) table (stride = columns; the pointer is 16-byte aligned only for some columns)."""
    if layout == "contiguous":
        return torch.tensor(values, dtype=dtype, device=DEVICE)
    assert layout == "block_table", layout
    table = torch.full((rows_before + len(values), columns), junk, dtype=dtype)
    table[rows_before:, column] = torch.tensor(values, dtype=dtype)
    return table.to(DEVICE)[rows_before:, column]


def _set_bits(cache, slot, flat_index, bits):
    row = cache[slot].reshape(-1)
    row.view(INT_VIEW[cache.dtype])[flat_index] = torch.tensor(bits, dtype=torch.int64).to(INT_VIEW[cache.dtype])


def _gather_case(dtype, index_dtype, layout, mask_dtype):
    base, cache = paged_cache(9, dtype, blank_slots=(2, 6))  # slots 2 and 6 hold NaN: masked rows point there
    _set_bits(cache, 4, 0, 0x80000000 if dtype == torch.float32 else 0x8000)  # -0.0 must survive the copy
    _set_bits(cache, 4, 1, QUIET_NAN_WITH_PAYLOAD[dtype])  # so must a NaN payload in a read slot
    idx = index_view([4, 2, 7, 6, 4], index_dtype, layout)
    mask = index_view([1, 0, 1, 0, 1], mask_dtype, layout, column=3)
    return base, cache, idx, mask


@pytest.mark.parametrize("dtype", STATE_DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64), ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "block_table"))
@pytest.mark.parametrize("mask_dtype", (torch.bool, torch.int32), ids=str)
@pytest.mark.parametrize("copy", list(COPIES))
def test_gather_equals_torch_where(dtype, index_dtype, layout, mask_dtype, copy):
    base, cache, idx, mask = _gather_case(dtype, index_dtype, layout, mask_dtype)
    before = storage_bytes(base)
    got = COPIES[copy](cache, idx, mask)
    want = torch_snapshot.gather_initial_states(cache, idx, mask)
    assert_bits_equal(got, want, what=f"{copy} gather vs torch.where snapshot")
    assert_storage_equal(base, before, what="cache storage after gather")
    # The masked rows point at NaN slots: zeros prove they were never read (not read-then-masked into NaN).
    assert not torch.isnan(got[1]).any() and not torch.isnan(got[3]).any()


@pytest.mark.parametrize("copy", list(COPIES))
def test_a_masked_row_never_reads_its_slot(copy):
    """A masked-off row's slot may be out of the cache's range (padding rows of a block table): never read."""
    base, cache = paged_cache(3, torch.float32)
    idx = index_view([1, 1000], torch.int64, "block_table")
    got = COPIES[copy](cache, idx, torch.tensor([True, False], device=DEVICE))
    assert_bits_equal(got[0], cache[1], what=f"{copy} gather, read row")
    assert_bits_equal(got[1], torch.zeros_like(cache[1]), what=f"{copy} gather, masked row")


def test_gather_check_catches_a_read_masked_slot():
    """Negative control: a gather that ignores the mask copies the NaN slots, and the bit comparison says so."""
    base, cache, idx, mask = _gather_case(torch.float16, torch.int64, "block_table", torch.bool)
    broken = gather_initial_states(cache, idx, torch.ones_like(mask))
    with pytest.raises(Mismatch, match="differ in bits"):
        assert_bits_equal(broken, torch_snapshot.gather_initial_states(cache, idx, mask), what="broken gather")


def test_gather_check_catches_a_wrong_slot():
    """Negative control: reading a neighbouring slot is reported."""
    base, cache, idx, mask = _gather_case(torch.bfloat16, torch.int32, "contiguous", torch.bool)
    broken = gather_initial_states(cache, idx + 1, mask)
    with pytest.raises(Mismatch):
        assert_bits_equal(broken, torch_snapshot.gather_initial_states(cache, idx, mask), what="broken gather")


def test_gather_rejects_non_compact_rows():
    base, cache = paged_cache(4, torch.float32)
    with pytest.raises(AssertionError, match="compact"):
        gather_initial_states(cache.transpose(2, 3), index_view([0], torch.int32, "contiguous"),
                              torch.tensor([True], device=DEVICE))
