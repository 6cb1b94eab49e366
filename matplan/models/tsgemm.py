"""TSM2 performance model and parameter search (SEEDS section 5).

C (m x k) = A (m x n) . B (n x k), k small, one thread per row of A, outer
product form. Parameters: ``t1`` threads per block (= rows of a B tile),
``t2`` columns of C a thread computes per pass (A is read ceil(k/t2) times),
``t3`` elements of A a thread loads at once (memory concurrency).

This is a *reconstruction*: the seed's formula images are missing. Kept from
its text: registers ``c + 3*t2 + 2*t3``, shared memory ``t2`` elements a
thread, occupancy min(HW, R_SM/R, S_SM/S), Little's-law utilisations, the
t2threshold branches of Alg. 5, gradient descent from 1 with step 0.1 and
stop 1e-4, integer results, t1 left to timing (the planner's measurement). Our reading
(assumptions, each named where it is used):

- register counts are in value-sized registers, so a float64 value takes two
  of the device's 32-bit registers; a thread may hold at most 255;
- the base count ``c`` (measured by the authors) is REG_BASE;
- B is read from DRAM once (small, L2-resident), C written once;
- compute time is 2mnk / peak (an FMA is two FLOP, as in the peaks), which
  puts the model's own memory/compute crossover at t2threshold / 2, while the
  branch test keeps the paper's t2threshold = peak * bytes / bandwidth;
- the descent works on a relaxation without kinks (k/t2 passes, occupancy not
  rounded to whole blocks, a smooth min(1, x)), on log(time), with steps of
  length 0.1 along the projected gradient (halved over kinks); the exact
  model then scores floor/ceil of the result and a small integer local
  search polishes it (the paper just rounds).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.device import DeviceSpec
from ..core.validation import check_int

# --- constants ---------------------------------------------------------------
#: c: registers a thread uses besides the B, C and A values (indices, pointers,
#: loop counters). The paper measures it per build; 32 is an assumption.
REG_BASE = 32
#: Most 32-bit registers a thread may hold (all NVIDIA GPUs since Kepler GK110).
MAX_REGS_PER_THREAD = 255
#: Most threads a block may hold.
MAX_THREADS_PER_BLOCK = 1024
#: Block sizes the planner's measurement times for t1 (filtered by the device and t2, t3).
T1_CANDIDATES = (64, 128, 256, 512, 1024)
#: Upper bound of t3 in the search (the paper's choices are all t3 = 4).
T3_MAX = 16
#: Gradient descent: start point of t2 and t3, step length, stop threshold.
GD_START = 1.0
GD_STEP = 0.1
GD_STOP = 1e-4
#: Backtracking halves a failed step down to GD_STEP / this.
GD_MIN_STEP_FRACTION = 64
#: Safety cap on descent steps (the step length bounds the path to ~10 * range).
GD_MAX_ITER = 10_000
#: Finite-difference half-width of the numerical gradient.
GD_FD_H = 1e-3
#: Sharpness of the smooth min(1, x) the descent uses for the utilisations.
SOFTCAP_P = 8


# --- model ---------------------------------------------------------------------
def _itemsize(dtype) -> int:
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"dtype: TSM2 model supports float32 and float64, got {dt}")
    return dt.itemsize


def _words(itemsize: int) -> int:
    """32-bit registers one value occupies (assumption: fp64 takes two)."""
    return max(1, itemsize // 4)


def registers_per_thread(t2: float, t3: float, dtype) -> float:
    """R = c + (3*t2 + 2*t3) value registers: B next + B current + C (t2 each), A current + next (t3 each)."""
    return REG_BASE + (3.0 * t2 + 2.0 * t3) * _words(_itemsize(dtype))


class _Consts:
    """The per-(device, shape, dtype) figures of the model, computed once so the descent stays fast."""

    __slots__ = ("size", "words", "hw", "regs_sm", "smem_sm", "smem_block", "loads", "fmas",
                 "bw", "peak", "m", "n", "k", "flops")

    def __init__(self, device: DeviceSpec, m, n, k, dtype):
        self.size = _itemsize(dtype)
        self.words = _words(self.size)
        self.hw = float(device.max_threads_per_sm)
        self.regs_sm = float(device.regs_per_sm)
        self.smem_sm = float(device.smem_per_sm)
        self.smem_block = float(device.smem_per_block)
        self.loads = loads_needed(device, dtype)
        self.fmas = fmas_needed(device, dtype)
        self.bw = float(device.mem_bandwidth)
        self.peak = float(device.peak_flops(dtype))
        self.m, self.n, self.k = m, n, k
        self.flops = 2.0 * m * n * k

    def occupancy(self, t1, t2, t3):
        regs = REG_BASE + (3.0 * t2 + 2.0 * t3) * self.words
        if regs > MAX_REGS_PER_THREAD:
            return 0.0
        occ = min(self.hw, self.regs_sm / regs, self.smem_sm / (t2 * self.size))
        if t1 is None:
            return occ
        if t1 > MAX_THREADS_PER_BLOCK or t1 * t2 * self.size > self.smem_block:
            return 0.0
        return float(math.floor(occ / t1) * t1)

    def log_smooth(self, kind):
        """log of the relaxed memory or compute time as a fast function of (t2, t3), for the descent.

        Relaxed: k/t2 passes instead of ceil(k/t2), occupancy not rounded to
        whole blocks, and min(1, x) of the utilisations replaced by the smooth
        x / (1 + x^p)^(1/p), p = SOFTCAP_P, so the descent sees no kinks.
        """
        words, size, hw, regs_sm, smem_sm = self.words, self.size, self.hw, self.regs_sm, self.smem_sm
        p, inv_p = float(SOFTCAP_P), 1.0 / SOFTCAP_P
        log, inf = math.log, math.inf
        if kind == "memory":
            need, a_bytes = self.loads, size * self.m * self.n * self.k
            rest, log_bw = size * (self.n * self.k + self.m * self.k), log(self.bw)
        else:
            need, log_c = self.fmas, log(self.flops / self.peak)

        def f(t2, t3):
            regs = REG_BASE + (3.0 * t2 + 2.0 * t3) * words
            if regs > MAX_REGS_PER_THREAD:
                return inf
            occ = min(hw, regs_sm / regs, smem_sm / (t2 * size))
            if kind == "memory":
                x = occ * t3 / need
                return log(a_bytes / t2 + rest) - log_bw + inv_p * log(1.0 + x ** p) - log(x)
            x = occ * t2 / need
            return log_c + inv_p * log(1.0 + x ** p) - log(x)
        return f

    def times(self, t1, t2, t3):
        """(memory s, compute s, mem_util, comp_util, occupancy) of the exact model."""
        occ = self.occupancy(t1, t2, t3)
        mu, cu = min(1.0, occ * t3 / self.loads), min(1.0, occ * t2 / self.fmas)
        passes = math.ceil(self.k / t2)
        nbytes = self.size * (self.m * self.n * passes + self.n * self.k + self.m * self.k)
        mem_s = nbytes / (self.bw * mu) if mu > 0 else math.inf
        comp_s = self.flops / (self.peak * cu) if cu > 0 else math.inf
        return mem_s, comp_s, mu, cu, occ


def loads_needed(device: DeviceSpec, dtype) -> float:
    """Little's law: loads in flight per SM to saturate memory: latency x bandwidth / (#SM x bytes)."""
    latency_s = device.mem_latency_cycles / device.clock_hz
    return latency_s * device.mem_bandwidth / (device.sms * _itemsize(dtype))


def fmas_needed(device: DeviceSpec, dtype) -> float:
    """Little's law: independent FMAs in flight per SM to saturate the FMA units = latency x FMA/cycle/SM."""
    fma_per_cycle_sm = device.peak_flops(dtype) / (2.0 * device.clock_hz * device.sms)
    return device.fma_latency_cycles * fma_per_cycle_sm


def occupancy(device: DeviceSpec, t1, t2: float, t3: float, dtype) -> float:
    """Most threads resident on one SM: min(HW max, regs_SM / R, smem_SM / S), S = t2 * itemsize.

    With ``t1`` given it is rounded down to whole blocks of t1 threads (0 when
    one block does not fit: over MAX_THREADS_PER_BLOCK threads or over the
    per-block shared memory); with ``t1=None`` it is the smooth bound the
    descent works on. Zero when a thread would need more than
    MAX_REGS_PER_THREAD registers.
    """
    return _Consts(device, 1, 1, 1, dtype).occupancy(t1, t2, t3)


def mem_utilisation(device: DeviceSpec, t1, t2: float, t3: float, dtype) -> float:
    """min(1, occupancy x t3 / loads_needed): t3 independent A loads a thread keeps in flight."""
    return min(1.0, occupancy(device, t1, t2, t3, dtype) * t3 / loads_needed(device, dtype))


def compute_utilisation(device: DeviceSpec, t1, t2: float, t3: float, dtype) -> float:
    """min(1, occupancy x t2 / fmas_needed): t2 independent accumulators a thread updates per A element."""
    return min(1.0, occupancy(device, t1, t2, t3, dtype) * t2 / fmas_needed(device, dtype))


def _check_shape(m, n, k):
    for name, v in (("m", m), ("n", n), ("k", k)):
        check_int(v, name, "a positive integer")


def model(device: DeviceSpec, m: int, n: int, k: int, dtype, t1, t2: float, t3: float) -> dict:
    """The modelled figures of one parameter set: memory and compute time (s), utilisations, occupancy.

    Memory time: A read ceil(k/t2) times plus B and C once, over bandwidth x
    mem_util. Compute time: 2mnk FLOP over peak x comp_util. Infeasible
    parameters (registers, shared memory, t1) give infinite times.
    """
    _check_shape(m, n, k)
    mem_s, comp_s, mu, cu, occ = _Consts(device, m, n, k, dtype).times(t1, t2, t3)
    return dict(mem_s=mem_s, comp_s=comp_s, time_s=max(mem_s, comp_s), mem_util=mu,
                comp_util=cu, occupancy=occ, registers=registers_per_thread(t2, t3, dtype),
                passes=math.ceil(k / t2))


def predict_time(device: DeviceSpec, m: int, n: int, k: int, dtype, t1, t2, t3) -> float:
    """Modelled run time in seconds: max(memory time, compute time); inf when the parameters cannot run."""
    return model(device, m, n, k, dtype, t1, t2, t3)["time_s"]


# --- parameter search --------------------------------------------------------
def _t2_cap(dtype) -> float:
    """Largest t2 whose registers fit with t3 = 1."""
    w = _words(_itemsize(dtype))
    return (MAX_REGS_PER_THREAD - REG_BASE - 2.0 * w) / (3.0 * w)


def _repair(t2, t3, lo2, hi2, room):
    """Clamp into the box, then lower t3 (and if need be t2) until 3*t2 + 2*t3 <= room (registers fit)."""
    t2 = min(max(t2, lo2), hi2)
    t3 = min(max(t3, 1.0), float(T3_MAX))
    if 3 * t2 + 2 * t3 > room:
        t3 = max(1.0, (room - 3 * t2) / 2)
        if 3 * t2 + 2 * t3 > room:
            t2 = max(lo2, (room - 2 * t3) / 3)
    return t2, t3


def _descend(logf, lo2, hi2, dtype):
    """Projected, normalised gradient descent of logf(t2, t3), a log time, on [lo2, hi2] x [1, T3_MAX].

    Starts at (GD_START, GD_START) moved into the box. The gradient is a
    central difference (half-width GD_FD_H, cut at the box), with components
    that push out of the box at an active bound dropped. A step moves
    GD_STEP along the negative gradient; a step that does not improve is
    halved and retried (the model has kinks where a utilisation reaches 1),
    down to GD_STEP / GD_MIN_STEP_FRACTION. Stops when a step improves log f
    by less than GD_STOP. Returns (t2, t3, steps) with t2, t3 floats.
    """
    room = (MAX_REGS_PER_THREAD - REG_BASE) / _words(_itemsize(dtype))
    x2, x3 = _repair(GD_START, GD_START, lo2, hi2, room)
    g = logf(x2, x3)
    box = ((lo2, hi2), (1.0, float(T3_MAX)))
    steps, step = 0, GD_STEP
    while steps < GD_MAX_ITER and math.isfinite(g):
        grad = [0.0, 0.0]
        for axis in (0, 1):
            lo, hi = box[axis]
            x = (x2, x3)[axis]
            a, b = max(lo, x - GD_FD_H), min(hi, x + GD_FD_H)
            if b <= a:
                continue                       # degenerate interval
            pa = (a, x3) if axis == 0 else (x2, a)
            pb = (b, x3) if axis == 0 else (x2, b)
            d = (logf(*pb) - logf(*pa)) / (b - a)
            if (x <= lo and d > 0) or (x >= hi and d < 0):
                d = 0.0                        # projected gradient at an active bound
            grad[axis] = d
        norm = math.hypot(*grad)
        if norm == 0.0 or not math.isfinite(norm):
            break
        while True:
            n2, n3 = _repair(x2 - step * grad[0] / norm, x3 - step * grad[1] / norm,
                             lo2, hi2, room)
            g_new = logf(n2, n3)
            steps += 1
            if g_new < g or step <= GD_STEP / GD_MIN_STEP_FRACTION:
                break
            step /= 2                          # backtrack over a kink
        if not g - g_new >= GD_STOP:           # small gain, no gain, or NaN
            if g_new < g:
                x2, x3 = n2, n3
            break
        x2, x3, g = n2, n3, g_new
        step = min(GD_STEP, 2 * step)
    return x2, x3, steps


def _integer_choice(c, t1, t2, t3, lo2, hi2, dtype):
    """The integer (t2, t3) the exact model scores best near the continuous optimum.

    The paper rounds to the nearest integers. Here floor and ceil of both are
    scored (the optimum often sits where a utilisation just reaches 1, and
    rounding down loses it), then a local search on the exact model
    (ceil(k/t2) passes, whole blocks of t1) moves to the best neighbour
    (t2 +-1, t3 +-1, or t2 jumping to the fewest columns for one pass more or
    less) while that improves. Score: modelled time, then total of memory and
    compute time (breaks the ties of a flat compute time), then smaller t2, t3.
    Returns (score, figures, t2, t3) or None when nothing fits.
    """
    lo_i, hi_i = math.ceil(lo2 - 1e-9), math.floor(hi2 + 1e-9)
    k = c.k

    def fits(a, b):
        return lo_i <= a <= hi_i and 1 <= b <= T3_MAX and \
            registers_per_thread(a, b, dtype) <= MAX_REGS_PER_THREAD

    def score(a, b):
        fig = c.times(t1, a, b)
        return (max(fig[0], fig[1]), fig[0] + fig[1], a, b), fig

    start = [(a, b) for a in (math.floor(t2), math.ceil(t2)) for b in (math.floor(t3), math.ceil(t3))]
    scored = [score(a, b) + (a, b) for a, b in start if fits(a, b)]
    if not scored:
        return None
    best = min(scored)
    while True:
        a, b = best[2], best[3]
        passes = math.ceil(k / a)
        near = [(a + da, b + db) for da in (-1, 0, 1) for db in (-1, 0, 1) if da or db]
        for q in (passes - 1, passes + 1):
            if q >= 1:
                a2, b2 = math.ceil(k / q), b
                while b2 > 1 and not fits(a2, b2):
                    b2 -= 1
                near.append((a2, b2))
        moves = [score(x, y) + (x, y) for x, y in near if fits(x, y)]
        if not moves or min(moves)[0] >= best[0]:
            return best
        best = min(moves)


def gradient_descent(device: DeviceSpec, m: int, n: int, k: int, dtype, t1=None) -> dict:
    """t2 and t3 by the paper's Alg. 5 on the model (integers), for block size ``t1`` (None: any).

    k <= t2threshold (memory bound): minimise memory time over 1 <= t2 <= k.
    Otherwise (compute bound): minimise compute time over t2threshold <= t2 <= k
    and memory time over 1 <= t2 < t2threshold; keep the pair whose modelled
    time (max of both) is lower. t2 is further capped so that the registers
    fit (MAX_REGS_PER_THREAD); a branch left empty by the cap is skipped.
    With ``t1`` the integer choice counts whole blocks of t1 threads; with
    None the occupancy is not rounded. Deterministic. Returns dict(t2, t3,
    predicted_s, bound, objective, steps, mem_util, comp_util, occupancy,
    limited_by).
    """
    _check_shape(m, n, k)
    c = _Consts(device, m, n, k, dtype)
    threshold = device.t2threshold(dtype)
    cap = min(float(k), math.floor(_t2_cap(dtype)))
    if cap < 1:
        raise ValueError(f"dtype: no t2 >= 1 fits in {MAX_REGS_PER_THREAD} registers "
                         f"with REG_BASE={REG_BASE}")
    bound = "memory" if k <= threshold else "compute"
    branches = []  # (objective, lo2, hi2)
    if bound == "memory":
        branches.append(("memory", 1.0, cap))
    else:
        if threshold <= cap:
            branches.append(("compute", threshold, cap))
        hi = min(cap, math.ceil(threshold) - 1.0)
        if hi >= 1:
            branches.append(("memory", 1.0, hi))
    best, steps = None, 0
    best, best_kind, steps = None, None, 0
    for kind, lo2, hi2 in branches:
        t2, t3, s = _descend(c.log_smooth(kind), lo2, hi2, dtype)
        steps += s
        pick = _integer_choice(c, t1, t2, t3, lo2, hi2, dtype)   # (score, figures, t2, t3)
        if pick is not None and (best is None or pick[0] < best[0]):
            best, best_kind = pick, kind
    if best is None or not math.isfinite(best[0][0]):
        raise ValueError(f"t1: no feasible (t2, t3) with t1={t1} on {device.name}")
    (time_s, _, t2, t3), (mem_s, comp_s, mu, cu, occ), _, _ = best
    kind = best_kind
    return dict(t2=t2, t3=t3, predicted_s=time_s, bound=bound, objective=kind, steps=steps,
                mem_util=mu, comp_util=cu, occupancy=occ,
                limited_by="memory" if mem_s >= comp_s else "compute")


def t1_candidates(device: DeviceSpec, m: int, t2: int, t3: int, dtype) -> list:
    """Block sizes to time for (t2, t3): those of T1_CANDIDATES with a whole block resident per SM.

    Sizes above ``m`` are dropped (idle threads), except the smallest feasible one.
    """
    ok = [t1 for t1 in T1_CANDIDATES if occupancy(device, t1, t2, t3, dtype) >= t1]
    small = [t1 for t1 in ok if t1 <= m]
    return small or ok[:1]


def choose_params(device: DeviceSpec, m: int, n: int, k: int, dtype) -> dict:
    """Everything the planner quotes for TSM2: t1 candidates (to time), t2, t3, predicted time and why.

    Returns dict(t1=[...], t1_predicted_s={t1: s}, t2, t3, predicted_s,
    bound ('memory'|'compute': k vs t2threshold, the paper's test),
    limited_by (which modelled time dominates at the chosen parameters),
    objective (the branch of Alg. 5 that won), t2threshold, mem_util,
    comp_util, occupancy, steps). ``predicted_s`` and the utilisations are for
    occupancy not rounded to whole blocks; ``t1_predicted_s`` rounds it for
    each candidate.
    """
    res = gradient_descent(device, m, n, k, dtype, None)
    t1s = t1_candidates(device, m, res["t2"], res["t3"], dtype)
    if not t1s:
        raise ValueError(f"device: no block size in {T1_CANDIDATES} fits t2={res['t2']}, "
                         f"t3={res['t3']} on {device.name}")
    per_t1 = {t1: predict_time(device, m, n, k, dtype, t1, res["t2"], res["t3"]) for t1 in t1s}
    return dict(res, t1=t1s, t1_predicted_s=per_t1, t2threshold=device.t2threshold(dtype))


# --- cuBLAS ---------------------------------------------------------------------
#: cuBLAS tall-and-skinny GEMM: fraction of copy bandwidth. Measured on an H100 (CuPy 14.2, CUDA 13,
#: benchmarks/tsgemm.py, n = 8192..32768, k = 1..32, both layouts): fp64 0.85-1.03 (median 0.98),
#: fp32 0.24-1.01 (k = 1: 0.70-1.01, k = 2: 0.24-0.64, k >= 4: 0.54-0.80; median 0.70). One
#: figure per dtype: a little under the median.
CUBLAS_TS_EFFICIENCY = {"float64": 0.95, "float32": 0.65}
#: cuBLAS's fixed cost on tall-and-skinny products beyond LAUNCH_S, seconds, by the path CuPy takes:
#: "gemv" at k = 1, "gemm" (its GEMM kernels' setup, split reductions) past it; fitted with
#: CUBLAS_TS_EFFICIENCY per fold by matplan report (tuning_db.refit).
CUBLAS_TS_FIXED_S = {"gemv": 0.0, "gemm": 0.0}
#: TSM2's fixed cost beyond LAUNCH_S (its call's host path, the split's sum), seconds; fitted per fold
#: likewise, so that neither side of cuBLAS against TSM2 alone absorbs the timings' common floor.
TSM2_FIXED_S = 0.0
CUBLAS_GEMM_EFFICIENCY = 0.7
LAUNCH_S = 6e-6
#: The column kernel's threads walk their slice of n one column at a time: where a launch has
#: too few rows to fill the GPU, that walk, not the bytes, bounds the call. Seconds a column, read
#: off training-h200.jsonl (docs/tsgemm.md): at m = 256 (one block, no split) TSM2's column kernels
#: took 9-16 us more than cuBLAS over n = 256 columns, whatever k, dtype or cp.async variant.
#: matplan report reads it off each fold's own timings instead (tuning_db.refit._column_walk).
COL_COLUMN_S = 40e-9
