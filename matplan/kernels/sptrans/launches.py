"""The launches of SpTRANS's three methods (:func:`matplan.kernels.sptrans.transpose` chooses one).

``segsort`` (segsort.cu, after count_scan.cu): six plain launches after one zeroed workspace.
``spt_count`` per-column counts and each nonzero's rank in its column, aggregated per 2048-entry
chunk in a shared-memory hash table (one global atomic per distinct column of a chunk: hot columns
of R-MAT/wordnet/gene_go do not serialise an atomic per entry on one word); ``spt_scan`` a
single-pass scan (a decoupled look-back read by the whole block) of the counts into A.T's indptr,
an allocation of its own that needs no zeroing, that also bins the columns by length;
``spt_scatter`` key (row << 32 | e) of nonzero e to slot indptr[col] + rank, so each row of A.T
holds its keys in the atomics' arbitrary order; then each row of A.T is sorted by its keys with a
method chosen by its length L: ``spt_sort_short`` a thread per row of L <= short_max (32;
insertion sort in shared memory, coalesced reads and writes by the warp), ``spt_sort_big`` a warp
per row of L <= warp_max (512; bitonic in shared memory), a block per row up to ``cap`` = 4096
keys (bitonic in shared memory), and for longer rows (the fallback) chunks of cap keys sorted in
shared memory as work items spread over all its blocks; ``spt_merge_long`` then merges each such
row's chunks by merge-path rounds, one block a row, between two global buffers.

``radix`` (radix.cu): a stable LSD counting sort of A's entries by column, so every row of A.T
comes out in A's order and nothing is sorted per row. ``spt_digits`` reads A's indices once for
every pass's digit histogram (shared-memory counts: no per-column atomics), the valid entries'
count and the row of each tile's first entry; then ``spt_radix_pass`` once per digit
(ceil(log2 n / 8) passes of at most 8 bits, least significant first): a block ranks a tile of 2048
keys stably by digit (warp by warp, __match_any_sync), finds the digit's count in earlier tiles by
decoupled look-back (a word per tile and digit), stages the tile in shared memory by digit and
writes it coalesced. Keys carry (column, row) and the value, so the last pass writes A.T with no
gather, and the sorted columns, from which ``spt_bounds`` reads A.T's indptr (no column counts and
no scan of them: spt_count and spt_scan took 22-70 us of a call). nnz must be below 2^30 (32-bit
look-back words).

``merge`` (merge.cu): the segmented merge of SEEDS section 3 in two cooperative launches (phases
separated by grid barriers): count/scan/scatter as above but with warp-aggregated atomics, then
merge-path tiles sorted in shared memory (per-thread sorts, log2(BLOCK) merge rounds) and
binary-tree rounds over the rows crossing tiles, every block taking whole tiles of output slots.
It ran at 0.60x CuPy's ``A.T.tocsr()`` geomean on an H100: the tile sort (log2(2048)
shared-memory merge rounds over every nonzero, ~200 us a 2M-nonzero matrix) does work that rows of
A.T of ~7-20 entries do not need, and the per-entry atomics on hot columns took up to 150 us. It is
kept because its cost does not depend on the longest row of A.T: the segsort fallback merges a row
of more than ``cap`` keys by one block (L log(L / cap) work on one SM), so a matrix whose nonzeros
sit mostly in a few columns of millions of entries transposes faster with ``method="merge"``.
"""
from __future__ import annotations

import functools

import numpy as np

from ...core.cache import BoundedCache
from ...core.xp import cupy_module
from .. import _cuda
from ..spgemm.operands import csr_from_parts
from ...models.sptrans import radix_passes
from .compiled import (_CTRL, BIG_BLOCK, BLOCK, BLOCK_LIMIT, CNT_CHUNK, INT32_MAX, MERGE_BLOCK, RADIX_TILE,
                       SCAN_TILE, SEG_N_LIVE, SHORT_BLOCK, SHORT_LIMIT, TILE, WARP_LIMIT, _launch)

#: spt_digits: blocks an SM at most (each adds its digit histograms to the global ones once)
DIGITS_BLOCKS_PER_SM = 4

#: radix method: keys between passes packed in one int (column << rowbits | row) where the
#: column's and the row's bits fit 31 (:func:`radix_rowbits`); False: always (column, row) int2
#: (tests reach both)
RADIX_PACK = True


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


@functools.lru_cache(maxsize=None)
def _check_bins(bins):
    short_max, warp_max, cap = (int(b) for b in bins)
    if not (1 <= short_max <= SHORT_LIMIT and short_max <= warp_max <= WARP_LIMIT
            and 32 <= cap <= BLOCK_LIMIT and cap & (cap - 1) == 0):
        raise ValueError(f"bins {bins}: need 1 <= short_max <= {SHORT_LIMIT}, short_max <= warp_max <= "
                         f"{WARP_LIMIT}, cap a power of two in [32, {BLOCK_LIMIT}]")
    return short_max, warp_max, cap


def _result(A, indptr, indices, data):
    """The cupyx CSR of A.T from its arrays (no read-back), flagged canonical when A is known to be."""
    canonical = True if getattr(A, "_has_canonical_format", None) is True else None
    return csr_from_parts(data, indices, indptr, A.shape[::-1], sorted_rows=True, canonical=canonical)


# ----------------------------------------------------------------------------- the segmented merge
def _merge(cp, ks, ct, A, indptr_a, indices, check, mark):
    """The segmented merge's two cooperative launches (module docstring); ``mark`` as
    :func:`_segmented` takes it (then each phase is a launch of its own)."""
    m, n = A.shape
    nnz = int(indices.size)
    tiles = (n + nnz + TILE - 1) // TILE
    g_place = max(1, min(ks.place_cap, (nnz + BLOCK - 1) // BLOCK))
    g_sort = max(1, min(ks.sort_cap[ct], tiles))
    # one zeroed workspace: counts -> A.T's indptr [0, n], block totals, tile columns, control words
    totals_off = n + 1
    tile_x_off = totals_off + g_place
    ctrl_off = tile_x_off + tiles
    ws = _cuda.zeroed(ctrl_off + _CTRL, cp.int32)
    # keys [0, nnz): scattered keys, later the merge scratch; [nnz, 2 nnz): ranks (int32), later runs
    keys = cp.empty(2 * nnz, dtype=cp.uint64)
    p_ws = ws.data.ptr
    p_rank = p_runs = keys.data.ptr + 8 * nnz
    place = (ks.place, g_place, (indptr_a, indices, np.int32(m), np.int32(n), np.int64(nnz), ws,
                                 np.int64(totals_off), np.int64(ctrl_off), np.uintp(p_rank), keys), 0, 3)
    _launch(place, mark)                       # runs while the outputs are allocated
    out_idx = cp.empty(nnz, dtype=cp.int32)
    out_val = cp.empty(nnz, dtype=A.dtype)
    sort = (ks.sort[ct], g_sort, (ws, np.int32(n), np.int64(nnz), A.data, keys, np.uintp(p_runs),
                                  np.uintp(p_ws + 4 * tile_x_off), np.uintp(p_ws + 4 * ctrl_off), out_idx, out_val),
            3, 5)
    _launch(sort, mark)
    if check and int(_cuda.read_back(ws[ctrl_off + 1:ctrl_off + 2])[0]):
        raise ValueError(f"A.indices: column indices outside [0, {n})")
    return _result(A, ws[:n + 1], out_idx, out_val)


# ----------------------------------------------------------------------------- segsort and radix
def radix_rowbits(m: int, n: int) -> int:
    """Bits of a row in the radix method's packed keys between passes (column << rowbits | row),
    or 0 when the keys stay int2: one pass (no keys between), RADIX_PACK off, or the row's and the
    column's bits past 31 (the last pass writes the whole column, which spt_bounds reads)."""
    passes, _ = radix_passes(n)
    rowbits = max(1, (int(m) - 1).bit_length())
    colbits = max(1, (int(n) - 1).bit_length())
    return rowbits if RADIX_PACK and passes > 1 and rowbits + colbits <= 31 else 0


#: the layouts by their arguments: pure functions of the shape, kept because their arithmetic is
#: host time before a call's first launch.
_LAYOUTS = BoundedCache("sptrans.layouts", maxsize=256)


def _layout(n: int, nnz: int, method: str, itemsize: int, bins: tuple, radix_tile: int,
            key_bytes: int = 8) -> tuple:
    """The scratch allocation of a segsort or radix call (:func:`_segsort_layout`,
    :func:`_radix_layout`); ``radix_tile``: RADIX_TILE, an argument so the cache keys on it
    (benchmarks/sptrans_radix_variants.py rebuilds the passes with other tiles); ``key_bytes``: 4
    where the radix keys are packed (:func:`radix_rowbits`), else 8."""
    key = (n, nnz, method, itemsize, bins, radix_tile, key_bytes)
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = (_segsort_layout(n, nnz, bins) if method == "segsort"
                  else _radix_layout(n, nnz, itemsize, radix_tile, key_bytes))
        _LAYOUTS.put(key, layout)
    return layout


def _segsort_layout(n, nnz, bins) -> tuple:
    """(front, ws_bytes, offsets of the workspace's parts in int32 words, scan tiles, the most huge
    columns). front: the keys [0, nnz) (the scattered keys) and [nnz, 2 nnz) (ranks, int32, later
    the huge columns' scratch), 16 bytes an entry. Then a zeroed workspace of int32 words: control
    words, the scan's status (8-byte words), the column lists (seg_list, n ints: medium from the
    front, long from the back; huge_list: columns of more than cap keys, at most nnz / (cap + 1))
    and last the column counts (n + 1), which spt_scan scans into A.T's indptr."""
    scan_tiles = (n + 1 + SCAN_TILE - 1) // SCAN_TILE
    max_huge = min(n, nnz // (bins[2] + 1))
    status = (_CTRL + 1) & ~1
    lists = status + 2 * scan_tiles
    huge = lists + n
    counts = huge + max_huge + 1
    return 16 * nnz, 4 * (counts + n + 1), (status, lists, huge, counts), scan_tiles, max_huge


def _radix_layout(n, nnz, itemsize, radix_tile, key_bytes) -> tuple:
    """(front, ws_bytes, offsets of the workspace's parts in int32 words, byte offsets of the
    front's parts, passes, bits, tiles). front (not zeroed): the buffers between the passes
    (:func:`_radix_between`), the sorted columns (nnz ints: the last pass's, for spt_bounds) and the
    tiles' first rows (tiles + 1 ints), rounded up to 16 bytes. The zeroed workspace of int32
    words: control words, the digit histograms (256 a pass), a tile ticket a pass and tiles x 256
    look-back words a pass (Poisson: 2.7 MB)."""
    passes, bits = radix_passes(n)
    tiles = (nnz + radix_tile - 1) // radix_tile
    between = _radix_between(passes, itemsize, nnz, key_bytes)[1]
    sorted_cols, tile_rows = between, between + 4 * nnz
    front = -(-(tile_rows + 4 * (tiles + 1)) // 16) * 16
    hist = _CTRL
    ticket = hist + passes * 256
    look = ticket + passes
    ws_bytes = 4 * (look + passes * tiles * 256)
    return front, ws_bytes, (hist, ticket, look), (sorted_cols, tile_rows), passes, bits, tiles


def _segmented(cp, ks, ct, A, indptr_a, indices, check, mark, bins, method, only_if=0, outs=None):
    """The segsort's or the radix method's launches (module docstring); no host synchronisation
    unless ``check``. The launch comes first that the GPU can start on (a single call waits for
    the host until then); allocations the later launches need are made while it runs. ``mark``
    (profiling only): None, or called with each launch's name after it. ``only_if`` (a device
    address): every launch does nothing unless the word there is set (a pattern replay's full
    path: replay._replayed_transpose); ``outs``: A.T's (indptr, indices, data) to write, else
    allocated here."""
    m, n = A.shape
    nnz = int(indices.size)
    seg = method == "segsort"
    rowbits = 0 if seg else radix_rowbits(m, n)
    layout = _layout(n, nnz, method, A.dtype.itemsize, bins, RADIX_TILE, 4 if rowbits else 8)
    front, ws_bytes = layout[:2]
    # one scratch allocation (each allocation and each zeroing is host time, which bounds a call's
    # time): the front (keys, or the radix buffers), then the zeroed workspace (the layouts)
    scratch = cp.empty(front + ws_bytes, dtype=cp.uint8)
    _cuda.hold(scratch)   # a recorded call's graph (SpTrans.runner) reads and writes it on every launch
    p_front = scratch.data.ptr
    p_ws = p_front + front   # the 8-byte status words aligned: front is a multiple of 16 bytes
    _cuda.zero(p_ws, ws_bytes)

    def done(name):
        if mark is not None:
            mark(name)
    launch = _segsort_launches if seg else _radix_launches
    indptr, out_idx, out_val = launch(cp, ks, ct, A, indptr_a, indices, layout, p_front, p_ws, bins, rowbits,
                                      outs, done, only_if)
    if check and int(_cuda.read_at(p_ws, 1, np.int32)[0]):   # the bad-index flag: control word 0
        raise ValueError(f"A.indices: column indices outside [0, {n})")
    return _result(A, indptr, out_idx, out_val)


def _outputs(cp, A, n, nnz, outs):
    """A.T's (indptr, indices, data): ``outs``, or allocated."""
    if outs is not None:
        return outs
    return cp.empty(n + 1, dtype=cp.int32), cp.empty(nnz, dtype=cp.int32), cp.empty(nnz, dtype=A.dtype)


def _segsort_launches(cp, ks, ct, A, indptr_a, indices, layout, p_keys, p_ws, bins, rowbits, outs, done, only_if):
    """The segsort's six launches (module docstring) on the scratch of :func:`_segsort_layout`;
    returns A.T's arrays."""
    m, n = A.shape
    nnz = int(indices.size)
    _, _, offs, scan_tiles, max_huge = layout
    short_max, warp_max, cap = bins
    p_status, p_list, p_huge, p_counts = (p_ws + 4 * o for o in offs)
    p_second = p_keys + 8 * nnz
    ks.count(((nnz + CNT_CHUNK - 1) // CNT_CHUNK,), (BLOCK,), (indices, nnz, n, p_counts, p_second, p_ws, only_if))
    done("count")
    # A.T's indptr is an allocation of its own, so the returned matrix does not keep the
    # workspace alive
    indptr = cp.empty(n + 1, dtype=cp.int32) if outs is None else outs[0]
    ks.scan((scan_tiles,), (BLOCK,), (p_counts, indptr, n, p_status, p_ws, p_list, p_huge, short_max, warp_max, cap,
                                      only_if))
    done("scan")
    ks.scatter(((m + nnz + TILE - 1) // TILE,), (BLOCK,), (indptr_a, indices, m, nnz, indptr, p_second, n, p_keys,
                                                           only_if))
    done("scatter")
    if outs is None:
        out_idx, out_val = cp.empty(nnz, dtype=cp.int32), cp.empty(nnz, dtype=A.dtype)
    else:
        out_idx, out_val = outs[1:]
    # at most min(n, nnz / (short_max + 1)) columns are medium or long: a warp each, grid-stride
    warps = BIG_BLOCK // 32
    big_grid = max(1, min(8 * ks.sms, (min(n, nnz // (short_max + 1)) + warps - 1) // warps))
    for name, fn, grid, block, args in (
            ("sort_short", ks.sort_short[ct], (n + SHORT_BLOCK - 1) // SHORT_BLOCK, SHORT_BLOCK,
             (indptr, n, p_keys, A.data, out_idx, out_val, short_max)),
            ("sort_big", ks.sort_big[ct], big_grid, BIG_BLOCK,
             (indptr, n, p_list, p_huge, p_ws, p_keys, A.data, out_idx, out_val, cap)),
            # merge rounds of the huge columns (their chunks sorted by spt_sort_big): a block each
            ("merge_long", ks.merge_long[ct], max(1, min(2 * ks.sms, max_huge)), MERGE_BLOCK,
             (indptr, p_huge, p_ws, p_keys, p_second, A.data, out_idx, out_val, cap))):
        fn((grid,), (block,), args + (only_if,))
        done(name)
    return indptr, out_idx, out_val


def _radix_between(passes: int, itemsize: int, nnz: int, key_bytes: int = 8) -> tuple:
    """(buffers, bytes, bytes of the keys) between the radix passes: ping-pong buffers of keys
    (key_bytes each: int2 (column, row), or 4 packed) and values, at most two (none for one pass),
    the keys first, their part rounded up to 16 bytes so the values are aligned."""
    between = min(2, passes - 1)
    keys = -(-between * key_bytes * nnz // 16) * 16
    return between, keys + between * itemsize * nnz, keys


def _radix_launches(cp, ks, ct, A, indptr_a, indices, layout, p_front, p_ws, bins, rowbits, outs, done, only_if):
    """spt_digits, the radix passes and spt_bounds (module docstring) on the scratch of
    :func:`_radix_layout`; returns A.T's arrays. Only the last pass and spt_bounds are given A.T's
    arrays (a replayed graph then moves three nodes a call, not every pass: SpTrans.runner).
    ``rowbits`` > 0: the keys between passes are packed (:func:`radix_rowbits`)."""
    m, n = A.shape
    nnz = int(indices.size)
    _, _, offs, front_offs, passes, bits, tiles = layout
    p_hist, p_ticket, p_look = (p_ws + 4 * o for o in offs)
    p_sorted, p_tile_rows = (p_front + o for o in front_offs)
    p_live = p_ws + 4 * SEG_N_LIVE
    grid = max(1, min(-(-nnz // TILE), DIGITS_BLOCKS_PER_SM * ks.sms))
    ks.digits((grid,), (BLOCK,), (indptr_a, m, indices, nnz, n, passes, bits, p_hist, p_ws, p_tile_rows,
                                  RADIX_TILE, only_if))
    done("digits")
    indptr, out_idx, out_val = _outputs(cp, A, n, nnz, outs)
    item = A.dtype.itemsize
    key_bytes = 4 if rowbits else 8
    between, _, keys = _radix_between(passes, item, nnz, key_bytes)
    bufs = [(p_front + key_bytes * nnz * i, p_front + keys + item * nnz * i) for i in range(between)]
    first, src, live = (indices, A.data), (0, 0), 0
    for p in range(passes):   # the last pass writes A.T and the sorted columns
        last = p == passes - 1
        dst = (0, 0) if last else bufs[p % 2]
        ks.radix_pass[ct]((max(1, tiles),), (BLOCK,),
                          (indptr_a, m, *first, *src, nnz, live, n, p * bits, bits, p_hist + 4 * 256 * p,
                           p_look + 4 * p * tiles * 256, p_ticket + 4 * p, *dst,
                           *((out_idx, out_val, p_sorted) if last else (0, 0, 0)), p_tile_rows if p == 0 else 0,
                           rowbits, only_if))
        done(f"pass{p}")
        # later passes read the keys of the valid entries only (spt_digits' count of them)
        first, src, live = (0, 0), dst, p_live
    ks.bounds(((nnz + 1 + TILE - 1) // TILE,), (BLOCK,), (p_sorted, p_live, n, indptr, only_if))
    done("bounds")
    return indptr, out_idx, out_val
