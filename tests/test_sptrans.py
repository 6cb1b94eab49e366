"""CPU tests of the segmented-merge SpTRANS: the NumPy port of sptrans.cu against SciPy.

The port runs the kernels' exact partitioning and rounds; tiny tiles (block 4, items 2) make
columns span many tiles, so the binary-tree rounds of the cross-merge phase run several times.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import sptrans_reference as ref
from conftest import messy_csr, random_csr

SMALL = dict(block=4, items=2)


def _same_as_scipy(A, T):
    """T == A.T exactly: pattern, order inside each row of T (stable by row, then position)."""
    A = sp.csr_matrix(A)
    m, n = A.shape
    assert T.shape == (n, m)
    rows = np.repeat(np.arange(m), np.diff(A.indptr))
    order = np.lexsort((np.arange(A.nnz), rows, A.indices))    # column, then row, then position
    np.testing.assert_array_equal(T.indptr, np.concatenate([[0], np.cumsum(np.bincount(A.indices, minlength=n))]))
    np.testing.assert_array_equal(T.indices, rows[order])
    np.testing.assert_array_equal(T.data, A.data[order])       # bitwise: values are only moved
    d = np.diff(T.indices.astype(np.int64))
    starts = np.zeros(T.nnz, bool)
    starts[T.indptr[:-1][T.indptr[:-1] < T.nnz]] = True
    assert np.all((d >= 0) | starts[1:]), "rows of A.T must be sorted by column"
    S = sp.csr_matrix(A, dtype=np.float64, copy=True)
    S.sum_duplicates()
    U = sp.csr_matrix(T, dtype=np.float64, copy=True)
    U.sum_duplicates()
    # duplicates summed in another order (SciPy sums A's, not A.T's): rounding differences only
    diff = abs(U - S.T.tocsr()).max() if S.nnz else 0.0
    assert diff <= 1e-13 * max(1.0, abs(A).sum())


@pytest.mark.parametrize("shape,density", [((60, 50), 0.1), ((7, 300), 0.2), ((300, 7), 0.3),
                                           ((1, 40), 0.5), ((40, 1), 0.5)])
@pytest.mark.parametrize("params", [SMALL, dict(block=8, items=4), dict(block=2, items=3)])
def test_random_small_tiles(rng, shape, density, params):
    A = random_csr(rng, *shape, density)
    _same_as_scipy(A, ref.transpose(A, rng, **params))


def test_default_tiles_match_kernel_constants(rng):
    """The GPU's constants (256 x 8 steps a tile): columns longer than a tile span several tiles."""
    m, n = 6000, 40
    A = random_csr(rng, m, n, 0.05)
    dense = sp.csr_matrix((np.ones(m), (np.arange(m), np.zeros(m, int))), shape=(m, n))
    A = sp.csr_matrix(A + 2 * dense)                       # column 0 holds 6000 entries: 3+ tiles
    info = {}
    T = ref.transpose(A, rng, info=info)
    _same_as_scipy(A, T)
    assert info["most_rounds"] >= 2


def test_long_column_many_rounds(rng):
    """One dense column over 40 tiny tiles: log2(q) rounds with odd run counts on the way."""
    m = 150
    A = sp.csr_matrix(random_csr(rng, m, 9, 0.2) + sp.csr_matrix(
        (np.full(m, 3.0), (np.arange(m), np.full(m, 4))), shape=(m, 9)))
    info = {}
    _same_as_scipy(A, ref.transpose(A, rng, info=info, **SMALL))
    assert info["most_rounds"] >= 5


def test_messy_duplicates_unsorted_long_row(rng):
    for m, n in ((30, 20), (5, 64), (1, 17), (50, 3)):
        A = messy_csr(rng, m, n)
        _same_as_scipy(A, ref.transpose(A, rng, **SMALL))


def test_empty_and_degenerate(rng):
    for shape in ((0, 0), (0, 5), (5, 0), (4, 6)):
        A = sp.csr_matrix(shape)
        T = ref.transpose(A, rng, **SMALL)
        assert T.shape == shape[::-1] and T.nnz == 0
        assert np.all(T.indptr == 0)
    A = sp.csr_matrix((np.ones(3), ([0, 0, 0], [999, 0, 500])), shape=(1, 1000))  # empty columns
    _same_as_scipy(A, ref.transpose(A, rng, **SMALL))


def test_atomic_order_does_not_matter():
    A = random_csr(np.random.default_rng(1), 80, 30, 0.2)
    outs = [ref.transpose(A, np.random.default_rng(s), **SMALL) for s in range(4)]
    for T in outs[1:]:
        np.testing.assert_array_equal(T.indices, outs[0].indices)
        np.testing.assert_array_equal(T.data, outs[0].data)


def test_out_of_range_column_flagged(rng):
    A = sp.csr_matrix((np.ones(2), np.array([0, 7]), np.array([0, 2])), shape=(1, 7), copy=False)
    A.indices[1] = 7
    with pytest.raises(ValueError, match="A.indices"):
        ref.transpose(A, rng, **SMALL)


def test_module_imports_without_cupy():
    from matplan.kernels import sptrans
    assert callable(sptrans.transpose)


def test_out_of_range_unchecked_stays_in_bounds(rng):
    """Skipped entries leave orphan slots; no kernel may index past its arrays (NumPy would raise)."""
    A = random_csr(rng, 40, 30, 0.2)
    A.indices[[0, 5, -1]] = [30, -2, 1000]
    T = ref.transpose(A, rng, check=False, **SMALL)
    assert T.indptr[-1] == A.nnz - 3
