"""SpTRANS on the GPU: CSR of A.T, rows sorted by column, stable and deterministic.

:func:`transpose` takes a cupyx CSR A (m x n, float32 or float64) and returns the cupyx CSR of
A.T (n x m) with no host synchronisation (the result is assembled with cupyx's ``_from_parts``,
which does not read the arrays back; cupyx's public ``csr_matrix((data, indices, indptr))`` waits
for the GPU in CuPy 14.2). Two methods (sptrans.cu has the details):

``method="auto"`` (default): "radix" when it needs at most two passes (n <= 2^16) or the mean
column holds at least RADIX_MEAN_COLUMN entries, else "segsort" (:func:`auto_method`; from the shape,
so no host synchronisation). The segsort's cost grows with long columns (bitonic sorts, merge
rounds), the radix method's with log2(n) (passes): H100 2026-11-23 (01cfb4f), GPU time queued,
float64: Poisson 104 us segsort / 149 us radix, world_highways 112 / 172, banded 145 / 237,
rmat-scale17 401 / 187, wordnet 726 / 124, gene_go 536 / 139. Deciding on the GPU instead (both kernel sets launched, the
unchosen one returning at once) cost more host time than it saved: 0.94x CuPy geomean against
1.07x for the radix method alone (2fb0246).

``method="segsort"``: six plain launches after one zeroed workspace.
``spt_count`` per-column counts and each nonzero's rank in its column, aggregated per 2048-entry
chunk in a shared-memory hash table (one global atomic per distinct column of a chunk: hot columns
of R-MAT/wordnet/gene_go no longer serialise an atomic per entry on one word); ``spt_scan`` a
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

``method="merge"``: the segmented merge of SEEDS section 3 in two cooperative launches (phases
separated by grid barriers): count/scan/scatter as above but with warp-aggregated atomics, then
merge-path tiles sorted in shared memory (per-thread sorts, log2(BLOCK) merge rounds) and
binary-tree rounds over the rows crossing tiles, every block taking whole tiles of output slots.
It was the only method until 2026-11; on an H100 (dc49754) it ran at 0.60x CuPy's
``A.T.tocsr()`` geomean: the tile sort (log2(2048) shared-memory merge rounds over every nonzero,
~200 us a 2M-nonzero matrix) did work that rows of A.T of ~7-20 entries do not need, and the
per-entry atomics on hot columns took up to 150 us. It is kept because its cost does not depend on
the longest row of A.T: the segsort fallback merges a row of more than ``cap`` keys by one block
(L log(L / cap) work on one SM), so a matrix whose nonzeros sit mostly in a few columns of
millions of entries transposes faster with ``method="merge"``.

``method="radix"``: a stable LSD counting sort of A's entries by column, so every row of A.T comes
out in A's order and nothing is sorted per row. ``spt_count`` and ``spt_scan`` as above (no ranks:
``spt_count<false>``, whose atomics are reductions nobody waits for; spt_scan also bins the column
counts into each pass's digit histogram), then ``spt_radix_pass``
once per digit (ceil(log2 n / 8) passes of at most 8 bits, least significant first): a block ranks
a tile of 2048 keys stably by digit (warp by warp, __match_any_sync), finds the digit's count in
earlier tiles by decoupled look-back (a word per tile and digit), stages the tile in shared memory
by digit and writes it coalesced. Keys carry (column, row) and the value, so the last pass writes
A.T with no gather; nnz must be below 2^30 (32-bit look-back words; "auto" falls back to the
segsort past that).

Plans (``SpTrans.runner``) replay their launches as a CUDA graph from an A's second call, and the
graph first checks A's pattern against the one it was recorded with: where it is the same, A.T
is A's values gathered through the kept permutation (``spt_same``, ``spt_finish``), and the
method's launches between them do nothing (their ``only_if`` argument); where it differs, they run
into scratch arrays that ``spt_finish`` copies.

Keys order each row of A.T by row of A and then by position in A, so the transpose is stable and
deterministic: duplicated (i, j) entries of A stay separate entries of A.T, in A's order (SciPy's
``A.T.tocsr()`` keeps them too). The keys are unique (e is), so no sort needs to be stable. The
result has sorted indices; it is flagged canonical only when A is (known to be) canonical. Indices
must be int32 (int64 inputs are converted when every index, the shape and nnz fit below 2^31; else
OverflowError). Column indices out of [0, n) are skipped without a memory fault (the slots past
A.T's indptr[n] are then unspecified); ``check=True`` raises on them (one host transfer, after the
launches).
"""
from __future__ import annotations

import functools
import math
import threading

import numpy as np

from ...core.xp import cupy_module, cupyx_sparse
from ...core.validation import check_transpose_call
from .. import _cuda, _graph
from ...core.types import Cost
from ..base import KeepsA
from ..registry import register
from ..spgemm.gpu import check_csr, csr_from_parts

_CU = "sptrans/sptrans.cu"
_NAMES = ("spt_place", "spt_sort<float>", "spt_sort<double>", "spt_count<true>", "spt_count<false>",
          "spt_scan", "spt_scatter", "spt_sort_short<float>", "spt_sort_short<double>",
          "spt_sort_big<float>", "spt_sort_big<double>", "spt_merge_long<float>", "spt_merge_long<double>",
          "spt_radix_pass<float>", "spt_radix_pass<double>", "spt_same", "spt_finish<float>", "spt_finish<double>")
#: Must match SPT_BLOCK and SPT_ITEMS in sptrans.cu.
BLOCK, ITEMS = 256, 8
TILE = BLOCK * ITEMS
#: Phases of the segmented merge's two kernels (profiling runs one a launch): spt_place 0-2, spt_sort 3-4.
MERGE_PHASES = ("count", "scan", "scatter", "tile_sort", "cross_merge")
#: The segsort's launches, in order.
PHASES = ("count", "scan", "scatter", "sort_short", "sort_big", "merge_long")
#: Default length bins of the segsort: (short_max, warp_max, cap); must stay within sptrans.cu's
#: SEG_SHORT_STAGE / 32 (thread), SEG_WARP_KEYS (warp) and SEG_BLOCK_KEYS (block) limits.
BINS = (32, 512, 4096)
SHORT_LIMIT, WARP_LIMIT, BLOCK_LIMIT = 32, 512, 4096
CNT_CHUNK, SCAN_TILE, SHORT_BLOCK, BIG_BLOCK, MERGE_BLOCK = 2048, BLOCK * ITEMS, 128, 256, 512
_CTRL = 8   # merge: barrier, bad-index flag, longest column; segsort: bad, tile counter, medium, long, huge
SEG_N_LIVE = 5   # control word of A.T's indptr[n] (spt_scan's copy, which the radix passes read)
METHODS = ("auto", "segsort", "radix", "merge")
#: radix method: digit bits at most (sptrans.cu RDX_BINS = 2^8; columns below 2^31 so at most
#: RDX_MAX_PASSES = 4 passes) and the nnz bound of its 32-bit look-back words (count << 2 | flag)
RADIX_BITS, RADIX_NNZ_LIMIT = 8, 2**30
#: keys a block of spt_radix_pass ranks (SPT_BLOCK x RDX_ITEMS)
RADIX_TILE = BLOCK * 8
#: radix method: keys between passes packed in one int ((column >> bits) << rowbits | row) where
#: they fit 31 bits (:func:`radix_rowbits`); False: always (column, row) int2 (tests reach both)
RADIX_PACK = True
#: method="auto" takes the radix method past this mean column length (nnz / n) even when it needs
#: three or four passes: H100 2026-11-23 (01cfb4f), radix vs segsort alone x CuPy, float64:
#: rmat-scale17 (mean 14.8) 1.01 / 0.54, ice40 (22) 1.02 / 0.68; banded (17, no long column) 1.06
#: / 1.68 is the case this rule gets wrong
RADIX_MEAN_COLUMN = 14
INT32_MAX = int(np.iinfo(np.int32).max)


class _Kernels:
    """The kernels of the current device: the segmented merge's two (with the most blocks each may
    have resident at once: a cooperative launch must not ask for more) and the segsort's six."""

    def __init__(self, cp):
        self.sms = sms = _cuda.device_attribute("MultiProcessorCount", cp.cuda.Device().id)
        # the compiled cuda Functions: the merge's launches take enable_cooperative_groups, and
        # the others skip RawKernel's wrapper (~2.4 us of host time a launch)
        def fn(name):
            return _cuda.compiled(_CU, name, _NAMES)

        def typed(name):
            return {ct: fn(f"{name}<{ct}>") for ct in ("float", "double")}
        self.place, self.sort = fn("spt_place"), typed("spt_sort")

        # the plain launches go through the driver with packed parameters (_cuda.Launcher: a
        # call's four to six launches were most of its ~170-200 us of host time through CuPy)
        # (signatures read from the kernels' declarations: _cuda.signature)
        def packed(name):
            return _cuda.packed(fn(name), _CU, name)

        def packed_typed(name):
            return {ct: _cuda.packed(f, _CU, name) for ct, f in typed(name).items()}
        # spt_count with ranks (the segsort) and without (the radix method: reductions, no waits)
        self.count = {ranks: packed(f"spt_count<{str(ranks).lower()}>") for ranks in (True, False)}
        self.scan, self.scatter = packed("spt_scan"), packed("spt_scatter")
        self.same, self.finish = packed("spt_same"), packed_typed("spt_finish")   # pattern replays
        self.sort_short, self.sort_big = packed_typed("spt_sort_short"), packed_typed("spt_sort_big")
        self.merge_long, self.radix_pass = packed_typed("spt_merge_long"), packed_typed("spt_radix_pass")
        self.place_cap = sms * _cuda.resident_blocks(self.place, BLOCK)
        self.sort_cap = {ct: sms * _cuda.resident_blocks(f, BLOCK) for ct, f in self.sort.items()}
        if self.place_cap < 1 or min(self.sort_cap.values()) < 1:
            raise RuntimeError(f"sptrans: no block of {BLOCK} threads fits on this GPU")


_KERNELS: dict = {}


def _kernels(cp):
    dev = cp.cuda.runtime.getDevice()   # (cuda.Device() builds an object first: host time a call)
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


def transpose(A, *, check: bool = False, method: str = "auto"):
    """CSR of A.T (cupyx), rows sorted by column; see the module docstring.

    check: verify A's column indices lie in [0, n) (waits for the GPU: one host transfer).
    method: "auto" (default: :func:`auto_method` picks "radix" or "segsort" from the shape),
        "segsort", "radix" or "merge" (the segmented merge); see the module docstring.
    """
    if method not in METHODS:
        raise ValueError(f"method: {method!r}; expected one of {METHODS}")
    return _transpose(A, check, None, method)


@functools.lru_cache(maxsize=None)
def _check_bins(bins):
    short_max, warp_max, cap = (int(b) for b in bins)
    if not (1 <= short_max <= SHORT_LIMIT and short_max <= warp_max <= WARP_LIMIT
            and 32 <= cap <= BLOCK_LIMIT and cap & (cap - 1) == 0):
        raise ValueError(f"bins {bins}: need 1 <= short_max <= {SHORT_LIMIT}, short_max <= warp_max <= "
                         f"{WARP_LIMIT}, cap a power of two in [32, {BLOCK_LIMIT}]")
    return short_max, warp_max, cap


def _transpose(A, check, mark, method="auto", bins=BINS):
    """transpose(); ``mark`` (profiling only): None, or called with each phase's name after that
    phase is launched (the merge method then runs each phase in a launch of its own). ``bins``
    (segsort; tests force small ones to reach every sort path on small matrices): (short_max,
    warp_max, cap)."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("sptrans needs CuPy and an NVIDIA GPU")
    csp = cupyx_sparse()
    check_csr("A", A)
    m, n = A.shape
    dtype = np.dtype(A.dtype)
    indptr_a, indices = _int32_arrays(A)
    nnz = int(indices.size)
    if nnz == 0 or m == 0 or n == 0:
        return csp.csr_matrix((n, m), dtype=dtype)
    ks = _kernels(cp)
    ct = _cuda.ctype(dtype)
    if method == "radix" and nnz >= RADIX_NNZ_LIMIT:
        raise OverflowError(f"A: {nnz:,} nonzeros; method='radix' needs fewer than 2^30 (its look-back "
                            f"words), method='segsort' takes up to 2^31 - 1")
    if method == "auto":
        method = auto_method(n, nnz)
    if method != "merge":
        return _segmented(cp, ks, ct, A, indptr_a, indices, check, mark, _check_bins(bins), method)
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
    out_val = cp.empty(nnz, dtype=dtype)
    sort = (ks.sort[ct], g_sort, (ws, np.int32(n), np.int64(nnz), A.data, keys, np.uintp(p_runs),
                                  np.uintp(p_ws + 4 * tile_x_off), np.uintp(p_ws + 4 * ctrl_off), out_idx, out_val),
            3, 5)
    _launch(sort, mark)
    if check and int(_cuda.read_back(ws[ctrl_off + 1:ctrl_off + 2])[0]):
        raise ValueError(f"A.indices: column indices outside [0, {n})")
    return _result(A, ws[:n + 1], out_idx, out_val)


def radix_passes(n: int) -> tuple:
    """(passes, digit bits) of the radix method for n columns: as few passes of at most RADIX_BITS
    bits as cover column n - 1, the bits spread evenly over them."""
    bits = max(1, (int(n) - 1).bit_length())
    passes = -(-bits // RADIX_BITS)
    return passes, -(-bits // passes)


def auto_method(n: int, nnz: int) -> str:
    """method="auto"'s choice from the shape alone (no host synchronisation): "radix" when its
    passes are at most two (n <= 2^16) or the mean column is long (nnz / n >= RADIX_MEAN_COLUMN),
    where the segsort's per-column sorts dominate; else "segsort", whose work on short columns is
    less than three radix passes. nnz >= 2^30: "segsort" (the radix look-back words' limit)."""
    if nnz >= RADIX_NNZ_LIMIT:
        return "segsort"
    return "radix" if radix_passes(n)[0] <= 2 or nnz >= RADIX_MEAN_COLUMN * n else "segsort"


def radix_rowbits(m: int, n: int) -> int:
    """Bits of a row in the radix method's packed keys between passes, or 0 when the keys stay
    int2: one pass (no keys between), RADIX_PACK off, or the row's bits and the column's left after
    the first digit past 31."""
    passes, bits = radix_passes(n)
    rowbits = max(1, (int(m) - 1).bit_length())
    return rowbits if RADIX_PACK and passes > 1 and rowbits + (passes - 1) * bits <= 31 else 0


@functools.lru_cache(maxsize=256)
def _layout(n: int, nnz: int, method: str, itemsize: int, bins: tuple, radix_tile: int,
            key_bytes: int = 8) -> tuple:
    """The scratch allocation of a segsort or radix call (a pure function of the shape, cached: its
    arithmetic is host time before the first launch): (front, ws_bytes, offsets of the workspace's
    parts in int32 words, passes, bits, scan tiles, radix tiles, the most huge columns).

    front: the segsort's keys [0, nnz) (the scattered keys) and [nnz, 2 nnz) (ranks, int32, later
    the huge columns' scratch), or the radix passes' buffers (_radix_between), rounded up to 16
    bytes. Then a zeroed workspace of int32 words: control words, the scan's status (8-byte
    words); segsort: the column lists (seg_list, n ints: medium from the front, long from the
    back; huge_list: columns of more than cap keys, at most nnz / (cap + 1)); radix: the digit
    histograms, a tile ticket and tiles x 256 look-back words a pass (Poisson: 2.7 MB); last the
    column counts (n + 1), which spt_scan scans into A.T's indptr. ``radix_tile``: RADIX_TILE, an
    argument so the cache keys on it (benchmarks/sptrans_radix_variants.py rebuilds the passes with
    other tiles); ``key_bytes``: 4 where the radix keys are packed (:func:`radix_rowbits`), else 8."""
    seg = method == "segsort"
    passes, bits = radix_passes(n)
    scan_tiles = (n + 1 + SCAN_TILE - 1) // SCAN_TILE
    tiles = (nnz + radix_tile - 1) // radix_tile
    max_huge = min(n, nnz // (bins[2] + 1))
    status = (_CTRL + 1) & ~1
    lists = status + 2 * scan_tiles
    huge = lists + (n if seg else 0)
    hist = huge + (max_huge + 1 if seg else 0)
    ticket = hist + (0 if seg else passes * 256)
    look = ticket + (0 if seg else passes)
    counts = look + (0 if seg else passes * tiles * 256)
    ws_bytes = 4 * (counts + n + 1)
    front = -(-(16 * nnz if seg else _radix_between(passes, itemsize, nnz, key_bytes)[1]) // 16) * 16
    return front, ws_bytes, (status, lists, huge, hist, ticket, look, counts), passes, bits, scan_tiles, tiles, max_huge


def _segmented(cp, ks, ct, A, indptr_a, indices, check, mark, bins, method, only_if=0, outs=None):
    """The segsort's or the radix method's launches (module docstring): count and scan, then the
    segsort's four kernels or the radix passes; no host synchronisation unless ``check``. The
    launch comes first that the GPU can start on (a single call waits for the host until then);
    allocations the later launches need are made while it runs. ``only_if`` (a device address):
    every launch does nothing unless the word there is set (a pattern replay's full path:
    _replayed_transpose); ``outs``: A.T's (indptr, indices, data) to write, else allocated here."""
    m, n = A.shape
    nnz = int(indices.size)
    seg = method == "segsort"
    rowbits = 0 if seg else radix_rowbits(m, n)
    layout = _layout(n, nnz, method, A.dtype.itemsize, bins, RADIX_TILE, 4 if rowbits else 8)
    front, ws_bytes, offs, passes, bits, scan_tiles, tiles, max_huge = layout
    short_max, warp_max, cap = bins if seg else (INT32_MAX,) * 3   # radix: no column is binned
    # one scratch allocation (each allocation and each zeroing is host time, which bounds a call's
    # time): keys or the radix buffers, then the zeroed workspace (_layout)
    scratch = cp.empty(front + ws_bytes, dtype=cp.uint8)
    _cuda.hold(scratch)   # a recorded call's graph (SpTrans.runner) reads and writes it on every launch
    p_keys = scratch.data.ptr
    p_ws = p_keys + front   # the 8-byte status words aligned: front rounded up to 16 bytes
    _cuda.zero(p_ws, ws_bytes)
    # device addresses as plain ints (the launches pack them: _cuda.Launcher)
    p_status, p_list, p_huge, p_hist, p_ticket, p_look, p_counts = (p_ws + 4 * o for o in offs)
    p_second = p_keys + 8 * nnz if seg else 0

    def done(name):
        if mark is not None:
            mark(name)
    ks.count[seg](((nnz + CNT_CHUNK - 1) // CNT_CHUNK,), (BLOCK,), (indices, nnz, n, p_counts, p_second, p_ws,
                                                                     only_if))
    done("count")
    # A.T's indptr is an allocation of its own, so the returned matrix does not keep the
    # workspace alive
    indptr = cp.empty(n + 1, dtype=cp.int32) if outs is None else outs[0]
    ks.scan((scan_tiles,), (BLOCK,), (p_counts, indptr, n, p_status, p_ws, p_list if seg else 0,
                                      p_huge if seg else 0, short_max, warp_max, cap, 0 if seg else p_hist,
                                      passes, bits, only_if))
    done("scan")
    if seg:
        ks.scatter(((m + nnz + TILE - 1) // TILE,), (BLOCK,), (indptr_a, indices, m, nnz, indptr, p_second, n, p_keys,
                                                               only_if))
        done("scatter")
    if outs is None:
        out_idx, out_val = cp.empty(nnz, dtype=cp.int32), cp.empty(nnz, dtype=A.dtype)
    else:
        out_idx, out_val = outs[1:]
    if seg:
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
    else:
        _radix_launches(ks, ct, A, indptr_a, indices, passes, bits, tiles, rowbits,
                        (p_keys, p_hist, p_look, p_ticket, p_ws + 4 * SEG_N_LIVE), out_idx, out_val, done, only_if)
    if check and int(_cuda.read_at(p_ws, 1, np.int32)[0]):   # the bad-index flag: control word 0
        raise ValueError(f"A.indices: column indices outside [0, {n})")
    return _result(A, indptr, out_idx, out_val)


def _result(A, indptr, indices, data):
    """The cupyx CSR of A.T from its arrays (no read-back), flagged canonical when A is known to be."""
    canonical = True if getattr(A, "_has_canonical_format", None) is True else None
    return csr_from_parts(data, indices, indptr, A.shape[::-1], sorted_rows=True, canonical=canonical)


def _radix_between(passes: int, itemsize: int, nnz: int, key_bytes: int = 8) -> tuple:
    """(buffers, bytes, bytes of the keys) between the radix passes: ping-pong buffers of keys
    (key_bytes each: int2 (column, row), or 4 packed) and values, at most two (none for one pass),
    the keys first, their part rounded up to 16 bytes so the values are aligned."""
    between = min(2, passes - 1)
    keys = -(-between * key_bytes * nnz // 16) * 16
    return between, keys + between * itemsize * nnz, keys


def _radix_launches(ks, ct, A, indptr_a, indices, passes, bits, tiles, rowbits, ptrs, out_idx, out_val, done,
                    only_if=0):
    """The radix passes (module docstring): ptrs are the device addresses of the buffers between
    passes (:func:`_radix_between`), the digit histograms, the look-back words, the tile tickets
    (a pass each) and the control word spt_scan copies A.T's indptr[n] to (the valid entries); only
    the last pass is given A.T's arrays (a replayed graph then moves two nodes a call, not every
    pass: SpTrans.runner). ``rowbits`` > 0: the keys between passes are packed
    (:func:`radix_rowbits`); the first pass drops the column's first digit, so the later passes
    take their shift less one digit."""
    m, n = A.shape
    nnz = int(indices.size)
    buf, hist, look, ticket, n_live = ptrs
    item = A.dtype.itemsize
    key_bytes = 4 if rowbits else 8
    between, _, keys = _radix_between(passes, item, nnz, key_bytes)
    bufs = [(buf + key_bytes * nnz * i, buf + keys + item * nnz * i) for i in range(between)]
    first, src, p_live = (indices, A.data), (0, 0), 0
    for p in range(passes):   # the last pass writes A.T
        last = p == passes - 1
        dst = (0, 0) if last else bufs[p % 2]
        shift = p * bits - (bits if rowbits and p > 0 else 0)
        drop = bits if rowbits and p == 0 else 0
        ks.radix_pass[ct]((max(1, tiles),), (BLOCK,),
                          (indptr_a, m, *first, *src, nnz, p_live, n, shift, bits, hist + 4 * 256 * p,
                           look + 4 * p * tiles * 256, ticket + 4 * p, *dst, *((out_idx, out_val) if last else (0, 0)),
                           rowbits, drop, only_if))
        done(f"pass{p}")
        # later passes read the keys of the valid entries only (n_live: spt_scan's count of them)
        first, src, p_live = (0, 0), dst, n_live


def _launch(kernel, mark):
    """Cooperative launch of (fn, grid, args, first phase, end phase): all its phases in one launch,
    or (profiling: ``mark`` given) one phase a launch, ``mark(name)`` after each."""
    fn, grid, args, lo, hi = kernel
    for a, b in ((lo, hi),) if mark is None else ((p, p + 1) for p in range(lo, hi)):
        fn((grid,), (BLOCK,), (*args, np.int32(a), np.int32(b)), enable_cooperative_groups=True)
        if mark is not None:
            mark(MERGE_PHASES[a])


# ----------------------------------------------------------------------------- the planner's kernel
#: A plan run's cost by method and dtype: (fixed seconds, bytes an entry of A at the copy
#: bandwidth; the radix method: bytes an entry a pass), relative least squares
#: (benchmarks/sptrans_fit.py) over two runs of benchmarks/sptrans.py on an H100 (c148a21, 14
#: matrices each, sptrans-graph-{a,b}-h100-2026-11-25-c148a21.json). The segsort and radix methods
#: are fitted on plan runs (SpTrans.runner: the launches replayed as a CUDA graph); the segsort on
#: the matrices whose longest column holds at most 64 entries (measured / model 0.84-1.46), the
#: radix method on all (0.82-1.27; a fee an entry, not a pass, left 0.75-1.41), the merge on
#: transpose(A, method="merge") calls (0.79-1.77).
METHOD_COSTS = {"segsort": {"float64": (76.1e-6, 66.3), "float32": (74.2e-6, 57.6)},
                "radix": {"float64": (55.7e-6, 54.1), "float32": (54.6e-6, 46.7)},
                "merge": {"float64": (117.4e-6, 424.1), "float32": (110.9e-6, 420.9)}}
#: ... and the segmented sort's long rows of A.T (warp, block and merge sorts): bytes an entry of A
#: per doubling of the longest column past BINS[0], the median over the seven matrices whose longest
#: column holds 600-59,512 entries (8564a85: 48, 37-124 B; the c148a21 runs above: 48-49, 35-125)
LONG_COLUMN_BYTES = 48.0


class SpTrans(KeepsA):
    """The planner's SpTRANS (:func:`matplan.planner.plan_transpose`): :func:`transpose` with the
    method as its parameter, chosen from A's longest column and its columns' count instead of
    method="auto"'s rule from the shape alone."""
    name = "sptrans.transpose"
    ops = ("sptrans",)
    backend = "gpu"
    deterministic = True    # no arithmetic; every row of A.T in A's order
    reads_a_at_run = True

    def supports(self, f):
        if max(f.m, f.n, f.nnz) > INT32_MAX:
            return f"A {f.m}x{f.n} with {f.nnz:,} nonzeros: sptrans needs rows, columns and nonzeros below 2^31 - 1"
        return None

    def candidates(self, f, device):
        for method in ("segsort", "radix", "merge"):
            if method != "radix" or f.nnz < RADIX_NNZ_LIMIT:
                yield {"method": method}

    def cost(self, f, params, device):
        method = params["method"]
        fixed, per_entry = METHOD_COSTS[method][f.dtype]
        passes, bits = radix_passes(f.n)
        t = fixed + f.nnz * per_entry * (passes if method == "radix" else 1) / device.mem_bandwidth
        if method == "segsort":
            doublings = max(0.0, math.log2(max(f.col_max, 1) / BINS[0]))
            t += f.nnz * LONG_COLUMN_BYTES * doublings / device.mem_bandwidth
            why = (f"segmented sort: scatter, then every row of A.T sorted by its length (longest "
                   f"{f.col_max:,}" + (f", {doublings:.1f} doublings past {BINS[0]} at "
                                       f"{LONG_COLUMN_BYTES:.0f} B an entry each" if doublings else "") + ")")
        elif method == "radix":
            why = f"radix: {passes} stable counting pass(es) of {bits} bits over {f.n:,} columns"
        else:
            why = "segmented merge: merge-path tiles, tree rounds across them"
        return Cost(0.0, t, f"{why}; {per_entry:.0f} B an entry{' a pass' if method == 'radix' else ''} at the "
                            f"copy bandwidth + {fixed * 1e6:.0f} us (fitted on an H100)")

    def run(self, prepared, B, out=None):
        check_transpose_call(B, out)
        return transpose(prepared.arrays["A"], method=prepared.params["method"])

    def runner(self, params):
        """``Plan.run``'s call: the segsort's or radix method's launches for an A (its arrays'
        addresses, shape and nnz) on a stream are recorded at its second call and replayed from
        then on as one CUDA graph (:class:`_graph.Replay`), whose outputs are allocated after the
        previous launch: a call's host path before the GPU starts is one graph launch instead of
        the Python launch path (60-145 us of host time on an H100 host). The first call of a key
        takes :meth:`run`, so a plan applied once to each of many matrices pays no recording
        (0.4-1.3 ms). Each graph holds its call's scratch (about 16 bytes an entry for the segsort;
        the passes' buffers and look-back words for the radix method) and the next call's output
        arrays; a runner keeps at most GRAPH_CACHE_SIZE graphs. The merge method, int64 or empty A,
        and hosts where the driver's graph API cannot be loaded take :meth:`run` on every call.
        Pattern replays (PATTERN_REPLAYS, :class:`_Pattern`): a graph keeps A's pattern as recorded
        (A's and A.T's indices and indptr, and the permutation between them, ~12 bytes an entry)
        and first checks A against it on the GPU; where it is the same, A.T is A's values gathered
        through the permutation and the kept indices copied (about 20 bytes an entry moved instead
        of the method's passes), and the method's launches do nothing; where it differs, they run
        as recorded. A key whose pattern was found changed is recorded again without a pattern."""
        general = super().runner(params)
        method = params["method"]
        cp = cupy_module()
        if cp is None or method == "merge" or not _graph.available():
            return general
        graphs, seen, unstable, lock = {}, set(), set(), threading.Lock()

        def replay(key, A):
            """The kept graph of ``key``, a new one at its second call, None at its first (which is
            remembered) or for no key (under ``lock``)."""
            rep = graphs.get(key)
            if rep is not None and rep.pattern is not None and rep.pattern.changed():
                graphs.pop(key)                      # A's pattern changed since its graph's: a new one,
                unstable.add(key)                    # without pattern replays (it may change again)
                rep = None
            if rep is not None or key is None:
                return rep
            if key not in seen:
                if len(seen) >= 4 * GRAPH_CACHE_SIZE:
                    seen.clear(), unstable.clear()
                seen.add(key)
                return None
            if len(graphs) >= GRAPH_CACHE_SIZE:
                graphs.pop(next(iter(graphs)))   # the oldest (freed once its launches are done)
            pattern = _Pattern(A, method) if PATTERN_REPLAYS and key not in unstable else None
            rep = graphs[key] = _graph.Replay(lambda: _replayed_transpose(A, method, pattern),
                                              lambda T: (T.indptr, T.indices, T.data))
            rep.pattern = pattern   # its _Pattern, or None
            return rep

        def run(A, B, out=None):
            check_transpose_call(B, out)
            key = _replay_key(cp, A, method)
            with lock:
                rep = replay(key, A)
                arrays = None if rep is None else rep.run(key[1])   # the current stream (the key's)
                if arrays is not None and rep.pattern is not None:
                    rep.pattern.note(key[1])
            if arrays is None:
                return general(A, B, out)
            return _result(A, *arrays)
        run.graphs = graphs   # the kept Replays by key (:func:`_replay_key`), each with its .pattern: inspected by tests
        return run


#: CUDA graphs a SpTrans runner (one per plan) keeps: one per A and stream it last ran on.
GRAPH_CACHE_SIZE = 2
#: A replayed graph first checks A's pattern against the one it was recorded with and, where it is
#: the same, writes A.T from the kept pattern and A's values (_Pattern); False: every replay runs
#: the method's launches.
PATTERN_REPLAYS = True


class _Pattern:
    """A's pattern when its graph was recorded, for pattern replays: copies of A's indptr and
    indices, A.T's indptr and indices, and src (slot q of A.T holds entry src[q] of A: A's
    positions transposed as float64 values, exact below 2^53); ``flag`` is the graph's verdict word
    (spt_same: set where A's pattern differs), copied after each replay to pinned memory that the
    next call reads without waiting (``changed``) to record a graph of the new pattern."""

    def __init__(self, A, method):
        cp = cupy_module()
        indptr_a, indices = _int32_arrays(A)
        positions = csr_from_parts(cp.arange(indices.size, dtype=cp.float64), indices, indptr_a, A.shape,
                                   sorted_rows=False, canonical=None)
        T = _transpose(positions, False, None, method)
        self.kept = (indptr_a.copy(), indices.copy(), T.indptr, T.indices, T.data.astype(cp.int32))
        self.flag = cp.empty(1, dtype=cp.uint32)
        self.host = np.frombuffer(cp.cuda.alloc_pinned_memory(4), dtype=np.uint32)
        self.host[0] = 0

    def note(self, stream_ptr: int) -> None:
        """After a replay on ``stream_ptr``: its verdict to the pinned word, in stream order."""
        cp = cupy_module()
        cp.cuda.runtime.memcpyAsync(self.host.ctypes.data, self.flag.data.ptr, 4,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream_ptr)

    def changed(self) -> bool:
        """Whether a replay noted so far found A's pattern changed (possibly not the latest)."""
        return bool(self.host[0])

    @property
    def nbytes(self) -> int:
        """Device bytes kept (a graph holding it counts them: _graph.Replay.nbytes)."""
        return sum(a.nbytes for a in self.kept) + self.flag.nbytes


def _replayed_transpose(A, method, pattern):
    """The launches a runner's graph records for A: with ``pattern`` (_Pattern), spt_same's check,
    the method's launches into scratch arrays that run only where the check failed, and
    spt_finish, which writes A.T from the kept pattern and A's values, or from the scratch (the one
    launch naming A.T's arrays: a replay moves one node); without, :func:`_transpose`'s."""
    if pattern is None:
        return _transpose(A, False, None, method)
    cp = cupy_module()
    ks = _kernels(cp)
    ct = _cuda.ctype(A.dtype)
    m, n = A.shape
    indptr_a, indices = _int32_arrays(A)
    nnz = int(indices.size)
    kept_indptr, kept_indices, t_indptr, t_indices, src = pattern.kept
    full = (cp.empty(n + 1, dtype=cp.int32), cp.empty(nnz, dtype=cp.int32), cp.empty(nnz, dtype=A.dtype))
    _cuda.hold(pattern, *full)
    _cuda.zero(pattern.flag.data.ptr, 4)
    grid = max(1, min(-(-(max(nnz, m + 1, n + 1)) // BLOCK), 16 * ks.sms))
    ks.same((grid,), (BLOCK,), (indptr_a, indices, kept_indptr, kept_indices, m, nnz, pattern.flag))
    _segmented(cp, ks, ct, A, indptr_a, indices, False, None, _check_bins(BINS), method,
               only_if=pattern.flag.data.ptr, outs=full)
    outs = (cp.empty(n + 1, dtype=cp.int32), cp.empty(nnz, dtype=cp.int32), cp.empty(nnz, dtype=A.dtype))
    ks.finish[ct]((grid,), (BLOCK,), (pattern.flag, src, A.data, t_indptr, t_indices, *full, nnz, n, *outs))
    return _result(A, *outs)


def _replay_key(cp, A, method):
    """What a recorded SpTRANS call depends on: the device, the stream, A's arrays' addresses,
    shape, nnz and dtype (its contents are read at every launch); None where a call must not be
    replayed: int64 indices (converted to new arrays each call), an empty A (no launches), or
    too many nonzeros for the radix method (its error)."""
    nnz = int(A.indices.size)
    if (A.indices.dtype != np.int32 or A.indptr.dtype != np.int32 or nnz == 0 or 0 in A.shape
            or (method == "radix" and nnz >= RADIX_NNZ_LIMIT)):
        return None
    return (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr, A.data.data.ptr,
            A.indices.data.ptr, A.indptr.data.ptr, A.shape, nnz, A.dtype.char)


register(SpTrans())

__all__ = ["transpose", "SpTrans", "BLOCK", "ITEMS", "TILE", "PHASES", "MERGE_PHASES", "BINS", "METHODS"]
