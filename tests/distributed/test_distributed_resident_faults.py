"""Workers lost with resident blocks of A (a process LocalCluster, SciPy path): a block is rebuilt
from the host matrix the client keeps and the product is complete and correct, or, distributed
without its source, the product fails with a clear error; never a partial result. The tests share
one cluster of four workers and each kills one."""
import time

import numpy as np
import pytest

distributed = pytest.importorskip("dask.distributed")
import matplan.distributed as md  # noqa: E402
from dist_checks import same as _same  # noqa: E402
from worker_kill import KillOnFirstBlock, cluster, crash_worker, fault_problem  # noqa: E402,F401 (fixture)


def _kill_holder(c, client, future):
    """Crash the worker holding ``future``'s data and wait until the client knows it is gone."""
    victim = next(iter(client.who_has([future])[future.key]))
    crash_worker(c, victim)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (victim in client.nthreads() or future.status == "finished"):
        time.sleep(0.05)
    assert victim not in client.nthreads()
    return victim


def test_worker_lost_mid_product_on_resident_operands(cluster, rng):
    c, client = cluster
    A, B = fault_problem(rng)
    Br = md.replicate(B, client=client)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br, nblocks=8)
    plugin = KillOnFirstBlock(c)
    c.scheduler.add_plugin(plugin, name="kill-resident")
    try:
        C = md.spgemm(Ad, Br, retries=3, path="tasks")   # the plugin kills on a block task
    finally:
        c.scheduler.remove_plugin(name="kill-resident")
    assert plugin.killed is not None
    assert len(C) == 8 and all(info["check_worst"] <= 1.0 for info in C.blocks_info())
    np.testing.assert_allclose(C.to_scipy().toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-300)
    # A's lost blocks live elsewhere now (rebuilt by matplan, or computed again by Dask: ask the cluster)
    assert plugin.killed not in {info["worker"] for info in Ad.blocks_info(refresh=True)}


def test_resident_block_lost_is_rebuilt_from_its_source(cluster, rng):
    c, client = cluster
    A, B = fault_problem(rng)
    Br = md.replicate(B, client=client)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br, nblocks=4)
    C1 = md.spgemm(Ad, Br)
    victim = _kill_holder(c, client, Ad.future(0))
    C2 = md.spgemm(Ad, Br)                          # block 0 of A sent again from the client's A
    np.testing.assert_allclose(C2.to_scipy().toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-300)
    assert Ad.blocks_info()[0]["worker"] != victim
    np.testing.assert_allclose(C1.to_scipy().toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-300)
    X = rng.random((400, 3))
    _same(md.spmm(Ad, X), A @ X)   # relative to the largest entry: a GPU worker sums in another order


def test_resident_block_lost_without_its_source_is_a_clear_error(cluster, rng):
    c, client = cluster
    A, B = fault_problem(rng)
    Br = md.replicate(B, client=client)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br, nblocks=4, keep_source=False)
    C = md.spgemm(Ad, Br)
    np.testing.assert_allclose(C.to_scipy().toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-300)
    _kill_holder(c, client, Ad.future(0))
    with pytest.raises(md.DistributedProductError, match="lost with its worker.*keep_source=False"):
        md.spgemm(Ad, Br)
    with pytest.raises(md.DistributedProductError, match="keep_source=False"):
        md.spmm(Ad, np.ones(400))
    with pytest.raises(md.DistributedProductError, match="keep_source=False"):
        Ad.to_scipy()
