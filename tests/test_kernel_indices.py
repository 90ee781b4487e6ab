"""Slot indices and ``has_initial_states`` reach every kernel in one form each (``kernels.interface.kernel_slots``,
``kernel_mask``): int32 slots and byte masks, the same values, no copy where the dtype already is the kernels', so
that the warmup plan has no binary per index or mask dtype."""

from __future__ import annotations

import pytest
import torch

from kernels.interface import INDEX_DTYPES, MASK_DTYPES, kernel_mask, kernel_slots
from kernels.warmup import ModelShape, plan

SLOT_PARAMS = {"idx_ptr", "init_slot_ptr", "final_slot_ptr", "final_idx_ptr"}
MASK_PARAMS = {"has_ptr", "has_init_ptr"}


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
def test_slots_keep_their_values_as_int32_and_int32_is_not_copied(dtype):
    column = torch.tensor([[3, -1], [0, 7], [2**31 - 1, 5], [-(2**31), 1]], dtype=dtype)[:, 0]  # a strided view
    slots = kernel_slots(column)
    assert slots.dtype == torch.int32 and slots.tolist() == column.tolist()
    assert (slots is column) == (dtype == torch.int32)


@pytest.mark.parametrize("dtype", MASK_DTYPES)
def test_masks_are_bytes_nonzero_where_the_mask_is_and_viewed_where_the_width_is_one_byte(dtype):
    values = [0, 1, 0, 1] if dtype == torch.bool else [0, 2, 0, -1 if dtype.is_signed else 255]
    column = torch.tensor([[v, 1] for v in values], dtype=dtype)[:, 0]
    mask = kernel_mask(column)
    assert mask.dtype == torch.uint8 and (mask != 0).tolist() == [False, True, False, True]
    assert (mask.data_ptr() == column.data_ptr() and mask.stride() == column.stride()) == (column.element_size() == 1)


def test_the_plan_has_one_slot_dtype_and_one_mask_dtype_whatever_the_callers_use():
    shape = ModelShape(nheads=3, headdim=5, dstate=16, ngroups=3, chunk_size=64)
    options = dict(index_dtypes=INDEX_DTYPES, mask_dtypes=MASK_DTYPES)
    planned, _ = plan([(shape, (torch.float16,), (torch.float16,), options)])
    seen: dict[str, set[str]] = {}
    for spec in planned:
        for key in spec.new:
            for name, described in key.params:
                if name in SLOT_PARAMS | MASK_PARAMS:
                    seen.setdefault(name, set()).add(described.split()[0])
    assert seen and all(dtypes == {"*i32"} for name, dtypes in seen.items() if name in SLOT_PARAMS), seen
    assert all(dtypes <= {"*u8", "*i32"} for name, dtypes in seen.items() if name in MASK_PARAMS), seen
