"""Checked-in configs per shape class (kernels.tuned_configs): the table's configs are shipped ones, and a stage's
pruning returns the checked-in config exactly for its class on its architecture, leaving every other shape to the
autotuner."""

from __future__ import annotations

import pytest

from kernels import bmm_chunk, chunk_cumsum, chunk_scan, chunk_state, state_passing, tuned_configs
from kernels.backend import INTERPRET

STAGES = {"chunk_cumsum": (chunk_cumsum.chunk_cumsum_kernel, chunk_cumsum.CONFIGS),
          "chunk_state": (chunk_state.chunk_state_kernel, chunk_state.CONFIGS),
          "bmm_chunk": (bmm_chunk.bmm_chunk_kernel, bmm_chunk.CONFIGS),
          "chunk_scan": (chunk_scan.chunk_scan_kernel, chunk_scan.CONFIGS),
          "state_passing": (state_passing._state_passing_kernel, state_passing.CONFIGS)}
# The serving shape's values of each stage's autotuning key.
SERVING_KEYS = {"chunk_cumsum": {"chunk_size": 256, "nheads": 64},
                "chunk_state": {"hdim": 64, "dstate": 128, "chunk_size": 256, "chunk_count_class": 1},
                "bmm_chunk": {"chunk_size": 256, "dstate": 128, "chunk_count_class": 1},
                "chunk_scan": {"chunk_size": 256, "hdim": 64, "dstate": 128},
                "state_passing": {"dim": 64 * 128, "chunk_count_class": 1}}


def test_every_checked_in_config_is_a_shipped_config_of_a_known_stage():
    assert tuned_configs.TUNED, "the measured table is empty"
    for stage, classes in tuned_configs.TUNED.items():
        assert stage in STAGES, f"TUNED names an unknown stage {stage!r}"
        _, configs = STAGES[stage]
        for key, wanted in classes.items():
            matching = [c for c in configs if tuned_configs.describe(c) == wanted]
            assert len(matching) == 1, f"{stage} {key}: {wanted} matches {len(matching)} of its CONFIGS"


def test_the_serving_class_is_pruned_to_its_checked_in_config_on_the_h200(monkeypatch):
    """The serving shape's real launch arguments reach the table through each stage's key."""
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "sm90")
    for stage, (kernel, configs) in STAGES.items():
        (chosen,) = kernel.early_config_prune(configs, dict(SERVING_KEYS[stage]))
        assert tuned_configs.describe(chosen) == tuned_configs.TUNED[stage][("sm90", *SERVING_KEYS[stage].values())]


def _serving_launch_arguments(stage: str, nchunks: int) -> dict:
    """The launcher's arguments for a serving-shape call of ``nchunks`` chunks (meta tensors: nothing runs)."""
    import torch

    T, H, P, N, Q = 8, 64, 64, 128, 256
    meta = lambda shape, dtype=torch.float32: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
    index = meta((nchunks + 1,), torch.int32)
    if stage == "chunk_state":
        return chunk_state.launch_arguments(meta((T, 1, N)), meta((T, H, P)), meta((H, nchunks, Q)),
                                            meta((H, nchunks, Q)), index, meta((nchunks, H, P, N)))
    if stage == "bmm_chunk":
        return bmm_chunk.launch_arguments(meta((T, 1, N)), meta((T, 1, N)), index, meta((nchunks, 1, Q, Q)))
    return state_passing.launch_arguments(
        meta((nchunks, H, P, N)), meta((H, nchunks, Q)), meta((nchunks,), torch.int32), meta((nchunks, H, P, N)),
        initial_states=meta((1, H, P, N)), state_cache=None, final_state_indices=None, last_chunk_indices=None)


@pytest.mark.parametrize("stage", ["chunk_state", "bmm_chunk", "state_passing"])
def test_a_few_chunks_and_many_take_their_own_checked_in_configs(monkeypatch, stage):
    """The launcher passes the chunk count's class; on the serving shape up to FEW_CHUNKS chunks get the checked-in
    config of class 0 (chunk_state: 64 x 64 tiles, twice the programs; bmm_chunk: 64 x 128 tiles; state passing:
    four warps), more get class 1's."""
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "sm90")
    kernel, configs = STAGES[stage]

    def chosen(nchunks: int) -> dict:
        (config,) = kernel.early_config_prune(configs, _serving_launch_arguments(stage, nchunks))
        return tuned_configs.describe(config)

    serving = {k: v for k, v in SERVING_KEYS[stage].items() if k != "chunk_count_class"}
    few, many = (tuned_configs.TUNED[stage][("sm90", *serving.values(), cls)] for cls in (0, 1))
    assert few != many
    assert [chosen(n) for n in (1, tuned_configs.FEW_CHUNKS)] == [few, few]
    assert [chosen(n) for n in (tuned_configs.FEW_CHUNKS + 1, 17)] == [many, many]


def test_pruning_returns_the_checked_in_config_only_for_its_class(monkeypatch):
    kernel, configs = STAGES["state_passing"]
    chosen = configs[-1]
    monkeypatch.setattr(tuned_configs, "TUNED",
                        {"state_passing": {("sm90", 8192, 1): tuned_configs.describe(chosen)}})
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "sm90")
    prune = kernel.early_config_prune
    serving = {"dim": 8192, "chunk_count_class": 1}
    assert prune(configs, serving) == [chosen]
    assert prune(configs, {}, **serving) == [chosen]  # launchers pass keywords
    other_dim = {**serving, "dim": 4096}
    assert prune(configs, other_dim) == _fitting(configs, 4096)  # another class: every config that fits stays
    assert prune(configs, {**serving, "chunk_count_class": 0}) == _fitting(configs, 8192)  # another chunk count
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "sm100")
    assert prune(configs, serving) == _fitting(configs, 8192)  # another GPU tunes for itself
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: None)
    # The interpreter keeps every config that fits too, the cheapest one to interpret (largest blocks) first.
    assert prune(configs, serving) == sorted(_fitting(configs, 8192), key=lambda c: -c.kwargs["BLOCK_SIZE"])


def _fitting(configs, dim: int) -> list:
    """The state passing's configs whose block does not overshoot a row of ``dim`` (a power of two) states."""
    return [c for c in configs if c.kwargs["BLOCK_SIZE"] <= dim]


def test_the_interpreter_runs_each_stage_with_its_largest_blocks(monkeypatch):
    """Under the interpreter the stand-in benchmarker keeps the first config after pruning: that is the one with
    the largest blocks (fewest programs and loop iterations to interpret) among those that fit, ties in list order."""
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: None)
    for stage, (kernel, configs) in STAGES.items():  # the serving shape: every config fits
        kept = kernel.early_config_prune(configs, dict(SERVING_KEYS[stage]))
        volumes = [tuned_configs.block_volume(c) for c in kept]
        assert volumes == sorted(volumes, reverse=True), stage
        if stage == "state_passing":  # under the interpreter, whole-row candidates too: those wider than the row go
            fits = _fitting(configs, SERVING_KEYS[stage]["dim"])
            assert {id(c) for c in kept} == {id(c) for c in fits}, stage
            if INTERPRET:
                assert len(fits) < len(configs), "no candidate wider than the serving row"
                assert kept[0].kwargs["BLOCK_SIZE"] == SERVING_KEYS[stage]["dim"], "a head's row is one block"
        elif stage != "chunk_cumsum":  # its fallback keeps the first config alone
            assert {id(c) for c in kept} == {id(c) for c in configs}, stage
        assert tuned_configs.block_volume(kept[0]) == max(tuned_configs.block_volume(c) for c in kept), stage


def test_every_tuned_stage_consults_the_table(monkeypatch):
    """The table's entry for one made-up class of each stage (the stage's last config) comes back from that stage's
    pruning; an entry that names no config of the stage is refused."""
    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "smXY")
    keys = {"chunk_cumsum": {"chunk_size": 7, "nheads": 3},
            "chunk_state": {"hdim": 7, "dstate": 3, "chunk_size": 5, "chunk_count_class": 0},
            "bmm_chunk": {"chunk_size": 7, "dstate": 3, "chunk_count_class": 0},
            "chunk_scan": {"chunk_size": 7, "hdim": 3, "dstate": 5},
            "state_passing": {"dim": 7, "chunk_count_class": 1}}
    order = {"chunk_cumsum": ("chunk_size", "nheads"),
             "chunk_state": ("hdim", "dstate", "chunk_size", "chunk_count_class"),
             "bmm_chunk": ("chunk_size", "dstate", "chunk_count_class"),
             "chunk_scan": ("chunk_size", "hdim", "dstate"), "state_passing": ("dim", "chunk_count_class")}
    for stage, (kernel, configs) in STAGES.items():
        key = ("smXY", *(keys[stage][name] for name in order[stage]))
        monkeypatch.setattr(tuned_configs, "TUNED", {stage: {key: tuned_configs.describe(configs[-1])}})
        assert kernel.early_config_prune(configs, dict(keys[stage])) == [configs[-1]], stage
        monkeypatch.setattr(tuned_configs, "TUNED", {stage: {key: {"BLOCK_SIZE": 3, "num_warps": 1}}})
        with pytest.raises(LookupError, match=f"{stage}'s checked-in config .* matches 0 of its configs"):
            kernel.early_config_prune(configs, dict(keys[stage]))


@pytest.mark.parametrize("stage", ["chunk_state", "bmm_chunk", "state_passing"])
def test_the_warmup_registry_compiles_the_config_of_each_chunk_count_class(monkeypatch, stage):
    """On the H200 the serving shape's binaries of these stages depend on the chunk count's class: a warmup that
    planned one class only would leave the other to compile at the first real call (the recompile guard's
    failure)."""
    import torch

    from kernels.warmup import ModelShape, plan

    monkeypatch.setattr(tuned_configs, "device_arch", lambda: "sm90")
    planned, _ = plan([(ModelShape(64, 64, 128), (torch.bfloat16,), (torch.bfloat16,))], [stage])
    binaries = {cls: {key.key for p in planned if p.spec.arguments["chunk_count_class"] == cls for key in p.keys}
                for cls in (0, 1)}
    assert binaries[0] and binaries[1] and not binaries[0] & binaries[1], binaries  # each class its own config
