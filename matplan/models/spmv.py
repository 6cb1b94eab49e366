"""SpMV/SpMM cost model: the ELL-R and BRCP papers' rules (SEEDS sections 2 and 4), the fitted
constants of matplan's kernels and of the cuSPARSE candidate, and each kernel's cost.

A kernel's run costs the bytes it streams (padding and warp divergence from the warp-length
figures) over the device bandwidth times a per-kernel efficiency, a straggler term for the
longest row's serial work, a term per launched thread and one per launch; its prepare costs
the bytes and passes of the format conversion. The statistics the rules read are in
:mod:`matplan.core.features`; the layout quantities a cost needs (vector width, tile size,
column chunks) are the kernels' and are passed in. See docs/spmv.md.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.features import WARP, brcp_T, warp_lengths  # noqa: F401  the statistics these rules read
from ..core.types import Cost
from . import traffic

# --- ELL-R row sorting (SEEDS section 2) -----------------------------------
#: Sorting rows by length pays when avg warp length after / before is at most this.
#: The paper says "about 66%": Harbor (0.663) sorts and wins, Protein (0.668) does not;
#: the constant sits between the two.
ELLR_SORT_RATIO = 0.665


def ellr_should_sort(before: float, after: float) -> bool:
    """The ELL-R rule: sort rows by length when the warp length shrinks to <= ELLR_SORT_RATIO."""
    if before <= 0:
        return False
    return after / before <= ELLR_SORT_RATIO


# --- BRCP (SEEDS section 4) --------------------------------------------------
#: Rows per BRCP block (one warp, one thread a block row).
BRCP_H = 32
#: A row longer than BRCP_LONG_FACTOR * T is cut into blocks of width ceil(nnz / BRCP_LONG_FACTOR).
BRCP_LONG_FACTOR = 64


# --- which kernels are offered -----------------------------------------------
#: ELL-R is not offered when padding to the longest row needs more slots than this.
ELLR_MAX_PAD_FACTOR, ELLR_MAX_PAD_EXTRA = 4, 1 << 20
#: The merge path and CSR split are offered only when the longest row exceeds this many mean rows:
#: on the balanced benchmark matrices (longest <= 15x mean) the merge path was 1.2-1.6x the best
#: row kernel.
MERGE_MIN_SKEW = 64


# --- matplan's kernels: fitted constants -------------------------------------
#: Fraction of the copy bandwidth each kernel sustains on the bytes it streams (first H100
#: run: CSR scalar 0.72, CSR vector 0.69, ELL-R 0.68, BRCP 0.68 of copy bandwidth on 3-D Poisson).
EFFICIENCY = {"spmv.csr_scalar": 0.65, "spmv.csr_vector": 0.8, "spmv.ellr": 0.8,
              "spmv.brc": 0.75, "spmv.brcp": 0.75, "spmv.csr_merge": 0.8,
              "spmv.csr_spmm": 0.7, "spmv.csr_split": 0.8}
#: One kernel launch from Python, seconds (fitted when the kernels launched through CuPy's
#: RawKernel; through _cuda's packed launcher a launch takes ~5 us).
LAUNCH_S = 6e-6
#: One loop iteration of a lone warp: the longest row or block runs alone at the end. An H100
#: took 0.35-0.5 us per iteration (CSR vector on R-MAT, BRCP with the paper's widths on skewed),
#: with or without 4x unrolling.
ITER_S = 4e-7
#: Cost of each launched thread (indptr loads, shuffles): W = 4 vs 8 vs 16 lanes on 3-D Poisson.
#: CSR scalar and vector launch their threads (1 or W per row) once for each of the k columns
#: (grid (rows, k)), so they count m * k and m * W * k threads; on the H100 tuning data CSR
#: vector's time past the bytes grew as m * W * k at 3-5e-12 s a thread (Poisson, banded,
#: uniform, k = 4 and 16).
THREAD_S = 5e-12
#: Entries each lane of CSR scalar / vector loads per loop trip (spmv.cu's UNROLL): the longest
#: row takes row_max / (UNROLL * lanes) trips of ITER_S. Counting one trip per entry predicted
#: 3-5x the H100's times where that row dominates (skewed, R-MAT, ice40, gene_go; CSR scalar
#: 0.17-0.3x, CSR vector 0.15-0.45x); per trip they fit 0.75-1.2x.
UNROLL = 4
#: Merge path (csr_merge), fitted on the H100 tuning data of the chunked kernel (36 timings:
#: skewed, R-MAT, ice40; k = 1, 4, 16; float32 and float64) with A's bytes at EFFICIENCY: a fixed
#: cost (two launches and the carry buffer), the dense bytes (X rows gathered at random, Y
#: written) at MERGE_DENSE_EFFICIENCY of the copy bandwidth, and each tile's search, scan and
#: barriers once per column. Measured / model 0.73-1.46 (charging the dense bytes like A's
#: predicted 0.43-1.05x the time).
MERGE_FIXED_S = 21e-6
MERGE_DENSE_EFFICIENCY = 0.37
MERGE_TILE_S = 3.3e-9
#: CSR SpMM: entries each slot takes per loop trip (spmv.cu's csr_spmm). With it and ITER_S the
#: cost is 0.8-1.2x the H100's times on the long-row matrices in float64 (k = 16: skewed 24 ms,
#: R-MAT 2.3 ms, ice40 0.42 ms) but up to 1.8x in float32 and on gene_go (rows of ~1000);
#: efficiency 0.7 gave 0.8-1.25x on the balanced matrices.
SPMM_PER_TRIP = 2
#: Format conversion: sustained fraction of bandwidth for sort/scatter passes, and per-op cost
#: (warm, 7-8M nonzeros: ELL-R 1-2 ms, BRCP/BRC 5-13 ms).
CONVERT_EFFICIENCY, CONVERT_OP_S = 0.15, 50e-6
#: BRCP/BRC padding, estimated from the sorted warp length, is capped at this fraction of nnz
#: (long rows are cut into pieces, so the sorted-slice padding of the head rows does not occur).
BRCP_PAD_CAP = 0.5
#: BRC / BRCP as SpMM (k > 1): each of the k column passes gathers B's column at A's column
#: indices, which misses L2 as for cuSPARSE (traffic.column_major_gathers_missed), plus a fixed
#: cost a call: effective bytes per missed gather at the copy bandwidth and seconds, least squares
#: (relative error) on the 256 BRC/BRCP SpMM timings of the H100 tuning data.
#: Measured / model within 0.7-1.4: 44% -> 57% (median 0.75 -> 0.89; uniform-large 0.30 -> 0.64,
#: R-MAT large 0.60 -> 1.10); large stencils (dragon, world_highways, Poisson large) stay at 0.3-0.6.
BLOCKED_SPMM_GATHER_BYTES = 29.0
BLOCKED_SPMM_OVERHEAD_S = 5e-6


# --- cuSPARSE through CuPy ----------------------------------------------------
#: Fraction of the copy bandwidth cuSPARSE SpMV reaches (0.11-0.58 measured on the corpus) and
#: the fixed cost of one cupyx SpMV call (about 46 us measured, descriptor creation included).
CUSPARSE_SPMV_EFFICIENCY = 0.35
CUSPARSE_SPMV_OVERHEAD_S = 46e-6
#: cupyx multiplies CSR by a 2-D B (k > 1) through cuSPARSE SpMM on a column-major copy of B,
#: so each nonzero gathers its k values from k columns, a sector each; past L2 (see
#: traffic.column_major_gathers_missed) each missed gather costs CUSPARSE_SPMM_GATHER_BYTES at
#: the copy bandwidth. With A's bytes and the dense bytes (B and C, with the copies) at their
#: efficiencies and the fixed cost, fitted on the H100 tuning data (111 timings, k = 4 and 16):
#: measured / model 0.71-1.96. The SpMV cost above gave 0.98-3.55 there, and 0.1-0.3x on random
#: columns at k = 16 (uniform-large 3.7 ms, R-MAT large 1.7 ms).
CUSPARSE_SPMM_OVERHEAD_S = 83e-6
CUSPARSE_SPMM_A_EFFICIENCY = 0.2
CUSPARSE_SPMM_DENSE_EFFICIENCY = 0.23
CUSPARSE_SPMM_GATHER_BYTES = 42.0


# --- the terms every cost is made of --------------------------------------------
def _ceil(x: float) -> float:
    """``np.ceil`` of a non-negative float as a Python float: the same number, without a NumPy
    scalar call (a plan prices every candidate; the costs it returns stay np.float64 where they were)."""
    return float(math.ceil(x)) if math.isfinite(x) else x


def _sizes(f):
    return traffic.itemsize(f), traffic.index_size(f)


def run_s(kernel: str, nbytes, device, launches=1, straggler_iters=0.0, threads=0.0) -> float:
    """Seconds of one application: ``nbytes`` at ``kernel``'s EFFICIENCY of the copy bandwidth,
    LAUNCH_S a launch, ITER_S a loop trip of the lone straggler and THREAD_S a launched thread."""
    return (nbytes / (device.mem_bandwidth * EFFICIENCY[kernel]) + launches * LAUNCH_S
            + straggler_iters * ITER_S + threads * THREAD_S)


def convert_s(nbytes, ops, device) -> float:
    """Seconds of a format conversion moving ``nbytes`` in ``ops`` array operations."""
    return nbytes / (device.mem_bandwidth * CONVERT_EFFICIENCY) + ops * CONVERT_OP_S


# --- CSR row kernels -----------------------------------------------------------
def csr_scalar(f, device) -> Cost:
    """A thread per row: a warp runs as long as its longest row, loads do not coalesce."""
    v, i = _sizes(f)
    slots = f.warp_len_before * f.m
    nbytes = slots * (v + i) * f.k + (f.m + 1) * i + traffic.dense_bytes(f)
    trips = _ceil(f.row_max / UNROLL)
    return Cost(0.0, np.float64(run_s("spmv.csr_scalar", nbytes, device, 1, trips, f.m * f.k)),
                f"thread per row: warps run {f.warp_len_before:.2f} iterations on average "
                f"({slots / max(f.nnz, 1):.2f}x the nonzeros as lane-slots), uncoalesced, "
                f"~{EFFICIENCY['spmv.csr_scalar']:.2f} of bandwidth")


def csr_vector(f, w: int, device) -> Cost:
    """``w`` lanes a row, launched once for each of the k columns."""
    v, i = _sizes(f)
    lane_slots = f.m * w * max(1.0, _ceil(f.row_mean / w))
    nbytes = f.nnz * (v + i) * f.k + 2 * f.m * i + traffic.dense_bytes(f)
    trips = _ceil(f.row_max / (UNROLL * w))
    return Cost(0.0, np.float64(run_s("spmv.csr_vector", nbytes, device, 1, trips, f.m * w * f.k)),
                f"{w} lanes per row (mean row {f.row_mean:.1f}) for each of {f.k} column(s): lanes busy "
                f"{f.nnz / max(lane_slots, 1):.2f}, longest row {f.row_max} takes "
                f"{int(trips)} trips of {UNROLL * w} entries")


def csr_spmm(f, kk: int, s: int, device) -> Cost:
    """``kk`` column lanes x ``s`` nonzero slots a row: A read once per ``kk`` columns."""
    v, i = _sizes(f)
    chunks = -(-f.k // kk)
    trips = int(_ceil(f.row_max / (SPMM_PER_TRIP * s))) * chunks   # the longest row's lone group
    nbytes = f.nnz * (v + i) * chunks + (f.m + 1) * i + traffic.dense_bytes(f)
    return Cost(0.0, run_s("spmv.csr_spmm", nbytes, device, 1, trips, f.m * kk * s),
                f"{kk} column lanes x {s} slots per row: A read {chunks}x for k={f.k} (once per "
                f"column in the row kernels), X rows read {min(kk, f.k) * v} B at a time; longest row "
                f"{f.row_max} takes {trips} trips")


def csr_split(f, w: int, limit: int, chunk: int, device) -> Cost:
    """CSR vector of ``w`` lanes up to ``limit`` nonzeros a row; longer rows in blocks of ``chunk``."""
    v, i = _sizes(f)
    trips = _ceil(min(f.row_max, limit) / (UNROLL * w))
    nbytes = f.nnz * (v + i) * f.k + 2 * f.m * i + traffic.dense_bytes(f)
    return Cost(convert_s(f.m * 8, 6, device),
                np.float64(run_s("spmv.csr_split", nbytes, device, 1, trips, f.m * w * f.k)),
                f"{w} lanes per row up to {limit} nonzeros, longer rows in blocks of "
                f"{chunk} (longest {f.row_max}): no straggler past {int(trips)} trips")


def csr_merge(f, tiles: float, passes: int, tile_shape: str, device) -> Cost:
    """Merge path over ``tiles`` tiles (row ends + nonzeros / tile size) of ``tile_shape``
    (threads x items), A read ``passes`` times for the k columns."""
    v, i = _sizes(f)
    nbytes = (f.nnz * (v + i) * passes + (f.m + 1) * i
              + 2 * tiles * (v * f.k + 24))                 # carries and their fix-up records
    run = (MERGE_FIXED_S + run_s("spmv.csr_merge", nbytes, device, 0) + tiles * f.k * MERGE_TILE_S
           + traffic.dense_bytes(f) / (device.mem_bandwidth * MERGE_DENSE_EFFICIENCY))
    return Cost(convert_s(f.m * 16 + tiles * 40, 8, device), run,
                f"merge path: {f.m + f.nnz:,} row ends + nonzeros in {int(_ceil(tiles)):,} tiles of "
                f"{tile_shape} items, no straggler (longest row {f.row_max}), "
                + (f"A read {passes}x for {f.k} columns, " if f.k > 1 else "")
                + f"~{EFFICIENCY['spmv.csr_merge']:.2f} of bandwidth on A, {MERGE_DENSE_EFFICIENCY:.2f} on X and Y")


# --- ELL-R -----------------------------------------------------------------------
def ellr_rule_text(f, sort: bool) -> str:
    """The ELL-R rule as applied to ``f``, for a plan's reasons."""
    ratio = f.warp_len_after / f.warp_len_before if f.warp_len_before else 1.0
    op = "<=" if ratio <= ELLR_SORT_RATIO else ">"
    return (f"ELL-R {'sorted' if sort else 'unsorted'}: warp length {f.warp_len_before:.2f} -> "
            f"{f.warp_len_after:.2f} ({ratio:.2f} {op} {ELLR_SORT_RATIO})")


def ellr(f, sort: bool, padded_slots: int, device) -> Cost:
    """ELL-R (rows sorted by length when ``sort``), ``padded_slots`` stored."""
    v, i = _sizes(f)
    wl = f.warp_len_after if sort else f.warp_len_before
    nbytes = wl * f.m * (v + i) * f.k + f.m * (4 + (i if sort else 0)) + traffic.dense_bytes(f)
    conv = convert_s(padded_slots * (v + i) + f.nnz * (2 * (v + i) + 32), 25 if sort else 15, device)
    return Cost(conv, run_s("spmv.ellr", nbytes, device, 1, f.row_max, f.m),
                f"{ellr_rule_text(f, sort)}; {wl * f.m / max(f.nnz, 1):.2f}x the nonzeros as "
                f"lane-slots; {padded_slots:,} padded slots stored")


# --- BRC / BRCP --------------------------------------------------------------------
def blocked_layout(f, T: int, long_factor: int) -> tuple:
    """(padded slots, block rows, longest piece) of the BRCP layout, predicted from the statistics."""
    T, long_factor = max(int(T), 1), int(long_factor)
    sorted_pad = max(f.warp_len_after * f.m - f.nnz, 0.0)
    slots = f.nnz + min(sorted_pad, BRCP_PAD_CAP * f.nnz)
    longest = np.ceil(f.row_max / long_factor) if f.row_max > long_factor * T else min(f.row_max, T)
    rows = max(slots / max(min(T, max(f.row_mean, 1.0)), 1.0), f.m)
    return slots, rows, longest


def _blocked(kernel, f, T, long_factor, device, per_row_bytes, launches, extra_why, extra_run_bytes=0) -> Cost:
    """The BRCP layout's cost; ``extra_run_bytes`` (BRC's zeroing of y) are added last at the copy
    bandwidth, where the caller would have added them to this Cost's run time."""
    v, i = _sizes(f)
    slots, rows, longest = blocked_layout(f, T, long_factor)
    nbytes = slots * (v + i) * f.k + rows * per_row_bytes + traffic.dense_bytes(f)
    conv = convert_s(slots * (v + i) + f.nnz * (2 * (v + i) + 64), 60, device)
    width = (f"T=round(mu+sigma)={f.T}" if T == f.T
             else f"width capped at {T} (T=round(mu+sigma)={f.T})")
    run = run_s(kernel, nbytes, device, launches, longest, rows)
    if f.k > 1:
        run += (traffic.column_major_gathers_missed(f, device.l2_bytes) * BLOCKED_SPMM_GATHER_BYTES
                / device.mem_bandwidth + BLOCKED_SPMM_OVERHEAD_S)
    if extra_run_bytes:
        run = run + extra_run_bytes / device.mem_bandwidth
    return Cost(conv, run,
                f"{width}, rows > {long_factor}*T cut to width "
                f"ceil(nnz/{long_factor}); ~{slots / max(f.nnz, 1):.2f}x the nonzeros "
                f"as slots, longest piece {int(longest)}{extra_why}")


def brc(f, T: int, long_factor: int, device) -> Cost:
    """BRC: the BRCP layout, every block row adding atomically into a zeroed y."""
    v, i = _sizes(f)
    return _blocked("spmv.brc", f, T, long_factor, device, i + v * f.k, 2, "; atomics into a zeroed y",
                    f.m * f.k * v)


def brcp(f, T: int, long_factor: int, device) -> Cost:
    """BRCP: warp segmented sums, and a fix-up launch when a row spans several blocks."""
    i = traffic.index_size(f)
    spans = f.row_max > int(T)          # some row needs several pieces: fixup launch
    return _blocked("spmv.brcp", f, T, long_factor, device, 4 + i, 1 + spans,
                    "; warp segmented sums" + (", fixed-order reduction of rows spanning blocks"
                                               if spans else ""))


# --- cuSPARSE ------------------------------------------------------------------------
def cusparse(f, device) -> Cost:
    """cupyx's ``A @ x``: cuSPARSE SpMV, or SpMM on a column-major copy of B for k > 1."""
    if f.k == 1:
        t = traffic.csr_spmm_bytes(f) / (device.mem_bandwidth * CUSPARSE_SPMV_EFFICIENCY)
        return Cost(0.0, t + CUSPARSE_SPMV_OVERHEAD_S,
                    f"cuSPARSE SpMV via CuPy: ~{CUSPARSE_SPMV_EFFICIENCY:.2f} of bandwidth + "
                    f"{CUSPARSE_SPMV_OVERHEAD_S * 1e6:.0f} us per call")
    bw = device.mem_bandwidth
    missed = traffic.column_major_gathers_missed(f, device.l2_bytes)
    t = (CUSPARSE_SPMM_OVERHEAD_S + traffic.csr_bytes(f) / (bw * CUSPARSE_SPMM_A_EFFICIENCY)
         + traffic.dense_bytes(f) / (bw * CUSPARSE_SPMM_DENSE_EFFICIENCY)
         + missed * CUSPARSE_SPMM_GATHER_BYTES / bw)
    return Cost(0.0, t, f"cuSPARSE SpMM via CuPy on a column-major copy of B: A at ~"
                        f"{CUSPARSE_SPMM_A_EFFICIENCY:.2f} and B, C at ~{CUSPARSE_SPMM_DENSE_EFFICIENCY:.2f} "
                        f"of bandwidth, {missed:,.0f} gathers past L2 (column spread {f.col_spread:.2f}) + "
                        f"{CUSPARSE_SPMM_OVERHEAD_S * 1e6:.0f} us per call")


# --- cuSPARSE prepared once (spmv.cusparse) ------------------------------------------------
#: The prepared call (descriptors and workspace made once, the output preallocated), fitted on
#: single-call H100 timings of benchmarks/spmv.py (two runs): SpMV as the CSR minimum traffic at
#: this fraction of the copy bandwidth plus a fixed cost (least squares in log over 15 timings of
#: 3-D Poisson, R-MAT, skewed, ice40 and world_highways, 1.7-8M nonzeros, float64 and float32:
#: measured / model 0.75-1.33; back to back the fixed cost is 10-20 us lower); SpMM on row-major
#: B and C as A, each nonzero's row of B and C at CUSPARSE_PREPARED_SPMM_EFFICIENCY (k = 16,
#: float64: 3-D Poisson 0.83, R-MAT 0.85, world_highways 1.15, skewed 1.43, whose 200k-nonzero
#: rows this leaves out). Few timings: a re-tune on the prepared call refits them.
CUSPARSE_PREPARED_SPMV_EFFICIENCY = 0.67
CUSPARSE_PREPARED_SPMM_EFFICIENCY = 0.65
CUSPARSE_PREPARED_OVERHEAD_S = 32e-6


def cusparse_prepared(f, device, order: str = "row") -> Cost:
    """``spmv.cusparse``: cuSPARSE SpMV, or SpMM on descriptors and a workspace made once (cupyx's
    call, with its per-call costs, is :func:`cusparse`). SpMM in ``order`` "row" multiplies B and
    writes C as they are (row-major); "col" (column-major, cupyx's order) costs the same call plus
    its two conversions: B copied to column-major and C copied back, each read and written once at
    the copy bandwidth, and a launch each (the planner's B and out are C-ordered). No algorithm is
    modelled apart: which is fastest is the measurement's to find."""
    if order not in ("row", "col"):
        raise ValueError(f"order: expected 'row' or 'col', got {order!r}")
    bw, fixed = device.mem_bandwidth, CUSPARSE_PREPARED_OVERHEAD_S
    if f.k == 1:
        t = traffic.csr_spmm_bytes(f) / (bw * CUSPARSE_PREPARED_SPMV_EFFICIENCY)
        why = f"cuSPARSE SpMV prepared once: ~{CUSPARSE_PREPARED_SPMV_EFFICIENCY:.2f} of bandwidth"
    else:
        nbytes = traffic.csr_bytes(f) + (f.nnz + f.m) * f.k * traffic.itemsize(f)
        t = nbytes / (bw * CUSPARSE_PREPARED_SPMM_EFFICIENCY)
        why = (f"cuSPARSE SpMM prepared once on {order}-major B: A, each nonzero's row of B and C at "
               f"~{CUSPARSE_PREPARED_SPMM_EFFICIENCY:.2f} of bandwidth")
        if order == "col":
            copies = 2 * f.k * (f.n + f.m) * traffic.itemsize(f)
            t += copies / bw + 2 * LAUNCH_S
            why += f", + B and C copied to and from column-major ({copies / 1e6:.1f} MB at the copy bandwidth)"
    return Cost(0.0, t + fixed, why + f" + {fixed * 1e6:.0f} us per call")
