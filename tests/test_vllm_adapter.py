"""The vLLM peer adapter (peers/vllm_ssd.py) and the script that assembles vLLM's ops (scripts/assemble_vllm_ops.py).

Without the ops the adapter must fail to import with the import it needed and the command that assembles them. With
them (``python scripts/assemble_vllm_ops.py`` writes ``.peers/vllm-0.33.0``, or an installed vllm), small cases pass
the harness's checks, and the two differences of contract the adapter declares are shown to be real: vLLM 0.33
stores a negative slot's final state before the cache (the adapter passes such calls through, and the harness's
untouched_storage sees the store; under the interpreter a store that would leave the storage is refused), and it has
no indexed path. The assembly itself is tested on small hand-made wheels: what it extracts, and that it stops on an
import it cannot account for and on a file whose hash does not match the wheel's RECORD.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import math
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from harness.cases.loader import load_case_file
from harness.checks import ProviderError, Status, load_provider, run_check
from harness.compare import assert_bits_equal
from reference.snapshot import gather_initial_states

REPO = Path(__file__).resolve().parents[1]
SPEC = "peers.vllm_ssd:provider"
ASSEMBLE = "python scripts/assemble_vllm_ops.py"
OPS_FOLDER = REPO / ".peers" / "vllm-0.33.0"

# One worker runs this module: each test launches vLLM's kernels, and on the GPU every worker that does compiles all
# of them (seconds each); in one process they compile once.
pytestmark = pytest.mark.xdist_group("vllm-kernels")


def _ops_available() -> bool:
    return (OPS_FOLDER / "vllm/model_executor/layers/mamba/ops/ssd_combined.py").is_file() or (
        importlib.util.find_spec("vllm") is not None)


needs_ops = pytest.mark.skipif(
    not _ops_available(),
    reason=f"vLLM's SSD ops are not assembled ({OPS_FOLDER} is absent and vllm is not installed): run {ASSEMBLE}")

CASES = """\
schema: ssd-case/1
cases:
  - id: vllm-direct
    description: one sequence continuing from a real state, direct writeback into another slot, padded rows
    seed: 21
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
    dtype: {io: float32, state: float32}
    options: {D: per_head, z: true, dt_bias: true, dt_softplus: true, dt_limit: [0.01, 0.5]}
    sequences:
      - {context: 5, tokens: 20, init_slot: 1, has_state: true, final_slot: 2}
    cache: {slots: 4, row_pad: 3, offset: 2, fill: nan}
    indices: {layout: contiguous, dtype: int32}
    call: {final_state: direct, path: auto}
  - id: vllm-batch-fp16
    description: two fp16 sequences, the first masked over a NaN slot, crossed slots from a block-table column
    seed: 22
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 2, chunk_size: 16}
    dtype: {io: float16, state: float32}
    options: {D: per_channel}
    sequences:
      - {context: 0, tokens: 10, init_slot: 0, has_state: false, final_slot: 1}
      - {context: 17, tokens: 20, init_slot: 1, has_state: true, final_slot: 0}
    cache: {slots: 3, row_pad: 2, offset: 1, fill: nan}
    indices: {layout: block_table, dtype: int64, columns: 4, init_column: 0, final_column: 2, rows_before: 1}
    call: {final_state: direct, path: auto}
  - id: vllm-returned
    description: two sequences returning fp16 final states (nothing written)
    seed: 23
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
    dtype: {io: float32, state: float16}
    sequences:
      - {context: 3, tokens: 9, init_slot: 0, has_state: true}
      - {context: 0, tokens: 12, init_slot: 1, has_state: false}
    cache: {slots: 2}
    call: {final_state: returned, path: auto}
  - id: vllm-checkpoint
    description: one sequence over three chunks returning every chunk-end state
    seed: 24
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
    dtype: {io: float32, state: float32}
    sequences:
      - {context: 0, tokens: 40, init_slot: 0, has_state: true}
    cache: {slots: 1}
    call: {final_state: checkpoint, path: auto}
  - id: vllm-warmed-layout
    description: vllm-direct's model configuration on the layouts the adapter's warmup covers (compact rows at the
      start of their storage, int32 contiguous slots)
    seed: 26
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
    dtype: {io: float32, state: float32}
    options: {D: per_head, z: true, dt_bias: true, dt_softplus: true, dt_limit: [0.01, 0.5]}
    sequences:
      - {context: 5, tokens: 20, init_slot: 1, has_state: true, final_slot: 2}
    cache: {slots: 4}
    indices: {layout: contiguous, dtype: int32}
    call: {final_state: direct, path: auto}
  - id: vllm-negative-final
    description: a padded sequence (final slot -1) whose slot -1 lies inside the cache's storage (offset = one row)
    seed: 25
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
    dtype: {io: float32, state: float32}
    sequences:
      - {context: 4, tokens: 20, init_slot: 0, has_state: true, final_slot: -1}
    cache: {slots: 2, offset: 128, fill: -7.25}
    call: {final_state: direct, path: auto}
  - id: vllm-padded-batch
    description: two sequences, the second padded (final slot -1), on a cache at the start of its storage; the
      builder's guard puts slot -1's row inside the storage
    seed: 27
    shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
    dtype: {io: float32, state: float32}
    sequences:
      - {context: 0, tokens: 12, init_slot: 0, has_state: false, final_slot: 1}
      - {context: 3, tokens: 9, init_slot: 1, has_state: true, final_slot: -1}
    cache: {slots: 2, fill: -7.25}
    call: {final_state: direct, path: auto}
"""

PASSING = {
    "vllm-direct": ["auto_vs_snapshot", "untouched_storage", "readonly_inputs", "determinism", "reference_bound"],
    "vllm-batch-fp16": ["untouched_storage", "masked_state", "reference_bound"],
    "vllm-returned": ["returned_shapes", "reference_bound"],
    "vllm-checkpoint": ["returned_shapes", "untouched_storage", "reference_bound"],
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("cases") / "vllm.yaml"
    path.write_text(CASES)
    return {c.id: c for c in load_case_file(path)}


@pytest.fixture(scope="module")
def vllm_provider():
    return load_provider(SPEC)


def test_missing_ops_name_the_import_and_the_assemble_command(tmp_path, monkeypatch):
    """An assembled-ops folder without the ops: the provider cannot load, and says which import failed, where it
    looked and which command assembles the ops."""
    monkeypatch.setenv("SSD_HARNESS_VLLM_OPS", str(tmp_path))
    monkeypatch.delitem(sys.modules, "peers.vllm_ssd", raising=False)
    with pytest.raises(ProviderError) as info:
        load_provider(SPEC)
    message = str(info.value)
    for expected in ("mamba_chunk_scan_combined_varlen", "vllm.model_executor.layers.mamba.ops.ssd_combined",
                     str(tmp_path), "SSD_HARNESS_VLLM_OPS", ASSEMBLE):
        assert expected in message, (expected, message)


@needs_ops
@pytest.mark.parametrize("case_id", sorted(PASSING))
def test_small_cases_pass_through_the_harness(cases, vllm_provider, device, case_id):
    from harness.checks import CheckContext

    case = cases[case_id]
    context = CheckContext(case, vllm_provider, device, SPEC)
    for check in PASSING[case_id]:
        result = run_check(case, check, vllm_provider, device=device, provider_spec=SPEC, context=context)
        assert result.status is Status.PASSED, (check, result.status, result.message or result.reason)


@needs_ops
def test_the_autotuning_check_sees_vllms_tuning_through_its_cache_hook(cases, vllm_provider, device):
    """vLLM launches a tuned key's kernel directly from its own config cache; through ``tuning_caches`` the check
    empties it, so vLLM's autotuners tune again (here after a plain call tuned every key) and the replay is judged."""
    from harness.checks import CheckContext

    case = cases["vllm-direct"]
    context = CheckContext(case, vllm_provider, device, SPEC)
    context.call(context.inputs())  # every key tuned, and cached by vLLM's launcher
    (cache,) = vllm_provider.tuning_caches()
    before = dict(cache)
    assert before, "vLLM's launcher cached no config"
    result = run_check(case, "autotune_idempotent", vllm_provider, device=device, provider_spec=SPEC)
    assert result.status is Status.PASSED, (result.status, result.message or result.reason)
    assert any("_chunk_scan_fwd_kernel" in name for name in result.stats["autotuners"]), result.stats
    assert result.stats["trial_launches"] > 0 and cache == before


@needs_ops
def test_a_mapping_that_drops_an_argument_is_caught(cases, vllm_provider, device):
    """Negative control for the test above: vLLM called without dt_softplus (an argument the adapter must pass on)
    fails reference_bound on the same case."""

    class DropsSoftplus:
        name = "vllm-without-dt_softplus"
        supported_paths = vllm_provider.supported_paths

        def ssd_prefill(self, *args, dt_softplus=False, **kwargs):
            return vllm_provider.ssd_prefill(*args, dt_softplus=False, **kwargs)

    assert cases["vllm-direct"].options.dt_softplus
    result = run_check(cases["vllm-direct"], "reference_bound", DropsSoftplus(), device=device, provider_spec=SPEC)
    assert result.status is Status.FAILED and "exceed the derived bound" in result.summary, result.summary


@needs_ops
def test_checkpoint_mode_with_final_slots_writes_nothing(cases, vllm_provider, device):
    """Ours: checkpoint mode writes nothing whatever final_state_indices holds. vLLM asserts against the pair, so
    the adapter must not hand it the cache: the call returns the chunk-end states and leaves the storage as it was."""
    case = cases["vllm-direct"]
    inputs = _inputs(case, device)
    kwargs = inputs.kwargs(final_state="checkpoint")
    kwargs["final_state_indices"] = inputs.final_state_indices
    before = inputs.cache_base.clone()
    returned = vllm_provider.ssd_prefill(**kwargs)
    nchunks = inputs.cu_chunk_seqlens.numel() - 1
    assert tuple(returned.shape) == (nchunks, *inputs.state_cache.shape[1:]), tuple(returned.shape)
    assert_bits_equal(inputs.cache_base, before, what="cache storage after a checkpoint call with final slots")


@needs_ops
def test_indexed_path_is_unsupported_not_passed(cases, vllm_provider, device):
    result = run_check(cases["vllm-direct"], "indexed_vs_snapshot", vllm_provider, device=device, provider_spec=SPEC)
    assert result.status is Status.UNSUPPORTED and "lacks the indexed path" in result.reason, result.reason
    with pytest.raises(ValueError, match="no indexed path"):
        inputs = _inputs(cases["vllm-direct"], device)
        vllm_provider.ssd_prefill(**inputs.kwargs(path="indexed"))


def _inputs(case, device):
    from harness.cases.builder import build_inputs

    return build_inputs(case, device)


@needs_ops
def test_vllm_stores_a_negative_slots_final_state_before_the_cache(cases, device):
    """The root cause of the regression case (cases/regressions/vllm-0.33-negative-final-slot.yaml): called
    directly, vLLM 0.33 writes the final state of a sequence whose final slot is -1 into the row before slot 0 (here
    inside the storage, one row of offset), instead of nothing. If a vLLM release guards negative slots, this fails
    and the regression case's xfail turns into a strict XPASS: drop both then."""
    from peers import vllm_ssd

    case = cases["vllm-negative-final"]
    inputs = _inputs(case, device)
    want = _final_states(case, device)[0]

    kwargs = inputs.kwargs()
    row = inputs.state_cache[0].numel()
    before = inputs.cache_base.clone()
    vllm_ssd.mamba_chunk_scan_combined_varlen(
        kwargs["x"], kwargs["dt"], kwargs["A"], kwargs["B"], kwargs["C"], chunk_size=kwargs["chunk_size"],
        cu_seqlens=kwargs["cu_seqlens"], cu_chunk_seqlens=kwargs["cu_chunk_seqlens"],
        last_chunk_indices=kwargs["last_chunk_indices"], seq_idx=kwargs["seq_idx"], out=kwargs["out"],
        initial_states=vllm_ssd._snapshot(inputs.state_cache, inputs.initial_state_indices,
                                          inputs.has_initial_states),
        state_dtype=inputs.state_cache.dtype, final_states_out=inputs.state_cache,
        final_state_indices=inputs.final_state_indices)
    assert inputs.state_cache.storage_offset() == row
    assert_bits_equal(inputs.cache_base[:row].view_as(want), want, what="the row before slot 0 (slot -1)")
    assert_bits_equal(inputs.cache_base[row:], before[row:], what="the cache's own slots")


def _final_states(case, device):
    """The case's final states as the adapter returns them (returned mode: nothing is written)."""
    from peers import vllm_ssd

    return vllm_ssd.provider.ssd_prefill(**_inputs(case, device).kwargs(final_state="returned"))


@needs_ops
@pytest.mark.parametrize("case_id", ["vllm-negative-final", "vllm-padded-batch"])
def test_a_negative_final_slot_goes_through_to_vllm_and_untouched_storage_sees_the_store(cases, vllm_provider,
                                                                                           device, case_id):
    """The adapter hands the padded call to vLLM as it is: the padded sequence's final state lands in the row
    before slot 0, which the harness's cases keep inside the storage (vllm-padded-batch has no offset: the builder's
    guard holds that row), so untouched_storage fails on it. Everything else vLLM computes is right: the output and
    the real slots pass reference_bound, and the call repeats exactly."""
    case = cases[case_id]
    padded = [b for b, s in enumerate(case.sequences) if s.final_slot < 0]
    inputs = _inputs(case, device)
    assert vllm_provider.ssd_prefill(**inputs.kwargs()) is None
    start = inputs.state_cache.storage_offset() - inputs.state_cache.stride(0)
    stored = inputs.cache_base[start : start + inputs.state_cache[0].numel()]
    want = _final_states(case, device)[padded[-1]]
    assert_bits_equal(stored.view_as(want), want, what="the row before slot 0 (slot -1)")

    result = run_check(case, "untouched_storage", vllm_provider, device=device, provider_spec=SPEC)
    assert result.status is Status.FAILED, (result.status, result.message or result.reason)
    assert "cache storage outside written slots" in result.summary, result.summary
    for check in ("reference_bound", "determinism", "readonly_inputs"):
        result = run_check(case, check, vllm_provider, device=device, provider_spec=SPEC)
        assert result.status is Status.PASSED, (check, result.status, result.message or result.reason)


@needs_ops
@pytest.mark.interpreter(reason="on a GPU the adapter passes the call through, and the store would land outside "
                                "this test's storage")
def test_under_the_interpreter_a_store_before_the_storage_is_refused(cases, vllm_provider, device):
    """A cache whose slot -1 row would start before its storage (not a harness case: its builder keeps that row
    inside): under the interpreter vLLM's store would write into the process's heap, so the adapter refuses the call
    and names the cause, before anything is written; its stage launches (which store final states too) likewise."""
    inputs = _inputs(cases["vllm-padded-batch"], device)
    cache = inputs.state_cache
    tight = torch.full((cache.shape[0] * cache.stride(0),), -7.25, dtype=cache.dtype)
    tight = tight.as_strided(cache.shape, cache.stride(), 0)
    tight.copy_(cache)
    before = tight.clone()
    kwargs = inputs.kwargs()
    kwargs["state_cache"] = tight
    with pytest.raises(NotImplementedError) as info:
        vllm_provider.ssd_prefill(**kwargs)
    message = str(info.value)
    for expected in ("final_state_indices [1, -1]", "HAS_FINAL_STATES", "slots [-1] (sequences [1])",
                     "storage_offset 0, stride(0) 128", "this process's heap", "on a GPU it passes it through"):
        assert expected in message, (expected, message)
    with pytest.raises(NotImplementedError, match="this process's heap"):
        vllm_provider.stage_launches(**{**kwargs, "path": "snapshot"})
    assert_bits_equal(tight, before, what="cache after the refused call and stage launches")


# --- the assembly script, on hand-made wheels --------------------------------------------------------------------

OPS = "vllm/model_executor/layers/mamba/ops"


def _script():
    spec = importlib.util.spec_from_file_location("assemble_vllm_ops", REPO / "scripts" / "assemble_vllm_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _wheel(path: Path, files: dict[str, str], *, tamper: str | None = None) -> Path:
    """A wheel holding ``files`` and a RECORD of their hashes (``tamper``: that file's content differs from its
    RECORD entry)."""
    wheel = path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    record = []
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            data = text.encode()
            record.append(_record_line(name, data))
            z.writestr(name, data + (b"# changed\n" if name == tamper else b""))
        z.writestr("vllm-0.33.0.dist-info/licenses/LICENSE", "Apache License 2.0\n")
        record.append(_record_line("vllm-0.33.0.dist-info/licenses/LICENSE", b"Apache License 2.0\n"))
        record.append("vllm-0.33.0.dist-info/RECORD,,")
        z.writestr("vllm-0.33.0.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


MINI_OPS = {
    f"{OPS}/__init__.py": "",
    f"{OPS}/ssd_combined.py": "from vllm.triton_utils import triton\nfrom .helper import f\n"
                              "from vllm.platforms import current_platform\n"
                              "if current_platform.is_cpu():\n"
                              "    import vllm.model_executor.layers.mamba.ops.cpu.mamba_ssm as cpu\n",
    f"{OPS}/helper.py": "from vllm.logger import init_logger\ndef f():\n    return 1\n",
    f"{OPS}/gather_initial_states.py": "from vllm.triton_utils import tl, triton\n",
    f"{OPS}/unused.py": "import vllm.engine\n",
}


def test_assembly_extracts_the_import_closure_and_writes_stand_ins(tmp_path):
    script = _script()
    out = tmp_path / "ops"
    written = {path: origin for path, origin, _ in script.assemble(_wheel(tmp_path, MINI_OPS), out, "0.33.0")}
    extracted = {p for p, o in written.items() if o == "vllm 0.33.0 wheel"}
    assert extracted == {f"{OPS}/__init__.py", f"{OPS}/ssd_combined.py", f"{OPS}/helper.py",
                         f"{OPS}/gather_initial_states.py"}, extracted  # not unused.py: nothing imports it
    for name in extracted:
        assert (out / name).read_text() == MINI_OPS[name]  # unchanged
    standins = {p for p, o in written.items() if o.startswith("stand-in")}
    assert {"vllm/triton_utils.py", "vllm/platforms.py", "vllm/logger.py", "vllm/__init__.py",
            "vllm/model_executor/layers/mamba/__init__.py"} <= standins, standins
    assert (out / "LICENSE").read_text() == "Apache License 2.0\n"
    assert not (out / OPS / "cpu").exists()


def test_assembly_stops_on_an_import_it_cannot_account_for(tmp_path):
    ops = dict(MINI_OPS)
    ops[f"{OPS}/helper.py"] = "from vllm.distributed import get_tp_group\n"
    with pytest.raises(SystemExit, match=r"helper.py line 1: imports vllm.distributed, which is neither"):
        _script().assemble(_wheel(tmp_path, ops), tmp_path / "ops", "0.33.0")
    assert not (tmp_path / "ops").exists()


def test_assembly_stops_on_a_name_a_stand_in_lacks(tmp_path):
    ops = dict(MINI_OPS)
    ops[f"{OPS}/helper.py"] = "from vllm.triton_utils import tldevice\n"
    with pytest.raises(SystemExit, match=r"imports \['tldevice'\] from vllm.triton_utils"):
        _script().assemble(_wheel(tmp_path, ops), tmp_path / "ops", "0.33.0")


def test_assembly_stops_on_a_file_that_does_not_match_the_record(tmp_path):
    with pytest.raises(SystemExit, match=r"helper.py does not match its sha256"):
        _script().assemble(_wheel(tmp_path, MINI_OPS, tamper=f"{OPS}/helper.py"), tmp_path / "ops", "0.33.0")


@pytest.mark.skipif(not (OPS_FOLDER / "ASSEMBLED.json").is_file(), reason=f"{OPS_FOLDER} absent: run {ASSEMBLE}")
def test_assembled_folder_is_small_and_all_python_from_the_wheel_is_vllms():
    """The folder travels to the GPU runner with the working tree (64 MiB for everything): it stays small."""
    import json

    manifest = json.loads((OPS_FOLDER / "ASSEMBLED.json").read_text())
    total = sum(p.stat().st_size for p in OPS_FOLDER.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert total < 1 << 20, total
    assert manifest["vllm_version"] == "0.33.0"
    assert f"{OPS}/ssd_combined.py" in manifest["files"] and f"{OPS}/gather_initial_states.py" in manifest["files"]


def test_interpreter_gather_matches_the_torch_snapshot_where_vllm_asserts_cuda(device):
    """Under the interpreter the adapter launches vLLM's gather kernel itself (the wrapper asserts CUDA/XPU); the
    copy must be the torch.where snapshot's, masked NaN rows included."""
    if not _ops_available():
        pytest.skip(f"vLLM's SSD ops are not assembled: run {ASSEMBLE}")
    from peers import vllm_ssd
    from reference import snapshot

    base = torch.randn(5 * 40 + 3).to(torch.float16)
    cache = base.as_strided((5, 2, 4, 4), (40, 16, 4, 1), 3)
    cache[2].fill_(float("nan"))
    table = torch.tensor([[9, 4], [9, 2], [9, 0]], dtype=torch.int32)
    indices = table[:, 1]  # a strided column
    has = torch.tensor([True, False, True])
    got = vllm_ssd._snapshot(cache.to(device), indices.to(device), has.to(device))
    want = snapshot.gather_initial_states(cache, indices, has)
    assert_bits_equal(got.cpu(), want, what="vLLM gather vs torch.where snapshot")


@needs_ops
def test_stage_hooks_are_the_ones_with_our_contract(cases, vllm_provider, device):
    """vLLM's gather has the stage contract, so gather_exact runs on it; its state passing has another contract and
    is not offered, so state_passing_exact is unsupported, naming the hook."""
    for case_id in ("vllm-direct", "vllm-batch-fp16"):
        result = run_check(cases[case_id], "gather_exact", vllm_provider, device=device, provider_spec=SPEC)
        assert result.status is Status.PASSED, (case_id, result.message or result.reason)
    result = run_check(cases["vllm-direct"], "state_passing_exact", vllm_provider, device=device, provider_spec=SPEC)
    assert result.status is Status.UNSUPPORTED and "lacks stage hook stages.state_passing" in result.reason, \
        result.reason


@needs_ops
@pytest.mark.parametrize("case_id", ["vllm-direct", "vllm-batch-fp16"])
def test_stage_launches_reproduce_the_adapters_call(cases, vllm_provider, device, case_id):
    """Each of vLLM's stages launched alone (the ``stage_launches`` hook the stage bench times) does the work of the
    adapter's call: the chunk scan's launch writes the call's output bit for bit on the hook's intermediates, the
    state passing's launch the call's final states into the cache, the gather's the snapshot copy."""
    from harness.cases.builder import build_inputs

    case = cases[case_id]
    called, launched = build_inputs(case, device), build_inputs(case, device)
    vllm_provider.ssd_prefill(**called.kwargs(path="snapshot"))
    kw = launched.kwargs(path="snapshot")
    launches = vllm_provider.stage_launches(**kw)
    assert set(launches) == {"gather", "chunk_cumsum", "chunk_state", "state_passing", "bmm_chunk", "chunk_scan"}
    # The hook's own call wrote the final slots (crossed slots: one is another sequence's initial slot), so the
    # gather's launch copies the cache as it is now: compare it before anything else writes.
    assert_bits_equal(launches["gather"](), gather_initial_states(launched.state_cache, kw["initial_state_indices"],
                                                                  kw["has_initial_states"]),
                      what=f"{case_id}: gather launched alone")
    launched.out.fill_(math.nan)
    launched.state_cache.fill_(math.nan)  # the final slots must be written by the state passing's launch itself
    assert_bits_equal(launches["chunk_scan"](), called.out, what=f"{case_id}: chunk scan launched alone: out")
    launches["state_passing"]()
    slots = kw["final_state_indices"].long()
    assert_bits_equal(launched.state_cache[slots], called.state_cache[slots],
                      what=f"{case_id}: state passing launched alone: final states")


@needs_ops
def test_stage_launches_refuse_what_they_do_not_mirror(cases, vllm_provider, device, monkeypatch):
    """The hook mirrors direct writeback only, and needs vLLM's private stage functions with the keywords it passes:
    anything else is NotImplementedError naming why (the stage bench then reports the peer's stages as not timed)."""
    from harness.cases.builder import build_inputs
    from peers import vllm_ssd

    kw = build_inputs(cases["vllm-direct"], device).kwargs(path="snapshot")
    with pytest.raises(NotImplementedError, match="direct writeback only"):
        vllm_provider.stage_launches(**{**kw, "final_state_indices": None})
    monkeypatch.setattr(vllm_ssd._combined, "_state_passing_fwd", lambda states, dA_cumsum: None)
    with pytest.raises(NotImplementedError, match=r"_state_passing_fwd with keyword\(s\) \['initial_states'"):
        vllm_provider.stage_launches(**kw)


@needs_ops
def test_warmup_hook_covers_its_layouts_and_the_guard_names_what_it_does_not(cases, vllm_provider, device):
    """The adapter warms by representative calls, as a vLLM server does. A case on the layouts they cover launches
    nothing new; vllm-direct's cache starts two elements into its storage, a pointer class no warmup call had,
    and the guard names vLLM's kernels that would compile for it. The gather's in-memory binaries are set aside
    first: earlier tests on this worker may have compiled the unwarmed class already, and then nothing compiles."""
    from harness.checks.hooks import model_configs
    from harness.guards.recompile import RecompileError, cold_in_memory_cache
    from harness.guards.server_warmup import guarded, warm

    gather = sys.modules["peers.vllm_ssd"]._gather_module._gather_initial_states_kernel
    with cold_in_memory_cache(gather):
        warmed = warm(vllm_provider, model_configs([cases["vllm-warmed-layout"]]))
        assert model_configs([cases["vllm-direct"]]) == list(warmed.configs)
        assert "_chunk_scan_fwd_kernel" in warmed.summary()
        with guarded(warmed) as record:
            result = run_check(cases["vllm-warmed-layout"], "determinism", vllm_provider, device=device,
                               provider_spec=SPEC)
        assert result.status is Status.PASSED and record.launches > 0, (result.message, record)
        with pytest.raises(RecompileError) as fired:
            with guarded(warmed):
                run_check(cases["vllm-direct"], "determinism", vllm_provider, device=device, provider_spec=SPEC)
        text = str(fired.value)
        if device == "cpu":  # under the interpreter the witness is the launch's key against the warmed keys
            assert "gather_initial_states._gather_initial_states_kernel: specialization not warmed up" in text, text
            assert "state_ptr: needed *fp32 unaligned, closest warmed *fp32 aligned16" in text, text
        else:  # on the GPU, the compile itself; the unaligned state pointer is the class no warmup call had
            kernel = "vllm.model_executor.layers.mamba.ops.gather_initial_states._gather_initial_states_kernel"
            assert f"compile hook: {kernel} compiled key [('*fp32', '')" in text, text


@pytest.mark.skipif(not (OPS_FOLDER / "vllm").is_dir(), reason=f"the assembled ops folder {OPS_FOLDER} is absent: "
                    f"run {ASSEMBLE}")
@pytest.mark.parametrize("keep", ["0", "1"])
def test_keep_racy_configs_makes_the_chunk_scan_filter_the_identity(keep):
    """On a platform that says CUDA sm90, vLLM 0.33 drops its racy chunk-scan configs when the module is imported;
    SSD_HARNESS_VLLM_KEEP_RACY_CONFIGS=1 keeps all 23 (every_config's sweep of them) and gives the platform back."""
    import os
    import subprocess
    import textwrap

    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(OPS_FOLDER)!r})
        import vllm.platforms as platforms
        sys.path.remove({str(OPS_FOLDER)!r})
        platform = platforms.current_platform
        platform.is_cuda = lambda: True
        platform.is_device_capability = lambda capability, device_id=0: capability in (90, (9, 0))
        import peers.vllm_ssd as adapter
        print(adapter.CHUNK_SCAN_CONFIGS, adapter.provider.name, platform.is_device_capability(90))
    """)
    env = {**os.environ, "SSD_HARNESS_VLLM_KEEP_RACY_CONFIGS": keep, "SSD_HARNESS_VLLM_OPS": str(OPS_FOLDER),
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    count, name, sm90 = proc.stdout.split()
    assert sm90 == "True"  # the platform as it was before the import
    if keep == "1":
        assert (int(count), name) == (23, "vllm-0.33.0-ssd-all-chunk-scan-configs")
    else:
        assert int(count) < 23 and name == "vllm-0.33.0-ssd", (count, name)
