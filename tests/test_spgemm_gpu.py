"""GPU tests of the RBSparse hash SpGEMM and the sort-based SpTRANS against SciPy (float64)."""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import int64_indices, messy_csr, random_csr

pytestmark = pytest.mark.gpu


@pytest.fixture
def hs(cp, monkeypatch):
    from matplan.kernels.spgemm import gpu as spgemm
    # poison the memory pool so entries the kernels fail to write show up as NaN / garbage
    junk = cp.full(1 << 26, np.nan)
    del junk
    # no guessed analyses: these tests change the module's settings between calls of the same
    # operands, which a kept analysis would not see (test_spgemm_guess_gpu.py tests the guesses)
    spgemm.forget_guesses()
    monkeypatch.setattr(spgemm, "GUESS_CACHE_SIZE", 0)
    return spgemm


@pytest.fixture(params=["slabs", "segments", "segments-walk"])
def global_path(request, hs, monkeypatch):
    """The global path a test takes: numeric by column segments in shared memory (forced however
    few rows there are), symbolic by bitmaps in shared memory; or numeric by dense slabs and
    symbolic by bitmaps in global memory (segments and shared bitmaps off). Segments read only
    their part of each sorted B row (rows of at least 32 A nonzeros and 32 products a nonzero a
    segment), or ("segments-walk") walk all of a row's products. The other rows take symbolic tables whatever their size
    (test_symbolic_bitmap_rows has the bitmaps for them)."""
    segments = request.param.startswith("segments")
    monkeypatch.setattr(hs, "GLOBAL_SEG_B_ROWS", request.param == "segments")
    monkeypatch.setattr(hs, "SYMBOLIC_GLOBAL_SHARED", segments)
    monkeypatch.setattr(hs, "SYMBOLIC_BITMAP_RATIO", float("inf"))   # symbolic tables, which overflow
    monkeypatch.setattr(hs, "GLOBAL_SEG_MIN_BLOCKS_PER_SM", 0.0 if segments else float("inf"))
    monkeypatch.setattr(hs, "GLOBAL_SEG_MAX_SEGMENTS", 1 << 30)   # many segments a row: the look-back's chains
    return request.param


def _check_global_path(info, global_path, b_sorted=None):
    """The global rows went the fixture's way (segments: over B's rows where ``b_sorted``, by the
    walk where it is False; None: either)."""
    assert info["global_rows_numeric"] > 0
    assert ("global_segments" in info) == global_path.startswith("segments")
    if global_path == "segments-walk" or (global_path == "segments" and b_sorted is False):
        assert info["global_segment_walk"] == "products"
    elif global_path == "segments" and b_sorted:
        assert info["global_segment_walk"] == "B rows"


def _dev(cp, M, dtype=np.float64):
    """M on the GPU as it is: duplicates and order kept (SciPy's astype would sum duplicates)."""
    import cupyx.scipy.sparse as csp
    M = sp.csr_matrix(M)
    return csp.csr_matrix((cp.asarray(M.data.astype(dtype)), cp.asarray(M.indices), cp.asarray(M.indptr)),
                          shape=M.shape)


def _check_canonical(C):
    """Every row's columns strictly increasing, all in range, values finite."""
    assert np.all(np.isfinite(C.data))
    assert C.indices.size == 0 or (C.indices.min() >= 0 and C.indices.max() < C.shape[1])
    d = np.diff(C.indices.astype(np.int64))
    row_start = np.zeros(C.indices.size, bool)
    row_start[C.indptr[1:-1][C.indptr[1:-1] < C.indices.size]] = True
    assert np.all((d > 0) | row_start[1:])


def _check(cp, hs, A, B, dtype=np.float64, sort=True, **kw):
    """C from the GPU == SciPy's float64 product; C's pattern is the symbolic product's. Unless
    the caller names ``passes`` or another output form, both paths run: passes='two' (its C and
    info are returned) and the default 'auto' (the one-pass path where the rows' bounds allow)."""
    info = {}
    both = "passes" not in kw and kw.get("out", "device") == "device"
    C = _check_one(cp, hs, A, B, dtype, sort, info, **(dict(kw, passes="two") if both else kw))
    if both:
        auto = {}
        _check_one(cp, hs, A, B, dtype, sort, auto, **kw)
        assert auto["nnz_c"] == info["nnz_c"]
    return C, info


def _check_one(cp, hs, A, B, dtype, sort, info, **kw):
    C = hs.spgemm(_dev(cp, A, dtype), _dev(cp, B, dtype), sort=sort, info=info, **kw).get()
    A64, B64 = sp.csr_matrix(A, dtype=np.float64), sp.csr_matrix(B, dtype=np.float64)
    ref = (A64 @ B64).tocsr()
    ref.sum_duplicates()
    assert C.shape == ref.shape and C.dtype == np.dtype(dtype)
    if sort:
        _check_canonical(C)
    pattern = (abs(A64).astype(bool).astype(np.float64) @ abs(B64).astype(bool).astype(np.float64))
    assert C.nnz == pattern.nnz, "C must store exactly the symbolic product's pattern"
    scale = (abs(A64) @ abs(B64)).max() if ref.nnz else 1.0
    tol = (1e-5 if np.dtype(dtype) == np.float32 else 1e-12) * max(scale, 1.0)
    Cs = sp.csr_matrix(C, dtype=np.float64)
    Cs.sum_duplicates()
    assert Cs.nnz == C.nnz, "no duplicate columns in a row"
    diff = (Cs - ref)
    assert diff.nnz == 0 or abs(diff.data).max() <= tol
    return C


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_random_square(cp, hs, rng, dtype):
    A = random_csr(rng, 700, 700, 0.02)
    C, info = _check(cp, hs, A, A, dtype)
    assert info["products"] == int(np.diff(A.indptr)[A.indices].sum())


def test_different_shapes_empty_rows_and_columns(cp, hs, rng):
    A = random_csr(rng, 300, 200, 0.05).tolil()
    A[::7, :] = 0          # empty rows of A
    A[:, 5:20] = 0         # A's empty columns make B's rows 5..19 unused
    B = random_csr(rng, 200, 900, 0.01).tolil()
    B[:, 100:400] = 0      # empty columns of C
    _check(cp, hs, A.tocsr(), B.tocsr())
    _check(cp, hs, sp.csr_matrix((0, 200)), B.tocsr())          # no rows
    _check(cp, hs, A.tocsr(), sp.csr_matrix((200, 0)))          # no columns
    _check(cp, hs, sp.csr_matrix((50, 60)), sp.csr_matrix((60, 70)))  # all empty


def test_duplicate_and_unsorted_indices(cp, hs, rng):
    A = messy_csr(rng, 400, 300)       # duplicates, unsorted, empty rows, one row of 900 entries
    B = messy_csr(rng, 300, 500)
    assert not A.has_canonical_format
    _check(cp, hs, A, B)
    _check(cp, hs, A, B, np.float32)


def test_cancellation_keeps_explicit_zero(cp, hs):
    """SciPy drops entries that cancel to exactly 0; the hash kernel keeps them stored (cuSPARSE
    does too) unless drop_zeros=True."""
    A = sp.csr_matrix(np.array([[1.0, 1.0, 0.0], [2.0, 0.0, 1.0]]))
    B = sp.csr_matrix(np.array([[1.0, 3.0], [-1.0, 0.0], [0.0, 1.0]]))
    ref = A @ B                                   # [[0, 3], [2, 7]]: C[0,0] cancels
    assert ref.nnz == 3                           # SciPy: the cancelled entry is not stored
    C = hs.spgemm(_dev(cp, A), _dev(cp, B)).get()
    assert C.nnz == 4 and C[0, 0] == 0.0 and np.array_equal(C.toarray(), ref.toarray())
    D = hs.spgemm(_dev(cp, A), _dev(cp, B), drop_zeros=True).get()
    assert D.nnz == 3 and np.array_equal(D.toarray(), ref.toarray())


@pytest.mark.parametrize("family", ["poisson3d", "rmat", "uniform", "skewed", "block_dense", "banded"])
def test_corpus_small(cp, hs, family):
    from matplan import corpus
    A = corpus.load(family, "small")
    B = A if A.shape[0] == A.shape[1] else A.T.tocsr()
    _check(cp, hs, A, B)


def test_row_larger_than_every_shared_table(cp, hs, rng, monkeypatch, global_path):
    """Row 0: 39,997 products, 34,010 distinct columns: fills the 32,768-slot symbolic table
    (overflow -> global) and exceeds the 16,384-slot numeric one; row 1 (every B row twice,
    duplicates): alpha = 160k / pi > 32,768, global at once; row 2 small (shared). The lift of
    few big-table rows to the global path is off here: it would send row 0 there directly."""
    monkeypatch.setattr(hs, "LIFT_MIN_TABLE", 1 << 62)
    n, k = 2000, 120_000
    B = sp.csr_matrix((rng.random(n * 40) + 0.5, rng.integers(0, k, n * 40), np.arange(0, n * 40 + 1, 40)),
                      shape=(n, k))
    B.sum_duplicates()
    rows = [np.arange(1000), np.tile(np.arange(n), 2), rng.integers(0, n, 5)]
    A = sp.csr_matrix((np.concatenate([rng.random(len(r)) + 0.5 for r in rows]), np.concatenate(rows),
                       np.cumsum([0] + [len(r) for r in rows])), shape=(3, n))
    C, info = _check(cp, hs, A, B)
    assert info["global_rows_numeric"] == 2
    assert info["symbolic_overflowed"] == 1 and info["global_rows_symbolic"] == 2
    _check_global_path(info, global_path, b_sorted=True)


def test_paper_48kb_limit_uses_global_path(cp, hs, rng, global_path):
    A = random_csr(rng, 200, 5000, 0.6)       # ~3,000 products a row, > the 2,048-slot table
    B = random_csr(rng, 5000, 4000, 0.002)
    C, info = _check(cp, hs, A, B, smem_limit=48 * 1024)
    assert all(size <= 2048 for size in info["numeric_tables"]) and info["global_rows_numeric"] > 0
    _check_global_path(info, global_path)


def test_global_path_in_batches_with_many_blocks_a_row(cp, hs, rng, monkeypatch, global_path):
    """More global rows than slabs (batches of 3 rows, slabs reused across batches), each row
    shared by many blocks (a block per 64 products) in both passes and written by 3 column
    segments (12,000 columns, 4,096 a segment): C is still SciPy's."""
    monkeypatch.setattr(hs, "_global_blocks", lambda nrows, slab_bytes, what: min(nrows, 3))
    monkeypatch.setattr(hs, "GLOBAL_PART_PRODUCTS", 64)
    monkeypatch.setattr(hs, "GLOBAL_MIN_PART_PRODUCTS", 64)
    A = random_csr(rng, 200, 5000, 0.6)       # ~3,000 products, ~2,300 distinct columns a row
    B = random_csr(rng, 5000, 12_000, 0.0007)
    assert hs._global_parts(3000, 3) == hs.GLOBAL_MAX_PARTS and hs._global_segments(12_000, 3)[0] == 3
    C, info = _check(cp, hs, A, B, smem_limit=9 * 1024)   # tables up to 2,048 keys / 512 slots
    assert info["global_rows_symbolic"] > 3 and info["global_rows_numeric"] > 3
    _check_global_path(info, global_path, b_sorted=True)


def test_global_segments_over_long_sorted_b_rows(cp, hs, rng, global_path):
    """Global rows over long sorted B rows (~400 entries, 50 of them 6,000): segments of ~20,000
    columns read their part of each B row, parts past SEG_LONG_PART (1,024) left to the whole
    block, and past SEG_LONG_MAX (32) of them a row (row 1: 40 long rows of B) kept by their warp;
    row 2 (20 long rows of B) has fewer nonzeros of A than a block has warps and walks its
    products."""
    n, k = 2000, 60_000
    lengths = np.full(n, 400)
    lengths[:50] = 6000
    B = _rows_csr([np.sort(rng.choice(k, m, replace=False)) for m in lengths], k, rng)
    rows = [rng.choice(np.arange(50, n), 100, replace=False), np.r_[np.arange(40), rng.choice(np.arange(50, n), 60)],
            rng.choice(50, 20, replace=False), []]
    A = _rows_csr(rows, n, rng)
    C, info = _check(cp, hs, A, B)
    _check_global_path(info, global_path, b_sorted=True)
    if global_path.startswith("segments"):
        assert info["global_segments"] >= 2


def test_global_rows_of_one_block_each(cp, hs, rng, monkeypatch, global_path):
    """A block a global row (no team): the symbolic pass counts a row's bits in its own bitmap,
    in shared memory with no global one, or in global memory."""
    monkeypatch.setattr(hs, "GLOBAL_MAX_PARTS", 1)
    A = random_csr(rng, 300, 5000, 0.6)       # ~24,000 products, ~3,900 distinct columns a row
    B = random_csr(rng, 5000, 4000, 0.002)
    C, info = _check(cp, hs, A, B, smem_limit=9 * 1024)   # symbolic tables up to 2,048 keys
    assert info["global_rows_symbolic"] > 0
    _check_global_path(info, global_path)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ratio", [1.0, 1e-9])
def test_symbolic_bitmap_rows(cp, hs, rng, monkeypatch, dtype, ratio):
    """Rows of symbolic tables of at least SYMBOLIC_BITMAP_RATIO slots a word of B's column bitmap
    count their columns in that bitmap in shared memory (symbolic_global): the many rows of the
    1,024-slot tables a block each, the one row of ~14,000 products (the 16,384-slot table) a team
    of blocks that ORs into a bitmap in global memory; with a tiny ratio every row with products.
    Duplicate and unsorted indices, empty rows."""
    monkeypatch.setattr(hs, "SYMBOLIC_BITMAP_RATIO", ratio)
    lengths = rng.integers(0, 60, 2000)
    lengths[::50] = 0
    lengths[7] = 900
    rows = [rng.integers(0, 3000, n) for n in lengths]   # duplicates, unsorted
    A = _rows_csr(rows, 3000, rng)
    B = random_csr(rng, 3000, 4000, 0.004)              # ~16 a row: 125-word bitmaps
    C, info = _check(cp, hs, A, B, dtype, passes="two")
    products = np.add.reduceat(np.r_[np.diff(B.indptr)[A.indices], 0], A.indptr[:-1])
    products[np.diff(A.indptr) == 0] = 0
    if ratio < 1:
        assert info["symbolic_bitmap_rows"] == int((products > 0).sum())
    else:
        assert 0 < info["symbolic_bitmap_rows"] < int((products > 0).sum())
    assert info["global_rows_symbolic"] == 0 and info["symbolic_overflowed"] == 0


@pytest.mark.parametrize("sorted_b", [False, True])
@pytest.mark.parametrize("smem_limit", [None, 9 * 1024])
def test_products_concentrated_in_one_long_row_of_b(cp, hs, rng, monkeypatch, smem_limit, sorted_b, global_path):
    """Rows of A over runs of empty rows of B (csum repeats) and one 6,000-nonzero row: each
    warp's equal range of a row's products may start inside the long row or after empty ones.
    Shared tables of up to 1,024 threads a row, or (9 KB) the global path, many blocks a row."""
    monkeypatch.setattr(hs, "GLOBAL_MIN_PART_PRODUCTS", 64)
    n, k = 4000, 20_000
    lengths = rng.integers(1, 4, n)
    lengths[rng.random(n) < 0.6] = 0
    lengths[1234] = 6000
    B = sp.csr_matrix((rng.random(lengths.sum()) + 0.5,
                       np.concatenate([rng.choice(k, m, replace=False) for m in lengths]),
                       np.concatenate([[0], np.cumsum(lengths)])), shape=(n, k))
    if sorted_b:   # segments read their part of each B row (binary searches), else walk the products
        B.sort_indices()
    empty_b = np.flatnonzero(lengths == 0)
    rows = [np.arange(n), np.union1d(rng.choice(n, 300, replace=False), [1234]), np.array([1234]),
            empty_b[:50], np.array([], dtype=np.int64), np.sort(np.append(empty_b[:700], 1234))]
    A = sp.csr_matrix((np.concatenate([rng.random(len(r)) + 0.5 for r in rows]), np.concatenate(rows),
                       np.concatenate([[0], np.cumsum([len(r) for r in rows])])), shape=(len(rows), n))
    C, info = _check(cp, hs, A, B, smem_limit=smem_limit)
    assert C.indptr[4] == C.indptr[5] == C.indptr[3]   # rows over empty rows of B only: empty
    if smem_limit:
        assert info["global_rows_numeric"] >= 2
        _check_global_path(info, global_path, b_sorted=sorted_b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("min_tpr, numeric_slots", [(8, 2), (8, 4), (16, 2), (32, 2)])
def test_short_rows_in_sub_warp_groups(cp, hs, rng, monkeypatch, min_tpr, numeric_slots, dtype, global_path):
    """Rows of 8 or 16 lanes (several rows a warp) or of whole warps give SciPy's C. smem_limit
    1,800 bytes leaves symbolic tables of 32-128 keys (sub-warp rows up to 128 keys here: 16
    lanes a row in the largest, which the rows past 128 products try and overflow) and numeric
    tables of 32-64 slots (more go global)."""
    monkeypatch.setattr(hs, "MIN_TPR", min_tpr)
    monkeypatch.setattr(hs, "SUBWARP_MAX_TABLE", 128)
    monkeypatch.setattr(hs, "NUMERIC_SUBWARP_SLOTS", numeric_slots)   # 4: rank sort of 4 slots a lane
    assert hs.launch_shape(128, 4, 1800, hs.SYMBOLIC_SLOTS_PER_THREAD)[0] == max(min_tpr, 16)
    lengths = rng.integers(0, 40, 3000)
    lengths[::97] = 0                           # empty rows
    cols = [rng.choice(2000, n, replace=False) for n in lengths]
    A = sp.csr_matrix((rng.random(lengths.sum()) + 0.5, np.concatenate(cols),
                       np.concatenate([[0], np.cumsum(lengths)])), shape=(3000, 2000))
    B = random_csr(rng, 2000, 3000, 0.003)      # ~9 a row: 0 to ~360 products a row of A
    assert hs.table_ladder(1800, 4) == (32, 64, 128) and hs.table_ladder(1800, 12) == (32, 64)
    C, info = _check(cp, hs, A, B, dtype=dtype, smem_limit=1800)
    assert info["symbolic_overflowed"] > 0 and info["global_rows_numeric"] > 0
    assert set(info["numeric_tables"]) == {32, 64}
    _check_global_path(info, global_path)


@pytest.mark.parametrize("grouping", ["balanced", "grouped"])
def test_forced_grouping(cp, hs, rng, grouping):
    A = messy_csr(rng, 600, 600)
    C, info = _check(cp, hs, A, random_csr(rng, 600, 800, 0.02), grouping=grouping)
    assert info["balanced"] == (grouping == "balanced")
    if grouping == "balanced":
        assert len(info["numeric_tables"]) <= 1



@pytest.mark.parametrize("balanced", [False, True])
def test_fused_classification_matches_the_xp_rules(cp, hs, rng, balanced):
    """classify_rows + bucket_rows (the launch path) give the tables, counts, moments and order of
    symbolic_index / table_index / balance / groups_of, on row figures spanning every table, the
    risky band past the largest one and the global path, with empty rows."""
    ladder = hs.table_ladder(48 * 1024, hs.KEY_BYTES)
    top, k = ladder[-1], 10 * ladder[-1]
    row_ct = np.concatenate([np.zeros(50), rng.integers(1, 3 * top, 3000), [top + 1, int(top * 3.1), 5 * top, 10 ** 9]])
    row_ct = rng.permutation(row_ct).astype(np.int64)
    m = row_ct.size
    # a CSR A and csum whose nnz_RowCt is row_ct: one nonzero per row carrying its product count
    Ap = cp.arange(m + 1, dtype=cp.int32)
    csum = cp.asarray(np.concatenate([[0], np.cumsum(row_ct)]))

    class _A:
        indptr = Ap
    sym = hs._classify(m, k, ladder, A=_A, csum=csum)
    ref = hs.symbolic_index(row_ct, k, ladder)
    assert np.array_equal(sym.idx.get(), ref)
    assert np.array_equal(sym.counts, np.bincount(ref + 1, minlength=len(ladder) + 2))
    assert sym.total == row_ct.sum() and sym.peak == row_ct.max()
    assert sym.risky == int(((np.minimum(row_ct, k) > top) & (ref == len(ladder) - 1)).sum())
    assert sym.var == pytest.approx(row_ct.astype(np.float64).var(), rel=1e-9)
    order, counts = hs._group(sym, len(ladder), balanced)
    want = hs.balance(ref, balanced, len(ladder))
    assert np.array_equal(sym.idx.get(), want), "the balanced rule is written back to idx"
    assert np.array_equal(counts, np.bincount(want + 1, minlength=len(ladder) + 2))
    order = order.get()
    assert np.array_equal(np.sort(order), np.arange(m))
    assert np.all(np.diff(want[order]) >= 0), "rows come out grouped by table"
    # numeric mode: C's exact row nnz, table_index's rule
    nnz = cp.asarray(np.minimum(row_ct, 2 * top))
    num = hs._classify(m, k, ladder, row_nnz=nnz)
    assert np.array_equal(num.idx.get(),
                          hs.table_index(np.minimum(row_ct, 2 * top), ladder, hs.NUMERIC_LAST_TABLE_LOAD))
    assert num.total == int(np.minimum(row_ct, 2 * top).sum())
    # the one-pass classes in the analysis's launch: numeric_esc limits (products), then tables
    classes = hs.ESC_CAPS + ladder[:4]
    both = hs._classify(m, 100, ladder, A=_A, csum=csum, second=(classes, len(hs.ESC_CAPS)))
    want = hs.one_pass_index(row_ct, 100, classes, len(hs.ESC_CAPS))
    assert np.array_equal(both.second.idx.get(), want)
    assert np.array_equal(both.second.counts, np.bincount(want + 1, minlength=len(classes) + 2))
    sorted_rows = (want >= 0) & (want < len(hs.ESC_CAPS))   # numeric_esc's: no symbolic table
    assert sorted_rows.any()
    assert np.array_equal(both.idx.get(), np.where(sorted_rows, -1, hs.symbolic_index(row_ct, 100, ladder)))
    order, counts = hs._group(both.second, len(classes), False)
    assert np.all(np.diff(want[order.get()]) >= 0)

def test_unsorted_output_has_the_same_entries(cp, hs, rng):
    A = random_csr(rng, 500, 500, 0.03)
    C, _ = _check(cp, hs, A, A, sort=False)
    S = hs.spgemm(_dev(cp, A), _dev(cp, A)).get()
    C.sort_indices()
    assert np.array_equal(C.indptr, S.indptr) and np.array_equal(C.indices, S.indices)


def test_more_than_2_31_products(cp, hs, rng):
    """64 rows each repeating one column of A 40,000 times (duplicates) times B rows of 1,000:
    2.56e9 products, so the product offsets need int64. Reference from the closed form."""
    rows, dup, width, k = 64, 40_000, 1000, 5000
    Bd = sp.csr_matrix((rng.random(4 * width) + 0.5,
                        np.concatenate([rng.choice(k, width, replace=False) for _ in range(4)]),
                        np.arange(0, 4 * width + 1, width)), shape=(4, k))
    Bd.has_sorted_indices = False
    import cupyx.scipy.sparse as csp
    cols = np.repeat(np.arange(rows) % 4, dup).astype(np.int32)
    A = csp.csr_matrix((cp.ones(rows * dup), cp.asarray(cols),
                        cp.arange(0, rows * dup + 1, dup, dtype=cp.int32)), shape=(rows, 4))
    info = {}
    C = hs.spgemm(A, _dev(cp, Bd), info=info).get()
    assert info["products"] == rows * dup * width > 2 ** 31
    Bs = Bd.copy()
    Bs.sort_indices()
    ref = sp.csr_matrix(dup * Bs[np.arange(rows) % 4].toarray())
    _check_canonical(C)
    assert C.nnz == rows * width
    assert abs(C - ref).max() <= 1e-9 * dup


def test_int64_index_input_through_the_planner(cp, hs, rng):
    from matplan.planner import plan
    A = random_csr(rng, 400, 400, 0.02, index_dtype=np.int64)
    dA = int64_indices(cp, _dev(cp, A))   # _dev alone would hold int32 (cupyx casts indices that fit)
    p = plan(dA, dA, kernels=["spgemm.hash"])
    assert p.kernel == "spgemm.hash" and "nnz_RowCt" in str(p)
    C = p.run(dA, dA).get()
    assert abs(C - A @ A).max() <= 1e-12 * (abs(A) @ abs(A)).max()


def test_peak_extra_memory_is_reported(cp, hs, rng):
    from matplan.core.memtrack import peak_memory
    A = random_csr(rng, 20000, 20000, 0.0005)
    dA = _dev(cp, A)
    with peak_memory() as mem:
        C = hs.spgemm(dA, dA)
    out_bytes = C.data.nbytes + C.indices.nbytes + C.indptr.nbytes
    print(f"\nspgemm.hash peak extra memory {mem.peak:,} B for an output of {out_bytes:,} B "
          f"({mem.peak / out_bytes:.2f}x)")
    assert out_bytes <= mem.peak <= 4 * out_bytes + 24 * A.nnz + 64 * A.shape[0] + (1 << 20)


def test_transpose_sort(cp, hs, rng):
    for A in (random_csr(rng, 300, 500, 0.02), messy_csr(rng, 200, 100), sp.csr_matrix((5, 7))):
        T = hs.transpose_sort(_dev(cp, A)).get()
        ref = sp.csr_matrix(A.T)   # keeps duplicates, like the transpose
        assert T.shape == ref.shape and T.nnz == A.nnz
        assert np.array_equal(T.toarray(), ref.toarray())
        d = np.diff(T.indices.astype(np.int64))   # rows ascending in each column (stable)
        starts = np.zeros(T.nnz, bool)
        starts[T.indptr[1:-1][T.indptr[1:-1] < T.nnz]] = True
        assert np.all((d >= 0) | starts[1:])


@pytest.mark.parametrize("n", [1, 2047, 2048, 2049, 300_001])
def test_scan_kernels_match_cumsum(cp, hs, rng, n):
    """scan_rows / scan_products (single-pass look-back scans) == NumPy's cumsum with a leading 0,
    over one block, a block boundary and many blocks; Cp32 is the int32 truncation (values past 2^31
    included); outputs are poisoned first."""
    vals = rng.integers(0, 1 << 20, n).astype(np.int64)
    vals[rng.integers(0, n)] = 3 << 31                          # one value past int32
    Cp, Cp32 = cp.full(n + 1, -7, dtype=cp.int64), cp.full(n + 1, -7, dtype=cp.int32)
    hs._scan("scan_rows", n, (cp.asarray(vals), np.int64(n), Cp, Cp32))
    want = np.concatenate([[0], np.cumsum(vals)])
    assert np.array_equal(Cp.get(), want)
    assert np.array_equal(Cp32.get(), want.astype(np.int32))   # wraps like C's (int) cast
    B = sp.random(5000, 50, density=0.2, format="csr", random_state=1)
    Aj = rng.integers(0, 5000, n).astype(np.int32)
    csum = cp.full(n + 1, -7, dtype=cp.int64)
    hs._scan("scan_products", n, (cp.asarray(Aj), np.int64(n), cp.asarray(B.indptr.astype(np.int32)), csum))
    assert np.array_equal(csum.get(), np.concatenate([[0], np.cumsum(np.diff(B.indptr)[Aj])]))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64, np.float64])
def test_zeroed_and_read_back(cp, rng, dtype):
    """_cuda.zeroed: every element zero in a pool block that held other values (poisoned first);
    _cuda.read_back: the values .get() reads, for a slice, one element, an empty array and one
    larger than the pinned buffer's first size, in order behind work queued on the stream."""
    from matplan.kernels import _cuda
    n = 100_003
    poison = cp.full(n, 7, dtype=dtype)
    del poison                                    # its block goes back to the pool for reuse
    z = _cuda.zeroed(n, dtype)
    assert z.dtype == dtype and z.shape == (n,) and not cp.any(z)
    assert _cuda.zeroed(0, dtype).size == 0
    a = cp.asarray(rng.integers(0, 1 << 30, 3 * n).astype(dtype))
    a[5:9] += 1                                   # queued before the read: must be seen
    for v in (a, a[5:9], a[-1:], a[:0], a[:2].reshape(1, 2)):
        got = _cuda.read_back(v)
        assert got.dtype == v.dtype and got.shape == v.shape and np.array_equal(got, v.get())
    with pytest.raises(ValueError, match="C-contiguous"):
        _cuda.read_back(a[::2])
    # read_at: the same words named by a device address (no CuPy slice), any count and dtype
    got = _cuda.read_at(a.data.ptr + 5 * a.itemsize, 4, dtype)
    assert got.dtype == dtype and np.array_equal(got, a[5:9].get())
    assert _cuda.read_at(a.data.ptr, 0, dtype).size == 0


def test_output_past_free_memory_raises(cp, hs, rng, monkeypatch):
    """spgemm(out='device') refuses a C that would not fit the free device memory, naming the
    alternatives (the check runs for every output once SMALL_OUTPUT_FRACTION is 0; the one-pass
    path, whose buffers are at most ONE_PASS_MEM_FRACTION of the device, leaves a shortage to
    CuPy's OutOfMemoryError)."""
    A = _dev(cp, random_csr(rng, 200, 200, 0.05))
    monkeypatch.setattr(hs, "SMALL_OUTPUT_FRACTION", 0.0)
    monkeypatch.setattr(hs, "_free_device_bytes", lambda: 1000)
    with pytest.raises(MemoryError, match="bytes of device memory.*spgemm_panels"):
        hs.spgemm(A, A, passes="two")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sort", [True, False])
def test_one_pass_path(cp, hs, rng, dtype, sort):
    """Rows whose bound min(nnz_RowCt, k) fits ONE_PASS_MAX_TABLE take the one-pass path (no
    symbolic pass): empty rows, a row at the bound, duplicates and unsorted indices included;
    a row past the bound takes the global path's slabs inside it."""
    m = 3000
    A = random_csr(rng, m, m, 3 / m)
    A = A.tolil()
    A[5, :] = 0                                    # an empty row
    A[7, :11] = 1.0                                # 11 x ~3: near the bound, not past it
    A = A.tocsr()
    C, info = _check(cp, hs, A, A, dtype, sort)
    auto = {}
    _check_one(cp, hs, A, A, dtype, sort, auto)
    assert auto["one_pass"] and not info["one_pass"]
    M = messy_csr(rng, 400, 400)
    _check(cp, hs, M, M, dtype, sort)
    for grouping in ("balanced", "grouped"):   # one table in row order, or tables by bound
        _check(cp, hs, A, A, dtype, sort, grouping=grouping)
        g = {}
        _check_one(cp, hs, A, A, dtype, sort, g, grouping=grouping)
        classes = len(g["numeric_tables"]) + len(g["esc_rows"])
        assert g["one_pass"] and (classes == 1) == (grouping == "balanced")
    big = A.tolil()
    big[9, :] = 1.0                                # a row of m products: past every one-pass table
    big = big.tocsr()
    wide = {}
    _check_one(cp, hs, big, A, dtype, sort, wide)
    assert wide["one_pass"] and wide["global_rows_numeric"] == 1   # that row by the global slabs


def _poison_pool(cp, nbytes: int, blocks: int = 4):
    """Free blocks of ``nbytes`` of 0xFF bytes into CuPy's pool (column -1, value NaN), so a
    buffer allocated next shows any entry a kernel leaves unwritten."""
    held = [cp.full(nbytes, 0xFF, dtype=cp.uint8) for _ in range(blocks)]
    del held


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sort", [True, False])
def test_one_pass_takes_few_long_rows(cp, hs, rng, monkeypatch, dtype, sort, global_path):
    """Up to ONE_PASS_LONG_ROWS rows past the one-pass classes take the global path (slabs, or
    column segments: 48 KB tables give a 40k-column row several) in the one-pass layout, each row
    at its products' offset with its count from its last segment: A @ A, A @ B for a wide B and
    for a B of duplicate and unsorted indices match SciPy from a poisoned memory pool; one long
    row more than the limit, or slabs past ONE_PASS_LONG_BYTES, send the product to the two
    passes."""
    m, smem = 3000, 48 * 1024
    S = random_csr(rng, m, m, 3 / m).tolil()
    S[5, :] = 0
    A = S.copy()
    for r in (9, 100, 2999):                       # rows of ~3m products, bound m: past the tables
        A[r, :] = rng.random(m) + 0.5
    A, S = A.tocsr(), S.tocsr()
    W = random_csr(rng, m, 40 * 1024, 20 / (40 * 1024))   # 40k columns: several segments a long row
    M = messy_csr(rng, m, m)                       # duplicates, unsorted indices, a long row
    for right, exact in ((S, True), (W, True), (M, False)):   # M's long row makes a few more
        info = {}
        products = int((sp.csr_matrix(A).astype(bool).astype(np.int64) @ np.diff(right.indptr)).sum())
        _poison_pool(cp, products * 8)
        _check_one(cp, hs, A, right, dtype, sort, info, smem_limit=smem)
        assert info["one_pass"]
        assert info["global_rows_numeric"] == 3 if exact else 3 <= info["global_rows_numeric"] <= hs.ONE_PASS_LONG_ROWS
        _check_global_path(info, global_path)
    monkeypatch.setattr(hs, "ONE_PASS_LONG_ROWS", 2)
    info = {}
    _check_one(cp, hs, A, S, dtype, sort, info, smem_limit=smem)
    assert not info["one_pass"]
    monkeypatch.setattr(hs, "ONE_PASS_LONG_ROWS", 64)
    monkeypatch.setattr(hs, "ONE_PASS_LONG_BYTES", 3 * m * 12 - 1)
    info = {}
    _check_one(cp, hs, A, S, np.float64, sort, info, smem_limit=smem)
    assert not info["one_pass"]


@pytest.mark.parametrize("copier", ["entries", "rows", "ranges"])
def test_one_pass_copies_by_entries_rows_and_ranges(cp, hs, rng, monkeypatch, copier):
    """compact_entries (a block a range of C's entries), compact_rows (a warp a row) and
    compact_ranges (a block a range of rows, an entry a thread) give the same C from a poisoned
    pool: empty rows (a run of 3000 inside one block's entries), rows of one entry, rows of up to
    500 entries over 600 columns."""
    monkeypatch.setattr(hs, "COMPACT_ALL_BY_ENTRIES", copier == "entries")
    monkeypatch.setattr(hs, "COMPACT_RANGE_BELOW", 10 ** 9 if copier == "ranges" else 0)
    counts = [0, 1, 3, 0, 200, 7] * 300 + [0] * 3000 + [1, 0, 0, 2] + [511, 0]
    A, B = _rows_of_products(rng, counts, long_a={5, 1799}, ncols=600)
    products = int((sp.csr_matrix(A).astype(bool).astype(np.int64) @ np.diff(B.indptr)).sum())
    info = {}
    _poison_pool(cp, products * 8)
    _check_one(cp, hs, A, B, np.float64, True, info)
    _poison_pool(cp, products * 8)
    _check_one(cp, hs, A, B, np.float32, True, {}, esc=False)
    assert info["one_pass"]


def test_one_pass_off_and_bad_passes(cp, hs, rng):
    A = _dev(cp, random_csr(rng, 500, 500, 0.004))
    info = {}
    hs.spgemm(A, A, passes="two", info=info)
    assert info["one_pass"] is False
    with pytest.raises(ValueError, match="passes"):
        hs.spgemm(A, A, passes="one")


def _rows_of_products(rng, counts, n=1000, long_a=(), ncols=20):
    """(A, B): row i of A has exactly counts[i] products with B, whose rows 0..599 hold one entry in
    columns 0..ncols-1 (few columns: runs of equal columns to sum) and rows 600..n-1 none; rows
    listed in ``long_a`` also get 3x as many nonzeros over B's empty rows (more A nonzeros than a
    group has lanes). B has max(30, ncols) columns."""
    rows, cols = [], []
    for i, c in enumerate(counts):
        picks = list(rng.choice(600, c, replace=False))     # c products: one per B row
        if i in long_a:
            picks += list(rng.integers(600, n, 3 * max(c, 12)))
        rng.shuffle(picks)
        rows += [i] * len(picks)
        cols += picks
    vals = (rng.random(len(rows)) + 0.5) * rng.choice([-1.0, 1.0], len(rows))
    A = sp.csr_matrix((vals, (rows, cols)), shape=(len(counts), n))
    A.sum_duplicates()   # the picks over B's empty rows may repeat
    bv = (rng.random(600) + 0.5) * rng.choice([-1.0, 1.0], 600)
    B = sp.csr_matrix((bv, (np.arange(600), rng.integers(0, ncols, 600))), shape=(n, max(30, ncols)))
    return A, B


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sort_based_rows_at_every_class_limit(cp, hs, rng, dtype):
    """numeric_esc (the one-pass path's rows of <= ESC_CAPS[-1] products): rows at each class's
    limit and one past it, rows with more A nonzeros than lanes (the binary-search branch), empty
    rows, runs of equal columns; == SciPy, == the hash kernels, sorted, and bitwise the same on a
    second run (the sums do not depend on timing)."""
    caps = hs.ESC_CAPS
    counts = [0, 1, 2] + [c + d for c in caps for d in (-1, 0, 1)] + [5, 0, 40, 100]
    A, B = _rows_of_products(rng, counts, long_a={len(counts) - 2, len(counts) - 1, 4})
    per_row = np.array([np.diff(B.indptr)[A.indices[A.indptr[i]:A.indptr[i + 1]]].sum()
                        for i in range(A.shape[0])])
    assert list(per_row) == counts   # the products the test meant
    assert np.diff(A.indptr)[-1] > 32   # more A nonzeros than the widest group's lanes
    info = {}
    C = _check_one(cp, hs, A, B, dtype, True, info, grouping="grouped")
    assert info["one_pass"] and set(info["esc_rows"]) == set(caps)
    assert sum(info["esc_rows"].values()) == int(((per_row > 0) & (per_row <= caps[-1])).sum())
    assert sum(info["numeric_tables"].values()) == int((per_row > caps[-1]).sum())
    again = hs.spgemm(_dev(cp, A, dtype), _dev(cp, B, dtype)).get()
    assert np.array_equal(again.indptr, C.indptr) and np.array_equal(again.indices, C.indices)
    assert np.array_equal(again.data.view(np.uint8), C.data.view(np.uint8))
    hashed = {}
    H = _check_one(cp, hs, A, B, dtype, True, hashed, grouping="grouped", esc=False)
    assert not hashed["esc_rows"] and np.array_equal(H.indices, C.indices)


@pytest.mark.parametrize("top", [16, 17, 128])
def test_sort_based_balanced_single_launch(cp, hs, rng, top):
    """Under the balanced rule every row runs in the class of the largest row, in row order (rows
    null): rows far below the class's limit and empty rows included."""
    counts = [top] * 30 + [top - 1] * 10 + [0, 3]
    A, B = _rows_of_products(rng, counts)
    info = {}
    _check_one(cp, hs, A, B, np.float64, True, info, grouping="balanced")
    cap = next(c for c in hs.ESC_CAPS if c >= top)
    assert info["one_pass"] and info["esc_rows"] == {cap: len(counts)} and not info["numeric_tables"]


def test_sort_based_rows_need_b_narrow_enough_to_pack(cp, hs, rng):
    """numeric_esc packs column << log2(slots) | slot into an int below EMPTY_KEY: rows of 100
    products (the 128-slot class) take it while B has at most esc_max_columns(128) = 2^24 - 1
    columns (the last column used), and keep a hash table one column past that."""
    limit = hs.esc_max_columns(128)
    assert limit == (1 << 24) - 1 and hs.esc_caps(limit)[-1] == 128 and 128 not in hs.esc_caps(limit + 1)
    rows = np.repeat(np.arange(40), 100)
    A = sp.csr_matrix((rng.random(rows.size) + 0.5, (rows, np.concatenate([rng.choice(200, 100, replace=False)
                                                                          for _ in range(40)]))), shape=(40, 200))
    for k, sort_based in ((limit, True), (limit + 1, False)):
        cols = np.concatenate([[k - 1], rng.integers(k - 300, k, 199)])   # the last column included
        B = sp.csr_matrix((rng.random(200) + 0.5, (np.arange(200), cols)), shape=(200, k))
        info = {}
        _check_one(cp, hs, A, B, np.float64, True, info, grouping="grouped")
        assert info["one_pass"] and (128 in info["esc_rows"]) == sort_based


@pytest.mark.parametrize("dtype,short", [(np.float32, [0, 3, 17, 100, 0, 300]), (np.float64, [0, 3, 17, 100, 0, 300]),
                                         (np.float64, [0, 3, 9, 1, 0, 16])])
def test_hybrid_sorts_short_rows_beside_the_two_passes(cp, hs, rng, monkeypatch, dtype, short):
    """Long rows (products past 512 and bound past 256) more than ONE_PASS_LONG_ROWS force the two
    passes; the rows numeric_esc can take skip the symbolic pass (the hybrid) and are copied into
    C after the scan. == SciPy with the hybrid, with esc=False, and when its upper-bound buffer
    does not fit (then the short rows are classified again for the symbolic tables)."""
    monkeypatch.setattr(hs, "ONE_PASS_LONG_ROWS", 0)   # the two long rows alone force the two passes
    A, B = _rows_of_products(rng, short * 40 + [599, 600, 2], long_a={3, 241}, ncols=400)
    info = {}
    _check_one(cp, hs, A, B, dtype, True, info)   # only 16-product rows: the copy takes 4 lanes a row
    assert info.get("hybrid") and not info["one_pass"] and info["esc_rows"]
    assert sum(info["esc_rows"].values()) == 40 * 4 + 1
    plain = {}
    _check_one(cp, hs, A, B, dtype, True, plain, esc=False)
    assert not plain.get("hybrid")
    for name, value in (("HYBRID_MIN_ROWS", 1 << 62), ("ONE_PASS_MEM_FRACTION", 1e-12)):   # switched off
        with monkeypatch.context() as mp:
            mp.setattr(hs, name, value)
            full = {}
            _check_one(cp, hs, A, B, dtype, True, full)
            assert not full.get("hybrid") and not full["one_pass"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_few_big_table_rows_take_the_global_path(cp, hs, rng, monkeypatch, dtype):
    """Rows of big shared tables that are few move to the global-memory path (lift_index; forced
    here from 32-slot tables on): == SciPy with the rows lifted in both passes, and the rule's
    host side (lift_index) on counts."""
    A = messy_csr(rng, 400, 300, dtype=np.float64)
    B = random_csr(rng, 300, 500, 0.05)
    base = {}
    _check_one(cp, hs, A, B, dtype, True, base, passes="two")
    assert base["lifted_rows"] == {"symbolic": 0, "numeric": 0}
    monkeypatch.setattr(hs, "LIFT_MIN_TABLE", 32)
    monkeypatch.setattr(hs, "LIFT_ROWS_PER_SM", 10 ** 6)
    monkeypatch.setattr(hs, "LIFT_MIN_PRODUCTS", 0)
    info = {}
    _check_one(cp, hs, A, B, dtype, True, info, passes="two", grouping="grouped")
    assert info["lifted_rows"]["symbolic"] > 0 and info["lifted_rows"]["numeric"] > 0
    assert info["global_rows_numeric"] >= info["lifted_rows"]["numeric"]
    assert hs.lift_index(np.array([0, 5, 0, 3, 0]), (32, 64, 128), 10 ** 6, 0) == 0


def _rows_csr(rows, n, rng):
    """CSR of the given column lists as they are (duplicates and order kept), values never zero."""
    indices = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows])
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    data = (rng.random(indices.size) + 0.5) * rng.choice([-1.0, 1.0], indices.size)
    return sp.csr_matrix((data, indices, indptr), shape=(len(rows), n))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("window", [True, False])
def test_esc_window_for_narrow_rows(cp, hs, rng, monkeypatch, dtype, window):
    """Rows of numeric_esc whose columns span at most their class's W * P slots take the dense
    window (window off: all sorted): a banded A·A with rows of 1 to 289 products (every class),
    unsorted and duplicate indices (one column on several lanes of a round) and empty rows; and
    over the identity, rows of 20 products (the 32-slot class) spanning exactly 32 columns
    (window) and 33 (sorted), and a row of one column 20 times."""
    monkeypatch.setattr(hs, "ESC_WINDOW", window)
    n = 3000
    band = []
    for i in range(n):
        half = i % 9
        c = list(range(max(0, i - half), min(n, i + half + 1))) if i % 50 else []
        c += c[:i % 3]                          # duplicates
        band.append(rng.permutation(c))
    A = _rows_csr(band, n, rng)
    assert not A.has_canonical_format
    info = {}
    _check_one(cp, hs, A, A, dtype, True, info)
    assert info["one_pass"] and len(info["esc_rows"]) >= 4
    _check(cp, hs, A, A, dtype)
    edge = [np.r_[0, 31, rng.choice(np.arange(1, 31), 18, replace=False)] + 100,
            np.r_[0, 32, rng.choice(np.arange(1, 32), 18, replace=False)] + 200,
            np.full(20, 7), [], rng.permutation(np.arange(1000, 1020))]
    E = _rows_csr(edge, n, rng)
    info = {}
    C = _check_one(cp, hs, E, sp.identity(n, format="csr"), dtype, True, info)
    assert info["esc_rows"] == {32: 4} and np.diff(C.indptr).tolist() == [20, 20, 1, 0, 20]


def test_esc_flag_is_checked(cp, hs, rng):
    A = _dev(cp, random_csr(rng, 50, 50, 0.05))
    with pytest.raises(TypeError, match="esc"):
        hs.spgemm(A, A, esc="yes")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("smem_limit, words_per_slot", [(None, 4), (None, 0), (25_600, 4)])
def test_big_tables_sorted_by_column_bitmap_or_bitonic(cp, hs, rng, monkeypatch, dtype, smem_limit,
                                                       words_per_slot):
    """Rows of 512- to 8192-slot numeric tables (~300-5,000 distinct of 20,011 columns; duplicate
    and unsorted indices in A) come out sorted == SciPy whether numeric_shared orders them by the
    column bitmap (bitmap_words > 0) or the bitonic sort (0: switched off, or, at 25,600 bytes a
    block, the 2,048-slot float64 table leaves no room for the bitmap while 512 and 1,024 do)."""
    monkeypatch.setattr(hs, "BITMAP_WORDS_PER_SLOT", words_per_slot)
    monkeypatch.setattr(hs, "LIFT_MIN_TABLE", 1 << 62)   # keep the few big rows in their tables
    used = {}   # table size -> bitmap words of its launch
    real = hs.bitmap_words
    monkeypatch.setattr(hs, "bitmap_words", lambda size, *a: used.setdefault(size, real(size, *a)))
    n, k = 2000, 20_011                                  # the last bitmap word is partly used
    B = random_csr(rng, n, k, 10 / k)
    assert B.indptr[1] > 0
    B.indices[B.indptr[1] - 1] = k - 1                   # column k - 1 in B's row 0 (still sorted)
    lengths = np.repeat([30, 60, 120, 250, 500], 8)      # ~300 .. 5,000 products a row
    A = sp.csr_matrix((np.concatenate([(rng.random(L) + 0.5) * rng.choice([-1.0, 1.0], L) for L in lengths]),
                       np.concatenate([rng.integers(0, n, L) for L in lengths]),
                       np.concatenate([[0], np.cumsum(lengths)])), shape=(len(lengths), n))
    A.indices[:30] = A.indices[:30][::-1].copy()
    A.indices[1] = A.indices[5] = 0                      # row 0 reads B's row 0 twice (duplicates)
    A.has_sorted_indices = False
    C, info = _check(cp, hs, A, B, dtype, smem_limit=smem_limit, passes="two", grouping="grouped")
    big = {size: w for size, w in used.items() if size > hs.RANK_SORT_MAX}
    assert set(used) == set(info["numeric_tables"]) and min(big) == 512 and C[0, k - 1] != 0
    if words_per_slot == 0:
        assert not any(big.values())
    elif smem_limit is None:
        assert set(big.values()) == {-(-k // 32)} and max(big) >= 4096
    elif np.dtype(dtype) == np.float64:
        assert big == {512: -(-k // 32), 1024: -(-k // 32), 2048: 0}


def test_global_batches_sized_to_l2(cp, hs, monkeypatch):
    """Past the resident-block target, a global batch takes the slabs GLOBAL_L2_FRACTION of L2
    holds, but at least target / GLOBAL_MAX_PARTS rows; at most the target, no batching below it."""
    monkeypatch.setattr(hs, "_global_target_blocks", lambda: 256)
    l2 = hs._cuda.device_attribute("L2CacheSize", cp.cuda.Device().id)
    slab = int(l2 * hs.GLOBAL_L2_FRACTION) // 20
    assert hs._global_blocks(100, slab, "numeric") == 100           # below the target: one batch
    assert hs._global_blocks(1000, slab, "numeric") == 20           # L2's 20 slabs
    assert hs._global_blocks(1000, slab * 10, "numeric") == 256 // hs.GLOBAL_MAX_PARTS   # 2 fit: 8
    assert hs._global_blocks(1000, 1024, "numeric") == 256          # small slabs: the target
