"""The host's fast statistics give the general formulas' numbers bit for bit.

On the host, sparse_features, col_spread, warp_lengths, products_per_row and spgemm_features
take shortcuts (exact integer sums instead of float reductions, a histogram instead of a sort,
reused buffers, chunked running sums, a row search from the other side). The planner's choices
and the learned model's inputs depend on these numbers, so each is compared here with the
plain NumPy formula it replaces (the one the GPU path still computes), with ==, not approx.
"""
import numpy as np
import pytest
import scipy.sparse as sp

from matplan.core import features as stats


def reference_sparse(A):
    """The general formulas: float64 reductions, a sort, linspace + searchsorted."""
    m, n = A.shape
    nnz = int(A.indptr[-1])
    lengths = np.diff(A.indptr).astype(np.int64)
    lf = lengths.astype(np.float64)
    pad = (-m) % stats.WARP
    padded = np.concatenate([lengths, np.zeros(pad, np.int64)])
    before = float(padded.reshape(-1, stats.WARP).max(axis=1).mean())
    after = float(np.sort(padded)[::-1].reshape(-1, stats.WARP).max(axis=1).mean())
    if nnz and n:
        pos = np.linspace(0, nnz - 1, min(nnz, stats.SPREAD_SAMPLES)).astype(np.int64)
        rows = np.searchsorted(A.indptr, pos, side="right") - 1
        cols = A.indices[pos].astype(np.float64)
        spread = float(np.abs(cols / n - (rows + 0.5) / m).mean())
    else:
        spread = 0.0
    return dict(row_mean=float(lf.mean()), row_std=float(lf.std()), row_min=int(lf.min()),
                row_max=int(lf.max()), empty_rows=int((lengths == 0).sum()),
                warp_len_before=before, warp_len_after=after, col_spread=spread)


def reference_products(A, B):
    b_len = np.diff(B.indptr).astype(np.int64)
    csum = np.concatenate([[0], np.cumsum(b_len[A.indices])])
    return csum[A.indptr[1:]] - csum[A.indptr[:-1]]


def matrices():
    rng = np.random.default_rng(7)
    out = {"identity": sp.identity(50, format="csr"), "one row": sp.csr_matrix(np.ones((1, 40))),
           "empty rows": sp.random(3000, 200, density=0.01, format="csr", random_state=1),
           "one long row": sp.csr_matrix((np.ones(9000), np.arange(9000), [0, 9000] + [9000] * 99),
                                         shape=(100, 9000))}
    for nnz, m in ((65_536, 6_000), (65_537, 6_000), (150_000, 2_000), (150_000, 120_000), (300_000, 30_000)):
        rows, cols = rng.integers(0, m, nnz), rng.integers(0, m, nnz)
        out[f"random {nnz} in {m} rows"] = sp.csr_matrix((np.ones(nnz), (rows, cols)), shape=(m, m))
    lengths = rng.zipf(1.7, 20_000).clip(0, 5_000)   # skewed rows, many short
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    out["skewed"] = sp.csr_matrix((np.ones(indptr[-1]), rng.integers(0, 20_000, indptr[-1]), indptr),
                                  shape=(20_000, 20_000))
    return out


@pytest.mark.parametrize("name", list(matrices()))
def test_sparse_features_match_general_formulas(name):
    A = matrices()[name]
    got = stats.sparse_features(A)
    want = reference_sparse(A)
    assert {k: got[k] for k in want} == want
    assert stats.col_spread(A) == want["col_spread"]
    assert stats.warp_lengths(np.diff(A.indptr)) == (want["warp_len_before"], want["warp_len_after"])


@pytest.mark.parametrize("name", ["empty rows", "random 65537 in 6000 rows", "skewed", "one long row"])
def test_spgemm_statistics_match_general_formulas(name):
    A = matrices()[name]
    B = A.T.tocsr() if A.shape[0] != A.shape[1] else A
    rowct = stats.products_per_row(A, B)
    want = reference_products(A, B)
    assert rowct.dtype == np.int64 and np.array_equal(rowct, want)
    got = stats.spgemm_features(A, B)
    rf = want.astype(np.float64)
    assert (got["products"], got["rowct_max"]) == (int(round(float(rf.sum()))), int(rf.max()))
    assert got["rowct_mean"] == float(rf.mean())
    assert got["rowct_var_over_mean"] == float(rf.var()) / float(rf.mean())


def test_products_per_row_across_chunk_edges(monkeypatch):
    """Row ends on, before and after chunk edges (chunks of 97 nonzeros), empty rows among them."""
    monkeypatch.setattr(stats, "SPREAD_SAMPLES", 97)
    rng = np.random.default_rng(3)
    lengths = rng.choice([0, 0, 1, 96, 97, 98, 194, 300], size=400)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    A = sp.csr_matrix((np.ones(indptr[-1]), rng.integers(0, 400, indptr[-1]), indptr), shape=(400, 400))
    assert np.array_equal(stats.products_per_row(A, A), reference_products(A, A))
    assert stats.col_spread(A) == reference_sparse(A)["col_spread"]   # 97 samples of many nonzeros


def test_warp_lengths_sort_fallback_and_histogram_agree():
    """A row far longer than the rows' count takes the sort; both give the same floats."""
    rng = np.random.default_rng(5)
    short = rng.integers(0, 40, 1000)
    long_row = np.concatenate([short, [10 ** 6]])
    for lengths in (short, long_row, np.zeros(33, np.int64), np.array([5])):
        padded = np.concatenate([lengths, np.zeros((-len(lengths)) % 32, np.int64)])
        want = (float(padded.reshape(-1, 32).max(axis=1).mean()),
                float(np.sort(padded)[::-1].reshape(-1, 32).max(axis=1).mean()))
        assert stats.warp_lengths(lengths) == want
        assert stats.warp_lengths(lengths, row_min=int(lengths.min()), row_max=int(lengths.max())) == want


def test_occupancy_all_examined_is_exact():
    d = np.array([3.0, 10.0, 1.0])
    assert np.array_equal(stats._occupancy_extrapolate(d, [5, 12, 1], [5, 12, 1], 100), d)
    est = stats._occupancy_extrapolate(np.array([3.0, 50.0]), [5, 60], [5, 600], 1000)
    assert est[0] == 3.0 and 50.0 < est[1] <= 600.0   # a subsampled row is extrapolated


def test_unchecked_indptr_not_from_zero():
    """An indptr starting past 0 (arrays a caller vouched for with check=False): the statistics
    still follow the general formulas."""
    import types
    A = types.SimpleNamespace(shape=(4, 5), indptr=np.array([2, 5, 5, 9, 12]), indices=np.arange(12) % 5)
    got = stats.sparse_features(A)
    want = reference_sparse(A)
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("cells", [0, 1 << 26])
def test_sampled_compression_bitmap_and_sort_agree(monkeypatch, cells):
    """The host's bitmap count of distinct columns and the sort give the same estimate."""
    from matplan import corpus
    monkeypatch.setattr(stats, "BITMAP_CELLS", cells)
    got = []
    for fam in ("rmat", "banded", "block_dense", "skewed"):
        A = sp.csr_matrix(corpus.load(fam, "small", seed=0))
        got.append(stats.sampled_compression(A, A, stats.products_per_row(A, A)))
    monkeypatch.setattr(stats, "BITMAP_CELLS", 1 << 26 if cells == 0 else 0)
    for fam, g in zip(("rmat", "banded", "block_dense", "skewed"), got):
        A = sp.csr_matrix(corpus.load(fam, "small", seed=0))
        assert stats.sampled_compression(A, A, stats.products_per_row(A, A)) == g, fam


def test_expand_by_repetition_matches_the_search():
    lengths = np.array([0, 3, 0, 0, 5, 1, 0], dtype=np.int64)
    seg, off = stats._expand(lengths, np)
    ends = np.cumsum(lengths)
    idx = np.arange(ends[-1])
    ref_seg = np.searchsorted(ends, idx, side="right")
    assert (seg == ref_seg).all() and (off == idx - (ends[ref_seg] - lengths[ref_seg])).all()
    seg, off = stats._expand(np.zeros(0, dtype=np.int64), np)
    assert seg.size == 0 and off.size == 0
