"""Chunked reference (five stages, fp32 with the kernels' roundings) vs the fp64 sequential scan, within the derived
bound of harness.bounds; and the negative controls showing each comparison can fail."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from harness import bounds
from harness.compare import Mismatch, assert_bits_equal, assert_within_bound
from harness.random_inputs import SsdInputs, make_inputs
from reference import chunked
from reference.sequential import Shadows, process_dt, sequential_ssd
from reference.sequential import ground_truth as sequential_ground_truth

PROFILE = "interpreter"  # CPU tensors: the arithmetic our kernels follow under the interpreter
# Negative controls run under both backends' arithmetic and bounds (CPU tensors either way): a control must fire
# against every backend's bound (cuda's is the looser for fp32 io: tf32 dots), not only the local one.
BACKENDS = ("interpreter", "cuda")
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def run_chunked(inp: SsdInputs, state_dtype, *, mode="returned", has_state=True, initial_override=None,
                profile=PROFILE):
    """Chunked reference through ``chunked_ssd`` with a NaN-filled padded cache holding the initial states."""
    m = inp.meta.tensors()
    batch, (_, H, P), N = inp.meta.batch, inp.x.shape, inp.B.shape[-1]
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
        return_intermediate_states=(mode == "checkpoint"), profile=profile, **m,
    )
    return out, res


def ground_truth(inp: SsdInputs, state_dtype):
    m = inp.meta.tensors()
    h0 = None if inp.initial_states is None else inp.initial_states.to(state_dtype)
    kw = dict(cu_seqlens=m["cu_seqlens"], D=inp.D, z=inp.z, dt_bias=inp.dt_bias, dt_softplus=inp.dt_softplus,
              initial_states=h0)
    t = sequential_ground_truth(inp.x, inp.dt, inp.A, inp.B, inp.C, chunk_size=inp.meta.chunk_size,
                                exit_offsets=m["cu_chunk_seqlens"][1:], **kw)
    return t.out, t.final_states, t.chunk_end, t.shadows, t.chunk_end_shadow


def derived_bounds(inp: SsdInputs, state_dtype, ref_out, ref_final, shadows, backend=PROFILE):
    m = inp.meta.tensors()
    terms = bounds.input_error_terms(inp.dt, inp.A, cu_chunk_seqlens=m["cu_chunk_seqlens"], seq_idx=m["seq_idx"],
                                     dt_bias=inp.dt_bias, dt_softplus=inp.dt_softplus, z=inp.z, backend=backend)
    common = dict(io_dtype=inp.x.dtype, state_dtype=state_dtype, chunk_size=inp.meta.chunk_size,
                  dstate=inp.B.shape[-1], backend=backend, shadows=shadows, **terms.as_kwargs())
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


# ---- negative controls: each comparison above can fail, on every backend ----
#
# A control is decisive when its bug moves the exact result by more than the two bounds together: the correct
# pipeline is within ``bound`` of the truth and the buggy one is the same chunked arithmetic on a changed problem, so
# within ``bug_bound`` of that problem's truth (the test above establishes both); then somewhere
# |buggy - truth| >= |bug_truth - truth| - bug_bound > bound. Each control first checks that precondition under the
# backend's own bound, so a bug too small for some backend's bound fails loudly instead of silently not firing.


@dataclass
class Truth:
    """fp64 truth of one problem and its derived bounds under one backend."""

    out: torch.Tensor
    final: torch.Tensor
    ends: torch.Tensor
    shadows: Shadows
    end_shadow: torch.Tensor
    out_bound: torch.Tensor
    final_bound: torch.Tensor
    common: dict


def truth_of(inp: SsdInputs, state_dtype, backend) -> Truth:
    out, final, ends, shadows, end_shadow = ground_truth(inp, state_dtype)
    out_bound, final_bound, common = derived_bounds(inp, state_dtype, out, final, shadows, backend)
    return Truth(out, final, ends, shadows, end_shadow, out_bound, final_bound, common)


def assert_decisive(truth, bound, bug_truth, bug_bound, what) -> float:
    """The bug's exact effect exceeds bound + bug_bound somewhere; returns the largest (effect - bug_bound) / bound."""
    margin = bounds.decisive_margin(truth, bound, bug_truth, bug_bound)
    print(f"{what}: decisive margin {margin:.3g}")
    assert margin > 1, (f"{what}: the deliberate bug moves the exact result by at most {margin:.3g} x the bound "
                        "(beyond the bug's own bound): too small to be caught on this backend")
    return margin


def _tight_inputs(io=BF16, *, ngroups=3, nheads=3, contexts=(0,), tokens=(150,), z=True) -> SsdInputs:
    return make_inputs(contexts=list(contexts), tokens=list(tokens), chunk_size=64, nheads=nheads, headdim=40,
                       dstate=16, ngroups=ngroups, io_dtype=io, state_dtype=io, D="per_head", z=z, seed=5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("io", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
def test_perturbed_ground_truth_is_caught(io, backend):
    """One element of the fp64 truth moved just past its bound (output and final state) must be reported."""
    inp = _tight_inputs(io)
    t = truth_of(inp, io, backend)
    out, final = run_chunked(inp, io, profile=backend)
    assert_within_bound(out, t.out, t.out_bound)
    bad_out = t.out.clone()
    bad_out[17, 1, 5] = out[17, 1, 5].double() + 1.001 * t.out_bound[17, 1, 5]
    with pytest.raises(Mismatch) as err:
        assert_within_bound(out, bad_out, t.out_bound)
    assert err.value.count == 1
    bad_final = t.final.clone()
    bad_final[0, 2, 3, 4] = final[0, 2, 3, 4].double() - 1.001 * t.final_bound[0, 2, 3, 4]
    with pytest.raises(Mismatch):
        assert_within_bound(final, bad_final, t.final_bound)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropped_initial_state_is_caught(backend):
    """8 new tokens (chunks of 1 and 7): the initial state still carries exp(-sum dt |A|) ~ e^-2 of its weight into
    the final state. (After 40 tokens, ~e^-11, its loss is below the bf16 final-state bound: no decisive control.)"""
    inp = _tight_inputs(BF16, contexts=(127,), tokens=(8,))
    t = truth_of(inp, BF16, backend)
    bug = truth_of(dataclasses.replace(inp, initial_states=None), BF16, backend)
    assert_decisive(t.out, t.out_bound, bug.out, bug.out_bound, "dropped initial state, output")
    assert_decisive(t.final, t.final_bound, bug.final, bug.final_bound, "dropped initial state, final state")
    out, final = run_chunked(inp, BF16, has_state=False, profile=backend)
    with pytest.raises(Mismatch):
        assert_within_bound(out, t.out, t.out_bound)
    with pytest.raises(Mismatch):
        assert_within_bound(final, t.final, t.final_bound)


def _most_visible_flip(inp: SsdInputs, out_bound: torch.Tensor) -> tuple[int, int, int]:
    """The x element whose sign flip moves its own output most relative to the bound there: to first order
    out[t,h,p] changes by 2 |x| |D[h] + dt[t] C[t].B[t]| |z sigmoid(z)| (the residual and the diagonal cb term)."""
    H = inp.x.shape[1]
    dtp = process_dt(inp.dt, inp.dt_bias, inp.dt_softplus)
    g = torch.arange(H) // (H // inp.B.shape[1])
    cb_diag = (inp.C.double()[:, g] * inp.B.double()[:, g]).sum(-1)  # (T, H)
    zz = inp.z.double()
    effect = 2 * inp.x.double().abs() * (inp.D.double()[None, :] + dtp * cb_diag).abs()[:, :, None]
    effect = effect * (zz * torch.sigmoid(zz)).abs()
    t, h, p = divmod_index(int((effect / out_bound).argmax()), inp.x.shape)
    return t, h, p


def divmod_index(flat: int, shape) -> tuple[int, ...]:
    idx = []
    for n in reversed(shape):
        flat, r = divmod(flat, n)
        idx.append(r)
    return tuple(reversed(idx))


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_flipped_input_element_is_caught(backend):
    inp = _tight_inputs(BF16)
    t = truth_of(inp, BF16, backend)
    tt, h, p = _most_visible_flip(inp, t.out_bound)
    x = inp.x.clone()
    x[tt, h, p] = -x[tt, h, p]
    flipped = dataclasses.replace(inp, x=x)
    bug = truth_of(flipped, BF16, backend)
    assert_decisive(t.out, t.out_bound, bug.out, bug.out_bound, f"x[{tt}, {h}, {p}] flipped")
    out, _ = run_chunked(flipped, BF16, profile=backend)
    with pytest.raises(Mismatch):
        assert_within_bound(out, t.out, t.out_bound)


def _stages(inp, *, skip_decay_chunk=None, wrong_group=False, profile=PROFILE):
    """The five stages by hand (returned mode, no cache) with an optional realistic bug."""
    m = inp.meta.tensors()
    q = inp.meta.chunk_size
    dA, dt_out = chunked.chunk_cumsum(inp.dt, inp.A, q, m["cu_chunk_seqlens"], dt_bias=inp.dt_bias,
                                      dt_softplus=True, profile=profile)
    B = _wrong_group_B(inp) if wrong_group else inp.B
    states = chunked.chunk_state(B, inp.x, dt_out, dA, m["cu_chunk_seqlens"], profile=profile)
    dA_passing = dA.clone()
    if skip_decay_chunk is not None:  # the chunk's decay is not applied to the carried state
        dA_passing[:, skip_decay_chunk, -1] = 0.0
    passed = chunked.state_passing(states, dA_passing, m["seq_idx"], initial_states=inp.initial_states,
                                   out_dtype=inp.x.dtype, profile=profile)
    cb = chunked.bmm_chunk(inp.C, B, q, m["cu_chunk_seqlens"])
    out = torch.empty_like(inp.x)
    chunked.chunk_scan(cb, inp.x, dt_out, dA, inp.C, passed.exiting, m["cu_chunk_seqlens"], m["seq_idx"], out=out,
                       D=inp.D, z=inp.z, initial_states=inp.initial_states, profile=profile)
    return out, passed.final


def _wrong_group_B(inp: SsdInputs) -> torch.Tensor:
    """B as a kernel with the group index bug sees it: head h reads group h % G instead of h // (H // G)."""
    H, G = inp.x.shape[1], inp.B.shape[1]
    return inp.B[:, [(h % G) for h in range(0, H, H // G)]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_run_stages_equal_chunked_ssd(backend):
    """The by-hand stage pipeline used for the bug controls is the real pipeline when no bug is injected."""
    inp = _tight_inputs(BF16, contexts=(127,), tokens=(100,))
    out, final = _stages(inp, profile=backend)
    out2, final2 = run_chunked(inp, BF16, profile=backend)
    assert_bits_equal(out, out2, what="hand-run output")
    assert_bits_equal(final, final2, what="hand-run final state")


def _skipped_decay_truth(inp: SsdInputs, t: Truth, chunk: int):
    """Exact (out, out shadow, final, final shadow) of the pipeline whose state passing skips ``chunk``'s decay (one
    sequence): the state leaving the chunk gains (1 - exp(S)) s_in (S = sum of dt A over the chunk, s_in the state
    entering it); the scan is linear in its initial state, so the tokens after the chunk gain the zero-input scan of
    that difference, and the shadows gain the same scan of its magnitude."""
    cu = [int(v) for v in inp.meta.tensors()["cu_chunk_seqlens"]]
    s, e = cu[chunk], cu[chunk + 1]
    assert chunk > 0, "s_in of chunk 0 is the initial state; pick a later chunk"
    dtp = process_dt(inp.dt, inp.dt_bias, inp.dt_softplus)
    keep = (1 - torch.exp((dtp[s:e] * inp.A.double()).sum(0)))[:, None, None]  # (H, 1, 1)
    delta, delta_shadow = keep * t.ends[chunk - 1], keep * t.end_shadow[chunk - 1]
    tail = slice(e, inp.x.shape[0])
    kw = dict(cu_seqlens=[0, inp.x.shape[0] - e], z=inp.z[tail], dt_bias=inp.dt_bias, dt_softplus=inp.dt_softplus)
    args = (torch.zeros_like(inp.x[tail]), inp.dt[tail], inp.A, inp.B[tail], inp.C[tail])
    d_out, d_final = sequential_ssd(*args, initial_states=delta[None], **kw)
    d_out_shadow, d_final_shadow = sequential_ssd(*args, initial_states=delta_shadow[None], magnitude=True, **kw)
    out, out_shadow = t.out.clone(), t.shadows.out.clone()
    out[tail] += d_out
    out_shadow[tail] += d_out_shadow
    return out, out_shadow, t.final + d_final, t.shadows.final_states + d_final_shadow


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("io", [F32, BF16], ids=["fp32", "bf16"])
def test_skipped_chunk_decay_exceeds_bound(io, backend):
    """Chunks of (1, 64, 35) tokens. Skipping chunk 1's decay corrupts chunk 2's outputs; skipping the last chunk's
    decay corrupts the final state (an earlier chunk's error decays away before the end: e^-15 over 64 tokens, the
    reason skipping chunk 0's decay is no control for the final state)."""
    inp = _tight_inputs(io, contexts=(127,), tokens=(100,))
    t = truth_of(inp, io, backend)
    bug_out, bug_out_shadow, _, _ = _skipped_decay_truth(inp, t, 1)
    bug_out_bound = bounds.ssd_output_bound(bug_out_shadow, bug_out, **t.common)
    assert_decisive(t.out, t.out_bound, bug_out, bug_out_bound, "chunk 1 decay skipped, output")
    _, _, bug_final, bug_final_shadow = _skipped_decay_truth(inp, t, 2)
    bug_final_bound = bounds.final_state_bound(bug_final_shadow, bug_final, **t.common)
    assert_decisive(t.final, t.final_bound, bug_final, bug_final_bound, "chunk 2 decay skipped, final state")
    out, _ = _stages(inp, skip_decay_chunk=1, profile=backend)
    with pytest.raises(Mismatch) as err:
        assert_within_bound(out, t.out, t.out_bound)
    print(f"skipped decay: {err.value.count} output elements beyond the bound")
    _, final = _stages(inp, skip_decay_chunk=2, profile=backend)
    with pytest.raises(Mismatch):
        assert_within_bound(final, t.final, t.final_bound)


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_group_exceeds_bound(backend):
    inp = _tight_inputs(BF16, ngroups=2, nheads=4)
    t = truth_of(inp, BF16, backend)
    bug = truth_of(dataclasses.replace(inp, B=_wrong_group_B(inp)), BF16, backend)
    assert_decisive(t.out, t.out_bound, bug.out, bug.out_bound, "wrong group")
    out, _ = _stages(inp, wrong_group=True, profile=backend)
    with pytest.raises(Mismatch):
        assert_within_bound(out, t.out, t.out_bound)


def test_a_control_too_small_for_the_bound_is_rejected():
    """assert_decisive refuses a bug whose exact effect the bounds could absorb: dropping the initial state before
    40 tokens moves the bf16 final state by less than the interpreter's bound (the initial state decays by ~e^-11;
    the interpreter's truncating bf16 cast doubles u), so a check that fired on it would fire only by luck."""
    inp = _tight_inputs(BF16, contexts=(127,), tokens=(40,))
    t = truth_of(inp, BF16, "interpreter")
    bug = truth_of(dataclasses.replace(inp, initial_states=None), BF16, "interpreter")
    assert_decisive(t.out, t.out_bound, bug.out, bug.out_bound, "output")  # the output still sees it early on
    with pytest.raises(AssertionError, match="too small to be caught"):
        assert_decisive(t.final, t.final_bound, bug.final, bug.final_bound, "final state")
    with pytest.raises(AssertionError, match="too small to be caught"):  # an effect inside bound + bug bound
        assert_decisive(t.out, t.out_bound, t.out + 0.9 * t.out_bound, 0.1 * t.out_bound, "synthetic")
