"""Properties of SpMV and SpMM (sparse A times a dense vector or matrix) on every path: C equals
SciPy's float64 product (NaN and Inf where it has them), in NumPy's result dtype and shape, written
into ``out`` when given, with the operands left as they were."""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import event, given
from hypothesis import strategies as st

import matplan
from prop_helpers import abs_of, assert_close, csr64, dense_operands, device, sparse_matrices, traits  # noqa: F401 (fixture)

#: Inf - Inf and Inf * NaN in a product are expected here
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

PATHS = ("run", "bind", "matmul")


def product(path, A, B, out=None):
    """A @ B through ``path``: ``plan().run``, ``plan().bind(A)(B)`` or ``matplan.matmul``; (C, plan or None)."""
    if path == "matmul":
        return matplan.matmul(A, B, out=out), None
    p = matplan.plan(A, B)
    return (p.run(A, B, out=out) if path == "run" else p.bind(A)(B, out=out)), p


def unchanged(device, M, host):
    """Whether device operand ``M`` still holds ``host``'s values (NaN equal to NaN)."""
    got = device.host(M)
    got = got.toarray() if hasattr(got, "toarray") else got
    want = host.toarray() if hasattr(host, "toarray") else host
    return np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("path", PATHS)
@given(data=st.data())
def test_sparse_times_dense_matches_scipy(device, path, data):
    A_host = data.draw(sparse_matrices(), label="A")
    B_host, layout = data.draw(dense_operands(A_host.shape[1]), label="B, layout")
    use_out = data.draw(st.booleans(), label="out")
    traits("A", A_host), traits("B", B_host), event(f"B {B_host.ndim}-D {layout}, out={use_out}")
    dtype = np.promote_types(A_host.dtype, B_host.dtype)
    shape = (A_host.shape[0],) + B_host.shape[1:]
    A, B = device.sparse(A_host), device.dense(B_host, layout)
    out = device.empty(shape, dtype) if use_out else None

    C, p = product(path, A, B, out)

    if p is not None:
        assert p.op == ("spmv" if B_host.ndim == 1 else "spmm")
    assert C.dtype == dtype and C.shape == shape
    if use_out:
        assert C is out
    B64 = B_host.astype(np.float64)
    ref = np.asarray(csr64(A_host) @ B64).reshape(shape)   # a matrix: a SciPy array gives 0-d for (1, 0) @ (0,)
    assert_close(device.host(C), ref, np.asarray(abs_of(A_host) @ np.abs(B64)).reshape(shape), dtype)
    assert unchanged(device, A, A_host) and unchanged(device, B, B_host)
