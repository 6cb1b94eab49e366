"""Steps 1-3 of a call: the checks, the analysis (one launch and one host transfer), the symbolic
pass and the scan of C's row counts, giving C's exact int64 row offsets; or, where the one-pass
path takes the product (rules.one_pass_table, one_pass_long), the analysis alone.

Hybrid (the two passes with ``passes="auto"``): rows of at most 512 products still take
numeric_esc. They have no symbolic table, are sorted into an upper-bound buffer before the other
rows' symbolic pass, and are copied into C after the scan (``compact_rows`` over their row list).
When the buffer would pass ONE_PASS_MEM_FRACTION of the device's memory, every row takes the
two passes. Rows of big shared tables (>= LIFT_MIN_TABLE slots) that are few (lift_index), one of
them of at least LIFT_MIN_PRODUCTS products, take the global-memory path in both passes: one
block a row on a few SMs left the GPU idle. When the balanced rule holds (var/mean of nnz_RowCt
<= 0.5) every row uses one table size: one launch per pass, as the paper does.
"""
from __future__ import annotations

import math
import time

import numpy as np

from ...core.xp import cupy_module
from ...models import spgemm as spgemm_model
from .. import _cuda
import matplan.kernels.spgemm.analysis as analysis
import matplan.kernels.spgemm.global_rows as global_rows
import matplan.kernels.spgemm.numeric as numeric
import matplan.kernels.spgemm.operands as operands
import matplan.kernels.spgemm.rules as rules
import matplan.kernels.spgemm.runtime as runtime

#: The hybrid two-pass path (rows numeric_esc can take skip the symbolic pass) needs at least this
#: many such rows (benchmarks/spgemm_esc.py sets it past any count to time the plain two passes).
HYBRID_MIN_ROWS = 1


def _symbolic(A, B, sort, smem_limit, grouping, info, passes="two", esc=True, guess=None) -> analysis._Symbolic:
    """Checks, analysis (step 1), symbolic pass (2) and scan (3): C's exact int64 row offsets;
    passes="auto" stops after the analysis (s.one_pass set) where rules.one_pass_table allows.
    ``guess``: (host words, device copy) of an earlier call's analysis to go on from instead of
    waiting for this one's (guesses._guessed; checked on the GPU, s.skip)."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("spgemm.hash needs CuPy and an NVIDIA GPU")
    operands.check_operands(A, B)
    A, B = operands.int32_operand("A", A), operands.int32_operand("B", B)
    if grouping not in ("auto", "balanced", "grouped"):
        raise ValueError(f"grouping: expected 'auto', 'balanced' or 'grouped', got {grouping!r}")
    dtype = np.dtype(A.dtype)
    m, k = A.shape[0], B.shape[1]
    if smem_limit is None:
        smem_limit = runtime._device_limits(runtime._device_id())[0]
    elif isinstance(smem_limit, bool) or not isinstance(smem_limit, (int, np.integer)) or smem_limit <= 0:
        raise ValueError(f"smem_limit: expected a positive number of bytes, got {smem_limit!r}")
    sym_ladder = rules.table_ladder(smem_limit, rules.KEY_BYTES)
    num_ladder = rules.table_ladder(smem_limit, rules.KEY_BYTES + dtype.itemsize)
    s = analysis._Symbolic(A, B, dtype, bool(sort), int(smem_limit), num_ladder, info=info)

    if m == 0 or k == 0 or A.nnz == 0 or B.nnz == 0:
        info.update(products=0, nnz_c=0, balanced=True, global_rows_symbolic=0, global_rows_numeric=0)
        return s

    clock = [time.perf_counter()]  # host time at phase ends (includes the two host transfers)

    # 1. analysis: nnz_RowCt, its moments and the symbolic table of every row in one launch and
    #    one host transfer
    #    (with passes="auto" the same launch also gives every row's one-pass class)
    sorts = rules.esc_caps(k) if esc and passes == "auto" else ()   # numeric_esc's classes come first
    classes = (sorts + num_ladder) if passes == "auto" else ()
    s.n_esc = len(sorts)
    analysis_words = analysis._classify_words(len(sym_ladder)) + analysis._classify_words(len(classes))
    zeros = s.zeros = runtime._Zeros([runtime._scan_words(A.nnz), analysis_words, 1, runtime._scan_words(m),
                                      analysis._classify_words(len(num_ladder)), m, 1])
    csum = runtime._product_offsets(A, B, zeros.take(runtime._scan_words(A.nnz)))
    row_nnz = zeros.take(m)
    if guess is not None:
        s.skip = zeros.take(1)
        guess = (guess[0], guess[1].data.ptr, s.skip)

    def offsets():   # allocated while the GPU classifies, off the host's work after the transfer
        s.counts = (row_nnz, cp.empty(m + 1, dtype=cp.int64), cp.empty(m + 1, dtype=cp.int32))
    sym = analysis._classify(m, k, sym_ladder, A=A, csum=csum, second=(classes, s.n_esc),
                             acc=zeros.take(analysis_words), meanwhile=offsets, guess=guess)
    s.words = sym.words
    bal = (sym.var <= spgemm_model.RBS_BALANCED_RATIO * sym.mean) if grouping == "auto" else (grouping == "balanced")
    s.rowct_max = sym.peak
    info.update(products=sym.total, rowct_max=sym.peak,
                rowct_var_over_mean=sym.var / sym.mean if sym.mean > 0 else 0.0, balanced=bal)
    s.csum = csum
    info["one_pass"] = False
    if passes == "auto":
        lift = rules.one_pass_lift(classes, s.n_esc)
        n_long = int(sym.second.counts[lift + 1:].sum())
        total_bytes = runtime._device_total_bytes()
        if (rules.one_pass_table(s.rowct_max, k, num_ladder[-1], info["products"], dtype.itemsize, total_bytes,
                                 (sorts or (0,))[-1])
                or rules.one_pass_long(n_long, k, info["products"], dtype.itemsize, total_bytes)):
            s.one_pass = (bal, zeros, sym.second, classes, lift if n_long else -1)
    if s.one_pass is not None:
        clock.append(time.perf_counter())
        s.host_ms = {"analysis": (clock[1] - clock[0]) * 1e3}
        return s
    if guess is not None:   # _remember keeps one-pass analyses only, so equal words cannot get here
        raise analysis._Misguess()
    # the hybrid: rows numeric_esc can take (their symbolic index is -1) go through it now, into
    # an upper-bound buffer, while the others take the two passes; where the buffer does not fit
    # (or HYBRID_MIN_ROWS says no), they are classified again for the symbolic tables (one launch
    # and transfer more): a row left at index -1 would be lost
    n_esc = s.n_esc
    n_sorted = int(sym.second.counts[1:n_esc + 1].sum()) if n_esc else 0
    if n_sorted:
        if (n_sorted >= HYBRID_MIN_ROWS
                and rules.upper_bound_fits(info["products"], dtype.itemsize, runtime._device_total_bytes())):
            s.hybrid = numeric._esc_first(s, sym.second, classes, row_nnz)
            s.taken = (sym.second.idx, n_esc)
        else:
            sym = analysis._classify(m, k, sym_ladder, A=A, csum=csum)
    sms = runtime._device_limits(runtime._device_id())[1]
    sym_lift = -1 if bal else rules.lift_index(sym.counts, sym_ladder, sms, s.rowct_max)
    sym_order, sym_counts = analysis._group(sym, len(sym_ladder), bal, sym_lift)
    lifted_sym = analysis._lifted_rows(sym, sym_lift)
    risky = sym.risky
    info.update(symbolic_tables={size: int(c) for size, c in zip(sym_ladder, sym_counts[1:-1]) if c})
    del sym

    clock.append(time.perf_counter())

    # 2. symbolic
    ovf_rows = cp.empty(m, dtype=cp.int32)
    n_direct = int(sym_counts[-1])
    ovf_count = zeros.take(1)   # (int32) rows that overflowed, listed after the n_direct
    starts = analysis._starts(sym_counts)
    if n_direct:
        ovf_rows[:n_direct] = sym_order[starts[-2]:starts[-1]]
    fork = runtime._Fork(sym_counts[1:len(sym_ladder) + 1])
    bitmap_from = global_rows.symbolic_bitmap_from(k, smem_limit)
    info["symbolic_bitmap_rows"] = int(sum(c for size, c in zip(sym_ladder, sym_counts[1:]) if size >= bitmap_from))
    for t, size in enumerate(sym_ladder):
        n = int(sym_counts[t + 1])
        if n == 0:
            continue
        tpr, rpb = rules.launch_shape(size, rules.KEY_BYTES, smem_limit, rules.SYMBOLIC_SLOTS_PER_THREAD)
        rows = sym_order[starts[t + 1]:starts[t + 2]]
        with fork.stream(t):
            if size >= bitmap_from:   # rows of a table hold alpha = products / pi <= size
                peak = min(s.rowct_max, math.ceil(size * spgemm_model.RBS_COMPRESSION))
                global_rows._symbolic_global(s, rows, n, row_nnz, peak)
                continue
            runtime._launch(f"symbolic_shared<{rules.group_width(tpr)}>", (n + rpb - 1) // rpb, tpr * rpb,
                            (A.indptr, A.indices, B.indptr, B.indices, csum, rows, np.int32(n),
                             np.int32(size), np.int32(rpb), row_nnz, ovf_rows, np.int32(n_direct), ovf_count),
                            smem=rules.table_smem(size, rules.KEY_BYTES, rpb))
    fork.join()
    n_global_sym = n_direct
    if risky or sym_counts[len(sym_ladder)]:
        # rows in the largest table may have filled it (past 3/4 of it counts as full, see
        # symbolic_shared): one more host transfer to know
        n_global_sym = n_direct + int(_cuda.read_at(ovf_count, 1, np.int32)[0])
    if n_global_sym:
        global_rows._symbolic_global(s, ovf_rows, n_global_sym, row_nnz, s.rowct_max)
    del ovf_rows, sym_order

    clock.append(time.perf_counter())

    # 3. scan; numeric table of every row (sliced per panel), grouped over all rows for one panel
    _, Cp, Cp32 = s.counts
    # Cp32: C's indptr when nnz(C) < 2^31
    runtime._scan("scan_rows", m, (row_nnz, np.int64(m), Cp, Cp32), zeros.take(runtime._scan_words(m)))
    num = analysis._classify(m, k, num_ladder, row_nnz=row_nnz,
                             acc=zeros.take(analysis._classify_words(len(num_ladder))), taken=s.taken)
    num_lift = -1 if bal else rules.lift_index(num.counts, num_ladder, sms, s.rowct_max)
    order, counts = analysis._group(num, len(num_ladder), bal, num_lift)
    s.Cp, s.Cp32, s.nnz_c, s.num_idx, s.whole = Cp, Cp32, num.total, num.idx, (order, counts)
    info.update(lifted_rows={"symbolic": lifted_sym, "numeric": analysis._lifted_rows(num, num_lift)})
    info.update(nnz_c=s.nnz_c, global_rows_symbolic=n_global_sym,
                symbolic_overflowed=n_global_sym - n_direct, smem_limit=int(smem_limit),
                numeric_tables={}, global_rows_numeric=0)
    clock.append(time.perf_counter())
    s.host_ms = {ph: (b - a) * 1e3 for ph, a, b in zip(("analysis", "symbolic", "scan"), clock, clock[1:])}
    return s

