"""BRCP block layout (SEEDS section 4): block widths from the row lengths, and the arrays a kernel needs.

Rows are sorted by length, longest first (ties: lower original row first),
empty rows dropped (their y entries are zero). Blocks are H = BRCP_H rows
(one warp; one thread a *block row*) by V columns, V chosen per block when the
block starts, with T = brcp_T(mean, std) of the row lengths:

- ``V = ceil(nnz / BRCP_LONG_FACTOR)`` when the current row has more than
  ``BRCP_LONG_FACTOR * T`` nonzeros (nnz: all of that row's nonzeros);
- otherwise ``V = min(T, max(remaining nonzeros of the current row,
  nonzeros of the next row))``.

Elements are placed *row-major*: each block row holds up to V consecutive
nonzeros of one matrix row; a row longer than V continues in the next block
row (and on into the next block); the next row starts on a fresh block row.
*Padding* is what a block row leaves unfilled (a row's last piece shorter
than V, and the block rows past the last row in the last block): value 0 and
column -1, so a kernel skips it (``col < 0``) rather than reading x[0], which
could be Inf/NaN. Padding block rows have ``row_perm = -1`` and
``row_seg_len = 0``.

Storage: block b occupies ``H * width[b]`` slots starting at
``block_ptr[b]``; inside a block, column-major: element (r, c), block row r
and column c, is at ``block_ptr[b] + c * H + r`` (a warp's loads coalesce).
``row_perm[g]`` is the original row of global block row g = b * H + r;
``row_seg_len[g]`` is, at the head of each run of equal row_perm *inside one
block* (a warp), the run's length, else 0: the kernel's segmented sum adds a
run's block-row sums in a fixed order and the head does one atomicAdd. A row
split over two blocks gets two atomicAdds (a + b == b + a: deterministic when
y starts at 0); over three or more it is not, see ``max_blocks_per_row``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from matplan.core.xp import array_module
from matplan.models.spmv import BRCP_H, BRCP_LONG_FACTOR, brcp_T

#: First window (rows) of the speculative block scan in ``layout``; it doubles while widths repeat.
_SCAN_WINDOW = 64


# --- the rule, plainly (reference) ------------------------------------------------
def _check_lengths(lengths, name):
    a = np.asarray(lengths)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"{name}: expected a 1-D array of integer row lengths, got shape "
                        f"{a.shape} and dtype {a.dtype}")
    a = a.astype(np.int64)
    if a.size and a.min() < 0:
        raise ValueError(f"{name}: row lengths must be >= 0")
    return a


def _check_T(T):
    if isinstance(T, bool) or int(T) != T or T < 1:
        raise ValueError(f"T: expected an integer >= 1, got {T!r}")
    return int(T)


def reference_blocks(sorted_row_lengths, T: int, H: int = BRCP_H) -> list:
    """The blocks, one by one, straight from the rule (pure Python; for tests and small inputs).

    ``sorted_row_lengths``: nonzeros per row, in non-increasing order (rows
    already sorted); counting stops at the first empty row. Returns a list of
    (V, rows) per block, rows a list of H entries, each (row position in the
    sorted order, first nonzero of that row in this block row, count), or None
    for a padding block row.
    """
    L = _check_lengths(sorted_row_lengths, "sorted_row_lengths").tolist()
    T = _check_T(T)
    if any(a < b for a, b in zip(L, L[1:])):
        raise ValueError("sorted_row_lengths: expected non-increasing row lengths (sort rows first)")
    rows = next((i for i, v in enumerate(L) if v == 0), len(L))
    blocks, idx, done = [], 0, 0       # done: nonzeros of row idx already placed
    while idx < rows:
        nnz = L[idx]
        if nnz > BRCP_LONG_FACTOR * T:
            V = -(-nnz // BRCP_LONG_FACTOR)
        else:
            nxt = L[idx + 1] if idx + 1 < rows else 0
            V = min(T, max(nnz - done, nxt))
        block = []
        for _ in range(H):
            if idx >= rows:
                block.append(None)
                continue
            count = min(V, L[idx] - done)
            block.append((idx, done, count))
            done += count
            if done == L[idx]:
                idx, done = idx + 1, 0
        blocks.append((V, block))
    return blocks


def block_widths(sorted_row_lengths, T: int) -> list:
    """V of each block for rows already sorted by length (non-increasing), by the rule above."""
    return [V for V, _ in reference_blocks(sorted_row_lengths, T)]


# --- the layout, vectorised ---------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
    """BRCP arrays for one sparsity pattern (see the module docstring). Arrays live on ``xp``.

    order:        (m,)  original row of each position in the sorted row order
    row_perm:     (nblocks*H,) int32, original row of each block row, -1 for padding
    row_seg_len:  (nblocks*H,) int32, run length at each run head inside a block, else 0
    block_ptr:    (nblocks+1,) int64, first slot of each block; width = diff / H
    block_width:  (nblocks,) int64, V of each block (host NumPy)
    nnz_slot:     (nnz,) int64, slot of each nonzero, nonzeros in CSR order *after* the
                  row sort (row order[0]'s nonzeros first, each row's in its CSR order)
    """

    H: int
    T: int
    shape_rows: int
    nnz: int
    order: object
    row_perm: object
    row_seg_len: object
    block_ptr: object
    block_width: np.ndarray
    nnz_slot: object
    max_blocks_per_row: int

    @property
    def nblocks(self) -> int:
        return int(self.block_width.shape[0])

    @property
    def size(self) -> int:
        """Slots in the value/col arrays, padding included."""
        return int(self.H * self.block_width.sum())

    @property
    def deterministic(self) -> bool:
        """The paper's condition: no row split over more than two blocks (two atomicAdds commute)."""
        return self.max_blocks_per_row <= 2


def _block_starts(L, T: int, H: int):
    """Start (row position, nonzeros of it already placed) and width of every block; host NumPy.

    Sequential in principle (a block's width depends on where it starts).
    Speculates instead: assume the width V of the current block holds for the
    following ones, lay the rows of a window out with width V at once
    (block rows per row = ceil(remaining / V)), compute where each following
    block would start and the width the rule gives there, and accept the
    blocks up to the first disagreement. The loop runs about once per change
    of width, not once per block; the window doubles while widths repeat.
    """
    rows = int(L.shape[0])
    nxt = np.concatenate([L[1:], [0]])
    long_rows = L > BRCP_LONG_FACTOR * T
    long_V = -(-L // BRCP_LONG_FACTOR)

    def rule(j, done):
        return np.where(long_rows[j], long_V[j], np.minimum(T, np.maximum(L[j] - done, nxt[j])))

    starts_j, starts_c, widths = [], [], []
    j, c, window = 0, 0, max(_SCAN_WINDOW, 2 * H)   # a full window holds > H block rows
    while j < rows:
        V = int(rule(j, c))
        hi = min(rows, j + window)
        rem = L[j:hi].copy()
        rem[0] -= c
        brows = -(-rem // V)
        end = np.cumsum(brows)                      # block rows used through each row of the window
        total = int(end[-1])
        q = np.arange(1, -(-total // H), dtype=np.int64)   # following blocks starting inside the window
        s = q * H
        i = np.searchsorted(end, s, side="right")   # window row holding block row s
        before = np.where(i > 0, end[np.maximum(i - 1, 0)], 0)
        done = (s - before) * V + np.where(i == 0, c, 0)
        Vq = rule(j + i, done)
        bad = np.flatnonzero(Vq != V)
        if bad.size:
            n_ok = int(bad[0]) + 1                  # block 0 and the agreeing ones before it
            window = max(_SCAN_WINDOW, 2 * H)
        elif hi == rows:
            n_ok = int(q.size) + 1                  # everything up to the last row
        else:
            n_ok = int(q.size)                      # the last one may continue past the window
            window *= 2
        starts_j.append(j)
        starts_c.append(c)
        if n_ok > 1:
            starts_j.extend((j + i[:n_ok - 1]).tolist())
            starts_c.extend(done[:n_ok - 1].tolist())
        widths.extend([V] * n_ok)
        if n_ok - 1 < q.size:                       # the next block starts inside the window
            j, c = int(j + i[n_ok - 1]), int(done[n_ok - 1])
        else:
            j = rows
    return (np.asarray(starts_j, np.int64), np.asarray(starts_c, np.int64),
            np.asarray(widths, np.int64))


def _expand(counts_excl_cumsum, total, xp):
    """Owner of each of ``total`` items given each owner's first item (non-decreasing): searchsorted."""
    return xp.searchsorted(counts_excl_cumsum, xp.arange(total, dtype=xp.int64), side="right") - 1


def layout(row_lengths, T: int | None = None, xp=None) -> Layout:
    """The BRCP arrays for rows of the given lengths (any order; sorted here). See ``Layout``.

    ``T`` defaults to brcp_T(mean, std) of ``row_lengths`` (population std).
    ``xp`` is numpy or cupy (default: where ``row_lengths`` lives). The row
    sort and all per-row, per-block-row and per-nonzero arrays use ``xp``
    ops only (sort, cumsum, searchsorted, gathers); the block starts (the
    one sequential part, see ``_block_starts``) are computed on the host
    from the sorted row lengths, a loop over changes of block width.
    """
    if xp is None:
        xp = array_module(row_lengths)
    lengths = xp.asarray(row_lengths)
    if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
        raise TypeError(f"row_lengths: expected a 1-D array of integer row lengths, got shape "
                        f"{lengths.shape} and dtype {lengths.dtype}")
    lengths = lengths.astype(xp.int64)
    m = int(lengths.shape[0])
    if m and int(lengths.min()) < 0:
        raise ValueError("row_lengths: row lengths must be >= 0")
    if T is None:
        T = brcp_T(float(lengths.mean()), float(lengths.std())) if m else 1
    T, H = _check_T(T), BRCP_H
    # stable descending sort by a unique key: longest first, then lower row index
    key = (int(lengths.max()) - lengths) * max(m, 1) + xp.arange(m, dtype=xp.int64) if m else lengths
    order = xp.argsort(key)
    L_x = lengths[order]
    nnz = int(L_x.sum()) if m else 0
    L = np.asarray(L_x.get() if hasattr(L_x, "get") else L_x)
    rows = int(np.count_nonzero(L))
    bj, bc, bV = _block_starts(L[:rows], T, H)
    nb = int(bV.shape[0])
    block_ptr = xp.asarray(np.concatenate([[0], np.cumsum(H * bV)]).astype(np.int64))
    if nb == 0:
        empty = xp.zeros(0, dtype=xp.int32)
        return Layout(H, T, m, 0, order, empty, empty, block_ptr, bV,
                      xp.zeros(0, dtype=xp.int64), 0)

    # (block, row) pairs: each is one run of equal row_perm inside one block
    nj, nc = np.append(bj[1:], rows), np.append(bc[1:], 0)      # where the next block starts
    last = np.where(nc > 0, nj, nj - 1)                          # last row touching each block
    pairs_per_block = last - bj + 1
    pstart = xp.asarray(np.concatenate([[0], np.cumsum(pairs_per_block)[:-1]]))
    P = int(pairs_per_block.sum())
    pb = _expand(pstart, P, xp)                                  # block of each pair
    bj_x, bc_x, nj_x, nc_x, bV_x = (xp.asarray(a) for a in (bj, bc, nj, nc, bV))
    prow = bj_x[pb] + (xp.arange(P, dtype=xp.int64) - pstart[pb])   # sorted row position
    e0 = xp.where(prow == bj_x[pb], bc_x[pb], 0)
    e1 = xp.where((prow == nj_x[pb]) & (nc_x[pb] > 0), nc_x[pb], L_x[prow])
    V = bV_x[pb]
    nbr = (e1 - e0 + V - 1) // V                                 # block rows of each pair
    g0 = xp.cumsum(nbr) - nbr    # first block row; blocks are full but the last, so this is global
    used = int(nbr.sum())

    row_perm = xp.full(nb * H, -1, dtype=xp.int32)
    row_seg_len = xp.zeros(nb * H, dtype=xp.int32)
    gp = _expand(g0, used, xp)                                   # pair of each used block row
    row_perm[:used] = order[prow[gp]].astype(xp.int32)
    row_seg_len[g0] = nbr.astype(xp.int32)

    # slot of each nonzero (sorted CSR order)
    srow_ptr = xp.cumsum(L_x) - L_x
    first = srow_ptr[prow] + e0                                  # first nonzero of each pair
    tp = _expand(first, nnz, xp)
    off = xp.arange(nnz, dtype=xp.int64) - first[tp]
    Vt = V[tp]
    g = g0[tp] + off // Vt
    b = pb[tp]
    nnz_slot = block_ptr[b] + (off % Vt) * H + (g - b * H)

    max_blocks = int(xp.bincount(prow, minlength=rows).max())
    return Layout(H, T, m, nnz, order, row_perm, row_seg_len, block_ptr, bV, nnz_slot, max_blocks)


def sorted_source(lay: Layout, indptr, xp=None):
    """For each nonzero in the sorted CSR order, its position in the original CSR arrays."""
    xp = xp or _module_of(indptr)
    indptr = xp.asarray(indptr).astype(xp.int64)
    lengths = indptr[1:] - indptr[:-1]
    L_x = lengths[lay.order]
    srow_ptr = xp.cumsum(L_x) - L_x
    t = xp.arange(lay.nnz, dtype=xp.int64)
    j = xp.searchsorted(srow_ptr, t, side="right") - 1
    return indptr[lay.order[j]] + (t - srow_ptr[j])


def pack(lay: Layout, indptr, indices, data, xp=None):
    """(value, col) arrays of ``lay.size`` slots from CSR arrays: nonzeros scattered, padding 0 / -1."""
    xp = xp or _module_of(data)
    if int(indptr[-1]) != lay.nnz:
        raise ValueError(f"indptr: {int(indptr[-1])} nonzeros, but the layout was built for {lay.nnz}")
    src = sorted_source(lay, indptr, xp)
    value = xp.zeros(lay.size, dtype=data.dtype)
    col = xp.full(lay.size, -1, dtype=xp.int32)
    value[lay.nnz_slot] = data[src]
    col[lay.nnz_slot] = xp.asarray(indices)[src].astype(xp.int32)
    return value, col


def spmv_reference(lay: Layout, value, col, x, xp=None):
    """y = A @ x with the BRCP kernel's arithmetic order, emulated with array ops (for checking layouts).

    Per block row: sum over its columns c = 0..V-1 in order (padding skipped);
    per run: the run's block-row sums added in order; per row: the runs' sums
    added in block order (the kernel's atomicAdds, here in a fixed order).
    """
    xp = xp or _module_of(value)
    H, nb = lay.H, lay.nblocks
    y = xp.zeros(lay.shape_rows, dtype=value.dtype)
    if nb == 0:
        return y
    slots = xp.arange(lay.size, dtype=xp.int64)
    b = xp.searchsorted(lay.block_ptr, slots, side="right") - 1
    g = b * H + (slots - lay.block_ptr[b]) % H                  # block row of each slot
    live = col >= 0
    prod = xp.where(live, value * x[xp.where(live, col, 0)], 0)
    # bincount adds in slot order, i.e. c = 0..V-1 for each block row
    brow_sum = xp.bincount(g, weights=prod, minlength=nb * H)
    heads = xp.flatnonzero(lay.row_seg_len > 0)
    seg = xp.cumsum(lay.row_seg_len > 0) - 1                      # run of each block row
    seg_sum = xp.bincount(seg[lay.row_perm >= 0], weights=brow_sum[lay.row_perm >= 0],
                          minlength=int(heads.shape[0]))
    return y + xp.bincount(lay.row_perm[heads], weights=seg_sum,
                           minlength=lay.shape_rows).astype(value.dtype)


def _module_of(a):
    return array_module(a)
