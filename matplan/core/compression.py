"""SpGEMM's compression (products / nnz(C) of C = A·B) estimated from a few drawn rows of A.

RBSparse's rule reads the compression; the planner estimates it by drawing COMPRESSION_SAMPLES
rows with probability proportional to their products and counting each drawn row's distinct
columns (:func:`sampled_compression`, on the array module of the operands), or finishes the
statistics kernel's counts of the same rows into the same float (:func:`drawn_compression`).
"""
from __future__ import annotations

import operator

import numpy as np

from .xp import array_module, to_host

#: Rows drawn (with probability proportional to their products) to estimate the compression.
COMPRESSION_SAMPLES = 64
#: Products of one drawn row examined, about (a row with more is subsampled; hard cap twice this).
COMPRESSION_ROW_CAP = 1 << 16


def _expand(lengths, xp):
    """(segment, offset) of every item when segment s holds lengths[s] items, in order."""
    if xp is np:   # the same arrays by repetition: a search per item cost ~0.3 s at 8M items
        lengths = np.asarray(lengths, dtype=np.int64)
        seg = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
        return seg, np.arange(seg.size, dtype=np.int64) - (np.cumsum(lengths) - lengths)[seg]
    ends = xp.cumsum(lengths)
    total = int(to_host(ends[-1])) if lengths.size else 0
    idx = xp.arange(total, dtype=xp.int64)
    seg = xp.searchsorted(ends, idx, side="right")
    return seg, idx - (ends[seg] - lengths[seg])


def _occupancy_extrapolate(distinct, examined, products, ncols):
    """nnz(C_i) from ``distinct`` columns among ``examined`` of the row's ``products``: the
    occupancy model d = N (1 - exp(-q / N)) (q draws from N equally likely columns) solved for N
    by bisection on log N, then N (1 - exp(-p / N)); exact where every product was examined."""
    d, q, p = (np.asarray(v, dtype=np.float64) for v in (distinct, examined, products))
    full = q >= p
    if full.all():   # every row examined whole: its count is exact (np.where below picks d)
        return d
    lo = np.log(np.maximum(d, 1.0))
    hi = np.full_like(d, np.log(max(ncols, 1)) + 1.0)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        n = np.exp(mid)
        low = n * -np.expm1(-q / n) < d            # too few columns: N must grow
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    n = np.exp(0.5 * (lo + hi))
    est = np.minimum(n * -np.expm1(-p / n), float(ncols))
    return np.where(full, d, np.clip(est, d, np.minimum(p, ncols)))


#: Rows x columns under which the host counts a sampled row's distinct columns in a bitmap.
BITMAP_CELLS = 1 << 26
#: ... and cells per key under which the bitmap is the cheaper (zeroing and counting ~32 cells
#: costs about what sorting one key does; measured from 6,400 to 1M keys).
BITMAP_CELLS_PER_KEY = 32


def _distinct_per_row(keys, nrows: int, ncols: int, xp):
    """Distinct keys (row * ncols + column) of each of ``nrows`` rows: by a sort, or on the host
    by a bitmap of nrows x ncols where it has at most BITMAP_CELLS cells and BITMAP_CELLS_PER_KEY
    per key (no sort: ~3x faster with few cells a key, much slower with many)."""
    if xp is np and nrows * ncols <= min(BITMAP_CELLS, BITMAP_CELLS_PER_KEY * keys.size):
        seen = np.zeros(nrows * ncols, dtype=bool)
        seen[keys] = True
        return np.count_nonzero(seen.reshape(nrows, ncols), axis=1).astype(np.int64)
    keys = xp.sort(keys)
    new = xp.ones(keys.size, dtype=bool)
    new[1:] = keys[1:] != keys[:-1]
    return xp.bincount(keys[new] // ncols, minlength=nrows)


def sampled_compression(A, B, rowct) -> float:
    """Estimated products / nnz(C) of C = A·B, the expected compression ratio (RBSparse's pi).

    nnz(C) / products is the mean of nnz(C_i) / nnz_RowCt_i over rows drawn with probability
    proportional to nnz_RowCt_i: COMPRESSION_SAMPLES rows at evenly spaced quantiles of the
    products' running sum (deterministic, so host and GPU agree). Each distinct drawn row's
    distinct columns are counted by sorting row-tagged keys. A row with more than
    COMPRESSION_ROW_CAP products is subsampled (every s-th entry of A's row) and its count is
    extrapolated by the occupancy model (:func:`_occupancy_extrapolate`). At most
    64 x 2^17 keys; 1.0 when there are no products.
    """
    xp = array_module(A)
    csum = xp.cumsum(rowct)
    total = int(to_host(csum[-1])) if rowct.size else 0
    if total == 0:
        return 1.0
    targets = (xp.arange(COMPRESSION_SAMPLES, dtype=xp.float64) + 0.5) * (total / COMPRESSION_SAMPLES)
    rows, draws = xp.unique(xp.searchsorted(csum, targets, side="right"), return_counts=True)
    p = rowct[rows]
    # every stride-th entry of A's row, stride = ceil(products / cap)
    stride = (p + COMPRESSION_ROW_CAP - 1) // COMPRESSION_ROW_CAP
    starts = A.indptr[rows].astype(xp.int64)
    length = A.indptr[rows + 1].astype(xp.int64) - starts
    seg_a, off_a = _expand((length + stride - 1) // stride, xp)
    cols_a = A.indices[starts[seg_a] + off_a * stride[seg_a]].astype(xp.int64)
    b_start = B.indptr[cols_a].astype(xp.int64)
    b_len = B.indptr[cols_a + 1].astype(xp.int64) - b_start
    # hard cap: the first 2 x cap products of the subsample
    before = xp.cumsum(b_len) - b_len
    before -= before[xp.searchsorted(seg_a, xp.arange(rows.size), side="left")][seg_a]
    entry, off_b = _expand(xp.clip(2 * COMPRESSION_ROW_CAP - before, 0, b_len), xp)
    row_of = seg_a[entry]
    ncols = B.shape[1]
    keys = row_of * ncols + B.indices[b_start[entry] + off_b].astype(xp.int64)
    counts = xp.stack([_distinct_per_row(keys, rows.size, ncols, xp),
                       xp.bincount(row_of, minlength=rows.size), p, draws])
    return compression_of(*to_host(counts), ncols)


def compression_of(distinct, examined, p, draws, ncols) -> float:
    """products / nnz(C) from each distinct drawn row's distinct columns among its ``examined``
    products of ``p``, drawn ``draws`` times (int64 arrays, rows ascending)."""
    nnz_c = _occupancy_extrapolate(distinct, examined, p, ncols)
    frac = float((draws * nnz_c / p).sum()) / COMPRESSION_SAMPLES
    return 1.0 / frac if frac > 0 else 1.0


#: Integers below this convert to float64 exactly (so int / int is float(a) / float(b)).
_EXACT = 1 << 53


def drawn_compression(figs, ncols: int) -> float:
    """:func:`sampled_compression` from the statistics kernel's drawn rows (1.0 without products): each
    distinct row once, ascending, with its first draw's figures and its draws. Where the rows rise
    (they do: quantiles of a running sum) and each was examined whole, in Python: NumPy's arrays
    cost more than the arithmetic on 64 draws."""
    if figs.products == 0:
        return 1.0
    rows, d, q, p = figs.drawn, figs.distinct, figs.examined, figs.drawn_products
    terms = None   # compression_of's float64 terms in Python, where the rows rise and were examined whole
    if all(map(operator.lt, rows, rows[1:])):   # each row drawn once (the common case): every draw a first
        if 0 < min(p, default=0) and max(p) < _EXACT and max(d) < _EXACT and all(map(operator.ge, q, p)):
            terms = list(map(operator.truediv, d, p))   # 1 * float(d) / p: ints below 2**53 divide as floats
    elif all(map(operator.le, rows, rows[1:])):   # the quantiles' rows rise, some drawn again
        first = [0] + [i for i in range(1, len(rows)) if rows[i] != rows[i - 1]]
        if all(q[i] >= p[i] > 0 for i in first):   # every row examined whole: its count is exact
            ends = first[1:] + [len(rows)]
            terms = [(e - i) * float(d[i]) / p[i] for i, e in zip(first, ends)]
    if terms is not None:   # its sum NumPy's (one leaf of <= 128)
        frac = (0.0 + leaf_sum(terms)) / COMPRESSION_SAMPLES
        return 1.0 / frac if frac > 0 else 1.0
    drawn = np.array((rows, d, q, p), dtype=np.int64)
    _, first, draws = np.unique(drawn[0], return_index=True, return_counts=True)
    distinct, examined, products = drawn[1:, first]
    return compression_of(distinct, examined, products, draws.astype(np.int64), ncols)


def leaf_sum(v) -> float:
    """NumPy's pairwise sum of at most 128 float64 values (one leaf: eight accumulators, combined
    as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the tail), without an array; the
    accumulators are locals (half the time of a list's items)."""
    n = len(v)
    if n < 8:
        r = -0.0
        for x in v:
            r += x
        return r
    body = n - n % 8
    r0, r1, r2, r3, r4, r5, r6, r7 = v[:8]
    for i in range(8, body, 8):
        a0, a1, a2, a3, a4, a5, a6, a7 = v[i:i + 8]
        r0 += a0
        r1 += a1
        r2 += a2
        r3 += a3
        r4 += a4
        r5 += a5
        r6 += a6
        r7 += a7
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for x in v[body:]:
        res += x
    return res
