"""Every specialization a representative set of SSD calls launches compiles for the H200 (sm_90), checked on the
CPU: the interpreter accepts code the GPU compiler rejects (plain float globals in @jit code, tl.dot with K < 16),
which the CPU tier would otherwise not see (both met on the H200: notes/gpu-runs.md)."""

from __future__ import annotations

import re

import pytest
import triton
import triton.language as tl

from harness.cases.builder import build_inputs
from harness.cases.model import Options
from harness.guards.gpu_compile import GpuCompileError, compile_distinct, compile_each, raise_failures
from harness.guards.specialization import Launch, capturing_launches, kernel_name
from kernels.ssd import ssd_prefill
from kernels.warmup import watched_kernels
from tests.support import make_case

# One worker runs the module: the representative calls are captured once (``launches``) and every kernel's
# specializations are compiled in one child process (``compiled``), whose start-up (importing torch) would otherwise
# be paid once per kernel.
pytestmark = [pytest.mark.interpreter(reason="on the GPU every launch compiles for real; this is the CPU tier's "
                                      "stand-in for that"),
              pytest.mark.xdist_group("gpu_compile")]

FULL = Options(D="per_channel", z=True, dt_bias=True, dt_softplus=True, dt_limit=(0.0, 10.0))
ONE = [(70, 90, 2, True, 5)]
# From kernels.plan.PAIR_FROM_CHUNKS chunks (chunk 64 here) either path runs chunk state's kernel and a state passing
# kernel: one long sequence reads ahead, a batch of short ones runs a chunk a step.
LONG = [(0, 600, 2, False, 5)]
BATCH = [(70, 90, 2, True, 5), (0, 300, 3, False, 6), (10, 200, 4, True, 7)]
# (io, state, path, mode, options, sequences): every kernel, both paths (the snapshot one with either states
# kernel), the three modes, all io dtypes, dstate 16.
CALLS = [
    ("float32", "bfloat16", "snapshot", "direct", FULL, ONE),
    ("float32", "bfloat16", "indexed", "direct", FULL, ONE),
    ("bfloat16", "bfloat16", "snapshot", "returned", Options(D="per_head"), ONE),
    ("float16", "float32", "snapshot", "checkpoint", Options(), ONE),
    ("bfloat16", "bfloat16", "snapshot", "direct", Options(), LONG),
    ("bfloat16", "bfloat16", "indexed", "direct", Options(), LONG),
    ("float16", "float32", "snapshot", "returned", Options(), BATCH),
]


# The calls above use padded caches (rows of 240 + 24 elements after 7): the gather runs as a kernel of its own. A
# cache with aligned rows runs it in the cumsum's kernel (``kernels.chunk_cumsum_gather.fuses``).
PADDED, ALIGNED = dict(row_pad=24, offset=7), dict(row_pad=0, offset=0)


@pytest.fixture(scope="module")
def launches(device) -> list[Launch]:
    seen: list[Launch] = []
    runs = [(call, False, PADDED) for call in CALLS] + [
        (CALLS[5], True, PADDED),  # the unfused plan: chunk state's and bmm's own kernels, every kernel alone
        (CALLS[0], False, ALIGNED), (CALLS[6], False, ALIGNED)]
    for (io, state, path, mode, options, sequences), unfused, layout in runs:
        case = make_case(sequences, io=io, state=state, options=options, mode=mode, slots=8, case_id="sm90", **layout)
        inputs = build_inputs(case, device)
        with capturing_launches(watched_kernels()) as calls:
            # The fused gather is what CUDA runs (the CPU default is the torch.where snapshot).
            ssd_prefill(**inputs.kwargs(path=path), **({"gather": "fused"} if path == "snapshot" else {}),
                        unfused=unfused)
        seen += calls
    return seen


@pytest.fixture(scope="module")
def compiled(launches) -> list:
    """Every distinct specialization of ``launches``, compiled for sm_90 in one child: (launch, error or None)."""
    return compile_each(launches)


@pytest.mark.parametrize("kernel", watched_kernels(), ids=lambda k: kernel_name(k).rsplit(".", 1)[-1])
def test_every_launched_specialization_compiles_for_sm90(launches, compiled, kernel):
    assert any(kernel_name(launch.kernel) == kernel_name(kernel) for launch in launches), (
        f"{kernel_name(kernel)} was not launched by the representative calls")
    own = [(launch, err) for launch, err in compiled if launch.kernel == kernel_name(kernel)]
    assert raise_failures(own) >= 1  # raises GpuCompileError naming each specialization that fails


@triton.jit
def _global_float_kernel(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) * _SCALE)


_SCALE = 1.4426950408889634  # a plain float global: the interpreter reads it, the GPU compiler refuses it


@triton.jit
def _small_k_dot_kernel(a_ptr, b_ptr, c_ptr, K: tl.constexpr):
    offs16 = tl.arange(0, 16)
    offs_k = tl.arange(0, K)
    a = tl.load(a_ptr + offs16[:, None] * K + offs_k[None, :])
    b = tl.load(b_ptr + offs_k[:, None] * 16 + offs16[None, :])
    tl.store(c_ptr + offs16[:, None] * 16 + offs16[None, :], tl.dot(a, b))


def test_gpu_only_compile_errors_are_caught():
    """Negative controls: the two GPU-only failures this project met, reproduced in toy kernels."""
    import torch

    x = torch.ones(4)
    a, b, c = torch.ones(16, 8), torch.ones(8, 16), torch.empty(16, 16)
    good = Launch(_small_k_dot_kernel, (torch.ones(16, 16), torch.ones(16, 16), c), {"K": 16})
    # One child compiles all three: each failure is named with its own error, and the launch that compiles is not.
    with pytest.raises(GpuCompileError) as raised:
        compile_distinct([Launch(_global_float_kernel, (x,), {}), Launch(_small_k_dot_kernel, (a, b, c), {"K": 8}),
                          good])
    failures = re.split(r"(?m)^(?=\S+ does not compile for )", str(raised.value))[1:]  # one part per failure
    assert [part.split(" ", 1)[0] for part in failures] == [
        f"{__name__}._global_float_kernel", f"{__name__}._small_k_dot_kernel"], raised.value
    assert "global variable _SCALE" in failures[0] and "K >= 16" not in failures[0], failures[0]
    assert "K: =8" in failures[1] and "K >= 16" in failures[1], failures[1]
    assert compile_distinct([good]) == 1
