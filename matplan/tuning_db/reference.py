"""Checking a timed candidate: SciPy's float64 reference of a problem, the error scale |A| @ |B|,
the accepted error, and whether the host can hold the reference at all."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..core.xp import to_host
from ..kernels.spgemm import panels as spgemm_panels   # host_available_bytes looked up per call: tests patch it
from ..models.traffic import spgemm_nnz_c

#: SciPy's float64 reference of a SpGEMM holds C about four times at once (the product, its
#: canonical copy, the error scale |A||B| and the checked result's copy), 12 bytes a nonzero. A
#: problem whose estimate passes this fraction of the host's available memory is reported and
#: not timed: wordnet A·Aᵀ (8.8e9 nonzeros) had the host kill a whole tuning run (an H200 machine
#: with 128 GB).
REFERENCE_HOST_FRACTION = 0.5
REFERENCE_BYTES_PER_NONZERO = 4 * 12


def check_reference_fits(features, available=None) -> None:
    """MemoryError naming the sizes when the host cannot hold the reference of this problem."""
    if features.op != "spgemm":
        return
    nnz_c = spgemm_nnz_c(features)
    need = nnz_c * REFERENCE_BYTES_PER_NONZERO
    available = spgemm_panels.host_available_bytes() if available is None else available
    if need > REFERENCE_HOST_FRACTION * available:
        raise MemoryError(f"the SciPy reference needs about {need / 1e9:,.0f} GB of host memory "
                          f"(~{nnz_c:,.0f} nonzeros of C expected), more than "
                          f"{REFERENCE_HOST_FRACTION:.0%} of the {available / 1e9:,.0f} GB available: not timed")


def reference(A, B):
    """SciPy/NumPy float64 product and the elementwise error scale |A| @ |B| (host arrays).

    With non-negative operands (common for SpGEMM's A @ A) the scale is the product itself.
    """
    A64 = A.astype(np.float64)
    B64 = B.astype(np.float64)
    ref = A64 @ B64
    nonneg = all(float((x.data if sp.issparse(x) else x).min(initial=0.0)) >= 0.0 for x in (A64, B64))
    bound = ref if nonneg else abs(A64) @ abs(B64)
    if sp.issparse(ref):
        ref = ref.tocsr()
        ref.sum_duplicates()
        if nonneg:
            bound = ref
        else:
            bound = bound.tocsr()
            bound.sum_duplicates()
    return ref, bound


def tolerance(features) -> float:
    """Accepted max |C - ref| / (|A||B|): the summation error bound of the longest dot product."""
    length = features.n if features.op in ("tsgemm", "gemm") else max(features.row_max, 1)
    return (length + 4) * float(np.finfo(np.dtype(features.dtype)).eps)


def max_error(C, ref, bound) -> float:
    """max |C - ref| / (|A||B|) elementwise; inf for NaN, a wrong shape or an entry outside |A||B|'s pattern."""
    C = to_host(C)
    if tuple(C.shape) != tuple(ref.shape):
        return float("inf")
    if sp.issparse(ref):
        if not sp.issparse(C):
            C = sp.csr_matrix(np.asarray(C))
        C = sp.csr_matrix(C)
        if not C.has_canonical_format:
            C = C.copy()
            C.sum_duplicates()
        if _same_pattern(C, ref) and _same_pattern(ref, bound):   # the usual case: compare values directly
            return _ratio_max(np.abs(C.data.astype(np.float64) - ref.data), bound.data)
        D = (C.astype(np.float64) - ref).tocoo()
        if D.nnz == 0:
            return 0.0
        ncol = ref.shape[1]
        b = bound.tocoo()
        bkeys = b.row.astype(np.int64) * ncol + b.col
        order = np.argsort(bkeys)
        bkeys, bvals = bkeys[order], b.data[order]
        keys = D.row.astype(np.int64) * ncol + D.col
        pos = np.clip(np.searchsorted(bkeys, keys), 0, max(len(bkeys) - 1, 0))
        scale = np.where((len(bkeys) > 0) & (bkeys[pos] == keys), bvals[pos] if len(bvals) else 0.0, 0.0)
        diff = np.abs(D.data)
    else:
        diff = np.abs(np.asarray(C, dtype=np.float64) - ref).ravel()
        scale = np.asarray(bound, dtype=np.float64).ravel()
    return _ratio_max(diff, scale)


def _same_pattern(X, Y) -> bool:
    return X.nnz == Y.nnz and np.array_equal(X.indptr, Y.indptr) and np.array_equal(X.indices, Y.indices)


def _ratio_max(diff, scale) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / scale)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    return float(ratio.max()) if ratio.size else 0.0


__all__ = ["check_reference_fits", "reference", "tolerance", "max_error", "REFERENCE_HOST_FRACTION",
           "REFERENCE_BYTES_PER_NONZERO"]
