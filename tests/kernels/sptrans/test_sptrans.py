"""CPU tests of SpTRANS: the NumPy port of its .cu files against SciPy, and the host side.

The port runs the kernels' exact partitioning and rounds; tiny tiles (block 4, items 2) make
columns span many tiles, so the binary-tree rounds of the cross-merge phase run several times.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import sptrans_radix_reference as rref
import sptrans_reference as ref
from conftest import messy_csr, random_csr

import matplan
from matplan.kernels import _cuda, _graph
from matplan.kernels.sptrans import compiled, gpu, kernel, launches, replay
from matplan.models import sptrans as model

SMALL = dict(block=4, items=2)


def as_dtype(A, dtype):
    """CSR A with its values cast to dtype, duplicates and order kept. Not ``A.astype(dtype)``: SciPy
    sums duplicated entries whenever astype changes the dtype (so a correct A.T of the float64 A
    looked wrong next to it: the 5 H100 failures of the segsort's first GPU run)."""
    A = sp.csr_matrix(A)
    return sp.csr_matrix((A.data.astype(dtype), A.indices, A.indptr), shape=A.shape)


def _same_as_scipy(A, T):
    """T == A.T exactly: pattern, order inside each row of T (stable by row, then position). A is
    copied first: SciPy's abs(A) below sums A's duplicates in place."""
    A = sp.csr_matrix(A).copy()
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
    S = sp.csr_matrix(A, dtype=np.float64).copy()
    S.sum_duplicates()
    U = sp.csr_matrix(T, dtype=np.float64).copy()
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
    assert callable(gpu.transpose)


def test_out_of_range_unchecked_stays_in_bounds(rng):
    """Skipped entries leave orphan slots; no kernel may index past its arrays (NumPy would raise)."""
    A = random_csr(rng, 40, 30, 0.2)
    A.indices[[0, 5, -1]] = [30, -2, 1000]
    T = ref.transpose(A, rng, check=False, **SMALL)
    assert T.indptr[-1] == A.nnz - 3


# ---- the segsort method (sptrans.transpose's default): its NumPy port against SciPy -------------
#: bins forced small so every sort path runs on small matrices: thread <= 2, warp <= 8, block <= 32
#: keys, longer rows of A.T by the chunk + merge-round fallback (block of 4 threads, 2 items each)
TINY = dict(bins=(2, 8, 32), block=4, items=2, stage=64, chunk=64, hash_bits=4, scan_tile=16)


def _col_lengths_csr(rng, m, lengths):
    """CSR of m rows whose column j holds lengths[j] entries at random distinct rows."""
    rows, cols = [], []
    for j, L in enumerate(lengths):
        rows.append(rng.choice(m, size=L, replace=False))
        cols.append(np.full(L, j))
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    vals = (rng.random(rows.size) + 0.5) * rng.choice([-1.0, 1.0], rows.size)
    return sp.csr_matrix((vals, (rows, cols)), shape=(m, len(lengths)))


@pytest.mark.parametrize("kw", [TINY, dict(bins=(4, 16, 64), block=8, items=4, stage=128, chunk=128,
                                           hash_bits=5, scan_tile=32), {}])
def test_segsort_every_bin(rng, kw):
    lengths = [0, 1, 2, 3, 5, 8, 9, 16, 17, 31, 32, 33, 40, 64, 65, 100, 0, 257, 1]
    A = _col_lengths_csr(rng, 300, lengths)
    info = {}
    _same_as_scipy(A, ref.segsort_transpose(A, rng, info=info, **kw))
    if kw is TINY:
        assert info["medium"] > 0 and info["long_in_block"] > 0 and info["long_fallback"] > 0
        assert info["fallback_rounds"] >= 3 and info["short_in_place"] > 0   # one warp: 19 columns > stage


@pytest.mark.parametrize("shape,density", [((60, 50), 0.1), ((7, 300), 0.2), ((300, 7), 0.3),
                                           ((1, 40), 0.5), ((40, 1), 0.5), ((200, 150), 0.05)])
def test_segsort_random(rng, shape, density):
    A = random_csr(rng, *shape, density)
    _same_as_scipy(A, ref.segsort_transpose(A, rng, **TINY))
    _same_as_scipy(A, ref.segsort_transpose(A, rng, bins=(4, 16, 32), block=8, items=2, stage=256))
    _same_as_scipy(A, ref.segsort_transpose(A, rng, bins=(2, 64, 32), block=3, stage=256))   # cap < warp_max


def test_segsort_crowded_warp_sorts_in_place(rng):
    """A warp whose 32 columns hold more keys than it stages: short columns sorted in place in
    global memory; the long ones in the same warp left to spt_sort_big."""
    A = _col_lengths_csr(rng, 400, [2, 300, 1, 2, 0, 250] + [2] * 40)
    info = {}
    _same_as_scipy(A, ref.segsort_transpose(A, rng, info=info, **TINY))
    assert info["short_in_place"] > 0 and info["short_staged"] > 0


def test_segsort_hash_table_crowded(rng):
    """More distinct columns in a chunk than the table's probes find: global atomics per entry."""
    A = random_csr(rng, 50, 400, 0.2)
    info = {}
    _same_as_scipy(A, ref.segsort_transpose(A, rng, info=info, **TINY))
    assert info["crowded"] > 0


def test_segsort_hot_column_aggregated(rng):
    """A column in every row: one global atomic per chunk for it, not one per entry."""
    m = 3000
    A = sp.csr_matrix(random_csr(rng, m, 40, 0.05) + sp.csr_matrix(
        (np.ones(m), (np.arange(m), np.zeros(m, int))), shape=(m, 40)))
    info = {}
    _same_as_scipy(A, ref.segsort_transpose(A, rng, info=info))   # the GPU's constants
    assert info["global_atomics"] < A.nnz / 10


def test_segsort_messy_duplicates_unsorted_long_row(rng):
    for m, n in ((30, 20), (5, 64), (1, 17), (50, 3), (300, 2)):
        A = messy_csr(rng, m, n)
        _same_as_scipy(A, ref.segsort_transpose(A, rng, **TINY))


def test_float32_reference_keeps_duplicates(rng):
    """The GPU tests' float32 case (messy_csr(400, 50): ~130 duplicated entries) with the GPU's
    constants: A.T keeps every duplicate, so the reference must be as_dtype(A), not A.astype (which
    sums them: 939 vs 810 entries, indptr[1] 14 vs 12, the H100 'over-count' of a correct kernel)."""
    A = messy_csr(rng, 400, 50)
    A32 = as_dtype(A, np.float32)
    assert A32.nnz == A.nnz and sp.csr_matrix(A).astype(np.float32).nnz < A.nnz
    for bins in ((32, 512, 4096), (4, 16, 32)):
        T = ref.segsort_transpose(A32, rng, bins=bins)
        assert T.nnz == A.nnz
        _same_as_scipy(A32, T)
    _same_as_scipy(A32, ref.transpose(A32, rng))


def test_segsort_empty_and_degenerate(rng):
    for shape in ((0, 0), (0, 5), (5, 0), (4, 6)):
        T = ref.segsort_transpose(sp.csr_matrix(shape), rng, **TINY)
        assert T.shape == shape[::-1] and T.nnz == 0
    A = sp.csr_matrix((np.ones(3), ([0, 0, 0], [999, 0, 500])), shape=(1, 1000))
    _same_as_scipy(A, ref.segsort_transpose(A, rng, **TINY))


def test_segsort_atomic_order_does_not_matter():
    A = _col_lengths_csr(np.random.default_rng(3), 200, [3, 40, 1, 7, 120, 0, 2])
    outs = [ref.segsort_transpose(A, np.random.default_rng(s), **TINY) for s in range(4)]
    for T in outs[1:]:
        np.testing.assert_array_equal(T.indices, outs[0].indices)
        np.testing.assert_array_equal(T.data, outs[0].data)


def test_segsort_out_of_range(rng):
    A = random_csr(rng, 40, 30, 0.2)
    A.indices[[0, 5, -1]] = [30, -2, 1000]
    with pytest.raises(ValueError, match="A.indices"):
        ref.segsort_transpose(A, rng, **TINY)
    T = ref.segsort_transpose(A, rng, check=False, **TINY)
    assert T.indptr[-1] == A.nnz - 3


def test_segsort_bins_validated():
    assert launches._check_bins(model.BINS) == model.BINS
    for bad in ((0, 8, 32), (33, 64, 64), (8, 4, 32), (4, 513, 64), (4, 8, 48), (4, 8, 8192)):
        with pytest.raises(ValueError, match="bins"):
            launches._check_bins(bad)


@pytest.mark.parametrize("n, nnz", [(1, 1), (7200, 1_339_200), (262_144, 1_810_432), (560_282, 1_652_213)])
def test_scratch_layout_parts_are_disjoint_and_aligned(n, nnz):
    """One scratch allocation a call: the front (keys or radix buffers) 16-byte aligned, then the
    zeroed workspace, whose parts follow one another without overlap. Segsort: control words,
    8-byte status words, the lists, the n + 1 column counts last; radix: the buffers between
    passes, the sorted columns and the tiles' first rows in the front; control words, digit
    histograms, tickets and look-back words zeroed."""
    front, ws_bytes, offs, scan_tiles, max_huge = launches._layout(n, nnz, "segsort", 8, model.BINS,
                                                                   compiled.RADIX_TILE)
    status, lists, huge, counts = offs
    assert front % 16 == 0 and front >= 16 * nnz
    assert status >= compiled._CTRL and status % 2 == 0          # uint64 words after the control words
    assert lists == status + 2 * scan_tiles and scan_tiles * compiled.SCAN_TILE >= n + 1
    assert huge - lists == n and counts - huge == max_huge + 1 and ws_bytes == 4 * (counts + n + 1)
    for key_bytes in (4, 8):
        front, ws_bytes, offs, front_offs, passes, bits, tiles = launches._layout(
            n, nnz, "radix", 8, model.BINS, compiled.RADIX_TILE, key_bytes)
        hist, ticket, look = offs
        sorted_cols, tile_rows = front_offs
        between = launches._radix_between(passes, 8, nnz, key_bytes)[1]
        assert front % 16 == 0 and sorted_cols == between and tile_rows == sorted_cols + 4 * nnz
        assert front >= tile_rows + 4 * (tiles + 1)
        assert hist >= compiled.SEG_N_LIVE + 1 and (ticket - hist, look - ticket) == (passes * 256, passes)
        assert ws_bytes == 4 * (look + passes * tiles * 256) and tiles == -(-nnz // compiled.RADIX_TILE)
        assert passes * bits >= max(1, (n - 1).bit_length()) and bits <= model.RADIX_BITS
    # the tile is part of the cache's key: a build with other tiles gets its own layout
    half = launches._layout(n, nnz, "radix", 8, model.BINS, compiled.RADIX_TILE // 2)
    assert half[6] == -(-2 * nnz // compiled.RADIX_TILE)


def test_segsort_scatter_matches_phase_scatter(rng):
    """spt_scatter's unrolled walk writes what phase_scatter writes (empty rows, long rows, bad indices)."""
    for A in (messy_csr(rng, 60, 40), random_csr(rng, 5, 300, 0.3), sp.csr_matrix((3, 4))):
        A = sp.csr_matrix(A)
        m, n = A.shape
        if A.nnz:
            A.indices[0] = n + 3                          # skipped by both
        indptr, indices = A.indptr.astype(np.int64), A.indices.astype(np.int64)
        counts, rank, _, _ = ref.segsort_count(indices, n, rng)
        t_indptr = np.cumsum(counts)
        np.testing.assert_array_equal(ref.segsort_scatter(indptr, indices, m, t_indptr, rank, n, 8),
                                      ref.scatter_keys(indptr, indices, m, t_indptr, rank, n, 8))


def test_radix_passes_and_auto_method():
    """Digit passes cover column n - 1 in as few passes of at most 8 bits as can; 'auto' takes the
    radix method for at most two passes, long mean columns or wide matrices, the segsort otherwise."""
    assert model.radix_passes(1) == (1, 1) and model.radix_passes(256) == (1, 8) and model.radix_passes(257) == (2, 5)
    assert model.radix_passes(65536) == (2, 8) and model.radix_passes(65537) == (3, 6)
    assert model.radix_passes(1 << 24) == (3, 8) and model.radix_passes((1 << 24) + 1) == (4, 7)
    assert model.auto_method(65536, 65536, 10) == "radix"
    assert model.auto_method(262144, 262144, 7 * 262144) == "segsort"
    assert model.auto_method(262144, 262144, model.RADIX_MEAN_COLUMN * 262144) == "radix"
    assert model.auto_method(100, 100, model.RADIX_NNZ_LIMIT) == "segsort"
    # wide: columns at least RADIX_WIDE times the rows
    assert model.auto_method(47_000, 755_000, 1_800_000) == "radix"
    assert model.auto_method(400_000, 755_000, 1_800_000) == "segsort"
    assert model.auto_method(377_500, 755_000, 1_800_000) == "radix"


# ---- the radix method: its NumPy port against SciPy ----------------------------------------------
@pytest.mark.parametrize("shape,density", [((60, 50), 0.1), ((7, 300), 0.2), ((300, 7), 0.3),
                                           ((1, 40), 0.5), ((40, 1), 0.5), ((200, 1000), 0.02)])
@pytest.mark.parametrize("tile,warps,max_bits", [(2048, 8, 8), (16, 4, 3), (7, 3, 2)])
def test_radix_random(rng, shape, density, tile, warps, max_bits):
    """Tiny tiles, odd warp splits and digits of 2-3 bits: many tiles and up to 5 passes."""
    A = random_csr(rng, *shape, density)
    _same_as_scipy(A, rref.radix_transpose(A, rng, tile, warps, max_bits))


def test_radix_hub_columns_messy_and_bad_indices(rng):
    """A column of every row (the hub the segsort sorts by merge rounds), duplicates and unsorted
    input kept in A's order, empty rows; an index outside [0, n) is dropped."""
    A = _col_lengths_csr(rng, 500, [500, 3, 0, 499, 1] + [2] * 30)
    _same_as_scipy(A, rref.radix_transpose(A, rng, tile=64, warps=4, max_bits=2))
    M = messy_csr(rng, 120, 90)
    _same_as_scipy(M, rref.radix_transpose(M, rng, tile=32, warps=8, max_bits=3))
    bad = random_csr(rng, 30, 20, 0.2)
    keep = bad.copy()
    keep.data[0] = 0.0                      # the entry the kernels skip, removed
    keep.eliminate_zeros()
    bad.indices[0] = 20
    _same_as_scipy(keep, rref.radix_transpose(bad, rng, tile=8, warps=2, max_bits=2))


def test_radix_packed_keys_fit_and_their_buffers_align():
    """radix_rowbits: the row's bits where they and the whole column's fit 31 (the last pass writes
    the column for spt_bounds; none for one pass or RADIX_PACK off); the packed keys' buffers keep
    the values aligned to their element whatever nnz."""
    assert launches.radix_rowbits(262144, 262144) == 0          # 18 + 18 > 31
    assert launches.radix_rowbits(7200, 7200) == 13             # 13 + 13
    assert launches.radix_rowbits(18903, 15975) == 15           # 15 + 14
    assert launches.radix_rowbits(1 << 15, 65536) == 15         # 15 + 16 = 31
    assert launches.radix_rowbits(1 << 16, 65536) == 0          # 16 + 16
    assert launches.radix_rowbits(3000, 256) == 0               # one pass: no keys between
    assert launches.radix_rowbits(1, 1000) == 1
    for nnz in (1, 3, 1001):
        for item in (4, 8):
            between, total, keys = launches._radix_between(3, item, nnz, 4)
            assert between == 2 and keys % 16 == 0 and keys >= 2 * 4 * nnz
            assert total == keys + 2 * item * nnz
            assert launches._radix_between(3, item, nnz)[2] == -(-16 * nnz // 16) * 16


def test_radix_first_rows_long_and_empty_rows(rng):
    """The first pass's rows by the max-scan of each row's first slot: tiles inside one long row,
    tiles across many short and empty rows, empty rows first and last, a last tile cut short."""
    lengths = np.concatenate([[0, 0, 5000, 0, 1], rng.integers(0, 4, 300), [0, 2500, 0, 0]])
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    nnz = int(indptr[-1])
    indices = rng.integers(0, 50, nnz)
    for tile in (2048, 64, 7):
        hist, live, bad, tile_rows = rref.radix_digits(indptr, indices, 50, 1, 6, tile)
        assert live == nnz and not bad and hist.sum() == nnz
        rows = np.concatenate([rref.radix_first_rows(indptr, tile_rows, t, tile, nnz) for t in range(-(-nnz // tile))])
        np.testing.assert_array_equal(rows, np.repeat(np.arange(lengths.size), lengths))
        assert tile_rows[-1] == lengths.size - 3                 # the last nonempty row


@pytest.mark.parametrize("n", [1, 5, 40, 3000])
def test_radix_bounds_every_column_once(rng, n):
    """spt_bounds' indptr from sorted columns: empty columns first, between and last, runs of
    empty columns past 32 left to the block, duplicated columns, no entries at all."""
    for live in (0, 1, 7, 500):
        cols = np.sort(rng.integers(0, n, live) if n < 100 else rng.choice(n, live, replace=False) // 3 * 3)
        indptr = rref.radix_bounds(cols, live, n, tile=64)
        np.testing.assert_array_equal(indptr, np.searchsorted(cols, np.arange(n + 1), side="left"))


def test_recording_keeps_launches_zeroings_and_holds_in_order(monkeypatch):
    """_cuda.recording: Launcher calls, zeroings and held allocations are recorded in order
    (pointers as addresses), nothing reaches the driver; outside it a launch goes to the driver."""
    import types

    class FakeArray:
        def __init__(self, ptr):
            self.data = types.SimpleNamespace(ptr=ptr)
    launched = []
    monkeypatch.setattr(_cuda, "_launch_api", lambda: (lambda *a: launched.append(a),
                                                        lambda: types.SimpleNamespace(ptr=7), FakeArray))
    k = _cuda.Launcher(types.SimpleNamespace(ptr=5), "pip")
    held = object()
    with _cuda.recording() as log:
        k((2,), (32,), (FakeArray(4096), 3, None), 128)
        _cuda.zero(8192, 64)
        _cuda.zero(8192, 0)   # nothing to zero: no record
        _cuda.hold(held)
    assert launched == []
    assert log == [("launch", k, (2, 1, 1), (32, 1, 1), 128, [4096, 3, 0]), ("zero", 8192, 64), ("hold", held)]
    _cuda.hold(held)   # not recording: nothing
    k((1,), (1,), (None, 1, None))
    assert len(launched) == 1 and launched[0][0] == 5 and launched[0][8] == 7


def test_graph_moves_only_pointers_inside_moved_outputs():
    """_graph.rebased: a pointer parameter inside a moved range [old, old + nbytes) moves by
    new - old; one past the end, null, other allocations and non-pointer parameters stay."""
    moves = [(1000, 400, 9000), (5000, 16, 7000)]
    values = [1000, 1399, 1400, 0, 5008, 1200, 3]
    assert _graph.rebased(values, (0, 1, 2, 3, 4), moves) == [9000, 9399, 1400, 0, 7008, 1200, 3]
    assert _graph.rebased(values, (2, 3), moves) is None
    assert values == [1000, 1399, 1400, 0, 5008, 1200, 3]   # not modified in place


def test_replay_cache_makes_room_before_recording_and_reports_bytes():
    """_graph.ReplayCache: a new replay is built after the least recently used one is dropped (its
    memory freed first), counted as an eviction; a lookup makes a replay the most recently used;
    the bytes are the replays' nbytes; reads by key and iteration count no lookup; a build that
    fails keeps nothing under its key."""
    import types
    cache = _graph.ReplayCache("test.replays", 2)
    kept_while_building = []

    def build(nbytes):
        def make():
            kept_while_building.append(sorted(cache))
            return types.SimpleNamespace(nbytes=nbytes)
        return make
    cache.record("a", build(100))
    cache.record("b", build(10))
    assert cache.get("a").nbytes == 100          # "b" is now the least recently used
    cache.record("c", build(1))
    assert kept_while_building[-1] == ["a", "c"] and sorted(cache) == ["a", "c"]
    info = cache.info()
    assert (info.entries, info.nbytes, info.evictions, info.hits, info.misses) == (2, 101, 1, 1, 0)
    assert cache["c"].nbytes == 1 and cache.info().hits == 1
    with pytest.raises(KeyError):
        cache["b"]

    def fail():
        raise RuntimeError("no graph")
    with pytest.raises(RuntimeError):
        cache.record("d", fail)
    assert list(cache) == ["c"] and "test.replays" in matplan.cache_info()


def test_plan_runner_records_at_a_keys_second_call_and_bounds_its_graphs(monkeypatch):
    """SpTrans.runner's policy, with CuPy and the graphs faked (no GPU): an A's first call takes
    run (transpose), its second records a graph, later calls replay it; int64 A never records;
    at most GRAPH_CACHE_SIZE graphs are kept and the keys remembered stay bounded."""
    import types
    ns = types.SimpleNamespace
    monkeypatch.setattr(replay, "cupy_module", lambda: ns(cuda=ns(runtime=ns(getDevice=lambda: 0),
                                                                 get_current_stream=lambda: ns(ptr=7))))
    monkeypatch.setattr(_graph, "available", lambda: True)
    monkeypatch.setattr(replay, "PATTERN_REPLAYS", False)   # its pattern is a GPU transpose

    class FakeReplay:
        made = []

        def __init__(self, call, outputs):
            self.runs = 0
            FakeReplay.made.append(self)

        def run(self, stream_ptr):
            assert stream_ptr == 7
            self.runs += 1
            return ("indptr", "indices", "data")
    monkeypatch.setattr(_graph, "Replay", FakeReplay)
    monkeypatch.setattr(replay, "_result", lambda A, *arrays: ("replayed", A.name))
    monkeypatch.setattr(kernel.SpTrans, "run", lambda self, prepared, B, out=None: ("general", prepared.arrays["A"].name))

    def arr(ptr, dtype, size):
        return ns(data=ns(ptr=ptr), dtype=np.dtype(dtype), size=size)

    def csr(name, base, index=np.int32):
        return ns(name=name, shape=(50, 40), dtype=np.dtype(np.float64), data=arr(base, np.float64, 90),
                  indices=arr(base + 1000, index, 90), indptr=arr(base + 2000, index, 51))
    run = kernel.SpTrans().runner({"method": "segsort"})
    A, B64 = csr("A", 10_000), csr("B64", 20_000, np.int64)
    assert [run(A, None) for _ in range(4)] == [("general", "A")] + [("replayed", "A")] * 3
    assert len(FakeReplay.made) == 1 and FakeReplay.made[0].runs == 3
    assert [run(B64, None) for _ in range(3)] == [("general", "B64")] * 3 and len(run.graphs) == 1
    for i in range(3):   # three more matrices, twice each: the oldest graphs go
        M = csr(f"M{i}", 100_000 * (i + 1))
        assert [run(M, None) for _ in range(2)] == [("general", M.name), ("replayed", M.name)]
        assert len(run.graphs) <= replay.GRAPH_CACHE_SIZE
    for i in range(20):   # each once: nothing recorded
        assert run(csr(f"N{i}", 10_000_000 * (i + 1)), None)[0] == "general"
    assert len(FakeReplay.made) == 4 and len(run.graphs) <= replay.GRAPH_CACHE_SIZE
    with pytest.raises(TypeError, match="B"):
        run(A, A)
