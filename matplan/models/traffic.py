"""Bytes each product must move through memory: the common floor of the analytic costs.

Counts assume each input read once and each output written once; the x/B
gathers of sparse products are counted once per distinct element (L2-resident),
which is what a well-behaved kernel achieves on the matrices we target.
"""
from __future__ import annotations

import numpy as np

from ..core.features import RBS_COMPRESSION, RBS_GROUP_BOUNDS


def itemsize(f) -> int:
    return np.dtype(f.dtype).itemsize


def index_size(f) -> int:
    return np.dtype(f.index_dtype or "int32").itemsize


def csr_bytes(f) -> float:
    """CSR A: values, indices, indptr."""
    v, i = itemsize(f), index_size(f)
    return f.nnz * (v + i) + (f.m + 1) * i


def dense_bytes(f) -> float:
    """Dense B (n x k) read once and C (m x k) written once."""
    return (f.n + f.m) * f.k * itemsize(f)


def csr_spmm_bytes(f) -> float:
    """CSR A + B (n x k) + C (m x k)."""
    return csr_bytes(f) + dense_bytes(f)


def column_major_gathers_missed(f, l2_bytes) -> float:
    """Expected gathers of a column-major B (n x k, k > 1) that miss L2 in a CSR SpMM: each
    nonzero reads k elements from k columns; they miss in proportion to how far the columns
    wander (3 x ``f.col_spread``, 1 for uniformly random columns) and to how much of B outgrows L2."""
    if f.k <= 1 or l2_bytes <= 0:
        return 0.0
    wander = min(1.0, 3.0 * f.col_spread)
    outgrown = min(1.0, f.n * f.k * itemsize(f) / l2_bytes)
    return f.nnz * f.k * wander * outgrown


def spgemm_nnz_c(f) -> float:
    """Expected nonzeros of C = A·B: products / the sampled compression ratio
    (``Features.compression``; pi where none was sampled), at most m x k."""
    ratio = f.compression if f.compression > 0 else RBS_COMPRESSION
    return min(f.products / ratio, float(f.m) * f.k)


def spgemm_long_row_nnz(f) -> float:
    """Expected nonzeros of C in the rows of the top RBSparse group (alpha = nnz_RowCt / pi of at
    least RBS_GROUP_BOUNDS[-1]): the products the lower groups cannot hold (each at least its
    group's lower bound), over the compression, at most spgemm_nnz_c. 0 when no row is in that
    group."""
    groups = tuple(f.rbs_groups)
    if not groups or not groups[-1]:
        return 0.0
    lower = RBS_COMPRESSION * sum(n * lo for n, lo in zip(groups[:-1], RBS_GROUP_BOUNDS[:-1]))
    ratio = f.compression if f.compression > 0 else RBS_COMPRESSION
    return min(max(0.0, f.products - lower) / ratio, spgemm_nnz_c(f))


def for_dtype(table: dict, f):
    """``table``'s fitted figure for f's dtype (a dtype it lacks takes float64's)."""
    return table.get(str(f.dtype), table["float64"])


def spgemm_fitted_bytes(f, per_dtype: dict) -> tuple:
    """(bytes, per product, per nonzero of C) of a SpGEMM kernel's fitted effective bytes:
    ``per_dtype`` maps a dtype name to (bytes per product, bytes per expected nonzero of C);
    a dtype it lacks takes float64's."""
    per_product, per_output = for_dtype(per_dtype, f)
    return f.products * per_product + spgemm_nnz_c(f) * per_output, per_product, per_output


def spgemm_bytes(f) -> float:
    """A, B read once, each product's B row gathered, C written."""
    v, i = itemsize(f), index_size(f)
    return (f.nnz + f.nnz_b + f.products + spgemm_nnz_c(f)) * (v + i)


def dense_gemm_bytes(f) -> float:
    v = itemsize(f)
    return (f.m * f.n + f.n * f.k + f.m * f.k) * v


def dense_gemm_flops(f) -> float:
    return 2.0 * f.m * f.n * f.k
