"""Whole-call replay: a call's launches recorded once per call signature, then launched again directly.

An eager ``ssd_prefill`` call spends most of its host time in Python that comes out the same for every call of one
signature: the argument checks, the plan, each stage's launch arguments, and per launch the launch cache's key.
``replayed(fn)`` wraps such a call. A signature (``call_signature``: every tensor's shape, strides, dtype, device
and address modulo 16, which arguments are the same tensor object, every other argument's value, the current
device) is run through ``fn`` as written and recorded: the tensors it allocates (``torch.empty`` and
``torch.empty_like``: shape, strides, dtype, device), and each launch's binary and its arguments in the binary's
order, a tensor argument as (an input or an allocation, a byte offset), anything else as its value. The signature's
next calls allocate the same tensors and hand each binary its arguments with the call's addresses in place: no
Python of ``fn``'s runs, and the launches, their order, grids, binaries and arguments are the recorded call's.

A recording is kept only where that is all the call does, so that a replay does everything the call would:

- every torch operation the call makes is an allocation, a view, or a read of metadata (``_ALLOWED``; watched by a
  ``TorchFunctionMode`` while it records): a copy, a fill or a read of a tensor's values would be skipped by a
  replay (the signature says nothing of values), so such a call is never replayed;
- every launch goes through ``LaunchCache`` and is bound, and every tensor argument is an input, an allocation or a
  view of one (the view's offset is a function of the signature);
- the call returns None or one of its allocations.

A replay runs only where the launch cache would launch every binary directly (``LaunchCache.launch``'s rules): no
one watches launches or compiles (the recompile guard, the warmup recording, the autotune guard and the bench's
fresh tuning each make ``TritonRuntime.unwatched`` false, so that every launch takes Triton's path under them),
and each binding is still what Triton would launch (``TritonRuntime.current``); else the call runs as written.
A recording also holds only while no module of ``kernels`` has an attribute assigned or deleted since (a test's
monkeypatch of a stage, a config table or a launcher: ``_WatchedModule``), since the recorded launches are what the
modules' code did at the time. At most ``LIMIT`` signatures are kept, the least recently called out first.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import types
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from kernels import direct_launch

LIMIT = 64  # call signatures kept: the model shapes and batch layouts a server meets, a few per layer type

_T = torch.Tensor
# Torch functions a recorded call may make: allocations, views (their offset from their base is recorded), and
# metadata reads. Anything else (a copy, an arithmetic op, a fill, ``item``) makes the call not replayable.
_ALLOCATIONS = frozenset({torch.empty, torch.empty_like})
_VIEWS = frozenset({_T.view, _T.__getitem__, _T.as_strided, _T.select, _T.unsqueeze, _T.expand, _T.narrow})
_METADATA = frozenset({
    _T.stride, _T.size, _T.dim, _T.numel, _T.element_size, _T.data_ptr, _T.storage_offset, _T.is_contiguous,
    _T.get_device, _T.__len__, _T.shape.__get__, _T.dtype.__get__, _T.device.__get__, _T.is_cuda.__get__,
    _T.ndim.__get__, _T.requires_grad.__get__, _T.layout.__get__, _T.is_sparse.__get__, _T.itemsize.__get__,
})
_ALLOWED = _ALLOCATIONS | _VIEWS | _METADATA


class _WatchedModule(types.ModuleType):
    """A module whose attribute assignments and deletions end every recording (``_GENERATION``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        _GENERATION[0] += 1
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        _GENERATION[0] += 1
        super().__delattr__(name)


_GENERATION = [0]  # bumped by every assignment to a watched module: a recording holds within one generation


def _watch_kernel_modules() -> None:
    """Every loaded module of ``kernels`` becomes a ``_WatchedModule`` (a recording's code is theirs)."""
    for name, module in list(sys.modules.items()):
        if (name == "kernels" or name.startswith("kernels.")) and type(module) is types.ModuleType:
            module.__class__ = _WatchedModule


def call_signature(device: int, args: tuple, kwargs: dict) -> tuple:
    """What a recording holds for: the device, then per argument (positional, then by keyword in the order given)
    for a tensor its shape, strides, dtype, device, address modulo 16 (the binaries specialize on alignment) and the
    position of the first argument that is the same object (a recorded launch reads that argument's address), for
    anything else its type and value."""
    first: dict[int, int] = {}
    described = []
    for position, value in enumerate((*args, *kwargs.values())):
        if isinstance(value, torch.Tensor):
            same = first.setdefault(id(value), position)
            described.append((value.shape, value.stride(), value.dtype, value.get_device(), value.data_ptr() & 15,
                              same))
        else:
            described.append((type(value), value))
    return device, tuple(kwargs), tuple(described)


@dataclass(frozen=True)
class Step:
    """One recorded launch: the binding, the grid, and the binary's arguments in its parameter order, each a value
    or, for a tensor, (source, byte offset) with source an input's position (>= 0) or ``-1 - allocation``."""

    binding: Any  # direct_launch.Binding
    grid: tuple[int, int, int]
    arguments: tuple  # a value, or an ``_Address``


@dataclass(frozen=True)
class _Address:
    source: int
    offset: int


@dataclass(frozen=True)
class Recording:
    allocations: tuple[tuple, ...]  # (shape, strides, dtype, device) per allocation, in call order
    steps: tuple[Step, ...]
    result: int | None  # the allocation the call returns, or None for a call that returns None
    generation: int  # ``_GENERATION`` when it was recorded


def _shares_storage(view: Any, base: Any) -> bool:
    """A view's result is a view of its base (``__getitem__`` with a tensor or list index is a copy)."""
    return (isinstance(view, torch.Tensor) and isinstance(base, torch.Tensor)
            and view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr())


class NotReplayable(Exception):
    """Why a call's recording cannot be kept (the message)."""


class _Recorder(TorchFunctionMode):
    """Watches one call: its torch operations (``_ALLOWED``), its allocations, its views' bases, its launches."""

    def __init__(self, inputs: list):
        super().__init__()
        self.inputs = {id(t): i for i, t in reversed(list(enumerate(inputs))) if isinstance(t, torch.Tensor)}
        self.allocations: list[torch.Tensor] = []
        self.allocated: dict[int, int] = {}
        self.bases: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # view id -> (view, base), both kept alive
        self.launches: list[tuple] = []
        self.refused: str | None = None
        self._launching = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if self._launching:  # Triton's own work inside a launch (a compile, a tuning's timing), not the call's
            return result
        if func in _ALLOCATIONS:
            self.allocated[id(result)] = len(self.allocations)
            self.allocations.append(result)
        elif func in _VIEWS and _shares_storage(result, args[0]):
            if result is not args[0]:
                self.bases[id(result)] = (result, args[0])
        elif func not in _METADATA and self.refused is None:  # indexing by a tensor or a list copies, as ops do
            self.refused = f"the call runs {getattr(func, '__qualname__', func)!r}, which a replay would skip"
        return result

    @contextlib.contextmanager
    def inside_launch(self):
        self._launching += 1
        try:
            yield
        finally:
            self._launching -= 1

    def launched(self, binding: Any, grid: Any, arguments: dict) -> None:
        """A launch of the call (``LaunchCache.launch``): the binding launched directly, or None."""
        self.launches.append((binding, grid, arguments))

    def address(self, t: torch.Tensor) -> _Address:
        offset = 0
        while True:
            if id(t) in self.inputs:
                return _Address(self.inputs[id(t)], offset)
            if id(t) in self.allocated:
                return _Address(-1 - self.allocated[id(t)], offset)
            if id(t) not in self.bases:
                raise NotReplayable(f"a launch reads a tensor {tuple(t.shape)} {t.dtype} that is neither an input, "
                                    "an allocation nor a view of one")
            view, base = self.bases[id(t)]
            offset += view.data_ptr() - base.data_ptr()
            t = base

    def recording(self, result: Any, generation: int) -> Recording:
        if self.refused is not None:
            raise NotReplayable(self.refused)
        steps = []
        for binding, grid, arguments in self.launches:
            if binding is None:
                raise NotReplayable("a launch took Triton's path (a first launch, a compile or a tuning)")
            if not isinstance(binding, direct_launch.Binding):
                raise NotReplayable(f"a launch's runtime binds {type(binding).__name__}, not a binary")
            if binding.address_names is None:
                raise NotReplayable("a launch reads a tensor that is not on a GPU")
            merged = binding.with_constexprs(arguments)
            values = tuple(self.address(v) if isinstance(v, torch.Tensor) else v for v in binding.in_order(merged))
            steps.append(Step(binding, direct_launch.launch_grid(grid, merged), values))
        if result is None:
            returned = None
        elif isinstance(result, torch.Tensor) and id(result) in self.allocated:
            returned = self.allocated[id(result)]
        else:
            raise NotReplayable("the call returns something other than None or one of its allocations")
        allocations = tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in self.allocations)
        return Recording(allocations, tuple(steps), returned, generation)


class CallReplays:
    """Recordings by call signature (the module's docstring). ``replays`` counts the calls replayed, ``refusals``
    the signatures never replayed and why (the latest reason per signature)."""

    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self.recordings: OrderedDict[tuple, Recording | None] = OrderedDict()
        self.refusals: dict[tuple, str] = {}
        self.replays = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def _recording_here(self) -> bool:
        """Whether this thread is inside a call being recorded (a nested call runs as written, recorded with it)."""
        return getattr(self._local, "recording", False)

    def call(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        launches = direct_launch.LAUNCHES
        if not isinstance(launches, direct_launch.LaunchCache) or self._recording_here():
            return fn(*args, **kwargs)
        runtime = launches.runtime
        if not runtime.unwatched():
            return fn(*args, **kwargs)
        try:
            signature = call_signature(runtime.device(), args, kwargs)
            hash(signature)
        except (TypeError, RuntimeError):  # an argument no signature holds (a dict, a tensor without an address)
            return fn(*args, **kwargs)
        with self._lock:
            known = signature in self.recordings
            recording = self.recordings.get(signature)
            if known:
                self.recordings.move_to_end(signature)
        if recording is not None:
            if recording.generation == _GENERATION[0] and all(runtime.current(s.binding) for s in recording.steps):
                return self._replay(launches, recording, args, kwargs)
        elif known:  # refused for good: a torch operation, an unbound kernel or a returned view
            return fn(*args, **kwargs)
        return self._record(fn, signature, args, kwargs)

    def _record(self, fn: Callable, signature: tuple, args: tuple, kwargs: dict) -> Any:
        _watch_kernel_modules()
        generation = _GENERATION[0]
        watcher = _Recorder([*args, *kwargs.values()])
        self._local.recording = True
        try:
            with direct_launch.observe_launches(watcher), watcher:
                result = fn(*args, **kwargs)
        finally:
            self._local.recording = False
        try:
            recording = watcher.recording(result, generation)
        except NotReplayable as reason:
            # A launch through Triton's path (a first launch, a compile, a tuning, a binding evicted) is this call's,
            # not the signature's: record again next time. Anything else is the call's nature: never replay it.
            transient = watcher.refused is None and any(binding is None for binding, _, _ in watcher.launches)
            with self._lock:
                self.refusals[signature] = str(reason)
                if not transient:
                    self._keep(signature, None)
            return result
        with self._lock:
            self._keep(signature, recording)
        return result

    def _keep(self, signature: tuple, recording: Recording | None) -> None:
        self.recordings[signature] = recording
        self.recordings.move_to_end(signature)
        while len(self.recordings) > self.limit:
            self.recordings.popitem(last=False)

    def _replay(self, launches: Any, recording: Recording, args: tuple, kwargs: dict) -> Any:
        allocations = [torch.empty_strided(shape, strides, dtype=dtype, device=device)
                       for shape, strides, dtype, device in recording.allocations]
        inputs = (*args, *kwargs.values())
        addresses = [t.data_ptr() if isinstance(t, torch.Tensor) else None for t in inputs]
        allocated = [t.data_ptr() for t in allocations]
        runtime = launches.runtime
        stream = runtime.stream(recording.steps[0].binding.device) if recording.steps else None
        for step in recording.steps:
            values = [(addresses[v.source] if v.source >= 0 else allocated[-1 - v.source]) + v.offset
                      if type(v) is _Address else v for v in step.arguments]
            runtime.run_bound(step.binding, step.grid, stream, values)
        launches.direct += len(recording.steps)
        self.replays += 1
        return None if recording.result is None else allocations[recording.result]


REPLAYS = CallReplays()


def replayed(fn: Callable) -> Callable:
    """``fn`` with its calls replayed where the module's docstring allows. Whatever ``fn`` reads besides its
    arguments and the modules of ``kernels`` must be fixed for the process (``kernels.backend`` reads its
    environment settings once)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return REPLAYS.call(fn, args, kwargs)

    return call
