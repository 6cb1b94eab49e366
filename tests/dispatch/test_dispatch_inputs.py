"""matmul's inputs (issue 40, items 1-5): a vector B on the first call and on every kind of hit,
out= checked once at the boundary, NumPy integers, CSR structure checked when a plan is made."""
import numpy as np
import pytest
import scipy.sparse as sp

import matplan
from matplan.core import validation
from conftest import random_csr
from dispatch_helpers import check, fresh_cache  # noqa: F401 (fixture)


@pytest.mark.parametrize("n", [15, 64])
def test_vector_b_on_the_first_call_and_on_hits(rng, fresh_cache, n):
    """Dense A with < 16 columns times a vector: a k = 1 "gemm" plan; every call gives (m,),
    and a (n, 1) B (the same entry: one fingerprint for k = 1) gives (m, 1)."""
    A, x = rng.random((1000, n)), rng.random(n)
    for call in range(3):                           # miss, identity hit, identity hit
        y = matplan.matmul(A, x)
        assert y.shape == (1000,)
        check(y, A, x)
    y = matplan.matmul(A, x + 1.0)                   # a new B object: the full path's hit
    assert y.shape == (1000,)
    Y = matplan.matmul(A, x[:, None])                # the column form: NumPy's (m, 1)
    assert Y.shape == (1000, 1)
    check(Y, A, x[:, None])
    assert fresh_cache.misses == 1
    check(matplan.matmul(A.copy(), x), A, x)         # another A object, equal content


def test_sparse_vector_and_column(rng, fresh_cache):
    A, x = random_csr(rng, 80, 60, 0.1), rng.random(60)
    for _ in range(2):
        assert matplan.matmul(A, x).shape == (80,)
        assert matplan.matmul(A, x[:, None]).shape == (80, 1)


@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_out_on_every_path(rng, fresh_cache, kind):
    A = random_csr(rng, 80, 60, 0.1) if kind == "sparse" else rng.random((80, 60))
    x = rng.random(60)
    outs = []
    for B in (x, x, x + 1.0, x.tolist()):            # miss, identity hit, full-path hit, normalize
        out = np.full(80, np.nan)
        assert matplan.matmul(A, B, out=out) is out
        check(out, A, np.asarray(B))
        outs.append(out)
    for bad, error, match in ((np.zeros(80, np.int64), TypeError, "out: expected dtype float64 .* got int64"),
                              (np.zeros(80, np.float32), TypeError, "out: expected dtype float64"),
                              (np.zeros(81), ValueError, r"out: expected shape \(80,\)"),
                              (np.zeros((80, 1)), ValueError, r"out: expected shape \(80,\)")):
        for B in (x, x.tolist()):                    # the identity path's check and normalize's
            with pytest.raises(error, match=match):
                matplan.matmul(A, B, out=bad)
    buf = np.zeros(140)
    xv = buf[:60]
    xv[...] = x
    with pytest.raises(ValueError, match="out: shares memory with B"):
        matplan.matmul(A, xv, out=buf[:80])
    with pytest.raises(ValueError, match="out: not supported for spgemm"):
        matplan.matmul(random_csr(rng, 80, 60, 0.1), random_csr(rng, 60, 20, 0.1), out=np.zeros((80, 20)))


def test_numpy_integer_reuse_and_bool_refused(rng, fresh_cache):
    A, x = random_csr(rng, 50, 40, 0.1), rng.random(40)
    check(matplan.matmul(A, x, reuse=np.int64(100)), A, x)
    assert list(fresh_cache)[0][1].plan.reuse == 100
    for bad in (True, np.bool_(False), 2.5, 0):
        with pytest.raises(ValueError, match="reuse: expected None"):
            matplan.matmul(A, x, reuse=bad)
    with pytest.raises(TypeError, match="check: expected True or False"):
        matplan.matmul(A, x, check="no")


def test_malformed_csr_refused_and_checked_only_when_planned(rng, fresh_cache, monkeypatch):
    calls = []
    real = validation.check_csr
    monkeypatch.setattr(validation, "check_csr", lambda M, name, *host: calls.append(name) or real(M, name, *host))
    A, x = random_csr(rng, 50, 40, 0.1), rng.random(40)
    bad = A.copy()
    bad.indices[2] = 40
    with pytest.raises(ValueError, match="A: malformed CSR: a column index"):
        matplan.matmul(bad, x)
    calls.clear()
    for B in (x, x, x + 1.0):                        # a miss (checked), then hits (not)
        check(matplan.matmul(A, B), A, B)
    assert calls == ["A"]
    matplan.matmul(A.copy(), x)                      # an equal A: confirmed against the checked copy
    assert len(calls) <= 2
    calls.clear()
    matplan.matmul(random_csr(rng, 50, 40, 0.2), x, check=False)
    assert calls == []


@pytest.mark.gpu
def test_gpu_vector_b_and_out(cp, rng):
    """The GPU path: a dense A with 15 columns times a vector (cuBLAS, a k = 1 plan) on the first
    call and on hits, and a CuPy out checked at the boundary."""
    import cupyx.scipy.sparse as csp
    matplan.get_plan_cache(cp.cuda.runtime.getDevice()).clear()
    A_h = rng.random((1000, 15))
    A, x = cp.asarray(A_h), cp.asarray(rng.random(15))
    for _ in range(3):
        y = matplan.matmul(A, x)
        assert y.shape == (1000,)
        np.testing.assert_allclose(y.get(), A_h @ x.get(), rtol=1e-12)
    assert matplan.matmul(A, x[:, None]).shape == (1000, 1)
    S_h = random_csr(rng, 300, 200, 0.05)
    S, v = csp.csr_matrix(S_h), cp.asarray(rng.random(200))
    for _ in range(2):
        out = cp.full(300, cp.nan)
        assert matplan.matmul(S, v, out=out) is out
        np.testing.assert_allclose(out.get(), S_h @ v.get(), rtol=1e-12)
    with pytest.raises(TypeError, match="out: expected a CuPy array"):
        matplan.matmul(S, v, out=np.zeros(300))
    with pytest.raises(ValueError, match="C-contiguous"):
        matplan.matmul(S, cp.asarray(rng.random((200, 2))), out=cp.empty((2, 300)).T)
    bad = S.copy()
    bad.indices[1] = -1
    with pytest.raises(ValueError, match="A: malformed CSR"):
        matplan.matmul(bad, v)
    assert sp.issparse(S_h)
