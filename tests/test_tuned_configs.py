"""Checked-in configs per shape class (kernels.tuned_configs): the table's configs are shipped ones, and a stage's
pruning returns the checked-in config exactly for its class on its architecture, leaving every other shape to the
autotuner."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels import bmm_chunk, chunk_cumsum, chunk_scan, chunk_state, chunk_state_passing, tuned_configs

STAGES = {"chunk_cumsum": (chunk_cumsum.chunk_cumsum_kernel, chunk_cumsum.CONFIGS),
          "chunk_state": (chunk_state.chunk_state_kernel, chunk_state.CONFIGS),
          "bmm_chunk": (bmm_chunk.bmm_chunk_kernel, bmm_chunk.CONFIGS),
          "chunk_scan": (chunk_scan.chunk_scan_kernel, chunk_scan.CONFIGS)}
# The serving shape's values of each stage's autotuning key.
SERVING_KEYS = {"chunk_cumsum": {"chunk_size": 256, "nheads": 64},
                "chunk_state": {"hdim": 64, "dstate": 128, "chunk_size": 256, "chunk_count_class": 1},
                "bmm_chunk": {"chunk_size": 256, "dstate": 128},
                "chunk_scan": {"chunk_size": 256, "hdim": 64, "dstate": 128}}


def test_every_checked_in_config_is_a_shipped_config_of_a_known_stage():
    assert tuned_configs.TUNED, "the measured table is empty"
    for stage, classes in tuned_configs.TUNED.items():
        assert stage in STAGES, f"TUNED names an unknown stage {stage!r}"
        _, configs = STAGES[stage]
        for key, entry in classes.items():
            wanted = entry.config
            matching = [c for c in configs if tuned_configs.describe(c) == wanted]
            assert len(matching) == 1, f"{stage} {key}: {wanted} matches {len(matching)} of its CONFIGS"


def test_the_serving_class_is_pruned_to_its_checked_in_config_on_the_h200(monkeypatch):
    """The serving shape's real launch arguments reach the table through each stage's key."""
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "sm90")
    for stage, (kernel, configs) in STAGES.items():
        (chosen,) = kernel.early_config_prune(configs, dict(SERVING_KEYS[stage]))
        wanted = tuned_configs.TUNED[stage][("sm90", *SERVING_KEYS[stage].values())].config
        assert tuned_configs.describe(chosen) == wanted


def test_chunk_state_takes_the_smaller_tile_for_a_few_chunks_and_the_larger_for_many(monkeypatch):
    """The launcher passes the chunk count's class; on the serving shape up to FEW_CHUNKS chunks get the checked-in
    config of class 0 (64 x 64 tiles: twice the programs), more get class 1's (64 x 128)."""
    import torch

    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "sm90")
    kernel, configs = STAGES["chunk_state"]
    T, H, P, N, Q = 8, 64, 64, 128, 256

    def chosen(nchunks: int) -> dict:
        meta = lambda shape, dtype=torch.float32: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
        arguments = chunk_state.launch_arguments(meta((T, 1, N)), meta((T, H, P)), meta((H, nchunks, Q)),
                                                 meta((H, nchunks, Q)), meta((nchunks + 1,), torch.int32),
                                                 meta((nchunks, H, P, N)))
        (config,) = kernel.early_config_prune(configs, arguments)
        return tuned_configs.describe(config)

    few, many = (tuned_configs.TUNED["chunk_state"][("sm90", P, N, Q, cls)].config for cls in (0, 1))
    assert few != many
    assert [chosen(n) for n in (1, tuned_configs.FEW_CHUNKS)] == [few, few]
    assert [chosen(n) for n in (tuned_configs.FEW_CHUNKS + 1, 17)] == [many, many]


def test_pruning_returns_the_checked_in_config_only_for_its_class(monkeypatch):
    kernel, configs = STAGES["bmm_chunk"]
    chosen = configs[-1]
    monkeypatch.setattr(tuned_configs, "TUNED", {"bmm_chunk": {("sm90", 256, 128): _measured(chosen)}})
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "sm90")
    prune = kernel.early_config_prune
    assert prune(configs, {"chunk_size": 256, "dstate": 128}) == [chosen]
    assert prune(configs, {}, chunk_size=256, dstate=128) == [chosen]  # launchers pass keywords
    # another class: the configs that fit it stay (here one)
    assert prune(configs, {"chunk_size": 64, "dstate": 32}) == _fitting(configs, 64, 32) == [configs[1]]
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "sm100")
    assert prune(configs, {"chunk_size": 256, "dstate": 128}) == configs  # another GPU tunes for itself
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: None)
    # The interpreter keeps every config that fits too, the cheapest one to interpret (largest blocks) first.
    by_volume = sorted(configs, key=lambda c: -tuned_configs.block_volume(c))
    assert prune(configs, {"chunk_size": 256, "dstate": 128}) == by_volume


def _measured(config) -> tuned_configs.Measured:
    """A made-up table entry for ``config`` (a ``triton.Config`` or a dict as ``TUNED`` spells it)."""
    spelled = config if isinstance(config, dict) else tuned_configs.describe(config)
    return tuned_configs.Measured(spelled, tuned_configs.CHECKED_IN, (40,))


def _fitting(configs, chunk_size: int, dstate: int) -> list:
    """bmm_chunk's configs whose blocks do not overshoot a chunk of ``chunk_size`` tokens and ``dstate`` (powers of
    two)."""
    return [c for c in configs if max(c.kwargs["BLOCK_SIZE_M"], c.kwargs["BLOCK_SIZE_N"]) <= chunk_size
            and c.kwargs["BLOCK_SIZE_K"] <= dstate]


def test_the_interpreter_runs_each_stage_with_its_largest_blocks(monkeypatch):
    """Under the interpreter the stand-in benchmarker keeps the first config after pruning: that is the one with
    the largest blocks (fewest programs and loop iterations to interpret) among those that fit, ties in list order."""
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: None)
    for stage, (kernel, configs) in STAGES.items():  # the serving shape: every config fits
        kept = kernel.early_config_prune(configs, dict(SERVING_KEYS[stage]))
        volumes = [tuned_configs.block_volume(c) for c in kept]
        assert volumes == sorted(volumes, reverse=True), stage
        if stage != "chunk_cumsum":  # its fallback keeps the first config alone
            assert {id(c) for c in kept} == {id(c) for c in configs}, stage
        assert tuned_configs.block_volume(kept[0]) == max(tuned_configs.block_volume(c) for c in kept), stage


def test_every_tuned_stage_consults_the_table(monkeypatch):
    """The table's entry for one made-up class of each stage (the stage's last config) comes back from that stage's
    pruning; an entry that names no config of the stage is refused."""
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "smXY")
    keys = {"chunk_cumsum": {"chunk_size": 7, "nheads": 3},
            "chunk_state": {"hdim": 7, "dstate": 3, "chunk_size": 5, "chunk_count_class": 0},
            "bmm_chunk": {"chunk_size": 7, "dstate": 3}, "chunk_scan": {"chunk_size": 7, "hdim": 3, "dstate": 5}}
    order = {"chunk_cumsum": ("chunk_size", "nheads"),
             "chunk_state": ("hdim", "dstate", "chunk_size", "chunk_count_class"),
             "bmm_chunk": ("chunk_size", "dstate"), "chunk_scan": ("chunk_size", "hdim", "dstate")}
    for stage, (kernel, configs) in STAGES.items():
        key = ("smXY", *(keys[stage][name] for name in order[stage]))
        monkeypatch.setattr(tuned_configs, "TUNED", {stage: {key: _measured(configs[-1])}})
        assert kernel.early_config_prune(configs, dict(keys[stage])) == [configs[-1]], stage
        monkeypatch.setattr(tuned_configs, "TUNED", {stage: {key: _measured({"BLOCK_SIZE": 3, "num_warps": 1})}})
        with pytest.raises(LookupError, match=f"{stage}'s checked-in config .* matches 0 of its configs"):
            kernel.early_config_prune(configs, dict(keys[stage]))


def test_the_warmup_registry_compiles_chunk_states_config_of_each_chunk_count_class(monkeypatch):
    """On the H200 the serving shape's chunk_state binary depends on the chunk count's class: a warmup that planned
    one class only would leave the other to compile at the first real call (the recompile guard's failure)."""
    import torch

    from kernels.warmup import ModelShape, plan

    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "sm90")
    planned, _ = plan([(ModelShape(64, 64, 128), (torch.bfloat16,), (torch.bfloat16,))], ["chunk_state"])
    blocks = {dict(key.params)["BLOCK_SIZE_N"] for p in planned for key in p.keys}
    wanted = {f"={entry.config['BLOCK_SIZE_N']!r}" for entry in tuned_configs.TUNED["chunk_state"].values()}
    assert blocks == wanted == {"=64", "=128"}
    assert {p.spec.arguments["chunk_count_class"] for p in planned} == {0, 1}


# ---------------------------------------------------------------- provenance

ROOT = Path(__file__).resolve().parents[1]


def decision_headings(text: str) -> set[str]:
    """The entries of docs/decisions.md: each ``### `` heading without its trailing ``(date...)``."""
    return {re.sub(r"\s*\([^()]*\)\s*$", "", line[4:]).strip() for line in text.splitlines() if line.startswith("### ")}


def logged_runs(text: str) -> set[int]:
    """The run numbers the run log has an entry for (``## <date> run N:`` or ``runs N-M:``)."""
    runs = set()
    for first, last in re.findall(r"^## \S+ runs? (\d+)(?:-(\d+))?:", text, flags=re.M):
        runs.update(range(int(first), int(last or first) + 1))
    return runs


def unproven(entries, decisions: set[str], runs: set[int]) -> list[str]:
    """Each (name, entry) whose decision is no entry of docs/decisions.md or whose runs are missing from the run log."""
    problems = []
    for name, entry in entries:
        if entry.decision not in decisions:
            problems.append(f"{name}: no entry {entry.decision!r} in docs/decisions.md")
        if not entry.runs or not set(entry.runs) <= runs:
            problems.append(f"{name}: runs {entry.runs} not all in notes/gpu-runs.md")
    return problems


def every_checked_in_entry():
    for stage, classes in tuned_configs.TUNED.items():
        yield from ((f"{stage} {key}", entry) for key, entry in classes.items())
    yield from ((f"chunk_state_passing {key}", entry) for key, entry in chunk_state_passing.TUNED.items())


def test_every_checked_in_config_names_its_decision_and_runs():
    """Provenance as data: every entry of both checked-in tables (the stages' and the fused kernel's) is a
    ``Measured`` whose decision is an entry of docs/decisions.md and whose runs are entries of the run log."""
    decisions = decision_headings((ROOT / "docs" / "decisions.md").read_text())
    runs = logged_runs((ROOT / "notes" / "gpu-runs.md").read_text())
    entries = list(every_checked_in_entry())
    assert entries and all(isinstance(entry, tuned_configs.Measured) for _, entry in entries)
    assert unproven(entries, decisions, runs) == []


def test_an_entry_without_a_decision_or_a_logged_run_is_reported():
    entry = tuned_configs.Measured({"BLOCK_SIZE_H": 2}, "Nowhere", (9999,))
    assert decision_headings("### Checked-in configs (2026-12-01 to 2026-12-04)\n## Other\n") == {"Checked-in configs"}
    assert logged_runs("## 2026-12-03 runs 111-112: x\n## 2026-11-29 run 4: y\n") == {4, 111, 112}
    assert unproven([("x", entry)], {"Checked-in configs"}, {4}) == [
        "x: no entry 'Nowhere' in docs/decisions.md", "x: runs (9999,) not all in notes/gpu-runs.md"]
