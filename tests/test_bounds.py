"""harness.bounds: the rounding model's constants, and the per-stage bounds shown to hold between two different
arithmetic (the interpreter and cuda profiles, run on CPU tensors) and to fail for a realistic bug."""

from __future__ import annotations

import pytest
import torch

from harness import bounds
from harness.compare import Mismatch, assert_bits_equal, assert_within_bound
from harness.random_inputs import make_inputs
from harness.varlen import build_varlen_metadata
from reference import arith, chunked


def test_unit_roundoff_and_gamma():
    assert bounds.unit_roundoff(torch.float32) == 2.0**-24
    assert bounds.unit_roundoff(torch.float16, "interpreter") == 2.0**-11
    assert bounds.unit_roundoff(torch.bfloat16, "cuda") == 2.0**-8
    assert bounds.unit_roundoff(torch.bfloat16, "interpreter") == 2.0**-7  # truncating cast
    assert bounds.gamma(4, 2.0**-8) == pytest.approx(4 * 2.0**-8 / (1 - 4 * 2.0**-8), rel=0, abs=0)
    with pytest.raises(ValueError, match="first-order"):
        bounds.gamma(300, 2.0**-8)
    with pytest.raises(ValueError, match="backend"):
        bounds.unit_roundoff(torch.float32, "rocm")
    with pytest.raises(ValueError, match="rounding model"):
        bounds.unit_roundoff(torch.float64)


def test_dot_model_per_backend():
    """tf32 (truncated, 2^-10 per operand) only for fp32 operands on CUDA; the MMA's truncating accumulation (2u per
    rounding, ceil(k/4) * 5 roundings) for every CUDA dot; numpy's fp32 matmul under the interpreter."""
    k, v = 64, 2.0**-10
    acc = bounds.gamma(16 * 5, 2.0**-23)
    assert bounds.mma_roundings(k) == 80 and bounds.mma_roundings(1) == 5 and bounds.mma_roundings(5) == 10
    assert bounds.dot_rel_err(k, torch.float32, "cuda") == (1 + v) ** 2 - 1 + acc * (1 + v) ** 2
    assert bounds.dot_rel_err(k, torch.bfloat16, "cuda") == acc
    assert bounds.dot_rel_err(k, torch.float16, "cuda") == acc
    assert bounds.dot_rel_err(k, torch.float32, "interpreter") == bounds.gamma(k, 2.0**-24)
    assert bounds.reference_dot_rel_err(k) == bounds.gamma(k, 2.0**-24)


def test_end_to_end_paths_carry_the_cuda_dot_model():
    """The ssd output/final-state paths use the same dot model: for fp32 io on CUDA the intra-chunk path (CB dot over
    N, cb_scaled dot over Q) and the final path (chunk-state dot over Q) grow by exactly the tf32/MMA terms."""
    kw = dict(io_dtype=torch.float32, state_dtype=torch.float32, chunk_size=64, dstate=16, dA_magnitude=0.0)
    cuda, interp = bounds.path_errors(backend="cuda", **kw), bounds.path_errors(backend="interpreter", **kw)
    extra = {k: bounds.dot_rel_err(k, torch.float32, "cuda") - bounds.gamma(k, 2.0**-24) for k in (16, 64)}
    exp_ulps = (bounds.EXP_ULPS["cuda"] - bounds.EXP_ULPS["interpreter"]) * 2.0**-24
    assert float(cuda.intra - interp.intra) == pytest.approx(extra[16] + extra[64] + exp_ulps, rel=1e-9)
    assert float(cuda.final - interp.final) == pytest.approx(extra[64] + 2 * exp_ulps, rel=1e-9)
    assert extra[16] > 2 * 2.0**-10  # truncated tf32: at least twice round-to-nearest tf32's 2 * 2^-11


def _tf32_truncate(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> tf32 as the tensor core reads an fp32 register: the low 13 fraction bits dropped."""
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def _tf32_bmm_emulation(C, B, chunk_size, cu):
    """CB the way a tf32 tl.dot forms it: truncated operands, exact products, one fp32 rounding of the sum (a
    stand-in for the MMA inside the modelled accumulation error)."""
    return chunked.bmm_chunk(_tf32_truncate(C), _tf32_truncate(B), chunk_size, cu)


def test_truncated_tf32_bmm_fits_the_bound_and_rounded_tf32_model_does_not():
    """Worst case for truncation: every operand 1 + (2^13 - 1) 2^-23 (all dropped bits set) loses ~2^-10, so each
    product ~2^-9: the truncation bound holds with little room; a round-to-nearest model (2^-11 per operand, which
    the H200 exceeded with err/bound 1.02-1.04: notes/gpu-runs.md) is exceeded about twice over."""
    meta = build_varlen_metadata([0], [40], 32)
    cu = meta.tensors()["cu_chunk_seqlens"]
    worst = torch.tensor(0x3F801FFF, dtype=torch.int32).view(torch.float32).item()
    C = torch.full((40, 1, 16), worst)
    B = torch.full((40, 1, 16), -worst)
    want = chunked.bmm_chunk(C, B, 32, cu)
    got = _tf32_bmm_emulation(C, B, 32, cu)
    abs_cb = chunked.bmm_chunk_magnitude(C, B, 32, cu)
    use = assert_within_bound(got, want, bounds.bmm_chunk_bound(abs_cb, io_dtype=torch.float32, dstate=16,
                                                                backend="cuda"), what="CB tf32").max_bound_use
    assert use > 0.9, f"the worst case should nearly reach the truncation bound, used {use:.3g}"
    rounded_model = (2 * 2.0**-11 + 2 * bounds.gamma(16, 2.0**-24)) * abs_cb
    with pytest.raises(Mismatch):
        assert_within_bound(got, want, rounded_model, what="CB tf32 vs round-to-nearest model")
    with pytest.raises(Mismatch):  # the same emulation is outside the interpreter's (no tf32) bound
        assert_within_bound(got, want, bounds.bmm_chunk_bound(abs_cb, io_dtype=torch.float32, dstate=16,
                                                              backend="interpreter"))


def test_bmm_magnitude_is_fp64_abs_products():
    inp, m = _stage_inputs(torch.float32)
    cu, q = m["cu_chunk_seqlens"], inp.meta.chunk_size
    mag = chunked.bmm_chunk_magnitude(inp.C, inp.B, q, cu)
    assert mag.dtype == torch.float64
    s, e = int(cu[1]), int(cu[2])
    want = inp.C[s:e, 0].double().abs() @ inp.B[s:e, 0].double().abs().T
    assert_bits_equal(mag[1, 0, : e - s, : e - s], want, what="chunk 1 magnitude")
    assert not mag[1, 0, e - s:].any() and not mag[1, 0, :, e - s:].any()
    with pytest.raises(ValueError, match="fp64 magnitude"):  # an fp32 magnitude would be rounded down
        bounds.bmm_chunk_bound(mag.float(), io_dtype=torch.float32, dstate=16, backend="cuda")
    with pytest.raises(ValueError, match="fp64 magnitude"):
        bounds.chunk_state_bound(mag.float(), io_dtype=torch.float32, chunk_size=16, backend="cuda")


def test_output_bound_grows_with_chunk_decay_and_io_precision():
    shadow, ref = torch.ones(2, 3, 4, dtype=torch.float64), torch.ones(2, 3, 4, dtype=torch.float64)
    kw = dict(state_dtype=torch.float32, chunk_size=64, dstate=16, backend="interpreter")
    small = bounds.ssd_output_bound(shadow, ref, io_dtype=torch.float32, dA_magnitude=1.0, **kw)
    large = bounds.ssd_output_bound(shadow, ref, io_dtype=torch.float32, dA_magnitude=torch.tensor([1.0, 50, 1]), **kw)
    bf16 = bounds.ssd_output_bound(shadow, ref, io_dtype=torch.bfloat16, dA_magnitude=1.0, **kw)
    assert (large[:, 1] > small[:, 1]).all() and torch.equal(large[:, 0], small[:, 0])
    assert (bf16 > 100 * small).all()


def _stage_inputs(io):
    inp = make_inputs(contexts=[5, 0], tokens=[90, 40], chunk_size=32, nheads=3, headdim=20, dstate=16, ngroups=1,
                      io_dtype=io, state_dtype=torch.float32, seed=11)
    return inp, inp.meta.tensors()


@pytest.mark.parametrize("io", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_stage_bounds_hold_across_arithmetic_profiles(io, record_property):
    """Twin stages run under the interpreter and the cuda profiles (different exp, FMA, cast rounding and cumsum
    order) agree within the per-stage bounds fed identical inputs."""
    inp, m = _stage_inputs(io)
    cu, q = m["cu_chunk_seqlens"], inp.meta.chunk_size
    runs = {}
    for prof in ("interpreter", "cuda"):
        dA, dt_out = chunked.chunk_cumsum(inp.dt, inp.A, q, cu, dt_bias=inp.dt_bias, dt_softplus=True, profile=prof)
        runs[prof] = (dA, dt_out)
    dA, dt_out = runs["interpreter"]
    terms = bounds.input_error_terms(inp.dt, inp.A, cu_chunk_seqlens=cu, seq_idx=m["seq_idx"], dt_bias=inp.dt_bias,
                                     dt_softplus=True, backend="cuda")
    abs_cumsum = torch.cumsum((dt_out.double() * inp.A.double()[:, None, None]).abs(), -1)
    uses = {}
    uses["cumsum"] = assert_within_bound(runs["cuda"][0], dA, bounds.chunk_cumsum_bound(
        abs_cumsum, chunk_size=q, backend="cuda", dt_rel_err=terms.dt_rel_err), what="dA_cumsum").max_bound_use
    # Downstream stages: identical inputs (the interpreter's cumsum) into both profiles.
    st_i = chunked.chunk_state(inp.B, inp.x, dt_out, dA, cu, profile="interpreter")
    st_c = chunked.chunk_state(inp.B, inp.x, dt_out, dA, cu, profile="cuda")
    abs_st = chunked.chunk_state_magnitude(inp.B, inp.x, dt_out, dA, cu, profile="interpreter")
    # backend="interpreter": its bf16 rounding model (truncation, 2u) is the looser of the two sides compared here.
    state_bound = bounds.chunk_state_bound(abs_st, io_dtype=io, chunk_size=q, backend="interpreter")
    uses["chunk_state"] = assert_within_bound(st_c, st_i, state_bound, what="chunk states").max_bound_use
    cb = chunked.bmm_chunk(inp.C, inp.B, q, cu)
    cb_rev = chunked.bmm_chunk(inp.C.flip(-1), inp.B.flip(-1), q, cu)  # another accumulation order
    abs_cb = chunked.bmm_chunk_magnitude(inp.C, inp.B, q, cu)
    uses["bmm"] = assert_within_bound(cb_rev, cb, bounds.bmm_chunk_bound(
        abs_cb, io_dtype=io, dstate=16, backend="interpreter"), what="CB").max_bound_use
    passed = chunked.state_passing(st_i, dA, m["seq_idx"], initial_states=inp.initial_states, profile="interpreter")
    outs = {}
    for prof in ("interpreter", "cuda"):
        outs[prof] = torch.empty_like(inp.x)
        chunked.chunk_scan(cb, inp.x, dt_out, dA, inp.C, passed.exiting, cu, m["seq_idx"], out=outs[prof], D=inp.D,
                           z=inp.z, initial_states=inp.initial_states, profile=prof)
    abs_acc = chunked.chunk_scan_magnitude(cb, inp.x, dt_out, dA, inp.C, passed.exiting, cu, m["seq_idx"], D=inp.D,
                                           z=inp.z, initial_states=inp.initial_states)
    gate = bounds.input_error_terms(inp.dt, inp.A, cu_chunk_seqlens=cu, seq_idx=m["seq_idx"], z=inp.z,
                                    backend="cuda").gate_rel_err
    scan_bound = bounds.chunk_scan_bound(abs_acc, outs["interpreter"], io_dtype=io, chunk_size=q, dstate=16,
                                         backend="interpreter", gate_rel_err=gate)
    uses["chunk_scan"] = assert_within_bound(outs["cuda"], outs["interpreter"], scan_bound,
                                             what="chunk scan").max_bound_use
    record_property("bound_use", uses)
    print({k: f"{v:.3g}" for k, v in uses.items()})

    # Negative controls: realistic bugs exceed the same bounds.
    with pytest.raises(Mismatch):  # cumsum missing the first token of every chunk
        assert_within_bound(dA - dA[:, :, :1], dA, bounds.chunk_cumsum_bound(
            abs_cumsum, chunk_size=q, backend="cuda", dt_rel_err=terms.dt_rel_err))
    with pytest.raises(Mismatch):  # chunk state without the within-chunk decay
        flat = torch.zeros_like(dA) + dA[:, :, -1:]
        wrong = chunked.chunk_state(inp.B, inp.x, dt_out, flat, cu, profile="interpreter")
        assert_within_bound(wrong, st_i, state_bound)
    with pytest.raises(Mismatch):  # CB transposed (B . C instead of C . B)
        assert_within_bound(cb.transpose(-1, -2), cb, bounds.bmm_chunk_bound(
            abs_cb, io_dtype=io, dstate=16, backend="interpreter"))
    with pytest.raises(Mismatch):  # chunk scan reading the exiting state of its own chunk
        wrong_out = torch.empty_like(inp.x)
        chunked.chunk_scan(cb, inp.x, dt_out, dA, inp.C, passed.exiting, cu, m["seq_idx"], out=wrong_out, D=inp.D,
                           z=inp.z, initial_states=inp.initial_states, states_are_entering=True, profile="cuda")
        assert_within_bound(wrong_out, outs["interpreter"], scan_bound)


def test_interpreter_softplus_term_covers_log_of_one_plus_e():
    """Under the interpreter softplus is log(fl(1 + e)): for very negative a the add drops e's low bits, an absolute
    u after the log, i.e. relative u / softplus(a). dt_rel_err bounds the profile's softplus vs fp64 there; without
    that term (a model with a relative u only) it is exceeded."""
    a = torch.linspace(-16.0, 4.0, 4001, dtype=torch.float32)[:, None]
    cu = torch.tensor([0, a.shape[0]])
    terms = bounds.input_error_terms(a, -torch.ones(1), cu_chunk_seqlens=cu, seq_idx=torch.zeros(1, dtype=torch.long),
                                     dt_softplus=True, backend="interpreter")
    exact = torch.nn.functional.softplus(a.double())
    got = arith.softplus(a, "interpreter")
    assert_within_bound(got, exact, terms.dt_rel_err * exact, what="interpreter softplus vs fp64")
    ulps = bounds.EXP_ULPS["interpreter"] + bounds.LOG_ULPS["interpreter"] + 1
    relative_u = ulps * 2.0**-24 + 2 * 2.0**-24 * a.abs()
    with pytest.raises(Mismatch):
        assert_within_bound(got, exact, relative_u.double() * exact, what="relative-u model")


def test_decisive_margin():
    """Excess of the bug's exact effect over its own bound and the compared value's error, in units of the bound;
    a zero bound counts as decisive only where the excess is positive."""
    truth, bug = torch.tensor([1.0, 2.0, 0.0]), torch.tensor([1.5, 2.0, 0.0])
    assert bounds.decisive_margin(truth, 0.1, bug, 0.1) == pytest.approx(4.0)
    assert bounds.decisive_margin(truth, 0.1, bug, 0.1, compared_err=0.1) == pytest.approx(3.0)
    assert bounds.decisive_margin(truth, torch.tensor([0.0, 0.0, 0.0]), bug, 0.0) == float("inf")
    assert bounds.decisive_margin(truth, torch.tensor([1.0, 1.0, 0.0]), truth, 0.0) == 0.0
