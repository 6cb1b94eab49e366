"""The one-pass path (``passes="auto"``, the default of ``spgemm(out='device')``): when every row's
bound min(nnz_RowCt, k) fits a table of ONE_PASS_MAX_TABLE slots or its products fit the largest
numeric_esc class (512), but for at most ONE_PASS_LONG_ROWS long rows, and an upper-bound buffer
of ``products`` entries is small (rules.one_pass_table, one_pass_long), the symbolic pass and the
scan after it are skipped: the analysis's launch also gives every row's one-pass class; rows of at
most 512 products take ``numeric_esc`` (the products expanded into registers, bitonic-sorted by
column a W-lane group a row, runs summed by a segmented scan: no table, no atomics,
deterministic sums; a row whose columns span at most its W * P slots is summed in a dense window
of them instead, ESC_WINDOW), the others a table sized from their bound at full load (no overflow
possible), the long rows the global path; each sorted row goes to its products' offset of that
buffer with its count, the counts' scan gives C's indptr, one host transfer its nnz, and
``compact_rows`` (``compact_entries`` where rows took the global path) copies the rows into C
allocated exactly. Short-row products (Poisson, uniform, road networks) spend a third of their
GPU time in the symbolic pass and the host round trip after it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ...core.xp import cupy_module
from .. import _cuda
import matplan.kernels.spgemm.analysis as analysis
import matplan.kernels.spgemm.global_rows as global_rows
import matplan.kernels.spgemm.numeric as numeric
import matplan.kernels.spgemm.operands as operands
import matplan.kernels.spgemm.runtime as runtime

#: C's rows of fewer entries than this on average are copied by compact_ranges (a block a range of
#: rows), longer ones by compact_rows (numeric.COMPACT_LANES lanes a row).
COMPACT_RANGE_BELOW = 16
#: The one-pass path copies C with compact_entries (a block per 2048 consecutive entries of C,
#: whatever rows hold them) where rows took the global path: a long row spreads over the blocks its
#: entries fill. H100, GPU time of the copy: skewed 425 -> 67 us (its 34 long rows had a block
#: each), metis 84 -> 71; without long rows compact_rows / compact_ranges stay ahead (uniform 136
#: against 161, world_highways 68 against 77, Poisson 103 against 105). True: compact_entries for
#: every one-pass product (tests).
COMPACT_ALL_BY_ENTRIES = False


def _one_pass(s: analysis._Symbolic, bal: bool, zeros, one: analysis._Classes, classes: tuple,
              lift: int = -1):
    """Steps 2-4 for rows of short bounds (rules.one_pass_table): no symbolic pass. Each row's table is
    sized from its bound min(nnz_RowCt, k) at full load (it cannot overflow); the numeric pass
    writes row i, sorted, at its products' offset csum[Ap[i]] of an upper-bound buffer with its
    count in row_nnz; the scan of the counts gives C's indptr, one host transfer its nnz, and
    compact_rows copies the rows to C. One host round trip after the analysis instead of two,
    and the symbolic pass's launch is saved. Each row's class (``one``, from the analysis's
    launch) is one of ``classes``: numeric_esc's product limits (rules.ESC_CAPS, when spgemm's ``esc``),
    then the tables. Under the balanced rule (one class for every row) the rows run in row order
    in the class of the largest row. ``lift`` >= 0: the rows of classes lift .. (few, rules.one_pass_long)
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


def _one_pass_launch(s: analysis._Symbolic, bal: bool, zeros, one: analysis._Classes, classes: tuple,
                     lift: int = -1, direct: tuple = None) -> _Launched:
    """_one_pass's launches up to the scan of C's row counts: no host synchronisation (a guessed
    call records them as a CUDA graph: guesses._guessed). ``direct``: (guessed Cp (int64), Cj, Cx): the
    rows, all numeric_esc's, written straight to C at those offsets, no buffer and no scan
    (guesses._direct_finish)."""
    ladder = s.num_ladder
    m, k = s.shape
    grouped = not (bal and lift < 0)
    if grouped:   # the GPU groups the rows while the host allocates the buffer
        order, counts = analysis._group(one, len(classes), False, lift)
    sort_caps = classes[:s.n_esc]
    n_glob = 0
    row_nnz, Cp, Cp32 = s.counts   # zeroed: rows of no products are not launched
    at = runtime._NULL
    if direct is None:
        buf, Uj, Ux = numeric._upper_bound(s)
        _cuda.hold(buf)
    else:
        at, Uj, Ux = direct
        buf, row_nnz = None, runtime._NULL
        if (s.rowct_max > (sort_caps or (0,))[-1] if not grouped else counts[len(sort_caps) + 1:].any()):
            raise analysis._Misguess()   # kept for a product of numeric_esc's rows only: settings changed since
    if not grouped:
        if s.rowct_max <= (sort_caps or (0,))[-1]:
            c = next(i for i, cap in enumerate(sort_caps) if cap >= s.rowct_max)
            numeric._esc_launch(s, c, runtime._NULL, m, Uj, Ux, row_nnz, at)
            tables, escs = {}, {sort_caps[c]: m}
        else:
            size = next(t for t in ladder if t >= min(s.rowct_max, k))
            numeric._numeric_launch(s, size, runtime._NULL, m, runtime._NULL, np.int64(0), Uj, Ux, row_nnz)
            tables, escs = {size: m}, {}
    else:
        starts = analysis._starts(counts)
        fork = runtime._Fork(counts[1:])
        escs = numeric._esc_launches(s, fork, order, starts, counts, sort_caps, Uj, Ux, row_nnz, at)
        e = len(sort_caps)   # the tables are the classes after the sort classes
        numeric._numeric_tables(s, fork, order, starts, counts, runtime._NULL, np.int64(0), Uj, Ux, row_nnz, first=e)
        n_glob = int(counts[-1])
        if n_glob:
            global_rows._global_rows(s, fork.stream(len(classes)), analysis._rows_at(order, starts[-2]), n_glob,
                                     runtime._NULL, np.int64(0), Uj, Ux, row_nnz)
        fork.join()
        tables = {size: int(c) for size, c in zip(ladder, counts[e + 1:-1]) if c}
    if direct is None:
        runtime._scan("scan_rows", m, (row_nnz, np.int64(m), Cp, Cp32), zeros.take(runtime._scan_words(m)))
    return _Launched(buf, Uj, Ux, n_glob, tables, escs)


def _one_pass_info(info: dict, s: analysis._Symbolic, op: _Launched, nnz_c: int) -> None:
    info.update(one_pass=True, nnz_c=nnz_c, global_rows_symbolic=0, global_rows_numeric=op.n_glob,
                symbolic_overflowed=0, smem_limit=s.smem_limit, numeric_tables=op.tables, esc_rows=op.escs)


def _one_pass_finish(s: analysis._Symbolic, op: _Launched, Cp32, info: dict):
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
            raise analysis._Misguess()
    Cj, Cx = cp.empty(nnz_c, dtype=cp.int32), cp.empty(nnz_c, dtype=s.dtype)
    if op.n_glob or COMPACT_ALL_BY_ENTRIES:
        numeric._compact(s, Cp, op.Uj, op.Ux, Cj, Cx, runtime._NULL, how="entries")
    else:
        how = "ranges" if nnz_c < COMPACT_RANGE_BELOW * m else "rows"
        numeric._compact(s, Cp, op.Uj, op.Ux, Cj, Cx, runtime._NULL, how=how)
    _one_pass_info(info, s, op, nnz_c)
    # op.buf is freed in stream order once the caller drops op: the pool hands it out again only
    # behind the copy
    return operands.csr_from_parts(Cx, Cj, Cp32, (m, k), sorted_rows=s.sort, canonical=s.sort or None)

