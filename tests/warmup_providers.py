"""Foreign providers with a ``warmup(requests)`` hook (docs/provider.md#optional-hooks), for the recompile guard.

Each is ``tests.autotuned_providers.private_copy`` (the reference computes the call; the final states go into the
cache through a real autotuned Triton kernel that is not ours, ``slot_update_kernel``) plus a warmup that makes
representative calls, as a server warms another engine: one fresh sequence of one chunk per model configuration,
direct writeback, on each cache layout in ``layouts`` ((row_pad, offset) in elements). The writeback kernel's
specialization depends on the layout (the cache pointer's 16-byte alignment, the row stride's integer class), so:

- ``warms_every_layout`` covers the layouts of ``tests.autotuned_providers.CASES`` (compact; rows padded by 2 with
  the cache 1 element into its storage): the guard must pass;
- ``warms_compact_only`` skips the padded, offset layout that ``slot-update-first`` uses: the guard must fail that
  case's items that write the cache, naming ``slot_update_kernel``.

Each sample call tunes the writeback afresh (its autotuner's cache emptied first), so every config is launched on
every layout, as a server that never re-tunes after startup would need for a check that re-tunes from scratch
(``autotune_idempotent``). Import after ``harness.backend.configure``.
"""

from __future__ import annotations

import torch

from tests.autotuned_providers import SlotUpdateWriteback, slot_update_kernel

D_SHAPES = {"none": None, "per_head": lambda h, p: (h,), "per_channel": lambda h, p: (h, p)}


def sample_call(config, row_pad: int, offset: int, device: str) -> dict:
    """``ssd_prefill`` keywords for one fresh sequence of one chunk under ``config`` (a ModelConfig), written back
    to slot 1 of a two-slot cache with rows padded by ``row_pad`` elements, ``offset`` elements into its storage."""
    H, P, N, G, Q = config.nheads, config.headdim, config.dstate, config.ngroups, config.chunk_size
    io = dict(dtype=config.io_dtype, device=device)
    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    row = H * P * N + row_pad
    storage = torch.zeros(offset + 2 * row, dtype=config.state_dtype, device=device)
    d_shape = D_SHAPES[config.D]
    return dict(
        x=torch.randn(Q, H, P, **io), dt=torch.rand(Q, H, **f32), A=-torch.rand(H, **f32),
        B=torch.randn(Q, G, N, **io), C=torch.randn(Q, G, N, **io), chunk_size=Q,
        cu_seqlens=torch.tensor([0, Q], **i32), cu_chunk_seqlens=torch.tensor([0, Q], **i32),
        last_chunk_indices=torch.tensor([0], **i32), seq_idx=torch.tensor([0], **i32),
        out=torch.empty(Q, H, P, **io), D=torch.rand(d_shape(H, P), **f32) if d_shape else None,
        z=torch.randn(Q, H, P, **io) if config.z else None, dt_bias=torch.rand(H, **f32) if config.dt_bias else None,
        dt_softplus=config.dt_softplus, dt_limit=config.dt_limit,
        state_cache=storage.as_strided((2, H, P, N), (row, P * N, N, 1), offset),
        initial_state_indices=torch.tensor([0], **i32), has_initial_states=torch.tensor([False], device=device),
        final_state_indices=torch.tensor([1], **i32),
    )


class WarmedSlotUpdate(SlotUpdateWriteback):
    def __init__(self, layouts: tuple[tuple[int, int], ...]):
        super().__init__(reads_private_copy=True)
        self.layouts = layouts

    @property
    def name(self) -> str:
        return f"slot-update-warmed-{len(self.layouts)}-layouts"

    def warmup(self, requests) -> None:
        from triton import knobs

        device = "cpu" if knobs.runtime.interpret else "cuda"
        for config in requests:
            for row_pad, offset in self.layouts:
                slot_update_kernel.cache.clear()
                self.ssd_prefill(**sample_call(config, row_pad, offset, device))


warms_every_layout = WarmedSlotUpdate(layouts=((0, 0), (2, 1)))
warms_compact_only = WarmedSlotUpdate(layouts=((0, 0),))


class WarmupRaises(WarmedSlotUpdate):
    """A hook that fails: every item of its configuration must be an error, none judged without a warmup."""

    def __init__(self):
        super().__init__(layouts=())
        self.calls = 0

    def warmup(self, requests) -> None:
        self.calls += 1
        raise RuntimeError("no device memory for the warmup")


warmup_raises = WarmupRaises()
