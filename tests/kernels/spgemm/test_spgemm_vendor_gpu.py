"""cuSPARSE's SpGEMM candidate: operands checked canonical by matplan's kernel (never changed in
place by cupyx's sum_duplicates), products against SciPy in float64."""
import numpy as np
import pytest
import scipy.sparse as sp

import matplan
from matplan.kernels.spgemm import vendor

pytestmark = pytest.mark.gpu


def _messy(rng, m, n, dtype):
    """A CSR with unsorted rows, duplicates, empty rows and one long row."""
    A = sp.random(m, n, density=0.02, format="csr", random_state=rng, dtype=np.float64)
    A.data += 0.5
    rows = [A.indices[A.indptr[i]:A.indptr[i + 1]][::-1] for i in range(m)]
    rows[1] = np.concatenate([rows[1], rows[1][:2]]) if rows[1].size >= 2 else np.array([3, 3])
    rows[2] = np.arange(n)[::-1]                                   # the long row, reversed
    rows[4] = np.array([], dtype=int)                              # an empty row
    indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])])
    indices = np.concatenate(rows)
    data = rng.random(indices.size) + 0.5
    return sp.csr_matrix((data.astype(dtype), indices, indptr), shape=(m, n))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index", [np.int32, np.int64])
def test_canonical_keeps_a_canonical_matrix_and_copies_a_messy_one(cp, dtype, index):
    import cupyx.scipy.sparse as csp
    rng = np.random.default_rng(7)
    clean = sp.random(300, 200, density=0.03, format="csr", random_state=1, dtype=dtype)
    Cd = csp.csr_matrix(clean)
    if index is np.int64:
        if not hasattr(csp.csr_matrix, "_from_parts"):
            pytest.skip("this CuPy has no int64 CSR")
        Cd = csp.csr_matrix((Cd.data, Cd.indices.astype(index), Cd.indptr.astype(index)), shape=Cd.shape)
    Cd.__dict__.pop("_has_canonical_format", None)
    got = vendor.canonical(Cd)
    assert got.has_canonical_format and got.indices.data.ptr == Cd.indices.data.ptr   # an alias, no copy
    M = _messy(rng, 300, 200, dtype)
    Md = csp.csr_matrix((cp.asarray(M.data), cp.asarray(M.indices.astype(index)), cp.asarray(M.indptr.astype(index))),
                        shape=M.shape)
    before = (Md.indices.get().copy(), Md.data.get().copy(), Md.nnz)
    got = vendor.canonical(Md)
    assert got is not Md and got.nnz < M.nnz
    assert (Md.indices.get() == before[0]).all() and (Md.data.get() == before[1]).all() and Md.nnz == before[2]
    assert abs(got.get() - M).max() <= 1e-6 * abs(M).max()


def test_cusparse_candidate_matches_scipy_and_leaves_operands_unchanged(cp):
    import cupyx.scipy.sparse as csp
    rng = np.random.default_rng(11)
    A = _messy(rng, 400, 300, np.float64)
    B = _messy(rng, 300, 350, np.float64)
    Ad, Bd = csp.csr_matrix(A), csp.csr_matrix(B)
    snap = [(M.indptr.get().copy(), M.indices.get().copy(), M.data.get().copy()) for M in (Ad, Bd)]
    p = matplan.plan(Ad, Bd, kernels=["spgemm.cusparse"])
    assert p.kernel == "spgemm.cusparse"
    want = (A @ B).toarray()
    for _ in range(2):
        C = p.run(Ad, Bd)
        assert np.abs(C.get().toarray() - want).max() <= 1e-12 * np.abs(want).max()
    for M, (ip, ix, dx) in zip((Ad, Bd), snap):
        assert (M.indptr.get() == ip).all() and (M.indices.get() == ix).all() and (M.data.get() == dx).all()
