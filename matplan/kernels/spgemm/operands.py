"""The operands' checks (cupyx CSR, float32 or float64, conforming, int32 indices) and a cupyx
CSR built from GPU arrays without a host synchronisation; SpTRANS uses them too."""
from __future__ import annotations

import numpy as np

from ...core.xp import cupyx_sparse
import matplan.kernels.spgemm.rules as rules


def check_csr(name: str, M):
    """Raise naming ``name`` unless M is a cupyx CSR matrix of float32 or float64 (SpGEMM, SpTRANS)."""
    csp = cupyx_sparse()
    if not csp.isspmatrix_csr(M):
        raise TypeError(f"{name}: expected a cupyx.scipy.sparse.csr_matrix, got {type(M).__name__}")
    if np.dtype(M.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{name}: dtype {M.dtype} is not supported; expected float32 or float64")


def csr_from_parts(data, indices, indptr, shape, *, sorted_rows: bool, canonical):
    """A cupyx CSR of these GPU arrays without reading them back: ``_from_parts`` (cupyx >= 14)
    checks only sizes and dtypes; the public constructor, used where that is missing, reads
    indptr's ends from the GPU (a host synchronisation). canonical: True, or None (not known)."""
    csp = cupyx_sparse()
    from_parts = getattr(csp.csr_matrix, "_from_parts", None)
    if from_parts is not None:
        return from_parts(data, indices, indptr, shape, has_canonical_format=canonical,
                          has_sorted_indices=sorted_rows or None)
    M = csp.csr_matrix((data, indices, indptr), shape=shape)
    if sorted_rows:
        M.has_sorted_indices = True
    if canonical:
        M.has_canonical_format = True
    return M


def check_operands(A, B):
    """Raise naming the argument unless A, B are cupyx CSR matrices of one float dtype that conform."""
    check_csr("A", A)
    check_csr("B", B)
    if A.dtype != B.dtype:
        raise TypeError(f"A and B: dtypes differ ({A.dtype} vs {B.dtype}); cast one of them")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A and B do not conform: A is {A.shape[0]}x{A.shape[1]}, B has {B.shape[0]} rows")


def int32_operand(name: str, M):
    """M with int32 indices and indptr, which the kernels read (``int*``).

    CuPy >= 14.1 keeps int64 indices where a matrix was built with them; those that fit are copied
    to int32 here. A matrix past the int32 range (nnz or a dimension above 2^31 - 1) is refused:
    the hash kernels index A, B and C's columns with 32-bit integers.
    """
    csp = cupyx_sparse()
    if max(M.nnz, *M.shape) > rules.INT32_MAX:
        sizes = (("nnz", M.nnz), ("rows", M.shape[0]), ("columns", M.shape[1]))
        too_big = [f"{what} {v:,}" for what, v in sizes if v > rules.INT32_MAX]
        raise ValueError(f"{name}: {', '.join(too_big)} past 2^31 - 1 = {rules.INT32_MAX:,}; spgemm.hash indexes "
                         f"A, B and C's columns with int32 (split {name} into blocks of fewer nonzeros)")
    for what in ("indices", "indptr"):
        dt = np.dtype(getattr(M, what).dtype)
        if dt.kind not in "iu":
            raise TypeError(f"{name}.{what}: expected an integer array, got {dt}")
    if M.indices.dtype == np.int32 and M.indptr.dtype == np.int32:
        return M
    return csp.csr_matrix((M.data, M.indices.astype(np.int32), M.indptr.astype(np.int32)), shape=M.shape)

