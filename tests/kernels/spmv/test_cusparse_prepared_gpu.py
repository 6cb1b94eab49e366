"""The prepared cuSPARSE SpMV/SpMM (``spmv.cusparse``) against SciPy in float64 on fresh random
inputs, in every configuration (algorithm; SpMM order: row-major, or column-major through kept
buffers); the workspace and buffers reused run after run; its fallbacks and refusals; the
planner's search of its configs; Plan.run's kept call.

Outputs are poisoned with NaN before each run so unwritten elements show."""
import gc
import types

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import csr_edge_cases, random_csr
from matplan import plan
from matplan.kernels import get
from matplan.kernels.spmv import cusparse_prepared as cpr, vendor
from matplan.planner import measure

pytestmark = pytest.mark.gpu
KERNEL = "spmv.cusparse"
#: B shapes and orders: a vector, then (k, order) of a 2-D B; "C" row-major, "F" column-major.
FORMS = [(None, "C"), (1, "C"), (4, "C"), (4, "F"), (32, "C"), (32, "F")]
#: Every SpMM (alg, order), offered by configs() or not: each runs right or raises clearly.
SPMM_COMBOS = [(alg, order) for order in cpr.ORDERS for alg in cpr.SPMM_ALGS]
#: (k, B's order, out's order) of a 2-D B: one column (both orders at once), then 33 in each pair.
SPMM_FORMS = [(1, "C", "C"), (33, "C", "C"), (33, "F", "C"), (33, "C", "F"), (33, "F", "F")]


def cases(rng):
    yield from csr_edge_cases(rng)
    lengths = rng.integers(0, 4, 500)
    lengths[123] = 30_000                                  # one very long row among short ones
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    data = (rng.random(indptr[-1]) + 0.5) * rng.choice([-1.0, 1.0], indptr[-1])
    yield "one-long-row", sp.csr_matrix((data, rng.integers(0, 40_000, indptr[-1]), indptr), shape=(500, 40_000))
    yield "empty-rows-first", sp.vstack([sp.csr_matrix((3000, 50)), random_csr(rng, 200, 50, 0.1)], format="csr")


def to_gpu(cp, A, dtype, index_dtype):
    """A CSR on the GPU with exactly these dtypes (a plain namespace keeps int64 indices)."""
    return types.SimpleNamespace(indptr=cp.asarray(A.indptr.astype(index_dtype)),
                                 indices=cp.asarray(A.indices.astype(index_dtype)),
                                 data=cp.asarray(A.data.astype(dtype)), shape=A.shape)


def operands(cp, rng, A, dtype, k, order):
    """(X on the host as (n, k), B on the GPU, out poisoned with NaN) for one form."""
    X = rng.standard_normal((A.shape[1], k or 1)).astype(dtype)
    if k is None:
        return X, cp.asarray(X[:, 0]), cp.full(A.shape[0], np.nan, dtype=dtype)
    B = cp.asarray(X, order=order)
    return X, B, cp.full((A.shape[0], k), np.nan, dtype=dtype, order=order)


def check(Y, A, X, dtype, what):
    ref = A.astype(np.float64) @ X.astype(np.float64)
    scale = abs(A).astype(np.float64) @ np.abs(X.astype(np.float64))
    tol = 1e-12 if dtype == np.float64 else 1e-5     # float32: cuSPARSE's summation order is its own
    Y = np.asarray(Y).reshape(ref.shape)
    assert not np.isnan(Y).any(), f"{what}: unwritten (NaN) outputs"
    bad = np.abs(Y - ref) > tol * (scale + 1e-30)
    assert not bad.any(), f"{what}: {bad.sum()} wrong, max err {np.abs(Y - ref).max():.3g}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_prepared_call_matches_scipy(cp, rng, dtype, index_dtype):
    kernel = get(KERNEL)
    for label, A in cases(rng):
        A = A.astype(dtype)
        p = kernel.prepare(to_gpu(cp, A, dtype, index_dtype), {})
        assert p.meta["fallback"] is None, p.meta["fallback"]
        for k, order in FORMS:
            X, B, out = operands(cp, rng, A, dtype, k, order)
            Y = kernel.run(p, B, out=out)
            assert Y is out
            check(cp.asnumpy(Y), A, X, dtype, f"{label} {np.dtype(dtype)} {np.dtype(index_dtype)} k={k} {order}")
        assert p.meta["cusparse"].layout_fallbacks == {}
        X, B, _ = operands(cp, rng, A, dtype, 4, "F")
        Y = kernel.run(p, B)                                    # out=None: a new C-contiguous result
        assert Y.flags.c_contiguous
        check(cp.asnumpy(Y), A, X, dtype, f"{label} out=None, column-major B")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("alg,order", SPMM_COMBOS)
def test_every_spmm_config_matches_scipy(cp, rng, dtype, index_dtype, alg, order):
    """Each order x algorithm on the edge cases (empty matrix and rows, a very long row,
    duplicates), k = 1 and 33, B and out in either order. A combination cuSPARSE refuses raises
    a RuntimeError naming the config and leaves configs() for these dtypes (then skipped, the
    reason shown by ``pytest -rs``); one it takes is never silently run by cupyx instead."""
    kernel, params = get(KERNEL), cpr.config(alg, order)
    assert params in cpr.configs("spmm", dtype, index_dtype) or (
        np.dtype(dtype).name, np.dtype(index_dtype).name, order, alg) in cpr.REFUSED
    for label, A in cases(rng):
        A = A.astype(dtype)
        p = kernel.prepare(to_gpu(cp, A, dtype, index_dtype), params)
        assert p.meta["fallback"] is None, p.meta["fallback"]
        for k, b_order, c_order in SPMM_FORMS:
            X = rng.standard_normal((A.shape[1], k)).astype(dtype)
            B = cp.asarray(X, order=b_order)
            out = cp.full((A.shape[0], k), np.nan, dtype=dtype, order=c_order)
            what = f"{label} {params} {np.dtype(dtype)} {np.dtype(index_dtype)} k={k} B {b_order} out {c_order}"
            try:
                Y = kernel.run(p, B, out=out)
            except RuntimeError as exc:
                assert alg != "default", f"{what}: the default algorithm must run: {exc}"
                assert f"spmv.cusparse params {params}: cuSPARSE refused B of {k} columns" in str(exc), str(exc)
                assert params not in cpr.configs("spmm", dtype, index_dtype)
                pytest.skip(f"cuSPARSE refuses {what}: raised clearly, left the configs ({exc})")
            assert Y is out
            check(cp.asnumpy(Y), A, X, dtype, what)
        assert p.meta["cusparse"].layout_fallbacks == {}, f"{label} {params}: ran cupyx instead"
        assert p.meta["cusparse"].params == params


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("alg", list(cpr.SPMV_ALGS))
def test_every_spmv_algorithm_matches_scipy(cp, rng, dtype, index_dtype, alg):
    """A vector B with each SpMV algorithm (``order`` does not apply to a vector)."""
    kernel = get(KERNEL)
    for params in (cpr.config(alg), cpr.config(alg, "col")):
        for label, A in cases(rng):
            A = A.astype(dtype)
            p = kernel.prepare(to_gpu(cp, A, dtype, index_dtype), params)
            X, B, out = operands(cp, rng, A, dtype, None, "C")
            assert kernel.run(p, B, out=out) is out
            check(cp.asnumpy(out), A, X, dtype, f"{label} SpMV {params} {np.dtype(dtype)} {np.dtype(index_dtype)}")
            assert p.meta["cusparse"].layout_fallbacks == {}


def test_spmm_algorithm_on_a_vector_is_refused_by_name(cp, rng):
    A = random_csr(rng, 50, 40, 0.1)
    p = get(KERNEL).prepare(to_gpu(cp, A, np.float64, np.int32), {"alg": "csr_alg3"})
    with pytest.raises(ValueError, match=r"params\['alg'\]: 'csr_alg3' is not a cuSPARSE SpMV algorithm"):
        get(KERNEL).run(p, cp.ones(40))


def test_a_refused_config_raises_and_the_default_falls_back(cp, rng, monkeypatch):
    """cuSPARSE refusing a named config: RuntimeError naming it, and it leaves configs(); refusing
    the default algorithm: recorded in layout_fallbacks, cupyx's call runs (and is right)."""
    lib = cpr.bindings()[0]

    class Refusing:
        def __getattr__(self, name):
            return getattr(lib, name)

        def spMM_bufferSize(self, *args):
            raise lib.CuSparseError(10)          # CUSPARSE_STATUS_NOT_SUPPORTED

    monkeypatch.setattr(cpr, "REFUSED", set())
    kernel = get(KERNEL)
    A = random_csr(rng, 300, 200, 0.02)
    params = {"alg": "csr_alg3", "order": "col"}
    p = kernel.prepare(to_gpu(cp, A, np.float32, np.int32), params)
    p.meta["cusparse"].lib = Refusing()
    with pytest.raises(RuntimeError, match=r"spmv.cusparse params \{'alg': 'csr_alg3', 'order': 'col'\}: "
                                           r"cuSPARSE refused B of 4 columns, column-major with alg 'csr_alg3'"):
        kernel.run(p, cp.ones((200, 4), dtype=np.float32))
    assert params not in cpr.configs("spmm", np.float32, np.int32)
    assert params in cpr.configs("spmm", np.float64, np.int32)
    q = kernel.prepare(to_gpu(cp, A, np.float64, np.int32), {})
    q.meta["cusparse"].lib = Refusing()
    X, B, out = operands(cp, rng, A, np.float64, 4, "C")
    check(cp.asnumpy(kernel.run(q, B, out=out)), A, X, np.float64, "default refused: cupyx")
    (reason,) = q.meta["cusparse"].layout_fallbacks.values()
    assert reason.startswith("cuSPARSE refused B of 4 columns, row-major with alg 'default': CuSparseError")


@pytest.mark.parametrize("params", [{"order": "col"}, {"alg": "csr_alg1", "order": "col"}])
def test_column_major_config_on_c_ordered_operands_copies_through_kept_buffers(cp, rng, params):
    """B and out C-contiguous with order="col": B is copied into a kept column-major buffer and C
    computed into another, then copied into out; an F-contiguous pair is used as it is."""
    kernel = get(KERNEL)
    A = random_csr(rng, 3000, 2000, 0.003)
    p = kernel.prepare(to_gpu(cp, A, np.float64, np.int32), params)
    X, B, out = operands(cp, rng, A, np.float64, 8, "C")
    check(cp.asnumpy(kernel.run(p, B, out=out)), A, X, np.float64, f"{params} on C operands")
    (layout,) = p.meta["cusparse"]._layouts.values()
    assert layout.b_buf.flags.f_contiguous and layout.c_buf.flags.f_contiguous
    assert layout.b_buf.shape == (2000, 8) and layout.c_buf.shape == (3000, 8)
    b_buf, c_buf = layout.b_buf, layout.c_buf
    X2, B2, out2 = operands(cp, rng, A, np.float64, 8, "F")
    check(cp.asnumpy(kernel.run(p, B2, out=out2)), A, X2, np.float64, f"{params} on F operands")
    assert layout.b_buf is b_buf and layout.c_buf is c_buf and p.meta["cusparse"].buffer_size_calls == 1


def test_cupyx_matrix_and_mixed_orders(cp, rng):
    """A cupyx CSR as A; B of one order into an out of the other (B is copied to out's order)."""
    import cupyx.scipy.sparse as csp
    kernel = get(KERNEL)
    A = random_csr(rng, 2000, 1500, 0.005)
    p = kernel.prepare(csp.csr_matrix(A), {})
    assert p.meta["fallback"] is None
    for b_order, c_order in (("C", "F"), ("F", "C")):
        X = rng.standard_normal((1500, 8))
        out = cp.full((2000, 8), np.nan, order=c_order)
        check(cp.asnumpy(kernel.run(p, cp.asarray(X, order=b_order), out=out)), A, X, np.float64,
              f"B {b_order} into out {c_order}")
    X = rng.standard_normal((3000, 8))
    strided = cp.asarray(X)[::2]                          # neither C- nor F-contiguous
    check(cp.asnumpy(kernel.run(p, strided)), A, X[::2], np.float64, "strided B")


@pytest.mark.parametrize("params", [{}, {"order": "col"}, {"alg": "csr_alg2"}])
@pytest.mark.parametrize("k,order", [(None, "C"), (16, "C"), (16, "F")])
def test_repeated_runs_reuse_the_workspace(cp, rng, k, order, params):
    """After the first run (descriptors, workspace, conversion buffers) a run allocates nothing."""
    kernel = get(KERNEL)
    A = random_csr(rng, 20_000, 20_000, 0.0005)
    p = kernel.prepare(to_gpu(cp, A, np.float64, np.int32), params)
    call = p.meta["cusparse"]
    X, B, out = operands(cp, rng, A, np.float64, k, order)
    kernel.run(p, B, out=out)
    cp.cuda.Device().synchronize()
    pool = cp.get_default_memory_pool()
    used, sized, layouts = pool.used_bytes(), call.buffer_size_calls, len(call._layouts)
    assert sized == 1 and layouts == 1
    for _ in range(20):
        X = rng.standard_normal(X.shape)
        B[...] = cp.asarray(X[:, 0] if k is None else X)
        out.fill(np.nan)
        kernel.run(p, B, out=out)
        check(cp.asnumpy(out), A, X, np.float64, f"repeated run k={k} {order} {params}")
    cp.cuda.Device().synchronize()
    assert pool.used_bytes() == used, "a repeated run allocated"
    assert call.buffer_size_calls == sized and len(call._layouts) == layouts


def test_fallback_reason_recorded_and_result_right(cp, rng):
    """int64 indptr with int32 indices: not the prepared call; cupyx's A @ B, with the reason."""
    kernel = get(KERNEL)
    A = random_csr(rng, 500, 400, 0.02)
    Ag = types.SimpleNamespace(indptr=cp.asarray(A.indptr.astype(np.int64)), indices=cp.asarray(A.indices),
                               data=cp.asarray(A.data), shape=A.shape)
    p = kernel.prepare(Ag, {})
    assert "indptr of int64 with indices of int32" in p.meta["fallback"]
    for k, order in FORMS:
        X, B, out = operands(cp, rng, A, np.float64, k, order)
        check(cp.asnumpy(kernel.run(p, B, out=out)), A, X, np.float64, f"fallback k={k} {order}")


def test_changes_to_a_are_read(cp, rng):
    """In-place writes to A's values are read by the next run; a reassigned array is described anew."""
    import cupyx.scipy.sparse as csp
    kernel = get(KERNEL)
    A = random_csr(rng, 800, 600, 0.02)
    Ag = csp.csr_matrix(A)
    p = kernel.prepare(Ag, {})
    x = rng.standard_normal(600)
    kernel.run(p, cp.asarray(x))
    Ag.data *= 2
    check(cp.asnumpy(kernel.run(p, cp.asarray(x))), A * 2, x.reshape(-1, 1), np.float64, "in-place write")
    Ag.data = cp.asarray(A.data * -3)
    check(cp.asnumpy(kernel.run(p, cp.asarray(x))), A * -3, x.reshape(-1, 1), np.float64, "reassigned data")


def test_streams_get_their_own_workspace(cp, rng):
    kernel = get(KERNEL)
    A = random_csr(rng, 5000, 5000, 0.002)
    p = kernel.prepare(to_gpu(cp, A, np.float64, np.int64), {})
    x = rng.standard_normal(5000)
    outs = []
    for stream in (cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)):
        with stream:
            outs.append(kernel.run(p, cp.asarray(x)))
        stream.synchronize()
    assert len(p.meta["cusparse"]._layouts) == 2
    for y in outs:
        check(cp.asnumpy(y), A, x.reshape(-1, 1), np.float64, "second stream")


def test_plan_run_keeps_the_prepared_call(cp, rng):
    import cupyx.scipy.sparse as csp
    A = random_csr(rng, 3000, 3000, 0.002)
    Ag = csp.csr_matrix(A)
    x = rng.standard_normal(3000)
    pl = plan(Ag, cp.asarray(x), kernels=[KERNEL])
    assert pl.kernel == KERNEL
    for _ in range(3):
        check(cp.asnumpy(pl.run(Ag, cp.asarray(x))), A, x.reshape(-1, 1), np.float64, "plan.run")
    key = (id(Ag), "default", "row")
    entry = vendor._KEPT.peek(key)
    assert entry is not None and entry[0]() is Ag and entry[1].buffer_size_calls == 1
    bound = pl.bind(Ag)
    check(cp.asnumpy(bound(cp.asarray(x))), A, x.reshape(-1, 1), np.float64, "bound(x)")
    del Ag, entry, bound
    gc.collect()
    assert vendor._KEPT.peek(key) is None, "the kept call outlived its A"


def test_planner_searches_the_configs_and_runs_the_fastest(cp, rng):
    """A plan of spmv.cusparse alone, measured: every SpMM config is screened on the caller's
    matrix, the fastest timed in full and kept (its params one of configs()), and Plan.run
    computes A @ X with it."""
    import cupyx.scipy.sparse as csp
    A = random_csr(rng, 40_000, 40_000, 0.0003)
    Ag = csp.csr_matrix(A)
    X = rng.standard_normal((40_000, 4))
    pl = plan(Ag, cp.asarray(X), kernels=[KERNEL], reuse=10**6, measure="always")
    assert pl.kernel == KERNEL and pl.params in cpr.configs("spmm", np.float64, np.int32)
    measured = next(c for c in pl.candidates if c.kernel == KERNEL)
    n = len(cpr.configs("spmm", np.float64, np.int32))
    search = f"fastest of {measure.SCREEN_KEEP} configs measured in full of {n} screened"
    assert measured.source == "measured" and search in measured.why, measured.why
    out = cp.full((40_000, 4), np.nan)
    check(cp.asnumpy(pl.run(Ag, cp.asarray(X), out=out)), A, X, np.float64, f"plan.run {pl.params}")


def test_cupyx_baseline_is_a_cupy_users_call(cp, rng):
    import cupyx.scipy.sparse as csp
    A = random_csr(rng, 700, 500, 0.02)
    X = rng.standard_normal((500, 3))
    out = cp.full((700, 3), np.nan)
    assert vendor.cupyx_matmul(csp.csr_matrix(A), cp.asarray(X), out=out) is out
    check(cp.asnumpy(out), A, X, np.float64, "cupyx_matmul")
