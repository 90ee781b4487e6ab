"""Our Triton kernels for the Mamba2 SSD prefill path, and the default provider (``kernels:provider``).

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, so it is settled here before any kernel module
is imported: a CPU-only machine gets the interpreter unless the caller chose otherwise (``harness.backend.configure``
normally sets it first).
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from kernels.ssd import ssd_prefill  # noqa: E402  (must follow the TRITON_INTERPRET decision)


class TritonSSDProvider:
    """The provider interface (docs/provider.md): a name, the paths it has, and ``ssd_prefill``."""

    name = "triton-ssd"
    supported_paths = frozenset({"snapshot", "indexed"})

    @staticmethod
    def ssd_prefill(*args, **kwargs):
        return ssd_prefill(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<provider {self.name}>"


provider = TritonSSDProvider()

__all__ = ["provider", "ssd_prefill"]
