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


__all__ = ["DIRECT_LAUNCH_VERIFIED", "PDL_AVAILABLE", "PDL_PROBLEM", "SPECIALIZATION_PROBLEM", "BaseBackend",
           "InterpretedFunction", "JITFunction", "MockTensor", "UnsupportedTriton", "create_function_from_signature",
           "gdc_launch_dependents", "gdc_wait", "launch_internals", "require_specialization"]
