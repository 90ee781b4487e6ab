"""The input builder: cache and index layouts, sentinel fill, NaN-poisoned out, seeding, clone aliasing."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from harness.cases.builder import build_inputs, generator_for
from harness.cases.model import CacheSpec, CallSpec, Case, IndicesSpec, Options, SequenceSpec, Shape, Tiers
from harness.compare import int_view, storage_bytes


def make_case(**changes) -> Case:
    """Two sequences (one masked) over a padded, offset cache with block-table indices."""
    case = Case.create(
        "builder-test",
        seed=11,
        shape=Shape(nheads=3, headdim=5, dstate=16, ngroups=3, chunk_size=16),
        dtype=("bfloat16", "float16"),
        options=Options(D="per_channel", z=True, dt_bias=True, dt_softplus=True),
        sequences=[(5, 20, 2, True, 4), (0, 7, 1, False, 2)],
        cache=CacheSpec(slots=6, row_pad=3, offset=5, fill=-7.25),
        indices=IndicesSpec("block_table", "int32", columns=5, init_column=1, final_column=3, rows_before=1),
        family="builder",
    )
    assert case.tiers == Tiers() and case.cpu_blocks() == 9  # the CPU tier by estimate: 3 chunks x 3 heads
    return replace(case, **changes)


def _gap_mask(case: Case) -> torch.Tensor:
    """True for cache_base elements outside every slot row (before the offset and in the row padding)."""
    sh, c = case.shape, case.cache
    row = sh.nheads * sh.headdim * sh.dstate
    mask = torch.ones(c.offset + c.slots * (row + c.row_pad), dtype=torch.bool)
    for s in range(c.slots):
        start = c.offset + s * (row + c.row_pad)
        mask[start : start + row] = False
    return mask


def test_shapes_and_dtypes():
    case = make_case()
    inp = build_inputs(case)
    T, H, P, N, G = 27, 3, 5, 16, 3
    assert inp.x.shape == (T, H, P) and inp.x.dtype == torch.bfloat16
    assert inp.dt.shape == (T, H) and inp.dt.dtype == torch.float32
    assert inp.A.shape == (H,) and bool((inp.A <= -1).all()) and bool((inp.A >= -16).all())
    assert inp.B.shape == inp.C.shape == (T, G, N) and inp.B.dtype == torch.bfloat16
    assert inp.D.shape == (H, P) and inp.z.shape == (T, H, P) and inp.dt_bias.shape == (H,)
    assert inp.out.shape == (T, H, P) and inp.out.dtype == torch.bfloat16
    assert inp.has_initial_states.tolist() == [True, False]
    assert inp.cu_seqlens.tolist() == [0, 20, 27] and inp.cu_seqlens.dtype == torch.int32
    assert inp.seq_idx.tolist() == list(case.metadata().seq_idx)
    no_options = build_inputs(replace(case, options=Options()))
    assert no_options.D is None and no_options.z is None and no_options.dt_bias is None
    assert bool((no_options.dt > 0).all())  # without softplus dt is used as is, so it must be positive


def test_cache_layout_stride_offset_and_sentinel_fill():
    case = make_case()
    inp = build_inputs(case)
    row = 3 * 5 * 16
    sc = inp.state_cache
    assert sc.shape == (6, 3, 5, 16) and sc.dtype == torch.float16
    assert sc.stride() == (row + 3, 5 * 16, 16, 1) and sc.storage_offset() == 5
    assert sc.untyped_storage().data_ptr() == inp.cache_base.untyped_storage().data_ptr()
    assert inp.cache_base.numel() == 5 + 6 * (row + 3)
    gaps = inp.cache_base[_gap_mask(case)]
    assert gaps.numel() == 5 + 6 * 3
    assert bool((int_view(gaps) == int_view(torch.tensor(-7.25, dtype=torch.float16))).all())
    # Slot 1 is read only by the masked sequence: NaN. Every other slot holds a finite random state.
    assert bool(sc[1].isnan().all())
    for s in (0, 2, 3, 4, 5):
        assert bool(sc[s].isfinite().all()) and float(sc[s].abs().max()) > 0


def test_nan_fill_fills_every_gap_with_nan():
    case = make_case(cache=CacheSpec(slots=6, row_pad=64, offset=8, fill="nan"))
    inp = build_inputs(case)
    assert bool(inp.cache_base[_gap_mask(case)].isnan().all())
    assert not bool(inp.state_cache[2].isnan().any())


def test_gap_check_sees_a_wrong_fill():
    """Negative control for the sentinel test: a cache whose gaps were overwritten fails the same comparison."""
    case = make_case()
    inp = build_inputs(case)
    inp.cache_base[0] = 0.0
    gaps = inp.cache_base[_gap_mask(case)]
    assert not bool((int_view(gaps) == int_view(torch.tensor(-7.25, dtype=torch.float16))).all())


@pytest.mark.parametrize(("state", "offset", "lowest"), [("float16", 5, -1), ("float32", 0, -1), ("float32", 7, -3)])
def test_negative_final_slots_get_their_row_inside_the_storage(state, offset, lowest):
    """The row ``slot * stride(0)`` before slot 0 lies in the storage, filled with the sentinel, whatever the offset;
    the guard keeps the pointer's 16-byte alignment class and the slots' contents."""
    case = make_case(dtype=replace(make_case().dtype, state=state),
                     sequences=(SequenceSpec(5, 20, 2, True, lowest), SequenceSpec(0, 7, 1, False, 2)),
                     cache=CacheSpec(slots=6, row_pad=3, offset=offset, fill=-7.25))
    plain = build_inputs(replace(case, sequences=(SequenceSpec(5, 20, 2, True, 4), case.sequences[1])))
    inp = build_inputs(case)
    sc, guard, item = inp.state_cache, case.cache_guard(), inp.cache_base.element_size()
    assert guard > 0 and guard * item % 16 == 0
    assert sc.storage_offset() == guard + offset and inp.cache_base.numel() == plain.cache_base.numel() + guard
    assert 0 <= sc.storage_offset() + lowest * sc.stride(0) < 16 // item  # the row's start, no more room than that
    assert sc.data_ptr() % 16 == plain.state_cache.data_ptr() % 16
    lead = inp.cache_base[: sc.storage_offset()]
    assert bool((int_view(lead) == int_view(torch.tensor(-7.25, dtype=sc.dtype))).all())
    for s in range(6):
        assert torch.equal(int_view(sc[s]), int_view(plain.state_cache[s])), s


def test_no_guard_without_negative_direct_slots():
    assert make_case().cache_guard() == 0
    returned = make_case(sequences=(SequenceSpec(5, 20, 2, True), SequenceSpec(0, 7, 1, False)),
                         call=CallSpec("returned"), indices=IndicesSpec())
    assert returned.cache_guard() == 0
    room = make_case(sequences=(SequenceSpec(5, 20, 2, True, -1), SequenceSpec(0, 7, 1, False, 2)),
                     cache=CacheSpec(slots=6, row_pad=3, offset=3 * 5 * 16 + 3, fill=-7.25))
    assert room.cache_guard() == 0  # the offset holds slot -1's row already


def test_block_table_column_views():
    case = make_case()
    inp = build_inputs(case)
    table, init, final = inp.index_table, inp.initial_state_indices, inp.final_state_indices
    assert table.shape == (1 + 2, 5) and table.dtype == torch.int32
    assert init.stride() == final.stride() == (5,)
    assert init.tolist() == [2, 1] and final.tolist() == [4, 2]
    assert init.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()
    item = 4
    assert init.data_ptr() - table.data_ptr() == (1 * 5 + 1) * item == case.indices.column_byte_offset(1)
    assert final.data_ptr() - table.data_ptr() == (1 * 5 + 3) * item
    # Other entries hold valid slots, so a misread shows as wrong data rather than a memory fault.
    assert bool(((table >= 0) & (table < 6)).all())


@pytest.mark.parametrize(
    "indices, init_aligned, final_aligned",
    [
        (IndicesSpec("block_table", "int32", 8, 0, 4, 2), True, True),  # byte offsets 64, 80
        (IndicesSpec("block_table", "int32", 5, 1, 2, 1), False, False),  # 24, 28
        (IndicesSpec("block_table", "int64", 16, 1, 2, 1), False, True),  # 136, 144
        (IndicesSpec("block_table", "int64", 3, 0, 2, 1), False, False),  # 24, 40
    ],
)
def test_block_table_pointer_alignment(indices, init_aligned, final_aligned):
    inp = build_inputs(make_case(indices=indices))
    assert inp.index_table.data_ptr() % 16 == 0  # allocations are aligned; the column offset decides
    assert (inp.initial_state_indices.data_ptr() % 16 == 0) == init_aligned
    assert (inp.final_state_indices.data_ptr() % 16 == 0) == final_aligned
    assert inp.initial_state_indices.dtype == (torch.int32 if indices.dtype == "int32" else torch.int64)


def test_contiguous_indices_and_in_place_sharing():
    contiguous = IndicesSpec("contiguous", "int64")
    inp = build_inputs(make_case(indices=contiguous))
    assert inp.index_table is None and inp.initial_state_indices.is_contiguous()
    assert inp.initial_state_indices.dtype == torch.int64
    assert inp.initial_state_indices.data_ptr() != inp.final_state_indices.data_ptr()
    in_place = make_case(indices=contiguous, sequences=(SequenceSpec(5, 20, 2, True, 2),))
    shared = build_inputs(in_place)
    assert shared.initial_state_indices is shared.final_state_indices  # vLLM passes one tensor for both


def test_negative_final_slot_is_kept():
    inp = build_inputs(make_case(sequences=(SequenceSpec(5, 20, 2, True, -1), SequenceSpec(0, 7, 1, False, 2))))
    assert inp.final_state_indices.tolist() == [-1, 2]


def test_kwargs_poison_out_and_follow_the_call():
    case = make_case()
    inp = build_inputs(case)
    inp.out.zero_()
    kw = inp.kwargs()
    assert kw["out"] is inp.out and bool(inp.out.isnan().all())
    assert kw["final_state_indices"] is inp.final_state_indices and not kw["return_intermediate_states"]
    assert kw["path"] == "auto" and kw["chunk_size"] == 16 and kw["dt_softplus"] is True
    assert kw["state_cache"] is inp.state_cache and kw["dt_limit"] == (0.0, math.inf)
    returned = inp.kwargs(path="snapshot", final_state="returned")
    assert returned["final_state_indices"] is None and returned["path"] == "snapshot"
    assert inp.kwargs(final_state="checkpoint")["return_intermediate_states"] is True
    ckpt = build_inputs(
        make_case(
            call=CallSpec("checkpoint", "auto"),
            sequences=(SequenceSpec(5, 20, 2, True), SequenceSpec(0, 7, 1, False)),
            indices=IndicesSpec("block_table", "int32", 5, 1, None, 1),
        )
    )
    assert ckpt.final_state_indices is None
    with pytest.raises(ValueError, match="needs final slots"):
        ckpt.kwargs(final_state="direct")


def _all_bits(inp) -> dict[str, torch.Tensor]:
    out = {k: storage_bytes(t).clone() for k, t in inp.tensor_fields().items() if k != "out"}
    return out


def test_same_seed_same_tensors_other_seed_other_tensors():
    case = make_case()
    a, b = _all_bits(build_inputs(case)), _all_bits(build_inputs(case))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    c = build_inputs(replace(case, seed=12))
    assert not torch.equal(storage_bytes(c.x), a["x"])


def test_options_do_not_shift_other_tensors():
    """Each tensor has its own generator: switching z or D off leaves x, B, C and the states as they were."""
    case = make_case()
    a = build_inputs(case)
    b = build_inputs(replace(case, options=replace(case.options, z=False, D="none")))
    for name in ("x", "B", "C", "dt", "A", "cache_base"):
        assert torch.equal(storage_bytes(getattr(a, name)), storage_bytes(getattr(b, name))), name


def test_generators_are_distinct_per_stream():
    x = torch.rand(4, generator=generator_for(1, "x"))
    assert not torch.equal(x, torch.rand(4, generator=generator_for(1, "z")))
    assert torch.equal(x, torch.rand(4, generator=generator_for(1, "x")))


def test_clone_preserves_layout_values_and_aliasing():
    inp = build_inputs(make_case())
    cl = inp.clone()
    for name, t in inp.tensor_fields().items():
        c = getattr(cl, name)
        assert c.shape == t.shape and c.stride() == t.stride() and c.storage_offset() == t.storage_offset(), name
        assert c.dtype == t.dtype and torch.equal(storage_bytes(c), storage_bytes(t)), name
        assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr(), name
    ptr = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    assert ptr(cl.state_cache) == ptr(cl.cache_base)
    assert ptr(cl.initial_state_indices) == ptr(cl.final_state_indices) == ptr(cl.index_table)
    assert cl.initial_state_indices.data_ptr() - cl.index_table.data_ptr() == 24
    # Writes through one view show through the other, as in the original.
    cl.state_cache[0].fill_(0.0)
    assert bool((cl.cache_base[5 : 5 + 240] == 0).all())
    assert not bool((inp.cache_base[5 : 5 + 240] == 0).all())


def test_clone_keeps_shared_index_tensor_shared():
    case = make_case(indices=IndicesSpec("contiguous", "int32"), sequences=(SequenceSpec(5, 20, 2, True, 2),))
    cl = build_inputs(case).clone()
    assert cl.initial_state_indices.data_ptr() == cl.final_state_indices.data_ptr()


def test_read_only_tensors_exclude_outputs_and_cache():
    inp = build_inputs(make_case())
    ro = inp.read_only_tensors()
    assert {"x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state_indices", "final_state_indices"} <= set(ro)
    assert {"index_table", "has_initial_states", "cu_seqlens", "seq_idx"} <= set(ro)
    assert not {"out", "cache_base", "state_cache"} & set(ro)
