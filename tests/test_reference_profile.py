"""Pin the ``interpreter`` arithmetic profile to what Triton 3.6's interpreter actually does: a tiny kernel runs the
state-passing recurrence ``s = exp2(LOG2E * a) * s + b`` and stores s in bf16/fp16/fp32; reference.arith must
reproduce every stored bit."""

from __future__ import annotations

import pytest
import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from harness.compare import Mismatch, assert_bits_equal
from reference import arith

LOG2E = arith.LOG2E

# The kernels are wrapped in the interpreter explicitly (what @triton.jit does under TRITON_INTERPRET=1), so this
# file runs on CPU tensors on any runner without flipping the process-wide TRITON_INTERPRET the GPU tier relies on.


def _recurrence(a_ptr, b_ptr, out32_ptr, out16_ptr, outbf_ptr, steps, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(steps):
        a = tl.load(a_ptr + i * BLOCK + offs)
        b = tl.load(b_ptr + i * BLOCK + offs)
        s = tl.math.exp2(LOG2E * a) * s + b
        tl.store(out32_ptr + i * BLOCK + offs, s)
        tl.store(out16_ptr + i * BLOCK + offs, s.to(tl.float16))
        tl.store(outbf_ptr + i * BLOCK + offs, s.to(tl.bfloat16))


_recurrence_kernel = InterpretedFunction(_recurrence)


def _cast(x_ptr, outbf_ptr, out16_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(outbf_ptr + offs, x.to(tl.bfloat16))
    tl.store(out16_ptr + offs, x.to(tl.float16))


_cast_kernel = InterpretedFunction(_cast)


def _run_recurrence(a, b):
    steps, block = a.shape
    out32 = torch.empty(steps, block, dtype=torch.float32)
    out16 = torch.empty(steps, block, dtype=torch.float16)
    outbf = torch.empty(steps, block, dtype=torch.bfloat16)
    _recurrence_kernel[(1,)](a, b, out32, out16, outbf, steps, BLOCK=block)
    return out32, out16, outbf


def _reference_recurrence(a, b, profile):
    s = torch.zeros(a.shape[1], dtype=torch.float32)
    rows32, rows16, rowsbf = [], [], []
    for i in range(a.shape[0]):
        s = arith.mul_add(arith.exp(a[i], profile), s, b[i], profile)
        rows32.append(s)
        rows16.append(arith.cast(s, torch.float16, profile))
        rowsbf.append(arith.cast(s, torch.bfloat16, profile))
    return torch.stack(rows32), torch.stack(rows16), torch.stack(rowsbf)


@pytest.fixture(scope="module")
def recurrence_inputs():
    g = torch.Generator().manual_seed(1)
    a = -torch.rand(24, 256, generator=g) * 3.0  # chunk-end decays dA in [-3, 0]
    b = torch.randn(24, 256, generator=g) * torch.logspace(-3, 3, 256)  # states over six decades
    return a.contiguous(), b.contiguous()


def test_interpreter_profile_reproduces_recurrence_bits(recurrence_inputs):
    a, b = recurrence_inputs
    got32, got16, gotbf = _run_recurrence(a, b)
    ref32, ref16, refbf = _reference_recurrence(a, b, "interpreter")
    assert_bits_equal(got32, ref32, what="fp32 recurrence")
    assert_bits_equal(got16, ref16, what="fp16 store")
    assert_bits_equal(gotbf, refbf, what="bf16 store (truncation)")


def test_cuda_profile_differs_from_interpreter_on_bf16_stores(recurrence_inputs):
    """Negative control: the round-to-nearest (cuda) bf16 cast is caught as different from the interpreter's."""
    a, b = recurrence_inputs
    _, _, gotbf = _run_recurrence(a, b)
    _, _, cudabf = _reference_recurrence(a, b, "cuda")
    with pytest.raises(Mismatch):
        assert_bits_equal(gotbf, cudabf, what="bf16 store, cuda profile")


def test_fused_mul_add_is_caught_under_interpreter(recurrence_inputs):
    """Negative control: a fused multiply-add (one rounding) differs from the interpreter's multiply then add."""
    a, b = recurrence_inputs
    got32, _, _ = _run_recurrence(a, b)
    s = torch.zeros(a.shape[1], dtype=torch.float64)
    rows = []
    for i in range(a.shape[0]):  # fma emulated in fp64: exact product, one rounding of the sum to fp32
        e = arith.exp(a[i], "interpreter").to(torch.float64)
        s = (e * s + b[i].to(torch.float64)).to(torch.float32).to(torch.float64)
        rows.append(s.to(torch.float32))
    with pytest.raises(Mismatch):
        assert_bits_equal(got32, torch.stack(rows), what="fp32 recurrence, fused")


def test_casts_match_interpreter_on_edge_values():
    """Ties, subnormals (the interpreter's bf16 quirk), signed zeros, huge values, inf and NaN."""
    bits = torch.tensor(
        [0x3F808000, 0x3F818000, 0x3F80FFFF, 0x00000001, 0x00400000, 0x007FFFFF, 0x80000003, 0x00012345,
         0x00000000, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x38800000,
         0x33800001, 0x477FF000, 0x47800000],
        dtype=torch.int64,
    )
    x = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)
    n = 32
    x = torch.cat([x, torch.randn(n - x.numel(), generator=torch.Generator().manual_seed(2))]).contiguous()
    outbf = torch.empty(n, dtype=torch.bfloat16)
    out16 = torch.empty(n, dtype=torch.float16)
    _cast_kernel[(1,)](x, outbf, out16, BLOCK=n)
    assert_bits_equal(outbf, arith.cast(x, torch.bfloat16, "interpreter"), what="fp32->bf16")
    assert_bits_equal(out16, arith.cast(x, torch.float16, "interpreter"), what="fp32->fp16")
    with pytest.raises(Mismatch):  # plain high-16-bit truncation misses the subnormal quirk
        plain = ((x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) >> 16)
        plain = torch.where(plain >= 0x8000, plain - 0x10000, plain).to(torch.int16).view(torch.bfloat16)
        assert_bits_equal(outbf, plain, what="fp32->bf16, plain truncation")
