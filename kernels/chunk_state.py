"""Stage 2: each chunk's own state contribution (docs/architecture.md, stage 2).

``states[c, h, p, n] = sum_l x[l, h, p] * b_scaled[l, n]`` with
``b_scaled = (B[l, g(h), n] * (exp(dA_cs[h, c, Q-1] - dA_cs[h, c, l]) * dt_out[h, c, l])).to(io dtype)``
(the decay-times-dt scale is formed first, as vLLM does), accumulated in fp32 by ``tl.dot``. One program computes a
(BLOCK_SIZE_M headdim x BLOCK_SIZE_N dstate) tile of one chunk and head, looping over the chunk's tokens.

The model's dimensions are constexprs, as in the chunk scan (``kernels.chunk_scan``): one binary per model shape,
with masks and loop bounds known to the compiler and fewer registers (docs/decisions.md: constexpr model
dimensions), the same bits.
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
    LOG2E,
    cdiv,
    dot_acc,
    least_overshoot,
    pdl_arguments,
    wait_at_end_if_overlapping,
    wait_unless_overlapping,
)
from kernels.direct_launch import launch
from kernels.interface import INDEX_DTYPES
from kernels.triton_internals import settle_cache_keys
from kernels.tuned_configs import checked_in, chunk_count_class

# Target shape: headdim 64, dstate 128, chunk 256. BLOCK_SIZE_K >= 16 (tl.dot minimum).
CONFIGS = [
    triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}, num_stages=3, num_warps=4),
    triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=3, num_warps=4),
    triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=4, num_warps=2),
    triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64}, num_stages=2, num_warps=8),
]


@triton.jit
def accumulate_tokens(acc, x, b, dA_cs_last, dA_cs_k, dt_k, DOT_FP32_OPERANDS: tl.constexpr,
                      FP32_DOT_PRECISION: tl.constexpr):
    """One block of a chunk's tokens added to its state tile: B scaled by ``exp(dA_last - dA_k) * dt_k`` in fp32,
    rounded to x's dtype, then the dot. The one copy of this stage's arithmetic, shared with the fused chunk state
    + state passing kernel (``kernels.chunk_state_passing``), so that both give the same bits."""
    scale = tl.math.exp2((dA_cs_last - dA_cs_k) * LOG2E) * dt_k
    b = (b * scale[:, None]).to(x.dtype)
    return dot_acc(acc, x, b, DOT_FP32_OPERANDS, FP32_DOT_PRECISION)


# chunk_count_class is read by the autotuner only (its key), overlaps_previous is a branch: specializing them would
# only multiply binaries.
@triton.jit(do_not_specialize=("chunk_count_class", "overlaps_previous"))
def _chunk_state_kernel(
    x_ptr,  # (T, H, P) io dtype
    B_ptr,  # (T, G, N) io dtype
    dt_ptr,  # (H, C, Q) fp32
    dA_cumsum_ptr,  # (H, C, Q) fp32
    cu_chunk_seqlens_ptr,  # (C + 1,)
    states_ptr,  # (C, H, P, N) fp32
    hdim: tl.constexpr,
    dstate: tl.constexpr,
    chunk_size: tl.constexpr,
    nheads_per_group: tl.constexpr,
    chunk_count_class,  # kernels.tuned_configs.chunk_count_class(C): the grid's size class, for the config choice
    stride_x_token,
    stride_x_head,
    stride_x_hdim,
    stride_B_token,
    stride_B_group,
    stride_B_dstate,
    stride_dt_head,
    stride_dt_chunk,
    stride_dt_pos,
    stride_dA_cs_head,
    stride_dA_cs_chunk,
    stride_dA_cs_pos,
    stride_states_chunk,
    stride_states_head,
    stride_states_hdim,
    stride_states_dstate,
    overlaps_previous,  # nonzero: the kernel before it signalled early, and this one reads nothing it writes
    DOT_FP32_OPERANDS: tl.constexpr,
    FP32_DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    wait_unless_overlapping(overlaps_previous, USE_PDL)
    # The grid is (tiles, chunks, heads). Programs start in launch order, and this one takes the tile of that place
    # in chunk-major order: every head of a chunk, then the next chunk, so the programs running at once share their
    # chunk's B rows, and the call's last chunk, often short, runs last.
    chunk_major = tl.program_id(axis=2) * tl.num_programs(axis=1) + tl.program_id(axis=1)
    chunk_state_tile(
        x_ptr, B_ptr, dt_ptr, dA_cumsum_ptr, cu_chunk_seqlens_ptr, states_ptr,
        tl.program_id(axis=0), chunk_major // tl.num_programs(axis=2), chunk_major % tl.num_programs(axis=2),
        hdim, dstate, chunk_size, nheads_per_group,
        stride_x_token, stride_x_head, stride_x_hdim, stride_B_token, stride_B_group, stride_B_dstate,
        stride_dt_head, stride_dt_chunk, stride_dt_pos, stride_dA_cs_head, stride_dA_cs_chunk, stride_dA_cs_pos,
        stride_states_chunk, stride_states_head, stride_states_hdim, stride_states_dstate,
        DOT_FP32_OPERANDS, FP32_DOT_PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
    wait_at_end_if_overlapping(overlaps_previous, USE_PDL)


@triton.jit
def chunk_state_tile(
    x_ptr, B_ptr, dt_ptr, dA_cumsum_ptr, cu_chunk_seqlens_ptr, states_ptr,
    pid_mn, pid_c, pid_h,
    hdim: tl.constexpr, dstate: tl.constexpr, chunk_size: tl.constexpr, nheads_per_group: tl.constexpr,
    stride_x_token, stride_x_head, stride_x_hdim, stride_B_token, stride_B_group, stride_B_dstate,
    stride_dt_head, stride_dt_chunk, stride_dt_pos, stride_dA_cs_head, stride_dA_cs_chunk, stride_dA_cs_pos,
    stride_states_chunk, stride_states_head, stride_states_hdim, stride_states_dstate,
    DOT_FP32_OPERANDS: tl.constexpr, FP32_DOT_PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    """The (BLOCK_SIZE_M headdim x BLOCK_SIZE_N dstate) tile ``pid_mn`` of chunk ``pid_c`` and head ``pid_h``: this
    stage's whole work for one program, shared with the kernel that runs bmm's tiles beside it
    (``kernels.chunk_state_bmm``)."""
    num_pid_n = tl.cdiv(dstate, BLOCK_SIZE_N)
    pid_m = pid_mn // num_pid_n
    pid_n = pid_mn % num_pid_n
    chunk_start = tl.load(cu_chunk_seqlens_ptr + pid_c).to(tl.int64)
    chunk_len = tl.load(cu_chunk_seqlens_ptr + pid_c + 1).to(tl.int64) - chunk_start
    group = pid_h // nheads_per_group

    x_ptr += chunk_start * stride_x_token + pid_h * stride_x_head
    B_ptr += chunk_start * stride_B_token + group * stride_B_group
    dt_ptr += pid_h * stride_dt_head + pid_c * stride_dt_chunk
    dA_cumsum_ptr += pid_h * stride_dA_cs_head + pid_c * stride_dA_cs_chunk

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_x_hdim + offs_k[None, :] * stride_x_token
    B_ptrs = B_ptr + offs_k[:, None] * stride_B_token + offs_n[None, :] * stride_B_dstate
    dt_ptrs = dt_ptr + offs_k * stride_dt_pos
    dA_cs_ptrs = dA_cumsum_ptr + offs_k * stride_dA_cs_pos
    # Padding positions repeat the chunk-end value, so Q - 1 is the end of short chunks too.
    dA_cs_last = tl.load(dA_cumsum_ptr + (chunk_size - 1) * stride_dA_cs_pos)

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, chunk_len, BLOCK_SIZE_K):
        k_mask = offs_k < chunk_len - k
        # x is read once here: streamed out of L2 first, so that the chunk states this kernel writes stay there for
        # the state passing, which reads them next (docs/decisions.md: L2 eviction hints). A hint on what L2 keeps;
        # the same values.
        x = tl.load(x_ptrs, mask=(offs_m[:, None] < hdim) & k_mask[None, :], other=0.0,
                    eviction_policy="evict_first")
        b = tl.load(B_ptrs, mask=k_mask[:, None] & (offs_n[None, :] < dstate), other=0.0).to(tl.float32)
        dA_cs_k = tl.load(dA_cs_ptrs, mask=k_mask, other=0.0)
        dt_k = tl.load(dt_ptrs, mask=k_mask, other=0.0)
        acc = accumulate_tokens(acc, x, b, dA_cs_last, dA_cs_k, dt_k, DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
        x_ptrs += BLOCK_SIZE_K * stride_x_token
        B_ptrs += BLOCK_SIZE_K * stride_B_token
        dt_ptrs += BLOCK_SIZE_K * stride_dt_pos
        dA_cs_ptrs += BLOCK_SIZE_K * stride_dA_cs_pos

    states_ptrs = (
        states_ptr
        + pid_c.to(tl.int64) * stride_states_chunk
        + pid_h * stride_states_head
        + offs_m[:, None] * stride_states_hdim
        + offs_n[None, :] * stride_states_dstate
    )
    tl.store(states_ptrs, acc, mask=(offs_m[:, None] < hdim) & (offs_n[None, :] < dstate))


_prune = checked_in("chunk_state", ("hdim", "dstate", "chunk_size", "chunk_count_class"),
                    least_overshoot(BLOCK_SIZE_M="hdim", BLOCK_SIZE_N="dstate", BLOCK_SIZE_K="chunk_size"))
chunk_state_kernel = triton.autotune(
    configs=CONFIGS, key=["hdim", "dstate", "chunk_size", "chunk_count_class"], do_bench=AUTOTUNE_DO_BENCH,
    prune_configs_by={"early_config_prune": _prune},
)(_chunk_state_kernel)


def interpreter_config(P: int, N: int, Q: int) -> dict[str, int]:
    """The blocks this stage runs under the interpreter for headdim P, dstate N and chunk size Q (the first config
    left after pruning: the interpreter's benchmarker keeps it). There the dot is numpy's, whose rounding depends on
    the blocks, so the fused kernel runs these blocks too to give this stage's bits."""
    assert INTERPRET, "on the GPU the autotuner chooses"
    sizes = dict(hdim=P, dstate=N, chunk_size=Q, chunk_count_class=0)
    return dict(_prune(CONFIGS, sizes)[0].kwargs)


def chunk_state(
    B: torch.Tensor,
    x: torch.Tensor,
    dt_out: torch.Tensor,
    dA_cumsum: torch.Tensor,
    cu_chunk_seqlens: torch.Tensor,
    overlaps_previous: bool = False,
) -> torch.Tensor:
    """B (T, G, N), x (T, H, P), dt_out and dA_cumsum (H, C, Q) fp32, cu_chunk_seqlens (C + 1,)
    -> states (C, H, P, N) fp32. ``overlaps_previous``: only right after a kernel launched with ``signal_next``
    that writes nothing this one reads (kernels/backend.py)."""
    check_inputs(B, x, dt_out, dA_cumsum)
    _, H, P = x.shape
    N = B.shape[2]
    C = dt_out.shape[1]
    assert cu_chunk_seqlens.shape == (C + 1,) and cu_chunk_seqlens.dtype in INDEX_DTYPES
    states = torch.empty(C, H, P, N, device=x.device, dtype=torch.float32)
    grid = lambda META: (cdiv(P, META["BLOCK_SIZE_M"]) * cdiv(N, META["BLOCK_SIZE_N"]), C, H)  # noqa: E731
    launch(chunk_state_kernel, grid, launch_arguments(B, x, dt_out, dA_cumsum, cu_chunk_seqlens, states,
                                                       overlaps_previous))
    return states


def check_inputs(B: torch.Tensor, x: torch.Tensor, dt_out: torch.Tensor, dA_cumsum: torch.Tensor) -> None:
    """B (T, G, N) in x's dtype, x (T, H, P) with G dividing H, dt_out and dA_cumsum (H, C, Q) fp32: what this
    stage's dot reads."""
    T, H, _ = x.shape
    _, G, _ = B.shape
    Hd = dt_out.shape[0]
    assert B.shape[0] == T and B.dtype == x.dtype, (
        f"B: expected ({T}, G, N) {x.dtype}, found {tuple(B.shape)} {B.dtype}")
    assert H % G == 0, f"nheads {H} must be a multiple of ngroups {G}"
    assert Hd == H and dt_out.dtype == torch.float32, f"dt_out: expected ({H}, C, Q) fp32"
    assert dA_cumsum.shape == dt_out.shape and dA_cumsum.dtype == torch.float32, (
        "dA_cumsum: expected dt_out's shape, fp32")


def launch_arguments(B: torch.Tensor, x: torch.Tensor, dt_out: torch.Tensor, dA_cumsum: torch.Tensor,
                     cu_chunk_seqlens: torch.Tensor, states: torch.Tensor, overlaps_previous: bool = False) -> dict:
    """The kernel's arguments by name for these tensors (the launcher's, and the warmup registry's on stand-ins);
    the block sizes come from the autotuner's config."""
    _, H, P = x.shape
    _, G, N = B.shape
    B_strides = B.stride()
    dA_cumsum_strides = dA_cumsum.stride()
    dt_out_strides = dt_out.stride()
    states_strides = states.stride()
    x_strides = x.stride()
    return dict(
        x_ptr=x, B_ptr=B, dt_ptr=dt_out, dA_cumsum_ptr=dA_cumsum, cu_chunk_seqlens_ptr=cu_chunk_seqlens,
        states_ptr=states,
        hdim=P, dstate=N, chunk_size=dt_out.shape[2], nheads_per_group=H // G,
        chunk_count_class=chunk_count_class(states.shape[0]),
        stride_x_token=x_strides[0], stride_x_head=x_strides[1], stride_x_hdim=x_strides[2],
        stride_B_token=B_strides[0], stride_B_group=B_strides[1], stride_B_dstate=B_strides[2],
        stride_dt_head=dt_out_strides[0], stride_dt_chunk=dt_out_strides[1], stride_dt_pos=dt_out_strides[2],
        stride_dA_cs_head=dA_cumsum_strides[0], stride_dA_cs_chunk=dA_cumsum_strides[1],
        stride_dA_cs_pos=dA_cumsum_strides[2],
        stride_states_chunk=states_strides[0], stride_states_head=states_strides[1],
        stride_states_hdim=states_strides[2], stride_states_dstate=states_strides[3],
        overlaps_previous=int(overlaps_previous),
        DOT_FP32_OPERANDS=DOT_FP32_OPERANDS,
        FP32_DOT_PRECISION=FP32_DOT_PRECISION,
        **pdl_arguments(),
    )


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
