"""Which backend runs the Triton kernels: the GPU (``cuda``) or Triton's interpreter on CPU tensors.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, so ``configure`` must run before ``kernels``
is imported. The pytest plugin and the CLI call it first thing.
"""

from __future__ import annotations

import os
import sys

import torch

DEVICES = ("auto", "cuda", "cpu")


def resolve_device(requested: str = "auto") -> str:
    """``auto`` is ``cuda`` when a GPU is visible, else ``cpu`` (the interpreter)."""
    if requested not in DEVICES:
        raise ValueError(f"device: expected one of {', '.join(DEVICES)}, found {requested!r}")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but torch sees no CUDA device")
    return requested


def configure(requested: str = "auto") -> str:
    """Resolve the device and set ``TRITON_INTERPRET`` to match, before any kernel module is imported."""
    device = resolve_device(requested)
    want = "1" if device == "cpu" else "0"
    if "kernels" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") != want:
        raise RuntimeError(
            f"kernels were imported with TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')} "
            f"before the harness selected device {device!r}; select the device first"
        )
    os.environ["TRITON_INTERPRET"] = want
    if device == "cuda":
        share_autotuning_results()
    return device


AUTOTUNE_CACHE_ENV = "TRITON_CACHE_AUTOTUNING"
# The kernels' autotuning budget per config, "warmup_ms,rep_ms" (kernels/backend.py reads it when imported;
# unset: Triton's 25,100).
AUTOTUNE_BUDGET_ENV = "SSD_AUTOTUNE_MS"
SHARED_GPU_AUTOTUNE_MS = "1,5"


def shorten_autotuning() -> None:
    """For processes that share a GPU with other test workers: their tuning timings are noise (the other workers'
    kernels run in between), so measuring each config for 125 ms buys nothing, and dozens of tuning keys per worker
    made it most of the GPU suite's time (GPU run 5). Any config is correct (every one is tested), so a short
    budget changes nothing a check expects. A caller's own setting wins."""
    os.environ.setdefault(AUTOTUNE_BUDGET_ENV, SHARED_GPU_AUTOTUNE_MS)


def share_autotuning_results() -> None:
    """Keep autotuning results in the Triton cache (shared by xdist workers), unless the caller chose otherwise.

    Each process otherwise benchmarks every config of every tuning key itself (some 0.1 s per config), and the
    suite has dozens of keys per worker. Which config wins never changes what a check expects: a check compares
    calls made in one process, with one tuned config per key, and tests/test_kernel_stages.py forces every config.
    Triton reads this when an autotuner is created, so it must be set before ``kernels`` is imported.
    """
    os.environ.setdefault(AUTOTUNE_CACHE_ENV, "1")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def current_device() -> str:
    """The device the kernels of this process run on, as ``--device`` spells it (after ``configure``)."""
    return "cpu" if interpreting() else "cuda"


def profile_for(device: str) -> str:
    """The arithmetic profile (``reference.chunked``) that our kernels follow on ``device``."""
    return "interpreter" if resolve_device(device) == "cpu" else "cuda"
