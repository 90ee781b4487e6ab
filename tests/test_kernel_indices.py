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


def _planned_pointer_dtypes() -> dict[str, set[str]]:
    """Per slot or mask parameter of the plan's keys, the pointer dtypes it is specialized on."""
    shape = ModelShape(nheads=3, headdim=5, dstate=16, ngroups=3, chunk_size=64)
    options = dict(index_dtypes=INDEX_DTYPES, mask_dtypes=MASK_DTYPES)
    planned, _ = plan([(shape, (torch.float16,), (torch.float16,), options)])
    seen: dict[str, set[str]] = {}
    for spec in planned:
        for key in spec.new:
            for name, described in key.params:
                if name in SLOT_PARAMS | MASK_PARAMS:
                    seen.setdefault(name, set()).add(described.split()[0])
    return seen


def _one_dtype_each(seen: dict[str, set[str]]) -> bool:
    return bool(seen) and all(dtypes == ({"*i32"} if name in SLOT_PARAMS else {"*u8"}) for name, dtypes in seen.items())


def test_the_plan_has_one_slot_dtype_and_one_mask_dtype_whatever_the_callers_use():
    # The placeholder a call without slots passes for the mask has the mask's dtype too: one binary for both calls.
    seen = _planned_pointer_dtypes()
    assert _one_dtype_each(seen), seen


def test_a_mask_placeholder_of_another_dtype_shows_in_the_plan(monkeypatch):
    """Negative control: the fused states kernel's calls without slots given an int32 placeholder for the mask (as
    the sequence index once was) put a second mask dtype, so a second binary per shape, into the plan."""
    from kernels import chunk_state_passing as csp

    real = csp.launch_arguments

    def int32_placeholder(*args, **kwargs):
        arguments = real(*args, **kwargs)
        if kwargs.get("has_initial_states") is None:
            arguments["has_init_ptr"] = arguments["seq_idx_ptr"]
        return arguments

    monkeypatch.setattr(csp, "launch_arguments", int32_placeholder)
    seen = _planned_pointer_dtypes()
    assert seen["has_init_ptr"] == {"*u8", "*i32"} and not _one_dtype_each(seen), seen


def test_ssd_prefill_converts_before_its_first_launch_so_no_copy_stands_between_two_kernels(device, monkeypatch):
    """A copy made between two launches would stand between the cumsum, which lets the next kernel start early, and
    the gather that starts beside it without waiting: every stage of the call must receive slots and masks already
    in the kernels' form, whatever dtype the caller passed."""
    from harness.cases.builder import build_inputs
    from kernels import provider, ssd
    from tests.support import make_case

    case = make_case([(0, 70, 1, True, 2), (9, 25, 4, False, 5)])
    inputs = build_inputs(case, device)
    kwargs = dict(inputs.kwargs(path="snapshot"), gather="fused")
    kwargs["initial_state_indices"] = kwargs["initial_state_indices"].to(torch.int64)
    kwargs["final_state_indices"] = kwargs["final_state_indices"].to(torch.int64)
    kwargs["has_initial_states"] = kwargs["has_initial_states"].to(torch.int32)
    seen = []
    index_names = {"initial_state_indices", "final_state_indices", "has_initial_states", "init_slot_index",
                   "final_slot_index", "has_initial_state"}

    def recording(name, stage):
        def run(*args, **kw):
            for argument, value in kw.items():
                if argument in index_names and value is not None:
                    seen.append((name, argument, value.dtype))
            for value in args:
                if isinstance(value, torch.Tensor) and value.dtype in (torch.int64, torch.bool):
                    seen.append((name, "positional", value.dtype))
            return stage(*args, **kw)
        return run

    for name in ("chunk_cumsum_gather", "gather_initial_states", "gather_initial_states_torch", "chunk_state_passing",
                 "state_passing_batched", "state_passing_indexed"):
        monkeypatch.setattr(ssd, name, recording(name, getattr(ssd, name)))
    provider.ssd_prefill(**kwargs)
    assert seen, "no stage received an index tensor"
    assert all(dtype in (torch.int32, torch.uint8) for _, _, dtype in seen), seen
