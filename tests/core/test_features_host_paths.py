"""The host's fast statistics give the general formulas' numbers bit for bit.

On the host, sparse_features, col_spread, warp_lengths, products_per_row, spgemm_features and
rbsparse_histogram take shortcuts (exact integer sums instead of float reductions, a histogram
instead of a sort, reused buffers, chunked running sums, sampled rows counted from each row's
first sample, integer group thresholds, a sort or a bitmap by the keys' count). The planner's choices
and the learned model's inputs depend on these numbers, so each is compared here with the
plain NumPy formula it replaces (the one the GPU path still computes), with ==, not approx.
"""
import numpy as np
import pytest
import scipy.sparse as sp

from matplan.core import compression as C, features as stats


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
    for nnz, m in ((65_536, 6_000), (65_537, 6_000), (150_000, 2_000), (150_000, 120_000), (150_000, 140_000),
                   (300_000, 30_000)):
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
    assert np.array_equal(C._occupancy_extrapolate(d, [5, 12, 1], [5, 12, 1], 100), d)
    est = C._occupancy_extrapolate(np.array([3.0, 50.0]), [5, 60], [5, 600], 1000)
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
    monkeypatch.setattr(C, "BITMAP_CELLS", cells)
    monkeypatch.setattr(C, "BITMAP_CELLS_PER_KEY", 1 << 26)   # the cell bound alone decides
    got = []
    for fam in ("rmat", "banded", "block_dense", "skewed"):
        A = sp.csr_matrix(corpus.load(fam, "small", seed=0))
        got.append(C.sampled_compression(A, A, stats.products_per_row(A, A)))
    monkeypatch.setattr(C, "BITMAP_CELLS", 1 << 26 if cells == 0 else 0)
    for fam, g in zip(("rmat", "banded", "block_dense", "skewed"), got):
        A = sp.csr_matrix(corpus.load(fam, "small", seed=0))
        assert C.sampled_compression(A, A, stats.products_per_row(A, A)) == g, fam


def test_expand_by_repetition_matches_the_search():
    lengths = np.array([0, 3, 0, 0, 5, 1, 0], dtype=np.int64)
    seg, off = C._expand(lengths, np)
    ends = np.cumsum(lengths)
    idx = np.arange(ends[-1])
    ref_seg = np.searchsorted(ends, idx, side="right")
    assert (seg == ref_seg).all() and (off == idx - (ends[ref_seg] - lengths[ref_seg])).all()
    seg, off = C._expand(np.zeros(0, dtype=np.int64), np)
    assert seg.size == 0 and off.size == 0


def test_rows_of_matches_the_search():
    """The sampled positions' rows counted from each row's first sample (the products s * step
    recomputed, no search) equal searchsorted's, for rows fewer and more than the samples, empty
    rows, rows of one nonzero, one long row, and the rows-searched fallback past
    ROWS_PER_SAMPLE_SEARCHED rows a sample; col_spread's (row + 0.5) / m repeated row by row
    (rows at most half the samples) is checked by the tests of whole statistics here."""
    rng = np.random.default_rng(9)
    for m, nnz, S in ((10, 1000, 97), (5000, 100_000, 4096), (90_000, 1_000_000, 65_536),
                      (300, 301, 300), (64, 70_000, 65_536), (200_000, 250_000, 65_536)):
        for shape in ("uniform", "skewed", "one long row"):
            if shape == "uniform":
                cuts = np.sort(rng.integers(0, nnz + 1, m - 1))
            elif shape == "skewed":
                cuts = np.sort(np.minimum(rng.zipf(1.3, m - 1), nnz))
            else:
                cuts = np.full(m - 1, nnz // 2)
            for dtype in (np.int32, np.int64):
                indptr = np.concatenate([[0], cuts, [nnz]]).astype(dtype)
                step = (nnz - 1) / (S - 1)
                pos = (np.arange(S, dtype=np.float64) * step).astype(np.int64)
                pos[-1] = nnz - 1
                assert np.array_equal(pos, np.linspace(0, nnz - 1, S).astype(np.int64))
                want = np.searchsorted(indptr, pos, side="right") - 1
                first = stats._first_samples(indptr, m, nnz, step, S)
                assert (first is None) == (m > stats.ROWS_PER_SAMPLE_SEARCHED * S)
                assert np.array_equal(stats._rows_of(indptr, pos, first, S), want), (m, nnz, S, shape)
                if first is not None:   # each row's first sample: the samples below its start
                    assert np.array_equal(first, np.searchsorted(pos, indptr, side="left"))


def test_rbs_histogram_by_integer_thresholds():
    """The host's groups by integer thresholds equal the float division and search, at and
    around every group's least count, for empty input, int32 and int64 counts."""
    from matplan.core.features import RBS_COMPRESSION, rbsparse_group_ids
    edges = np.array(stats._rbs_thresholds())
    bounds = np.array(stats.RBS_GROUP_BOUNDS[1:], dtype=np.float64)
    assert np.all(edges.astype(np.float64) / RBS_COMPRESSION >= bounds)          # each reaches its bound
    assert np.all((edges - 1).astype(np.float64) / RBS_COMPRESSION < bounds)     # ... and is the least
    near = np.concatenate([edges + d for d in (-2, -1, 0, 1, 2)])
    rng = np.random.default_rng(4)
    for counts in (near, np.arange(3000), rng.integers(0, 10 ** 12, 5000), np.zeros(7, np.int64),
                   rng.integers(0, 2000, 9999).astype(np.int32)):
        want = tuple(int(c) for c in np.bincount(rbsparse_group_ids(counts), minlength=6))
        assert stats.rbsparse_histogram(counts) == want
        assert stats._host_rbs_histogram(counts) == want
    negative = np.array([-5, 0, 200])   # not counts: the general path
    assert stats.rbsparse_histogram(negative) == tuple(
        int(c) for c in np.bincount(rbsparse_group_ids(negative), minlength=6))


def reference_compute(problem, dev, monkeypatch):
    """Features of ``problem`` by the general formulas (reference_sparse, reference_products, the
    float group search, the compression's sort, a full column count)."""
    from matplan.core.features import rbsparse_group_ids
    A, B, op = problem.A, problem.B, problem.op
    m, n = A.shape
    nnz = int(A.indptr[-1]) if m else 0
    want = dict(m=m, n=n, nnz=nnz)
    if op == "sptrans":
        if nnz and n:
            want.update(row_mean=nnz / m, row_max=int(np.diff(A.indptr).max()),
                        col_max=int(np.bincount(A.indices[:nnz], minlength=n).max()))
        return want
    if m:
        want.update(reference_sparse(A))
    if op == "spgemm" and m:
        rowct = reference_products(A, B)
        rf = rowct.astype(np.float64)
        monkeypatch.setattr(C, "BITMAP_CELLS", 0)   # the sort, not the bitmap
        want.update(products=int(round(float(rf.sum()))), rowct_max=int(rf.max()), rowct_mean=float(rf.mean()),
                    rowct_var_over_mean=float(rf.var()) / float(rf.mean()) if rf.mean() > 0 else 0.0,
                    rbs_groups=tuple(int(c) for c in np.bincount(rbsparse_group_ids(rowct), minlength=6)),
                    compression=C.sampled_compression(A, B, rowct))
        monkeypatch.undo()
    return want


def problems_of_each_op():
    rng = np.random.default_rng(12)
    mats = dict(matrices())
    mats["empty"] = sp.csr_matrix((0, 7))
    mats["no nonzeros"] = sp.csr_matrix((30, 20))
    m = 4000
    cols = rng.integers(0, m, 90_000)   # unsorted, with duplicates, int64 indices, empty rows
    indptr = np.concatenate([[0], np.sort(rng.integers(0, 90_000, m - 1)), [90_000]])
    messy = sp.csr_matrix((np.ones(90_000), cols, indptr), shape=(m, m))
    messy.indices, messy.indptr = messy.indices.astype(np.int64), messy.indptr.astype(np.int64)
    mats["unsorted, duplicates, int64"] = messy
    for name, A in mats.items():
        for op in ("spmv", "spmm", "spgemm", "sptrans"):
            if op == "spgemm" and A.nnz > 200_000:
                continue
            yield f"{op}: {name}", op, A


@pytest.mark.parametrize("case", list(problems_of_each_op()), ids=lambda c: c[0])
def test_compute_of_each_op_matches_general_formulas(case, monkeypatch):
    """features.compute on host operands, field by field, against the general formulas."""
    from matplan.core import device as device_mod
    from matplan.core.validation import check_structure, normalize, normalize_transpose
    _, op, A = case
    n = A.shape[1]
    B = {"spmv": np.ones(n), "spmm": np.ones((n, 3)), "spgemm": A.T.tocsr() if A.shape[0] != n else A}.get(op)
    problem = normalize_transpose(A) if op == "sptrans" else normalize(A, B)
    check_structure(problem)
    dev = device_mod.known("H100")
    got = stats.compute(problem, dev).to_dict()
    want = reference_compute(problem, dev, monkeypatch)
    if "rbs_groups" in want:
        want["rbs_groups"] = list(want["rbs_groups"])
    assert {k: got[k] for k in want} == want
