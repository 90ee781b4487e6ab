"""Pin both arithmetic profiles of reference.arith to what the kernels' arithmetic really does, bit for bit.

A tiny kernel runs the state-passing recurrence ``s = exp2(LOG2E * a) * s + b`` and stores s in fp32/fp16/bf16:
- ``interpreter`` profile: the kernel runs under Triton 3.6's interpreter on CPU tensors. That only works in a process
  that imported Triton with ``TRITON_INTERPRET=1`` (otherwise the ``tl`` helpers the kernel calls are compiled-mode
  JITFunctions), so these runs happen in a child process started with it, on any runner: the CPU tier and the GPU
  tier pin the same thing.
- ``cuda`` profile (the GPU twin): the same kernel compiled for the GPU on CUDA tensors; skipped where this process
  runs the interpreter (the ``gpu`` marker).

Run as a script (``python tests/test_reference_profile.py IN OUT``, with TRITON_INTERPRET=1) this file is the child:
it loads the inputs from IN, runs the kernels, and saves their outputs to OUT.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from harness.backend import interpreting
from harness.compare import Mismatch, assert_bits_equal
from reference import arith

REPO = Path(__file__).resolve().parents[1]
LOG2E = tl.constexpr(arith.LOG2E)  # the GPU compiler only accepts constexpr globals in @jit code


def _recurrence(a_ptr, b_ptr, out32_ptr, out16_ptr, outbf_ptr, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    # STEPS is a constexpr: the interpreter with numpy >= 2.4 (the GPU runner's) fails on a runtime-int range.
    offs = tl.arange(0, BLOCK)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(STEPS):
        a = tl.load(a_ptr + i * BLOCK + offs)
        b = tl.load(b_ptr + i * BLOCK + offs)
        s = tl.math.exp2(LOG2E * a) * s + b
        tl.store(out32_ptr + i * BLOCK + offs, s)
        tl.store(out16_ptr + i * BLOCK + offs, s.to(tl.float16))
        tl.store(outbf_ptr + i * BLOCK + offs, s.to(tl.bfloat16))


def _cast(x_ptr, outbf_ptr, out16_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(outbf_ptr + offs, x.to(tl.bfloat16))
    tl.store(out16_ptr + offs, x.to(tl.float16))


def run_recurrence(a: torch.Tensor, b: torch.Tensor):
    """a, b (steps, block) fp32 on the kernel's device -> stored s (steps, block) in fp32, fp16, bf16. Decorates
    here, not at import, so the kernel is interpreted or compiled as this process's TRITON_INTERPRET says."""
    steps, block = a.shape
    outs = [torch.empty(steps, block, dtype=dt, device=a.device) for dt in (torch.float32, torch.float16,
                                                                            torch.bfloat16)]
    triton.jit(_recurrence)[(1,)](a, b, *outs, STEPS=steps, BLOCK=block)
    return tuple(outs)


def run_cast(x: torch.Tensor):
    """x (n,) fp32 -> (x.to(bf16), x.to(fp16)) as kernel stores."""
    outbf = torch.empty_like(x, dtype=torch.bfloat16)
    out16 = torch.empty_like(x, dtype=torch.float16)
    triton.jit(_cast)[(1,)](x, outbf, out16, BLOCK=x.numel())
    return outbf, out16


def _child(in_path: str, out_path: str) -> None:
    assert interpreting(), "the child must run with TRITON_INTERPRET=1"
    inputs = torch.load(in_path)
    got = {"recurrence": run_recurrence(inputs["a"], inputs["b"]), "cast": run_cast(inputs["cast_x"])}
    torch.save(got, out_path)


def reference_recurrence(a, b, profile):
    """The recurrence under ``profile`` with reference.arith, on a's device."""
    s = torch.zeros(a.shape[1], dtype=torch.float32, device=a.device)
    rows32, rows16, rowsbf = [], [], []
    for i in range(a.shape[0]):
        s = arith.mul_add(arith.exp(a[i], profile), s, b[i], profile)
        rows32.append(s)
        rows16.append(arith.cast(s, torch.float16, profile))
        rowsbf.append(arith.cast(s, torch.bfloat16, profile))
    return torch.stack(rows32), torch.stack(rows16), torch.stack(rowsbf)


def _edge_values() -> torch.Tensor:
    """Ties, subnormals (the interpreter's bf16 quirk), signed zeros, huge values, inf and NaN, then randn: (32,)."""
    bits = torch.tensor(
        [0x3F808000, 0x3F818000, 0x3F80FFFF, 0x00000001, 0x00400000, 0x007FFFFF, 0x80000003, 0x00012345,
         0x00000000, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x38800000,
         0x33800001, 0x477FF000, 0x47800000],
        dtype=torch.int64,
    )
    x = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)
    n = 32
    return torch.cat([x, torch.randn(n - x.numel(), generator=torch.Generator().manual_seed(2))]).contiguous()


# One work unit under xdist: the module fixture below starts an interpreter child process (seconds: it imports torch
# and triton), which each of four workers running one of the four tests would otherwise pay for.
pytestmark = pytest.mark.xdist_group("reference_profile")


@pytest.fixture(scope="module")
def recurrence_inputs():
    g = torch.Generator().manual_seed(1)
    a = -torch.rand(24, 256, generator=g) * 3.0  # chunk-end decays dA in [-3, 0]
    b = torch.randn(24, 256, generator=g) * torch.logspace(-3, 3, 256)  # states over six decades
    return a.contiguous(), b.contiguous()


@pytest.fixture(scope="module")
def interpreted(recurrence_inputs, tmp_path_factory):
    """The kernels' outputs under Triton's interpreter, from a child process with TRITON_INTERPRET=1."""
    a, b = recurrence_inputs
    tmp = tmp_path_factory.mktemp("interpreter-profile")
    torch.save({"a": a, "b": b, "cast_x": _edge_values()}, tmp / "in.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, __file__, str(tmp / "in.pt"), str(tmp / "out.pt")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"interpreter child failed (rc {done.returncode}):\n{done.stderr[-4000:]}"
    return torch.load(tmp / "out.pt")


# ---- interpreter profile (child process, CPU tensors; every runner) ----

def test_interpreter_profile_reproduces_recurrence_bits(recurrence_inputs, interpreted):
    a, b = recurrence_inputs
    got32, got16, gotbf = interpreted["recurrence"]
    ref32, ref16, refbf = reference_recurrence(a, b, "interpreter")
    assert_bits_equal(got32, ref32, what="fp32 recurrence")
    assert_bits_equal(got16, ref16, what="fp16 store")
    assert_bits_equal(gotbf, refbf, what="bf16 store (truncation)")


def test_cuda_profile_differs_from_interpreter_on_bf16_stores(recurrence_inputs, interpreted):
    """Negative control: the round-to-nearest (cuda) bf16 cast is caught as different from the interpreter's."""
    a, b = recurrence_inputs
    _, _, cudabf = reference_recurrence(a, b, "cuda")
    with pytest.raises(Mismatch):
        assert_bits_equal(interpreted["recurrence"][2], cudabf, what="bf16 store, cuda profile")


def _fused_recurrence_fp32(a, b) -> torch.Tensor:
    """The interpreter profile's recurrence but with one rounding per step (fma emulated in fp64: the product of two
    fp32 values is exact there, then one rounding of the sum to fp32)."""
    s = torch.zeros(a.shape[1], dtype=torch.float64, device=a.device)
    rows = []
    for i in range(a.shape[0]):
        e = arith.exp(a[i], "interpreter").to(torch.float64)
        s = (e * s + b[i].to(torch.float64)).to(torch.float32).to(torch.float64)
        rows.append(s.to(torch.float32))
    return torch.stack(rows)


def test_fused_mul_add_is_caught_under_interpreter(recurrence_inputs, interpreted):
    """Negative control: a fused multiply-add (one rounding) differs from the interpreter's multiply then add."""
    a, b = recurrence_inputs
    with pytest.raises(Mismatch):
        assert_bits_equal(interpreted["recurrence"][0], _fused_recurrence_fp32(a, b), what="fp32 recurrence, fused")


def test_casts_match_interpreter_on_edge_values(interpreted):
    x = _edge_values()
    outbf, out16 = interpreted["cast"]
    assert_bits_equal(outbf, arith.cast(x, torch.bfloat16, "interpreter"), what="fp32->bf16")
    assert_bits_equal(out16, arith.cast(x, torch.float16, "interpreter"), what="fp32->fp16")
    with pytest.raises(Mismatch):  # plain high-16-bit truncation misses the subnormal quirk
        plain = ((x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) >> 16)
        plain = torch.where(plain >= 0x8000, plain - 0x10000, plain).to(torch.int16).view(torch.bfloat16)
        assert_bits_equal(outbf, plain, what="fp32->bf16, plain truncation")


# ---- cuda profile: the GPU twin (compiled kernel on CUDA tensors) ----

GPU_TWIN = pytest.mark.gpu(reason="the GPU twin: the cuda profile is pinned against a kernel compiled for the GPU")


@pytest.fixture(scope="module")
def on_gpu(recurrence_inputs):
    """(a, b, kernel outputs) on the GPU (for tests marked GPU_TWIN)."""
    a, b = (t.cuda() for t in recurrence_inputs)
    return a, b, run_recurrence(a, b)


@GPU_TWIN
def test_cuda_profile_reproduces_gpu_recurrence_bits(on_gpu):
    """exp2(LOG2E a) as torch.exp2, the contracted FMA as torch.addcmul, round-to-nearest casts: every bit."""
    a, b, (got32, got16, gotbf) = on_gpu
    ref32, ref16, refbf = reference_recurrence(a, b, "cuda")
    assert_bits_equal(got32, ref32, what="fp32 recurrence (GPU)")
    assert_bits_equal(got16, ref16, what="fp16 store (GPU)")
    assert_bits_equal(gotbf, refbf, what="bf16 store (GPU, nearest even)")


@GPU_TWIN
def test_interpreter_profile_differs_from_gpu_bf16_stores(on_gpu):
    """Negative control: the interpreter's truncating bf16 cast is caught against the GPU's stores."""
    a, b, (got32, _, gotbf) = on_gpu
    with pytest.raises(Mismatch):
        assert_bits_equal(gotbf, arith.cast(got32, torch.bfloat16, "interpreter"), what="bf16, truncation on GPU")


@GPU_TWIN
def test_unfused_mul_add_is_caught_on_gpu(on_gpu):
    """Negative control: multiply then add (two roundings, torch's eager ``e * s + b``) differs from the GPU's FMA."""
    a, b, (got32, _, _) = on_gpu
    s = torch.zeros(a.shape[1], dtype=torch.float32, device=a.device)
    rows = []
    for i in range(a.shape[0]):
        s = arith.exp(a[i], "cuda") * s + b[i]
        rows.append(s)
    with pytest.raises(Mismatch):
        assert_bits_equal(got32, torch.stack(rows), what="fp32 recurrence, unfused, GPU")


def test_the_kernels_name_a_profile_the_reference_has():
    """One rule says which profile the kernels follow on a device (``kernels.environment``); the reference defines
    the profiles. Each device maps to a distinct one of them, and a device the rule does not know is refused."""
    from kernels.environment import arithmetic_profile

    assert sorted(arithmetic_profile(d) for d in ("cpu", "cuda")) == sorted(arith.PROFILES)
    with pytest.raises(ValueError, match="device"):
        arithmetic_profile("auto")


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
