"""Checked-in configs per shape class, so that the serving shapes' binaries do not depend on timing noise.

An autotuner times every candidate config of a stage on the first call of each shape and keeps the fastest. On a
busy or noisy GPU two processes can keep different configs, hence different binaries and times, for the same shape.
For the shape classes in ``TUNED``, a stage's config pruning returns the one config chosen from a sweep of every
candidate (``python -m harness bench --stages``, which prints the proposal; each entry names its measurement:
``Measured``), so there is nothing left to choose. Other shapes, other GPUs and the interpreter tune as before.

A class is the GPU architecture and the values of the stage's autotuning key (its dimensions), the same for every
dtype; chunk_state's key also holds the chunk count's class (``chunk_count_class``), since its best tile differs
between a call of a few chunks and one of many. Each checked-in config is one of its stage's ``CONFIGS`` (tests
check it), so the every-config tests cover it.
"""

from __future__ import annotations

import dataclasses
import functools

import triton

from kernels.backend import INTERPRET


@dataclasses.dataclass(frozen=True)
class Measured:
    """A checked-in config and its provenance as data: ``decision`` is the heading of its entry in
    docs/decisions.md, ``runs`` the runs of notes/gpu-runs.md that measured it (tests/test_tuned_configs.py holds
    both to those files)."""

    config: dict[str, int] = dataclasses.field(hash=False)
    decision: str
    runs: tuple[int, ...]


CHECKED_IN = "Checked-in configs"

# stage -> {(arch, key values in the stage's autotuning key order): the config, by its block sizes and options}.
# The serving shape on sm90 (nheads 64, headdim 64, dstate 128, chunk 256; any dtype and chunk count): per stage the
# config with the least summed time over the four bench workloads in a sweep of every candidate, since the
# autotuner's own picks differ between processes.
TUNED: dict[str, dict[tuple, Measured]] = {
    "chunk_cumsum": {("sm90", 256, 64): Measured(dict(BLOCK_SIZE_H=2, num_warps=4, num_stages=3), CHECKED_IN, (40,))},
    # chunk_state, by chunk count class: a call of a few chunks fills the GPU only with the smaller tile (twice the
    # programs), many chunks run fastest with the larger one.
    "chunk_state": {
        ("sm90", 64, 128, 256, 0): Measured(dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, num_warps=4,
                                                 num_stages=3), CHECKED_IN, (55, 56, 128)),
        ("sm90", 64, 128, 256, 1): Measured(dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=32, num_warps=4,
                                                 num_stages=3), CHECKED_IN, (40, 55)),
    },
    "bmm_chunk": {("sm90", 256, 128): Measured(dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, num_warps=4,
                                                    num_stages=4), CHECKED_IN, (76, 77))},
    "chunk_scan": {("sm90", 256, 64, 128): Measured(dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32,
                                                         num_warps=4, num_stages=1), CHECKED_IN, (40, 47))},
}


# A call of at most this many chunks is class 0 for chunk_state's config, more is class 1. At the serving shape
# (64 heads, one (headdim, dstate) tile of 64 x 128 per chunk and head) four chunks are 256 programs, about two per
# multiprocessor of an H200 (132 of them): below that the larger tile leaves multiprocessors idle.
FEW_CHUNKS = 4


def chunk_count_class(nchunks: int) -> int:
    """A kernel argument that only its autotuner reads: 0 for a call of at most ``FEW_CHUNKS`` chunks, 1 above."""
    return 0 if nchunks <= FEW_CHUNKS else 1


def describe(config: triton.Config) -> dict[str, int]:
    """A config as ``TUNED`` spells it: its block sizes, warps and stages."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


@functools.cache
def device_arch() -> str | None:
    """The current CUDA device's architecture ("sm90" on the H200), or None under the interpreter."""
    if INTERPRET:
        return None
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"


def block_volume(config: triton.Config) -> int:
    """The product of a config's block sizes: an interpreted launch costs per program and per loop iteration, so
    the config with the largest blocks is the cheapest one to interpret."""
    volume = 1
    for value in config.kwargs.values():
        volume *= int(value)
    return volume


def checked_in_config(stage: str, arch: str | None, *key_values: int) -> dict[str, int] | None:
    """``TUNED``'s config for ``stage`` on ``arch`` at these values of its autotuning key, or None."""
    entry = TUNED.get(stage, {}).get((arch, *key_values))
    return None if entry is None else entry.config


def checked_in(stage: str, key: tuple[str, ...], fallback):
    """``early_config_prune`` for ``triton.autotune``: the one of ``configs`` that ``TUNED`` names for ``stage`` on
    this architecture and these values of the kernel arguments named in ``key``, else ``fallback``'s choice.

    Under the interpreter (no architecture) ``fallback``'s configs come largest blocks first (``block_volume``,
    stable among equals): the interpreter's stand-in benchmarker keeps the first config, and every config gives the
    same bits or stays within the stage's bound (tests/test_kernel_stages.py runs each), so the cheapest one to
    interpret is the one to keep. The others stay in the list for the autotuning guard's trials."""

    def prune(configs, named_args, **kwargs):
        arch = device_arch()
        if arch is None:
            return sorted(fallback(configs, named_args, **kwargs), key=lambda c: -block_volume(c))
        sizes = {**named_args, **kwargs}
        wanted = checked_in_config(stage, arch, *(int(sizes[name]) for name in key))
        if wanted is not None:
            matching = [c for c in configs if describe(c) == wanted]
            if len(matching) != 1:
                raise LookupError(f"kernels.tuned_configs: {stage}'s checked-in config {wanted} matches "
                                  f"{len(matching)} of its configs; it must be exactly one of them")
            return matching
        return fallback(configs, named_args, **kwargs)

    return prune
