"""What the kernels read from the process environment, and which arithmetic they follow where they run.

Neither torch nor triton is imported at module level, so that whoever embeds the kernels (an engine, the harness) can
read these names and set the variables before any kernel module imports triton.
"""

from __future__ import annotations

import os

# Triton's own switch: kernels are interpreted on CPU tensors (numpy) instead of compiled for the GPU. Triton reads it
# when it is imported (its library's jit functions) and when ``@triton.jit`` decorates a kernel.
INTERPRET_ENV = "TRITON_INTERPRET"
# The autotuning budget per config, "warmup_ms,rep_ms" (``kernels.backend`` reads it when imported; unset: Triton's
# 25,100). Processes that share a GPU shorten it: their timings are noise anyway.
AUTOTUNE_BUDGET_ENV = "SSD_AUTOTUNE_MS"

# Programmatic dependent launch (``kernels.backend.programmatic_launch``): "0" turns it off; unset or "1" leaves it on
# wherever the GPU has it (Hopper and later).
PDL_ENV = "SSD_PDL"
# Direct launches of bound binaries (``kernels.direct_launch``): "0" sends every launch through Triton's own launch
# path; unset or "1" launches a shape Triton has launched once directly, where the Triton version is the verified one.
DIRECT_LAUNCH_ENV = "SSD_DIRECT_LAUNCH"

DEVICES = ("cpu", "cuda")


def settle_interpreter() -> None:
    """Choose Triton's interpreter on a machine without a usable GPU, unless ``TRITON_INTERPRET`` is already set (a
    caller that chose a device sets it first, and then torch is not imported here)."""
    if INTERPRET_ENV in os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ[INTERPRET_ENV] = "1"


def arithmetic_profile(device: str) -> str:
    """The arithmetic profile (``reference.arith``'s names) the kernels follow when they run on ``device``: the
    interpreter on "cpu" (numpy's exp2, separate multiply and add, truncating bf16 casts), the GPU compiler on "cuda"
    (fused multiply-add, round-to-nearest casts)."""
    if device not in DEVICES:
        raise ValueError(f"device: expected one of {', '.join(DEVICES)}, found {device!r}")
    return "interpreter" if device == "cpu" else "cuda"
