"""Workers lost in the middle of a distributed product (a process LocalCluster, SciPy path): the
product either recomputes the lost blocks and returns a full, correct C, or fails with a clear
error; it never returns a partial C as complete. The tests share one cluster of four workers
and each kills one, in file order (the last runs on the one left). Products killed mid-call run
through tasks (``path="tasks"``: the plugin kills on a block task); the runner path's faults
are in test_distributed_runner.py."""

import numpy as np
import pytest
import scipy.sparse as sp

distributed = pytest.importorskip("dask.distributed")
import matplan.distributed as md  # noqa: E402
from worker_kill import KillOnFirstBlock, cluster, crash_worker, fault_problem  # noqa: E402,F401 (fixture)


def _plugin(c):
    plugin = KillOnFirstBlock(c)
    c.scheduler.add_plugin(plugin, name=f"kill-{id(plugin)}")
    return plugin


def _remove(c, plugin):
    c.scheduler.remove_plugin(name=f"kill-{id(plugin)}")


def test_read_right_after_a_kill_is_recomputed(cluster, rng):
    """C read the moment its worker is killed, whether or not the client has heard yet: C is
    recomputed, not an error. The nanny restarts the worker (the module's first test: the others
    kill theirs for good)."""
    c, client = cluster
    A, B = fault_problem(rng)
    Ad = md.DistributedCSR.from_matrix(A, client=client, nblocks=6)
    C = md.spgemm(Ad, md.replicate(B, client=client))
    victim = C.handles()[0].worker
    crash_worker(c, victim, restart=True)             # no waiting for the scheduler's news
    np.testing.assert_allclose(C.to_scipy().toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-300)
    assert C.blocks_info()[0]["path"] == "tasks"      # block 0 was computed again
    client.wait_for_workers(4, timeout=60)            # restarted: the later tests each kill one


def test_block_lost_after_the_call_is_recomputed(cluster, rng):
    """A worker that dies after the product returned: reading its blocks computes them again."""
    c, client = cluster
    A, B = fault_problem(rng)
    C = md.spgemm(A, B, client=client, nblocks=6, path="tasks")
    assert C.timings["path"] == "tasks" and C.path == "tasks"
    futures = C.handles()
    holders = client.who_has(futures)
    crash_worker(c, next(iter(holders[futures[0].key])))
    got = C.to_scipy()
    np.testing.assert_allclose(got.toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-300)
    Z = sp.csr_matrix((5, 300))
    assert md.spgemm(sp.csr_matrix((5, 400)), B, client=client).to_scipy().shape == Z.shape


def test_held_block_lost_after_a_runner_call_is_recomputed(cluster, rng):
    """The runner path's C: a held block whose worker died is computed again (through tasks) when read."""
    c, client = cluster
    A, B = fault_problem(rng)
    C = md.spgemm(A, B, client=client, nblocks=6)
    assert C.timings["path"] == "runner" and C.path == "runner"
    crash_worker(c, C.handles()[0].worker, client=client)
    np.testing.assert_allclose(C.to_scipy().toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-300)
    assert not isinstance(C.handles()[0], md.Held) and C.blocks_info()[0]["path"] == "tasks"


def test_worker_lost_mid_product_blocks_recomputed(cluster, rng):
    c, client = cluster
    A, B = fault_problem(rng)
    plugin = _plugin(c)
    try:
        C = md.spgemm(A, B, client=client, nblocks=12, retries=3, path="tasks")
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
    A, B = fault_problem(rng)
    plugin = _plugin(c)
    try:
        with pytest.raises(md.DistributedProductError, match="lost with its worker.*no partial result"):
            md.spgemm(A, B, client=client, nblocks=12, retries=0, path="tasks")
    finally:
        _remove(c, plugin)
    assert plugin.killed is not None


def test_lost_blocks_are_resubmitted_after_a_backoff(monkeypatch):
    """collect() waits before each resubmission (doubling), so a block resubmitted right after its
    worker died does not spend its retries before the scheduler hears; past them it raises."""
    from distributed import Client, LocalCluster
    from matplan.distributed import tasks
    waits = []
    monkeypatch.setattr(tasks, "backoff", waits.append)   # the attempt numbers it is called with
    calls = {0: 0, 1: 0}

    def submit(i, lost_times=(2, 0)):
        calls[i] += 1
        f = client.submit(lambda x: x * 10, i, pure=False)
        if calls[i] <= lost_times[i]:
            f.cancel()                                # as a block whose worker died with its inputs
        return f
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as lc, Client(lc) as client:
        results, attempts = tasks.collect(submit, [0, 1], retries=2, what="test", describe=str)
        assert results == {0: 0, 1: 10} and attempts == {0: 2, 1: 0}
        assert waits == [0, 1]
        waits.clear()
        calls.update({0: 0, 1: 0})
        with pytest.raises(tasks.DistributedProductError, match="lost with its worker on each of 2 attempt"):
            tasks.collect(submit, [0, 1], retries=1, what="test", describe=str)
        assert waits == [0]
