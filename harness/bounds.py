"""Derived error bounds for the SSD prefill path: first-order rounding analysis, never a tuned constant.

Model. Every rounding to a format with unit roundoff u (2^-24 fp32, 2^-8 bf16, 2^-11 fp16; twice that for a truncating
rounding: the interpreter's fp32 -> bf16 cast, CUDA's tf32 dot operands and MMA accumulation) perturbs the rounded value
v by at most u |v| (plus, below the format's normal range, half its smallest subnormal eta). A sum of K terms in fp32,
in any order, is off by at most gamma_K(u) = K u / (1 - K u) times the sum of |terms|. Unrolled, the SSD output is a sum
of products (one per input token s and output token t), each product a chain of factors that were each computed with a
small relative error. To first order a product's relative error is the sum of its factors' relative errors, so with r =
the largest such sum over all product chains ("paths"),

    |out - out_exact| <= r * shadow + u_io * (|ref| + r * shadow) + floor,

where ``shadow`` is the same recurrence run in fp64 on absolute values (reference.sequential.magnitude_shadows):
it equals the sum of |products|, and bounds every intermediate's magnitude. ``u_io |ref|`` is the final rounding of
the output to the io dtype; ``floor`` collects the absolute subnormal terms.

Relative errors of the factors (u = 2^-24, fp32 work precision; S = the largest |dA_cumsum| at a chunk end for the
head, i.e. the sum of |dt A| over a chunk; Q = chunk_size, N = dstate, K = most chunks in one sequence):
  dt      e_dt: fp32 ``dt + dt_bias`` (u, times softplus' condition number |a| sigmoid(a) / softplus(a)), softplus'
          exp (``EXP_ULPS`` plus 2u|a| for the exp2(LOG2E a) argument) and log (``LOG_ULPS``); under the interpreter
          the kernel has no log1p and computes log(fl(1 + e)): the add's rounding (1 + e)(1 + d) moves the log by
          d, an absolute u, i.e. a relative u / softplus(a) (large for very negative a, where fl(1 + e) loses e's
          low bits) - from inputs.
  cumsum  each dA_cumsum value is off by (gamma_Q + e_dt + u) S  (dA = dt A rounding, any summation order).
  exp     exp(cs_t - cs_s): 2 (gamma_Q + e_dt + u) S (two cumsum values) + u S (subtraction) + 2u S (LOG2E in fp32
          and the LOG2E * arg product) + EXP_ULPS u  =: e_exp.
  dots    ``dot_rel_err``. Interpreter: numpy's fp32 matmul, gamma_K(u) for K products in any order. CUDA (tensor
          cores, Triton's ``tl.dot``): fp32 operands enter the MMA as tf32 by *truncation* (the tensor core ignores
          the low 13 of the 23 fraction bits; measured: docs/exactness.md#arithmetic-facts), so each operand is off
          by less than one tf32 ulp: u_tf32 = 2^-10 (not 2^-11 as for round to nearest), (1+u_tf32)^2 - 1 per
          product; io-dtype (bf16/fp16) operands are exact. The MMA adds blocks of at least 4 exact products to the
          accumulator, aligning them to the largest exponent and truncating (Fasi, Higham, Mikaitis, Pranesh,
          "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021): a block of b products loses < 2u of the
          largest operand per addend plus 2u of the result, so a K-product dot is within gamma_R(2u),
          R = ceil(K/4) * 5 roundings, of the sum of |products|.
  gate    z sigmoid(z) = z div_rn(1, 1 + exp(-z)) (IEEE division on both backends): e_gate from inputs, plus u for
          ``acc *= gate``.
Paths (each a sum of the above):
  intra-chunk  CB dot over N, * exp (e_exp + u), * dt (e_dt + u), round to io (u_io), dot over Q, 2 adds, gate.
  carried      b_scaled: exp (e_exp + u), dt (e_dt + u), round to io (u_io); dot over Q; K state-passing steps
               (e_exp + 2u each); store in state dtype (u_state); cast to io dtype (u_io unless io == state);
               C dot over N; * exp(cs_t) (e_exp + u); 2 adds; gate. (The initial-state path is a sub-chain.)
  residual     x D (u), 2 adds, gate.
Floor (fp16 only matters; eta_bf16 = 2^-133, eta_fp32 = 2^-149): eta_io / 2 times (the shadow with each b_scaled
replaced by one unit: ``unit_out``; the window sum of |x| over a chunk for cb_scaled; sum_n |C| for the state cast;
1 for the output) plus eta_state / 2 times sum_n |C| for the state store.
The bound is rigorous to first order; the second-order terms (products of two u's) are below u_io^2 * shadow and are
covered by using gamma_n instead of n u.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

F64 = torch.float64
U32 = 2.0**-24
# tf32 has 10 fraction bits. The tensor core reads an fp32 register as tf32 by dropping the low 13 fraction bits
# (truncation toward zero): the relative error is below one tf32 ulp, 2^-10 (round to nearest would be 2^-11).
U_TF32_TRUNCATED = 2.0**-10
# Tensor-core accumulation truncates too: each rounding loses less than one fp32 ulp, a relative 2u.
U_MMA_ACCUMULATE = 2 * U32
# Fewest products the MMA adds to the accumulator in one aligned step (4 on every generation Fasi et al. measured;
# more per step means fewer roundings, so the smallest is the conservative choice).
MMA_MIN_BLOCK = 4
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
SMALLEST_SUBNORMAL = {torch.float32: 2.0**-149, torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24}
BACKENDS = ("cuda", "interpreter")
# Implementation errors of the fp32 transcendental functions, in units of u. CUDA (documented maxima): PTX
# ex2.approx.f32 2 ulp, log1pf 2 ulp (CUDA math library). Interpreter: numpy's fp32 loops are SIMD approximations
# (AVX512F exp 2.52 ulp and log 3.83 ulp, NumPy 1.20 release notes; SVML loops within 4 ulp): 4. Division is IEEE on
# both (the kernels use div_rn): half an ulp.
EXP_ULPS = {"cuda": 2.0, "interpreter": 4.0}
LOG_ULPS = {"cuda": 2.0, "interpreter": 4.0}
DIV_ULPS = {"cuda": 0.5, "interpreter": 0.5}


def unit_roundoff(dtype: torch.dtype, backend: str = "cuda") -> float:
    """Largest relative error of one rounding to ``dtype``: u for round-to-nearest; under the interpreter fp32 ->
    bf16 truncates (docs/exactness.md), which can lose a whole ulp: 2u."""
    _check_backend(backend)
    try:
        u = UNIT_ROUNDOFF[dtype]
    except KeyError:
        raise ValueError(f"unit_roundoff: no rounding model for {dtype}") from None
    return 2 * u if dtype == torch.bfloat16 and backend == "interpreter" else u


def gamma(n: int, u: float) -> float:
    """gamma_n(u) = n u / (1 - n u): the relative error bound of n successive roundings (Higham, eq. 3.8)."""
    if n * u >= 1:
        raise ValueError(f"gamma: n u = {n * u} >= 1, first-order analysis does not apply")
    return n * u / (1 - n * u)


def _check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, found {backend!r}")
    return backend


def _exp_arg_error(arg_abs: torch.Tensor | float) -> torch.Tensor | float:
    """Relative error of exp(a) from rounding LOG2E to fp32 and the product LOG2E * a: 2 u |a|."""
    return 2 * U32 * arg_abs


def dot_operand_unit(operand_dtype: torch.dtype, backend: str) -> float:
    """Relative error of one ``tl.dot`` operand as the multiplier sees it: tf32 truncation for fp32 operands on
    CUDA; 0 for io-dtype operands (exact) and under the interpreter (numpy multiplies in fp32)."""
    if _check_backend(backend) == "cuda" and operand_dtype == torch.float32:
        return U_TF32_TRUNCATED
    return 0.0


def mma_roundings(k: int) -> int:
    """Roundings a tensor-core dot of k products can apply to one product: ceil(k / block) aligned steps of at most
    ``MMA_MIN_BLOCK`` + 1 truncations each (the block's addends and the result)."""
    return -(-k // MMA_MIN_BLOCK) * (MMA_MIN_BLOCK + 1)


def dot_rel_err(k: int, operand_dtype: torch.dtype, backend: str) -> float:
    """Relative error (vs the exact sum of |products| of the unrounded operands) of an fp32-accumulated dot of k
    products computed by ``tl.dot`` on ``backend``. CUDA: operand truncation v per operand, (1+v)^2 - 1 per product,
    then the MMA's truncating accumulation gamma_R(2u) on the (1+v)^2-larger products. Interpreter: gamma_k(u)."""
    if _check_backend(backend) == "interpreter":
        return gamma(k, U32)
    v = dot_operand_unit(operand_dtype, backend)
    products = (1 + v) ** 2 - 1
    return products + gamma(mma_roundings(k), U_MMA_ACCUMULATE) * (1 + v) ** 2


def reference_dot_rel_err(k: int) -> float:
    """The PyTorch twin's dot (``torch.bmm`` in fp32, IEEE round to nearest on CPU and on CUDA with TF32 off, the
    PyTorch default): gamma_k(u) in any summation order."""
    return gamma(k, U32)


@dataclass(frozen=True)
class InputTerms:
    """Error terms that depend on the actual inputs (``input_error_terms``)."""

    dA_magnitude: torch.Tensor  # (H,) fp64: max over chunks of sum |dt A| within the chunk (S in the derivation)
    dt_rel_err: float
    gate_rel_err: float  # 0 when there is no z
    carried_chunks: int  # most chunks of any one sequence (K)

    def as_kwargs(self) -> dict:
        return {"dA_magnitude": self.dA_magnitude, "dt_rel_err": self.dt_rel_err,
                "gate_rel_err": self.gate_rel_err, "carried_chunks": self.carried_chunks}


def input_error_terms(dt, A, *, cu_chunk_seqlens, seq_idx, dt_bias=None, dt_softplus=False,
                      dt_limit=(0.0, math.inf), z=None, backend: str) -> InputTerms:
    """dt (T,H), A (H,), z (T,H,P) or None, metadata -> the input-dependent terms of the derivation."""
    from reference.sequential import process_dt

    _check_backend(backend)
    a = dt.detach().cpu().to(F64)
    if dt_bias is not None:
        a = a + dt_bias.detach().cpu().to(F64)
    if dt_softplus:
        soft = a <= 20.0
        sp = torch.log1p(torch.exp(a))
        cond = (a.abs() * torch.sigmoid(a) / sp).where(soft, torch.ones_like(a))
        evaluation = EXP_ULPS[backend] * U32 + _exp_arg_error(a.abs()) + LOG_ULPS[backend] * U32
        if backend == "interpreter":  # log(fl(1 + e)): the add's absolute u after the log, relative to softplus
            evaluation = evaluation + U32 * (1 + U32) / sp
        else:  # log1p(e) sees e's relative error damped by e / ((1 + e) softplus) <= 1: one more u covers rounding
            evaluation = evaluation + U32
        evaluation = torch.where(soft, evaluation, torch.zeros_like(a))
        rel = (U32 if dt_bias is not None else 0.0) * cond + evaluation
        dt_rel = float(rel.max()) if rel.numel() else 0.0
    else:
        dt_rel = U32 if dt_bias is not None else 0.0
    d = process_dt(dt.detach().cpu(), None if dt_bias is None else dt_bias.detach().cpu(), dt_softplus, dt_limit)
    dA = (d * A.detach().cpu().to(F64)[None, :]).abs()
    cu = [int(v) for v in cu_chunk_seqlens.tolist()]
    S = torch.zeros(dt.shape[1], dtype=F64)
    for c in range(len(cu) - 1):
        S = torch.maximum(S, dA[cu[c]:cu[c + 1]].sum(0))
    gate_rel = 0.0
    if z is not None:
        zmax = float(z.detach().cpu().to(F64).abs().max()) if z.numel() else 0.0
        # exp(-z) (EXP_ULPS + 2u|z|), 1 + e (u), division (DIV_ULPS), z * sigmoid (u), acc *= gate (u)
        gate_rel = (EXP_ULPS[backend] + DIV_ULPS[backend] + 3) * U32 + _exp_arg_error(zmax)
    seqs = [int(v) for v in seq_idx.tolist()]
    K = max((seqs.count(b) for b in set(seqs)), default=1)
    return InputTerms(dA_magnitude=S, dt_rel_err=dt_rel, gate_rel_err=gate_rel, carried_chunks=K)


def _as_head_tensor(v, ndim: int) -> torch.Tensor:
    """dA_magnitude scalar or (H,) -> broadcastable against (X, H, ...) with ``ndim`` dims (head axis 1)."""
    t = torch.as_tensor(v, dtype=F64)
    if t.dim() == 0:
        return t
    return t.reshape((1, -1) + (1,) * (ndim - 2))


def exp_rel_err(dA_magnitude, *, chunk_size: int, dt_rel_err: float, backend: str):
    """e_exp: relative error of exp(dA_cumsum[t] - dA_cumsum[s]) (or of a chunk-end decay) vs exact."""
    S = torch.as_tensor(dA_magnitude, dtype=F64)
    return (2 * (gamma(chunk_size, U32) + dt_rel_err + U32) + 3 * U32) * S + EXP_ULPS[_check_backend(backend)] * U32


@dataclass(frozen=True)
class PathErrors:
    intra: torch.Tensor
    carried: torch.Tensor
    final: torch.Tensor
    residual: float


def path_errors(*, io_dtype, state_dtype, chunk_size, dstate, backend, dA_magnitude, dt_rel_err=0.0,
                gate_rel_err=0.0, carried_chunks=1) -> PathErrors:
    """The relative error r of each product chain (see the module docstring), per head where S is per head."""
    u_io, u_st = unit_roundoff(io_dtype, backend), unit_roundoff(state_dtype, backend)
    e_exp = exp_rel_err(dA_magnitude, chunk_size=chunk_size, dt_rel_err=dt_rel_err, backend=backend)
    dot_q = dot_rel_err(chunk_size, io_dtype, backend)
    dot_n = dot_rel_err(dstate, io_dtype, backend)
    adds = gamma(2, U32)
    u_cast = 0.0 if io_dtype == state_dtype else u_io
    b_scaled = (e_exp + U32) + (dt_rel_err + U32) + u_io + dot_q
    passing = carried_chunks * (e_exp + 2 * U32)
    intra = dot_n + (e_exp + U32) + (dt_rel_err + U32) + u_io + dot_q + adds + gate_rel_err
    carried = b_scaled + passing + u_st + u_cast + dot_n + (e_exp + U32) + adds + gate_rel_err
    return PathErrors(intra=intra, carried=carried, final=b_scaled + passing, residual=U32 + adds + gate_rel_err)


def ssd_output_bound(shadow_out, ref_out, *, io_dtype, state_dtype, chunk_size, dstate, backend, dA_magnitude,
                     dt_rel_err=0.0, gate_rel_err=0.0, carried_chunks=1, shadows=None) -> torch.Tensor:
    """Elementwise bound (T,H,P) fp64 on |out - ref_out| for a chunked SSD output in ``io_dtype`` vs the fp64
    sequential reference. shadow_out (T,H,P): magnitude shadow; ref_out (T,H,P): fp64 reference; dA_magnitude
    scalar or (H,); ``shadows`` (reference.sequential.Shadows) adds the fp16 underflow floor (without it, only the
    output's own subnormal rounding is counted, which suffices for fp32/bf16)."""
    p = path_errors(io_dtype=io_dtype, state_dtype=state_dtype, chunk_size=chunk_size, dstate=dstate,
                    backend=backend, dA_magnitude=dA_magnitude, dt_rel_err=dt_rel_err, gate_rel_err=gate_rel_err,
                    carried_chunks=carried_chunks)
    r = torch.maximum(torch.maximum(p.intra, p.carried), torch.as_tensor(p.residual, dtype=F64))
    shadow = shadow_out.detach().to(F64)  # on the ground truth's device (the inputs'), like the comparison
    r = _as_head_tensor(r, 3).to(shadow.device)
    ref = ref_out.detach().to(shadow.device, F64).abs()
    u_io = unit_roundoff(io_dtype, backend)
    eta_io, eta_st = SMALLEST_SUBNORMAL[io_dtype], SMALLEST_SUBNORMAL[state_dtype]
    floor = torch.full_like(shadow, eta_io / 2)
    if shadows is not None:
        floor = floor + eta_io / 2 * (shadows.unit_out + shadows.window_x + shadows.c_abs_sum)
        floor = floor + eta_st / 2 * shadows.c_abs_sum
    return r * shadow + u_io * (ref + r * shadow) + floor


def final_state_bound(shadow_final, ref_final, *, io_dtype, state_dtype, chunk_size, dstate, backend, dA_magnitude,
                      dt_rel_err=0.0, gate_rel_err=0.0, carried_chunks=1, shadows=None) -> torch.Tensor:
    """Elementwise bound (Bt,H,P,N) fp64 on a final state stored in ``state_dtype`` vs the fp64 reference.
    Path: b_scaled, dot over Q, K state-passing steps, one rounding to the state dtype (relative to |ref|)."""
    p = path_errors(io_dtype=io_dtype, state_dtype=state_dtype, chunk_size=chunk_size, dstate=dstate,
                    backend=backend, dA_magnitude=dA_magnitude, dt_rel_err=dt_rel_err, gate_rel_err=gate_rel_err,
                    carried_chunks=carried_chunks)
    shadow = shadow_final.detach().to(F64)
    r = _as_head_tensor(p.final, 4).to(shadow.device)
    ref = ref_final.detach().to(shadow.device, F64).abs()
    u_st = unit_roundoff(state_dtype, backend)
    floor = torch.full_like(shadow, SMALLEST_SUBNORMAL[state_dtype] / 2)
    if shadows is not None:
        floor = floor + SMALLEST_SUBNORMAL[io_dtype] / 2 * shadows.unit_final
    return r * shadow + u_st * (ref + r * shadow) + floor


# Per-stage bounds: a kernel stage vs its reference twin fed identical inputs. Both sides make the same roundings
# except (a) the dots: the kernel's ``tl.dot`` (dot_rel_err: tf32 truncation and MMA accumulation on CUDA) against
# the twin's fp32 ``torch.bmm`` (reference_dot_rel_err), each measured from the exact sum of |products|, (b)
# exp/softplus implementations where the profile is not bit-exact, and (c) a tiny pre-rounding difference that flips
# an io-dtype rounding by one ulp (2 u_io of the rounded value). ``backend`` is where the kernel ran.


def _require_fp64(fn: str, name: str, t: torch.Tensor) -> None:
    """A magnitude summed in fp32 is itself rounded (down, possibly): bounds scale only fp64 magnitudes."""
    if t.dtype != F64:
        raise ValueError(f"{fn}: {name} must be the fp64 magnitude sum, found {t.dtype}")


def _stage_dot_err(k: int, io_dtype, backend: str) -> float:
    """Kernel dot vs twin dot of the same k products: both errors, each against the exact sum."""
    return dot_rel_err(k, io_dtype, backend) + reference_dot_rel_err(k)


def chunk_cumsum_bound(dA_abs_cumsum, *, chunk_size, backend, dt_rel_err=0.0) -> torch.Tensor:
    """(H,C,Q) bound on |dA_cumsum - twin|: dA_abs_cumsum = cumsum of |dt_out A| along Q (fp64 or fp32);
    dt_rel_err: the relative difference of the two dt_out (0 without softplus, where dt_out is exact)."""
    _check_backend(backend)
    return (2 * gamma(chunk_size, U32) + 2 * dt_rel_err + 2 * U32) * dA_abs_cumsum.detach().cpu().to(F64)


def chunk_state_bound(abs_states, *, io_dtype, chunk_size, backend) -> torch.Tensor:
    """(C,H,P,N) bound on |states - twin|: abs_states = sum_l |x| |b_scaled| in fp64
    (``reference.chunked.chunk_state_magnitude``)."""
    _require_fp64("chunk_state_bound", "abs_states", abs_states)
    r = _stage_dot_err(chunk_size, io_dtype, backend) + 2 * unit_roundoff(io_dtype, backend) + 2 * 2 * U32
    return r * abs_states.detach().cpu()


def bmm_chunk_bound(abs_cb, *, io_dtype, dstate, backend) -> torch.Tensor:
    """(C,G,Q,Q) bound on |CB - twin|: abs_cb = sum_n |C[l,n]| |B[s,n]| in fp64
    (``reference.chunked.bmm_chunk_magnitude``; 0 outside each chunk, so padding must match exactly)."""
    _require_fp64("bmm_chunk_bound", "abs_cb", abs_cb)
    return _stage_dot_err(dstate, io_dtype, backend) * abs_cb.detach().cpu()


def chunk_scan_bound(abs_acc, ref_out, *, io_dtype, chunk_size, dstate, backend, gate_rel_err=0.0) -> torch.Tensor:
    """(T,H,P) bound on |out - twin|: abs_acc = reference.chunked.chunk_scan_magnitude on the same inputs,
    ref_out the twin's output. Differences: dot orders and operands, cb_scaled and state-cast rounding flips, the
    fp32 steps after the dots done on different values (per side: the exp(cs) product, the D multiply-add, the
    ``acc *= gate`` product: gamma_4), the gates themselves when they differ (``gate_rel_err`` per side: 0 for a
    kernel against its twin under the kernel's profile, which computes the same gate bits), and a one-ulp flip of the
    final rounding."""
    u_io = unit_roundoff(io_dtype, backend)
    pre = (_stage_dot_err(chunk_size, io_dtype, backend) + _stage_dot_err(dstate, io_dtype, backend)
           + 2 * 2 * u_io + 2 * gamma(4, U32) + 2 * gate_rel_err)
    ref = ref_out.detach().cpu().to(F64).abs()
    eta = SMALLEST_SUBNORMAL[io_dtype]
    return pre * abs_acc.detach().cpu().to(F64) + 2 * u_io * ref + u_io * pre * abs_acc.detach().cpu().to(F64) + eta


def decisive_margin(truth, bound, bug_truth, bug_bound, *, compared_err=0.0) -> float:
    """How decisively a deliberate bug leaves ``bound``: the largest (|bug_truth - truth| - bug_bound - compared_err)
    / bound, over all elements.

    ``truth``/``bug_truth``: exact results of the correct and of the bugged problem; the bugged computation is within
    ``bug_bound`` of ``bug_truth``; the value the check compares it with is within ``compared_err`` of ``truth`` (0
    when it compares with the truth itself; a twin's own error, at most ``bound``, when it compares with a twin).
    Where the margin exceeds 1, |bugged - compared| >= |bug_truth - truth| - bug_bound - compared_err > bound, so the
    check must report the bug. Tensors of one broadcastable shape, any float dtype."""
    def f64(t):
        return torch.as_tensor(t).detach().cpu().to(F64)

    effect = (f64(bug_truth) - f64(truth)).abs()
    excess = effect - f64(bug_bound) - f64(compared_err)
    b = f64(bound)
    # A zero bound (an exact position, e.g. CB padding) is decisive wherever the excess is positive, nowhere else.
    inf = torch.tensor(math.inf, dtype=F64)
    ratio = torch.where(b > 0, excess / b.clamp_min(torch.finfo(F64).tiny), torch.where(excess > 0, inf, -inf))
    return float(ratio.max())
