"""The fusion lab (scripts/fusion_lab.py) and the fused kernel it tunes (kernels/chunk_state_passing.py): under the
interpreter the fused kernel gives the pair's bits (chunk_state, then the state passing stage) under every
candidate tile, on every dry-run case and path, reading the initial state from the cache or a snapshot, and a
fused kernel fed the chunk states (teacher-forced) gives ssd_prefill's workspace and cache bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.support import loaded_script


@pytest.fixture(scope="module")
def fusion_lab():
    yield from loaded_script("fusion_lab")


@pytest.mark.interpreter(reason="the lab's dry run is its plumbing under the interpreter, on CPU tensors")
def test_the_dry_run_gives_the_pairs_bits_under_every_fused_config(fusion_lab):
    rows = fusion_lab.run(fusion_lab.WORKLOADS, reps=1, dry_run=True)
    tags = {r[0] for r in rows}
    assert tags == {"one/snapshot", "one/indexed", "two/snapshot"}, tags
    batched = [f"batched{b}" for b in fusion_lab.BATCHED_BLOCKS]
    assert {(r[0], r[1]) for r in rows} == {(t, k) for t in tags for k in ("pair", "fused")} | {
        (t, k) for t in tags if t.endswith("/snapshot") for k in batched}
    variants = [v for v in fusion_lab.fused_variants() if v != "shipped"]
    for tag in tags:  # each candidate once shipped and once per variant of the fused kernel
        configs = [r[2] for r in rows if r[0] == tag and r[1] == "fused"]
        assert len(configs) == len(set(configs)) == 2 * (1 + len(variants)), configs
        assert all(any(c.endswith(f" {v}") for c in configs) for v in variants), configs
    for tag, kind, config, _us, same, stable in rows:
        assert stable, (tag, kind, config)
        assert same == ("-" if kind == "pair" else "True"), (tag, kind, config, same)


@pytest.mark.interpreter(reason="the lab's kernel runs under the interpreter on CPU tensors")
def test_the_batched_state_passing_is_caught_when_it_walks_the_wrong_chunks(fusion_lab, monkeypatch):
    """Negative control of the ``batched`` rows' bit check: fed each sequence's last chunk one too early (its last
    chunk's state never stepped, the next sequence starting a chunk early), the shipped batched kernel must read as
    differing from the pair where a sequence has more than one chunk."""
    from kernels import state_passing_batched as spb

    real = spb.state_passing_batched

    def early(states, dA_cumsum, last_chunk_indices, **kwargs):
        real(states, dA_cumsum, (last_chunk_indices - 1).clamp(min=0), **kwargs)

    monkeypatch.setattr(spb, "state_passing_batched", early)
    monkeypatch.setattr(fusion_lab, "BATCHED_BLOCKS", (512,))
    rows = fusion_lab.run(fusion_lab.WORKLOADS, reps=1, dry_run=True)
    assert {r[0]: r[4] for r in rows if r[1] == "batched512"} == {"one/snapshot": "False", "two/snapshot": "False"}


def test_the_labs_bit_comparison_sees_one_ulp(fusion_lab):
    a = torch.randn(3, 4, dtype=torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[1, 2] += 1
    assert fusion_lab.same_bits([a], [a.clone()]) and not fusion_lab.same_bits([a], [b])


@pytest.mark.interpreter(reason="the lab's small cases are CPU tensors, run under the interpreter")
@pytest.mark.parametrize("name,path", [("one", "snapshot"), ("one", "indexed"), ("two", "snapshot")])
def test_teacher_forced_fused_kernel_is_the_state_passing_stage(fusion_lab, name, path):
    """Fed the chunk states (the chunk state stage's), the fused kernel's recurrence, workspace rows and cache
    writeback are ssd_prefill's, bit for bit, on either path; and it reads them (one changed element moves its
    rows), so the teacher-forced mode holds the recurrence alone, whatever the dot would give."""
    from kernel_lab import call_intermediates, small_cases

    from harness.cases.builder import build_inputs
    from kernels.chunk_state_passing import chunk_state_passing

    case = small_cases()[name]
    shipped, ws = call_intermediates(case, "cpu", path)  # its cache holds ssd_prefill's writeback

    def teacher_forced(chunk_states):
        fresh = build_inputs(case, "cpu").kwargs(path=path)  # the same inputs, the cache as before the call
        init = (dict(initial_state_indices=fresh["initial_state_indices"][:1],
                     has_initial_states=fresh["has_initial_states"][:1]) if path == "indexed"
                else dict(initial_states=ws["initial_states"]))
        out = torch.empty_like(ws["states"])
        chunk_state_passing(fresh["B"], fresh["x"], ws["dt_out"], ws["dA_cumsum"], fresh["cu_chunk_seqlens"],
                            fresh["seq_idx"], out=out, state_cache=fresh["state_cache"],
                            final_state_indices=fresh["final_state_indices"],
                            last_chunk_indices=fresh["last_chunk_indices"], chunk_states=chunk_states, **init)
        return out, fresh["state_cache"]

    out, cache = teacher_forced(ws["chunk_states"])
    assert fusion_lab.same_bits([out], [ws["states"]]), "workspace rows differ from ssd_prefill's"
    assert fusion_lab.same_bits([cache], [shipped["state_cache"]]), "cache differs from ssd_prefill's"
    changed = ws["chunk_states"].clone()
    changed[0, 0, 0, 0] += 1.0
    out, _ = teacher_forced(changed)
    assert not fusion_lab.same_bits([out], [ws["states"]]), "the given chunk states were not read"
