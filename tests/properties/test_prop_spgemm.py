"""Properties of SpGEMM (sparse A times sparse B) on every path: C is a sparse matrix equal to
SciPy's float64 product (NaN and Inf where it has them), in NumPy's result dtype."""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st

from prop_helpers import abs_of, assert_close, csr64, device, sparse_matrices, traits  # noqa: F401 (fixture)
from test_prop_sparse_dense import PATHS, product, unchanged

#: Inf - Inf and Inf * NaN in a product are expected here
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@pytest.mark.parametrize("path", PATHS)
@given(data=st.data())
def test_spgemm_matches_scipy(device, path, data):
    A_host = data.draw(sparse_matrices(), label="A")
    B_host = data.draw(sparse_matrices(m=A_host.shape[1]), label="B")
    dtype = np.promote_types(A_host.dtype, B_host.dtype)
    traits("A", A_host), traits("B", B_host)
    A, B = device.sparse(A_host), device.sparse(B_host)

    C, p = product(path, A, B)

    if p is not None:
        assert p.op == "spgemm"
    C = device.host(C)
    assert sp.issparse(C) and C.dtype == dtype and C.shape == (A_host.shape[0], B_host.shape[1])
    ref = csr64(A_host) @ csr64(B_host)
    bound = abs_of(A_host) @ abs_of(B_host)
    assert_close(C, ref.toarray(), bound.toarray(), dtype)
    assert unchanged(device, A, A_host) and unchanged(device, B, B_host)
