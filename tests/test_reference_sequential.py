"""The fp64 sequential reference (reference/sequential.py) against the recurrence written out token by token here,
the way its module docstring states it: the blocked, stacked scan computes the same thing to fp64 rounding, for
the value scan, the magnitude shadow, the unit shadow and chunk-end states, across sequence and block borders."""

from __future__ import annotations

import math

import pytest
import torch

from reference import sequential as seq

F64 = torch.float64
T, H, P, N, G = 45, 4, 3, 8, 2
CU = [0, 17, 17, 45]  # an empty sequence, borders off the scan's block grid
EXITS = [5, 16, 17, 33, 45]


def naive(x, dt, A, B, C, *, D, z, dt_bias, dt_softplus, initial_states, magnitude=False, unit=False):
    """out (T,H,P), finals (Bt,H,P,N), states after each token (T,H,P,N): one token at a time, nothing fused."""
    f = (lambda t: t.double().abs()) if magnitude or unit else (lambda t: t.double())
    d = dt.double() + dt_bias.double()
    d = torch.where(d <= 20, torch.log1p(torch.exp(d)), d) if dt_softplus else d
    heads_per_group = H // G
    out = torch.zeros(T, H, P, dtype=F64)
    after = torch.zeros(T, H, P, N, dtype=F64)
    finals = []
    gate = z.double() * torch.sigmoid(z.double())
    gate = gate.abs() if magnitude or unit else gate
    for b in range(len(CU) - 1):
        h = torch.zeros(H, P, N, dtype=F64) if unit else f(initial_states[b]).clone()
        for t in range(CU[b], CU[b + 1]):
            for hh in range(H):
                g = hh // heads_per_group
                decay = math.exp(d[t, hh].item() * A[hh].item())
                inject = (f(x[t, hh])[:, None] * torch.ones(N, dtype=F64) if unit
                          else d[t, hh] * f(x[t, hh])[:, None] * f(B[t, g])[None, :])
                h[hh] = decay * h[hh] + inject
                y = h[hh] @ f(C[t, g])
                if not unit:
                    y = y + f(D[hh]) * f(x[t, hh])
                out[t, hh] = y * gate[t, hh]
            after[t] = h
        finals.append(h.clone())
    return out, torch.stack(finals), after


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(x=r(T, H, P), dt=r(T, H) * 0.5, A=-torch.rand(H, generator=g) - 0.2, B=r(T, G, N), C=r(T, G, N),
                D=r(H, P), z=r(T, H, P), dt_bias=r(H), dt_softplus=True, initial_states=r(len(CU) - 1, H, P, N))


def close(got, want, what):
    err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-300)).item()
    assert err < 1e-13, f"{what}: relative error {err:.3e} (fp64 rounding is ~1e-16)"


@pytest.mark.parametrize("variant", ["value", "magnitude"])
def test_sequential_ssd_is_the_token_by_token_recurrence(inputs, variant):
    magnitude = variant == "magnitude"
    out, final, ends = seq.sequential_ssd(**inputs, cu_seqlens=CU, exit_offsets=EXITS, magnitude=magnitude)
    want_out, want_final, after = naive(**inputs, magnitude=magnitude)
    close(out, want_out, f"{variant} out")
    close(final, want_final, f"{variant} final states")
    close(ends, after[[e - 1 for e in EXITS]], f"{variant} chunk-end states")


def test_ground_truth_is_all_three_scans_in_one(inputs):
    t = seq.ground_truth(**inputs, cu_seqlens=CU, chunk_size=8, exit_offsets=EXITS)
    value = naive(**inputs)
    shadow = naive(**inputs, magnitude=True)
    unit = naive(**inputs, unit=True)
    close(t.out, value[0], "out")
    close(t.final_states, value[1], "final states")
    close(t.chunk_end, value[2][[e - 1 for e in EXITS]], "chunk ends")
    close(t.shadows.out, shadow[0], "shadow out")
    close(t.shadows.final_states, shadow[1], "shadow finals")
    close(t.chunk_end_shadow, shadow[2][[e - 1 for e in EXITS]], "shadow chunk ends")
    close(t.shadows.unit_out, unit[0], "unit shadow out")
    close(t.shadows.unit_final, unit[1], "unit shadow finals")
    separate = seq.magnitude_shadows(**inputs, cu_seqlens=CU, chunk_size=8)
    for name in ("window_x", "c_abs_sum", "gate_abs"):
        assert torch.equal(getattr(t.shadows, name), getattr(separate, name)), name


def test_the_comparison_sees_a_wrong_recurrence(inputs):
    """Negative control: the naive twin with one token's dt changed is far outside fp64 rounding."""
    out, _ = seq.sequential_ssd(**inputs, cu_seqlens=CU)
    skewed = dict(inputs, dt=inputs["dt"].clone())
    skewed["dt"][20, 1] += 1.0
    want, _, _ = naive(**skewed)
    with pytest.raises(AssertionError, match="relative error"):
        close(out, want, "out")
