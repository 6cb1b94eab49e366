"""How a tuning run times the candidates of one problem (:func:`time_candidates`).

Each candidate is prepared, run once into a NaN-poisoned output and checked against the SciPy
float64 reference, and its ``prepare`` timed, one candidate after another. Their runs are then
timed together, so that a transient of the host or the GPU falls on all of them alike and their
ratios hold (two H100 tunes timed one candidate after another disagreed by a median 1.32 per
timing at 10-20 us; a transient ran seven consecutive candidates 1.2-9.6x slow):

1. the GPU warmed up (:func:`matplan.core.timing.warm_up`) after the prepares' host work;
2. ``warmup`` untimed rounds, then timed rounds of one synchronised call of each candidate
   (CUDA events around the call, the host's work included: ``run_ms_median``, ``_min``,
   ``_max``), each round in a rotated order, a call under OWN_CALLS_BELOW_MS right after
   OWN_CALLS untimed calls of its own candidate (the L2 as the candidate's repeated calls leave
   it, not as the others' did); a candidate leaves the rounds once it has
   ``repeats`` times, or MIN_REPEATS and ``budget_s`` seconds of its own;
   a kernel whose repeated runs replay what an earlier call recorded (SpGEMM's hash: its guessed
   analysis) also has a first call timed after each run (``first_ms``, :meth:`Kernel.tuning_calls`);
3. QUEUED_ROUNDS rotated rounds of calls queued back to back (``run_ms_queued``: the throughput a
   caller that reuses a plan gets, the host's work overlapping the GPU's; the planner's own
   measurement times the same way, :mod:`matplan.planner.measure`).

The formats held at once are bounded: past GROUP_MEMORY_FRACTION of the device's memory the
candidates prepared so far are timed and dropped before the next is prepared.
"""
from __future__ import annotations

import dataclasses
import time
import traceback

import numpy as np

from ..core.timing import rotated, warm_up
from ..planner import measure as planner_measure
from .reference import max_error

MIN_REPEATS = 3
#: Seconds of run-time measurement per candidate before the repeats stop early.
BUDGET_S = 2.0
#: Timed repeats of prepare (median kept; stops early past the budget). Cheap prepares (~50 us of
#: host work) jitter by 2x between calls; 3 repeats left the H100 report's worst regrets to that noise.
PREPARE_REPEATS = 11
#: Untimed calls of a candidate right before each of its timed single calls shorter than
#: OWN_CALLS_BELOW_MS: its operands back in L2 as its own repeated calls find them, not as the
#: other candidates' calls left it (benchmarks/tuning_order.py: 1 call restored most, 3 all).
OWN_CALLS = 2
OWN_CALLS_BELOW_MS = 1.0
#: Rounds of queued calls; a round queues up to QUEUED_CALLS calls, fewer where they take longer than
#: QUEUED_ROUND_S (the planner's measurement: measure.CALLS, measure.ROUND_S).
QUEUED_ROUNDS = 3
QUEUED_CALLS = planner_measure.CALLS
QUEUED_ROUND_S = planner_measure.ROUND_S
#: Share of the device's memory the prepared formats of one group may hold before they are timed.
GROUP_MEMORY_FRACTION = 0.25
#: Length limit of a stored error message.
ERROR_CHARS = 4000


class DeviceContextLost(RuntimeError):
    """A candidate left the device unusable in this process (e.g. a sticky CUDA error).

    Detected by a device synchronisation after any failure (kernels may also raise it).
    The candidate is recorded as failed; the worker process is replaced and the rest of
    the unit runs again in a fresh one.
    """


def error_text(exc) -> str:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
    return f"{type(exc).__name__}: {exc}\n{tb}"[:ERROR_CHARS]


class HostTimer:
    """perf_counter timing of host (NumPy/SciPy) calls, in milliseconds."""

    gpu = False

    def sync(self):
        pass

    def once(self, fn) -> float:
        return self.queued(fn, 1)

    def queued(self, fn, calls: int) -> float:
        """Milliseconds per call of ``calls`` calls of ``fn`` back to back."""
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t) * 1e3 / calls

    def warm(self, fn) -> None:
        pass

    def held_bytes(self) -> int:
        return 0

    def healthy(self) -> bool:
        return True


class CudaTimer(HostTimer):
    """CUDA-event timing on the current stream, in milliseconds (host work inside fn is included)."""

    gpu = True

    def __init__(self, cp):
        self.cp = cp
        self.start, self.stop = cp.cuda.Event(), cp.cuda.Event()

    def sync(self):
        self.cp.cuda.Device().synchronize()

    def queued(self, fn, calls: int) -> float:
        self.start.record()
        for _ in range(calls):
            fn()
        self.stop.record()
        self.stop.synchronize()
        return float(self.cp.cuda.get_elapsed_time(self.start, self.stop)) / calls

    def warm(self, fn) -> None:
        """The clocks up after host work that left the GPU idle (the prepares)."""
        warm_up(fn, planner_measure.WARM_UP_S)

    def held_bytes(self) -> int:
        return int(self.cp.get_default_memory_pool().used_bytes())

    def healthy(self) -> bool:
        """False when the CUDA context is broken (a sticky error fails every later call)."""
        try:
            self.cp.cuda.runtime.deviceSynchronize()
            self.cp.zeros(1).sum().item()
            return True
        except Exception:
            return False


def measure(timer, fn, repeats: int, warmup: int, budget_s: float = BUDGET_S) -> list:
    """Times of ``fn`` (ms) after ``warmup`` calls; stops early past ``budget_s`` once MIN_REPEATS are in."""
    for _ in range(warmup):
        fn()
    timer.sync()
    times, t0 = [], time.perf_counter()
    for _ in range(repeats):
        times.append(timer.once(fn))
        spent = time.perf_counter() - t0
        if spent > budget_s and (len(times) >= MIN_REPEATS or spent > 3 * budget_s):
            break
    return times


@dataclasses.dataclass
class _Ready:
    """A candidate prepared and checked, waiting for its runs' rounds."""
    kernel: object
    params: dict
    call: object          # the run (Kernel.tuning_calls' "run")
    first: object         # a first call, or None (Kernel.tuning_calls' "first")
    fields: dict          # status, prepare_ms, matched, max_error, error so far
    times: list = dataclasses.field(default_factory=list)
    firsts: list = dataclasses.field(default_factory=list)
    spent_s: float = 0.0
    queued: list = dataclasses.field(default_factory=list)


def _poisoned_out(problem, xp):
    """A NaN-filled output for dense-output ops (unwritten elements then fail the check)."""
    if problem.op == "spgemm":
        return None
    m = problem.A.shape[0]
    shape = (m,) if problem.B.ndim == 1 else (m, problem.B.shape[1])
    return xp.full(shape, np.nan, dtype=problem.dtype)


def _failed(timer, exc) -> tuple:
    lost = isinstance(exc, DeviceContextLost) or not timer.healthy()
    return dict(status="failed", error=("device context lost: " if lost else "") + error_text(exc)), lost


def _check(kernel, params, problem, ref, bound, tol, timer, xp, budget_s):
    """Prepare, check and time the prepares of one candidate: (_Ready or None, failure fields or
    None, device lost?)."""
    try:
        prepared = kernel.prepare(problem.A, dict(params))       # first call also compiles
        out = _poisoned_out(problem, xp)
        C = kernel.run(prepared, problem.B, out=out) if out is not None else kernel.run(prepared, problem.B)
        timer.sync()
        err = max_error(C, ref, bound)
        del C, out
        prep = measure(timer, lambda: kernel.prepare(problem.A, dict(params)), PREPARE_REPEATS, 0, budget_s)
        calls = kernel.tuning_calls(prepared, problem.B)
    except Exception as exc:  # a candidate that fails to compile or run is a result, not a crash
        fields, lost = _failed(timer, exc)
        return None, fields, lost
    fields = dict(status="ok", prepare_ms=float(np.median(prep)), matched=bool(err <= tol), max_error=err,
                  error="" if err <= tol else f"result differs from the SciPy float64 reference: "
                                              f"max error {err:.3g} > tolerance {tol:.3g}")
    return _Ready(kernel, params, calls["run"], calls.get("first"), fields), None, False


def _rounds(timer, group: list, repeats: int, warmup: int, budget_s: float, record) -> bool:
    """Time the runs of ``group`` (module docstring, steps 1-3) and record each; a candidate whose
    run raises is recorded as failed and leaves the rounds. Returns whether the device was lost."""
    live = list(group)

    def call(c, fn):
        """fn(c.call), or None once c is recorded as failed; DeviceContextLost when that lost the device."""
        try:
            return fn(c.call)
        except Exception as exc:
            fields, lost = _failed(timer, exc)
            record(c.kernel.name, c.params, fields)
            live.remove(c)
            if lost:
                raise DeviceContextLost(fields["error"]) from exc
            return None

    def own_calls(fn) -> None:
        for _ in range(OWN_CALLS):
            fn()
        timer.sync()

    def enough(c) -> bool:
        return len(c.times) >= repeats or (c.spent_s > budget_s and (len(c.times) >= MIN_REPEATS
                                                                      or c.spent_s > 3 * budget_s))
    try:
        if live:
            call(live[0], timer.warm)
        for _ in range(warmup):
            for c in list(live):
                call(c, lambda f: f())
        timer.sync()
        timing, r = list(live), 0
        while timing:
            for c in rotated(timing, r):
                if c in live:
                    t0 = time.perf_counter()
                    if not c.times or c.times[-1] < OWN_CALLS_BELOW_MS:
                        call(c, own_calls)
                    ms = call(c, timer.once) if c in live else None
                    if ms is not None:
                        c.times.append(ms)
                    if ms is not None and c.first is not None:
                        ms = call(c, lambda _: timer.once(c.first))
                        if ms is not None:
                            c.firsts.append(ms)
                    c.spent_s += time.perf_counter() - t0
            timing, r = [c for c in timing if c in live and not enough(c)], r + 1
        calls = {id(c): max(1, min(QUEUED_CALLS, round(QUEUED_ROUND_S * 1e3 / max(np.median(c.times), 1e-6))))
                 for c in live}
        for r in range(QUEUED_ROUNDS if live else 0):
            for c in rotated(list(live), r):
                if c in live:
                    ms = call(c, lambda f, n=calls[id(c)]: timer.queued(f, n))
                    if ms is not None:
                        c.queued.append(ms)
    except DeviceContextLost:
        return True
    for c in live:
        record(c.kernel.name, c.params, dict(c.fields, run_ms_median=float(np.median(c.times)),
                                             run_ms_min=float(min(c.times)), run_ms_max=float(max(c.times)),
                                             repeats=len(c.times), run_ms_queued=float(np.median(c.queued)),
                                             first_ms=float(np.median(c.firsts)) if c.firsts else None))
    return False


def time_candidates(todo, problem, ref, bound, tol, timer, xp, settings, record, memory_bytes: int = 0) -> bool:
    """Check and time ``todo`` ((kernel, params) pairs) on ``problem`` (module docstring), calling
    ``record(kernel name, params, fields)`` for each; ``memory_bytes``: the device's, for the
    groups' bound (0: one group). Returns whether the device was lost (the candidates not yet
    recorded then run again in a fresh worker)."""
    group = []
    limit = GROUP_MEMORY_FRACTION * memory_bytes
    for kernel, params in todo:
        ready, failed, lost = _check(kernel, params, problem, ref, bound, tol, timer, xp, settings.budget_s)
        if ready is None:
            record(kernel.name, params, failed)
            if lost:
                return True
            continue
        group.append(ready)
        if limit and timer.held_bytes() > limit:
            if _rounds(timer, group, settings.repeats, settings.warmup, settings.budget_s, record):
                return True
            group = []
            _free(xp)
    lost = _rounds(timer, group, settings.repeats, settings.warmup, settings.budget_s, record)
    _free(xp)
    return lost


def _free(xp) -> None:
    pool = getattr(xp, "get_default_memory_pool", None)
    if pool is not None:
        pool().free_all_blocks()


__all__ = ["time_candidates", "measure", "HostTimer", "CudaTimer", "DeviceContextLost", "error_text",
           "BUDGET_S", "MIN_REPEATS", "PREPARE_REPEATS", "QUEUED_ROUNDS", "GROUP_MEMORY_FRACTION"]
