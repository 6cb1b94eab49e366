"""B in column panels (CPU LocalCluster, SciPy path): each (row block, panel) planned and checked,
row blocks assembled from their panels, compared with SciPy in float64."""
import numpy as np
import pytest

distributed = pytest.importorskip("dask.distributed")
import matplan  # noqa: E402
import matplan.distributed as md  # noqa: E402
from matplan.distributed import panels as panels_mod  # noqa: E402
from matplan.distributed import block_tasks as worker_mod  # noqa: E402
from conftest import lossy_plans, messy_csr, random_csr  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with md.local_cluster(2, gpu=False, processes=False) as lc:
        yield lc.client()


def _same(C, A, B, rtol):
    A, B = A.astype(np.float64), B.astype(np.float64)
    ref = (A @ B).toarray()
    scale = (abs(A) @ abs(B)).toarray()
    assert C.shape == ref.shape
    np.testing.assert_array_less(np.abs(C.toarray().astype(np.float64) - ref), rtol * scale + 1e-300)


def _hub_matrices(rng, dtype):
    """A with a hub row (touching every row of B), B with a hub column (dense) and empty columns."""
    A = messy_csr(rng, 200, 120, dtype).tolil()
    A[37, :] = rng.uniform(0.5, 1.5, 120)
    B = random_csr(rng, 120, 90, 0.06, dtype).tolil()
    B[:, 11] = rng.uniform(0.5, 1.5, (120, 1))
    B[:, 60:70] = 0
    return A.tocsr().astype(dtype), B.tocsr().astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("npanels", [2, 3, 7])
def test_panels_match_scipy(client, rng, dtype, npanels):
    A, B = _hub_matrices(rng, dtype)
    C = md.spgemm(A, B, client=client, nblocks=8, panels=npanels)
    H = C.to_scipy()
    _same(H, A, B, 1e-12 if dtype == np.float64 else 1e-5)
    assert H.dtype == dtype and H.has_sorted_indices and C.nnz == H.nnz == (A @ B).nnz
    cb = C.panels.bounds
    assert cb[0] == 0 and cb[-1] == 90 and len(C.panels) >= npanels and sum(C.panels.nnz) == B.nnz
    if B[:, 11].nnz >= B.nnz / npanels:
        assert 11 in cb and 12 in cb   # a hub column (at least a mean panel's nonzeros) is a panel of its own
    w = md.row_weights(A, B)
    assert w[37] >= w.sum() / 8 and 37 in C.bounds and 38 in C.bounds   # the hub row is a block of its own
    pp = C.panel_plans
    assert len(pp) == len(C) * len(C.panels)   # balanced panels are never empty: one plan each
    workers = set(client.nthreads())
    for rec in pp:
        r0, r1 = rec["rows"]
        c0, c1 = rec["cols"]
        assert cb[rec["panel"]] == c0 and cb[rec["panel"] + 1] == c1
        assert rec["kernel"] == "cpu.scipy" and rec["reasons"] and rec["worker"] in workers
        assert isinstance(rec["plan"], matplan.Plan) and rec["check_worst"] <= 1.0
        assert rec["nnz"] == H[r0:r1, c0:c1].nnz
        want = np.diff((B[:, c0:c1]).indptr)[A[r0:r1].indices].sum()
        assert rec["products"] == want
    for info in C.blocks_info():
        assert info["check_worst"] <= 1.0 and len(info["panels"]) == len(C.panels)
        assert info["products"] == sum(p["products"] for p in info["panels"])
    for i in range(len(C)):   # every assembled block is the product's rows
        r0, r1 = C.bounds[i], C.bounds[i + 1]
        _same(C.block(i), A[r0:r1], B, 1e-12 if dtype == np.float64 else 1e-5)
    assert "panel 1 (columns" in C.explain()


def test_tiny_budget_splits_b_and_default_budget_keeps_it_whole(client, rng):
    A, B = messy_csr(rng, 150, 100), random_csr(rng, 100, 80, 0.1)
    whole = panels_mod.csr_bytes(B)
    budget = B.indptr.nbytes + (whole - B.indptr.nbytes) // 3
    C = md.spgemm(A, B, client=client, nblocks=3, panel_bytes=budget)
    assert len(C.panels) >= 3 and "exceeds" in C.panels.reason
    assert max(C.panels.nbytes) <= 1.5 * budget   # balanced by nonzeros: about the budget each
    _same(C.to_scipy(), A, B, 1e-12)
    limits = [w["memory_limit"] for w in client.scheduler_info()["workers"].values()]
    assert panels_mod.default_panel_bytes(client) == int(panels_mod.PANEL_FRACTION * min(limits))
    D = md.spgemm(A, B, client=client, nblocks=3)   # the default budget holds this B whole
    assert len(D.panels) == 1 and "replicated" in D.panels.reason
    assert all("panels" not in i for i in D.blocks_info()) and len(D.panel_plans) == len(D)
    assert (D.to_scipy() != C.to_scipy()).nnz == 0


def test_default_budget_counts_each_workers_gpu_memory():
    """A GPU worker's budget is the smaller of its host limit and its GPU's memory (NVML metrics),
    unless the product runs on the hosts; workers reporting nothing are left out."""
    class FakeClient:
        def scheduler_info(self, n_workers=0):
            return {"workers": {"a": {"memory_limit": 64 << 30, "metrics": {"gpu-memory-total": 80 << 30}},
                                "b": {"memory_limit": 32 << 30, "metrics": {"gpu-memory-total": 16 << 30}},
                                "c": {"memory_limit": 0, "metrics": {}}}}
    f = panels_mod.PANEL_FRACTION
    assert panels_mod.default_panel_bytes(FakeClient()) == int(f * (16 << 30))
    assert panels_mod.default_panel_bytes(FakeClient(), "gpu") == int(f * (16 << 30))
    assert panels_mod.default_panel_bytes(FakeClient(), "host") == int(f * (32 << 30))


def test_empty_panels_and_empty_blocks(client, rng):
    A, B = messy_csr(rng, 60, 40, np.float32), random_csr(rng, 40, 30, 0.15, np.float64)
    B = B.tolil()
    B[:, 10:20] = 0   # a panel with columns but no nonzeros
    B = B.tocsr()
    B.eliminate_zeros()
    C = md.spgemm(A, B, client=client, blocks=[0, 20, 20, 60], panels=[0, 0, 10, 10, 20, 30, 30])
    assert C.dtype == np.float64 and len(C.panels) == 6 and C.panels.nnz[0] == C.panels.nnz[2] == 0
    _same(C.to_scipy(), A, B, 1e-12)
    assert C.block(1).shape == (0, 30)
    for info in C.blocks_info():   # zero-width panels get no task; the empty-valued one does
        assert [p["panel"] for p in info["panels"]] == [1, 3, 4]
    assert {(r["block"], r["panel"]) for r in C.panel_plans} == {(b, p) for b in range(3) for p in (1, 3, 4)}


def test_panel_helpers(rng):
    B = messy_csr(rng, 30, 25)
    for c0, c1 in ((0, 25), (3, 9), (9, 9), (24, 25)):
        P = panels_mod.slice_cols(B, c0, c1)
        assert P.shape == (30, c1 - c0)
        np.testing.assert_array_equal(P.toarray(), B.toarray()[:, c0:c1])
    bounds = [0, 4, 4, 17, 25]
    parts = [panels_mod.slice_cols(B, bounds[p], bounds[p + 1]) for p in range(4)]
    H = panels_mod.hstack_rows(parts, bounds[:-1], 30, 25)
    np.testing.assert_array_equal(H.toarray(), B.toarray())
    assert H.nnz == B.nnz and H.indices.dtype == np.int32


def test_panel_arguments_are_checked(client, rng):
    A, B = random_csr(rng, 20, 15, 0.3), random_csr(rng, 15, 12, 0.3)
    with pytest.raises(ValueError, match="not both"):
        md.spgemm(A, B, client=client, panels=2, panel_bytes=10_000)
    with pytest.raises(ValueError, match="panel_bytes: .*row pointers"):
        md.spgemm(A, B, client=client, panel_bytes=B.indptr.nbytes)
    with pytest.raises(ValueError, match="panel_bytes"):
        md.spgemm(A, B, client=client, panel_bytes=0)
    with pytest.raises(ValueError, match="panels: .*column"):
        md.spgemm(A, B, client=client, panels=[0, 5, 3, 12])
    with pytest.raises(ValueError, match="panels: .*12"):
        md.spgemm(A, B, client=client, panels=[0, 5, 11])
    with pytest.raises(ValueError, match="panels"):
        md.spgemm(A, B, client=client, panels=0)


def test_a_panel_failing_its_check_fails_the_call(client, rng, monkeypatch):
    lossy_plans(monkeypatch, worker_mod, loses=lambda B: B.shape[1] < 20)   # only the panels' products
    A = random_csr(rng, 40, 30, 0.2)
    with pytest.raises(md.BlockCheckError, match="panel .* row sums"):
        md.spgemm(A, random_csr(rng, 30, 30, 0.2), client=client, nblocks=2, panels=2)


def test_a_bad_assembly_fails_the_block_check(client, rng, monkeypatch):
    """Assembling that drops a panel is caught by the whole block's row-sum check."""
    real = panels_mod.hstack_rows
    monkeypatch.setattr(panels_mod, "hstack_rows", lambda parts, cb, m, n: real(parts[:1], cb[:1], m, n))
    A = random_csr(rng, 40, 30, 0.3)
    with pytest.raises(md.BlockCheckError, match="assembled panels"):
        md.spgemm(A, random_csr(rng, 30, 30, 0.3), client=client, nblocks=2, panels=3)


def test_a_worker_lost_during_a_paneled_product(rng):
    """SIGKILL the worker that just finished the first (block, panel) task: its panel of B, its rows
    of A and its products are lost; they are scattered and computed again and C is complete."""
    from test_distributed_faults import KillOnFirstBlock
    A, B = random_csr(rng, 400, 300, 0.03), random_csr(rng, 300, 200, 0.03)
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        client.wait_for_workers(3)
        plugin = KillOnFirstBlock(c, marker="-panel-")
        c.scheduler.add_plugin(plugin, name="kill-panel")
        C = md.spgemm(A, B, client=client, nblocks=6, panels=3)
        assert plugin.killed is not None
        H = C.to_scipy()
    _same(H, A, B, 1e-12)
    assert C.nnz == (A @ B).nnz and all(i["check_worst"] <= 1.0 for i in C.blocks_info())
