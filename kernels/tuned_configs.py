"""Checked-in configs per shape class, so that the serving shapes' binaries do not depend on timing noise.

An autotuner times every candidate config of a stage on the first call of each shape and keeps the fastest. On a
busy or noisy GPU two processes can keep different configs, hence different binaries and times, for the same shape.
For the shape classes in ``TUNED``, a stage's config pruning returns the one config chosen from a sweep of every
candidate (``python -m harness bench --stages``, which prints the proposal; the measurement is in
docs/gpu-runs.md), so there is nothing left to choose. Other shapes, other GPUs and the interpreter tune as before.

A class is the GPU architecture and the values of the stage's autotuning key (its dimensions), the same for every
dtype and every number of chunks. Each checked-in config is one of its stage's ``CONFIGS`` (tests check it), so the
every-config tests cover it.
"""

from __future__ import annotations

import functools

import triton

from kernels.backend import INTERPRET

_C = triton.Config

# stage -> {(arch, key values in the stage's autotuning key order): config}
TUNED: dict[str, dict[tuple, triton.Config]] = {}


@functools.cache
def device_arch() -> str | None:
    """The current CUDA device's architecture ("sm90" on the H200), or None under the interpreter."""
    if INTERPRET:
        return None
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"


def checked_in(stage: str, key: tuple[str, ...], fallback):
    """``early_config_prune`` for ``triton.autotune``: the checked-in config of ``stage`` for this architecture and
    these values of the kernel arguments named in ``key`` when ``TUNED`` has one, else ``fallback``'s choice."""

    def prune(configs, named_args, **kwargs):
        arch = device_arch()
        if arch is not None:
            sizes = {**named_args, **kwargs}
            chosen = TUNED.get(stage, {}).get((arch, *(int(sizes[name]) for name in key)))
            if chosen is not None:
                return [chosen]
        return fallback(configs, named_args, **kwargs)

    return prune
