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
    """The provider interface (docs/provider.md): a name, the paths it has, ``ssd_prefill``, and the optional hooks
    ``warmup(requests)`` (the warmup registry, ``kernels.warmup``), ``stages`` (the stage functions the stage-level
    checks call, with docs/architecture.md's stage contracts), ``stage_launches`` (each stage of a call alone, for
    the stage bench: ``kernels.stage_launches``) and ``exact_across_configs`` (for ``every_config``)."""

    name = "triton-ssd"
    supported_paths = frozenset({"snapshot", "indexed"})

    def __init__(self):
        from types import SimpleNamespace

        from kernels.chunk_state_passing import state_passing
        from kernels.gather import gather_initial_states
        from kernels.ssd import ssd_prefill
        from kernels.state_passing_indexed import state_passing_indexed

        self.ssd_prefill = ssd_prefill
        self.stages = SimpleNamespace(state_passing=state_passing, state_passing_indexed=state_passing_indexed,
                                      gather_initial_states=gather_initial_states)
        # bmm and the chunk scan write no state (CB and out only), so the final states and the cache keep their bits
        # whichever of their configs runs (``every_config`` holds them to it; docs/provider.md).
        from kernels.bmm_chunk import bmm_chunk_kernel
        from kernels.chunk_scan import chunk_scan_kernel
        from kernels.specialization import kernel_name

        self.exact_across_configs = {kernel_name(k): ("states",) for k in (bmm_chunk_kernel, chunk_scan_kernel)}

    def warmup(self, requests) -> object:
        """Every specialization the SSD path can need for these model configurations (a server's startup warmup):
        compiled on the GPU, passed through Triton's warmup entry under the interpreter. Returns the registry's
        report."""
        from kernels.warmup import warmup_models

        return warmup_models(requests)

    def stage_launches(self, **call) -> dict:
        """Each stage of ``ssd_prefill(**call)`` as a closure launching it alone on the call's intermediates."""
        from kernels.stage_launches import stage_launches

        return stage_launches(self.ssd_prefill, **call)

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
