"""The papers' decision rules, as named constants and small functions (see ../shared/SEEDS.md).

Each function works on NumPy or CuPy arrays (``xp`` is taken from the input)
and returns plain Python numbers, so the planner can quote them in reasons.
"""
from __future__ import annotations

import math

import numpy as np

# --- ELL-R row sorting (SEEDS section 2) -----------------------------------
#: Warp size used by the warp-length statistic.
WARP = 32
#: Sorting rows by length pays when avg warp length after / before is at most this.
#: The paper says "about 66%": Harbor (0.663) sorts and wins, Protein (0.668) does not;
#: the constant sits between the two.
ELLR_SORT_RATIO = 0.665


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


def ellr_should_sort(before: float, after: float) -> bool:
    """The ELL-R rule: sort rows by length when the warp length shrinks to <= ELLR_SORT_RATIO."""
    if before <= 0:
        return False
    return after / before <= ELLR_SORT_RATIO


# --- RBSparse hash SpGEMM (SEEDS section 1) --------------------------------
#: variance(nnz_RowCt) / mean(nnz_RowCt) at or under this: one hash-table size for all rows.
RBS_BALANCED_RATIO = 0.5
#: The paper's compression estimate, products / nnz(C) of a row (nnz(C_i) ~ nnz_RowCt / pi).
RBS_COMPRESSION = math.pi
#: Group lower bounds of alpha = nnz_RowCt / pi, and the paper's table size for each group.
RBS_GROUP_BOUNDS = (0, 32, 64, 128, 256, 512)
RBS_GROUP_TABLE = (32, 64, 128, 256, 512, 2048)


def rbsparse_balanced(var_over_mean: float) -> bool:
    return var_over_mean <= RBS_BALANCED_RATIO


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


# --- BRCP (SEEDS section 4) --------------------------------------------------
#: Rows per BRCP block (one warp, one thread a block row).
BRCP_H = 32
#: A row longer than BRCP_LONG_FACTOR * T is cut into blocks of width ceil(nnz / BRCP_LONG_FACTOR).
BRCP_LONG_FACTOR = 64


def brcp_T(row_mean: float, row_std: float) -> int:
    """T = round(mu + sigma) of the nonzeros per row (at least 1)."""
    return max(1, int(round(row_mean + row_std)))


def _xp(a):
    mod = type(a).__module__
    if mod.startswith("cupy"):
        import cupy
        return cupy
    return np


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a
