"""NumPy port of SpTRANS's kernels (matplan/kernels/sptrans/*.cu), phase by phase, thread by thread:
the segmented merge (``transpose``, merge.cu), the segsort (``segsort_transpose``, count_scan.cu and
segsort.cu); the radix method's is sptrans_radix_reference.py.

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



def merge_path(src, a0, am, ae, p):
    """Keys of the merge of sorted runs src[a0:am] and src[am:ae] from output position p (absolute,
    a0 <= p <= ae) on: the merge-path partition (binary search on the diagonal), then the merge."""
    diag, alen, blen = p - a0, am - a0, ae - am
    lo, hi = max(diag - blen, 0), min(diag, alen)
    while lo < hi:
        mid = (lo + hi) >> 1
        if src[a0 + mid] <= src[am + diag - 1 - mid]:
            lo = mid + 1
        else:
            hi = mid
    ia, ib = a0 + lo, am + diag - lo
    while ia < am or ib < ae:
        if ib >= ae or (ia < am and src[ia] <= src[ib]):
            yield int(src[ia]); ia += 1
        else:
            yield int(src[ib]); ib += 1

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
                    for out, key in zip(range(p, sub), merge_path(src, ps, pm, pe, p)):
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


# ------------------------------------------------------------------------------------------------
# The segsort method (count_scan.cu: spt_count, spt_scan; segsort.cu: spt_scatter, spt_sort_short,
# spt_sort_big).
# Atomics (global and shared) happen in an order drawn from ``rng``; the result must not depend on it.

def segsort_count(indices, n, rng, chunk=2048, hash_bits=11, probes=4):
    """spt_count: per-chunk hash table of (column -> local count), one global atomic per claimed slot;
    entries whose probes all fail take a global atomic each. Returns (counts[n + 1], rank, bad, info)."""
    nnz = indices.size
    size = 1 << hash_bits
    counts = np.zeros(n + 1, np.int64)
    rank = np.full(nnz, -1, np.int64)
    bad = False
    events = []                          # (column, amount, target): target an entry (direct) or a slot
    crowded = 0
    slot_base = {}
    for b in range((nnz + chunk - 1) // chunk):
        s_col = np.full(size, -1, np.int64)
        s_cnt = np.zeros(size, np.int64)
        local = {}
        es = np.arange(b * chunk, min(nnz, (b + 1) * chunk))
        rng.shuffle(es)                  # the shared atomics' order
        for e in es:
            col = int(indices[e])
            if col < 0 or col >= n:
                bad = True
                continue
            h = ((col * 2654435761) & 0xFFFFFFFF) >> (32 - hash_bits)
            for p in range(probes):
                hh = (h + p) & (size - 1)
                if s_col[hh] == -1:
                    s_col[hh] = col
                if s_col[hh] == col:
                    local[e] = (hh, int(s_cnt[hh]))
                    s_cnt[hh] += 1
                    break
            else:
                events.append((col, 1, ("e", int(e))))
                crowded += 1
        for hh in np.flatnonzero(s_col >= 0):
            events.append((int(s_col[hh]), int(s_cnt[hh]), ("s", b, int(hh))))
        slot_base[b] = local             # ranks: the slot's base (below) + the local count
    order = rng.permutation(len(events))  # the global atomics' order
    bases = {}
    for i in order:
        col, amount, target = events[i]
        base = counts[col + 1]
        counts[col + 1] += amount
        if target[0] == "e":
            rank[target[1]] = base
        else:
            bases[target[1:]] = base
    for b, local in slot_base.items():
        for e, (hh, loc) in local.items():
            rank[e] = bases[(b, hh)] + loc
    return counts, rank, bad, dict(global_atomics=len(events), crowded=crowded)


def segsort_scan(counts, short_max, warp_max, cap, rng, tile=2048):
    """spt_scan: inclusive scan of counts (= A.T's indptr) and the column lists: medium ids
    (short_max < L <= warp_max) from the front of seg_list, long ids (warp_max < L <= cap) from the
    back, huge ids (L > warp_max, L > cap) in huge_list, each tile's ids in column order at a base
    taken by one atomic (tiles in arbitrary order)."""
    n = counts.size - 1
    indptr = np.cumsum(counts)
    seg_list = np.full(max(n, 0), -1, np.int64)
    huge_list = []
    n_med = n_long = 0
    tiles = (n + 1 + tile - 1) // tile
    for t in rng.permutation(tiles):
        ids = np.arange(max(t * tile, 1), min((t + 1) * tile, n + 1)) - 1
        lens = counts[ids + 1]
        med = ids[(lens > short_max) & (lens <= warp_max)]
        lng = ids[(lens > warp_max) & (lens <= cap)]
        huge_list += list(ids[(lens > warp_max) & (lens > cap)])
        seg_list[n_med:n_med + med.size] = med
        n_med += med.size
        seg_list[n - n_long - lng.size:n - n_long] = lng[::-1]   # seg_list[n - 1 - k] = k-th long id
        n_long += lng.size
    return indptr, seg_list, n_med, n_long, np.array(huge_list, np.int64)


def segsort_scatter(a_indptr, indices, m, t_indptr, rank, n, items):
    """spt_scatter (segsort): per thread the walk of its ``items`` path steps (rows of its entries,
    which are consecutive y0, y0 + 1, ...), then the entries' loads and writes."""
    nnz = indices.size
    total = m + nnz
    keys = np.full(nnz, SENTINEL_KEY, np.uint64)           # poison: every slot must be written
    for d in range(0, total, items):
        x = path_search(a_indptr[1:], m, nnz, d)
        y = y0 = d - x
        row = [-1] * items
        for k in range(items):
            if x + y < total:
                if y < nnz and x < m and a_indptr[x + 1] > y:
                    row[k] = x
                    y += 1
                else:
                    x += 1
        cnt = y - y0
        col = [int(indices[y0 + k]) if k < cnt else -1 for k in range(items)]
        rows = [r for r in row if r >= 0] + [0] * (items - cnt)
        for k in range(cnt):
            if 0 <= col[k] < n:
                keys[t_indptr[col[k]] + rank[y0 + k]] = (np.uint64(rows[k]) << np.uint64(32)) | np.uint64(y0 + k)
    return keys


def _insertion_sort(buf, lo, length):
    for i in range(lo + 1, lo + length):
        v = buf[i]
        k = i - 1
        while k >= lo and buf[k] > v:
            buf[k + 1] = buf[k]
            k -= 1
        buf[k + 1] = v


def _bitonic(buf, P):
    """bitonic<>(s, P, t, nt): every stage's compare-swaps (pair q -> i, i + j), ascending."""
    q = np.arange(P // 2)
    k = 2
    while k <= P:
        j = k >> 1
        while j > 0:
            i = (q // j) * 2 * j + (q & (j - 1))
            a, b = buf[i].copy(), buf[i + j].copy()
            swap = (a > b) == ((i & k) == 0)
            buf[i[swap]], buf[i[swap] + j] = b[swap], a[swap]
            j >>= 1
        k <<= 1


def _write(slot, key, data, out_idx, out_val):
    key = int(key)
    out_idx[slot] = key >> 32
    out_val[slot] = data[key & 0xFFFFFFFF]


def segsort_short(t_indptr, n, keys, data, out_idx, out_val, short_max, stage=1024, info=None):
    """spt_sort_short: warps of 32 columns; staged in shared memory when the warp's slots fit."""
    for j0 in range(0, n, 32):
        jend = min(j0 + 32, n)
        lo, hi = int(t_indptr[j0]), int(t_indptr[jend])
        cols = np.arange(j0, jend)
        starts, lens = t_indptr[cols], t_indptr[cols + 1] - t_indptr[cols]
        mine = lens <= short_max
        if hi - lo <= stage:
            buf = keys[lo:hi].copy()
            for s, L in zip(starts[~mine], lens[~mine]):
                buf[s - lo:s - lo + L] = SENTINEL_KEY
            for s, L in zip(starts[mine], lens[mine]):
                if L > 1:
                    _insertion_sort(buf, int(s - lo), int(L))
            for p in range(lo, hi):
                if buf[p - lo] != SENTINEL_KEY:
                    _write(p, buf[p - lo], data, out_idx, out_val)
            if info is not None:
                info["short_staged"] = info.get("short_staged", 0) + int(mine.sum())
        else:
            for s, L in zip(starts[mine], lens[mine]):
                _insertion_sort(keys, int(s), int(L))
                for k in range(L):
                    _write(s + k, keys[s + k], data, out_idx, out_val)
            if info is not None:
                info["short_in_place"] = info.get("short_in_place", 0) + int(mine.sum())


def _pow2_at_least(L, lo=32):
    P = lo
    while P < L:
        P <<= 1
    return P


def segsort_chunks(s, L, cap, keys):
    """spt_sort_big's huge-row work items: chunks of cap keys sorted (bitonic) back into keys."""
    for c0 in range(0, L, cap):
        length = min(cap, L - c0)
        buf = np.full(cap, SENTINEL_KEY, np.uint64)
        buf[:length] = keys[s + c0:s + c0 + length]
        _bitonic(buf, cap)
        keys[s + c0:s + c0 + length] = buf[:length]


def segsort_merge_rounds(s, L, cap, keys, scratch, data, out_idx, out_val, block, items):
    """spt_merge_long / merge_rounds(): merge-path rounds by the block's threads (``items``
    outputs a thread a step) between keys and scratch; the last round writes the outputs."""
    src, dst = keys[s:s + L], scratch[s:s + L]                   # views: writes land in keys/scratch
    w, rounds = cap, 0
    while w < L:
        final = 2 * w >= L
        out = np.full(L, SENTINEL_KEY, np.uint64)
        for tid in range(block):
            p = tid * items
            while p < L:
                a0 = (p // (2 * w)) * (2 * w)
                am, ae = min(a0 + w, L), min(a0 + 2 * w, L)
                for o, key in zip(range(p, min(p + items, ae)), merge_path(src, a0, am, ae, p)):
                    out[o] = key
                p += block * items
        # every output written once (the kernel writes each slot from one thread)
        assert not np.any(out == SENTINEL_KEY)
        if final:
            for o in range(L):
                _write(s + o, out[o], data, out_idx, out_val)
        else:
            dst[:] = out
        src, dst = dst, src
        w *= 2
        rounds += 1
    return rounds


def segsort_big(t_indptr, n, seg_list, n_med, n_long, huge_list, keys, scratch, data, out_idx, out_val,
                cap, block=512, items=8, info=None):
    """spt_sort_big (a warp per medium column, a block per long one, the huge ones' chunks) and
    spt_merge_long (a block per huge column; ``block`` threads)."""
    # medium columns from the front of seg_list, long ones from its back: one bitonic sort each
    for c in [int(seg_list[i]) for i in range(n_med)] + [int(seg_list[n - 1 - i]) for i in range(n_long)]:
        s, L = int(t_indptr[c]), int(t_indptr[c + 1] - t_indptr[c])
        assert L <= cap
        P = _pow2_at_least(L)
        buf = np.full(P, SENTINEL_KEY, np.uint64)
        buf[:L] = keys[s:s + L]
        _bitonic(buf, P)
        for k in range(L):
            _write(s + k, buf[k], data, out_idx, out_val)
    spans = [(int(t_indptr[c]), int(t_indptr[c + 1] - t_indptr[c])) for c in huge_list]
    for s, L in spans:                   # all chunks (spt_sort_big) before any merge (spt_merge_long)
        segsort_chunks(s, L, cap, keys)
    rounds = 0
    for s, L in spans:
        rounds = max(rounds, segsort_merge_rounds(s, L, cap, keys, scratch, data, out_idx, out_val, block, items))
    if info is not None:
        info["medium"] = info.get("medium", 0) + n_med
        info["long_in_block"] = info.get("long_in_block", 0) + n_long
        info["long_fallback"] = info.get("long_fallback", 0) + len(spans)
        info["fallback_rounds"] = max(info.get("fallback_rounds", 0), rounds)


def segsort_transpose(A, rng, bins=(32, 512, 4096), info=None, check=True, block=512, items=8,
                      stage=1024, chunk=2048, hash_bits=11, scan_tile=2048):
    """CSR of A.T (scipy CSR in, scipy CSR out) by the segsort kernels' NumPy ports."""
    import scipy.sparse as sp
    short_max, warp_max, cap = bins
    m, n = A.shape
    indptr = np.asarray(A.indptr, np.int64)
    indices = np.asarray(A.indices, np.int64)
    nnz = int(indptr[-1])
    if nnz == 0 or m == 0 or n == 0:
        return sp.csr_matrix((n, m), dtype=A.dtype)
    counts, rank, bad, cinfo = segsort_count(indices[:nnz], n, rng, chunk, hash_bits)
    if bad and check:
        raise ValueError("A.indices: column index out of range")
    t_indptr, seg_list, n_med, n_long, huge_list = segsort_scan(counts, short_max, warp_max, cap, rng, scan_tile)
    keys = segsort_scatter(indptr, indices, m, t_indptr, rank, n, 8)   # SPT_ITEMS
    scratch = np.full(nnz, SENTINEL_KEY, np.uint64)
    out_idx = np.full(nnz, -1, np.int64)
    out_val = np.full(nnz, np.nan, A.dtype)
    loc = {} if info is None else info
    loc.update(cinfo)
    segsort_short(t_indptr, n, keys, A.data, out_idx, out_val, short_max, stage, loc)
    segsort_big(t_indptr, n, seg_list, n_med, n_long, huge_list, keys, scratch, A.data, out_idx, out_val, cap,
                block, items, loc)
    total = int(t_indptr[-1])
    return sp.csr_matrix((out_val[:total], out_idx[:total].astype(np.int32), t_indptr.astype(np.int32)),
                         shape=(n, m))
