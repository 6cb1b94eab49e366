"""GPU SpMV/SpMM kernels against SciPy (float64) on fresh random inputs; BRCP bitwise reproducibility.

Outputs are poisoned with NaN before each run so unwritten elements show.
"""
import types

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import csr_edge_cases, random_csr
from matplan import plan
from matplan.kernels import get

pytestmark = pytest.mark.gpu

CONFIGS = ([("spmv.csr_scalar", {})]
           + [("spmv.csr_vector", {"W": w}) for w in (2, 4, 8, 16, 32)]
           + [("spmv.ellr", {"sorted": s}) for s in (False, True)]
           + [("spmv.brc", {"long_factor": 64})]
           + [("spmv.brcp", {"long_factor": lf}) for lf in (64, 8192)]
           + [("spmv.brcp", {"T": 3, "long_factor": 8192})]          # many rows spanning blocks
           + [("spmv.csr_merge", {})]
           + [("spmv.csr_split", {"W": w}) for w in (2, 8, 32)]
           + [("spmv.csr_spmm", {"S": s}) for s in (1, 2, 4, 8)])
KS = (1, 2, 7, 64)


def powerlaw(rng, m, n, a=1.7, cap=None, huge=None):
    L = np.minimum(rng.zipf(a, m), cap or n)
    if huge:
        L[m // 3] = huge
    indptr = np.concatenate([[0], np.cumsum(L)])
    data = (rng.random(indptr[-1]) + 0.5) * rng.choice([-1.0, 1.0], indptr[-1])
    return sp.csr_matrix((data, rng.integers(0, n, indptr[-1]), indptr), shape=(m, n))


def cases(rng):
    yield from csr_edge_cases(rng)
    yield "one-row-holds-most", powerlaw(rng, 500, 3000, cap=3, huge=20000)
    yield "powerlaw", powerlaw(rng, 3000, 3000, cap=2500)
    # 3000 empty rows first: merge-path tiles made only of row ends (no nonzeros)
    yield "empty-run", sp.vstack([sp.csr_matrix((3000, 50)), random_csr(rng, 200, 50, 0.1)], format="csr")


def to_gpu(cp, A, dtype, index_dtype):
    """A CSR on the GPU with exactly these dtypes (a plain namespace keeps int64 indices)."""
    return types.SimpleNamespace(indptr=cp.asarray(A.indptr.astype(index_dtype)),
                                 indices=cp.asarray(A.indices.astype(index_dtype)),
                                 data=cp.asarray(A.data.astype(dtype)), shape=A.shape)


def check(Y, A, X, dtype, what):
    ref = A.astype(np.float64) @ X.astype(np.float64)
    scale = abs(A).astype(np.float64) @ np.abs(X.astype(np.float64))
    tol = 1e-12 if dtype == np.float64 else 2e-6
    assert not np.isnan(Y).any(), f"{what}: unwritten (NaN) outputs"
    bad = np.abs(Y - ref) > tol * (scale + 1e-30)
    assert not bad.any(), f"{what}: {bad.sum()} wrong, max err {np.abs(Y - ref).max():.3g}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("name,params", CONFIGS, ids=lambda c: str(c))
def test_kernel_matches_scipy(cp, rng, name, params, dtype, index_dtype):
    kernel = get(name)
    for label, A in cases(rng):
        A = A.astype(dtype)
        p = kernel.prepare(to_gpu(cp, A, dtype, index_dtype), dict(params))
        for k in KS:
            X = rng.standard_normal((A.shape[1], k)).astype(dtype)
            Xg = cp.asarray(X[:, 0] if k == 1 else X)
            out = cp.full((A.shape[0],) if k == 1 else (A.shape[0], k), np.nan, dtype=dtype)
            Y = kernel.run(p, Xg, out=out)
            assert Y is out
            Y = cp.asnumpy(Y).reshape(A.shape[0], k)
            check(Y, A, X, dtype, f"{name}{params} {label} {np.dtype(dtype)} {np.dtype(index_dtype)} k={k}")
        Y2 = cp.asnumpy(kernel.run(p, cp.asarray(X)))                  # out=None path
        check(Y2.reshape(A.shape[0], X.shape[1]), A, X, dtype, f"{name} {label} out=None")


@pytest.mark.parametrize("blocks_per_sm", [0, 16])
def test_merge_spmm_columns_per_block(cp, rng, monkeypatch, blocks_per_sm):
    """csr_merge blocks computing several columns (kc = k, and kc not dividing k), deterministic."""
    from matplan.kernels.spmv import gpu as spmv
    monkeypatch.setattr(spmv, "MERGE_BLOCKS_PER_SM", blocks_per_sm)
    kernel = get("spmv.csr_merge")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    for label, A in list(cases(rng)) + [("large-powerlaw", powerlaw(rng, 60_000, 5000, cap=4000, huge=50_000))]:
        for dtype in (np.float32, np.float64):
            A = A.astype(dtype)
            p = kernel.prepare(to_gpu(cp, A, dtype, np.int64), {})
            for k in (2, 7, 64):
                kc = spmv.merge_columns(p.meta["ntiles"], k, sms)
                assert blocks_per_sm or kc == k or p.meta["ntiles"] == 0
                X = rng.standard_normal((A.shape[1], k)).astype(dtype)
                out = cp.full((A.shape[0], k), np.nan, dtype=dtype)
                first = cp.asnumpy(kernel.run(p, cp.asarray(X), out=out))
                check(first, A, X, dtype, f"csr_merge kc={kc} {label} {np.dtype(dtype)} k={k}")
                again = cp.asnumpy(kernel.run(p, cp.asarray(X)))
                assert np.array_equal(first, again, equal_nan=True), f"csr_merge kc={kc} {label}: runs differ"


def test_split_long_rows_at_the_limit_and_bitwise_reproducible(cp, rng):
    """csr_split: rows of exactly limit and limit + 1 nonzeros (group vs chunks), a row of many
    chunks and one of exactly SPLIT_CHUNK; 20 runs give bitwise-identical y (the row tickets only
    grow), and so do runs on two streams at once."""
    from matplan.kernels.spmv import formats as fmt
    kernel = get("spmv.csr_split")
    w = 4
    limit = fmt.split_limit(w)
    lengths = rng.integers(0, 6, 5000)
    lengths[[10, 11, 12, 13]] = [limit, limit + 1, fmt.SPLIT_CHUNK, 9 * fmt.SPLIT_CHUNK + 17]
    n = 40_000
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    data = (rng.random(indptr[-1]) + 0.5) * rng.choice([-1.0, 1.0], indptr[-1])
    # distinct columns in each row (7919 is prime to n): SciPy would sum duplicates, changing the lengths
    pos = np.arange(indptr[-1]) - np.repeat(indptr[:-1], lengths)
    cols = (np.repeat(rng.integers(0, n, 5000), lengths) + 7919 * pos) % n
    A = sp.csr_matrix((data, cols, indptr), shape=(5000, n))
    assert np.diff(A.astype(np.float32).indptr)[10:14].tolist() == lengths[10:14].tolist()
    for dtype in (np.float32, np.float64):
        Ad = A.astype(dtype)
        p = kernel.prepare(to_gpu(cp, Ad, dtype, np.int32), {"W": w})
        assert cp.asnumpy(p.arrays["fix_rows"]).tolist() == [11, 12, 13]
        assert int(p.meta["nchunks"]) == 1 + 1 + 10
        x = rng.standard_normal(n).astype(dtype)
        xg = cp.asarray(x)
        first = cp.asnumpy(kernel.run(p, xg, out=cp.full(5000, np.nan, dtype=dtype)))
        check(first.reshape(-1, 1), Ad, x.reshape(-1, 1), dtype, f"csr_split limit rows {np.dtype(dtype)}")
        for _ in range(20):
            assert np.array_equal(cp.asnumpy(kernel.run(p, xg)), first), "csr_split: runs differ"
        # two streams in flight at once: each has its own chunk sums and tickets
        streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
        outs = []
        for _ in range(5):
            for st in streams:
                with st:
                    outs.append(kernel.run(p, xg))
        for st in streams:
            st.synchronize()
        assert all(np.array_equal(cp.asnumpy(o), first) for o in outs), "csr_split: streams interfere"
        assert len(p.meta["scratch"]) == 3            # the default stream's and the two streams'


def test_cupyx_input_and_bad_arguments(cp, rng):
    import cupyx.scipy.sparse as csp
    A = random_csr(rng, 200, 100, 0.05)
    Ag = csp.csr_matrix(A)
    for name, params in CONFIGS:
        kernel = get(name)
        p = kernel.prepare(Ag, dict(params))
        x = rng.standard_normal(100)
        np.testing.assert_allclose(cp.asnumpy(kernel.run(p, cp.asarray(x))), A @ x, rtol=1e-12, atol=1e-12)
        with pytest.raises(ValueError, match="B"):
            kernel.run(p, cp.ones(99))
        with pytest.raises(TypeError, match="B"):
            kernel.run(p, cp.ones(100, dtype=cp.float32))
        with pytest.raises(ValueError, match="out"):
            kernel.run(p, cp.ones(100), out=cp.empty(5))


def _longdouble_reference(A, x):
    """Row sums in long double (80-bit on x86), from float64 products."""
    prod = A.data.astype(np.longdouble) * x.astype(np.longdouble)[A.indices]
    c = np.concatenate([[0], np.cumsum(prod)])
    return c[A.indptr[1:]] - c[A.indptr[:-1]]


def test_brcp_bitwise_reproducible_and_error_table(cp, rng, capsys):
    """100 runs on a power-law matrix give bitwise-identical y; errors vs a long-double reference."""
    A = powerlaw(rng, 100_000, 100_000, a=1.8, cap=10_000, huge=400_000)
    A.data = rng.random(A.nnz)                        # positive weights, as in PageRank
    x = rng.random(A.shape[1])
    Ag = to_gpu(cp, A, np.float64, np.int32)
    ref = _longdouble_reference(A, x)
    rows = []
    for name, params in [("spmv.brcp", {"long_factor": 64}), ("spmv.brcp", {"T": 32, "long_factor": 8192}),
                         ("spmv.brc", {"long_factor": 64}), ("spmv.csr_vector", {"W": 32}),
                         ("spmv.csr_merge", {})]:
        kernel = get(name)
        p = kernel.prepare(Ag, dict(params))
        xg = cp.asarray(x)
        first = kernel.run(p, xg).copy()
        differing = sum(not bool(cp.array_equal(kernel.run(p, xg), first)) for _ in range(99))
        y = cp.asnumpy(first).astype(np.longdouble)
        rel = float(np.linalg.norm((y - ref).astype(np.float64)) / np.linalg.norm(ref.astype(np.float64)))
        worst = float(np.max(np.abs(y - ref) / np.maximum(np.abs(ref), 1e-300)))
        rows.append((name, params, differing, rel, worst))
        if kernel.deterministic:
            assert differing == 0, f"{name}{params}: {differing} of 99 runs differ from the first"
    with capsys.disabled():
        print("\nBRCP vs BRC error (power-law 100k rows, one row of 400k nonzeros, float64):")
        print(f"  {'kernel':<34} {'runs != run 1':>13} {'||y-ref||/||ref||':>18} {'max row rel err':>16}")
        for name, params, differing, rel, worst in rows:
            print(f"  {name + str(params):<34} {differing:>13} {rel:>18.3e} {worst:>16.3e}")


def test_planner_on_gpu(cp, rng):
    import cupyx.scipy.sparse as csp
    A = powerlaw(rng, 20_000, 20_000, cap=5000)
    Ag, x = csp.csr_matrix(A), rng.standard_normal(20_000)
    xg = cp.asarray(x)
    for det in (False, True):
        pl = plan(Ag, xg, reuse=100, deterministic=det)
        assert pl.backend == "gpu"
        if det:
            assert get(pl.kernel).deterministic
        np.testing.assert_allclose(cp.asnumpy(pl.run(Ag, xg)), A @ x, rtol=1e-10, atol=1e-10)
        bound = pl.bind(Ag)
        np.testing.assert_allclose(cp.asnumpy(bound(xg)), A @ x, rtol=1e-10, atol=1e-10)
    X = rng.standard_normal((20_000, 7))
    pl = plan(Ag, cp.asarray(X), reuse=10)
    np.testing.assert_allclose(cp.asnumpy(pl.run(Ag, cp.asarray(X))), A @ X, rtol=1e-10, atol=1e-10)


def test_int64_indices_past_2_31_nonzeros(cp, rng):
    """A CSR with 2^31 + 2^20 nonzeros (int64 indptr/indices, ~26 GB): CSR kernels stay exact.

    Row r holds columns (r*L .. r*L+L-1) mod n with n a multiple of L, so y[r] is a difference of
    a float64 prefix sum of x: an exact reference without a second 2^31-entry product.
    """
    L, n = 1024, 1 << 22
    nnz = (1 << 31) + (1 << 20)
    m = nnz // L
    free = cp.cuda.runtime.memGetInfo()[0]
    if free < 40e9:
        pytest.skip(f"needs ~40 GB of free GPU memory, {free / 1e9:.0f} GB free")
    indptr = cp.arange(m + 1, dtype=cp.int64) * L
    indices = cp.arange(nnz, dtype=cp.int64)
    indices %= n
    data = cp.ones(nnz, dtype=cp.float32)
    A = types.SimpleNamespace(indptr=indptr, indices=indices, data=data, shape=(m, n))
    x = cp.asarray(rng.random(n).astype(np.float32))
    csum = cp.concatenate([cp.zeros(1), cp.cumsum(x.astype(cp.float64))])
    start = (cp.arange(m, dtype=cp.int64) * L) % n
    ref = csum[start + L] - csum[start]
    for name, params in [("spmv.csr_vector", {"W": 32}), ("spmv.csr_scalar", {}), ("spmv.csr_merge", {})]:
        kernel = get(name)
        y = kernel.run(kernel.prepare(A, params), x, out=cp.full(m, np.nan, dtype=cp.float32))
        err = float(cp.abs(y.astype(cp.float64) - ref).max())
        assert not bool(cp.isnan(y).any()), f"{name}: unwritten rows"
        assert err <= 1e-4 * L, f"{name}: max error {err:.3g} on {nnz:,} nonzeros"
        del y
    import cupyx.scipy.sparse as csp
    Ac = csp.csr_matrix((data, indices, indptr), shape=(m, n))   # CuPy >= 14.1 keeps int64 indices
    if Ac.indptr.dtype == cp.int64:                               # the planner's path, end to end
        pl = plan(Ac, x)
        y = pl.run(Ac, x)
        err = float(cp.abs(y.astype(cp.float64) - ref).max())
        assert err <= 1e-4 * L, f"plan ({pl.kernel}): max error {err:.3g}"
    del A, Ac, indices, data, indptr
    cp.get_default_memory_pool().free_all_blocks()
