"""GPU timing for benchmarks, tuning and the TSM2 t1 search: CUDA events around each call, median."""
from __future__ import annotations

from ._xp import cupy_module


def cuda_times_s(fn, repeats: int, warmup: int = 2) -> list:
    """Seconds of each of ``repeats`` calls of ``fn()`` on the current stream (CUDA events around
    each) after ``warmup`` untimed calls, sorted."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("cuda_times_s needs CuPy and a GPU")
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    for _ in range(warmup):
        fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
    return sorted(times)


def cuda_median_s(fn, repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` on the current stream over ``repeats`` calls after ``warmup`` calls."""
    times = cuda_times_s(fn, repeats, warmup)
    return times[len(times) // 2]
