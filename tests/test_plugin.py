"""The pytest plugin: items per case and check, collection errors, skips with reasons, xfail/XPASS, xdist pinning,
junit properties and the merged JSON report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import backend
from harness.cases.loader import load_case_file
from harness.compile_claims import CLAIMS_ENV
from harness.report import ItemRecord, Report, merge_reports, summary_lines
from ssd_pytest import plugin, state, workers, xdist_scheduling
from ssd_pytest.items import is_case_file
from tests import broken_providers as bp
from tests.support import needs_cpu_interpreter, unset_for_the_test

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _providers_imported_outside():
    """pytester restores sys.modules after each in-process run; importing the providers (and Triton) here keeps
    them in the snapshot, so inner runs do not re-import Triton's native modules (which cannot be loaded twice)."""
    from harness.checks import load_provider

    load_provider("kernels:provider")
    load_provider("reference:provider")


@pytest.fixture
def tiny(pytester) -> Path:
    return pytester.makefile(".yaml", tiny=bp.TINY_CASES)


def run_inner(pytester, device, *args):
    """An in-process pytest session with the plugin, on the session's device (the interpreter cannot run where
    numpy >= 2.4, as on the GPU runner), its items in this process: these tests are about the plugin, and a
    supervised child per session re-imports torch and initialises the device (tests/test_isolation.py covers it)."""
    return pytester.runpytest_inprocess("-p", "ssd_pytest.plugin", "--device", device, "-p", "no:cacheprovider",
                                        "-rsx", "--isolation", "none", *args)


@pytest.mark.parametrize("provider_name", sorted(bp.CAUGHT_BY))
def test_pytest_items_catch_each_broken_provider(pytester, tiny, provider_name, device):
    check, case_id = bp.CAUGHT_BY[provider_name]
    result = run_inner(pytester, device, str(tiny), "--provider", f"tests.broken_providers:{provider_name}",
                       "-k", f"{case_id} and {check}")
    assert result.ret == 1
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"*{case_id}::{check}*",
        f"repro: python -m harness repro {tiny} --check {check} --case {case_id} "
        f"--provider tests.broken_providers:{provider_name} --device {device}",
    ])


@pytest.mark.parametrize(("provider_name", "summary"), [
    ("wrong_slot", "cache storage outside written slots [[]2[]] (storage elements): * of * elements differ in bits "
                   "(torch.float32, shape (*)), max ulp * among the finite ones"),
    ("ignores_initial_state", "out vs fp64 sequential reference: * of * elements exceed the derived bound "
                              "(max |err| *, max ulp *)"),
])
def test_the_short_summary_line_of_a_failure_says_what_differed(pytester, tiny, monkeypatch, provider_name, summary,
                                                                 device):
    """``-rf``: the FAILED line ends with the failure's first line, which says what differed, in how many elements
    and by how many ulps (the breakages wrap the reference provider: quick on either device)."""
    monkeypatch.setenv("COLUMNS", "1000")  # pytest trims the line to the terminal's width
    check, case_id = bp.CAUGHT_BY[provider_name]
    provider = f"tests.broken_providers:on_reference.{provider_name}"
    result = run_inner(pytester, device, str(tiny), "--provider", provider, "-k", f"{case_id} and {check}", "-rf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"FAILED *tiny.yaml::{case_id}::{check} - {summary}"])


def test_items_are_file_case_check_and_unsupported_paths_skip_with_reason(pytester, tiny, device):
    result = run_inner(pytester, device, str(tiny), "--provider", "reference:provider", "-k", "tiny-direct and indexed")
    result.assert_outcomes(skipped=1)
    # The skip line points at the case in the YAML file (tiny-direct starts on its line 3), not at the plugin.
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] tiny.yaml:3: unsupported: provider 'reference' lacks the indexed "
                                 "path*"])
    collected = run_inner(pytester, device, str(tiny), "--collect-only", "-q")
    collected.stdout.fnmatch_lines(["tiny.yaml::tiny-direct::indexed_vs_snapshot",
                                    "tiny.yaml::tiny-batch::masked_state"])


def test_malformed_yaml_is_a_collection_error_naming_file_key_expected_found(pytester, device):
    bad = pytester.makefile(".yaml", bad=bp.TINY_CASES.replace("chunk_size: 16}", "chunk_size: 24}", 1))
    result = run_inner(pytester, device, str(bad))
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # a collection error; the other files would still run
    assert f"{bad}: cases[0].shape.chunk_size: expected a power of two >= 16, found 24" in result.stdout.lines
    assert "Traceback" not in result.stdout.str()


def test_duplicate_ids_across_files_name_both_files(pytester, device):
    first = pytester.makefile(".yaml", first=bp.TINY_CASES)
    second = pytester.makefile(".yaml", second=bp.TINY_CASES)
    result = run_inner(pytester, device, str(first), str(second), "--collect-only")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [f"{second}: id: expected an id unique across files, found 'tiny-direct' also in {first}"])


BIG = bp.TINY_CASES.replace("call: {final_state: direct, path: auto}\n  - id: tiny-batch",
                            "call: {final_state: direct, path: auto}\n    tiers: {cpu: false}\n  - id: tiny-batch")


def test_case_too_large_for_the_interpreter_is_skipped_with_reason(pytester, device):
    path = pytester.makefile(".yaml", big=BIG)
    result = run_inner(pytester, device, str(path), "-k", "tiny-direct and determinism")
    if device == "cpu":
        result.assert_outcomes(skipped=1)
        # Skipped at collection (a skip marker): the line names the YAML file, and the tier's own reason.
        result.stdout.fnmatch_lines(["SKIPPED [[]1[]] big.yaml: beyond the CPU interpreter tier: tiers.cpu is false "
                                     "in *big.yaml; runs on the GPU tier"])
    else:  # the CPU tier flag must not take the case from the GPU tier
        result.assert_outcomes(passed=1)


def test_the_gpu_marker_selects_the_case_items_outside_the_cpu_tier(pytester, device):
    """Every item of a case outside the CPU tier carries ``gpu`` (with the tier's reason): ``-m gpu`` collects them,
    ``-m "not gpu"`` the others."""
    path = pytester.makefile(".yaml", big=BIG)

    def collected(*args) -> list[str]:
        out = run_inner(pytester, device, str(path), "--collect-only", "-q", *args).stdout.lines
        return [line for line in out if "::" in line]

    everything = collected()
    gpu, not_gpu = collected("-m", "gpu"), collected("-m", "not gpu")
    assert gpu == [item for item in everything if "::tiny-direct::" in item] and gpu, (gpu, everything)
    assert sorted(gpu + not_gpu) == sorted(everything)


def test_the_gpu_marker_follows_the_cpu_tier_item_by_item(pytester, device):
    """A case beyond the CPU tier's per-case limit keeps its cheaper items on the CPU tier: only the items that do
    not fit carry ``gpu`` (harness.checks.tiers)."""
    from harness.checks.tiers import CPU_CASE_SECONDS, SECONDS_PER_BLOCK

    # tiny-direct over 8 chunks, with as many heads as make two calls fit the tier's case budget and three not
    heads = round(CPU_CASE_SECONDS / SECONDS_PER_BLOCK / 20)
    two = bp.TINY_CASES.split("  - id: tiny-batch")[0].replace(
        "nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16",
        f"nheads: {heads}, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16").replace("tokens: 20", "tokens: 120")
    path = pytester.makefile(".yaml", wide=two)
    out = run_inner(pytester, device, str(path), "--collect-only", "-q", "-m", "gpu").stdout.lines
    gpu = sorted(line.rsplit("::", 1)[1] for line in out if "::" in line)
    # The stage checks, the one call on the case's path that four checks read, and determinism's second call fit;
    # the snapshot and indexed calls, the tuning from scratch and the forced configs do not.
    assert gpu == ["auto_vs_snapshot", "autotune_idempotent", "every_config", "indexed_vs_snapshot"], gpu


# The GPU's collection without a GPU: the device the plugin decided, replaced by "cuda" once every plugin has
# configured (the tier decisions read it at collection), and each collected item's skip reason written down.
AS_ON_THE_GPU = """
import json
import pytest
from ssd_pytest import state

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    config.stash[state.DEVICE] = "cuda"

def pytest_collection_finish(session):
    skips = {}
    for item in session.items:
        marker = item.get_closest_marker("skip")
        skips[item.nodeid.split("::", 1)[1]] = marker.kwargs["reason"] if marker else None
    (session.config.rootpath / "skips.json").write_text(json.dumps(skips))
"""


def _skips_on_the_gpu(pytester, device, *args) -> dict:
    pytester.makeconftest(AS_ON_THE_GPU)
    result = run_inner(pytester, device, "--collect-only", "-q", *args)
    assert result.ret == 0, result.stdout.str()
    return json.loads((pytester.path / "skips.json").read_text())


def test_on_the_gpu_every_config_is_skipped_unless_named_with_the_reason(pytester, tiny, device):
    """A default GPU run skips every_config's items (each config it forces is a binary of its own there) with a
    reason that says why and how to run it; every other item keeps running."""
    from harness.checks.tiers import gpu_default_reason

    skips = _skips_on_the_gpu(pytester, device, str(tiny))
    every = {item: why for item, why in skips.items() if item.endswith("::every_config")}
    assert len(every) == 3 and all(why and why.startswith("not run by default on the GPU: ") for why in every.values())
    assert all("--check every_config runs it" in why for why in every.values()), every
    case = load_case_file(tiny)[0]
    assert every[f"{case.id}::every_config"] == gpu_default_reason(case, "every_config")
    assert {item: why for item, why in skips.items() if why} == every, skips  # nothing else is skipped


def test_on_the_gpu_check_every_config_runs_it_and_only_it(pytester, tiny, device):
    skips = _skips_on_the_gpu(pytester, device, str(tiny), "--check", "every_config")
    assert sorted(skips) == ["tiny-batch::every_config", "tiny-direct::every_config", "tiny-returned::every_config"]
    assert set(skips.values()) == {None}, skips


def test_on_the_gpu_a_case_naming_every_config_runs_it_by_default(pytester, device):
    regression = ROOT / "cases" / "regressions" / "every-config-serving-shapes.yaml"
    path = pytester.path / "serving.yaml"
    path.write_text(regression.read_text())
    skips = _skips_on_the_gpu(pytester, device, str(path))
    assert len(skips) == len(load_case_file(regression)) and all(k.endswith("::every_config") for k in skips)
    assert set(skips.values()) == {None}, skips


def test_an_unnamed_every_config_skipped_on_the_gpu_reaches_no_provider(pytester, tiny, device):
    """Run, not only collected: the skip comes before any setup or provider process, its line names the reason."""
    pytester.makeconftest(AS_ON_THE_GPU)
    result = run_inner(pytester, device, str(tiny), "-k", "tiny-direct and every_config")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] tiny.yaml*: not run by default on the GPU: on the GPU each config "
                                 "it forces is a binary of its own to compile*--check every_config runs it*"])


def test_check_names_an_unknown_check_as_a_usage_error(pytester, tiny, device):
    result = run_inner(pytester, device, str(tiny), "--check", "no_such_check")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--check: unknown [[]'no_such_check'[]]; known: *every_config*"])


def test_check_keeps_the_named_checks_items_on_the_cpu_tier_too(pytester, tiny, device):
    out = run_inner(pytester, device, str(tiny), "--collect-only", "-q", "--check", "determinism",
                    "--check", "reference_bound").stdout.lines
    checks = sorted({line.rsplit("::", 1)[1] for line in out if "::" in line})
    assert checks == ["determinism", "reference_bound"], out


def test_xfail_is_honoured_and_stale_xfail_fails_strictly(pytester, device):
    xfail = bp.TINY_CASES.replace("    call: {final_state: direct, path: auto}\n  - id: tiny-batch",
                                  "    call: {final_state: direct, path: auto}\n"
                                  "    expect: {xfail: 'issue 7: final slot written one off'}\n  - id: tiny-batch")
    path = pytester.makefile(".yaml", xf=xfail)
    caught = run_inner(pytester, device, str(path), "--provider", "tests.broken_providers:wrong_slot",
                       "-k", "tiny-direct and untouched")
    caught.assert_outcomes(xfailed=1)
    stale = run_inner(pytester, device, str(path), "-k", "tiny-direct and determinism")
    stale.assert_outcomes(failed=1)
    stale.stdout.fnmatch_lines(["*XPASS(strict): determinism passed but the case expects a failure*"])


def test_an_xfail_for_named_providers_applies_to_them_only(pytester, device):
    broken = "tests.broken_providers:wrong_slot"
    scoped = bp.TINY_CASES.replace("    call: {final_state: direct, path: auto}\n  - id: tiny-batch",
                                   "    call: {final_state: direct, path: auto}\n"
                                   f"    expect: {{xfail: 'writes the slot after its own', providers: [{broken}]}}\n"
                                   "  - id: tiny-batch")
    path = pytester.makefile(".yaml", scoped=scoped)
    caught = run_inner(pytester, device, str(path), "--provider", broken, "-k", "tiny-direct and untouched")
    caught.assert_outcomes(xfailed=1)
    caught.stdout.fnmatch_lines([f"*expected failure with --provider {broken}: writes the slot after its own*"])
    ours = run_inner(pytester, device, str(path), "-k", "tiny-direct and untouched")
    ours.assert_outcomes(passed=1)
    ours_listed = pytester.makefile(".yaml", stale=scoped.replace(broken, "kernels:provider"))
    stale = run_inner(pytester, device, str(ours_listed), "-k", "tiny-direct and untouched")
    stale.assert_outcomes(failed=1)
    stale.stdout.fnmatch_lines(["*XPASS(strict): untouched_storage passed but the case expects a failure with "
                                "--provider kernels:provider (writes the slot after its own)*"])


def test_shards_cover_every_item_once_and_keep_each_case_whole(pytester, tiny, device):
    def ids(*extra):
        out = run_inner(pytester, device, str(tiny), "--collect-only", "-q", *extra).stdout.lines
        return {line for line in out if "::" in line}

    def cases(nodeids):
        return {i.rsplit("::", 1)[0] for i in nodeids}

    everything = ids()
    first, second = ids("--shard", "1/2"), ids("--shard", "2/2")
    assert first and second and not first & second and first | second == everything
    assert not cases(first) & cases(second)  # a case's checks share one shard (its inputs are built once)
    # Measured costs (--durations-from): the case of the one item measured as slow gets a shard to itself.
    slow = sorted(everything)[0]
    earlier = pytester.path / "earlier.json"
    Report([ItemRecord(i, "passed", duration=100.0 if i == slow else 0.1) for i in everything]).write(earlier)
    measured = [ids("--shard", f"{k}/2", "--durations-from", str(earlier)) for k in (1, 2)]
    assert measured[0] | measured[1] == everything and not cases(measured[0]) & cases(measured[1]), measured
    assert cases({slow}) in (cases(measured[0]), cases(measured[1])), measured
    bad = run_inner(pytester, device, str(tiny), "--collect-only", "--shard", "1/2", "--durations-from",
                    str(pytester.path / "none.json"))
    assert bad.ret != 0 and "--durations-from" in "\n".join(bad.errlines) and "none.json" in "\n".join(bad.errlines)


def test_workers_are_pinned_to_gpus_round_robin(monkeypatch, tmp_path):
    assert [workers.gpu_for_worker(f"gw{i}", ["0", "1"]) for i in range(5)] == ["0", "1", "0", "1", "0"]
    assert workers.gpu_for_worker("gw3", ["4", "6", "7"]) == "4"
    with pytest.raises(ValueError):
        workers.gpu_for_worker("master", ["0"])
    monkeypatch.setenv(workers.GPU_LIST_ENV, "2,3")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    unset_for_the_test(monkeypatch, "CUDA_VISIBLE_DEVICES")
    workers.pin_worker("gw1")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    # The Triton cache stays shared across workers (atomic publish makes that safe; see workers.pin_worker).
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path)


def test_xdist_work_units_are_whole_cases():
    assert xdist_scheduling.case_scope("cases/corpus/direct.yaml::direct-001-x::reference_bound") == \
        "cases/corpus/direct.yaml::direct-001-x"
    assert xdist_scheduling.case_scope("c.yml::one::determinism") == "c.yml::one"
    # Python tests are each their own unit: one slow parametrized file must not land on one worker.
    assert xdist_scheduling.case_scope("tests/test_gather.py::test_x[a-b]") == "tests/test_gather.py::test_x[a-b]"
    assert xdist_scheduling.case_scope("tests/test_a.py::TestK::test_m") == "tests/test_a.py::TestK::test_m"
    # xdist_group(name), as the workers report it: one unit per group name.
    groups = {"tests/test_ssd_warmup.py::test_x[a-b]": "ssd_warmup", "tests/test_ssd_warmup.py::test_y": "ssd_warmup"}
    assert xdist_scheduling.case_scope("tests/test_ssd_warmup.py::test_x[a-b]", groups) == \
        xdist_scheduling.case_scope("tests/test_ssd_warmup.py::test_y", groups) == "xdist_group:ssd_warmup"
    assert xdist_scheduling.case_scope("tests/test_a.py::test_z", groups) == "tests/test_a.py::test_z"


def test_second_units_go_to_the_nodes_with_the_cheapest_first_units(tmp_path, monkeypatch):
    """The scheduler itself, with stand-in nodes: four single-test units by measured cost (40, 30, 20, 10, then
    4, 3, 2, 1 s) on four nodes. Round one hands out 40/30/20/10 s in node order; round two goes in reverse, so the
    node running the 10 s unit gets the 4 s one and the 40 s node the 1 s one (xdist's own order gave the 40 s node
    the 4 s unit too)."""
    costs = {f"tests/test_t.py::test_{c}": float(c) for c in (40, 30, 20, 10, 4, 3, 2, 1)}
    earlier = tmp_path / "earlier.json"
    Report([ItemRecord(n, "passed", duration=d) for n, d in costs.items()]).write(earlier)
    monkeypatch.delenv(xdist_scheduling.GROUPS_FILE_ENV, raising=False)
    options = {"dist": "load", "durations_from": str(earlier), "tx": ["4*popen"]}
    config = SimpleNamespace(getoption=lambda name, default=None: options.get(name, default),
                             getvalue=lambda name: options[name], option=SimpleNamespace(loadscopereorder=True),
                             stash=pytest.Stash())

    sched = plugin.pytest_xdist_make_scheduler(config, log=None)
    nodes = _stand_in_nodes([f"gw{i}" for i in range(4)])
    collection = list(costs)
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    assigned = {n.name: [int(collection[i].rsplit("_", 1)[1]) for i in n.sent] for n in nodes}
    assert assigned == {"gw0": [40, 1], "gw1": [30, 2], "gw2": [20, 3], "gw3": [10, 4]}, assigned


def _stand_in_nodes(names):
    class Node:
        def __init__(self, name):
            self.name, self.sent, self.shutting_down = name, [], False
            self.gateway = SimpleNamespace(id=name)

        def send_runtest_some(self, indices):
            self.sent += indices

        def shutdown(self):
            self.shutting_down = True

    return [Node(name) for name in names]


def test_workers_with_roles_get_their_own_kind_first(monkeypatch):
    """With roles (one case worker of two: gw0), the scheduler hands gw0 the case units and gw1 the tests while
    there are any of its kind, then the other kind: no unit waits while a worker idles."""
    monkeypatch.delenv(xdist_scheduling.GROUPS_FILE_ENV, raising=False)
    options = {"dist": "load", "durations_from": None, "tx": ["2*popen"]}
    config = SimpleNamespace(getoption=lambda name, default=None: options.get(name, default),
                             getvalue=lambda name: options[name], option=SimpleNamespace(loadscopereorder=True),
                             stash=pytest.Stash())
    config.stash[state.CASE_WORKERS] = 1
    collection = ["tests/test_a.py::test_1", "tests/test_a.py::test_2", "tests/test_a.py::test_3",
                  "cases/c.yaml::one::determinism", "cases/c.yaml::one::masked_state", "cases/c.yaml::two::determinism"]
    sched = plugin.pytest_xdist_make_scheduler(config, log=None)
    nodes = _stand_in_nodes(["gw0", "gw1"])
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    sent = {n.name: [collection[i] for i in n.sent] for n in nodes}
    assert sent == {"gw0": collection[3:], "gw1": collection[:2]}, sent  # two units each: case units to gw0
    for index in nodes[0].sent:  # gw0 finishes its cases: the one unit left is a test, and it goes to gw0
        sched.mark_test_complete(nodes[0], index)
    assert [collection[i] for i in nodes[0].sent[3:]] == ["tests/test_a.py::test_3"]


def test_roles_are_planned_only_where_they_save_contexts(tmp_path, monkeypatch):
    """``plan_worker_roles``: on a GPU with case items in children, under this plugin's scheduler, the case workers'
    count follows the case items' share of the measured time over the run's paths (``--ignore``d files left out);
    elsewhere no roles, and a value inherited from an enclosing run is removed."""
    earlier = tmp_path / "earlier.json"
    Report([ItemRecord("cases/c.yaml::one::determinism", "passed", duration=3.0),
            ItemRecord("tests/test_a.py::test_1", "passed", duration=1.0),
            ItemRecord("tests/test_b.py::test_1", "passed", duration=4.0)]).write(earlier)

    def config(device="cuda", isolation=None, tx=("16*popen",), ignore=(), args=()):
        options = {"dist": "load", "durations_from": str(earlier), "tx": list(tx), "isolation": isolation,
                   "ignore": [str(ROOT / path) for path in ignore]}
        return SimpleNamespace(getoption=lambda name, default=None: options.get(name, default),
                               option=SimpleNamespace(loadscopereorder=False), stash=pytest.Stash(), rootpath=ROOT,
                               args=[str(ROOT / a) for a in args]), device

    monkeypatch.delenv(xdist_scheduling.GROUPS_FILE_ENV, raising=False)
    monkeypatch.delenv(workers.CASE_WORKERS_ENV, raising=False)  # restored as it was after the test
    assert xdist_scheduling.plan_worker_roles(*config()) == 6  # 3 of 8 s: 6 of 16 workers
    assert os.environ[workers.CASE_WORKERS_ENV] == "6" and workers.planned_case_workers() == 6
    assert workers.role_of("gw5", 6) == workers.CASES and workers.role_of("gw6", 6) == workers.TESTS
    assert xdist_scheduling.plan_worker_roles(*config(ignore=["tests/test_b.py"])) == 12  # 3 of 4 s
    assert xdist_scheduling.plan_worker_roles(*config(args=["tests"])) == 1  # no case item: still one of each kind
    assert xdist_scheduling.plan_worker_roles(*config(tx=["popen", "popen"])) == 1
    for no_roles in (config(device="cpu"), config(isolation="none"), config(tx=["popen"])):
        os.environ[workers.CASE_WORKERS_ENV] = "3"
        assert xdist_scheduling.plan_worker_roles(*no_roles) is None
        assert workers.CASE_WORKERS_ENV not in os.environ and workers.planned_case_workers() is None


def test_on_a_gpu_each_worker_holds_one_context(tmp_path, device):
    """``-n 2`` on a GPU, one case worker and one test worker (``workers.role_of``; the case items are most of the
    measured time): the case worker ran the cases in its child and made no CUDA context of its own; the test worker
    ran the CUDA test in its own context and never started its child."""
    if device != "cuda":
        pytest.skip("worker roles are planned only for a GPU run (one context per worker instead of two); on the "
                    "CPU the plan's tests above cover them")
    (tmp_path / "tiny.yaml").write_text(bp.TINY_CASES)
    (tmp_path / "test_gpu.py").write_text(
        "import torch\ndef test_on_the_gpu():\n    assert torch.ones(4, device='cuda').sum().item() == 4\n")
    earlier, report = tmp_path / "earlier.json", tmp_path / "report.json"
    Report([ItemRecord("tiny.yaml::tiny-direct::determinism", "passed", duration=9.0),
            ItemRecord("test_gpu.py::test_on_the_gpu", "passed", duration=1.0)]).write(earlier)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ssd_pytest.plugin", str(tmp_path), "--device", "cuda", "-n", "2",
         # one unit of each kind: with more, the second round would hand each worker a second unit of any kind
         "-p", "no:cacheprovider", "-k", "tiny-direct and determinism or test_on_the_gpu", "--ssd-report", str(report),
         "--provider", "reference:provider", "--durations-from", str(earlier)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = json.loads(report.read_text())["meta"]
    assert meta["worker_roles"] == {"gw0": {"role": "cases", "cuda_context": False},
                                    "gw1": {"role": "tests", "cuda_context": True}}, meta["worker_roles"]
    items = json.loads(report.read_text())["items"]
    assert {i["worker"] for i in items if "tiny.yaml" in i["nodeid"]} == {"gw0"}, items
    assert [i["worker"] for i in items if "test_gpu.py" in i["nodeid"]] == ["gw1"], items
    assert not (meta.get("worker_isolation") or {}).get("gw1"), meta.get("worker_isolation")


def test_cpu_threads_are_shared_fairly_among_workers():
    assert workers.cpu_threads_per_worker(14, 16) == 1
    assert workers.cpu_threads_per_worker(4, 16) == 4
    assert workers.cpu_threads_per_worker(2, 2) == 1
    assert workers.cpu_threads_per_worker(1, 8) == 8
    assert workers.cpu_threads_per_worker(0, 8) == 8


def test_the_workers_blas_pools_get_a_share_of_the_cores_unless_the_user_chose(monkeypatch):
    """The controller sets the variable OpenBLAS, MKL and OpenMP size their pools from to each worker's share, before
    xdist starts the workers (the run above shows the workers inherit it); a value already set is kept; the plugin
    gives the variable back at the end of the run."""
    unset_for_the_test(monkeypatch, backend.BLAS_THREADS_ENV)
    monkeypatch.setattr(workers, "usable_cores", lambda: 16)
    workers.share_blas_threads(4)
    assert os.environ[backend.BLAS_THREADS_ENV] == "4"
    monkeypatch.setenv(backend.BLAS_THREADS_ENV, "3")
    workers.share_blas_threads(16)
    assert os.environ[backend.BLAS_THREADS_ENV] == "3"
    assert backend.BLAS_THREADS_ENV in plugin.RUN_ENVIRONMENT


def test_auto_workers_on_cpu_is_one_per_core(pytestconfig, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)

    class Config:
        def getoption(self, name):
            return {"device": "cpu", "workers_per_gpu": 3}[name]

    assert plugin.pytest_xdist_auto_num_workers(Config()) == len(os.sched_getaffinity(0))


def test_only_an_xdist_controller_that_starts_workers_skips_the_device_set_up(pytester, device):
    """The controller does not configure the device (it runs no kernels); any process that collects does, including
    ``--collect-only -n 2``, where xdist starts no workers and this process collects by itself."""

    class Config:
        def __init__(self, dist="load", tx=("popen", "popen"), collectonly=False, worker=False):
            self.option = SimpleNamespace(dist=dist, tx=list(tx))
            self.collectonly = collectonly
            if worker:
                self.workerinput = {}

        def getoption(self, name):
            return {"collectonly": self.collectonly}[name]

    assert workers.is_xdist_controller(Config())
    for not_controller in (Config(collectonly=True), Config(dist="no", tx=()), Config(worker=True)):
        assert not workers.is_xdist_controller(not_controller)
    # At collection time the kernels' backend is set, or a test module importing kernels gets the wrong one.
    pytester.makepyfile(test_backend_set="""
        import os
        WANTED = {"cpu": "1", "cuda": "0"}[os.environ["SSD_TEST_DEVICE"]]
        assert os.environ.get("TRITON_INTERPRET") == WANTED, os.environ.get("TRITON_INTERPRET")
        def test_x():
            pass
    """)
    env = {**os.environ, "SSD_TEST_DEVICE": device, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "ssd_pytest.plugin", "--device", device, "-n", "2",
                           "--collect-only", "-q", "-p", "no:cacheprovider", str(pytester.path)],
                          cwd=pytester.path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "1 test collected" in proc.stdout, proc.stdout + proc.stderr


def test_auto_workers_on_gpus_come_from_the_listed_gpus_without_torch(monkeypatch):
    """The xdist controller sizes and pins workers from CUDA_VISIBLE_DEVICES or the driver (NVML), not torch."""
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)

    class Config:
        def __init__(self, device):
            self.device = device
            self.stash = pytest.Stash()

        def getoption(self, name):
            return {"device": self.device, "workers_per_gpu": 3}[name]

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 6")
    assert backend.gpus_for_workers("auto") == backend.gpus_for_workers("cuda") == ["4", "6"]
    assert backend.gpus_for_workers("cpu") == []
    assert plugin.pytest_xdist_auto_num_workers(Config("auto")) == 6
    assert plugin.pytest_xdist_auto_num_workers(Config("cpu")) == len(os.sched_getaffinity(0))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert backend.gpus_for_workers("auto") == []
    with pytest.raises(ValueError, match="'cuda' requested but the NVIDIA driver reports no GPU"):
        backend.gpus_for_workers("cuda")
    assert plugin.pytest_xdist_auto_num_workers(Config("cuda")) == len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="device: expected one of"):
        backend.gpus_for_workers("gpu")
    assert backend.nvml_device_count("libno-such-nvml.so.1") == 0


GIB = 1 << 30


@pytest.mark.parametrize("cores, host_gib, gpu_gib, gpus, expected", [
    (16, 128, 139, 1, 16),   # one H200, 16 cores: one worker per core
    (128, 560, 139, 8, 16),  # eight H200s: the cores shared among them
    (64, 32, 80, 1, 8),      # host memory decides
    (64, 512, 24, 1, 6),     # the GPU's memory decides
    (4, 16, 80, 8, 1),       # fewer cores than GPUs: still one worker per GPU
    (1, 1, 0, 1, 1),         # nothing fits: at least one
])
def test_workers_per_gpu_come_from_the_hosts_cores_and_memory(cores, host_gib, gpu_gib, gpus, expected):
    assert workers.workers_per_gpu_for_host(cores, host_gib * GIB, gpu_gib * GIB, gpus) == expected


def test_auto_workers_on_a_gpu_host_default_to_the_hosts_rule_and_say_so_in_the_header(monkeypatch):
    """``-n auto --device cuda`` without ``--workers-per-gpu`` sizes the workers by ``workers_per_gpu_for_host``;
    the option overrides it; the run's header names the choice and what decided it."""
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(workers, "usable_cores", lambda: 16)
    monkeypatch.setattr(workers, "host_memory_bytes", lambda: 128 * GIB)
    monkeypatch.setattr(backend, "nvml_smallest_gpu_memory", lambda: 139 * GIB)

    class Config:
        def __init__(self, per_gpu):
            self.per_gpu = per_gpu
            self.stash = pytest.Stash()

        def getoption(self, name):
            return {"device": "cuda", "workers_per_gpu": self.per_gpu, "provider": None}[name]

    default, override = Config(None), Config(3)
    assert plugin.pytest_xdist_auto_num_workers(default) == 16
    assert plugin.pytest_xdist_auto_num_workers(override) == 3
    for config in (default, override):
        config.stash[state.DEVICE] = "cuda"
    assert plugin.pytest_report_header(default)[1] == (
        "ssd-harness: -n auto = 16 worker(s) per GPU x 1 GPU(s) (16 cores, 128 GiB host memory, 1 GPU(s) of 139 GiB)")
    assert plugin.pytest_report_header(override)[1].endswith("3 worker(s) per GPU x 1 GPU(s) (--workers-per-gpu)")


def test_the_smallest_gpus_memory_is_zero_without_a_driver():
    assert backend.nvml_smallest_gpu_memory("libno-such-nvml.so.1") == 0


def test_the_cuda_context_is_created_on_a_side_thread_through_the_driver():
    """What backend.create_cuda_context_in_background asks of the driver (on the GPU runner, libcuda itself): init,
    device 0 of the worker's pinned list, its primary context; on a side thread. No driver: no thread."""
    import ctypes
    import threading

    calls = []

    class Driver:
        def cuInit(self, flags):
            calls.append(("cuInit", flags, threading.current_thread().name))
            return 0

        def cuDeviceGet(self, device, ordinal):
            calls.append(("cuDeviceGet", ordinal))
            ctypes.cast(device, ctypes.POINTER(ctypes.c_int)).contents.value = 7
            return 0

        def cuDevicePrimaryCtxRetain(self, context, device):
            calls.append(("cuDevicePrimaryCtxRetain", device.value))
            return 0

    thread = backend.create_cuda_context_in_background(driver=Driver())
    thread.join(timeout=30)
    assert not thread.is_alive() and thread.daemon
    assert calls == [("cuInit", 0, "ssd-harness-cuda-context"), ("cuDeviceGet", 0), ("cuDevicePrimaryCtxRetain", 7)]
    assert backend.create_cuda_context_in_background(library="libno-such-cuda.so.1") is None
    # ``after``: the thread first waits on it (a worker on its forked child's context), and makes none when it
    # says no (the child ended without one: torch makes the worker's at its first CUDA call).
    for answer, expected in ((False, []), (True, ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"])):
        calls.clear()
        asked = []
        def after(answer=answer, asked=asked) -> bool:
            asked.append(threading.current_thread().name)
            return answer

        thread = backend.create_cuda_context_in_background(driver=Driver(), after=after)
        thread.join(timeout=30)
        assert asked == ["ssd-harness-cuda-context"] and [c[0] for c in calls] == expected


@pytest.mark.parametrize("device, forked, worker, expected", [
    ("cuda", True, "gw0", "after the child's"), ("cuda", False, "gw0", "at once"), ("cpu", True, "gw0", "none"),
    ("cuda", True, "case worker gw0", "none"), ("cuda", True, "test worker gw1", "at once")])
def test_a_worker_makes_its_context_after_its_forked_childs(monkeypatch, device, forked, worker, expected):
    """``workers.start_worker``: on a GPU the worker's context thread waits for its forked child's context
    (``spare.wait_for_spare_context``: the driver makes contexts one at a time, and the child's is the one the first
    case item needs); without a forked child it starts at once; on the CPU there is none. With roles (one case
    worker: gw0), a case worker makes none (its child's is the one it needs) and a test worker makes its own at
    once (its child starts only for a case item)."""
    import torch

    from harness.isolation import spare

    made = []
    monkeypatch.setattr(workers, "prefork_child", lambda config: forked)
    monkeypatch.setattr(backend, "create_cuda_context_in_background", lambda after=None: made.append(after) or "thread")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setenv(workers.GPU_LIST_ENV, "0")
    unset_for_the_test(monkeypatch, "CUDA_VISIBLE_DEVICES")
    worker_id = worker.rsplit(" ", 1)[-1]
    if " " in worker:
        monkeypatch.setenv(workers.CASE_WORKERS_ENV, "1")
    else:
        monkeypatch.delenv(workers.CASE_WORKERS_ENV, raising=False)
    config = SimpleNamespace(getoption=lambda name: device, add_cleanup=lambda fn: None, stash={})
    workers.start_worker(config, worker_id)
    assert {"after the child's": [spare.wait_for_spare_context], "at once": [None], "none": []}[expected] == made


def test_report_merge_and_summary_group_failures():
    a = Report([ItemRecord("f::c1::determinism", "failed", case_id="c1", check="determinism", family="single"),
                ItemRecord("f::c2::determinism", "passed", case_id="c2", check="determinism", family="multi")],
               meta={"worker": "gw0", "gpu": "0"})
    b = Report([ItemRecord("f::c2::determinism", "xpassed", case_id="c2", check="determinism", family="multi"),
                ItemRecord("f::c3::masked_state", "skipped", case_id="c3", check="masked_state", reason="why")],
               meta={"worker": "gw1"})
    merged = merge_reports([a, b])
    assert merged.meta["workers"] == ["gw0", "gw1"]
    assert merged.meta["worker_gpus"] == {"gw0": "0"} and "gpu" not in merged.meta  # where each worker ran
    assert merged.counts() == {"failed": 1, "skipped": 1, "xpassed": 1}
    text = "\n".join(summary_lines(merged.items))
    assert "failures by check:\n  determinism                 2  c1, c2" in text
    assert "failures by case family:" in text and "single" in text and "multi" in text
    # A failing test that is not a case item is not hidden behind "no failures".
    other = ItemRecord("tests/test_cli.py::test_x", "failed")
    text = "\n".join(summary_lines([ItemRecord("f::c2::determinism", "passed", case_id="c2", check="determinism"),
                                     other]))
    assert text == ("case items: 1 passed\nother tests: 1 failed\nother test failures:\n"
                    "  tests/test_cli.py::test_x"), text


def test_yaml_fixtures_under_tests_are_not_collected_as_cases():
    """The malformed files are fixtures: `pytest tests` (and the testpaths default) must not collect them as cases,
    while naming one explicitly still makes it a case (whose error is then reported: the malformed-YAML tests)."""
    def config(*args):
        return SimpleNamespace(args=list(args), rootpath=ROOT, invocation_params=SimpleNamespace(dir=ROOT),
                               stash=pytest.Stash())

    fixture = ROOT / "tests/malformed/xfail_without_reason.yaml"
    corpus = next((ROOT / "cases/corpus").glob("*.yaml"))
    assert fixture.exists()
    assert not is_case_file(fixture, config("tests"))
    assert not is_case_file(fixture, config())  # testpaths default
    assert not is_case_file(fixture, config(str(ROOT)))
    assert is_case_file(fixture, config("tests/malformed/xfail_without_reason.yaml"))
    assert is_case_file(corpus, config("tests")) and is_case_file(corpus, config())
    assert not is_case_file(ROOT / ".github/workflows/ci-cpu.yml", config(str(ROOT)))


def test_autotuning_results_are_shared_through_the_cache_on_cuda_only(monkeypatch):
    """GPU runs keep tuning results in the shared Triton cache (one benchmark per key for all workers); a caller's
    own choice wins, and the interpreter, which has no timer, is left alone."""
    unset_for_the_test(monkeypatch, backend.AUTOTUNE_CACHE_ENV)
    backend.share_autotuning_results()
    assert os.environ[backend.AUTOTUNE_CACHE_ENV] == "1"
    monkeypatch.setenv(backend.AUTOTUNE_CACHE_ENV, "0")
    backend.share_autotuning_results()
    assert os.environ[backend.AUTOTUNE_CACHE_ENV] == "0"
    monkeypatch.delenv(backend.AUTOTUNE_CACHE_ENV, raising=False)
    if backend.current_device() == "cpu":
        backend.configure("cpu")
        assert backend.AUTOTUNE_CACHE_ENV not in os.environ


def test_autotuning_budget_is_shortened_only_when_asked_and_parsed_strictly(monkeypatch):
    from kernels.backend import autotune_budget_ms
    from kernels.environment import AUTOTUNE_BUDGET_ENV

    assert autotune_budget_ms(None) == (25.0, 100.0) and autotune_budget_ms("") == (25.0, 100.0)
    assert autotune_budget_ms(backend.SHARED_GPU_AUTOTUNE_MS) == (1.0, 5.0)
    for bad in ("5", "1,0", "-1,5", "a,b", "1,2,3"):
        with pytest.raises(ValueError, match="SSD_AUTOTUNE_MS=.*expected 'warmup_ms,rep_ms'"):
            autotune_budget_ms(bad)
    unset_for_the_test(monkeypatch, AUTOTUNE_BUDGET_ENV)
    backend.shorten_autotuning()
    assert os.environ[AUTOTUNE_BUDGET_ENV] == backend.SHARED_GPU_AUTOTUNE_MS
    monkeypatch.setenv(AUTOTUNE_BUDGET_ENV, "25,100")
    backend.shorten_autotuning()
    assert os.environ[AUTOTUNE_BUDGET_ENV] == "25,100"


@needs_cpu_interpreter
def test_one_xdist_run_merges_reports_keeps_units_together_and_starts_the_costliest_first(tmp_path):
    """One ``-n 2`` run (three fresh processes, each importing torch, are the expensive part) shows:
    - junit properties on case items and one merged JSON report over both workers;
    - work units: a case's checks on one worker; a module marked ``xdist_group`` on one worker, the rest spread
      over both;
    - ``--durations-from``: the costliest unit is handed out first, wherever collection order puts it.
    It tests the plugin's machinery, not kernels: the PyTorch reference provider on device "cpu" wherever it runs."""
    (tmp_path / "tiny.yaml").write_text(bp.TINY_CASES)
    log = tmp_path / "order"
    log.mkdir()
    record = ("import os, pathlib\n"
              f"def mark(name):\n    (pathlib.Path({str(log)!r}) / os.environ['PYTEST_XDIST_WORKER']).open('a')"
              ".write(name + '\\n')\n")
    (tmp_path / "test_grouped.py").write_text(
        "import pytest, time\npytestmark = pytest.mark.xdist_group('heavy')\n" + record
        + "".join(f"def test_g{i}():\n    mark('g{i}')\n    time.sleep(0.2)\n" for i in range(4)))
    (tmp_path / "test_free.py").write_text(
        record + "".join(f"def test_f{i}():\n    mark('f{i}')\n" for i in range(6)))
    # An earlier run's report: the last free test was the slowest item by far.
    earlier = tmp_path / "earlier.json"
    Report([ItemRecord(f"test_free.py::test_f{i}", "passed", duration=60.0 if i == 5 else 0.01) for i in range(6)]
           ).write(earlier)
    # The controller imports no torch before it starts the workers (backend.gpus_for_workers: importing torch would
    # delay every worker's start).
    (tmp_path / "conftest.py").write_text(
        "import os, sys\n"
        "def pytest_xdist_setupnodes(config, specs):\n"
        f"    open({str(tmp_path / 'controller-torch')!r}, 'w').write(str('torch' in sys.modules))\n"
        f"    open({str(tmp_path / 'claims-dir')!r}, 'w').write(os.environ.get({CLAIMS_ENV!r}, ''))\n"
        "def pytest_sessionstart(session):\n"
        "    if hasattr(session.config, 'workerinput'):  # a worker claims something, as a GPU warmup would\n"
        "        from harness.compile_claims import ClaimBoard\n"
        "        ClaimBoard.from_env().try_claim(os.environ['PYTEST_XDIST_WORKER'])\n"
        f"        open({str(tmp_path)!r} + '/threads-' + os.environ['PYTEST_XDIST_WORKER'], 'w')"
        f".write(os.environ.get({backend.BLAS_THREADS_ENV!r}, 'unset'))\n"
        "        import atexit  # runs only if the worker leaves through the interpreter's shutdown\n"
        f"        atexit.register(lambda: open({str(tmp_path)!r} + '/atexit-' + os.environ['PYTEST_XDIST_WORKER'],"
        " 'w'))\n")
    junit, report = tmp_path / "junit.xml", tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ssd_pytest.plugin", str(tmp_path), "--device", "cpu", "-n", "2",
         # Hypothesis's plugin imports hypothesis in each worker's terminal summary, after xdist's workerfinished:
         # on a busy host that outlasts execnet's 5 s grace before it interrupts the worker, whose early exit
         # (the last cleanup) then never runs.
         "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
         "-k", "determinism or reference_bound or test_g or test_f",
         "--junitxml", str(junit), "--ssd-report", str(report), "--provider", "reference:provider",
         "--durations-from", str(earlier)],
        # Without an enclosing run's thread share: this run's controller sets its own.
        cwd=tmp_path, env={**{k: v for k, v in os.environ.items() if k != backend.BLAS_THREADS_ENV},
                           "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
        # Two cores for two workers: one torch thread each, so each forks its child (harness.isolation.forking) on
        # any host.
        preexec_fn=lambda: os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2]),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ssd-harness summary" in proc.stdout and "no failures" in proc.stdout
    # The controller prints one line per case from what its workers report (ssd_pytest.progress).
    for case in ("tiny-batch", "tiny-direct", "tiny-returned"):
        assert re.search(rf"^{case} +2 passed  \[[123]/3 cases, \d+s elapsed, (ETA \S+|ETA unknown|done)\]$",
                         proc.stdout, flags=re.MULTILINE), proc.stdout
    # Workers leave without the interpreter's shutdown once xdist has their results (workers.exit_worker_now), and xdist
    # takes that as a normal end, not a crash.
    assert not list(tmp_path.glob("atexit-*")), "a worker went through the interpreter's shutdown"
    # Each worker started with its share of the two cores for its BLAS and OpenMP pools (workers.share_blas_threads).
    assert {p.name: p.read_text() for p in tmp_path.glob("threads-*")} == {"threads-gw0": "1", "threads-gw1": "1"}
    assert "Not properly terminated" not in proc.stdout + proc.stderr and "crashed" not in proc.stdout
    data = json.loads(report.read_text())
    assert data["meta"]["workers"] == ["gw0", "gw1"]
    # Each worker's case items ran in a child forked at the worker's start (workers.prefork_child), which imported
    # nothing again and was configured while the worker collected.
    isolation = data["meta"]["worker_isolation"]
    assert sorted(isolation) == ["gw0", "gw1"], isolation
    assert all([s["how"] for s in i["starts"]] == ["fork"] for i in isolation.values()), isolation
    assert all(i["restarts"] == [] for i in isolation.values()), isolation
    # What each worker and its running child cost the host so far (timeline.process_cpu): a child that ran items
    # used CPU of its own.
    assert sorted(data["meta"]["worker_cpu"]) == ["gw0", "gw1"], data["meta"]
    for worker, usage in data["meta"]["worker_cpu"].items():
        child = isolation[worker]["starts"][-1]["cpu"]
        assert usage["user"] > 0 and child["user"] + child["system"] > 0 and child["minor_faults"] > 0, (usage, child)
    items = data["items"]
    case_items = [i for i in items if "tiny.yaml" in i["nodeid"]]
    assert sorted(i["nodeid"].split("::", 1)[1] for i in case_items) == sorted(
        f"{c}::{k}" for c in ("tiny-batch", "tiny-direct", "tiny-returned") for k in ("determinism", "reference_bound"))
    assert len(items) == len(case_items) + 10
    assert all(i["outcome"] == "passed" and i["duration"] > 0 for i in items)
    # When each item began (the report is sorted by node id): a worker's items do not overlap in time.
    for worker in ("gw0", "gw1"):
        spans = sorted((i["start"], i["start"] + i["duration"]) for i in items if i["worker"] == worker)
        assert spans and all(end <= next_start + 1e-3 for (_, end), (next_start, _) in pairwise(spans)), spans
    workers_of_case: dict[str, set] = {}
    for i in case_items:
        workers_of_case.setdefault(i["case_id"], set()).add(i["worker"])
    # xdist work units are whole cases (xdist_scheduling.case_scope): a case's inputs are built on one worker only.
    assert all(len(w) == 1 for w in workers_of_case.values()), workers_of_case
    assert not (tmp_path / "report.json.parts").exists() or not any((tmp_path / "report.json.parts").iterdir())
    cases_xml = ET.parse(junit).getroot().iter("testcase")
    props = [{p.get("name"): p.get("value") for p in tc.iter("property")} for tc in cases_xml]
    props = [p for p in props if p]
    assert len(props) == 6 and all({"case_id", "check", "seed", "family"} <= set(p) for p in props)
    assert all({"max_ulp", "bound_use"} <= set(p) for p in props if p["check"] == "reference_bound")
    assert all(0 < i["bound_use"] < 1 for i in case_items if i["check"] == "reference_bound"), case_items
    grouped = {i["worker"] for i in items if "test_grouped.py" in i["nodeid"]}
    assert len([i for i in items if "test_grouped.py" in i["nodeid"]]) == 4 and len(grouped) == 1, items
    assert {i["worker"] for i in items} == {"gw0", "gw1"}
    firsts = sorted(f.read_text().split()[0] for f in log.iterdir())
    # f5 (60 s measured) and the grouped unit (4 unmeasured items at the median, more than any case or other free
    # test) start first; collection order would have started with a case of tiny.yaml and test_f0.
    assert firsts == ["f5", "g0"], firsts
    assert (tmp_path / "controller-torch").read_text() == "False"
    # The workers' compile claims (harness.compile_claims): one folder for this session, gone when it ended.
    claims = (tmp_path / "claims-dir").read_text()
    assert claims and not os.path.exists(claims), claims
    assert data["meta"]["device"] == "cpu"  # from the workers' parts
    # Start-up phases (harness.timeline): the controller starts first, each worker's phases are in order and its
    # first item starts after it collected; every worker's compile ledger is in the report.
    meta = data["meta"]
    assert set(meta["phases"]) == {"process_start", "configured", "workers_finished", "session_end"}
    assert set(meta["worker_phases"]) == set(meta["worker_compiles"]) == {"gw0", "gw1"}
    for worker, phases in meta["worker_phases"].items():
        first = min(i["start"] for i in items if i["worker"] == worker)
        assert (meta["phases"]["process_start"] <= phases["process_start"] <= phases["configured"]
                <= phases["collected"] <= first <= phases["session_end"] <= meta["phases"]["workers_finished"]
                <= meta["phases"]["session_end"]), phases
    times = subprocess.run([sys.executable, "-m", "harness", "times", str(report)], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert times.returncode == 0 and "workers collected" in times.stdout, times.stdout + times.stderr


def test_item_durations_include_fixture_setup(pytester, device):
    """A slow module fixture is charged to the first item that sets it up, so `harness times` shows where it went."""
    pytester.makepyfile(test_slow_fixture="""
import time, pytest

@pytest.fixture(scope="module")
def slow():
    time.sleep(0.5)

def test_first(slow):
    pass

def test_second(slow):
    pass
""")
    report = pytester.path / "r.json"
    result = run_inner(pytester, device, "--ssd-report", str(report))
    result.assert_outcomes(passed=2)
    durations = {i["nodeid"].rsplit("::", 1)[1]: i["duration"] for i in json.loads(report.read_text())["items"]}
    assert durations["test_first"] >= 0.5 > durations["test_second"], durations


def test_least_overshoot_keeps_every_config_where_blocks_fit_and_the_narrowest_elsewhere():
    import triton

    from kernels.backend import least_overshoot

    configs = [triton.Config({"M": m, "N": n}) for m, n in ((32, 64), (64, 64), (128, 64), (32, 32))]
    prune = least_overshoot(M="rows", N="cols")
    assert prune(configs, {"rows": 256, "cols": 64}) == configs[:3] + [configs[3]]  # serving-like: all fit
    assert prune(configs, {"rows": 64, "cols": 64}) == [configs[0], configs[1], configs[3]]  # M=128 overshoots 64
    assert prune(configs, {"rows": 8, "cols": 5}) == [configs[3]]  # headdim 5: the narrowest block only
    assert prune(configs, {"rows": 8, "cols": 64}) == [configs[0], configs[3]]  # never empty: least oversized


def test_what_loads_before_a_workers_start_does_not_import_the_kernels_package():
    """pytest imports the plugin and tests/conftest.py before an xdist worker's start, where the worker forks its
    case items' child (``harness.isolation.spare``): importing ``kernels`` there would ask torch for a GPU, start the
    CUDA driver and leave the worker to spawn its child instead (importing torch again)."""
    code = ("import sys, ssd_pytest.plugin, tests.conftest; "
            "print([m for m in sys.modules if m == 'kernels' or m.startswith(('kernels.', 'triton'))])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_without_xdist_the_plugin_loads_and_runs_the_items(pytester, tiny, device):
    """``-p no:xdist`` leaves xdist's hooks unknown to pytest: the plugin's implementations of them are optional,
    so the session runs instead of stopping on an INTERNALERROR."""
    result = run_inner(pytester, device, str(tiny), "-p", "no:xdist", "--provider", "reference:provider",
                       "-k", "tiny-direct and determinism")
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=1)


def test_without_xdist_the_suites_grouped_test_files_are_collected():
    """The suite's files that group their items on one worker (``xdist_group``) collect under ``-p no:xdist`` too:
    with xdist not loaded nothing else declares the mark, and ``--strict-markers`` stopped each such file."""
    grouped = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py")
                     if path.name != Path(__file__).name and "pytest.mark.xdist_group(" in path.read_text())
    assert grouped, "no test file groups its items: this test has nothing to collect"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                           "-p", "no:cacheprovider", *grouped], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]  # a collection error exits 2


def test_a_run_inside_a_longer_lived_process_gives_back_what_it_set(pytester, tiny, device, monkeypatch):
    """An inline run (pytester's, ``pytest.main``) sets its run's report name, its device's settings and more in
    the process's environment; at its end the process has them as before, so its next run or test inherits none."""
    from kernels.environment import AUTOTUNE_BUDGET_ENV
    from ssd_pytest import reporting

    assert AUTOTUNE_BUDGET_ENV in plugin.RUN_ENVIRONMENT and reporting.RUN_ID_ENV in plugin.RUN_ENVIRONMENT
    monkeypatch.setenv(reporting.RUN_ID_ENV, "the enclosing run's")
    before = {name: os.environ.get(name) for name in plugin.RUN_ENVIRONMENT}
    # Without workers (an xdist controller's settings: the autouse fixture checks the inline runs that start one).
    result = run_inner(pytester, device, str(tiny), "--provider", "reference:provider", "-k",
                       "tiny-direct and determinism")
    assert result.ret == 0, result.stdout.str()
    assert {name: os.environ.get(name) for name in plugin.RUN_ENVIRONMENT} == before
