"""Where the chunk scan's time goes on the prefill: variants of stage 5 timed against the shipped kernel (issue 54).

    python lab/chunk_scan_variants.py [--rounds 5] [--chunks 17] [--sweep] [--only REGEX]

The serving shape (64 heads, headdim 64, dstate 128, one group, chunk 256, bf16 io and states, D per head, no z) on
a one-sequence prefill of ``--chunks`` chunks (the last one 160 tokens, as in the 4256-token bench workload), inputs
as a prefill makes them (dA_cumsum a decreasing cumsum within each chunk). Each variant runs from CUDA graphs of 20
launches, replayed; the table gives the median and best us per launch over interleaved rounds, and each variant's
output against the shipped kernel's (bit-equal, or the largest difference relative to the output's largest value).

Variants (one lab kernel, constexpr flags; the shipped kernel itself as the baseline):
- ``factor``: below the tile's first row the decay exp(dA[l] - dA[s]) is the product exp(dA[l] - dA[r]) *
  exp(dA[r] - dA[s]) with r the tile's first row: both factors are at most 1 (no overflow), one exp per row and one
  per column instead of one per element, and no causal select off the diagonal. Different bits (two exps).
- ``heads=H``: one program computes H heads of its (chunk, tile) one after another, so the CB and C tiles its
  heads share come from the SM's L1 after the first head. The same bits.
- ``prefetch``: a copy of the shipped kernel whose causal loop loads the next step's operands (CB, dA, dt, x)
  before its own step's arithmetic, in registers, the first step's before the inter-chunk term; ``copy`` is the
  same copy without it. The same bits.
- ``cb-bf16``: the shipped kernel reading a bf16 copy of CB: what halving CB's traffic would buy (different bits;
  a diagnostic, not a candidate).

Not part of the product or the suite.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import chunk_scan as shipped  # noqa: E402
from kernels.backend import (  # noqa: E402
    DOT_FP32_OPERANDS,
    FP32_DOT_PRECISION,
    LOG2E,
    dot_acc,
    wait_for_previous_kernel,
)

H, P, N, Q = 64, 64, 128, 256
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@triton.jit
def _scan_variant(
    CB_ptr, x_ptr, out_ptr, dt_ptr, dA_cumsum_ptr, seq_idx_ptr, C_ptr, states_ptr, D_ptr, cu_chunk_seqlens_ptr,
    chunk_size: tl.constexpr, hdim: tl.constexpr, dstate: tl.constexpr,
    stride_CB_chunk, stride_CB_m, stride_x_token, stride_x_head, stride_dt_head, stride_dt_chunk,
    stride_C_token, stride_states_chunk, stride_states_head, stride_states_hdim,
    FACTOR_DECAY: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr,
    DOT_FP32_OPERANDS: tl.constexpr, FP32_DOT_PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    # Grid (tiles, chunks, heads / HEADS_PER_PROGRAM), head-fastest order as the shipped kernel.
    launch_order = tl.program_id(axis=2) * tl.num_programs(axis=1) + tl.program_id(axis=1)
    launch_order = launch_order * tl.num_programs(axis=0) + tl.program_id(axis=0)
    pid_hg = launch_order % tl.num_programs(axis=2)
    pid_mn = (launch_order // tl.num_programs(axis=2)) % tl.num_programs(axis=0)
    pid_c = launch_order // (tl.num_programs(axis=2) * tl.num_programs(axis=0))
    num_pid_n = tl.cdiv(hdim, BLOCK_SIZE_N)
    pid_m = pid_mn // num_pid_n
    pid_n = pid_mn % num_pid_n
    chunk_start = tl.load(cu_chunk_seqlens_ptr + pid_c).to(tl.int64)
    chunk_len = tl.load(cu_chunk_seqlens_ptr + pid_c + 1).to(tl.int64) - chunk_start
    if pid_m * BLOCK_SIZE_M >= chunk_len:
        return
    io_dtype = x_ptr.dtype.element_ty
    seq = tl.load(seq_idx_ptr + pid_c)
    prev_chunk = pid_c - 1
    prev_seq = tl.load(seq_idx_ptr + prev_chunk, mask=prev_chunk >= 0, other=-1)
    from_states = prev_seq == seq
    m_start = pid_m * BLOCK_SIZE_M
    offs_m = m_start + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_s = tl.arange(0, dstate)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    row_mask = offs_m < chunk_len
    k_max = tl.minimum((pid_m + 1) * BLOCK_SIZE_M, chunk_len)
    for hh in range(HEADS_PER_PROGRAM):
        pid_h = pid_hg * HEADS_PER_PROGRAM + hh
        CB_base = CB_ptr + pid_c.to(tl.int64) * stride_CB_chunk
        x_base = x_ptr + chunk_start * stride_x_token + pid_h * stride_x_head
        dt_base = dt_ptr + pid_h * stride_dt_head + pid_c * stride_dt_chunk
        dA_base = dA_cumsum_ptr + pid_h * stride_dt_head + pid_c * stride_dt_chunk
        dA_cs_m = tl.load(dA_base + offs_m)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        if from_states:
            prev_base = states_ptr + prev_chunk.to(tl.int64) * stride_states_chunk + pid_h * stride_states_head
            c = tl.load(C_ptr + (chunk_start + offs_m[:, None]) * stride_C_token + offs_s[None, :],
                        mask=row_mask[:, None], other=0.0)
            prev = tl.load(prev_base + offs_s[:, None] + offs_n[None, :] * stride_states_hdim).to(io_dtype)
            acc = dot_acc(acc, c, prev, DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
            acc *= tl.math.exp2(dA_cs_m * LOG2E)[:, None]
        CB_ptrs = CB_base + offs_m[:, None] * stride_CB_m + offs_k[None, :]
        x_ptrs = x_base + offs_k[:, None] * stride_x_token + offs_n[None, :]
        k_start = 0
        if FACTOR_DECAY:
            # Below the tile's first row: exp(dA[l] - dA[r]) * exp(dA[r] - dA[s]), both factors <= 1.
            dA_r = tl.load(dA_base + m_start)
            row_decay = tl.math.exp2((dA_cs_m - dA_r) * LOG2E)
            for k in range(0, m_start, BLOCK_SIZE_K):
                cb = tl.load(CB_ptrs)
                dA_cs_k = tl.load(dA_base + k + offs_k)
                dt_k = tl.load(dt_base + k + offs_k)
                col = tl.math.exp2((dA_r - dA_cs_k) * LOG2E) * dt_k
                cb = (cb * row_decay[:, None] * col[None, :]).to(io_dtype)
                xk = tl.load(x_ptrs)
                acc = dot_acc(acc, cb, xk, DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
                CB_ptrs += BLOCK_SIZE_K
                x_ptrs += BLOCK_SIZE_K * stride_x_token
            k_start = m_start
        for k in range(k_start, k_max, BLOCK_SIZE_K):
            cb = tl.load(CB_ptrs)
            dA_cs_k = tl.load(dA_base + k + offs_k)
            dt_k = tl.load(dt_base + k + offs_k)
            cb = cb * tl.math.exp2((dA_cs_m[:, None] - dA_cs_k[None, :]) * LOG2E)
            cb = cb * dt_k[None, :]
            cb = tl.where(offs_m[:, None] >= k + offs_k[None, :], cb, 0.0).to(io_dtype)
            xk = tl.load(x_ptrs, mask=(offs_k[:, None] < chunk_len - k), other=0.0)
            acc = dot_acc(acc, cb, xk, DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
            CB_ptrs += BLOCK_SIZE_K
            x_ptrs += BLOCK_SIZE_K * stride_x_token
        D = tl.load(D_ptr + pid_h).to(tl.float32)
        x_residual = tl.load(x_base + offs_m[:, None] * stride_x_token + offs_n[None, :], mask=row_mask[:, None],
                             other=0.0).to(tl.float32)
        acc += x_residual * D
        out_ptrs = out_ptr + (chunk_start + offs_m[:, None]) * stride_x_token + pid_h * stride_x_head + offs_n[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


# The shipped kernel's text with one flag: PREFETCH loads each causal step's operands one step ahead.
@triton.jit(do_not_specialize=["stride_D_head", "stride_D_hdim", "prev_chunk_offset", "has_initial_states"])
def _scan_prefetch(
    CB_ptr,  # (C, G, Q, Q) fp32
    x_ptr,  # (T, H, P) io dtype
    z_ptr,  # (T, H, P) io dtype, unused without HAS_Z
    out_ptr,  # (T, H, P) io dtype
    dt_ptr,  # (H, C, Q) fp32
    dA_cumsum_ptr,  # (H, C, Q) fp32
    seq_idx_ptr,  # (C,)
    C_ptr,  # (T, G, N) io dtype
    states_ptr,  # (C, H, P, N) state dtype
    D_ptr,  # (H,) or (H, P), unused without HAS_D
    initial_states_ptr,  # (Bt, H, P, N) state dtype, same inner strides as states; read only if has_initial_states
    cu_chunk_seqlens_ptr,  # (C + 1,)
    prev_chunk_offset,  # 0: states[c] enters chunk c (indexed path); 1: states[c - 1] exits the chunk before
    has_initial_states,  # nonzero: a sequence's first chunk starts from initial_states[seq] (else from zero)
    chunk_size: tl.constexpr,
    hdim: tl.constexpr,
    dstate: tl.constexpr,
    nheads_per_group: tl.constexpr,
    stride_CB_chunk,
    stride_CB_group,
    stride_CB_m,
    stride_CB_k,
    stride_x_token,
    stride_x_head,
    stride_x_hdim,
    stride_z_token,
    stride_z_head,
    stride_z_hdim,
    stride_out_token,
    stride_out_head,
    stride_out_hdim,
    stride_dt_head,
    stride_dt_chunk,
    stride_dt_pos,
    stride_dA_cs_head,
    stride_dA_cs_chunk,
    stride_dA_cs_pos,
    stride_C_token,
    stride_C_group,
    stride_C_dstate,
    stride_states_chunk,
    stride_states_head,
    stride_states_hdim,
    stride_states_dstate,
    stride_init_batch,
    stride_init_head,
    stride_D_head,
    stride_D_hdim,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    DOT_FP32_OPERANDS: tl.constexpr,
    FP32_DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_SIZE_DSTATE: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    # The grid is (tiles, chunks, heads). Programs start in launch order, and this one takes the tile of that place
    # in head-fastest order: the heads of one (chunk, tile) one after another, then the next tile, then the next
    # chunk, so the programs running at once cover the causal loop's short and long tiles alike.
    launch_order = tl.program_id(axis=2) * tl.num_programs(axis=1) + tl.program_id(axis=1)
    launch_order = launch_order * tl.num_programs(axis=0) + tl.program_id(axis=0)
    pid_h = launch_order % tl.num_programs(axis=2)
    pid_mn = (launch_order // tl.num_programs(axis=2)) % tl.num_programs(axis=0)
    pid_c = launch_order // (tl.num_programs(axis=2) * tl.num_programs(axis=0))
    num_pid_n = tl.cdiv(hdim, BLOCK_SIZE_N)
    pid_m = pid_mn // num_pid_n
    pid_n = pid_mn % num_pid_n
    chunk_start = tl.load(cu_chunk_seqlens_ptr + pid_c).to(tl.int64)
    chunk_len = tl.load(cu_chunk_seqlens_ptr + pid_c + 1).to(tl.int64) - chunk_start
    # A tile whose rows all lie past the chunk's end stores nothing (a continuation's short chunk, a sequence's last).
    if pid_m * BLOCK_SIZE_M >= chunk_len:
        return
    group = pid_h // nheads_per_group
    io_dtype = x_ptr.dtype.element_ty

    # Which state enters this chunk: states[prev_chunk] when that chunk is of the same sequence (always, on the
    # indexed path, where prev_chunk == c), else the sequence's initial state, else none (zero).
    seq = tl.load(seq_idx_ptr + pid_c)
    prev_chunk = pid_c - prev_chunk_offset
    prev_seq = tl.load(seq_idx_ptr + prev_chunk, mask=prev_chunk >= 0, other=-1)
    from_states = prev_seq == seq
    if from_states:
        prev_base = states_ptr + prev_chunk.to(tl.int64) * stride_states_chunk + pid_h * stride_states_head
    else:
        prev_base = initial_states_ptr + seq.to(tl.int64) * stride_init_batch + pid_h * stride_init_head

    CB_ptr += pid_c.to(tl.int64) * stride_CB_chunk + group * stride_CB_group
    x_ptr += chunk_start * stride_x_token + pid_h * stride_x_head
    C_ptr += chunk_start * stride_C_token + group * stride_C_group
    dt_ptr += pid_h * stride_dt_head + pid_c * stride_dt_chunk
    dA_cumsum_ptr += pid_h * stride_dA_cs_head + pid_c * stride_dA_cs_chunk

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    row_mask = offs_m < chunk_len
    col_mask = offs_n < hdim
    # Where the tiles divide the chunk (the serving shape) no tile reaches past it (the grid has chunk_size /
    # BLOCK_SIZE_M row tiles, and the causal loop stops inside the chunk), so the chunk-indexed loads take no mask: a
    # mask is a compare and a zero per element, in instructions and registers. The same values either way.
    if chunk_size % BLOCK_SIZE_M == 0:
        dA_cs_m = tl.load(dA_cumsum_ptr + offs_m * stride_dA_cs_pos)
    else:
        dA_cs_m = tl.load(dA_cumsum_ptr + offs_m * stride_dA_cs_pos, mask=offs_m < chunk_size, other=0.0)

    offs_k = tl.arange(0, BLOCK_SIZE_K)
    CB_ptrs = CB_ptr + offs_m[:, None] * stride_CB_m + offs_k[None, :] * stride_CB_k
    x_ptrs = x_ptr + offs_k[:, None] * stride_x_token + offs_n[None, :] * stride_x_hdim
    dt_ptrs = dt_ptr + offs_k * stride_dt_pos
    dA_cs_ptrs = dA_cumsum_ptr + offs_k * stride_dA_cs_pos
    k_max = tl.minimum((pid_m + 1) * BLOCK_SIZE_M, chunk_len)
    if PREFETCH:
        # The first step's operands, loaded before the inter-chunk term so that their latency overlaps it.
        cb_n = tl.load(CB_ptrs)
        dA_n = tl.load(dA_cs_ptrs)
        dt_n = tl.load(dt_ptrs)
        x_n = tl.load(x_ptrs, mask=(offs_k[:, None] < chunk_len) & col_mask[None, :], other=0.0)

    # Inter-chunk term: (C . prev) * exp(dA_cs[l]).
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    if from_states | (has_initial_states != 0):
        offs_s = tl.arange(0, BLOCK_SIZE_DSTATE)
        C_ptrs = C_ptr + offs_m[:, None] * stride_C_token + offs_s[None, :] * stride_C_dstate
        prev_ptrs = prev_base + offs_s[:, None] * stride_states_dstate + offs_n[None, :] * stride_states_hdim
        for s in range(0, dstate, BLOCK_SIZE_DSTATE):
            s_mask = offs_s < dstate - s
            c = tl.load(C_ptrs, mask=row_mask[:, None] & s_mask[None, :], other=0.0)
            prev = tl.load(prev_ptrs, mask=s_mask[:, None] & col_mask[None, :], other=0.0).to(io_dtype)
            acc = dot_acc(acc, c, prev, DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
            C_ptrs += BLOCK_SIZE_DSTATE * stride_C_dstate
            prev_ptrs += BLOCK_SIZE_DSTATE * stride_states_dstate
        acc *= tl.math.exp2(dA_cs_m * LOG2E)[:, None]

    # Intra-chunk term: causal sum over s <= l, only up to this tile's last row.
    if PREFETCH:
        # Each step loads the next step's operands before its own arithmetic (registers, not the pipeliner's
        # shared-memory stages, which sm90 miscompiles at these tiles): the loads' latency overlaps the step.
        for k in range(0, k_max, BLOCK_SIZE_K):
            cb = cb_n
            dA_cs_k = dA_n
            dt_k = dt_n
            xk = x_n
            CB_ptrs += BLOCK_SIZE_K * stride_CB_k
            x_ptrs += BLOCK_SIZE_K * stride_x_token
            dt_ptrs += BLOCK_SIZE_K * stride_dt_pos
            dA_cs_ptrs += BLOCK_SIZE_K * stride_dA_cs_pos
            more = k + BLOCK_SIZE_K < k_max
            cb_n = tl.load(CB_ptrs, mask=more, other=0.0)
            dA_n = tl.load(dA_cs_ptrs, mask=more, other=0.0)
            dt_n = tl.load(dt_ptrs, mask=more, other=0.0)
            x_n = tl.load(x_ptrs, mask=(offs_k[:, None] < chunk_len - k - BLOCK_SIZE_K) & col_mask[None, :] & more,
                          other=0.0)
            cb = cb * tl.math.exp2((dA_cs_m[:, None] - dA_cs_k[None, :]) * LOG2E)
            cb = cb * dt_k[None, :]
            cb = tl.where(offs_m[:, None] >= k + offs_k[None, :], cb, 0.0).to(io_dtype)
            acc = dot_acc(acc, cb, xk, DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
    else:
        for k in range(0, k_max, BLOCK_SIZE_K):
            if (chunk_size % BLOCK_SIZE_M == 0) & (chunk_size % BLOCK_SIZE_K == 0):
                cb = tl.load(CB_ptrs)
                dA_cs_k = tl.load(dA_cs_ptrs)
                dt_k = tl.load(dt_ptrs)
            else:
                k_in_q = offs_k < chunk_size - k
                cb = tl.load(CB_ptrs, mask=(offs_m[:, None] < chunk_size) & k_in_q[None, :], other=0.0)
                dA_cs_k = tl.load(dA_cs_ptrs, mask=k_in_q, other=0.0)
                dt_k = tl.load(dt_ptrs, mask=k_in_q, other=0.0)
            cb = cb * tl.math.exp2((dA_cs_m[:, None] - dA_cs_k[None, :]) * LOG2E)
            cb = cb * dt_k[None, :]
            # Above the diagonal exp() may overflow (inf * 0 = NaN): select, don't multiply, to mask.
            cb = tl.where(offs_m[:, None] >= k + offs_k[None, :], cb, 0.0).to(io_dtype)
            xk = tl.load(x_ptrs, mask=(offs_k[:, None] < chunk_len - k) & col_mask[None, :], other=0.0)
            acc = dot_acc(acc, cb, xk, DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
            CB_ptrs += BLOCK_SIZE_K * stride_CB_k
            x_ptrs += BLOCK_SIZE_K * stride_x_token
            dt_ptrs += BLOCK_SIZE_K * stride_dt_pos
            dA_cs_ptrs += BLOCK_SIZE_K * stride_dA_cs_pos

    tile_mask = row_mask[:, None] & col_mask[None, :]
    if HAS_D:
        D = tl.load(D_ptr + pid_h * stride_D_head + offs_n * stride_D_hdim, mask=col_mask, other=0.0).to(tl.float32)
        x_residual = tl.load(
            x_ptr + offs_m[:, None] * stride_x_token + offs_n[None, :] * stride_x_hdim, mask=tile_mask, other=0.0
        ).to(tl.float32)
        acc += x_residual * D[None, :]
    if HAS_Z:
        z = tl.load(
            z_ptr + (chunk_start + offs_m[:, None]) * stride_z_token + pid_h * stride_z_head
            + offs_n[None, :] * stride_z_hdim,
            mask=tile_mask,
            other=0.0,
        ).to(tl.float32)
        # div_rn, not '/': Triton's fp32 '/' is the approximate div.full.f32 on CUDA, which no torch op reproduces;
        # the IEEE division makes the gate bit-equal to reference.arith.sigmoid on both backends.
        acc *= z * tl.math.div_rn(1.0, 1.0 + tl.math.exp2(-z * LOG2E))

    out_ptrs = (
        out_ptr
        + (chunk_start + offs_m[:, None]) * stride_out_token
        + pid_h * stride_out_head
        + offs_n[None, :] * stride_out_hdim
    )
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=tile_mask)


def prefill_inputs(chunks: int, seed: int = 0) -> dict:
    """Stage 5's inputs for a one-sequence prefill of ``chunks`` chunks, the last 160 tokens."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    T = (chunks - 1) * Q + 160
    bounds = list(range(0, T, Q)) + [T]
    dt = torch.nn.functional.softplus(torch.randn(H, chunks, Q, device=DEVICE, generator=g) - 3.0)
    A = -torch.exp(torch.rand(H, 1, 1, device=DEVICE, generator=g) * 2.77)  # A in [-16, -1]
    dA_cumsum = torch.cumsum(dt * A, dim=-1)
    C = torch.randn(T, 1, N, device=DEVICE, generator=g).bfloat16()
    B = torch.randn(T, 1, N, device=DEVICE, generator=g).bfloat16()
    Cp = torch.zeros(chunks * Q, N, device=DEVICE)
    Bp = torch.zeros(chunks * Q, N, device=DEVICE)
    Cp[:T], Bp[:T] = C[:, 0].float(), B[:, 0].float()
    CB = torch.bmm(Cp.view(chunks, Q, N), Bp.view(chunks, Q, N).transpose(1, 2)).view(chunks, 1, Q, Q).contiguous()
    return dict(
        CB=CB,
        x=torch.randn(T, H, P, device=DEVICE, generator=g).bfloat16(),
        dt_out=dt.contiguous(),
        dA_cumsum=dA_cumsum.contiguous(),
        C=C,
        states=(torch.randn(chunks, H, P, N, device=DEVICE, generator=g) * 0.1).bfloat16(),
        cu_chunk_seqlens=torch.tensor(bounds, dtype=torch.int32, device=DEVICE),
        seq_idx=torch.zeros(chunks, dtype=torch.int32, device=DEVICE),
        D=torch.rand(H, device=DEVICE, generator=g),
    )


def shipped_call(inp: dict, out: torch.Tensor, CB=None):
    def call():
        shipped.chunk_scan(CB if CB is not None else inp["CB"], inp["x"], inp["dt_out"], inp["dA_cumsum"], inp["C"],
                           inp["states"], inp["cu_chunk_seqlens"], inp["seq_idx"], out=out, D=inp["D"])
    return call


def shipped_raw_call(inp: dict, out: torch.Tensor, CB: torch.Tensor, config: dict, warps: int, stages: int):
    """The shipped kernel at one config, bypassing the wrapper's checks (for a bf16 CB)."""
    args = shipped.launch_arguments(inp["CB"], inp["x"], inp["dt_out"], inp["dA_cumsum"], inp["C"], inp["states"],
                                    inp["cu_chunk_seqlens"], inp["seq_idx"], out=out, D=inp["D"], z=None,
                                    initial_states=None, states_are_entering=False)
    args["CB_ptr"] = CB
    args.pop("launch_pdl")
    nchunks = inp["CB"].shape[0]
    grid = (triton.cdiv(Q, config["BLOCK_SIZE_M"]) * triton.cdiv(P, config["BLOCK_SIZE_N"]), nchunks, H)

    def call():
        shipped._chunk_scan_kernel[grid](**args, **config, num_warps=warps, num_stages=stages)
    return call


def prefetch_call(inp: dict, out: torch.Tensor, config: dict, warps: int, stages: int, prefetch: bool):
    """The lab's copy of the shipped kernel (``_scan_prefetch``), with or without the one-step-ahead loads."""
    args = shipped.launch_arguments(inp["CB"], inp["x"], inp["dt_out"], inp["dA_cumsum"], inp["C"], inp["states"],
                                    inp["cu_chunk_seqlens"], inp["seq_idx"], out=out, D=inp["D"], z=None,
                                    initial_states=None, states_are_entering=False)
    args.pop("launch_pdl")
    args["USE_PDL"] = False
    nchunks = inp["CB"].shape[0]
    grid = (triton.cdiv(Q, config["BLOCK_SIZE_M"]) * triton.cdiv(P, config["BLOCK_SIZE_N"]), nchunks, H)

    def call():
        _scan_prefetch[grid](**args, **config, PREFETCH=prefetch, num_warps=warps, num_stages=stages)
    return call


def variant_call(inp: dict, out: torch.Tensor, *, factor: bool, heads: int, config: dict, warps: int, stages: int):
    nchunks = inp["CB"].shape[0]
    grid = (triton.cdiv(Q, config["BLOCK_SIZE_M"]) * triton.cdiv(P, config["BLOCK_SIZE_N"]), nchunks, H // heads)
    x, st = inp["x"], inp["states"]

    def call():
        _scan_variant[grid](
            inp["CB"], x, out, inp["dt_out"], inp["dA_cumsum"], inp["seq_idx"], inp["C"], st, inp["D"],
            inp["cu_chunk_seqlens"], Q, P, N,
            inp["CB"].stride(0), inp["CB"].stride(2), x.stride(0), x.stride(1), inp["dt_out"].stride(0),
            inp["dt_out"].stride(1), inp["C"].stride(0), st.stride(0), st.stride(1), st.stride(2),
            FACTOR_DECAY=factor, HEADS_PER_PROGRAM=heads, DOT_FP32_OPERANDS=DOT_FP32_OPERANDS,
            FP32_DOT_PRECISION=FP32_DOT_PRECISION, **config, num_warps=warps, num_stages=stages)
    return call


def graph_of(call, launches: int = 20) -> torch.cuda.CUDAGraph:
    call()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            call()
    return graph


def time_graph(graph: torch.cuda.CUDAGraph, launches: int = 20, replays: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=17)
    parser.add_argument("--sweep", action="store_true", help="the shipped kernel at every config of a grid")
    parser.add_argument("--only", default="",
                        help="run the shipped kernel and the variants whose name this regular expression finds")
    args = parser.parse_args(argv)
    inp = prefill_inputs(args.chunks)
    T = inp["x"].shape[0]
    cfg = lambda m, n, k: dict(BLOCK_SIZE_M=m, BLOCK_SIZE_N=n, BLOCK_SIZE_K=k)  # noqa: E731
    variants = {"shipped": lambda out: shipped_call(inp, out)}
    if args.sweep:
        # The shipped kernel at every config of the grid that avoids the sm90 miscompile.
        for m, n, k, w, st in itertools.product((32, 64, 128), (32, 64), (32, 64), (2, 4, 8), (1, 2, 3, 4)):
            config = triton.Config(cfg(m, n, k), num_warps=w, num_stages=st)
            if shipped.miscompiles_on_sm90(config) or (w == 8 and m < 64) or (st == 4 and w != 2):
                continue
            blocks = cfg(m, n, k)
            variants[f"config M{m} N{n} K{k} w{w} s{st}"] = (
                lambda out, c=blocks, w=w, st=st: shipped_raw_call(inp, out, inp["CB"], c, w, st))
    else:
        for m, n, k, w in ((64, 64, 32, 4), (64, 64, 64, 4), (64, 32, 32, 4), (128, 64, 32, 8), (32, 64, 32, 2)):
            blocks = cfg(m, n, k)
            for prefetch in (False, True):
                variants[f"{'prefetch' if prefetch else 'copy'} {m}/{n}/{k} w{w}"] = (
                    lambda out, c=blocks, w=w, p=prefetch: prefetch_call(inp, out, c, w, 1, p))
        cb_bf16 = inp["CB"].bfloat16()
        variants["cb-bf16 64/64/32"] = lambda out: shipped_raw_call(inp, out, cb_bf16, cfg(64, 64, 32), 4, 1)
        for m, k, w in ((64, 32, 4), (64, 64, 4), (128, 64, 8), (128, 32, 8)):
            for factor in (False, True):
                for heads in (1, 2, 4, 8):
                    name = f"{'factor' if factor else 'plain'} heads={heads} {m}/64/{k} w{w}"
                    variants[name] = (lambda out, f=factor, h=heads, m=m, k=k, w=w: variant_call(
                        inp, out, factor=f, heads=h, config=cfg(m, 64, k), warps=w, stages=1))
    outs, graphs, failed, live = {}, {}, {}, []
    for name, make in variants.items():
        if not re.search(args.only, name) and name != "shipped":
            continue
        # Each variant keeps its own output alive: its graph writes there on every replay.
        out = torch.empty(T, H, P, device=DEVICE, dtype=torch.bfloat16)
        print(f"building {name}", flush=True)
        try:
            call = make(out)
            out.zero_()
            call()
            if DEVICE == "cuda":
                torch.cuda.synchronize()
                outs[name] = out.clone()
                graphs[name] = graph_of(call)
                graphs[name].replay()
                torch.cuda.synchronize()
            else:
                outs[name] = out.clone()
            live.append(out)
        except torch.AcceleratorError:
            raise  # the context is lost: nothing after this can run
        except Exception as exc:  # noqa: BLE001 - a lab reports every variant that cannot run
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    times = {name: [] for name in graphs} if DEVICE == "cuda" else {name: [1.0] for name in outs}
    for _ in range(args.rounds if DEVICE == "cuda" else 0):
        for name, graph in graphs.items():
            times[name].append(time_graph(graph))
    ref = outs["shipped"].float()
    scale = ref.abs().max().item()
    print(f"chunks {args.chunks}, tokens {T}; us per launch, median / best of {args.rounds} rounds")
    print(f"{'variant':34s} {'median':>8s} {'best':>8s} {'vs shipped':>10s}  output vs shipped")
    base = statistics.median(times["shipped"])
    for name, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
        o = outs[name]
        same = torch.equal(o.view(torch.int16), outs["shipped"].view(torch.int16))
        diff = "bit-equal" if same else f"max |d| / max |out| = {(o.float() - ref).abs().max().item() / scale:.2e}"
        if not torch.isfinite(o.float()).all():
            diff += " NON-FINITE"
        print(f"{name:34s} {statistics.median(ts):8.2f} {min(ts):8.2f} {statistics.median(ts) / base:10.3f}  {diff}")
    for name, why in failed.items():
        print(f"{name:34s} not run: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
