"""GPU tests of the RBSparse hash SpGEMM (the two passes, the global path, the scans) and the sort-based SpTRANS against SciPy (float64)."""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import int64_indices, messy_csr, random_csr
from matplan.kernels import _cuda
from matplan.kernels.spgemm import analysis, global_rows, rules, runtime
from spgemm_gpu_helpers import _check, _check_canonical, _check_global_path, _dev, _rows_csr
from spgemm_gpu_helpers import global_path, hs  # noqa: F401  fixtures

pytestmark = pytest.mark.gpu


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
    monkeypatch.setattr(rules, "LIFT_MIN_TABLE", 1 << 62)
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
    monkeypatch.setattr(global_rows, "_global_blocks", lambda nrows, slab_bytes, what: min(nrows, 3))
    monkeypatch.setattr(global_rows, "GLOBAL_PART_PRODUCTS", 64)
    monkeypatch.setattr(global_rows, "GLOBAL_MIN_PART_PRODUCTS", 64)
    A = random_csr(rng, 200, 5000, 0.6)       # ~3,000 products, ~2,300 distinct columns a row
    B = random_csr(rng, 5000, 12_000, 0.0007)
    assert global_rows._global_parts(3000, 3) == global_rows.GLOBAL_MAX_PARTS and global_rows._global_segments(12_000, 3)[0] == 3
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
    monkeypatch.setattr(global_rows, "GLOBAL_MAX_PARTS", 1)
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
    monkeypatch.setattr(global_rows, "SYMBOLIC_BITMAP_RATIO", ratio)
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
    monkeypatch.setattr(global_rows, "GLOBAL_MIN_PART_PRODUCTS", 64)
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
    monkeypatch.setattr(rules, "MIN_TPR", min_tpr)
    monkeypatch.setattr(rules, "SUBWARP_MAX_TABLE", 128)
    monkeypatch.setattr(rules, "NUMERIC_SUBWARP_SLOTS", numeric_slots)   # 4: rank sort of 4 slots a lane
    assert rules.launch_shape(128, 4, 1800, rules.SYMBOLIC_SLOTS_PER_THREAD)[0] == max(min_tpr, 16)
    lengths = rng.integers(0, 40, 3000)
    lengths[::97] = 0                           # empty rows
    cols = [rng.choice(2000, n, replace=False) for n in lengths]
    A = sp.csr_matrix((rng.random(lengths.sum()) + 0.5, np.concatenate(cols),
                       np.concatenate([[0], np.cumsum(lengths)])), shape=(3000, 2000))
    B = random_csr(rng, 2000, 3000, 0.003)      # ~9 a row: 0 to ~360 products a row of A
    assert rules.table_ladder(1800, 4) == (32, 64, 128) and rules.table_ladder(1800, 12) == (32, 64)
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
    ladder = rules.table_ladder(48 * 1024, rules.KEY_BYTES)
    top, k = ladder[-1], 10 * ladder[-1]
    row_ct = np.concatenate([np.zeros(50), rng.integers(1, 3 * top, 3000), [top + 1, int(top * 3.1), 5 * top, 10 ** 9]])
    row_ct = rng.permutation(row_ct).astype(np.int64)
    m = row_ct.size
    # a CSR A and csum whose nnz_RowCt is row_ct: one nonzero per row carrying its product count
    Ap = cp.arange(m + 1, dtype=cp.int32)
    csum = cp.asarray(np.concatenate([[0], np.cumsum(row_ct)]))

    class _A:
        indptr = Ap
    sym = analysis._classify(m, k, ladder, A=_A, csum=csum)
    ref = rules.symbolic_index(row_ct, k, ladder)
    assert np.array_equal(sym.idx.get(), ref)
    assert np.array_equal(sym.counts, np.bincount(ref + 1, minlength=len(ladder) + 2))
    assert sym.total == row_ct.sum() and sym.peak == row_ct.max()
    assert sym.risky == int(((np.minimum(row_ct, k) > top) & (ref == len(ladder) - 1)).sum())
    assert sym.var == pytest.approx(row_ct.astype(np.float64).var(), rel=1e-9)
    order, counts = analysis._group(sym, len(ladder), balanced)
    want = rules.balance(ref, balanced, len(ladder))
    assert np.array_equal(sym.idx.get(), want), "the balanced rule is written back to idx"
    assert np.array_equal(counts, np.bincount(want + 1, minlength=len(ladder) + 2))
    order = order.get()
    assert np.array_equal(np.sort(order), np.arange(m))
    assert np.all(np.diff(want[order]) >= 0), "rows come out grouped by table"
    # numeric mode: C's exact row nnz, table_index's rule
    nnz = cp.asarray(np.minimum(row_ct, 2 * top))
    num = analysis._classify(m, k, ladder, row_nnz=nnz)
    assert np.array_equal(num.idx.get(),
                          rules.table_index(np.minimum(row_ct, 2 * top), ladder, rules.NUMERIC_LAST_TABLE_LOAD))
    assert num.total == int(np.minimum(row_ct, 2 * top).sum())
    # the one-pass classes in the analysis's launch: numeric_esc limits (products), then tables
    classes = rules.ESC_CAPS + ladder[:4]
    both = analysis._classify(m, 100, ladder, A=_A, csum=csum, second=(classes, len(rules.ESC_CAPS)))
    want = rules.one_pass_index(row_ct, 100, classes, len(rules.ESC_CAPS))
    assert np.array_equal(both.second.idx.get(), want)
    assert np.array_equal(both.second.counts, np.bincount(want + 1, minlength=len(classes) + 2))
    sorted_rows = (want >= 0) & (want < len(rules.ESC_CAPS))   # numeric_esc's: no symbolic table
    assert sorted_rows.any()
    assert np.array_equal(both.idx.get(), np.where(sorted_rows, -1, rules.symbolic_index(row_ct, 100, ladder)))
    order, counts = analysis._group(both.second, len(classes), False)
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
    runtime._scan("scan_rows", n, (cp.asarray(vals), np.int64(n), Cp, Cp32))
    want = np.concatenate([[0], np.cumsum(vals)])
    assert np.array_equal(Cp.get(), want)
    assert np.array_equal(Cp32.get(), want.astype(np.int32))   # wraps like C's (int) cast
    B = sp.random(5000, 50, density=0.2, format="csr", random_state=1)
    Aj = rng.integers(0, 5000, n).astype(np.int32)
    csum = cp.full(n + 1, -7, dtype=cp.int64)
    runtime._scan("scan_products", n, (cp.asarray(Aj), np.int64(n), cp.asarray(B.indptr.astype(np.int32)), csum))
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
    monkeypatch.setattr(runtime, "SMALL_OUTPUT_FRACTION", 0.0)
    monkeypatch.setattr(runtime, "_free_device_bytes", lambda: 1000)
    with pytest.raises(MemoryError, match="bytes of device memory.*spgemm_panels"):
        hs.spgemm(A, A, passes="two")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("smem_limit, words_per_slot", [(None, 4), (None, 0), (25_600, 4)])
def test_big_tables_sorted_by_column_bitmap_or_bitonic(cp, hs, rng, monkeypatch, dtype, smem_limit,
                                                       words_per_slot):
    """Rows of 512- to 8192-slot numeric tables (~300-5,000 distinct of 20,011 columns; duplicate
    and unsorted indices in A) come out sorted == SciPy whether numeric_shared orders them by the
    column bitmap (bitmap_words > 0) or the bitonic sort (0: switched off, or, at 25,600 bytes a
    block, the 2,048-slot float64 table leaves no room for the bitmap while 512 and 1,024 do)."""
    monkeypatch.setattr(rules, "BITMAP_WORDS_PER_SLOT", words_per_slot)
    monkeypatch.setattr(rules, "LIFT_MIN_TABLE", 1 << 62)   # keep the few big rows in their tables
    used = {}   # table size -> bitmap words of its launch
    real = rules.bitmap_words
    monkeypatch.setattr(rules, "bitmap_words", lambda size, *a: used.setdefault(size, real(size, *a)))
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
    big = {size: w for size, w in used.items() if size > rules.RANK_SORT_MAX}
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
    monkeypatch.setattr(global_rows, "_global_target_blocks", lambda: 256)
    l2 = _cuda.device_attribute("L2CacheSize", cp.cuda.Device().id)
    slab = int(l2 * global_rows.GLOBAL_L2_FRACTION) // 20
    assert global_rows._global_blocks(100, slab, "numeric") == 100           # below the target: one batch
    assert global_rows._global_blocks(1000, slab, "numeric") == 20           # L2's 20 slabs
    assert global_rows._global_blocks(1000, slab * 10, "numeric") == 256 // global_rows.GLOBAL_MAX_PARTS   # 2 fit: 8
    assert global_rows._global_blocks(1000, 1024, "numeric") == 256          # small slabs: the target
