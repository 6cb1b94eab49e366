"""Checks of SpGEMM products against SciPy, shared by the benchmark scripts.

``SpgemmReference(A, B)`` holds what SciPy says of C = A @ B; ``check_product(C, ref)`` returns
(ok, reason), the reason naming the first mismatch (row and what). C is a SciPy CSR matrix or a
cupyx one (only its indptr, the sampled rows and its row sums leave the GPU).

The rule for nnz: C must store exactly the structure of A·B, the (i, j) for which some a_ik b_kj
is stored, each once. Duplicates are not summed (a kernel must not emit them); an explicit zero is
allowed only where the structure has the entry (its products cancel; SciPy's own product drops
those, so the reference structure is taken from the product of A's and B's patterns); an explicit
zero anywhere else is an extra entry. Columns within a row may come in any order.

What is checked, in this order (the first failure is the reason):
1. the shape;
2. each row's count of entries against the structure's (so nnz(C) too), for every row where the
   structure costs at most ``REFERENCE_MAX_PRODUCTS`` products to count, else on the sampled rows;
3. on ``SAMPLE_ROWS`` rows spread evenly plus the row with the most products: the sorted column
   indices equal the structure's, and each value within ``RTOL[dtype]`` of SciPy's times the
   entry's |A||B| (so cancellation is judged by the magnitudes that cancelled);
4. every row's sum against SciPy's A @ (B @ 1), within the same tolerance times |A| @ (|B| @ 1).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

#: Rows sampled evenly for the column and value checks (the longest row is added).
SAMPLE_ROWS = 64
#: Relative tolerance of a value, times the magnitudes that made it (|A||B| at that entry).
RTOL = {"float64": 1e-10, "float32": 1e-4}
#: Past this many products the structure's per-row counts are not computed in full (SciPy's
#: symbolic pass over them would take minutes); the sampled rows' counts are still checked.
REFERENCE_MAX_PRODUCTS = 1_500_000_000
#: Products per block of rows while counting the structure (bounds the host memory it takes).
_BLOCK_PRODUCTS = 50_000_000


def _host(x):
    """A NumPy array of ``x``, a NumPy or CuPy array."""
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _pattern(M):
    """M's pattern as float64 ones (no cancellation, no underflow in a product of two)."""
    P = sp.csr_matrix((np.ones(M.nnz), M.indices, M.indptr), shape=M.shape)
    P.sum_duplicates()
    return P


class SpgemmReference:
    """What SciPy says of C = A @ B, computed once per product and shared by every check of it.

    ``row_products``: products per row (the sampled longest row is its argmax); ``counts``: the
    structure's entries per row, None past ``max_products``; ``rowsum`` / ``rowsum_scale``:
    A @ (B @ 1) and |A| @ (|B| @ 1); ``sample``: the sampled rows, sorted."""

    def __init__(self, A, B, sample_rows=SAMPLE_ROWS, max_products=REFERENCE_MAX_PRODUCTS):
        A, B = sp.csr_matrix(A, dtype=np.float64), sp.csr_matrix(B, dtype=np.float64)
        if A.shape[1] != B.shape[0]:
            raise ValueError(f"A and B: inner dimensions differ, {A.shape} @ {B.shape}")
        if not isinstance(sample_rows, (int, np.integer)) or sample_rows < 1:
            raise ValueError(f"sample_rows: expected a positive int, got {sample_rows!r}")
        self.A, self.B, self.shape = A, B, (A.shape[0], B.shape[1])
        m = A.shape[0]
        per_entry = np.diff(B.indptr)[A.indices].astype(np.int64)
        cum = np.concatenate([[0], np.cumsum(per_entry)])
        self.row_products = cum[A.indptr[1:]] - cum[A.indptr[:-1]]
        self.products = int(cum[-1])
        ones = np.ones(B.shape[1])
        self.rowsum = A @ (B @ ones)
        self.rowsum_scale = abs(A) @ (abs(B) @ ones)
        even = np.linspace(0, m - 1, min(sample_rows, m)).round().astype(np.int64) if m else np.zeros(0, np.int64)
        longest = [int(np.argmax(self.row_products))] if m else []
        self.sample = np.unique(np.concatenate([even, longest]).astype(np.int64))
        self.counts = self._counts() if self.products <= max_products else None
        self.counts_note = None if self.counts is not None else (
            f"per-row counts checked on the sampled rows only ({self.products:,} products > "
            f"{max_products:,}); total nnz not checked")
        self._rows = self._sampled_rows()

    def _counts(self):
        """The structure's entries per row, counted in blocks of rows (bounded host memory)."""
        PA, PB = _pattern(self.A), _pattern(self.B)
        out, r0, m = [], 0, self.shape[0]
        cum = np.concatenate([[0], np.cumsum(self.row_products)])
        while r0 < m:
            r1 = max(r0 + 1, int(np.searchsorted(cum, cum[r0] + _BLOCK_PRODUCTS, side="right")) - 1)
            r1 = min(r1, m)
            out.append(np.diff((PA[r0:r1] @ PB).indptr))
            r0 = r1
        return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)

    def _sampled_rows(self):
        """row -> (structure's sorted columns, SciPy's values there (0 where products cancel),
        |A||B| there)."""
        if not len(self.sample):
            return {}
        As = self.A[self.sample]
        S = _pattern(As) @ _pattern(self.B)
        V, M = As @ self.B, abs(As) @ abs(self.B)
        for X in (S, V, M):
            X.sum_duplicates()
            X.sort_indices()
        rows = {}
        for k, i in enumerate(self.sample):
            cols = S.indices[S.indptr[k]:S.indptr[k + 1]].astype(np.int64)
            vals = np.zeros(len(cols))
            vc = V.indices[V.indptr[k]:V.indptr[k + 1]]
            vals[np.searchsorted(cols, vc)] = V.data[V.indptr[k]:V.indptr[k + 1]]
            mags = np.zeros(len(cols))
            mc = M.indices[M.indptr[k]:M.indptr[k + 1]]
            mags[np.searchsorted(cols, mc)] = M.data[M.indptr[k]:M.indptr[k + 1]]
            rows[int(i)] = (cols, vals, mags)
        return rows


def _rtol(dtype):
    name = np.dtype(dtype).name
    if name not in RTOL:
        raise ValueError(f"C: expected a float32 or float64 product, got dtype {name}")
    return RTOL[name]


def _row_sums(C):
    """C's row sums in float64, on the host."""
    try:
        s = C.sum(axis=1, dtype=np.float64)
    except TypeError:       # a sum without dtype= (float64 products need none)
        s = C.sum(axis=1)
    return _host(s).astype(np.float64).ravel()


def _row_mismatch(i, got_cols, got_vals, cols, vals, mags, rtol):
    """What differs in row i (None where nothing does): columns first, then values."""
    order = np.argsort(got_cols, kind="stable")
    got_cols, got_vals = got_cols[order], got_vals[order]
    dup = np.flatnonzero(np.diff(got_cols) == 0)
    if len(dup):
        return f"row {i}: column {int(got_cols[dup[0]])} stored twice (duplicates are not summed)"
    if not np.array_equal(got_cols, cols):
        missing = np.setdiff1d(cols, got_cols)
        extra = np.setdiff1d(got_cols, cols)
        if len(extra):
            j = int(extra[0])
            v = float(got_vals[np.searchsorted(got_cols, j)])
            what = "an explicit zero" if v == 0 else f"value {v:.6g}"
            return (f"row {i}: column {j} ({what}) is not in A·B's structure"
                    + (f"; column {int(missing[0])} missing" if len(missing) else ""))
        return f"row {i}: column {int(missing[0])} missing"
    err = np.abs(got_vals.astype(np.float64) - vals)
    bad = np.flatnonzero(err > rtol * mags)
    if len(bad):
        k = int(bad[0])
        return (f"row {i}: column {int(cols[k])} value {float(got_vals[k]):.17g}, SciPy's {vals[k]:.17g} "
                f"(error {err[k]:.3g} > {rtol:g} x |A||B| {mags[k]:.3g})")
    return None


def check_product(C, ref: SpgemmReference, row0=None):
    """(ok, reason) of the product C against ``ref``. ``row0`` None: C is the whole product (its
    shape must be ref's); an int: C is a row panel, its rows ref's rows row0, row0 + 1, ... The
    reason names the first mismatch, or says what was checked where all passed."""
    if not isinstance(ref, SpgemmReference):
        raise TypeError(f"ref: expected a SpgemmReference, got {type(ref).__name__}")
    m = int(C.shape[0])
    if row0 is None:
        if tuple(int(d) for d in C.shape) != ref.shape:
            return False, f"shape {tuple(int(d) for d in C.shape)}, expected {ref.shape}"
        row0 = 0
    elif not (isinstance(row0, (int, np.integer)) and 0 <= row0 and row0 + m <= ref.shape[0]):
        raise ValueError(f"row0: expected None or 0 <= row0 with row0 + C's {m} rows <= {ref.shape[0]}, got {row0!r}")
    elif int(C.shape[1]) != ref.shape[1]:
        return False, f"panel at row {row0}: {int(C.shape[1])} columns, expected {ref.shape[1]}"
    rtol = _rtol(C.dtype)
    indptr = _host(C.indptr).astype(np.int64)
    if len(indptr) != m + 1:
        return False, f"indptr has {len(indptr)} entries for {m} rows"
    counts = np.diff(indptr)
    nnz = int(indptr[-1]) if len(indptr) else 0
    if ref.counts is not None:
        want = ref.counts[row0:row0 + m]
        bad = np.flatnonzero(counts != want)
        if len(bad):
            i = int(bad[0])
            return False, (f"row {row0 + i}: {int(counts[i])} entries stored, A·B's structure has {int(want[i])} "
                           f"(nnz {nnz:,} vs {int(want.sum()):,}; rule: structure only, each entry once)")
    for i in ref.sample[(ref.sample >= row0) & (ref.sample < row0 + m)]:
        i = int(i)
        cols, vals, mags = ref._rows[i]
        s, e = int(indptr[i - row0]), int(indptr[i - row0 + 1])
        why = _row_mismatch(i, _host(C.indices[s:e]).astype(np.int64), _host(C.data[s:e]), cols, vals, mags, rtol)
        if why:
            return False, why
    got = _row_sums(C)
    want, scale = ref.rowsum[row0:row0 + m], ref.rowsum_scale[row0:row0 + m]
    bad = np.flatnonzero(~(np.abs(got - want) <= rtol * scale))
    if len(bad):
        i = int(bad[0])
        return False, f"row {row0 + i}: row sum {got[i]:.17g}, SciPy's {want[i]:.17g} (tolerance {rtol:g} x {scale[i]:.3g})"
    sampled = int(np.count_nonzero((ref.sample >= row0) & (ref.sample < row0 + m)))
    return True, (f"ok: {'per-row counts (nnz ' + format(nnz, ',') + ')' if ref.counts is not None else ref.counts_note}, "
                  f"columns and values of {sampled} sampled rows, row sums")
