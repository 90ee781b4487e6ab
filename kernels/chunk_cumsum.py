"""Stage 1: dt processing and the per-chunk cumulative sum of dt * A (docs/architecture.md, stage 1).

One program handles BLOCK_SIZE_H heads of one chunk; the whole chunk sits in one block of positions, so the
cumsum is a single ``tl.cumsum`` (its summation order is the kernel's and may follow the config, hence a bounded
stage for ``dA_cumsum``). ``dt_out`` is pure elementwise fp32 with the contract's formula, so it is compared bit for
bit under every config.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernels.backend import (
    AUTOTUNE_DO_BENCH,
    LOG2E,
    USE_LIBDEVICE,
    cdiv,
    let_next_kernel_start,
    next_power_of_2,
    pdl_arguments,
    wait_for_previous_kernel,
)
from kernels.direct_launch import launch
from kernels.interface import INDEX_DTYPES
from kernels.triton_internals import settle_cache_keys
from kernels.tuned_configs import checked_in, checked_in_config, describe, device_arch

# Heads per program and warps: the first is small enough that (BLOCK_SIZE_H, chunk_size=256) fp32 tiles stay in
# registers; kernels.tuned_configs may choose another for a shape class it has measured.
CONFIGS = [triton.Config({"BLOCK_SIZE_H": 8}, num_warps=4), triton.Config({"BLOCK_SIZE_H": 2}, num_warps=4)]
SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # a constexpr: the GPU compiler rejects plain globals in @jit code


@triton.jit
def chunk_cumsum_tile(
    dt_ptr,
    A_ptr,
    dt_bias_ptr,
    cu_chunk_seqlens_ptr,
    dt_out_ptr,
    dA_cumsum_ptr,
    pid_c,
    pid_h,
    nheads,
    chunk_size,
    dt_min,
    dt_max,
    stride_dt_token,
    stride_dt_head,
    stride_A_head,
    stride_dt_bias_head,
    stride_dt_out_head,
    stride_dt_out_chunk,
    stride_dt_out_pos,
    stride_dA_cs_head,
    stride_dA_cs_chunk,
    stride_dA_cs_pos,
    has_dt_bias,
    dt_softplus,
    has_dt_limit,
    LOG1P_LIBDEVICE: tl.constexpr,
    BLOCK_SIZE_H: tl.constexpr,
    BLOCK_SIZE_CHUNK: tl.constexpr,
):
    """The cumsum of chunk ``pid_c`` for the heads of block ``pid_h``: the stage kernel's body, and the cumsum
    programs' of the kernel that also runs the gather's (``kernels.chunk_cumsum_gather``). ``has_dt_bias``,
    ``dt_softplus``, ``has_dt_limit``: run-time branches (``RUNTIME_FLAGS``)."""
    chunk_start = tl.load(cu_chunk_seqlens_ptr + pid_c)
    chunk_len = tl.load(cu_chunk_seqlens_ptr + pid_c + 1) - chunk_start
    dt_ptr += chunk_start.to(tl.int64) * stride_dt_token

    offs_h = pid_h * BLOCK_SIZE_H + tl.arange(0, BLOCK_SIZE_H)
    offs_q = tl.arange(0, BLOCK_SIZE_CHUNK)
    head_mask = offs_h < nheads
    in_chunk = head_mask[:, None] & (offs_q[None, :] < chunk_len)

    # Every load before the first store: the compiler cannot move a load above a store to memory it may alias, and
    # A's load there would add a round trip to each program's chain (cu_chunk_seqlens, then dt, then the stores).
    A = tl.load(A_ptr + offs_h * stride_A_head, mask=head_mask, other=0.0).to(tl.float32)
    dt_ptrs = dt_ptr + offs_q[None, :].to(tl.int64) * stride_dt_token + offs_h[:, None] * stride_dt_head
    dt = tl.load(dt_ptrs, mask=in_chunk, other=0.0).to(tl.float32)
    if has_dt_bias:
        dt_bias = tl.load(dt_bias_ptr + offs_h * stride_dt_bias_head, mask=head_mask, other=0.0).to(tl.float32)
        dt = dt + dt_bias[:, None]
    if dt_softplus:
        exp_dt = tl.math.exp2(dt * LOG2E)
        if LOG1P_LIBDEVICE:
            softplus = libdevice.log1p(exp_dt)
        else:
            softplus = tl.math.log(1.0 + exp_dt)
        dt = tl.where(dt <= SOFTPLUS_THRESHOLD, softplus, dt)
    if has_dt_limit:
        dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
    # Padding positions carry dt = 0 so that dA_cumsum[..., Q - 1] is the chunk-end value.
    dt = tl.where(in_chunk, dt, 0.0)

    # dt_out stored before the scan: Triton then runs the scan in the stores' layout (consecutive positions in each
    # thread: one layout conversion, and fewer shuffles and barriers than a scan in the loads' layout, head-major).
    store_mask = head_mask[:, None] & (offs_q[None, :] < chunk_size)
    tl.store(
        dt_out_ptr + offs_h[:, None] * stride_dt_out_head + pid_c * stride_dt_out_chunk
        + offs_q[None, :] * stride_dt_out_pos,
        dt,
        mask=store_mask,
    )
    dA_cumsum = tl.cumsum(dt * A[:, None], axis=1)
    tl.store(
        dA_cumsum_ptr
        + offs_h[:, None] * stride_dA_cs_head
        + pid_c * stride_dA_cs_chunk
        + offs_q[None, :] * stride_dA_cs_pos,
        dA_cumsum,
        mask=store_mask,
    )


# The dt options only choose which of the tile's steps run: as run-time branches (one binary for every combination,
# each step's arithmetic the same as when it was compiled in alone) instead of constexprs, which compiled one binary
# per combination. Flags and the bias's stride are not specialized: as ints equal to 1 (or a multiple of 16) they
# would be a class of their own each. LOG1P_LIBDEVICE stays a constexpr: it chooses the arithmetic.
RUNTIME_FLAGS = ("has_dt_bias", "dt_softplus", "has_dt_limit", "stride_dt_bias_head")


@triton.jit(do_not_specialize=("signal_next", *RUNTIME_FLAGS))
def _chunk_cumsum_kernel(
    dt_ptr,  # (T, H) any float dtype
    A_ptr,  # (H,) fp32
    dt_bias_ptr,  # (H,) fp32, unused without has_dt_bias
    cu_chunk_seqlens_ptr,  # (C + 1,) int32/int64
    dt_out_ptr,  # (H, C, Q) fp32
    dA_cumsum_ptr,  # (H, C, Q) fp32
    nheads,
    chunk_size,
    dt_min,
    dt_max,
    stride_dt_token,
    stride_dt_head,
    stride_A_head,
    stride_dt_bias_head,
    stride_dt_out_head,
    stride_dt_out_chunk,
    stride_dt_out_pos,
    stride_dA_cs_head,
    stride_dA_cs_chunk,
    stride_dA_cs_pos,
    signal_next,  # nonzero: let the next kernel start early (kernels/backend.py)
    has_dt_bias,
    dt_softplus,
    has_dt_limit,
    LOG1P_LIBDEVICE: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_SIZE_H: tl.constexpr,
    BLOCK_SIZE_CHUNK: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    let_next_kernel_start(signal_next, USE_PDL)
    chunk_cumsum_tile(
        dt_ptr, A_ptr, dt_bias_ptr, cu_chunk_seqlens_ptr, dt_out_ptr, dA_cumsum_ptr,
        tl.program_id(axis=0), tl.program_id(axis=1),
        nheads, chunk_size, dt_min, dt_max, stride_dt_token, stride_dt_head, stride_A_head, stride_dt_bias_head,
        stride_dt_out_head, stride_dt_out_chunk, stride_dt_out_pos, stride_dA_cs_head, stride_dA_cs_chunk,
        stride_dA_cs_pos, has_dt_bias, dt_softplus, has_dt_limit, LOG1P_LIBDEVICE, BLOCK_SIZE_H, BLOCK_SIZE_CHUNK)


def _first_config(configs, named_args, **kwargs):
    """Outside the measured classes the first config, untimed: a stage this small gains less from tuning than its
    extra binaries cost to compile."""
    return configs[:1]


# The autotuner only selects: the checked-in config for a measured class, the first config elsewhere. Its one
# benchmark of that config writes the stage's own outputs, so it is harmless.
chunk_cumsum_kernel = triton.autotune(
    configs=CONFIGS, key=["chunk_size", "nheads"], do_bench=AUTOTUNE_DO_BENCH,
    prune_configs_by={"early_config_prune": checked_in("chunk_cumsum", ("chunk_size", "nheads"), _first_config)},
)(_chunk_cumsum_kernel)


def chunk_cumsum_config(chunk_size: int, nheads: int) -> dict[str, int]:
    """The config the autotuner above runs for this shape, which nothing times: the checked-in one for a measured
    class, else the first (under the interpreter too: its prune keeps the fallback's one config). For the kernel that
    runs the cumsum's programs beside the gather's (``kernels.chunk_cumsum_gather``), whose dA_cumsum must have the
    bits of this kernel's."""
    checked = checked_in_config("chunk_cumsum", device_arch(), chunk_size, nheads)
    return dict(checked) if checked is not None else describe(CONFIGS[0])


def chunk_cumsum(
    dt: torch.Tensor,
    A: torch.Tensor,
    chunk_size: int,
    cu_chunk_seqlens: torch.Tensor,
    *,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    signal_next: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dt (T, H), A (H,) fp32, cu_chunk_seqlens (C + 1,) -> (dA_cumsum (H, C, Q) fp32, dt_out (H, C, Q) fp32).

    dt processing in fp32: + dt_bias, softplus ``log1p(exp(dt))`` where dt <= 20 (under the interpreter
    ``log(1 + exp(dt))``: no log1p there), clamp to dt_limit unless it is (0, inf); dt_out = 0 past the chunk's end.
    ``signal_next``: the next kernel may start early (kernels/backend.py).
    """
    dA_cumsum, dt_out = cumsum_outputs(dt, A, chunk_size, cu_chunk_seqlens, dt_bias)
    H, nchunks = dt_out.shape[0], dt_out.shape[1]

    def grid(meta):
        return (nchunks, cdiv(H, meta["BLOCK_SIZE_H"]))

    launch(chunk_cumsum_kernel, grid, launch_arguments(
        dt, A, cu_chunk_seqlens, dt_out, dA_cumsum, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
        signal_next=signal_next))
    return dA_cumsum, dt_out


def cumsum_outputs(dt: torch.Tensor, A: torch.Tensor, chunk_size: int, cu_chunk_seqlens: torch.Tensor,
                   dt_bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The launcher's checks on its inputs, and its outputs, uninitialized: (dA_cumsum, dt_out), each (H, C, Q)
    fp32."""
    T, H = dt.shape
    assert A.shape == (H,) and A.dtype == torch.float32, f"A: expected ({H},) fp32, found {tuple(A.shape)} {A.dtype}"
    assert dt.dtype.is_floating_point, f"dt: expected a float dtype, found {dt.dtype}"
    assert cu_chunk_seqlens.dim() == 1 and cu_chunk_seqlens.dtype in INDEX_DTYPES
    assert chunk_size >= 1 and chunk_size & (chunk_size - 1) == 0, f"chunk_size: power of two, found {chunk_size}"
    if dt_bias is not None:
        assert dt_bias.shape == (H,), f"dt_bias: expected ({H},), found {tuple(dt_bias.shape)}"
    nchunks = cu_chunk_seqlens.numel() - 1
    dt_out = torch.empty(H, nchunks, chunk_size, device=dt.device, dtype=torch.float32)
    return torch.empty_like(dt_out), dt_out


def launch_arguments(dt: torch.Tensor, A: torch.Tensor, cu_chunk_seqlens: torch.Tensor, dt_out: torch.Tensor,
                     dA_cumsum: torch.Tensor, *, dt_bias: torch.Tensor | None, dt_softplus: bool,
                     dt_limit: tuple[float, float], signal_next: bool = False) -> dict:
    """The kernel's arguments by name for these tensors (the launcher's, and the warmup registry's on stand-ins),
    less the config's. Without dt_bias, A stands in for its pointer (never read) and its stride is 0."""
    H, _, chunk_size = dt_out.shape
    dt_strides = dt.stride()
    dA_cumsum_strides = dA_cumsum.stride()
    dt_out_strides = dt_out.stride()
    return dict(
        dt_ptr=dt, A_ptr=A, dt_bias_ptr=dt_bias if dt_bias is not None else A,
        cu_chunk_seqlens_ptr=cu_chunk_seqlens, dt_out_ptr=dt_out, dA_cumsum_ptr=dA_cumsum,
        nheads=H, chunk_size=chunk_size, dt_min=float(dt_limit[0]), dt_max=float(dt_limit[1]),
        stride_dt_token=dt_strides[0], stride_dt_head=dt_strides[1], stride_A_head=A.stride(0),
        stride_dt_bias_head=dt_bias.stride(0) if dt_bias is not None else 0,
        stride_dt_out_head=dt_out_strides[0], stride_dt_out_chunk=dt_out_strides[1],
        stride_dt_out_pos=dt_out_strides[2],
        stride_dA_cs_head=dA_cumsum_strides[0], stride_dA_cs_chunk=dA_cumsum_strides[1],
        stride_dA_cs_pos=dA_cumsum_strides[2],
        signal_next=int(signal_next),
        has_dt_bias=int(dt_bias is not None),
        dt_softplus=int(bool(dt_softplus)),
        has_dt_limit=int(tuple(dt_limit) != (0.0, math.inf)),
        LOG1P_LIBDEVICE=USE_LIBDEVICE,
        BLOCK_SIZE_CHUNK=next_power_of_2(chunk_size),
        **pdl_arguments(),
    )


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
