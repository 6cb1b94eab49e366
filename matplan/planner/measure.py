"""Measured choice among the finalists the cost models cannot separate.

The models' costs are 15% off the device's times at the median (``learned_report_*.json``), so
candidates predicted within ``MARGIN`` of the best are equal as far as the model knows: on an
H100 the model put CSR scalar 3% ahead of ELL-R on banded-large float64, which ran 17% faster
(``spmv-h100-2026-11-24-197e637.log``). When the plan will do enough work for a measurement to
pay (timing the finalists is predicted to cost at most ``BUDGET`` of reuse x the predicted cost
per application) and a run is predicted to take at least ``MIN_RUN_S``, :func:`plan` runs each
finalist on the caller's own (A, B): prepare once, ``WARMUP`` untimed calls, then ``ROUNDS``
rounds of ``CALLS`` calls queued back to back between two CUDA events (the throughput a
reuse-heavy caller gets; single calls of a 20-us kernel vary by 10% with the host's jitter,
which chose W=16 over W=32 on gene_go where their queued times are equal, 2026-11-24), and
chooses by measured run + predicted prepare / reuse. A finalist whose conversion does not fit
the budget is left out (the model's best is always in). The pattern is Triton's autotuner: a
performance model prunes, timings choose. Plans of near-equal finalists may then differ between
processes (by less than the measurement noise); ``measure="never"`` keeps the model's
deterministic choice.
"""
from __future__ import annotations

import dataclasses
import time

from ..core.timing import cuda_queued_s

#: Candidates predicted within this fraction of the best are finalists (the H100 model's run
#: error is x1.15 at the median, x1.7 at the 90th percentile; at 0.15 ice40 float32 kept CSR
#: vector W=32, predicted 21% behind csr_split and measured 2x faster back to back, out) ...
MARGIN = 0.3
#: ... at most this many, cheapest first.
MAX_FINALISTS = 4
#: measure="auto" measures when the finalists' timing is predicted to cost at most this fraction
#: of the plan's predicted work (reuse x the best predicted cost per application).
BUDGET = 0.2
WARMUP, CALLS, ROUNDS = 2, 10, 3
#: measure="auto" leaves plans whose best predicted run is shorter than this to the model: such a
#: call's time is the host's as much as the GPU's (~10 us of CuPy launch, ~15 us of run path), so
#: the timings rank the host's jitter (H100, 2026-11-24, 6d19572: on block_dense-large float32 the
#: measurement took CSR vector W=32 over W=16, 0.0177 against 0.0139 ms back to back).
MIN_RUN_S = 30e-6
#: Host time of one timed call beyond the kernel (event records, synchronisation, Python).
CALL_OVERHEAD_S = 40e-6
MODES = ("auto", "always", "never")


def check_mode(measure) -> str:
    """The measure mode, or ValueError naming the accepted ones (True/False mean always/never)."""
    if measure is True:
        return "always"
    if measure is False:
        return "never"
    if measure not in MODES:
        raise ValueError(f"measure: expected one of {MODES} (or True/False), got {measure!r}")
    return measure


def finalists(scored) -> list:
    """The candidates predicted within MARGIN of the cheapest, at most MAX_FINALISTS."""
    limit = scored[0].total_s * (1 + MARGIN)
    return [c for c in scored if c.total_s <= limit][:MAX_FINALISTS]


def predicted_cost_s(finals) -> float:
    """Predicted seconds to measure ``finals``: each prepared once and run WARMUP + CALLS x ROUNDS times."""
    calls = WARMUP + CALLS * ROUNDS
    return sum(c.prepare_s + calls * (c.run_s + CALL_OVERHEAD_S) for c in finals)


def to_measure(mode: str, backend: str, planning_elsewhere: bool, finals, reuse: int) -> list:
    """The finalists to measure (none: keep the model's choice). Never for one finalist or a plan
    for another device than the one in use (measure="always" raises there). "always": all of them;
    "auto": on the GPU only, for runs predicted past MIN_RUN_S, the model's best and each next
    finalist whose measurement keeps the total within BUDGET of the plan's predicted work."""
    if mode == "never" or len(finals) < 2:
        return []
    if planning_elsewhere:
        if mode == "always":
            raise ValueError("measure='always' times the candidates on the device in use; it cannot "
                             "be combined with device=<another GPU>")
        return []
    if mode == "always":
        return list(finals)
    if backend != "gpu" or finals[0].run_s < MIN_RUN_S:
        return []
    budget = BUDGET * reuse * finals[0].total_s
    chosen = [finals[0]]
    for c in finals[1:]:
        if predicted_cost_s(chosen + [c]) <= budget:
            chosen.append(c)
    return chosen if len(chosen) > 1 and predicted_cost_s(chosen) <= budget else []


def measure(problem, finals, reuse: int, extra_s=lambda name: 0.0) -> tuple:
    """(finalists as measured Candidates, cheapest first; one sentence for the plan's reasons).

    Each finalist runs on (problem.A, problem.B) with its own prepared format, released before the
    next; ``extra_s(kernel name)`` is the per-call cost the plan adds to the kernel's (``per_call``).
    A kernel that fails here raises: it would fail in ``plan.run`` too.
    """
    from ..kernels import get
    t0 = time.perf_counter()
    measured = []
    for c in finals:
        kernel = get(c.kernel)
        try:
            prepared = kernel.prepare(problem.A, dict(c.params))
            run_s = _run_s(problem.backend, lambda: kernel.run(prepared, problem.B)) + extra_s(c.kernel)
        except Exception as exc:
            raise RuntimeError(f"measuring candidate {c.label()} on these inputs failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        del prepared
        measured.append(dataclasses.replace(
            c, run_s=run_s, total_s=run_s + c.prepare_s / max(reuse, 1), source="measured",
            why=f"{c.why}; measured {run_s * 1e3:.4f} ms a run here ({CALLS} calls back to back, "
                f"median of {ROUNDS} rounds; {c.source} model {c.run_s * 1e3:.4f})"))
    measured.sort(key=lambda c: c.total_s)
    note = (f"measured {len(finals)} of the candidates predicted within {MARGIN:.0%} of the best "
            f"({time.perf_counter() - t0:.4f} s): " +
            ", ".join(f"{c.label()} {c.total_s * 1e3:.4f} ms" for c in measured))
    return measured, note


def _run_s(backend: str, fn) -> float:
    """Seconds per call of ``fn`` queued back to back (CUDA events on the GPU, the host clock else),
    the median of ROUNDS rounds of CALLS calls after WARMUP."""
    if backend == "gpu":
        return cuda_queued_s(fn, CALLS, ROUNDS, WARMUP)
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for _ in range(CALLS):
            fn()
        times.append((time.perf_counter() - t) / CALLS)
    return sorted(times)[len(times) // 2]


__all__ = ["MARGIN", "MAX_FINALISTS", "BUDGET", "MODES", "check_mode", "finalists", "to_measure", "measure"]
