"""Providers whose final-state writeback goes through a real ``@triton.autotune``d kernel (not one of ours).

The wrapped provider (``reference:provider``, which launches no Triton kernel) computes ``out`` and returns the final
states; the writeback then applies ``cache[final_slot] = src * decay + delta`` per sequence, with ``decay`` a
per-head factor and ``delta = final - initial * decay``, so one launch over ``src = initial`` writes the final state.

- ``in_place`` reads ``src`` from the final slot itself, which holds the initial state when a sequence continues in
  its own slot: right after one launch, but every tuning trial launch applies the update again (destructive
  autotuning). Plain calls whose tuning key is already tuned never show it.
- ``private_copy`` reads ``src`` from a copy of the initial states taken before the launch: trials are harmless.

``CASES`` are two cases with the same tuning key for the writeback kernel (same state shape and dtypes), each
continuing its sequences in their own slots. Import after ``harness.backend.configure`` (the decorator reads
``TRITON_INTERPRET``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

CASES = """\
schema: ssd-case/1
cases:
  - id: slot-update-first
    description: one sequence continuing in its own slot (tunes the writeback's key)
    seed: 31
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
    dtype: {io: float32, state: float32}
    sequences:
      - {context: 5, tokens: 20, init_slot: 1, has_state: true, final_slot: 1}
    cache: {slots: 3, row_pad: 2, offset: 1, fill: nan}
    call: {final_state: direct, path: auto}
  - id: slot-update-second
    description: two sequences continuing in their own slots; the writeback's tuning key equals the first case's
    seed: 32
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
    dtype: {io: float32, state: float32}
    sequences:
      - {context: 9, tokens: 13, init_slot: 2, has_state: true, final_slot: 2}
      - {context: 3, tokens: 7, init_slot: 0, has_state: true, final_slot: 0}
    cache: {slots: 4}
    call: {final_state: direct, path: auto}
"""


@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["dim"])
@triton.jit
def slot_update_kernel(cache_ptr, dst_slot_ptr, src_ptr, src_row_ptr, decay_ptr, delta_ptr, dim, per_head,
                       cache_stride, src_stride, heads, BLOCK: tl.constexpr):
    """cache[dst_slot[b]] = src[src_row[b]] * decay[b, head] + delta[b] over one sequence's flattened (H, P, N)
    state; a negative slot writes nothing. Program (b, block)."""
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    dst = tl.load(dst_slot_ptr + b).to(tl.int64)
    row = tl.load(src_row_ptr + b).to(tl.int64)
    m = (offs < dim) & (dst >= 0)
    old = tl.load(src_ptr + row * src_stride + offs, mask=m, other=0.0).to(tl.float32)
    decay = tl.load(decay_ptr + b * heads + offs // per_head, mask=m, other=0.0)
    delta = tl.load(delta_ptr + b * dim + offs, mask=m, other=0.0)
    tl.store(cache_ptr + dst * cache_stride + offs, (old * decay + delta).to(cache_ptr.dtype.element_ty), mask=m)


class SlotUpdateWriteback:
    """``reference:provider`` for ``out`` and the final states, then the autotuned slot update as the writeback."""

    def __init__(self, reads_private_copy: bool, base: str = "reference:provider"):
        self.reads_private_copy = reads_private_copy
        self.base = base
        self._inner = None

    @property
    def inner(self):
        if self._inner is None:
            from harness.checks.providers import load_provider

            self._inner = load_provider(self.base)
        return self._inner

    @property
    def name(self) -> str:
        return "slot-update-" + ("private-copy" if self.reads_private_copy else "in-place")

    @property
    def supported_paths(self):
        return self.inner.supported_paths

    def ssd_prefill(self, *args, A, state_cache, initial_state_indices, has_initial_states, final_state_indices=None,
                    return_intermediate_states=False, **kwargs):
        call = dict(A=A, state_cache=state_cache, initial_state_indices=initial_state_indices,
                    has_initial_states=has_initial_states, return_intermediate_states=return_intermediate_states)
        if final_state_indices is None:
            return self.inner.ssd_prefill(*args, **call, **kwargs)
        finals = self.inner.ssd_prefill(*args, **call, **kwargs)  # returned mode: final states, nothing written
        batch, heads = finals.shape[:2]
        dim = finals[0].numel()
        initial = torch.where(has_initial_states.view(-1, 1, 1, 1), state_cache[initial_state_indices.long()],
                              torch.zeros((), dtype=state_cache.dtype, device=state_cache.device)).float()
        decay = torch.exp(A.float()).expand(batch, heads).contiguous()
        delta = (finals.float() - initial * decay.view(batch, heads, 1, 1)).reshape(batch, dim).contiguous()
        dst = final_state_indices.long()
        if self.reads_private_copy:
            src, rows = initial.reshape(batch, dim).to(state_cache.dtype).contiguous(), torch.arange(batch)
        else:
            src, rows = state_cache, dst
        rows = rows.to(state_cache.device)
        self.launch(lambda meta: (batch, triton.cdiv(dim, meta["BLOCK"])),
                    state_cache, dst, src, rows, decay, delta, dim, dim // heads, state_cache.stride(0), src.stride(0),
                    heads)
        return None

    def launch(self, grid, *args) -> None:
        slot_update_kernel[grid](*args)


class CachedConfigWriteback(SlotUpdateWriteback):
    """The slot update launched as vLLM's ``launch_autotuned`` launches its kernels: the first launch per (tuning
    key, argument dtypes) goes through the autotuner, which tunes; the chosen config is kept in ``configs`` and
    later launches call the jit function with it directly, so Triton's autotuner never runs again for that key.
    ``offers_hook``: whether ``tuning_caches()`` returns ``configs`` (the provider hook for such caches)."""

    def __init__(self, reads_private_copy: bool, offers_hook: bool):
        super().__init__(reads_private_copy)
        self.configs: dict = {}
        if offers_hook:
            self.tuning_caches = lambda: [self.configs]

    @property
    def name(self) -> str:
        return super().name + "-cached-config"

    def launch(self, grid, *args) -> None:
        key = (args[6], *(getattr(a, "dtype", None) for a in args))  # ``dim`` is the autotuner's key
        config = self.configs.get(key)
        if config is None:
            slot_update_kernel[grid](*args)
            self.configs[key] = slot_update_kernel.best_config
            return
        slot_update_kernel.fn[grid](*args, **config.all_kwargs())


in_place = SlotUpdateWriteback(reads_private_copy=False)
private_copy = SlotUpdateWriteback(reads_private_copy=True)


# ``out`` through an autotuned row copy, one of whose configs is wrong: ``RowCopyOut`` wraps ``reference:provider``
# (which launches no Triton kernel) and copies its ``out`` into the caller's through ``row_copy``. The config with
# ``ROWS == MISCOMPILED_ROWS`` stands in for a config the compiler gets wrong: it writes NaN into the last row of each
# block of rows, as vLLM's racy wgmma chunk-scan configs write NaN into whole output rows. It is not the first config,
# so the interpreter's stand-in benchmarker (the first config wins) never picks it; on a GPU it stores its block
# ``MISCOMPILED_STORES`` times, by far the slowest config, so a tuner that times the configs never picks it either:
# only forcing it shows it.
# ``ROWS == NUDGED_ROWS`` moves the last row of each block by one ulp: within any reference bound, caught only where
# the provider declares ``out`` bit-identical across the kernel's configs.
MISCOMPILED_ROWS = 8
NUDGED_ROWS = 2
# Under the interpreter each store is numpy work, and the stand-in benchmarker needs no slowness to pass it over.
MISCOMPILED_STORES = tl.constexpr(1 if os.environ.get("TRITON_INTERPRET", "0") == "1" else 1 << 16)


@triton.jit
def _row_copy(dst_ptr, src_ptr, n_rows, row_len, ROWS: tl.constexpr, COLS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    offs = rows[:, None] * row_len + cols[None, :]
    m = (rows[:, None] < n_rows) & (cols[None, :] < row_len)
    v = tl.load(src_ptr + offs, mask=m, other=0.0)
    last = (rows % ROWS == ROWS - 1)[:, None]
    if ROWS == 8:
        v = tl.where(last, float("nan"), v)
        for _ in range(MISCOMPILED_STORES - 1):
            tl.store(dst_ptr + offs, v, mask=m)
    if ROWS == 2:
        v = tl.where(last & (v != 0.0), (v.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True), v)
    tl.store(dst_ptr + offs, v, mask=m)


ROW_COPY_CONFIGS = [triton.Config({"ROWS": 4}), triton.Config({"ROWS": MISCOMPILED_ROWS}),
                    triton.Config({"ROWS": 16})]
row_copy = triton.autotune(configs=ROW_COPY_CONFIGS, key=["row_len"])(_row_copy)
row_copy_without_miscompiled = triton.autotune(
    configs=[c for c in ROW_COPY_CONFIGS if c.kwargs["ROWS"] != MISCOMPILED_ROWS], key=["row_len"])(_row_copy)
row_copy_nudging = triton.autotune(configs=[triton.Config({"ROWS": 4}), triton.Config({"ROWS": NUDGED_ROWS})],
                                   key=["row_len"])(_row_copy)
ROW_COPY = "tests.autotuned_providers._row_copy"  # the kernel's name in reports (module.qualname)


class RowCopyOut:
    """``reference:provider``'s call, its fp32 ``out`` copied into the caller's by the autotuned ``kernel``.
    ``exact_across_configs``: the provider's declaration (docs/provider.md), if any."""

    def __init__(self, kernel, exact_across_configs: dict | None = None, base: str = "reference:provider"):
        self.kernel = kernel
        self.base = base
        self._inner = None
        if exact_across_configs is not None:
            self.exact_across_configs = exact_across_configs

    @property
    def inner(self):
        if self._inner is None:
            from harness.checks.providers import load_provider

            self._inner = load_provider(self.base)
        return self._inner

    name = "row-copy-out"

    @property
    def supported_paths(self):
        return self.inner.supported_paths

    def ssd_prefill(self, *args, out, **kwargs):
        if out.dtype != torch.float32:
            raise NotImplementedError(f"RowCopyOut copies fp32 rows; out is {out.dtype}")
        staged = torch.empty_like(out, memory_format=torch.contiguous_format)
        copied = torch.empty_like(staged)
        returned = self.inner.ssd_prefill(*args, out=staged, **kwargs)
        rows, row_len = out.shape[0], out[0].numel()
        self.kernel[lambda meta: (triton.cdiv(rows, meta["ROWS"]),)](
            copied, staged, rows, row_len, COLS=triton.next_power_of_2(row_len))
        out.copy_(copied)
        return returned


row_copy_out = RowCopyOut(row_copy)  # ``--provider tests.autotuned_providers:row_copy_out``
