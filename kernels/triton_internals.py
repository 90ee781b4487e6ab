"""Every Triton internal the kernels use (beyond ``triton``, ``triton.language``, ``triton.testing`` and the
documented extern-math route ``triton.language.extra.libdevice``), imported here only, under the version check the
harness uses too (``kernels.triton_version``).

- Programmatic dependent launch: ``triton.language.extra.cuda``'s ``gdc_wait`` and ``gdc_launch_dependents`` (PTX
  ``griddepcontrol``). Fallback: on a Triton outside ``VERIFIED``, or one without them, ``PDL_PROBLEM`` says why,
  ``PDL_AVAILABLE`` is False (programmatic launch stays off: ``kernels.backend.programmatic_launch``), and both names
  are kernels that fail to compile with that reason. A launch without programmatic launch never reaches the branch
  that calls them, so the kernels run as plain launches; a launch that did would otherwise skip its wait.
- Specialization keys (``kernels.specialization``, the warmup registry): ``triton.runtime.jit``'s ``JITFunction``,
  ``MockTensor`` and ``create_function_from_signature``, ``triton.runtime.interpreter.InterpretedFunction`` and
  ``triton.backends.compiler.BaseBackend``. Nothing computes Triton's keys without Triton's own binder, so there is
  no fallback: ``require_specialization`` refuses with ``UnsupportedTriton`` naming why (``SPECIALIZATION_PROBLEM``),
  as the harness's gates do, and the kernels themselves still run.
- Cache keys (``settle_cache_keys``): ``JITFunction``'s ``cache_key``, ``hash`` and ``used_global_vals``. Fallback:
  on a Triton outside ``VERIFIED`` nothing is settled (``CACHE_KEY_PROBLEM`` says why); Triton then keys a kernel by
  the order its functions were first hashed in, which costs compiles, never bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton_version import UnsupportedTriton, version_problem

_PDL = "kernels/triton_internals.py relies on triton.language.extra.cuda's gdc_wait and gdc_launch_dependents,"
_SPECIALIZATION = ("kernels/triton_internals.py relies on triton.runtime.jit's JITFunction, MockTensor and "
                   "create_function_from_signature, InterpretedFunction and BaseBackend,")


def _pdl_problem() -> str | None:
    problem = version_problem(_PDL)
    if problem is not None:
        return problem
    try:
        from triton.language.extra import cuda
    except ImportError as exc:
        return f"Triton {triton.__version__} has no triton.language.extra.cuda ({exc}): {_PDL}"
    missing = [name for name in ("gdc_wait", "gdc_launch_dependents") if not hasattr(cuda, name)]
    return f"Triton {triton.__version__} lacks {', '.join(missing)}: {_PDL}" if missing else None


PDL_PROBLEM = _pdl_problem()
PDL_AVAILABLE = PDL_PROBLEM is None

if PDL_AVAILABLE:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
else:

    @triton.jit
    def gdc_wait():
        """Stands in for programmatic launch's wait where the running Triton's is not trusted: never compiles."""
        tl.static_assert(False, "programmatic launch is off on this Triton (kernels.triton_internals.PDL_PROBLEM)")

    @triton.jit
    def gdc_launch_dependents():
        """Stands in for programmatic launch's early signal where the running Triton's is not trusted: never
        compiles."""
        tl.static_assert(False, "programmatic launch is off on this Triton (kernels.triton_internals.PDL_PROBLEM)")


def _specialization_problem() -> str | None:
    problem = version_problem(_SPECIALIZATION)
    if problem is not None:
        return problem
    try:
        from triton.backends.compiler import BaseBackend  # noqa: F401
        from triton.runtime.interpreter import InterpretedFunction  # noqa: F401
        from triton.runtime.jit import JITFunction, MockTensor, create_function_from_signature  # noqa: F401
    except ImportError as exc:
        return f"Triton {triton.__version__}: {exc}: {_SPECIALIZATION}"
    return None


SPECIALIZATION_PROBLEM = _specialization_problem()

if SPECIALIZATION_PROBLEM is None:
    from triton.backends.compiler import BaseBackend
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction, MockTensor, create_function_from_signature
else:
    BaseBackend = InterpretedFunction = JITFunction = MockTensor = create_function_from_signature = None


_CACHE_KEY = ("kernels/triton_internals.py relies on triton.runtime.jit's JITFunction (its cache_key, hash and "
              "used_global_vals),")
CACHE_KEY_PROBLEM = SPECIALIZATION_PROBLEM or version_problem(_CACHE_KEY)
# Hashing runs to a fixed point in as many passes as the deepest call chain of jit functions, plus one to see it.
MAX_SETTLE_PASSES = 8


def _jit_functions(namespace: dict) -> list:
    """The ``JITFunction`` objects of a module's namespace, unwrapped from autotuners and heuristics (``.fn``), in
    name order."""
    found = {}
    for _, value in sorted(namespace.items(), key=lambda item: item[0]):
        while not isinstance(value, JITFunction) and hasattr(value, "fn"):
            value = value.fn
        if isinstance(value, JITFunction):
            found.setdefault(id(value), value)
    return list(found.values())


def settle_cache_keys(namespace: dict) -> None:
    """Give each jit function of ``namespace`` (a kernel module's ``globals()``, at its end) the cache key it has
    when every function it calls was hashed first, whatever the process hashes first later.

    Triton's ``cache_key`` adds a called function's constexpr globals (``used_global_vals``) to the caller's key
    before it hashes the called function, so a kernel hashed before its helpers lacks their globals: one process
    keys it with ``LOG2E`` and another without, and each compiles the same binary under its own key (pytest workers
    whose tests launched kernels in different orders; a second run on a warm disk cache). Hashing again until no key
    changes makes every key hold all the globals its calls read. A no-op under the interpreter (no ``JITFunction``)
    and outside ``VERIFIED``."""
    if CACHE_KEY_PROBLEM is not None:
        return
    functions = _jit_functions(namespace)
    keys = None
    for _ in range(MAX_SETTLE_PASSES):
        for fn in functions:
            fn.hash = None  # what cache_key caches; the next access hashes again with the callees' globals known
        settled = [fn.cache_key for fn in functions]
        if settled == keys:
            return
        keys = settled
    raise RuntimeError(f"jit functions' cache keys still changed after {MAX_SETTLE_PASSES} passes: "
                       f"{[fn.__name__ for fn in functions]}")


# Direct launches (``kernels.direct_launch``) call a compiled binary's launcher with Triton's own argument
# convention, which is read from this one version; every other version launches through Triton's path.
DIRECT_LAUNCH_VERIFIED = "3.6.0"


def launch_internals() -> tuple:
    """(``Autotuner``, ``JITFunction``, ``driver``): what ``kernels.direct_launch`` reads of Triton's launch path, on
    ``DIRECT_LAUNCH_VERIFIED`` only (it checks the version before it asks)."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    return Autotuner, JITFunction, driver


def require_specialization() -> None:
    """Raise ``UnsupportedTriton`` unless this Triton's binder and jit classes are the verified ones."""
    if SPECIALIZATION_PROBLEM is not None:
        raise UnsupportedTriton(SPECIALIZATION_PROBLEM)


__all__ = ["CACHE_KEY_PROBLEM", "DIRECT_LAUNCH_VERIFIED", "PDL_AVAILABLE", "PDL_PROBLEM", "SPECIALIZATION_PROBLEM",
           "BaseBackend", "InterpretedFunction", "JITFunction", "MockTensor", "UnsupportedTriton",
           "create_function_from_signature", "gdc_launch_dependents", "gdc_wait", "launch_internals",
           "require_specialization", "settle_cache_keys"]
