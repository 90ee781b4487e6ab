"""Stage launches that skip Triton's generic launch path once it has launched the same shape: ``launch``.

``kernel[grid](**arguments)`` goes, on every call, through ``Autotuner.run`` (the tuning key: the key arguments'
values and every tensor's dtype as a string, then the cache lookup) and ``JITFunction.run`` (its binder specializes
every argument, the cache key is built from the specialization and the options, the device cache is searched, launch
metadata is assembled for the launch hooks). For one call site at one shape all of that comes out the same each time.
``launch`` keys a call by what decides the binary and its config (``shape_key``: every tensor's dtype and 16-byte
alignment, every other argument's exact value, the kernel and the device; finer than both of Triton's keys), lets
Triton's own path launch a key the first time, then binds what Triton chose (``Binding``: the compiled binary, the
autotuner's config, the parameter order) and launches that binary directly for the key afterwards: the grid is
computed from the arguments as Triton computes it, the arguments go to the binary's launcher in the kernel's
parameter order, with the current stream, as ``JITFunction.run`` passes them. The key reads every tensor's address
(its alignment); where every tensor of the launch is on a GPU those addresses go to the launcher in the tensors'
places, which it takes as device pointers as they are, instead of asking the driver for each tensor's.

Nothing Triton's path would do differently may be skipped, so a launch takes Triton's path whenever:

- the direct path is off: under the interpreter (there is no binary; interpreted launches always take Triton's
  path), on a Triton other than ``VERIFIED`` (the internals below are read from that version), with
  ``SSD_DIRECT_LAUNCH=0``, or for a kernel wrapped otherwise than in one ``Autotuner`` without a config pre-hook;
- someone watches launches or compiles: ``JITFunction.run`` or ``Autotuner.run`` replaced on the class (the recompile
  guard and the warmup recording wrap the first, ``harness.triton_launches``; the autotune guard and the bench's
  fresh tuning the second, ``harness.triton_autotuner``) or on the kernel's own objects, a compile hook
  (``knobs.runtime.jit_cache_hook``), a launch enter or exit hook, a kernel's ``pre_run_hooks``, or Triton's debug
  mode;
- the key has no binding: its first launch, or its binding was evicted (``LaunchCache`` holds at most ``LIMIT``
  bindings, least recently launched out first);
- Triton's caches no longer hold what the binding holds: the autotuner's cache lost the key's config (``forget_tuning``,
  ``forced_config``), the device cache lost the binary (the recompile guard's ``cold_in_memory_cache``) or Triton's
  instrumentation mode changed: Triton would tune or compile again, so its path runs and the key is bound afresh.

What is read of Triton 3.6.0: ``JITFunction.device_caches[device][0]`` (the key -> ``CompiledKernel`` dict),
``JITFunction.params`` (the parameter order), ``JITFunction.used_global_vals`` (checked as ``run`` checks it),
``Autotuner.cache`` / ``configs`` / ``keys`` / ``arg_names`` / ``best_config`` and its tuning key's formula,
``CompiledKernel.run(gridX, gridY, gridZ, stream, function, packed_metadata, launch_metadata, enter_hook,
exit_hook, *arguments)`` and ``driver.active.get_current_device`` / ``get_current_stream``.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch
import triton

from kernels.backend import INTERPRET
from kernels.environment import DIRECT_LAUNCH_ENV
from kernels.triton_internals import DIRECT_LAUNCH_VERIFIED, launch_internals

VERIFIED = DIRECT_LAUNCH_VERIFIED
LIMIT = 256  # bindings kept, over every kernel and shape: a few per stage kernel and shape class in use


def direct_launch_setting(raw: str | None) -> bool:
    """``SSD_DIRECT_LAUNCH``: unset or "1" -> on where Triton is ``VERIFIED``, "0" -> every launch through Triton."""
    if raw in (None, "", "1"):
        return True
    if raw == "0":
        return False
    raise ValueError(f"{DIRECT_LAUNCH_ENV}={raw!r}: expected '0' (every launch through Triton) or '1' (direct "
                     "launches where this Triton is verified)")


def shape_key(kernel: Any, device: int, arguments: dict) -> tuple:
    """What decides the binary and the config of a launch of ``kernel`` with ``arguments`` on ``device``: the
    arguments' names and types, for a tensor its dtype, whether its address is 16-byte aligned (what Triton
    specializes a pointer on) and whether it is on a GPU, for anything else its exact value (Triton keys ints on their
    class, constexprs and the autotuner's key arguments on their value; the exact value is finer than either). The
    type of every argument is in the key, so ``True`` and ``1``, or ``1`` and ``1.0``, never share one."""
    return launch_key(kernel, device, arguments)[0]


def launch_key(kernel: Any, device: int, arguments: dict) -> tuple[tuple, list[int]]:
    """(``shape_key``, the tensors' addresses in argument order): the addresses are read once, for the key's
    alignment and for the launch (``TritonRuntime.launch``)."""
    values = tuple(arguments.values())
    types = tuple(map(type, values))
    split = _SPLITS.get(types)
    if split is None:
        split = _SPLITS[types] = _split(types)
    tensors, scalars = split
    held = tensors(values)
    addresses = [t.data_ptr() for t in held]
    signature = tuple([(t.dtype, not address & 15, t.is_cuda) for t, address in zip(held, addresses, strict=True)])
    return (kernel, device, tuple(arguments), types, scalars(values), signature), addresses


def _split(types: tuple) -> tuple[Any, Any]:
    """(the tensors of an argument tuple, its other values) as two getters, for arguments of these types."""
    tensor_at = [i for i, kind in enumerate(types) if issubclass(kind, torch.Tensor)]
    other_at = [i for i, kind in enumerate(types) if not issubclass(kind, torch.Tensor)]
    return _picker(tensor_at), _picker(other_at)


def _picker(keys: list) -> Any:
    """A getter of the items at ``keys`` (positions of a tuple, or names of a dict), in that order, always as a
    tuple (``operator.itemgetter`` returns a bare item for one key and fails on none)."""
    if not keys:
        return lambda items: ()
    if len(keys) == 1:
        (key,) = keys
        return lambda items: (items[key],)
    return operator.itemgetter(*keys)


# Argument types -> the getters of their tensors and other values: one entry per launch site's argument layout.
_SPLITS: dict[tuple, tuple[Any, Any]] = {}


@dataclass
class Binding:
    """What Triton chose for one shape key: the binary, the config (None without an autotuner), and what is checked
    before each direct launch that Triton would still choose them."""

    binary: Any  # CompiledKernel
    jit: Any  # the JITFunction
    tuner: Any  # the Autotuner around it, or None
    config: Any  # the tuner's Config for this key, or None
    tuning_key: tuple | None  # the tuner's key for these arguments (None when it has one config)
    triton_key: Any  # the binary's key in jit.device_caches[device][0]
    device: int
    params: tuple[str, ...]  # the kernel's parameter names, in order
    constexprs: dict  # the config's kwargs (block sizes ...), merged into the arguments
    instrumentation_mode: str  # Triton's compile option at binding time (part of its key, not of the shape key)
    # The tensor arguments' names in argument order where every one is on a GPU, else None (``TritonRuntime.launch``).
    address_names: tuple[str, ...] | None = None

    def __post_init__(self):
        # The binary's arguments in parameter order, from the launch's arguments merged with the config's constexprs.
        self.in_order = _picker(self.params)

    def with_constexprs(self, arguments: dict) -> dict:
        """A launch's arguments with the config's constexprs (block sizes ...), as the binary takes them."""
        return {**arguments, **self.constexprs}


class TritonRuntime:
    """The Triton 3.6.0 internals ``LaunchCache`` uses (the module's docstring)."""

    def __init__(self):
        from triton import knobs

        Autotuner, JITFunction, driver = launch_internals()
        self.Autotuner, self.JITFunction, self.driver, self.knobs = Autotuner, JITFunction, driver, knobs
        self.jit_run = inspect.unwrap(JITFunction.__dict__["run"])
        self.autotuner_run = inspect.unwrap(Autotuner.__dict__["run"])

    def unwatched(self) -> bool:
        """No one watches launches or compiles (the module's docstring)."""
        runtime = self.knobs.runtime
        return (self.JITFunction.__dict__["run"] is self.jit_run
                and self.Autotuner.__dict__["run"] is self.autotuner_run
                and runtime.jit_cache_hook is None and not runtime.debug
                and self._idle(runtime.launch_enter_hook) and self._idle(runtime.launch_exit_hook))

    def _idle(self, hook: Any) -> bool:
        """A launch hook that calls nothing: None, or Triton's hook chain with no calls in it."""
        return hook is None or (isinstance(hook, self.knobs.HookChain) and not hook.calls)

    def device(self) -> int:
        return self.driver.active.get_current_device()

    def stream(self, device: int) -> int:
        return self.driver.active.get_current_stream(device)

    def layers(self, kernel: Any) -> tuple[Any, Any] | None:
        """(Autotuner or None, JITFunction) of a kernel this path can launch, else None."""
        tuner = kernel if isinstance(kernel, self.Autotuner) else None
        jit = tuner.fn if tuner is not None else kernel
        if type(jit) is not self.JITFunction:  # a Heuristics or another wrapper: its own logic runs in its run
            return None
        return tuner, jit

    def bind(self, kernel: Any, arguments: dict, result: Any, device: int) -> Binding | None:
        """The binding of what Triton's path just launched (``result``: what ``kernel[grid](...)`` returned), or None
        when this kernel or launch cannot be launched directly."""
        layers = self.layers(kernel)
        if layers is None or result is None or not hasattr(result, "packed_metadata"):
            return None
        tuner, jit = layers
        config, tuning_key = None, None
        if tuner is not None:
            config = tuner.best_config
            if config.pre_hook is not None:
                return None
            if len(tuner.configs) > 1:
                tuning_key = tuning_key_of(tuner, arguments)
                if tuner.cache.get(tuning_key) is not config:
                    return None
        params = tuple(p.name for p in jit.params)
        constexprs = dict(config.kwargs) if config is not None else {}
        if any(name not in arguments and name not in constexprs for name in params):
            return None  # a parameter left to its default: Triton's binder fills it in, this path does not
        kernel_cache = jit.device_caches[device][0]
        triton_key = next((k for k, v in kernel_cache.items() if v is result), None)
        if triton_key is None:
            return None
        return Binding(result, jit, tuner, config, tuning_key, triton_key, device, params, constexprs,
                       self.knobs.compilation.instrumentation_mode, gpu_tensor_names(arguments))

    def current(self, binding: Binding) -> bool:
        """Whether Triton's path would still launch ``binding``'s binary with its config."""
        tuner, jit = binding.tuner, binding.jit
        if self.knobs.compilation.instrumentation_mode != binding.instrumentation_mode:
            return False
        if tuner is not None:
            if binding.tuning_key is None:
                if len(tuner.configs) != 1 or tuner.configs[0] is not binding.config:
                    return False
            elif tuner.cache.get(binding.tuning_key) is not binding.config:
                return False
        if jit.pre_run_hooks or "run" in jit.__dict__ or (tuner is not None and "run" in tuner.__dict__):
            return False  # a hook, or a run of this one kernel replaced: Triton's path runs them
        if jit.device_caches[binding.device][0].get(binding.triton_key) is not binding.binary:
            return False
        for (name, _), (value, globals_dict) in jit.used_global_vals.items():
            if globals_dict.get(name, _MISSING) != value:
                return False  # Triton's path raises for it
        return True

    def launch(self, binding: Binding, grid: Any, arguments: dict, addresses: list[int]) -> Any:
        """``binding``'s binary on these arguments, as ``JITFunction.run`` launches it with no launch hooks.
        ``addresses``: the tensors' (``launch_key``). Where every tensor is on a GPU they go to the launcher as
        addresses: for device memory the address is the device pointer that the launcher would otherwise look up
        per tensor through the driver (``cuPointerGetAttribute``)."""
        arguments = binding.with_constexprs(arguments)
        grid = launch_grid(grid, arguments)
        if binding.address_names is not None:
            arguments.update(zip(binding.address_names, addresses, strict=True))
        return self.run_bound(binding, grid, self.stream(binding.device), binding.in_order(arguments))

    def run_bound(self, binding: Binding, grid: tuple[int, int, int], stream: int, values: Any) -> Any:
        """``binding``'s binary on a three-dimensional ``grid`` with its arguments' ``values`` in parameter order
        (addresses for tensors), on ``stream``: the one call of Triton's launcher (``CompiledKernel.run``), here and
        for ``kernels.call_replay``."""
        if binding.tuner is not None:
            binding.tuner.best_config = binding.config
        binary = binding.binary
        binary.run(*grid, stream, binary.function, binary.packed_metadata, None, None, None, *values)
        return binary


def launch_grid(grid: Any, arguments: dict) -> tuple[int, int, int]:
    """A launch's grid as three sizes: ``grid(arguments)`` where it is callable (as Triton computes it, with the
    config's constexprs among the arguments), padded with ones."""
    if callable(grid):
        grid = grid(arguments)
    return (tuple(grid) + (1, 1))[:3]


def gpu_tensor_names(arguments: dict) -> tuple[str, ...] | None:
    """The tensor arguments' names in argument order, or None where one of them is not on a GPU (its pointer is
    the launcher's to look up, or to refuse)."""
    names = []
    for name, value in arguments.items():
        if isinstance(value, torch.Tensor):
            if not value.is_cuda:
                return None
            names.append(name)
    return tuple(names)


_MISSING = object()


def tuning_key_of(tuner: Any, arguments: dict) -> tuple:
    """``Autotuner.run``'s tuning key for a launch with ``arguments`` by keyword: the key arguments' values, then the
    dtype (as a string) of every argument that has one, in the order the arguments are passed."""
    named = {k: v for k, v in arguments.items() if k in tuner.arg_names}
    key = [named[k] for k in tuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


class LaunchCache:
    """``launch(kernel, grid, arguments)``: Triton's path for a key's first launch and whenever the module's
    docstring says so, the bound binary directly otherwise. ``runtime`` is ``TritonRuntime()`` (tests give a fake);
    ``direct`` and ``through_triton`` count the launches each way."""

    def __init__(self, runtime: Any, limit: int = LIMIT):
        self.runtime, self.limit = runtime, limit
        # key -> [binding, the launch count at its latest launch] (the eviction order: least recently launched out)
        self.bindings: dict[tuple, list] = {}
        self.direct = self.through_triton = 0
        self._lock = threading.Lock()
        self._launches = 0

    def launch(self, kernel: Any, grid: Any, arguments: dict) -> Any:
        observer = getattr(_OBSERVER, "current", None)
        if observer is not None:
            with observer.inside_launch():
                result, binding = self._launch(kernel, grid, arguments)
            observer.launched(binding, grid, arguments)
            return result
        return self._launch(kernel, grid, arguments)[0]

    def _launch(self, kernel: Any, grid: Any, arguments: dict) -> tuple[Any, Binding | None]:
        """(what the launch returns, the binding it launched directly, or None where it took Triton's path)."""
        runtime = self.runtime
        if not runtime.unwatched():
            return self._through_triton(kernel, grid, arguments, None), None
        device = runtime.device()
        key, addresses = launch_key(kernel, device, arguments)
        try:
            entry = self.bindings.get(key)
        except TypeError:  # an argument no key can hold (a list ...): Triton's path decides what it means
            return self._through_triton(kernel, grid, arguments, None), None
        binding = None
        if entry is not None:
            with self._lock:
                self._launches += 1
                entry[1] = self._launches
            binding = entry[0]
        if binding is not None and runtime.current(binding):
            self.direct += 1
            return runtime.launch(binding, grid, arguments, addresses), binding
        return self._through_triton(kernel, grid, arguments, (key, device)), None

    def _through_triton(self, kernel: Any, grid: Any, arguments: dict, bind_as: tuple | None) -> Any:
        self.through_triton += 1
        result = kernel[grid](**arguments)
        if bind_as is not None:
            key, device = bind_as
            binding = self.runtime.bind(kernel, arguments, result, device)
            with self._lock:
                if binding is None:
                    self.bindings.pop(key, None)
                else:
                    self._launches += 1
                    self.bindings[key] = [binding, self._launches]
                    while len(self.bindings) > self.limit:  # the least recently launched out
                        del self.bindings[min(self.bindings, key=lambda k: self.bindings[k][1])]
        return result

    def clear(self) -> None:
        with self._lock:
            self.bindings.clear()


# The observer of this thread's launches, if any (``observe_launches``).
_OBSERVER = threading.local()


@contextlib.contextmanager
def observe_launches(observer: Any):
    """Report every ``LaunchCache`` launch this thread makes inside the block to ``observer``: its
    ``inside_launch()`` context wraps the launch, then ``launched(binding, grid, arguments)`` gets the binding
    launched directly, or None where the launch took Triton's path (``kernels.call_replay`` records calls so)."""
    previous = getattr(_OBSERVER, "current", None)
    _OBSERVER.current = observer
    try:
        yield observer
    finally:
        _OBSERVER.current = previous


class TritonPath:
    """Every launch through ``kernel[grid](...)``: where the direct path is off (the module's docstring)."""

    direct = through_triton = 0

    def launch(self, kernel: Any, grid: Any, arguments: dict) -> Any:
        self.through_triton += 1
        return kernel[grid](**arguments)

    def clear(self) -> None:
        pass


def launches_for(interpret: bool, version: str, setting: str | None) -> LaunchCache | TritonPath:
    """This process's launcher: a ``LaunchCache`` over ``TritonRuntime`` where the direct path is on, else
    ``TritonPath``."""
    if interpret or version != VERIFIED or not direct_launch_setting(setting):
        return TritonPath()
    return LaunchCache(TritonRuntime())


LAUNCHES = launches_for(INTERPRET, triton.__version__, os.environ.get(DIRECT_LAUNCH_ENV))


def launch(kernel: Any, grid: Any, arguments: dict) -> Any:
    """Launch ``kernel`` on ``grid`` with ``arguments`` (by name): what ``kernel[grid](**arguments)`` does, directly
    where the module's docstring allows."""
    return LAUNCHES.launch(kernel, grid, arguments)
