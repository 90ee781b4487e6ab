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

``GraphTimer`` splits capture and measurement so that a bench can capture every call it compares first and then
measure them in alternation (``harness.bench.interleave``).
"""

from __future__ import annotations

import statistics

import torch

QUEUED = 20  # replays per pair of events when timing per call


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


class GraphTimer:
    """``prepare(fn)`` captures ``fn`` (``capture_graph``); ``measure(graph)`` is its device time per call over
    ``reps`` replays (``median_replay_us``), ``latency(graph)`` one synchronized call's (``median_latency_us``)."""

    def __init__(self, reps: int, warmup: int = 10):
        self.reps, self.warmup = reps, warmup

    def prepare(self, fn) -> torch.cuda.CUDAGraph:
        return capture_graph(fn, self.warmup)

    def measure(self, graph: torch.cuda.CUDAGraph) -> float:
        return median_replay_us(graph, self.reps)

    def latency(self, graph: torch.cuda.CUDAGraph) -> float:
        return median_latency_us(graph, max(1, self.reps // 4))
