"""fp64 token-by-token SSD scan: the ground truth, and the magnitude shadow the error bounds multiply.

For each sequence b and token t (vectorised over heads H, headdim P, dstate N; g(h) = h // (H // G)):
    dt_t = clamp(softplus(dt[t] + dt_bias))            (softplus only where the argument <= 20, like the kernels)
    h    = exp(dt_t * A) h + dt_t * x[t] B[t, g(h)]^T  (h: (H, P, N), starting from initial_states[b] or 0)
    y[t] = (h C[t, g(h)] + D x[t]) * silu(z[t])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

F64 = torch.float64


def _ints(t) -> list[int]:
    return [int(v) for v in (t.tolist() if isinstance(t, torch.Tensor) else t)]


def process_dt(dt: torch.Tensor, dt_bias=None, dt_softplus: bool = False, dt_limit=(0.0, math.inf)) -> torch.Tensor:
    """dt (T, H) any float dtype -> processed dt (T, H) fp64 (bias, softplus below 20, clamp when not (0, inf))."""
    d = dt.to(F64)
    if dt_bias is not None:
        d = d + dt_bias.to(F64)
    if dt_softplus:
        d = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    if (lo, hi) != (0.0, math.inf):
        d = d.clamp(lo, hi)
    return d


def _per_head(groups: torch.Tensor, nheads: int) -> torch.Tensor:
    """(T, G, N) -> (T, H, N) by repeating each group H // G times (head h reads group h // (H // G))."""
    ngroups = groups.shape[1]
    if nheads % ngroups:
        raise ValueError(f"ngroups: nheads ({nheads}) must be a multiple of ngroups ({ngroups})")
    return groups.repeat_interleave(nheads // ngroups, dim=1)


@dataclass
class Shadows:
    """Magnitude shadows (all fp64, >= 0): what every rounding-error term of the SSD is bounded by.

    out (T,H,P), final_states (Bt,H,P,N): the scan run on |x|, |B|, |C|, |D|, |z sigmoid(z)|, |initial state|.
    unit_out (T,H,P), unit_final (Bt,H,P,N): the same scan with the input term dt |x| |B| replaced by |x| (each
        rounded b_scaled element off by one absolute unit: the fp16 underflow floor).
    window_x (T,H,P): |gate| * sum of |x| over the last chunk_size tokens of the sequence (cb_scaled underflow).
    c_abs_sum (T,H,1): |gate| * sum_n |C| (state-cast underflow), gate_abs (T,H,P).
    """

    out: torch.Tensor
    final_states: torch.Tensor
    unit_out: torch.Tensor
    unit_final: torch.Tensor
    window_x: torch.Tensor
    c_abs_sum: torch.Tensor
    gate_abs: torch.Tensor


@dataclass
class _Variant:
    """One recurrence the scan runs: ``h = decay h + (coef x) B^T``, ``y = (h C + D x) * gate``. The value scan,
    its magnitude shadow and the unit shadow differ only in these tensors (fp64, on the scan's device)."""

    x: torch.Tensor  # (T, H, P)
    coef: torch.Tensor  # (T, H): dt, or ones for the unit scan (1 * x is exact)
    B: torch.Tensor  # (T, H, N)
    C: torch.Tensor  # (T, H, N)
    D: torch.Tensor | None  # (H, P)
    gate: torch.Tensor | None  # (T, H, P)
    h0: torch.Tensor | None  # (Bt, H, P, N)


# Tokens whose inputs and states are formed per block: the token loop itself is one fused multiply-add per token,
# a few vectorised ops per block do the rest: a token-by-token loop launches about ten small ops per token, and on
# the serving shape their launch overhead, not the arithmetic, sets the reference's time.
SCAN_BLOCK = 16


def _scan(variants: list[_Variant], decay: torch.Tensor, cu: list[int], exit_offsets) -> list[tuple]:
    """The recurrence, token by token in order, for every variant at once (stacked on a leading axis).
    decay (T, H) = exp(dt A). Returns per variant (out (T,H,P), final (Bt,H,P,N), exits {offset: (H,P,N)}), on the
    inputs' device."""
    V = len(variants)
    T, H, P = variants[0].x.shape
    N = variants[0].B.shape[-1]
    dev = variants[0].x.device
    stack = lambda get: torch.stack([get(v) for v in variants])  # noqa: E731
    x, coef, B, C = stack(lambda v: v.x), stack(lambda v: v.coef), stack(lambda v: v.B), stack(lambda v: v.C)
    zeros_hp = torch.zeros(H, P, dtype=F64, device=dev)
    D = stack(lambda v: v.D if v.D is not None else zeros_hp)  # y + 0 * x == y: x is finite
    ones = torch.ones(T, H, P, dtype=F64, device=dev)
    gate = stack(lambda v: v.gate if v.gate is not None else ones)  # y * 1 == y
    out = torch.empty(V, T, H, P, dtype=F64, device=dev)
    final = torch.empty(V, len(cu) - 1, H, P, N, dtype=F64, device=dev)
    exits = {}
    wanted = set(exit_offsets or ())
    hs = torch.empty(SCAN_BLOCK, V, H, P, N, dtype=F64, device=dev)
    for b in range(len(cu) - 1):
        h = torch.stack([v.h0[b] if v.h0 is not None else torch.zeros(H, P, N, dtype=F64, device=dev)
                         for v in variants])
        for s in range(cu[b], cu[b + 1], SCAN_BLOCK):
            e = min(s + SCAN_BLOCK, cu[b + 1])
            L = e - s
            # (L, V, H, P, N): the input term of each token, then the sequential recurrence over the block.
            inject = ((coef[:, s:e, :, None] * x[:, s:e])[..., None] * B[:, s:e, :, None, :]).transpose(0, 1)
            step_decay = decay[s:e, None, :, None, None]
            for i in range(L):
                h = torch.addcmul(inject[i], step_decay[i], h, out=hs[i])
                if s + i + 1 in wanted:
                    exits[s + i + 1] = h.clone()
            h = h.clone()  # hs is reused by the next block
            y = torch.einsum("lvhpn,lvhn->lvhp", hs[:L], C[:, s:e].transpose(0, 1)).transpose(0, 1)
            out[:, s:e] = (y + D[:, None] * x[:, s:e]) * gate[:, s:e]
        final[:, b] = h
    return [(out[k], final[k], {o: e[k] for o, e in exits.items()}) for k in range(V)]


def _inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states):
    """The value, magnitude-shadow and unit-shadow variants of the inputs (fp64, on ``x``'s device) and decay (T, H)."""
    T, H, P = x.shape
    dev = x.device
    to = lambda t: t.detach().to(dev, F64)  # noqa: E731
    dtp = process_dt(dt.detach().to(dev), None if dt_bias is None else dt_bias.detach().to(dev), dt_softplus, dt_limit)
    decay = torch.exp(dtp * to(A)[None, :])
    Bh, Ch = _per_head(to(B), H), _per_head(to(C), H)
    Dv = None
    if D is not None:
        Dv = to(D)
        Dv = Dv[:, None].expand(H, P) if Dv.dim() == 1 else Dv
    gate = None
    if z is not None:
        zz = to(z)
        gate = zz * torch.sigmoid(zz)
    h0 = None if initial_states is None else to(initial_states)
    value = _Variant(to(x), dtp, Bh, Ch, Dv, gate, h0)
    absolute = lambda t: None if t is None else t.abs()  # noqa: E731
    magnitude = _Variant(value.x.abs(), dtp, Bh.abs(), Ch.abs(), absolute(Dv), absolute(gate), absolute(h0))
    # The unit shadow: input term |x| (coef 1, B = 1), read out through |C| and |gate| (ones without z).
    unit = _Variant(magnitude.x, torch.ones_like(dtp), torch.ones_like(Ch), magnitude.C, None,
                    magnitude.gate if z is not None else None, None)
    return value, magnitude, unit, decay


def sequential_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    cu_seqlens,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit=(0.0, math.inf),
    initial_states: torch.Tensor | None = None,
    magnitude: bool = False,
    exit_offsets: Sequence[int] | None = None,
):
    """fp64 sequential SSD, on the device ``x`` lives on, and so are the results.

    On a GPU an fp64 step runs over the serving shape's heads in parallel instead of on a shared CPU thread, and the
    bounds and comparisons that read the results run there too (``harness.compare.assert_within_bound``); fp64 rounding
    (1e-16) is far below every bound either way.

    x (T,H,P), dt (T,H), A (H,), B/C (T,G,N), D (H,) or (H,P), z (T,H,P), initial_states (Bt,H,P,N), any dtypes.
    Returns ``(out (T,H,P) fp64, final_states (Bt,H,P,N) fp64)``; with ``exit_offsets`` (token offsets, e.g.
    ``cu_chunk_seqlens[1:]``) a third item, the state after token ``offset - 1`` for each, stacked (len, H, P, N).
    ``magnitude=True`` runs the same recurrence on absolute values (|x|, |B|, |C|, |D|, |z sigmoid(z)|, |h0|) and
    returns its shadow of out and final states in the same tuple form.
    """
    value, shadow, _, decay = _inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states)
    offsets = _ints(exit_offsets) if exit_offsets is not None else None
    [(out, final, exits)] = _scan([shadow if magnitude else value], decay, _ints(cu_seqlens), offsets)
    return _with_exits(out, final, exits, offsets)


def _with_exits(out, final, exits, offsets):
    if offsets is None:
        return out, final
    H, P, N = final.shape[1:]
    chunk_end = (torch.stack([exits[o] for o in offsets]) if offsets
                 else torch.empty(0, H, P, N, dtype=F64, device=final.device))
    return out, final, chunk_end


@dataclass
class GroundTruth:
    """fp64 value scan and its shadows from one pass (``ground_truth``). ``chunk_end`` and ``chunk_end_shadow``
    (len(exit_offsets), H, P, N) are None without exit offsets."""

    out: torch.Tensor
    final_states: torch.Tensor
    shadows: Shadows
    chunk_end: torch.Tensor | None = None
    chunk_end_shadow: torch.Tensor | None = None


def ground_truth(
    x, dt, A, B, C, *, cu_seqlens, chunk_size: int, D=None, z=None, dt_bias=None, dt_softplus=False,
    dt_limit=(0.0, math.inf), initial_states=None, exit_offsets=None,
) -> GroundTruth:
    """``sequential_ssd`` and ``magnitude_shadows`` (and the magnitude scan's chunk-end states) in one scan of
    the three recurrences stacked: what a bound check needs, for a third of the token loop."""
    value, shadow, unit, decay = _inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states)
    offsets = _ints(exit_offsets) if exit_offsets is not None else None
    cu = _ints(cu_seqlens)
    (out, final, exits), (s_out, s_final, s_exits), (u_out, u_final, _) = _scan(
        [value, shadow, unit], decay, cu, offsets)
    shadows = _shadows(shadow, s_out, s_final, u_out, u_final, cu, chunk_size)
    truth = GroundTruth(out, final, shadows)
    if offsets is not None:
        truth.chunk_end = _with_exits(out, final, exits, offsets)[2]
        truth.chunk_end_shadow = _with_exits(s_out, s_final, s_exits, offsets)[2]
    return truth


def magnitude_shadows(
    x, dt, A, B, C, *, cu_seqlens, chunk_size: int, D=None, z=None, dt_bias=None, dt_softplus=False,
    dt_limit=(0.0, math.inf), initial_states=None,
) -> Shadows:
    """All the magnitude shadows ``harness.bounds`` needs (see ``Shadows``), same inputs as ``sequential_ssd``."""
    _, shadow, unit, decay = _inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states)
    cu = _ints(cu_seqlens)
    (s_out, s_final, _), (u_out, u_final, _) = _scan([shadow, unit], decay, cu, None)
    return _shadows(shadow, s_out, s_final, u_out, u_final, cu, chunk_size)


def _shadows(shadow: _Variant, out, final, unit_out, unit_final, cu: list[int], chunk_size: int) -> Shadows:
    xa, Ca = shadow.x, shadow.C
    T, H, P = xa.shape
    dev = xa.device
    gate = shadow.gate if shadow.gate is not None else torch.ones(T, H, P, dtype=F64, device=dev)
    window = torch.empty(T, H, P, dtype=F64, device=dev)
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        run = torch.cat([torch.zeros(1, H, P, dtype=F64, device=dev), xa[s:e].cumsum(0)])
        idx = torch.arange(e - s, device=dev)
        window[s:e] = run[idx + 1] - run[(idx + 1 - chunk_size).clamp_min(0)]
    return Shadows(
        out=out, final_states=final, unit_out=unit_out, unit_final=unit_final,
        window_x=window * gate, c_abs_sum=Ca.sum(-1, keepdim=True) * gate.amax(-1, keepdim=True), gate_abs=gate,
    )
