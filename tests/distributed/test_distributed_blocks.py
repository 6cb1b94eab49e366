"""matplan.distributed's pure parts: row blocks balanced by work, the row-sum check, the spill
budget and the on-disk format (no cluster needed)."""
import json

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("dask.distributed")
from matplan.distributed import blocks as B  # noqa: E402
from matplan.distributed import store  # noqa: E402
from matplan.distributed.checks import RowSums, check_rowsums  # noqa: E402
from matplan.distributed.spill import SpillRegistry  # noqa: E402
from conftest import messy_csr, random_csr  # noqa: E402


def _block_sums(w, bounds):
    return np.array([w[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])])


def test_weights_are_products_per_row_and_nonzeros(rng):
    A = messy_csr(rng, 60, 40)
    Bm = random_csr(rng, 40, 30, 0.1)
    want = np.array([sum(np.diff(Bm.indptr)[j] for j in A.indices[A.indptr[i]:A.indptr[i + 1]]) for i in range(60)])
    np.testing.assert_array_equal(B.row_weights(A, Bm), want)
    np.testing.assert_array_equal(B.row_weights(A), np.diff(A.indptr))
    np.testing.assert_array_equal(B.row_weights(A, np.ones((40, 3))), np.diff(A.indptr))
    with pytest.raises(ValueError, match="A, B"):
        B.row_weights(A, random_csr(rng, 39, 30, 0.1))
    with pytest.raises(TypeError, match="A: expected a CSR"):
        B.row_weights(np.ones((3, 3)))


@pytest.mark.parametrize("nblocks", [1, 2, 7, 32])
def test_blocks_within_one_row_of_the_mean(rng, nblocks):
    """Without hubs every block's work is within the largest row's work of the mean."""
    w = rng.integers(0, 50, 5000)
    bounds = B.balanced_bounds(w, nblocks)
    assert bounds[0] == 0 and bounds[-1] == w.size and np.all(np.diff(bounds) > 0)
    sums = _block_sums(w, bounds)
    assert len(sums) == nblocks
    assert sums.sum() == w.sum()
    assert np.all(np.abs(sums - w.sum() / nblocks) <= w.max())


def test_hub_row_gets_its_own_block():
    w = np.ones(1000, dtype=np.int64)
    w[400] = 5000          # one row holds most of the work
    bounds = B.balanced_bounds(w, 8)
    assert 400 in bounds and 401 in bounds      # [400, 401) is a block
    sums = _block_sums(w, bounds)
    assert sums.max() == 5000
    others = np.delete(sums, np.flatnonzero(sums == 5000))
    # the ordinary rows are cut evenly between the hub's neighbours: no block past the mean
    assert others.max() <= w.sum() / 8


def test_blocks_balance_products_not_rows(rng):
    """A skewed matrix: equal-row blocks differ by orders of magnitude in products, ours do not."""
    lengths = np.where(rng.random(4000) < 0.02, 200, 2)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    A = sp.csr_matrix((np.ones(indptr[-1]), rng.integers(0, 4000, indptr[-1]), indptr), shape=(4000, 4000))
    rb = B.row_blocks(A, A, nblocks=8)
    assert rb.measure == "products" and sum(rb.weights) == int(B.row_weights(A, A).sum())
    assert rb.imbalance() < 1.25
    even = B.block_weights(B.row_weights(A, A), np.linspace(0, 4000, 9).astype(int))
    assert max(even) / (sum(even) / 8) > rb.imbalance()
    assert "RowBlocks" in repr(rb)


def test_edge_cases_of_the_cuts():
    np.testing.assert_array_equal(B.balanced_bounds(np.zeros(0), 4), [0, 0])           # no rows: one empty block
    np.testing.assert_array_equal(B.balanced_bounds(np.zeros(10), 3), [0, 3, 7, 10])    # no work: by rows
    np.testing.assert_array_equal(B.balanced_bounds(np.ones(3), 10), [0, 1, 2, 3])      # more blocks than rows
    for bad in ([[1, 2]], [-1, 2], [np.nan, 1.0]):
        with pytest.raises(ValueError, match="weights"):
            B.balanced_bounds(np.array(bad), 2)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="nblocks"):
            B.balanced_bounds(np.ones(4), bad)


def test_user_bounds(rng):
    A = random_csr(rng, 20, 20, 0.2)
    rb = B.row_blocks(A, A, blocks=[0, 5, 5, 20])       # an empty block is allowed
    assert rb.bounds == (0, 5, 5, 20) and rb.weights[1] == 0 and len(rb) == 3
    assert list(rb) == [(0, 5), (5, 5), (5, 20)]
    assert B.row_blocks(A, A, blocks=rb) is rb
    for bad in ([0, 25], [1, 20], [0, 10, 5, 20], [0.0, 20.0], [20]):
        with pytest.raises(ValueError, match="blocks"):
            B.row_blocks(A, A, blocks=bad)
    with pytest.raises(ValueError, match="blocks, nblocks"):
        B.row_blocks(A, A, blocks=[0, 20], nblocks=2)
    with pytest.raises(ValueError, match="cover 5 rows"):
        B.row_blocks(A, A, blocks=B.row_blocks(A[:5], A))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rowsum_check_passes_products_and_catches_a_lost_entry(rng, dtype):
    A = messy_csr(rng, 80, 50, dtype)
    Bm = random_csr(rng, 50, 40, 0.2, dtype)
    C = (A @ Bm).tocsr()
    rs, products = RowSums.of(Bm), B.row_weights(A, Bm)
    ok, worst = check_rowsums(A, C, rs, products, dtype)
    assert ok and worst <= 1.0
    row = int(np.argmax(np.diff(C.indptr)))
    at = C.indptr[row] + int(np.argmax(np.abs(C.data[C.indptr[row]:C.indptr[row + 1]])))
    bad = C.copy()
    bad.data[at] = 0.0                                # its largest entry lost
    assert not check_rowsums(A, bad, rs, products, dtype)[0]
    bad.data[at] = np.nan                             # NaN where none should be
    assert check_rowsums(A, bad, rs, products, dtype) == (False, np.inf)
    assert not check_rowsums(A, C[:-1], rs, products, dtype)[0]   # a row missing
    empty = sp.csr_matrix((0, 40), dtype=dtype)
    assert check_rowsums(A[:0], empty, rs, products[:0], dtype) == (True, 0.0)


def test_rowsum_check_with_inf_inputs():
    A = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 1.0]]))
    Bm = sp.csr_matrix(np.array([[np.inf, 0.0], [1.0, 2.0]]))
    C = (A @ Bm).tocsr()
    assert check_rowsums(A, C, RowSums.of(Bm), B.row_weights(A, Bm), np.float64)[0]
    finite = C.copy()
    finite.data[0] = 5.0                              # C finite where the reference is not
    assert not check_rowsums(A, finite, RowSums.of(Bm), B.row_weights(A, Bm), np.float64)[0]


class _FakeBlock:
    def __init__(self, nbytes):
        self.device_nbytes = nbytes

    def to_host(self):
        self.device_nbytes = 0


def test_spill_moves_oldest_blocks_past_the_budget():
    reg = SpillRegistry()
    a, b, c = _FakeBlock(40), _FakeBlock(40), _FakeBlock(40)
    assert reg.add(a, 100) == [] and reg.add(b, 100) == []
    assert reg.resident_bytes() == 80
    assert reg.add(c, 100) == [a]                     # 120 > 100: the oldest goes to the host
    assert a.device_nbytes == 0 and reg.resident_bytes() == 80
    big = _FakeBlock(500)
    assert reg.add(big, 100) == [b, c, big]           # past the budget on its own: it moves too
    assert reg.resident_bytes() == 0
    d = _FakeBlock(10)
    assert reg.add(d, None) == [] and reg.resident_bytes() == 10
    del d                                             # a block Dask released leaves the registry
    assert reg.resident_bytes() == 0
    assert reg.add(_FakeBlock(0), 0) == []            # host blocks are never counted


def test_store_format(tmp_path, rng):
    C = random_csr(rng, 30, 20, 0.2)
    recs = []
    for i, (r0, r1) in enumerate([(0, 10), (10, 10), (10, 30)]):
        rec = store.write_block(tmp_path, i, C[r0:r1])
        recs.append(dict(rec, rows=[r0, r1], kernel="cpu.scipy", reasons=["x"], worker="w", check_worst=0.0))
    store.write_index(tmp_path, C.shape, C.dtype, [0, 10, 10, 30], recs)
    doc = store.read_index(tmp_path)
    assert doc["format"] == store.FORMAT and doc["nnz"] == C.nnz and doc["bounds"] == [0, 10, 10, 30]
    got = sp.vstack([store.read_block(tmp_path, doc, i) for i in range(3)], format="csr")
    assert (got != C).nnz == 0
    with np.load(tmp_path / "block-00000.npz", allow_pickle=False) as z:   # plain arrays, no pickle
        assert {"indptr", "indices", "data", "shape", "format"} <= set(z.files)
    sp.save_npz(tmp_path / "block-00002.npz", C[10:30] * 2, compressed=False)   # changed after saving
    with pytest.raises(ValueError, match="SHA-256"):
        store.read_block(tmp_path, doc, 2)
    idx = json.loads((tmp_path / "index.json").read_text())
    idx["bounds"] = [0, 10, 30, 30, 30]
    (tmp_path / "index.json").write_text(json.dumps(idx))
    with pytest.raises(ValueError, match="bounds"):
        store.read_index(tmp_path)
    with pytest.raises(FileNotFoundError, match="index.json"):
        store.read_index(tmp_path / "nothing")
