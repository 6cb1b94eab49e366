"""Row-row SpGEMM by the segmented merge (SEEDS section 3): C = A @ B, deterministic.

Row i of C is the merge of the rows B[j, :] scaled by a_ij. :func:`spgemm_merge` expands every
product into a key (column << 32 | product index) and its value (``merge_expand``), sorts each
row's keys with the segmented merge that SpTRANS's ``method="merge"`` uses (``spt_sort`` of
sptrans/merge.cu: merge-path tiles, then binary-tree rounds over the rows that cross tiles, a fixed
number of outputs a thread however long the rows), then sums each row's runs of equal columns in
product order (``merge_starts`` and ``merge_heads`` mark each run's head, their scan gives its
place in C, ``merge_write`` sums and writes it, a thread a product). The same inputs give the
same bits on every run (no atomics on values), which the hash kernel (atomicAdd into tables)
does not promise: a plan asked for ``deterministic=True`` can take it.

It stores every product twice over (keys with the sort's scratch, values, the sorted columns and
values: 36 bytes a product in float64), so it needs fewer than 2^31 products (int32 row offsets)
and the memory for them (:data:`MEM_FRACTION` of the device's). Output rows sorted by column,
duplicates summed, products that cancel kept as explicit zeros (as SciPy and spgemm.hash keep
them); A and B may hold unsorted and duplicate column indices.

H100, float64 whole calls: 0.50x cuSPARSE and 0.27x spgemm.hash in geomean; metis 1.48 ms against
cuSPARSE's 1.54, Poisson 1.72 against 0.91, skewed 2.05 against 1.57 (6.9 ms when a warp a row
counted and wrote C). The sort is the cost: spt_sort sorts the keys from scratch, not merging the
presorted B rows the paper merges, and a row longer than a tile adds tree rounds with a grid
barrier each (ice40 and block-dense, 2.4e8 products: 53 and 73 ms). Merging the presorted rows
instead, in ceil(log2(widest row of A)) rounds of merge-path pairs over every product, was
1.5-1.8x slower. The planner's cost is matplan.models.spgemm.merge_cost.
"""
from __future__ import annotations

import numpy as np

from ...core.xp import cupy_module, cupyx_sparse
from ...models import spgemm as spgemm_model
from .. import _cuda
from ..registry import register
from ..sptrans import compiled as sptrans
import matplan.kernels.spgemm.operands as operands
import matplan.kernels.spgemm.rules as rules
import matplan.kernels.spgemm.runtime as runtime
from .kernel import SparseProduct

SOURCE = "spgemm/spgemm_merge.cu"
_NAMES = ("merge_rows", "merge_starts", "merge_heads", "merge_expand<float>", "merge_expand<double>",
          "merge_write<float>", "merge_write<double>")
#: Threads a block of the launches (merge_expand: a warp takes 32 nonzeros of A).
BLOCK = 256
#: Most of the device's memory the products' buffers may take (buffer_bytes).
MEM_FRACTION = 0.5


def _launcher(name: str):
    return _cuda.packed(_cuda.function(SOURCE, name, _NAMES), SOURCE, name.split("<")[0])


def _grid(n: int) -> tuple:
    """Blocks of BLOCK threads for n threads' work (the launches are grid-stride past 65535)."""
    return (max(1, min(-(-n // BLOCK), 65535)),)


def rounds_for(longest_row: int) -> int:
    """spt_sort's tree rounds for a row of this many products: log2 of its tiles, rounded up."""
    tiles = max(1, -(-int(longest_row) // sptrans.TILE))
    return (tiles - 1).bit_length()


def buffer_bytes(products: int, itemsize: int) -> int:
    """Device bytes of the products' buffers at their peak (the sort): keys and their scratch (16),
    values, sorted columns (4) and sorted values; the runs' heads and ranks come after the keys and
    values are freed."""
    return int(products) * (16 + 4 + 2 * itemsize)


def spgemm_merge(A, B):
    """C = A @ B (cupyx CSR, float32 or float64, int32 or int64 indices) by the row-row segmented
    merge; a cupyx CSR with sorted rows. OverflowError for 2^31 or more products, MemoryError when
    their buffers pass MEM_FRACTION of the device's memory."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("spgemm.merge needs CuPy and an NVIDIA GPU")
    operands.check_operands(A, B)
    A, B = operands.int32_operand("A", A), operands.int32_operand("B", B)
    m, k = A.shape[0], B.shape[1]
    dtype = np.dtype(A.dtype)
    nnz = int(A.indices.size)
    if m == 0 or k == 0 or nnz == 0 or B.nnz == 0:
        return cupyx_sparse().csr_matrix((m, k), dtype=dtype)
    csum = runtime._product_offsets(A, B)
    seg = cp.empty(m + 1, dtype=cp.int32)
    ctrl = _cuda.zeroed(sptrans._CTRL, cp.int32)   # spt_sort's control words: barrier, -, longest row
    _launcher("merge_rows")(_grid(m + 1), (BLOCK,), (A.indptr, csum, m, seg, ctrl.data.ptr + 4 * 2))
    products = int(_cuda.read_back(csum[nnz:])[0])
    if products == 0:
        return cupyx_sparse().csr_matrix((m, k), dtype=dtype)
    if products > rules.INT32_MAX:
        raise OverflowError(f"A @ B: {products:,} products; spgemm.merge needs fewer than 2^31 "
                            f"(int32 row offsets): use spgemm.hash")
    need = buffer_bytes(products, dtype.itemsize)
    if need > MEM_FRACTION * runtime._device_total_bytes():
        raise MemoryError(f"A @ B: {products:,} products need {need / 1e9:.1f} GB of buffers in spgemm.merge, "
                          f"past {MEM_FRACTION:.0%} of the device's memory: use spgemm.hash")
    ct = _cuda.ctype(dtype)
    keys = cp.empty(2 * products, dtype=cp.uint64)   # the keys, then the merge rounds' scratch
    vals = cp.empty(products, dtype=dtype)
    _launcher(f"merge_expand<{ct}>")(_grid(nnz), (BLOCK,),   # a warp takes 32 nonzeros
                                     (A.indices, A.data, nnz, B.indptr, B.indices, B.data, csum, keys, vals))
    col = cp.empty(products, dtype=cp.int32)
    val = cp.empty(products, dtype=dtype)
    ks = sptrans._kernels(cp)
    tiles = (m + products + sptrans.TILE - 1) // sptrans.TILE
    tile_x = cp.empty(tiles, dtype=cp.int32)
    sptrans._launch((ks.sort[ct], max(1, min(ks.sort_cap[ct], tiles)),
                     (seg, np.int32(m), np.int64(products), vals, keys, np.uintp(keys.data.ptr + 8 * products),
                      tile_x, ctrl, col, val), 3, 5), None)
    del keys, vals, tile_x
    # each run of equal columns in a row: its head (a row's first product, or a new column), the
    # heads' inclusive scan its place in C; a thread a product, whatever the rows' lengths
    heads = _cuda.zeroed(products, cp.int32)
    _launcher("merge_starts")(_grid(m), (BLOCK,), (seg, m, heads))
    _launcher("merge_heads")(_grid(products), (BLOCK,), (col, products, heads))
    rank = cp.cumsum(heads, dtype=cp.int32)
    del heads
    nnz_c = int(_cuda.read_back(rank[products - 1:])[0])
    Cp, Cp32 = cp.empty(m + 1, dtype=cp.int64), cp.empty(m + 1, dtype=cp.int32)
    Cj, Cx = cp.empty(nnz_c, dtype=cp.int32), cp.empty(nnz_c, dtype=dtype)
    _launcher(f"merge_write<{ct}>")(_grid(max(products, m + 1)), (BLOCK,),
                                    (seg, m, products, col, val, rank, Cp, Cp32, Cj, Cx))
    return operands.csr_from_parts(Cx, Cj, Cp32, (m, k), sorted_rows=True, canonical=True)


class MergeSpGEMM(SparseProduct):
    name = "spgemm.merge"
    ops = ("spgemm",)
    backend = "gpu"
    deterministic = True   # sorted by (column, product index), runs summed in that order
    reads_a_at_run = True

    def supports(self, f):
        if f.products >= rules.INT32_MAX:
            return f"{f.products:,} products: the row-row merge needs fewer than 2^31 (int32 row offsets)"
        return None

    def candidates(self, features, device):
        yield {}

    def cost(self, f, params, device):
        return spgemm_model.merge_cost(f, device, sptrans.TILE)

    def product(self, A, B, params):
        return spgemm_merge(A, B)


register(MergeSpGEMM())

__all__ = ["spgemm_merge", "MergeSpGEMM", "buffer_bytes", "rounds_for"]
