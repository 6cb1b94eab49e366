"""Routing other libraries' CSR products through matplan.matmul: install/restore, nesting, fall-through,
threads, SciPy solvers (GPU test marked gpu)."""
import threading

import numpy as np
import pytest
import scipy.sparse as sp

import matplan
from matplan.dispatch import routing
from conftest import random_csr
from dispatch_helpers import (fresh_cache, poisson2d, entries, check, _cg_iterations,  # noqa: F401 (fixtures)
                              _gpu_csr)


def _own(cls, name):
    return cls.__dict__.get(name, "<inherited>")


def test_routing_routes_and_restores(rng, fresh_cache):
    A = random_csr(rng, 80, 60, 0.1)
    x = rng.standard_normal(60)
    before = {(c, m): (_own(c, m), getattr(c, m)) for c in routing.targets() for m in routing.METHODS}
    with matplan.dispatch.route_sparse_matmul():
        assert routing.is_routing()
        assert getattr(sp.csr_matrix.__matmul__, "__matplan_router__", False)
        ys = [A @ x, A.dot(x), sp.csr_array(A) @ x]   # the last: same content, a hit
        assert (fresh_cache.misses, fresh_cache.hits) == (1, 2)
    for y in ys:
        check(y, A, x)
    with matplan.dispatch.route_sparse_matmul():
        with matplan.dispatch.skip_routing():
            check(A @ x, A, x)                         # check's own SciPy products are not routed
        assert (fresh_cache.misses, fresh_cache.hits) == (1, 2)
    after = {(c, m): (_own(c, m), getattr(c, m)) for c in routing.targets() for m in routing.METHODS}
    assert after == before and not routing.is_routing()
    check(A @ x, A, x)
    assert fresh_cache.hits + fresh_cache.misses == 3  # not routed any more


def test_routing_restores_on_exception(rng):
    before = {(c, m): _own(c, m) for c in routing.targets() for m in routing.METHODS}
    with pytest.raises(RuntimeError, match="boom"):
        with matplan.dispatch.route_sparse_matmul():
            random_csr(rng, 10, 10, 0.3) @ rng.standard_normal(10)
            raise RuntimeError("boom")
    assert {(c, m): _own(c, m) for c in routing.targets() for m in routing.METHODS} == before
    assert not routing.is_routing()


def test_routing_nesting_skip_and_options(rng, fresh_cache):
    A = random_csr(rng, 40, 40, 0.1)
    x = rng.standard_normal(40)
    with matplan.dispatch.route_sparse_matmul():
        with matplan.dispatch.route_sparse_matmul(deterministic=True):
            A @ x
            assert entries(fresh_cache)[0][0].deterministic is True     # the innermost options apply
            with matplan.dispatch.skip_routing():
                A @ x                                                   # not routed
                assert not routing.is_routing()
        assert getattr(sp.csr_matrix.__matmul__, "__matplan_router__", False)  # outer block still open
        A @ x
        assert entries(fresh_cache)[0][0].deterministic is False
    assert (fresh_cache.misses, fresh_cache.hits) == (2, 0)
    assert "__matmul__" not in sp.csr_matrix.__dict__ or not getattr(
        sp.csr_matrix.__dict__["__matmul__"], "__matplan_router__", False)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_routing_falls_through_or_raises_with_only(rng, fresh_cache):
    Ai = sp.csr_matrix(np.arange(12).reshape(3, 4))
    xi = np.arange(4)
    A = random_csr(rng, 3, 4, 0.9)
    with matplan.dispatch.route_sparse_matmul():
        np.testing.assert_array_equal(Ai @ xi, Ai.toarray() @ xi)      # integers: SciPy's product
        np.testing.assert_allclose((A.dot(2.0)).toarray(), 2.0 * A.toarray())  # a scalar: scaling
        M = np.asmatrix(rng.standard_normal((4, 2)))
        assert isinstance(A @ M, np.matrix)                             # ndarray subclass: SciPy's
    assert fresh_cache.hits + fresh_cache.misses == 0
    with matplan.dispatch.route_sparse_matmul(only=True):
        with pytest.raises(TypeError, match="dtype"):
            Ai @ xi
        with pytest.raises(TypeError, match="matrix"):
            A @ np.asmatrix(rng.standard_normal((4, 2)))
    with pytest.raises(TypeError, match="only"):
        with matplan.dispatch.route_sparse_matmul(only="yes"):
            pass


def test_routing_is_per_thread(rng, fresh_cache):
    A = random_csr(rng, 50, 50, 0.1)
    x = rng.standard_normal(50)
    seen = {}

    def other():
        check(A @ x, A, x)
        cache = matplan.get_plan_cache("cpu")
        seen["other"] = (routing.is_routing(), cache.hits + cache.misses)

    with matplan.dispatch.route_sparse_matmul():
        t = threading.Thread(target=other)
        t.start()
        t.join()
        A @ x
    assert seen["other"] == (False, 0) and fresh_cache.misses == 1


def test_routing_reaches_scipy_solver(rng, fresh_cache):
    A = poisson2d(16)
    b = rng.standard_normal(A.shape[0])
    with matplan.dispatch.route_sparse_matmul():
        x, info, its = _cg_iterations(A, b)
    assert info == 0 and np.linalg.norm(A @ x - b) <= 1e-9 * np.linalg.norm(b)
    assert fresh_cache.misses == 1 and fresh_cache.hits >= its - 1   # every A @ p inside cg went through matplan


@pytest.mark.gpu
def test_gpu_routing(cp, rng):
    import cupyx.scipy.sparse as csp
    cache = matplan.get_plan_cache(cp.cuda.runtime.getDevice())
    cache.clear()
    A = random_csr(rng, 300, 200, 0.05)
    dA = _gpu_csr(cp, A)
    x = rng.standard_normal(200)
    own = _own(csp.csr_matrix, "__matmul__")
    with matplan.dispatch.route_sparse_matmul():
        np.testing.assert_allclose((dA @ cp.asarray(x)).get(), A @ x, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dA.dot(cp.asarray(x)).get(), A @ x, rtol=1e-12, atol=1e-12)
    assert (cache.misses, cache.hits) == (1, 1) and _own(csp.csr_matrix, "__matmul__") == own
    cache.clear()
