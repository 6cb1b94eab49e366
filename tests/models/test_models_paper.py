"""The models against the papers (SEEDS.md): thresholds, tables and rules, on hand-built inputs."""
import math
import time

import numpy as np
import pytest
import scipy.sparse as sp

import brcp_reference as brcp
from matplan.models import spgemm as spgemm_model, spmv as spmv_model, tsgemm as tsm2
from matplan.core.device import known


# --- TSM2 t2threshold (SEEDS 5: K40c ~40, M40 ~6, P100 ~50) ---------------------------------
@pytest.mark.parametrize("gpu, paper", [("K40c", 40), ("M40", 6), ("P100", 50)])
def test_t2threshold_matches_paper(gpu, paper):
    assert known(gpu).t2threshold(np.float64) == pytest.approx(paper, rel=0.10)


# --- ELL-R sorting rule (SEEDS 2): the paper's table of average warp lengths ----------------
ELLR_TABLE = [  # matrix, before, after, sorting pays
    ("Economics", 22.4, 6.18, True), ("Circuit", 14.1, 5.66, True), ("Harbor", 76.5, 50.7, True),
    ("Protein", 90.3, 60.3, False), ("Accelerator", 16.1, 11.2, False), ("Ship", 40.0, 28.3, False),
    ("Cantilever", 37.6, 32.6, False), ("Spheres", 42.2, 36.6, False),
    ("Wind Tunnel", 31.0, 27.2, False), ("Epidemiology", 3.99, 3.99, False),
]


@pytest.mark.parametrize("name, before, after, sorts", ELLR_TABLE)
def test_ellr_rule_on_paper_table(name, before, after, sorts):
    assert spmv_model.ellr_should_sort(before, after) is sorts


def test_warp_lengths_hand_built():
    # warp 0: one row of 10, the rest 1; warp 1: all 2 but one row of 3
    rl = np.array([10] + [1] * 31 + [2] * 31 + [3])
    # sorted: 10, 3, 2 x 31 | 2 (1 left), ... -> warp 0 max 10, warp 1: 2 and 1s -> max 2
    assert spmv_model.warp_lengths(rl) == (6.5, 6.0)
    # 40 rows: the second warp is padded with empty rows
    rl = np.array([1] * 39 + [5])
    assert spmv_model.warp_lengths(rl) == (3.0, 3.0)
    assert spmv_model.warp_lengths(np.zeros(0, np.int64)) == (0.0, 0.0)


# --- RBSparse (SEEDS 1) ---------------------------------------------------------------------
def test_rbsparse_balanced_boundary():
    assert spgemm_model.rbsparse_balanced(0.5)
    assert not spgemm_model.rbsparse_balanced(0.5000001)
    flat = np.array([10.0, 10.0, 10.0])
    assert spgemm_model.rbsparse_balanced(flat.var() / flat.mean())
    skew = np.array([1.0, 100.0])
    assert not spgemm_model.rbsparse_balanced(skew.var() / skew.mean())


def test_rbsparse_groups_and_boundaries():
    pi = np.pi
    assert (32 * pi) / pi == 32.0   # the boundary below is exact in float64
    # alpha = row_ct / pi: group bounds [0,32) [32,64) [64,128) [128,256) [256,512) [512,inf)
    row_ct = np.array([0, 1, 100, 32 * pi, 101, 64 * pi - 1e-9, 64 * pi, 127 * pi,
                       128 * pi, 300 * pi, 256 * pi, 511.9 * pi, 512 * pi, 1e6])
    want = [0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 4, 4, 5, 5]
    assert spgemm_model.rbsparse_group_ids(row_ct).tolist() == want
    assert spgemm_model.rbsparse_histogram(row_ct) == (3, 3, 2, 1, 3, 2)
    # integer nnz_RowCt: 100/pi = 31.8 (group 0), 101/pi = 32.1 (group 1)
    assert spgemm_model.rbsparse_group_ids(np.array([100, 101], dtype=np.int64)).tolist() == [0, 1]
    assert spgemm_model.RBS_GROUP_TABLE[spgemm_model.rbsparse_group_ids(np.array([2000]))[0]] == 2048


# --- BRCP block widths (SEEDS 4), computed by hand --------------------------------------------
def test_brcp_widths_long_row():
    # T = 4: row 0 (300 > 64*4) gets V = ceil(300/64) = 5, 60 block rows: block 0 (32 of them)
    # and block 1 (28), where row 0 is still the current row, so V = 5 again; rows 10, 5, 5 fill
    # 2 + 1 + 1 block rows, exactly 32; block 2 starts at the row of 1: V = min(4, max(1, 0)) = 1.
    assert brcp.block_widths([300, 10, 5, 5, 1], 4) == [5, 5, 1]
    blocks = brcp.reference_blocks([300, 10, 5, 5, 1], 4)
    assert blocks[1][1][27] == (0, 295, 5) and blocks[1][1][28] == (1, 0, 5)
    assert blocks[2][1][0] == (4, 0, 1) and blocks[2][1][1:] == [None] * 31


def test_brcp_widths_remaining_of_current_row():
    # T = 4. Block 0: V = min(4, max(9, 7)) = 4; row 0 takes 3 block rows (4, 4, 1), rows 1..14
    # two each (4, 3): 31; row 15 takes block row 31 with 4 nonzeros and has 3 left.
    # Block 1: V = min(4, max(3 remaining, 2 next)) = 3.
    L = [9] + [7] * 15 + [2] * 5 + [1] * 3 + [0] * 2
    assert brcp.block_widths(L, 4) == [4, 3]
    b1 = brcp.reference_blocks(L, 4)[1][1]
    assert b1[0] == (15, 4, 3) and b1[1] == (16, 0, 2) and b1[9:] == [None] * 23
    # T caps V: one row of 9 with T = 2 gives V = 2
    assert brcp.block_widths([9], 2) == [2]
    assert brcp.block_widths([], 3) == [] and brcp.block_widths([0, 0], 3) == []


def test_brcp_three_blocks_reported():
    # T = 2: row 0 (300 > 128): V = 5, 60 block rows (blocks 0, 1). Row 1 (129 > 128) starts at
    # block row 60 with block 1's V = 5 (4 block rows), then block 2: V = ceil(129/64) = 3 for the
    # 109 left: 37 block rows, so row 1 touches blocks 1, 2 and 3.
    assert brcp.block_widths([300, 129], 2) == [5, 5, 3, 3]
    lay = brcp.layout(np.array([300, 129]), T=2)
    assert lay.max_blocks_per_row == 3 and not lay.deterministic
    lay = brcp.layout(np.array([300, 10, 5, 5, 1]), T=4)
    assert lay.max_blocks_per_row == 2 and lay.deterministic


def test_brcp_rejects_bad_input():
    with pytest.raises(ValueError, match="sorted_row_lengths"):
        brcp.block_widths([1, 5], 2)
    with pytest.raises(ValueError, match="T"):
        brcp.block_widths([5, 1], 0)
    with pytest.raises(TypeError, match="row_lengths"):
        brcp.layout(np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="row_lengths"):
        brcp.layout(np.array([1, -1]))


# --- BRCP layout arrays ------------------------------------------------------------------------
def test_brcp_layout_tiny_by_hand():
    # rows 0..3 with 2, 0, 3, 1 nonzeros; T = 2. Sorted: row 2 (3), row 0 (2), row 3 (1), row 1 (0).
    # One block, V = min(2, max(3, 2)) = 2: block rows (row 2: 2 + 1), (row 0: 2), (row 3: 1).
    lay = brcp.layout(np.array([2, 0, 3, 1]), T=2)
    assert lay.order.tolist() == [2, 0, 3, 1]
    assert lay.block_width.tolist() == [2] and lay.block_ptr.tolist() == [0, 64]
    assert lay.row_perm.tolist() == [2, 2, 0, 3] + [-1] * 28
    assert lay.row_seg_len.tolist() == [2, 0, 1, 1] + [0] * 28
    # sorted CSR order: row 2's three, row 0's two, row 3's one; slot = block_ptr + c*32 + r
    assert lay.nnz_slot.tolist() == [0, 32, 1, 2, 34, 3]
    assert lay.size == 64 and lay.max_blocks_per_row == 1
    # default T = round(mean + std) = round(1.5 + 1.118) = 3
    assert brcp.layout(np.array([2, 0, 3, 1])).T == spmv_model.brcp_T(1.5, math.sqrt(1.25)) == 3


def _reference_arrays(lengths, lay):
    """row_perm, row_seg_len and slots of the plain per-block reference, for comparison."""
    L = np.asarray(lengths)[lay.order]
    srow = np.concatenate([[0], np.cumsum(L)])
    H = lay.H
    blocks = brcp.reference_blocks(L, lay.T)
    row_perm, seg, slot = [], [], np.full(int(L.sum()), -1)
    for b, (V, rows) in enumerate(blocks):
        base = int(lay.block_ptr[b])
        for r, e in enumerate(rows):
            row_perm.append(-1 if e is None else int(lay.order[e[0]]))
            seg.append(0)
            if e is not None:
                j, first, count = e
                slot[srow[j] + first + np.arange(count)] = base + np.arange(count) * H + r
        r = 0
        while r < H and rows[r] is not None:
            run = 1
            while r + run < H and rows[r + run] is not None and rows[r + run][0] == rows[r][0]:
                run += 1
            seg[b * H + r] = run
            r += run
    return [V for V, _ in blocks], row_perm, seg, slot


def _random_lengths(rng, kind, m):
    if kind == "uniform":
        return rng.integers(0, 12, m)
    if kind == "power":
        return (rng.pareto(1.2, m) * 3).astype(np.int64)
    if kind == "one-long":
        L = rng.integers(0, 5, m)
        if m:
            L[rng.integers(0, m)] = int(rng.integers(300, 3000))
        return L
    return rng.choice([0, 1, 2, 3, 40, 200], m)


@pytest.mark.parametrize("kind", ["uniform", "power", "one-long", "mixed"])
def test_brcp_vectorised_layout_matches_reference(rng, kind):
    for trial in range(40):
        lengths = _random_lengths(rng, kind, int(rng.integers(0, 300)))
        T = None if trial % 2 else int(rng.integers(1, 12))
        lay = brcp.layout(lengths, T)
        widths, row_perm, seg, slot = _reference_arrays(lengths, lay)
        assert lay.block_width.tolist() == widths
        assert lay.row_perm.tolist() == row_perm
        assert lay.row_seg_len.tolist() == seg
        assert lay.nnz_slot.tolist() == slot.tolist()
        # every slot used once, inside the arrays; blocks full but the last
        assert np.unique(lay.nnz_slot).size == lay.nnz and (lay.nnz == 0 or lay.nnz_slot.max() < lay.size)
        assert (np.diff(lay.block_ptr) == lay.H * lay.block_width).all()
        if lay.nblocks:
            assert (lay.row_perm[: (lay.nblocks - 1) * lay.H] >= 0).all()


def test_brcp_layout_long_scan_many_blocks(rng):
    # enough rows for the speculative scan to double its window and meet width changes
    lengths = np.concatenate([rng.integers(1, 4, 20000), rng.integers(20, 60, 3000), [5000, 4000]])
    lay = brcp.layout(lengths)
    assert lay.block_width.tolist() == brcp.block_widths(np.sort(lengths)[::-1], lay.T)


# --- BRCP SpMV arithmetic, emulated with the layout, against SciPy ------------------------------
def _check_spmv(A, rng, T=None):
    lay = brcp.layout(np.diff(A.indptr), T)
    value, col = brcp.pack(lay, A.indptr, A.indices, A.data)
    assert (value[col < 0] == 0).all() and np.count_nonzero(col >= 0) == A.nnz
    x = rng.random(A.shape[1]) + 0.5
    if A.shape[1]:
        x[0] = np.inf if not A[:, 0].nnz else x[0]   # padding must not read x[0]
    y = brcp.spmv_reference(lay, value, col, x)
    want = A @ x
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    return lay


def test_brcp_spmv_emulation_random(rng):
    for m, n, d in [(1, 1, 1.0), (50, 40, 0.1), (300, 200, 0.05), (1000, 700, 0.01)]:
        A = sp.random(m, n, density=d, format="csr", random_state=rng)
        A.data = rng.random(A.nnz) + 0.5
        _check_spmv(A, rng)


def test_brcp_spmv_emulation_empty_rows_and_long_row(rng):
    # T = round(mean + std) grows with the long row itself: it takes many rows for one
    # row to exceed 64 * T (std ~ L / sqrt(m))
    m, n = 20000, 10000
    L = rng.integers(0, 6, m)
    L[rng.random(m) < 0.3] = 0
    L[123] = 8000                           # > 64 * T: cut into blocks of ceil(8000 / 64)
    indptr = np.concatenate([[0], np.cumsum(L)])
    indices = rng.integers(0, n, indptr[-1]).astype(np.int32)
    A = sp.csr_matrix((rng.random(indptr[-1]) - 0.5, indices, indptr), shape=(m, n))
    lay = _check_spmv(A, rng)
    assert L[123] > spmv_model.BRCP_LONG_FACTOR * lay.T
    assert lay.block_width[0] == math.ceil(8000 / spmv_model.BRCP_LONG_FACTOR)
    assert lay.row_perm[0] == 123 and lay.row_seg_len[0] == lay.H   # the long row fills block 0


def test_brcp_spmv_emulation_duplicates_unsorted_and_three_blocks(rng):
    # duplicates and unsorted columns stay as they are; the 129-row spans three blocks (T = 2)
    L = np.array([300, 129, 3, 0, 2])
    indptr = np.concatenate([[0], np.cumsum(L)])
    indices = rng.integers(0, 50, indptr[-1]).astype(np.int32)
    A = sp.csr_matrix((rng.random(indptr[-1]) + 0.5, indices, indptr), shape=(5, 50))
    A.has_sorted_indices = False
    lay = _check_spmv(A, rng, T=2)
    assert lay.max_blocks_per_row == 3


def test_brcp_spmv_emulation_all_empty(rng):
    for shape in [(5, 3), (0, 4), (3, 0)]:
        A = sp.csr_matrix(shape)
        lay = brcp.layout(np.diff(A.indptr))
        assert lay.nblocks == 0 and lay.size == 0 and lay.block_ptr.tolist() == [0]
        value, col = brcp.pack(lay, A.indptr, A.indices, A.data)
        y = brcp.spmv_reference(lay, value, col, np.ones(shape[1]))
        assert y.shape == (shape[0],) and not y.any()


# --- TSM2 model --------------------------------------------------------------------------------
K40C, H100 = known("K40c"), known("H100")


def test_tsm2_memory_bound_small_k_on_k40c():
    for k in (2, 4, 8, 16):
        r = tsm2.choose_params(K40C, 20480, 20480, k, np.float64)
        assert r["bound"] == "memory" and r["objective"] == "memory"
        assert 1 <= r["t2"] <= k and 1 <= r["t3"] <= tsm2.T3_MAX
    # the paper's K40c choice for k = 16: t2 = k, t3 = 4
    r = tsm2.choose_params(K40C, 20480, 20480, 16, np.float64)
    assert (r["t2"], r["t3"]) == (16, 4)


def test_tsm2_compute_bound_large_k_on_k40c():
    thr = K40C.t2threshold(np.float32)          # 59.6
    r = tsm2.choose_params(K40C, 20480, 20480, 64, np.float32)
    assert r["bound"] == "compute" and r["t2threshold"] == pytest.approx(thr)
    assert r["objective"] in ("compute", "memory")
    # float64 k = 64: the compute branch (t2 >= 40) cannot fit in 255 registers, the memory branch runs
    r = tsm2.choose_params(K40C, 20480, 20480, 64, np.float64)
    assert r["bound"] == "compute" and r["objective"] == "memory" and r["t2"] < K40C.t2threshold(np.float64)
    assert tsm2.registers_per_thread(r["t2"], r["t3"], np.float64) <= tsm2.MAX_REGS_PER_THREAD


@pytest.mark.parametrize("gpu", ["K40c", "M40", "P100", "H100"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tsm2_descent_integers_in_range_deterministic_and_near_grid_optimum(gpu, dtype):
    dev = known(gpu)
    for k in (1, 2, 3, 5, 8, 13, 16, 33, 64):
        a = tsm2.gradient_descent(dev, 16384, 16384, k, dtype)
        b = tsm2.gradient_descent(dev, 16384, 16384, k, dtype)
        assert a == b
        assert isinstance(a["t2"], int) and isinstance(a["t3"], int)
        assert 1 <= a["t2"] <= k and 1 <= a["t3"] <= tsm2.T3_MAX
        assert tsm2.registers_per_thread(a["t2"], a["t3"], dtype) <= tsm2.MAX_REGS_PER_THREAD
        assert a["predicted_s"] == tsm2.predict_time(dev, 16384, 16384, k, dtype, None, a["t2"], a["t3"])
        # no worse than the start point, and as good as an exhaustive search of the integer grid
        assert a["predicted_s"] <= tsm2.predict_time(dev, 16384, 16384, k, dtype, None, 1, 1)
        grid = min(tsm2.predict_time(dev, 16384, 16384, k, dtype, None, t2, t3)
                   for t2 in range(1, k + 1) for t3 in range(1, tsm2.T3_MAX + 1))
        assert a["predicted_s"] <= grid * 1.0001


def test_tsm2_descent_is_fast():
    tsm2.gradient_descent(H100, 16384, 16384, 16, np.float64)
    t = time.perf_counter()
    for k in (2, 8, 16):
        tsm2.gradient_descent(H100, 16384, 16384, k, np.float64)
    assert (time.perf_counter() - t) / 3 < 0.05   # ~1-3 ms here; generous for loaded CI machines


def test_tsm2_time_follows_utilisation():
    # memory bound, one pass (t2 = k = 8): the modelled time is bytes / (bandwidth * mem_util),
    # so it falls as t3 raises the memory utilisation and stays once it reaches 1
    m = n = 16384
    t2 = 8
    prev_u, prev_t = 0.0, math.inf
    for t3 in range(1, 9):
        u = tsm2.mem_utilisation(H100, None, t2, t3, np.float64)
        t = tsm2.predict_time(H100, m, n, 8, np.float64, None, t2, t3)
        assert u >= prev_u and t <= prev_t * (1 + 1e-12)
        nbytes = 8 * (m * n + n * 8 + m * 8)
        cu = tsm2.compute_utilisation(H100, None, t2, t3, np.float64)
        assert t == pytest.approx(max(nbytes / (H100.mem_bandwidth * u),
                                      2 * m * n * 8 / (H100.peak_flops(np.float64) * cu)))
        prev_u, prev_t = u, t
    assert prev_u == 1.0
    # fewer columns per pass: A read ceil(k / t2) times
    one = tsm2.predict_time(H100, m, n, 8, np.float64, None, 8, 4)
    two = tsm2.predict_time(H100, m, n, 8, np.float64, None, 4, 4)
    assert two == pytest.approx(2 * one, rel=0.01)


def test_tsm2_occupancy_limits():
    # registers: R = 32 + (3*t2 + 2*t3) * 2 for float64
    assert tsm2.registers_per_thread(8, 4, np.float64) == 32 + (24 + 8) * 2
    occ = tsm2.occupancy(H100, None, 8, 4, np.float64)
    assert occ == pytest.approx(min(2048, 65536 / 96, H100.smem_per_sm / 64))
    assert tsm2.occupancy(H100, 256, 8, 4, np.float64) == 512          # whole blocks of 256
    assert tsm2.occupancy(H100, 1024, 8, 4, np.float64) == 0           # one block does not fit
    assert tsm2.occupancy(H100, None, 64, 1, np.float64) == 0          # over 255 registers
    assert tsm2.predict_time(H100, 100, 100, 64, np.float64, None, 64, 1) == math.inf
    # Little's law: loads in flight per SM on the H100 = 650 cycles / 1.98 GHz * 3.35 TB/s / (132 * 8)
    assert tsm2.loads_needed(H100, np.float64) == pytest.approx(650 / 1.98e9 * 3.35e12 / (132 * 8))


def test_tsm2_choose_params_h100_near_copy_time():
    n, k = 16384, 8
    r = tsm2.choose_params(H100, n, n, k, np.float64)
    floor = n * n * 8 / H100.mem_bandwidth
    assert math.isfinite(r["predicted_s"]) and r["predicted_s"] > 0
    assert floor <= r["predicted_s"] <= 3 * floor
    assert r["bound"] == "memory" and r["t2threshold"] == pytest.approx(80.0, rel=0.01)
    for key in ("t1", "t1_predicted_s", "t2", "t3", "mem_util", "comp_util", "limited_by"):
        assert key in r
    assert r["t1"] and all(t in tsm2.T1_CANDIDATES for t in r["t1"])
    assert all(tsm2.occupancy(H100, t, r["t2"], r["t3"], np.float64) >= t for t in r["t1"])


def test_tsm2_rejects_bad_input():
    with pytest.raises(ValueError, match="k"):
        tsm2.choose_params(H100, 10, 10, 0, np.float64)
    with pytest.raises(TypeError, match="dtype"):
        tsm2.choose_params(H100, 10, 10, 4, np.int32)


def test_planning_bandwidth_snaps_near_the_recorded_copy_bandwidth():
    """Every process plans an H100 with one bandwidth: measurements within COPY_BW_SNAP of the
    recorded copy bandwidth give that figure; a GPU far off (another SKU, a MIG slice) keeps its own."""
    from matplan.core.device import COPY_BW_SNAP, planning_bandwidth
    nominal = known("H100").copy_bandwidth
    assert nominal > 0
    for f in (0.97, 0.99, 1.0, 1.02, 1 + 0.99 * COPY_BW_SNAP):
        assert planning_bandwidth(nominal * f, nominal) == nominal
    for f in (0.6, 1 - 2 * COPY_BW_SNAP, 1.2):
        assert planning_bandwidth(nominal * f, nominal) == nominal * f
    assert planning_bandwidth(1.5e12, 0.0) == 1.5e12          # no recorded figure: as measured


def test_tsm2_model_takes_integer_shapes_only():
    dev = known("H100")
    got = tsm2.model(dev, np.int64(20000), 2000, 8, np.float64, 64, 32.0, 8.0)
    assert got["time_s"] > 0
    for bad in (4.0, 2.5, 0, True):
        with pytest.raises(ValueError, match="^k: expected a positive integer"):
            tsm2.model(dev, 20000, 2000, bad, np.float64, 64, 32.0, 8.0)
