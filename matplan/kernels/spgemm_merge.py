"""Row-row SpGEMM by the segmented merge (SEEDS section 3): C = A @ B, deterministic.

Row i of C is the merge of the rows B[j, :] scaled by a_ij. :func:`spgemm_merge` expands every
product in place (``merge_expand``): row i's products at its offset, as q_i sorted sub-segments,
the rows of B its q_i nonzeros select (B's rows are sorted first where one is not). Rounds of
``merge_round`` then merge the sub-segments pairwise, 1, 2, 4, ... nonzeros of A at a time,
ceil(log2(the widest row of A)) rounds, each a fixed number of outputs a thread over all products
(a merge-path search into its pair), ties to the earlier sub-segment. Each run of equal columns is
then summed in product order (``merge_starts`` and ``merge_heads`` mark the runs' heads, their scan
places each in C, ``merge_write`` sums and writes it, a thread a product). The same inputs give
the same bits on every run (no atomics on values), which the hash kernel (atomicAdd into tables)
does not promise: a plan asked for ``deterministic=True`` can take it.

It holds every product twice (two buffers of columns and values the rounds alternate between: 24
bytes a product in float64), so it needs fewer than 2^31 products (int32 row offsets) and the
memory for them (:data:`MEM_FRACTION` of the device's). Output rows sorted by column, duplicates
summed, products that cancel kept as explicit zeros (as SciPy and spgemm.hash keep them); A and B
may hold unsorted and duplicate column indices.

History (H100, 2026-11-24, float64 whole calls, benchmarks/spgemm.py): the first version sorted
every row's (column, product) keys with SpTRANS's segmented sort (sptrans.cu spt_sort) instead of
merging the presorted rows of B: 0.45-0.50x cuSPARSE, 0.22-0.27x spgemm.hash, Poisson 1.72 ms,
ice40 53, block-dense 73 (gpu-tests-spgemm-merge-h100-2026-11-24-05a1c62.log).
"""
from __future__ import annotations

import numpy as np

from .._xp import cupy_module, cupyx_sparse
from . import _cuda, spgemm
from .base import Cost, Kernel, Prepared
from .registry import register

SOURCE = "spgemm_merge.cu"
_NAMES = ("merge_rows", "merge_check_b", "merge_rowof", "merge_starts", "merge_heads",
          "merge_expand<float>", "merge_expand<double>", "merge_round<float>", "merge_round<double>",
          "merge_write<float>", "merge_write<double>")
#: Outputs a thread of a merge round (spgemm_merge.cu MERGE_ITEMS).
ITEMS = 8
#: Threads a block of the launches (merge_expand: a warp takes 32 nonzeros of A).
BLOCK = 256
#: Most of the device's memory the products' buffers may take (buffer_bytes).
MEM_FRACTION = 0.5
#: The planner's cost: FIXED_S + products x BYTES_PER_PRODUCT x (2 + the rounds, ceil(log2 of the
#: widest row of A)) at the copy bandwidth: the expansion and the compression, then a pass over
#: every product a round (read and written: columns and values). First figures, to be refitted
#: from benchmarks/spgemm.py's merge_ms.
FIXED_S = 0.45e-3
BYTES_PER_PRODUCT = 40.0


def _launcher(name: str):
    return _cuda.packed(_cuda.function(SOURCE, name, _NAMES), SOURCE, name.split("<")[0])


def rounds_for(widest_row: int) -> int:
    """Merge rounds for a row of A of this many nonzeros: ceil(log2), 0 for one or none."""
    return (max(int(widest_row), 1) - 1).bit_length()


def buffer_bytes(products: int, itemsize: int) -> int:
    """Device bytes of the products' buffers at their peak (the rounds): two of columns and values."""
    return int(products) * 2 * (4 + itemsize)


def spgemm_merge(A, B):
    """C = A @ B (cupyx CSR, float32 or float64, int32 or int64 indices) by the row-row segmented
    merge; a cupyx CSR with sorted rows. OverflowError for 2^31 or more products, MemoryError when
    their buffers pass MEM_FRACTION of the device's memory."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("spgemm.merge needs CuPy and an NVIDIA GPU")
    spgemm.check_operands(A, B)
    A, B = spgemm.int32_operand("A", A), spgemm.int32_operand("B", B)
    m, k = A.shape[0], B.shape[1]
    dtype = np.dtype(A.dtype)
    nnz = int(A.indices.size)
    if m == 0 or k == 0 or nnz == 0 or B.nnz == 0:
        return cupyx_sparse().csr_matrix((m, k), dtype=dtype)
    grid = lambda n: (max(1, min(-(-n // BLOCK), 65535)),)   # noqa: E731  grid-stride launches
    csum = spgemm._product_offsets(A, B)
    seg = cp.empty(m + 1, dtype=cp.int32)
    stats = cp.zeros(3, dtype=cp.uint64)   # products, most nonzeros in a row of A, B unsorted
    _launcher("merge_rows")(grid(m + 1), (BLOCK,), (A.indptr, csum, m, seg, stats))
    _launcher("merge_check_b")(grid(B.shape[0]), (BLOCK,), (B.indptr, B.indices, B.shape[0], stats))
    products, widest, unsorted = (int(v) for v in stats.get())
    if products == 0:
        return cupyx_sparse().csr_matrix((m, k), dtype=dtype)
    if products > spgemm.INT32_MAX:
        raise OverflowError(f"A @ B: {products:,} products; spgemm.merge needs fewer than 2^31 "
                            f"(int32 row offsets): use spgemm.hash")
    need = buffer_bytes(products, dtype.itemsize)
    if need > MEM_FRACTION * spgemm._device_total_bytes():
        raise MemoryError(f"A @ B: {products:,} products need {need / 1e9:.1f} GB of buffers in spgemm.merge, "
                          f"past {MEM_FRACTION:.0%} of the device's memory: use spgemm.hash")
    if unsorted:   # the rows of B are the sub-segments merged: sorted (cuSPARSE csrsort, duplicates kept)
        B = B.copy()
        B.sort_indices()
    ct = _cuda.ctype(dtype)
    rowof = cp.empty(nnz, dtype=cp.int32)
    _launcher("merge_rowof")(grid(m), (BLOCK,), (A.indptr, m, rowof))
    bufs = [(cp.empty(products, dtype=cp.int32), cp.empty(products, dtype=dtype)) for _ in range(2)]
    _launcher(f"merge_expand<{ct}>")(grid(nnz), (BLOCK,),
                                     (A.indices, A.data, nnz, B.indptr, B.indices, B.data, csum, *bufs[0]))
    merge = _launcher(f"merge_round<{ct}>")
    rounds = rounds_for(widest)   # sub-segments of 1, 2, 4, ... nonzeros of A
    for r in range(rounds):
        merge(grid(-(-products // ITEMS)), (BLOCK,), (csum, A.indptr, rowof, nnz, products, r,
                                                     *bufs[r % 2], *bufs[(r + 1) % 2]))
    col, val = bufs[rounds % 2]
    del bufs, rowof
    # each run of equal columns in a row: its head (a row's first product, or a new column), the
    # heads' inclusive scan its place in C; a thread a product, whatever the rows' lengths
    heads = cp.zeros(products, dtype=cp.int32)
    _launcher("merge_starts")(grid(m), (BLOCK,), (seg, m, heads))
    _launcher("merge_heads")(grid(products), (BLOCK,), (col, products, heads))
    rank = cp.cumsum(heads, dtype=cp.int32)
    del heads
    nnz_c = int(rank[products - 1].get())
    Cp, Cp32 = cp.empty(m + 1, dtype=cp.int64), cp.empty(m + 1, dtype=cp.int32)
    Cj, Cx = cp.empty(nnz_c, dtype=cp.int32), cp.empty(nnz_c, dtype=dtype)
    _launcher(f"merge_write<{ct}>")(grid(max(products, m + 1)), (BLOCK,),
                                    (seg, m, products, col, val, rank, Cp, Cp32, Cj, Cx))
    return spgemm.csr_from_parts(Cx, Cj, Cp32, (m, k), sorted_rows=True, canonical=True)


class MergeSpGEMM(Kernel):
    name = "spgemm.merge"
    ops = ("spgemm",)
    backend = "gpu"
    deterministic = True   # merged with ties to the earlier sub-segment, runs summed in that order
    reads_a_at_run = True

    def supports(self, f):
        if f.products >= spgemm.INT32_MAX:
            return f"{f.products:,} products: the row-row merge needs fewer than 2^31 (int32 row offsets)"
        return None

    def candidates(self, features, device):
        yield {}

    def cost(self, f, params, device):
        rounds = rounds_for(f.row_max)
        t = FIXED_S + f.products * BYTES_PER_PRODUCT * (2 + rounds) / device.mem_bandwidth
        return Cost(0.0, t, f"row-row segmented merge (deterministic): {f.products:,} products expanded in "
                            f"place, {rounds} merge round(s) for A's widest row ({f.row_max:,} nonzeros), "
                            f"~{BYTES_PER_PRODUCT:.0f} B a product a pass at the copy bandwidth + "
                            f"{FIXED_S * 1e3:.2f} ms fixed")

    def prepare(self, A, params):
        return Prepared(self.name, dict(params), {"A": A}, A.shape, A.dtype)

    def run(self, prepared, B, out=None):
        if out is not None:
            raise ValueError("out: not supported for spgemm (the output's sparsity is not known in advance)")
        return spgemm_merge(prepared.arrays["A"], B)


register(MergeSpGEMM())

__all__ = ["spgemm_merge", "MergeSpGEMM", "buffer_bytes", "rounds_for"]
