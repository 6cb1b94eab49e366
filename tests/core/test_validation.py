"""Entry-point validation: op inference, and errors that name the argument."""
import numpy as np
import pytest
import scipy.sparse as sp

from matplan.core.validation import normalize


@pytest.fixture
def A(rng):
    from conftest import random_csr
    return random_csr(rng, 30, 20, 0.2)


def test_op_inference(A, rng):
    assert normalize(A, rng.random(20)).op == "spmv"
    assert normalize(A, rng.random((20, 3))).op == "spmm"
    assert normalize(A, A.T.tocsr()).op == "spgemm"
    assert normalize(rng.random((40, 512)), rng.random((512, 4))).op == "tsgemm"
    assert normalize(rng.random((40, 50)), rng.random((50, 40))).op == "gemm"


@pytest.mark.parametrize("fmt", ["csc", "coo", "lil", "dok"])
def test_other_formats_become_csr(A, rng, fmt):
    p = normalize(A.asformat(fmt), rng.random(20))
    assert p.A.format == "csr"
    np.testing.assert_allclose(p.A @ np.ones(20), A @ np.ones(20))


def test_shape_mismatch_names_both(A, rng):
    with pytest.raises(ValueError, match=r"A is 30x20 but B has 21 rows"):
        normalize(A, rng.random(21))


@pytest.mark.parametrize("dtype", [np.int64, np.complex128, np.float16, bool])
def test_unsupported_dtype(A, dtype):
    with pytest.raises(TypeError, match=r"B: dtype .* not supported; expected float32 or float64"):
        normalize(A, np.ones(20, dtype=dtype))


def test_mixed_float_precision_upcasts(A, rng):
    p = normalize(A.astype(np.float32), rng.random(20))
    assert p.dtype == np.float64 and p.A.dtype == np.float64


def test_bad_types_and_ranks(A, rng):
    with pytest.raises(TypeError, match="A: expected a SciPy/cupyx sparse matrix"):
        normalize("matrix", rng.random(3))
    with pytest.raises(ValueError, match="B: expected a vector or a 2-D matrix"):
        normalize(A, rng.random((20, 2, 2)))
    with pytest.raises(ValueError, match="A: expected a 2-D matrix"):
        normalize(rng.random(5), rng.random(5))
    with pytest.raises(TypeError, match="A is dense and B is sparse"):
        normalize(rng.random((5, 30)), A)


def test_dlpack_host_array(A, rng):
    class Producer:  # a foreign host array exposing only DLPack
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    x = rng.random(20)
    p = normalize(A, Producer(x))
    np.testing.assert_array_equal(p.B, x)


def test_empty_matrix_is_valid():
    p = normalize(sp.csr_matrix((0, 0)), np.zeros(0))
    assert p.op == "spmv"


def test_a_times_a_checks_its_structure_once(rng, monkeypatch):
    """SpGEMM of one matrix with itself reads its structure once; a malformed one still raises,
    and a distinct B is checked too."""
    from matplan.core import validation
    A = sp.random(60, 60, density=0.1, format="csr", random_state=1)
    seen = []
    real = validation.check_csr
    monkeypatch.setattr(validation, "check_csr", lambda M, name, *a, **k: (seen.append(name), real(M, name, *a, **k)))
    validation.check_structure(normalize(A, A))
    assert seen == ["A"]
    validation.check_structure(normalize(A, A.copy()))
    assert seen == ["A", "A", "B"]
    bad = A.copy()
    bad.indices[0] = 60
    with pytest.raises(ValueError, match="A"):
        validation.check_structure(normalize(bad, bad))
