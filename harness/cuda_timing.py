"""Timings of a GPU call by CUDA graph replay (``python -m harness bench``).

A call is captured once as a CUDA graph (after warm-up calls on a side stream, which autotune and compile outside
the capture). Two measurements of its replays, in microseconds:

- per call (``median_replay_us``): ``QUEUED`` replays enqueued back to back between one pair of CUDA events, the
  elapsed time divided by ``QUEUED``; the median over the batches. The device runs the replays one after another
  while the host enqueues the next, as in a serving loop whose host runs ahead, so this is the device's time per
  call, without the host's launch latency.
- one call's latency (``median_latency_us``): one replay between a pair of events, synchronized before the next;
  the median. The device idles while the host launches the graph, so this adds the host's launch latency, which
  differs between processes.

- an eager call's host time (``eager_host_us``): ``HOST_CALLS`` eager calls (no graph) enqueued back to back on
  the host clock, behind a spin kernel (``torch.cuda._sleep``) that keeps the device busy until the last call has
  been enqueued, so no launch waits for the device: the time is the host's alone (Python, argument handling, the
  launch path, allocations), as it sits before a prompt's first token wherever a call runs outside a captured graph.
  ``HOST_CALLS`` calls of a few dozen launches each stay far below the launch queue's depth (about a thousand), so the
  queue never fills either. Whether the spin outlasted the enqueueing is checked, not assumed (its event has not
  completed when the last call returns); where it did not, the batch is repeated behind a longer spin, and a call
  that waits for the device itself (a synchronizing copy, ``.item()``) never lets it outlast: ``HostTimeError``.

``GraphTimer`` splits capture and measurement so that a bench can capture every call it compares first and then
measure them in alternation (``harness.bench.interleave``).
"""

from __future__ import annotations

import statistics
import time

import torch

QUEUED = 20  # replays per pair of events when timing per call
HOST_CALLS = 25  # eager calls per host-time batch (below the launch queue's depth, see above)
HOST_BATCHES = 3  # host-time batches per measurement (the median)
SPIN_CYCLES = 50_000_000  # the first spin behind a batch: about 25 ms at an H200's 2 GHz
SPIN_GROWTH, SPIN_TRIES = 4, 4  # a spin that ended before the batch did is this much longer next, this many times


class HostTimeError(RuntimeError):
    """The device finished the spin before the host had enqueued the batch, however long the spin: the call waits
    for the device (so its host time is not separable from the device's)."""


def _median_events(fn, reps: int, queued: int = 1) -> float:
    """Median us of one ``fn()`` over ``reps`` calls: ``queued`` calls back to back between each pair of events."""
    times = []
    for _ in range(max(1, reps // queued)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(queued):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / queued)
    return statistics.median(times)


def capture_graph(fn, warmup: int = 10, calls: int = 1) -> torch.cuda.CUDAGraph:
    """``fn`` captured as a CUDA graph (``calls`` calls of it, one after another), replayed ``warmup`` times. Three
    eager calls on a side stream come first: autotuning and compiling launch kernels that must not be captured, and
    the caching allocator warms there."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def median_replay_us(graph: torch.cuda.CUDAGraph, reps: int) -> float:
    """Device microseconds per replay of ``graph``: ``reps`` replays in batches of ``QUEUED`` back to back, the
    median over the batches."""
    return _median_events(graph.replay, reps, QUEUED)


def median_latency_us(graph: torch.cuda.CUDAGraph, reps: int) -> float:
    """Microseconds of one synchronized replay of ``graph`` (host launch included), the median of ``reps``."""
    return _median_events(graph.replay, reps)


def time_graph(fn, reps: int, warmup: int = 10, calls: int = 1) -> float:
    """Device microseconds per call of ``fn``: a CUDA graph of ``calls`` calls (``median_replay_us``), divided by
    ``calls``; autotuning must be done before capture. A graph of one short kernel reads the device's floor between
    queued graphs, not the kernel; ``calls`` launches in one graph read each launch and its gap to the next, as the
    kernels of one captured call follow each other."""
    return median_replay_us(capture_graph(fn, warmup, calls), reps) / calls


def time_after(before, fn, reps: int, calls: int, warmup: int = 10) -> float:
    """Device microseconds per call of ``fn`` where each call follows one of ``before``: a graph of ``calls`` pairs
    (``before``, ``fn``) less a graph of ``calls`` calls of ``before``, each ``median_replay_us``, measured in turn
    three times; the median of the three differences, divided by ``calls``. ``fn`` then starts each time from
    what ``before`` leaves (in L2, for one), not from what its own previous call left."""

    def pair() -> None:
        before()
        fn()

    with_fn, alone = capture_graph(pair, warmup, calls), capture_graph(before, warmup, calls)
    diffs = [median_replay_us(with_fn, reps) - median_replay_us(alone, reps) for _ in range(3)]
    return statistics.median(diffs) / calls


def host_batch_us(fn, calls: int, spin_cycles: int, sleep=None, clock=time.perf_counter) -> float | None:
    """Host microseconds per eager call over ``calls`` calls enqueued behind a spin of ``spin_cycles``, or None when
    the spin had ended before the last call returned (the device may have held the host back)."""
    sleep = sleep or torch.cuda._sleep
    torch.cuda.synchronize()
    sleep(spin_cycles)
    spin_done = torch.cuda.Event()
    spin_done.record()
    start = clock()
    for _ in range(calls):
        fn()
    elapsed = clock() - start
    outlasted = not spin_done.query()
    torch.cuda.synchronize()
    return elapsed * 1e6 / calls if outlasted else None


def eager_host_us(fn, calls: int = HOST_CALLS, batches: int = HOST_BATCHES, batch=host_batch_us) -> float:
    """Host microseconds per eager call of ``fn`` (the module's docstring): the median of ``batches`` batches of
    ``calls`` calls, each behind a spin that outlasted it; a spin that did not is lengthened ``SPIN_GROWTH`` times
    over, up to ``SPIN_TRIES`` times, then ``HostTimeError``. One untimed call comes first: what a provider does once
    per shape in eager mode (a launch bound after a graph capture tuned afresh) stays out of the batches."""
    fn()
    times, spin, tries = [], SPIN_CYCLES, 0
    while len(times) < batches:
        us = batch(fn, calls, spin)
        if us is not None:
            times.append(us)
            continue
        tries += 1
        if tries >= SPIN_TRIES:
            raise HostTimeError(f"a spin of {spin} cycles ended before {calls} eager calls were enqueued: the call "
                                "waits for the device, so its host time cannot be told from the device's")
        spin *= SPIN_GROWTH
    return statistics.median(times)


class GraphTimer:
    """``prepare(fn)`` captures ``fn`` (``capture_graph``); ``measure(graph)`` is its device time per call over
    ``reps`` replays (``median_replay_us``), ``latency(graph)`` one synchronized call's (``median_latency_us``),
    ``host(fn)`` the host time of one eager call of ``fn`` (``eager_host_us``)."""

    def __init__(self, reps: int, warmup: int = 10):
        self.reps, self.warmup = reps, warmup

    def prepare(self, fn) -> torch.cuda.CUDAGraph:
        return capture_graph(fn, self.warmup)

    def measure(self, graph: torch.cuda.CUDAGraph) -> float:
        return median_replay_us(graph, self.reps)

    def latency(self, graph: torch.cuda.CUDAGraph) -> float:
        return median_latency_us(graph, max(1, self.reps // 4))

    def host(self, fn) -> float:
        return eager_host_us(fn)
