"""Chunked reference (five stages, fp32 with the kernels' roundings) vs the fp64 sequential scan, within the derived
bound of harness.bounds; and the negative controls showing each comparison can fail."""

from __future__ import annotations

import pytest
import torch

from harness import bounds
from harness.compare import Mismatch, assert_within_bound
from reference import chunked
from reference.random_inputs import SsdInputs, make_inputs
from reference.sequential import magnitude_shadows, sequential_ssd

PROFILE = "interpreter"  # CPU tensors: the arithmetic our kernels follow under the interpreter
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def run_chunked(inp: SsdInputs, state_dtype, *, mode="returned", has_state=True, initial_override=None):
    """Chunked reference through ``chunked_ssd`` with a NaN-filled padded cache holding the initial states."""
    m = inp.meta.tensors()
    batch, (T, H, P), N = inp.meta.batch, inp.x.shape, inp.B.shape[-1]
    storage = torch.full((batch + 2, H, P * N + 8), float("nan"), dtype=state_dtype)
    cache = storage[:, :, 4: 4 + P * N].unflatten(-1, (P, N))[1:]  # padded rows and a storage offset
    init = inp.initial_states if initial_override is None else initial_override
    has = torch.full((batch,), has_state and init is not None, dtype=torch.bool)
    if init is not None:
        cache[:batch] = init.to(state_dtype)
    out = torch.empty_like(inp.x)
    res = chunked.chunked_ssd(
        inp.x, inp.dt, inp.A, inp.B, inp.C, chunk_size=inp.meta.chunk_size, out=out, D=inp.D, z=inp.z,
        dt_bias=inp.dt_bias, dt_softplus=inp.dt_softplus, state_cache=cache,
        initial_state_indices=torch.arange(batch), has_initial_states=has,
        return_intermediate_states=(mode == "checkpoint"), profile=PROFILE, **m,
    )
    return out, res


def ground_truth(inp: SsdInputs, state_dtype):
    m = inp.meta.tensors()
    h0 = None if inp.initial_states is None else inp.initial_states.to(state_dtype)
    kw = dict(cu_seqlens=m["cu_seqlens"], D=inp.D, z=inp.z, dt_bias=inp.dt_bias, dt_softplus=inp.dt_softplus,
              initial_states=h0)
    out, final, ends = sequential_ssd(inp.x, inp.dt, inp.A, inp.B, inp.C, exit_offsets=m["cu_chunk_seqlens"][1:], **kw)
    shadows = magnitude_shadows(inp.x, inp.dt, inp.A, inp.B, inp.C, chunk_size=inp.meta.chunk_size, **kw)
    _, _, end_shadow = sequential_ssd(inp.x, inp.dt, inp.A, inp.B, inp.C, magnitude=True,
                                      exit_offsets=m["cu_chunk_seqlens"][1:], **kw)
    return out, final, ends, shadows, end_shadow


def derived_bounds(inp: SsdInputs, state_dtype, ref_out, ref_final, shadows):
    m = inp.meta.tensors()
    terms = bounds.input_error_terms(inp.dt, inp.A, cu_chunk_seqlens=m["cu_chunk_seqlens"], seq_idx=m["seq_idx"],
                                     dt_bias=inp.dt_bias, dt_softplus=inp.dt_softplus, z=inp.z, backend=PROFILE)
    common = dict(io_dtype=inp.x.dtype, state_dtype=state_dtype, chunk_size=inp.meta.chunk_size,
                  dstate=inp.B.shape[-1], backend=PROFILE, shadows=shadows, **terms.as_kwargs())
    return (bounds.ssd_output_bound(shadows.out, ref_out, **common),
            bounds.final_state_bound(shadows.final_states, ref_final, **common), common)


# (id, contexts, tokens, chunk, headdim, dstate, ngroups, io, state, D, z, initial)
CASES = [
    ("fp32-ctx0-N16", [0], [150], 64, 40, 16, 3, F32, F32, "per_head", True, True),
    ("fp16-ctx0-N16", [0], [150], 64, 40, 16, 3, F16, F16, "per_channel", True, True),
    ("bf16-ctx0-N16", [0], [150], 64, 40, 16, 3, BF16, BF16, "per_head", True, True),
    ("bf16-ctx1-N128", [1], [140], 64, 24, 128, 3, BF16, BF16, "per_channel", False, True),
    ("fp16-ctx63-N128", [63], [100], 64, 24, 128, 1, F16, F16, None, True, True),
    ("fp32-ctx64-noinit", [64], [130], 64, 40, 16, 3, F32, F32, "per_head", False, False),
    ("bf16-ctx127-fp32state", [127], [120], 64, 40, 16, 3, BF16, F32, "per_head", True, True),
    ("bf16-ctx4224-Q256", [4224], [300], 256, 40, 16, 3, BF16, BF16, "per_channel", True, True),
    ("fp16-ctx4224-Q256-N128", [4224], [280], 256, 24, 128, 3, F16, F16, "per_head", False, True),
    ("fp32-Q256-3seq", [4224, 0, 255], [40, 300, 3], 256, 40, 16, 3, F32, F32, "per_channel", True, True),
    ("bf16-3seq-single-tokens", [127, 0, 64], [1, 90, 1], 64, 40, 16, 3, BF16, BF16, "per_head", True, True),
    ("fp16-3seq-noinit", [1, 63, 64], [70, 1, 66], 64, 40, 128, 3, F16, F16, "per_channel", True, False),
    ("bf16-fp16state-noz", [5, 0], [80, 64], 64, 40, 16, 3, BF16, F16, None, False, True),
    ("fp32-single-token", [127], [1], 64, 40, 16, 3, F32, F32, "per_head", True, True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_chunked_matches_sequential_within_derived_bound(case, record_property):
    _, ctx, tok, q, p, n, g, io, st, d, z, init = case
    inp = make_inputs(contexts=ctx, tokens=tok, chunk_size=q, nheads=3, headdim=p, dstate=n, ngroups=g,
                      io_dtype=io, state_dtype=st, D=d, z=z, initial=init, seed=len(ctx) * 31 + q + n + p)
    ref_out, ref_final, ref_ends, shadows, end_shadow = ground_truth(inp, st)
    out_bound, final_bound, common = derived_bounds(inp, st, ref_out, ref_final, shadows)
    out, final = run_chunked(inp, st, mode="returned")
    s_out = assert_within_bound(out, ref_out, out_bound, what="chunked output")
    s_fin = assert_within_bound(final, ref_final, final_bound, what="chunked final states")
    _, ends = run_chunked(inp, st, mode="checkpoint")
    end_bound = bounds.final_state_bound(end_shadow, ref_ends, **{**common, "shadows": None})
    s_end = assert_within_bound(ends, ref_ends, end_bound, what="chunked chunk-end states")
    record_property("bound_use", {"out": s_out.max_bound_use, "final": s_fin.max_bound_use,
                                  "chunk_end": s_end.max_bound_use})
    print(f"bound use: out {s_out.max_bound_use:.3g} final {s_fin.max_bound_use:.3g} "
          f"chunk_end {s_end.max_bound_use:.3g} (max ulp out {s_out.max_ulp})")


# ---- negative controls: each comparison above can fail ----

def _tight_case(io=BF16, *, ngroups=3, nheads=3, contexts=(0,), tokens=(150,), z=True):
    inp = make_inputs(contexts=list(contexts), tokens=list(tokens), chunk_size=64, nheads=nheads, headdim=40,
                      dstate=16, ngroups=ngroups, io_dtype=io, state_dtype=io, D="per_head", z=z, seed=5)
    ref_out, ref_final, _, shadows, _ = ground_truth(inp, io)
    out_bound, final_bound, _ = derived_bounds(inp, io, ref_out, ref_final, shadows)
    return inp, ref_out, ref_final, out_bound, final_bound


@pytest.mark.parametrize("io", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
def test_perturbed_ground_truth_is_caught(io):
    """One element of the fp64 truth moved just past its bound (output and final state) must be reported."""
    inp, ref_out, ref_final, out_bound, final_bound = _tight_case(io)
    out, final = run_chunked(inp, io)
    assert_within_bound(out, ref_out, out_bound)
    bad_out = ref_out.clone()
    bad_out[17, 1, 5] = out[17, 1, 5].double() + 1.001 * out_bound[17, 1, 5]
    with pytest.raises(Mismatch) as err:
        assert_within_bound(out, bad_out, out_bound)
    assert err.value.count == 1
    bad_final = ref_final.clone()
    bad_final[0, 2, 3, 4] = final[0, 2, 3, 4].double() - 1.001 * final_bound[0, 2, 3, 4]
    with pytest.raises(Mismatch):
        assert_within_bound(final, bad_final, final_bound)


def test_dropped_initial_state_is_caught():
    inp, ref_out, ref_final, out_bound, final_bound = _tight_case(BF16, contexts=(127,), tokens=(40,))
    out, final = run_chunked(inp, BF16, has_state=False)
    with pytest.raises(Mismatch):
        assert_within_bound(out, ref_out, out_bound)
    with pytest.raises(Mismatch):
        assert_within_bound(final, ref_final, final_bound)


def test_one_flipped_input_element_is_caught():
    inp, ref_out, _, out_bound, _ = _tight_case(BF16)
    p = int(inp.x[100, 0].float().abs().argmax())  # a typical-size element (|x| ~ 2), not a near-zero one
    inp.x[100, 0, p] = -inp.x[100, 0, p]
    out, _ = run_chunked(inp, BF16)
    with pytest.raises(Mismatch):
        assert_within_bound(out, ref_out, out_bound)


def _stages(inp, *, skip_decay_chunk=None, wrong_group=False):
    """The five stages by hand (returned mode, no cache) with an optional realistic bug."""
    m = inp.meta.tensors()
    q = inp.meta.chunk_size
    dA, dt_out = chunked.chunk_cumsum(inp.dt, inp.A, q, m["cu_chunk_seqlens"], dt_bias=inp.dt_bias,
                                      dt_softplus=True, profile=PROFILE)
    B = inp.B
    if wrong_group:  # head h reads group h % G instead of h // (H // G)
        H, G = inp.x.shape[1], B.shape[1]
        B = B[:, [(h % G) for h in range(0, H, H // G)]]
    states = chunked.chunk_state(B, inp.x, dt_out, dA, m["cu_chunk_seqlens"], profile=PROFILE)
    dA_passing = dA.clone()
    if skip_decay_chunk is not None:  # the chunk's decay is not applied to the carried state
        dA_passing[:, skip_decay_chunk, -1] = 0.0
    passed = chunked.state_passing(states, dA_passing, m["seq_idx"], initial_states=inp.initial_states,
                                   out_dtype=inp.x.dtype, profile=PROFILE)
    cb = chunked.bmm_chunk(inp.C, B, q, m["cu_chunk_seqlens"])
    out = torch.empty_like(inp.x)
    chunked.chunk_scan(cb, inp.x, dt_out, dA, inp.C, passed.exiting, m["cu_chunk_seqlens"], m["seq_idx"], out=out,
                       D=inp.D, z=inp.z, initial_states=inp.initial_states, profile=PROFILE)
    return out, passed.final


def test_hand_run_stages_equal_chunked_ssd():
    """The by-hand stage pipeline used for the bug controls is the real pipeline when no bug is injected."""
    inp, *_ = _tight_case(BF16, contexts=(127,), tokens=(100,))
    out, final = _stages(inp)
    out2, final2 = run_chunked(inp, BF16)
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16))
    assert torch.equal(final.view(torch.int16), final2.view(torch.int16))


@pytest.mark.parametrize("io", [F32, BF16], ids=["fp32", "bf16"])
def test_skipped_chunk_decay_exceeds_bound(io):
    """Chunks of (1, 64, 35) tokens. Skipping chunk 1's decay corrupts chunk 2's outputs; skipping the last chunk's
    decay corrupts the final state (earlier chunks' errors decay away before the end: e^-15 over 64 tokens)."""
    inp, ref_out, ref_final, out_bound, final_bound = _tight_case(io, contexts=(127,), tokens=(100,))
    out, _ = _stages(inp, skip_decay_chunk=1)
    with pytest.raises(Mismatch) as err:
        assert_within_bound(out, ref_out, out_bound)
    print(f"skipped decay: {err.value.count} output elements beyond the bound")
    _, final = _stages(inp, skip_decay_chunk=2)
    with pytest.raises(Mismatch):
        assert_within_bound(final, ref_final, final_bound)


def test_wrong_group_exceeds_bound():
    inp, ref_out, _, out_bound, _ = _tight_case(BF16, ngroups=2, nheads=4)
    out, _ = _stages(inp, wrong_group=True)
    with pytest.raises(Mismatch):
        assert_within_bound(out, ref_out, out_bound)
