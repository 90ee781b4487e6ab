"""Deliberately broken providers: each wraps a working provider and breaks one rule the harness must catch.

Use as ``--provider tests.broken_providers:<name>`` (around ``kernels:provider``, our kernels) or
``tests.broken_providers:on_reference.<name>`` (around ``reference:provider``). The wrapped provider is loaded on
first use, after the harness has chosen the device. ``TINY_CASES`` is a small case file (interpreter-sized) on which
every breakage shows.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from harness.compare import int_view

TINY_CASES = """\
schema: ssd-case/1
cases:
  - id: tiny-direct
    description: one sequence continuing from a real state, direct writeback into another slot
    seed: 11
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
    dtype: {io: float32, state: float32}
    options: {D: per_head, z: true, dt_bias: true, dt_softplus: true}
    sequences:
      - {context: 5, tokens: 20, init_slot: 1, has_state: true, final_slot: 2}
    cache: {slots: 4, row_pad: 3, offset: 2, fill: nan}
    indices: {layout: contiguous, dtype: int32}
    call: {final_state: direct, path: auto}
  - id: tiny-batch
    description: two sequences, the first masked over a NaN slot, crossed slots
    seed: 12
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 2, chunk_size: 16}
    dtype: {io: float32, state: float32}
    sequences:
      - {context: 0, tokens: 10, init_slot: 0, has_state: false, final_slot: 1}
      - {context: 17, tokens: 20, init_slot: 1, has_state: true, final_slot: 0}
    cache: {slots: 3, row_pad: 2, offset: 1}
    call: {final_state: direct, path: auto}
  - id: tiny-returned
    description: two sequences returning fp16 final states (nothing written)
    seed: 13
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
    dtype: {io: float32, state: float16}
    sequences:
      - {context: 3, tokens: 9, init_slot: 0, has_state: true}
      - {context: 0, tokens: 12, init_slot: 1, has_state: false}
    cache: {slots: 2}
    call: {final_state: returned, path: auto}
"""


def _base(spec: str | None = None):
    from harness.checks.providers import load_provider

    return load_provider(spec or "kernels:provider")


def _nudge(t: torch.Tensor, flat_index: int, ulps: int) -> None:
    """Move one element of ``t`` by ``ulps`` units in the last place, in place."""
    bits = int_view(t.view(-1)[flat_index : flat_index + 1])
    t.view(-1)[flat_index : flat_index + 1].copy_((bits + ulps).view(t.dtype))


class _Broken:
    """Delegates to the base provider; subclasses override ``call``."""

    breakage = ""

    def __init__(self, base: str | None = None):
        self.base = base  # provider spec to wrap; None: kernels:provider
        self._inner = None

    @property
    def inner(self):
        if self._inner is None:
            self._inner = _base(self.base)
        return self._inner

    @property
    def name(self) -> str:
        return f"broken-{type(self).__name__}"

    @property
    def supported_paths(self):
        return getattr(self.inner, "supported_paths", frozenset({"snapshot", "indexed"}))

    def ssd_prefill(self, *args, **kwargs):
        kwargs.pop("workspace_out", None)  # broken providers expose no workspace
        return self.call(*args, **kwargs)

    def call(self, *args, **kwargs):
        return self.inner.ssd_prefill(*args, **kwargs)


class WrongSlot(_Broken):
    breakage = "writes each final state one slot past the one it was given"

    def call(self, *args, final_state_indices=None, state_cache, **kwargs):
        if final_state_indices is not None:
            slots = state_cache.shape[0]
            shifted = torch.where(final_state_indices >= 0, (final_state_indices + 1) % slots, final_state_indices)
            final_state_indices = shifted.to(final_state_indices.dtype)
        return self.inner.ssd_prefill(*args, final_state_indices=final_state_indices, state_cache=state_cache, **kwargs)


class IgnoresInitialState(_Broken):
    breakage = "treats every sequence as starting from a zero state"

    def call(self, *args, has_initial_states, **kwargs):
        return self.inner.ssd_prefill(*args, has_initial_states=torch.zeros_like(has_initial_states), **kwargs)


class LastRowUnwritten(_Broken):
    breakage = "leaves the last output row as it found it"

    def call(self, *args, out, **kwargs):
        saved = out[-1].clone()
        result = self.inner.ssd_prefill(*args, out=out, **kwargs)
        out[-1].copy_(saved)
        return result


class MutatesInput(_Broken):
    breakage = "scribbles on x after computing"

    def call(self, x, *args, **kwargs):
        result = self.inner.ssd_prefill(x, *args, **kwargs)
        x.view(-1)[0] += 1
        return result


class OneUlpIndexed(_Broken):
    breakage = "the indexed path's output differs from the snapshot path's by one ulp in one element"

    supported_paths = frozenset({"snapshot", "indexed"})

    def call(self, *args, path="auto", out, **kwargs):
        base_path = path
        if path == "indexed" and "indexed" not in getattr(self.inner, "supported_paths", {"indexed"}):
            base_path = "snapshot"  # a base without the indexed path: emulate it (eligibility is checked below)
            if kwargs.get("final_state_indices") is None or kwargs["has_initial_states"].shape[0] != 1 or kwargs.get(
                "return_intermediate_states"
            ):
                raise ValueError("path='indexed': needs one sequence with direct writeback")
        result = self.inner.ssd_prefill(*args, path=base_path, out=out, **kwargs)
        if path == "indexed":
            _nudge(out, out.numel() // 2, 1)
        return result


class Nondeterministic(_Broken):
    breakage = "each call's output differs from the previous call's in one element"

    def __init__(self, base: str | None = None):
        super().__init__(base)
        self.calls = 0

    def call(self, *args, out, **kwargs):
        result = self.inner.ssd_prefill(*args, out=out, **kwargs)
        self.calls += 1
        _nudge(out, 0, self.calls)
        return result


class ReadsMaskedSlot(_Broken):
    breakage = "reads the slot of a masked sequence (NaN) as if it held a state"

    def call(self, *args, has_initial_states, **kwargs):
        return self.inner.ssd_prefill(*args, has_initial_states=torch.ones_like(has_initial_states), **kwargs)


class AcceptsIneligibleIndexed(_Broken):
    breakage = "silently runs the snapshot path when asked for an ineligible indexed call"

    def call(self, *args, path="auto", **kwargs):
        return self.inner.ssd_prefill(*args, path="snapshot" if path == "indexed" else path, **kwargs)


class ReturnsWrongDtype(_Broken):
    breakage = "returns final states in fp32 instead of the cache dtype"

    def call(self, *args, **kwargs):
        result = self.inner.ssd_prefill(*args, **kwargs)
        return None if result is None else result.float()


def _neighbours(cu_seqlens: torch.Tensor) -> list[tuple[int, int, int]]:
    """(b, the last token of sequence b, the first token of sequence b + 1) for each pair with tokens."""
    cu = cu_seqlens.tolist()
    return [(b, cu[b + 1] - 1, cu[b + 1]) for b in range(len(cu) - 2) if cu[b + 1] > cu[b] and cu[b + 2] > cu[b + 1]]


class LeaksIntoPreviousOutput(_Broken):
    breakage = ("adds 0 * the next sequence's first x row to each sequence's last output row (an x tile read past "
                "the sequence's end, its weights zero)")

    def call(self, x, *args, cu_seqlens, out, **kwargs):
        result = self.inner.ssd_prefill(x, *args, cu_seqlens=cu_seqlens, out=out, **kwargs)
        for _, last, first in _neighbours(cu_seqlens):
            out[last] += (0 * x[first].float()).to(out.dtype)
        return result


class LeaksIntoPreviousState(_Broken):
    breakage = "adds 0 * the next sequence's first x element to each sequence's final state (written or returned)"

    def call(self, x, *args, cu_seqlens, state_cache, final_state_indices=None, **kwargs):
        result = self.inner.ssd_prefill(x, *args, cu_seqlens=cu_seqlens, state_cache=state_cache,
                                        final_state_indices=final_state_indices, **kwargs)
        for b, _, first in _neighbours(cu_seqlens):
            leak = 0 * x[first].float().flatten()[0]
            if result is not None and result.shape[0] == cu_seqlens.shape[0] - 1:
                result[b] += leak.to(result.dtype)
            elif final_state_indices is not None and int(final_state_indices[b]) >= 0:
                state_cache[int(final_state_indices[b])] += leak.to(state_cache.dtype)
        return result


wrong_slot = WrongSlot()
ignores_initial_state = IgnoresInitialState()
last_row_unwritten = LastRowUnwritten()
mutates_input = MutatesInput()
one_ulp_indexed = OneUlpIndexed()
nondeterministic = Nondeterministic()
reads_masked_slot = ReadsMaskedSlot()
accepts_ineligible_indexed = AcceptsIneligibleIndexed()
returns_wrong_dtype = ReturnsWrongDtype()
leaks_into_previous_output = LeaksIntoPreviousOutput()
leaks_into_previous_state = LeaksIntoPreviousState()

# provider attribute -> (the check that must catch it, a case of TINY_CASES that shows it)
CAUGHT_BY = {
    "wrong_slot": ("untouched_storage", "tiny-direct"),
    "ignores_initial_state": ("reference_bound", "tiny-direct"),
    "last_row_unwritten": ("reference_bound", "tiny-batch"),
    "mutates_input": ("readonly_inputs", "tiny-batch"),
    "one_ulp_indexed": ("indexed_vs_snapshot", "tiny-direct"),
    "nondeterministic": ("determinism", "tiny-direct"),
    "reads_masked_slot": ("masked_state", "tiny-batch"),
    "accepts_ineligible_indexed": ("auto_vs_snapshot", "tiny-batch"),
    "returns_wrong_dtype": ("returned_shapes", "tiny-returned"),
    "leaks_into_previous_output": ("sequence_independence", "tiny-batch"),
    "leaks_into_previous_state": ("sequence_independence", "tiny-batch"),
}
BROKEN = {name: globals()[name] for name in CAUGHT_BY}

# The same breakages around the PyTorch reference provider:
# ``--provider tests.broken_providers:on_reference.wrong_slot``. For searches that call the provider hundreds of
# times (the fuzzer), where the interpreter would take minutes, in this process.
on_reference = SimpleNamespace(**{name: type(p)(base="reference:provider") for name, p in BROKEN.items()})
