"""SpTRANS on the GPU by the segmented merge of SEEDS section 3: CSR of A.T, rows sorted by column.

:func:`transpose` takes a cupyx CSR A (m x n, float32 or float64) and returns the cupyx CSR of
A.T (n x m) in four launches and one CuPy scan, with no host synchronisation of ours (nnz(A.T) = nnz(A); cupyx's csr_matrix constructor,
which wraps the result, does wait for the GPU in CuPy 14.2):

1. ``count_rank``: per-column counts by atomics (one atomic per column per warp, ``__match_any``)
   and each nonzero's rank among its column's nonzeros, in the atomics' (arbitrary) order;
2. ``cupy.cumsum`` of the counts: A.T's indptr;
3. ``scatter_keys``: merge-path partition of (A's row ends, nonzeros), 8 steps a thread; nonzero
   e of row i goes to slot indptr[col] + rank as the key (i << 32 | e);
4. ``tile_sort``: merge-path tiles of 2048 steps over (A.T's row ends, slots), fixed work per
   thread; each block sorts its slots by (row of A.T, key): per-thread sorts, then 8 merge-path
   rounds in shared memory (a segmented merge: each row of A.T is a segment). Rows of A.T inside
   the tile are final; a row crossing tiles leaves one sorted run per tile;
5. ``cross_merge``: the block of the tile holding a crossing row's start merges its runs pairwise
   in binary-tree rounds (merge path, 8 outputs per thread per step) and writes the row.

Keys order each row of A.T by row of A and then by position in A, so the transpose is stable:
duplicated (i, j) entries of A stay separate entries of A.T, in A's order (SciPy's ``A.T.tocsr()``
keeps them too). The result has sorted indices; it is flagged canonical only when A is (known
to be) canonical. Indices must be int32 (int64 inputs are converted when every index, the shape
and nnz fit below 2^31; else OverflowError). Column indices out of [0, n) are skipped without a
memory fault; ``check=True`` raises on them (one host transfer).
"""
from __future__ import annotations

import numpy as np

from .._xp import cupy_module
from . import _cuda
from .spgemm import check_csr

_CU = "sptrans.cu"
_NAMES = ("count_rank", "scatter_keys", "tile_sort<float>", "tile_sort<double>",
          "cross_merge<float>", "cross_merge<double>")
#: Must match SPT_BLOCK, SPT_ITEMS, SPT_MERGE_BLOCK in sptrans.cu.
BLOCK, ITEMS, MERGE_BLOCK = 256, 8, 512
TILE = BLOCK * ITEMS
COUNT_BLOCK = 256
INT32_MAX = int(np.iinfo(np.int32).max)


def _fn(name):
    return _cuda.function(_CU, name, _NAMES)


def _int32_arrays(A):
    """A's indptr and indices as int32 arrays, or OverflowError naming the 2^31 - 1 limit."""
    cp = cupy_module()
    m, n = A.shape
    nnz = int(A.indices.size)
    if max(m, n, nnz) > INT32_MAX:
        raise OverflowError(f"A: shape {A.shape} with {nnz:,} nonzeros; sptrans needs rows, columns "
                            f"and nonzeros below 2^31 - 1 (int32 indices and keys)")
    indptr, indices = A.indptr, A.indices
    if indptr.dtype != cp.int32:
        indptr = indptr.astype(cp.int32)
    if indices.dtype != cp.int32:
        indices = indices.astype(cp.int32)
    return indptr, indices


def transpose(A, *, check: bool = False):
    """CSR of A.T (cupyx), rows sorted by column; see the module docstring.

    check: verify A's column indices lie in [0, n) (costs one host transfer); False skips it.
    """
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("sptrans needs CuPy and an NVIDIA GPU")
    import cupyx.scipy.sparse as csp
    check_csr("A", A)
    m, n = A.shape
    dtype = np.dtype(A.dtype)
    indptr_a, indices = _int32_arrays(A)
    nnz = int(indices.size)
    if nnz == 0 or m == 0 or n == 0:
        return csp.csr_matrix((n, m), dtype=dtype)
    data = A.data
    counts = cp.zeros(n + 2, dtype=cp.int32)      # counts[1 + j]; counts[n + 1]: out-of-range flag
    rank = cp.empty(nnz, dtype=cp.int32)
    _fn("count_rank")(((nnz + COUNT_BLOCK - 1) // COUNT_BLOCK,), (COUNT_BLOCK,),
                      (indices, np.int64(nnz), np.int32(n), counts, rank, counts[n + 1:]))
    if check and int(counts[n + 1].get()):
        raise ValueError(f"A.indices: column indices outside [0, {n})")
    indptr_t = cp.cumsum(counts[:n + 1], dtype=cp.int32)
    keys = cp.empty(2 * nnz, dtype=cp.uint64)      # [0, nnz): scattered keys, then cross_merge scratch
    keys0, runs = keys[:nnz], keys[nnz:]
    grid = (m + nnz + TILE - 1) // TILE
    _fn("scatter_keys")((grid,), (BLOCK,), (indptr_a, indices, np.int32(m), np.int64(nnz), indptr_t,
                                            rank, np.int32(n), keys0))
    out_idx = cp.empty(nnz, dtype=cp.int32)
    out_val = cp.empty(nnz, dtype=dtype)
    ct = _cuda.ctype(dtype)
    tiles = (n + nnz + TILE - 1) // TILE
    _fn(f"tile_sort<{ct}>")((tiles,), (BLOCK,), (indptr_t, np.int32(n), np.int64(nnz), keys0, data,
                                                  runs, out_idx, out_val))
    _fn(f"cross_merge<{ct}>")((tiles,), (MERGE_BLOCK,), (indptr_t, np.int32(n), np.int64(nnz), runs, keys0,
                                                          data, out_idx, out_val))
    T = csp.csr_matrix((out_val, out_idx, indptr_t), shape=(n, m))
    try:  # flags only (no check kernel): sorted always, canonical when A is known to be
        T.has_sorted_indices = True
        if getattr(A, "_has_canonical_format", None) is True:
            T.has_canonical_format = True
    except AttributeError:
        pass
    return T


__all__ = ["transpose", "BLOCK", "ITEMS", "TILE"]
