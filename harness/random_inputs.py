"""Realistic random SSD inputs for the reference tests (x, B, C ~ N(0,1) in the io dtype; raw dt with dt_bias and
softplus giving dt ~ 0.02..0.4; A = -exp(U(0,1)); D ~ N(0,1)); generated on the CPU from a seed.

Here and not in ``reference``: building inputs needs the varlen metadata (``harness.varlen``), and the oracle must not
depend on the harness that uses it. The references take the metadata as tensors, like any provider.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.varlen import VarlenMetadata, build_varlen_metadata


@dataclass
class SsdInputs:
    """Packed inputs: x (T,H,P), dt (T,H) fp32, A (H,), B/C (T,G,N), D (H,) or (H,P), z (T,H,P), dt_bias (H,),
    initial_states (Bt,H,P,N) in the state dtype or None, plus the metadata."""

    meta: VarlenMetadata
    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_bias: torch.Tensor
    initial_states: torch.Tensor | None
    dt_softplus: bool = True
    extra: dict = field(default_factory=dict)

    def tensors(self) -> dict:
        return self.meta.tensors()


def make_inputs(*, contexts, tokens, chunk_size, nheads, headdim, dstate, ngroups, io_dtype, state_dtype,
                D="per_head", z=True, initial=True, seed=0) -> SsdInputs:
    meta = build_varlen_metadata(contexts, tokens, chunk_size)
    g = torch.Generator().manual_seed(seed)
    T, H, P, N, G = meta.total_tokens, nheads, headdim, dstate, ngroups
    randn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x = randn(T, H, P).to(io_dtype)
    B = randn(T, G, N).to(io_dtype)
    C = randn(T, G, N).to(io_dtype)
    dt = (randn(T, H) - 2.0).to(torch.float32)
    dt_bias = (0.5 * randn(H)).to(torch.float32)
    A = -torch.exp(torch.rand(H, generator=g)).to(torch.float32)
    Dv = None
    if D == "per_head":
        Dv = randn(H).to(torch.float32)
    elif D == "per_channel":
        Dv = randn(H, P).to(torch.float32)
    zz = randn(T, H, P).to(io_dtype) if z else None
    h0 = randn(meta.batch, H, P, N).to(state_dtype) if initial else None
    return SsdInputs(meta=meta, x=x, dt=dt, A=A, B=B, C=C, D=Dv, z=zz, dt_bias=dt_bias, initial_states=h0)
