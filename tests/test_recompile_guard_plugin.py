"""--recompile-guard in the pytest plugin: before a case's first item, the provider's warmup hook on its model
configuration; then any case item that needs a specialization the warmup did not produce fails, whoever's kernel it
is (CPU: by specialization key; GPU: by the compile hook). Without the hook, items are unsupported by the guard."""

from __future__ import annotations

import importlib

import pytest
import yaml

from tests import broken_providers as bp

pytestmark = pytest.mark.usefixtures("children_with_one_hardware_queue")  # tests/conftest.py says why

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module", autouse=True)
def _kernels_imported_outside():
    """Keep Triton's native modules in pytester's sys.modules snapshot (they cannot be loaded twice), and the warmup
    registry with them (a test patches it; an inner run must not import a second copy)."""
    from harness.checks import load_provider

    load_provider("kernels:provider")
    import kernels.warmup  # noqa: F401


def run_guarded(pytester, device, *args, select="tiny-direct"):
    """The inner run on the session's device (the interpreter cannot run where numpy >= 2.4, as on the GPU runner);
    its items run in a supervised child unless ``args`` say ``--isolation none``."""
    tiny = pytester.makefile(".yaml", tiny=bp.TINY_CASES)
    return pytester.runpytest_inprocess("-p", "ssd_pytest.plugin", "--device", device, "-p", "no:cacheprovider",
                                        "-s", "--recompile-guard", str(tiny), "-k", select, *args)


def test_warmed_suite_passes_under_the_guard(pytester, device):
    result = run_guarded(pytester, device, "--provider", "kernels:provider")
    result.stdout.fnmatch_lines(["*warmup: * by provider 'triton-ssd''s warmup hook on 1 model config(s)*"])
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("passed", 0) >= 5, result.stdout.str()[-3000:]


def cases_with_twin() -> str:
    """TINY_CASES plus tiny-direct again under another id and seed, with other sequences and slots: the same model
    request by construction (shape, dtypes and options copied)."""
    doc = yaml.safe_load(bp.TINY_CASES)
    (direct,) = [c for c in doc["cases"] if c["id"] == "tiny-direct"]
    twin = {**direct, "id": "tiny-direct-twin", "description": "tiny-direct's model configuration, other sequences",
            "seed": 21, "cache": {"slots": 4},
            "sequences": [{"context": 0, "tokens": 7, "init_slot": 0, "has_state": False, "final_slot": 3}]}
    doc["cases"].append(twin)
    return yaml.safe_dump(doc, sort_keys=False)


def test_each_model_request_is_warmed_once_before_its_first_item(pytester, tmp_path, device):
    """Lazy warmups: one per distinct model request of the selected cases (cases sharing shape, dtypes and options
    share it), none for cases not run, each printed before the item that needed it. In this process
    (``--isolation none``): which requests are warmed is the plugin's choice, wherever they run
    (test_warmed_suite_passes_under_the_guard runs them in the supervised child)."""
    from harness.cases.loader import load_case_file
    from harness.warmup import requests_from_cases

    text = cases_with_twin()
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    cases = load_case_file(path)
    distinct = {repr(requests_from_cases([c])) for c in cases}
    assert len(distinct) == len(cases) - 1  # the twin shares tiny-direct's request
    tiny = pytester.makefile(".yaml", tiny=text)
    result = pytester.runpytest_inprocess("-p", "ssd_pytest.plugin", "--device", device, "-p", "no:cacheprovider",
                                          "-s", "--recompile-guard", "--isolation", "none", str(tiny), "-k",
                                          "determinism")
    warmups = [line for line in result.outlines if "warmup:" in line and "warmup hook" in line]
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert len(warmups) == len(distinct), (warmups, distinct)
    just_one = run_guarded(pytester, device, "--provider", "kernels:provider", "--isolation", "none",
                           select="tiny-direct and determinism")
    assert len([line for line in just_one.outlines if "warmup:" in line]) == 1


@pytest.mark.interpreter(reason="on the GPU the guard's witness is a compile, and kernels this worker already "
                         "compiled for earlier tests do not compile again; the GPU negative control is the cold-cache "
                         "probe in tests/test_recompile_guard.py")
def test_narrower_warmup_makes_the_guard_fire(pytester, monkeypatch, device):
    """Negative control: a warmup without the case's per-head D leaves chunk scan's D class unwarmed."""
    from kernels import warmup

    real = warmup.model_request

    def without_d(config):
        shape, io, state, opts = real(config)
        return shape, io, state, {**opts, "d_kinds": ("none",)}

    monkeypatch.setattr(warmup, "model_request", without_d)
    # in this process: the monkeypatch does not reach a supervised child
    result = run_guarded(pytester, device, "--provider", "kernels:provider", "--isolation", "none", "-k", "determinism")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*recompile guard (after warmup:*", "*_chunk_scan_kernel*"])


def test_a_check_that_does_not_run_is_skipped_not_judged_by_the_guard(pytester, device):
    """An unsupported (or tier-skipped) item launches nothing; the guard's 'no launch happened' sanity check must not
    turn its skip into a failure."""
    result = run_guarded(pytester, device, "--provider", "reference:provider", select="tiny-direct and indexed")
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("skipped", 0) >= 1 and not outcomes.get("failed"), (
        result.stdout.str()[-3000:])


def run_slot_cases(pytester, device, provider: str, *args):
    """``tests.autotuned_providers.CASES`` under the guard against a foreign provider (its writeback is an
    autotuned Triton kernel that is not ours), its items in this process."""
    from tests import autotuned_providers

    cases = pytester.makefile(".yaml", slots=autotuned_providers.CASES)
    return pytester.runpytest_inprocess("-p", "ssd_pytest.plugin", "--device", device, "-p", "no:cacheprovider",
                                        "-s", "-rfs", "--recompile-guard", str(cases), "--provider", provider,
                                        "--isolation", "none", *args)


def test_a_foreign_providers_warmup_hook_is_what_its_items_are_held_to(pytester, device):
    """The guard warms through the provider's own hook and judges whichever kernels it launches: here a foreign
    autotuned writeback, warmed by representative calls on every layout the cases use."""
    result = run_slot_cases(pytester, device, "tests.warmup_providers:warms_every_layout")
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("passed", 0) >= 10 and not outcomes.get("failed"), \
        result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*warmup: * by provider 'slot-update-warmed-2-layouts'*slot_update_kernel*"])


@pytest.mark.interpreter(reason="on the GPU the guard's witness is a compile, and a layout an earlier test of this "
                         "worker compiled does not compile again; the GPU negative control is the cold-cache probe in "
                         "tests/test_recompile_guard.py")
def test_a_foreign_warmup_that_skips_a_layout_fails_the_items_that_need_it(pytester, device):
    """Negative control: the compact-only warmup never launched the writeback on slot-update-first's padded cache
    that starts 4 bytes into its storage; every item of that case that writes the cache fails, naming the kernel and
    the argument classes; the other case, on a compact cache, passes."""
    result = run_slot_cases(pytester, device, "tests.warmup_providers:warms_compact_only")
    assert result.ret == 1, result.stdout.str()[-3000:]
    failed = [line for line in result.outlines if line.startswith("FAILED")]
    assert failed and all("slot-update-first" in line for line in failed), failed
    assert any("determinism" in line for line in failed), failed
    result.stdout.fnmatch_lines(["*recompile guard (after warmup:*", "*kernel tests.autotuned_providers."
                                 "slot_update_kernel: specialization not warmed up*",
                                 "*cache_ptr: needed *fp32 unaligned, closest warmed *fp32 aligned16*"])
    assert result.parseoutcomes().get("passed", 0) >= 5, result.stdout.str()[-3000:]  # slot-update-second's


def test_a_provider_without_the_hook_is_unsupported_never_failed_or_passed(pytester, device):
    """Without warmup(requests) the guard cannot know what a server would warm: every item that ran and passed is
    an unsupported skip with that reason; none fails for it and none passes."""
    # autotune_idempotent and every_config are not judged by the guard at all (Check.not_a_serving_call): their own
    # results stand
    result = run_slot_cases(pytester, device, "tests.autotuned_providers:private_copy", "-k",
                            "not reference_bound and not autotune_idempotent and not every_config")
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and not outcomes.get("passed") and not outcomes.get("failed"), result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*unsupported: provider 'slot-update-private-copy' has no warmup(requests) hook; "
                                 "the recompile guard cannot know what a server would warm*"])


def test_without_the_hook_a_failing_check_still_fails(pytester, device):
    result = run_guarded(pytester, device, "--provider", "tests.broken_providers:on_reference.wrong_slot",
                         select="tiny-direct and untouched_storage")
    assert result.ret == 1 and result.parseoutcomes().get("failed") == 1, result.stdout.str()[-3000:]


def test_a_warmup_hook_that_raises_errors_every_item_of_its_configuration_once(pytester, device):
    # The module the inner run loads the provider from (an earlier inner run's copy left sys.modules with it).
    warmup_providers = importlib.import_module("tests.warmup_providers")

    # in this process (run_slot_cases), where the hook's call count is visible
    result = run_slot_cases(pytester, device, "tests.warmup_providers:warmup_raises", "-k",
                            "slot-update-second and (determinism or untouched_storage)")
    outcomes = result.parseoutcomes()
    assert result.ret == 1 and outcomes.get("errors") == 2 and not outcomes.get("passed"), result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*recompile guard: the warmup hook of provider * raised on *: RuntimeError: no "
                                 "device memory for the warmup*"])
    assert warmup_providers.warmup_raises.calls == 1
