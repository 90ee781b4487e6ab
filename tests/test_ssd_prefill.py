"""``kernels.ssd_prefill`` end to end: vs the fp64 sequential reference within harness.bounds' derived bound,
cache storage outside the written final slots unchanged byte for byte, and determinism."""

from __future__ import annotations

import pytest
import torch

from harness import bounds
from harness.cases.builder import build_inputs
from harness.checks.bound import ground_truth_for
from harness.compare import Mismatch, assert_bits_equal, assert_within_bound, storage_bytes
from kernels import provider, ssd_prefill
from kernels.environment import arithmetic_profile
from tests.support import DSTATE, NHEADS, make_case


def ground_truth(inputs, *, checkpoint=False):
    """fp64 sequential (out, finals[, chunk ends]), the magnitude shadows and the chunk-end shadow, from the inputs
    BEFORE the call (the call may overwrite the initial-state slots): the reference_bound check's own."""
    return ground_truth_for(inputs, inputs.cu_chunk_seqlens[1:] if checkpoint else None)


def bound_dims(inputs) -> dict:
    case = inputs.case
    profile = arithmetic_profile(inputs.out.device.type)  # the kernels' arithmetic where the call ran
    terms = bounds.input_error_terms(
        inputs.dt, inputs.A, cu_chunk_seqlens=inputs.cu_chunk_seqlens, seq_idx=inputs.seq_idx,
        dt_bias=inputs.dt_bias, dt_softplus=case.options.dt_softplus, dt_limit=case.options.dt_limit, z=inputs.z,
        backend=profile,
    )
    return dict(io_dtype=case.dtype.io_torch, state_dtype=case.dtype.state_torch, chunk_size=case.shape.chunk_size,
                dstate=case.shape.dstate, backend=profile, **terms.as_kwargs())


def assert_call_within_bound(inputs, returned, truth, shadows, chunk_shadow, final_slots):
    """out, and the final states (written slots / returned) or chunk-end states, within the derived bounds."""
    dims = bound_dims(inputs)
    out_bound = bounds.ssd_output_bound(shadows.out, truth[0], shadows=shadows, **dims)
    assert_within_bound(inputs.out, truth[0], out_bound, what="out vs fp64 sequential reference")
    mode = inputs.case.call.final_state
    if mode == "checkpoint":
        bound = bounds.final_state_bound(chunk_shadow, truth[2], **dims)
        assert_within_bound(returned, truth[2], bound, what="chunk-end states vs fp64 sequential reference")
        return
    final_bound = bounds.final_state_bound(shadows.final_states, truth[1], shadows=shadows, **dims)
    if mode == "returned":
        assert_within_bound(returned, truth[1], final_bound, what="returned final states vs fp64 reference")
        return
    assert returned is None, f"direct writeback returned {type(returned)}"
    for b, slot in enumerate(final_slots):
        if slot >= 0:
            assert_within_bound(inputs.state_cache[slot], truth[1][b], final_bound[b],
                                what=f"final state of sequence {b} in slot {slot} vs fp64 reference")


def call(inputs, *, path="auto", **extra):
    kwargs = inputs.kwargs(path=path)
    return ssd_prefill(**kwargs, **extra)


# ---- vs the fp64 sequential reference --------------------------------------------------------------------------

DTYPE_PAIRS = [("float32", "float32"), ("bfloat16", "float32"), ("float16", "float16"), ("bfloat16", "bfloat16"),
               ("float16", "bfloat16")]
BATCHES = {
    "one": [(70, 100, 2, True, 5)],
    "two-crossed": [(0, 60, 2, True, 5), (130, 70, 5, True, 2)],
    "three": [(5, 40, 1, True, 6), (64, 64, 3, False, -1), (200, 90, 4, True, 4)],
}


# Every dtype pair on every batch through the snapshot path; the one-sequence batch also through indexed and auto.
DIRECT_CALLS = ([(pair, batch, "snapshot") for pair in DTYPE_PAIRS for batch in sorted(BATCHES)]
                + [(pair, "one", "indexed") for pair in DTYPE_PAIRS]
                + [(pair, "one", "auto") for pair in (DTYPE_PAIRS[0], DTYPE_PAIRS[3])])


@pytest.mark.parametrize("pair,batch,path", DIRECT_CALLS, ids=lambda v: "-".join(v) if isinstance(v, tuple) else v)
def test_direct_writeback_within_bound(pair, batch, path, device):
    (io, state), seqs = pair, BATCHES[batch]
    inputs = build_inputs(make_case(seqs, io=io, state=state), device)
    truth = ground_truth(inputs)
    returned = call(inputs, path=path)
    assert_call_within_bound(inputs, returned, *truth, final_slots=[s[4] for s in seqs])


@pytest.mark.parametrize("io,state", [("float32", "float32"), ("bfloat16", "float16")], ids=lambda v: v)
@pytest.mark.parametrize("mode", ("returned", "checkpoint"))
def test_returned_and_checkpoint_within_bound(io, state, mode, device):
    seqs = BATCHES["three"]
    inputs = build_inputs(make_case(seqs, io=io, state=state, mode=mode), device)
    truth = ground_truth(inputs, checkpoint=mode == "checkpoint")
    returned = call(inputs)
    expect_shape = (inputs.metadata.nchunks if mode == "checkpoint" else len(seqs), NHEADS, 5, DSTATE)  # headdim 5
    assert tuple(returned.shape) == expect_shape and returned.dtype == inputs.state_cache.dtype
    assert_call_within_bound(inputs, returned, *truth, final_slots=[])


@pytest.mark.gpu(reason="production-size shapes are too slow for the interpreter")
@pytest.mark.parametrize("io,state", [("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float16")])
@pytest.mark.parametrize("path", ("snapshot", "indexed"))
def test_production_shape_within_bound_on_cuda(io, state, path, device):
    seqs = [(4224, 600, 3, True, 3)] if path == "indexed" else [(4224, 32, 3, True, 5), (0, 1600, 5, False, 3),
                                                                 (528, 600, 7, True, 7)]
    case = make_case(seqs, io=io, state=state, headdim=64, nheads=8, dstate=128, ngroups=2, chunk_size=256,
                     slots=12, row_pad=64, offset=8)
    inputs = build_inputs(case, device)
    truth = ground_truth(inputs)
    returned = call(inputs, path=path)
    assert_call_within_bound(inputs, returned, *truth, final_slots=[s[4] for s in seqs])


def test_bound_check_catches_a_dropped_initial_state(device):
    """Negative control: the same bound check, fed the output of a call whose initial state was dropped (mask
    forced off), reports the difference."""
    seqs = [(70, 30, 2, True, 5)]
    inputs = build_inputs(make_case(seqs, io="float32", state="float32"), device)
    truth = ground_truth(inputs)
    kwargs = inputs.kwargs(path="snapshot")
    kwargs["has_initial_states"] = torch.zeros_like(inputs.has_initial_states)
    ssd_prefill(**kwargs)
    with pytest.raises(Mismatch, match="exceed the derived bound"):
        assert_call_within_bound(inputs, None, *truth, final_slots=[5])


# ---- storage outside the written final slots ---------------------------------------------------------------------

def written_rows_mask(inputs, slots) -> torch.Tensor:
    """(storage elements,) bool: True on the rows of ``slots`` (non-negative ones) in the cache's storage."""
    base, cache = inputs.cache_base, inputs.state_cache
    mask = torch.zeros(base.untyped_storage().nbytes() // base.element_size(), dtype=torch.bool)
    row = cache[0].numel()
    for slot in {s for s in slots if s >= 0}:
        start = cache.storage_offset() + slot * cache.stride(0)
        mask[start:start + row] = True
    return mask


def assert_untouched_outside(inputs, before: torch.Tensor, slots) -> None:
    """Every storage element outside the rows of ``slots`` equals ``before`` (bytes from ``storage_bytes``)."""
    dtype = inputs.cache_base.dtype
    keep = ~written_rows_mask(inputs, slots)
    after = storage_bytes(inputs.cache_base).view(dtype)
    assert_bits_equal(after[keep], before.view(dtype)[keep], what=f"cache storage outside final slots {sorted(slots)}")


STORAGE_CASES = {
    # name: (sequences, mode, fill)
    "shuffled-nan-gaps": ([(0, 50, 6, True, 1), (70, 60, 1, False, 7), (10, 40, 3, True, -1)], "direct", "nan"),
    "finite-sentinel": ([(0, 50, 6, True, 1), (70, 60, 1, True, 7)], "direct", -3.25),
    "one-in-place": ([(100, 80, 4, True, 4)], "direct", "nan"),
    "one-masked-negative": ([(100, 80, 4, False, -1)], "direct", -3.25),
    "returned": ([(0, 50, 6, True, 1), (70, 60, 1, True, 7)], "returned", "nan"),
    "checkpoint": ([(0, 50, 6, True, 1), (70, 60, 1, True, 7)], "checkpoint", -3.25),
}


STORAGE_CALLS = [(name, "auto") for name in sorted(STORAGE_CASES)] + [
    ("one-in-place", "indexed"), ("one-masked-negative", "indexed")]  # indexed: one sequence, direct writeback


@pytest.mark.parametrize("name,path", STORAGE_CALLS)
def test_storage_outside_final_slots_unchanged(name, path, device):
    seqs, mode, fill = STORAGE_CASES[name]
    inputs = build_inputs(make_case(seqs, io="bfloat16", state="float16", mode=mode, fill=fill, slots=9,
                                    row_pad=40, offset=13), device)
    before = storage_bytes(inputs.cache_base)
    call(inputs, path=path)
    written = [s[4] for s in seqs] if mode == "direct" else []
    assert_untouched_outside(inputs, before, written)


def test_storage_check_catches_a_stray_write(device):
    """Negative control: one element written into a gap after the call is reported."""
    seqs, mode, fill = STORAGE_CASES["shuffled-nan-gaps"]
    inputs = build_inputs(make_case(seqs, io="bfloat16", state="float16", fill=fill, row_pad=40, offset=13), device)
    before = storage_bytes(inputs.cache_base)
    call(inputs)
    gap = inputs.state_cache.storage_offset() + 2 * inputs.state_cache.stride(0) - 1  # last pad element of row 1
    inputs.cache_base.view(-1)[gap] = 0.0
    with pytest.raises(Mismatch, match="outside final slots"):
        assert_untouched_outside(inputs, before, [s[4] for s in seqs])


# ---- determinism -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path,mode", [("auto", "direct"), ("indexed", "direct"), ("auto", "returned"),
                                       ("auto", "checkpoint")])
def test_second_identical_call_gives_identical_bits(path, mode, device):
    seqs = [(70, 100, 2, True, 2)] if path == "indexed" else [(0, 60, 2, True, 5), (130, 70, 5, True, 2)]
    first = build_inputs(make_case(seqs, io="bfloat16", state="bfloat16", mode=mode), device)
    second = first.clone()
    r1 = call(first, path=path)
    r2 = call(second, path=path)
    assert_bits_equal(second.out, first.out, what="out, second call vs first")
    assert_bits_equal(storage_bytes(second.cache_base), storage_bytes(first.cache_base),
                      what="cache storage, second call vs first")
    if r1 is not None or r2 is not None:
        assert_bits_equal(r2, r1, what="returned states, second call vs first")


# ---- provider ----------------------------------------------------------------------------------------------------

def test_provider_interface(device):
    assert provider.name == "triton-ssd"
    assert set(provider.supported_paths) == {"snapshot", "indexed"}
    inputs = build_inputs(make_case([(0, 20, 1, False, 3)], mode="returned"), device)
    via_provider = provider.ssd_prefill(**inputs.kwargs())
    again = inputs.clone()
    direct = ssd_prefill(**again.kwargs())
    assert_bits_equal(via_provider, direct, what="provider.ssd_prefill vs kernels.ssd_prefill")


def test_unknown_path_is_rejected(device):
    inputs = build_inputs(make_case([(0, 20, 1, False, 3)]), device)
    with pytest.raises(ValueError, match="path"):
        call(inputs, path="fast")
