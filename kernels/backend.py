"""What every stage kernel needs to know about where it runs: the GPU or Triton's interpreter.

``TRITON_INTERPRET`` is read once, when this module is imported (``kernels/__init__.py`` settles it first, unless the
embedding process, e.g. ``harness.backend.configure``, already did).
The interpreter emulates each program in numpy and cannot do everything the GPU does (docs/exactness.md):
bf16 arithmetic and bf16 ``tl.dot`` are wrong there, and ``libdevice`` calls are not supported. Those differences
are switched here, in one place, and passed to kernels as constexprs; the GPU keeps the production arithmetic.
"""

from __future__ import annotations

import functools
import os

import triton
import triton.language as tl

from kernels.environment import AUTOTUNE_BUDGET_ENV, INTERPRET_ENV, PDL_ENV, arithmetic_profile
from kernels.triton_internals import PDL_AVAILABLE, gdc_launch_dependents, gdc_wait, settle_cache_keys

INTERPRET = os.environ.get(INTERPRET_ENV) == "1"
# The reference arithmetic profile these kernels follow in this process.
ARITHMETIC_PROFILE = arithmetic_profile("cpu" if INTERPRET else "cuda")

# The interpreter cannot multiply bf16 operands in tl.dot: kernels cast both (already io-rounded) operands to fp32
# there. Products of io-dtype values are exact in fp32 and accumulation is fp32 either way, so only the summation
# order can differ from the GPU's io-dtype dot.
DOT_FP32_OPERANDS = INTERPRET

# Precision of tl.dot when its operands are fp32 (fp32 io dtype on the GPU). "tf32" is Triton's and vLLM's
# production default: the tensor core reads the operands as tf32 by truncation (10 fraction bits kept, measured on the
# H200), so a dot operand is off by up to 2**-10 (harness.bounds.dot_operand_unit). Ignored by the interpreter.
FP32_DOT_PRECISION = "tf32"


@triton.jit
def dot_acc(acc, a, b, DOT_FP32_OPERANDS: tl.constexpr, FP32_DOT_PRECISION: tl.constexpr):
    """``acc + a @ b`` for every stage's dot: the interpreter switch above in one place. The operands arrive rounded
    to the io dtype; under the interpreter they are widened to fp32 (exact), on the GPU they stay as they are."""
    if DOT_FP32_OPERANDS:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return acc + tl.dot(a, b, input_precision=FP32_DOT_PRECISION)


# libdevice's log1p (the same CUDA math-library routine torch.log1p calls) is unavailable under the interpreter,
# where softplus falls back to log(1 + exp(dt)).
USE_LIBDEVICE = not INTERPRET

# exp(x) is computed as exp2(x * LOG2E): on CUDA tl.math.exp2 equals torch.exp2 bit for bit (docs/exactness.md).
# A tl.constexpr: the GPU compiler refuses plain Python globals inside @jit code (the interpreter does not).
LOG2E = tl.constexpr(1.4426950408889634)


def cdiv(x: int, y: int) -> int:
    """``triton.cdiv`` for host code (grids, block choices): the same formula without the wrapper that makes Triton's
    usable inside kernels, which costs more than the division itself on every launch."""
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for host code (as ``cdiv``): the smallest power of two >= n, by Triton's formula."""
    n -= 1
    n |= n >> 1
    n |= n >> 2
    n |= n >> 4
    n |= n >> 8
    n |= n >> 16
    n |= n >> 32
    return n + 1


# The interpreter pays per program, not per element (each program is a round of numpy calls): a kernel with one
# fixed block walks its extent in one block there, up to this many elements.
INTERPRETER_MAX_BLOCK = 1 << 20


def fixed_block(extent: int, gpu_block: int) -> int:
    """The block of a kernel that runs one fixed block size (never autotuned): ``gpu_block`` on the GPU; under the
    interpreter the whole ``extent`` (a power of two, at most ``INTERPRETER_MAX_BLOCK``). Only for kernels whose
    bits do not depend on the block (elementwise copies and recurrences)."""
    return min(INTERPRETER_MAX_BLOCK, next_power_of_2(extent)) if INTERPRET else gpu_block


def _interpreter_do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8)):
    """Autotuner timing stand-in for the interpreter, which has no GPU timer: equal times for every config, so the
    first config in the list wins, reproducibly. The trial is not launched: there is nothing to time, and an
    interpreted trial costs as much as the call itself (one per remaining config and tuning key). What a trial launch
    does to memory is for an autotuning guard to check; it brings a benchmarker of its own that runs every trial."""
    return [1.0] * len(quantiles)


def autotune_budget_ms(raw: str | None) -> tuple[float, float]:
    """(warmup ms, repeat ms) the autotuner measures each config for: Triton's defaults (25, 100) unless
    ``SSD_AUTOTUNE_MS`` says "warmup,rep" (processes that share a GPU shorten it)."""
    if not raw:
        return 25.0, 100.0
    try:
        warm, rep = (float(v) for v in raw.split(","))
        if warm < 0 or rep <= 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"{AUTOTUNE_BUDGET_ENV}={raw!r}: expected 'warmup_ms,rep_ms' with warmup >= 0 and "
                         "rep > 0, e.g. '25,100'") from None
    return warm, rep


AUTOTUNE_WARMUP_MS, AUTOTUNE_REP_MS = autotune_budget_ms(os.environ.get(AUTOTUNE_BUDGET_ENV))


def _gpu_do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8)):
    """Triton's GPU benchmarker with this process's budget."""
    from triton.testing import do_bench

    return do_bench(kernel_call, warmup=AUTOTUNE_WARMUP_MS, rep=AUTOTUNE_REP_MS, quantiles=quantiles)


def least_overshoot(**block_over: str):
    """``early_config_prune`` for ``triton.autotune``: keep the configs whose blocks overshoot the problem least.

    ``block_over`` maps a block-size kwarg to the kernel argument that holds the size of the dimension it tiles. A
    block wider than that dimension (padded to a power of two) computes the same masked tile as a narrower one,
    only slower, yet costs a compile and a tuning benchmark. Where every block fits (the serving shape: headdim 64,
    dstate 128, chunk 256) every config stays; on small and odd shapes only the least oversized ones do. Which
    configs remain never changes what a check expects (each config is forced in tests/test_kernel_stages.py)."""

    def overshoot(config: triton.Config, sizes: dict) -> float:
        return sum(max(1.0, config.kwargs[block] / next_power_of_2(max(1, int(sizes[arg]))))
                   for block, arg in block_over.items())

    def prune(configs, named_args, **kwargs):
        # Triton passes positional arguments by name in ``named_args`` and keyword arguments as ``kwargs``: the
        # launchers pass everything by keyword.
        sizes = {**named_args, **kwargs}
        least = min(overshoot(c, sizes) for c in configs)
        return [c for c in configs if overshoot(c, sizes) == least]

    return prune


# Programmatic dependent launch: every stage kernel is launched with ``launch_pdl``, so the GPU may start placing its
# programs as soon as every program of the kernel before it in the stream has exited, instead of after that kernel
# has completed and its writes have been flushed. The first thing each program does is ``wait_for_previous_kernel``:
# ``gdc_wait`` blocks until every kernel before it in the stream has completed and its writes are visible, so no load
# or store of a stage moves ahead of what it depends on, whoever launched the kernel before (a stage of ours, a torch
# op, another engine's kernel), and the order is transitive along the call. What overlaps is launch and scheduling
# latency, no arithmetic: the bits cannot change.
# A kernel signals its dependents early (``let_next_kernel_start``, under ``signal_next``) where ``ssd_prefill``
# launches right after it a kernel that reads nothing it writes (``kernels.plan``): bmm after the fused states
# kernel, the chunk state kernel after bmm, the gather after the cumsum. Launched with
# ``overlaps_previous``, that kernel computes beside this one and waits at its end instead of its start; it completes
# only after this kernel has, and the order stays transitive for the kernels after it. What it reads from earlier
# kernels is complete: the signalling kernel waited for them before it signalled. An overlapping kernel never
# signals (``check_overlap_flags``): its own wait comes last, and a kernel it let start would not be ordered after
# the kernel this one overlaps. The signal fires once every program of this kernel has
# started, so the overlapping kernel's programs fill the multiprocessors this kernel's last wave leaves idle. Elsewhere
# an early signal only places the next kernel's programs, waiting, where this one could run, and delays this
# kernel's own later programs (docs/decisions.md: where a kernel signals the next).

# The names in a launch's arguments that are launch options, not kernel parameters (the warmup registry passes them
# through as options).
LAUNCH_OPTIONS = ("launch_pdl", "num_warps", "num_stages", "maxnreg")


def pdl_setting(raw: str | None) -> bool:
    """``SSD_PDL``: unset or "1" -> on where the GPU has it, "0" -> off."""
    if raw in (None, "", "1"):
        return True
    if raw == "0":
        return False
    raise ValueError(f"{PDL_ENV}={raw!r}: expected '0' (off) or '1' (on where the GPU supports it)")


@functools.cache
def programmatic_launch() -> bool:
    """Whether this process launches the stage kernels with programmatic dependent launch: not under the
    interpreter (no GPU), on compute capability 9.0 and later (``griddepcontrol`` is sm_90 PTX), unless
    ``SSD_PDL=0``."""
    if INTERPRET or not PDL_AVAILABLE or not pdl_setting(os.environ.get(PDL_ENV)):
        return False
    import torch

    return torch.cuda.get_device_capability()[0] >= 9


def pdl_arguments() -> dict:
    """What every stage launch adds to its arguments: the kernel's ``USE_PDL`` constexpr and the launch option,
    always equal (a kernel launched with ``launch_pdl`` must wait; one that waits without it pays nothing)."""
    on = programmatic_launch()
    return {"USE_PDL": on, "launch_pdl": on}


def check_overlap_flags(signal_next: bool, overlaps_previous: bool) -> None:
    """A launch may signal early or overlap the kernel before it, not both (above)."""
    assert not (signal_next and overlaps_previous), (
        "a kernel launched with overlaps_previous waits at its end, so it cannot also signal the next one early")


@triton.jit
def wait_for_previous_kernel(USE_PDL: tl.constexpr):
    """Every stage kernel's first statement: programmatic dependent launch's wait (above)."""
    if USE_PDL:
        gdc_wait()


@triton.jit
def let_next_kernel_start(signal_next, USE_PDL: tl.constexpr):
    """Programmatic launch's early signal (above), where ``signal_next`` is nonzero: the next kernel's programs may
    be placed from here on. Called right after this kernel's own wait, so that the next one cannot start before the
    kernels this one waited for are done."""
    if USE_PDL:
        if signal_next != 0:
            gdc_launch_dependents()


@triton.jit
def wait_unless_overlapping(overlaps_previous, USE_PDL: tl.constexpr):
    """The first statement of a kernel that may run beside the one before it (above): the wait, unless
    ``overlaps_previous`` defers it to ``wait_at_end_if_overlapping``, its last statement."""
    if overlaps_previous == 0:
        wait_for_previous_kernel(USE_PDL)


@triton.jit
def wait_at_end_if_overlapping(overlaps_previous, USE_PDL: tl.constexpr):
    """The deferred wait (``wait_unless_overlapping``)."""
    if overlaps_previous != 0:
        wait_for_previous_kernel(USE_PDL)


# Passed as ``do_bench`` to every ``triton.autotune`` here.
AUTOTUNE_DO_BENCH = _interpreter_do_bench if INTERPRET else _gpu_do_bench


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
