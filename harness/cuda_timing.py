"""Timings of a GPU call by CUDA graph replay (``python -m harness bench``).

A call is captured once as a CUDA graph (after warm-up calls on a side stream, which autotune and compile outside
the capture); each measurement then replays the graph ``reps`` times, one pair of CUDA events around each replay,
and reports the median in microseconds. ``GraphTimer`` splits the two steps so that a bench can capture every call
it compares first and then measure them in alternation (``harness.bench.interleave``).
"""

from __future__ import annotations

import statistics

import torch


def _median_events(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def capture_graph(fn, warmup: int = 10) -> torch.cuda.CUDAGraph:
    """``fn`` captured as a CUDA graph, replayed ``warmup`` times. Three eager calls on a side stream come first:
    autotuning and compiling launch kernels that must not be captured, and the caching allocator warms there."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def median_replay_us(graph: torch.cuda.CUDAGraph, reps: int) -> float:
    """Median microseconds of one replay of ``graph`` over ``reps`` replays."""
    return _median_events(graph.replay, reps)


def time_graph(fn, reps: int, warmup: int = 10) -> float:
    """Median microseconds of one CUDA graph replay of ``fn`` (autotuning must be done before capture)."""
    return median_replay_us(capture_graph(fn, warmup), reps)


class GraphTimer:
    """``prepare(fn)`` captures ``fn`` (``capture_graph``); ``measure(graph)`` is the median of ``reps`` replays."""

    def __init__(self, reps: int, warmup: int = 10):
        self.reps, self.warmup = reps, warmup

    def prepare(self, fn) -> torch.cuda.CUDAGraph:
        return capture_graph(fn, self.warmup)

    def measure(self, graph: torch.cuda.CUDAGraph) -> float:
        return median_replay_us(graph, self.reps)
