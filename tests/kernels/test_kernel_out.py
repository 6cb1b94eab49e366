"""kernels.base.out_or_new, the one check of a kernel's ``out`` (SpMV kernels and the prepared
cuSPARSE call use it): NumPy stands in for CuPy, the check reads only the array's attributes."""
import numpy as np
import pytest

from matplan.kernels.base import out_or_new


def test_none_gives_a_new_c_contiguous_array():
    out = out_or_new(None, (3, 2), np.float32, np)
    assert out.shape == (3, 2) and out.dtype == np.float32 and out.flags.c_contiguous


def test_a_fitting_out_is_returned_itself():
    c, f = np.empty((4, 3)), np.empty((4, 3), order="F")
    assert out_or_new(c, (4, 3), np.float64, np) is c
    assert out_or_new(f, (4, 3), np.float64, np, orders="CF") is f
    v = np.empty(5)                                    # a vector is C- and F-contiguous
    assert out_or_new(v, (5,), np.float64, np, orders="F") is v


@pytest.mark.parametrize("out,shape,orders,error,match", [
    ([0.0] * 4, (4,), "C", TypeError, r"^out: expected a numpy.ndarray, got builtins.list"),
    (np.empty(5), (4,), "C", ValueError, r"^out: expected shape \(4,\), got \(5,\)"),
    (np.empty((4, 1)), (4,), "C", ValueError, r"^out: expected shape \(4,\), got \(4, 1\)"),
    (np.empty(4, np.float32), (4,), "C", ValueError, r"^out: expected dtype float64, got float32"),
    (np.empty((8, 3))[::2], (4, 3), "CF", ValueError,
     r"^out: expected a C-contiguous or F-contiguous array, got strides"),
])
def test_bad_out_names_out_and_what_was_expected(out, shape, orders, error, match):
    with pytest.raises(error, match=match):
        out_or_new(out, shape, np.float64, np, orders=orders)


def test_order_is_checked():
    f = np.empty((4, 3), order="F")
    with pytest.raises(ValueError, match=r"^out: expected a C-contiguous array, got strides \(8, 32\)"):
        out_or_new(f, (4, 3), np.float64, np)
    with pytest.raises(ValueError, match="F-contiguous"):
        out_or_new(np.empty((4, 3)), (4, 3), np.float64, np, orders="F")
