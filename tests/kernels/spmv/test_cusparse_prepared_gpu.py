"""The prepared cuSPARSE SpMV/SpMM (``spmv.cusparse``) against SciPy in float64 on fresh random
inputs; the workspace reused run after run; its fallbacks; Plan.run's kept call.

Outputs are poisoned with NaN before each run so unwritten elements show."""
import gc
import types

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import csr_edge_cases, random_csr
from matplan import plan
from matplan.kernels import get
from matplan.kernels.spmv import vendor

pytestmark = pytest.mark.gpu
KERNEL = "spmv.cusparse"
#: B shapes and orders: a vector, then (k, order) of a 2-D B; "C" row-major, "F" column-major.
FORMS = [(None, "C"), (1, "C"), (4, "C"), (4, "F"), (32, "C"), (32, "F")]


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


@pytest.mark.parametrize("k,order", [(None, "C"), (16, "C"), (16, "F")])
def test_repeated_runs_reuse_the_workspace(cp, rng, k, order):
    kernel = get(KERNEL)
    A = random_csr(rng, 20_000, 20_000, 0.0005)
    p = kernel.prepare(to_gpu(cp, A, np.float64, np.int32), {})
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
        check(cp.asnumpy(out), A, X, np.float64, f"repeated run k={k} {order}")
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
    key = (id(Ag), "default")
    entry = vendor._KEPT.peek(key)
    assert entry is not None and entry[0]() is Ag and entry[1].buffer_size_calls == 1
    bound = pl.bind(Ag)
    check(cp.asnumpy(bound(cp.asarray(x))), A, x.reshape(-1, 1), np.float64, "bound(x)")
    del Ag, entry, bound
    gc.collect()
    assert vendor._KEPT.peek(key) is None, "the kept call outlived its A"


def test_cupyx_baseline_is_a_cupy_users_call(cp, rng):
    import cupyx.scipy.sparse as csp
    A = random_csr(rng, 700, 500, 0.02)
    X = rng.standard_normal((500, 3))
    out = cp.full((700, 3), np.nan)
    assert vendor.cupyx_matmul(csp.csr_matrix(A), cp.asarray(X), out=out) is out
    check(cp.asnumpy(out), A, X, np.float64, "cupyx_matmul")
