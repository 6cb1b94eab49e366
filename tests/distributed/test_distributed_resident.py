"""Resident operands on an in-process CPU LocalCluster (the SciPy path): A's blocks made resident
once, B or X replicated once, products repeated without planning or sending anything again, Y
left on the workers; compared with SciPy in float64."""
import numpy as np
import pytest
import scipy.sparse as sp

distributed = pytest.importorskip("dask.distributed")
import matplan  # noqa: E402
import matplan.distributed as md  # noqa: E402
from matplan.distributed import blocks as blocks_mod, tasks as tasks_mod  # noqa: E402
from dist_checks import same as _same  # noqa: E402
from conftest import messy_csr, random_csr  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with md.local_cluster(2, gpu=False, processes=False) as lc:
        yield lc.client()


def test_assign_blocks_balances_work_not_counts():
    w = [10, 1, 1, 1, 1, 6]                       # a hub block and small ones
    home = blocks_mod.assign_blocks(w, 2)
    loads = [sum(x for x, h in zip(w, home) if h == k) for k in (0, 1)]
    assert sorted(loads) == [10, 10]
    assert blocks_mod.assign_blocks([0, 0, 0, 0], 2).count(0) == 2   # no work: spread by count
    with pytest.raises(ValueError, match="n_workers"):
        blocks_mod.assign_blocks([1], 0)
    assert blocks_mod.default_nblocks(2, 10, "products") == 2 * blocks_mod.BLOCKS_PER_WORKER
    assert blocks_mod.default_nblocks(2, 5 * blocks_mod.MAX_BLOCK_PRODUCTS, "products") == 6
    assert blocks_mod.default_nblocks(2, 5 * blocks_mod.MAX_BLOCK_PRODUCTS, "nonzeros") == 2


def test_groups_of_puts_one_worker_together():
    hint = {0: "a", 1: "b", 2: "a", 3: None}.get
    assert tasks_mod.groups_of([0, 1, 2, 3], hint) == [("a", [0, 2]), ("b", [1]), (None, [3])]


def test_from_matrix_places_balanced_blocks(client, rng):
    A, B = messy_csr(rng, 300, 200), random_csr(rng, 200, 150, 0.05)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=B)
    assert Ad.rblocks.measure == "products" and len(Ad) >= 2       # one a worker, plus the hub row's own
    long_row = int(np.argmax(np.diff(A.indptr)))
    assert long_row in Ad.bounds and long_row + 1 in Ad.bounds
    infos = Ad.blocks_info()
    assert {i["worker"] for i in infos} == set(client.nthreads())  # spread over both workers
    assert all(i["location"] == "host" and i["kernel"] is None for i in infos)
    assert sum(i["nnz"] for i in infos) == A.nnz == Ad.nnz
    assert (Ad.to_scipy() != A).nnz == 0 and "resident, balanced by products" in repr(Ad)
    assert Ad.timings["place_s"] > 0
    S = md.DistributedCSR.from_matrix(A, client=client, nblocks=3)
    assert S.rblocks.measure == "nonzeros" and len(S) >= 3
    with pytest.raises(TypeError, match="A: expected a sparse"):
        md.DistributedCSR.from_matrix(np.ones((3, 3)), client=client)
    with pytest.raises(ValueError, match="balance: A has 200 columns but this B has 7 rows"):
        md.DistributedCSR.from_matrix(A, client=client, balance=sp.csr_matrix((7, 3)))
    with pytest.raises(ValueError, match="on"):
        md.DistributedCSR.from_matrix(A, client=client, on="tpu")
    Ad.release()
    with pytest.raises(md.DistributedProductError, match="released"):
        Ad.block(0)


def test_replicate_checks_and_says_what_it_holds(client, rng):
    B = random_csr(rng, 20, 10, 0.3)
    with md.replicate(B, client=client) as Br:
        assert Br.sparse and Br.shape == (20, 10) and "sparse B 20x10" in repr(Br) and Br.nbytes > 0
    assert "released" in repr(Br)
    with pytest.raises(md.DistributedProductError, match="released"):
        Br.future()
    X = md.replicate(np.ones((20, 3), dtype=np.float32), client=client)
    assert not X.sparse and X.dtype == np.float32 and "dense X" in repr(X)
    with pytest.raises(TypeError, match="float32 or float64"):
        md.replicate(np.ones(4, dtype=np.int64), client=client)
    with pytest.raises(ValueError, match="1 or 2 dimensions"):
        md.replicate(np.ones((2, 2, 2)), client=client)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_repeated_spgemm_plans_once_and_sends_nothing(client, rng, dtype):
    A, B = messy_csr(rng, 300, 200, dtype), random_csr(rng, 200, 150, 0.05, dtype)
    Br = md.replicate(B, client=client)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br)
    keys = [Ad.future(i).key for i in range(len(Ad))]
    ref = A.astype(np.float64) @ B.astype(np.float64)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    C1 = md.spgemm(Ad, Br)
    C2 = md.spgemm(Ad, Br)
    for C in (C1, C2):
        _same(C.to_scipy(), ref, rtol)
        assert C.dtype == dtype and all(i["check_worst"] <= 1.0 for i in C.blocks_info())
        assert isinstance(C.plan(0), matplan.Plan) and "cpu.scipy" in C.explain()
        assert C.timings["scatter_s"] < 0.5 and C.panels.reason.startswith("replicated beforehand")
    assert C1.timings["planned"] == len(Ad) and C2.timings["planned"] == 0   # the second call planned nothing
    assert all(i["plan_s"] == 0 for i in C2.blocks_info())
    assert [Ad.future(i).key for i in range(len(Ad))] == keys                # A's blocks never sent again
    bound = Ad.bound_plans()
    assert len(bound) == len(Ad) and {p["operand"] for p in bound} == {Br.token}
    assert all(p["op"] == "spgemm" and p["kernel"] == "cpu.scipy" and p["reasons"] for p in bound)
    B2 = random_csr(rng, 200, 90, 0.05, dtype)                                # another B: planned for it
    C3 = md.spgemm(Ad, B2)
    _same(C3.to_scipy(), A.astype(np.float64) @ B2.astype(np.float64), rtol)
    assert C3.timings["planned"] == len(Ad) and len(Ad.bound_plans()) == 2 * len(Ad)


def test_mixed_operands_and_a_product_as_an_operand(client, rng):
    A, B, D = random_csr(rng, 200, 150, 0.04), random_csr(rng, 150, 120, 0.04), random_csr(rng, 120, 80, 0.05)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=B)
    Br = md.replicate(B, client=client)
    _same(md.spgemm(Ad, B).to_scipy(), A @ B)                  # resident A, host B
    _same(md.spgemm(A, Br, nblocks=3).to_scipy(), A @ B)       # host A, replicated B
    C = md.spgemm(Ad, Br)
    _same(md.spgemm(C, md.replicate(D, client=client)).to_scipy(), (A @ B) @ D)   # C's blocks as A
    with pytest.raises(ValueError, match="blocks, nblocks: A is a DistributedCSR"):
        md.spgemm(Ad, Br, nblocks=2)
    with pytest.raises(ValueError, match="panels, panel_bytes: B is replicated"):
        md.spgemm(Ad, Br, panels=2)
    with pytest.raises(ValueError, match="do not conform"):
        md.spgemm(Ad, md.replicate(D, client=client))
    with pytest.raises(ValueError, match="dense"):
        md.spgemm(Ad, md.replicate(np.ones((150, 2)), client=client))
    with pytest.raises(TypeError, match="B: a DistributedCSR"):
        md.spgemm(Ad, md.DistributedCSR.from_matrix(B, client=client))


def test_spmm_with_x_on_the_workers_leaves_y_there(client, rng):
    A = messy_csr(rng, 400, 300, np.float32)                   # float32 A, float64 X: computed in float64
    X = rng.random((300, 5))
    Ad = md.DistributedCSR.from_matrix(A, client=client)
    Xr = md.replicate(X, client=client)
    Y = md.spmm(Ad, Xr)
    assert isinstance(Y, md.DistributedDense) and Y.shape == (400, 5) and Y.dtype == np.float64
    ref = A.astype(np.float64) @ X
    np.testing.assert_allclose(Y.gather(), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(Y.block(1), ref[Y.bounds[1]:Y.bounds[2]], rtol=1e-12, atol=1e-12)
    assert Y.timings["planned"] == len(Ad) and "DistributedDense 400x5" in repr(Y)
    again = md.spmm(Ad, Xr)
    assert again.timings["planned"] == 0 and np.array_equal(again.gather(), Y.gather())
    assert {p["kernel"] for p in Y.plans} == {"cpu.scipy"} and all(p["worker"] for p in Y.blocks_info())
    x = md.replicate(X[:, 0], client=client)                  # a vector: SpMV, y of shape (400,)
    np.testing.assert_allclose(md.spmm(Ad, x).gather(), ref[:, 0], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"X: expected shape \(300,\)"):
        md.spmm(Ad, md.replicate(np.ones((7, 2)), client=client))
    with pytest.raises(ValueError, match="SpGEMM's operand"):
        md.spmm(Ad, md.replicate(sp.random(300, 4, density=0.5, format="csr"), client=client))


def test_iterating_on_a_distributed_y(client, rng):
    """Y = A @ X as the next X: each worker assembles X from Y's blocks; nothing through the client."""
    S = random_csr(rng, 300, 300, 0.03)
    X = rng.random((300, 2))
    with md.DistributedOperator(S, client=client) as op:
        Y = op @ md.replicate(X, client=client)
        for _ in range(3):
            Y = op @ Y
        np.testing.assert_allclose(Y.gather(), S @ (S @ (S @ (S @ X))), rtol=1e-12)
        assert op.last_timings["planned"] == 0 and len(op.plans) == len(op.matrix)
    Ad = md.DistributedCSR.from_matrix(S, client=client)
    with md.DistributedOperator(Ad) as op:                     # over a resident matrix: left to its owner
        y = op @ X[:, 0]
        assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(md.spmm(Ad, X), S @ X, rtol=1e-12)   # still usable after the operator closed
