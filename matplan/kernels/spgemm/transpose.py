"""A.T by one radix sort: the plain SpTRANS baseline of benchmarks/sptrans.py."""
from __future__ import annotations

from ...core.xp import cupy_module, cupyx_sparse


def transpose_sort(A):
    """CSR of A.T by one radix sort of the (column, row) keys: rows come out sorted in each column.

    A plain sort-based transpose, kept as a baseline for the segmented-merge one of SEEDS section 3
    (:func:`matplan.kernels.sptrans.transpose`).
    """
    cp = cupy_module()
    csp = cupyx_sparse()
    if not csp.isspmatrix_csr(A):
        raise TypeError(f"A: expected a cupyx.scipy.sparse.csr_matrix, got {type(A).__name__}")
    m, n = A.shape
    rows = cp.searchsorted(A.indptr[1:], cp.arange(A.indices.size, dtype=A.indptr.dtype), side="right")
    order = cp.argsort(A.indices.astype(cp.int64) * max(m, 1) + rows)
    counts = cp.bincount(A.indices, minlength=n)
    indptr = cp.zeros(n + 1, dtype=cp.int32)
    cp.cumsum(counts, out=indptr[1:])
    return csp.csr_matrix((A.data[order], rows[order].astype(cp.int32), indptr), shape=(n, m))
