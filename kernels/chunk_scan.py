"""Stage 5: the chunk scan output (docs/architecture.md, stage 5).

For token l of chunk c (head h, group g(h)):
``acc = (C[l] . prev) * exp(dA_cs[l]) + sum_{s<=l} cb_scaled[l, s] * x[s]``,
``cb_scaled = (CB[l, s] * exp(dA_cs[l] - dA_cs[s]) * dt_out[s]).to(io dtype)``; ``acc += x[l] * D``;
``acc *= z * sigmoid(z)``; ``out[l] = acc.to(io dtype)``. ``prev`` (cast to the io dtype before the dot, as vLLM
does) is ``states[c]`` when ``states_are_entering``; otherwise ``states[c - 1]`` when chunk c - 1 belongs to the same
sequence, else ``initial_states[seq_idx[c]]`` or zero. One program computes a (BLOCK_SIZE_M tokens x BLOCK_SIZE_N
headdim) tile of one chunk and head.

The model's dimensions (chunk size, headdim, dstate, heads per group) are constexprs: one binary per model shape,
which a server compiles once anyway, with masks and loop bounds known to the compiler (fewer registers, hence more
programs per SM; docs/decisions.md: constexpr model dimensions). Both paths run one binary. Which state enters a
chunk is decided at run time (``prev_chunk_offset``, ``has_initial_states``; neither specialized) and read by a
single load from a selected base pointer. With the choice as constexprs the two paths compile to different code,
and the GPU compiler is then free to lower their fp32 (tf32) dots differently, which gives different bits for the
same operand values on sm90 (docs/decisions.md: one chunk scan binary for both paths): the indexed path must equal
the snapshot path bit for bit, so the arithmetic has to be literally the same code.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import (
    AUTOTUNE_DO_BENCH,
    DOT_FP32_OPERANDS,
    FP32_DOT_PRECISION,
    LOG2E,
    cdiv,
    dot_acc,
    least_overshoot,
    next_power_of_2,
    pdl_arguments,
    wait_for_previous_kernel,
)
from kernels.direct_launch import launch
from kernels.interface import INDEX_DTYPES, STATE_DTYPES
from kernels.triton_internals import settle_cache_keys
from kernels.tuned_configs import checked_in


def miscompiles_on_sm90(config: triton.Config) -> bool:
    """Triton 3.6 lowers ``tl.dot(cb, x)`` (cb in registers) to wgmma and writes NaN/Inf rows on sm90 when
    num_stages > 1, BLOCK_SIZE_M % 64 == 0 and num_warps % 4 == 0 (docs/exactness.md; vLLM drops these configs)."""
    return config.num_stages > 1 and config.kwargs["BLOCK_SIZE_M"] % 64 == 0 and config.num_warps % 4 == 0


# Target shape: headdim 64, dstate 128, chunk 256. Every entry avoids the sm90 miscompile above (checked below and
# in tests). The first two are the fastest of the candidates `python -m harness bench --stages` times on the
# 4256-token prefill (docs/decisions.md: checked-in configs). The 32-wide config is the least oversized one for
# small headdims and chunks (kernels.backend.least_overshoot keeps only it there).
CONFIGS = [
    triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, num_stages=1, num_warps=4),
    triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, num_stages=1, num_warps=4),
    triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}, num_stages=3, num_warps=2),
]
_bad = [c for c in CONFIGS if miscompiles_on_sm90(c)]
if _bad:
    raise RuntimeError(f"chunk_scan CONFIGS contains configs Triton miscompiles on sm90: {_bad}")

# dstate is covered in blocks of at most this many states (one block for the target dstate 128).
MAX_BLOCK_SIZE_DSTATE = 128
# tl.dot needs K >= 16 on the GPU ("Input shapes should have M >= 1, N >= 1 and K >= 16"), even for dstate 8.
MIN_BLOCK_SIZE_DSTATE = 16


def dstate_block(dstate: int) -> int:
    """The dstate block of the (C . prev) dot: a power of two in [16, 128] (masked past dstate)."""
    return max(MIN_BLOCK_SIZE_DSTATE, min(next_power_of_2(dstate), MAX_BLOCK_SIZE_DSTATE))


# D's strides are (1, 0) per head and (P, 1) per channel: not specialized, so both share one binary (the loads are
# a few per program; kernels.warmup needs one D class fewer). The previous-state selectors are runtime values that
# must not be specialized either (0 vs 1 would otherwise compile the two paths differently).
@triton.jit(do_not_specialize=["stride_D_head", "stride_D_hdim", "prev_chunk_offset", "has_initial_states"])
def _chunk_scan_kernel(
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
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    CB_ptrs = CB_ptr + offs_m[:, None] * stride_CB_m + offs_k[None, :] * stride_CB_k
    x_ptrs = x_ptr + offs_k[:, None] * stride_x_token + offs_n[None, :] * stride_x_hdim
    dt_ptrs = dt_ptr + offs_k * stride_dt_pos
    dA_cs_ptrs = dA_cumsum_ptr + offs_k * stride_dA_cs_pos
    k_max = tl.minimum((pid_m + 1) * BLOCK_SIZE_M, chunk_len)
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


chunk_scan_kernel = triton.autotune(
    configs=CONFIGS, key=["chunk_size", "hdim", "dstate"], do_bench=AUTOTUNE_DO_BENCH,
    prune_configs_by={"early_config_prune": checked_in("chunk_scan", ("chunk_size", "hdim", "dstate"), least_overshoot(
        BLOCK_SIZE_M="chunk_size", BLOCK_SIZE_N="hdim", BLOCK_SIZE_K="chunk_size"))},
)(_chunk_scan_kernel)


def chunk_scan(
    CB: torch.Tensor,
    x: torch.Tensor,
    dt_out: torch.Tensor,
    dA_cumsum: torch.Tensor,
    C: torch.Tensor,
    states: torch.Tensor,
    cu_chunk_seqlens: torch.Tensor,
    seq_idx: torch.Tensor,
    *,
    out: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    states_are_entering: bool = False,
) -> None:
    """Write out (T, H, P) io dtype from CB (nchunks, G, Q, Q) fp32, x (T, H, P), dt_out and dA_cumsum (H, nchunks, Q)
    fp32, C (T, G, N), states (nchunks, H, P, N) state dtype, cu_chunk_seqlens (nchunks + 1,), seq_idx (nchunks,);
    optional D (H,) or (H, P), z (T, H, P), initial_states (Bt, H, P, N) state dtype."""
    T, H, P = x.shape
    nchunks, G, Q, _ = CB.shape
    N = C.shape[-1]
    io = x.dtype
    assert CB.shape == (nchunks, G, Q, Q) and CB.dtype == torch.float32, (
        f"CB: expected (C, G, Q, Q) fp32, found {tuple(CB.shape)} {CB.dtype}")
    assert C.shape == (T, G, N) and C.dtype == io, f"C: expected ({T}, {G}, N) {io}, found {tuple(C.shape)} {C.dtype}"
    assert H % G == 0, f"nheads {H} must be a multiple of ngroups {G}"
    for name, t in (("dt_out", dt_out), ("dA_cumsum", dA_cumsum)):
        assert t.shape == (H, nchunks, Q) and t.dtype == torch.float32, (
            f"{name}: expected ({H}, {nchunks}, {Q}) fp32, found {tuple(t.shape)} {t.dtype}")
    assert states.shape == (nchunks, H, P, N) and states.dtype in STATE_DTYPES, (
        f"states: expected ({nchunks}, {H}, {P}, {N}), found {tuple(states.shape)} {states.dtype}")
    assert cu_chunk_seqlens.shape == (nchunks + 1,) and cu_chunk_seqlens.dtype in INDEX_DTYPES
    assert seq_idx.shape == (nchunks,) and seq_idx.dtype in INDEX_DTYPES
    assert out.shape == x.shape and out.dtype == io, (
        f"out: expected {tuple(x.shape)} {io}, found {tuple(out.shape)} {out.dtype}")
    if z is not None:
        assert z.shape == x.shape and z.dtype == io, (
            f"z: expected {tuple(x.shape)} {io}, found {tuple(z.shape)} {z.dtype}")
    if D is not None:
        assert D.shape in ((H,), (H, P)), f"D: expected ({H},) or ({H}, {P}), found {tuple(D.shape)}"
    if initial_states is not None:
        assert initial_states.dim() == 4 and initial_states.shape[1:] == (H, P, N), (
            f"initial_states: expected (Bt, {H}, {P}, {N}), found {tuple(initial_states.shape)}")
        # One load reads either tensor (see the module docstring), so they share dtype and inner strides.
        assert initial_states.dtype == states.dtype, (
            f"initial_states: expected {states.dtype} like states, found {initial_states.dtype}")
        assert initial_states.stride()[2:] == states.stride()[2:], (
            f"initial_states: expected inner strides {states.stride()[2:]} like states, "
            f"found {initial_states.stride()[2:]}")
    assert not (states_are_entering and initial_states is not None), "entering states already hold the initial states"

    grid = lambda META: (cdiv(Q, META["BLOCK_SIZE_M"]) * cdiv(P, META["BLOCK_SIZE_N"]), nchunks, H)  # noqa: E731
    launch(chunk_scan_kernel, grid, launch_arguments(
        CB, x, dt_out, dA_cumsum, C, states, cu_chunk_seqlens, seq_idx, out=out, D=D, z=z,
        initial_states=initial_states, states_are_entering=states_are_entering))


def launch_arguments(CB: torch.Tensor, x: torch.Tensor, dt_out: torch.Tensor, dA_cumsum: torch.Tensor,
                     C: torch.Tensor, states: torch.Tensor, cu_chunk_seqlens: torch.Tensor, seq_idx: torch.Tensor, *,
                     out: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
                     initial_states: torch.Tensor | None, states_are_entering: bool) -> dict:
    """The kernel's arguments by name for these tensors (the launcher's, and the warmup registry's on stand-ins);
    the block sizes other than dstate's come from the autotuner's config. Absent z, D or initial states are
    pointer placeholders of the same dtype (never read) with zero strides; D (H,) has stride 0 along headdim."""
    _, G, Q, _ = CB.shape
    _, H, P = x.shape
    N = C.shape[-1]
    init = initial_states if initial_states is not None else states
    z_arg = z if z is not None else x
    D_arg = D if D is not None else dt_out
    C_strides = C.stride()
    CB_strides = CB.stride()
    dA_cumsum_strides = dA_cumsum.stride()
    dt_out_strides = dt_out.stride()
    out_strides = out.stride()
    states_strides = states.stride()
    x_strides = x.stride()
    return dict(
        CB_ptr=CB, x_ptr=x, z_ptr=z_arg, out_ptr=out, dt_ptr=dt_out, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx,
        C_ptr=C, states_ptr=states, D_ptr=D_arg, initial_states_ptr=init, cu_chunk_seqlens_ptr=cu_chunk_seqlens,
        prev_chunk_offset=0 if states_are_entering else 1,
        has_initial_states=int(initial_states is not None),
        chunk_size=Q, hdim=P, dstate=N, nheads_per_group=H // G,
        stride_CB_chunk=CB_strides[0], stride_CB_group=CB_strides[1], stride_CB_m=CB_strides[2],
        stride_CB_k=CB_strides[3],
        stride_x_token=x_strides[0], stride_x_head=x_strides[1], stride_x_hdim=x_strides[2],
        stride_z_token=z.stride(0) if z is not None else 0,
        stride_z_head=z.stride(1) if z is not None else 0,
        stride_z_hdim=z.stride(2) if z is not None else 0,
        stride_out_token=out_strides[0], stride_out_head=out_strides[1], stride_out_hdim=out_strides[2],
        stride_dt_head=dt_out_strides[0], stride_dt_chunk=dt_out_strides[1], stride_dt_pos=dt_out_strides[2],
        stride_dA_cs_head=dA_cumsum_strides[0], stride_dA_cs_chunk=dA_cumsum_strides[1],
        stride_dA_cs_pos=dA_cumsum_strides[2],
        stride_C_token=C_strides[0], stride_C_group=C_strides[1], stride_C_dstate=C_strides[2],
        stride_states_chunk=states_strides[0], stride_states_head=states_strides[1],
        stride_states_hdim=states_strides[2], stride_states_dstate=states_strides[3],
        stride_init_batch=initial_states.stride(0) if initial_states is not None else 0,
        stride_init_head=initial_states.stride(1) if initial_states is not None else 0,
        stride_D_head=D.stride(0) if D is not None else 0,
        stride_D_hdim=D.stride(1) if D is not None and D.dim() == 2 else 0,
        HAS_D=D is not None,
        HAS_Z=z is not None,
        DOT_FP32_OPERANDS=DOT_FP32_OPERANDS,
        FP32_DOT_PRECISION=FP32_DOT_PRECISION,
        BLOCK_SIZE_DSTATE=dstate_block(N),
        **pdl_arguments(),
    )


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
