"""Each Triton stage kernel against its PyTorch twin in ``reference.chunked``, fed identical inputs.

What is exact and what is bounded, and why:
- chunk cumsum ``dt_out``: elementwise fp32 (bias add, softplus, clamp, zero padding) that the twin computes with the
  kernel's own formula per profile (``reference.arith.softplus``: exp2(x LOG2E) then libdevice log1p on CUDA,
  log(1 + e) under the interpreter), so it is compared bit for bit on both backends, softplus included. On CUDA this
  pins that libdevice's log1p is the routine torch.log1p runs (the GPU tier verifies it).
- chunk cumsum ``dA_cumsum``: under the interpreter ``tl.cumsum`` is numpy's sequential cumsum, as in the twin's
  interpreter profile: exact. On CUDA the scan order is the kernel's: bounded.
- chunk scan's epilogue (D residual, z gate with div_rn, output cast): exact when the dots contribute exact zeros.
- chunk state, bmm, chunk scan: ``tl.dot`` sums in an order PyTorch cannot reproduce (and reads fp32 operands as
  truncated tf32 on CUDA): bounded by ``harness.bounds``. Their operands (b_scaled, cb_scaled, the io-cast previous
  state) and every elementwise step are bit-equal on both sides under the profile, so only the dots differ.

Negative controls show each bug is decisive under both backends' bounds (``harness.bounds.decisive_margin`` on the
exact fp64 stage results of the correct and the bugged inputs), then that the check fires here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from itertools import pairwise

import pytest
import torch
import triton

from harness import bounds
from harness.cases.model import Shape
from harness.compare import Mismatch, assert_bits_equal, assert_within_bound
from harness.triton_autotuner import forced_config
from harness.varlen import build_varlen_metadata
from kernels import bmm_chunk as kbmm
from kernels import chunk_cumsum as kcumsum
from kernels import chunk_scan as kscan
from kernels import chunk_state as kstate
from kernels import chunk_state_bmm as kone
from kernels import tuned_configs
from kernels.environment import arithmetic_profile
from reference import arith
from reference import chunked as ref
from tests.support import case_file_shapes

F32, F64 = torch.float32, torch.float64

# Triton 3.6's interpreter itself converts 1-element arrays to ints (runtime loop bounds): numpy deprecation noise.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def assert_decisive_everywhere(margins: dict, what: str) -> None:
    """margins: backend -> decisive margin. A control must be decisive under every backend's bound, not only here."""
    print(f"{what}: decisive margins " + ", ".join(f"{b} {m:.3g}" for b, m in margins.items()))
    weak = {b: m for b, m in margins.items() if not m > 1}
    assert not weak, f"{what}: the deliberate bug is within reach of the bound on {weak}: not a decisive control"


# ----------------------------------------------------------------------------------------------- inputs


def shape_id(s: Shape) -> str:
    return f"H{s.nheads}P{s.headdim}N{s.dstate}G{s.ngroups}Q{s.chunk_size}"


# Model shapes of the case corpus (cases/corpus), so that on a GPU the stages' binaries are the ones the corpus's
# warmup compiles anyway: odd headdim and nheads with one group, ngroups = nheads, 1 < ngroups < nheads with 128-token
# chunks; with first partial chunks and short last chunks below. Small enough for the interpreter.
SHAPES = [
    Shape(11, 19, 32, 1, 64),
    Shape(3, 5, 16, 3, 64),
    Shape(4, 16, 64, 2, 128),
]
# Where the H200 measured the CB element ``test_bmm_fp32_h200_element_fits_truncated_tf32_bound`` pins (it launches no
# kernel).
H200_MEASURED_SHAPE = Shape(3, 5, 16, 1, 64)
SEQUENCES = {
    "one-short": ([0], [30]),
    "two-partial-first": ([5, 0], [70, 20]),
    "three-mixed": ([100, 64, 3], [40, 64, 10]),
}


def scenarios():
    """(shape, sequences) pairs: every shape and every sequence layout appear, without the full product."""
    names = list(SEQUENCES)
    every_shape = [(s, names[i % len(names)]) for i, s in enumerate(SHAPES)]
    return [pytest.param(s, seqs, id=f"{shape_id(s)}-{seqs}") for s, seqs in every_shape] + [
        pytest.param(SHAPES[0], "three-mixed", id=f"{shape_id(SHAPES[0])}-three-mixed"),
        pytest.param(SHAPES[1], "one-short", id=f"{shape_id(SHAPES[1])}-one-short"),
    ]


def dtype_id(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


@dataclass
class Inputs:
    shape: Shape
    device: str
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

    @property
    def profile(self) -> str:
        """The arithmetic profile the kernels follow on this device; its name is also the backend ``harness.bounds``
        models ("cuda" or "interpreter")."""
        return arithmetic_profile(self.device)


def make_inputs(shape: Shape, seqs: str | tuple[list[int], list[int]], io: torch.dtype, device: str,
                seed: int = 0) -> Inputs:
    """Seeded CPU tensors moved to the device, for the sequences ``SEQUENCES`` names (or ``(contexts, tokens)``).
    dt around softplus(-2) so decays stay inside a chunk's range."""
    contexts, tokens = SEQUENCES[seqs] if isinstance(seqs, str) else seqs
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
    t = {k: v.to(device) for k, v in t.items()}
    return Inputs(shape=shape, device=device, md=md, meta=md.tensors(device), **t)


def ref_cumsum(inp: Inputs, softplus: bool = True):
    """The reference twin's (dA_cumsum, dt_out): shared inputs for the downstream stage tests."""
    return ref.chunk_cumsum(inp.dt, inp.A, inp.shape.chunk_size, inp.meta["cu_chunk_seqlens"], dt_bias=inp.dt_bias,
                            dt_softplus=softplus, profile=inp.profile)


# ----------------------------------------------------------------------------------------------- chunk cumsum


def _abs_dA_cumsum(dt_out, A) -> torch.Tensor:
    """(H, C, Q) fp64: running sum of |dt_out A| (the magnitude ``bounds.chunk_cumsum_bound`` scales)."""
    return torch.cumsum((dt_out.cpu().to(F64) * A.cpu().to(F64)[:, None, None]).abs(), dim=-1)


def _exact_dA_cumsum(dt_out, A) -> torch.Tensor:
    """(H, C, Q) fp64: the exact cumsum of dt_out A (products exact in fp64) that kernel and twin both approximate."""
    return torch.cumsum(dt_out.cpu().to(F64) * A.cpu().to(F64)[:, None, None], dim=-1)


def check_dA_cumsum(got, want, dt_out, A, chunk_size, profile) -> None:
    """Interpreter: sequential numpy scan on both sides, exact. CUDA: the kernel's scan order, bounded."""
    if profile == "interpreter":
        assert_bits_equal(got, want, what="dA_cumsum (interpreter: sequential scan on both sides, exact)")
    else:
        bound = bounds.chunk_cumsum_bound(_abs_dA_cumsum(dt_out, A), chunk_size=chunk_size, backend=profile)
        assert_within_bound(got, want, bound, what="dA_cumsum (cuda: scan order differs, bounded)")


@pytest.mark.parametrize("softplus,limit,bias", [(False, (0.0, math.inf), True), (False, (0.05, 0.2), False),
                                                  (True, (0.0, math.inf), True), (True, (0.1, 0.5), True)],
                         ids=["plain", "limit-nobias", "softplus", "softplus-limit"])
@pytest.mark.parametrize("shape,seqs", scenarios())
def test_chunk_cumsum(shape, seqs, softplus, limit, bias, device):
    inp = make_inputs(shape, seqs, torch.float32, device)
    if not softplus:  # keep dt positive, as softplus would
        inp.dt = inp.dt.abs() * 0.1
    kw = dict(dt_bias=inp.dt_bias if bias else None, dt_softplus=softplus, dt_limit=limit)
    cu = inp.meta["cu_chunk_seqlens"]
    dA_k, dt_k = kcumsum.chunk_cumsum(inp.dt, inp.A, shape.chunk_size, cu, **kw)
    dA_r, dt_r = ref.chunk_cumsum(inp.dt, inp.A, shape.chunk_size, cu, profile=inp.profile, **kw)
    assert_bits_equal(dt_k, dt_r, what=f"dt_out ({'softplus, ' if softplus else ''}exact)")
    check_dA_cumsum(dA_k, dA_r, dt_r, inp.A, shape.chunk_size, inp.profile)


def _wide_dt(tokens=1024, nheads=8, seed=3):
    """dt spanning every softplus regime: e underflowing in 1 + e (-30), the usual -6..2, the threshold's sides."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.rand(tokens, nheads, generator=g) * 52.0 - 30.0
    dt[:8, 0] = torch.tensor([20.0, math.nextafter(20.0, 21.0), 19.999998, -17.0, -16.5, 0.0, -0.0, 1e-30])
    return dt


def test_softplus_dt_out_exact_over_every_regime(device, profile):
    """dt_out with softplus is bit-exact over [-30, 22] and at the threshold, not only on the stage inputs: on CUDA
    this is the check that libdevice log1p and torch.log1p are one routine."""
    md = build_varlen_metadata([0], [1024], 64)
    dt, A = _wide_dt().to(device), -torch.ones(8, device=device)
    cu = md.tensors(device)["cu_chunk_seqlens"]
    dA_k, dt_k = kcumsum.chunk_cumsum(dt, A, 64, cu, dt_softplus=True)
    dA_r, dt_r = ref.chunk_cumsum(dt, A, 64, cu, dt_softplus=True, profile=profile)
    assert_bits_equal(dt_k, dt_r, what="dt_out softplus over [-30, 22]")
    check_dA_cumsum(dA_k, dA_r, dt_r, A, 64, profile)


def test_exact_dt_out_catches_natural_exp_softplus(device, profile):
    """Negative control: the textbook softplus log1p(exp(dt)) (natural exp) is not the kernel's arithmetic; the exact
    comparison reports it."""
    md = build_varlen_metadata([0], [1024], 64)
    dt, A = _wide_dt().to(device), -torch.ones(8, device=device)
    cu = md.tensors(device)["cu_chunk_seqlens"]
    _, dt_k = kcumsum.chunk_cumsum(dt, A, 64, cu, dt_softplus=True)
    textbook = torch.where(dt <= 20.0, torch.log1p(torch.exp(dt)), dt)
    _, dt_textbook = ref.chunk_cumsum(textbook, A, 64, cu, profile=profile)  # dt_out layout of the values
    with pytest.raises(Mismatch) as err:
        assert_bits_equal(dt_k, dt_textbook, what="dt_out vs natural-exp softplus")
    print(f"natural-exp softplus: {err.value.count} of {dt.numel()} elements differ")


def test_chunk_cumsum_catches_missing_bias(device):
    """Negative control: a kernel run without dt_bias. dt_out is exact, so any changed bit is caught; dA_cumsum's
    check is decisive under both backends' bounds (the exact effect is |A| times the running sum of the softplus
    change) and fires here."""
    inp = make_inputs(SHAPES[0], "two-partial-first", torch.float32, device)
    cu = inp.meta["cu_chunk_seqlens"]
    dA_k, dt_k = kcumsum.chunk_cumsum(inp.dt, inp.A, 64, cu, dt_bias=None, dt_softplus=True)
    dA_r, dt_r = ref.chunk_cumsum(inp.dt, inp.A, 64, cu, dt_bias=inp.dt_bias, dt_softplus=True, profile=inp.profile)
    with pytest.raises(Mismatch):
        assert_bits_equal(dt_k, dt_r, what="dt_out")
    margins = {b: bounds.decisive_margin(
        _exact_dA_cumsum(dt_r, inp.A), bounds.chunk_cumsum_bound(_abs_dA_cumsum(dt_r, inp.A), chunk_size=64, backend=b),
        _exact_dA_cumsum(dt_k, inp.A), bounds.chunk_cumsum_bound(_abs_dA_cumsum(dt_k, inp.A), chunk_size=64, backend=b),
        compared_err=bounds.chunk_cumsum_bound(_abs_dA_cumsum(dt_r, inp.A), chunk_size=64, backend=b))
        for b in bounds.BACKENDS}
    assert_decisive_everywhere(margins, "missing dt_bias, dA_cumsum")
    with pytest.raises(Mismatch):
        check_dA_cumsum(dA_k, dA_r, dt_r, inp.A, 64, inp.profile)


def test_chunk_cumsum_exact_check_catches_one_ulp(device):
    """Negative control for the exact comparison: one ulp in one element of dt_out is reported."""
    inp = make_inputs(SHAPES[0], "one-short", torch.float32, device)
    inp.dt = inp.dt.abs() * 0.1
    _, dt_k = kcumsum.chunk_cumsum(inp.dt, inp.A, 64, inp.meta["cu_chunk_seqlens"])
    bent = dt_k.clone()
    bent[1, 0, 3] = torch.nextafter(bent[1, 0, 3], torch.tensor(math.inf, device=bent.device))
    with pytest.raises(Mismatch) as err:
        assert_bits_equal(bent, dt_k, what="dt_out")
    assert err.value.count == 1


# ----------------------------------------------------------------------------------------------- chunk state


def chunk_state_bound(inp: Inputs, io: torch.dtype, dt_out, dA_cumsum, *, B=None, backend=None) -> torch.Tensor:
    """(C, H, P, N) ``bounds.chunk_state_bound`` over the fp64 magnitude sum_l |x| |b_scaled| (B defaults to inp.B;
    backend to the one the kernels ran on)."""
    mag = ref.chunk_state_magnitude(inp.B if B is None else B, inp.x, dt_out, dA_cumsum, inp.meta["cu_chunk_seqlens"],
                                    profile=inp.profile)
    return bounds.chunk_state_bound(mag, io_dtype=io, chunk_size=inp.shape.chunk_size, backend=backend or inp.profile)


@pytest.mark.parametrize("io", IO_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,seqs", scenarios())
def test_chunk_state(shape, seqs, io, device):
    inp = make_inputs(shape, seqs, io, device)
    dA, dt_out = ref_cumsum(inp)
    cu = inp.meta["cu_chunk_seqlens"]
    got = kstate.chunk_state(inp.B, inp.x, dt_out, dA, cu)
    want = ref.chunk_state(inp.B, inp.x, dt_out, dA, cu, profile=inp.profile)
    assert got.dtype == F32 and got.shape == want.shape
    assert_within_bound(got, want, chunk_state_bound(inp, io, dt_out, dA), what="chunk states")


@pytest.mark.parametrize("io", IO_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,seqs", scenarios())
def test_fused_chunk_state_passing_is_chunk_state_then_state_passing(shape, seqs, io, device):
    """The snapshot path's fused kernel gives the bits of the two stages it fuses (the indexed path runs them apart,
    and the two paths must agree bit for bit): chunk_state's chunk states, then the teacher-forced recurrence on
    them, exiting states in fp32 with zero initial states."""
    from kernels.chunk_state_passing import chunk_state_passing, state_passing

    inp = make_inputs(shape, seqs, io, device)
    dA, dt_out = ref_cumsum(inp)
    cu, seq_idx = inp.meta["cu_chunk_seqlens"], inp.meta["seq_idx"]
    want = state_passing(kstate.chunk_state(inp.B, inp.x, dt_out, dA, cu), dA, seq_idx, out_dtype=F32)
    got = torch.full_like(want, math.nan)
    chunk_state_passing(inp.B, inp.x, dt_out, dA, cu, seq_idx, out=got)
    assert_bits_equal(got, want, what=f"fused exiting states vs chunk_state + state_passing ({io})")


@pytest.mark.parametrize("broken", ["wrong-group", "skipped-decay"])
def test_chunk_state_catches_broken_input(broken, device):
    """Negative control: B from the wrong group, or dA_cumsum zeroed (no decay): decisive under both backends'
    bounds (exact fp64 chunk states of the correct and the bugged inputs), and outside the bound here."""
    inp = make_inputs(SHAPES[1], "two-partial-first", torch.bfloat16, device)  # ngroups = nheads: distinct groups
    dA, dt_out = ref_cumsum(inp)
    cu = inp.meta["cu_chunk_seqlens"]
    B, dA_k = inp.B, dA
    if broken == "wrong-group":
        B = inp.B.roll(1, dims=1).contiguous()
    else:
        dA_k = torch.zeros_like(dA)

    def exact(B_, dA_):
        return ref.chunk_state_magnitude(B_, inp.x, dt_out, dA_, cu, profile=inp.profile, absolute=False)

    margins = {}
    for b in bounds.BACKENDS:
        bound = chunk_state_bound(inp, torch.bfloat16, dt_out, dA, backend=b)
        margins[b] = bounds.decisive_margin(exact(inp.B, dA), bound, exact(B, dA_k),
                                            chunk_state_bound(inp, torch.bfloat16, dt_out, dA_k, B=B, backend=b),
                                            compared_err=bound)
    assert_decisive_everywhere(margins, f"chunk state, {broken}")
    got = kstate.chunk_state(B, inp.x, dt_out, dA_k, cu)
    want = ref.chunk_state(inp.B, inp.x, dt_out, dA, cu, profile=inp.profile)
    with pytest.raises(Mismatch):
        assert_within_bound(got, want, chunk_state_bound(inp, torch.bfloat16, dt_out, dA), what="chunk states")


# ----------------------------------------------------------------------------------------------- bmm


def bmm_bound(inp: Inputs, io: torch.dtype, *, B=None, backend=None) -> torch.Tensor:
    """(C, G, Q, Q) ``bounds.bmm_chunk_bound`` over sum_n |C| |B| in fp64; exact zeros outside each chunk (backend:
    the one the kernels ran on unless named)."""
    mag = ref.bmm_chunk_magnitude(inp.C, inp.B if B is None else B, inp.shape.chunk_size, inp.meta["cu_chunk_seqlens"])
    return bounds.bmm_chunk_bound(mag, io_dtype=io, dstate=inp.shape.dstate, backend=backend or inp.profile)


@pytest.mark.parametrize("io", IO_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,seqs", scenarios())
def test_bmm_chunk(shape, seqs, io, device):
    inp = make_inputs(shape, seqs, io, device)
    cu = inp.meta["cu_chunk_seqlens"]
    got = kbmm.bmm_chunk(inp.C, inp.B, shape.chunk_size, cu)
    want = ref.bmm_chunk(inp.C, inp.B, shape.chunk_size, cu)
    assert got.dtype == F32 and got.shape == want.shape
    assert_within_bound(got, want, bmm_bound(inp, io), what="CB")
    # Outside each chunk's (len, len) block the bound is 0: padding must be written as exact zeros.
    for c, (s, e) in enumerate(pairwise(inp.md.cu_chunk_seqlens)):
        outside = torch.ones(shape.chunk_size, shape.chunk_size, dtype=torch.bool)
        outside[: e - s, : e - s] = False
        assert_bits_equal(got[c][:, outside.to(got.device)].cpu(), torch.zeros(shape.ngroups, int(outside.sum())),
                          what=f"CB padding of chunk {c}")


def test_bmm_fp32_h200_element_fits_truncated_tf32_bound(device):
    """An element the H200 computed outside a round-to-nearest tf32 bound (notes/gpu-runs.md), in test_bmm_chunk
    on ``H200_MEASURED_SHAPE``, three-mixed, float32: CB[2, 0, 31, 32] = 7.34079647064209 on the GPU vs the twin's
    7.350269317626953. The truncated-tf32 model holds it (about half the bound used); the round-to-nearest model
    (operands rounded to nearest, 2^-11, dots gamma_N each side) is exceeded, as on the GPU."""
    inp = make_inputs(H200_MEASURED_SHAPE, "three-mixed", torch.float32, device)
    cu = inp.meta["cu_chunk_seqlens"]
    want = ref.bmm_chunk(inp.C, inp.B, 64, cu)[2, 0, 31, 32].cpu()
    assert want.item() == 7.350269317626953, "the reported expected value: the stage inputs changed"
    gpu = torch.tensor(7.34079647064209, dtype=F32)
    at = (2, 0, 31, 32)
    bound = bmm_bound(inp, torch.float32, backend="cuda")[at]
    use = assert_within_bound(gpu, want, bound, what="H200 CB element, truncated tf32").max_bound_use
    assert 0.4 < use < 0.6, f"bound use {use:.3g}: the model's margin on the measured element changed"
    mag = ref.bmm_chunk_magnitude(inp.C, inp.B, 64, cu)[at]
    v, gam = 2.0**-11, bounds.gamma(16, 2.0**-24)
    rounded_model = mag * (2 * gam + (2 * v + v * v) * (1 + gam))
    with pytest.raises(Mismatch):
        assert_within_bound(gpu, want, rounded_model, what="H200 CB element, round-to-nearest tf32 model")


def test_bmm_chunk_catches_shifted_tokens(device):
    """Negative control: B read one token late (an off-by-one chunk start): decisive under both backends' bounds
    (exact fp64 CB of both), and outside the bound here."""
    inp = make_inputs(SHAPES[0], "two-partial-first", torch.float16, device)
    cu = inp.meta["cu_chunk_seqlens"]
    shifted = inp.B.roll(-1, dims=0).contiguous()
    margins = {}
    for b in bounds.BACKENDS:
        bound = bmm_bound(inp, torch.float16, backend=b)
        margins[b] = bounds.decisive_margin(
            ref.bmm_chunk_magnitude(inp.C, inp.B, 64, cu, absolute=False), bound,
            ref.bmm_chunk_magnitude(inp.C, shifted, 64, cu, absolute=False),
            bmm_bound(inp, torch.float16, B=shifted, backend=b), compared_err=bound)
    assert_decisive_everywhere(margins, "CB with B shifted one token")
    got = kbmm.bmm_chunk(inp.C, shifted, 64, cu)
    want = ref.bmm_chunk(inp.C, inp.B, 64, cu)
    with pytest.raises(Mismatch):
        assert_within_bound(got, want, bmm_bound(inp, torch.float16), what="CB")


# ----------------------------------------------------------------------------------------------- chunk scan


def chunk_scan_bound(inp, io, scan_args, scan_kw, ref_out, *, backend=None) -> torch.Tensor:
    """(T, H, P) ``bounds.chunk_scan_bound``: the gate is the kernel's own formula in the twin (gate_rel_err 0);
    backend: the one the kernels ran on unless named."""
    mag = ref.chunk_scan_magnitude(*scan_args, **scan_kw, profile=inp.profile)
    return bounds.chunk_scan_bound(mag, ref_out, io_dtype=io, chunk_size=inp.shape.chunk_size,
                                   dstate=inp.shape.dstate, backend=backend or inp.profile)


def scan_inputs(inp: Inputs, state_dtype: torch.dtype, *, entering: bool, with_init: bool, seed: int = 1):
    """Teacher-forced chunk-scan inputs: reference CB/dt_out/dA_cumsum, random states and initial states."""
    H, P, N = inp.shape.nheads, inp.shape.headdim, inp.shape.dstate
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(inp.md.nchunks, H, P, N, generator=g).to(state_dtype).to(inp.device)
    init = torch.randn(inp.md.batch, H, P, N, generator=g).to(state_dtype).to(inp.device) if with_init else None
    dA, dt_out = ref_cumsum(inp)
    CB = ref.bmm_chunk(inp.C, inp.B, inp.shape.chunk_size, inp.meta["cu_chunk_seqlens"])
    args = (CB, inp.x, dt_out, dA, inp.C, states, inp.meta["cu_chunk_seqlens"], inp.meta["seq_idx"])
    kw = dict(initial_states=init, states_are_entering=entering)
    return args, kw


def run_scan_pair(inp, io, args, kw):
    got = torch.full_like(inp.x, float("nan"))
    want = torch.full_like(inp.x, float("nan"))
    kscan.chunk_scan(*args, out=got, **kw)
    ref.chunk_scan(*args, out=want, profile=inp.profile, **kw)
    return got, want


SCAN_VARIANTS = ["init-Dhead-z", "noinit-Dchannel", "entering-z", "plain"]


def scan_cases():
    """Every variant with every io dtype (state dtype = io), spread over the scenarios, plus mixed state/io dtypes
    (states are cast to the io dtype before the dot) on the initial-state variant."""
    scen = scenarios()
    cases = []
    for i, (variant, io) in enumerate([(v, d) for v in SCAN_VARIANTS for d in IO_DTYPES]):
        shape, seqs = scen[i % len(scen)].values
        cases.append(pytest.param(shape, seqs, variant, io, io,
                                  id=f"{shape_id(shape)}-{seqs}-{variant}-{dtype_id(io)}"))
    mixed = [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16), (torch.float32, torch.float16),
             (torch.bfloat16, torch.float16)]
    for i, (io, st) in enumerate(mixed):
        shape, seqs = scen[(i + 1) % len(scen)].values
        cases.append(pytest.param(shape, seqs, "init-Dhead-z", io, st,
                                  id=f"{shape_id(shape)}-{seqs}-init-Dhead-z-{dtype_id(io)}-state-{dtype_id(st)}"))
    return cases


@pytest.mark.parametrize("shape,seqs,variant,io,state_dtype", scan_cases())
def test_chunk_scan(shape, seqs, variant, io, state_dtype, device):
    inp = make_inputs(shape, seqs, io, device)
    args, kw = scan_inputs(inp, state_dtype, entering=variant.startswith("entering"), with_init="init-" in variant)
    if "Dhead" in variant:
        kw["D"] = inp.D_head
    if "Dchannel" in variant:
        kw["D"] = inp.D_channel
    if variant.endswith("-z"):
        kw["z"] = inp.z
    got, want = run_scan_pair(inp, io, args, kw)
    assert_within_bound(got, want, chunk_scan_bound(inp, io, args, kw, want), what=f"chunk scan out ({variant})")


def _epilogue_only(inp: Inputs, D):
    """Chunk-scan inputs whose dots contribute exact zeros (CB = 0, zero states, no initial state): the output is
    the elementwise epilogue alone, (x D) * (z sigmoid(z)) cast to the io dtype."""
    args, kw = scan_inputs(inp, F32, entering=False, with_init=False)
    CB, x, dt_out, dA, C, states, cu, seq_idx = args
    args = (torch.zeros_like(CB), x, dt_out, dA, C, torch.zeros_like(states), cu, seq_idx)
    return args, dict(kw, D=D, z=inp.z)


@pytest.mark.parametrize("io", IO_DTYPES, ids=dtype_id)
def test_chunk_scan_epilogue_exact(io, device):
    """D residual (FMA on CUDA, multiply then add under the interpreter), z gate (exp2 and div_rn) and the output
    cast: the same bits as the twin's profile, on both backends."""
    inp = make_inputs(SHAPES[1], "two-partial-first", io, device)
    args, kw = _epilogue_only(inp, inp.D_channel)
    got, want = run_scan_pair(inp, io, args, kw)
    assert_bits_equal(got, want, what=f"chunk scan epilogue ({dtype_id(io)})")


def test_exact_epilogue_catches_natural_sigmoid(device):
    """Negative control: torch.sigmoid (natural exp) for the gate is not the kernel's arithmetic; fp32 io keeps the
    gate's last bits visible in the output."""
    inp = make_inputs(SHAPES[1], "two-partial-first", torch.float32, device)
    args, kw = _epilogue_only(inp, inp.D_channel)
    got, _ = run_scan_pair(inp, torch.float32, args, kw)
    x, z, D = inp.x.to(F32), inp.z.to(F32), inp.D_channel.to(F32)
    residual = arith.mul_add(x, D[None], torch.zeros_like(x), inp.profile)
    with pytest.raises(Mismatch) as err:
        assert_bits_equal(got, residual * (z * torch.sigmoid(z)), what="epilogue vs natural sigmoid")
    print(f"natural sigmoid: {err.value.count} of {got.numel()} elements differ")


@pytest.mark.parametrize("broken", ["skipped-decay", "wrong-group", "wrong-previous-state", "no-initial-state"])
def test_chunk_scan_catches_broken_input(broken, device):
    """Negative control: each broken input (or the wrong previous-state convention) is decisive under both
    backends' bounds (exact fp64 chunk scans of the correct and the bugged inputs) and leaves the bound here."""
    io = torch.bfloat16
    inp = make_inputs(SHAPES[1], "two-partial-first", io, device)  # ngroups = nheads, 2 sequences, 3 chunks
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
    ref.chunk_scan(*args, out=want, profile=inp.profile, **kw)
    want_bug = torch.full_like(inp.x, float("nan"))
    ref.chunk_scan(*bad_args, out=want_bug, profile=inp.profile, **bad_kw)
    exact = ref.chunk_scan_magnitude(*args, **kw, profile=inp.profile, absolute=False)
    exact_bug = ref.chunk_scan_magnitude(*bad_args, **bad_kw, profile=inp.profile, absolute=False)
    margins = {}
    for b in bounds.BACKENDS:
        bound = chunk_scan_bound(inp, io, args, kw, want, backend=b)
        margins[b] = bounds.decisive_margin(exact, bound, exact_bug,
                                            chunk_scan_bound(inp, io, bad_args, bad_kw, want_bug, backend=b),
                                            compared_err=bound)
    assert_decisive_everywhere(margins, f"chunk scan, {broken}")
    with pytest.raises(Mismatch):
        assert_within_bound(got, want, chunk_scan_bound(inp, io, args, kw, want), what="chunk scan out")


def test_chunk_scan_leaves_other_tokens_untouched(device):
    """Only the rows of real tokens are stored: a sentinel-filled `out` keeps no NaN once every token is written,
    and a launch over a prefix of the chunks leaves the later tokens' sentinel bits as they were."""
    inp = make_inputs(SHAPES[0], "three-mixed", torch.float16, device)
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


STAGE_KERNELS = {"chunk_state": kstate, "bmm_chunk": kbmm, "chunk_scan": kscan}


def _config_params():
    return [pytest.param(name, i, id=f"{name}-{i}")
            for name, mod in STAGE_KERNELS.items() for i in range(len(mod.CONFIGS))]


@pytest.mark.parametrize("stage,index", _config_params())
def test_every_config_within_bound(stage, index, device):
    """Each config of each autotuned stage, forced in turn, stays within the stage's bound (bf16, partial chunks)."""
    mod = STAGE_KERNELS[stage]
    kernel = getattr(mod, f"{stage}_kernel")
    io = torch.bfloat16
    inp = make_inputs(SHAPES[1], "two-partial-first", io, device)
    cu = inp.meta["cu_chunk_seqlens"]
    with forced_config(kernel, mod.CONFIGS[index]):
        if stage == "chunk_state":
            dA, dt_out = ref_cumsum(inp)
            got = kstate.chunk_state(inp.B, inp.x, dt_out, dA, cu)
            want = ref.chunk_state(inp.B, inp.x, dt_out, dA, cu, profile=inp.profile)
            bound = chunk_state_bound(inp, io, dt_out, dA)
        elif stage == "bmm_chunk":
            got = kbmm.bmm_chunk(inp.C, inp.B, inp.shape.chunk_size, cu)
            want = ref.bmm_chunk(inp.C, inp.B, inp.shape.chunk_size, cu)
            bound = bmm_bound(inp, io)
        else:
            args, kw = scan_inputs(inp, torch.bfloat16, entering=False, with_init=True)
            kw.update(D=inp.D_channel, z=inp.z)
            got, want = run_scan_pair(inp, io, args, kw)
            bound = chunk_scan_bound(inp, io, args, kw, want)
        assert kernel.best_config is mod.CONFIGS[index]
    assert_within_bound(got, want, bound, what=f"{stage} with config {index}: {mod.CONFIGS[index]}")


@pytest.mark.parametrize("index", range(len(kcumsum.CONFIGS)))
def test_every_chunk_cumsum_config(index, device):
    """Each chunk_cumsum config, forced: dt_out bit for bit, dA_cumsum within its bound (its scan order may follow
    the config), on partial chunks with softplus and a bias."""
    shape = SHAPES[1]
    inp = make_inputs(shape, "two-partial-first", torch.float32, device)
    kw = dict(dt_bias=inp.dt_bias, dt_softplus=True, dt_limit=(0.0, math.inf))
    cu = inp.meta["cu_chunk_seqlens"]
    with forced_config(kcumsum.chunk_cumsum_kernel, kcumsum.CONFIGS[index]):
        dA_k, dt_k = kcumsum.chunk_cumsum(inp.dt, inp.A, shape.chunk_size, cu, **kw)
        assert kcumsum.chunk_cumsum_kernel.best_config is kcumsum.CONFIGS[index]
    dA_r, dt_r = ref.chunk_cumsum(inp.dt, inp.A, shape.chunk_size, cu, profile=inp.profile, **kw)
    assert_bits_equal(dt_k, dt_r, what=f"dt_out with config {index}: {kcumsum.CONFIGS[index]}")
    check_dA_cumsum(dA_k, dA_r, dt_r, inp.A, shape.chunk_size, inp.profile)


# Tiles of the fused chunk state + state passing kernel: (BLOCK_SIZE_M headdim, BLOCK_SIZE_N dstate, BLOCK_SIZE_K).
FUSED_TILES = [(16, 16, 16), (16, 32, 32), (32, 16, 64)]


def test_every_checked_in_fused_tile_fits_in_shared_memory():
    """A checked-in tile whose pipelined x and B tiles exceed the GPU's shared memory cannot launch at all (fp32 io
    at the bf16 tile needed 264196 bytes of 232448 on the H200): each leaves room for Triton's own buffers."""
    from kernels import chunk_state_passing as csp

    for (arch, _P, _N, _Q, io_bytes), entry in csp.TUNED.items():
        config = entry.config
        need = csp.pipelined_tile_bytes(config, io_bytes)
        assert need + 8192 <= csp.SHARED_MEMORY_LIMIT[arch], (arch, io_bytes, config, need)
    too_big = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=256, num_warps=8, num_stages=2)
    assert csp.pipelined_tile_bytes(too_big, 4) + 8192 > csp.SHARED_MEMORY_LIMIT["sm90"]  # the check can fail


def test_every_fused_tile_gives_the_same_recurrence_bits(monkeypatch, device):
    """The fused kernel runs one fixed tile per shape class, chosen by speed. The recurrence is elementwise over the
    state, so the tile cannot change a bit of it: teacher-forced (``stages.state_passing``), every tile writes the
    workspace and the cache rows the first one writes (headdim 20 is no multiple of 16 or 32: tail masks)."""
    from kernels import chunk_state_passing as csp

    g = torch.Generator().manual_seed(5)
    C, H, P, N = 3, 2, 20, 32
    states = torch.randn(C, H, P, N, generator=g).to(device)
    dA = (-torch.rand(H, C, 8, generator=g)).cumsum(-1).to(device)
    seq_idx = torch.tensor([0, 0, 1], dtype=torch.int32, device=device)
    init = torch.randn(2, H, P, N, generator=g).to(device)
    runs = []
    for m, n, k in FUSED_TILES:
        config = dict(BLOCK_SIZE_M=m, BLOCK_SIZE_N=n, BLOCK_SIZE_K=k, num_warps=4, num_stages=2)
        monkeypatch.setattr(csp, "teacher_forced_config", lambda P, N, Q, config=config: config)
        cache = torch.zeros(4, H, P, N, device=device)
        out = csp.state_passing(states, dA, seq_idx, initial_states=init, out_dtype=torch.float32, state_cache=cache,
                                final_state_indices=torch.tensor([2, 0], dtype=torch.int32, device=device),
                                last_chunk_indices=torch.tensor([1, 2], dtype=torch.int32, device=device))
        runs.append(((m, n, k), out, cache))
    first_tile, first_out, first_cache = runs[0]
    assert first_cache[[0, 2]].abs().sum() > 0  # the final states were written
    for tile, out, cache in runs[1:]:
        assert_bits_equal(out, first_out, what=f"workspace with tile {tile} vs {first_tile}")
        assert_bits_equal(cache, first_cache, what=f"cache with tile {tile} vs {first_tile}")


# ---------------------------------------------------------------------- chunk state and bmm in one kernel
# ``kernels.chunk_state_bmm``: each tensor it writes has the bits of its own stage's kernel under the same blocks; its
# config is fixed only where both stages' are; the warmup holds its binaries; a wrong split of its programs is caught.

SERVING = Shape(64, 64, 128, 1, 256)  # the corpus's serving shape: its binaries are the corpus's


def one_kernel_configs(P: int, N: int, Q: int, nchunks: int) -> tuple[dict, triton.Config, triton.Config]:
    """The one kernel's config for this shape, and each stage kernel's config with the same blocks. Where the one
    kernel has none (the GPU at a shape without checked-in configs: ``ssd_prefill`` launches the two kernels there),
    blocks that fit the shape, so that the comparison still runs on the GPU."""
    config = kone.chunk_state_bmm_config(P, N, Q, nchunks)
    if config is None:
        fit = lambda n: max(16, min(64, triton.next_power_of_2(n)))  # noqa: E731
        config = {**kone.blocks(dict(BLOCK_SIZE_M=fit(P), BLOCK_SIZE_N=fit(N), BLOCK_SIZE_K=fit(Q)),
                                dict(BLOCK_SIZE_M=fit(Q), BLOCK_SIZE_N=fit(Q), BLOCK_SIZE_K=fit(N))),
                  "num_warps": 4, "num_stages": 3}

    def part(prefix: str) -> triton.Config:
        return triton.Config({b: config[prefix + b] for b in kone.BLOCKS}, num_warps=config["num_warps"],
                             num_stages=config["num_stages"])

    return config, part("STATE_"), part("BMM_")


def one_kernel_and_apart(inp):
    """(the one kernel's (states, CB), the two stage kernels' (states, CB)) on ``inp``'s cumsum."""
    dA, dt_out = ref_cumsum(inp)
    cu = inp.meta["cu_chunk_seqlens"]
    s = inp.shape
    config, state_config, bmm_config = one_kernel_configs(s.headdim, s.dstate, s.chunk_size, dt_out.shape[1])
    with forced_config(kstate.chunk_state_kernel, state_config), forced_config(kbmm.bmm_chunk_kernel, bmm_config):
        apart = (kstate.chunk_state(inp.B, inp.x, dt_out, dA, cu), kbmm.bmm_chunk(inp.C, inp.B, s.chunk_size, cu))
    return kone.chunk_state_bmm(inp.B, inp.x, inp.C, dt_out, dA, cu, config), apart


@pytest.mark.parametrize("io", IO_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,seqs", scenarios())
def test_one_kernel_writes_each_stage_s_bits(shape, seqs, io, device):
    (states, CB), (want_states, want_CB) = one_kernel_and_apart(make_inputs(shape, seqs, io, device))
    assert_bits_equal(states, want_states, what=f"chunk states, one kernel vs chunk_state ({io})")
    assert_bits_equal(CB, want_CB, what=f"CB, one kernel vs bmm_chunk ({io})")


@pytest.mark.parametrize("tokens", [30, 17 * 256 - 40], ids=["one-chunk", "seventeen-chunks"])
def test_the_serving_shape_runs_its_checked_in_blocks(tokens, device):
    """At the serving shape's class the GPU runs the checked-in blocks of both stages (a config per chunk count
    class), under the register cap, and each tensor keeps its stage's bits."""
    if device != "cuda":
        pytest.skip("the checked-in configs are the GPU's; the interpreter runs each stage's own blocks (above)")
    nchunks = build_varlen_metadata([0], [tokens], SERVING.chunk_size).nchunks
    config = kone.chunk_state_bmm_config(SERVING.headdim, SERVING.dstate, SERVING.chunk_size, nchunks)
    cls = tuned_configs.chunk_count_class(nchunks)
    state = tuned_configs.checked_in_config("chunk_state", "sm90", 64, 128, 256, cls)
    assert config == {**kone.blocks(state, tuned_configs.checked_in_config("bmm_chunk", "sm90", 256, 128)),
                      "num_warps": state["num_warps"], "num_stages": state["num_stages"], "maxnreg": kone.REGISTER_CAP}
    inp = make_inputs(SERVING, ([0], [tokens]), torch.bfloat16, device)
    (states, CB), (want_states, want_CB) = one_kernel_and_apart(inp)
    assert_bits_equal(states, want_states, what="chunk states at the serving shape")
    assert_bits_equal(CB, want_CB, what="CB at the serving shape")


def test_a_skipped_chunk_is_caught(device):
    """Negative control: the kernel launched without the last chunk's chunk state programs (a grid one chunk's
    worth of state tiles short) leaves that chunk's states as they were (NaN here); the comparison above names it,
    and the chunk's CB is still bmm's."""
    inp = make_inputs(SHAPES[1], "two-partial-first", torch.float32, device)
    dA, dt_out = ref_cumsum(inp)
    cu = inp.meta["cu_chunk_seqlens"]
    s, nchunks = inp.shape, dt_out.shape[1]
    want_states, want_CB = one_kernel_and_apart(inp)[1]
    config = one_kernel_configs(s.headdim, s.dstate, s.chunk_size, nchunks)[0]
    states = torch.full((nchunks, s.nheads, s.headdim, s.dstate), math.nan, device=device)
    CB = torch.full((nchunks, s.ngroups, s.chunk_size, s.chunk_size), math.nan, device=device)
    arguments = kone.launch_arguments(inp.B, inp.x, inp.C, dt_out, dA, cu, states, CB, config)
    tiles = triton.cdiv(s.headdim, config["STATE_BLOCK_SIZE_M"]) * triton.cdiv(s.dstate, config["STATE_BLOCK_SIZE_N"])
    kone._chunk_state_bmm_kernel[(kone.programs(arguments) - tiles * s.nheads,)](**arguments)
    assert_bits_equal(CB, want_CB, what="CB, one kernel vs bmm_chunk")
    assert_bits_equal(states[:-1], want_states[:-1], what="chunk states before the last chunk")
    with pytest.raises(Mismatch, match="chunk states, one kernel"):
        assert_bits_equal(states, want_states, what="chunk states, one kernel vs chunk_state")


def test_the_config_is_fixed_only_where_both_stages_configs_are(monkeypatch):
    """On the GPU: both stages' checked-in configs, chunk state's warps and stages, the register cap; None where
    either stage has no checked-in config for the shape class or the two disagree on the warps (the kernel has one
    warp count). Under the interpreter: each stage's interpreter blocks (there the dot's rounding depends on them)."""
    monkeypatch.setattr(kone, "INTERPRET", False)
    monkeypatch.setattr(kone, "device_arch", lambda: "sm90")
    few = kone.chunk_state_bmm_config(64, 128, 256, 1)
    assert few == dict(STATE_BLOCK_SIZE_M=64, STATE_BLOCK_SIZE_N=64, STATE_BLOCK_SIZE_K=64, BMM_BLOCK_SIZE_M=64,
                       BMM_BLOCK_SIZE_N=64, BMM_BLOCK_SIZE_K=32, num_warps=4, num_stages=3, maxnreg=128)
    many = kone.chunk_state_bmm_config(64, 128, 256, 17)
    assert (many["STATE_BLOCK_SIZE_N"], many["STATE_BLOCK_SIZE_K"]) == (128, 32)
    assert kone.chunk_state_bmm_config(64, 64, 256, 1) is None  # no checked-in config at dstate 64
    monkeypatch.setattr(kone, "device_arch", lambda: "sm100")
    assert kone.chunk_state_bmm_config(64, 128, 256, 1) is None  # none for another GPU
    monkeypatch.setattr(kone, "device_arch", lambda: "sm90")
    bmm = dict(tuned_configs.TUNED["bmm_chunk"])
    bmm[("sm90", 256, 128)] = dataclasses.replace(bmm[("sm90", 256, 128)],
                                                  config={**bmm[("sm90", 256, 128)].config, "num_warps": 8})
    monkeypatch.setitem(tuned_configs.TUNED, "bmm_chunk", bmm)
    assert kone.chunk_state_bmm_config(64, 128, 256, 1) is None


def test_the_interpreter_runs_each_stage_s_own_blocks():
    if not kone.INTERPRET:
        pytest.skip("the interpreter's blocks: this process compiles for the GPU")
    config = kone.chunk_state_bmm_config(5, 16, 64, 2)
    assert {b: config["STATE_" + b] for b in kone.BLOCKS} == kstate.interpreter_config(5, 16, 64)
    assert {b: config["BMM_" + b] for b in kone.BLOCKS} == kbmm.interpreter_config(64, 16)
    assert "maxnreg" not in config  # a GPU compile option


def test_the_warmup_holds_the_one_kernel_s_binaries(device):
    """Every key the one kernel launches at a shape where it runs (the serving shape's class on the GPU, a small one
    under the interpreter) is in the warmup of that shape: on the GPU a compile after it fails the guard; dropping
    its keys (negative control) fires."""
    from harness.guards.recompile import guard_no_recompile
    from harness.guards.specialization import MissingSpecialization, assert_keys_warmed, recording_launches
    from harness.warmup import warmup_all
    from kernels.warmup import ModelShape

    shape = SERVING if device == "cuda" else Shape(2, 5, 16, 1, 64)
    model = ModelShape(nheads=shape.nheads, headdim=shape.headdim, dstate=shape.dstate, ngroups=shape.ngroups,
                       chunk_size=shape.chunk_size)
    report = warmup_all(device, [(model, (torch.bfloat16,), (torch.bfloat16,))], kernels=["chunk_state_bmm"])
    kernel = kone._chunk_state_bmm_kernel
    launched = []
    for tokens in (30, 5 * shape.chunk_size + 3):  # each chunk count class
        inp = make_inputs(shape, ([0], [tokens]), torch.bfloat16, device)
        dA, dt_out = ref_cumsum(inp)
        config = kone.chunk_state_bmm_config(shape.headdim, shape.dstate, shape.chunk_size, dt_out.shape[1])
        assert config is not None
        with recording_launches([kernel]) as keys, guard_no_recompile([kernel], warmed=report.keys):
            kone.chunk_state_bmm(inp.B, inp.x, inp.C, dt_out, dA, inp.meta["cu_chunk_seqlens"], config)
        launched += list(keys)
    assert launched
    assert_keys_warmed(launched, report.keys)
    with pytest.raises(MissingSpecialization, match="specialization not warmed up"):
        assert_keys_warmed(launched, [k for k in report.keys if k.kernel != launched[0].kernel])


# ---------------------------------------------------------------------- the cumsum and the gather in one kernel
# ``kernels.chunk_cumsum_gather``: dA_cumsum and dt_out have the bits of the cumsum's own kernel (the indexed path
# runs that one), the copy the gather's; its cumsum config is the one the cumsum's autotuner keeps; the warmup holds
# its binaries; a grid short of the gather's last row is caught.

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Per cache dtype: the dt options and the index layout (each appears; the full product adds nothing the two kernels'
# own tests do not cover).
FUSED_CASES = {torch.float32: (dict(bias=True, softplus=True, limit=(0.0, math.inf)), "contiguous"),
               torch.float16: (dict(bias=False, softplus=False, limit=(0.05, 0.2)), "block_table"),
               torch.bfloat16: (dict(bias=True, softplus=True, limit=(0.1, 0.5)), "contiguous")}
# (slot, has an initial state) per sequence: a masked-off row points at a NaN slot, which must not be read.
ROWS = [(4, 1), (3, 0), (0, 1)]


def cumsum_gather_inputs(shape: Shape, seqs, state: torch.dtype, device: str):
    """(inputs, ``chunk_cumsum_gather``'s keyword arguments): a padded cache of five slots at ``shape``'s (H, P, N),
    slot 3 NaN; indices and mask as the cache dtype's case says (contiguous, or block-table columns)."""
    from support import index_view, paged_cache

    options, layout = FUSED_CASES[state]
    inp = make_inputs(shape, seqs, torch.float32, device)
    batch = len(SEQUENCES[seqs][0]) if isinstance(seqs, str) else len(seqs[0])
    _, cache = paged_cache(5, state, device, heads=shape.nheads, headdim=shape.headdim, dstate=shape.dstate,
                           blank_slots=(3,))
    rows = (ROWS * batch)[:batch]
    mask_dtype = torch.bool if layout == "contiguous" else torch.int32
    return inp, dict(state_cache=cache, initial_state_indices=index_view([s for s, _ in rows], torch.int32, layout,
                                                                         device),
                     has_initial_states=index_view([h for _, h in rows], mask_dtype, layout, device, column=3),
                     dt_bias=inp.dt_bias if options["bias"] else None, dt_softplus=options["softplus"],
                     dt_limit=options["limit"])


def cumsum_gather_apart(inp, kw) -> tuple:
    """What the two kernels write: (dA_cumsum, dt_out, initial states)."""
    from kernels.gather import gather_initial_states

    cu, Q = inp.meta["cu_chunk_seqlens"], inp.shape.chunk_size
    return (*kcumsum.chunk_cumsum(inp.dt, inp.A, Q, cu, dt_bias=kw["dt_bias"], dt_softplus=kw["dt_softplus"],
                                  dt_limit=kw["dt_limit"]),
            gather_initial_states(kw["state_cache"], kw["initial_state_indices"], kw["has_initial_states"]))


def assert_each_kernel_s_bits(got, want, what: str) -> None:
    for name, g, w in zip(("dA_cumsum", "dt_out", "initial states"), got, want, strict=True):
        assert_bits_equal(g, w, what=f"{name}, one kernel vs its own kernel ({what})")


@pytest.mark.parametrize("state", CACHE_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,seqs", scenarios())
def test_cumsum_gather_writes_each_kernel_s_bits(shape, seqs, state, device):
    from kernels.chunk_cumsum_gather import chunk_cumsum_gather

    inp, kw = cumsum_gather_inputs(shape, seqs, state, device)
    got = chunk_cumsum_gather(inp.dt, inp.A, shape.chunk_size, inp.meta["cu_chunk_seqlens"], **kw)
    assert_each_kernel_s_bits(got, cumsum_gather_apart(inp, kw), f"{dtype_id(state)} cache")


@pytest.mark.parametrize("tokens", [30, 17 * 256 - 40], ids=["one-chunk", "seventeen-chunks"])
def test_cumsum_gather_at_the_serving_shape(tokens, device):
    """At the serving shape's class (64 heads, chunk 256) the GPU runs the cumsum's checked-in config in both
    kernels, and each tensor keeps its own kernel's bits."""
    if device != "cuda":
        pytest.skip("the checked-in config is the GPU's; the interpreter runs the first config (tests above)")
    from kernels.chunk_cumsum_gather import chunk_cumsum_gather

    assert kcumsum.chunk_cumsum_config(256, 64) == tuned_configs.checked_in_config("chunk_cumsum", "sm90", 256, 64)
    shape = Shape(64, 64, 128, 1, 256)
    inp, kw = cumsum_gather_inputs(shape, ([0, 0, 0], [tokens, 40, 300]), torch.bfloat16, device)
    got = chunk_cumsum_gather(inp.dt, inp.A, 256, inp.meta["cu_chunk_seqlens"], **kw)
    assert_each_kernel_s_bits(got, cumsum_gather_apart(inp, kw), "serving shape")


def test_cumsum_gather_catches_a_missing_row(device):
    """Negative control: the kernel launched a row's worth of gather programs short leaves the last row's copy as
    it was (NaN here); the comparison names it, and the cumsum's outputs and the other rows are still right."""
    from kernels import chunk_cumsum_gather as kcg

    shape = SHAPES[0]
    inp, kw = cumsum_gather_inputs(shape, "three-mixed", torch.float32, device)
    want = cumsum_gather_apart(inp, kw)
    dA, dt_out = kcumsum.cumsum_outputs(inp.dt, inp.A, shape.chunk_size, inp.meta["cu_chunk_seqlens"], kw["dt_bias"])
    initial = torch.full_like(want[2], math.nan)
    arguments = kcg.launch_arguments(
        inp.dt, inp.A, inp.meta["cu_chunk_seqlens"], dt_out, dA, kw["state_cache"], kw["initial_state_indices"],
        kw["has_initial_states"], initial, dt_bias=kw["dt_bias"], dt_softplus=kw["dt_softplus"],
        dt_limit=kw["dt_limit"])
    row_blocks = triton.cdiv(arguments["row"], arguments["GATHER_BLOCK_SIZE"])
    kcg._chunk_cumsum_gather_kernel[(kcg.programs(arguments) - row_blocks,)](**arguments)
    assert_bits_equal(dA, want[0], what="dA_cumsum")
    assert_bits_equal(dt_out, want[1], what="dt_out")
    assert_bits_equal(initial[:-1], want[2][:-1], what="initial states before the last row")
    with pytest.raises(Mismatch, match="initial states, one kernel"):
        assert_each_kernel_s_bits((dA, dt_out, initial), want, "a row short")


def test_the_cumsum_config_is_the_one_its_autotuner_keeps(monkeypatch, device):
    """``chunk_cumsum_config`` is what the cumsum's kernel runs at a shape, here and on the H200's checked-in class,
    and the first config elsewhere (nothing times the cumsum)."""
    inp = make_inputs(SHAPES[0], "one-short", torch.float32, device)
    kcumsum.chunk_cumsum(inp.dt, inp.A, 64, inp.meta["cu_chunk_seqlens"])
    kept = kcumsum.chunk_cumsum_kernel.best_config
    assert tuned_configs.describe(kept) == kcumsum.chunk_cumsum_config(64, SHAPES[0].nheads)
    monkeypatch.setattr(kcumsum, "device_arch", lambda: "sm90")
    assert kcumsum.chunk_cumsum_config(256, 64) == dict(BLOCK_SIZE_H=2, num_warps=4, num_stages=3)
    assert kcumsum.chunk_cumsum_config(256, 48) == tuned_configs.describe(kcumsum.CONFIGS[0])


def test_the_stage_shapes_are_case_file_shapes():
    """The shapes this file launches the stages on are the case files' (``SHAPES`` above): a case file edited away
    from one shows here, not as a slower cold GPU run."""
    shapes = case_file_shapes()
    missing = [s for s in (*SHAPES, SERVING) if s not in shapes]
    assert not missing, (missing, sorted(map(str, shapes)))
