"""The order lab (scripts/order_lab.py): under the interpreter every launch order of ``ssd_prefill``
(``kernels.ssd.LAUNCH_ORDER``) gives the order "none"'s bits on every workload and path, with either of the snapshot
path's states kernels, and the lab's comparison flags an order whose bmm computes something else."""

from __future__ import annotations

import pytest

from kernels.ssd import LAUNCH_ORDERS
from tests.support import loaded_script


@pytest.fixture(scope="module")
def order_lab():
    yield from loaded_script("order_lab")


@pytest.mark.interpreter(reason="the lab's dry run is its plumbing under the interpreter, on CPU tensors")
def test_every_order_gives_the_same_bits(order_lab):
    rows = order_lab.run(order_lab.WORKLOADS, rounds=1, reps=1, peer_spec=None, dry_run=True)
    expected = {(w, f"ours:{o}", v) for w in order_lab.WORKLOADS for o in LAUNCH_ORDERS
                for v in (("snapshot-fused", "snapshot-pair") if w == "mixed-3"
                          else ("indexed", "snapshot-fused", "snapshot-pair"))}
    assert {(r["workload"], r["side"], r["variant"]) for r in rows} == expected
    assert [r for r in rows if r["error"]] == []


@pytest.mark.interpreter(reason="the lab's dry run is its plumbing under the interpreter, on CPU tensors")
def test_an_order_whose_bmm_differs_is_flagged(order_lab, monkeypatch):
    """Negative control: bmm launched beside another kernel (after it or before it), or in chunk state's kernel,
    returns a CB off by one in its first chunk."""
    from kernels import ssd

    real, real_one_kernel = ssd.bmm_chunk, ssd.chunk_state_bmm

    def off_by_one_when_overlapping(*args, signal_next=False, overlaps_previous=False, **kwargs):
        CB = real(*args, signal_next=signal_next, overlaps_previous=overlaps_previous, **kwargs)
        if signal_next or overlaps_previous:
            CB[0] += 1.0
        return CB

    def off_by_one_in_one_kernel(*args, **kwargs):
        states, CB = real_one_kernel(*args, **kwargs)
        CB[0] += 1.0
        return states, CB

    monkeypatch.setattr(ssd, "bmm_chunk", off_by_one_when_overlapping)
    monkeypatch.setattr(ssd, "chunk_state_bmm", off_by_one_in_one_kernel)
    rows = order_lab.run(["short-continuation"], rounds=1, reps=1, peer_spec=None, dry_run=True)
    flagged = {(r["side"], r["variant"]) for r in rows if r["error"]}
    assert all(r["error"].startswith(f"out, {r['variant']} order") and "differ in bits" in r["error"]
               for r in rows if r["error"])
    assert flagged == {(f"ours:{o}", v) for o in LAUNCH_ORDERS if o != "none"
                       for v in ("indexed", "snapshot-fused", "snapshot-pair")}
