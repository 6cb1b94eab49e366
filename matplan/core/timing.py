"""The timing loops of benchmarks, tuning and the planner's measurement: CUDA events around each
call (what one call costs) or around calls queued back to back (throughput), and the host clock's
equivalent for host kernels."""
from __future__ import annotations

import time

from .xp import cupy_module


def cuda_times_s(fn, repeats: int, warmup: int = 2) -> list:
    """Seconds of each of ``repeats`` calls of ``fn()`` on the current stream (CUDA events around
    each) after ``warmup`` untimed calls, sorted."""
    return sorted(_event_times({"fn": fn}, repeats, warmup, "cuda_times_s")["fn"])


def _event_times(fns: dict, repeats: int, warmup: int, caller: str) -> dict:
    """{name: [seconds of each call]}: ``repeats`` rounds in which each of ``fns`` is called once
    between two CUDA events, after ``warmup`` such rounds untimed. Round r starts at the r-th
    function (a rotation), so each follows each other equally often: what a call leaves behind
    (the L2's contents, the memory pool's free blocks) falls on all alike. In a fixed order
    spgemm.py's plan.run, timed right after cuSPARSE, read 25-100 us (6-17%) over the same hash
    call timed after it; rotated, 7-70 us (1-11%) (H100)."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError(f"{caller} needs CuPy and a GPU")
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    cp.cuda.get_current_stream().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = {name: [] for name in fns}
    order = list(fns.items())
    for r in range(repeats):
        for name, fn in rotated(order, r):
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times[name].append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
    return times


def rotated(items: list, r: int) -> list:
    """Round r's order of ``items``: rotated by r, so that each follows each other equally often."""
    k = r % len(items)
    return items[k:] + items[:k]


def cuda_median_s(fn, repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` on the current stream over ``repeats`` calls after ``warmup`` calls."""
    times = cuda_times_s(fn, repeats, warmup)
    return times[len(times) // 2]


def cuda_queued_s(fn, calls: int, rounds: int, warmup: int = 1) -> float:
    """Median over ``rounds`` of the seconds per call of ``calls`` calls of ``fn()`` queued back to
    back between two CUDA events: throughput, the host's work of a call overlapping the GPU's
    (as long as it is the shorter; the host's jitter, 10% of a single 20-us call, averages out)."""
    return queued_s(fn, calls, rounds, warmup, gpu=True)


def queued_s(fn, calls: int, rounds: int, warmup: int = 1, *, gpu: bool = True,
             round_s: float | None = None) -> float:
    """Median over ``rounds`` of the seconds per call of ``calls`` calls of ``fn()`` queued back to
    back, after ``warmup`` calls: between two CUDA events on the current device (``gpu``), else by
    the host clock. With ``round_s``, ``calls`` is lowered so that a round takes about that long
    (at least one call), by the warm-up calls' seconds per call: long calls need no averaging over
    many, and timing them costs the planner little then."""
    if calls < 1 or rounds < 1:
        raise ValueError(f"calls and rounds: expected at least 1, got {calls}, {rounds}")
    clock = _CudaClock() if gpu else _HostClock()
    if warmup:
        clock.start()
        for _ in range(warmup):
            fn()
        per_call = clock.stop() / warmup
        if round_s is not None:
            calls = max(1, min(calls, round(round_s / max(per_call, 1e-9))))
    clock.sync()
    times = []
    for _ in range(rounds):
        clock.start()
        for _ in range(calls):
            fn()
        times.append(clock.stop() / calls)
    return sorted(times)[len(times) // 2]


class _CudaClock:
    """Seconds between start() and stop() on the current stream, by two CUDA events."""

    def __init__(self):
        self.cp = cupy_module()
        if self.cp is None:
            raise RuntimeError("timing on the GPU needs CuPy and a GPU")
        self.begin, self.end = self.cp.cuda.Event(), self.cp.cuda.Event()

    def sync(self) -> None:
        self.cp.cuda.Device().synchronize()

    def start(self) -> None:
        self.begin.record()

    def stop(self) -> float:
        self.end.record()
        self.end.synchronize()
        return self.cp.cuda.get_elapsed_time(self.begin, self.end) * 1e-3


class _HostClock:
    """Seconds between start() and stop() by the host's clock (host kernels)."""

    def sync(self) -> None:
        pass

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def stop(self) -> float:
        return time.perf_counter() - self.t0


def cuda_medians_alternating_s(fns: dict, repeats: int, warmup: int = 2) -> dict:
    """{name: median seconds} of each ``fns[name]()`` (CUDA events around each call), the calls
    taken in turn round by round (each round in a rotated order) after ``warmup`` rounds, each
    result dropped at once. A change of the host's speed during a measurement (20-40% for calls
    of about a millisecond on H100 hosts) then falls on every function alike, so their ratios
    hold."""
    times = _event_times(fns, repeats, warmup, "cuda_medians_alternating_s")
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def warm_up(fn, seconds: float) -> None:
    """Call ``fn()`` back to back for about ``seconds`` of GPU time, then wait for it: the clocks
    are up before a timing that follows compiles or other host work that left the GPU idle."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("warm_up needs CuPy and a GPU")
    per_call = cuda_queued_s(fn, 3, 1)
    for _ in range(min(int(seconds / max(per_call, 1e-6)), 10_000)):
        fn()
    cp.cuda.get_current_stream().synchronize()
