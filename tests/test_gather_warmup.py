"""Gather-warmup regressions (issue 6): block-table column views of many widths, columns and leading rows must be
covered by the startup warmup, and no gather compile may happen during the call after it.

GPU: the guard sees real compiles (hook + kernel cache). CPU: the same guard compares the GPU specialization key of
each launch against the warmed keys. The negative control warms stride-1 contiguous indices only.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest
import torch

from harness.compare import assert_bits_equal
from harness.guards.recompile import RecompileError, cold_in_memory_cache, guard_no_recompile
from harness.guards.specialization import kernel_name, specialization_key
from harness.warmup import warmup
from kernels import gather
from kernels.specialization import gpu_view
from kernels.warmup import ModelShape

SHAPE = ModelShape(nheads=2, headdim=4, dstate=8, ngroups=1, chunk_size=16)
STATE_DTYPES = (torch.float32, torch.float16)
KERNEL = gather._gather_initial_states_kernel


@dataclass(frozen=True)
class ColumnCase:
    """Indices = bt[rows_before:, idx_column] of an (rows_before + batch, columns) table; the mask likewise of
    its own table (mask_columns == 0: a contiguous mask vector)."""

    columns: int
    idx_column: int
    rows_before: int
    batch: int
    index_dtype: torch.dtype
    state_dtype: torch.dtype
    mask_columns: int = 0
    mask_column: int = 0
    row_pad: int = 0
    cache_offset: int = 0

    @property
    def id(self) -> str:
        i = "i32" if self.index_dtype == torch.int32 else "i64"
        s = str(self.state_dtype).split(".")[-1]
        return (f"bt{self.columns}c{self.idx_column}r{self.rows_before}b{self.batch}-{i}-{s}"
                f"-m{self.mask_columns}c{self.mask_column}-pad{self.row_pad}-off{self.cache_offset}")


I32, I64, F32, F16 = torch.int32, torch.int64, torch.float32, torch.float16
CASES = [
    ColumnCase(2, 0, 0, 3, I32, F32),  # stride 2 (other), aligned
    ColumnCase(2, 1, 0, 3, I32, F32),  # 4 bytes in: unaligned
    ColumnCase(3, 2, 1, 2, I32, F16),  # rows_before shifts alignment: (3 + 2) * 4 bytes
    ColumnCase(4, 0, 1, 4, I32, F32),  # 16 bytes per row: every row start aligned
    ColumnCase(4, 3, 2, 2, I64, F16),
    ColumnCase(5, 4, 0, 3, I32, F32),  # column 4 of int32: 16 bytes in, aligned
    ColumnCase(5, 4, 3, 3, I32, F16),  # ... unless leading decode rows move it
    ColumnCase(16, 0, 0, 2, I32, F32),  # stride a multiple of 16
    ColumnCase(16, 5, 1, 2, I64, F32),
    ColumnCase(17, 0, 1, 3, I32, F16),  # (17) * 4 bytes: unaligned start
    ColumnCase(32, 8, 2, 2, I64, F32),
    ColumnCase(1, 0, 1, 4, I64, F32),  # one column: stride 1 but 8 bytes in
    ColumnCase(3, 1, 0, 1, I64, F16),  # batch 1 (the indexed path's shape, here through the snapshot gather)
    ColumnCase(6, 2, 5, 3, I32, F32, mask_columns=3, mask_column=1),
    ColumnCase(7, 0, 0, 2, I64, F32, mask_columns=16, mask_column=0),
    ColumnCase(8, 7, 3, 2, I32, F16, mask_columns=17, mask_column=16, row_pad=1),
    ColumnCase(2, 0, 4, 3, I32, F32, row_pad=3, cache_offset=1),  # unaligned cache rows too
    ColumnCase(48, 33, 1, 2, I64, F16, mask_columns=2, mask_column=1, row_pad=16, cache_offset=8),
]
assert len({c.id for c in CASES}) == len(CASES) >= 18


def build(case: ColumnCase, device: str, seed: int = 0):
    """(state_cache, indices, mask, expected) for one case; masked rows point at a NaN-filled slot.

    Whole storages are moved to the device and the views taken there: ``view.to("cuda")`` of a column or padded
    view makes a contiguous, aligned copy, which would hide every class these cases exist for."""
    g = torch.Generator().manual_seed(seed)
    H, P, N = SHAPE.nheads, SHAPE.headdim, SHAPE.dstate
    slots, row = 6, H * P * N
    flat = torch.randn(case.cache_offset + slots * (row + case.row_pad), generator=g).to(case.state_dtype)
    cache_layout = ((slots, H, P, N), (row + case.row_pad, P * N, N, 1), case.cache_offset)
    cache = flat.as_strided(*cache_layout)
    cache[slots - 1] = float("nan")
    rows = case.rows_before + case.batch
    table = torch.randint(0, slots - 1, (rows, case.columns), generator=g, dtype=torch.int64).to(case.index_dtype)
    mask_vals = torch.arange(case.batch) % 3 != 1  # some rows masked off
    mask_table = torch.zeros(rows, max(case.mask_columns, 1), dtype=torch.bool)
    mask_table[case.rows_before:, case.mask_column] = mask_vals
    table[case.rows_before:, case.idx_column][~mask_vals] = slots - 1
    idx = table[case.rows_before:, case.idx_column]
    mask = mask_table[case.rows_before:, case.mask_column] if case.mask_columns else mask_vals.clone()
    expected = torch.where(mask[:, None, None, None], cache[idx.long()], torch.zeros((), dtype=case.state_dtype))

    def on_device(view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        moved = base.to(device)
        return moved.as_strided(view.shape, view.stride(), view.storage_offset())

    dev_mask = on_device(mask, mask_table) if case.mask_columns else mask.to(device)
    dev = on_device(cache, flat), on_device(idx, table), dev_mask
    for got, want in zip(dev, (cache, idx, mask), strict=True):
        assert got.stride() == want.stride() and got.data_ptr() % 16 == want.data_ptr() % 16, (got, want)
    return (*dev, expected)


def cold_gpu_cache(device):
    """The gather kernel's in-memory binaries set aside for the block on the GPU (nothing to set aside under the
    interpreter, where the guard compares launch keys with the warmed ones)."""
    return cold_in_memory_cache(KERNEL) if device == "cuda" else contextlib.nullcontext()


def _stride1_only(device):
    return warmup(device, SHAPE, [torch.float32], STATE_DTYPES, kernels=["gather"],
                  index_strides=(1,), index_alignments=(True,))


@pytest.fixture(scope="module")
def startup_warmup(device):
    report = warmup(device, SHAPE, [torch.float32], STATE_DTYPES, kernels=["gather"])
    print(report.summary())
    assert report.per_kernel[kernel_name(KERNEL)] == len(report.keys) > 0
    return report


def _specialized(param_name: str, flag: str) -> bool:
    """Whether the gather kernel specializes this argument (reads the decorator flags, not the key machinery)."""
    param = next(p for p in gpu_view(KERNEL).params if p.name == param_name)
    return not getattr(param, flag)


def _needs_more_than_stride1(idx: torch.Tensor, mask: torch.Tensor) -> bool:
    """Independent of the key code: a view falls outside a stride-1 aligned warmup iff a specialized argument
    of the kernel sees a different class (stride != 1, or an unaligned address)."""
    for t, ptr, stride in ((idx, "idx_ptr", "stride_idx"), (mask, "has_ptr", "stride_has")):
        if _specialized(stride, "do_not_specialize") and t.stride(0) != 1:
            return True
        if _specialized(ptr, "do_not_specialize_on_alignment") and t.data_ptr() % 16 != 0:
            return True
    return False


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_column_view_gather_is_warmed(case, startup_warmup, device):
    cache, idx, mask, expected = build(case, device)
    with guard_no_recompile([KERNEL], warmed=startup_warmup.keys):
        got = gather.gather_initial_states(cache, idx, mask)
    assert_bits_equal(got.cpu(), expected, what=f"gather {case.id}")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_column_view_needs_the_startup_warmup(case, device):
    """Each regression case is only covered because of the stride/alignment classes: a stride-1-only warmup
    misses exactly the cases whose views differ in a specialized class."""
    cache, idx, mask, _ = build(case, device)
    # On the GPU the module's full warmup has already compiled every class: set this kernel's in-memory binaries
    # aside so that a missing class really compiles (they are put back after, for the tests and cases that follow).
    with cold_gpu_cache(device):
        narrow = _stride1_only(device)
        if _needs_more_than_stride1(idx, mask):
            with pytest.raises(RecompileError, match="_gather_initial_states_kernel"):
                with guard_no_recompile([KERNEL], warmed=narrow.keys):
                    gather.gather_initial_states(cache, idx, mask)
        else:
            with guard_no_recompile([KERNEL], warmed=narrow.keys):
                gather.gather_initial_states(cache, idx, mask)


def test_negative_control_stride1_warmup_then_column_view_fires(device):
    """The guard must fire: warm stride-1 contiguous indices only, then call with a block-table column view."""
    case = ColumnCase(5, 1, 0, 3, I32, F32)  # stride 5, 4 bytes in
    cache, idx, mask, _ = build(case, device)
    if not _needs_more_than_stride1(idx, mask):
        pytest.skip("the gather kernel no longer specializes index stride or alignment: column views cannot "
                    "recompile it (its SCALAR_ONLY decision); the toy kernel in test_recompile_guard.py "
                    "keeps showing that the guard fires")
    with cold_gpu_cache(device):
        narrow = _stride1_only(device)
        with pytest.raises(RecompileError) as err:
            with guard_no_recompile([KERNEL], warmed=narrow.keys):
                gather.gather_initial_states(cache, idx, mask)
    assert "stride_idx: needed i32 other, closest warmed =1" in str(err.value), str(err.value)


def test_scalar_only_arguments_decision():
    """Decision (kernels.gather.SCALAR_ONLY): the gather reads one index and one mask element per program, so
    their alignment and stride classes only multiply binaries; so do the cache's (the rows' load width, on the
    unaligned rows and the unfused bench plan this kernel runs on). Measure what the decorator flags would save."""
    full = warmup("cpu", SHAPE, [torch.float32], STATE_DTYPES, kernels=["gather"])
    decided = gather.SCALAR_ONLY
    unspecialized = {p for flag in decided.values() for p in flag}
    assert unspecialized <= set(KERNEL.arg_names if hasattr(KERNEL, "arg_names") else []), unspecialized
    # keys with the decided arguments reduced to their type: what the kernel compiles once the flags are applied
    def erased(c: str) -> str:  # unspecialized: only the type remains ('=1' was an i32 constexpr)
        return "i32" if c.startswith("=") else c.split()[0]

    collapsed = {tuple((n, erased(c) if n in unspecialized else c) for n, c in k.params) for k in full.keys}
    print(f"gather: {len(full.keys)} specializations today, {len(collapsed)} with {decided}")
    already = not any(_specialized(p, flag) for flag in ("do_not_specialize_on_alignment", "do_not_specialize")
                      for p in decided[flag])
    # 2 alignments of each scalar-only pointer x 3 value classes of each scalar-only stride
    assert len(full.keys) == len(collapsed) * (1 if already else 2 * 2 * 3 * 3), (len(full.keys), len(collapsed))


def test_warmup_registration_tracks_the_kernel_signature():
    """A registration that lacks a parameter fails loudly instead of warming the wrong key."""
    from kernels.warmup import WarmupSpec, pointer, spec_keys

    spec = WarmupSpec(KERNEL, dict(cache_ptr=pointer(torch.float32)))
    with pytest.raises(KeyError, match="lacks parameters"):
        spec_keys(spec)
    with pytest.raises(TypeError, match="unknown parameters"):
        spec_keys(WarmupSpec(KERNEL, dict(not_a_param=1)))


def test_key_of_a_real_call_is_in_the_full_warmup(startup_warmup, device):
    """The registry's stand-in keys equal the keys of the real launcher's call (same argument list and options)."""
    from kernels.backend import fixed_block, pdl_arguments

    case = CASES[1]
    cache, idx, mask, _ = build(case, device)
    row = SHAPE.nheads * SHAPE.headdim * SHAPE.dstate
    key = specialization_key(KERNEL, (cache, idx, mask.view(torch.uint8), torch.empty(1, dtype=case.state_dtype),
                                      row, cache.stride(0), idx.stride(0), mask.stride(0), row, 0),
                             {"BLOCK_SIZE": fixed_block(row, gather.BLOCK_SIZE), "num_warps": gather.NUM_WARPS,
                              **pdl_arguments()})
    assert key.key in {k.key for k in startup_warmup.keys}
