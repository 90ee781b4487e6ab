"""Varlen metadata: properties under Hypothesis and a worked example of the chunk rules in docs/domain.md."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.varlen import build_varlen_metadata, first_chunk_length

chunk_sizes = st.sampled_from([1, 2, 8, 64, 128, 256])
sequences = st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 1200)), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(seqs=sequences, chunk=chunk_sizes)
def test_metadata_properties(seqs, chunk):
    contexts = [c for c, _ in seqs]
    tokens = [t for _, t in seqs]
    m = build_varlen_metadata(contexts, tokens, chunk)
    cu = m.cu_chunk_seqlens
    lengths = m.chunk_lengths()
    assert m.cu_seqlens[0] == 0 and cu[0] == 0 and cu[-1] == m.cu_seqlens[-1] == sum(tokens)
    assert all(0 < n <= chunk for n in lengths)
    for b, (ctx, n) in enumerate(zip(contexts, tokens, strict=True)):
        own = [c for c in range(m.nchunks) if m.seq_idx[c] == b]
        # chunks of a sequence are contiguous, lie inside it, and their sizes sum to its tokens
        assert own == list(range(own[0], own[-1] + 1))
        assert cu[own[0]] == m.cu_seqlens[b] and cu[own[-1] + 1] == m.cu_seqlens[b + 1]
        assert sum(lengths[c] for c in own) == n
        assert m.last_chunk_indices[b] == own[-1]
        # the first chunk fills up to the next absolute chunk boundary
        assert lengths[own[0]] == min(chunk - ctx % chunk, n)
        # every later chunk but the last is full, and every chunk ends on an absolute boundary except the last
        for c in own[1:-1]:
            assert lengths[c] == chunk
        for c in own[:-1]:
            assert (ctx + cu[c + 1] - m.cu_seqlens[b]) % chunk == 0
    assert m.seq_idx == tuple(sorted(m.seq_idx))


def test_worked_example():
    m = build_varlen_metadata([0, 1, 87, 127, 127], [2433, 127, 1200, 1026, 1025], 128)
    assert m.cu_seqlens == (0, 2433, 2560, 3760, 4786, 5811)
    lengths = m.chunk_lengths()
    # seq 0: 19 full chunks + 1 token; seq 1: 127 tokens fill up to the boundary at 128
    assert lengths[:20] == [128] * 19 + [1]
    assert lengths[20] == 127
    # seq 2: context 87 -> 41 tokens to the boundary, then 9 full, then 7
    assert lengths[21:32] == [41] + [128] * 9 + [7]
    # seq 3: context 127 -> 1 token, 8 full, 1; seq 4: 1 token, 8 full
    assert lengths[32:42] == [1] + [128] * 8 + [1]
    assert lengths[42:] == [1] + [128] * 8
    assert m.last_chunk_indices == (19, 20, 31, 41, 50)
    assert m.seq_idx == (0,) * 20 + (1,) + (2,) * 11 + (3,) * 10 + (4,) * 9
    assert m.nchunks == 51


def test_tensors_keyword_names_and_dtypes():
    import torch

    m = build_varlen_metadata([3], [10], 4)
    t = m.tensors(dtype=torch.int64)
    assert set(t) == {"cu_seqlens", "cu_chunk_seqlens", "last_chunk_indices", "seq_idx"}
    assert t["cu_chunk_seqlens"].tolist() == [0, 1, 5, 9, 10]
    assert all(v.dtype == torch.int64 for v in t.values())


@pytest.mark.parametrize(
    "contexts, tokens, chunk, field",
    [
        ([0], [0], 64, "tokens[0]"),
        ([0, 0], [5, -1], 64, "tokens[1]"),
        ([-1], [5], 64, "context[0]"),
        ([0], [5], 48, "chunk_size"),
        ([0], [5], 0, "chunk_size"),
        ([0, 1], [5], 64, "contexts"),
        ([], [], 64, "tokens"),
        ([0], [2.5], 64, "tokens[0]"),
    ],
)
def test_rejects_impossible_input_naming_the_field(contexts, tokens, chunk, field):
    with pytest.raises(ValueError, match="^" + re.escape(field) + ":"):
        build_varlen_metadata(contexts, tokens, chunk)


def test_first_chunk_length_at_boundaries():
    assert first_chunk_length(0, 300, 64) == 64
    assert first_chunk_length(63, 300, 64) == 1
    assert first_chunk_length(64, 300, 64) == 64
    assert first_chunk_length(4224, 32, 256) == 32  # 4224 % 256 == 128: room for 128, only 32 tokens
