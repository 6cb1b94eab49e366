"""Launches of the numeric kernels: numeric_shared (hash tables in shared memory), numeric_esc
(short rows sorted in registers), the hybrid's numeric_esc rows before the symbolic pass, the
compaction of the one-pass layout into C, and the numeric pass of a row range (a panel or all of
C) after the two passes."""
from __future__ import annotations

import time

import numpy as np

from ...core.xp import cupy_module
from .. import _cuda
import matplan.kernels.spgemm.analysis as analysis
import matplan.kernels.spgemm.global_rows as global_rows
import matplan.kernels.spgemm.operands as operands
import matplan.kernels.spgemm.rules as rules
import matplan.kernels.spgemm.runtime as runtime

#: Rows of numeric_esc whose columns span at most its W * P slots (banded rows) are summed in a
#: dense window of those slots and written out by a bitmap, no sort (False: every row sorted).
ESC_WINDOW = True
#: compact_rows: lanes a row on the one-pass path (fewer for the hybrid's short rows); compact_ranges:
#: rows a block of 256 threads (COMPACT_ROWS), taken when C's rows hold fewer than
#: one_pass.COMPACT_RANGE_BELOW entries on average.
COMPACT_LANES = 32
COMPACT_ROWS = 256
#: compact_entries' entries a block (256 threads of hash_compact.cu's COMPACT_ITEMS).
COMPACT_ENTRIES_BLOCK = 256 * 8


def _numeric(s: analysis._Symbolic, r0: int, r1: int, c0: int, c1: int):
    """Step 4 for rows [r0, r1) of C, whose nonzeros are [c0, c1) of the whole: a cupyx CSR panel
    of (r1 - r0) x k with int32 indptr starting at 0. Rows grouped by exact nnz, one launch per
    table size on its own stream; rows past every shared table use the global-memory path."""
    cp = cupy_module()
    t0 = time.perf_counter()
    k, dtype, ladder = s.shape[1], s.dtype, s.num_ladder
    nnz = c1 - c0
    if nnz > rules.INT32_MAX:  # panel_bounds keeps panels below this; a guard, not a path
        raise OverflowError(f"spgemm: panel rows [{r0}, {r1}) have {nnz:,} nonzeros, past 2^31 - 1")
    if (r0, r1) == (0, s.shape[0]):
        order, counts = s.whole
    else:
        order, counts_d = analysis.groups_of(s.num_idx[r0:r1], len(ladder))
        counts = _cuda.read_back(counts_d)
        order += np.int32(r0)                   # panel-local positions -> global row ids
    Cj = cp.empty(nnz, dtype=cp.int32)
    Cx = cp.empty(nnz, dtype=dtype)
    starts = analysis._starts(counts)
    base = np.int64(c0)
    fork = runtime._Fork(counts[1:])   # the shared tables, then the global path
    _numeric_tables(s, fork, order, starts, counts, s.Cp, base, Cj, Cx, runtime._NULL)
    n_glob = int(counts[-1])
    rows = order[starts[-2]:starts[-1]] if n_glob else None
    if n_glob:
        global_rows._global_rows(s, fork.stream(len(ladder)), rows, n_glob, s.Cp, base, Cj, Cx, runtime._NULL)
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
    C = operands.csr_from_parts(Cx, Cj, indptr, (r1 - r0, k), sorted_rows=s.sort, canonical=s.sort or None)
    tables = s.info["numeric_tables"]
    for size, c in zip(ladder, counts[1:-1]):
        if c:
            tables[size] = tables.get(size, 0) + int(c)
    s.info["global_rows_numeric"] += n_glob
    s.host_ms["numeric_launch"] = s.host_ms.get("numeric_launch", 0.0) + (time.perf_counter() - t0) * 1e3
    return C


def _numeric_tables(s: analysis._Symbolic, fork, order, starts, counts, Cp, base, Cj, Cx, row_nnz,
                    first: int = 0):
    """numeric_shared for every shared table with rows (counts, starts: host, per class index + 1;
    order: the rows grouped; table t is class first + t and launches on that fork stream); Cp null
    (_NULL): the one-pass layout."""
    for t, size in enumerate(s.num_ladder, start=first):
        n = int(counts[t + 1])
        if n:
            with fork.stream(t):
                _numeric_launch(s, size, analysis._rows_at(order, starts[t + 1]), n, Cp, base, Cj, Cx, row_nnz)


def _numeric_launch(s: analysis._Symbolic, size: int, rows, n: int, Cp, base, Cj, Cx, row_nnz):
    """One numeric_shared launch over n rows (rows null: rows 0 .. n - 1) in tables of ``size`` slots."""
    A, B = s.A, s.B
    num_slot = rules.KEY_BYTES + s.dtype.itemsize
    tpr, rpb = rules.launch_shape(size, num_slot, s.smem_limit, rules.NUMERIC_SUBWARP_SLOTS
                                  if size <= rules.SUBWARP_MAX_TABLE else rules.NUMERIC_SLOTS_PER_THREAD)
    words = rules.bitmap_words(size, rpb, s.shape[1], num_slot, s.smem_limit, s.sort)
    runtime._launch(f"numeric_shared<{_cuda.ctype(s.dtype)}, {rules.group_width(tpr)}>", (n + rpb - 1) // rpb,
                    tpr * rpb,
                    (A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, s.csum, rows,
                     np.int32(n), np.int32(size), np.int32(rpb), Cp, base, Cj, Cx, np.int32(s.sort), row_nnz,
                     np.int32(words), s.skip or runtime._NULL),
                    smem=rules.table_smem(size, num_slot, rpb) + 4 * words)


def _esc_launches(s: analysis._Symbolic, fork, order, starts, counts, sort_caps: tuple, Uj, Ux, row_nnz,
                  Cp=runtime._NULL) -> dict:
    """numeric_esc for every sort class with rows (classes 0 .. len(sort_caps) - 1 of a grouping:
    order, host starts and counts per class index + 1), each on its fork stream, as _esc_launch
    writes; returns {class size: rows}."""
    for c in range(len(sort_caps)):
        n = int(counts[c + 1])
        if n:
            with fork.stream(c):
                _esc_launch(s, c, analysis._rows_at(order, starts[c + 1]), n, Uj, Ux, row_nnz, Cp)
    return {cap: int(n) for cap, n in zip(sort_caps, counts[1:len(sort_caps) + 1]) if n}


def _upper_bound(s: analysis._Symbolic) -> tuple:
    """(buffer, Uj, Ux): the upper-bound buffer of the one-pass path, one entry a product, and
    the device addresses of its columns (int32) and values (s.dtype) in it (one allocation: each
    costs ~4 us of host time while the GPU waits for the numeric launches). A row i is written at
    its products' offset csum[Ap[i]] and _compact moves it to C. Keep the buffer while they run."""
    products = s.info["products"]
    cols = -(-4 * products // 16) * 16
    buf = cupy_module().empty(cols + products * s.dtype.itemsize, dtype=np.uint8)
    return buf, buf.data.ptr, buf.data.ptr + cols


def _esc_first(s: analysis._Symbolic, one: analysis._Classes, classes: tuple, row_nnz) -> tuple:
    """The hybrid's first step: numeric_esc on the rows it can take (``one``: the analysis's
    one-pass classes), into an upper-bound buffer with their counts in row_nnz, before the other
    rows' symbolic pass; returns (those rows, Uj, Ux, the buffer holding them) for _compact after
    the scan."""
    n_esc = s.n_esc
    order, counts = analysis._group(one, len(classes), False)   # grouped on the GPU while the buffer is allocated
    buf, Uj, Ux = _upper_bound(s)
    starts = analysis._starts(counts)
    fork = runtime._Fork(counts[1:n_esc + 1])
    s.info["esc_rows"] = _esc_launches(s, fork, order, starts, counts, classes[:n_esc], Uj, Ux, row_nnz)
    fork.join()
    s.info["hybrid"] = True
    return order[int(starts[1]):int(starts[n_esc + 1])], Uj, Ux, buf


def _compact_lanes(esc_rows: dict) -> int:
    """compact_rows' lanes a row for rows of numeric_esc's classes (``esc_rows``: {class cap: rows}):
    from the widest class used, a quarter of its products, 4 to COMPACT_LANES."""
    return COMPACT_LANES if not esc_rows else min(COMPACT_LANES, max(4, max(esc_rows) // 4))


#: _compact's copiers (hash_compact.cu): a group of lanes a row, a block a range of rows, a block a range
#: of C's entries.
COMPACT_HOW = ("rows", "ranges", "entries")


def _compact(s: analysis._Symbolic, Cp, Uj, Ux, Cj, Cx, rows, how: str = "rows", lanes: int = COMPACT_LANES):
    """Rows of the upper-bound buffer (Uj, Ux at their products' offsets) to C's offsets Cp, by
    ``how``: "rows", compact_rows over ``rows`` (null: every row), ``lanes`` (a power of two <=
    BLOCK_THREADS) a row; "ranges", compact_ranges (every row; for short rows); or "entries",
    compact_entries (every row; a block a range of C's entries, ``Cj.size`` of them)."""
    if how not in COMPACT_HOW:
        raise ValueError(f"how: expected one of {COMPACT_HOW}, got {how!r}")
    ct = _cuda.ctype(s.dtype)
    m = s.shape[0] if rows is runtime._NULL else rows.size
    args = (s.A.indptr, s.csum, Cp, Uj, Ux, np.int32(m), Cj, Cx)
    if how == "entries":
        if Cj.size:
            runtime._launch(f"compact_entries<{ct}>", -(-Cj.size // COMPACT_ENTRIES_BLOCK), 256,
                            args[:6] + (np.int64(Cj.size),) + args[6:])
    elif how == "ranges":
        runtime._launch(f"compact_ranges<{ct}>", -(-m // COMPACT_ROWS), 256, args)
    else:
        grid = max(1, min(-(-m // (rules.BLOCK_THREADS // lanes)), 64 * global_rows._global_target_blocks()))
        runtime._launch(f"compact_rows<{ct}>", grid, rules.BLOCK_THREADS, args + (rows, np.int32(lanes)))


def _esc_launch(s: analysis._Symbolic, c: int, rows, n: int, Uj, Ux, row_nnz, Cp=runtime._NULL):
    """One numeric_esc launch of class ESC_CLASSES[c] over n rows (rows null: rows 0 .. n - 1), in
    the one-pass layout (each row at its products' offset, its count in row_nnz), or, ``Cp``
    given, at C's guessed offsets Cp (int64; a row of another length refutes the guess)."""
    A, B = s.A, s.B
    w, p = rules.ESC_CLASSES[c]
    runtime._launch(f"numeric_esc<{_cuda.ctype(s.dtype)}, {w}, {p}>", -(-n * w // rules.ESC_BLOCK),
                    rules.ESC_BLOCK,
                    (A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, s.csum, rows, np.int32(n),
                     Cp, np.int64(0), Uj, Ux, row_nnz, np.int32(ESC_WINDOW), s.skip or runtime._NULL))

