"""GPU tests of SpGEMM row panels: spgemm(out='host') and spgemm_panels against SciPy (float64).

Small matrices are forced into many panels; real and generated products past 2^31 nonzeros or
2^32 products are checked by row sums on every row and entry by entry on ~200 sampled rows.
"""
import time

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import random_csr
import matplan.kernels.spgemm as spgemm
from matplan.kernels.spgemm import panels as panels_mod
from spgemm_gpu_helpers import _check_canonical, _dev

pytestmark = pytest.mark.gpu
INT32_MAX = 2 ** 31 - 1


@pytest.fixture
def hs(cp):
    """The spgemm package, after poisoning the memory pool with NaN so unwritten entries show."""
    junk = cp.full(1 << 26, np.nan)
    del junk
    return spgemm


def _pattern(A, B):
    A64, B64 = sp.csr_matrix(A, dtype=np.float64), sp.csr_matrix(B, dtype=np.float64)
    P = (abs(A64).astype(bool).astype(np.float64) @ abs(B64).astype(bool).astype(np.float64)).tocsr()
    P.sort_indices()
    return P


def _assert_same(C, A, B, dtype, rows=None):
    """Host CSR C (or rows ``rows`` of A @ B) == SciPy's float64 product, pattern exactly."""
    A64, B64 = sp.csr_matrix(A, dtype=np.float64), sp.csr_matrix(B, dtype=np.float64)
    if rows is not None:
        A64 = A64[rows]
    ref = (A64 @ B64).tocsr()
    ref.sum_duplicates()
    pat = _pattern(A64, B64)
    assert C.shape == ref.shape and C.dtype == np.dtype(dtype)
    _check_canonical(C)
    assert np.array_equal(C.indptr, pat.indptr) and np.array_equal(C.indices, pat.indices)
    scale = max((abs(A64) @ abs(B64)).max(), 1.0) if ref.nnz else 1.0
    tol = (1e-5 if np.dtype(dtype) == np.float32 else 1e-12) * scale
    diff = sp.csr_matrix(C, dtype=np.float64) - ref
    assert diff.nnz == 0 or abs(diff.data).max() <= tol


def _operands(rng, dtype):
    """600 x 400 times 400 x 500 with empty rows: every 9th row and the run 100..259."""
    A = random_csr(rng, 600, 400, 0.03).tolil()
    A[::9, :] = 0
    A[100:260, :] = 0
    A = A.tocsr().astype(dtype)
    return A, random_csr(rng, 400, 500, 0.02).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_many_panels_host_and_generator(cp, hs, rng, dtype):
    A, B = _operands(rng, dtype)
    nnz_c = _pattern(A, B).nnz
    limit = nnz_c // 17 + 1
    info = {}
    C = hs.spgemm(_dev(cp, A, dtype), _dev(cp, B, dtype), out="host", max_panel_nnz=limit, info=info)
    assert isinstance(C, sp.csr_matrix) and info["panels"] >= 17 and info["nnz_c"] == nnz_c
    _assert_same(C, A, B, dtype)

    ginfo = {}
    panels = hs.spgemm_panels(_dev(cp, A, dtype), _dev(cp, B, dtype), max_panel_nnz=limit, info=ginfo)
    assert ginfo["panels"] == info["panels"]          # known before the first panel is built
    stop = 0
    for r0, r1, P in panels:
        assert r0 == stop and r1 > r0 and P.shape == (r1 - r0, 500)
        assert P.indptr.dtype == cp.int32 and int(P.indptr[0]) == 0 and P.nnz <= limit
        _assert_same(P.get(), A, B, dtype, rows=np.arange(r0, r1))
        stop = r1
        del P
    assert stop == 600 and ginfo["global_rows_numeric"] == info["global_rows_numeric"]


def test_byte_budget_cuts_inside_an_empty_run(cp, hs, rng):
    """max_panel_bytes below the 160 empty rows 100..259 (PANEL_ROW_BYTES each): boundaries inside."""
    A, B = _operands(rng, np.float64)
    pat = _pattern(A, B)
    budget = 40 * panels_mod.PANEL_ROW_BYTES
    budget += int(panels_mod.panel_bytes(np.diff(pat.indptr).max(), 0, 8))
    expected = panels_mod.panel_bounds(pat.indptr, INT32_MAX, budget, 8)
    assert budget < 160 * panels_mod.PANEL_ROW_BYTES and any(100 < b < 260 for b in expected)
    info = {}
    C = hs.spgemm(_dev(cp, A), _dev(cp, B), out="host", max_panel_bytes=budget, info=info)
    assert info["panel_bounds"] == expected.tolist()
    _assert_same(C, A, B, np.float64)
    U = hs.spgemm(_dev(cp, A), _dev(cp, B), out="host", max_panel_bytes=budget, sort=False)
    U.sort_indices()                                   # unsorted rows: the same entries
    _assert_same(U, A, B, np.float64)
    got = [(r0, r1, P.get()) for r0, r1, P in hs.spgemm_panels(_dev(cp, A), _dev(cp, B), max_panel_bytes=budget)]
    assert [r0 for r0, _, _ in got] + [600] == expected.tolist()
    _assert_same(sp.vstack([P for _, _, P in got], format="csr"), A, B, np.float64)


def test_one_panel_by_default_and_small_cases(cp, hs, rng):
    A = random_csr(rng, 300, 300, 0.02)
    C = hs.spgemm(_dev(cp, A), _dev(cp, A)).get()
    info = {}
    got = list(hs.spgemm_panels(_dev(cp, A), _dev(cp, A), info=info))
    assert info["panels"] == 1 and len(got) == 1 and got[0][:2] == (0, 300)
    P = got[0][2].get()
    assert np.array_equal(P.indptr, C.indptr) and np.array_equal(P.indices, C.indices)
    H = hs.spgemm(_dev(cp, A), _dev(cp, A), out="host")
    assert np.array_equal(H.indptr, C.indptr) and abs(H - C).max() <= 1e-12 * abs(C).max()
    # no rows, no product: out='host' gives an empty SciPy CSR; the generator yields nothing / one
    assert hs.spgemm(_dev(cp, sp.csr_matrix((0, 5))), _dev(cp, sp.csr_matrix((5, 4))), out="host").shape == (0, 4)
    assert list(hs.spgemm_panels(_dev(cp, sp.csr_matrix((0, 5))), _dev(cp, sp.csr_matrix((5, 4))))) == []
    E = hs.spgemm(_dev(cp, sp.csr_matrix((7, 5))), _dev(cp, sp.csr_matrix((5, 4))), out="host")
    assert E.shape == (7, 4) and E.nnz == 0
    with pytest.raises(ValueError, match="row .* alone has"):
        hs.spgemm(_dev(cp, A), _dev(cp, A), out="host", max_panel_nnz=1)


def test_drop_zeros_and_unsorted_in_panels(cp, hs):
    A = sp.csr_matrix(np.array([[1.0, 1.0, 0.0], [2.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    B = sp.csr_matrix(np.array([[1.0, 3.0], [-1.0, 0.0], [0.0, 1.0]]))
    ref = (A @ B).toarray()
    H = hs.spgemm(_dev(cp, A), _dev(cp, B), out="host", max_panel_nnz=2, drop_zeros=True)
    assert H.nnz == 4 and np.array_equal(H.toarray(), ref)
    K = hs.spgemm(_dev(cp, A), _dev(cp, B), out="host", max_panel_nnz=2)
    assert K.nnz == 6 and np.array_equal(K.toarray(), ref)          # cancelled C[0,0], C[3,0] stay
    parts = [P.get() for _, _, P in hs.spgemm_panels(_dev(cp, A), _dev(cp, B), max_panel_nnz=2,
                                                      drop_zeros=True)]
    assert len(parts) == 3 and sum(P.nnz for P in parts) == 4
    assert np.array_equal(sp.vstack(parts).toarray(), ref)
    unsorted = [P.get() for _, _, P in hs.spgemm_panels(_dev(cp, A), _dev(cp, B), max_panel_nnz=2, sort=False)]
    assert len(unsorted) == 3 and sum(P.nnz for P in unsorted) == 6
    assert np.array_equal(sp.vstack(unsorted).toarray(), ref)


def test_int64_indices_are_read_as_int32(cp, hs, rng):
    """CuPy >= 14.1 keeps int64 index arrays; the kernels read int32: spgemm copies them down."""
    A = random_csr(rng, 400, 300, 0.03)
    dA = _dev(cp, A)
    dA.indices, dA.indptr = dA.indices.astype(cp.int64), dA.indptr.astype(cp.int64)
    dB = _dev(cp, A.T)
    dB.indptr = dB.indptr.astype(cp.int64)
    _assert_same(hs.spgemm(dA, dB).get(), A, A.T, np.float64)
    _assert_same(hs.spgemm(dA, dB, out="host", max_panel_nnz=500), A, A.T, np.float64)


# ----------------------------------------------------------------------------- large products
def _real(name):
    from matplan.corpus import load_npz_matrix, matrices_dir
    d = matrices_dir()
    if d is None or not (d / f"{name}.npz").is_file():
        pytest.skip(f"real matrix {name} not found (set MATPLAN_MATRICES)")
    return load_npz_matrix(d / f"{name}.npz")


def _sample_rows(A, B, bounds, rng, n=200):
    """~n random rows, the row with the most products and the rows on both sides of every boundary."""
    products = A @ np.diff(B.indptr).astype(np.float64)
    edges = np.concatenate([bounds[1:-1] - 1, bounds[1:-1]]) if len(bounds) > 2 else np.zeros(0, int)
    rows = np.concatenate([rng.choice(A.shape[0], n, replace=False), [np.argmax(products)], edges])
    return np.unique(rows.astype(np.int64))


#: nonzeros a cuSPARSE row-sum call takes at most: its SpMV fails (CUSPARSE_STATUS_INTERNAL_ERROR)
#: on panels near 2^31 nonzeros, which a GPU of 141 GB holds
ROW_SUM_NNZ = 1 << 30


def _row_sums(cp, P):
    """P @ 1 on the host, by cuSPARSE over runs of rows of at most ROW_SUM_NNZ nonzeros (views)."""
    import cupyx.scipy.sparse as csp
    indptr = P.indptr.get().astype(np.int64)
    ones = cp.ones(P.shape[1], dtype=P.dtype)
    sums, r = [], 0
    while r < P.shape[0]:
        e = max(r + 1, int(np.searchsorted(indptr, indptr[r] + ROW_SUM_NNZ, side="right")) - 1)
        e = min(e, P.shape[0])
        s0, s1 = int(indptr[r]), int(indptr[e])
        part = csp.csr_matrix((P.data[s0:s1], P.indices[s0:s1], P.indptr[r:e + 1] - s0), shape=(e - r, P.shape[1]))
        sums.append((part @ ones).get())
        r = e
    return np.concatenate(sums) if sums else np.zeros(0)


def _check_panel(cp, P, r0, A, B, rowsum, sample):
    """Panel P = C[r0:r0 + rows] on the GPU: row sums (C @ 1 against A @ (B @ 1)) for every row,
    columns in range, and the sampled rows entry by entry against SciPy's A[rows] @ B."""
    r1 = r0 + P.shape[0]
    assert P.indptr.dtype == cp.int32 and int(P.indptr[0]) == 0 and P.shape[1] == B.shape[1]
    if P.nnz:
        assert int(P.indices.min()) >= 0 and int(P.indices.max()) < B.shape[1]
    got = _row_sums(cp, P)
    np.testing.assert_allclose(got, rowsum[r0:r1], rtol=1e-10, atol=0)   # NaN (unwritten) fails
    rows = sample[(sample >= r0) & (sample < r1)]
    if rows.size == 0:
        return 0
    ref = (A[rows] @ B).tocsr()
    ref.sort_indices()
    local = cp.asarray(rows - r0)
    indptr = P.indptr[local].get(), P.indptr[local + 1].get()
    for i, (s, e) in enumerate(zip(*indptr)):
        lo, hi = ref.indptr[i], ref.indptr[i + 1]
        assert np.array_equal(P.indices[int(s):int(e)].get(), ref.indices[lo:hi]), f"row {rows[i]}"
        np.testing.assert_allclose(P.data[int(s):int(e)].get(), ref.data[lo:hi], rtol=1e-12, atol=0)
    return rows.size


def _stream_and_check(cp, hs, A, B, rng, min_panels=1, **kw):
    """spgemm_panels(A, B) checked panel by panel, each freed before the next is built."""
    rowsum = A @ (B @ np.ones(B.shape[1]))
    info = {}
    t0 = time.perf_counter()
    panels = hs.spgemm_panels(_dev(cp, A), _dev(cp, B), info=info, **kw)
    sample = _sample_rows(A, B, np.asarray(info["panel_bounds"]), rng)
    stop, checked, kernel_s = 0, 0, 0.0
    t1 = time.perf_counter()
    for r0, r1, P in panels:
        cp.cuda.get_current_stream().synchronize()
        kernel_s += time.perf_counter() - t1
        assert r0 == stop and P.nnz <= INT32_MAX
        checked += _check_panel(cp, P, r0, A, B, rowsum, sample)
        stop = r1
        del P
        t1 = time.perf_counter()
    assert stop == A.shape[0] and info["panels"] >= min_panels and checked >= 200
    print(f"\n{info['products']:,} products, C {info['nnz_c']:,} nonzeros in {info['panels']} panels "
          f"({info['panel_why']}); symbolic {info['host_ms']['analysis'] + info['host_ms']['symbolic']:.0f} ms "
          f"host, panels built in {kernel_s * 1e3:.0f} ms, total with checks {time.perf_counter() - t0:.1f} s")
    return info


def test_gene_go_a_at(cp, hs, rng):
    A = _real("gene_go_bp_ancestors")
    B = A.T.tocsr()
    info = _stream_and_check(cp, hs, A, B, rng)                     # fits: one panel
    assert info["products"] > 2 ** 32 and info["panels"] == 1 and info["nnz_c"] == 357_323_409
    _stream_and_check(cp, hs, A, B, rng, min_panels=6, max_panel_nnz=60_000_000)


def test_rmat_scale19_past_2_32_products(cp, hs, rng):
    from matplan.corpus import rmat
    A = rmat(19, 16, seed=0)
    products = int(np.diff(A.indptr)[A.indices].astype(np.int64).sum())
    assert products > 2 ** 32
    info = _stream_and_check(cp, hs, A, A, rng)
    assert info["products"] == products


def test_wordnet_a_at_streams_past_the_gpu(cp, hs, rng):
    """C has 8,756,141,395 nonzeros (~105 GB in float64): more than the GPU holds, past int32."""
    A = _real("wordnet_gloss_doc_term")
    B = A.T.tocsr()
    dA, dB = _dev(cp, A), _dev(cp, B)
    with pytest.raises(OverflowError, match="2\\^31 - 1.*out='host'.*spgemm_panels"):
        hs.spgemm(dA, dB)
    need = 8_756_141_395 * 16
    if need > panels_mod.HOST_MEM_FRACTION * panels_mod.host_available_bytes():
        with pytest.raises(MemoryError, match="8,756,141,395 nonzeros.*host memory.*spgemm_panels"):
            hs.spgemm(dA, dB, out="host")
    del dA, dB
    info = _stream_and_check(cp, hs, A, B, rng, min_panels=5)
    assert info["nnz_c"] == 8_756_141_395
