"""The GPU path of matplan.distributed (CuPy blocks), compared with SciPy in float64: on workers that
are threads of this process sharing its GPU, and on one worker process per GPU (needs 2 GPUs),
a worker among them killed mid-product. Skipped without CuPy and a GPU, except the first test,
which starts the Nanny-per-GPU cluster on the CPU with made-up device ids."""
import os
import time

import numpy as np
import pytest

distributed = pytest.importorskip("dask.distributed")
import matplan.distributed as md  # noqa: E402
from matplan.core.xp import cupy_module  # noqa: E402
from conftest import messy_csr, random_csr  # noqa: E402
from worker_kill import KillOnFirstBlock, crash_worker  # noqa: E402


def _assert_same(C, A, B):
    """C (a DistributedCSR) equals SciPy's A @ B entry by entry (sparse: no dense copies)."""
    got, ref = C.to_scipy(), (A @ B).tocsr()
    assert got.shape == ref.shape
    assert abs(got - ref).max() <= 1e-12 * abs(ref).max()


def _worker_view():
    """(CUDA_VISIBLE_DEVICES, the PCI bus id of device 0 or None) in a worker process."""
    from matplan.core.xp import cupy_module
    cp = cupy_module()
    return os.environ.get("CUDA_VISIBLE_DEVICES"), None if cp is None else cp.cuda.Device(0).pci_bus_id


def test_nanny_gpu_cluster_gives_each_worker_its_device(monkeypatch, rng):
    """Without dask-cuda: one single-threaded worker per id, GPU=1, its own CUDA_VISIBLE_DEVICES.
    The ids are made up (no GPU needed); blocks run on the host. Dask's NVML monitor is off: on a
    GPU host it would look the made-up ids up and the scheduler and workers would not start. The
    config turns it off in the workers' processes; in this one an earlier test may have started
    NVML already, which Dask then keeps using whatever the config says, so its state is set too."""
    import dask
    from distributed.diagnostics import nvml
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setitem(dask.config.config.setdefault("distributed", {}).setdefault("diagnostics", {}), "nvml", False)
    monkeypatch.setattr(nvml, "NVML_STATE", nvml.NVMLState.DISABLED_CONFIG)
    with pytest.raises(ValueError, match="gpu_cluster"):
        md.local_cluster(gpu=True, gpu_cluster="slurm")
    if md.cluster.dask_cuda_module()[0] is None:
        with pytest.raises(RuntimeError, match="gpu_cluster='dask-cuda'.*dask-cuda"):
            md.local_cluster(gpu=True, gpu_cluster="dask-cuda")
    with md.local_cluster(gpu=True, gpu_cluster="nanny") as lc:
        assert (lc.kind, lc.backend, lc.n_workers) == ("cuda", "nanny", 2)
        assert "one distributed.Nanny per GPU" in repr(lc) and "devices 3,5" in repr(lc)
        client = lc.client()
        client.wait_for_workers(2)
        seen = client.run(_worker_view)
        assert sorted(v[0] for v in seen.values()) == ["3", "5"]
        infos = client.scheduler_info(n_workers=-1)["workers"].values()
        assert [(w["nthreads"], w["resources"]) for w in infos] == [(1, {"GPU": 1})] * 2
        A, B = random_csr(rng, 400, 300, 0.03), random_csr(rng, 300, 200, 0.03)
        C = md.spgemm(A, B, client=client, on="host", nblocks=4)
        _assert_same(C, A, B)
    with pytest.raises(ValueError, match="n_workers: 3 GPU workers asked, 2"):
        md.local_cluster(3, gpu=True, gpu_cluster="nanny")


@pytest.fixture(scope="module")
def client():
    with md.local_cluster(2, gpu=False, processes=False) as lc:   # CPU cluster object, GPU work (on="gpu")
        yield lc.client()


@pytest.mark.gpu
def test_spgemm_blocks_on_the_gpu(cp, client, rng):
    A, B = messy_csr(rng, 3000, 2000), random_csr(rng, 2000, 1500, 0.01)
    ref = (A @ B).toarray()
    C = md.spgemm(A, B, client=client, on="gpu", nblocks=4)
    assert all(p["backend"] == "gpu" for p in C.plans)
    assert {i["location"] for i in C.blocks_info(refresh=True)} == {"gpu"}
    np.testing.assert_allclose(C.to_scipy().toarray(), ref, rtol=1e-12, atol=1e-12)
    Cg = C.to_cupy()
    np.testing.assert_allclose(Cg.get().toarray(), ref, rtol=1e-12, atol=1e-12)
    S = md.spgemm(A, B, client=client, on="gpu", nblocks=4, spill_bytes=0)   # no budget: all spilled
    assert {i["location"] for i in S.blocks_info(refresh=True)} == {"host"}
    np.testing.assert_allclose(S.to_scipy().toarray(), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_spgemm_column_panels_on_the_gpu(cp, client, rng):
    """B sent in column panels (a budget a third of B, and explicit boundaries with an empty
    panel): every (block, panel) product on the GPU, C assembled equal to SciPy's."""
    from matplan.distributed import panels as panels_mod
    A, B = messy_csr(rng, 2000, 1500), random_csr(rng, 1500, 1200, 0.01)
    ref = (A @ B).toarray()
    budget = B.indptr.nbytes + (panels_mod.csr_bytes(B) - B.indptr.nbytes) // 3
    C = md.spgemm(A, B, client=client, on="gpu", nblocks=3, panel_bytes=budget)
    assert len(C.panels) >= 3 and all(p["backend"] == "gpu" for p in C.plans)
    np.testing.assert_allclose(C.to_scipy().toarray(), ref, rtol=1e-12, atol=1e-12)
    D = md.spgemm(A, B, client=client, on="gpu", nblocks=2, panels=[0, 400, 400, 1200])
    assert len(D.panels) == 3
    np.testing.assert_allclose(D.to_cupy().get().toarray(), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_spmm_on_the_gpu_returns_cupy(cp, client, rng):
    A = messy_csr(rng, 3000, 2000)
    X = rng.random((2000, 4))
    Y = md.spmm(A, cp.asarray(X), client=client, on="gpu", nblocks=3)
    assert isinstance(Y, cp.ndarray)
    np.testing.assert_allclose(Y.get(), A @ X, rtol=1e-12, atol=1e-12)
    with md.DistributedOperator(A, client=client, on="gpu") as op:
        assert {b["location"] for b in op.blocks_info()} == {"gpu"}
        np.testing.assert_allclose(op @ X[:, 0], A @ X[:, 0], rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_resident_operands_on_the_gpu(cp, client, rng):
    """A's blocks placed on the GPU once (from cupyx input), B and X replicated once; repeated
    products plan nothing and equal SciPy's; Y stays on the workers until gathered."""
    import cupyx.scipy.sparse as csp
    A, B = messy_csr(rng, 3000, 2000), random_csr(rng, 2000, 1500, 0.01)
    Br = md.replicate(csp.csr_matrix(B), client=client)
    Ad = md.DistributedCSR.from_matrix(csp.csr_matrix(A), client=client, balance=Br, on="gpu")
    assert {i["location"] for i in Ad.blocks_info()} == {"gpu"}
    C1 = md.spgemm(Ad, Br, on="gpu")
    C2 = md.spgemm(Ad, Br, on="gpu")
    assert C1.timings["planned"] == len(Ad) and C2.timings["planned"] == 0
    assert C2.timings["path"] == "runner" and {i["location"] for i in C2.blocks_info(refresh=True)} == {"gpu"}
    assert all(p["backend"] == "gpu" for p in C2.plans)
    _assert_same(C1, A, B)
    _assert_same(C2, A, B)
    X = rng.random((2000, 4))
    S = md.DistributedCSR.from_matrix(A, client=client, on="gpu")
    Y = md.spmm(S, md.replicate(cp.asarray(X), client=client), on="gpu")
    assert {i["location"] for i in Y.blocks_info(refresh=True)} == {"gpu"}
    Yg = Y.to_cupy()
    assert isinstance(Yg, cp.ndarray)
    np.testing.assert_allclose(Yg.get(), A @ X, rtol=1e-12, atol=1e-12)
    A2 = random_csr(rng, 2000, 2000, 0.002)
    with md.DistributedOperator(A2, client=client, on="gpu") as op:
        Z = op @ (op @ md.replicate(X, client=client))        # X assembled on each worker from Y's blocks
        np.testing.assert_allclose(Z.gather(), A2 @ (A2 @ X), rtol=1e-12, atol=1e-12)


# ---- one worker process per GPU (2 GPUs or more) ----

def _two_gpus():
    cp = cupy_module()
    if cp is None or cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs")


def _problem(rng):
    """~8e6 products: a few ms a block on a GPU, a fraction of a second in SciPy."""
    return random_csr(rng, 20_000, 20_000, 0.001), random_csr(rng, 20_000, 20_000, 0.001)


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["auto", "nanny"])
def test_one_worker_process_per_gpu(rng, how):
    _two_gpus()
    with md.local_cluster(2, gpu=True, gpu_cluster=how) as lc:
        assert lc.kind == "cuda" and (how == "auto" or lc.backend == "nanny")
        client = lc.client()
        client.wait_for_workers(2)
        seen = client.run(_worker_view)
        buses = [v[1] for v in seen.values()]
        assert None not in buses and len(set(buses)) == 2, seen   # each worker on its own GPU
        A, B = _problem(rng)
        C = md.spgemm(A, B, client=client, on="gpu", nblocks=8)
        assert C.timings["workers_used"] == 2 and all(p["backend"] == "gpu" for p in C.plans)
        _assert_same(C, A, B)


@pytest.fixture(scope="module")
def gpu_cluster():   # module scope: conftest's cp fixture is per test
    _two_gpus()
    with md.local_cluster(2, gpu=True) as lc:
        client = lc.client()
        client.wait_for_workers(2)
        yield lc.cluster, client


def _kill_during(c, fn):
    plugin = KillOnFirstBlock(c, restart=True)   # its nanny starts a fresh worker, as after a crash
    name = f"kill-{id(plugin)}"
    c.scheduler.add_plugin(plugin, name=name)
    try:
        return plugin, fn()
    finally:
        c.scheduler.remove_plugin(name=name)


@pytest.mark.gpu
def test_gpu_worker_lost_mid_product_recomputed(gpu_cluster, rng):
    """The issue's fault test on GPUs: a full C, equal to SciPy's, every block checked; never partial."""
    c, client = gpu_cluster
    A, B = _problem(rng)
    plugin, C = _kill_during(c, lambda: md.spgemm(A, B, client=client, on="gpu", nblocks=12, retries=3,
                                                  path="tasks"))   # the plugin kills on a block task
    assert plugin.killed is not None
    assert C.timings["resubmitted"] >= 1
    assert len(C.blocks_info()) == 12 and all(info["check_worst"] <= 1.0 for info in C.blocks_info())
    _assert_same(C, A, B)


@pytest.mark.gpu
def test_gpu_worker_lost_without_retries_fails_clearly(gpu_cluster, rng):
    c, client = gpu_cluster
    client.wait_for_workers(2, timeout=120)   # the nanny restarted the worker killed before
    A, B = _problem(rng)
    with pytest.raises(md.DistributedProductError, match="no partial result"):
        _kill_during(c, lambda: md.spgemm(A, B, client=client, on="gpu", nblocks=12, retries=0, path="tasks"))


@pytest.mark.gpu
def test_gpu_resident_operands_survive_a_lost_worker(gpu_cluster, rng):
    """Resident A on two GPU workers, B replicated: the second product plans nothing; after the
    worker holding block 0 is SIGKILLed (its nanny starts a fresh one) the block is rebuilt from the
    client's A and the product is complete and equal to SciPy's."""
    c, client = gpu_cluster
    client.wait_for_workers(2, timeout=120)
    A, B = _problem(rng)
    Br = md.replicate(B, client=client)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br, on="gpu")
    assert len({i["worker"] for i in Ad.blocks_info()}) == 2 and {i["location"] for i in Ad.blocks_info()} == {"gpu"}
    md.spgemm(Ad, Br, on="gpu")
    C = md.spgemm(Ad, Br, on="gpu")
    assert C.timings["planned"] == 0 and C.timings["workers_used"] == 2 and C.timings["path"] == "runner"
    _assert_same(C, A, B)
    f = Ad.future(0)
    victim = next(iter(client.who_has([f])[f.key]))
    crash_worker(c, victim, restart=True)   # SIGKILL only: the nanny may start another
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and f.status == "finished":
        time.sleep(0.1)
    C = md.spgemm(Ad, Br, on="gpu")
    _assert_same(C, A, B)
    assert Ad.blocks_info()[0]["worker"] != victim
