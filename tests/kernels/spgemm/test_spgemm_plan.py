"""CPU tests of the RBSparse hash SpGEMM's grouping, table sizes and cost model (no GPU needed)."""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from matplan.kernels.spgemm import analysis, global_rows, numeric, rules, runtime
from matplan.kernels.spgemm import kernel as hash_kernel
from matplan.models import spgemm as spgemm_model
from matplan.core import device as device_mod
from matplan.core import features as stats
from matplan.core.validation import normalize

from conftest import random_csr

KB = 1024


def test_ladder_follows_device_shared_memory():
    h100 = device_mod.known("H100")
    assert rules.table_ladder(h100.smem_per_block, 12)[-1] == 16384       # fp64: 16384 * 12 B = 192 KB
    assert rules.table_ladder(h100.smem_per_block, 8)[-1] == 16384        # fp32: 32768 * 8 B > 227 KB
    assert rules.table_ladder(h100.smem_per_block, 4)[-1] == 32768        # symbolic keys only
    paper = rules.table_ladder(48 * KB, 12)                               # the paper's 48 KB cap
    assert paper[0] == 32 and paper[-1] == 2048 and 2048 * 12 + rules.STATIC_SMEM <= 48 * KB
    assert all(b == 2 * a for a, b in zip(paper, paper[1:]))
    with pytest.raises(ValueError, match="smem_limit"):
        rules.table_ladder(100, 12)


@pytest.mark.parametrize("size", [32, 64, 128, 256, 512, 1024, 2048, 16384])
def test_launch_shape_fits(size):
    tpr, rpb = rules.launch_shape(size, 12, 227 * KB)
    # a row is 8 or 16 lanes of a warp (small tables only), or whole warps: the kernels' widths
    assert (tpr in (8, 16) and size <= rules.SUBWARP_MAX_TABLE) or (tpr % 32 == 0 and 32 <= tpr <= 1024)
    assert rules.group_width(tpr) in rules.GROUP_WIDTHS
    assert rpb >= 1 and tpr * rpb <= 1024 and rpb <= rules.MAX_RPB == 32
    assert (tpr * rpb) % 32 == 0   # whole warps a block
    assert rpb * size * 12 + rules.STATIC_SMEM <= 227 * KB


def test_table_index_never_undersizes():
    ladder = rules.table_ladder(48 * KB, 12)
    need = np.array([0, 1, 16, 17, 1024, 1025, 2048, 2049, 10 ** 6])
    idx = rules.table_index(need, ladder)
    assert idx[0] == -1
    for n, i in zip(need[1:], idx[1:]):
        if i < len(ladder):
            assert n <= ladder[i] and (i == len(ladder) - 1 or n <= rules.table_load(ladder[i]) * ladder[i])
            if i > 0:  # the smallest adequate table
                assert n > rules.table_load(ladder[i - 1]) * ladder[i - 1]
        else:
            assert n > ladder[-1]
    assert list(idx[1:]) == [0, 0, 1, 6, 6, 6, 7, 7]


def test_symbolic_index_uses_bound_then_alpha():
    ladder = (32, 64, 128)
    row_ct = np.array([0, 10, 100, 200, 300, 500, 10 ** 4])
    idx = rules.symbolic_index(row_ct, 10 ** 6, ladder)
    # 200, 300 exceed 128 but alpha = ct/pi <= 128: the largest table, may overflow
    assert list(idx) == [-1, 0, 2, 2, 2, 3, 3]
    # a narrow B bounds the distinct columns: min(ct, k) decides
    assert list(rules.symbolic_index(row_ct, 50, ladder)) == [-1, 0, 2, 2, 2, 2, 2]


def test_balance_rule_gives_one_table():
    idx = np.array([-1, 0, 2, 1, 5])
    assert list(rules.balance(idx, True, 5)) == [-1, 2, 2, 2, 5]     # global row (5) stays global
    assert list(rules.balance(idx, False, 5)) == list(idx)
    assert list(rules.balance(idx, np.asarray(True), 5)) == [-1, 2, 2, 2, 5]


def test_groups_of_orders_rows():
    idx = np.array([1, -1, 0, 1, 3, 0])
    order, counts = analysis.groups_of(idx, 3)
    assert list(counts) == [1, 2, 2, 0, 1]   # -1, 0, 1, 2, 3(global)
    assert list(idx[order]) == sorted(idx)
    assert order.dtype == np.int32


def _features(A, B, dtype=np.float64):
    problem = normalize(A.astype(dtype), B.astype(dtype))
    return stats.compute(problem, device_mod.known("H100"))


def test_product_offsets_formula_matches_stats(rng):
    A, B = random_csr(rng, 50, 40, 0.1), random_csr(rng, 40, 30, 0.2)
    b_len = np.diff(B.indptr)
    csum = np.concatenate([[0], np.cumsum(b_len[A.indices])])
    assert np.array_equal(csum[A.indptr[1:]] - csum[A.indptr[:-1]], stats.products_per_row(A, B))


def test_cost_explains_balanced_and_grouped(rng):
    h100 = device_mod.known("H100")
    kernel = hash_kernel.HashSpGEMM()
    A = sp.eye(1000, format="csr") * 2.0                         # every row: 1 product -> balanced
    f = _features(A, A)
    assert spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
    c = kernel.cost(f, {"sort": True}, h100)
    assert "balanced" in c.why and "every row fits" in c.why and c.run_s > 0
    lengths = np.ones(2000, dtype=int)
    lengths[:5] = 1500                                           # a few heavy rows -> grouped
    rows = np.repeat(np.arange(2000), lengths)
    cols = np.concatenate([rng.choice(2000, n, replace=False) for n in lengths])
    S = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(2000, 2000))
    f = _features(S, S)
    assert not spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
    c = kernel.cost(f, {"sort": True}, h100)
    assert "grouped" in c.why and "alpha in" in c.why


def test_hash_path_follows_spgemm_rule():
    """The cost model's path is spgemm()'s own choice: one pass while every row's bound fits
    ONE_PASS_MAX_TABLE (balanced or grouped by the RBSparse rule) or the long rows are very few
    (one_pass_long), the hybrid when few rows are long, else two passes; each path's fixed cost
    is in the cost and named in the why, and the one-pass paths' first-call excess is the
    preparation."""
    h100 = device_mod.known("H100")
    kernel = hash_kernel.HashSpGEMM()
    n = 3000
    band = sp.diags([1.0, 2.0, 1.0], [-1, 0, 1], shape=(n, n), format="csr")
    f = _features(band, band)
    assert hash_kernel.hash_path(f, h100.smem_per_block) == "one pass, balanced"
    c = kernel.cost(f, {"sort": True}, h100)
    assert "one pass, balanced, direct" in c.why   # 3 products a row: every row numeric_esc's, C in place
    assert c.run_s >= spgemm_model.HASH_FIXED_S["one pass, direct"]
    # a first call goes on from no guessed analysis: its excess is the preparation (reuse weighs it)
    assert c.prepare_s == spgemm_model.HASH_FIRST_EXTRA_S > 0 and "a first call" in c.why
    lengths = np.ones(n, dtype=int)
    lengths[:3] = 10                                              # a few longer rows: grouped
    rows = np.repeat(np.arange(n), lengths)
    cols = (rows + np.concatenate([np.arange(c) for c in lengths])) % n
    G = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    f = _features(G, G)
    assert f.rowct_max <= rules.ONE_PASS_MAX_TABLE and not spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
    assert hash_kernel.hash_path(f, h100.smem_per_block) == "one pass, grouped"
    hub = sp.csr_matrix((np.ones(n), (np.zeros(n, int), np.arange(n))), shape=(n, n)) + sp.eye(n)
    f = _features(hub.tocsr(), hub.tocsr())
    assert min(f.rowct_max, f.k) > rules.ONE_PASS_MAX_TABLE
    assert hash_kernel.hash_path(f, h100.smem_per_block) == "one pass, grouped"   # one long row: one_pass_long
    w, h = 7000, rules.ONE_PASS_LONG_ROWS + 6                       # h long rows: past one_pass_long, within
    hubs = sp.csr_matrix((np.ones(h * 200), (np.repeat(np.arange(h), 200), np.tile(np.arange(200), h))),
                         shape=(w, w)) + sp.eye(w)                 # HYBRID_LONG_ROWS of 7000
    f = _features(hubs.tocsr(), hubs.tocsr())
    assert hash_kernel.hash_path(f, h100.smem_per_block) == "hybrid"       # the long rows hashed, the rest sorted
    hybrid = kernel.cost(f, {"sort": True}, h100)
    assert "hybrid" in hybrid.why and hybrid.run_s >= spgemm_model.HASH_FIXED_S["hybrid"]
    assert hybrid.prepare_s == 0 and "a first call" not in hybrid.why    # never guessed: every call a first call
    dense = sp.random(300, 300, density=0.5, format="csr", random_state=1)   # every row long
    f = _features(dense, dense)
    assert hash_kernel.hash_path(f, h100.smem_per_block) == "two passes"
    two = kernel.cost(f, {"sort": True}, h100)
    assert "two passes" in two.why and two.run_s >= spgemm_model.HASH_FIXED_S["two passes"]
    assert two.prepare_s == 0


def test_cost_names_global_rows():
    h100 = device_mod.known("H100")
    n = 60000
    dense_row = sp.csr_matrix((np.ones(n), (np.zeros(n, int), np.arange(n))), shape=(n, n))
    A = (dense_row + sp.eye(n)).tocsr()              # row 0: 60,000 products, alpha ~ 19,000
    f = _features(A, sp.eye(n, format="csr"))
    balanced, why, n_global = hash_kernel.describe_groups(f, h100.smem_per_block)
    assert f.rowct_max / math.pi > 16384 and n_global >= 1 and "global-memory path" in why


def test_cost_charges_slabs_only_where_the_global_rows_take_them(monkeypatch):
    """The global rows' dense slabs (B.shape[1] columns written and scanned, a row) are charged
    where global_seg_shape sends them there; by column segments in shared memory the products'
    traffic already covers them, and the cost says which."""
    h100 = device_mod.known("H100")
    n = 60000
    dense_row = sp.csr_matrix((np.ones(n), (np.zeros(n, int), np.arange(n))), shape=(n, n))
    f = _features((dense_row + sp.eye(n)).tocsr(), sp.eye(n, format="csr"))
    n_global = hash_kernel.describe_groups(f, h100.smem_per_block)[2]
    kernel = hash_kernel.HashSpGEMM()
    monkeypatch.setattr(global_rows, "GLOBAL_SEG_MIN_BLOCKS_PER_SM", 0.0)
    seg = kernel.cost(f, {"sort": True}, h100)
    assert "column segment" in seg.why and "slabs" not in seg.why
    monkeypatch.setattr(global_rows, "GLOBAL_SEG_MIN_BLOCKS_PER_SM", float("inf"))
    slabs = kernel.cost(f, {"sort": True}, h100)
    assert "dense slabs" in slabs.why
    assert slabs.run_s - seg.run_s == pytest.approx(n_global * n * (rules.KEY_BYTES + 8) * 2 / h100.mem_bandwidth)


def test_planner_explains_hash_when_costed():
    h100 = device_mod.known("H100")
    A = sp.random(3000, 3000, density=0.003, format="csr", random_state=1) + sp.eye(3000)
    f = _features(A.tocsr(), A.tocsr())
    c = hash_kernel.HashSpGEMM().cost(f, {"sort": True}, h100)
    assert f"{f.rowct_var_over_mean:.2f}" in c.why


@pytest.mark.parametrize("batch_rows", [1, 12, 10_000])
@pytest.mark.parametrize("ncols", [1, 4095, 4096, 4097, 65536, 500_000, 10 ** 7])
def test_global_segments_cover_columns(monkeypatch, ncols, batch_rows):
    monkeypatch.setattr(runtime, "_device_limits", lambda device_id: (227 * KB, 132))
    monkeypatch.setattr(runtime, "_device_id", lambda: 0)
    segs, seg_cols = global_rows._global_segments(ncols, batch_rows)
    step = global_rows.GLOBAL_BLOCK_THREADS * global_rows.GLOBAL_SCAN_COLS
    assert 1 <= segs <= global_rows.GLOBAL_MAX_SEGMENTS and seg_cols % step == 0
    assert (segs - 1) * seg_cols < ncols <= segs * seg_cols   # every column, no empty segment
    if batch_rows >= 132 * global_rows.GLOBAL_BLOCKS_PER_SM:
        assert segs == 1   # enough blocks from the rows alone: no counting pass


def test_one_pass_long_rows_rule():
    """The one-pass path also takes a few rows past its classes (the first table past
    ONE_PASS_MAX_TABLE, or none): at most ONE_PASS_LONG_ROWS of them, their slabs within
    ONE_PASS_LONG_BYTES, and its upper-bound buffer within upper_bound_fits."""
    classes = (16, 32, 64, 128, 256, 512, 64, 128, 256, 512, 1024)   # 6 numeric_esc classes, then tables
    assert rules.one_pass_lift(classes, 6) == 9            # the 512-slot table
    assert rules.one_pass_lift((16, 32, 64, 128, 256), 2) == 5   # no table past 256: only the unclassed rows
    big = 2 ** 40                                        # device bytes: the upper-bound buffer fits
    assert rules.one_pass_long(0, 10**6, 10**6, 8, big)
    assert rules.one_pass_long(rules.ONE_PASS_LONG_ROWS, 1000, 10**6, 8, big)
    assert not rules.one_pass_long(rules.ONE_PASS_LONG_ROWS + 1, 1000, 10**6, 8, big)
    k = rules.ONE_PASS_LONG_BYTES // 12
    assert rules.one_pass_long(1, k, 10**6, 8, big) and not rules.one_pass_long(1, k + 1, 10**6, 8, big)
    assert not rules.one_pass_long(1, 1000, 2**31, 4, 2**50)     # 2^31 products: no upper-bound buffer


def test_one_pass_table_rule():
    """The one-pass path needs every row's bound within ONE_PASS_MAX_TABLE and the largest table,
    and its upper-bound buffer within ONE_PASS_MEM_FRACTION of the device and 2^31 entries."""
    big = 80 * 2**30
    assert rules.one_pass_table(49, 10**6, 16384, 12_527_104, 8, big)
    assert rules.one_pass_table(10**6, 100, 16384, 10**7, 8, big)          # bound min(peak, k) = 100
    assert not rules.one_pass_table(rules.ONE_PASS_MAX_TABLE + 1, 10**6, 16384, 10**6, 8, big)
    assert not rules.one_pass_table(100, 10**6, 64, 10**6, 8, big)           # past the largest table
    assert not rules.one_pass_table(49, 10**6, 16384, 2**31, 4, 2**50)       # 2^31 products
    assert not rules.one_pass_table(49, 10**6, 16384, big // 12 // 8, 8, big)
    # numeric_esc's largest class opens the path to rows past the table bound
    assert rules.one_pass_table(512, 10**6, 16384, 10**6, 8, big, esc_cap=512)
    assert not rules.one_pass_table(513, 10**6, 16384, 10**6, 8, big, esc_cap=512)
    assert not rules.one_pass_table(300, 10**6, 16384, big // 12 // 8, 8, big, esc_cap=512)   # buffer still bounds it


def test_esc_classes_and_their_column_limits():
    """numeric_esc's classes are W * P powers of two from 16 to 512 (the kernel's static_assert);
    a product packs column << log2(slots) | slot below EMPTY_KEY, so the widest B a class takes
    leaves its largest packed value under 2^31 - 1; wider B drop the larger classes first."""
    assert rules.ESC_CAPS == tuple(sorted(rules.ESC_CAPS)) and rules.ESC_CAPS[0] == 16 and rules.ESC_CAPS[-1] == 512
    for (w, p), cap in zip(rules.ESC_CLASSES, rules.ESC_CAPS):
        assert cap == w * p and cap & (cap - 1) == 0 and w in (8, 16, 32)
        bits = cap.bit_length() - 1
        limit = rules.esc_max_columns(cap)
        assert ((limit - 1) << bits | (cap - 1)) < 2**31 - 1          # the largest packed product
        assert (limit << bits | (cap - 1)) >= 2**31 - 1               # one column more would not fit
    assert rules.esc_caps(1000) == rules.ESC_CAPS
    assert rules.esc_caps(rules.esc_max_columns(128)) == (16, 32, 64, 128)
    assert rules.esc_caps(rules.esc_max_columns(16) + 1) == ()


def test_one_pass_classes_reference():
    """one_pass_index (the xp mirror of classify_rows' second classification): numeric_esc classes
    compare a row's products, tables its bound min(products, k); -1 for rows without products."""
    classes = rules.ESC_CAPS + (32, 64, 128, 256)
    n_esc = len(rules.ESC_CAPS)
    rc = np.array([0, 5, 16, 17, 512, 513, 10**6])
    got = rules.one_pass_index(rc, 100, classes, n_esc)
    assert list(got) == [-1, 0, 0, 1, 5, n_esc + 2, n_esc + 2]   # 513 and 10^6: bound 100 -> 128 table
    assert list(rules.one_pass_index(rc, 10**7, classes, n_esc))[-2:] == [len(classes), len(classes)]
    assert rules.upper_bound_fits(10**6, 8, 80 * 2**30) and not rules.upper_bound_fits(2**31, 4, 2**60)


def test_lift_index_takes_few_big_table_rows():
    """lift_index: from the smallest big table (>= LIFT_MIN_TABLE slots) whose rows, with every
    larger table's, are at most LIFT_ROWS_PER_SM per SM; -1 when there are too many or none, or
    when the largest row has fewer than LIFT_MIN_PRODUCTS products."""
    ladder = (1024, 2048, 4096, 8192, 16384)
    counts = np.array([0, 900, 50, 4, 12, 6, 12])   # -1, the tables, global
    peak = rules.LIFT_MIN_PRODUCTS
    assert rules.lift_index(counts, ladder, 132, peak) == 2               # 22 rows <= 66
    assert rules.lift_index(counts, ladder, 20, peak) == 4                # only the 6 rows fit 10
    assert rules.lift_index(counts, ladder, 132, peak - 1) == -1          # no row worth the global path
    assert rules.lift_index(np.array([0, 900, 50, 0, 0, 0, 3]), ladder, 132, peak) == -1
    assert rules.lift_index(np.array([0, 0, 0, 8002, 6383, 9000, 0]), ladder, 132, peak) == -1   # R-MAT-like


def test_bitmap_words_only_where_it_fits_and_pays():
    """numeric_shared's column bitmap: sorted rows, one row a block, tables past the rank sort,
    B's columns at most BITMAP_WORDS_PER_SLOT words a slot, and room beside the table."""
    smem = 227 * KB
    assert rules.bitmap_words(16384, 1, 65_536, 12, smem, True) == 2048
    assert rules.bitmap_words(16384, 1, 262_144, 12, smem, True) == 8192       # 192 + 32 KB fit
    assert rules.bitmap_words(16384, 1, 400_000, 12, smem, True) == 0          # 192 + 49 KB do not
    assert rules.bitmap_words(512, 1, 512 * 32 * rules.BITMAP_WORDS_PER_SLOT, 12, smem, True) > 0
    assert rules.bitmap_words(512, 1, 512 * 32 * rules.BITMAP_WORDS_PER_SLOT + 32, 12, smem, True) == 0
    assert rules.bitmap_words(rules.RANK_SORT_MAX, 1, 1000, 12, smem, True) == 0  # the rank sort's tables
    assert rules.bitmap_words(1024, 2, 1000, 12, smem, True) == 0              # several rows a block
    assert rules.bitmap_words(1024, 1, 1000, 12, smem, False) == 0             # unsorted output


def test_rank_sort_max_matches_the_kernel():
    from matplan.kernels import _cuda
    assert f"#define RANK_SORT_MAX {rules.RANK_SORT_MAX}\n" in _cuda.source("spgemm/hash_shared.cu")


def test_compact_names_its_copier():
    """_compact takes its copier by name (compact_rows, compact_ranges, compact_entries); another
    name is an error before anything is launched."""
    assert numeric.COMPACT_HOW == ("rows", "ranges", "entries")
    with pytest.raises(ValueError, match="how: expected one of"):
        numeric._compact(None, None, None, None, None, None, runtime.NULL_PTR, how="cols")


def test_global_segment_columns_fit_shared_memory():
    """numeric_global_seg's segment: k cut into as few equal segments (multiples of 32 columns) as
    fit beside STATIC_SMEM with values and bitmap (H100's 227 KB: 28,480 float64 / 56,128 float32
    columns at most); the kernel's block size is global_rows.py's."""
    from matplan.kernels import _cuda
    smem = 227 * KB
    assert global_rows.global_seg_cols(65_536, 8, smem) == 21_856 and global_rows.global_seg_cols(65_536, 4, smem) == 32_768
    assert global_rows.global_seg_cols(262_144, 8, smem) == 26_240 and global_rows.global_seg_cols(28_480, 8, smem) == 28_480
    assert global_rows.global_seg_cols(1000, 8, smem) == 1024 and global_rows.global_seg_cols(100, 8, 48 * KB) == 128
    assert global_rows.global_seg_cols(3000, 8, 1800) == 64 and global_rows.global_seg_cols(3000, 4, 1800) == 160
    for k, item, limit in ((65_536, 8, smem), (10 ** 6, 4, 48 * KB), (3000, 8, 1800), (28_481, 8, smem)):
        cols = global_rows.global_seg_cols(k, item, limit)
        assert cols % 32 == 0 and cols * item + cols // 8 + rules.STATIC_SMEM <= max(limit, 32 * item + 4 + rules.STATIC_SMEM)
        assert -(-k // cols) == -(-k // ((8 * (limit - rules.STATIC_SMEM)) // (8 * item + 1) // 32 * 32 or 32))
    assert f"#define SEG_THREADS {global_rows.GLOBAL_SEG_THREADS}\n" in _cuda.source("spgemm/hash_global.cu")


def test_symbolic_bitmap_takes_big_tables(monkeypatch):
    """Rows of symbolic tables of at least SYMBOLIC_BITMAP_RATIO slots a word of B's column bitmap
    count their columns in the bitmap (R-MAT 16, k = 65,536: 2,048 words, tables of 512 slots and
    up); none where the bitmap is past shared memory or the shared bitmaps are off."""
    smem = 227 * KB
    assert global_rows.symbolic_bitmap_from(65_536, smem) == global_rows.SYMBOLIC_BITMAP_RATIO * 2048 == 512
    assert global_rows.symbolic_bitmap_from(8 * smem, smem) == math.inf            # a bitmap of smem bytes
    monkeypatch.setattr(global_rows, "SYMBOLIC_GLOBAL_SHARED", False)
    assert global_rows.symbolic_bitmap_from(65_536, smem) == math.inf


def test_global_segments_or_slabs():
    """Segments for at most GLOBAL_SEG_MAX_SEGMENTS a row that give every SM a block (H100:
    R-MAT 16's 2,938 rows x 3 float64 segments; R-MAT 18's 10), slabs otherwise (ice40's 8 rows
    x 4 segments on 132 SMs, more than 32 segments...)."""
    smem = 227 * KB
    assert global_rows.global_seg_shape(65_536, 8, smem, 2938, 132) == (21_856, 3)
    assert global_rows.global_seg_shape(65_536, 4, smem, 2938, 132) == (32_768, 2)
    assert global_rows.global_seg_shape(262_144, 8, smem, 33_467, 132) == (26_240, 10)
    assert global_rows.global_seg_shape(100_000, 8, smem, 8, 132) is None                 # 8 x 4 blocks
    assert global_rows.global_seg_shape(28_480 * (global_rows.GLOBAL_SEG_MAX_SEGMENTS + 1), 8, smem, 1000, 132) is None
    assert global_rows.global_seg_shape(28_480 * global_rows.GLOBAL_SEG_MAX_SEGMENTS, 8, smem, 1000, 132) == (28_480, 32)


def test_cusparse_cost_charges_rows_of_many_products(rng):
    """cuSPARSE's SpGEMM cost adds CUSPARSE_SPGEMM_LONG_ROW_BYTES per expected nonzero of C in rows
    of alpha >= 512 (models.spgemm.long_row_nnz), and says so; rows below it add nothing."""
    from matplan.kernels.spgemm import vendor
    from matplan.models import traffic
    h100 = device_mod.known("H100")
    short = _features(random_csr(rng, 300, 300, 0.02), random_csr(rng, 300, 300, 0.02))
    assert spgemm_model.long_row_nnz(short) == 0.0
    assert "alpha >=" not in vendor.CusparseSpGEMM().cost(short, {}, h100).why
    A = random_csr(rng, 40, 400, 0.5)                      # ~200 nonzeros a row over B's rows of ~60
    B = random_csr(rng, 400, 5000, 0.012)
    f = _features(A, B)
    assert f.rbs_groups[-1] > 0                             # alpha = ~12,000 / pi >= 512
    long_nnz = spgemm_model.long_row_nnz(f)
    assert 0 < long_nnz <= traffic.spgemm_nnz_c(f) + 1e-6
    cost = vendor.CusparseSpGEMM().cost(f, {}, h100)
    nbytes, _, _ = spgemm_model.fitted_bytes(f, spgemm_model.CUSPARSE_SPGEMM_BYTES)
    extra = long_nnz * spgemm_model.CUSPARSE_SPGEMM_LONG_ROW_BYTES["float64"] / h100.mem_bandwidth
    assert cost.run_s == pytest.approx(nbytes / h100.mem_bandwidth + extra + spgemm_model.CUSPARSE_SPGEMM_OVERHEAD_S)
    assert "alpha >= 512" in cost.why
