"""SpTRANS on the GPU by the segmented merge of SEEDS section 3: CSR of A.T, rows sorted by column.

:func:`transpose` takes a cupyx CSR A (m x n, float32 or float64) and returns the cupyx CSR of
A.T (n x m) with two cooperative launches, one zeroed workspace and no host synchronisation
(the result is assembled with cupyx's ``_from_parts``, which does not read the arrays back;
cupyx's public ``csr_matrix((data, indices, indptr))`` waits for the GPU in CuPy 14.2). The
phases, separated by grid barriers (sptrans.cu has the details):

``spt_place`` (0) per-column counts by warp-aggregated atomics and each nonzero's rank among its
column's nonzeros, in the atomics' (arbitrary) order; (1) their scan in place: A.T's indptr, and
the longest column; (2) merge-path partition of (A's row ends, nonzeros), ITEMS steps a thread:
nonzero e of row i goes to slot indptr[col] + rank as the key (i << 32 | e).
``spt_sort`` (3) merge-path tiles of TILE steps over (A.T's row ends, slots), fixed work per
thread; each block sorts its slots by (row of A.T, key): per-thread sorts, then log2(BLOCK)
merge-path rounds in shared memory (a segmented merge: each row of A.T is a segment). Rows inside
a tile are final; a row crossing tiles leaves one sorted run per tile; (4) binary-tree rounds
over the crossing rows' runs, a grid barrier between rounds, every block taking whole tiles of
output slots (ITEMS outputs a thread), so one long row is merged by many blocks.

Keys order each row of A.T by row of A and then by position in A, so the transpose is stable and
deterministic: duplicated (i, j) entries of A stay separate entries of A.T, in A's order (SciPy's
``A.T.tocsr()`` keeps them too). The result has sorted indices; it is flagged canonical only when
A is (known to be) canonical. Indices must be int32 (int64 inputs are converted when every index,
the shape and nnz fit below 2^31; else OverflowError). Column indices out of [0, n) are skipped
without a memory fault; ``check=True`` raises on them (one host transfer, after the launches).
"""
from __future__ import annotations

import numpy as np

from .._xp import cupy_module
from . import _cuda
from .spgemm import check_csr, csr_from_parts

_CU = "sptrans.cu"
_NAMES = ("spt_place", "spt_sort<float>", "spt_sort<double>")
#: Must match SPT_BLOCK and SPT_ITEMS in sptrans.cu.
BLOCK, ITEMS = 256, 8
TILE = BLOCK * ITEMS
#: Phases of the two kernels (profiling runs one a launch): spt_place runs 0-2, spt_sort 3-4.
PHASES = ("count", "scan", "scatter", "tile_sort", "cross_merge")
_CTRL = 4   # barrier, bad-index flag, longest column, pad
INT32_MAX = int(np.iinfo(np.int32).max)


class _Kernels:
    """The two kernels of the current device and the most blocks each may have resident at once
    (a cooperative launch must not ask for more)."""

    def __init__(self, cp):
        from cupy_backends.cuda.api import driver
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        # the compiled functions (RawKernel.kernel): their launch takes enable_cooperative_groups
        self.place = _cuda.function(_CU, "spt_place", _NAMES).kernel
        self.sort = {ct: _cuda.function(_CU, f"spt_sort<{ct}>", _NAMES).kernel for ct in ("float", "double")}
        occ = driver.occupancyMaxActiveBlocksPerMultiprocessor
        self.place_cap = sms * occ(self.place.ptr, BLOCK, 0)
        self.sort_cap = {ct: sms * occ(f.ptr, BLOCK, 0) for ct, f in self.sort.items()}
        if self.place_cap < 1 or min(self.sort_cap.values()) < 1:
            raise RuntimeError(f"sptrans: no block of {BLOCK} threads fits on this GPU")


_KERNELS: dict = {}


def _kernels(cp):
    dev = cp.cuda.Device().id
    k = _KERNELS.get(dev)
    if k is None:
        k = _KERNELS[dev] = _Kernels(cp)
    return k


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

    check: verify A's column indices lie in [0, n) (waits for the GPU: one host transfer).
    """
    return _transpose(A, check, None)


def _transpose(A, check, mark):
    """transpose(); ``mark`` (profiling only): None, or called with each phase's name after that
    phase is launched, each phase then in a launch of its own."""
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
    ks = _kernels(cp)
    ct = _cuda.ctype(dtype)
    tiles = (n + nnz + TILE - 1) // TILE
    g_place = max(1, min(ks.place_cap, (nnz + BLOCK - 1) // BLOCK))
    g_sort = max(1, min(ks.sort_cap[ct], tiles))
    # one zeroed workspace: counts -> A.T's indptr [0, n], block totals, tile columns, control words
    totals_off = n + 1
    tile_x_off = totals_off + g_place
    ctrl_off = tile_x_off + tiles
    ws = cp.zeros(ctrl_off + _CTRL, dtype=cp.int32)
    # keys [0, nnz): scattered keys, later the merge scratch; [nnz, 2 nnz): ranks (int32), later runs
    keys = cp.empty(2 * nnz, dtype=cp.uint64)
    p_ws = ws.data.ptr
    p_rank = p_runs = keys.data.ptr + 8 * nnz
    place = (ks.place, g_place, (indptr_a, indices, np.int32(m), np.int32(n), np.int64(nnz), ws,
                                 np.int64(totals_off), np.int64(ctrl_off), np.uintp(p_rank), keys), 0, 3)
    _launch(place, mark)                       # runs while the outputs are allocated
    out_idx = cp.empty(nnz, dtype=cp.int32)
    out_val = cp.empty(nnz, dtype=dtype)
    sort = (ks.sort[ct], g_sort, (ws, np.int32(n), np.int64(nnz), A.data, keys, np.uintp(p_runs),
                                  np.uintp(p_ws + 4 * tile_x_off), np.uintp(p_ws + 4 * ctrl_off), out_idx, out_val),
            3, 5)
    _launch(sort, mark)
    if check and int(ws[ctrl_off + 1].get()):
        raise ValueError(f"A.indices: column indices outside [0, {n})")
    canonical = True if getattr(A, "_has_canonical_format", None) is True else None
    return csr_from_parts(out_val, out_idx, ws[:n + 1], (n, m), sorted_rows=True, canonical=canonical)


def _launch(kernel, mark):
    """Cooperative launch of (fn, grid, args, first phase, end phase): all its phases in one launch,
    or (profiling: ``mark`` given) one phase a launch, ``mark(name)`` after each."""
    fn, grid, args, lo, hi = kernel
    for a, b in ((lo, hi),) if mark is None else ((p, p + 1) for p in range(lo, hi)):
        fn((grid,), (BLOCK,), (*args, np.int32(a), np.int32(b)), enable_cooperative_groups=True)
        if mark is not None:
            mark(PHASES[a])


__all__ = ["transpose", "BLOCK", "ITEMS", "TILE", "PHASES"]
