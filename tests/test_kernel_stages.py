"""Each Triton stage kernel against its PyTorch twin in ``reference.chunked``, fed identical inputs.

What is exact and what is bounded, and why:
- chunk cumsum ``dt_out`` without softplus: pure elementwise fp32 (bias add, clamp, zero padding) in the same order
  in kernel and reference, so it is compared bit for bit on both backends.
- chunk cumsum ``dt_out`` with softplus: bounded. The kernel computes exp as exp2(x * LOG2E) (bit-equal to
  torch.exp2 on CUDA) and, under the interpreter, log(1 + e) (Triton's interpreter has no log1p); the reference
  twin uses the natural exp and log1p (``reference.arith.natural_exp``/``log1p``).
- chunk cumsum ``dA_cumsum``: under the interpreter ``tl.cumsum`` is numpy's sequential cumsum, as in the reference's
  interpreter profile, so it is exact whenever ``dt_out`` is; on CUDA the scan order is the kernel's: bounded.
- chunk state, bmm, chunk scan: ``tl.dot`` sums in an order PyTorch cannot reproduce: bounded. Their operands
  (b_scaled, cb_scaled, the io-cast previous state) are rounded identically on both sides, since the profile makes
  every elementwise step bit-equal, so only summation order (and tf32 operands for fp32 io on CUDA) differs.

Bounds are first-order rounding analysis over an fp64 magnitude of the summed terms (formulas next to each helper).
harness/bounds.py does not exist yet; these helpers are written to move there unchanged.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from harness.backend import configure, profile_for

DEVICE = configure("auto")  # sets TRITON_INTERPRET before the kernel modules below are imported
PROFILE = profile_for(DEVICE)

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from harness.compare import Mismatch, assert_bits_equal, assert_within_bound  # noqa: E402
from harness.varlen import build_varlen_metadata  # noqa: E402
from kernels import backend as kbackend  # noqa: E402
from kernels import bmm_chunk as kbmm  # noqa: E402
from kernels import chunk_cumsum as kcumsum  # noqa: E402
from kernels import chunk_scan as kscan  # noqa: E402
from kernels import chunk_state as kstate  # noqa: E402
from reference import chunked as ref  # noqa: E402

F32, F64 = torch.float32, torch.float64

# Triton 3.6's interpreter itself converts 1-element arrays to ints (runtime loop bounds): numpy deprecation noise.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# ----------------------------------------------------------------------------------------------- bounds (first order)

U32 = 2.0**-24  # fp32 unit roundoff
# Library exp/log are within a few ulp (CUDA math library: <= 2 ulp; numpy's float32 SIMD loops: <= 4 ulp).
LIB_ULPS = 4


def unit_roundoff(dtype: torch.dtype, profile: str) -> float:
    """Relative error of one fp32 -> ``dtype`` rounding. The interpreter truncates to bf16 (a full ulp, 2**-7)."""
    if dtype == torch.float32:
        return U32
    if dtype == torch.float16:
        return 2.0**-11
    if dtype == torch.bfloat16:
        return 2.0**-7 if profile == "interpreter" else 2.0**-8
    raise ValueError(f"unit_roundoff: unsupported dtype {dtype}")


def dot_operand_unit(io: torch.dtype, profile: str) -> float:
    """Rounding of tl.dot operands inside the dot: tf32 (kernels.backend.FP32_DOT_PRECISION) for fp32 io on CUDA,
    none otherwise (io-dtype products are exact in fp32; the interpreter multiplies in fp32)."""
    if io == torch.float32 and profile == "cuda" and kbackend.FP32_DOT_PRECISION == "tf32":
        return 2.0**-11
    return 0.0


def gamma(n: int, u: float = U32) -> float:
    """Higham's gamma_n = n u / (1 - n u): relative error bound of an n-term fp32 sum, in any order."""
    return n * u / (1.0 - n * u)


def dot_bound(magnitude: torch.Tensor, terms: int, io: torch.dtype, profile: str) -> torch.Tensor:
    """|kernel - reference| for two fp32 sums of the same ``terms`` products, ``magnitude = sum |a_k b_k|`` (fp64):
    each sum is within gamma_terms of exact (2 gamma), and tf32 operands add (2 v + v**2) per product."""
    v = dot_operand_unit(io, profile)
    return magnitude * (2.0 * gamma(terms) + (2.0 * v + v * v) * (1.0 + gamma(terms)))


def softplus_bound(d: torch.Tensor, sp: torch.Tensor, profile: str) -> torch.Tensor:
    """|kernel - reference| of softplus(d) (d fp64 pre-softplus argument, sp fp64 softplus value).

    e = exp(d): kernel exp2(fl(d LOG2E)) vs reference exp(d) differ by relative |d| u (the rounded exponent) plus
    LIB_ULPS ulp on each side. log1p(e (1 + delta)) moves by delta e / (1 + e). Under the interpreter fl(1 + e) adds
    u (absolute, after log). Each log/log1p adds LIB_ULPS ulp of the result. Clamping never increases a difference.
    """
    delta = (d.abs() + 2 * LIB_ULPS) * U32
    e = torch.exp(d)
    err = delta * e / (1.0 + e) + 2 * LIB_ULPS * U32 * sp.abs()
    if profile == "interpreter":
        err = err + U32
    return torch.where(d <= 20.0, err, torch.zeros_like(err))


# ----------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Shape:
    nheads: int
    headdim: int
    dstate: int
    ngroups: int
    chunk_size: int

    def __str__(self) -> str:
        return f"H{self.nheads}P{self.headdim}N{self.dstate}G{self.ngroups}Q{self.chunk_size}"


# Small enough for the interpreter; odd headdim/nheads, ngroups 1 or = nheads, first partial chunks, short last chunks.
SHAPES = [
    Shape(3, 5, 16, 1, 64),
    Shape(3, 19, 32, 3, 64),
    Shape(11, 16, 16, 1, 128),
]
SEQUENCES = {
    "one-short": ([0], [30]),
    "two-partial-first": ([5, 0], [70, 20]),
    "three-mixed": ([100, 64, 3], [40, 64, 10]),
}


def scenarios():
    """(shape, sequences) pairs: every shape and every sequence layout appear, without the full product."""
    names = list(SEQUENCES)
    return [pytest.param(s, names[i % len(names)], id=f"{s}-{names[i % len(names)]}") for i, s in enumerate(SHAPES)] + [
        pytest.param(SHAPES[0], "three-mixed", id=f"{SHAPES[0]}-three-mixed"),
        pytest.param(SHAPES[1], "one-short", id=f"{SHAPES[1]}-one-short"),
    ]


def dtype_id(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


@dataclass
class Inputs:
    shape: Shape
    md: object
    meta: dict
    x: torch.Tensor
    z: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    dt_bias: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D_head: torch.Tensor
    D_channel: torch.Tensor


def make_inputs(shape: Shape, seqs: str, io: torch.dtype, seed: int = 0) -> Inputs:
    """Seeded CPU tensors moved to the device. dt around softplus(-2) so decays stay inside a chunk's range."""
    contexts, tokens = SEQUENCES[seqs]
    md = build_varlen_metadata(contexts, tokens, shape.chunk_size)
    T, H, P, N, G = md.total_tokens, shape.nheads, shape.headdim, shape.dstate, shape.ngroups
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    t = dict(
        x=rnd(T, H, P).to(io),
        z=rnd(T, H, P).to(io),
        dt=rnd(T, H) * 0.5 - 2.0,
        A=-(torch.rand(H, generator=g) + 0.5),
        dt_bias=rnd(H) * 0.1,
        B=rnd(T, G, N).to(io),
        C=rnd(T, G, N).to(io),
        D_head=rnd(H),
        D_channel=rnd(H, P),
    )
    t = {k: v.to(DEVICE) for k, v in t.items()}
    return Inputs(shape=shape, md=md, meta=md.tensors(DEVICE), **t)


def ref_cumsum(inp: Inputs, softplus: bool = True):
    """The reference twin's (dA_cumsum, dt_out): shared inputs for the downstream stage tests."""
    return ref.chunk_cumsum(inp.dt, inp.A, inp.shape.chunk_size, inp.meta["cu_chunk_seqlens"], dt_bias=inp.dt_bias,
                            dt_softplus=softplus, profile=PROFILE)


# ----------------------------------------------------------------------------------------------- chunk cumsum


def cumsum_bounds(inp: Inputs, dt_out_ref, dA_ref, dt_bound, profile):
    """dA_cumsum[h, c, l] bound: |A| * sum_{j<=l} dt_bound_j (propagated dt differences) plus 2 gamma_Q times the
    running sum of |dA_j| (two fp32 scans of the same length, any order)."""
    A = inp.A.detach().cpu().to(F64).abs()[:, None, None]
    prop = A * torch.cumsum(dt_bound, dim=-1) * (1.0 + gamma(inp.shape.chunk_size))
    scan = 2.0 * gamma(inp.shape.chunk_size) * torch.cumsum((dt_out_ref.cpu().to(F64) * A).abs(), dim=-1)
    return prop + scan


@pytest.mark.parametrize("softplus,limit,bias", [(False, (0.0, math.inf), True), (False, (0.05, 0.2), False),
                                                  (True, (0.0, math.inf), True), (True, (0.1, 0.5), True)],
                         ids=["plain", "limit-nobias", "softplus", "softplus-limit"])
@pytest.mark.parametrize("shape,seqs", scenarios())
def test_chunk_cumsum(shape, seqs, softplus, limit, bias):
    inp = make_inputs(shape, seqs, torch.float32)
    if not softplus:  # keep dt positive, as softplus would
        inp.dt = inp.dt.abs() * 0.1
    kw = dict(dt_bias=inp.dt_bias if bias else None, dt_softplus=softplus, dt_limit=limit)
    cu = inp.meta["cu_chunk_seqlens"]
    dA_k, dt_k = kcumsum.chunk_cumsum(inp.dt, inp.A, shape.chunk_size, cu, **kw)
    dA_r, dt_r = ref.chunk_cumsum(inp.dt, inp.A, shape.chunk_size, cu, profile=PROFILE, **kw)

    if softplus:
        d = inp.dt.cpu().to(F64) + (inp.dt_bias.cpu().to(F64) if bias else 0.0)
        sp = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
        per_token = softplus_bound(d, sp, PROFILE)  # (T, H)
        dt_bound = torch.zeros(shape.nheads, inp.md.nchunks, shape.chunk_size, dtype=F64)
        for c, (s, e) in enumerate(zip(inp.md.cu_chunk_seqlens[:-1], inp.md.cu_chunk_seqlens[1:])):
            dt_bound[:, c, : e - s] = per_token[s:e].T
        assert_within_bound(dt_k, dt_r, dt_bound, what="dt_out (softplus: bounded)")
    else:
        assert_bits_equal(dt_k, dt_r, what="dt_out (exact)")
        dt_bound = torch.zeros(dt_k.shape, dtype=F64)

    if PROFILE == "interpreter" and not softplus:
        assert_bits_equal(dA_k, dA_r, what="dA_cumsum (interpreter: sequential scan on both sides, exact)")
    else:
        assert_within_bound(dA_k, dA_r, cumsum_bounds(inp, dt_r, dA_r, dt_bound, PROFILE), what="dA_cumsum")


def test_chunk_cumsum_catches_missing_bias():
    """Negative control: a kernel run without dt_bias must differ from the reference with it."""
    inp = make_inputs(SHAPES[0], "two-partial-first", torch.float32)
    cu = inp.meta["cu_chunk_seqlens"]
    _, dt_k = kcumsum.chunk_cumsum(inp.dt, inp.A, 64, cu, dt_bias=None, dt_softplus=True)
    _, dt_r = ref.chunk_cumsum(inp.dt, inp.A, 64, cu, dt_bias=inp.dt_bias, dt_softplus=True, profile=PROFILE)
    d = inp.dt.cpu().to(F64) + inp.dt_bias.cpu().to(F64)
    bound = softplus_bound(d, torch.log1p(torch.exp(d)), PROFILE).max()
    with pytest.raises(Mismatch):
        assert_within_bound(dt_k, dt_r, bound, what="dt_out")


def test_chunk_cumsum_exact_check_catches_one_ulp():
    """Negative control for the exact comparison: one ulp in one element of dt_out is reported."""
    inp = make_inputs(SHAPES[0], "one-short", torch.float32)
    inp.dt = inp.dt.abs() * 0.1
    _, dt_k = kcumsum.chunk_cumsum(inp.dt, inp.A, 64, inp.meta["cu_chunk_seqlens"])
    bent = dt_k.clone()
    bent[1, 0, 3] = torch.nextafter(bent[1, 0, 3], torch.tensor(math.inf, device=bent.device))
    with pytest.raises(Mismatch) as err:
        assert_bits_equal(bent, dt_k, what="dt_out")
    assert err.value.count == 1


# ----------------------------------------------------------------------------------------------- chunk state


def chunk_state_magnitude(inp: Inputs, dt_out, dA_cumsum) -> torch.Tensor:
    """(C, H, P, N) fp64: sum_l |x[l, p]| |b_scaled[l, n]|, b_scaled from fp64 values (the io rounding of b_scaled is
    covered by the (1 + u_io) factor applied by the caller)."""
    H, G = inp.shape.nheads, inp.shape.ngroups
    heads_g = torch.arange(H) // (H // G)
    x, B = inp.x.cpu().to(F64), inp.B.cpu().to(F64)
    dt, dA = dt_out.cpu().to(F64), dA_cumsum.cpu().to(F64)
    cu = inp.md.cu_chunk_seqlens
    out = torch.zeros(inp.md.nchunks, H, inp.shape.headdim, inp.shape.dstate, dtype=F64)
    for c in range(inp.md.nchunks):
        s, e = cu[c], cu[c + 1]
        scale = torch.exp(dA[:, c, -1:] - dA[:, c, : e - s]) * dt[:, c, : e - s]  # (H, L)
        b = B[s:e][:, heads_g, :].permute(1, 0, 2).abs() * scale[:, :, None]  # (H, L, N)
        out[c] = torch.bmm(x[s:e].abs().permute(1, 2, 0), b)
    return out


def chunk_state_bound(inp: Inputs, io: torch.dtype, dt_out, dA_cumsum) -> torch.Tensor:
    mag = chunk_state_magnitude(inp, dt_out, dA_cumsum) * (1.0 + unit_roundoff(io, PROFILE))
    return dot_bound(mag, inp.shape.chunk_size, io, PROFILE)


@pytest.mark.parametrize("io", IO_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,seqs", scenarios())
def test_chunk_state(shape, seqs, io):
    inp = make_inputs(shape, seqs, io)
    dA, dt_out = ref_cumsum(inp)
    cu = inp.meta["cu_chunk_seqlens"]
    got = kstate.chunk_state(inp.B, inp.x, dt_out, dA, cu)
    want = ref.chunk_state(inp.B, inp.x, dt_out, dA, cu, profile=PROFILE)
    assert got.dtype == F32 and got.shape == want.shape
    assert_within_bound(got, want, chunk_state_bound(inp, io, dt_out, dA), what="chunk states")


@pytest.mark.parametrize("broken", ["wrong-group", "skipped-decay"])
def test_chunk_state_catches_broken_input(broken):
    """Negative control: B from the wrong group, or dA_cumsum zeroed (no decay), is outside the bound."""
    inp = make_inputs(SHAPES[1], "two-partial-first", torch.bfloat16)  # ngroups = nheads: groups distinguishable
    dA, dt_out = ref_cumsum(inp)
    cu = inp.meta["cu_chunk_seqlens"]
    B, dA_k = inp.B, dA
    if broken == "wrong-group":
        B = inp.B.roll(1, dims=1).contiguous()
    else:
        dA_k = torch.zeros_like(dA)
    got = kstate.chunk_state(B, inp.x, dt_out, dA_k, cu)
    want = ref.chunk_state(inp.B, inp.x, dt_out, dA, cu, profile=PROFILE)
    with pytest.raises(Mismatch):
        assert_within_bound(got, want, chunk_state_bound(inp, torch.bfloat16, dt_out, dA), what="chunk states")


# ----------------------------------------------------------------------------------------------- bmm


def bmm_bound(inp: Inputs, io: torch.dtype) -> torch.Tensor:
    """(C, G, Q, Q): dot_bound over sum_n |C[l, n]| |B[s, n]| (dstate terms); exact zeros outside each chunk."""
    Q, G = inp.shape.chunk_size, inp.shape.ngroups
    C, B = inp.C.cpu().to(F64).abs(), inp.B.cpu().to(F64).abs()
    cu = inp.md.cu_chunk_seqlens
    mag = torch.zeros(inp.md.nchunks, G, Q, Q, dtype=F64)
    for c in range(inp.md.nchunks):
        s, e = cu[c], cu[c + 1]
        mag[c, :, : e - s, : e - s] = torch.bmm(C[s:e].permute(1, 0, 2), B[s:e].permute(1, 2, 0))
    return dot_bound(mag, inp.shape.dstate, io, PROFILE)


@pytest.mark.parametrize("io", IO_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,seqs", scenarios())
def test_bmm_chunk(shape, seqs, io):
    inp = make_inputs(shape, seqs, io)
    cu = inp.meta["cu_chunk_seqlens"]
    got = kbmm.bmm_chunk(inp.C, inp.B, shape.chunk_size, cu)
    want = ref.bmm_chunk(inp.C, inp.B, shape.chunk_size, cu)
    assert got.dtype == F32 and got.shape == want.shape
    assert_within_bound(got, want, bmm_bound(inp, io), what="CB")
    # Outside each chunk's (len, len) block the bound is 0: padding must be written as exact zeros.
    for c, (s, e) in enumerate(zip(inp.md.cu_chunk_seqlens[:-1], inp.md.cu_chunk_seqlens[1:])):
        outside = torch.ones(shape.chunk_size, shape.chunk_size, dtype=torch.bool)
        outside[: e - s, : e - s] = False
        assert_bits_equal(got[c][:, outside.to(got.device)].cpu(), torch.zeros(shape.ngroups, int(outside.sum())),
                          what=f"CB padding of chunk {c}")


def test_bmm_chunk_catches_shifted_tokens():
    """Negative control: B read one token late (an off-by-one chunk start) is outside the bound."""
    inp = make_inputs(SHAPES[0], "two-partial-first", torch.float16)
    cu = inp.meta["cu_chunk_seqlens"]
    got = kbmm.bmm_chunk(inp.C, inp.B.roll(-1, dims=0).contiguous(), 64, cu)
    want = ref.bmm_chunk(inp.C, inp.B, 64, cu)
    with pytest.raises(Mismatch):
        assert_within_bound(got, want, bmm_bound(inp, torch.float16), what="CB")


# ----------------------------------------------------------------------------------------------- chunk scan


def silu_relative_error(profile: str) -> float:
    """Relative difference of z * sigmoid(z) between kernel and reference, first order: exp differs by
    (|z| + 2 LIB_ULPS) u (bounded here by |z| <= 8 for randn inputs: checked by the caller), then 1 + e, the
    division (CUDA's approximate division: 2 ulp) and the product add at most 4 u on each side."""
    return (8.0 + 2 * LIB_ULPS) * U32 + 2 * 4 * U32


def chunk_scan_bound(inp, io, scan_args, scan_kw) -> torch.Tensor:
    """(T, H, P): both sides sum N + L + 1 fp32 terms (C.prev over dstate, the causal cb_scaled.x, x D) of total
    magnitude S (reference.chunked.chunk_scan_magnitude, times 1 + u_io for io-rounded operands), then gate by
    silu (relative difference rho), then round to the io dtype: |d out| <= d_fp32 (1 + u_io) + 2 u_io S |silu|."""
    u_io = unit_roundoff(io, PROFILE)
    has_z = scan_kw.get("z") is not None
    if has_z:
        assert float(inp.z.abs().max()) <= 8.0, "silu_relative_error assumes |z| <= 8"
    mag = ref.chunk_scan_magnitude(*scan_args, **scan_kw).to(F64) * (1.0 + u_io)
    terms = inp.shape.dstate + inp.shape.chunk_size + 1
    rho = silu_relative_error(PROFILE) + U32 if has_z else 0.0
    d_fp32 = dot_bound(mag, terms, io, PROFILE) * (1.0 + rho) + rho * mag
    return d_fp32 * (1.0 + u_io) + 2.0 * u_io * mag


def scan_inputs(inp: Inputs, state_dtype: torch.dtype, *, entering: bool, with_init: bool, seed: int = 1):
    """Teacher-forced chunk-scan inputs: reference CB/dt_out/dA_cumsum, random states and initial states."""
    H, P, N = inp.shape.nheads, inp.shape.headdim, inp.shape.dstate
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(inp.md.nchunks, H, P, N, generator=g).to(state_dtype).to(DEVICE)
    init = torch.randn(inp.md.batch, H, P, N, generator=g).to(state_dtype).to(DEVICE) if with_init else None
    dA, dt_out = ref_cumsum(inp)
    CB = ref.bmm_chunk(inp.C, inp.B, inp.shape.chunk_size, inp.meta["cu_chunk_seqlens"])
    args = (CB, inp.x, dt_out, dA, inp.C, states, inp.meta["cu_chunk_seqlens"], inp.meta["seq_idx"])
    kw = dict(initial_states=init, states_are_entering=entering)
    return args, kw


def run_scan_pair(inp, io, args, kw):
    got = torch.full_like(inp.x, float("nan"))
    want = torch.full_like(inp.x, float("nan"))
    kscan.chunk_scan(*args, out=got, **kw)
    ref.chunk_scan(*args, out=want, profile=PROFILE, **kw)
    return got, want


SCAN_VARIANTS = ["init-Dhead-z", "noinit-Dchannel", "entering-z", "plain"]


def scan_cases():
    """Every variant with every io dtype (state dtype = io), spread over the scenarios, plus mixed state/io dtypes
    (states are cast to the io dtype before the dot) on the initial-state variant."""
    scen = scenarios()
    cases = []
    for i, (variant, io) in enumerate([(v, d) for v in SCAN_VARIANTS for d in IO_DTYPES]):
        shape, seqs = scen[i % len(scen)].values
        cases.append(pytest.param(shape, seqs, variant, io, io, id=f"{shape}-{seqs}-{variant}-{dtype_id(io)}"))
    mixed = [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16), (torch.float32, torch.float16),
             (torch.bfloat16, torch.float16)]
    for i, (io, st) in enumerate(mixed):
        shape, seqs = scen[(i + 1) % len(scen)].values
        cases.append(pytest.param(shape, seqs, "init-Dhead-z", io, st,
                                  id=f"{shape}-{seqs}-init-Dhead-z-{dtype_id(io)}-state-{dtype_id(st)}"))
    return cases


@pytest.mark.parametrize("shape,seqs,variant,io,state_dtype", scan_cases())
def test_chunk_scan(shape, seqs, variant, io, state_dtype):
    inp = make_inputs(shape, seqs, io)
    args, kw = scan_inputs(inp, state_dtype, entering=variant.startswith("entering"), with_init="init-" in variant)
    if "Dhead" in variant:
        kw["D"] = inp.D_head
    if "Dchannel" in variant:
        kw["D"] = inp.D_channel
    if variant.endswith("-z"):
        kw["z"] = inp.z
    got, want = run_scan_pair(inp, io, args, kw)
    assert_within_bound(got, want, chunk_scan_bound(inp, io, args, kw), what=f"chunk scan out ({variant})")


@pytest.mark.parametrize("broken", ["skipped-decay", "wrong-group", "wrong-previous-state", "no-initial-state"])
def test_chunk_scan_catches_broken_input(broken):
    """Negative control: each broken input (or the wrong previous-state convention) leaves the bound."""
    io = torch.bfloat16
    inp = make_inputs(SHAPES[1], "two-partial-first", io)  # ngroups = nheads, 2 sequences, 3 chunks
    args, kw = scan_inputs(inp, torch.float32, entering=False, with_init=True)
    kw["z"] = inp.z
    bad_args, bad_kw = list(args), dict(kw)
    if broken == "skipped-decay":
        bad_args[3] = torch.zeros_like(args[3])
    elif broken == "wrong-group":
        bad_args[4] = inp.C.roll(1, dims=1).contiguous()
    elif broken == "wrong-previous-state":
        bad_kw.update(states_are_entering=True, initial_states=None)  # reads states[c] instead of states[c - 1]
    else:
        bad_kw["initial_states"] = None
    got = torch.full_like(inp.x, float("nan"))
    kscan.chunk_scan(*bad_args, out=got, **bad_kw)
    want = torch.full_like(inp.x, float("nan"))
    ref.chunk_scan(*args, out=want, profile=PROFILE, **kw)
    with pytest.raises(Mismatch):
        assert_within_bound(got, want, chunk_scan_bound(inp, io, args, kw), what="chunk scan out")


def test_chunk_scan_leaves_other_tokens_untouched():
    """Only the rows of real tokens are stored: a sentinel-filled `out` keeps no NaN once every token is written,
    and a launch over a prefix of the chunks leaves the later tokens' sentinel bits as they were."""
    inp = make_inputs(SHAPES[0], "three-mixed", torch.float16)
    args, kw = scan_inputs(inp, torch.float16, entering=False, with_init=True)
    got = torch.full_like(inp.x, float("nan"))
    kscan.chunk_scan(*args, out=got, **kw)
    assert not torch.isnan(got).any()
    nc = 2
    cut = inp.md.cu_chunk_seqlens[nc]
    CB, x, dt_out, dA, C, states, cu, seq_idx = args
    part = torch.full_like(inp.x, float("nan"))
    kscan.chunk_scan(CB[:nc], x, dt_out[:, :nc], dA[:, :nc], C, states[:nc], cu[: nc + 1], seq_idx[:nc], out=part,
                     **kw)
    assert_bits_equal(part[cut:], torch.full_like(inp.x[cut:], float("nan")), what="tokens past the launched chunks")
    assert_bits_equal(part[:cut], got[:cut], what="tokens of the launched chunks")


# ----------------------------------------------------------------------------------------------- configs


def test_chunk_scan_configs_avoid_sm90_miscompile():
    """Every shipped chunk-scan config avoids the sm90 wgmma miscompile; the predicate itself flags a bad config."""
    bad = triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, num_stages=2, num_warps=4)
    assert kscan.miscompiles_on_sm90(bad)
    assert [c for c in kscan.CONFIGS if kscan.miscompiles_on_sm90(c)] == []


@contextlib.contextmanager
def forced_config(kernel, config):
    """Run ``kernel`` (a triton Autotuner) with only ``config``: a one-config autotuner launches it untimed."""
    saved_configs, saved_cache = kernel.configs, dict(kernel.cache)
    kernel.configs, kernel.cache = [config], {}
    try:
        yield
    finally:
        kernel.configs = saved_configs
        kernel.cache.clear()
        kernel.cache.update(saved_cache)


STAGE_KERNELS = {"chunk_state": kstate, "bmm_chunk": kbmm, "chunk_scan": kscan}


def _config_params():
    return [pytest.param(name, i, id=f"{name}-{i}") for name, mod in STAGE_KERNELS.items() for i in range(len(mod.CONFIGS))]


@pytest.mark.parametrize("stage,index", _config_params())
def test_every_config_within_bound(stage, index):
    """Each config of each autotuned stage, forced in turn, stays within the stage's bound (bf16, partial chunks)."""
    mod = STAGE_KERNELS[stage]
    kernel = getattr(mod, f"{stage}_kernel")
    io = torch.bfloat16
    inp = make_inputs(SHAPES[1], "two-partial-first", io)
    cu = inp.meta["cu_chunk_seqlens"]
    with forced_config(kernel, mod.CONFIGS[index]):
        if stage == "chunk_state":
            dA, dt_out = ref_cumsum(inp)
            got = kstate.chunk_state(inp.B, inp.x, dt_out, dA, cu)
            want = ref.chunk_state(inp.B, inp.x, dt_out, dA, cu, profile=PROFILE)
            bound = chunk_state_bound(inp, io, dt_out, dA)
        elif stage == "bmm_chunk":
            got = kbmm.bmm_chunk(inp.C, inp.B, inp.shape.chunk_size, cu)
            want = ref.bmm_chunk(inp.C, inp.B, inp.shape.chunk_size, cu)
            bound = bmm_bound(inp, io)
        else:
            args, kw = scan_inputs(inp, torch.bfloat16, entering=False, with_init=True)
            kw.update(D=inp.D_channel, z=inp.z)
            got, want = run_scan_pair(inp, io, args, kw)
            bound = chunk_scan_bound(inp, io, args, kw)
        assert kernel.best_config is mod.CONFIGS[index]
    assert_within_bound(got, want, bound, what=f"{stage} with config {index}: {mod.CONFIGS[index]}")
