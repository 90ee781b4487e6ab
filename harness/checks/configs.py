"""``every_config``: the case's call once per config of every Triton autotuner it reaches, that config forced, each
from fresh inputs (docs/checks.md#every_config).

A test sees the config the autotuner picked on that machine that day; an autotuned kernel is as correct as its worst
config, and a config that a compiler gets wrong corrupts outputs wherever the tuner happens to pick it. The check:

1. makes one call (every autotuner at its own pick) with a hook on Triton's ``Autotuner.run``
   (``harness.triton_autotuner.launches_reported``), the provider's own tuning caches emptied
   (``provider.tuning_caches()``: a launcher that keeps the chosen config and then launches the kernel directly
   would otherwise bypass the autotuner), and keeps, per autotuner launched, the configs its launches may choose
   from (``candidate_configs``: after its ``early_config_prune`` and perf model);
2. drops configs that give the same binary for the case (``binary_identity``: under the interpreter the program is
   numpy code that warps and stages do not change), and the config a kernel picked at every launch: that first
   call ran it, and is judged like each forced call and is the baseline of the exact comparisons;
3. per autotuner and remaining config, forces that config (``harness.triton_autotuner.forced_config``; the other
   autotuners keep their picks) with the provider's tuning caches emptied, calls on fresh inputs, and judges the
   result against the fp64 reference within the case's bound (``harness.checks.bound.reference_judge``) and, where
   the provider declares outputs of that kernel bit-identical across its configs (``provider.exact_across_configs``,
   docs/provider.md), against the first call, bit for bit.

A config the device cannot run (Triton raises ``OutOfResources``, e.g. more shared memory than the device has, or
another error its autotuner skips such a config for: ``_not_runnable``) is listed as not runnable on this device,
neither a pass nor a crash. Any other exception of a forced call is the item's error, naming the config. At most
``CONFIG_BUDGET`` forced calls run per item: past it the item is skipped as ``not all ran`` with what ran in its
stats (a failure among those that ran still fails it). ``CONFIG_ENV`` (``python -m harness repro ... --config
KERNEL:INDEX``) runs one config alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from harness.checks.base import Check, NotAllRan, NotApplicable
from harness.checks.registry import register
from harness.compare import Mismatch

NAME = "every_config"
# Forced calls one item may make. vLLM 0.33's five autotuners have 58 configs together (chunk scan 23 with its racy
# ones kept, chunk cumsum and chunk state 20, bmm 9, state passing 6) and prune none, so a provider of that size
# runs whole.
CONFIG_BUDGET = 96
# ``KERNEL:INDEX``: run only config INDEX (its position in the autotuner's config list) of the autotuner whose
# kernel is KERNEL (``kernel_name``), forced even where it is the autotuner's pick.
CONFIG_ENV = "SSD_HARNESS_CONFIG"


def _not_runnable() -> tuple[type, ...]:
    """What Triton raises for a config that cannot be built or launched on this device, and what its autotuner
    therefore skips when it tunes (``Autotuner._bench`` gives such a config an infinite time): more resources than
    the device has, a ptxas failure, a ``tl.static_assert`` the config fails."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError

    return OutOfResources, PTXASError, CompileTimeAssertionFailure


@dataclass(frozen=True)
class Candidate:
    """One config of one autotuner: ``index`` is its position in the autotuner's config list."""

    kernel: str
    index: int
    config: Any

    @property
    def label(self) -> str:
        return f"{self.kernel}[{self.index}] {describe(self.config)}"

    @property
    def spec(self) -> str:
        return f"{self.kernel}:{self.index}"


def describe(config) -> str:
    """Block sizes, warps and stages (and ctas / maxnreg where set): ``BLOCK_SIZE_M=64 num_warps=4 num_stages=2``."""
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.num_ctas != 1:
        options["num_ctas"] = config.num_ctas
    if config.maxnreg is not None:
        options["maxnreg"] = config.maxnreg
    return " ".join(f"{k}={v}" for k, v in {**config.kwargs, **options}.items())


def binary_identity(config, interpreting: bool) -> tuple:
    """What decides the binary a config gives for a fixed launch: its constexprs and launch options on the GPU; its
    constexprs alone under the interpreter, which runs each program as numpy code whatever the warps and stages."""
    constexprs = tuple(sorted(config.kwargs.items()))
    if interpreting:
        return constexprs
    return constexprs, config.num_warps, config.num_stages, config.num_ctas, config.maxnreg


def _index_of(tuner, config) -> int:
    for i, c in enumerate(tuner.configs):
        if c is config or (c.kwargs == config.kwargs and describe(c) == describe(config)):
            return i
    raise LookupError(f"{config} is not one of its autotuner's configs")


@dataclass
class Found:
    """One autotuner the call reached: its distinct candidate configs over its launches (in order), and the binary
    identities of the configs its launches ran (the autotuner's picks)."""

    tuner: Any
    candidates: list[Candidate]
    picked: set


def discover(ctx, caches) -> tuple[dict[str, Found], Any]:
    """(kernel name -> what the call's autotuners may choose from and chose, in order of first launch; the call):
    steps 1-2 above. The call ran every autotuner's pick, so it is the baseline of the forced calls."""
    from harness import triton_autotuner as tt
    from harness.checks.calls import run_call
    from harness.guards.autotune import emptied
    from harness.guards.specialization import kernel_name

    interpreting = tt.interpreting()
    found: dict[str, Found] = {}
    seen: dict[str, dict] = {}

    def launched(tuner, args, kwargs) -> None:
        name = kernel_name(tuner)
        entry = found.setdefault(name, Found(tuner, [], set()))
        for config in tt.candidate_configs(tuner, args, kwargs):
            identity = binary_identity(config, interpreting)
            if identity not in seen.setdefault(name, {}):
                seen[name][identity] = None
                entry.candidates.append(Candidate(name, _index_of(tuner, config), config))

    def returned(tuner) -> None:
        found[kernel_name(tuner)].picked.add(binary_identity(tuner.best_config, interpreting))

    with emptied(caches), tt.launches_reported(launched, arguments=True, on_return=returned):
        call = run_call(ctx, "the autotuners' picks")
    return found, call


def to_force(found: Found, interpreting: bool) -> list[Candidate]:
    """The candidates a forced call must run: all but the one every launch of the kernel picked (the discovery call
    ran that one already)."""
    if len(found.picked) != 1:
        return list(found.candidates)
    return [c for c in found.candidates if binary_identity(c.config, interpreting) not in found.picked]


def _only(plan: dict[str, list[Candidate]], chosen: str) -> dict[str, list[Candidate]]:
    """The plan cut to ``KERNEL:INDEX`` (``CONFIG_ENV``), forced even where it is the autotuner's pick."""
    kernel, sep, index = chosen.rpartition(":")
    if not sep or not index.isdigit():
        raise ValueError(f"{CONFIG_ENV}={chosen!r}: expected KERNEL:INDEX")
    if kernel not in plan:
        raise ValueError(f"{CONFIG_ENV}={chosen!r}: the call launches no autotuner of {kernel!r}; it launches "
                         f"{sorted(plan)}")
    picked = [c for c in plan[kernel] if c.index == int(index)]
    if not picked:
        raise ValueError(f"{CONFIG_ENV}={chosen!r}: config {index} is not among {kernel}'s candidates for this "
                         f"case: {[c.index for c in plan[kernel]]}")
    return {kernel: picked}


def _compare_exact(call, baseline, outputs: frozenset[str], what: str) -> None:
    from harness.checks.calls import assert_returned_equal
    from harness.compare import assert_bits_equal, assert_storage_equal, storage_bytes

    if "out" in outputs:
        assert_bits_equal(call.inputs.out, baseline.inputs.out, what=f"out ({what})")
    if "states" in outputs:
        assert_storage_equal(call.inputs.cache_base, storage_bytes(baseline.inputs.cache_base),
                             what=f"state cache storage ({what})", element=call.inputs.cache_base.dtype)
        assert_returned_equal(call, baseline)


def _every_config(ctx) -> dict:
    from harness import triton_autotuner as tt
    from harness.checks.bound import reference_judge
    from harness.checks.calls import run_call
    from harness.checks.hooks import exact_across_configs, tuning_caches
    from harness.checks.providers import DEFAULT_PROVIDER
    from harness.checks.runner import repro_line
    from harness.guards.autotune import emptied

    NOT_RUNNABLE = _not_runnable()  # noqa: N806 - a constant of this call, imported with Triton
    caches = tuning_caches(ctx.provider)
    exact = exact_across_configs(ctx.provider)
    judge = reference_judge(ctx)
    found, picks = discover(ctx, caches)
    if not found:
        raise NotApplicable("the call launched no Triton autotuner, so it has no configs to force")
    judge(picks, under="the autotuners' picks")  # a failure here is the plain call's: reference_bound reports it
    chosen = os.environ.get(CONFIG_ENV)
    if chosen:
        plan = _only({k: f.candidates for k, f in found.items()}, chosen)
    else:
        plan = {k: to_force(f, tt.interpreting()) for k, f in found.items()}
    total = sum(len(c) for c in plan.values())
    ran: list[str] = []
    not_runnable: list[str] = []
    failures: list[tuple[Candidate, Mismatch]] = []
    stopped = False
    for kernel, candidates in plan.items():
        for candidate in candidates:
            if len(ran) + len(not_runnable) == CONFIG_BUDGET:
                stopped = True
                break
            with emptied(caches), tt.forced_config(found[kernel].tuner, candidate.config):
                try:
                    call = run_call(ctx, f"forced {candidate.label}")
                except NOT_RUNNABLE as exc:
                    not_runnable.append(f"{candidate.label}: not runnable on this device: "
                                        f"{type(exc).__name__}: {exc}")
                    continue
                except Exception as exc:
                    raise RuntimeError(f"forced {candidate.label}: the call raised {type(exc).__name__}: "
                                       f"{exc}".splitlines()[0]) from exc
            ran.append(candidate.label)
            try:
                judge(call, under=f"forced {candidate.label}")
                if exact.get(kernel):
                    _compare_exact(call, picks, exact[kernel],
                                   f"forced {candidate.label} vs the autotuners' picks, declared exact")
            except Mismatch as exc:
                failures.append((candidate, exc))
        if stopped:
            break
    stats = {"autotuners": {k: len(f.candidates) for k, f in found.items()}, "configs_forced": len(ran),
             "configs_to_force": total, "config_budget": CONFIG_BUDGET, "forced": ran,
             "exact_across_configs": {k: sorted(v) for k, v in exact.items() if k in found}}
    if not_runnable:
        stats["not_runnable_on_this_device"] = not_runnable
    if failures:
        repro = repro_line(ctx.case, NAME, ctx.provider_spec or DEFAULT_PROVIDER)
        lines = [f"{c.label}: {e.summary}\n{e.details}\nrerun this config: {repro} --config {c.spec}"
                 for c, e in failures]
        named = ", ".join(c.label for c, _ in failures)
        raise Mismatch(f"{len(failures)} of {len(ran)} forced configs fail: {named}\n" + "\n".join(lines),
                       count=sum(max(e.count, 0) for _, e in failures) or -1, stats=stats)
    if stopped:
        raise NotAllRan(f"{len(ran) + len(not_runnable)} of {total} configs to force ran (budget {CONFIG_BUDGET} "
                        "forced calls per item); those that ran are within the bound", stats)
    return stats


register(
    Check(
        name=NAME,
        doc="every config of every autotuner the call reaches, forced, from fresh inputs: within the reference "
            "bound, and bit-identical where the provider declares it",
        run=_every_config,
        cpu_calls=4.0,
        not_a_serving_call="it forces configs that the server's own tuning never chose",
        gpu_when_named=("on the GPU each config it forces is a binary of its own to compile, for every case's "
                        "shapes and options; the nightly GPU run's every_config step and scripts/gpu_run.sh "
                        "every-config run it over the whole corpus"),
    )
)
