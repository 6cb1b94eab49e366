"""GPU tests of the segmented-merge SpTRANS (matplan.kernels.sptrans) against SciPy float64."""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import messy_csr, random_csr
from test_sptrans import _same_as_scipy

pytestmark = pytest.mark.gpu


@pytest.fixture
def st(cp):
    from matplan.kernels import sptrans
    junk = cp.full(1 << 26, np.nan)   # poison the pool: slots the kernels miss show as NaN / garbage
    junk2 = cp.full(1 << 25, -1, dtype=cp.int32)
    del junk, junk2
    return sptrans


def _dev(cp, M, dtype=np.float64):
    import cupyx.scipy.sparse as csp
    M = sp.csr_matrix(M)
    return csp.csr_matrix((cp.asarray(M.data.astype(dtype)), cp.asarray(M.indices), cp.asarray(M.indptr)),
                          shape=M.shape)


def _check(cp, st, A, dtype=np.float64):
    A = sp.csr_matrix(A)
    T = st.transpose(_dev(cp, A, dtype)).get()
    assert np.all(np.isfinite(T.data))
    _same_as_scipy(A.astype(dtype), T)
    return T


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,density", [((1000, 800), 0.01), ((3000, 50), 0.2), ((50, 3000), 0.2),
                                           ((20000, 20000), 0.0005), ((1, 5000), 0.5), ((5000, 1), 0.5)])
def test_random(cp, st, rng, dtype, shape, density):
    _check(cp, st, random_csr(rng, *shape, density), dtype)


def test_long_columns_many_tiles(cp, st, rng):
    """Dense columns of 40k rows span ~20 tiles of 2048: several cross_merge rounds."""
    m, n = 40000, 300
    A = random_csr(rng, m, n, 0.01)
    cols = np.array([0, 7, 299])
    dense = sp.csr_matrix((np.ones(m * 3), (np.repeat(np.arange(m), 3), np.tile(cols, m))), shape=(m, n))
    _check(cp, st, A + 2 * dense)


def test_matches_cupy_transpose_large(cp, st, rng):
    """R-MAT scale 15 (~0.5M nonzeros, power-law columns): equal to cupyx A.T.tocsr() entry for entry."""
    from matplan import corpus
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


def test_messy(cp, st, rng):
    for m, n in ((300, 200), (5, 3000), (1, 700), (4000, 3)):
        _check(cp, st, messy_csr(rng, m, n))


def test_empty_rows_cols_and_degenerate(cp, st, rng):
    import cupyx.scipy.sparse as csp
    for shape in ((0, 0), (0, 5), (5, 0), (4, 6)):
        T = st.transpose(csp.csr_matrix(shape, dtype=np.float64))
        assert T.shape == shape[::-1] and T.nnz == 0
    A = sp.csr_matrix((np.ones(3), ([0, 0, 0], [99999, 0, 50000])), shape=(3, 100000))
    _check(cp, st, A)


def test_int64_indices_converted(cp, st, rng):
    import cupyx.scipy.sparse as csp
    A = random_csr(rng, 500, 400, 0.02)
    Ad = _dev(cp, A)
    try:
        Ad64 = csp.csr_matrix((Ad.data, Ad.indices.astype(cp.int64), Ad.indptr.astype(cp.int64)), shape=A.shape)
    except Exception:
        pytest.skip("this cupyx does not hold int64 indices")
    _same_as_scipy(A, st.transpose(Ad64).get())


def test_errors(cp, st, rng):
    import cupyx.scipy.sparse as csp
    A = _dev(cp, random_csr(rng, 20, 30, 0.2))
    with pytest.raises(TypeError, match="A:"):
        st.transpose(A.tocsc())
    with pytest.raises(TypeError, match="A: dtype"):
        st.transpose(csp.csr_matrix(A.astype(cp.complex128)))
    bad = A.copy()
    bad.indices[0] = 30
    with pytest.raises(ValueError, match="A.indices"):
        st.transpose(bad, check=True)
    st.transpose(bad)   # unchecked: no fault, result unspecified
    cp.cuda.Device().synchronize()


def test_no_host_sync_in_launch_path(cp, st, rng):
    """transpose only enqueues work: it returns while a long kernel queued ahead still runs (the
    result is wrapped by cupyx's _from_parts, which does not read the arrays back)."""
    A = _dev(cp, random_csr(rng, 2000, 2000, 0.01))
    st.transpose(A)
    cp.cuda.Device().synchronize()
    spin = cp.RawKernel(r'''extern "C" __global__ void spin(long long c){
        long long t = clock64(); while (clock64() - t < c) {} }''', "spin")
    spin((1,), (1,), (np.int64(2_000_000_000),))  # ~1 s
    done = cp.cuda.Event()
    done.record()
    T = st.transpose(A)
    assert not done.done, "transpose waited for the GPU"
    cp.cuda.Device().synchronize()
    _same_as_scipy(A.get(), T.get())


def test_phase_by_phase_launches_agree(cp, st, rng):
    """The profiling path (one launch a phase) gives the fused launches' result bit for bit."""
    A = _dev(cp, random_csr(rng, 30000, 20000, 0.002) + sp.csr_matrix(
        (np.ones(30000), (np.arange(30000), np.full(30000, 5))), shape=(30000, 20000)))
    names = []
    T1 = st._transpose(A, False, names.append)
    T2 = st.transpose(A)
    assert tuple(names) == st.PHASES
    for a, b in ((T1.indptr, T2.indptr), (T1.indices, T2.indices), (T1.data, T2.data)):
        assert cp.array_equal(a, b)
    _same_as_scipy(A.get(), T1.get())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_more_tiles_than_blocks_and_long_column(cp, st, rng, dtype):
    """~1.8M nonzeros: more tiles than resident blocks (grid-stride loops in every phase) and a
    200k-entry column over ~100 tiles (7 cross-merge rounds, grid barrier between rounds)."""
    m, n = 200_000, 50_000
    A = random_csr(rng, m, n, 8 / n) + sp.csr_matrix((np.ones(m), (np.arange(m), np.full(m, 7))), shape=(m, n))
    _check(cp, st, A, dtype)
