"""Replayed ``ssd_prefill`` calls against the same calls as written, on the GPU's code paths with fake binaries.

    TRITON_INTERPRET=0 python -m tests.replay_equivalence [--misplace-allocations]

Run by ``tests/test_call_replay.py`` in a process of its own (the GPU's code paths need ``TRITON_INTERPRET=0``
before the kernels load; ``tests/fake_gpu.py``). For each call below, on fresh inputs every time: one call binds the
launches, one runs as written (nothing recorded) and one is recorded, then one is replayed. The as-written call's
and the replayed call's launches are compared: the same binaries in the same order, the same grids, and the same
arguments, where an address is compared as (the input it points into, or the allocation by its order in the
call, and the byte offset from that tensor's start) and each allocation by its shape, strides and dtype. Calls
that do torch work besides allocations and views must never be replayed (they run as written both times). Prints
one JSON line: per call, whether it was replayed and the differences found.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch

if os.environ.get("TRITON_INTERPRET") != "0":
    sys.exit("run with TRITON_INTERPRET=0 (tests/fake_gpu.py)")

from harness.cases.builder import build_inputs  # noqa: E402
from harness.cases.model import IndicesSpec  # noqa: E402
from kernels import call_replay, provider  # noqa: E402
from tests import fake_gpu  # noqa: E402
from tests.support import CHUNK16_SHAPE, make_case  # noqa: E402

BF16 = dict(io="bfloat16", state="bfloat16", **CHUNK16_SHAPE)
ONE = [(20, 40, 1, True, 2)]
TWO = [(20, 40, 1, True, 2), (0, 70, 3, False, 4)]
LONG = [(5, 200, 1, True, 2)]  # 13 chunks of 16: the states as a pair of kernels
# name -> (case, ssd_prefill keywords besides the inputs, whether it must be replayed)
CALLS = {
    "indexed": (make_case(ONE, **BF16), dict(path="indexed"), True),
    "indexed-pair": (make_case(LONG, **BF16), dict(path="indexed"), True),
    "snapshot-aligned-cache": (make_case(TWO, row_pad=0, offset=0, **BF16), dict(path="snapshot", gather="fused"),
                               True),
    "snapshot-offset-cache": (make_case(TWO, **BF16), dict(path="snapshot", gather="fused"), True),
    "snapshot-pair": (make_case(LONG + TWO[1:], **BF16), dict(path="snapshot", gather="fused"), True),
    "block-table-indices": (make_case(TWO, indices=IndicesSpec(layout="block_table", columns=4, init_column=1,
                                                               final_column=2, rows_before=1), **BF16),
                            dict(path="snapshot", gather="fused"), True),
    "checkpoint": (make_case(TWO, **BF16), dict(path="snapshot", gather="fused", final_state="checkpoint"), True),
    "fp32-odd-shape": (make_case(TWO), dict(path="snapshot", gather="fused"), True),
    "unfused": (make_case(TWO, **BF16), dict(path="snapshot", gather="fused", unfused=True), True),
    # torch work in the call: a replay would skip it
    "torch-gather": (make_case(TWO, **BF16), dict(path="snapshot", gather="torch"), False),
    "returned": (make_case(TWO, **BF16), dict(path="snapshot", gather="fused", final_state="returned"), False),
    "int64-slots": (make_case(ONE, indices=IndicesSpec(dtype="int64"), **BF16), dict(path="indexed"), False),
}

_ALLOCATED: list[torch.Tensor] = []  # the allocations of the call being watched


def _watch_allocations() -> None:
    """Every ``torch.empty`` / ``empty_like`` / ``empty_strided`` result goes into ``_ALLOCATED`` (the tensors kept,
    so that their addresses stay theirs for the call)."""
    for name in ("empty", "empty_like", "empty_strided"):
        original = getattr(torch, name)

        def allocate(*args, _original=original, **kwargs):
            t = _original(*args, **kwargs)
            _ALLOCATED.append(t)
            return t

        setattr(torch, name, allocate)


def _launches(call) -> tuple[list, list]:
    """(the launches of ``call()``, its allocations)."""
    fake_gpu.RUNS.clear()
    _ALLOCATED.clear()
    fake_gpu.RECORDING[0] = True
    try:
        call()
    finally:
        fake_gpu.RECORDING[0] = False
    return list(fake_gpu.RUNS), list(_ALLOCATED)


def _normalized(runs: list, inputs: list[torch.Tensor], allocations: list[torch.Tensor]) -> list:
    """The launches with every address as ("input", i, offset) or ("allocation", k, offset)."""
    def place(value):
        if not (isinstance(value, tuple) and value[:1] == (fake_gpu.ADDRESS,)):
            return value
        value = value[1]
        for kind, tensors in (("input", inputs), ("allocation", allocations)):
            for i, t in enumerate(tensors):
                start = t.untyped_storage().data_ptr()
                if start <= value < start + max(1, t.untyped_storage().nbytes()):
                    return (kind, i, value - t.data_ptr())
        return ("unknown address", value)

    return [(name, grid, tuple(place(v) for v in arguments)) for name, grid, arguments in runs]


def _layouts(allocations: list[torch.Tensor]) -> list:
    return [(tuple(t.shape), t.stride(), str(t.dtype)) for t in allocations]


def check(name: str) -> dict:
    case, keywords, replayable = CALLS[name]
    keywords = dict(keywords)
    path, final_state = keywords.pop("path"), keywords.pop("final_state", None)

    def fresh():
        built = build_inputs(case, "cpu")
        kwargs = {**built.kwargs(path=path, final_state=final_state), **keywords}
        tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
        return kwargs, tensors

    kwargs, _ = fresh()
    provider.ssd_prefill(**kwargs)  # binds every launch
    kwargs, written_inputs = fresh()
    written, written_allocations = _launches(lambda: provider.ssd_prefill.__wrapped__(**kwargs))
    before = call_replay.REPLAYS.replays
    kwargs, _ = fresh()
    provider.ssd_prefill(**kwargs)  # recorded
    kwargs, replayed_inputs = fresh()
    replayed, replayed_allocations = _launches(lambda: provider.ssd_prefill(**kwargs))
    was_replayed = call_replay.REPLAYS.replays > before
    differences = []
    if was_replayed != replayable:
        differences.append(f"replayed: {was_replayed}, expected {replayable}")
    a = _normalized(written, written_inputs, written_allocations)
    b = _normalized(replayed, replayed_inputs, replayed_allocations)
    if not a:
        differences.append("the call as written launched nothing")
    if not replayable:  # both ran as written; their torch ops' results are tensors neither input nor allocation
        return {"replayed": was_replayed, "launches": len(a), "differences": differences}
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        differences.append(f"launch {first} differs: as written {a[first] if first < len(a) else None}, "
                           f"replayed {b[first] if first < len(b) else None}")
    if _layouts(written_allocations) != _layouts(replayed_allocations):
        differences.append(f"allocations differ: {_layouts(written_allocations)} against "
                           f"{_layouts(replayed_allocations)}")
    if any(v[0] == "unknown address" for _, _, arguments in a for v in arguments if isinstance(v, tuple)):
        differences.append("an address into neither an input nor an allocation")
    return {"replayed": was_replayed, "launches": len(a), "differences": differences}


def misplace_allocations() -> None:
    """The negative control (``--misplace-allocations``): a replay that hands every allocation's launches the
    first allocation's address, which the comparison must catch."""
    original = call_replay.CallReplays._replay

    def replay(self, launches, recording, args, kwargs):
        def first(v):
            return dataclasses.replace(v, source=-1) if isinstance(v, call_replay._Address) and v.source < 0 else v

        steps = tuple(dataclasses.replace(s, arguments=tuple(map(first, s.arguments))) for s in recording.steps)
        return original(self, launches, dataclasses.replace(recording, steps=steps), args, kwargs)

    call_replay.CallReplays._replay = replay


def main(argv: list[str]) -> int:
    fake_gpu.install()
    _watch_allocations()
    if "--misplace-allocations" in argv:
        misplace_allocations()
    print(json.dumps({name: check(name) for name in CALLS}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
