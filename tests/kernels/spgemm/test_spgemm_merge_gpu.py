"""Row-row SpGEMM by the segmented merge (matplan/kernels/spgemm_merge.py) against SciPy in float64
(GPU only; skipped without CuPy)."""
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import int64_indices, messy_csr, random_csr

pytestmark = pytest.mark.gpu


@pytest.fixture
def sm(cp):
    from matplan.kernels.spgemm import merge as spgemm_merge
    return spgemm_merge


def _dev(cp, M, dtype=np.float64, index_dtype=np.int32):
    """M on the GPU as it is (duplicates and order kept)."""
    import cupyx.scipy.sparse as csp
    M = sp.csr_matrix(M)
    D = csp.csr_matrix((cp.asarray(M.data.astype(dtype)), cp.asarray(M.indices.astype(index_dtype)),
                        cp.asarray(M.indptr.astype(index_dtype))), shape=M.shape)
    return int64_indices(cp, D) if np.dtype(index_dtype) == np.int64 else D   # cupyx casts to int32


def _check(cp, sm, A, B, dtype, index_dtype=np.int32):
    """spgemm_merge(A, B) == SciPy's float64 product: C's pattern exactly (explicit zeros of
    cancelling products kept), rows sorted with no duplicate column, values within float tolerance."""
    C = sm.spgemm_merge(_dev(cp, A, dtype, index_dtype), _dev(cp, B, dtype, index_dtype)).get()
    A64, B64 = sp.csr_matrix(A, dtype=np.float64), sp.csr_matrix(B, dtype=np.float64)
    ref = (A64 @ B64).tocsr()
    ref.sum_duplicates()
    assert C.shape == ref.shape and C.dtype == np.dtype(dtype)
    for i in range(C.shape[0]):
        row = C.indices[C.indptr[i]:C.indptr[i + 1]]
        assert (np.diff(row) > 0).all(), f"row {i}: columns not strictly increasing"
    pattern = abs(A64).astype(bool).astype(np.float64) @ abs(B64).astype(bool).astype(np.float64)
    assert C.nnz == pattern.nnz
    scale = max((abs(A64) @ abs(B64)).max() if ref.nnz else 1.0, 1.0)
    diff = sp.csr_matrix(C, dtype=np.float64) - ref
    assert diff.nnz == 0 or abs(diff.data).max() <= (1e-5 if np.dtype(dtype) == np.float32 else 1e-12) * scale
    return C


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_random_square_and_rectangular(cp, sm, rng, dtype):
    A = random_csr(rng, 700, 700, 0.02)
    _check(cp, sm, A, A, dtype)
    L, R = random_csr(rng, 300, 1200, 0.01), random_csr(rng, 1200, 50, 0.05)
    _check(cp, sm, L, R, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_messy_inputs_and_a_long_row(cp, sm, rng, dtype):
    """Empty rows, duplicate and unsorted column indices, and one very long row of A: its row of C
    has ~20,000 products, past one 2,048-product tile (the merge's tree rounds across tiles)."""
    A = messy_csr(rng, 400, 2000, dtype)
    B = random_csr(rng, 2000, 3000, 0.003)
    _check(cp, sm, A, B, dtype)
    _check(cp, sm, messy_csr(rng, 300, 300), messy_csr(rng, 300, 300), dtype)


def test_int64_indices_empty_and_no_products(cp, sm, rng):
    A = random_csr(rng, 200, 150, 0.05)
    _check(cp, sm, A, A.T.tocsr(), np.float64, index_dtype=np.int64)
    C = sm.spgemm_merge(_dev(cp, sp.csr_matrix((0, 5))), _dev(cp, sp.csr_matrix((5, 7))))
    assert C.shape == (0, 7) and C.nnz == 0
    Z = sp.csr_matrix((np.ones(3), [0, 1, 2], [0, 1, 2, 3]), shape=(3, 4))   # A's columns hit B's empty rows
    E = sp.csr_matrix((np.ones(1), [1], [0, 0, 0, 0, 1]), shape=(4, 6))
    C = _check(cp, sm, Z, E, np.float64)
    assert C.nnz == 0 and C.shape == (3, 6)


def test_long_runs_and_rows_of_many_tiles(cp, sm, rng):
    """Runs of 3,000 equal columns (summed by their head's thread) and a row of 60,000 products
    (30 tiles: five tree rounds), next to short rows."""
    A = sp.vstack([sp.csr_matrix(rng.random((2, 3000)) + 0.5), random_csr(rng, 50, 3000, 0.002)]).tocsr()
    B = sp.hstack([sp.csr_matrix(rng.random((3000, 3)) + 0.5), random_csr(rng, 3000, 40000, 0.0005)]).tocsr()
    _check(cp, sm, A, B, np.float64)
    _check(cp, sm, A, B, np.float32)


def test_cancellation_kept_and_deterministic(cp, sm, rng):
    """Products that cancel leave an explicit zero (as SciPy's product does), and two calls give the
    same bits (runs summed in product order, no atomics on values)."""
    A = sp.csr_matrix(np.array([[1.0, 1.0], [0.0, 2.0]]))
    B = sp.csr_matrix(np.array([[3.0, 1.0], [-3.0, 4.0]]))
    C = _check(cp, sm, A, B, np.float64)
    assert C.nnz == 4 and C[0, 0] == 0.0
    A = random_csr(rng, 2000, 2000, 0.01)
    dA = _dev(cp, A)
    first = sm.spgemm_merge(dA, dA)
    again = sm.spgemm_merge(dA, dA)
    assert bool((first.indptr == again.indptr).all() and (first.indices == again.indices).all()
                and (first.data == again.data).all())


def test_planner_candidate_and_deterministic_plans(cp, rng):
    """spgemm.merge is a planner candidate, runs through plan.run, and is the deterministic GPU
    SpGEMM: a plan asked for bitwise reproducibility may take it, never spgemm.hash."""
    from matplan import planner
    A = _dev(cp, random_csr(rng, 1500, 1500, 0.004))
    plan = planner.plan(A, A, kernels=["spgemm.merge"], measure="never")
    assert plan.kernel == "spgemm.merge"
    assert "segmented merge" in next(c for c in plan.candidates if c.kernel == "spgemm.merge").why
    ref = (A.get() @ A.get()).tocsr()
    C = plan.run(A, A).get()
    assert abs(C - ref).max() <= 1e-12 * max(1.0, abs(ref).max())
    from matplan.kernels import get
    det = planner.plan(A, A, deterministic=True, measure="never")
    assert get(det.kernel).deterministic and "spgemm.merge" in {c.kernel for c in det.candidates}


def test_bad_inputs(cp, sm, rng):
    A = _dev(cp, random_csr(rng, 20, 30, 0.1))
    with pytest.raises(ValueError):
        sm.spgemm_merge(A, A)   # 20 x 30 times 20 x 30
    with pytest.raises(ValueError, match="out"):
        from matplan.kernels import get
        k = get("spgemm.merge")
        k.run(k.prepare(A, {}), A.T.tocsr(), out=cp.empty(3))
