"""Arithmetic profiles: how the kernels round on each backend (docs/exactness.md), so the chunked reference can
reproduce them.

``cuda``: exp as ``torch.exp2(LOG2E * x)`` in fp32, multiply-add as one fused ``torch.addcmul``, fp32 -> bf16/fp16
casts round to nearest even. ``interpreter`` (Triton's numpy interpreter): exp is numpy's ``exp2`` on the fp32
array, ``a*b+c`` is a separate multiply and add, fp32 -> bf16 truncates (the interpreter's ``_convert_float`` without
a rounding mode), fp32 -> fp16 is numpy's ``astype`` (nearest even), ``tl.cumsum`` is ``np.cumsum`` (sequential fp32).

The kernels never call ``tl.exp``: every exponential, softplus' and sigmoid's included, is ``tl.math.exp2(x * LOG2E)``.
Softplus is ``libdevice.log1p(e)`` on CUDA (the CUDA math library's ``log1pf``, the routine ``torch.log1p`` runs on
CUDA fp32 tensors) and ``tl.math.log(1.0 + e)`` under the interpreter (no libdevice there): numpy's fp32 add and
``np.log``. Sigmoid is ``div_rn(1, 1 + e)``: IEEE division on both backends (Triton's plain ``/`` is the approximate
``div.full.f32`` on CUDA, which torch cannot reproduce).
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch

Profile = Literal["cuda", "interpreter"]
PROFILES: tuple[str, ...] = ("cuda", "interpreter")

LOG2E = 1.4426950408889634  # rounded to fp32 wherever it multiplies an fp32 tensor, as a Triton constant is
SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above it, as in the kernels (kernels.chunk_cumsum.SOFTPLUS_THRESHOLD)
_LOG2E_F32 = torch.tensor(LOG2E, dtype=torch.float32)


def check_profile(profile: str) -> str:
    if profile not in PROFILES:
        raise ValueError(f"profile: expected one of {', '.join(PROFILES)}, found {profile!r}")
    return profile


def _np_unary(x: torch.Tensor, fn) -> torch.Tensor:
    """Apply a numpy ufunc to an fp32 tensor on the CPU, the way the interpreter does, and move the result back."""
    arr = x.detach().to(torch.float32).cpu().contiguous().numpy()
    with np.errstate(over="ignore"):  # exp of a masked-out (s > l) position may overflow; kernels mask it too
        return torch.from_numpy(np.ascontiguousarray(fn(arr))).to(x.device)


def exp(x: torch.Tensor, profile: Profile) -> torch.Tensor:
    """``exp(x)`` the way the kernels write it: ``exp2(LOG2E * x)`` in fp32.  x: any shape, fp32."""
    scaled = x.to(torch.float32) * _LOG2E_F32.to(x.device)
    if check_profile(profile) == "cuda":
        return torch.exp2(scaled)
    return _np_unary(scaled, np.exp2)


def softplus(x: torch.Tensor, profile: Profile) -> torch.Tensor:
    """The kernels' softplus of fp32 ``x`` (any shape): ``log1p(exp2(x LOG2E))`` where ``x <= 20``, ``x`` above.

    cuda: ``torch.log1p`` of the profile's exp (the kernel's libdevice log1p; bit-equality with torch's CUDA log1pf is
    pinned by the GPU tier, tests/test_kernel_stages.py). interpreter: ``np.log(np.float32(1) + e)`` as the
    interpreted ``tl.math.log(1.0 + e)`` does it.
    """
    x = x.to(torch.float32)
    e = exp(x, profile)
    if profile == "cuda":
        sp = torch.log1p(e)
    else:
        sp = _np_unary(e, lambda a: np.log(np.float32(1.0) + a))
    return torch.where(x <= SOFTPLUS_THRESHOLD, sp, x)


def sigmoid(x: torch.Tensor, profile: Profile) -> torch.Tensor:
    """The kernels' ``div_rn(1, 1 + exp2(-x LOG2E))`` for fp32 ``x`` (any shape): fp32 add and IEEE division on both
    profiles (torch's ``/`` is IEEE on CPU and CUDA; numpy's fp32 divide under the interpreter is too)."""
    e = exp(-x.to(torch.float32), profile)
    return 1.0 / (1.0 + e)


def mul_add(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, profile: Profile) -> torch.Tensor:
    """``a * b + c`` in fp32: one fused rounding on CUDA (Triton contracts to FMA), two under the interpreter."""
    if check_profile(profile) == "cuda":
        a, b = torch.broadcast_tensors(a, b)
        return torch.addcmul(c, a, b)
    return a * b + c


def cumsum(x: torch.Tensor, dim: int, profile: Profile) -> torch.Tensor:
    """fp32 cumulative sum. Interpreter: ``np.cumsum`` (sequential fp32 adds). CUDA: ``torch.cumsum`` (the kernel's
    scan order is not reproducible; that stage is bounded)."""
    if check_profile(profile) == "cuda":
        return torch.cumsum(x.to(torch.float32), dim=dim)
    arr = x.detach().to(torch.float32).cpu().contiguous().numpy()
    return torch.from_numpy(np.cumsum(arr, axis=dim, dtype=np.float32)).to(x.device)


def _bf16_truncate(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 as Triton 3.6's interpreter does it: keep the high 16 bits (truncation toward zero).

    fp32 subnormal inputs reproduce the interpreter's quirk: it normalises the significand, then stores exponent 0 with
    the top 7 bits of the normalised fraction (so the value is not the truncated one). Pinned by
    tests/test_reference_profile.py against a real interpreted kernel.
    """
    bits = x.detach().to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    high = bits >> 16
    exponent = (bits >> 23) & 0xFF
    fraction = bits & 0x7FFFFF
    subnormal = (exponent == 0) & (fraction != 0)
    if bool(subnormal.any()):
        # Position of the most significant set bit of the fraction (0..22); shift it out past bit 23.
        msb = torch.floor(torch.log2(fraction.clamp_min(1).to(torch.float64))).to(torch.int64)
        normalised = (fraction << (23 - msb)) & 0x7FFFFF
        quirk = ((bits >> 31) << 15) | (normalised >> 16)
        high = torch.where(subnormal, quirk, high)
    high = torch.where(high >= 0x8000, high - 0x10000, high)  # to signed int16 range
    return high.to(torch.int16).view(torch.bfloat16).reshape(x.shape)


def cast(x: torch.Tensor, dtype: torch.dtype, profile: Profile) -> torch.Tensor:
    """Round an fp32 tensor to ``dtype`` the way a kernel store or ``.to()`` does on this profile."""
    check_profile(profile)
    x = x.to(torch.float32)
    if dtype == torch.float32:
        return x
    if dtype == torch.bfloat16 and profile == "interpreter":
        return _bf16_truncate(x)
    if dtype in (torch.bfloat16, torch.float16):
        return x.to(dtype)
    raise ValueError(f"cast: unsupported dtype {dtype}")


def round_trip(x: torch.Tensor, dtype: torch.dtype, profile: Profile) -> torch.Tensor:
    """``x`` rounded to ``dtype`` and read back as fp32 (a value a kernel cast then fed to fp32 math or a dot)."""
    return cast(x, dtype, profile).to(torch.float32)
