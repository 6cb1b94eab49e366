"""NumPy port of SpTRANS's radix method (matplan/kernels/sptrans/radix.cu, ``radix_transpose``):
spt_digits' histograms and tiles' first rows, the passes tile by tile (the first pass's rows by a
max-scan, stable ranks by warp, the look-back's earlier-tile counts), spt_bounds' indptr from the
sorted columns. The tile, the warps and the digit bits are arguments so tests reach many tiles and
passes on small matrices; ``rng`` orders the tiles as the GPU's blocks may start."""
from __future__ import annotations

import numpy as np


def radix_pass(cols, rows, vals, shift, bits, hist, tile, warps, rng):
    """spt_radix_pass over keys (cols, rows, vals) in their current order: per tile of ``tile``
    keys, the stable rank of each key among the tile's keys of its digit (warp w takes the w-th of
    ``warps`` consecutive parts, each warp's running count per digit, then exclusive over warps),
    the digit's count in earlier tiles (what the decoupled look-back sums; the tiles are visited in
    a random order of tickets, as the GPU's blocks may start) and the digit's global start (the
    exclusive scan of ``hist``). Returns the keys at their new slots."""
    mask = (1 << bits) - 1
    digit = (cols >> shift) & mask
    start = np.concatenate([[0], np.cumsum(hist[:mask + 1])])[:-1]
    n = cols.size
    tiles = -(-n // tile)
    counts = np.zeros((tiles, mask + 1), np.int64)           # each tile's digit counts
    for t in range(tiles):
        counts[t] = np.bincount(digit[t * tile:(t + 1) * tile], minlength=mask + 1)
    before = np.cumsum(counts, axis=0) - counts               # earlier tiles' counts (the look-back)
    pos = np.empty(n, np.int64)
    for t in rng.permutation(tiles):                          # blocks in any order: the result is the same
        d = digit[t * tile:(t + 1) * tile]
        part = -(-tile // warps)
        wcnt = np.zeros((warps, mask + 1), np.int64)
        rank = np.empty(d.size, np.int64)
        for w in range(warps):                                # each warp's keys in order
            for q in range(w * part, min((w + 1) * part, d.size)):
                rank[q] = wcnt[w, d[q]]
                wcnt[w, d[q]] += 1
        wstart = np.cumsum(wcnt, axis=0) - wcnt               # exclusive over warps
        w_of = np.arange(d.size) // part
        pos[t * tile:t * tile + d.size] = start[d] + before[t, d] + wstart[w_of, d] + rank
    assert np.array_equal(np.sort(pos), np.arange(n)), "the slots must be a permutation"
    out = [np.empty_like(x) for x in (cols, rows, vals)]
    for o, x in zip(out, (cols, rows, vals)):
        o[pos] = x
    return out


def radix_digits(indptr, indices, n, passes, bits, tile):
    """spt_digits: (each pass's digit histogram over the valid entries, their count, whether an
    index is outside [0, n), tile_rows: the row of entry t * tile for each tile t, then that of
    the last entry). Rows by a thread each, as the kernel: every nonempty row writes the tiles
    that start in it."""
    cols = np.asarray(indices, np.int64)
    nnz = cols.size
    ok = (cols >= 0) & (cols < n)
    mask = (1 << bits) - 1
    hist = np.stack([np.bincount((cols[ok] >> (p * bits)) & mask, minlength=mask + 1) for p in range(passes)])
    tiles = -(-nnz // tile)
    tile_rows = np.full(tiles + 1, -1, np.int64)
    for r in range(len(indptr) - 1):
        lo, hi = int(indptr[r]), int(indptr[r + 1])
        t = -(-lo // tile)
        while t * tile < hi:
            tile_rows[t] = r
            t += 1
        if hi == nnz and hi > lo:
            tile_rows[tiles] = r
    return hist, int(ok.sum()), bool((~ok).any()), tile_rows


def radix_first_rows(indptr, tile_rows, t, tile, nnz):
    """The first pass's rows of tile t's entries: each nonempty row among tile_rows[t] ..
    tile_rows[t + 1] marks its first slot in the tile, an inclusive max-scan carries the marks
    forward (the kernel's per-thread runs and block_exclusive_max give the same)."""
    t0 = t * tile
    mark = np.full(tile, -1, np.int64)
    for r in range(int(tile_rows[t]), int(tile_rows[t + 1]) + 1):
        lo, hi = int(indptr[r]), int(indptr[r + 1])
        if hi > lo and hi > t0 and lo < t0 + tile:
            mark[max(lo, t0) - t0] = r
    rows = np.maximum.accumulate(mark)
    return rows[:min(tile, nnz - t0)]


def radix_bounds(sorted_cols, live, n, tile=2048, run=32):
    """spt_bounds: indptr[j] = the valid entries of columns below j, written by position p in
    [0, live] for the columns in (sorted_cols[p - 1], sorted_cols[p]] (-1 before, n after); runs
    longer than ``run`` by the position's block after its positions (the order changes nothing:
    every column is written once, which the port checks)."""
    indptr = np.full(n + 1, -1, np.int64)
    written = np.zeros(n + 1, np.int64)
    for p0 in range(0, live + 1, tile):
        runs = []
        for p in range(p0, min(p0 + tile, live + 1)):
            lo = int(sorted_cols[p - 1]) if p > 0 else -1
            hi = int(sorted_cols[p]) if p < live else n
            if hi - lo <= run:
                indptr[lo + 1:hi + 1] = p
                written[lo + 1:hi + 1] += 1
            else:
                runs.append((lo + 1, hi, p))
        for lo, hi, p in runs:
            indptr[lo:hi + 1] = p
            written[lo:hi + 1] += 1
    assert np.all(written == 1), "every column written once"
    return indptr


def radix_transpose(A, rng, tile=2048, warps=8, max_bits=8):
    """CSR of A.T by the radix method's NumPy port: spt_digits' histograms and tiles' first rows,
    the first pass's rows by tile (radix_first_rows), ceil(bits / max_bits) passes, least
    significant digit first, over keys (column, row, value) in A's order, and A.T's indptr from
    the sorted columns (radix_bounds). Columns outside [0, n) are dropped, as the kernels skip
    them."""
    import scipy.sparse as sp
    m, n = A.shape
    indptr = np.asarray(A.indptr, np.int64)
    nnz = int(indptr[-1])
    if nnz == 0 or m == 0 or n == 0:
        return sp.csr_matrix((n, m), dtype=A.dtype)
    cols = np.asarray(A.indices[:nnz], np.int64)
    total_bits = max(1, int(n - 1).bit_length())
    passes = -(-total_bits // max_bits)
    bits = -(-total_bits // passes)
    hist, live, _, tile_rows = radix_digits(indptr, cols, n, passes, bits, tile)
    rows = np.concatenate([radix_first_rows(indptr, tile_rows, t, tile, nnz) for t in range(-(-nnz // tile))])
    np.testing.assert_array_equal(rows, np.repeat(np.arange(m), np.diff(indptr)))
    vals = np.asarray(A.data[:nnz])
    keep = (cols >= 0) & (cols < n)
    cols, rows, vals = cols[keep], rows[keep], vals[keep]
    assert cols.size == live
    for p in range(passes):
        cols, rows, vals = radix_pass(cols, rows, vals, p * bits, bits, hist[p], tile, warps, rng)
    t_indptr = radix_bounds(cols, live, n, tile)
    return sp.csr_matrix((vals, rows.astype(np.int32), t_indptr.astype(np.int32)), shape=(n, m))
