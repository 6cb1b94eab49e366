"""Format builders for the SpMV kernels, written once against the array module ``xp``.

NumPy on the host (so CI checks every layout without a GPU) and CuPy on the GPU
(so ``prepare`` converts with array operations, never a Python loop over rows).
Each builder takes CSR arrays (indptr, indices, data), keeps duplicates and
unsorted indices as they are (the kernels sum every stored entry, as SciPy
does) and returns plain dicts of arrays.

Layouts (see ../shared/SEEDS.md sections 2 and 4):

* ELL-R: slot c of (sorted) row r at ``c * m + r``; ``rl`` the row lengths,
  ``perm`` the original row of each sorted row (sorted rows only).
* Blocked (BRC / BRCP): rows sorted by length (descending, ties by row index),
  each row cut into pieces of the BRCP block width (row-major filling: a row's
  pieces occupy consecutive block rows), 32 block rows a block, a block as wide
  as its widest piece, column-major inside the block; ``block_ptr`` the start
  of each block, ``row_perm`` the original row of each block row (-1 padding),
  ``row_seg_len`` the run length of equal ``row_perm`` at the head of each run.
  Padding slots hold value 0 and column -1.
"""
from __future__ import annotations

import numpy as np

from ...models import spmv as spmv_model

H = spmv_model.BRCP_H
#: The paper cuts a row longer than 64*T into blocks of width ceil(nnz/64), so that it spans
#: at most 64 block rows (two blocks when aligned). Our BRCP reduces spanning rows in a fixed
#: order, so a larger factor (more lanes on a very long row) stays deterministic.
LONG_FACTORS = (spmv_model.BRCP_LONG_FACTOR, 8192)
#: Beyond the paper: the "spread" variant caps the block width T at this, because a warp's
#: loop over a wide block is serial (on an H100 a lone warp takes ~0.4 us per iteration).
WIDTH_CAP = 32


def _cdiv(a, b):
    return -(-a // b)


def _sorted_order(lengths, xp):
    """Rows by length, longest first, ties by row index (the same order on NumPy and CuPy)."""
    m = lengths.shape[0]
    if m == 0:
        return xp.zeros(0, dtype=xp.int64)
    key = (int(lengths.max()) - lengths.astype(xp.int64)) * m + xp.arange(m, dtype=xp.int64)
    return xp.argsort(key)


def _row_of_nonzero(indptr, nnz, xp):
    """Row index of every stored entry (int64), without a loop over rows."""
    return xp.searchsorted(indptr[1:].astype(xp.int64), xp.arange(nnz, dtype=xp.int64), side="right")


def index_dtype_for(indices_dtype, largest: int, xp):
    """The format's index type: the input's, widened to int64 when ``largest`` does not fit int32."""
    dt = np.dtype(indices_dtype)
    if dt == np.int64 or largest >= np.iinfo(np.int32).max:
        return xp.int64
    return xp.int32


def scatter(total, slot, indices, data, index_dtype, xp):
    """Values (0 padding) and columns (-1 padding) of a padded format from each entry's slot."""
    vals = xp.zeros(total, dtype=data.dtype)
    cols = xp.full(total, -1, dtype=index_dtype)
    vals[slot] = data
    cols[slot] = indices.astype(index_dtype)
    return vals, cols


# ---------------------------------------------------------------- CSR vector width
VECTOR_WIDTHS = (2, 4, 8, 16, 32)


def vector_width(row_mean: float) -> int:
    """Lanes per row for CSR vector: the smallest power of two >= the mean row length, in 2..32."""
    for w in VECTOR_WIDTHS:
        if w >= row_mean:
            return w
    return VECTOR_WIDTHS[-1]


# ---------------------------------------------------------------- CSR SpMM group shape
#: Column lanes (KK) and nonzero slots (S) per row of the CSR SpMM kernel, KK * S <= 32.
SPMM_COLUMNS = (4, 8, 16, 32)
SPMM_SLOTS = (1, 2, 4, 8)


def spmm_columns(k: int) -> int:
    """Column lanes per slot: the smallest of SPMM_COLUMNS >= k (32 for wider X, in chunks)."""
    return next((c for c in SPMM_COLUMNS if c >= k), SPMM_COLUMNS[-1])


def spmm_slots(slots: int, k: int) -> int:
    """``slots`` capped so that a row's group (column lanes x slots) fits in a warp."""
    return min(int(slots), 32 // spmm_columns(k))


def ellr_padded_slots(m: int, row_max: int) -> int:
    return m * row_max


def ellr(indptr, indices, data, sort: bool, xp=np):
    """ELL-R arrays: vals, cols (column-major, stride m), rl (int32), perm (sorted rows) or None."""
    m = indptr.shape[0] - 1
    nnz = int(indptr[-1]) if m else 0
    lengths = xp.diff(indptr).astype(xp.int64)
    row_max = int(lengths.max()) if m else 0
    total = ellr_padded_slots(m, row_max)
    idt = index_dtype_for(indices.dtype, max(total, m), xp)
    row = _row_of_nonzero(indptr, nnz, xp)
    offset = xp.arange(nnz, dtype=xp.int64) - indptr[:-1].astype(xp.int64)[row]
    if sort:
        order = _sorted_order(lengths, xp)
        rank = xp.empty(m, dtype=xp.int64)
        rank[order] = xp.arange(m, dtype=xp.int64)
        pos, rl, perm = rank[row], lengths[order], order.astype(idt)
    else:
        pos, rl, perm = row, lengths, None
    vals, cols = scatter(total, offset * m + pos, indices, data, idt, xp)
    return dict(vals=vals, cols=cols, rl=rl.astype(xp.int32), perm=perm,
                stride=m, row_max=row_max, total=total)


# ---------------------------------------------------------------- BRCP / BRC blocked layout
def piece_widths(sorted_lengths, T: int, long_factor: int, xp):
    """The BRCP block-width rule per row: ceil(L/f) when L > f*T (f = long_factor), else min(T, L)."""
    L = sorted_lengths
    return xp.where(L > long_factor * T, _cdiv(L, long_factor), xp.minimum(L, T))


def blocked(indptr, T: int, long_factor: int = spmv_model.BRCP_LONG_FACTOR, xp=np):
    """The BRCP layout (row_perm, row_seg_len, block_ptr and the slot of every stored entry)."""
    m = indptr.shape[0] - 1
    nnz = int(indptr[-1]) if m else 0
    lengths = xp.diff(indptr).astype(xp.int64)
    order = _sorted_order(lengths, xp)
    Ls = lengths[order]
    w = piece_widths(Ls, max(int(T), 1), long_factor, xp)
    npieces = xp.where(Ls > 0, _cdiv(Ls, xp.maximum(w, 1)), 1)   # an empty row: one piece of width 0
    pend = xp.cumsum(npieces)
    P = int(pend[-1]) if m else 0
    pstart = pend - npieces
    nblocks = _cdiv(P, H)
    slots_n = nblocks * H
    piece = xp.arange(P, dtype=xp.int64)
    prow = xp.searchsorted(pend, piece, side="right")          # sorted row of each piece
    q = piece - pstart[prow]
    plen = xp.zeros(slots_n, dtype=xp.int64)
    plen[:P] = xp.minimum(w[prow], Ls[prow] - q * w[prow])
    width = plen.reshape(nblocks, H).max(axis=1) if nblocks else xp.zeros(0, dtype=xp.int64)
    block_ptr = xp.zeros(nblocks + 1, dtype=xp.int64)
    block_ptr[1:] = xp.cumsum(width * H)
    row_perm = xp.full(slots_n, -1, dtype=xp.int64)
    row_perm[:P] = order[prow]
    row_seg_len = segment_lengths(row_perm, xp)
    # slot of every stored entry
    rank = xp.empty(m, dtype=xp.int64)
    rank[order] = xp.arange(m, dtype=xp.int64)
    row = _row_of_nonzero(indptr, nnz, xp)
    s = rank[row]
    off = xp.arange(nnz, dtype=xp.int64) - indptr[:-1].astype(xp.int64)[row]
    ws = xp.maximum(w[s], 1)
    p = pstart[s] + off // ws
    slot = block_ptr[p // H] + (off % ws) * H + p % H
    total = int(block_ptr[-1]) if nblocks else 0
    return dict(row_perm=row_perm, row_seg_len=row_seg_len, block_ptr=block_ptr, slot=slot,
                nblocks=nblocks, total=total, pieces=P)


def segment_lengths(row_perm, xp):
    """rowSegLen: at the head of each run of equal row_perm inside a block the run length, else 0."""
    n = row_perm.shape[0]
    out = xp.zeros(n, dtype=xp.int32)
    if n == 0:
        return out
    head = xp.ones(n, dtype=bool)
    head[1:] = row_perm[1:] != row_perm[:-1]
    head[::H] = True
    hp = xp.flatnonzero(head)
    ends = xp.concatenate([hp[1:], xp.asarray([n], dtype=hp.dtype)])
    out[hp] = (ends - hp).astype(xp.int32)
    return out


def brcp_reduction(row_perm, row_seg_len, m: int, xp=np):
    """Where each BRCP segment's sum goes, and the fixed-order reduction of rows spanning blocks.

    Returns dest (per block row: the row for a row held by one block, -(partial+2) for a
    segment of a row spanning several blocks, -1 for padding), fix_rows and fix_ptr (the
    partials of each spanning row, in block order), and the number of partials. Empty rows
    hold one block row of width 0, so the block kernel stores their zeros.
    """
    n = row_perm.shape[0]
    heads = xp.flatnonzero(row_seg_len > 0)
    seg_row = row_perm[heads]
    real = seg_row >= 0
    nseg = xp.bincount(seg_row[real], minlength=m) if m else xp.zeros(0, dtype=xp.int64)
    spans = xp.zeros(heads.shape[0], dtype=bool)
    spans[real] = nseg[seg_row[real]] > 1
    pid = xp.cumsum(spans) - 1
    seg_dest = xp.where(spans, -(pid + 2), seg_row)
    seg_id = xp.cumsum(row_seg_len > 0) - 1                     # segment of each block row
    dest = seg_dest[seg_id] if n else xp.zeros(0, dtype=xp.int64)
    first = spans.copy()                                         # first segment of each spanning row
    first[1:] &= seg_row[1:] != seg_row[:-1]
    span_rows = seg_row[first]
    span_start = pid[first]
    npart = int(spans.sum())
    fix_rows = span_rows.astype(xp.int64)
    fix_ptr = xp.concatenate([span_start, xp.full(1, npart, dtype=xp.int64)])
    return dict(dest=dest.astype(xp.int64), fix_rows=fix_rows, fix_ptr=fix_ptr.astype(xp.int64),
                partials=npart)


def brcp(indptr, indices, data, T: int, long_factor: int = spmv_model.BRCP_LONG_FACTOR, xp=np):
    """Every array the BRCP and BRC kernels read, in the format's index type."""
    m = indptr.shape[0] - 1
    lay = blocked(indptr, T, long_factor, xp)
    red = brcp_reduction(lay["row_perm"], lay["row_seg_len"], m, xp)
    idt = index_dtype_for(indices.dtype, max(lay["total"], m + 2, red["partials"] + 2), xp)
    vals, cols = scatter(lay["total"], lay["slot"], indices, data, idt, xp)
    return dict(vals=vals, cols=cols, block_ptr=lay["block_ptr"].astype(idt),
                row_perm=lay["row_perm"].astype(idt), row_seg_len=lay["row_seg_len"],
                dest=red["dest"].astype(idt), fix_rows=red["fix_rows"].astype(idt),
                fix_ptr=red["fix_ptr"].astype(idt), nblocks=lay["nblocks"], total=lay["total"],
                partials=red["partials"], pieces=lay["pieces"])


# ---------------------------------------------------------------- CSR split
#: Nonzeros a block of csr_split sums per chunk of a long row (SPLIT_THREADS = 256 lanes x 16).
SPLIT_CHUNK = 4096
#: A row is long (cut into chunks) past this many loop trips of its lane group: W lanes take
#: UNROLL = 4 entries each a trip, so the longest short row costs at most 16 trips (~6 us at
#: 0.4 us a trip on an H100) whatever the width.
SPLIT_TRIPS = 16


def split_limit(w: int) -> int:
    """Longest row csr_split leaves to a group of ``w`` lanes (longer rows go in chunks)."""
    return SPLIT_TRIPS * 4 * int(w)


def split_chunks(indptr, limit: int, xp=np):
    """The chunks of the rows longer than ``limit``: (chunk_lo, chunk_hi) nonzero ranges of at most
    SPLIT_CHUNK entries and ``chunk_row``, the long row (its index in ``fix_rows``) each belongs
    to; ``fix_rows``/``fix_lo``/``fix_hi``: each long row and its chunks [lo, hi), added in chunk
    order by the block that completes the row. int64; array operations only (GPU with CuPy)."""
    ip = indptr.astype(xp.int64)
    lens = ip[1:] - ip[:-1]
    rows = xp.flatnonzero(lens > limit).astype(xp.int64)
    per_row = (lens[rows] + SPLIT_CHUNK - 1) // SPLIT_CHUNK
    fix_hi = xp.cumsum(per_row)
    fix_lo = fix_hi - per_row
    nchunks = int(fix_hi[-1]) if rows.shape[0] else 0
    c = xp.arange(nchunks, dtype=xp.int64)
    owner = xp.searchsorted(fix_hi, c, side="right")          # the long row each chunk belongs to
    lo = ip[rows[owner]] + (c - fix_lo[owner]) * SPLIT_CHUNK
    hi = xp.minimum(lo + SPLIT_CHUNK, ip[rows[owner] + 1])
    return dict(chunk_lo=lo, chunk_hi=hi, chunk_row=owner.astype(xp.int64), fix_rows=rows, fix_lo=fix_lo,
                fix_hi=fix_hi, nchunks=nchunks)


# ---------------------------------------------------------------- CSR merge path
#: Threads per block of the merge-path kernel (MERGE_NT in spmv.cu) and the items per thread
#: compiled there (odd: no shared-memory bank conflicts, as in CUB's 7); a tile is
#: MERGE_NT * ipt consecutive items of the merge path. 15 was 1.1-1.5x slower than 7 on every
#: H100 benchmark matrix, 8 (even) 1.02-1.1x.
MERGE_NT = 128
MERGE_IPT = (7,)


def merge_path(indptr, ipt: int, xp=np):
    """Tile split of the merge path (row ends + nonzeros) and the rows whose sums cross tiles.

    Row end r sits at path position ``r + indptr[r + 1]``, so the row at diagonal d is
    the number of row ends before d (a searchsorted, no loop). Tile t's open row at its
    end is ``tile_row[t + 1]``; it carries a partial sum when some of its nonzeros lie in
    the tile. ``fix_rows``/``fix_lo``/``fix_hi``: each such row and its carrying tiles
    [lo, hi) (consecutive, added in tile order by ``merge_fixup``).
    """
    tile = MERGE_NT * int(ipt)
    m = indptr.shape[0] - 1
    nnz = int(indptr[-1]) if m else 0
    total = m + nnz
    ntiles = _cdiv(total, tile)
    ends = indptr[1:].astype(xp.int64) + xp.arange(m, dtype=xp.int64)
    diag = xp.minimum(xp.arange(ntiles + 1, dtype=xp.int64) * tile, total)
    tile_row = xp.searchsorted(ends, diag, side="left").astype(xp.int64)
    r1 = tile_row[1:]
    n1 = diag[1:] - r1
    open_ = r1 < m
    start = xp.zeros_like(r1)
    start[open_] = indptr[r1[open_]].astype(xp.int64)
    tiles = xp.flatnonzero(open_ & (n1 > start)).astype(xp.int64)
    rows = r1[tiles]
    head = xp.ones(rows.shape[0], dtype=bool)
    head[1:] = rows[1:] != rows[:-1]
    hp = xp.flatnonzero(head)
    last = xp.concatenate([hp[1:], xp.asarray([rows.shape[0]], dtype=hp.dtype)]) - 1
    return dict(tile_row=tile_row, ntiles=ntiles, fix_rows=rows[hp], fix_lo=tiles[hp],
                fix_hi=tiles[last] + 1 if hp.shape[0] else tiles[hp], tile=tile, nnz=nnz)


def merge_emulate(indptr, indices, data, X, ipt: int):
    """NumPy emulation of ``csr_merge`` + ``merge_fixup`` (loops as in spmv.cu; for tests only)."""
    m = indptr.shape[0] - 1
    nnz = int(indptr[-1]) if m else 0
    k = X.shape[1]
    mp = merge_path(indptr, ipt)
    tile, tr_ = mp["tile"], mp["tile_row"]
    Y = np.full((m, k), np.nan)
    carry = np.full((mp["ntiles"], k), np.nan)
    for t in range(mp["ntiles"]):
        d0, d1 = t * tile, min((t + 1) * tile, m + nnz)
        r0, r1 = int(tr_[t]), int(tr_[t + 1])
        n0 = d0 - r0
        prod = data[n0:d1 - r1, None] * X[indices[n0:d1 - r1]]
        end = [int(indptr[r + 1]) if r < m else nnz for r in range(r0, r1 + 1)]
        flags, sums, firsts = [], [], []
        for th in range(MERGE_NT):
            D = min(d0 + th * ipt, d1)
            tr = int(np.searchsorted(np.arange(r0, r1) + np.asarray(end[:-1], dtype=np.int64), D, "left"))
            nz, s, first = D - (r0 + tr), np.zeros(k), None
            for it in range(ipt):
                if D + it >= d1:
                    break
                if end[tr] <= nz:
                    if first is None:
                        first = (r0 + tr, s)
                    else:
                        Y[r0 + tr] = s
                    s, tr = np.zeros(k), tr + 1
                else:
                    s, nz = s + prod[nz - n0], nz + 1
            flags.append(first is not None)
            sums.append(s)
            firsts.append(first)
        run = np.zeros(k)                       # sequential segmented scan over the threads
        for th in range(MERGE_NT):
            if firsts[th] is not None:
                Y[firsts[th][0]] = run + firsts[th][1]
            run = sums[th] if flags[th] else run + sums[th]
        if r1 < m:
            carry[t] = run
    for row, lo, hi in zip(mp["fix_rows"], mp["fix_lo"], mp["fix_hi"]):
        Y[int(row)] += carry[int(lo):int(hi)].sum(axis=0)
    return Y


def result_shape(shape, dtype, B) -> tuple:
    """The shape of A @ B for an m x n A of ``dtype``: (m,) for a vector B, (m, k) for an n x k one;
    ValueError (shape) or TypeError (dtype) naming B otherwise."""
    m, n = shape
    if B.ndim not in (1, 2) or B.shape[0] != n:
        raise ValueError(f"B: expected shape ({n},) or ({n}, k), got {B.shape}")
    if B.dtype != dtype:
        raise TypeError(f"B: dtype {B.dtype} does not match A's {dtype}")
    return (m,) if B.ndim == 1 else (m, B.shape[1])
