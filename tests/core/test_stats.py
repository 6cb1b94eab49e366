"""Statistics: exact values on hand-built matrices; CuPy and NumPy give the same numbers."""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from matplan.models import spmv as spmv_model
from matplan.core import device
from matplan.core import compression as C, features as stats
from matplan.core.validation import normalize


def csr_from_lengths(lengths, n=None, rng=None):
    rng = rng or np.random.default_rng(0)
    lengths = np.asarray(lengths)
    n = n or max(int(lengths.max(initial=1)), 1)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate([rng.choice(n, L, replace=False) for L in lengths]) if lengths.sum() else np.zeros(0, int)
    return sp.csr_matrix((rng.random(indptr[-1]) + 0.5, indices, indptr), shape=(len(lengths), n))


def features(A, B):
    return stats.compute(normalize(A, B), device.known("H100"))


def test_row_moments_and_T():
    A = csr_from_lengths([0, 2, 4, 6, 8], n=10)
    f = features(A, np.ones(10))
    L = np.array([0, 2, 4, 6, 8])
    assert (f.m, f.n, f.nnz, f.row_min, f.row_max, f.empty_rows) == (5, 10, 20, 0, 8, 1)
    assert f.row_mean == pytest.approx(L.mean()) and f.row_std == pytest.approx(L.std())
    assert f.T == round(L.mean() + L.std()) == 7
    assert f.density == pytest.approx(20 / 50)


def test_warp_lengths_hand_built():
    # 64 rows: warp 0 holds one row of 40 (others 1), warp 1 all 2: before = (40+2)/2 = 21.
    # Sorted: warp 0 = [40, 2 x 31] -> 40, warp 1 = [2 x 1, 1 x 31] -> 2: after = 21 too.
    L = np.array([40] + [1] * 31 + [2] * 32)
    f = features(csr_from_lengths(L, n=64), np.ones(64))
    assert (f.warp_len_before, f.warp_len_after) == (21.0, 21.0)
    # 64 rows alternating 30 / 1: before 30 + 30, after 30 + 1.
    L = np.array([30, 1] * 32)
    before, after = spmv_model.warp_lengths(L)
    assert (before, after) == (30.0, 15.5)


def test_products_per_row_and_groups():
    rng = np.random.default_rng(1)
    A = csr_from_lengths([3, 0, 1, 5], n=6, rng=rng)
    B = csr_from_lengths([1, 2, 3, 40, 5, 300], n=400, rng=rng)
    rowct = stats.products_per_row(A, B)
    expected = [sum(B.indptr[j + 1] - B.indptr[j] for j in A.indices[A.indptr[i]:A.indptr[i + 1]]) for i in range(4)]
    np.testing.assert_array_equal(rowct, expected)
    f = features(A, B)
    assert f.products == sum(expected)
    assert f.rowct_var_over_mean == pytest.approx(np.var(expected) / np.mean(expected))
    alpha = np.array(expected) / math.pi
    hist = np.histogram(alpha, bins=[0, 32, 64, 128, 256, 512, np.inf])[0]
    assert f.rbs_groups == tuple(hist)


def exact_compression(A, B):
    products = stats.products_per_row(A, B).sum()    # duplicates count: abs() sums them in place
    C = (abs(A) @ abs(B)).tocsr()          # no cancellation: the structure of A·B
    C.sum_duplicates()
    return products / C.nnz


def test_sampled_compression_is_exact_on_uniform_rows():
    # 40 dense 8 x 8 blocks: every row has 64 products over 8 distinct columns
    A = sp.block_diag([np.ones((8, 8))] * 40, format="csr")
    assert exact_compression(A, A) == 8.0
    assert features(A, A).compression == 8.0


def test_sampled_compression_estimates_random_and_messy(rng):
    from conftest import messy_csr
    for A, B in ((sp.random(3000, 2000, density=0.004, format="csr", random_state=rng),
                  sp.random(2000, 1500, density=0.01, format="csr", random_state=rng)),
                 (messy_csr(rng, 2000, 400), sp.random(400, 300, density=0.05, format="csr", random_state=rng))):
        est = C.sampled_compression(A, B, stats.products_per_row(A, B))
        assert est == pytest.approx(exact_compression(A, B), rel=0.1)


def test_sampled_compression_extrapolates_rows_over_the_cap(rng, monkeypatch):
    # rows of ~40 x 100 products over 3000 columns: past a cap of 512 products each row is
    # subsampled and its distinct count extrapolated by the occupancy model
    A = sp.random(200, 1000, density=0.04, format="csr", random_state=rng)
    B = sp.random(1000, 3000, density=0.033, format="csr", random_state=rng)
    exact = exact_compression(A, B)
    monkeypatch.setattr(C, "COMPRESSION_ROW_CAP", 512)
    est = C.sampled_compression(A, B, stats.products_per_row(A, B))
    assert est == pytest.approx(exact, rel=0.1)


def test_occupancy_extrapolation():
    # all examined: exact; 1000 draws that found 500 columns -> N ~ 628, p = 10^6 -> all of N
    d = C._occupancy_extrapolate([10, 500, 1000], [10, 1000, 1000], [10, 10**6, 10**6], 10**9)
    assert d[0] == 10 and d[1] == pytest.approx(628, rel=0.01)
    assert d[2] == pytest.approx(10**6, rel=1e-3)    # no repeats seen: about as many columns as products
    assert C._occupancy_extrapolate([7], [10], [100], 7)[0] == 7   # at most the columns of B


def test_compression_without_products():
    A = sp.csr_matrix((5, 4))
    assert features(A, sp.random(4, 3, density=0.5, format="csr")).compression == 1.0
    A = sp.random(5, 4, density=0.5, format="csr")
    assert features(A, sp.csr_matrix((4, 3))).compression == 1.0
    assert features(sp.csr_matrix((0, 4)), sp.csr_matrix((4, 3))).compression == 0.0


def test_col_spread_banded_random_and_sampled(rng, monkeypatch):
    n = 4000
    banded = sp.diags([np.ones(n - abs(d)) for d in (-2, 0, 2)], [-2, 0, 2], format="csr")
    assert stats.col_spread(banded) < 1e-3
    uniform = sp.random(n, n, density=0.005, format="csr", random_state=rng)
    assert stats.col_spread(uniform) == pytest.approx(1 / 3, abs=0.02)
    # every nonzero in the last column of the first row's block: |j/n - i/m| known exactly
    corner = sp.csr_matrix((np.ones(3), [n - 1] * 3, [0, 3] + [3] * (n - 1)), shape=(n, n))
    assert stats.col_spread(corner) == pytest.approx((n - 1) / n - 0.5 / n)
    monkeypatch.setattr(stats, "SPREAD_SAMPLES", 97)       # fewer samples than nonzeros
    assert stats.col_spread(uniform) == pytest.approx(1 / 3, abs=0.08)
    assert stats.col_spread(sp.csr_matrix((5, 4))) == 0.0
    assert features(uniform, np.ones(n)).col_spread == pytest.approx(stats.col_spread(uniform))


def test_empty_and_degenerate():
    f = features(sp.csr_matrix((0, 0)), np.zeros(0))
    assert (f.m, f.nnz) == (0, 0)
    f = features(sp.csr_matrix((7, 3)), np.zeros(3))
    assert (f.nnz, f.empty_rows, f.row_max, f.warp_ratio) == (0, 7, 0, 1.0)


def test_dense_features():
    rng = np.random.default_rng(2)
    f = features(np.asfortranarray(rng.random((256, 256))), rng.random((256, 4)))
    assert f.op == "tsgemm" and f.layout == "F" and f.k == 4
    assert f.t2threshold == pytest.approx(device.known("H100").t2threshold(np.float64))


def test_features_roundtrip():
    A = csr_from_lengths([1, 2, 3], n=4)
    f = features(A, A.T.tocsr())
    assert stats.Features.from_dict(f.to_dict()) == f


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gpu_statistics_match_numpy(cp, rng, index_dtype):
    import cupyx.scipy.sparse as csp
    from conftest import messy_csr
    A = messy_csr(rng, 3000, 500)
    A.indices = A.indices.astype(index_dtype)
    A.indptr = A.indptr.astype(index_dtype)
    B = sp.random(500, 400, density=0.02, format="csr", random_state=rng)
    host = features(A, B)
    gpu = features(csp.csr_matrix(A), csp.csr_matrix(B))
    hd, gd = host.to_dict(), gpu.to_dict()
    assert gd.pop("backend") == "gpu" and hd.pop("backend") == "cpu"
    # cupyx keeps int32 indices whatever the host matrix used; the figures must still agree
    gd.pop("index_dtype"), hd.pop("index_dtype")
    for key, value in hd.items():
        if isinstance(value, float):
            assert gd[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert gd[key] == value, key
