"""Workers lost in the middle of a distributed product (a process LocalCluster, SciPy path): the
product either recomputes the lost blocks and returns a full, correct C, or fails with a clear
error; it never returns a partial C as complete. The tests share one cluster of three workers
and each kills one, in file order (the last runs on the one left)."""

import numpy as np
import pytest
import scipy.sparse as sp

distributed = pytest.importorskip("dask.distributed")
import matplan.distributed as md  # noqa: E402
from conftest import random_csr  # noqa: E402
from worker_kill import KillOnFirstBlock, crash as _crash  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        with distributed.Client(c) as client:
            client.wait_for_workers(3)
            yield c, client


def _problem(rng):
    A = random_csr(rng, 600, 400, 0.02)
    return A, random_csr(rng, 400, 300, 0.02)


def _plugin(c):
    plugin = KillOnFirstBlock(c)
    c.scheduler.add_plugin(plugin, name=f"kill-{id(plugin)}")
    return plugin


def _remove(c, plugin):
    c.scheduler.remove_plugin(name=f"kill-{id(plugin)}")


def test_block_lost_after_the_call_is_recomputed(cluster, rng):
    """A worker that dies after the product returned: reading its blocks computes them again."""
    c, client = cluster
    A, B = _problem(rng)
    C = md.spgemm(A, B, client=client, nblocks=6)
    holders = client.who_has(C._futures)
    victim = next(iter(holders[C._futures[0].key]))
    for nanny in list(c.workers.values()):
        if nanny.worker_address == victim:
            _crash(nanny)
    got = C.to_scipy()
    np.testing.assert_allclose(got.toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-300)
    Z = sp.csr_matrix((5, 300))
    assert md.spgemm(sp.csr_matrix((5, 400)), B, client=client).to_scipy().shape == Z.shape


def test_worker_lost_mid_product_blocks_recomputed(cluster, rng):
    c, client = cluster
    A, B = _problem(rng)
    plugin = _plugin(c)
    try:
        C = md.spgemm(A, B, client=client, nblocks=12, retries=3)
    finally:
        _remove(c, plugin)
    assert plugin.killed is not None
    assert C.timings["resubmitted"] >= 1            # the lost worker's blocks ran again elsewhere
    got = C.to_scipy()
    assert got.shape == (600, 300)
    np.testing.assert_allclose(got.toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-300)
    assert all(info["check_worst"] <= 1.0 for info in C.blocks_info())


def test_worker_lost_without_retries_fails_clearly(cluster, rng):
    c, client = cluster
    A, B = _problem(rng)
    plugin = _plugin(c)
    try:
        with pytest.raises(md.DistributedProductError, match="lost with its worker.*no partial result"):
            md.spgemm(A, B, client=client, nblocks=12, retries=0)
    finally:
        _remove(c, plugin)
    assert plugin.killed is not None
