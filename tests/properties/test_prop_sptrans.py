"""Properties of SpTRANS (``plan_transpose``): ``run(A)`` and ``bind(A)()`` give A.T as a CSR
matrix of A's dtype with each row's columns in order, equal to SciPy's (duplicates summed when
densified), with A left as it was."""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st

from matplan import planner
from prop_helpers import abs_of, assert_close, csr64, device, sparse_matrices, traits  # noqa: F401 (fixture)
from test_prop_sparse_dense import unchanged

#: Inf - Inf and Inf * NaN in a product are expected here
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@pytest.mark.parametrize("path", ("run", "bind"))
@given(data=st.data())
def test_sptrans_matches_scipy(device, path, data):
    A_host = data.draw(sparse_matrices(), label="A")
    A = device.sparse(A_host)
    traits("A", A_host)

    p = planner.plan_transpose(A)
    C = device.host(p.run(A) if path == "run" else p.bind(A)())

    m, n = A_host.shape
    assert p.op == "sptrans"
    assert sp.issparse(C) and C.format == "csr" and C.shape == (n, m) and C.dtype == A_host.dtype
    starts, ends = C.indptr[:-1], C.indptr[1:]
    assert all((np.diff(C.indices[s:e]) >= 0).all() for s, e in zip(starts, ends)), "a row's columns out of order"
    assert_close(C, csr64(A_host).toarray().T, abs_of(A_host).toarray().T, A_host.dtype)
    assert unchanged(device, A, A_host)
