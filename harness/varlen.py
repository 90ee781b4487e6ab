"""Varlen metadata for packed Mamba2 prefill batches (docs/domain.md, vLLM's convention).

Chunks are aligned to absolute token position: a sequence whose cached ``context`` is not a multiple of
``chunk_size`` first gets a partial chunk that fills up to the next boundary, then full chunks, then a possibly
partial last chunk. No chunk spans two sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class VarlenMetadata:
    """Per-batch chunk layout. All lists are plain ints; ``tensors()`` moves them to a device."""

    chunk_size: int
    contexts: tuple[int, ...]
    tokens: tuple[int, ...]
    cu_seqlens: tuple[int, ...]  # (batch + 1,) token offsets of sequences
    cu_chunk_seqlens: tuple[int, ...]  # (nchunks + 1,) token offsets of chunk boundaries
    last_chunk_indices: tuple[int, ...]  # (batch,) index of each sequence's last chunk
    seq_idx: tuple[int, ...]  # (nchunks,) sequence of each chunk

    @property
    def batch(self) -> int:
        return len(self.tokens)

    @property
    def nchunks(self) -> int:
        return len(self.seq_idx)

    @property
    def total_tokens(self) -> int:
        return self.cu_seqlens[-1]

    def chunk_lengths(self) -> list[int]:
        c = self.cu_chunk_seqlens
        return [c[i + 1] - c[i] for i in range(self.nchunks)]

    def tensors(self, device: torch.device | str = "cpu", dtype: torch.dtype = torch.int32) -> dict[str, torch.Tensor]:
        """The four metadata tensors under the keyword names ``ssd_prefill`` takes."""
        make = lambda v: torch.tensor(v, dtype=dtype, device=device)  # noqa: E731
        return {
            "cu_seqlens": make(self.cu_seqlens),
            "cu_chunk_seqlens": make(self.cu_chunk_seqlens),
            "last_chunk_indices": make(self.last_chunk_indices),
            "seq_idx": make(self.seq_idx),
        }


def first_chunk_length(context: int, tokens: int, chunk_size: int) -> int:
    """Tokens in a sequence's first chunk: up to the next absolute chunk boundary, at most ``tokens``."""
    room = chunk_size - context % chunk_size
    return min(room, tokens)


def build_varlen_metadata(contexts: Sequence[int], tokens: Sequence[int], chunk_size: int) -> VarlenMetadata:
    """Build ``cu_seqlens``, ``cu_chunk_seqlens``, ``last_chunk_indices`` and ``seq_idx``.

    Raises ``ValueError`` naming the field for impossible input.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive power of two, found {chunk_size!r}")
    if chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size: expected a power of two, found {chunk_size}")
    contexts, tokens = list(contexts), list(tokens)
    if len(contexts) != len(tokens):
        raise ValueError(f"contexts: expected one per sequence ({len(tokens)}), found {len(contexts)}")
    if not tokens:
        raise ValueError("tokens: expected at least one sequence, found none")
    for b, (ctx, n) in enumerate(zip(contexts, tokens, strict=True)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"tokens[{b}]: expected an integer >= 1, found {n!r}")
        if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 0:
            raise ValueError(f"context[{b}]: expected an integer >= 0, found {ctx!r}")

    cu_seqlens = [0]
    cu_chunks = [0]
    seq_idx: list[int] = []
    last_chunk: list[int] = []
    for b, (ctx, n) in enumerate(zip(contexts, tokens, strict=True)):
        start = cu_seqlens[-1]
        pos = 0
        step = first_chunk_length(ctx, n, chunk_size)
        while pos < n:
            pos += step
            cu_chunks.append(start + pos)
            seq_idx.append(b)
            step = min(chunk_size, n - pos)
        cu_seqlens.append(start + n)
        last_chunk.append(len(seq_idx) - 1)
    return VarlenMetadata(
        chunk_size=chunk_size,
        contexts=tuple(contexts),
        tokens=tuple(tokens),
        cu_seqlens=tuple(cu_seqlens),
        cu_chunk_seqlens=tuple(cu_chunks),
        last_chunk_indices=tuple(last_chunk),
        seq_idx=tuple(seq_idx),
    )
