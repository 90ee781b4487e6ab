"""Compile launches for a GPU target on a machine without a GPU (Triton's wheel ships ``ptxas``).

The interpreter accepts code the GPU compiler rejects: a plain Python float global inside ``@jit`` code (the GPU
compiler reads only constexpr globals), a ``tl.dot`` with K < 16 (a small dstate). CPU CI would stay green on both.
Here the launches a real SSD call makes under the interpreter are captured (``capturing_launches``), reduced
to what Triton specializes on (dtypes, 16-byte alignment, ints, constexprs, launch options), and every distinct
specialization is compiled for sm_90 exactly as ``JITFunction.run`` would (same binder, same packing of signature,
constexprs, attributes and options), without a driver or a device.

The compiles run in a fresh child process started with ``TRITON_INTERPRET=0`` in its environment, so that every jit
function in it (ours and Triton's own libraries) is a plain ``JITFunction``: in the interpreting process the code
generator meets the interpreter's patched ``tl.tensor`` operators ("'ir.block_argument' object has no attribute
'dtype'"), and a process that switches the variable after start-up still holds interpreted library functions
(gluon's ``assert knobs.runtime.interpret or isinstance(fn, JITFunction)``).
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from harness.guards.specialization import Launch
from kernels.specialization import gpu_view, kernel_name, options_as_run_sees_them, specialization_key

# The H200 (Hopper, compute capability 9.0, warp size 32) as (backend, arch, warp size).
SM90 = ("cuda", 90, 32)


class GpuCompileError(AssertionError):
    """A specialization the GPU compiler rejects (the interpreter ran it)."""


class PointerStandIn:
    """What Triton specializes a tensor argument on: its dtype and whether its address is 16-byte aligned."""

    def __init__(self, dtype: torch.dtype, aligned: bool):
        self.dtype = dtype
        self.aligned = aligned
        self.shape = [1]  # Triton reads a 1-d tensor's shape and stride like MockTensor's

    def data_ptr(self) -> int:
        return 0 if self.aligned else 8

    def stride(self) -> tuple:
        return (1,)

    def __reduce__(self):
        return (PointerStandIn, (self.dtype, self.aligned))


@dataclass(frozen=True)
class PortableLaunch:
    """A launch reduced to picklable stand-ins, with the kernel named by module and qualified name."""

    kernel: str
    args: tuple
    kwargs: dict
    describe: str


def portable_value(value: Any) -> Any:
    """One launch argument as the compile child needs it: a tensor as its ``PointerStandIn``, anything else as is."""
    if isinstance(value, torch.Tensor):
        return PointerStandIn(value.dtype, value.data_ptr() % 16 == 0)
    return value


def portable(launch: Launch) -> PortableLaunch:
    return PortableLaunch(kernel_name(launch.kernel), tuple(portable_value(a) for a in launch.args),
                          {k: portable_value(v) for k, v in launch.kwargs.items()},
                          specialization_key(launch.kernel, launch.args, launch.kwargs).describe())


def distinct(launches: Iterable[Launch]) -> list[PortableLaunch]:
    """One portable launch per distinct specialization key, in first-seen order."""
    seen: dict[tuple[str, str], PortableLaunch] = {}
    for launch in launches:
        key = specialization_key(launch.kernel, launch.args, launch.kwargs)
        seen.setdefault((key.kernel, key.key), None)
        if seen[(key.kernel, key.key)] is None:
            seen[(key.kernel, key.key)] = portable(launch)
    return list(seen.values())


def _resolve(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def compile_launch(launch: PortableLaunch, target: tuple = SM90) -> Any:
    """Compile one launch's specialization for ``target`` (in this process); returns Triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    gpu = GPUTarget(*target)
    view = gpu_view(_resolve(launch.kernel))
    backend = make_backend(gpu)
    binder = create_function_from_signature(view.signature, view.params, backend)
    kwargs = options_as_run_sees_them(view, launch.kwargs)
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = view._pack_args(backend, kwargs, bound_args, specialization, options)
    return triton.compile(ASTSource(view, signature, constexprs, attrs), target=gpu, options=options.__dict__)


def _compile_all(launches: list[PortableLaunch], target: tuple) -> list[str | None]:
    """Child process body: an error text per launch (None where it compiled)."""
    errors = []
    for launch in launches:
        try:
            compile_launch(launch, target)
            errors.append(None)
        except Exception as exc:  # compiler errors come as several types; keep the message and where it arose
            import traceback

            where = traceback.extract_tb(exc.__traceback__)[-1]
            errors.append(f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno}: {where.line})")
    return errors


def compiler_child_env() -> dict[str, str]:
    """The environment of a child process that compiles for the GPU: Triton's compiler, not its interpreter, and
    this process's import path (so kernels defined anywhere it imports from, tests too, resolve by name)."""
    return {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def compile_each(launches: Iterable[Launch], target: tuple = SM90) -> list[tuple[PortableLaunch, str | None]]:
    """Compile every distinct specialization among ``launches`` for ``target`` in one fresh process (its start-up,
    importing torch, is most of a small compile's cost: callers with several groups of launches compile them
    together); returns each distinct launch with the compiler's error text, None where it compiled."""
    todo = distinct(launches)
    if not todo:
        raise ValueError("compile_distinct: no launches: nothing would be checked")
    with tempfile.TemporaryDirectory() as tmp:
        job, result = os.path.join(tmp, "launches.pkl"), os.path.join(tmp, "errors.pkl")
        with open(job, "wb") as fh:
            pickle.dump((todo, target), fh)
        env = compiler_child_env()
        proc = subprocess.run([sys.executable, "-m", "harness.guards.gpu_compile", job, result], env=env,
                              capture_output=True, text=True, cwd=os.getcwd())
        if proc.returncode != 0 or not os.path.exists(result):
            raise RuntimeError(f"gpu_compile child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        with open(result, "rb") as fh:
            errors = pickle.load(fh)
    return list(zip(todo, errors, strict=True))


def raise_failures(compiled: list[tuple[PortableLaunch, str | None]], target: tuple = SM90) -> int:
    """``GpuCompileError`` naming the kernel and specialization of each launch of ``compiled`` (``compile_each``'s
    answer) that the GPU compiler rejected; else the number compiled."""
    failed = [(launch, err) for launch, err in compiled if err is not None]
    if failed:
        raise GpuCompileError("\n".join(
            f"{launch.kernel} does not compile for {target[0]} sm_{target[1]}:\n  {launch.describe}\n{err}"
            for launch, err in failed))
    return len(compiled)


def compile_distinct(launches: Iterable[Launch], target: tuple = SM90) -> int:
    """Compile every distinct specialization among ``launches`` for ``target`` in a fresh process; raise
    ``GpuCompileError`` naming the kernel and specialization of each one the GPU compiler rejects. Returns the
    number compiled."""
    return raise_failures(compile_each(launches, target), target)


def _child(job: str, result: str) -> None:
    with open(job, "rb") as fh:
        launches, target = pickle.load(fh)
    errors = _compile_all(launches, target)
    with open(result, "wb") as fh:
        pickle.dump(errors, fh)


if __name__ == "__main__":
    _child(*sys.argv[1:3])
