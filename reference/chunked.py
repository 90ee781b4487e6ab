"""The five SSD stages in PyTorch, same signatures as the kernel stages (docs/architecture.md), computing in fp32
with the kernels' roundings: b_scaled and cb_scaled rounded to the io dtype before their dots, states cast to the io
dtype in chunk scan, the output cast to the io dtype. Arithmetic follows a ``Profile`` (reference.arith).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reference import arith
from reference.arith import PROFILES, Profile  # noqa: F401  (re-exported: docs name reference.chunked.Profile)
from reference.sequential import _ints
from reference.snapshot import gather_initial_states, write_final_states

F32 = torch.float32


def _chunks(cu_chunk_seqlens) -> list[tuple[int, int]]:
    cu = _ints(cu_chunk_seqlens)
    return [(cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def _group_of_head(nheads: int, ngroups: int) -> torch.Tensor:
    return torch.arange(nheads) // (nheads // ngroups)


def chunk_cumsum(dt, A, chunk_size, cu_chunk_seqlens, *, dt_bias=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                 profile: Profile = "interpreter"):
    """dt (T,H), A (H,) -> (dA_cumsum (H,C,Q) fp32, dt_out (H,C,Q) fp32); padded positions have dt_out = 0.
    Softplus is the kernels' formula on this profile (``reference.arith.softplus``), so ``dt_out`` is bit-exact."""
    d = dt.to(F32)
    if dt_bias is not None:
        d = d + dt_bias.to(F32)
    if dt_softplus:
        d = arith.softplus(d, profile)
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    if (lo, hi) != (0.0, math.inf):
        d = d.clamp(lo, hi)
    chunks = _chunks(cu_chunk_seqlens)
    H = dt.shape[1]
    dt_out = torch.zeros(H, len(chunks), chunk_size, dtype=F32, device=dt.device)
    for c, (s, e) in enumerate(chunks):
        dt_out[:, c, : e - s] = d[s:e].T
    dA = dt_out * A.to(F32)[:, None, None]
    return arith.cumsum(dA, -1, profile), dt_out


def chunk_state(B, x, dt_out, dA_cumsum, cu_chunk_seqlens, *, profile: Profile = "interpreter"):
    """B (T,G,N), x (T,H,P) io dtype -> states (C,H,P,N) fp32: sum_l x[l] b_scaled[l], b_scaled rounded to io dtype."""
    T, H, P = x.shape
    N = B.shape[-1]
    heads_g = _group_of_head(H, B.shape[1])
    chunks = _chunks(cu_chunk_seqlens)
    states = torch.empty(len(chunks), H, P, N, dtype=F32, device=x.device)
    for c, (s, e) in enumerate(chunks):
        L = e - s
        decay = arith.exp(dA_cumsum[:, c, -1:] - dA_cumsum[:, c, :L], profile)  # (H, L)
        scale = decay * dt_out[:, c, :L]
        b = B[s:e].to(F32)[:, heads_g, :].permute(1, 0, 2)  # (H, L, N)
        b_scaled = arith.round_trip(b * scale[:, :, None], x.dtype, profile)
        states[c] = torch.bmm(x[s:e].to(F32).permute(1, 2, 0), b_scaled)  # (H,P,L) @ (H,L,N)
    return states


def chunk_state_magnitude(B, x, dt_out, dA_cumsum, cu_chunk_seqlens, *, profile: Profile,
                          absolute: bool = True) -> torch.Tensor:
    """B (T,G,N), x (T,H,P) -> (C,H,P,N) fp64 on the CPU: sum_l |x[l]| |b[l]|, b = B * decay * dt_out with the decay
    as ``chunk_state`` computes it under ``profile`` (fp32 exp, identical on the kernel's side), the rest in fp64
    (``harness.bounds.chunk_state_bound`` scales it). ``absolute=False``: the signed sum, i.e. the exact chunk state
    of these factors before any io rounding - what both the kernel and its twin approximate."""
    f64 = torch.float64
    H, N = x.shape[1], B.shape[-1]
    heads_g = _group_of_head(H, B.shape[1])
    chunks = _chunks(cu_chunk_seqlens)
    out = torch.zeros(len(chunks), H, x.shape[2], N, dtype=f64)
    for c, (s, e) in enumerate(chunks):
        L = e - s
        decay = arith.exp(dA_cumsum[:, c, -1:] - dA_cumsum[:, c, :L], profile).cpu().to(f64)  # (H, L)
        scale = decay * dt_out[:, c, :L].cpu().to(f64)
        b = B[s:e].detach().cpu().to(f64)[:, heads_g, :].permute(1, 0, 2) * scale[:, :, None]  # (H, L, N)
        xs = x[s:e].detach().cpu().to(f64).permute(1, 2, 0)  # (H, P, L)
        out[c] = torch.bmm(xs.abs(), b.abs()) if absolute else torch.bmm(xs, b)
    return out


@dataclass
class StatePassing:
    """Reference state passing outputs: exiting/entering (C,H,P,N) and final (Bt,H,P,N), all in out_dtype."""

    exiting: torch.Tensor
    entering: torch.Tensor
    final: torch.Tensor


def state_passing(states, dA_cumsum, seq_idx, *, initial_states=None, out_dtype=F32, state_cache=None,
                  final_state_indices=None, last_chunk_indices=None, profile: Profile = "interpreter") -> StatePassing:
    """states (C,H,P,N) fp32, dA_cumsum (H,C,Q): s = exp(dA_cs[:, c, -1]) * s + states[c] in fp32 per sequence.

    With ``state_cache`` and ``final_state_indices``, the final state of sequence b (at ``last_chunk_indices[b]``) is
    also written to ``state_cache[final_state_indices[b]]`` in the cache dtype, skipped for a negative slot.
    """
    seqs = _ints(seq_idx)
    nchunks, H, P, N = states.shape
    batch = max(seqs) + 1 if seqs else 0
    exiting = torch.empty(nchunks, H, P, N, dtype=out_dtype, device=states.device)
    entering = torch.empty_like(exiting)
    finals32 = torch.zeros(batch, H, P, N, dtype=F32, device=states.device)
    s = None
    for c in range(nchunks):
        if c == 0 or seqs[c] != seqs[c - 1]:
            b = seqs[c]
            s = initial_states[b].to(F32) if initial_states is not None else torch.zeros(H, P, N, dtype=F32,
                                                                                        device=states.device)
        entering[c] = arith.cast(s, out_dtype, profile)
        decay = arith.exp(dA_cumsum[:, c, -1], profile)[:, None, None]
        s = arith.mul_add(decay, s, states[c], profile)
        exiting[c] = arith.cast(s, out_dtype, profile)
        finals32[seqs[c]] = s
    final = arith.cast(finals32, out_dtype, profile)
    if state_cache is not None and final_state_indices is not None:
        lasts = _ints(last_chunk_indices) if last_chunk_indices is not None else None
        slots = _ints(final_state_indices)
        for b, slot in enumerate(slots):
            if slot < 0:
                continue
            src = finals32[b] if lasts is None else finals32[seqs[lasts[b]]]
            state_cache[slot] = arith.cast(src, state_cache.dtype, profile)
    return StatePassing(exiting=exiting, entering=entering, final=final)


def bmm_chunk(C, B, chunk_size, cu_chunk_seqlens):
    """C, B (T,G,N) -> CB (nchunks,G,Q,Q) fp32, CB[c,g,l,s] = C[t0+l,g] . B[t0+s,g] inside the chunk, 0 outside."""
    chunks = _chunks(cu_chunk_seqlens)
    G = C.shape[1]
    cb = torch.zeros(len(chunks), G, chunk_size, chunk_size, dtype=F32, device=C.device)
    for c, (s, e) in enumerate(chunks):
        L = e - s
        cc = C[s:e].to(F32).permute(1, 0, 2)  # (G, L, N)
        bb = B[s:e].to(F32).permute(1, 2, 0)  # (G, N, L)
        cb[c, :, :L, :L] = torch.bmm(cc, bb)
    return cb


def bmm_chunk_magnitude(C, B, chunk_size, cu_chunk_seqlens, *, absolute: bool = True) -> torch.Tensor:
    """C, B (T,G,N) -> (nchunks,G,Q,Q) fp64 on the CPU: sum_n |C[t0+l,g,n]| |B[t0+s,g,n]| inside each chunk, 0
    outside; computed in fp64 so the magnitude that ``harness.bounds.bmm_chunk_bound`` multiplies is not itself
    rounded down by fp32 arithmetic (products of io-dtype values are exact in fp64; the fp64 sum's relative error,
    gamma_N(2^-53), is 2^-29 times smaller than the fp32 errors it scales). ``absolute=False``: the signed, exact CB."""
    f64 = torch.float64
    chunks = _chunks(cu_chunk_seqlens)
    mag = torch.zeros(len(chunks), C.shape[1], chunk_size, chunk_size, dtype=f64)
    for c, (s, e) in enumerate(chunks):
        cc = C[s:e].detach().cpu().to(f64).permute(1, 0, 2)  # (G, L, N)
        bb = B[s:e].detach().cpu().to(f64).permute(1, 2, 0)  # (G, N, L)
        if absolute:
            cc, bb = cc.abs(), bb.abs()
        mag[c, :, : e - s, : e - s] = torch.bmm(cc, bb)
    return mag


def _previous_states(states, seq_idx, initial_states, states_are_entering, H, P, N, device):
    seqs = _ints(seq_idx)
    prev = []
    for c in range(len(seqs)):
        if states_are_entering:
            prev.append(states[c])
        elif c > 0 and seqs[c - 1] == seqs[c]:
            prev.append(states[c - 1])
        elif initial_states is not None:
            prev.append(initial_states[seqs[c]])
        else:
            prev.append(torch.zeros(H, P, N, dtype=F32, device=device))
    return prev


def chunk_scan(CB, x, dt_out, dA_cumsum, C, states, cu_chunk_seqlens, seq_idx, *, out, D=None, z=None,
               initial_states=None, states_are_entering=False, profile: Profile = "interpreter") -> None:
    """Writes out (T,H,P) io dtype. Per chunk and token l (fp32, g = g(h)):
    acc = (C[l] . prev.to(io)) * exp(dA_cs[l]) + sum_{s<=l} cb_scaled[l,s] x[s],
    cb_scaled = (CB[l,s] * exp(dA_cs[l] - dA_cs[s]) * dt[s]).to(io); acc += x[l] D; acc *= z sigmoid(z)."""
    T, H, P = x.shape
    N = C.shape[-1]
    io = x.dtype
    heads_g = _group_of_head(H, C.shape[1])
    chunks = _chunks(cu_chunk_seqlens)
    prevs = _previous_states(states, seq_idx, initial_states, states_are_entering, H, P, N, x.device)
    Dv = None
    if D is not None:
        Dv = D.to(F32)
        Dv = Dv[:, None].expand(H, P) if Dv.dim() == 1 else Dv
    for c, (s, e) in enumerate(chunks):
        L = e - s
        cs = dA_cumsum[:, c, :L]  # (H, L)
        xs = x[s:e].to(F32).permute(1, 0, 2)  # (H, L, P)
        cc = C[s:e].to(F32)[:, heads_g, :].permute(1, 0, 2)  # (H, L, N)
        prev = arith.round_trip(prevs[c].to(F32), io, profile)  # (H, P, N)
        acc = torch.bmm(cc, prev.transpose(1, 2)) * arith.exp(cs, profile)[:, :, None]  # (H, L, P)
        cb = CB[c][heads_g][:, :L, :L]  # (H, L, L)
        cb = cb * arith.exp(cs[:, :, None] - cs[:, None, :], profile)
        cb = cb * dt_out[:, c, :L][:, None, :]
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        cb = torch.where(causal, cb, torch.zeros((), dtype=F32, device=x.device))
        acc = acc + torch.bmm(arith.round_trip(cb, io, profile), xs)
        if Dv is not None:
            acc = arith.mul_add(xs, Dv[:, None, :], acc, profile)
        if z is not None:
            zz = z[s:e].to(F32).permute(1, 0, 2)
            acc = acc * (zz * arith.sigmoid(zz, profile))
        out[s:e] = arith.cast(acc, io, profile).permute(1, 0, 2)


def chunk_scan_magnitude(CB, x, dt_out, dA_cumsum, C, states, cu_chunk_seqlens, seq_idx, *, D=None, z=None,
                         initial_states=None, states_are_entering=False, profile: Profile | None = None,
                         absolute: bool = True) -> torch.Tensor:
    """(T,H,P) fp64: chunk scan's sum of |terms| (|C||prev| decay + |cb_scaled||x| + |x D|, times |z sigmoid(z)|),
    the magnitude that per-stage chunk-scan bounds multiply. Same inputs as ``chunk_scan``.

    Decays and gate: exact fp64 functions, or with ``profile`` the fp32 values ``chunk_scan`` computes under it (bit
    for bit the kernel's). ``absolute=False`` (with ``profile``): the signed sum, the exact chunk scan of those factors
    before the io roundings (cb_scaled, state cast, output), which the kernel and its twin both approximate."""
    if not absolute and profile is None:
        raise ValueError("chunk_scan_magnitude: the signed (exact) scan needs the profile whose decays it uses")
    T, H, P = x.shape
    N = C.shape[-1]
    f64 = torch.float64
    heads_g = _group_of_head(H, C.shape[1])
    prevs = _previous_states(states, seq_idx, initial_states, states_are_entering, H, P, N, x.device)
    mag = torch.abs if absolute else (lambda t: t)
    out = torch.empty(T, H, P, dtype=f64)
    for c, (s, e) in enumerate(_chunks(cu_chunk_seqlens)):
        L = e - s
        cs = dA_cumsum[:, c, :L]
        if profile is None:
            cs64 = cs.cpu().to(f64)
            decay_in, decay = torch.exp(cs64), torch.exp(cs64[:, :, None] - cs64[:, None, :])
        else:
            decay_in = arith.exp(cs, profile).cpu().to(f64)
            decay = arith.exp(cs[:, :, None] - cs[:, None, :], profile).cpu().to(f64)
        decay = torch.where(torch.ones(L, L, dtype=torch.bool).tril(), decay, torch.zeros((), dtype=f64))
        xs = mag(x[s:e].cpu().to(f64).permute(1, 0, 2))
        cc = mag(C[s:e].cpu().to(f64)[:, heads_g, :].permute(1, 0, 2))
        acc = torch.bmm(cc, mag(prevs[c].cpu().to(f64)).transpose(1, 2)) * decay_in[:, :, None]
        cb = mag(CB[c].cpu().to(f64)[heads_g][:, :L, :L]) * decay
        acc = acc + torch.bmm(cb * dt_out[:, c, :L].cpu().to(f64)[:, None, :], xs)
        if D is not None:
            Dv = mag(D.cpu().to(f64))
            acc = acc + xs * (Dv[:, None, None] if Dv.dim() == 1 else Dv[:, None, :])
        if z is not None:
            zz = z[s:e].permute(1, 0, 2)
            if profile is None:
                z64 = zz.cpu().to(f64)
                gate = z64 * torch.sigmoid(z64)
            else:
                z32 = zz.to(F32)
                gate = (z32 * arith.sigmoid(z32, profile)).cpu().to(f64)
            acc = acc * mag(gate)
        out[s:e] = acc.permute(1, 0, 2)
    return out


def default_profile(device: torch.device) -> str:
    """The arithmetic our kernels follow on this device (GPU: ``cuda``; CPU tensors run the interpreter)."""
    return "cuda" if torch.device(device).type == "cuda" else "interpreter"


def chunked_ssd(x, dt, A, B, C, *, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out,
                D=None, z=None, dt_bias=None, dt_softplus=False, dt_limit=(0.0, math.inf), state_cache,
                initial_state_indices, has_initial_states, final_state_indices=None,
                return_intermediate_states=False, profile=None):
    """The five stages end to end with snapshot semantics (docs/provider.md keyword names).

    x (T,H,P), dt (T,H), A (H,), B/C (T,G,N), out (T,H,P) io dtype written in place; state_cache (slots,H,P,N).
    Returns None after direct writeback (``final_state_indices`` given), the chunk-end states (nchunks,H,P,N) in the
    cache dtype with ``return_intermediate_states`` (writing nothing), else final states (Bt,H,P,N) in the cache dtype.
    """
    profile = profile or default_profile(x.device)
    initial = gather_initial_states(state_cache, initial_state_indices, has_initial_states)
    dA_cumsum, dt_out = chunk_cumsum(dt, A, chunk_size, cu_chunk_seqlens, dt_bias=dt_bias,
                                             dt_softplus=dt_softplus, dt_limit=dt_limit, profile=profile)
    states = chunk_state(B, x, dt_out, dA_cumsum, cu_chunk_seqlens, profile=profile)
    passed = state_passing(states, dA_cumsum, seq_idx, initial_states=initial, out_dtype=state_cache.dtype,
                                   last_chunk_indices=last_chunk_indices, profile=profile)
    cb = bmm_chunk(C, B, chunk_size, cu_chunk_seqlens)
    chunk_scan(cb, x, dt_out, dA_cumsum, C, passed.exiting, cu_chunk_seqlens, seq_idx, out=out, D=D, z=z,
                       initial_states=initial, profile=profile)
    if return_intermediate_states:
        return passed.exiting
    if final_state_indices is not None:
        write_final_states(state_cache, final_state_indices, passed.final)
        return None
    return passed.final
