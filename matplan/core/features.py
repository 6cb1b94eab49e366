"""Matrix statistics (features) the planner decides from, computed where the data lives.

One pass over ``indptr`` (and over A's ``indices`` for SpGEMM's products per
row), with the array module of the input (NumPy on the host, CuPy on the GPU),
so both paths give the same numbers. All figures are gathered into one array
and moved to the host once. GPU operands of up to ``xp.HOST_STATS_NNZ`` entries are
measured on a host copy of their index arrays (CuPy's kernels would compile first).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .xp import array_module


@dataclasses.dataclass(frozen=True)
class Features:
    op: str
    dtype: str
    backend: str
    m: int                       # rows of A
    n: int                       # columns of A (= rows of B)
    k: int                       # columns of B (1 for a vector)
    nnz: int = 0                 # nonzeros of A (m*n for dense A)
    density: float = 1.0
    index_dtype: str = ""        # index width of sparse A ("int32"/"int64")
    row_mean: float = 0.0
    row_std: float = 0.0
    row_min: int = 0
    row_max: int = 0
    empty_rows: int = 0
    T: int = 0                   # BRCP: round(mu + sigma)
    warp_len_before: float = 0.0  # ELL-R: average warp length in original row order
    warp_len_after: float = 0.0   # ... and after sorting rows by length
    warp_ratio: float = 1.0       # after / before
    nnz_b: int = 0               # SpGEMM: nonzeros of B
    products: int = 0            # SpGEMM: sum of nnz_RowCt (multiply-adds)
    rowct_mean: float = 0.0
    rowct_max: int = 0
    rowct_var_over_mean: float = 0.0
    rbs_groups: tuple = ()       # rows in each RBSparse group (alpha = nnz_RowCt / pi)
    compression: float = 0.0     # SpGEMM: products / nnz(C), sampled (0: not measured)
    col_spread: float = 0.0      # mean |j/n - i/m| over (sampled) nonzeros: how far B's gathers wander
    layout: str = ""             # dense A: "C" or "F" (or "strided")
    t2threshold: float = 0.0     # TSM2: device's memory/compute boundary in k
    col_max: int = 0             # SpTRANS: entries of A's longest column (the longest row of A.T)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["rbs_groups"] = list(self.rbs_groups)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Features":
        d = dict(d)
        d["rbs_groups"] = tuple(d.get("rbs_groups", ()))
        return cls(**d)


def row_lengths(A):
    xp = array_module(A)
    return xp.diff(A.indptr)


def sparse_features(A, xp=None) -> dict:
    """Row-length moments, empty rows, T, the ELL-R warp lengths and the column spread of CSR ``A``."""
    xp = xp or array_module(A)
    m, n = A.shape
    nnz = int(A.indptr[-1]) if m else 0
    out = dict(m=m, n=n, nnz=nnz, density=nnz / (m * n) if m * n else 0.0,
               index_dtype=str(np.dtype(A.indices.dtype)))
    if m == 0:
        return out
    lengths = xp.diff(A.indptr).astype(xp.int64)
    lf = lengths.astype(xp.float64)
    moments = xp.stack([lf.mean(), lf.std(), lf.min(), lf.max(), (lengths == 0).sum().astype(xp.float64)])
    mean, std, lo, hi, empty = (float(v) for v in _host(moments))
    before, after = warp_lengths(lengths)
    out.update(row_mean=mean, row_std=std, row_min=int(lo), row_max=int(hi), empty_rows=int(empty),
               T=brcp_T(mean, std), warp_len_before=before, warp_len_after=after,
               warp_ratio=after / before if before else 1.0, col_spread=col_spread(A, xp, nnz))
    return out


#: Nonzeros (evenly spaced in storage order) that col_spread examines.
SPREAD_SAMPLES = 1 << 16


def col_spread(A, xp=None, nnz: int | None = None) -> float:
    """Mean |j/n - i/m| over nonzeros (i, j) of CSR ``A``, from SPREAD_SAMPLES evenly spaced ones.

    About 0 for banded and mesh matrices (row i's columns lie near i n/m: consecutive rows
    gather the same rows of B, which stay in cache) and about 1/3 for uniformly random
    columns (every gather may miss). Evenly spaced samples make host and GPU agree. ``nnz``:
    A's nonzeros where the caller has them (saves a device-to-host transfer).
    """
    xp = xp or array_module(A)
    m, n = A.shape
    if nnz is None:
        nnz = int(_host(A.indptr[-1])) if m else 0
    if nnz == 0 or n == 0:
        return 0.0
    pos = xp.linspace(0, nnz - 1, min(nnz, SPREAD_SAMPLES)).astype(xp.int64)
    keep = xp.ones(pos.shape[0], dtype=bool)   # sorted already: unique without unique's hash or sort
    keep[1:] = pos[1:] != pos[:-1]
    pos = pos[keep]
    rows = xp.searchsorted(A.indptr, pos, side="right") - 1
    cols = A.indices[pos].astype(xp.float64)
    return float(_host(xp.abs(cols / n - (rows + 0.5) / m).mean()))


def products_per_row(A, B):
    """RBSparse nnz_RowCt: for each row i of A, sum of nnz(B[j,:]) over j in row i (int64)."""
    xp = array_module(A)
    b_len = xp.diff(B.indptr).astype(xp.int64)
    per_nz = b_len[A.indices]
    csum = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(per_nz)])
    return csum[A.indptr[1:]] - csum[A.indptr[:-1]]


#: Rows drawn (with probability proportional to their products) to estimate the compression.
COMPRESSION_SAMPLES = 64
#: Products of one drawn row examined, about (a row with more is subsampled; hard cap twice this).
COMPRESSION_ROW_CAP = 1 << 16


def _expand(lengths, xp):
    """(segment, offset) of every item when segment s holds lengths[s] items, in order."""
    ends = xp.cumsum(lengths)
    total = int(_host(ends[-1])) if lengths.size else 0
    idx = xp.arange(total, dtype=xp.int64)
    seg = xp.searchsorted(ends, idx, side="right")
    return seg, idx - (ends[seg] - lengths[seg])


def _occupancy_extrapolate(distinct, examined, products, ncols):
    """nnz(C_i) from ``distinct`` columns among ``examined`` of the row's ``products``: the
    occupancy model d = N (1 - exp(-q / N)) (q draws from N equally likely columns) solved for N
    by bisection on log N, then N (1 - exp(-p / N)); exact where every product was examined."""
    d, q, p = (np.asarray(v, dtype=np.float64) for v in (distinct, examined, products))
    full = q >= p
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
    total = int(_host(csum[-1])) if rowct.size else 0
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
    keys = xp.sort(row_of * ncols + B.indices[b_start[entry] + off_b].astype(xp.int64))
    new = xp.ones(keys.size, dtype=bool)
    new[1:] = keys[1:] != keys[:-1]
    counts = xp.stack([xp.bincount(keys[new] // ncols, minlength=rows.size),
                       xp.bincount(row_of, minlength=rows.size), p, draws])
    distinct, examined, p, draws = _host(counts)
    nnz_c = _occupancy_extrapolate(distinct, examined, p, ncols)
    frac = float((draws * nnz_c / p).sum()) / COMPRESSION_SAMPLES
    return 1.0 / frac if frac > 0 else 1.0


def spgemm_features(A, B) -> dict:
    xp = array_module(A)
    out = dict(nnz_b=int(B.indptr[-1]) if B.shape[0] else 0, k=B.shape[1])
    if A.shape[0] == 0:
        return out
    rowct = products_per_row(A, B)
    rf = rowct.astype(xp.float64)
    mean, var, total, hi = (float(v) for v in _host(xp.stack([rf.mean(), rf.var(), rf.sum(), rf.max()])))
    out.update(products=int(round(total)), rowct_mean=mean, rowct_max=int(hi),
               rowct_var_over_mean=var / mean if mean > 0 else 0.0,
               rbs_groups=rbsparse_histogram(rowct),
               compression=sampled_compression(A, B, rowct))
    return out


def transpose_features(A) -> dict:
    """What a SpTRANS plan decides from, and no more (a plan of A.T is often made for one call):
    shape, nnz, the mean and longest row, and the longest column (``col_max``: what the segmented
    sort's per-row sorts grow with); two host transfers."""
    xp = array_module(A)
    m, n = A.shape
    nnz = int(_host(A.indptr[-1])) if m else 0
    out = dict(m=m, n=n, nnz=nnz, density=nnz / (m * n) if m * n else 0.0,
               index_dtype=str(np.dtype(A.indices.dtype)))
    if nnz == 0 or n == 0:
        return out
    longest = xp.stack([xp.diff(A.indptr).max().astype(xp.int64),
                        xp.bincount(A.indices[:nnz], minlength=n).max().astype(xp.int64)])
    row_max, col_max = (int(v) for v in _host(longest))
    out.update(row_mean=nnz / m, row_max=row_max, col_max=col_max)
    return out


def dense_layout(A) -> str:
    flags = A.flags
    if flags.c_contiguous:
        return "C"
    if flags.f_contiguous:
        return "F"
    return "strided"


def compute(problem, device) -> Features:
    """Features of a validated :class:`matplan.validation.Problem` for planning on ``device``."""
    A, B, op = problem.A, problem.B, problem.op
    k = 0 if B is None else 1 if B.ndim == 1 else B.shape[1]
    if op in ("spmv", "spmm", "sptrans", "spgemm"):   # small GPU operands: statistics on the host
        host_a, host_b = problem.host_index["A"], problem.host_index["B"]
        if op != "spgemm":
            A = host_a or A
        elif host_a is not None and host_b is not None:   # both or neither: products_per_row reads both
            A, B = host_a, host_b
    base = dict(op=op, dtype=str(problem.dtype), backend=problem.backend, m=A.shape[0], n=A.shape[1], k=k)
    if op == "sptrans":
        base.update(transpose_features(A))
    elif op in ("spmv", "spmm", "spgemm"):
        base.update(sparse_features(A))
        if op == "spgemm":
            base.update(spgemm_features(A, B))
    else:
        m, n = A.shape
        base.update(nnz=m * n, density=1.0, layout=dense_layout(A),
                    t2threshold=device.t2threshold(problem.dtype))
    return Features(**base)


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


__all__ = ["Features", "compute", "sparse_features", "col_spread", "spgemm_features", "products_per_row",
           "sampled_compression", "row_lengths", "transpose_features"]


# --- statistics the papers' rules read (the rules themselves: matplan.models) -------------
#: Warp size used by the warp-length statistic.
WARP = 32


def warp_lengths(row_lengths, warp: int = WARP):
    """Average warp length (longest row in each group of ``warp`` consecutive rows) before and after sorting."""
    xp = _xp(row_lengths)
    m = int(row_lengths.shape[0])
    if m == 0:
        return 0.0, 0.0
    pad = (-m) % warp
    lengths = row_lengths.astype(xp.int64)
    if pad:
        lengths = xp.concatenate([lengths, xp.zeros(pad, dtype=xp.int64)])
    before = lengths.reshape(-1, warp).max(axis=1).mean()
    after = xp.sort(lengths)[::-1].reshape(-1, warp).max(axis=1).mean()
    return float(before), float(after)


#: The paper's compression estimate, products / nnz(C) of a row (nnz(C_i) ~ nnz_RowCt / pi).
RBS_COMPRESSION = math.pi
#: Group lower bounds of alpha = nnz_RowCt / pi, and the paper's table size for each group.
RBS_GROUP_BOUNDS = (0, 32, 64, 128, 256, 512)


def rbsparse_group_ids(row_ct):
    """Group index (0..5) of each row: alpha = nnz_RowCt / pi binned by RBS_GROUP_BOUNDS."""
    xp = _xp(row_ct)
    alpha = row_ct.astype(xp.float64) / RBS_COMPRESSION
    bounds = xp.asarray(RBS_GROUP_BOUNDS[1:], dtype=xp.float64)
    return xp.searchsorted(bounds, alpha, side="right")


def rbsparse_histogram(row_ct) -> tuple:
    """Rows in each RBSparse group, as a tuple of six ints."""
    xp = _xp(row_ct)
    ids = rbsparse_group_ids(row_ct)
    counts = xp.bincount(ids, minlength=len(RBS_GROUP_BOUNDS))
    return tuple(int(c) for c in _host(counts))


def brcp_T(row_mean: float, row_std: float) -> int:
    """T = round(mu + sigma) of the nonzeros per row (at least 1)."""
    return max(1, int(round(row_mean + row_std)))


def _xp(a):
    mod = type(a).__module__
    if mod.startswith("cupy"):
        import cupy  # only for CuPy inputs
        return cupy
    return np
