"""GPU tests of SpTRANS (matplan.kernels.sptrans; the segsort default, the segmented merge and the
radix method)
against SciPy float64. The fixture poisons the memory pool (NaN values, -1 indices) so slots the
kernels miss show up."""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import int64_indices, messy_csr, random_csr
from test_sptrans import _same_as_scipy, as_dtype

from matplan import corpus, planner
from matplan.kernels.sptrans import gpu, launches
from matplan.kernels.sptrans.kernel import SpTrans
from matplan.models import sptrans as model

pytestmark = pytest.mark.gpu


@pytest.fixture
def st(cp):
    junk = cp.full(1 << 26, np.nan)   # poison the pool: slots the kernels miss show as NaN / garbage
    junk2 = cp.full(1 << 25, -1, dtype=cp.int32)
    del junk, junk2
    return gpu


def _dev(cp, M, dtype=np.float64):
    import cupyx.scipy.sparse as csp
    M = sp.csr_matrix(M)
    return csp.csr_matrix((cp.asarray(M.data.astype(dtype)), cp.asarray(M.indices), cp.asarray(M.indptr)),
                          shape=M.shape)


def _check(cp, st, A, dtype=np.float64, method="auto", bins=None):
    A = sp.csr_matrix(A)
    Ad = _dev(cp, A, dtype)
    if bins is None:
        T = st.transpose(Ad, method=method)
    else:
        T = st._transpose(Ad, False, None, method, bins)
    T = T.get()
    assert np.all(np.isfinite(T.data))
    _same_as_scipy(as_dtype(A, dtype), T)   # not A.astype: it sums duplicates
    return T


def _col_lengths(rng, m, lengths):
    """CSR (m rows) whose column j holds lengths[j] entries at random distinct rows."""
    rows = np.concatenate([rng.choice(m, size=L, replace=False) for L in lengths])
    cols = np.repeat(np.arange(len(lengths)), lengths)
    vals = (rng.random(rows.size) + 0.5) * rng.choice([-1.0, 1.0], rows.size)
    return sp.csr_matrix((vals, (rows, cols)), shape=(m, len(lengths)))


#: a length in every bin of the default segsort bins (32, 512, 4096) and at each edge
BIN_LENGTHS = [0, 1, 2, 3, 7, 16, 31, 32, 33, 34, 100, 255, 256, 257, 511, 512, 513, 1000, 2048, 4095,
               4096, 4097, 5000, 9000, 20000]


@pytest.mark.parametrize("method", ["auto", "segsort", "merge", "radix"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,density", [((1000, 800), 0.01), ((3000, 50), 0.2), ((50, 3000), 0.2),
                                           ((20000, 20000), 0.0005), ((1, 5000), 0.5), ((5000, 1), 0.5)])
def test_random(cp, st, rng, dtype, shape, density, method):
    _check(cp, st, random_csr(rng, *shape, density), dtype, method)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segsort_every_bin(cp, st, rng, dtype):
    """Rows of A.T in every length bin: thread (<= 32), warp (<= 512), block (<= 4096), fallback."""
    lengths = BIN_LENGTHS + list(rng.integers(0, 40, 300)) + list(rng.integers(33, 600, 40))
    rng.shuffle(lengths)
    _check(cp, st, _col_lengths(rng, 30000, lengths), dtype, method="segsort")


@pytest.mark.parametrize("bins", [(4, 16, 32), (1, 1, 32), (32, 32, 64), (8, 512, 128)])
def test_segsort_forced_fallback(cp, st, rng, bins):
    """Bins forced small: most rows of A.T go to the warp, block and chunk + merge-round fallback."""
    lengths = BIN_LENGTHS[:-3] + list(rng.integers(0, 300, 200))
    _check(cp, st, _col_lengths(rng, 6000, lengths), np.float64, method="segsort", bins=bins)
    _check(cp, st, messy_csr(rng, 400, 50), np.float32, method="segsort", bins=bins)


def test_segsort_one_very_long_column(cp, st, rng):
    """One row of A.T of 300k keys (chunks of 4096, 7 merge rounds by one block) among short ones."""
    m, n = 300_000, 1000
    A = random_csr(rng, m, n, 3 / n) + sp.csr_matrix((np.ones(m), (np.arange(m), np.full(m, 999))), shape=(m, n))
    _check(cp, st, A)


def test_segsort_crowded_warps(cp, st, rng):
    """Warps whose 32 columns hold more than 1024 keys (a long column among short ones): the short
    columns are sorted in place in global memory."""
    lengths = []
    for _ in range(50):
        lengths += [3, 2000, 5, 0, 1] + [2] * 27
    _check(cp, st, _col_lengths(rng, 5000, lengths))


def test_segsort_hot_columns_and_duplicates(cp, st, rng):
    """Every row of A holds columns 0, 5 and 1999 (hot rows of A.T, aggregated atomics), every 7th
    row column 5 twice more (duplicates kept, in A's order), rows left unsorted."""
    B = _hot_messy(rng, 50_000, 2000)
    assert not B.has_sorted_indices
    _check(cp, st, B)
    _check(cp, st, B, np.float32, "merge")


def _hot_messy(rng, m, n):
    r = [np.repeat(np.arange(m), 3), rng.integers(0, m, 4 * m), np.repeat(np.arange(0, m, 7), 2)]
    c = [np.tile([1999, 0, 5], m), rng.integers(0, n, 4 * m), np.full(r[2].size, 5)]
    r, c = np.concatenate(r), np.concatenate(c)
    v = (rng.random(r.size) + 0.5) * rng.choice([-1.0, 1.0], r.size)
    order = np.argsort(r, kind="stable")                  # rows in order, each row as listed
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=m))]).astype(np.int32)
    B = sp.csr_matrix((v[order], c[order].astype(np.int32), indptr), shape=(m, n))
    B.has_sorted_indices = False
    return B


@pytest.mark.parametrize("method", ["auto", "segsort", "merge", "radix"])
def test_long_columns_many_tiles(cp, st, rng, method):
    """Dense columns of 40k rows span ~20 tiles of 2048: several cross_merge rounds."""
    m, n = 40000, 300
    A = random_csr(rng, m, n, 0.01)
    cols = np.array([0, 7, 299])
    dense = sp.csr_matrix((np.ones(m * 3), (np.repeat(np.arange(m), 3), np.tile(cols, m))), shape=(m, n))
    _check(cp, st, A + 2 * dense, method=method)


def test_matches_cupy_transpose_large(cp, st, rng):
    """R-MAT scale 15 (~0.5M nonzeros, power-law columns): equal to cupyx A.T.tocsr() entry for entry."""
    A = corpus.rmat(scale=15, edge_factor=16, seed=int(rng.integers(1 << 30)))
    A = sp.csr_matrix(A, dtype=np.float64)
    A.data = (rng.random(A.nnz) + 0.5) * rng.choice([-1.0, 1.0], A.nnz)
    Ad = _dev(cp, A)
    T = st.transpose(Ad)
    V = Ad.T.tocsr()
    V.sort_indices()
    assert cp.array_equal(T.indptr, V.indptr) and cp.array_equal(T.indices, V.indices)
    assert cp.array_equal(T.data, V.data)
    _same_as_scipy(A, T.get())


@pytest.mark.parametrize("method", ["auto", "segsort", "merge", "radix"])
def test_messy(cp, st, rng, method):
    for m, n in ((300, 200), (5, 3000), (1, 700), (4000, 3), (20000, 2)):
        _check(cp, st, messy_csr(rng, m, n), method=method)


@pytest.mark.parametrize("method", ["auto", "segsort", "merge", "radix"])
def test_empty_rows_cols_and_degenerate(cp, st, rng, method):
    import cupyx.scipy.sparse as csp
    for shape in ((0, 0), (0, 5), (5, 0), (4, 6)):
        T = st.transpose(csp.csr_matrix(shape, dtype=np.float64), method=method)
        assert T.shape == shape[::-1] and T.nnz == 0
    A = sp.csr_matrix((np.ones(3), ([0, 0, 0], [99999, 0, 50000])), shape=(3, 100000))
    _check(cp, st, A, method=method)
    A = sp.csr_matrix((np.ones(2), ([0, 99998], [7, 7])), shape=(100000, 10))   # empty rows of A
    _check(cp, st, A, method=method)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_int64_indices_converted(cp, st, rng, dtype):
    A = random_csr(rng, 500, 400, 0.02) + _col_lengths(rng, 500, [0] * 399 + [450])
    Ad = _dev(cp, A, dtype)
    Ad64 = int64_indices(cp, Ad)
    _same_as_scipy(as_dtype(A, dtype), st.transpose(Ad64).get())
    _same_as_scipy(as_dtype(A, dtype), st.transpose(Ad64, method="merge").get())
    _same_as_scipy(as_dtype(A, dtype), st.transpose(Ad64, method="radix").get())
    _same_as_scipy(as_dtype(A, dtype), st.transpose(Ad64, method="segsort").get())


def test_errors(cp, st, rng):
    import cupyx.scipy.sparse as csp
    A = _dev(cp, random_csr(rng, 20, 30, 0.2))
    with pytest.raises(TypeError, match="A:"):
        st.transpose(A.tocsc())
    with pytest.raises(TypeError, match="A: dtype"):
        st.transpose(csp.csr_matrix(A.astype(cp.complex128)))
    with pytest.raises(ValueError, match="method"):
        st.transpose(A, method="bogus")
    bad = A.copy()
    bad.indices[0] = 30
    bad.indices[3] = -1
    for method in st.METHODS:
        with pytest.raises(ValueError, match="A.indices"):
            st.transpose(bad, check=True, method=method)
        st.transpose(bad, method=method)   # unchecked: no fault, result unspecified
        cp.cuda.Device().synchronize()
    T = st.transpose(A, check=True)        # a clean matrix passes the check
    _same_as_scipy(A.get(), T.get())


@pytest.mark.parametrize("method", ["auto", "segsort", "merge", "radix"])
def test_no_host_sync_in_launch_path(cp, st, rng, method):
    """transpose only enqueues work: it returns while a long kernel queued ahead still runs (the
    result is wrapped by cupyx's _from_parts, which does not read the arrays back)."""
    A = _dev(cp, random_csr(rng, 2000, 2000, 0.01))
    st.transpose(A, method=method)
    T = returns_before_the_gpu(cp, lambda: st.transpose(A, method=method))
    _same_as_scipy(A.get(), T.get())


def returns_before_the_gpu(cp, call):
    """call()'s result, asserting it returned while a ~1 s kernel queued ahead of it still ran (its
    launch path waited for nothing on the GPU); the GPU is synchronised after."""
    cp.cuda.Device().synchronize()
    spin = cp.RawKernel(r'''extern "C" __global__ void spin(long long c){
        long long t = clock64(); while (clock64() - t < c) {} }''', "spin")
    spin((1,), (1,), (np.int64(2_000_000_000),))  # ~1 s
    done = cp.cuda.Event()
    done.record()
    out = call()
    assert not done.done, "the call waited for the GPU"
    cp.cuda.Device().synchronize()
    return out


def test_phase_by_phase_launches_agree(cp, st, rng):
    """The profiling path (one launch a phase) gives the fused launches' result bit for bit."""
    A = _dev(cp, random_csr(rng, 30000, 20000, 0.002) + sp.csr_matrix(
        (np.ones(30000), (np.arange(30000), np.full(30000, 5))), shape=(30000, 20000)))
    names, merge_names = [], []
    T1 = st._transpose(A, False, names.append, "segsort")
    T2 = st.transpose(A)
    T3 = st._transpose(A, False, merge_names.append, "merge")
    T4 = st.transpose(A, method="merge")
    T5 = st.transpose(A, method="radix")
    assert tuple(names) == st.PHASES and tuple(merge_names) == st.MERGE_PHASES
    for T in (T2, T3, T4, T5):   # every method gives the one stable order
        for a, b in ((T1.indptr, T.indptr), (T1.indices, T.indices), (T1.data, T.data)):
            assert cp.array_equal(a, b)
    _same_as_scipy(A.get(), T1.get())


@pytest.mark.parametrize("method", ["auto", "segsort", "merge", "radix"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_more_tiles_than_blocks_and_long_column(cp, st, rng, dtype, method):
    """~1.8M nonzeros: more tiles than resident blocks (grid-stride loops in every phase) and a
    200k-entry column over ~100 tiles (7 cross-merge rounds, grid barrier between rounds)."""
    m, n = 200_000, 50_000
    A = random_csr(rng, m, n, 8 / n) + sp.csr_matrix((np.ones(m), (np.arange(m), np.full(m, 7))), shape=(m, n))
    _check(cp, st, A, dtype, method)


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("n", [1, 2, 255, 256, 257, 65536, 65537, 1 << 24])
def test_radix_pass_counts(cp, st, rng, monkeypatch, n, pack):
    """Column counts at the digit edges: 1, 2, 3 and 4 passes (n = 2^24 + 1 columns would be 4);
    the columns hit the largest index so every digit of the last pass is used. The keys between
    passes packed in one int (12 row bits here, where the column's fit beside them) and as int2."""
    monkeypatch.setattr(launches, "RADIX_PACK", pack)
    m = 3000
    packs = pack and model.radix_passes(n)[0] > 1 and 12 + max(1, (n - 1).bit_length()) <= 31
    assert bool(launches.radix_rowbits(m, n)) == packs
    A = random_csr(rng, m, n, min(1.0, 6 / n))
    edge = sp.csr_matrix((np.ones(3), ([0, 1, m - 1], [n - 1, 0, n - 1])), shape=(m, n))
    T = _check(cp, st, A + edge, method="radix")
    assert model.radix_passes(n)[0] == max(1, -(-max(1, (n - 1).bit_length()) // 8))
    assert T.shape == (n, m)


@pytest.mark.parametrize("m", [50, 3000])
def test_radix_four_passes(cp, st, rng, m):
    """n past 2^24 columns: four passes of 7 bits; 50 rows pack the keys between passes (6 + 25
    bits), 3000 do not (12 + 25 > 31: int2 keys)."""
    n = (1 << 24) + 5
    assert model.radix_passes(n) == (4, 7)
    assert launches.radix_rowbits(m, n) == (6 if m == 50 else 0)
    A = sp.csr_matrix((rng.random(4000) + 0.5, (rng.integers(0, m, 4000), rng.integers(0, n, 4000))),
                      shape=(m, n))
    _check(cp, st, A, method="radix")


@pytest.mark.parametrize("shape,nnz_per_col,expect", [((40000, 70000), 2, "segsort"), ((40000, 70000), 20, "radix"),
                                                     ((3000, 60000), 2, "radix"), ((3000, 70000), 2, "radix")])
def test_auto_on_either_side(cp, st, rng, shape, nnz_per_col, expect):
    """method='auto' picks by the shape (more than two radix passes, short mean columns and A not
    wide: the segsort) and gives SciPy's transpose on both sides."""
    m, n = shape
    A = random_csr(rng, m, n, nnz_per_col / m)
    assert model.auto_method(m, n, A.nnz) == expect
    _check(cp, st, A, method="auto")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_radix_long_rows_empty_rows_and_wide(cp, st, rng, dtype):
    """The radix method's first pass takes each tile's rows from spt_digits (tiles inside a row of
    100k entries, rows of one entry, runs of empty rows), and spt_bounds reads A.T's indptr off the
    sorted columns: a wide A whose columns come in clusters (runs of empty columns past a block),
    entries only in the first and last columns, a doc-term A (Zipf columns, 'auto' takes radix)."""
    lengths = np.concatenate([[0, 3, 100_000, 0, 0, 1], rng.integers(0, 3, 20_000), [0] * 5000, [40_000, 0]])
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    n = 70_000
    A = sp.csr_matrix((rng.random(indptr[-1]) + 0.5, rng.integers(0, n, indptr[-1]), indptr), shape=(lengths.size, n))
    _check(cp, st, A, dtype, "radix")
    m, n = 3000, 2_000_000
    cols = (rng.integers(0, 40, 30_000) * 50_000 + rng.integers(0, 30, 30_000))   # 40 clusters of 30 columns
    wide = sp.csr_matrix((rng.random(cols.size) + 0.5, (rng.integers(0, m, cols.size), cols)), shape=(m, n))
    _check(cp, st, wide, dtype, "radix")
    ends = sp.csr_matrix((np.ones(4), ([0, 5, 5, m - 1], [0, n - 1, 0, n - 1])), shape=(m, n))
    _check(cp, st, ends, dtype, "radix")
    doc = doc_term(5000, 400_000, 150_000, seed=int(rng.integers(1 << 30)))
    assert model.auto_method(*doc.shape, doc.nnz) == "radix"
    _check(cp, st, doc, dtype, "auto")


def test_radix_skips_bad_indices_and_keeps_the_rest(cp, st, rng):
    """Unchecked, the radix method drops entries whose column is outside [0, n) and transposes the
    rest exactly (spt_digits counts only the valid ones, which the later passes and spt_bounds
    read)."""
    A = sp.csr_matrix(random_csr(rng, 3000, 70_000, 0.001))
    A.data = rng.random(A.nnz) + 0.5                  # no zeros: eliminate_zeros drops only the bad
    keep, bad = A.copy(), _dev(cp, A)
    for i, col in ((0, 70_000), (17, -1), (A.nnz - 1, 1 << 30)):
        bad.indices[i] = col
        keep.data[i] = 0.0
    keep.eliminate_zeros()
    _same_as_scipy(keep, st.transpose(bad, method="radix").get())


def doc_term(m, n, nnz, seed):
    """benchmarks/sptrans.py's doc-term matrix: rows uniform, columns from a Zipf law."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, n + 1))
    cdf /= cdf[-1]
    cols = rng.permutation(n)[np.minimum(np.searchsorted(cdf, rng.random(2 * nnz)), n - 1)]
    keys = np.unique(rng.integers(0, m, 2 * nnz) * n + cols)[:nnz]
    return sp.csr_matrix((rng.random(keys.size) + 0.5, (keys // n, keys % n)), shape=(m, n))


@pytest.mark.parametrize("method", ["segsort", "radix"])
def test_indptr_owns_its_memory(cp, st, rng, method):
    """A.T's indptr is an allocation of its own: the returned matrix does not keep the call's
    workspace (the radix look-back words, the segsort's column lists) alive."""
    A = random_csr(rng, 3000, 70000, 0.002)
    T = st.transpose(_dev(cp, A), method=method)
    n = A.shape[1]
    assert T.indptr.base is None
    assert T.indptr.data.mem.size <= -(-(n + 1) * 4 // 512) * 512
    _same_as_scipy(A, T.get())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_plan_transpose_picks_by_the_longest_column(cp, st, rng, dtype):
    """planner.plan_transpose on the GPU: banded (3.4M entries, longest column 17) takes the
    segmented sort, where method="auto"'s rule from the shape takes the radix method (mean column
    17 >= RADIX_MEAN_COLUMN); a matrix with a hub column of 30,000 entries takes the radix method.
    plan.run(A) and the bound plan give exactly SciPy's A.T; the vendor path is a scored candidate,
    and deterministic=True rejects it."""
    n = 200_000
    banded = sp.diags([rng.random(n - abs(o)) + 0.5 for o in range(-8, 9)], list(range(-8, 9)),
                      shape=(n, n), format="csr")
    hub = random_csr(rng, 60_000, 40_000, 2e-4)
    hub = sp.csr_matrix(hub + sp.csr_matrix((np.ones(30_000), (np.arange(30_000), np.zeros(30_000, int))),
                                            shape=hub.shape))
    for A, method in ((banded, "segsort"), (hub, "radix")):
        Ad = _dev(cp, A, dtype)
        p = planner.plan_transpose(Ad)
        assert (p.op, p.kernel, p.params) == ("sptrans", "sptrans.transpose", {"method": method}), str(p)
        assert p.features.col_max == np.bincount(A.indices, minlength=A.shape[1]).max()
        assert any("longest column" in r for r in p.reasons)
        scored = {c.kernel: c for c in p.candidates}
        assert scored["sptrans.cusparse"].source != "rejected"
        for T in (p.run(Ad), p.bind(Ad)()):
            _same_as_scipy(as_dtype(A, dtype), T.get())
        strict = planner.plan_transpose(Ad, deterministic=True)
        assert {c.kernel: c.source for c in strict.candidates}["sptrans.cusparse"] == "rejected"
    assert model.auto_method(n, n, banded.nnz) == "radix"   # the shape rule's miss the planner avoids


@pytest.mark.parametrize("case", ["messy", "float32", "empty", "int64"])
def test_plan_transpose_vendor_and_merge_candidates_run(cp, st, rng, case):
    """Every GPU candidate of a SpTRANS plan runs and matches SciPy when the plan is restricted to
    it (kernels=...): messy input (duplicates, unsorted rows, a long row, empty rows), float32, an
    empty matrix and int64 indices."""
    dtype = np.float32 if case == "float32" else np.float64
    A = sp.csr_matrix((40, 30)) if case == "empty" else as_dtype(messy_csr(rng, 500, 300), dtype)
    Ad = _dev(cp, A, dtype)
    if case == "int64":
        Ad = int64_indices(cp, Ad)
    for kernel in ("sptrans.cusparse", "sptrans.transpose"):
        p = planner.plan_transpose(Ad, kernels=[kernel], measure="never")
        assert p.kernel == kernel and p.features.nnz == A.nnz
        T = p.run(Ad).get()
        assert T.dtype == dtype and T.shape == (A.shape[1], A.shape[0])
        if kernel == "sptrans.cusparse":   # cuSPARSE's order among duplicates is its own: compare sums
            assert T.has_sorted_indices   # SciPy computes the flag: rows sorted by column
            S, U = A.copy(), T.copy()   # copies: sum_duplicates works in place
            S.sum_duplicates()
            U.sum_duplicates()
            tol = 4 * np.finfo(dtype).eps * np.abs(A.data).sum()   # sums in another order; abs(A) would sum A in place
            assert abs(U - S.T.tocsr()).max() <= tol
        else:
            _same_as_scipy(A, T)
    merge = SpTrans().run(SpTrans().prepare(Ad, {"method": "merge"}), None)
    _same_as_scipy(A, merge.get())
