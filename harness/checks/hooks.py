"""The provider interface's optional hooks (docs/provider.md#optional-hooks), as the harness looks them up.

- ``provider.warmup(requests)``: warm what a server would warm at startup for ``requests``, a list of
  ``ModelConfig``. The recompile guard warms through it, then fails any item that compiles a Triton kernel; a
  provider without it cannot be judged by that guard (``warmup_hook`` says why).
- ``provider.stages.<name>``: stage functions that follow docs/architecture.md's stage contracts, for the
  stage-level exact checks (``STAGE_HOOKS``); a provider without the one a check needs is unsupported by it.
- ``provider.tuning_caches()``: the mutable mappings in which the provider's code keeps tuning results outside
  Triton's autotuners (a launcher that remembers the chosen config and then launches the kernel directly, which
  Triton's autotuner never sees again). ``autotune_idempotent`` empties them for its tuned call and restores them
  after; without the hook only Triton's own caches are reset (``tuning_caches`` returns []).
- ``provider.exact_across_configs``: kernel name -> the call's outputs (``CONFIG_OUTPUTS``) that are bit-identical
  whichever of that autotuned kernel's configs runs; ``every_config`` holds them to it (``exact_across_configs``
  returns {} without it: every config is then held to the reference bound only).
- ``provider.stage_launches(**call)``: each stage of one call as a closure launching it alone on that call's
  intermediates, for ``harness bench --stages`` (``stage_launches_hook``); a provider without it is timed by
  profiling its whole calls only.

A ``ModelConfig`` is a plain value, read by attribute: a provider needs nothing of the harness to take one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from harness.checks.providers import provider_name

D_KINDS = ("none", "per_head", "per_channel")
# The stage hooks the harness calls, each with the contract in docs/architecture.md ("Stage contracts").
STAGE_HOOKS = ("state_passing", "state_passing_indexed", "gather_initial_states")


@dataclass(frozen=True)
class ModelConfig:
    """One model configuration a server knows at startup, and so can warm: the layer's shape, its dtypes and which
    of the optional inputs its calls pass. What a server only learns per call is not in it, and a warmup must cover
    all of it: batch size and token counts, initial-state path, final-state mode, slot-index dtype and layout,
    the cache's row padding and storage offset."""

    nheads: int
    headdim: int
    dstate: int
    ngroups: int
    chunk_size: int
    io_dtype: torch.dtype  # x, B, C, z, out
    state_dtype: torch.dtype  # the state cache
    D: str = "none"  # "none", "per_head" (H,) or "per_channel" (H, P)
    z: bool = False  # the gate is passed
    dt_bias: bool = False  # dt_bias is passed
    dt_softplus: bool = False
    dt_limit: tuple[float, float] = (0.0, math.inf)  # (0, inf): no clamp

    def __post_init__(self):
        if self.D not in D_KINDS:
            raise ValueError(f"ModelConfig.D: expected one of {D_KINDS}, found {self.D!r}")

    def describe(self) -> str:
        options = [f"D={self.D}"] + [n for n in ("z", "dt_bias", "dt_softplus") if getattr(self, n)]
        if tuple(self.dt_limit) != (0.0, math.inf):
            options.append(f"dt_limit={tuple(self.dt_limit)}")
        return (f"H={self.nheads} P={self.headdim} N={self.dstate} G={self.ngroups} Q={self.chunk_size} "
                f"io={str(self.io_dtype).removeprefix('torch.')} state={str(self.state_dtype).removeprefix('torch.')} "
                + " ".join(options))


def model_config(case) -> ModelConfig:
    """The model configuration of a case (``harness.cases.model.Case``): its shape, dtypes and options."""
    sh, o = case.shape, case.options
    return ModelConfig(sh.nheads, sh.headdim, sh.dstate, sh.ngroups, sh.chunk_size, case.dtype.io_torch,
                       case.dtype.state_torch, D=o.D, z=o.z, dt_bias=o.dt_bias, dt_softplus=o.dt_softplus,
                       dt_limit=tuple(o.dt_limit))


def model_configs(cases: Iterable[Any]) -> list[ModelConfig]:
    """The distinct model configurations of ``cases``, in first-seen order."""
    return list(dict.fromkeys(model_config(c) for c in cases))


def warmup_hook(provider) -> tuple[Callable[[list[ModelConfig]], Any] | None, str]:
    """(the provider's ``warmup``, "") or (None, why the recompile guard cannot judge it)."""
    hook = getattr(provider, "warmup", None)
    if callable(hook):
        return hook, ""
    return None, (f"unsupported: provider {provider_name(provider)!r} has no warmup(requests) hook; the recompile "
                  "guard cannot know what a server would warm")


def tuning_caches(provider) -> list:
    """The provider's own tuning caches (``provider.tuning_caches()``), or [] without the hook."""
    hook = getattr(provider, "tuning_caches", None)
    return list(hook()) if callable(hook) else []


# What a provider may declare bit-identical across an autotuned kernel's configs: ``out``, and ``states``: the
# cache's whole storage and the returned tensor (final or chunk-end states, whichever the call's mode gives).
CONFIG_OUTPUTS = ("out", "states")


def exact_across_configs(provider) -> dict[str, frozenset[str]]:
    """``provider.exact_across_configs`` as kernel name -> outputs, {} without it. Raises ``ValueError`` for an
    output not in ``CONFIG_OUTPUTS``."""
    declared = getattr(provider, "exact_across_configs", None) or {}
    found = {}
    for kernel, outputs in dict(declared).items():
        unknown = sorted(set(outputs) - set(CONFIG_OUTPUTS))
        if unknown:
            raise ValueError(f"provider {provider_name(provider)!r}: exact_across_configs[{kernel!r}] names "
                             f"{unknown}; expected some of {CONFIG_OUTPUTS}")
        found[str(kernel)] = frozenset(outputs)
    return found


def stage_hook(provider, name: str) -> tuple[Callable | None, str]:
    """(``provider.stages.<name>``, "") or (None, the unsupported reason naming the missing hook)."""
    if name not in STAGE_HOOKS:
        raise KeyError(f"stage hook: expected one of {STAGE_HOOKS}, found {name!r}")
    fn = getattr(getattr(provider, "stages", None), name, None)
    if callable(fn):
        return fn, ""
    return None, (f"provider {provider_name(provider)!r} lacks stage hook stages.{name} (docs/provider.md#optional-"
                  "hooks); the stage-level check cannot run, so it is not passed")


def stage_launches_hook(provider) -> tuple[Callable | None, str]:
    """(``provider.stage_launches``, "") or (None, why its stages cannot be timed alone)."""
    hook = getattr(provider, "stage_launches", None)
    if callable(hook):
        return hook, ""
    return None, (f"provider {provider_name(provider)!r} has no stage_launches hook (docs/provider.md#optional-hooks): "
                  "its stages are not timed alone")


__all__ = ["ModelConfig", "model_config", "model_configs", "warmup_hook", "stage_hook", "stage_launches_hook",
           "tuning_caches", "exact_across_configs", "CONFIG_OUTPUTS", "STAGE_HOOKS", "D_KINDS"]
