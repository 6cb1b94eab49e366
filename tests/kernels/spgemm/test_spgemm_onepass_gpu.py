"""GPU tests of the RBSparse hash SpGEMM (the one-pass path, numeric_esc, the hybrid) against SciPy (float64)."""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import messy_csr, random_csr
from matplan.kernels.spgemm import numeric, one_pass, rules, symbolic
from spgemm_gpu_helpers import _check, _check_global_path, _check_one, _dev, _rows_csr
from spgemm_gpu_helpers import global_path, hs  # noqa: F401  fixtures

pytestmark = pytest.mark.gpu


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
        assert info["global_rows_numeric"] == 3 if exact else 3 <= info["global_rows_numeric"] <= rules.ONE_PASS_LONG_ROWS
        _check_global_path(info, global_path)
    monkeypatch.setattr(rules, "ONE_PASS_LONG_ROWS", 2)
    info = {}
    _check_one(cp, hs, A, S, dtype, sort, info, smem_limit=smem)
    assert not info["one_pass"]
    monkeypatch.setattr(rules, "ONE_PASS_LONG_ROWS", 64)
    monkeypatch.setattr(rules, "ONE_PASS_LONG_BYTES", 3 * m * 12 - 1)
    info = {}
    _check_one(cp, hs, A, S, np.float64, sort, info, smem_limit=smem)
    assert not info["one_pass"]


@pytest.mark.parametrize("copier", ["entries", "rows", "ranges"])
def test_one_pass_copies_by_entries_rows_and_ranges(cp, hs, rng, monkeypatch, copier):
    """compact_entries (a block a range of C's entries), compact_rows (a warp a row) and
    compact_ranges (a block a range of rows, an entry a thread) give the same C from a poisoned
    pool: empty rows (a run of 3000 inside one block's entries), rows of one entry, rows of up to
    500 entries over 600 columns."""
    monkeypatch.setattr(one_pass, "COMPACT_ALL_BY_ENTRIES", copier == "entries")
    monkeypatch.setattr(one_pass, "COMPACT_RANGE_BELOW", 10 ** 9 if copier == "ranges" else 0)
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
    caps = rules.ESC_CAPS
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
    cap = next(c for c in rules.ESC_CAPS if c >= top)
    assert info["one_pass"] and info["esc_rows"] == {cap: len(counts)} and not info["numeric_tables"]


def test_sort_based_rows_need_b_narrow_enough_to_pack(cp, hs, rng):
    """numeric_esc packs column << log2(slots) | slot into an int below EMPTY_KEY: rows of 100
    products (the 128-slot class) take it while B has at most esc_max_columns(128) = 2^24 - 1
    columns (the last column used), and keep a hash table one column past that."""
    limit = rules.esc_max_columns(128)
    assert limit == (1 << 24) - 1 and rules.esc_caps(limit)[-1] == 128 and 128 not in rules.esc_caps(limit + 1)
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
    monkeypatch.setattr(rules, "ONE_PASS_LONG_ROWS", 0)   # the two long rows alone force the two passes
    A, B = _rows_of_products(rng, short * 40 + [599, 600, 2], long_a={3, 241}, ncols=400)
    info = {}
    _check_one(cp, hs, A, B, dtype, True, info)   # only 16-product rows: the copy takes 4 lanes a row
    assert info.get("hybrid") and not info["one_pass"] and info["esc_rows"]
    assert sum(info["esc_rows"].values()) == 40 * 4 + 1
    plain = {}
    _check_one(cp, hs, A, B, dtype, True, plain, esc=False)
    assert not plain.get("hybrid")
    for module, name, value in ((symbolic, "HYBRID_MIN_ROWS", 1 << 62), (rules, "ONE_PASS_MEM_FRACTION", 1e-12)):
        with monkeypatch.context() as mp:   # switched off
            mp.setattr(module, name, value)
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
    monkeypatch.setattr(rules, "LIFT_MIN_TABLE", 32)
    monkeypatch.setattr(rules, "LIFT_ROWS_PER_SM", 10 ** 6)
    monkeypatch.setattr(rules, "LIFT_MIN_PRODUCTS", 0)
    info = {}
    _check_one(cp, hs, A, B, dtype, True, info, passes="two", grouping="grouped")
    assert info["lifted_rows"]["symbolic"] > 0 and info["lifted_rows"]["numeric"] > 0
    assert info["global_rows_numeric"] >= info["lifted_rows"]["numeric"]
    assert rules.lift_index(np.array([0, 5, 0, 3, 0]), (32, 64, 128), 10 ** 6, 0) == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("window", [True, False])
def test_esc_window_for_narrow_rows(cp, hs, rng, monkeypatch, dtype, window):
    """Rows of numeric_esc whose columns span at most their class's W * P slots take the dense
    window (window off: all sorted): a banded A·A with rows of 1 to 289 products (every class),
    unsorted and duplicate indices (one column on several lanes of a round) and empty rows; and
    over the identity, rows of 20 products (the 32-slot class) spanning exactly 32 columns
    (window) and 33 (sorted), and a row of one column 20 times."""
    monkeypatch.setattr(numeric, "ESC_WINDOW", window)
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
