"""Properties of TS-GEMM (a dense tall A times a small dense B: k <= 8 columns, n >= 16 k rows) on
every path: C equals NumPy's float64 product (NaN and Inf where it has them), in NumPy's result
dtype and shape, written into ``out`` when given; A in C, F (a transposed view) or strided layout."""
import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from prop_helpers import DTYPES, assert_close, dense_operands, device, specials, traits, values  # noqa: F401 (fixture)
from test_prop_sparse_dense import PATHS, product, unchanged

#: Inf - Inf and Inf * NaN in a product are expected here
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@st.composite
def tall_skinny(draw):
    """(A host, A layout, B host, B layout) with B of k <= 8 columns (a vector at times for k = 1)
    and n >= 16 k rows: a product the planner calls tsgemm."""
    k = draw(st.integers(0, 8))
    ndim = 1 if k == 1 and draw(st.booleans()) else 2
    n = draw(st.integers(16 * k, 16 * k + 48))
    m = draw(st.integers(0, 64))
    dtype, layout, special = draw(DTYPES), draw(st.sampled_from(["C", "F", "strided"])), draw(specials())
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    A = values(rng, m * n, dtype, special).reshape(m, n)
    B, b_layout = draw(dense_operands(n, ndim=ndim, k=k))
    return A, layout, B, b_layout


@pytest.mark.parametrize("path", PATHS)
@given(data=st.data())
def test_tsgemm_matches_numpy(device, path, data):
    A_host, a_layout, B_host, b_layout = data.draw(tall_skinny(), label="A, A layout, B, B layout")
    use_out = data.draw(st.booleans(), label="out")
    traits("A", A_host), traits("B", B_host), event(f"A {a_layout}, B {B_host.ndim}-D {b_layout}, out={use_out}")
    dtype = np.promote_types(A_host.dtype, B_host.dtype)
    shape = (A_host.shape[0],) + B_host.shape[1:]
    A, B = device.dense(A_host, a_layout), device.dense(B_host, b_layout)
    out = device.empty(shape, dtype) if use_out else None

    C, p = product(path, A, B, out)

    if p is not None:
        assert p.op == "tsgemm"
    assert C.dtype == dtype and C.shape == shape
    if use_out:
        assert C is out
    A64, B64 = A_host.astype(np.float64), B_host.astype(np.float64)
    assert_close(device.host(C), A64 @ B64, np.abs(A64) @ np.abs(B64), dtype)
    assert unchanged(device, A, A_host) and unchanged(device, B, B_host)
