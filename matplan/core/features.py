"""Matrix statistics (features) the planner decides from, computed where the data lives.

One pass over ``indptr`` (and over A's ``indices`` for SpGEMM's products per row), with the
array module of the input (NumPy on the host, CuPy on the GPU), so both paths give the same
numbers. GPU CSR operands are measured by the prebuilt statistics kernel where it is installed
(:mod:`.figures`: one launch, one copy back, shared with the structure check), whose figures
:func:`from_figures` finishes into these formulas' numbers bit for bit; without it, operands of
up to ``xp.HOST_STATS_NNZ`` entries are measured on a host copy of their index arrays and larger
ones with CuPy.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import threading

import numpy as np

from . import figures as kernel_figures
from . import compression
from .xp import array_module


@dataclasses.dataclass(frozen=True)
class Features:
    """The statistics a plan decides from; a statistic no candidate reads may be NOT_MEASURED
    (:func:`measured` tells)."""
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
    products: int = 0            # SpGEMM: sum of nnz_RowCt (multiply-adds); an estimate where products_sampled
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


#: Every field of Features in order, at its default (the required ones at None, compute() sets them).
_FIELD_DEFAULTS = {f.name: None if f.default is dataclasses.MISSING else f.default
                   for f in dataclasses.fields(Features)}


def _features(values: dict) -> Features:
    """``Features(**values)`` for compute()'s values (the required fields among them) without the
    frozen dataclass's __init__, which sets each of the 31 fields by object.__setattr__ (~4x the
    time of a dict, every plan); a key that is no field goes to __init__, which names it."""
    state = _FIELD_DEFAULTS.copy()
    state.update(values)
    if len(state) != len(_FIELD_DEFAULTS):
        return Features(**values)
    made = object.__new__(Features)
    object.__setattr__(made, "__dict__", state)
    return made


def row_lengths(A):
    xp = array_module(A)
    return xp.diff(A.indptr)


def sparse_features(A, xp=None, detail: bool = True) -> dict:
    """Row-length moments, empty rows, T, the ELL-R warp lengths and the column spread of CSR ``A``;
    without ``detail`` the warp lengths, their ratio and the spread are NOT_MEASURED."""
    xp = xp or array_module(A)
    m, n = A.shape
    nnz = int(A.indptr[-1]) if m else 0
    out = dict(m=m, n=n, nnz=nnz, density=nnz / (m * n) if m * n else 0.0,
               index_dtype=_dtype_name(A.indices.dtype))
    if m == 0:
        return out
    if xp is np:   # the same figures as the general path below, in fewer passes over the rows
        lengths, work = _host_lengths(A.indptr)
        mean, std, lo, hi, empty = _host_moments(lengths, int(A.indptr[-1]) - int(A.indptr[0]), work)
    else:
        lengths = xp.diff(A.indptr).astype(xp.int64)
        lf = lengths.astype(xp.float64)
        moments = xp.stack([lf.mean(), lf.std(), lf.min(), lf.max(), (lengths == 0).sum().astype(xp.float64)])
        mean, std, lo, hi, empty = (float(v) for v in _host(moments))
    out.update(row_mean=mean, row_std=std, row_min=int(lo), row_max=int(hi), empty_rows=int(empty),
               T=brcp_T(mean, std))
    if not detail:
        out.update(warp_len_before=NOT_MEASURED, warp_len_after=NOT_MEASURED, warp_ratio=NOT_MEASURED,
                   col_spread=NOT_MEASURED)
        return out
    before, after = warp_lengths(lengths, row_min=int(lo), row_max=int(hi))
    out.update(warp_len_before=before, warp_len_after=after, warp_ratio=after / before if before else 1.0,
               col_spread=col_spread(A, xp, nnz))
    return out


#: A statistic a plan did not measure because none of its candidates reads it (compute's ``detail``;
#: ``col_max`` holds it as the int -1): below any measured value (they are never negative), and
#: equal to itself, so plans keep comparing equal after a round trip, which NaN would not.
NOT_MEASURED = -1.0


def measured(value: float) -> bool:
    """False for a NOT_MEASURED statistic."""
    return value >= 0


def _host_moments(lengths, total, work=None):
    """(mean, std, min, max, empty rows) of NumPy int64 row ``lengths`` (which sum to ``total``), bit
    for bit what the float64 reductions give (:func:`_int_mean_var`; ``work`` as it takes it)."""
    m = lengths.shape[0]
    lo, hi = int(lengths.min()), int(lengths.max())
    mean, var = _int_mean_var(lengths, total, lo, work)
    return mean, float(np.sqrt(var)), lo, hi, m - int(np.count_nonzero(lengths))


def _int_mean_var(x, total: int, lo: int, work=None):
    """``x.astype(float64)``'s mean and var for NumPy int64 ``x`` whose sum is ``total``, without the
    float copy: integers below 2**53 add without rounding, so the mean is total / len exactly, and
    the var is NumPy's own two-pass formula (deviations squared in place, summed) on the same values.
    ``work``: a float64 array as long as ``x`` for the deviations (else a new one)."""
    m = x.shape[0]
    mean = float(np.float64(total) / m) if lo >= 0 and total < 2 ** 53 else float(x.mean())
    dev = np.subtract(x, np.float64(mean), out=work)
    np.multiply(dev, dev, out=dev)
    return mean, float(np.add.reduce(dev) / m)


#: Rows up to which host row lengths and their deviations go to arrays kept per thread (16 MB at
#: most): fresh arrays as long as A's rows cost more in page faults than the passes over them.
KEPT_ROWS = 1 << 20


def _host_lengths(indptr):
    """(int64 row lengths of host ``indptr``, a float64 work array as long, or None): this thread's
    kept arrays up to KEPT_ROWS rows (valid until its next call), new ones past them."""
    m = indptr.shape[0] - 1
    if m > KEPT_ROWS:
        return np.diff(indptr).astype(np.int64), None
    bufs = getattr(_local, "rows", None)
    if bufs is None or bufs[0].shape[0] < m:
        size = min(KEPT_ROWS, 1 << max(12, (m - 1).bit_length()))
        bufs = _local.rows = (np.empty(size, np.int64), np.empty(size, np.float64))
    lengths = np.subtract(indptr[1:], indptr[:-1], out=bufs[0][:m])
    return lengths, bufs[1][:m]


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
    if xp is np:
        return _host_col_spread(A, m, n, nnz)
    pos = xp.linspace(0, nnz - 1, min(nnz, SPREAD_SAMPLES)).astype(xp.int64)   # distinct: see below
    rows = xp.searchsorted(A.indptr, pos, side="right") - 1
    cols = A.indices[pos].astype(xp.float64)
    return float(_host(xp.abs(cols / n - (rows + 0.5) / m).mean()))


def _host_col_spread(A, m, n, nnz) -> float:
    """col_spread on the host: linspace's positions by its own arithmetic (distinct: with more
    nonzeros than samples they step by more than 1), the same rows and float operations, in
    buffers kept per thread (fresh large temporaries' page faults can outweigh the arithmetic)."""
    rows = None
    if nnz <= SPREAD_SAMPLES and int(A.indptr[0]) == 0:   # every nonzero, each row's own
        cols = A.indices[:nnz].astype(np.float64)
        counts = np.diff(A.indptr, prepend=0, append=nnz)   # samples of rows -1, 0, ..., m
    else:
        S = min(nnz, SPREAD_SAMPLES)
        steps, cols, pos, half = _scratch(S)
        step = (nnz - 1) / (S - 1)
        np.multiply(steps, step, out=cols)   # numpy.linspace(0, nnz - 1, S), step by step
        cols[-1] = nnz - 1
        pos[:] = cols             # truncation, as linspace(...).astype(int64)
        first = _first_samples(A.indptr, m, nnz, step, S)
        if first is not None and 2 * m <= S:
            counts = np.diff(first, prepend=0, append=S)
        else:
            rows = _rows_of(A.indptr, pos, first, S)
        np.copyto(cols, np.take(A.indices, pos))
    cols /= n
    if rows is None:   # (row + 0.5) / m of each row, repeated for its samples
        half = np.repeat((np.arange(-1, m + 1, dtype=np.int64) + 0.5) / m, counts)
    else:
        np.add(rows, 0.5, out=half)   # (rows + 0.5) / m
        half /= m
    cols -= half
    return float(np.abs(cols, out=cols).mean())


_local = threading.local()


def _scratch(size: int):
    """This thread's (0, 1, ..., size - 1 as float64; float64, int64, float64 work arrays) of ``size``."""
    bufs = getattr(_local, "scratch", None)
    if bufs is None or bufs[0].shape[0] != size:
        bufs = _local.scratch = (np.arange(size, dtype=np.float64), np.empty(size, np.float64),
                                 np.empty(size, np.int64), np.empty(size, np.float64))
    return bufs


ROWS_PER_SAMPLE_SEARCHED = 2   # past this many rows a sample, the samples' rows are searched


def _first_samples(indptr, m, nnz, step, S):
    """Each row's first sample: how many pos[s] = trunc(s * ``step``) (the last nnz - 1) lie below
    indptr[r], by division corrected by recomputing the products (no gathers, no search), or None."""
    if S < 2 or m > ROWS_PER_SAMPLE_SEARCHED * S:
        return None
    v = indptr.astype(np.float64)   # exact: a well-formed indptr is below 2**53
    c = np.ceil(v / step)
    np.clip(c, 0, S - 1, out=c)     # the products s * step for s < S - 1; the last sample is apart
    t = np.empty_like(c)
    for _ in range(8):   # c[r] = first s < S - 1 with s * step >= v[r] (else S - 1); off by one or two at most
        low = (np.multiply(c - 1, step, out=t) >= v) & (c > 0)
        high = (np.multiply(c, step, out=t) < v) & (c < S - 1)
        if not (low.any() or high.any()):
            break
        c += high.view(np.int8) - low.view(np.int8)
    else:
        return None
    first = c.astype(np.int64)
    first += v > nnz - 1            # the last sample, nnz - 1, lies below v from v = nnz on
    return first


def _rows_of(indptr, pos, first, S):
    """searchsorted(indptr, pos, 'right') - 1 for the samples ``pos``, counted from each row's
    ``first`` sample (:func:`_first_samples`) where there is one: O(rows + samples), no search."""
    if first is None:
        return np.searchsorted(indptr, pos, side="right") - 1
    return np.cumsum(np.bincount(first, minlength=S + 1)[:S]) - 1   # rows starting at each sample


def products_per_row(A, B):
    """RBSparse nnz_RowCt: for each row i of A, sum of nnz(B[j,:]) over j in row i (int64)."""
    xp = array_module(A)
    b_len = xp.diff(B.indptr).astype(xp.int64)
    if xp is np:
        return _host_products_per_row(np.asarray(A.indptr), A.indices, b_len)
    per_nz = b_len[A.indices]
    csum = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(per_nz)])
    return csum[A.indptr[1:]] - csum[A.indptr[:-1]]


def _host_products_per_row(indptr, indices, b_len):
    """products_per_row on the host, over A's nonzeros in chunks of SPREAD_SAMPLES through this
    thread's int64 buffer (no temporaries as long as A: their page faults cost more than the
    sums): the running sum of nnz(B[j,:]) is read at each row end that falls in a chunk."""
    nnz, m = indices.shape[0], indptr.shape[0] - 1
    at = np.zeros(m + 1, dtype=np.int64)   # the running sum at each indptr entry
    buf = _scratch(SPREAD_SAMPLES)[2]
    step = buf.shape[0]
    # keys of indptr's own type: a Python int key makes searchsorted copy indptr to int64 each time
    key = indptr.dtype.type if nnz <= np.iinfo(indptr.dtype).max else int
    carry, lo = 0, int(np.searchsorted(indptr, key(0), side="right"))
    for s in range(0, nnz, step):
        e = min(s + step, nnz)
        chunk = buf[:e - s]
        np.take(b_len, indices[s:e], out=chunk, mode="clip")   # indices checked in range by check_csr
        chunk[0] += carry
        np.cumsum(chunk, out=chunk)
        hi = int(np.searchsorted(indptr, key(e), side="right"))
        at[lo:hi] = chunk[indptr[lo:hi] - (s + 1)]
        carry, lo = int(chunk[-1]), hi
    return at[1:] - at[:-1]


def spgemm_features(A, B, detail: bool = True) -> dict:
    """nnz(B), the products (nnz_RowCt) and their per-row moments, RBSparse's groups and the
    sampled compression; without ``detail`` (host operands only) the products are estimated from
    :func:`sampled_products` and the rest is NOT_MEASURED (``rbs_groups`` empty)."""
    xp = array_module(A)
    out = dict(nnz_b=int(B.indptr[-1]) if B.shape[0] else 0, k=B.shape[1])
    if A.shape[0] == 0:
        return out
    if not detail and xp is np:
        products = sampled_products(A, B)
        return dict(out, products=products, rowct_mean=products / A.shape[0], rowct_max=int(NOT_MEASURED),
                    rowct_var_over_mean=NOT_MEASURED, compression=NOT_MEASURED)
    rowct = products_per_row(A, B)
    if xp is np:   # the figures of the general path below, without the float copy
        total, hi = int(rowct.sum()), int(rowct.max())
        lo = int(rowct.min())
        mean, var = _int_mean_var(rowct, total, lo)
    else:
        rf = rowct.astype(xp.float64)
        mean, var, total, hi = (float(v) for v in _host(xp.stack([rf.mean(), rf.var(), rf.sum(), rf.max()])))
    out.update(products=int(round(total)), rowct_mean=mean, rowct_max=int(hi),
               rowct_var_over_mean=var / mean if mean > 0 else 0.0,
               rbs_groups=rbsparse_histogram(rowct, lo if xp is np else None),
               compression=compression.sampled_compression(A, B, rowct))
    return out


#: Nonzeros of A (every s-th) whose rows of B a host plan without detail counts: a byte cost's estimate.
PRODUCT_SAMPLES = 1 << 13


def sampled_products(A, B) -> int:
    """SpGEMM's products (the sum of nnz(B[j,:]) over A's nonzeros j) of host CSR ``A`` and ``B``:
    exact up to PRODUCT_SAMPLES nonzeros, else nnz(A) times their mean over every s-th nonzero (at
    most PRODUCT_SAMPLES; the exact count gathers every nonzero's row of B: ~3 ms at 1M)."""
    lo, hi = int(A.indptr[0]), int(A.indptr[-1])
    if hi <= lo:
        return 0
    cols = A.indices[lo:hi:-(-(hi - lo) // PRODUCT_SAMPLES)]   # a strided view, no index array
    total = int(np.take(B.indptr, cols + 1).sum(dtype=np.int64) - np.take(B.indptr, cols).sum(dtype=np.int64))
    return total if cols.shape[0] == hi - lo else int(round(total * (hi - lo) / cols.shape[0]))


def products_sampled(f) -> bool:
    """Whether Features ``f``'s products are :func:`sampled_products`'s estimate (a plan that
    measured no products per row, past PRODUCT_SAMPLES nonzeros), not the exact count."""
    return not measured(f.rowct_max) and f.nnz > PRODUCT_SAMPLES


def transpose_features(A, detail: bool = True) -> dict:
    """What a SpTRANS plan decides from, and no more (a plan of A.T is often made for one call):
    shape, nnz, the mean and longest row, and the longest column (``col_max``: what the segmented
    sort's per-row sorts grow with; without ``detail`` NOT_MEASURED); two host transfers."""
    xp = array_module(A)
    m, n = A.shape
    nnz = int(_host(A.indptr[-1])) if m else 0
    out = dict(m=m, n=n, nnz=nnz, density=nnz / (m * n) if m * n else 0.0,
               index_dtype=_dtype_name(A.indices.dtype))
    if nnz == 0 or n == 0:
        return out
    longest = [xp.diff(A.indptr).max().astype(xp.int64)]
    if detail:
        longest.append(xp.bincount(A.indices[:nnz], minlength=n).max().astype(xp.int64))
    got = [int(v) for v in _host(xp.stack(longest))]   # one transfer
    out.update(row_mean=nnz / m, row_max=got[0], col_max=got[1] if detail else int(NOT_MEASURED))
    return out


def dense_layout(A) -> str:
    flags = A.flags
    if flags.c_contiguous:
        return "C"
    if flags.f_contiguous:
        return "F"
    return "strided"


def compute(problem, device, detail: bool = True) -> Features:
    """Features of a validated :class:`matplan.validation.Problem` for planning on ``device``;
    ``detail`` False: host operands' warp lengths and column spread (SpMV, SpMM, SpGEMM), SpGEMM's
    per-row products and compression (its products sampled) and SpTRANS's longest column are left
    NOT_MEASURED (most of a plan's time; a plan asks only where no candidate reads them)."""
    A, B, op = problem.A, problem.B, problem.op
    k = 0 if B is None else 1 if B.ndim == 1 else B.shape[1]
    base = dict(op=op, dtype=_dtype_name(problem.dtype), backend=problem.backend, m=A.shape[0], n=A.shape[1], k=k)
    figs = kernel_figures.problem_figures(problem)   # GPU CSR operands, by the statistics kernel
    got = None if figs is None else from_figures(op, figs, A, B)
    if got is not None:
        base.update(got)
        return _features(base)
    if op in ("spmv", "spmm", "sptrans", "spgemm"):   # small GPU operands: statistics on the host
        host_a, host_b = problem.host_index["A"], problem.host_index["B"]
        if op != "spgemm":
            A = host_a or A
        elif host_a is not None and host_b is not None:   # both or neither: products_per_row reads both
            A, B = host_a, host_b
    if op == "sptrans":
        base.update(transpose_features(A, detail))
    elif op in ("spmv", "spmm", "spgemm"):
        base.update(sparse_features(A, detail=detail))
        if op == "spgemm":
            base.update(spgemm_features(A, B, detail))
    else:
        m, n = A.shape
        base.update(nnz=m * n, density=1.0, layout=dense_layout(A),
                    t2threshold=device.t2threshold(problem.dtype))
    return _features(base)


def from_figures(op: str, figs, A, B=None) -> dict | None:
    """The statistics of ``op`` (as :func:`sparse_features`, :func:`spgemm_features` and
    :func:`transpose_features` give them) from the statistics kernel's figures of GPU CSR ``A``
    (and ``B``): the same numbers bit for bit, the same float64 operations on the kernel's exact
    integers and pairwise sums. None where the operands are malformed (rows falling, sums past
    2**53: arrays a caller vouched for), which the general formulas then measure."""
    m, n = A.shape
    m, n = int(m), int(n)
    nnz = figs.a.ptrm if m else 0
    out = dict(m=m, n=n, nnz=nnz, density=nnz / (m * n) if m * n else 0.0,
               index_dtype=_dtype_name(A.indices.dtype))
    if op == "sptrans":
        if nnz > 0 and n:
            out.update(row_mean=nnz / m, row_max=figs.row_max, col_max=figs.col_max)
        return out
    total = figs.a.ptrm - figs.a.ptr0
    if m and (figs.row_min < 0 or not 0 <= total < 2 ** 53 or not 0 <= figs.products < 2 ** 53):
        return None
    # Python's float operations are float64's: an int below 2**53 converts exactly, as in NumPy
    if m:
        mean = total / m
        std = _sqrt(figs.row_ss / m)
        groups = (m + (-m) % WARP) // WARP
        before = figs.warp_before / groups
        after = (figs.warp_after / groups if figs.warp_after is not None else
                 warp_lengths(row_lengths(A), row_min=figs.row_min, row_max=figs.row_max)[1])
        samples = min(nnz, SPREAD_SAMPLES)
        out.update(row_mean=mean, row_std=std, row_min=figs.row_min, row_max=figs.row_max,
                   empty_rows=figs.empty_rows, T=brcp_T(mean, std), warp_len_before=before, warp_len_after=after,
                   warp_ratio=after / before if before else 1.0,
                   col_spread=figs.spread_sum / samples if nnz > 0 and n else 0.0)
    if op != "spgemm":
        return out
    out.update(nnz_b=figs.b.ptrm if B.shape[0] else 0, k=B.shape[1])
    if m == 0:
        return out
    total = figs.products
    mean = total / m
    var = figs.rowct_ss / m
    out.update(products=total, rowct_mean=mean, rowct_max=figs.rowct_max,
               rowct_var_over_mean=var / mean if mean > 0 else 0.0, rbs_groups=tuple(figs.rbs_groups),
               compression=compression.drawn_compression(figs, B.shape[1]) if figs.compression_ok else
               compression.sampled_compression(A, B, products_per_row(A, B)))
    return out


def _sqrt(x: float) -> float:
    """numpy.sqrt of a float64 as a float: math.sqrt's correctly rounded root, NumPy's NaN below 0."""
    return math.sqrt(x) if x >= 0.0 else float(np.sqrt(np.float64(x)))


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype) -> str:
    """str(numpy.dtype(dtype)), once per dtype."""
    return str(np.dtype(dtype))


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


__all__ = ["Features", "compute", "from_figures", "sparse_features", "NOT_MEASURED", "measured", "col_spread",
           "spgemm_features", "PRODUCT_SAMPLES", "sampled_products", "products_sampled", "products_per_row",
           "row_lengths", "transpose_features"]


# --- statistics the papers' rules read (the rules themselves: matplan.models) -------------
#: Warp size used by the warp-length statistic.
WARP = 32


def warp_lengths(row_lengths, warp: int = WARP, row_min: int | None = None, row_max: int | None = None):
    """Average warp length (longest row in each group of ``warp`` consecutive rows) before and after sorting.

    After sorting (longest first, zeros padding the last group), group g's longest row is the
    one of rank g * warp; the sum of those is counted from a histogram of the lengths
    (:func:`_warp_sums`) instead of sorting, where the longest row is no longer than a few times
    the rows. ``row_min`` / ``row_max``: the lengths' extremes, where the caller has them. The
    sums are exact integers, so both ways give the same floats."""
    xp = _xp(row_lengths)
    m = int(row_lengths.shape[0])
    if m == 0:
        return 0.0, 0.0
    pad = (-m) % warp
    lengths = row_lengths.astype(xp.int64)
    groups = (m + pad) // warp
    if row_min is None or row_max is None:
        row_min, row_max = (int(v) for v in _host(xp.stack([lengths.min(), lengths.max()])))
    if row_min >= 0 and row_max <= 4 * m + 1024:
        before, after = (int(v) for v in _host(_warp_sums(lengths, xp, pad, row_max, warp)))
        return before / groups, after / groups
    if pad:
        lengths = xp.concatenate([lengths, xp.zeros(pad, dtype=xp.int64)])
    before = lengths.reshape(-1, warp).max(axis=1).mean()
    after = xp.sort(lengths)[::-1].reshape(-1, warp).max(axis=1).mean()
    return float(before), float(after)


def _warp_sums(lengths, xp, pad, row_max, warp):
    """[sum of each group's longest row in row order, the same after sorting] of int64 ``lengths``
    (all >= 0, at most ``row_max``) as one array where they live. After sorting, value v holds
    the ranks [G, G + c) (G rows longer, c of length v, the ``pad`` zeros counted), which contain
    ceil((G + c) / warp) - ceil(G / warp) of the ranks g * warp."""
    m = lengths.shape[0]
    full = m - m % warp
    before = lengths[:full].reshape(-1, warp).max(axis=1).sum() if full else xp.zeros((), xp.int64)
    if full < m:   # the last group, padded with zeros
        before = before + xp.maximum(lengths[full:].max(), 0)
    counts = xp.bincount(lengths, minlength=row_max + 1)
    counts[0] += pad
    longer = xp.cumsum(counts[::-1])[::-1] - counts
    firsts = (longer + counts + (warp - 1)) // warp - (longer + (warp - 1)) // warp
    after = (firsts * xp.arange(row_max + 1, dtype=xp.int64)).sum()
    return xp.stack([before, after])


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


def rbsparse_histogram(row_ct, row_min: int | None = None) -> tuple:
    """Rows in each RBSparse group, as a tuple of six ints. ``row_min``: the least entry, where
    the caller has it (on the host, signed integer counts >= 0 are binned by integer thresholds)."""
    xp = _xp(row_ct)
    if (xp is np and row_ct.dtype.kind == "i" and row_ct.size
            and (row_min if row_min is not None else int(row_ct.min())) >= 0):
        return _host_rbs_histogram(row_ct)
    ids = rbsparse_group_ids(row_ct)
    counts = xp.bincount(ids, minlength=len(RBS_GROUP_BOUNDS))
    return tuple(int(c) for c in _host(counts))


@functools.lru_cache(maxsize=1)
def _rbs_thresholds() -> tuple:
    """The least count of each group after the first: the least x whose float64(x) / pi reaches
    the group's bound (x / pi only grows with x, so a count's group is how many it reaches)."""
    starts = [max(0, int(bound * RBS_COMPRESSION) - 2) for bound in RBS_GROUP_BOUNDS[1:]]
    return tuple(next(x for x in range(x0, x0 + 8) if float(np.float64(x) / RBS_COMPRESSION) >= bound)
                 for x0, bound in zip(starts, RBS_GROUP_BOUNDS[1:]))


def _host_rbs_histogram(row_ct) -> tuple:
    """rbsparse_histogram of NumPy counts >= 0 by integer thresholds (no float copy, no search)."""
    edges = _rbs_thresholds()
    below = np.cumsum(np.bincount(np.minimum(row_ct, edges[-1]), minlength=edges[-1] + 1))[np.asarray(edges) - 1]
    return tuple(int(c) for c in np.diff(np.concatenate([[0], below, [row_ct.shape[0]]])))


def brcp_T(row_mean: float, row_std: float) -> int:
    """T = round(mu + sigma) of the nonzeros per row (at least 1)."""
    return max(1, int(round(row_mean + row_std)))


def _xp(a):
    mod = type(a).__module__
    if mod.startswith("cupy"):
        import cupy  # only for CuPy inputs
        return cupy
    return np
