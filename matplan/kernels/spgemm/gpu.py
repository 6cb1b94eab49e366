"""RBSparse hash SpGEMM (SEEDS section 1) on the GPU, registered as ``spgemm.hash``.

C = A @ B for cupyx CSR A (m x n) and B (n x k), float32 or float64, in five steps:

1. analysis (GPU): ``csum``, the exclusive scan of nnz(B[j,:]) over A's nonzeros (int64), gives
   nnz_RowCt per row (the paper's row computation density) and a work index for every product;
   one launch (``classify_rows``) finds every row's table and the totals, one host transfer
   brings back the group sizes and the moments the balanced rule needs, ``bucket_rows`` groups;
2. symbolic pass: a shared-memory hash of column keys per row counts its distinct columns; the
   table is sized from nnz_RowCt (an upper bound, so it cannot overflow) where it fits, else the
   largest table is tried and a row that fills it goes to the global-memory path (a bitmap of
   B's columns, in shared memory where it fits, several blocks a row), as do rows whose paper
   estimate alpha = nnz_RowCt / pi already exceeds it;
3. exclusive scan of the exact row counts -> C's indptr, the numeric table of every row (one
   launch, one host transfer: total nnz, groups) and the allocation of C;
4. numeric pass grouped by the exact nnz of each row (the paper groups by its estimate alpha; the
   symbolic pass gives the true count, so a numeric table never overflows): keys by atomicCAS,
   values by atomicAdd, then the row is sorted by column in shared memory (by rank up to 256
   slots; above, by a bitmap of B's columns where it fits beside the table, else bitonic;
   ``sort=False`` skips it) and written out; rows larger than every shared table (or than 3/4 of
   the largest: NUMERIC_LAST_TABLE_LOAD) use the global path: by column segments summed in shared
   memory (numeric_global_seg, a block a segment of a row) for at most GLOBAL_SEG_MAX_SEGMENTS
   segments a row that fill the GPU, else dense slabs of B.shape[1] columns in global memory, in
   batches of the slabs half the L2 holds when they are many;
5. the groups' launches go to separate streams, joined to the caller's stream by events.

One-pass path (``passes="auto"``, the default of ``spgemm(out='device')``): when every row's bound
min(nnz_RowCt, k) fits a table of ONE_PASS_MAX_TABLE slots or its products fit the largest
numeric_esc class (512), but for at most ONE_PASS_LONG_ROWS long rows, and an upper-bound
buffer of ``products`` entries is small (one_pass_table, one_pass_long), steps
2-3 are skipped: the analysis's launch also gives every row's one-pass
class; rows of at most 512 products take ``numeric_esc`` (the products expanded into registers,
bitonic-sorted by column a W-lane group a row, runs summed by a segmented scan: no table, no
atomics, deterministic sums; a row whose columns span at most its W * P slots is summed in a dense
window of them instead, ESC_WINDOW), the others a table sized from their bound at full load (no overflow
possible), the long rows the global path; each sorted row goes to its products' offset
of that buffer with its count, the
counts' scan gives C's indptr, one host transfer its nnz, and ``compact_rows`` (``compact_entries``
where rows took the global path) copies the rows into C allocated exactly. Short-row products (Poisson, uniform, road networks) spend a third of
their GPU time in the symbolic pass and the host round trip after it.
Guessed analyses (``guess=True``, the default, on the one-pass path): a call waits twice for the
GPU, for the analysis (which sizes the upper-bound buffer and picks the launches) and for C's nnz,
and the GPU idles while the host waits, decides and launches. A one-pass call keeps its analysis
words under its operands (the device, the stream, the arrays' addresses, shapes, nnz, dtypes and
the options: at most GUESS_CACHE_SIZE pairs). The pair's next call decides from them without
waiting and records its launches up to the scan of C's row counts as a CUDA graph (GUESS_GRAPHS
pairs keep one), which later calls replay: their host path before the GPU starts is one graph
launch (H100: single calls 1.12-1.43x faster). ``words_differ`` compares the guessed words with
the call's own analysis on the GPU; every numeric kernel does nothing where they differ, and the
flag comes back with C's nnz: a refuted guess (A's or B's pattern changed in place) is dropped and
the call rerun unguessed. Equal words make the same decisions, so the result is the operands' as
they are now. Where every row took numeric_esc, a verified guessed call also keeps C's row offsets
and nnz, and the pair's later calls go direct (DIRECT_GUESSES): a graph in which numeric_esc
writes each row straight into C at its kept offset, no upper-bound buffer, no scan and no
compaction; a row of another length than kept writes nothing and refutes the guess (one read at
the call's end). ``guess=False`` opts out; ``forget_guesses()`` drops them all.
Hybrid (the two passes with ``passes="auto"``): rows of at most 512 products still take
numeric_esc. They have no symbolic table, are sorted into an upper-bound buffer before the other
rows' symbolic pass, and are copied into C after the scan (``compact_rows`` over their row list).
When the buffer would pass ONE_PASS_MEM_FRACTION of the device's memory, every row takes the
two passes. Rows of big shared tables (>= LIFT_MIN_TABLE slots) that are few (lift_index), one of
them of at least LIFT_MIN_PRODUCTS products, take the global-memory path in both passes: one
block a row on a few SMs left the GPU idle.
Table sizes are powers of two from 32 up to the largest that fits the device's shared memory per
block (227 KB on an H100: 16384 slots of 12 bytes in float64, 32768 key-only slots in the
symbolic pass); ``smem_limit`` sets another cap (the paper's 48 KB, for instance). When the
balanced rule holds (var/mean of nnz_RowCt <= 0.5) every row uses one table size: one launch per
pass, as the paper does.

Semantics: duplicated and unsorted input indices are summed like SciPy. Products that cancel to
an exact zero stay stored as explicit zeros (C's pattern is the symbolic product's, as cuSPARSE
gives); SciPy's ``A @ B`` drops them. ``drop_zeros=True`` removes them to match SciPy's storage.
Product counts of any size are fine (int64 offsets). A and B are read with int32 indices: int64
index arrays that fit are copied to int32; a matrix with nnz or a dimension past 2^31 - 1 is
refused (ValueError naming it).

Output forms and row panels. After the symbolic pass C's exact row offsets (int64) are known, so
its rows can be cut into contiguous panels (``panel_bounds``, pure NumPy) that each hold fewer than
2^31 nonzeros (a cupyx CSR has int32 indptr) and fit a device-memory budget; the numeric pass then
runs per panel, on that panel's rows only, writing the panel's own CSR (offsets from 0). The
symbolic pass is not repeated.

* ``spgemm(A, B)`` (out='device', the default): one cupyx CSR on the GPU, as before. When C has
  more than 2^31 - 1 nonzeros (OverflowError) or needs more than OUTPUT_MEM_FRACTION of the free
  device memory (MemoryError) it refuses before the numeric pass, naming the two forms below.
* ``spgemm(A, B, out='host')``: a SciPy CSR in host memory (int64 indices and indptr past 2^31 - 1
  nonzeros), filled panel by panel (each copied down and freed). Refused (MemoryError naming the
  size) when it would take more than HOST_MEM_FRACTION of the host's available memory.
* ``spgemm_panels(A, B)``: an iterator of ``(row_start, row_stop, panel)``, each panel a cupyx CSR
  of C[row_start:row_stop], built when reached: streams a C that fits nowhere whole.

Panels are at most 2^31 - 1 nonzeros and PANEL_MEM_FRACTION of the free device memory measured
after the symbolic pass; ``max_panel_nnz`` / ``max_panel_bytes`` set smaller limits (tests use
them to force many panels). The planner's explanation of ``spgemm.hash`` names the predicted
panel count when products / pi passes either limit.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import threading
import time

import numpy as np

from ...core.xp import array_module, cupy_module, cupyx_sparse
from ...models import spgemm as spgemm_model, traffic
from .. import _cuda, _graph
from ...core.types import Cost
from ..base import KeepsA
from ..registry import register

_CU = "spgemm/spgemm.cu"
#: a null device pointer argument (kernels take it for an absent array)
NULL_PTR = _NULL = np.uintp(0)
#: Lanes of a row's group in the shared-table kernels (template argument W): 8 or 16 lanes of a
#: warp for short rows, else whole warps (32).
GROUP_WIDTHS = (8, 16, 32)
_NAMES = (tuple(f"numeric_shared<{t}, {w}>" for t in ("float", "double") for w in GROUP_WIDTHS)
          + tuple(f"symbolic_shared<{w}>" for w in GROUP_WIDTHS)
          + ("numeric_global_acc<float>", "numeric_global_acc<double>",
             "numeric_global_out<float>", "numeric_global_out<double>",
             "numeric_global_seg<float>", "numeric_global_seg<double>",
             "compact_rows<float>", "compact_rows<double>", "compact_ranges<float>", "compact_ranges<double>",
             "compact_entries<float>", "compact_entries<double>", "words_differ")
          + tuple(f"numeric_esc<{t}, {w}, {p}>" for t in ("float", "double")
                  for w, p in ((8, 2), (8, 4), (16, 4), (32, 4), (32, 8), (32, 16))))
#: The sort-based numeric kernel of the one-pass path (numeric_esc<T, W, P>): a row of at most
#: W * P products is expanded into registers (P a lane of a W-lane group), bitonic-sorted by column
#: and its runs summed; (W, P) by class, the smallest that holds the row. It replaces the hash
#: table and its rank sort for short rows (``spgemm(..., esc=False)`` keeps the hash).
ESC_CLASSES = ((8, 2), (8, 4), (16, 4), (32, 4), (32, 8), (32, 16))
ESC_CAPS = tuple(w * p for w, p in ESC_CLASSES)
#: numeric_esc's values sit in shared memory sized for blocks of ESC_BLOCK threads.
ESC_BLOCK = 256
#: Rows of numeric_esc whose columns span at most its W * P slots (banded rows) are summed in a
#: dense window of those slots and written out by a bitmap, no sort (False: every row sorted).
ESC_WINDOW = True


def esc_max_columns(cap: int) -> int:
    """Most columns B may have for the numeric_esc class of ``cap`` slots: a product travels as
    column << log2(cap) | slot in an int below EMPTY_KEY (2^31 - 1); wider B keep the hash tables."""
    return (1 << (32 - cap.bit_length())) - 1


@functools.lru_cache(maxsize=None)
def esc_caps(k: int) -> tuple:
    """The numeric_esc classes a product with B of ``k`` columns may use (a prefix of ESC_CAPS)."""
    return tuple(cap for cap in ESC_CAPS if k <= esc_max_columns(cap))
#: The hybrid two-pass path (rows numeric_esc can take skip the symbolic pass) needs at least this
#: many such rows (benchmarks/spgemm_esc.py sets it past any count to time the plain two passes).
HYBRID_MIN_ROWS = 1
#: Smallest hash table (one warp's worth of slots).
MIN_TABLE = 32
#: Static shared memory of the kernels plus margin, taken off the per-block budget.
STATIC_SMEM = 1024
#: Threads per row: table size / slots per thread, clamped to [32, MAX_TPR], or to [MIN_TPR,
#: MAX_TPR] for tables of at most SUBWARP_MAX_TABLE slots (a row is then 8 or 16 lanes of a warp,
#: several short rows a warp); rows per block fill BLOCK_THREADS, at most MAX_RPB (the kernels'
#: per-row shared counters). H100, MIN_TPR 8/16/32 (spgemm-phases-h100-2026-11-23-6f706b5.log):
#: world_highways' symbolic pass (rows of <= 16 products) 298 -> 154 us at 8 lanes, 208 at 16;
#: its numeric pass 484 -> 305 us at 16 lanes; rows of 64 products (uniform) lost at 16 lanes
#: (symbolic 185 -> 286 us), hence the cap. The numeric table is ~2x the row's nnz (TABLE_LOAD)
#: and its rank sort holds 2 slots a thread (NUMERIC_SUBWARP_SLOTS, at most 4, for sub-warp
#: tables); the symbolic table is ~2x the row's products (an upper bound of its nnz), so
#: 2 slots a thread gave a thread per product (banded: 512 threads for 289 products a row); 8
#: measured best of 2/4/8 on the H100 (symbolic pass: banded 1469 -> 539 us, ice40 2814 -> 1676,
#: Poisson 260 -> 185; spgemm-sym-slots-h100-2026-11-23-d49e7f3.log).
MIN_TPR = 8
SUBWARP_MAX_TABLE = 64
MAX_TPR = 1024
MAX_RPB = 32
NUMERIC_SLOTS_PER_THREAD = 2
NUMERIC_SUBWARP_SLOTS = 2
SYMBOLIC_SLOTS_PER_THREAD = 8
BLOCK_THREADS = 256
#: A row takes the smallest table whose size times its load holds it (the largest table may fill
#: up): SMALL_TABLE_LOAD for tables of at most SUBWARP_MAX_TABLE slots, TABLE_LOAD above. H100,
#: 0.5 -> 0.75 for every table (spgemm-phases-h100-2026-11-23-39d9028.log): numeric pass
#: block-dense 3624 -> 2298 us, ice40 23.9 -> 17.1 ms, R-MAT 53.1 -> 48.5 ms, banded 710 -> 547
#: (its symbolic pass 684 -> 459); rows of small tables gained nothing (dragon lost, 748 -> 829).
TABLE_LOAD = 0.75
SMALL_TABLE_LOAD = 0.5
#: Load up to which the largest numeric table takes rows (past it: the global path). H100, R-MAT
#: scale 16 (c7eb0c5), 1.0 -> 0.75: numeric_shared 21.1 -> 5.2 ms (1,162 rows of 12k-16k columns
#: probed long chains in a 16384-slot table), the global path 11.4 -> 16.1 ms, the call 31.0 -> 26.3
#: (spgemm-bitmap-l2-h100-2026-11-24-c7eb0c5.log).
NUMERIC_LAST_TABLE_LOAD = 0.75
#: Persistent blocks of the global path per SM, and the fraction of free memory their slabs may use.
GLOBAL_BLOCKS_PER_SM = 2
GLOBAL_BLOCK_THREADS = 512
GLOBAL_MEM_FRACTION = 0.25
#: Batches of many global rows take as many slabs as this fraction of the L2 cache holds: R-MAT's
#: 264 slabs of 768 KB (207 MB against a 50 MB L2) sent the dense accumulator's atomics to DRAM;
#: 32-row batches took numeric_global_acc 18.3 -> 7.2 ms at scale 16, 88.2 -> 38.7 at scale 17
#: (H100, helper measurement 2026-11-24).
GLOBAL_L2_FRACTION = 0.5
#: Blocks sharing one row of the global path: one per GLOBAL_PART_PRODUCTS products of the largest
#: row, more when a batch has too few rows to give every SM GLOBAL_BLOCKS_PER_SM blocks, but at
#: least GLOBAL_MIN_PART_PRODUCTS products a block and at most GLOBAL_MAX_PARTS blocks a row (a
#: long row is then not one block's chain of dependent loads).
GLOBAL_PART_PRODUCTS = 32768
GLOBAL_MIN_PART_PRODUCTS = 2048
GLOBAL_MAX_PARTS = 32
#: Columns of a row one block of numeric_global_out writes: a multiple of the columns a block scans
#: a step (GLOBAL_BLOCK_THREADS * GLOBAL_SCAN_COLS), at most GLOBAL_MAX_SEGMENTS segments a row.
GLOBAL_SCAN_COLS = 8
GLOBAL_MAX_SEGMENTS = 64
#: The numeric global path by column segments (numeric_global_seg, spgemm.cu): a block of
#: GLOBAL_SEG_THREADS threads (SEG_THREADS there) keeps one segment of a row's columns, their sums
#: and a bitmap, in shared memory (global_seg_cols) and walks all of the row's products: sums by
#: shared-memory atomics, no slab of B.shape[1] columns to clear and scan. Each segment reads the
#: row's B indices again, and a row's segments are its only parallelism: taken for at most
#: GLOBAL_SEG_MAX_SEGMENTS segments a row when the global rows' segments give every SM at least
#: GLOBAL_SEG_MIN_BLOCKS_PER_SM blocks, else the slab path.
GLOBAL_SEG_THREADS = 1024
GLOBAL_SEG_MIN_BLOCKS_PER_SM = 1.0
GLOBAL_SEG_MAX_SEGMENTS = 32
#: Where B's rows are sorted by column (B.has_sorted_indices), a segment of a row with at least
#: one A nonzero a warp and 32 products a nonzero a segment reads only its part of each B row (two
#: binary searches a nonzero of A) instead of walking all of the row's products (False: always
#: the walk). H100 (spgemm-segments-b-rows-h100-2026-11-24.log): numeric_global_seg R-MAT 16
#: 4791 -> 4214 us, R-MAT 17 26.5 -> 20.0 ms, skewed 253 -> 246.
GLOBAL_SEG_B_ROWS = True
#: symbolic_global marks a row's columns in a bitmap of B's columns in shared memory where it fits
#: (False: in global memory, one per row, L2 atomics; benchmarks compare with --set).
SYMBOLIC_GLOBAL_SHARED = True
#: Rows of symbolic tables of at least SYMBOLIC_BITMAP_RATIO slots a 32-bit word of a bitmap of
#: B's columns (k / 32 words) count their columns in that bitmap in shared memory instead
#: (symbolic_bitmap_from; symbolic_global): a read and at most one atomicOr a product, no probe
#: chains, no overflow, k / 32 words to clear and count a row. inf: the tables only. H100
#: (2026-11-24, spgemm-symbolic-bitmap-h100-2026-11-24.log), symbolic pass at ratio 0.25 / 1 /
#: inf: R-MAT 16 2861 / 2944 / 3553 us, R-MAT 17 8.1 / 8.4 / 10.4 ms, block-dense 1246 / 1228 /
#: 1304, ice40 1759 / 1808 / 1806. Without the read first (an atomic a product), block-dense's
#: 34,596 products a row over 225 words lost: 1668 against 1299 us.
SYMBOLIC_BITMAP_RATIO = 0.25
#: Sorted rows of tables past RANK_SORT_MAX slots (spgemm.cu's, the rank sort's limit) are ordered
#: by a bitmap of B's columns instead of a bitonic sort of the table (numeric_shared; bitmap_words)
#: when the bitmap fits beside the table and has at most BITMAP_WORDS_PER_SLOT 32-bit words a slot
#: (its clearing and scan cost ~k/32 words a row, the bitonic network ~S log2(S)^2 / 4 exchanges).
RANK_SORT_MAX = 256
BITMAP_WORDS_PER_SLOT = 4
INT32_MAX = np.iinfo(np.int32).max
KEY_BYTES = 4


# ----------------------------------------------------------------------------- grouping (xp)
@functools.lru_cache(maxsize=None)
def table_ladder(smem_bytes: int, slot_bytes: int) -> tuple:
    """Power-of-two table sizes from MIN_TABLE up to the largest that fits ``smem_bytes`` per block."""
    sizes, size = [], MIN_TABLE
    while size * slot_bytes + STATIC_SMEM <= smem_bytes:
        sizes.append(size)
        size *= 2
    if not sizes:
        raise ValueError(f"smem_limit: {smem_bytes} bytes of shared memory per block hold no "
                         f"{MIN_TABLE}-slot table of {slot_bytes}-byte slots; expected at least "
                         f"{MIN_TABLE * slot_bytes + STATIC_SMEM}")
    return tuple(sizes)


def launch_shape(size: int, slot_bytes: int, smem_bytes: int, slots_per_thread: int = NUMERIC_SLOTS_PER_THREAD) -> tuple:
    """(threads per row, rows per block) for tables of ``size`` slots."""
    floor = MIN_TPR if size <= SUBWARP_MAX_TABLE else 32
    tpr = min(MAX_TPR, max(floor, size // slots_per_thread))
    rpb = max(1, min(MAX_RPB, BLOCK_THREADS // tpr))
    while rpb > 1 and table_smem(size, slot_bytes, rpb) + STATIC_SMEM > smem_bytes:
        rpb //= 2
    return tpr, rpb


def group_width(tpr: int) -> int:
    """The shared-table kernels' W for rows of ``tpr`` threads: tpr below a warp, else 32."""
    return tpr if tpr < 32 else 32


def table_smem(size: int, slot_bytes: int, rpb: int) -> int:
    """Dynamic shared memory of a launch: rpb tables of ``size`` slots."""
    return rpb * size * slot_bytes


def table_load(size: int) -> float:
    """Fraction of a ``size``-slot table a row may fill (the largest table aside)."""
    return SMALL_TABLE_LOAD if size <= SUBWARP_MAX_TABLE else TABLE_LOAD


@functools.lru_cache(maxsize=None)
def table_caps(ladder: tuple, last_load: float = 1.0) -> tuple:
    """Most nonzeros a row may need for each table of ``ladder``: table_load(size) * size, the
    largest table last_load of it (numeric tables: NUMERIC_LAST_TABLE_LOAD)."""
    return tuple(int(s * table_load(s)) for s in ladder[:-1]) + (int(ladder[-1] * last_load),)


def table_index(need, ladder: tuple, last_load: float = 1.0):
    """Per row: index in ``ladder`` of the smallest table with need <= its cap (table_caps; the largest
    table takes need <= last_load * size), ``len(ladder)`` when none does (global path), -1 when
    need == 0."""
    xp = array_module(need)
    idx = xp.searchsorted(xp.asarray(table_caps(ladder, last_load), dtype=xp.int64), need.astype(xp.int64),
                          side="left")
    return xp.where(need > 0, idx, -1)


def symbolic_index(row_ct, k: int, ladder: tuple):
    """Symbolic-pass table of each row: sized from min(nnz_RowCt, k) (a bound: no overflow) when it
    fits; else the largest table when the paper's estimate alpha = nnz_RowCt / pi fits in it (the
    row may still overflow and is then redone globally); else the global path directly."""
    xp = array_module(row_ct)
    bound = xp.minimum(row_ct, k)
    idx = table_index(bound, ladder)
    alpha = xp.minimum(row_ct.astype(xp.float64) / spgemm_model.RBS_COMPRESSION, k)
    risky = (idx == len(ladder)) & (alpha <= ladder[-1])
    return xp.where(risky, len(ladder) - 1, idx)


def one_pass_index(row_ct, k: int, classes: tuple, n_esc: int):
    """One-pass class of each row (classify_rows' idx2): the first class whose limit holds it,
    nnz_RowCt for the n_esc numeric_esc classes, min(nnz_RowCt, k) for the tables after them;
    len(classes) when none does, -1 for a row of no products."""
    xp = array_module(row_ct)
    row_ct = row_ct.astype(xp.int64)
    fig = xp.stack([row_ct if c < n_esc else xp.minimum(row_ct, k) for c in range(len(classes))])
    fits = fig <= xp.asarray(classes, dtype=xp.int64)[:, None]
    idx = xp.where(fits.any(axis=0), fits.argmax(axis=0), len(classes))
    return xp.where(row_ct > 0, idx, -1)


def balance(idx, balanced, n_tables: int):
    """The balanced rule: every shared-memory row takes the largest table any of them needs.

    ``balanced`` is a bool or a 0-d boolean xp array (decided on the GPU: no host transfer)."""
    xp = array_module(idx)
    shared = (idx >= 0) & (idx < n_tables)
    if idx.size == 0:
        return idx
    top = xp.where(shared, idx, -1).max()
    return xp.where(shared & xp.asarray(balanced), top, idx)


def groups_of(idx, n_tables: int):
    """Rows ordered by table index and the count per index (-1 .. n_tables), as xp arrays.

    On the GPU a counting sort (bucket_rows) replaces a full sort; order inside a group is arbitrary."""
    xp = array_module(idx)
    counts = xp.bincount(idx + 1, minlength=n_tables + 2)
    if xp is np:
        return xp.argsort(idx, kind="stable").astype(np.int32), counts
    fill = xp.zeros(n_tables + 2, dtype=xp.uint64)
    return _bucket(idx.astype(xp.int32, copy=False), n_tables, -1, counts.view(xp.uint64), fill), counts


# ----------------------------------------------------------------------------- grouping (GPU, fused)
# The launch path of a call: a handful of kernels and one host transfer per pass instead of the
# ~40 CuPy calls of the xp functions above (3.5-5.7 ms of host time per call on an H100,
# benchmarks/results/spgemm-phases-h100-2026-11-23-bb69dc5.log). The xp functions stay the
# reference the GPU path is tested against.
def _rows_at(order, start) -> int:
    """The device address of order[start:] (int32 row ids) for a launch: a CuPy slice costs ~2 us
    of host time, and the launch paths take one a class."""
    return order.data.ptr + 4 * int(start)


def _starts(counts) -> list:
    """Where each group of ``counts`` (host) starts in the grouped order, and the total last."""
    return list(itertools.accumulate(np.asarray(counts).tolist(), initial=0))


def _bucket(idx, n_tables: int, top: int, counts, fill, lift: int = -1):
    """Rows ordered by table index (a counting sort: bucket_rows) from ``counts`` (uint64, GPU:
    rows per index -1..n_tables) and ``fill`` (uint64, GPU, as many zeros): no host round trip;
    top >= 0 moves every shared-table row to table ``top`` first, in ``idx`` too (the balanced
    rule); lift >= 0 moves the rows of tables lift .. n_tables - 1 to the global path (lift_index)."""
    order = cupy_module().empty(idx.size, dtype=np.int32)
    _cuda.hold(order)   # a recorded call's graph (_guessed) writes it on every replay
    _launch("bucket_rows", (idx.size + 255) // 256, 256,
            (idx, np.int32(idx.size), np.int32(n_tables), np.int32(top), counts, fill, order, np.int32(lift)))
    return order


@functools.lru_cache(maxsize=None)
def _device_caps(caps: tuple, device_id: int):
    return cupy_module().asarray(caps, dtype=np.int64)


@dataclasses.dataclass
class _Classes:
    """classify_rows' result: table index per row and its totals (GPU), and the host figures of one
    transfer; ``second``: the one-pass classes of the same launch (mode 0 with ``second``)."""
    idx: object
    acc: int                # address of classify_rows' totals, then bucket_rows' fill counters (uint64)
    counts: np.ndarray      # rows per index -1 .. n_tables
    total: int              # sum of the row figure (products, or C's nnz)
    peak: int               # its largest row
    risky: int              # rows sent to the largest table on the paper's estimate (mode 0)
    mean: float
    var: float
    second: "_Classes | None" = None
    keep: object = None     # the allocation holding acc when _classify made it
    words: np.ndarray = None   # the transfer's words (uint64), from which every figure above comes


def _classify(m: int, k: int, ladder: tuple, *, A=None, csum=None, row_nnz=None, acc=None,
              second: tuple = (), taken: tuple = (), meanwhile=None, guess=None) -> _Classes:
    """Table index of every row: from nnz_RowCt (A, csum: symbolic pass, as symbolic_index) or
    from C's exact row nnz (row_nnz: numeric pass, as table_index); one launch, one transfer.
    ``second`` (mode 0): (caps, n_esc) of the one-pass classes, classified in the same launch (the
    first n_esc are numeric_esc's product limits, compared with nnz_RowCt itself; a row none
    holds gets len(caps)); acc must then hold _classify_words of both. Rows numeric_esc takes
    (second's class < n_esc) get index -1 here: they have no symbolic table. ``taken`` (mode 1):
    (the analysis's second idx, n_esc): those rows get index -1 too (numeric_esc wrote them).
    acc: the address of _classify_words zeroed words, or None (zeroed here). ``meanwhile``: called
    after the launch, before the transfer waits for it (host work the GPU's run hides).
    ``guess``: (host words, their device copy, flag address): no transfer; the figures come from
    the guessed words, and words_differ sets the flag on the GPU where the launch's differ."""
    cp = cupy_module()
    T = len(ladder)
    caps2, n_esc = second or ((), 0)
    T2 = len(caps2)
    taken_idx, n_taken = taken or (None, 0)
    mode = 0 if row_nnz is None else 1
    idx = cp.empty(m, dtype=cp.int32)
    idx2 = cp.empty(m, dtype=cp.int32) if T2 else taken_idx
    _cuda.hold(idx, idx2)   # a recorded call's graph (_guessed) writes them on every replay
    words = _classify_words(T) + (_classify_words(T2) if T2 else 0)
    keep = None
    if acc is None:   # zeroed: T + 6 totals, then T + 2 fill counters for _bucket (and the second's)
        keep = _cuda.zeroed(words, cp.uint64)
        acc = keep.data.ptr
    ref = csum if mode == 0 else row_nnz
    _launch("classify_rows", (m + 255) // 256, 256,
            (A.indptr if mode == 0 else ref, ref, ref, np.int32(m), np.int64(k),
             _device_caps(table_caps(ladder, 1.0 if mode == 0 else NUMERIC_LAST_TABLE_LOAD) + tuple(caps2),
                          _device_id()),
             np.int32(T), np.int64(ladder[-1]), np.int32(mode), np.int32(T2), np.int32(n_esc or n_taken),
             idx, idx2, acc))
    if guess is not None:
        host, expected, flag = guess
        if host.size != words:   # kept under other settings (module constants changed since)
            raise _Misguess()
        _launch("words_differ", 1, 256, (acc, expected, np.int32(words), flag))
    if meanwhile is not None:
        meanwhile()
    if guess is None:
        host = _cuda.read_at(acc, words, np.uint64)
    total = int(host[T + 2])
    mean = total / m
    var = max(0.0, float(host[T + 5:T + 6].view(np.float64)[0]) / m - mean * mean)
    two = None
    if T2:
        w = _classify_words(T)
        two = _Classes(idx2, acc + 8 * w, host[w:w + T2 + 2].astype(np.int64), total, int(host[T + 3]), 0, mean,
                       var, keep=keep)
    return _Classes(idx, acc, host[:T + 2].astype(np.int64), total, int(host[T + 3]), int(host[T + 4]), mean, var,
                    two, keep, host)


def _group(c: _Classes, n_tables: int, balanced: bool, lift: int = -1):
    """(order, host counts) of rows by table index, the balanced rule applied (to c.idx too), or
    else the rows of tables lift .. n_tables - 1 moved to the global path (lift >= 0)."""
    counts = c.counts.copy()
    top = -1
    present = np.flatnonzero(counts[1:n_tables + 1])
    if balanced and present.size:
        top = int(present[-1])
        counts[top + 1] = counts[1:n_tables + 1].sum()
        counts[1:top + 1] = 0
        lift = -1
    elif lift >= 0:
        counts[n_tables + 1] += counts[lift + 1:n_tables + 1].sum()
        counts[lift + 1:n_tables + 1] = 0
    return _bucket(c.idx, n_tables, top, c.acc, c.acc + 8 * (n_tables + 6), lift), counts


#: Few rows in big shared tables run one block each on as many SMs while the rest of the GPU
#: idles (skewed-spgemm, H100 f390189: 6 rows of 50k-125k products took 340 us in 16384-slot
#: tables, 12 rows in 8192-slot ones 186 us, while the global path split the 12 largest rows over
#: 22 blocks each in 91 us): rows of tables of at least LIFT_MIN_TABLE slots move to the global
#: path, several blocks a row, when they and the rows of every larger table number at most
#: LIFT_ROWS_PER_SM per SM, and the largest row has at least LIFT_MIN_PRODUCTS products (the
#: global path's launches cost more host time than a one-block row of a few thousand products:
#: skewed-small's row of 2,469 products was lifted from a 4096-key symbolic table).
LIFT_MIN_TABLE = 4096
LIFT_ROWS_PER_SM = 0.5
LIFT_MIN_PRODUCTS = 32768


def lift_index(counts, ladder: tuple, sms: int, peak: int) -> int:
    """The smallest table index from which rows take the global path (-1: none): tables of at
    least LIFT_MIN_TABLE slots, whose rows together with every larger table's are at most
    LIFT_ROWS_PER_SM * sms (counts: rows per table index + 1, host); none when the largest row
    (``peak`` products) has fewer than LIFT_MIN_PRODUCTS."""
    if peak < LIFT_MIN_PRODUCTS:
        return -1
    lift, total = -1, 0
    for t in range(len(ladder) - 1, -1, -1):
        if ladder[t] < LIFT_MIN_TABLE:
            break
        total += int(counts[t + 1])
        if total > LIFT_ROWS_PER_SM * sms:
            break
        if counts[t + 1]:
            lift = t
    return lift


def _lifted_rows(c: "_Classes", lift: int) -> int:
    """Rows that lift index ``lift`` (lift_index; -1: none) moves from c's tables to the global path."""
    return int(c.counts[lift + 1:-1].sum()) if lift >= 0 else 0


# ----------------------------------------------------------------------------- GPU
#: Extra NVRTC options for spgemm.cu, e.g. ("-DSUBWARP_MIN_BLOCKS=6",) (benchmarks/spgemm_phases.py
#: --define: compile-time variants in one run).
NVRTC_DEFINES: tuple = ()


_STREAMS: dict = {}
_LAUNCHERS: dict = {}


def _compiled(kernel_name: str, device_id: int):
    """(cuda Function, packed Launcher) of a kernel for a device, memoised under the kernel's name:
    the launch path skips _cuda.function's argument normalisation, and the Launcher's signature is
    read from the kernel's declaration in spgemm.cu (_cuda.signature)."""
    key = (kernel_name, device_id, NVRTC_DEFINES)
    got = _LAUNCHERS.get(key)
    if got is None:
        fn = _cuda.compiled(_CU, kernel_name, _NAMES, options=NVRTC_DEFINES)
        got = _LAUNCHERS[key] = (fn, _cuda.packed(fn, _CU, kernel_name))
    return got


def _launch(kernel_name, grid, block, args, smem=0):
    """Launch through the driver with packed parameters (_cuda.Launcher): CuPy's launch took 11-16 us
    of host time for kernels of this many parameters, a packed one ~5 (SpMV, 2026-11-24), and a
    call launches six to a dozen of them."""
    fn, launch = _compiled(kernel_name, _device_id())
    if smem > 32 * 1024:  # past the 48 KB default once static shared memory is added: opt in
        _cuda.allow_dynamic_smem(fn, smem)
    launch(grid if isinstance(grid, tuple) else (grid,), (block,), args, shared_mem=smem)


def _device_id() -> int:
    """The current device's id (the runtime's call; ``cuda.Device()`` builds an object first)."""
    return cupy_module().cuda.runtime.getDevice()


@functools.lru_cache(maxsize=None)
def _device_limits(device_id: int) -> tuple:
    """(opt-in shared memory per block, SM count) of a device, read once."""
    return (_cuda.device_attribute("MaxSharedMemoryPerBlockOptin", device_id),
            _cuda.device_attribute("MultiProcessorCount", device_id))


def _streams(n):
    cp = cupy_module()
    dev = _device_id()
    have = _STREAMS.setdefault(dev, [])
    while len(have) < n:
        have.append(cp.cuda.Stream(non_blocking=True))
    return have[:n]


class _Fork:
    """Launch work on side streams that start after, and are joined back into, the current stream.

    ``counts``: rows per launch slot; with at most one non-empty slot everything stays on the
    current stream (no events: ~20-40 us of host time a call)."""

    def __init__(self, counts):
        cp = cupy_module()
        self.main = cp.cuda.get_current_stream()
        self.solo = np.count_nonzero(counts) <= 1
        self.start = None if self.solo else self.main.record()
        self.streams = None if self.solo else _streams(len(counts))
        self.used = []

    def stream(self, i):
        if self.solo:
            return self.main
        s = self.streams[i]
        if s not in self.used:
            s.wait_event(self.start)
            self.used.append(s)
        return s

    def join(self):
        for s in self.used:
            self.main.wait_event(s.record())


#: Values a block of the scan kernels takes (spgemm.cu: SCAN_ITEMS per thread, 256 threads).
SCAN_TILE = 8 * 256


def _scan_words(n: int) -> int:
    """Look-back status words (uint64) a scan of n values needs."""
    return max(1, -(-n // SCAN_TILE)) + 1


def _classify_words(n_tables: int) -> int:
    """Words (uint64) of classify_rows' totals plus bucket_rows' fill counters."""
    return 2 * n_tables + 8


class _Zeros:
    """One zeroed uint64 allocation that a call's counters are carved from, as device addresses
    (launch arguments, _cuda.read_at): each zeroed allocation costs host time (_cuda.zeroed), and
    each CuPy slice ~2 us more."""

    def __init__(self, words):
        self.buf = _cuda.zeroed(int(sum(words)), np.uint64)
        self.at = self.buf.data.ptr

    def take(self, n: int) -> int:
        """The address of the next ``n`` zeroed words."""
        at = self.at
        self.at += 8 * n
        return at


def _scan(kernel: str, n: int, args, status=None):
    """Launch scan_products or scan_rows (spgemm.cu scan_i64: one launch, out[0] = 0, out[1:] the
    inclusive scan of n values) with ``args`` and a zeroed look-back ``status`` (_scan_words(n))."""
    if status is None:
        status = _cuda.zeroed(_scan_words(n), np.uint64)
    _launch(kernel, _scan_words(n) - 1, 256, args + (status,))


def _product_offsets(A, B, status=None):
    """csum (int64, nnz(A)+1): exclusive scan of nnz(B[j,:]) over A's nonzeros, the work index of
    every product (csum at A's row ends gives nnz_RowCt, planner.stats.products_per_row)."""
    nnz = A.indices.size
    csum = cupy_module().empty(nnz + 1, dtype=np.int64)
    _scan("scan_products", nnz, (A.indices, np.int64(nnz), B.indptr, csum), status)
    return csum


def _free_device_bytes() -> int:
    """Bytes the current device can still hand out: the driver's free memory plus CuPy's pool cache."""
    cp = cupy_module()
    return int(cp.cuda.runtime.memGetInfo()[0] + cp.get_default_memory_pool().free_bytes())


def _device_total_bytes() -> int:
    return _total_bytes(_device_id())


@functools.lru_cache(maxsize=None)
def _total_bytes(device_id: int) -> int:
    return int(cupy_module().cuda.runtime.memGetInfo()[1])


def _global_target_blocks() -> int:
    """Blocks the global path aims to keep resident: GLOBAL_BLOCKS_PER_SM on every SM."""
    return _device_limits(_device_id())[1] * GLOBAL_BLOCKS_PER_SM


def _global_parts(peak_products: int, batch_rows: int) -> int:
    """Blocks per row of the global path for batches of ``batch_rows`` rows of at most
    ``peak_products`` products."""
    want = max(-(-int(peak_products) // GLOBAL_PART_PRODUCTS), -(-_global_target_blocks() // batch_rows))
    most = max(1, int(peak_products) // GLOBAL_MIN_PART_PRODUCTS)
    return int(max(1, min(GLOBAL_MAX_PARTS, most, want)))


def _global_segments(ncols: int, batch_rows: int) -> tuple:
    """(segments a row, columns a segment) of numeric_global_out over ``ncols`` columns: one
    segment (no counting pass) when the batch's rows alone give every SM GLOBAL_BLOCKS_PER_SM
    blocks (R-MAT's 264-row batches: counting took 0.5 ms of 72)."""
    step = GLOBAL_BLOCK_THREADS * GLOBAL_SCAN_COLS
    steps = -(-ncols // step)
    if batch_rows >= _global_target_blocks():
        return 1, steps * step
    per_seg = -(-steps // min(GLOBAL_MAX_SEGMENTS, steps))
    return -(-steps // per_seg), per_seg * step


def global_seg_cols(k: int, itemsize: int, smem_limit: int) -> int:
    """Columns of a segment of numeric_global_seg: k cut into as few equal segments (multiples of
    32 columns, at least 32) as fit in ``smem_limit`` beside STATIC_SMEM with their values and
    bitmap. Each segment reads its row's B rows again (all their entries, or its part of sorted
    ones), so fewer segments are less work: on an H100 (227 KB) R-MAT 16 / 17 / 18 take 3 / 5 / 10
    float64 segments of ~28k columns at most, where powers of two (16,384) took 4 / 8 / 16."""
    most = max(32, (8 * (smem_limit - STATIC_SMEM)) // (8 * itemsize + 1) // 32 * 32)
    nseg = -(-k // most)
    return -(-(-(-k // nseg)) // 32) * 32


def global_seg_shape(k: int, itemsize: int, smem_limit: int, n_glob: int, sms: int):
    """(columns a segment, segments a row) of the numeric global path by segments for n_glob rows
    of k columns, or None where the slabs take them: more than GLOBAL_SEG_MAX_SEGMENTS segments a
    row, fewer blocks than GLOBAL_SEG_MIN_BLOCKS_PER_SM a multiprocessor, or past int32 blocks."""
    cols = global_seg_cols(k, itemsize, smem_limit)
    nseg = -(-k // cols)
    blocks = n_glob * nseg
    if nseg > GLOBAL_SEG_MAX_SEGMENTS or blocks > INT32_MAX or blocks < GLOBAL_SEG_MIN_BLOCKS_PER_SM * sms:
        return None
    return cols, nseg


def _global_rows(s: "_Symbolic", fork_stream, rows, n_glob: int, Cp, base, Cj, Cx, row_nnz) -> None:
    """The numeric global path of ``rows`` (n_glob of them) on ``fork_stream``: by column segments
    where global_seg_shape takes them, else by slabs; Cp null (_NULL): the one-pass layout."""
    if not _global_segmented(s, fork_stream, rows, n_glob, Cp, base, Cj, Cx, row_nnz):
        with fork_stream:
            _global_slabs(s, rows, n_glob, Cp, base, Cj, Cx, row_nnz)


def _global_segmented(s: "_Symbolic", fork_stream, rows, n_glob: int, Cp, base, Cj, Cx, row_nnz) -> bool:
    """The numeric global path by column segments for ``rows`` (n_glob of them) where
    global_seg_shape takes them; False (nothing launched) otherwise."""
    A, B, k, itemsize = s.A, s.B, s.shape[1], s.dtype.itemsize
    shape = global_seg_shape(k, itemsize, s.smem_limit, n_glob, _device_limits(_device_id())[1])
    if shape is None:
        return False
    cols, nseg = shape
    b_sorted = GLOBAL_SEG_B_ROWS and nseg > 1 and bool(B.has_sorted_indices)   # may check B (a host transfer)
    with fork_stream:   # the look-back's status words, then its ticket counter, zeroed
        status = _cuda.zeroed(n_glob * nseg + 1, np.uint64)
        _cuda.hold(status)
        _launch(f"numeric_global_seg<{_cuda.ctype(s.dtype)}>", n_glob * nseg, GLOBAL_SEG_THREADS,
                (A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, s.csum, rows, np.int32(n_glob),
                 np.int32(nseg), np.int32(cols), status, Cp, base, Cj, Cx, np.int32(b_sorted), row_nnz,
                 s.skip or _NULL),
                smem=cols * itemsize + cols // 8)
    s.info.update(global_segments=nseg, global_segment_walk="B rows" if b_sorted else "products")
    return True


def _symbolic_global(s: "_Symbolic", rows, n: int, row_nnz, peak: int) -> None:
    """symbolic_global over ``rows`` (n of them, at most ``peak`` products each), a bitmap of B's
    columns a row: in shared memory where one fits (SYMBOLIC_GLOBAL_SHARED), and in global memory,
    in batches of rows, for rows of several blocks (their union) or past shared memory."""
    cp = cupy_module()
    A, B, words = s.A, s.B, -(-s.shape[1] // 32)
    in_shared = _symbolic_bitmap_shared(s.shape[1], s.smem_limit)
    parts = _global_parts(peak, min(n, _global_target_blocks()))
    if in_shared and parts == 1:   # a block a row, its bitmap in shared memory alone: one launch
        G = n
    else:                          # batches of rows that hold a bitmap each in global memory
        G = _global_blocks(n, 4 * words, "symbolic")
        parts = _global_parts(peak, min(G, n))
    bitmaps = cp.empty(G * words if parts > 1 or not in_shared else 1, dtype=cp.uint32)
    for b0 in range(0, n, G):   # batches of G rows, a bitmap each
        if bitmaps.size > 1:
            bitmaps.fill(0)
        _launch("symbolic_global", (min(G, n - b0), parts), GLOBAL_BLOCK_THREADS,
                (A.indptr, A.indices, B.indptr, B.indices, s.csum, rows, np.int32(b0), bitmaps,
                 np.int32(words), np.int32(in_shared), np.int64(peak), row_nnz), smem=4 * words if in_shared else 0)


def _symbolic_bitmap_shared(k: int, smem_limit: int) -> bool:
    """Whether symbolic_global keeps its bitmap of B's k columns in shared memory: allowed
    (SYMBOLIC_GLOBAL_SHARED) and its k / 32 words fit beside STATIC_SMEM."""
    return SYMBOLIC_GLOBAL_SHARED and 4 * -(-k // 32) + STATIC_SMEM <= smem_limit


def symbolic_bitmap_from(k: int, smem_limit: int) -> float:
    """The smallest symbolic table whose rows count their columns in a bitmap of B's k columns
    instead (symbolic_global): SYMBOLIC_BITMAP_RATIO slots a 32-bit word of the bitmap, where the
    bitmap is in shared memory; infinity otherwise."""
    return SYMBOLIC_BITMAP_RATIO * -(-k // 32) if _symbolic_bitmap_shared(k, smem_limit) else math.inf


def _global_blocks(nrows, slab_bytes, what):
    """Rows of a batch of the global path (a slab each): all of them up to the resident-block target
    and what GLOBAL_MEM_FRACTION of free memory holds (asked only when the batch's slabs pass
    SMALL_OUTPUT_FRACTION of the device; below, a shortage is CuPy's OutOfMemoryError); past the
    target (several batches anyway), as many slabs as GLOBAL_L2_FRACTION of the L2 cache holds, but
    enough rows to give every SM GLOBAL_BLOCKS_PER_SM blocks at GLOBAL_MAX_PARTS a row."""
    target = _global_target_blocks()
    rows = min(nrows, target)
    # the driver's free memory (~15 us a query) only where the slabs could come near it
    if rows * slab_bytes > SMALL_OUTPUT_FRACTION * _device_total_bytes():
        free = _free_device_bytes()
        fit = int(free * GLOBAL_MEM_FRACTION) // slab_bytes
        if fit < 1:
            raise MemoryError(f"spgemm: the global-memory path ({what}) needs {slab_bytes:,} bytes per "
                              f"row slab (B has that many columns), more than {GLOBAL_MEM_FRACTION:.0%} "
                              f"of the {free:,} bytes free")
        rows = min(rows, fit)
    if nrows > target:
        l2 = _cuda.device_attribute("L2CacheSize", _device_id())
        rows = min(rows, max(int(l2 * GLOBAL_L2_FRACTION) // slab_bytes, -(-target // GLOBAL_MAX_PARTS)))
    return max(1, rows)


def check_csr(name: str, M):
    """Raise naming ``name`` unless M is a cupyx CSR matrix of float32 or float64 (SpGEMM, SpTRANS)."""
    csp = cupyx_sparse()
    if not csp.isspmatrix_csr(M):
        raise TypeError(f"{name}: expected a cupyx.scipy.sparse.csr_matrix, got {type(M).__name__}")
    if np.dtype(M.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{name}: dtype {M.dtype} is not supported; expected float32 or float64")


def csr_from_parts(data, indices, indptr, shape, *, sorted_rows: bool, canonical):
    """A cupyx CSR of these GPU arrays without reading them back: ``_from_parts`` (cupyx >= 14)
    checks only sizes and dtypes; the public constructor, used where that is missing, reads
    indptr's ends from the GPU (a host synchronisation). canonical: True, or None (not known)."""
    csp = cupyx_sparse()
    from_parts = getattr(csp.csr_matrix, "_from_parts", None)
    if from_parts is not None:
        return from_parts(data, indices, indptr, shape, has_canonical_format=canonical,
                          has_sorted_indices=sorted_rows or None)
    M = csp.csr_matrix((data, indices, indptr), shape=shape)
    if sorted_rows:
        M.has_sorted_indices = True
    if canonical:
        M.has_canonical_format = True
    return M


def check_operands(A, B):
    """Raise naming the argument unless A, B are cupyx CSR matrices of one float dtype that conform."""
    check_csr("A", A)
    check_csr("B", B)
    if A.dtype != B.dtype:
        raise TypeError(f"A and B: dtypes differ ({A.dtype} vs {B.dtype}); cast one of them")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A and B do not conform: A is {A.shape[0]}x{A.shape[1]}, B has {B.shape[0]} rows")


def int32_operand(name: str, M):
    """M with int32 indices and indptr, which the kernels read (``int*``).

    CuPy >= 14.1 keeps int64 indices where a matrix was built with them; those that fit are copied
    to int32 here. A matrix past the int32 range (nnz or a dimension above 2^31 - 1) is refused:
    the hash kernels index A, B and C's columns with 32-bit integers.
    """
    csp = cupyx_sparse()
    if max(M.nnz, *M.shape) > INT32_MAX:
        sizes = (("nnz", M.nnz), ("rows", M.shape[0]), ("columns", M.shape[1]))
        too_big = [f"{what} {v:,}" for what, v in sizes if v > INT32_MAX]
        raise ValueError(f"{name}: {', '.join(too_big)} past 2^31 - 1 = {INT32_MAX:,}; spgemm.hash indexes "
                         f"A, B and C's columns with int32 (split {name} into blocks of fewer nonzeros)")
    for what in ("indices", "indptr"):
        dt = np.dtype(getattr(M, what).dtype)
        if dt.kind not in "iu":
            raise TypeError(f"{name}.{what}: expected an integer array, got {dt}")
    if M.indices.dtype == np.int32 and M.indptr.dtype == np.int32:
        return M
    return csp.csr_matrix((M.data, M.indices.astype(np.int32), M.indptr.astype(np.int32)), shape=M.shape)


# ----------------------------------------------------------------------------- row panels (NumPy)
#: Bytes of a panel per nonzero of C beyond its value: the int32 column index.
PANEL_INDEX_BYTES = 4
#: Device bytes a panel needs per row: its int32 indptr, the int64 offsets it is cut from, and the
#: row grouping of the numeric pass (table index, order, bucket keys).
PANEL_ROW_BYTES = 32
#: Fraction of the free device memory (after the symbolic pass) one panel may take when C is split
#: (out='host', spgemm_panels): a generator's caller may still hold the previous panel while the
#: next is built, and the global-memory path takes its slabs from what is left.
PANEL_MEM_FRACTION = 0.3
#: Fraction of the free device memory the single output of spgemm(out='device') may take; outputs
#: below SMALL_OUTPUT_FRACTION of the device's total memory skip the check (CuPy's own
#: OutOfMemoryError remains if the pool cannot serve them).
OUTPUT_MEM_FRACTION = 0.9
SMALL_OUTPUT_FRACTION = 1 / 16
#: The one-pass path (_one_pass): rows whose bound min(nnz_RowCt, k) fits this table, an upper-bound
#: buffer of at most this fraction of the device's memory.
ONE_PASS_MAX_TABLE = 256
ONE_PASS_MEM_FRACTION = 1 / 16
#: ... and also when at most ONE_PASS_LONG_ROWS rows fit neither (their slabs of B.shape[1] columns
#: at most ONE_PASS_LONG_BYTES): those take the global path in the one-pass layout, which
#: saves the symbolic pass and two of the four host round trips of the two passes (skewed-spgemm:
#: 34 such rows of 499,966 short ones).
ONE_PASS_LONG_ROWS = 64
ONE_PASS_LONG_BYTES = 256 << 20
#: compact_rows: lanes a row on the one-pass path (fewer for the hybrid's short rows); compact_ranges: rows a block of 256
#: threads (COMPACT_ROWS), taken when C's rows hold fewer than COMPACT_RANGE_BELOW entries on average.
COMPACT_LANES = 32
COMPACT_ROWS = 256
COMPACT_RANGE_BELOW = 16
#: The one-pass path copies C with compact_entries (a block per 2048 consecutive entries of C,
#: whatever rows hold them) where rows took the global path: a long row spreads over the blocks its
#: entries fill. H100 (630161a, spgemm-compact-entries-h100-2026-11-24-630161a.log), GPU time of
#: the copy: skewed 425 -> 67 us (its 34 long rows had a block each), metis 84 -> 71; without long
#: rows compact_rows / compact_ranges stay ahead (uniform 136 against 161, world_highways 68
#: against 77, Poisson 103 against 105). True: compact_entries for every one-pass product (tests).
COMPACT_ALL_BY_ENTRIES = False
#: compact_entries' entries a block (256 threads of spgemm.cu's COMPACT_ITEMS).
COMPACT_ENTRIES_BLOCK = 256 * 8
#: Fraction of the host's available memory (MemAvailable) an out='host' result may take.
HOST_MEM_FRACTION = 0.8


def panel_bytes(nnz, rows, itemsize: int):
    """Device bytes of a panel of ``rows`` rows and ``nnz`` nonzeros of C (output and row workspace)."""
    return nnz * (PANEL_INDEX_BYTES + itemsize) + rows * PANEL_ROW_BYTES


def panel_bounds(indptr, max_nnz: int, max_bytes: int | None = None, itemsize: int = 8) -> np.ndarray:
    """Row boundaries [0, b1, ..., m] of contiguous panels of C, given C's int64 ``indptr``.

    Greedy from the top: each panel takes as many rows as fit both limits, nnz <= ``max_nnz`` and
    panel_bytes(nnz, rows, itemsize) <= ``max_bytes`` (None: no byte limit), so the panels are as
    few as these limits allow. Empty rows cost PANEL_ROW_BYTES each (a byte limit can cut a run of
    empty rows). A single row past a limit raises ValueError naming the row. NumPy only.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    if indptr.ndim != 1 or indptr.size < 1 or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
        raise ValueError("indptr: expected a 1-D non-decreasing array starting at 0 (C's row offsets)")
    if isinstance(max_nnz, bool) or int(max_nnz) < 1:
        raise ValueError(f"max_nnz: expected a positive number of nonzeros, got {max_nnz!r}")
    if max_bytes is not None and (isinstance(max_bytes, bool) or int(max_bytes) < 1):
        raise ValueError(f"max_bytes: expected a positive number of bytes, got {max_bytes!r}")
    m = indptr.size - 1
    cost = panel_bytes(indptr, np.arange(m + 1, dtype=np.int64), itemsize)  # cumulative, increasing
    bounds = [0]
    while bounds[-1] < m:
        r = bounds[-1]
        stop = int(np.searchsorted(indptr, indptr[r] + int(max_nnz), side="right")) - 1
        if max_bytes is not None:
            stop = min(stop, int(np.searchsorted(cost, cost[r] + int(max_bytes), side="right")) - 1)
        if stop <= r:
            nnz = int(indptr[r + 1] - indptr[r])
            raise ValueError(f"row {r} of C alone has {nnz:,} nonzeros ({int(panel_bytes(nnz, 1, itemsize)):,} "
                             f"bytes as a panel), past the panel limit of {int(max_nnz):,} nonzeros"
                             + (f" / {int(max_bytes):,} bytes" if max_bytes is not None else ""))
        bounds.append(min(stop, m))
    return np.asarray(bounds, dtype=np.int64)


def host_available_bytes() -> int:
    """Memory the host can still give: MemAvailable from /proc/meminfo, else free pages (os.sysconf)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _positive_limit(name, value, upper=None):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{name}: {value:,} is past {upper:,} (2^31 - 1: a panel is a cupyx CSR "
                         f"with int32 indptr)")
    return int(value)


# ----------------------------------------------------------------------------- the passes
@dataclasses.dataclass
class _Symbolic:
    """What the analysis and symbolic passes leave for the numeric pass of any row range."""
    A: object
    B: object
    dtype: np.dtype
    sort: bool
    smem_limit: int
    num_ladder: tuple
    csum: object = None        # int64, nnz(A) + 1 (GPU)
    Cp: object = None          # int64, m + 1: C's exact row offsets (GPU)
    Cp32: object = None        # the same truncated to int32 (C's indptr when nnz(C) < 2^31)
    num_idx: object = None     # numeric table index per row, balanced rule applied (GPU)
    whole: tuple = None        # (order, host counts) of num_idx over all rows: the one-panel case
    nnz_c: int = 0
    rowct_max: int = 0         # products of the largest row (sizes the global path's teams)
    one_pass: tuple = None     # (balanced, zeros, classes, caps) when the one-pass path takes over
    hybrid: tuple = None       # (rows, Uj, Ux, buffer): rows numeric_esc wrote to an upper-bound buffer
    taken: tuple = ()          # (analysis class per row, n_esc) of those rows, for the numeric classes
    n_esc: int = 0             # numeric_esc classes at the front of the one-pass classes
    counts: tuple = None       # (row_nnz, Cp, Cp32): the address of C's row counts (int64, zeroed,
    #                            in zeros) and C's row offsets, allocated while the analysis runs
    zeros: object = None       # the call's _Zeros (its words must outlive every launch reading them)
    words: np.ndarray = None   # the analysis's words (read back, or guessed: _guessed)
    skip: object = None        # guessed: the address of words_differ's flag (the numeric kernels skip when set)
    info: dict = dataclasses.field(default_factory=dict)
    host_ms: dict = dataclasses.field(default_factory=dict)

    @property
    def shape(self):
        return self.A.shape[0], self.B.shape[1]

    @property
    def empty(self):
        return self.Cp is None


def _symbolic(A, B, sort, smem_limit, grouping, info, passes="two", esc=True, guess=None) -> _Symbolic:
    """Checks, analysis (step 1), symbolic pass (2) and scan (3): C's exact int64 row offsets;
    passes="auto" stops after the analysis (s.one_pass set) where one_pass_table allows.
    ``guess``: (host words, device copy) of an earlier call's analysis to go on from instead of
    waiting for this one's (_guessed; checked on the GPU, s.skip)."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("spgemm.hash needs CuPy and an NVIDIA GPU")
    check_operands(A, B)
    A, B = int32_operand("A", A), int32_operand("B", B)
    if grouping not in ("auto", "balanced", "grouped"):
        raise ValueError(f"grouping: expected 'auto', 'balanced' or 'grouped', got {grouping!r}")
    dtype = np.dtype(A.dtype)
    m, k = A.shape[0], B.shape[1]
    if smem_limit is None:
        smem_limit = _device_limits(_device_id())[0]
    elif isinstance(smem_limit, bool) or not isinstance(smem_limit, (int, np.integer)) or smem_limit <= 0:
        raise ValueError(f"smem_limit: expected a positive number of bytes, got {smem_limit!r}")
    sym_ladder = table_ladder(smem_limit, KEY_BYTES)
    num_ladder = table_ladder(smem_limit, KEY_BYTES + dtype.itemsize)
    s = _Symbolic(A, B, dtype, bool(sort), int(smem_limit), num_ladder, info=info)

    if m == 0 or k == 0 or A.nnz == 0 or B.nnz == 0:
        info.update(products=0, nnz_c=0, balanced=True, global_rows_symbolic=0, global_rows_numeric=0)
        return s

    clock = [time.perf_counter()]  # host time at phase ends (includes the two host transfers)

    # 1. analysis: nnz_RowCt, its moments and the symbolic table of every row in one launch and
    #    one host transfer
    #    (with passes="auto" the same launch also gives every row's one-pass class)
    sorts = esc_caps(k) if esc and passes == "auto" else ()   # numeric_esc's classes come first
    classes = (sorts + num_ladder) if passes == "auto" else ()
    s.n_esc = len(sorts)
    zeros = s.zeros = _Zeros([_scan_words(A.nnz), _classify_words(len(sym_ladder)) + _classify_words(len(classes)),
                              1, _scan_words(m), _classify_words(len(num_ladder)), m, 1])
    csum = _product_offsets(A, B, zeros.take(_scan_words(A.nnz)))
    row_nnz = zeros.take(m)
    if guess is not None:
        s.skip = zeros.take(1)
        guess = (guess[0], guess[1].data.ptr, s.skip)

    def offsets():   # allocated while the GPU classifies, off the host's work after the transfer
        s.counts = (row_nnz, cp.empty(m + 1, dtype=cp.int64), cp.empty(m + 1, dtype=cp.int32))
    sym = _classify(m, k, sym_ladder, A=A, csum=csum, second=(classes, s.n_esc),
                    acc=zeros.take(_classify_words(len(sym_ladder)) + _classify_words(len(classes))), meanwhile=offsets,
                    guess=guess)
    s.words = sym.words
    bal = (sym.var <= spgemm_model.RBS_BALANCED_RATIO * sym.mean) if grouping == "auto" else (grouping == "balanced")
    s.rowct_max = sym.peak
    info.update(products=sym.total, rowct_max=sym.peak,
                rowct_var_over_mean=sym.var / sym.mean if sym.mean > 0 else 0.0, balanced=bal)
    s.csum = csum
    info["one_pass"] = False
    if passes == "auto":
        lift = one_pass_lift(classes, s.n_esc)
        n_long = int(sym.second.counts[lift + 1:].sum())
        total_bytes = _device_total_bytes()
        if (one_pass_table(s.rowct_max, k, num_ladder[-1], info["products"], dtype.itemsize, total_bytes,
                           (sorts or (0,))[-1])
                or one_pass_long(n_long, k, info["products"], dtype.itemsize, total_bytes)):
            s.one_pass = (bal, zeros, sym.second, classes, lift if n_long else -1)
    if s.one_pass is not None:
        clock.append(time.perf_counter())
        s.host_ms = {"analysis": (clock[1] - clock[0]) * 1e3}
        return s
    if guess is not None:   # _remember keeps one-pass analyses only, so equal words cannot get here
        raise _Misguess()
    # the hybrid: rows numeric_esc can take (their symbolic index is -1) go through it now, into
    # an upper-bound buffer, while the others take the two passes; where the buffer does not fit
    # (or HYBRID_MIN_ROWS says no), they are classified again for the symbolic tables (one launch
    # and transfer more): a row left at index -1 would be lost
    n_esc = s.n_esc
    n_sorted = int(sym.second.counts[1:n_esc + 1].sum()) if n_esc else 0
    if n_sorted:
        if n_sorted >= HYBRID_MIN_ROWS and upper_bound_fits(info["products"], dtype.itemsize, _device_total_bytes()):
            s.hybrid = _esc_first(s, sym.second, classes, row_nnz)
            s.taken = (sym.second.idx, n_esc)
        else:
            sym = _classify(m, k, sym_ladder, A=A, csum=csum)
    sms = _device_limits(_device_id())[1]
    sym_lift = -1 if bal else lift_index(sym.counts, sym_ladder, sms, s.rowct_max)
    sym_order, sym_counts = _group(sym, len(sym_ladder), bal, sym_lift)
    lifted_sym = _lifted_rows(sym, sym_lift)
    risky = sym.risky
    info.update(symbolic_tables={size: int(c) for size, c in zip(sym_ladder, sym_counts[1:-1]) if c})
    del sym

    clock.append(time.perf_counter())

    # 2. symbolic
    ovf_rows = cp.empty(m, dtype=cp.int32)
    n_direct = int(sym_counts[-1])
    ovf_count = zeros.take(1)   # (int32) rows that overflowed, listed after the n_direct
    starts = _starts(sym_counts)
    if n_direct:
        ovf_rows[:n_direct] = sym_order[starts[-2]:starts[-1]]
    fork = _Fork(sym_counts[1:len(sym_ladder) + 1])
    bitmap_from = symbolic_bitmap_from(k, smem_limit)
    info["symbolic_bitmap_rows"] = int(sum(c for size, c in zip(sym_ladder, sym_counts[1:]) if size >= bitmap_from))
    for t, size in enumerate(sym_ladder):
        n = int(sym_counts[t + 1])
        if n == 0:
            continue
        tpr, rpb = launch_shape(size, KEY_BYTES, smem_limit, SYMBOLIC_SLOTS_PER_THREAD)
        rows = sym_order[starts[t + 1]:starts[t + 2]]
        with fork.stream(t):
            if size >= bitmap_from:   # rows of a table hold alpha = products / pi <= size
                _symbolic_global(s, rows, n, row_nnz, min(s.rowct_max, math.ceil(size * spgemm_model.RBS_COMPRESSION)))
                continue
            _launch(f"symbolic_shared<{group_width(tpr)}>", (n + rpb - 1) // rpb, tpr * rpb,
                    (A.indptr, A.indices, B.indptr, B.indices, csum, rows, np.int32(n),
                     np.int32(size), np.int32(rpb), row_nnz, ovf_rows, np.int32(n_direct), ovf_count),
                    smem=table_smem(size, KEY_BYTES, rpb))
    fork.join()
    n_global_sym = n_direct
    if risky or sym_counts[len(sym_ladder)]:
        # rows in the largest table may have filled it (past 3/4 of it counts as full, see
        # symbolic_shared): one more host transfer to know
        n_global_sym = n_direct + int(_cuda.read_at(ovf_count, 1, np.int32)[0])
    if n_global_sym:
        _symbolic_global(s, ovf_rows, n_global_sym, row_nnz, s.rowct_max)
    del ovf_rows, sym_order

    clock.append(time.perf_counter())

    # 3. scan; numeric table of every row (sliced per panel), grouped over all rows for one panel
    _, Cp, Cp32 = s.counts
    _scan("scan_rows", m, (row_nnz, np.int64(m), Cp, Cp32), zeros.take(_scan_words(m)))  # Cp32: C's indptr < 2^31
    num = _classify(m, k, num_ladder, row_nnz=row_nnz, acc=zeros.take(_classify_words(len(num_ladder))),
                    taken=s.taken)
    num_lift = -1 if bal else lift_index(num.counts, num_ladder, sms, s.rowct_max)
    order, counts = _group(num, len(num_ladder), bal, num_lift)
    s.Cp, s.Cp32, s.nnz_c, s.num_idx, s.whole = Cp, Cp32, num.total, num.idx, (order, counts)
    info.update(lifted_rows={"symbolic": lifted_sym, "numeric": _lifted_rows(num, num_lift)})
    info.update(nnz_c=s.nnz_c, global_rows_symbolic=n_global_sym,
                symbolic_overflowed=n_global_sym - n_direct, smem_limit=int(smem_limit),
                numeric_tables={}, global_rows_numeric=0)
    clock.append(time.perf_counter())
    s.host_ms = {ph: (b - a) * 1e3 for ph, a, b in zip(("analysis", "symbolic", "scan"), clock, clock[1:])}
    return s


def _numeric(s: _Symbolic, r0: int, r1: int, c0: int, c1: int):
    """Step 4 for rows [r0, r1) of C, whose nonzeros are [c0, c1) of the whole: a cupyx CSR panel
    of (r1 - r0) x k with int32 indptr starting at 0. Rows grouped by exact nnz, one launch per
    table size on its own stream; rows past every shared table use the global-memory path."""
    cp = cupy_module()
    t0 = time.perf_counter()
    k, dtype, ladder = s.shape[1], s.dtype, s.num_ladder
    nnz = c1 - c0
    if nnz > INT32_MAX:  # panel_bounds keeps panels below this; a guard, not a path
        raise OverflowError(f"spgemm: panel rows [{r0}, {r1}) have {nnz:,} nonzeros, past 2^31 - 1")
    if (r0, r1) == (0, s.shape[0]):
        order, counts = s.whole
    else:
        order, counts_d = groups_of(s.num_idx[r0:r1], len(ladder))
        counts = _cuda.read_back(counts_d)
        order += np.int32(r0)                   # panel-local positions -> global row ids
    Cj = cp.empty(nnz, dtype=cp.int32)
    Cx = cp.empty(nnz, dtype=dtype)
    starts = _starts(counts)
    base = np.int64(c0)
    fork = _Fork(counts[1:])   # the shared tables, then the global path
    _numeric_tables(s, fork, order, starts, counts, s.Cp, base, Cj, Cx, _NULL)
    n_glob = int(counts[-1])
    rows = order[starts[-2]:starts[-1]] if n_glob else None
    if n_glob:
        _global_rows(s, fork.stream(len(ladder)), rows, n_glob, s.Cp, base, Cj, Cx, _NULL)
    fork.join()
    if s.hybrid is not None:   # the rows numeric_esc took (whole C only: panels take two passes)
        rows, Uj, Ux, _ = s.hybrid
        _compact(s, s.Cp, Uj, Ux, Cj, Cx, rows, lanes=_compact_lanes(s.info["esc_rows"]))
        s.hybrid = None
    if (r0, r1) == (0, s.shape[0]):
        indptr = s.Cp32   # nnz < 2^31 (checked above): the truncation is exact
    else:
        indptr = (s.Cp[r0:r1 + 1] - base if base else s.Cp[r0:r1 + 1]).astype(cp.int32)
    # sorted rows are canonical: the hash leaves no duplicates
    C = csr_from_parts(Cx, Cj, indptr, (r1 - r0, k), sorted_rows=s.sort, canonical=s.sort or None)
    tables = s.info["numeric_tables"]
    for size, c in zip(ladder, counts[1:-1]):
        if c:
            tables[size] = tables.get(size, 0) + int(c)
    s.info["global_rows_numeric"] += n_glob
    s.host_ms["numeric_launch"] = s.host_ms.get("numeric_launch", 0.0) + (time.perf_counter() - t0) * 1e3
    return C


def _global_slabs(s: _Symbolic, rows, n_glob: int, Cp, base, Cj, Cx, row_nnz) -> None:
    """The global-memory path of ``n_glob`` rows by dense slabs (numeric_global_acc, then
    global_segment_counts and numeric_global_out over column segments), in batches of as many rows
    as there are slabs; Cp null (_NULL): the one-pass layout, each row's count to row_nnz."""
    cp = cupy_module()
    A, B, k, dtype = s.A, s.B, s.shape[1], s.dtype
    ct = _cuda.ctype(dtype)
    G = _global_blocks(n_glob, k * (KEY_BYTES + dtype.itemsize), "numeric")
    parts = _global_parts(s.rowct_max, min(G, n_glob))
    segs, seg_cols = _global_segments(k, min(G, n_glob))
    marks = _cuda.zeroed(G * k, np.int32)
    acc = _cuda.zeroed(G * k, dtype)
    seg_counts = cp.empty(G * segs, dtype=cp.int32)
    _cuda.hold(marks, acc, seg_counts)   # a recorded call's graph (_guessed) uses them on every replay
    for b0 in range(0, n_glob, G):    # batches of G rows, a slab each
        nb = min(G, n_glob - b0)
        _launch(f"numeric_global_acc<{ct}>", (nb, parts), GLOBAL_BLOCK_THREADS,
                (A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, s.csum, rows,
                 np.int32(b0), marks, acc, np.int64(k), s.skip or _NULL))
        if segs > 1:   # one segment a row starts at the row's start: nothing to count
            _launch("global_segment_counts", (nb, segs), GLOBAL_BLOCK_THREADS,
                    (rows, np.int32(b0), marks, np.int64(k), np.int64(seg_cols), seg_counts))
        _launch(f"numeric_global_out<{ct}>", (nb, segs), GLOBAL_BLOCK_THREADS,
                (rows, np.int32(b0), marks, acc, np.int64(k), np.int64(seg_cols), seg_counts,
                 Cp, base, Cj, Cx, A.indptr, s.csum, row_nnz, s.skip or _NULL))


def _numeric_tables(s: _Symbolic, fork, order, starts, counts, Cp, base, Cj, Cx, row_nnz, first: int = 0):
    """numeric_shared for every shared table with rows (counts, starts: host, per class index + 1;
    order: the rows grouped; table t is class first + t and launches on that fork stream); Cp null
    (_NULL): the one-pass layout."""
    for t, size in enumerate(s.num_ladder, start=first):
        n = int(counts[t + 1])
        if n:
            with fork.stream(t):
                _numeric_launch(s, size, _rows_at(order, starts[t + 1]), n, Cp, base, Cj, Cx, row_nnz)


def bitmap_words(size: int, rpb: int, ncols: int, slot_bytes: int, smem_bytes: int, sort: bool) -> int:
    """Words of numeric_shared's column bitmap for sorted rows in ``size``-slot tables (0: the
    bitonic sort): tables past RANK_SORT_MAX slots, one row a block, B's ``ncols`` columns at most
    BITMAP_WORDS_PER_SLOT words a slot, and the bitmap beside the table within ``smem_bytes``."""
    words = -(-ncols // 32)
    fits = table_smem(size, slot_bytes, rpb) + 4 * words + STATIC_SMEM <= smem_bytes
    use = sort and rpb == 1 and size > RANK_SORT_MAX and words <= BITMAP_WORDS_PER_SLOT * size and fits
    return words if use else 0


def _numeric_launch(s: _Symbolic, size: int, rows, n: int, Cp, base, Cj, Cx, row_nnz):
    """One numeric_shared launch over n rows (rows null: rows 0 .. n - 1) in tables of ``size`` slots."""
    A, B = s.A, s.B
    num_slot = KEY_BYTES + s.dtype.itemsize
    tpr, rpb = launch_shape(size, num_slot, s.smem_limit, NUMERIC_SUBWARP_SLOTS
                            if size <= SUBWARP_MAX_TABLE else NUMERIC_SLOTS_PER_THREAD)
    words = bitmap_words(size, rpb, s.shape[1], num_slot, s.smem_limit, s.sort)
    _launch(f"numeric_shared<{_cuda.ctype(s.dtype)}, {group_width(tpr)}>", (n + rpb - 1) // rpb, tpr * rpb,
            (A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, s.csum, rows,
             np.int32(n), np.int32(size), np.int32(rpb), Cp, base, Cj, Cx, np.int32(s.sort), row_nnz,
             np.int32(words), s.skip or _NULL),
            smem=table_smem(size, num_slot, rpb) + 4 * words)


def _esc_launches(s: _Symbolic, fork, order, starts, counts, sort_caps: tuple, Uj, Ux, row_nnz, Cp=_NULL) -> dict:
    """numeric_esc for every sort class with rows (classes 0 .. len(sort_caps) - 1 of a grouping:
    order, host starts and counts per class index + 1), each on its fork stream, as _esc_launch
    writes; returns {class size: rows}."""
    for c in range(len(sort_caps)):
        n = int(counts[c + 1])
        if n:
            with fork.stream(c):
                _esc_launch(s, c, _rows_at(order, starts[c + 1]), n, Uj, Ux, row_nnz, Cp)
    return {cap: int(n) for cap, n in zip(sort_caps, counts[1:len(sort_caps) + 1]) if n}


def _upper_bound(s: _Symbolic) -> tuple:
    """(buffer, Uj, Ux): the upper-bound buffer of the one-pass path, one entry a product, and
    the device addresses of its columns (int32) and values (s.dtype) in it (one allocation: each
    costs ~4 us of host time while the GPU waits for the numeric launches). A row i is written at
    its products' offset csum[Ap[i]] and _compact moves it to C. Keep the buffer while they run."""
    products = s.info["products"]
    cols = -(-4 * products // 16) * 16
    buf = cupy_module().empty(cols + products * s.dtype.itemsize, dtype=np.uint8)
    return buf, buf.data.ptr, buf.data.ptr + cols


def _esc_first(s: _Symbolic, one: _Classes, classes: tuple, row_nnz) -> tuple:
    """The hybrid's first step: numeric_esc on the rows it can take (``one``: the analysis's
    one-pass classes), into an upper-bound buffer with their counts in row_nnz, before the other
    rows' symbolic pass; returns (those rows, Uj, Ux, the buffer holding them) for _compact after
    the scan."""
    n_esc = s.n_esc
    order, counts = _group(one, len(classes), False)   # the GPU groups while the buffer is allocated
    buf, Uj, Ux = _upper_bound(s)
    starts = _starts(counts)
    fork = _Fork(counts[1:n_esc + 1])
    s.info["esc_rows"] = _esc_launches(s, fork, order, starts, counts, classes[:n_esc], Uj, Ux, row_nnz)
    fork.join()
    s.info["hybrid"] = True
    return order[int(starts[1]):int(starts[n_esc + 1])], Uj, Ux, buf


def _compact_lanes(esc_rows: dict) -> int:
    """compact_rows' lanes a row for rows of numeric_esc's classes (``esc_rows``: {class cap: rows}):
    from the widest class used, a quarter of its products, 4 to COMPACT_LANES."""
    return COMPACT_LANES if not esc_rows else min(COMPACT_LANES, max(4, max(esc_rows) // 4))


#: _compact's copiers (spgemm.cu): a group of lanes a row, a block a range of rows, a block a range
#: of C's entries.
COMPACT_HOW = ("rows", "ranges", "entries")


def _compact(s: _Symbolic, Cp, Uj, Ux, Cj, Cx, rows, how: str = "rows", lanes: int = COMPACT_LANES):
    """Rows of the upper-bound buffer (Uj, Ux at their products' offsets) to C's offsets Cp, by
    ``how``: "rows", compact_rows over ``rows`` (null: every row), ``lanes`` (a power of two <=
    BLOCK_THREADS) a row; "ranges", compact_ranges (every row; for short rows); or "entries",
    compact_entries (every row; a block a range of C's entries, ``Cj.size`` of them)."""
    if how not in COMPACT_HOW:
        raise ValueError(f"how: expected one of {COMPACT_HOW}, got {how!r}")
    ct = _cuda.ctype(s.dtype)
    m = s.shape[0] if rows is _NULL else rows.size
    args = (s.A.indptr, s.csum, Cp, Uj, Ux, np.int32(m), Cj, Cx)
    if how == "entries":
        if Cj.size:
            _launch(f"compact_entries<{ct}>", -(-Cj.size // COMPACT_ENTRIES_BLOCK), 256,
                    args[:6] + (np.int64(Cj.size),) + args[6:])
    elif how == "ranges":
        _launch(f"compact_ranges<{ct}>", -(-m // COMPACT_ROWS), 256, args)
    else:
        _launch(f"compact_rows<{ct}>", max(1, min(-(-m // (BLOCK_THREADS // lanes)), 64 * _global_target_blocks())),
                BLOCK_THREADS, args + (rows, np.int32(lanes)))


def _esc_launch(s: _Symbolic, c: int, rows, n: int, Uj, Ux, row_nnz, Cp=_NULL):
    """One numeric_esc launch of class ESC_CLASSES[c] over n rows (rows null: rows 0 .. n - 1), in
    the one-pass layout (each row at its products' offset, its count in row_nnz), or, ``Cp``
    given, at C's guessed offsets Cp (int64; a row of another length refutes the guess)."""
    A, B = s.A, s.B
    w, p = ESC_CLASSES[c]
    _launch(f"numeric_esc<{_cuda.ctype(s.dtype)}, {w}, {p}>", -(-n * w // ESC_BLOCK), ESC_BLOCK,
            (A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, s.csum, rows, np.int32(n),
             Cp, np.int64(0), Uj, Ux, row_nnz, np.int32(ESC_WINDOW), s.skip or _NULL))


def one_pass_table(peak: int, k: int, top: int, products: int, itemsize: int, total_bytes: int,
                   esc_cap: int = 0) -> bool:
    """Whether C = A @ B takes the one-pass path: every row's bound min(nnz_RowCt, k) fits a table
    of ONE_PASS_MAX_TABLE slots (and the largest numeric table, ``top``), or every row's products
    fit numeric_esc's largest class (``esc_cap``), and the upper-bound buffer (products entries) is
    at most ONE_PASS_MEM_FRACTION of the device's memory and below 2^31 entries."""
    return ((min(int(peak), int(k)) <= min(ONE_PASS_MAX_TABLE, int(top)) or int(peak) <= esc_cap)
            and upper_bound_fits(products, itemsize, total_bytes))


def one_pass_lift(classes: tuple, n_esc: int) -> int:
    """The first one-pass class (numeric_esc's n_esc, then the tables) of rows too long for the
    one-pass tables: the first table past ONE_PASS_MAX_TABLE slots, else len(classes) (the rows no
    class holds)."""
    return next((c for c in range(n_esc, len(classes)) if classes[c] > ONE_PASS_MAX_TABLE), len(classes))


def one_pass_long(n_long: int, k: int, products: int, itemsize: int, total_bytes) -> bool:
    """Whether C = A @ B takes the one-pass path with ``n_long`` rows past its classes
    (one_pass_lift) on the global path: at most ONE_PASS_LONG_ROWS, their slabs of k columns
    (where the segments do not take them) at most ONE_PASS_LONG_BYTES, and the upper-bound buffer
    fits (upper_bound_fits). The other way in is one_pass_table."""
    return (n_long <= ONE_PASS_LONG_ROWS and n_long * k * (KEY_BYTES + itemsize) <= ONE_PASS_LONG_BYTES
            and upper_bound_fits(products, itemsize, total_bytes))


def upper_bound_fits(products: int, itemsize: int, total_bytes) -> bool:
    """Whether an upper-bound buffer of ``products`` entries (the one-pass path, the hybrid's
    numeric_esc rows) is below 2^31 entries and ONE_PASS_MEM_FRACTION of the device's memory."""
    return products <= INT32_MAX and products * (KEY_BYTES + itemsize) <= ONE_PASS_MEM_FRACTION * total_bytes


def _one_pass(s: _Symbolic, bal: bool, zeros, one: _Classes, classes: tuple, lift: int = -1):
    """Steps 2-4 for rows of short bounds (one_pass_table): no symbolic pass. Each row's table is
    sized from its bound min(nnz_RowCt, k) at full load (it cannot overflow); the numeric pass
    writes row i, sorted, at its products' offset csum[Ap[i]] of an upper-bound buffer with its
    count in row_nnz; the scan of the counts gives C's indptr, one host transfer its nnz, and
    compact_rows copies the rows to C. One host round trip after the analysis instead of two,
    and the symbolic pass's launch is saved. Each row's class (``one``, from the analysis's
    launch) is one of ``classes``: numeric_esc's product limits (ESC_CAPS, when spgemm's ``esc``),
    then the tables. Under the balanced rule (one class for every row) the rows run in row order
    in the class of the largest row. ``lift`` >= 0: the rows of classes lift .. (few, one_pass_long)
    take the global path, written in the same layout."""
    return _one_pass_finish(s, _one_pass_launch(s, bal, zeros, one, classes, lift), s.counts[2], s.info)


@dataclasses.dataclass(frozen=True)
class _Launched:
    """What _one_pass_launch queued, for _one_pass_finish: the upper-bound buffer and its parts'
    addresses, the rows on the global path, and {table size: rows}, {numeric_esc class: rows}."""
    buf: object
    Uj: int
    Ux: int
    n_glob: int
    tables: dict
    escs: dict


def _one_pass_launch(s: _Symbolic, bal: bool, zeros, one: _Classes, classes: tuple, lift: int = -1,
                     direct: tuple = None) -> _Launched:
    """_one_pass's launches up to the scan of C's row counts: no host synchronisation (a guessed
    call records them as a CUDA graph: _guessed). ``direct``: (guessed Cp (int64), Cj, Cx): the
    rows, all numeric_esc's, written straight to C at those offsets, no buffer and no scan
    (_direct_finish)."""
    ladder = s.num_ladder
    m, k = s.shape
    grouped = not (bal and lift < 0)
    if grouped:   # the GPU groups the rows while the host allocates the buffer
        order, counts = _group(one, len(classes), False, lift)
    sort_caps = classes[:s.n_esc]
    n_glob = 0
    row_nnz, Cp, Cp32 = s.counts   # zeroed: rows of no products are not launched
    at = _NULL
    if direct is None:
        buf, Uj, Ux = _upper_bound(s)
        _cuda.hold(buf)
    else:
        at, Uj, Ux = direct
        buf, row_nnz = None, _NULL
        if (s.rowct_max > (sort_caps or (0,))[-1] if not grouped else counts[len(sort_caps) + 1:].any()):
            raise _Misguess()   # kept for a product of numeric_esc's rows only: settings changed since
    if not grouped:
        if s.rowct_max <= (sort_caps or (0,))[-1]:
            c = next(i for i, cap in enumerate(sort_caps) if cap >= s.rowct_max)
            _esc_launch(s, c, _NULL, m, Uj, Ux, row_nnz, at)
            tables, escs = {}, {sort_caps[c]: m}
        else:
            size = next(t for t in ladder if t >= min(s.rowct_max, k))
            _numeric_launch(s, size, _NULL, m, _NULL, np.int64(0), Uj, Ux, row_nnz)
            tables, escs = {size: m}, {}
    else:
        starts = _starts(counts)
        fork = _Fork(counts[1:])
        escs = _esc_launches(s, fork, order, starts, counts, sort_caps, Uj, Ux, row_nnz, at)
        e = len(sort_caps)   # the tables are the classes after the sort classes
        _numeric_tables(s, fork, order, starts, counts, _NULL, np.int64(0), Uj, Ux, row_nnz, first=e)
        n_glob = int(counts[-1])
        if n_glob:
            _global_rows(s, fork.stream(len(classes)), _rows_at(order, starts[-2]), n_glob, _NULL, np.int64(0), Uj,
                         Ux, row_nnz)
        fork.join()
        tables = {size: int(c) for size, c in zip(ladder, counts[e + 1:-1]) if c}
    if direct is None:
        _scan("scan_rows", m, (row_nnz, np.int64(m), Cp, Cp32), zeros.take(_scan_words(m)))
    return _Launched(buf, Uj, Ux, n_glob, tables, escs)


def _one_pass_info(info: dict, s: _Symbolic, op: _Launched, nnz_c: int) -> None:
    info.update(one_pass=True, nnz_c=nnz_c, global_rows_symbolic=0, global_rows_numeric=op.n_glob,
                symbolic_overflowed=0, smem_limit=s.smem_limit, numeric_tables=op.tables, esc_rows=op.escs)


def _one_pass_finish(s: _Symbolic, op: _Launched, Cp32, info: dict):
    """_one_pass after its launches (``op``): C's nnz (and a guess's verdict) from the GPU, C
    allocated, the rows compacted into it, what was done in ``info``; ``Cp32`` is C's indptr (a
    replayed graph's own)."""
    cp = cupy_module()
    m, k = s.shape
    Cp = s.counts[1]
    if s.skip is None:
        nnz_c = int(_cuda.read_at(Cp.data.ptr + 8 * m, 1, np.int64)[0])
    else:   # guessed: words_differ's flag comes back with C's nnz
        nnz_c, refuted = (int(v) for v in _cuda.read_words((Cp.data.ptr + 8 * m, s.skip), np.int64))
        if refuted:
            raise _Misguess()
    Cj, Cx = cp.empty(nnz_c, dtype=cp.int32), cp.empty(nnz_c, dtype=s.dtype)
    if op.n_glob or COMPACT_ALL_BY_ENTRIES:
        _compact(s, Cp, op.Uj, op.Ux, Cj, Cx, _NULL, how="entries")
    else:
        _compact(s, Cp, op.Uj, op.Ux, Cj, Cx, _NULL, how="ranges" if nnz_c < COMPACT_RANGE_BELOW * m else "rows")
    _one_pass_info(info, s, op, nnz_c)
    # op.buf is freed in stream order once the caller drops op: the pool hands it out again only behind the copy
    return csr_from_parts(Cx, Cj, Cp32, (m, k), sorted_rows=s.sort, canonical=s.sort or None)


def _panels(s: _Symbolic, max_panel_nnz, max_panel_bytes):
    """(bounds, host indptr) of the panels C is cut into, the reason in ``info``; one transfer of C's indptr."""
    m = s.shape[0]
    free = _free_device_bytes()
    budget = int(free * PANEL_MEM_FRACTION) if max_panel_bytes is None else max_panel_bytes
    limit = INT32_MAX if max_panel_nnz is None else max_panel_nnz
    indptr = s.Cp.get() if s.Cp is not None else np.zeros(m + 1, dtype=np.int64)
    bounds = panel_bounds(indptr, limit, budget, s.dtype.itemsize)
    why = (f"{len(bounds) - 1} panel(s): each at most {limit:,} nonzeros"
           + (" (int32 indptr)" if max_panel_nnz is None else " (max_panel_nnz)")
           + f" and {budget:,} bytes"
           + (f" ({PANEL_MEM_FRACTION:.0%} of {free:,} free device bytes)" if max_panel_bytes is None
              else " (max_panel_bytes)"))
    s.info.update(panels=len(bounds) - 1, panel_why=why, panel_nnz_limit=limit, panel_byte_budget=budget,
                  panel_bounds=bounds.tolist() if len(bounds) <= 4097 else None)
    return bounds, indptr


def _finish_info(s: _Symbolic):
    s.info["host_ms"] = {ph: round(v, 4) for ph, v in s.host_ms.items()}


# Guessed analyses (module docstring). An operand pair's entry keeps its analysis words; its first
# guessed call records the launches up to the scan of C's row counts (_symbolic's and
# _one_pass_launch's, with the guess: no host synchronisation) as a CUDA graph, which later calls
# replay: their host path before the GPU starts is one graph launch, not the Python launch path.
# A graph keeps its call's scratch (the upper-bound buffer: products x 12 bytes in float64, the
# product offsets, the row classes, the global path's slabs) and the next call's C indptr.
#: Operand pairs whose analysis is kept, and of those, the most recent that keep a graph.
GUESS_CACHE_SIZE, GUESS_GRAPHS = 8, 2
#: A pair whose rows all take numeric_esc keeps C's offsets from a verified guessed call; its later
#: calls write C straight at them (no upper-bound buffer, scan or compaction), numeric_esc checking
#: each row's length against its kept one (_direct_finish). False: the one-pass graph only.
DIRECT_GUESSES = True
_GUESSES: dict = {}
_GUESS_LOCK = threading.Lock()


class _Misguess(Exception):
    """The analysis a call guessed differed from its own (words_differ's flag): rerun unguessed."""


class _Guess:
    """An operand pair's kept analysis: its words on the host and (from its first guessed call) the
    device; once recorded
    (``recorded``: the Replay, the recorded call's _Symbolic and _Launched, its ``info``) the graph
    of its launches; ``direct``: (C's offsets (int64), its indptr, nnz) once a call of numeric_esc's
    rows only has given them (_direct_finish). ``lock`` is held from a call's launches to its
    last read of the graph's scratch (two threads on one stream would overwrite it between them)."""

    def __init__(self, words):
        self.words, self.dev, self.recorded, self.direct = words, None, None, None
        self.lock = threading.Lock()


def _guess_key(A, B, sort, smem_limit, grouping, esc):
    """The key of C = A @ B's guessed analysis: device, stream, the operands' array addresses,
    shapes, nnz and dtypes, and the options that shape the launches; None for operands that are
    not cupyx CSR matrices with int32 indices (the call's checks then refuse or convert them)."""
    csp = cupyx_sparse()
    if csp is None or not (csp.isspmatrix_csr(A) and csp.isspmatrix_csr(B)):
        return None
    if any(M.indices.dtype != np.int32 or M.indptr.dtype != np.int32 for M in (A, B)):
        return None
    # with cupyx's sortedness flag (read, never checked: the global path's segments rely on it)
    parts = tuple((M.data.data.ptr, M.indices.data.ptr, M.indptr.data.ptr, M.shape, M.nnz, M.dtype.str,
                   getattr(M, "_has_sorted_indices", None)) for M in (A, B))
    return (_device_id(), cupy_module().cuda.get_current_stream().ptr, parts, bool(sort), smem_limit, grouping,
            bool(esc))


def _remember(key, words) -> None:
    """Keep a one-pass call's analysis ``words`` for _guess_key ``key`` (the oldest past GUESS_CACHE_SIZE dropped)."""
    entry = _Guess(words)
    with _GUESS_LOCK:
        _GUESSES.pop(key, None)
        _GUESSES[key] = entry
        while len(_GUESSES) > GUESS_CACHE_SIZE:
            _GUESSES.pop(next(iter(_GUESSES)))


def _guessed(A, B, g: _Guess, options: tuple, info: dict, drop_zeros: bool):
    """C = A @ B from a kept analysis ``g``: the launches recorded as a graph (a pair's first
    guessed call, and its first direct one) or replayed (later ones), or issued where the driver's
    graph API cannot be loaded; then the guess's verdict (_Misguess when refuted) and C: compacted
    from the upper-bound buffer (_one_pass_finish) or, direct, written in place (_direct_finish)."""
    t0 = time.perf_counter()
    with g.lock:
        C = _guessed_locked(A, B, g, options, info)
    info.update(panels=1, guessed=True, host_ms={"guessed": round((time.perf_counter() - t0) * 1e3, 4)})
    if drop_zeros:
        C.eliminate_zeros()
    return C


def _guessed_locked(A, B, g: _Guess, options: tuple, info: dict):
    sort, smem_limit, grouping, esc = options
    cp = cupy_module()
    stream = cp.cuda.get_current_stream().ptr
    direct = g.direct
    if g.dev is None:
        g.dev = cp.asarray(g.words)   # words_differ's; a recorded graph names its address

    def launch():
        out = () if direct is None else (cp.empty(direct[2], dtype=np.int32), cp.empty(direct[2], dtype=A.dtype))
        s = _symbolic(A, B, sort, smem_limit, grouping, info, "auto", esc, (g.words, g.dev))
        return s, _one_pass_launch(s, *s.one_pass, direct=None if direct is None else (direct[0], *out)), out

    # the graph's outputs, a new set each replay: C's indptr (one pass) or C's columns and values (direct)
    outputs = (lambda r: (r[0].counts[2],)) if direct is None else (lambda r: r[2])
    if g.recorded is not None:
        rep, s, op, known = g.recorded
        info.update(known)
        arrays = rep.run(stream)
    elif _graph.available():
        done = []
        rep = _graph.Replay(lambda: done.append(launch()) or done[0], outputs)
        s, op, _ = done[0]
        with _GUESS_LOCK:   # the graphs' scratch is large: only the most recent pairs keep one
            recorded = [e for e in _GUESSES.values() if e.recorded is not None]
            for e in recorded[:max(0, len(recorded) - GUESS_GRAPHS + 1)]:
                e.recorded = None
            g.recorded = (rep, s, op, dict(info))
        arrays = rep.run(stream)
    else:
        done = launch()
        s, op, arrays = done[0], done[1], outputs(done)
    info["direct"] = direct is not None
    if direct is not None:
        return _direct_finish(s, op, arrays, direct, info)
    C = _one_pass_finish(s, op, arrays[0], info)
    if DIRECT_GUESSES and not op.tables and not op.n_glob:   # numeric_esc's rows only: C's offsets kept
        g.direct = (s.counts[1].copy(), C.indptr.copy(), C.nnz)
        g.recorded = None   # the next call records the direct graph (and frees this one's buffer)
    return C


def _direct_finish(s: _Symbolic, op: _Launched, arrays, direct: tuple, info: dict):
    """A direct guessed call after its launches: C's indptr copied from the kept one, the verdict
    from the GPU (words_differ's, or a row of another length than kept: _Misguess), C."""
    Cj, Cx = arrays
    indptr = direct[1].copy()
    if int(_cuda.read_at(s.skip, 1, np.uint64)[0]):
        raise _Misguess()
    _one_pass_info(info, s, op, direct[2])
    return csr_from_parts(Cx, Cj, indptr, s.shape, sorted_rows=s.sort, canonical=s.sort or None)


def forget_guesses() -> None:
    """Drop every kept analysis: each operand pair's next call waits for its own (benchmarks time
    first calls so)."""
    with _GUESS_LOCK:
        _GUESSES.clear()


def spgemm(A, B, *, sort: bool = True, smem_limit: int | None = None, drop_zeros: bool = False,
           grouping: str = "auto", out: str = "device", max_panel_nnz: int | None = None,
           max_panel_bytes: int | None = None, passes: str = "auto", esc: bool = True,
           guess: bool = True, info: dict | None = None):
    """C = A @ B with the RBSparse hash kernels (see the module docstring for the output forms).

    sort: write each row sorted by column (SciPy's canonical order); False skips the sort.
    smem_limit: shared-memory bytes per block the tables may use (default: the device's opt-in max).
    drop_zeros: remove entries that cancelled to exactly zero (SciPy's storage).
    grouping: 'auto' (the balanced rule decides), 'balanced' (one table size) or 'grouped'.
    out: 'device' (one cupyx CSR; OverflowError / MemoryError naming the alternatives when C does
        not fit int32 or device memory) or 'host' (a SciPy CSR assembled panel by panel).
    max_panel_nnz, max_panel_bytes: with out='host', cap each panel below the defaults (2^31 - 1
        nonzeros; PANEL_MEM_FRACTION of free device memory), e.g. to force many panels in tests.
    passes: "auto" (the one-pass path of _one_pass where one_pass_table allows, out='device'
        only) or "two" (always the symbolic pass, then the numeric pass).
    esc: in the one-pass path, rows of at most ESC_CAPS[-1] products take the sort-based
        numeric_esc (deterministic sums) where B's columns allow (esc_max_columns); False keeps
        them in hash tables.
    guess: a one-pass call of operands met before goes on from their last analysis, checked on
        the GPU (module docstring, "Guessed analyses"); False waits for this call's own and keeps
        none.
    info: a dict to fill with what was done (groups, global rows, nnz, products, panels, one_pass,
        guessed, direct).
    """
    if passes not in ("auto", "two"):
        raise ValueError(f"passes: expected 'auto' or 'two', got {passes!r}")
    for name, flag in (("esc", esc), ("guess", guess)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name}: expected True or False, got {flag!r}")
    if out not in ("device", "host"):
        raise ValueError(f"out: expected 'device' or 'host', got {out!r} (spgemm_panels streams panels)")
    max_panel_nnz = _positive_limit("max_panel_nnz", max_panel_nnz, INT32_MAX)
    max_panel_bytes = _positive_limit("max_panel_bytes", max_panel_bytes)
    if out == "device" and (max_panel_nnz is not None or max_panel_bytes is not None):
        raise ValueError("max_panel_nnz / max_panel_bytes: only with out='host' or spgemm_panels "
                         "(out='device' returns C in one piece)")
    info = info if info is not None else {}
    info["guessed"] = info["direct"] = False
    key = _guess_key(A, B, sort, smem_limit, grouping, esc) if guess and out == "device" and passes == "auto" else None
    kept = _GUESSES.get(key) if key is not None else None
    if kept is not None:
        try:
            return _guessed(A, B, kept, (sort, smem_limit, grouping, esc), info, drop_zeros)
        except _Misguess:   # the operands' analysis changed: forget it, run the call unguessed
            with _GUESS_LOCK:
                _GUESSES.pop(key, None)
    s = _symbolic(A, B, sort, smem_limit, grouping, info, passes if out == "device" else "two", esc)
    m, k = s.shape
    if s.one_pass is not None:
        t0 = time.perf_counter()
        C = _one_pass(s, *s.one_pass)
        s.host_ms["one_pass"] = (time.perf_counter() - t0) * 1e3
        _finish_info(s)
        info.update(panels=1)
        if drop_zeros:
            C.eliminate_zeros()
        if key is not None:
            _remember(key, s.words)
        return C
    if out == "host":
        return _to_host(s, max_panel_nnz, max_panel_bytes, drop_zeros)
    if s.empty:
        csp = cupyx_sparse()
        return csp.csr_matrix((m, k), dtype=s.dtype)
    need = int(panel_bytes(s.nnz_c, m + 1, s.dtype.itemsize))
    # the driver's free memory costs ~5 us a query: asked only when C could come near it
    free = _free_device_bytes() if need > SMALL_OUTPUT_FRACTION * _device_total_bytes() else None
    alternatives = ("spgemm(A, B, out='host') assembles a SciPy CSR with int64 indptr in host memory; "
                    "spgemm_panels(A, B) yields row panels one at a time")
    if s.nnz_c > INT32_MAX:
        raise OverflowError(f"spgemm: C would have {s.nnz_c:,} nonzeros, more than 2^31 - 1, which a "
                            f"cupyx CSR with int32 indptr cannot hold; {alternatives}")
    if free is not None and need > OUTPUT_MEM_FRACTION * free:
        raise MemoryError(f"spgemm: C ({s.nnz_c:,} nonzeros) needs {need:,} bytes of device memory, more "
                          f"than {OUTPUT_MEM_FRACTION:.0%} of the {free:,} bytes free; {alternatives}")
    info.update(panels=1)
    C = _numeric(s, 0, m, 0, s.nnz_c)
    _finish_info(s)
    if drop_zeros:
        C.eliminate_zeros()
    return C


def spgemm_panels(A, B, *, sort: bool = True, smem_limit: int | None = None, drop_zeros: bool = False,
                  grouping: str = "auto", max_panel_nnz: int | None = None,
                  max_panel_bytes: int | None = None, info: dict | None = None):
    """C = A @ B as contiguous row panels: an iterator of (row_start, row_stop, cupyx CSR panel).

    The analysis and symbolic passes run now (errors raise here, and ``info`` already holds
    'panels' and 'panel_bounds'); each panel's numeric pass runs when the iterator reaches it.
    A panel is C[row_start:row_stop] as a (row_stop - row_start) x k cupyx CSR with int32 indptr.
    Panels hold at most ``max_panel_nnz`` (default 2^31 - 1) nonzeros and ``max_panel_bytes``
    (default PANEL_MEM_FRACTION of free device memory). Drop each panel before taking the next
    to keep one on the device at a time. Options as in :func:`spgemm`.
    """
    max_panel_nnz = _positive_limit("max_panel_nnz", max_panel_nnz, INT32_MAX)
    max_panel_bytes = _positive_limit("max_panel_bytes", max_panel_bytes)
    info = info if info is not None else {}
    s = _symbolic(A, B, sort, smem_limit, grouping, info)
    bounds, indptr = _panels(s, max_panel_nnz, max_panel_bytes)
    return _iter_panels(s, bounds, indptr, drop_zeros)


def _iter_panels(s: _Symbolic, bounds, indptr, drop_zeros):
    csp = cupyx_sparse()
    k = s.shape[1]
    for r0, r1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if s.empty:
            P = csp.csr_matrix((r1 - r0, k), dtype=s.dtype)
        else:
            P = _numeric(s, r0, r1, int(indptr[r0]), int(indptr[r1]))
            _finish_info(s)
            if drop_zeros:
                P.eliminate_zeros()
        yield r0, r1, P
        del P


def _to_host(s: _Symbolic, max_panel_nnz, max_panel_bytes, drop_zeros):
    """out='host': a SciPy CSR (int64 indices past 2^31 - 1 nonzeros) filled panel by panel."""
    import scipy.sparse as sp
    m, k = s.shape
    bounds, indptr = _panels(s, max_panel_nnz, max_panel_bytes)
    idx_dtype = np.int64 if s.nnz_c > INT32_MAX else np.int32
    isz = np.dtype(idx_dtype).itemsize
    need = s.nnz_c * (isz + s.dtype.itemsize) + (m + 1) * isz
    avail = host_available_bytes()
    if need > HOST_MEM_FRACTION * avail:
        raise MemoryError(f"spgemm(out='host'): C has {s.nnz_c:,} nonzeros, {need:,} bytes as a SciPy CSR "
                          f"({np.dtype(idx_dtype)} indices, {s.dtype} values), more than "
                          f"{HOST_MEM_FRACTION:.0%} of the {avail:,} bytes of host memory available; "
                          f"spgemm_panels(A, B) streams the row panels instead")
    data = np.empty(s.nnz_c, dtype=s.dtype)
    indices = np.empty(s.nnz_c, dtype=idx_dtype)
    for r0, r1, P in _iter_panels(s, bounds, indptr, drop_zeros=False):
        c0, c1 = int(indptr[r0]), int(indptr[r1])
        if c1 > c0:
            P.data.get(out=data[c0:c1])
            indices[c0:c1] = P.indices.get()
        del P
    C = sp.csr_matrix((data, indices, indptr.astype(idx_dtype, copy=False)), shape=(m, k), copy=False)
    if s.sort:
        C.has_canonical_format = True
    if drop_zeros:
        C.eliminate_zeros()
    return C


# ----------------------------------------------------------------------------- SpTRANS
def transpose_sort(A):
    """CSR of A.T by one radix sort of the (column, row) keys: rows come out sorted in each column.

    A plain sort-based transpose, kept as a baseline for the segmented-merge one of SEEDS section 3
    (:func:`matplan.kernels.sptrans.transpose`).
    """
    cp = cupy_module()
    csp = cupyx_sparse()
    if not csp.isspmatrix_csr(A):
        raise TypeError(f"A: expected a cupyx.scipy.sparse.csr_matrix, got {type(A).__name__}")
    m, n = A.shape
    rows = cp.searchsorted(A.indptr[1:], cp.arange(A.indices.size, dtype=A.indptr.dtype), side="right")
    order = cp.argsort(A.indices.astype(cp.int64) * max(m, 1) + rows)
    counts = cp.bincount(A.indices, minlength=n)
    indptr = cp.zeros(n + 1, dtype=cp.int32)
    cp.cumsum(counts, out=indptr[1:])
    return csp.csr_matrix((A.data[order], rows[order].astype(cp.int32), indptr), shape=(n, m))


# ----------------------------------------------------------------------------- the kernel
#: Effective bytes the hash passes move per product and per nonzero of C, by dtype, at the copy
#: bandwidth: least squares (relative error) of whole calls less HASH_FIXED_S over the H100 tuning
#: data (benchmarks/results/tuning-h100-2026-11-24-training.jsonl, 17 matrices, nnz(C) exact).
#: Per nonzero of C costs 4-5x per product: a distinct key fills a slot, is counted, compacted,
#: sorted and written; a repeated key is one atomic add. The fit is within 0.6-1.4x on the corpus
#: but under-predicts R-MAT medium (0.3x) and ice40 (0.5x): large rows with many distinct columns
#: (big tables, few resident blocks, the global path) cost more than a linear model says.
#: Global rows that take dense slabs are charged the slabs' bytes on top; by column segments in
#: shared memory they are not (the slab term had R-MAT 16 / 17 at 26 / 89 ms predicted against
#: 13 / 37 measured at 697e0e7; without it 15.6 / 44.0).
HASH_BYTES = {"float32": (41.0, 149.0), "float64": (42.0, 197.0)}
#: The fixed cost of a call outside the pass kernels (product scan, classification, allocation,
#: host round trips), by the path spgemm() takes (hash_path): whole calls on the smallest corpus
#: matrices, H100 2026-11-24 at 70d9d05 (benchmarks/results/spgemm-onepass-study-h100-2026-11-24-70d9d05.log):
#: one pass balanced (one launch, two host transfers) 0.27-0.39 ms (banded-, poisson2d-small),
#: one pass grouped (classification, a launch per table size) 0.60-0.93 ms (poisson3d-, uniform-
#: small), two passes (symbolic, scan, numeric: four host transfers) 0.82-1.19 ms (skewed-,
#: rmat-small). One constant of 0.6 ms for every path predicted skewed-small's hash call
#: (0.94-0.97 ms measured) below cuSPARSE's (0.49-0.52) and poisson2d-small's (0.25) above it.
#: The hybrid (two passes for a few long rows, the rest sorted by numeric_esc, no row past the
#: shared tables) is charged like one pass grouped: metis_copter2 took 0.62-0.63 ms a whole call
#: at 46988e6 (tune-h100-spgemm-esc-2026-11-24-46988e6.log); at the two passes' 0.85 ms the
#: leave-family-out report sent metis to cuSPARSE (2.07x the best).
#: Refitted at acb8da6 (struct-packed launches, the lift guard; tuning-h100-2026-11-24-training-launch.jsonl),
#: whole call less the bandwidth term on the smallest problems of each path: one pass balanced
#: 0.19-0.26 ms (poisson2d-, block_dense-, banded-small), grouped 0.28-0.42 (poisson3d-, uniform-
#: small), the hybrid 0.57-0.63 (metis) and 0.67-0.87 (skewed-small), two passes 0.53-0.84
#: (rmat-small) and 0.81-0.87 (skewed-medium). They are host time: another H100 host ran the same
#: calls up to 1.5x slower.
HASH_FIXED_S = {"one pass, balanced": 0.22e-3, "one pass, grouped": 0.33e-3, "hybrid": 0.65e-3,
                "two passes": 0.75e-3}
#: The planner takes a product for the hybrid when at most this fraction of its rows has
#: alpha = nnz_RowCt / pi >= 256 (the RBSparse groups past numeric_esc's 512 products).
HYBRID_LONG_ROWS = 0.01
LAUNCH_S = 6e-6


def _compression_text(f) -> str:
    return (f"products / {f.compression:.2f}, the sampled compression" if f.compression > 0
            else "products / pi, none sampled")


def describe_groups(f, smem_bytes: int) -> tuple:
    """(balanced, text, predicted global rows) from the planner's features, for cost() and why."""
    itemsize = np.dtype(f.dtype).itemsize
    ladder = table_ladder(smem_bytes, KEY_BYTES + itemsize)
    balanced = spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
    alpha_max = f.rowct_max / spgemm_model.RBS_COMPRESSION
    n_global = 0
    if min(alpha_max, f.k) > ladder[-1]:
        n_global = max(1, f.rbs_groups[-1] if f.rbs_groups else 1) if alpha_max > 4 * ladder[-1] else 1
    groups = ", ".join(f"{c:,} rows alpha in [{lo},{hi})" for lo, hi, c in
                       zip(spgemm_model.RBS_GROUP_BOUNDS, spgemm_model.RBS_GROUP_BOUNDS[1:] + ("inf",),
                           f.rbs_groups) if c)
    mode = (f"balanced (var/mean of nnz_RowCt {f.rowct_var_over_mean:.2f} <= "
            f"{spgemm_model.RBS_BALANCED_RATIO}): one table size" if balanced else
            f"grouped (var/mean {f.rowct_var_over_mean:.2f} > {spgemm_model.RBS_BALANCED_RATIO}): {groups}")
    glob = (f"largest row alpha = {alpha_max:,.0f} exceeds the {ladder[-1]}-slot shared table, so about "
            f"{n_global} row(s) go to the global-memory path" if n_global else
            f"every row fits a shared table (largest {ladder[-1]} slots, alpha max {alpha_max:,.0f})")
    return balanced, f"{mode}; {glob}", n_global


def hash_path(f, smem_bytes: int) -> str:
    """The path spgemm() takes for the planner's features (a key of HASH_FIXED_S): one pass where
    one_pass_table allows (its device-memory bound is left out: it binds only past ~300M products
    on an 80 GB GPU, where the fixed cost no longer matters, and the planner's features must not
    depend on the memory of the machine that computes them), balanced or grouped by the RBSparse
    rule; grouped also when the long rows (alpha past 256: about nnz_RowCt > 804, the features'
    nearest bound to the one-pass classes' 512) are few enough for one_pass_long; else the
    hybrid when few rows are long (HYBRID_LONG_ROWS) and none passes the shared tables; else two
    passes."""
    itemsize = np.dtype(f.dtype).itemsize
    top = table_ladder(smem_bytes, KEY_BYTES + itemsize)[-1]
    caps = esc_caps(f.k)
    if one_pass_table(f.rowct_max, f.k, top, f.products, itemsize, total_bytes=math.inf,
                      esc_cap=(caps or (0,))[-1]):
        return "one pass, balanced" if spgemm_model.rbsparse_balanced(f.rowct_var_over_mean) else "one pass, grouped"
    long_rows = sum(f.rbs_groups[4:]) if len(f.rbs_groups) > 4 else f.m
    if one_pass_long(long_rows, f.k, f.products, itemsize, total_bytes=math.inf):
        return "one pass, grouped"
    if caps and long_rows <= HYBRID_LONG_ROWS * f.m and f.rowct_max / spgemm_model.RBS_COMPRESSION <= top:
        return "hybrid"
    return "two passes"


def predict_panels(est_nnz: float, m: int, itemsize: int, free_bytes: int | None) -> tuple:
    """(panels, why) for a C of about ``est_nnz`` nonzeros and ``m`` rows: (1, '') when it fits one
    int32 CSR in OUTPUT_MEM_FRACTION of ``free_bytes`` (None: device memory not known, int32 only);
    else about how many panels spgemm_panels / out='host' cut it into, and why."""
    nbytes = float(panel_bytes(est_nnz, m + 1, itemsize))
    reasons = []
    if est_nnz > INT32_MAX:
        reasons.append("more than 2^31 - 1 nonzeros (a cupyx CSR has int32 indptr)")
    if free_bytes is not None and nbytes > OUTPUT_MEM_FRACTION * free_bytes:
        reasons.append(f"more than {OUTPUT_MEM_FRACTION:.0%} of the {free_bytes / 1e9:.1f} GB of free "
                       "device memory")
    if not reasons:
        return 1, ""
    n = math.ceil(est_nnz / INT32_MAX)
    if free_bytes:
        n = max(n, math.ceil(nbytes / (PANEL_MEM_FRACTION * free_bytes)))
    return n, (f"C predicted at ~{est_nnz:,.0f} nonzeros, {nbytes / 1e9:.1f} GB: "
               f"{' and '.join(reasons)} -> about {n} row panels (each < 2^31 nonzeros"
               + (f", <= {PANEL_MEM_FRACTION:.0%} of free memory" if free_bytes else "")
               + "); spgemm() refuses one piece: use out='host' or spgemm_panels()")


class SparseProduct(KeepsA):
    """A GPU SpGEMM kernel of ours: prepare keeps A (KeepsA), run computes A @ B by
    :meth:`product` (no ``out``: C's sparsity is not known in advance)."""

    def product(self, A, B, params):
        raise NotImplementedError

    def run(self, prepared, B, out=None):
        if out is not None:
            raise ValueError("out: not supported for spgemm (the output's sparsity is not known in advance)")
        return self.product(prepared.arrays["A"], B, prepared.params)


class HashSpGEMM(SparseProduct):
    name = "spgemm.hash"
    ops = ("spgemm",)
    backend = "gpu"
    deterministic = False   # atomicAdd order varies run to run
    reads_a_at_run = True   # prepare keeps A; spgemm() analyses A and B anew on every call

    def candidates(self, features, device):
        yield {"sort": True}

    def cost(self, f, params, device):
        itemsize = np.dtype(f.dtype).itemsize
        balanced, why, n_global = describe_groups(f, device.smem_per_block)
        path = hash_path(f, device.smem_per_block)
        est_c = traffic.spgemm_nnz_c(f)
        nbytes, per_product, per_output = traffic.spgemm_fitted_bytes(f, HASH_BYTES)
        t = nbytes / device.mem_bandwidth
        seg = global_seg_shape(f.k, itemsize, device.smem_per_block, n_global, device.sms) if n_global else None
        if n_global and seg is None:   # dense slabs of B.shape[1] columns, written and scanned
            t += n_global * f.k * (KEY_BYTES + itemsize) * 2 / device.mem_bandwidth
            why += f" (dense slabs of {f.k:,} columns in global memory)"
        elif n_global:   # by segments in shared memory: the products' traffic above covers them
            why += f" (by {seg[1]} column segment(s) of {seg[0]:,} columns in shared memory)"
        launches = 2 * (1 if balanced else sum(1 for c in f.rbs_groups if c)) + (2 if n_global else 0)
        t += HASH_FIXED_S[path] + launches * LAUNCH_S
        free = _free_device_bytes() if device.source == "measured" and cupy_module() is not None else None
        _, panels = predict_panels(est_c, f.m, itemsize, free)
        caps = esc_caps(f.k)
        sort = ("" if not caps else
                f"; every row sorted in registers (numeric_esc: at most {caps[-1]} products a row)"
                if f.rowct_max <= caps[-1] else
                f"; rows of at most {caps[-1]} products sorted in registers (numeric_esc), the others hashed")
        return Cost(0.0, t, f"RBSparse hash, {path} ({HASH_FIXED_S[path] * 1e3:.2f} ms fixed), {why}{sort}; "
                            f"~{est_c:,.0f} nonzeros of C expected ({_compression_text(f)}); "
                            f"{per_product:.0f} B per product + {per_output:.0f} B per nonzero of C "
                            f"at the copy bandwidth" + (f"; {panels}" if panels else ""))

    def product(self, A, B, params):
        return spgemm(A, B, sort=params.get("sort", True))


register(HashSpGEMM())

__all__ = ["spgemm", "check_csr", "spgemm_panels", "transpose_sort", "SparseProduct", "HashSpGEMM", "table_ladder", "launch_shape",
           "table_index", "symbolic_index", "one_pass_index", "balance", "groups_of", "describe_groups", "hash_path", "panel_bounds",
           "panel_bytes", "predict_panels", "int32_operand", "host_available_bytes"]
