"""Chunk state and bmm in one launch (docs/architecture.md, stages 2 and 4): the first programs compute bmm's tiles
(``kernels.bmm_chunk.bmm_tile``), the others chunk state's (``kernels.chunk_state.chunk_state_tile``), each with its
stage's own code and blocks, so each tensor gets its stage's bits.

The two stages read only the call's inputs and the cumsum's outputs and write different tensors. Run as two kernels
they overlap anyway (``kernels.plan``'s bmm "before_chunk_state": bmm signals early, chunk state computes beside it);
one kernel places the same programs in the same order with one launch fewer, and its programs wait for the kernel
before them as every stage kernel does.

Fused only where both stages' configs are fixed, so that the tiles are the ones the two kernels would run and the
path that runs them apart (the snapshot path's bmm) gets the same bits: on the GPU where ``kernels.tuned_configs``
has both stages' configs for the shape class and they agree on the warps (the kernel has one warp count; its
pipeline depth is chunk state's, which no value depends on); under the interpreter each stage's interpreter blocks.
Elsewhere ``chunk_state_bmm_config`` is None and ``kernels.ssd`` launches the two kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import bmm_chunk, chunk_state
from kernels.backend import INTERPRET, cdiv, wait_for_previous_kernel
from kernels.bmm_chunk import bmm_tile
from kernels.chunk_state import chunk_state_tile
from kernels.direct_launch import launch
from kernels.triton_internals import settle_cache_keys
from kernels.tuned_configs import checked_in_config, chunk_count_class, device_arch

BLOCKS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K")
# Registers per thread on the GPU: the two parts' code compiles to 130 at the serving shape's few-chunk tiles, chunk
# state's own kernel to 96, and above 128 a multiprocessor holds three programs of four warps instead of four (a
# second wave on a 600-token call). Capped at 128 it compiles without spilling (no stack).
REGISTER_CAP = 128


# The chunk and head counts are grid extents read as scalars: specializing them would only multiply binaries.
@triton.jit(do_not_specialize=("nchunks", "nheads"))
def _chunk_state_bmm_kernel(
    x_ptr,  # (T, H, P) io dtype
    B_ptr,  # (T, G, N) io dtype
    C_ptr,  # (T, G, N) io dtype
    dt_ptr,  # (H, C, Q) fp32
    dA_cumsum_ptr,  # (H, C, Q) fp32
    cu_chunk_seqlens_ptr,  # (C + 1,)
    states_ptr,  # (C, H, P, N) fp32
    CB_ptr,  # (C, G, Q, Q) fp32
    hdim: tl.constexpr,
    dstate: tl.constexpr,
    chunk_size: tl.constexpr,
    nheads_per_group: tl.constexpr,
    ngroups: tl.constexpr,
    nchunks,
    nheads,
    stride_x_token,
    stride_x_head,
    stride_x_hdim,
    stride_B_token,
    stride_B_group,
    stride_B_dstate,
    stride_C_token,
    stride_C_group,
    stride_C_dstate,
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
    stride_CB_chunk,
    stride_CB_group,
    stride_CB_m,
    stride_CB_n,
    DOT_FP32_OPERANDS: tl.constexpr,
    FP32_DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
    STATE_BLOCK_SIZE_M: tl.constexpr,
    STATE_BLOCK_SIZE_N: tl.constexpr,
    STATE_BLOCK_SIZE_K: tl.constexpr,
    BMM_BLOCK_SIZE_M: tl.constexpr,
    BMM_BLOCK_SIZE_N: tl.constexpr,
    BMM_BLOCK_SIZE_K: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    # A 1-D grid: bmm's programs first, in its own grid's order (tiles, then chunks, then groups), so they are placed
    # first and chunk state's fill the places around them; then chunk state's, chunk-major as in its own kernel.
    pid = tl.program_id(axis=0)
    bmm_tiles = tl.cdiv(chunk_size, BMM_BLOCK_SIZE_M) * tl.cdiv(chunk_size, BMM_BLOCK_SIZE_N)
    state_tiles = tl.cdiv(hdim, STATE_BLOCK_SIZE_M) * tl.cdiv(dstate, STATE_BLOCK_SIZE_N)
    bmm_programs = bmm_tiles * nchunks * ngroups
    if pid < bmm_programs:
        bmm_tile(C_ptr, B_ptr, cu_chunk_seqlens_ptr, CB_ptr, pid % bmm_tiles, (pid // bmm_tiles) % nchunks,
                 pid // (bmm_tiles * nchunks), dstate, chunk_size,
                 stride_C_token, stride_C_group, stride_C_dstate, stride_B_token, stride_B_group, stride_B_dstate,
                 stride_CB_chunk, stride_CB_group, stride_CB_m, stride_CB_n,
                 DOT_FP32_OPERANDS, FP32_DOT_PRECISION, BMM_BLOCK_SIZE_M, BMM_BLOCK_SIZE_N, BMM_BLOCK_SIZE_K)
    else:
        place = pid - bmm_programs
        chunk_major = place // state_tiles
        chunk_state_tile(
            x_ptr, B_ptr, dt_ptr, dA_cumsum_ptr, cu_chunk_seqlens_ptr, states_ptr,
            place % state_tiles, chunk_major // nheads, chunk_major % nheads,
            hdim, dstate, chunk_size, nheads_per_group,
            stride_x_token, stride_x_head, stride_x_hdim, stride_B_token, stride_B_group, stride_B_dstate,
            stride_dt_head, stride_dt_chunk, stride_dt_pos, stride_dA_cs_head, stride_dA_cs_chunk, stride_dA_cs_pos,
            stride_states_chunk, stride_states_head, stride_states_hdim, stride_states_dstate,
            DOT_FP32_OPERANDS, FP32_DOT_PRECISION, STATE_BLOCK_SIZE_M, STATE_BLOCK_SIZE_N, STATE_BLOCK_SIZE_K)


def chunk_state_bmm_config(P: int, N: int, Q: int, nchunks: int) -> dict[str, int] | None:
    """The one config a call of this shape and chunk count runs (never autotuned: each part's blocks are its
    stage's fixed ones, module docstring), or None where the two stages are not both fixed: launch them apart."""
    if not INTERPRET:
        arch = device_arch()
        state = checked_in_config("chunk_state", arch, P, N, Q, chunk_count_class(nchunks))
        bmm = checked_in_config("bmm_chunk", arch, Q, N)
        if state is None or bmm is None or state["num_warps"] != bmm["num_warps"]:
            return None
        return {**blocks(state, bmm), "num_warps": state["num_warps"], "num_stages": state["num_stages"],
                "maxnreg": REGISTER_CAP}
    return {**blocks(chunk_state.interpreter_config(P, N, Q), bmm_chunk.interpreter_config(Q, N)),
            "num_warps": 4, "num_stages": 3}


def blocks(state: dict[str, int], bmm: dict[str, int]) -> dict[str, int]:
    """The kernel's block sizes from each stage's config."""
    return {**{f"STATE_{b}": state[b] for b in BLOCKS}, **{f"BMM_{b}": bmm[b] for b in BLOCKS}}


def chunk_state_bmm(B: torch.Tensor, x: torch.Tensor, C: torch.Tensor, dt_out: torch.Tensor, dA_cumsum: torch.Tensor,
                    cu_chunk_seqlens: torch.Tensor, config: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chunk_state(B, x, dt_out, dA_cumsum, cu_chunk_seqlens), bmm_chunk(C, B, Q, cu_chunk_seqlens))`` in one
    launch, under ``config`` (``chunk_state_bmm_config``): states (C, H, P, N) fp32 and CB (C, G, Q, Q) fp32."""
    chunk_state.check_inputs(B, x, dt_out, dA_cumsum)
    assert C.shape == B.shape and C.dtype == B.dtype, (
        f"C: expected {tuple(B.shape)} {B.dtype}, found {tuple(C.shape)} {C.dtype}")
    _, H, P = x.shape
    _, G, N = B.shape
    nchunks, Q = dt_out.shape[1], dt_out.shape[2]
    states = torch.empty(nchunks, H, P, N, device=x.device, dtype=torch.float32)
    CB = torch.empty(nchunks, G, Q, Q, device=x.device, dtype=torch.float32)
    arguments = launch_arguments(B, x, C, dt_out, dA_cumsum, cu_chunk_seqlens, states, CB, config)
    launch(_chunk_state_bmm_kernel, (programs(arguments),), arguments)
    return states, CB


def programs(arguments: dict) -> int:
    """The grid's size: bmm's programs, then chunk state's."""
    Q, P, N = arguments["chunk_size"], arguments["hdim"], arguments["dstate"]
    bmm = cdiv(Q, arguments["BMM_BLOCK_SIZE_M"]) * cdiv(Q, arguments["BMM_BLOCK_SIZE_N"])
    state = cdiv(P, arguments["STATE_BLOCK_SIZE_M"]) * cdiv(N, arguments["STATE_BLOCK_SIZE_N"])
    return arguments["nchunks"] * (bmm * arguments["ngroups"] + state * arguments["nheads"])


def launch_arguments(B: torch.Tensor, x: torch.Tensor, C: torch.Tensor, dt_out: torch.Tensor,
                     dA_cumsum: torch.Tensor, cu_chunk_seqlens: torch.Tensor, states: torch.Tensor, CB: torch.Tensor,
                     config: dict[str, int]) -> dict:
    """The kernel's arguments by name for these tensors and ``config`` (the launcher's, and the warmup registry's
    on stand-ins)."""
    # Both stages' arguments (the B and the sizes they share are the same values), less the overlap flags and the
    # chunk state autotuner's key, which a kernel that always waits first and is never tuned has not.
    arguments = {**bmm_chunk.launch_arguments(C, B, cu_chunk_seqlens, CB),
                 **chunk_state.launch_arguments(B, x, dt_out, dA_cumsum, cu_chunk_seqlens, states)}
    for name in ("signal_next", "overlaps_previous", "chunk_count_class"):
        del arguments[name]
    return dict(arguments, ngroups=B.shape[1], nchunks=states.shape[0], nheads=x.shape[1], **config)


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
