"""Stage 4: ``CB[c, g, l, s] = sum_n C[t0 + l, g, n] * B[t0 + s, g, n]`` per chunk (docs/architecture.md, stage 4).

The full (Q, Q) matrix (not only its causal half), fp32, zero where l or s lies past the chunk's length. One program
computes a (BLOCK_SIZE_M, BLOCK_SIZE_N) tile of one chunk and group, looping over dstate.

bmm reads only the call's inputs, so ``ssd_prefill`` runs it beside the chunk state kernel (kernels/backend.py):
launched after it (``overlaps_previous``), bmm computes beside it and waits for it at its end instead of its start;
launched before it (``signal_next``), bmm lets it start early. Launched alone it waits first, as every stage kernel
does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import (
    AUTOTUNE_DO_BENCH,
    DOT_FP32_OPERANDS,
    FP32_DOT_PRECISION,
    INTERPRET,
    cdiv,
    check_overlap_flags,
    dot_acc,
    least_overshoot,
    let_next_kernel_start,
    pdl_arguments,
    wait_at_end_if_overlapping,
    wait_unless_overlapping,
)
from kernels.direct_launch import launch
from kernels.interface import INDEX_DTYPES
from kernels.triton_internals import settle_cache_keys
from kernels.tuned_configs import checked_in

# Target shape: dstate 128, chunk 256, ngroups 1: few (chunk, group) pairs on short prefills, so the small tiles
# keep enough programs in flight; BLOCK_SIZE_K >= 16 (tl.dot minimum).
CONFIGS = [
    triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=4),
    triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=2),
    triton.Config({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128}, num_stages=2, num_warps=4),
]


@triton.jit(do_not_specialize=("signal_next", "overlaps_previous"))
def _bmm_chunk_kernel(
    C_ptr,  # (T, G, N) io dtype
    B_ptr,  # (T, G, N) io dtype
    cu_chunk_seqlens_ptr,  # (C + 1,)
    CB_ptr,  # (C, G, Q, Q) fp32
    dstate,
    chunk_size,
    stride_C_token,
    stride_C_group,
    stride_C_dstate,
    stride_B_token,
    stride_B_group,
    stride_B_dstate,
    stride_CB_chunk,
    stride_CB_group,
    stride_CB_m,
    stride_CB_n,
    signal_next,  # nonzero: let the next kernel start early (kernels/backend.py)
    overlaps_previous,  # nonzero: the kernel before it signalled early, and bmm reads nothing it writes
    DOT_FP32_OPERANDS: tl.constexpr,
    FP32_DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    wait_unless_overlapping(overlaps_previous, USE_PDL)
    let_next_kernel_start(signal_next, USE_PDL)
    bmm_tile(C_ptr, B_ptr, cu_chunk_seqlens_ptr, CB_ptr, tl.program_id(axis=0), tl.program_id(axis=1),
             tl.program_id(axis=2), dstate, chunk_size,
             stride_C_token, stride_C_group, stride_C_dstate, stride_B_token, stride_B_group, stride_B_dstate,
             stride_CB_chunk, stride_CB_group, stride_CB_m, stride_CB_n,
             DOT_FP32_OPERANDS, FP32_DOT_PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
    wait_at_end_if_overlapping(overlaps_previous, USE_PDL)


@triton.jit
def bmm_tile(
    C_ptr, B_ptr, cu_chunk_seqlens_ptr, CB_ptr, pid_mn, pid_c, pid_g, dstate, chunk_size,
    stride_C_token, stride_C_group, stride_C_dstate, stride_B_token, stride_B_group, stride_B_dstate,
    stride_CB_chunk, stride_CB_group, stride_CB_m, stride_CB_n,
    DOT_FP32_OPERANDS: tl.constexpr, FP32_DOT_PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    """The (BLOCK_SIZE_M, BLOCK_SIZE_N) tile ``pid_mn`` of chunk ``pid_c`` and group ``pid_g``: this stage's whole
    work for one program, shared with the kernel that runs it beside chunk state's tiles
    (``kernels.chunk_state_bmm``)."""
    num_pid_n = tl.cdiv(chunk_size, BLOCK_SIZE_N)
    pid_m = pid_mn // num_pid_n
    pid_n = pid_mn % num_pid_n
    chunk_start = tl.load(cu_chunk_seqlens_ptr + pid_c).to(tl.int64)
    chunk_len = tl.load(cu_chunk_seqlens_ptr + pid_c + 1).to(tl.int64) - chunk_start

    C_ptr += chunk_start * stride_C_token + pid_g * stride_C_group
    B_ptr += chunk_start * stride_B_token + pid_g * stride_B_group
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    C_ptrs = C_ptr + offs_m[:, None] * stride_C_token + offs_k[None, :] * stride_C_dstate
    B_ptrs = B_ptr + offs_k[:, None] * stride_B_dstate + offs_n[None, :] * stride_B_token

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, dstate, BLOCK_SIZE_K):
        k_mask = offs_k < dstate - k
        c = tl.load(C_ptrs, mask=(offs_m[:, None] < chunk_len) & k_mask[None, :], other=0.0)
        b = tl.load(B_ptrs, mask=k_mask[:, None] & (offs_n[None, :] < chunk_len), other=0.0)
        acc = dot_acc(acc, c, b, DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
        C_ptrs += BLOCK_SIZE_K * stride_C_dstate
        B_ptrs += BLOCK_SIZE_K * stride_B_dstate

    # Rows/columns past the chunk's end were loaded as zeros, so storing the whole (Q, Q) tile writes their zeros.
    CB_ptrs = (
        CB_ptr
        + pid_c.to(tl.int64) * stride_CB_chunk
        + pid_g * stride_CB_group
        + offs_m[:, None] * stride_CB_m
        + offs_n[None, :] * stride_CB_n
    )
    tl.store(CB_ptrs, acc, mask=(offs_m[:, None] < chunk_size) & (offs_n[None, :] < chunk_size))


_prune = checked_in("bmm_chunk", ("chunk_size", "dstate"), least_overshoot(
    BLOCK_SIZE_M="chunk_size", BLOCK_SIZE_N="chunk_size", BLOCK_SIZE_K="dstate"))
bmm_chunk_kernel = triton.autotune(
    configs=CONFIGS, key=["chunk_size", "dstate"], do_bench=AUTOTUNE_DO_BENCH,
    prune_configs_by={"early_config_prune": _prune},
)(_bmm_chunk_kernel)


def interpreter_config(Q: int, N: int) -> dict[str, int]:
    """The blocks this stage runs under the interpreter for chunk size Q and dstate N (the first config left after
    pruning: the interpreter's benchmarker keeps it). There the dot is numpy's, whose rounding depends on the blocks,
    so the kernel that runs bmm beside chunk state (``kernels.chunk_state_bmm``) runs these blocks too."""
    assert INTERPRET, "on the GPU the autotuner chooses"
    return dict(_prune(CONFIGS, dict(chunk_size=Q, dstate=N))[0].kwargs)


def bmm_chunk(C: torch.Tensor, B: torch.Tensor, chunk_size: int, cu_chunk_seqlens: torch.Tensor,
              signal_next: bool = False, overlaps_previous: bool = False) -> torch.Tensor:
    """C, B (T, G, N) io dtype, cu_chunk_seqlens (C + 1,) -> CB (nchunks, G, Q, Q) fp32. ``signal_next``: the next
    kernel may start early; ``overlaps_previous``: only right after a stage launched with ``signal_next`` (the module
    docstring)."""
    T, G, N = C.shape
    assert B.shape == C.shape and B.dtype == C.dtype, (
        f"B: expected {tuple(C.shape)} {C.dtype}, found {tuple(B.shape)} {B.dtype}")
    assert cu_chunk_seqlens.dim() == 1 and cu_chunk_seqlens.dtype in INDEX_DTYPES
    assert chunk_size >= 1 and chunk_size & (chunk_size - 1) == 0, f"chunk_size: power of two, found {chunk_size}"
    nchunks = cu_chunk_seqlens.numel() - 1
    CB = torch.empty(nchunks, G, chunk_size, chunk_size, device=C.device, dtype=torch.float32)
    grid = lambda META: (  # noqa: E731
        cdiv(chunk_size, META["BLOCK_SIZE_M"]) * cdiv(chunk_size, META["BLOCK_SIZE_N"]),
        nchunks,
        G,
    )
    launch(bmm_chunk_kernel, grid, launch_arguments(C, B, cu_chunk_seqlens, CB, signal_next, overlaps_previous))
    return CB


def launch_arguments(C: torch.Tensor, B: torch.Tensor, cu_chunk_seqlens: torch.Tensor, CB: torch.Tensor,
                     signal_next: bool = False, overlaps_previous: bool = False) -> dict:
    """The kernel's arguments by name for these tensors (the launcher's, and the warmup registry's on stand-ins);
    the block sizes come from the autotuner's config."""
    check_overlap_flags(signal_next, overlaps_previous)
    B_strides = B.stride()
    C_strides = C.stride()
    CB_strides = CB.stride()
    return dict(
        C_ptr=C, B_ptr=B, cu_chunk_seqlens_ptr=cu_chunk_seqlens, CB_ptr=CB,
        dstate=C.shape[2], chunk_size=CB.shape[2],
        stride_C_token=C_strides[0], stride_C_group=C_strides[1], stride_C_dstate=C_strides[2],
        stride_B_token=B_strides[0], stride_B_group=B_strides[1], stride_B_dstate=B_strides[2],
        stride_CB_chunk=CB_strides[0], stride_CB_group=CB_strides[1], stride_CB_m=CB_strides[2],
        stride_CB_n=CB_strides[3],
        signal_next=int(signal_next), overlaps_previous=int(overlaps_previous),
        DOT_FP32_OPERANDS=DOT_FP32_OPERANDS,
        FP32_DOT_PRECISION=FP32_DOT_PRECISION,
        **pdl_arguments(),
    )


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
