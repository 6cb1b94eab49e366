"""One set of input rules on every path of a plan (issue 40, items 1-6): plan, run (fast and
general path), bind and the bound call (fast and general path) agree on vectors, dtypes, out=,
integers and CSR structure; from_dict names what is missing."""
import itertools
import json

import numpy as np
import pytest
import scipy.sparse as sp

import matplan
from matplan import planner
from matplan.core import validation
from matplan.planner import Plan
from conftest import random_csr

DTYPES = (np.float32, np.float64)


def _problems(rng, xp=np, csr=sp.csr_matrix):
    A = random_csr(rng, 60, 40, 0.1)
    return {
        "spmv": (csr(A), xp.asarray(rng.random(40))),
        "spmm": (csr(A), xp.asarray(rng.random((40, 3)))),
        "spgemm": (csr(A), csr(random_csr(rng, 40, 30, 0.1))),
        "tsgemm": (xp.asarray(rng.random((100, 64))), xp.asarray(rng.random((64, 2)))),
        "gemm": (xp.asarray(rng.random((30, 20))), xp.asarray(rng.random((20, 25)))),
    }


def _dense(C):
    C = C.get() if hasattr(C, "get") and not sp.issparse(C) else C
    C = C.toarray() if hasattr(C, "toarray") else C
    return np.asarray(C.get() if hasattr(C, "get") else C)


def _paths(p, A, B, **kw):
    """C from each path: run (the fast path when A, B are the planned kinds), bind + call."""
    return {"run": p.run(A, B, **kw), "bind": p.bind(A)(B, **kw)}


# -- item 1: a vector B on every path ---------------------------------------------------------


@pytest.mark.parametrize("n", [15, 64])   # 15 < 16 columns: a dense "gemm" of k = 1; 64: tsgemm
def test_dense_a_times_a_vector_on_every_path(rng, n):
    A, x = rng.random((1000, n)), rng.random(n)
    p = planner.plan(A, x)
    assert p.op == ("gemm" if n < 16 else "tsgemm") and p.features.k == 1
    for name, C in _paths(p, A, x).items():
        assert C.shape == (1000,), name
        np.testing.assert_allclose(C, A @ x, rtol=1e-12)
    X = x[:, None]                             # the (n, 1) form: an (m, 1) result, as NumPy gives
    for name, C in {**_paths(p, A, X), **_paths(planner.plan(A, X), A, x)}.items():
        assert C.shape in ((1000, 1), (1000,)), name
    assert p.bind(A)(X).shape == (1000, 1) and planner.plan(A, X).bind(A)(x).shape == (1000,)


@pytest.mark.parametrize("planned", ["vector", "column"])
def test_sparse_k1_plans_take_either_form(rng, planned):
    """A SpMV plan takes an (n, 1) B and an SpMM plan of k = 1 a vector: the kernel gets the form it
    was planned for, C follows B's (NumPy's shape), out too."""
    A, x = random_csr(rng, 60, 40, 0.1), rng.random(40)
    p = planner.plan(A, x if planned == "vector" else x[:, None])
    assert p.op == ("spmv" if planned == "vector" else "spmm")
    bound = p.bind(A)
    for B, shape in ((x, (60,)), (x[:, None], (60, 1))):
        for C in (p.run(A, B), bound(B)):
            assert C.shape == shape
            np.testing.assert_allclose(C.reshape(-1), A @ x, rtol=1e-12)
        out = np.full(shape, np.nan)
        assert p.run(A, B, out=out) is out and bound(B, out=out) is out
        np.testing.assert_allclose(out.reshape(-1), A @ x, rtol=1e-12)
    with pytest.raises(ValueError, match=r"B: this plan expects shape \(40,\) or \(40, 1\)"):
        bound(rng.random((40, 2)))


# -- item 2: out= at the boundary -------------------------------------------------------------


@pytest.mark.parametrize("op", ["spmv", "spmm", "tsgemm", "gemm"])
def test_out_is_checked_on_every_path(rng, op):
    A, B = _problems(rng)[op]
    p = planner.plan(A, B)
    shape = (A.shape[0],) if B.ndim == 1 else (A.shape[0], B.shape[1])
    bound = p.bind(A)
    calls = {"run": lambda B, out: p.run(A, B, out=out),                    # fast path
             "run (general)": lambda B, out: p.run(A, B.tolist(), out=out),
             "bound": lambda B, out: bound(B, out=out),                      # fast path
             "bound (general)": lambda B, out: bound(B.astype(np.float32), out=out)}
    for name, call in calls.items():
        out = np.full(shape, np.nan)
        assert call(B, out) is out, name
        np.testing.assert_allclose(out, A @ B, rtol=1e-5)
        for bad, error, match in (
                (np.zeros(shape, np.int64), TypeError, "out: expected dtype float64 .* got int64"),
                (np.zeros(shape, np.float32), TypeError, "out: expected dtype float64 .* got float32"),
                (np.zeros((shape[0] + 1,) + shape[1:]), ValueError, r"out: expected shape"),
                (np.zeros(shape).tolist(), TypeError, "out: expected a NumPy array"),
                (np.broadcast_to(np.zeros(1), shape), ValueError, "out: read-only")):
            with pytest.raises(error, match=match):
                call(B, bad)
    n = int(np.prod(shape))
    buf = np.zeros(B.size + n)
    Bv = buf[:B.size].reshape(B.shape)
    Bv[...] = B
    over_b = buf[B.size - 1:B.size - 1 + n].reshape(shape)      # shares B's last element
    over_a = np.lib.stride_tricks.as_strided(A.data if sp.issparse(A) else A, shape=shape,
                                             strides=(0,) * len(shape))
    for call in (lambda: p.run(A, Bv, out=over_b), lambda: bound(Bv, out=over_b)):
        with pytest.raises(ValueError, match="out: shares memory with B"):
            call()
    for call in (lambda: p.run(A, B, out=over_a), lambda: bound(B, out=over_a)):
        with pytest.raises(ValueError, match="out: shares memory with A"):
            call()


def test_out_refused_for_sparse_results(rng):
    A, B = _problems(rng)["spgemm"]
    p, t = planner.plan(A, B), planner.plan_transpose(A)
    for call in (lambda: p.run(A, B, out=np.zeros((60, 30))), lambda: p.bind(A)(B, out=np.zeros((60, 30))),
                 lambda: t.run(A, out=np.zeros((40, 60)))):
        with pytest.raises(ValueError, match="out: not supported for sp"):
            call()


# -- item 3: one dtype rule for run, bind and the bound call ----------------------------------


@pytest.mark.parametrize("op", ["spmv", "spmm", "spgemm", "tsgemm", "gemm"])
def test_one_dtype_rule_on_run_and_bind(rng, op):
    """A plan computes in NumPy's promotion of its A's and B's dtypes; run and bind + call accept
    exactly the operands whose promotion is that dtype, cast them to it, and return it."""
    A, B = _problems(rng)[op]
    for pa, pb in itertools.product(DTYPES, DTYPES):
        p = planner.plan(A.astype(pa), B.astype(pb))
        want = np.promote_types(pa, pb)
        assert p.features.dtype == str(want)
        for ca, cb in itertools.product(DTYPES, DTYPES):
            Ac, Bc = A.astype(ca), B.astype(cb)
            ok = np.promote_types(ca, cb) == want
            results = {}
            for path, call in (("run", lambda: p.run(Ac, Bc)), ("bind", lambda: p.bind(Ac)(Bc))):
                try:
                    results[path] = call()
                except ValueError as e:
                    assert "this plan is for" in str(e), (path, e)
                    results[path] = None
            assert (results["run"] is not None) == ok == (results["bind"] is not None), (pa, pb, ca, cb)
            for C in results.values():
                if C is not None:
                    assert C.dtype == want
                    np.testing.assert_allclose(_dense(C), _dense(Ac.astype(np.float64) @ Bc.astype(np.float64)),
                                               rtol=1e-5, atol=1e-5)


def test_dtype_cases_from_the_issue(rng):
    A, x = random_csr(rng, 40, 30, 0.2), rng.random(30)
    A32 = A.astype(np.float32)
    p = planner.plan(A32, x)                    # float32 A, float64 x: a float64 plan
    assert p.run(A32, x).dtype == np.float64 and p.bind(A32)(x).dtype == np.float64
    q = planner.plan(A, x)
    x32 = x.astype(np.float32)
    assert q.run(A, x32).dtype == np.float64 and q.bind(A)(x32).dtype == np.float64


def test_upcast_sums_a_coos_duplicates_in_the_plans_dtype():
    """A float32 COO with duplicates under a float64 plan: cast first, then converted to CSR, so its
    duplicates sum in float64 and the product has float64 accuracy (they summed in float32; found
    by tests/properties)."""
    a, b = np.float32(0.1), np.float32(0.2)
    A = sp.coo_matrix((np.array([a, b]), ([0, 0], [0, 0])), shape=(1, 1))
    x = np.ones(1)
    want = np.float64(a) + np.float64(b)
    assert np.float64(a + b) != want                       # the float32 sum is not the float64 one
    p = planner.plan(A, x)
    q = planner.plan(sp.csr_matrix(np.ones((1, 1))), x)    # a float64 plan binding a float32 A
    for C in (p.run(A, x), p.bind(A)(x), q.bind(A)(x), matplan.matmul(A, x)):
        assert C.dtype == np.float64 and C[0] == want
    assert A.nnz == 2                                     # the caller's A is left as it was


def test_upcast_keeps_each_duplicate_as_scipys_product_does():
    """Duplicates of opposite signs times an Inf give NaN in SciPy's mixed-dtype products (each entry
    is multiplied); an upcast that summed them first (SciPy's astype) gave -Inf (found by
    tests/properties)."""
    A = sp.csr_matrix((np.float32([-2.0, 1.0]), np.int32([0, 0]), np.int32([0, 2])), shape=(1, 1))
    x, B = np.array([np.inf]), sp.csr_matrix(np.array([[np.inf]]))
    with np.errstate(invalid="ignore"):
        assert np.isnan(A @ x).all() and np.isnan((A @ B).toarray()).all()      # SciPy
        for C in (planner.plan(A, x).run(A, x), planner.plan(A, x).bind(A)(x), matplan.matmul(A, x)):
            assert C.dtype == np.float64 and np.isnan(C).all()
        for C in (planner.plan(A, B).run(A, B), planner.plan(A, B).bind(A)(B)):
            assert C.dtype == np.float64 and np.isnan(C.toarray()).all()
        dense = planner.plan(A.astype(np.float64), x)                           # bind casts the same way
        assert np.isnan(dense.bind(A)(x)).all()


# -- item 4: NumPy integers -------------------------------------------------------------------


def test_numpy_integers_are_integers(rng):
    A, x = random_csr(rng, 40, 30, 0.2), rng.random(30)
    p = planner.plan(A, x, reuse=np.int64(100))
    assert p.reuse == 100 and type(p.reuse) is int
    assert planner.plan_transpose(A, reuse=np.int32(3)).reuse == 3
    json.dumps(p.to_dict())
    for bad in (True, np.bool_(True), 2.0, np.float64(2.0)):
        with pytest.raises(ValueError, match="reuse: expected a positive integer"):
            planner.plan(A, x, reuse=bad)


# -- item 5: CSR structure at plan / bind / run of a new A ------------------------------------


def _bad(A, how):
    A = A.copy()
    if how == "column":
        A.indices[A.indptr[1]] = A.shape[1] + 5
    elif how == "negative":
        A.indices[0] = -3
    else:                                        # indptr decreasing
        A.indptr[2] = A.indptr[1] - 1 if A.indptr[1] > 0 else A.indptr[3] + 1
    return A


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = validation.check_csr
    monkeypatch.setattr(validation, "check_csr", lambda M, name, *host: calls.append(name) or real(M, name, *host))
    return calls


@pytest.mark.parametrize("how", ["column", "negative", "indptr"])
def test_malformed_csr_is_refused_at_plan_bind_and_run(rng, how):
    A, x = random_csr(rng, 50, 40, 0.2), rng.random(40)
    bad = _bad(A, how)
    with pytest.raises(ValueError, match="A: malformed CSR"):
        planner.plan(bad, x)
    p = planner.plan(A, x)
    with pytest.raises(ValueError, match="A: malformed CSR"):
        p.bind(bad)
    with pytest.raises(ValueError, match="A: malformed CSR"):
        p.run(bad, x)                                        # the fast path's types, a new A
    with pytest.raises(ValueError, match="A: malformed CSR"):
        p.run(bad, x.tolist())                               # the general path
    B = random_csr(rng, 40, 20, 0.2)
    s = planner.plan(A, B)
    with pytest.raises(ValueError, match="B: malformed CSR"):
        planner.plan(A, _bad(B, how))
    for call in (lambda: s.run(A, _bad(B, how)), lambda: s.bind(A)(_bad(B, how))):
        with pytest.raises(ValueError, match="B: malformed CSR"):
            call()
    with pytest.raises(ValueError, match="A: malformed CSR"):
        planner.plan_transpose(bad)


def test_check_paid_at_plan_and_bind_not_per_run(rng, counted):
    A, x = random_csr(rng, 50, 40, 0.2), rng.random(40)
    p = planner.plan(A, x)
    assert counted == ["A"]
    for _ in range(3):
        p.run(A, x)
    bound = p.bind(A)                    # the A checked when planned
    bound(x)
    assert counted == ["A"]
    A2 = A.copy()                        # a new A: checked once, then not again
    p.run(A2, x)
    p.run(A2, x)
    assert counted == ["A", "A"]
    A2.indices = A2.indices.copy()       # an index array replaced: checked again
    p.run(A2, x)
    assert counted == ["A", "A", "A"]
    p.run(A.copy(), x, check=False)      # the caller vouches
    p.bind(A.copy(), check=False)
    planner.plan(A.copy(), x, check=False)
    assert counted == ["A", "A", "A"]


def test_check_false_skips_every_check(rng, counted):
    A, B = random_csr(rng, 50, 40, 0.2), random_csr(rng, 40, 20, 0.2)
    p = planner.plan(A, B, check=False)
    p.run(A.copy(), B.copy(), check=False)
    p.bind(A.copy(), check=False)(B.copy(), check=False)
    planner.plan_transpose(A, check=False).run(A.copy(), check=False)
    assert counted == []


def test_unpickled_plan_checks_again(rng, counted):
    import pickle
    A, x = random_csr(rng, 50, 40, 0.2), rng.random(40)
    p = planner.plan(A, x)
    q = pickle.loads(pickle.dumps(p))
    q.run(A, x)
    q.run(A, x)
    assert counted == ["A", "A"] and q == p


# -- item 6: from_dict names what is missing --------------------------------------------------


def test_from_dict_names_missing_and_unknown_fields(rng):
    A, x = random_csr(rng, 40, 30, 0.2), rng.random(30)
    d = json.loads(planner.plan(A, x).to_json())
    for key in ("features", "kernel", "candidates"):
        broken = {k: v for k, v in d.items() if k != key}
        with pytest.raises(ValueError, match=rf"plan: missing field\(s\) {key} \(plan format 1"):
            Plan.from_dict(broken)
    broken = {k: v for k, v in d.items() if k not in ("op", "reasons")}
    with pytest.raises(ValueError, match=r"missing field\(s\) op, reasons"):
        Plan.from_dict(broken)
    with pytest.raises(ValueError, match=r"plan features: missing field\(s\) m \(plan format 1"):
        Plan.from_dict({**d, "features": {k: v for k, v in d["features"].items() if k != "m"}})
    with pytest.raises(ValueError, match=r"plan candidates\[0\]: missing field\(s\) run_s"):
        Plan.from_dict({**d, "candidates": [{k: v for k, v in d["candidates"][0].items() if k != "run_s"}]})
    with pytest.raises(ValueError, match=r"plan: unknown field\(s\) colour"):
        Plan.from_dict({**d, "colour": "blue"})
    with pytest.raises(ValueError, match="plan features: expected a mapping"):
        Plan.from_dict({**d, "features": None})
    optional = {k: v for k, v in d.items() if k != "planning_s"}    # a field with a default
    assert Plan.from_dict(optional).planning_s == 0.0


# -- the same on the GPU ----------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_vectors_out_dtypes_and_structure(cp, rng):
    """Item 1-3 and 5 where the GPU path differs: cuBLAS/TSM2 on a vector, SpMV kernels on either
    k = 1 form, CuPy out (C-contiguous for sparse products, no overlap), bind's dtype rule, and the
    CSR check computed on the GPU."""
    import cupyx.scipy.sparse as csp
    A_h = rng.random((1000, 15))
    A, x = cp.asarray(A_h), cp.asarray(rng.random(15))
    p = planner.plan(A, x)
    for C in (p.run(A, x), p.bind(A)(x), p.bind(A)(x[:, None]).reshape(-1)):
        assert C.shape == (1000,)
        np.testing.assert_allclose(C.get(), A_h @ x.get(), rtol=1e-12)
    S_h = random_csr(rng, 300, 200, 0.05)
    S, v = csp.csr_matrix(S_h), cp.asarray(rng.random(200))
    for B in (v, v[:, None]):
        q = planner.plan(S, B)
        bound = q.bind(S)
        for Bc, shape in ((v, (300,)), (v[:, None], (300, 1))):
            out = cp.full(shape, cp.nan)
            assert bound(Bc, out=out) is out and q.run(S, Bc).shape == shape
            np.testing.assert_allclose(out.get().reshape(-1), S_h @ v.get(), rtol=1e-12)
        oshape = (300,) if B.ndim == 1 else (300, 1)
        with pytest.raises(TypeError, match="out: expected a CuPy array"):
            bound(B, out=np.zeros(oshape))
        with pytest.raises(TypeError, match="out: expected dtype float64"):
            q.run(S, B, out=cp.zeros(oshape, cp.float32))
    Q = cp.asarray(rng.random((200, 4)))
    r = planner.plan(S, Q)
    with pytest.raises(ValueError, match="C-contiguous"):
        r.bind(S)(Q, out=cp.empty((4, 300)).T)
    buf = cp.empty((300, 4))
    Qa = buf[:200]
    Qa[...] = Q
    with pytest.raises(ValueError, match="out: shares memory with B"):
        r.run(S, Qa, out=buf)
    S32 = S.astype(cp.float32)
    w = planner.plan(S32, v)                      # float64 plan from a float32 A
    np.testing.assert_allclose(w.bind(S32)(v).get(), S_h @ v.get(), rtol=1e-5)
    with pytest.raises(ValueError, match="this plan is for float64"):
        w.bind(S32)(v.astype(cp.float32))
    bad = S.copy()
    bad.indices[3] = 200
    with pytest.raises(ValueError, match="A: malformed CSR"):
        planner.plan(bad, v)
    p2 = planner.plan(S, v)
    with pytest.raises(ValueError, match="A: malformed CSR"):
        p2.run(bad, v)
