"""State passing (stage 3): the inter-chunk recurrence over the chunk states, snapshot path.

Per head and state element, in fp32: at the first chunk of sequence ``b`` the state is ``initial_states[b]`` (or 0);
then ``s = exp2(LOG2E * dA_cs[h, c, Q-1]) * s + states[c]`` and ``out[c] = s`` (the state *exiting* chunk c).
The multiply-add is written as one expression so that Triton contracts it into an FMA on CUDA, which equals
``torch.addcmul`` bit for bit (docs/exactness.md); the interpreter does not fuse (the ``interpreter`` profile).

Optional direct writeback: at ``last_chunk_indices[b]`` the state is also stored into
``state_cache[final_state_indices[b]]`` in the cache dtype, skipped for negative slots.

Autotuned over BLOCK_SIZE. That is safe here: the kernel reads only the dense snapshot (``initial_states``), never
the cache, and every trial overwrites ``out`` and the final cache slots with the same values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import (
    ARITHMETIC_PROFILE,
    AUTOTUNE_DO_BENCH,
    INTERPRET,
    LOG2E,
    least_overshoot,
    pdl_arguments,
    wait_for_previous_kernel,
)
from kernels.interface import INDEX_DTYPES
from kernels.tuned_configs import checked_in

# Kernels may only read constexpr globals.
_LOG2E = tl.constexpr(LOG2E)
# Chunks whose rows each program reads at once (the loops are written out for four).
READ_AHEAD = tl.constexpr(4)

# The candidates measured on the serving shape that came within noise of the best (docs/gpu-runs.md): 64 and 128
# launch too many programs, 2048 too few, and 1024 keeps up only with 8 warps (the serving class's checked-in
# config, kernels.tuned_configs). Few configs keep the tuner (and its guard tests) in play at a fraction of a long
# list's compiles (the suite warms every config it can pick).
CONFIGS = [triton.Config({"BLOCK_SIZE": bs}) for bs in (256, 512)] + [triton.Config({"BLOCK_SIZE": 1024}, num_warps=8)]
# The interpreter pays per program, not per element: there, blocks up to a whole head's row as well, of which
# least_overshoot keeps those that fit the row and kernels.tuned_configs.checked_in tries the largest first (one call
# on the serving shape: 6.4 s in blocks of 1024, 1.0 s in one block). The recurrence is elementwise: every block
# gives the same bits.
if INTERPRET:
    CONFIGS += [triton.Config({"BLOCK_SIZE": 1 << k}) for k in range(11, 17)]

# Metadata and index tensors are read one scalar at a time, nchunks is a loop bound: specializing on their
# alignment or value class only multiplies binaries, so they are compiled once for all classes.
SCALAR_ONLY = {
    "do_not_specialize": ("nchunks", "stride_seq_idx", "stride_final_idx", "stride_last_chunk"),
    "do_not_specialize_on_alignment": ("seq_idx_ptr", "final_idx_ptr", "last_chunk_ptr"),
}


@triton.jit
def grouped_chunks(nchunks):
    """Where the kernels' first loop ends: it runs whole groups of ``READ_AHEAD`` chunks, none past the last chunk,
    so it reads without masks; the 0-3 chunks after them go one at a time through the second loop (a one-chunk call
    then reads one row and runs one step, not four)."""
    return nchunks - nchunks % READ_AHEAD


@triton.jit
def chunk_row(ptr, c, stride_chunk):
    """The scalar pointer ``c`` chunks past the scalar ``ptr``, in int64 (chunks x stride can pass 2**31 elements).
    The kernels form every row's pointer from scalars at its load or store, so their loops carry no pointer tensor:
    one carried through both loops has its layout converted between them (through shared memory, with more
    registers). Within a group of chunks the offsets from its first (at most ``READ_AHEAD`` strides) stay int32."""
    return ptr + tl.cast(c, tl.int64) * stride_chunk


@triton.jit
def load_chunk(states_ptr, dA_cs_ptr, offs, mask):
    """A chunk's state contribution (fp32) and the dA cumsum at its end, from scalar pointers at that chunk (this
    program's head; for dA the chunk's last position)."""
    new = tl.load(states_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dA_end = tl.load(dA_cs_ptr).to(tl.float32)
    return new, dA_end


@triton.jit
def load_chunks_ahead(states_ptr, dA_cs_ptr, offs, mask, first, stride_states_chunk, stride_dA_chunk):
    """The ``READ_AHEAD`` (four) chunks from ``first``, each as ``load_chunk``, all issued before any of their steps:
    one group of the kernels' first loop (whole groups only, so none is past the last chunk). One 64-bit product
    per group, not per chunk: fewer registers."""
    states_ptr = chunk_row(states_ptr, first, stride_states_chunk)
    dA_cs_ptr = chunk_row(dA_cs_ptr, first, stride_dA_chunk)
    new0, end0 = load_chunk(states_ptr, dA_cs_ptr, offs, mask)
    new1, end1 = load_chunk(states_ptr + stride_states_chunk, dA_cs_ptr + stride_dA_chunk, offs, mask)
    new2, end2 = load_chunk(states_ptr + 2 * stride_states_chunk, dA_cs_ptr + 2 * stride_dA_chunk, offs, mask)
    new3, end3 = load_chunk(states_ptr + 3 * stride_states_chunk, dA_cs_ptr + 3 * stride_dA_chunk, offs, mask)
    return new0, end0, new1, end1, new2, end2, new3, end3


@triton.jit
def load_chunk_at(states_ptr, dA_cs_ptr, offs, mask, c, stride_states_chunk, stride_dA_chunk):
    """Chunk ``c`` as ``load_chunk``, counted from the scalar pointers at chunk 0: one step of the second loop."""
    return load_chunk(chunk_row(states_ptr, c, stride_states_chunk), chunk_row(dA_cs_ptr, c, stride_dA_chunk), offs,
                      mask)


@triton.jit
def recurrence_step(s, new, dA_end):
    """One chunk of the fp32 inter-chunk recurrence ``s = exp(dA_chunk_end) * s + chunk_state``, shared by the
    snapshot and the indexed kernels so their arithmetic is one piece of code. ``exp`` as ``exp2(LOG2E * x)`` (equal
    to torch.exp2 on CUDA); the multiply-add is one expression so CUDA contracts it to an FMA (torch.addcmul).

    The kernels read ``READ_AHEAD`` chunks' rows (``load_chunks_ahead``; the 0-3 left after the whole groups one at a
    time: ``grouped_chunks``) before those chunks' steps and stores: the loop is bound by memory latency (each program
    has one chunk's row in flight otherwise, and every program of the grid is resident at once), and a load that
    follows a store cannot be hoisted by the compiler (the pointers may alias).
    So the chunk states must not overlap the outputs (``memory_overlaps``; the snapshot kernel's output is its own).
    """
    return tl.math.exp2(_LOG2E * dA_end) * s + new


@triton.jit
def _sequence_initial_state(init_ptr, seq, stride_init_batch, offs, mask, HAS_INIT: tl.constexpr,
                            BLOCK_SIZE: tl.constexpr):
    """Sequence ``seq``'s initial state in fp32 (``init_ptr``: this program's head), or zeros without one."""
    if HAS_INIT:
        return tl.load(init_ptr + seq.to(tl.int64) * stride_init_batch + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        return tl.zeros((BLOCK_SIZE,), dtype=tl.float32)


@triton.jit
def _final_slot_at(seq, c, final_idx_ptr, stride_final_idx, last_chunk_ptr, stride_last_chunk,
                   WRITE_CACHE: tl.constexpr):
    """Where chunk ``c``'s exiting state is written back: sequence ``seq``'s final slot when ``c`` is its last chunk,
    else -1 (negative, like a padded sequence's slot: nothing is written). Read with the chunk's row, before any
    store: after a store the compiler cannot hoist a load (the pointers may alias), and each chunk would wait on
    these two dependent loads in turn. ``seq`` is a valid sequence, so both reads are in bounds."""
    if WRITE_CACHE:
        last = tl.load(last_chunk_ptr + seq.to(tl.int64) * stride_last_chunk)
        slot = tl.load(final_idx_ptr + seq.to(tl.int64) * stride_final_idx).to(tl.int64)
        return tl.where(last == c, slot, -1)
    else:
        return tl.full((), -1, tl.int64)


@triton.jit
def _snapshot_step(s, prev_seq, new, dA_end, seq, slot, offs, mask, out_row_ptr, init_ptr, stride_init_batch,
                   cache_ptr, stride_cache_slot, HAS_INIT: tl.constexpr, WRITE_CACHE: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr):
    """A chunk of sequence ``seq`` (its row ``new``, ``dA_end`` and writeback ``slot``, from ``_final_slot_at``,
    already read): restart at a sequence's first chunk, step, store the exiting state at ``out_row_ptr``, and write
    it back to ``slot`` unless negative. The pointers are scalars at this program's head; returns (state, sequence
    index)."""
    if seq != prev_seq:  # first chunk of a new sequence: restart from its initial state
        s = _sequence_initial_state(init_ptr, seq, stride_init_batch, offs, mask, HAS_INIT, BLOCK_SIZE)
    s = recurrence_step(s, new, dA_end)
    tl.store(out_row_ptr + offs, s.to(out_row_ptr.dtype.element_ty), mask=mask)
    if WRITE_CACHE:
        if slot >= 0:  # negative: not the sequence's last chunk, or a padded sequence
            tl.store(cache_ptr + slot * stride_cache_slot + offs, s.to(cache_ptr.dtype.element_ty), mask=mask)
    return s, seq


# Under the interpreter the do_bench stand-in keeps the first config after pruning (the largest block there:
# kernels.tuned_configs.checked_in); on the GPU the checked-in config of a measured class, else Triton's benchmarker.
@triton.autotune(configs=CONFIGS, key=["dim"], do_bench=AUTOTUNE_DO_BENCH,
                 prune_configs_by={"early_config_prune": checked_in("state_passing", ("dim",),
                                                                    least_overshoot(BLOCK_SIZE="dim"))})
@triton.jit(**SCALAR_ONLY)
def _state_passing_kernel(
    states_ptr,  # (C, H, P*N) fp32
    out_ptr,  # (C, H, P*N) out dtype
    dA_cs_ptr,  # (H, C, Q) fp32
    init_ptr,  # (Bt, H, P*N) state dtype, read only when HAS_INIT
    seq_idx_ptr,  # (C,)
    cache_ptr,  # (slots, H, P*N), written only when WRITE_CACHE
    final_idx_ptr,  # (Bt,) int32/int64
    last_chunk_ptr,  # (Bt,)
    dim,  # P * N
    nchunks,
    chunk_size,
    stride_states_chunk,
    stride_states_head,
    stride_out_chunk,
    stride_out_head,
    stride_dA_head,
    stride_dA_chunk,
    stride_dA_q,
    stride_init_batch,
    stride_init_head,
    stride_seq_idx,
    stride_cache_slot,
    stride_cache_head,
    stride_final_idx,
    stride_last_chunk,
    HAS_INIT: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    pid_m = tl.program_id(0)
    pid_h = tl.program_id(1)
    offs = pid_m * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < dim

    # Scalar bases (this program's head): the loops carry only scalars and the state (chunk_row says why).
    states_ptr += pid_h * stride_states_head
    out_ptr += pid_h * stride_out_head
    dA_cs_ptr += pid_h * stride_dA_head + (chunk_size - 1) * stride_dA_q
    init_ptr += pid_h * stride_init_head
    cache_ptr += pid_h * stride_cache_head

    prev_seq = tl.load(seq_idx_ptr)
    s = _sequence_initial_state(init_ptr, prev_seq, stride_init_batch, offs, mask, HAS_INIT, BLOCK_SIZE)

    # Whole groups of READ_AHEAD chunks: their rows and sequence indices are read before their steps and stores
    # (recurrence_step says why); then the 0-3 chunks left, one at a time.
    for first in range(0, grouped_chunks(nchunks), READ_AHEAD):
        new0, end0, new1, end1, new2, end2, new3, end3 = load_chunks_ahead(
            states_ptr, dA_cs_ptr, offs, mask, first, stride_states_chunk, stride_dA_chunk)
        seq0 = tl.load(seq_idx_ptr + first * stride_seq_idx)
        seq1 = tl.load(seq_idx_ptr + (first + 1) * stride_seq_idx)
        seq2 = tl.load(seq_idx_ptr + (first + 2) * stride_seq_idx)
        seq3 = tl.load(seq_idx_ptr + (first + 3) * stride_seq_idx)
        slot0 = _final_slot_at(seq0, first, final_idx_ptr, stride_final_idx, last_chunk_ptr, stride_last_chunk,
                               WRITE_CACHE)
        slot1 = _final_slot_at(seq1, first + 1, final_idx_ptr, stride_final_idx, last_chunk_ptr, stride_last_chunk,
                               WRITE_CACHE)
        slot2 = _final_slot_at(seq2, first + 2, final_idx_ptr, stride_final_idx, last_chunk_ptr, stride_last_chunk,
                               WRITE_CACHE)
        slot3 = _final_slot_at(seq3, first + 3, final_idx_ptr, stride_final_idx, last_chunk_ptr, stride_last_chunk,
                               WRITE_CACHE)
        out_group_ptr = chunk_row(out_ptr, first, stride_out_chunk)
        for k in tl.static_range(READ_AHEAD):  # unrolled: k is a constant, so each branch below is chosen at compile
            if k == 0:
                new, dA_end, seq, slot = new0, end0, seq0, slot0
            elif k == 1:
                new, dA_end, seq, slot = new1, end1, seq1, slot1
            elif k == 2:
                new, dA_end, seq, slot = new2, end2, seq2, slot2
            else:
                new, dA_end, seq, slot = new3, end3, seq3, slot3
            s, prev_seq = _snapshot_step(
                s, prev_seq, new, dA_end, seq, slot, offs, mask, out_group_ptr + k * stride_out_chunk, init_ptr,
                stride_init_batch, cache_ptr, stride_cache_slot, HAS_INIT, WRITE_CACHE, BLOCK_SIZE)
    for c in range(grouped_chunks(nchunks), nchunks):
        new, dA_end = load_chunk_at(states_ptr, dA_cs_ptr, offs, mask, c, stride_states_chunk, stride_dA_chunk)
        seq = tl.load(seq_idx_ptr + c * stride_seq_idx)
        slot = _final_slot_at(seq, c, final_idx_ptr, stride_final_idx, last_chunk_ptr, stride_last_chunk, WRITE_CACHE)
        s, prev_seq = _snapshot_step(
            s, prev_seq, new, dA_end, seq, slot, offs, mask, chunk_row(out_ptr, c, stride_out_chunk), init_ptr,
            stride_init_batch, cache_ptr, stride_cache_slot, HAS_INIT, WRITE_CACHE, BLOCK_SIZE)


def memory_overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of two tensors (from their lowest to their highest element) share a byte."""
    def span(t: torch.Tensor) -> tuple[int, int]:
        dims = list(zip(t.shape, t.stride(), strict=True))
        if t.numel() == 0:
            return 0, 0
        low = t.data_ptr() + t.element_size() * sum((size - 1) * stride for size, stride in dims if stride < 0)
        extent = sum((size - 1) * abs(stride) for size, stride in dims) + 1
        return low, low + extent * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a.device == b.device and a0 < b1 and b0 < a1


def check_state_rows(name: str, t: torch.Tensor, H: int, P: int, N: int) -> None:
    """(rows, H, P, N) with compact (P, N) so that one head is a flat run of P*N elements."""
    assert t.dim() == 4 and tuple(t.shape[1:]) == (H, P, N), (
        f"{name}: expected (*, {H}, {P}, {N}), found {tuple(t.shape)}")
    assert t.stride(3) == 1 and t.stride(2) == N, f"{name}: (P, N) must be compact, found strides {t.stride()}"


def check_index(name: str, t: torch.Tensor, n: int, dtypes: tuple[torch.dtype, ...] = INDEX_DTYPES) -> None:
    """A (n,) index (or mask) tensor of one of ``dtypes``."""
    assert t.dim() == 1 and t.shape[0] == n, f"{name}: expected ({n},), found {tuple(t.shape)}"
    assert t.dtype in dtypes, f"{name}: expected one of {dtypes}, found {t.dtype}"


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
    """Exiting state of every chunk.

    states (C, H, P, N) fp32; dA_cumsum (H, C, Q) fp32; seq_idx (C,) int; initial_states (Bt, H, P, N) or None;
    state_cache (slots, H, P, N) with compact (P, N) (padded stride(0), storage offset allowed) together with
    final_state_indices (Bt,) and last_chunk_indices (Bt,) int32/int64, possibly strided views.
    ``profile``, when given, must be the arithmetic profile this kernel follows here (``ARITHMETIC_PROFILE``).
    Returns (C, H, P, N) ``out_dtype``.
    """
    if profile is not None and profile != ARITHMETIC_PROFILE:
        raise ValueError(f"profile: this kernel follows {ARITHMETIC_PROFILE!r} here, asked for {profile!r}")
    assert states.dim() == 4 and states.dtype == torch.float32, f"states: expected (C,H,P,N) fp32, found {states.dtype}"
    C, H, P, N = states.shape
    assert states.stride(3) == 1 and states.stride(2) == N, f"states: (P, N) must be compact, found {states.stride()}"
    assert dA_cumsum.dim() == 3 and tuple(dA_cumsum.shape[:2]) == (H, C), (
        f"dA_cumsum: expected ({H}, {C}, Q), found {tuple(dA_cumsum.shape)}")
    assert dA_cumsum.dtype == torch.float32, f"dA_cumsum: expected fp32, found {dA_cumsum.dtype}"
    check_index("seq_idx", seq_idx, C)
    write_cache = state_cache is not None
    if write_cache:
        assert final_state_indices is not None and last_chunk_indices is not None, (
            "state_cache: final_state_indices and last_chunk_indices are needed for the writeback")
        check_state_rows("state_cache", state_cache, H, P, N)
        assert state_cache.stride(1) == P * N, f"state_cache: (H, P, N) must be compact, found {state_cache.stride()}"
        batch = final_state_indices.shape[0]
        check_index("final_state_indices", final_state_indices, batch)
        check_index("last_chunk_indices", last_chunk_indices, batch)
    if initial_states is not None:
        check_state_rows("initial_states", initial_states, H, P, N)
        assert initial_states.stride(1) == P * N, (
            f"initial_states: (H,P,N) must be compact, found {initial_states.stride()}")
    for name, t in (("dA_cumsum", dA_cumsum), ("seq_idx", seq_idx), ("initial_states", initial_states),
                    ("state_cache", state_cache), ("final_state_indices", final_state_indices),
                    ("last_chunk_indices", last_chunk_indices)):
        assert t is None or t.device == states.device, f"{name}: on {t.device}, states on {states.device}"

    out = torch.empty((C, H, P, N), dtype=out_dtype, device=states.device)
    grid = lambda meta: (triton.cdiv(P * N, meta["BLOCK_SIZE"]), H)  # noqa: E731
    _state_passing_kernel[grid](**launch_arguments(
        states, dA_cumsum, seq_idx, out, initial_states=initial_states, state_cache=state_cache,
        final_state_indices=final_state_indices, last_chunk_indices=last_chunk_indices))
    return out


def launch_arguments(states: torch.Tensor, dA_cumsum: torch.Tensor, seq_idx: torch.Tensor, out: torch.Tensor, *,
                     initial_states: torch.Tensor | None, state_cache: torch.Tensor | None,
                     final_state_indices: torch.Tensor | None, last_chunk_indices: torch.Tensor | None) -> dict:
    """The kernel's arguments by name for these tensors (the launcher's, and the warmup registry's on stand-ins).
    Without initial states or a cache writeback, placeholders fill the pointer arguments the kernel never reads."""
    C, H, P, N = states.shape
    write_cache = state_cache is not None
    init = initial_states if initial_states is not None else states  # placeholder pointer, never read
    cache = state_cache if write_cache else out  # placeholder pointer, never written
    final_idx = final_state_indices if write_cache else seq_idx
    last_chunk = last_chunk_indices if write_cache else seq_idx
    return dict(
        states_ptr=states, out_ptr=out, dA_cs_ptr=dA_cumsum, init_ptr=init, seq_idx_ptr=seq_idx, cache_ptr=cache,
        final_idx_ptr=final_idx, last_chunk_ptr=last_chunk,
        dim=P * N, nchunks=C, chunk_size=dA_cumsum.shape[2],
        stride_states_chunk=states.stride(0), stride_states_head=states.stride(1),
        stride_out_chunk=out.stride(0), stride_out_head=out.stride(1),
        stride_dA_head=dA_cumsum.stride(0), stride_dA_chunk=dA_cumsum.stride(1), stride_dA_q=dA_cumsum.stride(2),
        stride_init_batch=init.stride(0), stride_init_head=init.stride(1),
        stride_seq_idx=seq_idx.stride(0),
        stride_cache_slot=cache.stride(0), stride_cache_head=cache.stride(1),
        stride_final_idx=final_idx.stride(0), stride_last_chunk=last_chunk.stride(0),
        HAS_INIT=initial_states is not None,
        WRITE_CACHE=write_cache,
        **pdl_arguments(),
    )
