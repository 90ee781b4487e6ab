"""Direct launches of bound binaries (``kernels.direct_launch``): the shape key, the bound cache, the fallback to
Triton's path, and what the guards watch.

Under the interpreter there is no binary, so every launch takes Triton's path there: the cache's logic is tested with
a fake runtime, the Triton 3.6.0 runtime's binding and launch with a fake binary in a real ``JITFunction``'s device
cache, and the shape key against Triton's own specialization key on real stage arguments. The last test, on the
GPU only, launches real stages both ways and compares the bits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Heuristics
from triton.runtime.jit import JITFunction

from kernels import direct_launch as dl

# ---- the shape key against Triton's keys -------------------------------------------------------------------------


def _cumsum_arguments(T: int, *, dtype=torch.float32, dt_stride: int = 1, offset: int = 0, H: int = 4, Q: int = 16):
    """chunk_cumsum's launch arguments for ``T`` tokens: dt (T, H) of ``dtype``, every ``dt_stride``-th head of a
    wider row, starting ``offset`` elements into its storage."""
    from kernels import chunk_cumsum

    storage = torch.zeros(offset + T * H * dt_stride, dtype=dtype)
    dt = storage[offset:].view(T, H * dt_stride)[:, ::dt_stride]
    A = torch.zeros(H, dtype=torch.float32)
    cu = torch.arange(0, T + Q, Q, dtype=torch.int32).clamp(max=T)
    dA, dt_out = chunk_cumsum.cumsum_outputs(dt, A, Q, cu, None)
    return chunk_cumsum.launch_arguments(dt, A, cu, dt_out, dA, dt_bias=None, dt_softplus=True,
                                         dt_limit=(0.0, float("inf")))


def test_the_shape_key_separates_what_triton_compiles_apart_and_keeps_one_shape_together():
    from kernels import chunk_cumsum
    from kernels.specialization import specialization_key

    variants = {
        "base": _cumsum_arguments(40),
        "base again, new tensors": _cumsum_arguments(40),
        "another token count": _cumsum_arguments(72),
        "a strided dt": _cumsum_arguments(40, dt_stride=2),
        "bf16 dt": _cumsum_arguments(40, dtype=torch.bfloat16),
        "an unaligned dt": _cumsum_arguments(40, offset=1),
    }
    config = {"BLOCK_SIZE_H": 8, "num_warps": 4}
    keys = {name: dl.shape_key(chunk_cumsum.chunk_cumsum_kernel, 0, args) for name, args in variants.items()}
    specs = {name: specialization_key(chunk_cumsum.chunk_cumsum_kernel, (), {**args, **config}).key
             for name, args in variants.items()}
    assert keys["base"] == keys["base again, new tensors"]
    assert len({keys[name] for name in variants if name != "base again, new tensors"}) == len(variants) - 1
    # What Triton keys apart, the shape key keys apart (it is finer: equal shape keys mean equal binaries).
    for a, b in itertools.combinations(variants, 2):
        if keys[a] == keys[b]:
            assert specs[a] == specs[b], (a, b)
    assert specs["base"] != specs["bf16 dt"] and specs["base"] != specs["an unaligned dt"]
    # The kernel and the device are part of the key.
    assert dl.shape_key(chunk_cumsum.chunk_cumsum_kernel, 1, variants["base"]) != keys["base"]
    # An int and a bool of one value are different arguments to Triton.
    assert dl.shape_key(None, 0, {"flag": True}) != dl.shape_key(None, 0, {"flag": 1})
    assert dl.shape_key(None, 0, {"scale": 1}) != dl.shape_key(None, 0, {"scale": 1.0})
    # The addresses the key read are the tensors', in argument order; which tensors may go to the launcher as
    # addresses: all of them on a GPU, else none.
    x, y = torch.zeros(4), torch.zeros(8)
    assert dl.launch_key(None, 0, {"x": x, "n": 3, "y": y})[1] == [x.data_ptr(), y.data_ptr()]
    assert dl.gpu_tensor_names({"x": x, "n": 3}) is None and dl.gpu_tensor_names({"n": 3}) == ()
    # A tensor subclass is a tensor to the key (its dtype and alignment), never a value compared by ``==``.
    weight = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
    assert dl.shape_key(None, 0, {"w": weight}) == dl.shape_key(None, 0, {"w": torch.nn.Parameter(torch.ones(4))})


def test_the_tuning_key_is_the_autotuners_own(device):
    """The tuner's cache after a real launch holds exactly the key ``tuning_key_of`` computes for its arguments."""
    from harness.cases.builder import build_inputs
    from kernels import bmm_chunk
    from tests.support import CHUNK16_SHAPE, make_case

    kw = build_inputs(make_case([(0, 20, 1, False, 2)], slots=3, **CHUNK16_SHAPE), device).kwargs(path="snapshot")
    C, B, cu = kw["C"], kw["B"], kw["cu_chunk_seqlens"]
    tuner = bmm_chunk.bmm_chunk_kernel
    assert len(tuner.configs) > 1
    saved = dict(tuner.cache)
    tuner.cache.clear()
    try:
        CB = bmm_chunk.bmm_chunk(C, B, 16, cu)
        assert list(tuner.cache) == [dl.tuning_key_of(tuner, bmm_chunk.launch_arguments(C, B, cu, CB))]
    finally:
        tuner.cache.clear()
        tuner.cache.update(saved)


def test_the_host_divisions_are_tritons():
    from kernels.backend import cdiv, next_power_of_2

    for x in range(0, 600):
        assert next_power_of_2(x) == triton.next_power_of_2(x), x
        for y in (1, 2, 3, 16, 64, 100, 256):
            assert cdiv(x, y) == triton.cdiv(x, y), (x, y)
    for x in (1 << 20, (1 << 31) - 1, 1 << 31, (1 << 40) + 3):
        assert next_power_of_2(x) == triton.next_power_of_2(x) and cdiv(x, 7) == triton.cdiv(x, 7)


def test_no_launch_path_calls_tritons_wrapped_divisions():
    """Host code in kernels/ divides with ``kernels.backend.cdiv`` / ``next_power_of_2``: Triton's are wrapped for
    use inside kernels, and the wrapper costs more than the division at every launch."""
    import ast
    from pathlib import Path

    import kernels

    def jit_decorated(node) -> bool:
        return any("jit" in ast.unparse(d) for d in node.decorator_list)

    found = []
    for path in sorted(Path(kernels.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        inside_jit = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and jit_decorated(f)
                      for n in ast.walk(f)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and id(node) not in inside_jit
                    and ast.unparse(node.func) in ("triton.cdiv", "triton.next_power_of_2")):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node.func)}")
    assert found == []


# ---- the cache, over a fake runtime ------------------------------------------------------------------------------


class FakeKernel:
    """``kernel[grid](**arguments)``: Triton's path, recorded; returns a new binary per launch."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def run(**arguments):
            self.launches.append(arguments)
            return f"binary {len(self.launches)}"
        return run


class FakeRuntime:
    """The runtime's five methods: bindings are the binary Triton's path returned; ``stale`` bindings are not
    current; ``watched`` sends everything through Triton's path."""

    def __init__(self):
        self.watched, self.stale, self.unbindable, self.direct_launches = False, set(), set(), []

    def unwatched(self):
        return not self.watched

    def device(self):
        return 0

    def bind(self, kernel, arguments, result, device):
        return None if arguments["n"] in self.unbindable else result

    def current(self, binding):
        return binding not in self.stale

    def launch(self, binding, grid, arguments, addresses):
        self.direct_launches.append((binding, grid, arguments["n"]))
        return binding


def test_a_shape_launches_through_triton_once_then_its_binary_directly():
    runtime, kernel = FakeRuntime(), FakeKernel()
    cache = dl.LaunchCache(runtime)
    x = torch.zeros(8)
    assert cache.launch(kernel, (2,), {"x": x, "n": 8}) == "binary 1"
    assert cache.launch(kernel, (3,), {"x": torch.ones(8), "n": 8}) == "binary 1"  # new tensors, one shape
    assert cache.launch(kernel, (2,), {"x": x, "n": 16}) == "binary 2"  # another shape: Triton's path first
    assert cache.launch(kernel, (2,), {"x": x.to(torch.float64), "n": 16}) == "binary 3"  # another dtype
    assert cache.launch(kernel, (4,), {"x": x, "n": 16}) == "binary 2"
    assert [a["n"] for a in kernel.launches] == [8, 16, 16]
    assert runtime.direct_launches == [("binary 1", (3,), 8), ("binary 2", (4,), 16)]
    assert (cache.direct, cache.through_triton) == (2, 3)


def test_the_cache_keeps_the_most_recently_launched_shapes_up_to_its_limit():
    runtime, kernel = FakeRuntime(), FakeKernel()
    cache = dl.LaunchCache(runtime, limit=2)
    for n in (1, 2, 1, 3):  # 1 was launched again after 2, so 2 is the oldest when 3 comes
        cache.launch(kernel, (1,), {"n": n})
    assert len(cache.bindings) == 2
    keys = {n: dl.shape_key(kernel, runtime.device(), {"n": n}) for n in (1, 2, 3)}
    assert list(cache.bindings) == [keys[1], keys[3]]
    cache.launch(kernel, (1,), {"n": 2})  # evicted: Triton's path again, and bound again
    assert [a["n"] for a in kernel.launches] == [1, 2, 3, 2]
    assert list(cache.bindings) == [keys[3], keys[2]]


def test_triton_decides_whenever_a_binding_is_stale_unbindable_or_launches_are_watched():
    runtime, kernel = FakeRuntime(), FakeKernel()
    cache = dl.LaunchCache(runtime)
    cache.launch(kernel, (1,), {"n": 1})
    runtime.stale.add("binary 1")  # e.g. its autotuner forgot the config: Triton's path tunes again
    assert cache.launch(kernel, (1,), {"n": 1}) == "binary 2"
    assert cache.launch(kernel, (1,), {"n": 1}) == "binary 2"  # bound afresh
    runtime.watched = True  # a guard wraps Triton's run: every launch through it, nothing bound
    assert cache.launch(kernel, (1,), {"n": 1}) == "binary 3" and cache.launch(kernel, (1,), {"n": 5}) == "binary 4"
    assert len(cache.bindings) == 1
    runtime.watched = False
    runtime.unbindable.add(7)
    cache.launch(kernel, (1,), {"n": 7})
    cache.launch(kernel, (1,), {"n": 7})
    assert [a["n"] for a in kernel.launches][-2:] == [7, 7] and len(cache.bindings) == 1
    cache.launch(kernel, (1,), {"n": 1, "shape": [1, 2]})  # an unhashable argument: no key, Triton's path
    assert kernel.launches[-1]["shape"] == [1, 2] and len(cache.bindings) == 1
    assert runtime.direct_launches == [("binary 2", (1,), 1)]


def test_the_direct_path_is_off_under_the_interpreter_on_other_tritons_and_when_switched_off():
    assert isinstance(dl.launches_for(True, dl.VERIFIED, None), dl.TritonPath)
    assert isinstance(dl.launches_for(False, "3.5.1", None), dl.TritonPath)
    assert isinstance(dl.launches_for(False, dl.VERIFIED, "0"), dl.TritonPath)
    assert isinstance(dl.launches_for(False, dl.VERIFIED, "1"), dl.LaunchCache)
    assert isinstance(dl.launches_for(False, dl.VERIFIED, None), dl.LaunchCache)
    with pytest.raises(ValueError, match="SSD_DIRECT_LAUNCH='yes'"):
        dl.launches_for(False, dl.VERIFIED, "yes")
    kernel = FakeKernel()
    path = dl.TritonPath()
    assert path.launch(kernel, (1,), {"n": 3}) == "binary 1" and path.through_triton == 1
    from kernels.backend import INTERPRET

    if INTERPRET:
        assert isinstance(dl.LAUNCHES, dl.TritonPath)


# ---- the Triton 3.6.0 runtime, with a fake binary ----------------------------------------------------------------


def _scale(x_ptr, out_ptr, n, alpha, FLAG: tl.constexpr, BLOCK: tl.constexpr):
    pass


class FakeBinary:
    function, packed_metadata = "function handle", "packed metadata"

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


@contextlib.contextmanager
def tuned_jit(binary, configs):
    """An ``Autotuner`` over a real ``JITFunction`` of ``_scale`` whose device 0 cache holds ``binary``."""
    jit = JITFunction(_scale)
    jit.device_caches = {0: ({"triton key": binary}, {}, None, None, None)}
    tuner = triton.autotune(configs=configs, key=["n"])(jit)
    yield tuner, jit


@contextlib.contextmanager
def _instrumentation_mode(mode: str):
    from triton import knobs

    saved = knobs.compilation.instrumentation_mode
    knobs.compilation.instrumentation_mode = mode
    try:
        yield
    finally:
        knobs.compilation.instrumentation_mode = saved


def test_the_runtime_binds_what_triton_chose_and_launches_it_as_jit_run_does():
    binary = FakeBinary()
    configs = [triton.Config({"BLOCK": 16}, num_warps=4), triton.Config({"BLOCK": 32}, num_warps=8)]
    x, out = torch.zeros(64), torch.zeros(64)
    arguments = {"x_ptr": x, "out_ptr": out, "n": 64, "alpha": 0.5, "FLAG": True}
    runtime = dl.TritonRuntime()
    runtime.stream = lambda device: 1234
    with tuned_jit(binary, configs) as (tuner, jit):
        tuning_key = dl.tuning_key_of(tuner, arguments)
        assert tuning_key == (64, "torch.float32", "torch.float32")
        tuner.cache[tuning_key] = tuner.best_config = configs[1]
        binding = runtime.bind(tuner, arguments, binary, 0)
        assert binding is not None and binding.params == ("x_ptr", "out_ptr", "n", "alpha", "FLAG", "BLOCK")
        assert runtime.current(binding)
        tuner.best_config = None
        addresses = [x.data_ptr(), out.data_ptr()]
        assert binding.address_names is None  # tensors off the GPU: the launcher gets the tensors themselves
        runtime.launch(binding, lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),), arguments, addresses)
        assert binary.calls == [(2, 1, 1, 1234, "function handle", "packed metadata", None, None, None,
                                 x, out, 64, 0.5, True, 32)]
        assert tuner.best_config is configs[1] and "BLOCK" not in arguments  # the caller's dict is left as it was
        runtime.launch(binding, (3, 2), arguments, addresses)
        assert binary.calls[-1][:3] == (3, 2, 1)
        # Every tensor on a GPU: their addresses (the launch key's) go to the launcher in the tensors' places.
        on_gpu = dataclasses.replace(binding, address_names=("x_ptr", "out_ptr"))
        runtime.launch(on_gpu, (1,), arguments, [4096, 8192])
        assert binary.calls[-1][9:] == (4096, 8192, 64, 0.5, True, 32)

        tuner.cache.clear()  # forgotten (the bench's fresh tuning): Triton's path must tune again
        assert not runtime.current(binding)
        tuner.cache[tuning_key] = configs[0]  # tuned again, to another config
        assert not runtime.current(binding)
        tuner.cache[tuning_key] = configs[1]
        jit.device_caches[0][0].clear()  # the binary set aside (cold_in_memory_cache): Triton's path compiles
        assert not runtime.current(binding)
        jit.device_caches[0][0]["triton key"] = binary
        jit.pre_run_hooks.append(lambda *a, **k: None)
        assert not runtime.current(binding)
        jit.pre_run_hooks.clear()
        assert runtime.current(binding)
        for layer in (jit, tuner):  # one kernel's run replaced (a counting wrapper, say)
            layer.run = lambda *a, **k: None
            assert not runtime.current(binding)
            del layer.run
        assert runtime.current(binding)
        with _instrumentation_mode("fpsan"):  # another compile option: another binary on Triton's path
            assert not runtime.current(binding)
        assert runtime.current(binding)

        # Nothing bound where Triton's path returned no binary, chose another config than the tuner's cache holds,
        # or a parameter was left to a default.
        assert runtime.bind(tuner, arguments, None, 0) is None
        tuner.best_config = configs[0]
        assert runtime.bind(tuner, arguments, binary, 0) is None
        tuner.best_config = configs[1]
        assert runtime.bind(tuner, {k: v for k, v in arguments.items() if k != "FLAG"}, binary, 0) is None
        assert runtime.bind(tuner, arguments, FakeBinary(), 0) is None  # not the binary Triton holds
        assert runtime.bind(Heuristics(jit, jit.arg_names, {"BLOCK": lambda a: 16}), arguments, binary, 0) is None


def test_a_config_with_a_pre_hook_or_a_forced_config_is_left_to_triton():
    from harness.triton_autotuner import forced_config

    binary = FakeBinary()
    configs = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32}, pre_hook=lambda nargs: None)]
    arguments = {"x_ptr": torch.zeros(4), "out_ptr": torch.zeros(4), "n": 4, "alpha": 1.0, "FLAG": False}
    runtime = dl.TritonRuntime()
    with tuned_jit(binary, configs) as (tuner, _):
        tuner.cache[dl.tuning_key_of(tuner, arguments)] = tuner.best_config = configs[1]
        assert runtime.bind(tuner, arguments, binary, 0) is None
        tuner.cache[dl.tuning_key_of(tuner, arguments)] = tuner.best_config = configs[0]
        binding = runtime.bind(tuner, arguments, binary, 0)
        assert runtime.current(binding)
        with forced_config(tuner, configs[0]):  # one config, the same: Triton's path would launch it too
            assert not runtime.current(binding)  # the forced autotuner's cache is empty: bound again as one config
            tuner.best_config = configs[0]
            forced = runtime.bind(tuner, arguments, binary, 0)
            assert forced.tuning_key is None and runtime.current(forced)
        assert not runtime.current(forced)  # the configs back: the one-config binding no longer stands


# ---- what the guards watch ---------------------------------------------------------------------------------------


def test_every_guard_and_hook_sends_launches_through_triton():
    from triton import knobs

    from harness import triton_autotuner as tt
    from harness.guards.recompile import compile_events
    from harness.triton_launches import listening

    runtime = dl.TritonRuntime()
    assert runtime.unwatched()
    with listening(lambda *a: None):  # the recompile guard's and the warmup recording's launch witness
        assert not runtime.unwatched()
    with tt.launches_reported(lambda tuner: None):  # the autotune guard's and the bench's fresh tuning
        assert not runtime.unwatched()
    with compile_events():  # the recompile guard's compile hook
        assert not runtime.unwatched()
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert not runtime.unwatched()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert runtime.unwatched()
    # And the cache takes Triton's path for them (no key bound while watched).
    kernel, cache = FakeKernel(), dl.LaunchCache(runtime)
    with listening(lambda *a: None):
        cache.launch(kernel, (1,), {"n": 1})
    assert kernel.launches == [{"n": 1}] and not cache.bindings


class ThroughTritonRuntime(FakeRuntime):
    """Binds any launch and launches a binding through Triton's path again: what a direct launch would reuse, on
    the interpreter (no binary)."""

    def bind(self, kernel, arguments, result, device):
        return kernel

    def launch(self, binding, grid, arguments, addresses):
        self.direct_launches.append(binding)
        return binding[grid](**arguments)


def test_every_stage_launch_of_a_repeated_call_finds_its_binding(device, monkeypatch):
    """Every Triton launch of ``ssd_prefill`` goes through ``launch``, and a second call on fresh tensors of the same
    case finds every one bound: the shape key does not change with the tensors' addresses."""
    from harness.cases.builder import build_inputs
    from harness.triton_launches import listening
    from kernels import provider
    from tests.support import CHUNK16_SHAPE, make_case

    one = make_case([(20, 12, 1, True, 2)], slots=3, **CHUNK16_SHAPE)
    batch = make_case([(20, 12, 1, True, 2), (0, 40, 3, False, 4)], slots=5, **CHUNK16_SHAPE)
    for case, path in ((one, "indexed"), (batch, "snapshot")):
        # One call through Triton's path first: on the GPU its autotuners time their configs there (trial launches,
        # which a tuned call does not make), so that the calls counted below launch only the call's own kernels.
        monkeypatch.setattr(dl, "LAUNCHES", dl.TritonPath())
        provider.ssd_prefill(**build_inputs(case, device).kwargs(path=path))
        seen: list = []
        cache = dl.LaunchCache(ThroughTritonRuntime())
        monkeypatch.setattr(dl, "LAUNCHES", cache)
        for _ in range(2):
            kw = build_inputs(case, device).kwargs(path=path)
            with contextlib.ExitStack() as stack:
                if not seen:  # the first call: count every jit launch, whoever makes it
                    stack.enter_context(listening(lambda fn, args, kwargs, warmup, seen=seen: seen.append(warmup)))
                provider.ssd_prefill(**kw)
        launches = seen.count(False)
        assert launches > 0 and cache.through_triton == launches, path
        assert cache.direct == launches and len(cache.bindings) == launches, path


# ---- on the GPU: real stages both ways -------------------------------------------------------------------------


def test_direct_launches_give_the_bits_of_tritons_path_and_step_aside_for_a_guard(device, monkeypatch):
    from harness.cases.builder import build_inputs
    from harness.triton_launches import listening
    from kernels import provider
    from tests.support import direct_launch_cases

    one, batch = direct_launch_cases(device, "a direct launch needs a compiled binary: under the interpreter every "
                                             "launch takes Triton's path (the tests above check the logic with fakes)")
    assert one.indexed_eligible()

    def call(case, path):
        kw = build_inputs(case, device).kwargs(path=path)
        provider.ssd_prefill(**kw)
        return kw["out"].clone(), kw["state_cache"].clone()

    for case, path in ((one, "indexed"), (one, "snapshot"), (batch, "snapshot")):
        monkeypatch.setattr(dl, "LAUNCHES", dl.TritonPath())
        expected = call(case, path)
        cache = dl.LaunchCache(dl.TritonRuntime())
        monkeypatch.setattr(dl, "LAUNCHES", cache)
        first = call(case, path)
        launches = cache.through_triton
        assert launches > 0 and cache.direct == 0
        second = call(case, path)
        assert (cache.direct, cache.through_triton) == (launches, launches), "every launch of a repeat is direct"
        seen: list = []
        with listening(lambda fn, args, kwargs, warmup, seen=seen: seen.append(fn)):
            third = call(case, path)
        assert cache.direct == launches and len(seen) >= launches, "a watched launch went around the watcher"
        for got in (first, second, third):
            for a, b in zip(got, expected, strict=True):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (case.id, path)
