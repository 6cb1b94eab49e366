"""NumPy port of matplan/kernels/sptrans.cu, phase by phase, thread by thread.

Same partitioning (merge path over (ends, positions), SPT_TILE steps a block, ITEMS a thread),
same rounds (thread-local odd-even sort, log2(BLOCK) shared-memory merge rounds, binary-tree
rounds over the crossing columns' runs, every tile's output slots in each round). The grid
barriers of the kernels are the sequential order of the phases and rounds here. The tile constants are arguments so tests can use tiny
tiles and reach many-run columns on small matrices. ``rng`` orders the atomics of count_rank
(warps and column groups in random order), as the GPU may; the result must not depend on it.
"""
from __future__ import annotations

import numpy as np

SENTINEL_COL = 0x7FFFFFFF
SENTINEL_KEY = (1 << 64) - 1


def path_search(ends, a_len, b_len, diag):
    """How many of ends[0..a_len) come before step ``diag`` of the merge with 0, 1, 2, ..."""
    lo, hi = max(diag - b_len, 0), min(diag, a_len)
    while lo < hi:
        mid = (lo + hi) >> 1
        if ends[mid] <= diag - 1 - mid:
            lo = mid + 1
        else:
            hi = mid
    return lo


def count_rank(indices, n, rng):
    nnz = indices.size
    counts = np.zeros(n + 1, np.int64)
    rank = np.full(nnz, -1, np.int64)
    bad = False
    warps = np.arange((nnz + 31) // 32)
    rng.shuffle(warps)
    for w in warps:
        lanes = np.arange(w * 32, min(w * 32 + 32, nnz))
        cols = indices[lanes]
        ok = (cols >= 0) & (cols < n)
        bad |= not ok.all()
        lanes, cols = lanes[ok], cols[ok]
        groups = np.unique(cols)
        rng.shuffle(groups)
        for c in groups:
            peers = lanes[cols == c]                       # in lane order
            base = counts[c + 1]
            counts[c + 1] += peers.size
            rank[peers] = base + np.arange(peers.size)
    return counts, rank, bad


def scatter_keys(a_indptr, indices, m, t_indptr, rank, n, items):
    nnz = indices.size
    total = m + nnz
    keys = np.full(nnz, SENTINEL_KEY, np.uint64)           # poison: every slot must be written
    ends = a_indptr[1:]
    for d in range(0, total, items):
        x = path_search(ends, m, nnz, d)
        y = d - x
        k = 0
        while k < items and x + y < total:
            if y < nnz and x < m and a_indptr[x + 1] > y:
                col = indices[y]
                if 0 <= col < n:
                    keys[t_indptr[col] + rank[y]] = (np.uint64(x) << np.uint64(32)) | np.uint64(y)
                y += 1
            else:
                x += 1
            k += 1
    return keys


def _block_merge_sort(recs, block, items):
    """Thread-local odd-even transposition sort, then merge-path rounds of width items, 2*items, ..."""
    tile = block * items
    regs = [list(recs[t * items:(t + 1) * items]) for t in range(block)]
    for r in regs:
        for p in range(items):
            for k in range(p & 1, items - 1, 2):
                if r[k + 1] < r[k]:
                    r[k], r[k + 1] = r[k + 1], r[k]
    w = items
    while w < tile:
        smem = [rec for r in regs for rec in r]
        for tid in range(block):
            start = tid * items
            a0 = (start // (2 * w)) * (2 * w)
            b0 = a0 + w
            diag = start - a0
            lo, hi = max(diag - w, 0), min(diag, w)
            while lo < hi:
                mid = (lo + hi) >> 1
                if not (smem[b0 + diag - 1 - mid] < smem[a0 + mid]):
                    lo = mid + 1
                else:
                    hi = mid
            ia, ib, a1, b1 = a0 + lo, b0 + diag - lo, b0, b0 + w
            out = []
            for _ in range(items):
                take_a = ib >= b1 or (ia < a1 and not (smem[ib] < smem[ia]))
                if take_a:
                    out.append(smem[ia]); ia += 1
                else:
                    out.append(smem[ib]); ib += 1
            regs[tid] = out
        w *= 2
    return [rec for r in regs for rec in r]


def tile_sort(t_indptr, n, nnz, keys_in, data, out_idx, out_val, block, items):
    tile = block * items
    total = n + nnz
    ends = t_indptr[1:]
    runs = np.full(nnz, SENTINEL_KEY, np.uint64)
    tile_x = np.full((total + tile - 1) // tile, -1, np.int64)
    for t0 in range(0, total, tile):
        t1 = min(t0 + tile, total)
        j0 = j1 = None
        recs = []
        for tid in range(block):
            d = t0 + tid * items
            x = path_search(ends, n, nnz, d) if d < total else n
            y = d - x if d < total else nnz
            if tid == 0:
                tile_x[t0 // tile], j0 = x, y
            for k in range(items):
                rec = (SENTINEL_COL, SENTINEL_KEY)
                if d + k < t1:
                    if y < nnz and (x >= n or t_indptr[x + 1] > y):
                        if x < n:
                            rec = (x, int(keys_in[y]))
                        y += 1
                    else:
                        x += 1
                recs.append(rec)
            if d < t1 <= d + items:
                j1 = y                                   # the thread ending at t1
        recs = _block_merge_sort(recs, block, items)
        for q, (c, key) in enumerate(recs[:j1 - j0]):
            slot = j0 + q
            if c == SENTINEL_COL:
                continue
            if t_indptr[c] >= j0 and t_indptr[c + 1] <= j1:
                out_idx[slot] = key >> 32
                out_val[slot] = data[key & 0xFFFFFFFF]
            else:
                runs[slot] = key
    return runs, tile_x


def cross_rounds(t_indptr, n, nnz, runs, tile_x, data, out_idx, out_val, block, items, maxlen):
    """Phase 4: round s = 1, 2, 4, ... over every tile's output slots. Returns (crossing columns, rounds)."""
    tile = block * items
    total = n + nnz
    tiles = (total + tile - 1) // tile
    qmax = 1 + (maxlen - 1 + tile - 1) // tile if maxlen > 1 else 1
    bufs = [runs, np.full(nnz, SENTINEL_KEY, np.uint64)]   # runs, then the keys array as scratch
    crossing, rounds = set(), 0
    s, r = 1, 0
    while s < qmax:
        src, dst = bufs[r & 1], bufs[(r + 1) & 1]
        for t in range(tiles):
            t0 = t * tile
            t1 = min(t0 + tile, total)
            x0 = int(tile_x[t])
            x1 = int(tile_x[t + 1]) if t + 1 < tiles else n
            j0, j1 = t0 - x0, t1 - x1
            for tid in range(block):
                p = j0 + tid * items
                pend = min(p + items, j1)
                while p < pend:
                    if x0 < n and p < t_indptr[x0 + 1]:
                        c = x0
                    elif x1 < n and x1 != x0:
                        s1 = int(t_indptr[x1])
                        if p < s1:
                            p = s1
                            continue
                        c = x1
                    else:
                        break
                    start, end = int(t_indptr[c]), int(t_indptr[c + 1])
                    b = ((c + start) // tile + 1) * tile - c
                    cend = min(end, pend)
                    if b >= end:
                        p = cend
                        continue
                    q = 1 + (end - b + tile - 1) // tile
                    if s >= q:
                        p = cend
                        continue
                    crossing.add(c)
                    rounds = max(rounds, r + 1)
                    final = 2 * s >= q
                    k0 = 0 if p < b else 1 + (p - b) // tile
                    ra = (k0 // (2 * s)) * (2 * s)
                    rm, rb = min(ra + s, q), min(ra + 2 * s, q)

                    def bnd(k):
                        return start if k == 0 else (end if k >= q else min(b + (k - 1) * tile, end))

                    ps, pm, pe = bnd(ra), bnd(rm), bnd(rb)
                    sub = min(pend, pe)
                    diag, alen, blen = p - ps, pm - ps, pe - pm
                    lo, hi = max(diag - blen, 0), min(diag, alen)
                    while lo < hi:
                        mid = (lo + hi) >> 1
                        if src[ps + mid] <= src[pm + diag - 1 - mid]:
                            lo = mid + 1
                        else:
                            hi = mid
                    ia, ib = ps + lo, pm + diag - lo
                    for out in range(p, sub):
                        if ib >= pe or (ia < pm and src[ia] <= src[ib]):
                            key = int(src[ia]); ia += 1
                        else:
                            key = int(src[ib]); ib += 1
                        if final:
                            out_idx[out] = key >> 32
                            out_val[out] = data[key & 0xFFFFFFFF]
                        else:
                            dst[out] = key
                    p = sub
        s *= 2
        r += 1
    return len(crossing), rounds


def transpose(A, rng, block=256, items=8, info=None, check=True):
    """CSR of A.T (scipy CSR in, scipy CSR out) by the five phases' NumPy ports."""
    import scipy.sparse as sp
    m, n = A.shape
    indptr = np.asarray(A.indptr, np.int64)
    indices = np.asarray(A.indices, np.int64)
    nnz = int(indptr[-1])
    counts, rank, bad = count_rank(indices[:nnz], n, rng)
    if bad and check:
        raise ValueError("A.indices: column index out of range")
    t_indptr = np.cumsum(counts)                         # phase 1 (the kernel scans in place)
    maxlen = int(counts.max()) if counts.size else 0
    keys = scatter_keys(indptr, indices, m, t_indptr, rank, n, items)
    out_idx = np.full(nnz, -1, np.int64)
    out_val = np.full(nnz, np.nan, A.dtype)
    runs, tile_x = tile_sort(t_indptr, n, nnz, keys, A.data, out_idx, out_val, block, items)
    merged, rounds = cross_rounds(t_indptr, n, nnz, runs, tile_x, A.data, out_idx, out_val, block, items,
                                  maxlen)
    if info is not None:
        info.update(crossing_columns=merged, most_rounds=rounds)
    return sp.csr_matrix((out_val, out_idx.astype(np.int32), t_indptr.astype(np.int32)), shape=(n, m))
