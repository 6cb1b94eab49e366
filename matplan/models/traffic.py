"""Bytes each product must move through memory: the common floor of the analytic costs.

Counts assume each input read once and each output written once; the x/B
gathers of sparse products are counted once per distinct element (L2-resident),
which is what a well-behaved kernel achieves on the matrices we target.
"""
from __future__ import annotations

import functools

import numpy as np

from ..core.features import RBS_COMPRESSION


def itemsize(f) -> int:
    return _bytes_of(f.dtype)


def index_size(f) -> int:
    return _bytes_of(f.index_dtype or "int32")


@functools.lru_cache(maxsize=64)
def _bytes_of(dtype) -> int:
    """Bytes of one element of ``dtype``, kept: the analytic costs of one plan ask some 30 times."""
    return np.dtype(dtype).itemsize


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


def for_dtype(table: dict, f):
    """``table``'s fitted figure for f's dtype (a dtype it lacks takes float64's)."""
    return table.get(str(f.dtype), table["float64"])


def spgemm_bytes(f) -> float:
    """A, B read once, each product's B row gathered, C written."""
    v, i = itemsize(f), index_size(f)
    return (f.nnz + f.nnz_b + f.products + spgemm_nnz_c(f)) * (v + i)


def dense_gemm_bytes(f) -> float:
    v = itemsize(f)
    return (f.m * f.n + f.n * f.k + f.m * f.k) * v


def dense_gemm_flops(f) -> float:
    return 2.0 * f.m * f.n * f.k
