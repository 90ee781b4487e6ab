"""Median timings of a GPU call: CUDA events around each call, and CUDA graph replay (``python -m harness bench``)."""

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


def time_events(fn, reps: int, warmup: int = 10) -> float:
    """Median microseconds of one call, CUDA events around each call (launch overhead included)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return _median_events(fn, reps)


def time_graph(fn, reps: int, warmup: int = 10) -> float:
    """Median microseconds of one CUDA graph replay of ``fn`` (autotuning must be done before capture)."""
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
    return _median_events(graph.replay, reps)
