"""``autotune_idempotent``: with every Triton autotuner the provider's call launches tuning from scratch, a replay of
the chosen configs from a snapshot leaves the same bytes in every storage the call can touch (inputs, output, state
cache) and returns the same bits (``harness.guards.autotune``). It runs for every provider: the autotuners are found
by hooking Triton's autotuner, not from a list of our kernels, and each one re-tunes even when its tuning key was
tuned earlier in the process (by another case, or the disk cache). A provider that launches no autotuner, or whose
autotuners run no tuning trial, is skipped with that reason."""

from __future__ import annotations

from harness.checks.base import Check, NotApplicable
from harness.checks.registry import register
from harness.compare import Mismatch


def _autotune_idempotent(ctx) -> dict:
    # imported here: the guards pull in Triton's runtime, which the checks' registration does not need
    from harness.checks.hooks import tuning_caches
    from harness.guards.autotune import DestructiveAutotuning, NothingTuned, check_autotune_safe

    inputs = ctx.inputs()
    try:
        report = check_autotune_safe(ctx.provider.ssd_prefill, kwargs=inputs.kwargs(),
                                     own_caches=tuning_caches(ctx.provider))
    except NothingTuned as exc:
        raise NotApplicable(str(exc)) from None
    except DestructiveAutotuning as exc:
        stats = exc.report.as_stats() if exc.report is not None else {}
        raise Mismatch(str(exc), count=-1, stats=stats) from None
    return report.as_stats()


register(
    Check(
        name="autotune_idempotent",
        doc="every autotuner the call launches tunes from scratch; a replay of the chosen configs leaves the same "
            "bytes",
        run=_autotune_idempotent,
        cpu_calls=3.4,
        not_a_serving_call="it makes every autotuner tune from scratch, launching (on the GPU: compiling) configs "
                           "that a warmed server's tuning never chose",
    )
)
