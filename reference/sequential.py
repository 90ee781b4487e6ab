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


def _scan(x, dtp, A, Bh, Ch, Dv, gate, cu, h0, exit_offsets, unit_input: bool):
    """The recurrence itself. x (T,H,P) dtp (T,H) A (H,) Bh/Ch (T,H,N) Dv (H,P) or None, gate (T,H,P) or None,
    h0 (Bt,H,P,N) or None -> out (T,H,P), final (Bt,H,P,N), exits {offset: (H,P,N)}."""
    T, H, P = x.shape
    N = Bh.shape[-1]
    dev = x.device
    out = torch.empty(T, H, P, dtype=F64, device=dev)
    final = torch.empty(len(cu) - 1, H, P, N, dtype=F64, device=dev)
    exits = {}
    wanted = set(exit_offsets or ())
    decay = torch.exp(dtp * A[None, :])  # (T, H)
    for b in range(len(cu) - 1):
        h = h0[b].clone() if h0 is not None else torch.zeros(H, P, N, dtype=F64, device=dev)
        for t in range(cu[b], cu[b + 1]):
            if unit_input:
                inject = x[t][:, :, None].expand(H, P, N)
            else:
                inject = (dtp[t][:, None] * x[t])[:, :, None] * Bh[t][:, None, :]
            h = decay[t][:, None, None] * h + inject
            y = torch.einsum("hpn,hn->hp", h, Ch[t])
            if Dv is not None:
                y = y + Dv * x[t]
            out[t] = y * gate[t] if gate is not None else y
            if t + 1 in wanted:
                exits[t + 1] = h.clone()
        final[b] = h
    return out.cpu(), final.cpu(), {o: e.cpu() for o, e in exits.items()}


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
    """fp64 sequential SSD; returns CPU tensors.

    The token loop runs on the device ``x`` lives on: on the GPU runner a CUDA fp64 step is some 20 times faster
    than a CPU one for the serving shape, and fp64 rounding (1e-16) is far below every bound either way.

    x (T,H,P), dt (T,H), A (H,), B/C (T,G,N), D (H,) or (H,P), z (T,H,P), initial_states (Bt,H,P,N), any dtypes.
    Returns ``(out (T,H,P) fp64, final_states (Bt,H,P,N) fp64)``; with ``exit_offsets`` (token offsets, e.g.
    ``cu_chunk_seqlens[1:]``) a third item, the state after token ``offset - 1`` for each, stacked (len, H, P, N).
    ``magnitude=True`` runs the same recurrence on absolute values (|x|, |B|, |C|, |D|, |z sigmoid(z)|, |h0|) and
    returns its shadow of out and final states in the same tuple form.
    """
    cu = _ints(cu_seqlens)
    T, H, P = x.shape
    dev = x.device
    f = (lambda t: t.detach().to(dev, F64).abs()) if magnitude else (lambda t: t.detach().to(dev, F64))
    xv = f(x)
    dtp = process_dt(dt.detach().to(dev), None if dt_bias is None else dt_bias.detach().to(dev), dt_softplus, dt_limit)
    Av = A.detach().to(dev, F64)
    Bh, Ch = _per_head(f(B), H), _per_head(f(C), H)
    Dv = None
    if D is not None:
        Dv = f(D)
        Dv = Dv[:, None].expand(H, P) if Dv.dim() == 1 else Dv
    gate = None
    if z is not None:
        zz = z.detach().to(dev, F64)
        gate = zz * torch.sigmoid(zz)
        gate = gate.abs() if magnitude else gate
    h0 = None if initial_states is None else f(initial_states)
    offsets = _ints(exit_offsets) if exit_offsets is not None else None
    out, final, exits = _scan(xv, dtp, Av, Bh, Ch, Dv, gate, cu, h0, offsets, unit_input=False)
    if offsets is None:
        return out, final
    chunk_end = torch.stack([exits[o] for o in offsets]) if offsets else torch.empty(0, H, P, Bh.shape[-1], dtype=F64)
    return out, final, chunk_end


def magnitude_shadows(
    x, dt, A, B, C, *, cu_seqlens, chunk_size: int, D=None, z=None, dt_bias=None, dt_softplus=False,
    dt_limit=(0.0, math.inf), initial_states=None,
) -> Shadows:
    """All the magnitude shadows ``harness.bounds`` needs (see ``Shadows``), same inputs as ``sequential_ssd``."""
    out, final = sequential_ssd(
        x, dt, A, B, C, cu_seqlens=cu_seqlens, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
        dt_limit=dt_limit, initial_states=initial_states, magnitude=True,
    )
    cu = _ints(cu_seqlens)
    T, H, P = x.shape
    dev = x.device  # the unit scan runs where the inputs are, like sequential_ssd's
    xa = x.detach().to(dev, F64).abs()
    dtp = process_dt(dt.detach().to(dev), None if dt_bias is None else dt_bias.detach().to(dev), dt_softplus, dt_limit)
    Ca = _per_head(C.detach().to(dev, F64).abs(), H)
    gate = torch.ones(T, H, P, dtype=F64, device=dev)
    if z is not None:
        zz = z.detach().to(dev, F64)
        gate = (zz * torch.sigmoid(zz)).abs()
    unit_out, unit_final, _ = _scan(xa, dtp, A.detach().to(dev, F64), Ca, Ca, None, gate, cu, None, None, True)
    xa, Ca, gate = xa.cpu(), Ca.cpu(), gate.cpu()
    window = torch.empty(T, H, P, dtype=F64)
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        run = torch.cat([torch.zeros(1, H, P, dtype=F64), xa[s:e].cumsum(0)])
        idx = torch.arange(e - s)
        window[s:e] = run[idx + 1] - run[(idx + 1 - chunk_size).clamp_min(0)]
    return Shadows(
        out=out, final_states=final, unit_out=unit_out, unit_final=unit_final,
        window_x=window * gate, c_abs_sum=Ca.sum(-1, keepdim=True) * gate.amax(-1, keepdim=True), gate_abs=gate,
    )
