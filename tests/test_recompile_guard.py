"""Recompile guard and specialization keys: the guard fires on a key the warmup missed, on both backends."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from harness.guards import recompile
from harness.guards.recompile import RecompileError, cold_in_memory_cache, compile_events, guard_no_recompile
from harness.guards.specialization import (
    MissingSpecialization,
    assert_keys_warmed,
    expect_warmed,
    specialization_key,
)
from kernels.warmup import UnalignedPointer, pointer

GPU_ONLY = pytest.mark.gpu(reason="real compiles only happen on the GPU; the CPU tier checks specialization keys "
                           "instead (the other tests of this file)")


@triton.jit
def _copy_scalar(src_ptr, dst_ptr, stride):
    tl.store(dst_ptr, tl.load(src_ptr + stride))


@triton.jit(do_not_specialize_on_alignment=["src_ptr"], do_not_specialize=["stride"])
def _copy_scalar_unspecialized(src_ptr, dst_ptr, stride):
    tl.store(dst_ptr, tl.load(src_ptr + stride))


def _key(kernel, src, stride, device):
    return specialization_key(kernel, (src, torch.empty(1, device=device), stride))


def test_alignment_stride_and_dtype_each_change_the_key(device):
    table = torch.zeros(8, 5, dtype=torch.int32, device=device)
    base = _key(_copy_scalar, table[:, 4], 1, device)  # column 4: 16 bytes in, aligned
    assert base.key != _key(_copy_scalar, table[:, 1], 1, device).key  # 4 bytes in: unaligned
    assert base.key != _key(_copy_scalar, table[:, 4], 5, device).key  # stride 1 is a constexpr, 5 is not
    other, multiple_of_16 = (_key(_copy_scalar, table[:, 4], stride, device).key for stride in (5, 32))
    assert other != multiple_of_16
    assert base.key != _key(_copy_scalar, table[:, 4].long(), 1, device).key
    readable = dict(_key(_copy_scalar, table[:, 1], 5, device).params)
    assert readable["src_ptr"] == "*i32 unaligned" and readable["stride"] == "i32 other", readable


def test_stand_ins_match_real_tensors(device):
    table = torch.zeros(8, 5, dtype=torch.int64, device=device)
    for column, stand_in in ((0, pointer(torch.int64)), (1, UnalignedPointer(torch.int64))):
        assert _key(_copy_scalar, table[:, column], 1, device).key == _key(_copy_scalar, stand_in, 1, device).key


def test_do_not_specialize_collapses_scalar_only_classes(device):
    """The mechanism behind each kernel's SCALAR_ONLY decision (e.g. kernels.gather): one binary for all classes."""
    table = torch.zeros(8, 5, dtype=torch.int32, device=device)
    keys = {_key(_copy_scalar_unspecialized, table[:, j], s, device).key for j in range(5) for s in (1, 5, 32)}
    assert len(keys) == 1, keys
    assert len({_key(_copy_scalar, table[:, j], s, device).key for j in range(5) for s in (1, 5, 32)}) == 6


def _copy(src, dst, stride):
    _copy_scalar[(1,)](src, dst, stride)


def test_guard_passes_on_warmed_key_and_fires_on_missing_one(device):
    table = torch.arange(40, dtype=torch.float32, device=device).reshape(8, 5)
    dst = torch.zeros(1, device=device)
    warmed = [_key(_copy_scalar, pointer(torch.float32), 1, device)]
    if device == "cuda":  # the guard's compile witnesses need the binary compiled for real
        _copy_scalar.warmup(torch.float32, torch.float32, 1, grid=(1,))
    with guard_no_recompile([_copy_scalar], warmed=warmed):
        _copy(table[:, 4], dst, 1)
    assert dst.item() == 5.0  # the guarded launch really ran (raw pointer + 1: element 5 of the table)
    with pytest.raises(RecompileError) as err:
        with guard_no_recompile([_copy_scalar], warmed=warmed):
            _copy(table[:, 1], dst, 5)
    text = str(err.value)
    assert "_copy_scalar" in text and "src_ptr: needed *fp32 unaligned, closest warmed *fp32 aligned16" in text, text
    assert "stride: needed i32 other, closest warmed =1" in text, text


def test_guard_fires_when_nothing_was_launched():
    with pytest.raises(RecompileError, match="no launch of the watched kernels"):
        with guard_no_recompile([_copy_scalar], warmed=[]):
            pass


@pytest.mark.interpreter(reason="on the GPU the compile witnesses work without warmed keys")
def test_interpreter_guard_requires_warmed_keys():
    with pytest.raises(ValueError, match="pass the warmed keys"):
        with guard_no_recompile([_copy_scalar]):
            pass


def test_expect_warmed_and_assert_keys_warmed_report_missing(device):
    key = _key(_copy_scalar, pointer(torch.float32), 16, device)
    with pytest.raises(MissingSpecialization, match="no specialization of this kernel was warmed"):
        assert_keys_warmed([key], [])
    assert_keys_warmed([key], [key])
    with pytest.raises(MissingSpecialization):
        with expect_warmed([_copy_scalar], [key]):
            _copy(torch.zeros(4, device=device), torch.zeros(1, device=device), 2)


def test_compile_hook_records_and_never_decides(monkeypatch):
    """The hook returns None itself (a truthy value skips the launch) and passes a previous hook's answer on."""
    calls = []

    def previous(**kwargs):
        calls.append(kwargs["key"])
        return "previous-answer"

    monkeypatch.setattr(recompile, "_get_hook", lambda: previous)
    installed = {}
    monkeypatch.setattr(recompile, "_set_hook", lambda h: installed.__setitem__("hook", h))
    with compile_events() as events:
        info = type("Info", (), {"module": "m", "name": "k"})()
        answer = installed["hook"](key="K1", repr="k[...]", fn=info, compile={}, is_manual_warmup=False,
                                   already_compiled=False)
    assert answer == "previous-answer" and calls == ["K1"]
    assert events[0].kernel == "m.k" and events[0].key == "K1"
    assert installed["hook"] is previous  # restored on exit
    monkeypatch.setattr(recompile, "_get_hook", lambda: None)
    with compile_events():
        assert installed["hook"](key="K2", fn=info) is None


def test_cold_in_memory_cache_restores_what_it_set_aside():
    """A test that needs a cold kernel must not leave the worker's warmed binaries behind it (cases run after such a
    test would compile and fail the guard). The cache is empty inside and the same entries after, also
    when the block raises. Runs on a bare JITFunction (no GPU needed: nothing is launched)."""
    from triton.runtime.jit import JITFunction

    jit = JITFunction(_copy_scalar_probe_source)
    entry = ({"key-a": "binary-a"}, {}, "target", "backend", "binder")
    jit.device_caches[0] = entry
    with cold_in_memory_cache(jit):
        assert dict(jit.device_caches) == {}
        jit.device_caches[0] = ({"key-b": "binary-b"}, {}, "target", "backend", "binder")  # compiled inside
    assert dict(jit.device_caches) == {0: entry} and jit.device_caches[0] is entry
    with pytest.raises(RuntimeError, match="boom"):
        with cold_in_memory_cache(jit):
            raise RuntimeError("boom")
    assert jit.device_caches[0] is entry


def _copy_scalar_probe_source(src_ptr, dst_ptr, stride):
    tl.store(dst_ptr, tl.load(src_ptr + stride))


@triton.jit
def _copy_scalar_probe(src_ptr, dst_ptr, stride):
    """Launched only by the GPU tests below, which start it from an empty in-memory cache."""
    tl.store(dst_ptr, tl.load(src_ptr + stride))


@GPU_ONLY
def test_gpu_key_matches_tritons_cache_and_compile_is_caught(device):
    # A cold in-memory cache whatever ran before in this process (an earlier test, or a rerun, may have compiled
    # this very class).
    with cold_in_memory_cache(_copy_scalar_probe):
        src = torch.arange(16, dtype=torch.float32, device=device)
        dst = torch.zeros(1, device=device)
        predicted = specialization_key(_copy_scalar_probe, (src[1:], dst, 7))  # unaligned, other
        with pytest.raises(RecompileError) as err:
            with guard_no_recompile([_copy_scalar_probe]):
                _copy_scalar_probe[(1,)](src[1:], dst, 7)
        assert dst.item() == 8.0  # the hook did not skip the launch
        new = recompile.kernel_cache_keys(_copy_scalar_probe)
        assert [k for _, k in new] == [predicted.key], (new, predicted.key)
        text = str(err.value)
        assert "compile hook" in text and "kernel cache" in text and "(warmup)" not in text, text
        # the same class again: compiled now, so the guard passes (it does not fire on every call)
        with guard_no_recompile([_copy_scalar_probe]):
            _copy_scalar_probe[(1,)](src[3:], dst, 9)
        assert dst.item() == 12.0


@GPU_ONLY
def test_gpu_warmup_compiles_what_a_real_call_then_finds(device):
    """A compile-only warmup with stand-ins is seen by the hook as a warmup (is_manual_warmup) and fills the very
    cache entry a real call with real tensors looks up: the real call compiles nothing."""
    with cold_in_memory_cache(_copy_scalar_probe):
        with compile_events() as events:
            _copy_scalar_probe.warmup(torch.float32, torch.float32, 16, grid=(1,))
        assert [e.is_warmup for e in events] == [True], events
        src = torch.arange(64, dtype=torch.float32, device=device)
        dst = torch.zeros(1, device=device)
        with guard_no_recompile([_copy_scalar_probe], warmed=[specialization_key(_copy_scalar_probe,
                                                                                  (torch.float32, torch.float32, 16))]):
            _copy_scalar_probe[(1,)](src, dst, 32)
        assert dst.item() == 32.0
        with pytest.raises(RecompileError, match="stride: needed i32 other"):  # negative control: another class
            with guard_no_recompile([_copy_scalar_probe], warmed=[specialization_key(
                    _copy_scalar_probe, (torch.float32, torch.float32, 16))]):
                _copy_scalar_probe[(1,)](src, dst, 33)


def test_every_kernel_mode_judges_kernels_nobody_listed(device):
    """The provider-neutral guard: no list of kernels, and a launch of any jit function is keyed (here a toy kernel
    that is nobody's registration); a warmed one passes, another class fails naming it."""
    table = torch.arange(40, dtype=torch.float32, device=device).reshape(8, 5)
    dst = torch.zeros(1, device=device)
    warmed = [_key(_copy_scalar, pointer(torch.float32), 1, device)]
    if device == "cuda":
        _copy_scalar.warmup(torch.float32, torch.float32, 1, grid=(1,))
    with guard_no_recompile(warmed=warmed) as record:
        _copy(table[:, 4], dst, 1)
    assert record.kernels == {f"{__name__}._copy_scalar": 1} and dst.item() == 5.0, record
    with pytest.raises(RecompileError, match=r"_copy_scalar: specialization not warmed up"):
        with guard_no_recompile(warmed=warmed):
            _copy(table[:, 1], dst, 5)


def test_launch_listeners_see_launches_and_warmup_entries_and_restore_the_classes(device):
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from harness.triton_launches import listening

    originals = {cls: cls.__dict__["run"] for cls in (JITFunction, InterpretedFunction)}
    outer, inner = [], []
    with listening(lambda fn, args, kwargs, warmup: outer.append(warmup)):
        with listening(lambda fn, args, kwargs, warmup: inner.append((fn, warmup))):
            _copy_scalar.warmup(torch.float32, torch.float32, 3, grid=(1,))
            _copy(torch.zeros(4, device=device), torch.zeros(1, device=device), 2)
        _copy(torch.zeros(4, device=device), torch.zeros(1, device=device), 2)
    assert inner == [(_copy_scalar, True), (_copy_scalar, False)], inner
    assert outer == [True, False, False], outer
    assert {cls: cls.__dict__["run"] for cls in originals} == originals  # the classes' own run is back


def test_unverified_triton_is_refused_for_launch_listening(monkeypatch):
    from harness import triton_launches

    monkeypatch.setattr(triton, "__version__", "9.0.0")
    with pytest.raises(triton_launches.UnsupportedTriton, match="widen VERIFIED"):
        with triton_launches.listening(lambda *a: None):
            pass


@pytest.mark.interpreter(reason="on the GPU the warmup's compiles are the witness; keys are compared under the "
                         "interpreter")
def test_server_warmup_sees_exactly_what_our_registry_plans():
    """Watching our provider's warmup hook yields the registry's own keys: under the interpreter its warmup entries
    are seen though nothing compiles, so the generic guard holds our kernels to what the registry warms."""
    from harness.checks import load_provider
    from harness.checks.hooks import ModelConfig
    from harness.guards.server_warmup import warm
    from kernels.warmup import warmup_models

    config = ModelConfig(2, 4, 16, 1, 16, torch.float32, torch.float16, D="per_channel", z=True)
    observed = warm(load_provider("kernels:provider"), [config])
    planned = warmup_models([config]).keys
    assert {(k.kernel, k.key) for k in observed.keys} == {(k.kernel, k.key) for k in planned}
    assert "_chunk_scan_kernel" in observed.summary() and len(observed.keys) == len(planned)


def test_a_provider_without_the_warmup_hook_says_why():
    from harness.checks import load_provider
    from harness.checks.hooks import ModelConfig
    from harness.guards.server_warmup import warm

    with pytest.raises(NotImplementedError, match="provider 'reference' has no warmup\\(requests\\) hook; the "
                                                  "recompile guard cannot know what a server would warm"):
        warm(load_provider("reference:provider"), [ModelConfig(2, 4, 16, 1, 16, torch.float32, torch.float32)])
