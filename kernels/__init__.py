"""Our Triton kernels for the Mamba2 SSD prefill path, and the default provider (``kernels:provider``).

Triton reads ``TRITON_INTERPRET`` when it is imported and when ``@triton.jit`` decorates a kernel, so it is settled
here, before any kernel module imports triton: a machine without a usable GPU gets the interpreter unless the caller
chose otherwise (``harness.backend.configure`` normally sets it first). The package itself imports no kernel: the
provider and ``ssd_prefill`` load on first access, so that ``kernels.environment`` and ``kernels.interface``
(no triton) can be read before the backend is chosen.
"""

from kernels.environment import settle_interpreter

settle_interpreter()


class TritonSSDProvider:
    """The provider interface (docs/provider.md): a name, the paths it has, and ``ssd_prefill``."""

    name = "triton-ssd"
    supported_paths = frozenset({"snapshot", "indexed"})

    def __init__(self):
        from kernels.ssd import ssd_prefill

        self.ssd_prefill = ssd_prefill

    def __repr__(self) -> str:
        return f"<provider {self.name}>"


def __getattr__(name: str):
    """``provider`` and ``ssd_prefill``, made (and kept) at their first access."""
    if name == "provider":
        value = TritonSSDProvider()
    elif name == "ssd_prefill":
        from kernels.ssd import ssd_prefill as value
    else:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = ["provider", "ssd_prefill"]
