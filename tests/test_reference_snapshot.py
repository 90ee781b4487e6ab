"""Snapshot gather/writeback and the reference provider's modes: padded, offset caches; NaN in masked slots;
negative final slots; strided int32/int64 index views; every other storage byte untouched."""

from __future__ import annotations

import pytest
import torch

from harness.compare import Mismatch, assert_bits_equal, assert_storage_equal, storage_bytes
from harness.random_inputs import make_inputs
from reference import provider
from reference.chunked import chunked_ssd
from reference.snapshot import gather_initial_states, write_final_states

H, P, N = 3, 5, 4


def padded_cache(slots=6, dtype=torch.bfloat16, row_pad=7, offset=3, seed=0):
    """(slots,H,P,N) view with stride(0) = H*P*N + row_pad and a storage offset; gaps hold NaN sentinels."""
    row = H * P * N + row_pad
    storage = torch.full((offset + slots * row,), float("nan"), dtype=dtype)
    cache = storage[offset:].view(slots, row)[:, : H * P * N].view(slots, H, P, N)
    cache.copy_(torch.randn(slots, H, P, N, generator=torch.Generator().manual_seed(seed)).to(dtype))
    return cache


def index_view(values, dtype, columns=3, column=1):
    """A block-table column view: stride ``columns``, pointer offset ``column`` elements."""
    table = torch.full((len(values), columns), -7, dtype=dtype)
    table[:, column] = torch.tensor(values, dtype=dtype)
    return table[:, column]


def storage_with(cache, saved, writes):
    """The bytes ``saved`` (storage_bytes of ``cache`` earlier) with only ``cache[slot] = value`` applied."""
    scratch = saved.clone().view(cache.dtype)
    view = scratch.as_strided(cache.shape, cache.stride(), cache.storage_offset())
    for slot, value in writes:
        view[slot] = value
    return scratch.view(torch.uint8)


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_gather_masks_nan_slot_to_zero(idx_dtype):
    cache = padded_cache()
    cache[4] = float("nan")
    idx = index_view([2, 4, 0], idx_dtype)
    has = torch.tensor([True, False, True])
    got = gather_initial_states(cache, idx, has)
    expected = torch.stack([cache[2], torch.zeros_like(cache[0]), cache[0]])
    assert_bits_equal(got, expected, what="gathered initial states")
    assert idx.stride(0) == 3


def test_gather_negative_control_nan_leaks_when_masking_by_multiplication():
    cache = padded_cache()
    cache[4] = float("nan")
    leaky = cache[torch.tensor([4])] * 0  # what torch.where avoids: NaN * 0 is NaN
    with pytest.raises(Mismatch):
        assert_bits_equal(leaky, gather_initial_states(cache, torch.tensor([4]), torch.tensor([False])))


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_writeback_skips_negative_slots_and_touches_nothing_else(idx_dtype):
    cache = padded_cache(dtype=torch.float16)
    before = storage_bytes(cache)
    finals = torch.randn(3, H, P, N).to(torch.float16)
    write_final_states(cache, index_view([5, -1, 1], idx_dtype), finals)
    assert_storage_equal(cache, storage_with(cache, before, [(5, finals[0]), (1, finals[2])]),
                         what="cache storage after writeback")


def test_writeback_negative_control_detects_a_write_to_a_gap():
    cache = padded_cache(dtype=torch.float16)
    before = storage_bytes(cache)
    write_final_states(cache, torch.tensor([-1]), torch.randn(1, H, P, N).to(torch.float16))
    assert_storage_equal(cache, before)  # nothing written for a negative slot
    gap = torch.empty(0, dtype=torch.float16).set_(cache.untyped_storage())
    gap[3 + H * P * N] = 1.0  # first padding element after slot 0's row
    with pytest.raises(Mismatch):
        assert_storage_equal(cache, before)


# ---- provider modes ----

def _provider_call(mode, *, path="auto", slots=(4, 4), final=(1, -1), has=(True, False), state_dtype=torch.float32):
    inp = make_inputs(contexts=[3, 64], tokens=[20, 9], chunk_size=16, nheads=H, headdim=P, dstate=N, ngroups=1,
                      io_dtype=torch.float32, state_dtype=state_dtype, seed=3)
    cache = padded_cache(dtype=state_dtype)
    cache[4] = float("nan") if not has[0] else cache[4]
    out = torch.empty_like(inp.x)
    kwargs = dict(chunk_size=16, out=out, D=inp.D, z=inp.z, dt_bias=inp.dt_bias, dt_softplus=True,
                  state_cache=cache, initial_state_indices=index_view(list(slots), torch.int32),
                  has_initial_states=torch.tensor(has), **inp.meta.tensors())
    if mode == "direct":
        kwargs["final_state_indices"] = index_view(list(final), torch.int64, columns=2, column=0)
    if mode == "checkpoint":
        kwargs["return_intermediate_states"] = True
    return inp, cache, out, kwargs


def test_provider_identity_and_indexed_refusal():
    assert provider.name == "reference"
    assert provider.supported_paths == {"snapshot"}
    inp, cache, out, kwargs = _provider_call("returned")
    with pytest.raises(ValueError, match="no indexed path"):
        provider.ssd_prefill(inp.x, inp.dt, inp.A, inp.B, inp.C, path="indexed", **kwargs)


def test_provider_direct_writes_final_slot_reading_the_slot_it_overwrites():
    """Sequence 0 reads slot 4 and writes slot 1; sequence 1 is masked and padded (-1). Output and final state
    equal the returned-mode call (snapshot semantics), and only slot 1 changes."""
    inp, cache_r, out_r, kw_r = _provider_call("returned", slots=(1, 4), has=(True, False))
    finals = provider.ssd_prefill(inp.x, inp.dt, inp.A, inp.B, inp.C, **kw_r)
    inp, cache, out, kw = _provider_call("direct", slots=(1, 4), final=(1, -1), has=(True, False))
    before = storage_bytes(cache)
    assert provider.ssd_prefill(inp.x, inp.dt, inp.A, inp.B, inp.C, path="snapshot", **kw) is None
    assert_bits_equal(out, out_r, what="direct vs returned output")
    assert_bits_equal(cache[1], finals[0], what="written final slot")
    assert_storage_equal(cache, storage_with(cache, before, [(1, finals[0])]), what="cache storage outside slot 1")


def test_provider_masked_nan_slot_equals_zero_initial_state():
    inp, _, out_nan, kw = _provider_call("returned", slots=(4, 4), has=(False, False))
    fin_nan = provider.ssd_prefill(inp.x, inp.dt, inp.A, inp.B, inp.C, **kw)
    assert torch.isnan(kw["state_cache"][4]).all()
    inp, cache, out_zero, kw0 = _provider_call("returned", slots=(4, 4), has=(True, True))
    cache[4] = 0.0
    fin_zero = provider.ssd_prefill(inp.x, inp.dt, inp.A, inp.B, inp.C, **kw0)
    assert_bits_equal(out_nan, out_zero)
    assert_bits_equal(fin_nan, fin_zero)


def test_provider_checkpoint_returns_chunk_end_states_and_writes_nothing():
    inp, cache, out, kw = _provider_call("checkpoint", slots=(2, 3), has=(True, True))
    before = storage_bytes(cache)
    ends = provider.ssd_prefill(inp.x, inp.dt, inp.A, inp.B, inp.C, **kw)
    assert ends.shape == (inp.meta.nchunks, H, P, N) and ends.dtype == cache.dtype
    assert_storage_equal(cache, before)
    _, _, _, kw_r = _provider_call("returned", slots=(2, 3), has=(True, True))
    finals = chunked_ssd(inp.x, inp.dt, inp.A, inp.B, inp.C, **kw_r)
    for b, last in enumerate(inp.meta.last_chunk_indices):
        assert_bits_equal(ends[last], finals[b], what=f"chunk-end state of sequence {b}'s last chunk")
