"""Chunk state and state passing in one kernel, for calls of fewer than ``kernels.plan.PAIR_FROM_CHUNKS`` chunks on
either path (docs/architecture.md, stages 2 and 3): the chunk states never leave the chip.

Each program owns one (headdim x dstate) tile of one head and walks the chunks in order: it accumulates the chunk's
state contribution (``kernels.chunk_state.accumulate_tokens``, the chunk state stage's arithmetic, the same code)
and at the chunk's last token block takes the fp32 inter-chunk recurrence step on it
(``kernels.state_passing.recurrence_step``, the indexed state passing's, the same code), storing the workspace row
and, at a sequence's last chunk, its final state into the cache. Run apart, the two stages write the fp32 chunk
states (C x H x P x N) and read them back (``kernels.chunk_state``, then the path's state passing kernel: the plan
for longer calls); the pair's bits are this kernel's (same arithmetic; on the GPU the dot accumulates in the same
order whatever the token block, under the interpreter this kernel runs chunk_state's blocks: ``default_config``).

- initial states (``init_mode``): none (zeros); a dense snapshot, row = sequence (the snapshot path); or the paged
  cache, row = the sequence's slot, masked by ``has_initial_states`` (one sequence: the indexed path). A masked
  row is never read: the slot may hold garbage or NaN.
- workspace rows (``store_entering``): the state *exiting* each chunk (snapshot path), or the state *entering* it
  (row 0 a raw copy of the initial state, no fp32 round trip).
- writeback (``write_cache``): at ``last_chunk_indices[b]`` the state goes to ``state_cache[final_state_indices[b]]``
  in the cache dtype, skipped for negative slots.
- ``read_chunk_states``: the chunk states are read from ``chunk_states`` instead of computed (teacher-forced:
  ``state_passing``, the stage hook that holds the recurrence to the reference bit for bit): the same binary as a
  call of the same dtypes, the token loads masked off.

Which initial states, which rows and whether the cache is written are run-time arguments, not constexprs: one
binary per dtype and alignment class. headdim, dstate and the chunk size are constexprs (one binary per model shape,
as in the chunk state and chunk scan stages); the head-to-group ratio is not, so that the teacher-forced mode's
stand-in tokens (one group) run the binary of a call. Never autotuned (a trial launch of the by-slot mode would
overwrite an aliased initial state; the snapshot path writes final slots): one fixed config per shape class
(``tile_config``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import (
    ARITHMETIC_PROFILE,
    DOT_FP32_OPERANDS,
    FP32_DOT_PRECISION,
    INTERPRET,
    cdiv,
    let_next_kernel_start,
    next_power_of_2,
    pdl_arguments,
    wait_for_previous_kernel,
)
from kernels.chunk_state import accumulate_tokens, check_inputs, interpreter_config
from kernels.direct_launch import launch
from kernels.interface import MASK_DTYPES, kernel_mask, kernel_slots
from kernels.state_passing import check_index, check_state_rows, recurrence_step
from kernels.triton_internals import settle_cache_keys
from kernels.tuned_configs import Measured

INIT_NONE, INIT_DENSE, INIT_BY_SLOT = 0, 1, 2

# Metadata and index tensors are read one scalar at a time; counts and the mode flags are loop bounds and branch
# conditions: specializing on their alignment or value class only multiplies binaries. The state cache is written
# through ``cache_ptr`` once per sequence (one tile, in the step of its last chunk), never read through it: that
# pointer's alignment and its row stride's class would only choose the vector width of that one store, which never
# changes a value stored, while they multiplied the binaries by the cache layout classes a server meets (aligned or
# offset, padded or not). The initial states are read through ``init_ptr`` once per sequence, never per chunk (one
# tile: before the chunk loop for the first sequence, in the step of each later one's first chunk): the paged cache
# by slot on the indexed path, the dense snapshot on the snapshot path. Its alignment and ``stride_init_row``'s
# class would likewise only choose that one load's vector width, never a value loaded, while on the indexed path
# they multiplied the binaries by the same cache layout classes.
SCALAR_ONLY = {
    "do_not_specialize": ("nchunks", "stride_seq_idx", "stride_init_slot", "stride_has_init", "stride_final_idx",
                          "stride_last_chunk", "init_mode", "store_entering", "write_cache", "read_chunk_states",
                          "signal_next", "stride_cache_slot", "stride_init_row"),
    "do_not_specialize_on_alignment": ("cu_chunk_seqlens_ptr", "seq_idx_ptr", "init_slot_ptr", "has_init_ptr",
                                       "final_idx_ptr", "last_chunk_ptr", "cache_ptr", "init_ptr"),
}


@triton.jit
def initial_state(init_ptr, tile, seq, init_slot_ptr, has_init_ptr, stride_init_row, stride_init_slot,
                  stride_has_init, init_mode, mask):
    """Sequence ``seq``'s initial state on this program's tile, raw (the init tensor's dtype); zeros without one."""
    if init_mode == 2:  # INIT_BY_SLOT: mask and slot side by side, the row's load masked by both
        has = tl.load(has_init_ptr + seq.to(tl.int64) * stride_has_init) != 0
        row = tl.where(has, tl.load(init_slot_ptr + seq.to(tl.int64) * stride_init_slot).to(tl.int64), 0)
    else:
        has = init_mode == 1
        row = seq.to(tl.int64)
    return tl.load(init_ptr + row * stride_init_row + tile, mask=mask & has, other=0.0)


@triton.jit
def first_initial_state(init_ptr, tile, first_seq, init_slot_ptr, has_init_ptr, stride_init_row, init_mode, mask):
    """``initial_state`` of the first chunk's sequence ``first_seq``, loaded before the chunk loop. By slot the call
    has one sequence (``chunk_state_passing`` checks it), so its mask and slot are sequence 0's, loaded without
    waiting for ``first_seq``: a warp issues nothing past a load whose address is not ready, and the chain first
    chunk's sequence -> its slot -> the row held the first token loads back by two memory latencies where the dense
    snapshot's row waits for one."""
    return initial_state(init_ptr, tile, first_seq, init_slot_ptr, has_init_ptr, stride_init_row, 0, 0, init_mode,
                         mask)  # zero strides: sequence 0's slot and mask, addresses that do not wait for first_seq


@triton.jit
def writeback_target(last_chunk_ptr, final_idx_ptr, seq, stride_last_chunk, stride_final_idx, write_cache):
    """(sequence ``seq``'s last chunk, its final slot), or (-1, -1) without a writeback: loaded once per sequence,
    when it starts. At each chunk's end, after the workspace store, they would be two chained loads that wait for
    that store (the pointers may alias), in every chunk step of a latency-bound loop."""
    row = seq.to(tl.int64)
    last = tl.load(last_chunk_ptr + row * stride_last_chunk, mask=write_cache != 0, other=-1)
    slot = tl.load(final_idx_ptr + row * stride_final_idx, mask=write_cache != 0, other=-1)
    return last, slot


# Under the interpreter the teacher-forced mode skips its token blocks (all masked), whose loads and dot cost numpy
# work there (several times the rest of the kernel's). On the GPU this is False: no branch in the loop, and one
# binary computes or reads the chunk states.
_SKIP_GIVEN_TOKENS = tl.constexpr(INTERPRET)


@triton.jit
def token_block(acc, x_ptr, B_ptr, dt_c, dA_c, tok, k0, k_mask, offs_m, offs_n, offs_k, hdim, dstate, chunk_size,
                stride_x_token, stride_x_hdim, stride_B_token, stride_B_dstate, stride_dt_pos, stride_dA_pos,
                DOT_FP32_OPERANDS: tl.constexpr, FP32_DOT_PRECISION: tl.constexpr):
    """One block of a chunk's tokens (``k_mask``: those in the chunk, none when the chunk states are given) added to
    the state tile; returns it and the dA cumsum at the chunk's end. ``dt_c``, ``dA_c``: scalar pointers at this
    head's chunk."""
    x = tl.load(x_ptr + offs_m[:, None] * stride_x_hdim + tok[None, :] * stride_x_token,
                mask=(offs_m[:, None] < hdim) & k_mask[None, :], other=0.0)
    b = tl.load(B_ptr + tok[:, None] * stride_B_token + offs_n[None, :] * stride_B_dstate,
                mask=k_mask[:, None] & (offs_n[None, :] < dstate), other=0.0).to(tl.float32)
    dA_last = tl.load(dA_c + (chunk_size - 1) * stride_dA_pos)
    dA_k = tl.load(dA_c + (k0 + offs_k) * stride_dA_pos, mask=k_mask, other=0.0)
    dt_k = tl.load(dt_c + (k0 + offs_k) * stride_dt_pos, mask=k_mask, other=0.0)
    return accumulate_tokens(acc, x, b, dA_last, dA_k, dt_k, DOT_FP32_OPERANDS, FP32_DOT_PRECISION), dA_last


# One loop walks every chunk's token blocks (a persistent matmul's shape: the accumulator is finished and reset on a
# chunk's last block), so loads run ahead across chunk boundaries. A token loop nested in a chunk loop drains its
# software pipeline at every chunk (docs/decisions.md: fused chunk state + state passing).
@triton.jit(**SCALAR_ONLY)
def _chunk_state_passing_kernel(
    x_ptr, B_ptr, dt_ptr, dA_cs_ptr, cu_chunk_seqlens_ptr, seq_idx_ptr, chunk_states_ptr, out_ptr, init_ptr,
    init_slot_ptr, has_init_ptr, cache_ptr, final_idx_ptr, last_chunk_ptr,
    hdim: tl.constexpr, dstate: tl.constexpr, chunk_size: tl.constexpr, nheads_per_group, nchunks,
    stride_x_token, stride_x_head, stride_x_hdim, stride_B_token, stride_B_group, stride_B_dstate,
    stride_dt_head, stride_dt_chunk, stride_dt_pos, stride_dA_head, stride_dA_chunk, stride_dA_pos,
    stride_seq_idx, stride_chunk_states_chunk, stride_chunk_states_head, stride_out_chunk, stride_out_head,
    stride_init_row, stride_init_head, stride_init_slot, stride_has_init, stride_cache_slot, stride_cache_head,
    stride_final_idx, stride_last_chunk, init_mode, store_entering, write_cache, read_chunk_states, signal_next,
    DOT_FP32_OPERANDS: tl.constexpr, FP32_DOT_PRECISION: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    let_next_kernel_start(signal_next, USE_PDL)
    pid_mn = tl.program_id(axis=0)
    pid_h = tl.program_id(axis=1)
    num_pid_n = tl.cdiv(dstate, BLOCK_SIZE_N)
    pid_m = pid_mn // num_pid_n
    pid_n = pid_mn % num_pid_n
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    mask = (offs_m[:, None] < hdim) & (offs_n[None, :] < dstate)
    tile = offs_m[:, None] * dstate + offs_n[None, :]
    x_ptr += pid_h * stride_x_head
    B_ptr += (pid_h // nheads_per_group) * stride_B_group
    dt_ptr += pid_h * stride_dt_head
    dA_cs_ptr += pid_h * stride_dA_head
    chunk_states_ptr += pid_h * stride_chunk_states_head
    out_ptr += pid_h * stride_out_head
    init_ptr += pid_h * stride_init_head
    cache_ptr += pid_h * stride_cache_head
    compute = read_chunk_states == 0  # teacher-forced: every token load is masked off and the given state taken

    prev_seq = tl.load(seq_idx_ptr)
    # The first sequence's initial state is loaded here and first read at the first chunk's end: a read (or the
    # entering row's store) before the loop would hold every warp at that read, until the load returns, before the
    # first token load is issued. Its loads come before the writeback target's, which wait for ``prev_seq``.
    entering = first_initial_state(init_ptr, tile, prev_seq, init_slot_ptr, has_init_ptr, stride_init_row, init_mode,
                                   mask)
    seq_last, seq_slot = writeback_target(last_chunk_ptr, final_idx_ptr, prev_seq, stride_last_chunk,
                                          stride_final_idx, write_cache)
    s = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    blocks = tl.cdiv(chunk_size, BLOCK_SIZE_K)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for it in range(nchunks * blocks):
        c = it // blocks
        k0 = (it - c * blocks) * BLOCK_SIZE_K
        seq = tl.load(seq_idx_ptr + c * stride_seq_idx)  # before the tokens: its latency overlaps theirs
        chunk_start = tl.load(cu_chunk_seqlens_ptr + c).to(tl.int64)
        chunk_len = tl.load(cu_chunk_seqlens_ptr + c + 1).to(tl.int64) - chunk_start
        k_mask = (offs_k < chunk_len - k0) & compute
        tok = chunk_start + k0 + offs_k
        dA_c = dA_cs_ptr + c * stride_dA_chunk
        dt_c = dt_ptr + c * stride_dt_chunk
        if _SKIP_GIVEN_TOKENS:
            dA_last = tl.load(dA_c + (chunk_size - 1) * stride_dA_pos)
            if compute:
                acc, dA_last = token_block(
                    acc, x_ptr, B_ptr, dt_c, dA_c, tok, k0, k_mask, offs_m, offs_n, offs_k, hdim, dstate, chunk_size,
                    stride_x_token, stride_x_hdim, stride_B_token, stride_B_dstate, stride_dt_pos, stride_dA_pos,
                    DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
        else:
            acc, dA_last = token_block(
                acc, x_ptr, B_ptr, dt_c, dA_c, tok, k0, k_mask, offs_m, offs_n, offs_k, hdim, dstate, chunk_size,
                stride_x_token, stride_x_hdim, stride_B_token, stride_B_dstate, stride_dt_pos, stride_dA_pos,
                DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
        if k0 + BLOCK_SIZE_K >= chunk_size:  # the chunk's last block: its state is complete
            if c == 0:
                s = entering.to(tl.float32)
                if store_entering:
                    tl.store(out_ptr + tile, entering.to(out_ptr.dtype.element_ty), mask=mask)
            if seq != prev_seq:
                s = initial_state(init_ptr, tile, seq, init_slot_ptr, has_init_ptr, stride_init_row,
                                  stride_init_slot, stride_has_init, init_mode, mask).to(tl.float32)
                seq_last, seq_slot = writeback_target(last_chunk_ptr, final_idx_ptr, seq, stride_last_chunk,
                                                      stride_final_idx, write_cache)
            prev_seq = seq
            given = tl.load(chunk_states_ptr + c * stride_chunk_states_chunk + tile,
                            mask=mask & (read_chunk_states != 0), other=0.0).to(tl.float32)
            s = recurrence_step(s, tl.where(compute, acc, given), dA_last)
            if store_entering:
                if c + 1 < nchunks:
                    tl.store(out_ptr + (c + 1) * stride_out_chunk + tile, s.to(out_ptr.dtype.element_ty),
                             mask=mask)
            else:
                tl.store(out_ptr + c * stride_out_chunk + tile, s.to(out_ptr.dtype.element_ty), mask=mask)
            if write_cache:
                if seq_last == c:
                    slot = seq_slot.to(tl.int64)
                    if slot >= 0:
                        tl.store(cache_ptr + slot * stride_cache_slot + tile, s.to(cache_ptr.dtype.element_ty),
                                 mask=mask)
            acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)


# The fixed config per shape class (arch, headdim, dstate, chunk size, io dtype's bytes) -> blocks, warps, stages;
# others take ``default_config``. The serving shape on sm90, 16-bit io: the kernel's best summed over the four
# bench workloads. fp32 io: the same tile with half the tokens a step, so that its two pipeline stages fit in shared
# memory (not timed: fp32 io is no serving dtype).
_FUSED = "Fused chunk state + state passing: one flat loop, and its tile"
TUNED: dict[tuple, Measured] = {
    ("sm90", 64, 128, 256, 2): Measured(dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=256, num_warps=8,
                                             num_stages=2), _FUSED, (60, 76, 77)),
    ("sm90", 64, 128, 256, 4): Measured(dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=8,
                                             num_stages=2), _FUSED, (76,)),
}
# sm90's shared memory per block (bytes): a config whose pipelined x and B tiles need more cannot launch.
SHARED_MEMORY_LIMIT = {"sm90": 232448}


def pipelined_tile_bytes(config: dict, io_bytes: int) -> int:
    """Shared memory the software pipeline holds for a config: ``num_stages`` copies of the x (M x K) and B (K x N)
    tiles in the io dtype (Triton adds a little for its own buffers)."""
    m, n, k = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    return config["num_stages"] * (m * k + k * n) * io_bytes


def default_config(P: int, N: int, Q: int) -> dict[str, int]:
    """Blocks that fit the shape (``tl.dot`` needs every block >= 16): on the GPU 64 x 64 tiles and 64 tokens a
    step; under the interpreter the chunk state stage's own blocks (``kernels.chunk_state.interpreter_config``)."""
    if INTERPRET:
        return dict(interpreter_config(P, N, Q), num_warps=4, num_stages=3)
    fit = lambda extent, cap: max(16, min(cap, next_power_of_2(extent)))  # noqa: E731
    return dict(BLOCK_SIZE_M=fit(P, 64), BLOCK_SIZE_N=fit(N, 64), BLOCK_SIZE_K=fit(Q, 64), num_warps=4, num_stages=3)


def tile_config(P: int, N: int, Q: int, io_bytes: int) -> dict[str, int]:
    """The one config this shape and io dtype size run (never autotuned: a trial launch would write final slots)."""
    from kernels.tuned_configs import device_arch

    entry = TUNED.get((device_arch(), P, N, Q, io_bytes))
    return dict(entry.config) if entry is not None else default_config(P, N, Q)


def chunk_state_passing(
    B: torch.Tensor,
    x: torch.Tensor,
    dt_out: torch.Tensor,
    dA_cumsum: torch.Tensor,
    cu_chunk_seqlens: torch.Tensor,
    seq_idx: torch.Tensor,
    *,
    out: torch.Tensor,
    initial_states: torch.Tensor | None = None,
    state_cache: torch.Tensor | None = None,
    initial_state_indices: torch.Tensor | None = None,
    has_initial_states: torch.Tensor | None = None,
    final_state_indices: torch.Tensor | None = None,
    last_chunk_indices: torch.Tensor | None = None,
    chunk_states: torch.Tensor | None = None,
    config: dict | None = None,
    signal_next: bool = False,
) -> None:
    """Each chunk's state contribution and the inter-chunk recurrence, into ``out`` (C, H, P, N).

    B (T, G, N) and x (T, H, P) io dtype; dt_out and dA_cumsum (H, C, Q) fp32; cu_chunk_seqlens (C + 1,), seq_idx
    (C,). Initial states: ``initial_states`` (Bt, H, P, N), a dense snapshot by sequence (``out`` gets exiting
    states); or ``initial_state_indices`` and ``has_initial_states`` (1,) into ``state_cache`` (one sequence; ``out``
    gets entering states and must be in the cache dtype); or neither (zeros, exiting states). Writeback:
    ``final_state_indices`` and ``last_chunk_indices`` (Bt,) with ``state_cache``. ``chunk_states`` (C, H, P, N)
    fp32: read instead of computed. ``config``: blocks, warps and stages (default ``tile_config``). ``signal_next``:
    the next kernel may start early (kernels/backend.py).
    """
    check_inputs(B, x, dt_out, dA_cumsum)
    _, H, P = x.shape
    N = B.shape[2]
    C = dt_out.shape[1]
    check_index("cu_chunk_seqlens", cu_chunk_seqlens, C + 1)
    check_index("seq_idx", seq_idx, C)
    check_state_rows("out", out, H, P, N)
    assert out.shape[0] == C, f"out: expected {C} chunk rows, found {out.shape[0]}"
    by_slot = initial_state_indices is not None
    if by_slot:
        assert initial_states is None, "initial states come from the cache by slot or from a snapshot, not both"
        assert state_cache is not None and has_initial_states is not None, (
            "initial_state_indices: state_cache and has_initial_states are needed too")
        check_index("initial_state_indices", initial_state_indices, 1)
        check_index("has_initial_states", has_initial_states, 1, MASK_DTYPES)
        assert out.dtype == state_cache.dtype, f"out: entering states in the cache dtype {state_cache.dtype}"
    if initial_states is not None:
        check_state_rows("initial_states", initial_states, H, P, N)
        assert initial_states.stride(1) == P * N, (
            f"initial_states: (H, P, N) must be compact, found {initial_states.stride()}")
    write_cache = final_state_indices is not None
    if write_cache:
        assert state_cache is not None and last_chunk_indices is not None, (
            "final_state_indices: state_cache and last_chunk_indices are needed for the writeback")
        batch = final_state_indices.shape[0]
        check_index("final_state_indices", final_state_indices, batch)
        check_index("last_chunk_indices", last_chunk_indices, batch)
    if state_cache is not None:
        check_state_rows("state_cache", state_cache, H, P, N)
        assert state_cache.stride(1) == P * N, f"state_cache: (H, P, N) must be compact, found {state_cache.stride()}"
    if chunk_states is not None:
        assert chunk_states.dtype == torch.float32 and tuple(chunk_states.shape) == (C, H, P, N), (
            f"chunk_states: expected ({C}, {H}, {P}, {N}) fp32, found {tuple(chunk_states.shape)} {chunk_states.dtype}")
        check_state_rows("chunk_states", chunk_states, H, P, N)
    for name, t in (("B", B), ("dt_out", dt_out), ("dA_cumsum", dA_cumsum), ("cu_chunk_seqlens", cu_chunk_seqlens),
                    ("seq_idx", seq_idx), ("out", out), ("initial_states", initial_states),
                    ("state_cache", state_cache), ("initial_state_indices", initial_state_indices),
                    ("has_initial_states", has_initial_states), ("final_state_indices", final_state_indices),
                    ("last_chunk_indices", last_chunk_indices), ("chunk_states", chunk_states)):
        assert t is None or t.device == x.device, f"{name}: on {t.device}, x on {x.device}"
    arguments = launch_arguments(
        B, x, dt_out, dA_cumsum, cu_chunk_seqlens, seq_idx, out=out, initial_states=initial_states,
        state_cache=state_cache, initial_state_indices=initial_state_indices, has_initial_states=has_initial_states,
        final_state_indices=final_state_indices, last_chunk_indices=last_chunk_indices, chunk_states=chunk_states,
        config=config, signal_next=signal_next)
    grid = (cdiv(P, arguments["BLOCK_SIZE_M"]) * cdiv(N, arguments["BLOCK_SIZE_N"]), H)
    launch(_chunk_state_passing_kernel, grid, arguments)


def launch_arguments(B: torch.Tensor, x: torch.Tensor, dt_out: torch.Tensor, dA_cumsum: torch.Tensor,
                     cu_chunk_seqlens: torch.Tensor, seq_idx: torch.Tensor, *, out: torch.Tensor,
                     initial_states: torch.Tensor | None = None, state_cache: torch.Tensor | None = None,
                     initial_state_indices: torch.Tensor | None = None,
                     has_initial_states: torch.Tensor | None = None,
                     final_state_indices: torch.Tensor | None = None,
                     last_chunk_indices: torch.Tensor | None = None,
                     chunk_states: torch.Tensor | None = None, config: dict | None = None,
                     signal_next: bool = False) -> dict:
    """The kernel's arguments by name, config and launch options included (the launcher's, and the warmup
    registry's on stand-ins). Pointers the call does not read or write are filled with placeholders."""
    _, H, P = x.shape
    _, G, N = B.shape
    Q = dt_out.shape[2]
    if initial_state_indices is not None:
        init_mode, init = INIT_BY_SLOT, state_cache
    elif initial_states is not None:
        init_mode, init = INIT_DENSE, initial_states
    else:
        init_mode, init = INIT_NONE, out  # placeholder pointer, never read
    # Placeholders of indices and a mask the call does not read, in the dtypes of the real ones (int32 slots, byte
    # masks): a pointer's dtype is part of the binary's key, so a placeholder of another dtype would compile the
    # same kernel again for the calls without slots. ``out``'s bytes: its last stride is 1 (``check_state_rows``).
    slot = kernel_slots(initial_state_indices) if initial_state_indices is not None else seq_idx
    has = kernel_mask(has_initial_states) if has_initial_states is not None else out.view(torch.uint8)
    write_cache = final_state_indices is not None
    cache = state_cache if write_cache else out  # placeholder pointer, never written
    final_idx = kernel_slots(final_state_indices) if write_cache else seq_idx
    last_chunk = last_chunk_indices if write_cache else seq_idx
    # Unread placeholder: an fp32 tensor with the workspace's strides, so that reading the chunk states (the stage
    # check) and computing them (every call) are one specialization, one binary.
    given = chunk_states if chunk_states is not None else dA_cumsum
    given_strides = chunk_states.stride()[:2] if chunk_states is not None else out.stride()[:2]
    cfg = dict(config) if config is not None else tile_config(P, N, Q, x.element_size())
    B_strides = B.stride()
    dA_cumsum_strides = dA_cumsum.stride()
    dt_out_strides = dt_out.stride()
    x_strides = x.stride()
    out_strides = out.stride()
    init_strides = init.stride()
    cache_strides = cache.stride()
    return dict(
        x_ptr=x, B_ptr=B, dt_ptr=dt_out, dA_cs_ptr=dA_cumsum, cu_chunk_seqlens_ptr=cu_chunk_seqlens,
        seq_idx_ptr=seq_idx, chunk_states_ptr=given, out_ptr=out, init_ptr=init, init_slot_ptr=slot,
        has_init_ptr=has, cache_ptr=cache, final_idx_ptr=final_idx, last_chunk_ptr=last_chunk,
        hdim=P, dstate=N, chunk_size=Q, nheads_per_group=H // G, nchunks=dt_out.shape[1],
        stride_x_token=x_strides[0], stride_x_head=x_strides[1], stride_x_hdim=x_strides[2],
        stride_B_token=B_strides[0], stride_B_group=B_strides[1], stride_B_dstate=B_strides[2],
        stride_dt_head=dt_out_strides[0], stride_dt_chunk=dt_out_strides[1], stride_dt_pos=dt_out_strides[2],
        stride_dA_head=dA_cumsum_strides[0], stride_dA_chunk=dA_cumsum_strides[1], stride_dA_pos=dA_cumsum_strides[2],
        stride_seq_idx=seq_idx.stride(0),
        stride_chunk_states_chunk=given_strides[0], stride_chunk_states_head=given_strides[1],
        stride_out_chunk=out_strides[0], stride_out_head=out_strides[1],
        stride_init_row=init_strides[0], stride_init_head=init_strides[1],
        stride_init_slot=slot.stride(0), stride_has_init=has.stride(0),
        stride_cache_slot=cache_strides[0], stride_cache_head=cache_strides[1],
        stride_final_idx=final_idx.stride(0), stride_last_chunk=last_chunk.stride(0),
        init_mode=init_mode, store_entering=int(init_mode == INIT_BY_SLOT), write_cache=int(write_cache),
        read_chunk_states=int(chunk_states is not None), signal_next=int(signal_next),
        DOT_FP32_OPERANDS=DOT_FP32_OPERANDS,
        FP32_DOT_PRECISION=FP32_DOT_PRECISION,
        **cfg,
        **pdl_arguments(),
    )


# The io dtype of the teacher-forced stand-ins for x and B. The binary depends on it through the dot, which the
# teacher-forced mode skips; the recurrence is fp32 arithmetic whatever the io dtype, one piece of code.
TEACHER_FORCED_IO_DTYPE = torch.bfloat16


def state_passing(
    states: torch.Tensor,
    dA_cumsum: torch.Tensor,
    seq_idx: torch.Tensor,
    *,
    initial_states: torch.Tensor | None = None,
    out_dtype: torch.dtype,
    state_cache: torch.Tensor | None = None,
    final_state_indices: torch.Tensor | None = None,
    last_chunk_indices: torch.Tensor | None = None,
    profile: str | None = None,
) -> torch.Tensor:
    """The state passing stage (docs/architecture.md's contract; the provider's ``stages.state_passing``): the
    exiting state of every chunk, from given chunk states, by this kernel's teacher-forced mode.

    states (C, H, P, N) fp32; dA_cumsum (H, C, Q) fp32; seq_idx (C,) int; initial_states (Bt, H, P, N) or None;
    state_cache (slots, H, P, N) with compact (H, P, N) rows (padded stride(0), storage offset allowed) together
    with final_state_indices (Bt,) and last_chunk_indices (Bt,) int32/int64, possibly strided views.
    ``profile``, when given, must be the arithmetic profile this kernel follows here (``ARITHMETIC_PROFILE``).
    Returns (C, H, P, N) ``out_dtype``.
    """
    if profile is not None and profile != ARITHMETIC_PROFILE:
        raise ValueError(f"profile: this kernel follows {ARITHMETIC_PROFILE!r} here, asked for {profile!r}")
    assert states.dim() == 4 and states.dtype == torch.float32, f"states: expected (C,H,P,N) fp32, found {states.dtype}"
    C, H, P, N = states.shape
    assert dA_cumsum.dim() == 3 and tuple(dA_cumsum.shape[:2]) == (H, C), (
        f"dA_cumsum: expected ({H}, {C}, Q), found {tuple(dA_cumsum.shape)}")
    if state_cache is not None:
        assert final_state_indices is not None and last_chunk_indices is not None, (
            "state_cache: final_state_indices and last_chunk_indices are needed for the writeback")
    B, x, no_tokens = teacher_forced_tokens(C, H, P, N, states.device)
    out = torch.empty((C, H, P, N), dtype=out_dtype, device=states.device)
    chunk_state_passing(B, x, dA_cumsum, dA_cumsum, no_tokens, seq_idx, out=out, initial_states=initial_states,
                        state_cache=state_cache, final_state_indices=final_state_indices,
                        last_chunk_indices=last_chunk_indices, chunk_states=states,
                        config=teacher_forced_config(P, N, dA_cumsum.shape[2]))
    return out


def teacher_forced_tokens(C: int, H: int, P: int, N: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, x, cu_chunk_seqlens) for the teacher-forced mode (its launcher's, and the warmup registry's on the meta
    device): stand-ins for the tokens, never read, since every chunk is empty (``cu_chunk_seqlens`` all zero) and
    every token load masked off."""
    B = torch.zeros((1, 1, N), dtype=TEACHER_FORCED_IO_DTYPE, device=device)
    x = torch.zeros((1, H, P), dtype=TEACHER_FORCED_IO_DTYPE, device=device)
    return B, x, torch.zeros((C + 1,), dtype=torch.int32, device=device)


def teacher_forced_config(P: int, N: int, Q: int) -> dict[str, int]:
    """The tile of the teacher-forced mode: on the GPU a bf16 call's (``tile_config``: the same binary); under the
    interpreter, which pays per program and loop step, a head's whole state and a whole chunk a step (there is no
    dot whose rounding depends on the blocks)."""
    if not INTERPRET:
        return tile_config(P, N, Q, TEACHER_FORCED_IO_DTYPE.itemsize)
    whole = lambda extent: max(16, next_power_of_2(extent))  # noqa: E731
    return dict(BLOCK_SIZE_M=whole(P), BLOCK_SIZE_N=whole(N), BLOCK_SIZE_K=whole(Q), num_warps=4, num_stages=1)


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
