"""What the supervisor and its child say to each other (``channel.Channel`` carries these)."""

from __future__ import annotations

from dataclasses import dataclass

# ---- supervisor -> child


@dataclass
class Hello:
    """The first message: how to configure the child like its parent."""

    sys_path: list[str]
    device: str
    provider_spec: str
    warmup_first: float = 0.0
    torch_threads: int = 0  # the parent's torch intra-op thread count (its share of the cores); 0: torch's default
    environ: dict | None = None  # the parent's environment now (a forked child's is that of the fork); None: keep


@dataclass
class RunItem:
    case: object
    check: str
    repro_device: str | None = None
    guard: bool = False  # under the recompile guard (warming the case's model request first, once per request)


@dataclass
class Warmup:
    """Warm the case's model request for the recompile guard, without running a check."""

    case: object


@dataclass
class Close:
    pass


# ---- child -> supervisor

# A forked child's one byte on its own pipe once its device context exists (``spare.wait_for_spare_context``).
CONTEXT_MADE = b"c"


@dataclass
class Ready:
    pid: int
    device: str
    provider_name: str
    startup: dict | None = None  # seconds per start-up phase after Hello: configure, provider, device_context


@dataclass
class Unusable:
    """The provider could not be loaded (or the device not configured): the message says why."""

    message: str


@dataclass
class ItemDone:
    result: object  # harness.checks.CheckResult
    sticky: str = ""  # non-empty: the child must not run another item (harness.isolation.sticky); it exits next
    compiles: dict | None = None  # the child's Triton compiles and cache loads during the item (CompileLedger.drain)


@dataclass
class Warmed:
    summary: str = ""  # the warmup's summary; "" when the child had warmed that request already
    error: str = ""  # non-empty: the warmup raised (the exception in one line)
    detail: str = ""  # its traceback
    sticky: str = ""
    compiles: dict | None = None  # as ItemDone's
