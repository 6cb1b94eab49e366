"""SciPy / cupyx LinearOperators through a bound plan (GPU tests marked gpu)."""
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from matplan import planner
from conftest import random_csr
from dispatch_helpers import (fresh_cache, poisson2d, _cg_iterations, _gpu_csr,  # noqa: F401 (fixtures)
                              _cg_tol_kw)


def test_linear_operator_cg_poisson(rng):
    A = poisson2d(24)
    b = rng.standard_normal(A.shape[0])
    plan = planner.plan(A, b, reuse=200)
    op = plan.as_linear_operator(A)
    assert isinstance(op, spla.LinearOperator) and op.shape == A.shape and op.dtype == np.float64
    x, info, its = _cg_iterations(op, b)
    x_ref, info_ref, its_ref = _cg_iterations(A, b)
    assert info == 0 and info_ref == 0 and abs(its - its_ref) <= 1
    np.testing.assert_allclose(x, spla.spsolve(A.tocsc(), b), rtol=1e-7, atol=1e-9)
    assert np.linalg.norm(A @ x - b) <= 1e-9 * np.linalg.norm(b)


def test_linear_operator_matmat_blocks_and_padding(rng):
    A = random_csr(rng, 60, 45, 0.1)
    X = rng.standard_normal((45, 5))
    x = rng.standard_normal(45)
    vec_op = planner.plan(A, x).as_linear_operator(A)
    np.testing.assert_allclose(vec_op.matmat(X), A @ X, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(vec_op.matvec(x.reshape(-1, 1)).ravel(), A @ x, rtol=1e-12, atol=1e-12)
    spmm_op = planner.plan(A, X[:, :3]).bind(A).as_linear_operator()   # width 3: blocks 3 + 2 (padded)
    np.testing.assert_allclose(spmm_op.matmat(X), A @ X, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(spmm_op.matmat(X[:, :3]), A @ X[:, :3], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(spmm_op.matvec(x), A @ x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(spmm_op @ x, A @ x, rtol=1e-12, atol=1e-12)


def test_linear_operator_rmatvec(rng):
    A = random_csr(rng, 50, 35, 0.1)
    y = rng.standard_normal(50)
    Y = rng.standard_normal((50, 3))
    op = planner.plan(A, rng.standard_normal(35)).as_linear_operator(A)
    np.testing.assert_allclose(op.rmatvec(y), A.T @ y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.rmatmat(Y), A.T @ Y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.H @ y, A.T @ y, rtol=1e-12, atol=1e-12)
    bound_op = planner.plan(A, rng.standard_normal(35)).bind(A).as_linear_operator()
    with pytest.raises(NotImplementedError):
        bound_op.rmatvec(y)


def test_linear_operator_dtype_and_errors(rng):
    A = random_csr(rng, 40, 40, 0.1, dtype=np.float32)
    x = rng.standard_normal(40)                                    # float64 input is cast
    op = planner.plan(A, x.astype(np.float32)).as_linear_operator(A)
    y = op.matvec(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, A.astype(np.float64) @ x, rtol=1e-5, atol=1e-5)
    B = random_csr(rng, 40, 10, 0.2)
    with pytest.raises(TypeError, match="spgemm"):
        planner.plan(A, B.astype(np.float32)).as_linear_operator(A)


@pytest.mark.gpu
def test_gpu_linear_operator_cg(cp, rng):
    import cupyx.scipy.sparse.linalg as cspla
    A = poisson2d(40)
    b = rng.standard_normal(A.shape[0])
    dA, db = _gpu_csr(cp, A), cp.asarray(b)
    op = planner.plan(dA, db, reuse=200).as_linear_operator(dA)
    assert isinstance(op, cspla.LinearOperator)
    x, info = cspla.cg(op, db, **{_cg_tol_kw(cspla.cg): 1e-10}, maxiter=2000)
    assert info == 0
    np.testing.assert_allclose(x.get(), spla.spsolve(A.tocsc(), b), rtol=1e-6, atol=1e-8)
    y = rng.standard_normal(A.shape[0])
    np.testing.assert_allclose(op.rmatvec(cp.asarray(y)).get(), A.T @ y, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_gpu_linear_operator_rmatvec_of_a_rectangular_matrix(cp, rng):
    """rmatvec / rmatmat on the GPU build A^T once (matplan's SpTRANS) and match SciPy's A.T @ y on
    a rectangular A (a symmetric one, as in the CG test above, would hide a wrong transpose)."""
    A = sp.random(300, 170, density=0.05, format="csr", random_state=3)
    dA = _gpu_csr(cp, A)
    op = planner.plan(dA, cp.asarray(rng.standard_normal(170))).as_linear_operator(dA)
    y, Y = rng.standard_normal(300), rng.standard_normal((300, 3))
    np.testing.assert_allclose(op.rmatvec(cp.asarray(y)).get(), A.T @ y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.rmatmat(cp.asarray(Y)).get(), A.T @ Y, rtol=1e-12, atol=1e-12)
