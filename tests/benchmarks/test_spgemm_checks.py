"""benchmarks/_checks.py: SpGEMM products checked against SciPy beyond row sums (counts per row,
columns and values of sampled rows), each failure naming its row."""
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _checks  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)


def _operands(m=40, seed=0):
    rng = np.random.default_rng(seed)
    A = sp.random(m, m, density=0.15, random_state=rng, format="csr")
    B = sp.random(m, m, density=0.15, random_state=rng, format="csr")
    return A, B


def _structural(A, B):
    """A @ B storing A·B's whole structure (SciPy's own product drops cancelled entries)."""
    S = (abs(A) @ abs(B)).tocsr()
    S.sort_indices()
    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    values = np.asarray((A @ B)[rows, S.indices]).ravel()
    return sp.csr_matrix((values, S.indices, S.indptr), shape=S.shape)


def _row_with(C, at_least=2):
    """A row of C with at least ``at_least`` entries (all rows are sampled: m <= 64)."""
    return int(np.flatnonzero(np.diff(C.indptr) >= at_least)[0])


def test_equal_products_pass_in_float64_and_float32():
    A, B = _operands()
    ref = _checks.SpgemmReference(A, B)
    ok, why = _checks.check_product((A @ B).tocsr(), ref)
    assert ok, why
    assert "per-row counts" in why and "sampled rows" in why
    C32 = (A @ B).tocsr().astype(np.float32)
    assert _checks.check_product(C32, ref)[0]
    # columns in any order within a row pass
    C = (A @ B).tocsr()
    i = _row_with(C)
    s, e = C.indptr[i], C.indptr[i + 1]
    C.indices[s:e], C.data[s:e] = C.indices[s:e][::-1].copy(), C.data[s:e][::-1].copy()
    C.has_sorted_indices = False
    assert _checks.check_product(C, ref)[0]


def test_cancelled_entries_are_structure_and_may_be_stored_as_zeros():
    A = sp.csr_matrix(np.array([[1.0, 1.0], [0.0, 2.0]]))
    B = sp.csr_matrix(np.array([[3.0, 1.0], [-3.0, 0.0]]))
    ref = _checks.SpgemmReference(A, B)
    assert (A @ B).nnz == 2          # SciPy drops the cancelled (0, 0)
    C = _structural(A, B)
    assert C.nnz == 3 and C[0, 0] == 0 and C[0, 1] == 1 and C[1, 0] == -6
    ok, why = _checks.check_product(C, ref)
    assert ok, why
    ok, why = _checks.check_product((A @ B).tocsr(), ref)   # missing the structure's (0, 0)
    assert not ok and why.startswith("row 0: 1 entries stored, A·B's structure has 2")


def test_dropped_entry_fails_naming_the_row_and_nnz():
    A, B = _operands()
    C = (A @ B).tocsr()
    i = _row_with(C)
    D = C.tolil()
    D[i, C.indices[C.indptr[i]]] = 0
    D = D.tocsr()
    D.eliminate_zeros()
    ok, why = _checks.check_product(D, _checks.SpgemmReference(A, B))
    assert not ok
    assert why.startswith(f"row {i}: ") and f"nnz {C.nnz - 1:,} vs {C.nnz:,}" in why


def test_wrong_column_fails_naming_row_and_column():
    A, B = _operands()
    C = (A @ B).tocsr()
    C.sort_indices()
    i = _row_with(C)
    row = set(C.indices[C.indptr[i]:C.indptr[i + 1]])
    j_new = next(j for j in range(C.shape[1]) if j not in row)
    j_old = int(C.indices[C.indptr[i]])
    C.indices[C.indptr[i]] = j_new
    ok, why = _checks.check_product(C, _checks.SpgemmReference(A, B))
    assert not ok and why.startswith(f"row {i}: column {j_new} ")
    assert f"column {j_old} missing" in why


def test_wrong_value_fails_naming_row_and_column():
    A, B = _operands()
    C = (A @ B).tocsr()
    C.sort_indices()
    i = _row_with(C)
    k = C.indptr[i] + 1
    C.data[k] *= 1 + 1e-6
    ok, why = _checks.check_product(C, _checks.SpgemmReference(A, B))
    assert not ok and why.startswith(f"row {i}: column {C.indices[k]} value")
    # the same error passes float32's tolerance (1e-4 times |A||B|)
    ok32, why32 = _checks.check_product(C.astype(np.float32), _checks.SpgemmReference(A, B))
    assert ok32, why32


def test_extra_explicit_zero_outside_the_structure_fails():
    A, B = _operands()
    C = (A @ B).tocsr()
    ref = _checks.SpgemmReference(A, B)
    i = _row_with(C, 1)
    row = set(C.indices[C.indptr[i]:C.indptr[i + 1]])
    j = next(j for j in range(C.shape[1]) if j not in row)
    indices = np.insert(C.indices, C.indptr[i + 1], j)
    data = np.insert(C.data, C.indptr[i + 1], 0.0)
    indptr = C.indptr.copy()
    indptr[i + 1:] += 1
    D = sp.csr_matrix((data, indices, indptr), shape=C.shape)
    ok, why = _checks.check_product(D, ref)
    assert not ok and why.startswith(f"row {i}: {np.diff(C.indptr)[i] + 1} entries stored")
    # with the full counts skipped, the sampled row names the zero itself
    ref_sampled = _checks.SpgemmReference(A, B, max_products=0)
    ok, why = _checks.check_product(D, ref_sampled)
    assert not ok and why.startswith(f"row {i}: ")
    ok, why = _checks.check_product(C, ref_sampled)
    assert ok and "total nnz not checked" in why


def test_duplicate_entry_is_not_summed():
    A, B = _operands()
    C = (A @ B).tocsr()
    C.sort_indices()
    i = _row_with(C)
    s = C.indptr[i]
    half = C.data[s] / 2
    indices = np.insert(C.indices, s, C.indices[s])
    data = np.insert(C.data, s, half)
    data[s + 1] = half
    indptr = C.indptr.copy()
    indptr[i + 1:] += 1
    D = sp.csr_matrix((data, indices, indptr), shape=C.shape)
    ok, why = _checks.check_product(D, _checks.SpgemmReference(A, B, max_products=0))
    assert not ok and why == f"row {i}: column {C.indices[s]} stored twice (duplicates are not summed)"


def test_nnz_mismatch_in_an_unsampled_row_is_found_by_counts():
    A, B = _operands(m=400, seed=3)
    ref = _checks.SpgemmReference(A, B, sample_rows=4)
    C = (A @ B).tocsr()
    unsampled = [i for i in range(C.shape[0]) if i not in set(ref.sample) and C.indptr[i + 1] > C.indptr[i]]
    i = unsampled[len(unsampled) // 2]
    C.data[C.indptr[i]] = 0.0
    C.eliminate_zeros()
    ok, why = _checks.check_product(C, ref)
    assert not ok and why.startswith(f"row {i}: ") and "nnz" in why


def test_panels_shape_and_bad_arguments():
    A, B = _operands()
    C = (A @ B).tocsr()
    ref = _checks.SpgemmReference(A, B)
    assert _checks.check_product(C[10:25], ref, row0=10)[0]
    ok, why = _checks.check_product(C[10:25], ref, row0=11)
    assert not ok and why.startswith("row 11: ")
    ok, why = _checks.check_product(C[:-1], ref)
    assert not ok and why.startswith("shape")
    with pytest.raises(ValueError, match="row0"):
        _checks.check_product(C[10:25], ref, row0=30)
    with pytest.raises(TypeError, match="ref"):
        _checks.check_product(C, None)
    with pytest.raises(ValueError, match="inner dimensions"):
        _checks.SpgemmReference(A, B[:5])
    with pytest.raises(ValueError, match="dtype"):
        _checks.check_product(C.astype(np.int64), ref)


def test_sample_is_deterministic_and_has_the_longest_row():
    A, B = _operands(m=500, seed=1)
    r1, r2 = _checks.SpgemmReference(A, B), _checks.SpgemmReference(A, B)
    assert np.array_equal(r1.sample, r2.sample)
    assert int(np.argmax(r1.row_products)) in set(r1.sample)
    assert 64 <= len(r1.sample) <= 65 and r1.sample[0] == 0 and r1.sample[-1] == 499
    want = np.diff((A @ B).indptr)   # random positive values: no cancellation
    assert np.array_equal(r1.counts, want)
