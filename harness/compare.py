"""Bit-exact and bounded comparisons that raise with a report a kernel engineer can act on.

Exact means ``rtol=0, atol=0`` compared as bits: tensors are viewed as a same-width integer dtype, so -0.0 vs +0.0
and NaN payloads count (docs/exactness.md). Every helper here raises; none returns a bool. Distances in ulps are
between values: +0.0 and -0.0 are the same value, 0 ulp apart (a bit comparison names them "sign of zero"), and a
NaN or an infinity has no ulp distance to anything (reported as such, never as a number).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Mismatch(AssertionError):
    """Raised by every comparison here. ``report`` is the full text, whose first line (``summary``) says what
    differed, in how many elements and, for floats, by how many ulps at most; ``details`` is the rest. ``count``:
    the number of differing elements (-1 where shapes, dtypes or kinds differ)."""

    def __init__(self, report: str, count: int, stats: dict | None = None):
        super().__init__(report)
        self.report = report
        self.count = count
        self.stats = stats or {}

    @property
    def summary(self) -> str:
        return self.report.strip().partition("\n")[0]

    @property
    def details(self) -> str:
        return self.report.strip().partition("\n")[2]


@dataclass
class BoundStats:
    """What a bounded comparison measured (also attached to reports)."""

    max_abs_err: float = 0.0
    max_rel_err: float = 0.0  # max |err| / |expected| over elements with expected != 0
    max_bound_use: float = 0.0  # max |err| / bound: 1.0 means at the bound
    # In the actual tensor's dtype, vs expected rounded to that dtype; None when a non-finite element (below) has
    # no ulp distance, so the largest one is unknown.
    max_ulp: int | None = 0
    numel: int = 0
    # Elements whose error is not a finite number: NaN in the result, or an infinity on one side only. Their error
    # is unbounded, so with any of them the maxima above are inf (max_ulp None), never those of the finite rest.
    nonfinite: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "max_bound_use": self.max_bound_use,
            "max_ulp": self.max_ulp,
            "numel": self.numel,
            "nonfinite": self.nonfinite,
            **self.extra,
        }

    def describe(self) -> str:
        """The maxima as the first line of a report shows them."""
        ulp = "none (non-finite elements)" if self.max_ulp is None else str(self.max_ulp)
        text = (f"max |err| {self.max_abs_err:.3e}, max err/bound {self.max_bound_use:.3g}, "
                f"max rel err {self.max_rel_err:.3e}, max ulp {ulp}")
        if self.nonfinite:
            text = (f"{self.nonfinite} non-finite: NaN, or an infinity on one side only; {text}"
                    + (f"; the {self.numel - self.nonfinite} finite ones: {self.extra['finite']}"
                       if "finite" in self.extra else ""))
        return text


def int_view(t: torch.Tensor) -> torch.Tensor:
    """The same bits as a signed integer tensor of the same width (bool and integer tensors pass through)."""
    if t.dtype == torch.bool or not (t.dtype.is_floating_point or t.dtype.is_complex):
        return t
    return t.contiguous().view(_INT_VIEW[t.element_size()])


def ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """Map float bits to int64 so that adjacent floats differ by 1 and -0.0 and +0.0, the same value, both map to 0
    (ulp metric: the smallest subnormals of either sign are 2 apart, one step to zero and one past it)."""
    bits = int_view(t).to(torch.int64)
    width = 8 * t.element_size()
    sign_min = -(1 << (width - 1))
    return torch.where(bits < 0, sign_min - bits, bits)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in units in the last place of the common float dtype (int64)."""
    if a.dtype != b.dtype:
        raise TypeError(f"ulp_distance: dtypes differ ({a.dtype} vs {b.dtype})")
    return (ordered_bits(a) - ordered_bits(b)).abs()


def _hex(bits: int, width: int) -> str:
    return f"0x{bits & ((1 << width) - 1):0{width // 4}x}"


def _fmt_index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    idx = []
    for s in reversed(shape):
        idx.append(flat % s if s else 0)
        flat = flat // s if s else 0
    return tuple(reversed(idx))


def _header(what: str, repro: str | None, context: str | None) -> list[str]:
    lines = []
    if context:
        lines.append(context)
    if repro:
        lines.append(f"repro: {repro}")
    return lines


def assert_bits_equal(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    what: str = "tensor",
    repro: str | None = None,
    context: str | None = None,
    max_report: int = 8,
) -> None:
    """Raise ``Mismatch`` unless ``actual`` and ``expected`` have the same shape, dtype and bits."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        lines = [
            f"{what}: shape/dtype differ: actual {tuple(actual.shape)} {actual.dtype}, "
            f"expected {tuple(expected.shape)} {expected.dtype}"
        ]
        raise Mismatch("\n".join(lines + _header(what, repro, context)), count=-1)
    if actual.device == expected.device and torch.equal(int_view(actual.detach()), int_view(expected.detach())):
        return  # equal bits, found where the tensors are: only a mismatch's report needs them on the host
    a = actual.detach().cpu()
    e = expected.detach().cpu()
    ai, ei = int_view(a), int_view(e)
    diff = (ai != ei).reshape(-1)
    count = int(diff.sum())
    if count == 0:
        return
    flat = diff.nonzero().reshape(-1)[:max_report].tolist()
    is_float = a.dtype.is_floating_point
    width = 8 * a.element_size()
    ulps = ulp_distance(a, e).reshape(-1) if is_float else None
    stats: dict = {"mismatched": count, "numel": a.numel()}
    first = f"{what}: {count} of {a.numel()} elements differ in bits ({a.dtype}, shape {tuple(a.shape)})"
    if is_float:
        finite_pairs = torch.isfinite(a.reshape(-1)) & torch.isfinite(e.reshape(-1))
        both_finite = finite_pairs & diff
        if both_finite.any():
            stats["max_ulp"] = int(ulps[both_finite].max())
            if stats["max_ulp"] == 0:
                first += ", the finite ones differ only in the sign of zero (0 ulp)"
            else:
                first += f", max ulp {stats['max_ulp']} among the finite ones"
        else:
            first += ", none of them a pair of finite values (no ulp distance)"
    lines = [first]
    for f in flat:
        idx = _fmt_index(f, tuple(a.shape))
        if is_float:
            av, ev = a.reshape(-1)[f].item(), e.reshape(-1)[f].item()
            ab, eb = int(ai.reshape(-1)[f]), int(ei.reshape(-1)[f])
            if not finite_pairs[f]:
                u = "none (non-finite)"
            elif int(ulps[f]) == 0:
                u = "0 (sign of zero)"
            else:
                u = str(int(ulps[f]))
            lines.append(
                f"  at {idx}: actual {av!r} ({_hex(ab, width)}) expected {ev!r} ({_hex(eb, width)}) ulp {u}"
            )
        else:
            lines.append(f"  at {idx}: actual {a.reshape(-1)[f].item()} expected {e.reshape(-1)[f].item()}")
    if count > len(flat):
        lines.append(f"  ... {count - len(flat)} more")
    raise Mismatch("\n".join(lines + _header(what, repro, context)), count=count, stats=stats)


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of ``t``'s underlying storage (including gaps and bytes before its offset) as a uint8 CPU tensor."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage).cpu().clone()


def assert_storage_equal(
    actual: torch.Tensor | torch.Tensor,
    expected_bytes: torch.Tensor,
    *,
    what: str = "storage",
    element: torch.dtype | None = None,
    repro: str | None = None,
    context: str | None = None,
) -> None:
    """Compare a tensor's whole storage with bytes saved earlier by ``storage_bytes``.

    With ``element`` (the tensor's dtype), mismatches are reported as elements of that dtype at storage offsets.
    """
    got = storage_bytes(actual)
    elem = element or actual.dtype
    size = torch.empty(0, dtype=elem).element_size()
    if got.numel() % size == 0 and expected_bytes.numel() == got.numel():
        assert_bits_equal(
            got.view(elem), expected_bytes.view(elem), what=f"{what} (storage elements)", repro=repro, context=context
        )
    else:
        assert_bits_equal(got, expected_bytes, what=f"{what} (bytes)", repro=repro, context=context)


def assert_within_bound(
    actual: torch.Tensor,
    expected: torch.Tensor,
    bound: torch.Tensor,
    *,
    what: str = "tensor",
    repro: str | None = None,
    context: str | None = None,
    max_report: int = 8,
) -> BoundStats:
    """Raise unless ``|actual - expected| <= bound`` elementwise (NaN anywhere in actual fails; so does any Inf
    that expected does not have). ``expected`` is usually float64 ground truth; ``bound`` broadcasts against it.
    Returns the measured ``BoundStats`` when it holds. Computed on ``actual``'s device: a serving case's output is
    tens of millions of fp64 elements and this makes two dozen elementwise passes over them, which on a CPU thread
    shared with other workers dominate the reference_bound check; every operation here
    is exact or a comparison, so the device does not change the verdict.
    """
    if actual.shape != expected.shape:
        raise Mismatch(
            f"{what}: shape differs: actual {tuple(actual.shape)}, expected {tuple(expected.shape)}", count=-1
        )
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(a.device, torch.float64)
    bnd = torch.broadcast_to(bound.detach().to(a.device, torch.float64), e.shape)
    err = (a - e).abs()
    same_inf = torch.isinf(a) & torch.isinf(e) & (a == e)
    err = torch.where(same_inf, torch.zeros_like(err), err)
    bad = ~(err <= bnd)  # NaN in err counts as bad
    nz = e != 0
    stats = BoundStats(numel=a.numel())
    finite = torch.isfinite(err)
    if finite.any():
        stats.max_abs_err = float(err[finite].max())
        rel = err[finite & nz] / e[finite & nz].abs()
        stats.max_rel_err = float(rel.max()) if rel.numel() else 0.0
        use = err[finite] / bnd[finite].clamp_min(torch.finfo(torch.float64).tiny)
        stats.max_bound_use = float(use.max())
    if actual.dtype.is_floating_point:
        e_rounded = e.to(actual.dtype)
        u = ulp_distance(actual.detach(), e_rounded)
        ok = torch.isfinite(a) & torch.isfinite(e_rounded.to(torch.float64))
        stats.max_ulp = int(u[ok].max()) if ok.any() else 0
    nonfinite = int((~finite).sum())
    if nonfinite:
        if finite.any():
            stats.extra["finite"] = stats.describe()
        stats.nonfinite = nonfinite
        stats.max_abs_err = stats.max_rel_err = stats.max_bound_use = math.inf
        stats.max_ulp = None
    count = int(bad.sum())
    if count == 0:
        return stats
    flat = bad.reshape(-1).nonzero().reshape(-1)[:max_report].tolist()
    lines = [f"{what}: {count} of {a.numel()} elements exceed the derived bound ({stats.describe()})"]
    for f in flat:
        idx = _fmt_index(f, tuple(a.shape))
        lines.append(
            f"  at {idx}: actual {a.reshape(-1)[f].item()!r} expected {e.reshape(-1)[f].item()!r} "
            f"|err| {err.reshape(-1)[f].item():.3e} bound {bnd.reshape(-1)[f].item():.3e}"
        )
    if count > len(flat):
        lines.append(f"  ... {count - len(flat)} more")
    raise Mismatch("\n".join(lines + _header(what, repro, context)), count=count, stats=stats.as_dict())
