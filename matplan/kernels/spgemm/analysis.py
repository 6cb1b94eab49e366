"""The analysis of C = A @ B on the GPU: every row's table from nnz_RowCt (or from C's exact row
counts) by one launch and one host transfer (classify_rows), the rows grouped by table with a
counting sort (bucket_rows), the balanced rule and lifted tables applied; and ``_Symbolic``, what
the analysis and the symbolic pass leave for the numeric pass.

The grouping takes a handful of kernels and one host transfer per pass instead of the ~40 CuPy
calls of the xp reference (rules.table_index, groups_of): 3.5-5.7 ms of host time per call on an
H100 (benchmarks/spgemm_phases.py). The xp functions stay the reference the GPU path is tested
against.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np

from ...core.xp import array_module, cupy_module
from .. import _cuda
import matplan.kernels.spgemm.rules as rules
import matplan.kernels.spgemm.runtime as runtime


class _Misguess(Exception):
    """The analysis a call guessed differed from its own (words_differ's flag): rerun unguessed."""


def groups_of(idx, n_tables: int):
    """Rows ordered by table index and the count per index (-1 .. n_tables), as xp arrays.

    On the GPU a counting sort (bucket_rows) replaces a full sort; order inside a group is arbitrary."""
    xp = array_module(idx)
    counts = xp.bincount(idx + 1, minlength=n_tables + 2)
    if xp is np:
        return xp.argsort(idx, kind="stable").astype(np.int32), counts
    fill = xp.zeros(n_tables + 2, dtype=xp.uint64)
    return _bucket(idx.astype(xp.int32, copy=False), n_tables, -1, counts.view(xp.uint64), fill), counts


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
    rule); lift >= 0 moves the rows of tables lift .. n_tables - 1 to the global path (rules.lift_index)."""
    order = cupy_module().empty(idx.size, dtype=np.int32)
    _cuda.hold(order)   # a recorded call's graph (_guessed) writes it on every replay
    runtime._launch("bucket_rows", (idx.size + 255) // 256, 256,
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
    runtime._launch("classify_rows", (m + 255) // 256, 256,
                    (A.indptr if mode == 0 else ref, ref, ref, np.int32(m), np.int64(k),
                     _device_caps(rules.table_caps(ladder, 1.0 if mode == 0 else rules.NUMERIC_LAST_TABLE_LOAD)
                                  + tuple(caps2), runtime._device_id()),
                     np.int32(T), np.int64(ladder[-1]), np.int32(mode), np.int32(T2), np.int32(n_esc or n_taken),
                     idx, idx2, acc))
    if guess is not None:
        host, expected, flag = guess
        if host.size != words:   # kept under other settings (module constants changed since)
            raise _Misguess()
        runtime._launch("words_differ", 1, 256, (acc, expected, np.int32(words), flag))
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


def _lifted_rows(c: _Classes, lift: int) -> int:
    """Rows that lift index ``lift`` (lift_index; -1: none) moves from c's tables to the global path."""
    return int(c.counts[lift + 1:-1].sum()) if lift >= 0 else 0


def _classify_words(n_tables: int) -> int:
    """Words (uint64) of classify_rows' totals plus bucket_rows' fill counters."""
    return 2 * n_tables + 8


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

