"""The global-memory path of rows too long for any shared table (and of the few rows of big
tables lifted there): the symbolic pass by a bitmap of B's columns a row (symbolic_global), the
numeric pass by column segments in shared memory (numeric_global_seg) or by dense slabs of
B.shape[1] columns in global memory (numeric_global_acc, numeric_global_out), in batches of rows,
several blocks a row (hash_global.cu)."""
from __future__ import annotations

import math

import numpy as np

from ...core.xp import cupy_module
from .. import _cuda
import matplan.kernels.spgemm.analysis as analysis
import matplan.kernels.spgemm.rules as rules
import matplan.kernels.spgemm.runtime as runtime

#: Persistent blocks of the global path per SM, and the fraction of free memory their slabs may use.
GLOBAL_BLOCKS_PER_SM = 2
GLOBAL_BLOCK_THREADS = 512
GLOBAL_MEM_FRACTION = 0.25
#: Batches of many global rows take as many slabs as this fraction of the L2 cache holds: R-MAT's
#: 264 slabs of 768 KB (207 MB against a 50 MB L2) sent the dense accumulator's atomics to DRAM;
#: 32-row batches took numeric_global_acc 18.3 -> 7.2 ms at scale 16, 88.2 -> 38.7 at scale 17
#: (H100).
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
#: The numeric global path by column segments (numeric_global_seg, hash_global.cu): a block of
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
#: the walk). H100: numeric_global_seg R-MAT 16
#: 4791 -> 4214 us, R-MAT 17 26.5 -> 20.0 ms, skewed 253 -> 246.
GLOBAL_SEG_B_ROWS = True
#: symbolic_global marks a row's columns in a bitmap of B's columns in shared memory where it fits
#: (False: in global memory, one per row, L2 atomics; benchmarks compare with --set).
SYMBOLIC_GLOBAL_SHARED = True
#: Rows of symbolic tables of at least SYMBOLIC_BITMAP_RATIO slots a 32-bit word of a bitmap of
#: B's columns (k / 32 words) count their columns in that bitmap in shared memory instead
#: (symbolic_bitmap_from; symbolic_global): a read and at most one atomicOr a product, no probe
#: chains, no overflow, k / 32 words to clear and count a row. inf: the tables only. H100,
#: symbolic pass at ratio 0.25 / 1 / inf: R-MAT 16 2861 / 2944 / 3553 us, R-MAT 17 8.1 / 8.4 /
#: 10.4 ms, block-dense 1246 / 1228 / 1304, ice40 1759 / 1808 / 1806. Without the read first (an
#: atomic a product), block-dense's 34,596 products a row over 225 words lost: 1668 against 1299 us.
SYMBOLIC_BITMAP_RATIO = 0.25


def _global_target_blocks() -> int:
    """Blocks the global path aims to keep resident: GLOBAL_BLOCKS_PER_SM on every SM."""
    return runtime._device_limits(runtime._device_id())[1] * GLOBAL_BLOCKS_PER_SM


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
    most = max(32, (8 * (smem_limit - rules.STATIC_SMEM)) // (8 * itemsize + 1) // 32 * 32)
    nseg = -(-k // most)
    return -(-(-(-k // nseg)) // 32) * 32


def global_seg_shape(k: int, itemsize: int, smem_limit: int, n_glob: int, sms: int):
    """(columns a segment, segments a row) of the numeric global path by segments for n_glob rows
    of k columns, or None where the slabs take them: more than GLOBAL_SEG_MAX_SEGMENTS segments a
    row, fewer blocks than GLOBAL_SEG_MIN_BLOCKS_PER_SM a multiprocessor, or past int32 blocks."""
    cols = global_seg_cols(k, itemsize, smem_limit)
    nseg = -(-k // cols)
    blocks = n_glob * nseg
    if nseg > GLOBAL_SEG_MAX_SEGMENTS or blocks > rules.INT32_MAX or blocks < GLOBAL_SEG_MIN_BLOCKS_PER_SM * sms:
        return None
    return cols, nseg


def _global_rows(s: analysis._Symbolic, fork_stream, rows, n_glob: int, Cp, base, Cj, Cx, row_nnz) -> None:
    """The numeric global path of ``rows`` (n_glob of them) on ``fork_stream``: by column segments
    where global_seg_shape takes them, else by slabs; Cp null (_NULL): the one-pass layout."""
    if not _global_segmented(s, fork_stream, rows, n_glob, Cp, base, Cj, Cx, row_nnz):
        with fork_stream:
            _global_slabs(s, rows, n_glob, Cp, base, Cj, Cx, row_nnz)


def _global_segmented(s: analysis._Symbolic, fork_stream, rows, n_glob: int, Cp, base, Cj, Cx, row_nnz) -> bool:
    """The numeric global path by column segments for ``rows`` (n_glob of them) where
    global_seg_shape takes them; False (nothing launched) otherwise."""
    A, B, k, itemsize = s.A, s.B, s.shape[1], s.dtype.itemsize
    shape = global_seg_shape(k, itemsize, s.smem_limit, n_glob, runtime._device_limits(runtime._device_id())[1])
    if shape is None:
        return False
    cols, nseg = shape
    b_sorted = GLOBAL_SEG_B_ROWS and nseg > 1 and bool(B.has_sorted_indices)   # may check B (a host transfer)
    with fork_stream:   # the look-back's status words, then its ticket counter, zeroed
        status = _cuda.zeroed(n_glob * nseg + 1, np.uint64)
        _cuda.hold(status)
        runtime._launch(f"numeric_global_seg<{_cuda.ctype(s.dtype)}>", n_glob * nseg, GLOBAL_SEG_THREADS,
                        (A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, s.csum, rows, np.int32(n_glob),
                         np.int32(nseg), np.int32(cols), status, Cp, base, Cj, Cx, np.int32(b_sorted), row_nnz,
                         s.skip or runtime._NULL),
                        smem=cols * itemsize + cols // 8)
    s.info.update(global_segments=nseg, global_segment_walk="B rows" if b_sorted else "products")
    return True


def _symbolic_global(s: analysis._Symbolic, rows, n: int, row_nnz, peak: int) -> None:
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
        runtime._launch("symbolic_global", (min(G, n - b0), parts), GLOBAL_BLOCK_THREADS,
                        (A.indptr, A.indices, B.indptr, B.indices, s.csum, rows, np.int32(b0), bitmaps,
                         np.int32(words), np.int32(in_shared), np.int64(peak), row_nnz),
                        smem=4 * words if in_shared else 0)


def _symbolic_bitmap_shared(k: int, smem_limit: int) -> bool:
    """Whether symbolic_global keeps its bitmap of B's k columns in shared memory: allowed
    (SYMBOLIC_GLOBAL_SHARED) and its k / 32 words fit beside STATIC_SMEM."""
    return SYMBOLIC_GLOBAL_SHARED and 4 * -(-k // 32) + rules.STATIC_SMEM <= smem_limit


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
    if rows * slab_bytes > runtime.SMALL_OUTPUT_FRACTION * runtime._device_total_bytes():
        free = runtime._free_device_bytes()
        fit = int(free * GLOBAL_MEM_FRACTION) // slab_bytes
        if fit < 1:
            raise MemoryError(f"spgemm: the global-memory path ({what}) needs {slab_bytes:,} bytes per "
                              f"row slab (B has that many columns), more than {GLOBAL_MEM_FRACTION:.0%} "
                              f"of the {free:,} bytes free")
        rows = min(rows, fit)
    if nrows > target:
        l2 = _cuda.device_attribute("L2CacheSize", runtime._device_id())
        rows = min(rows, max(int(l2 * GLOBAL_L2_FRACTION) // slab_bytes, -(-target // GLOBAL_MAX_PARTS)))
    return max(1, rows)


def _global_slabs(s: analysis._Symbolic, rows, n_glob: int, Cp, base, Cj, Cx, row_nnz) -> None:
    """The global-memory path of ``n_glob`` rows by dense slabs (numeric_global_acc, then
    global_segment_counts and numeric_global_out over column segments), in batches of as many rows
    as there are slabs; Cp null (_NULL): the one-pass layout, each row's count to row_nnz."""
    cp = cupy_module()
    A, B, k, dtype = s.A, s.B, s.shape[1], s.dtype
    ct = _cuda.ctype(dtype)
    G = _global_blocks(n_glob, k * (rules.KEY_BYTES + dtype.itemsize), "numeric")
    parts = _global_parts(s.rowct_max, min(G, n_glob))
    segs, seg_cols = _global_segments(k, min(G, n_glob))
    marks = _cuda.zeroed(G * k, np.int32)
    acc = _cuda.zeroed(G * k, dtype)
    seg_counts = cp.empty(G * segs, dtype=cp.int32)
    _cuda.hold(marks, acc, seg_counts)   # a recorded call's graph (_guessed) uses them on every replay
    for b0 in range(0, n_glob, G):    # batches of G rows, a slab each
        nb = min(G, n_glob - b0)
        runtime._launch(f"numeric_global_acc<{ct}>", (nb, parts), GLOBAL_BLOCK_THREADS,
                        (A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, s.csum, rows,
                         np.int32(b0), marks, acc, np.int64(k), s.skip or runtime._NULL))
        if segs > 1:   # one segment a row starts at the row's start: nothing to count
            runtime._launch("global_segment_counts", (nb, segs), GLOBAL_BLOCK_THREADS,
                            (rows, np.int32(b0), marks, np.int64(k), np.int64(seg_cols), seg_counts))
        runtime._launch(f"numeric_global_out<{ct}>", (nb, segs), GLOBAL_BLOCK_THREADS,
                        (rows, np.int32(b0), marks, acc, np.int64(k), np.int64(seg_cols), seg_counts,
                         Cp, base, Cj, Cx, A.indptr, s.csum, row_nnz, s.skip or runtime._NULL))

