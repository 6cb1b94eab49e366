"""Distributed SpGEMM on an in-process CPU LocalCluster (the SciPy path), compared with SciPy in float64."""
import numpy as np
import pytest
import scipy.sparse as sp

distributed = pytest.importorskip("dask.distributed")
import matplan  # noqa: E402
import matplan.distributed as md  # noqa: E402
from matplan.distributed import block_tasks as worker_mod  # noqa: E402
from conftest import lossy_plans, messy_csr, random_csr  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with md.local_cluster(2, gpu=False, processes=False) as lc:
        yield lc.client()


def _same(C, A, B, rtol=1e-12):
    """C (SciPy) == A @ B computed by SciPy in float64, entry by entry, relative to |A| @ |B|."""
    A, B = A.astype(np.float64), B.astype(np.float64)   # copies: SciPy's abs() sums duplicates in place
    ref = (A @ B).toarray()
    scale = (abs(A) @ abs(B)).toarray()
    got = C.toarray().astype(np.float64)
    assert C.shape == ref.shape
    np.testing.assert_array_less(np.abs(got - ref), rtol * scale + 1e-300)


def test_import_matplan_does_not_import_dask():
    import subprocess
    import sys
    code = ("import sys, matplan; print(sorted(m for m in ('dask', 'distributed', 'matplan.distributed') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_local_cluster_says_what_it_is():
    with md.local_cluster(1, gpu=False, processes=False) as lc:
        assert lc.kind == "cpu" and lc.n_workers == 1
        assert "CPU workers" in repr(lc) and "SciPy path" in repr(lc) and "gpu=False" in repr(lc)
    with pytest.raises(ValueError, match="gpu"):
        md.local_cluster(gpu="yes")
    with pytest.raises(ValueError, match="n_workers"):
        md.local_cluster(0)
    if not md.cluster.visible_gpus()[0]:
        with pytest.raises(RuntimeError, match="gpu=True"):
            md.local_cluster(gpu=True)


def test_cpu_cluster_workers_take_the_host_where_a_gpu_is_seen(monkeypatch):
    """local_cluster(gpu=False) workers compute on the host for on="auto" even in a process that
    sees a GPU (a CuPy faked here); on="gpu" still asks for the GPU, and other clusters' workers
    keep "auto" on it."""
    from matplan.distributed import worker as worker_mod
    monkeypatch.setattr(worker_mod, "cupy_module", lambda: object())   # a GPU seen by every worker
    def each(client, fn):   # in a task on every worker (where the blocks run)
        return [client.submit(fn, workers=[w], pure=False).result() for w in sorted(client.nthreads())]
    with md.local_cluster(2, gpu=False, processes=False) as lc:
        got = each(lc.client(), lambda: (worker_mod.use_gpu("auto"), worker_mod.use_gpu("gpu")))
    assert got == [(False, True)] * 2
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as c:
        with distributed.Client(c) as cl:
            assert each(cl, lambda: worker_mod.use_gpu("auto")) == [True]
    assert worker_mod.use_gpu("auto") is True   # outside any worker


def test_visible_devices_parsed(monkeypatch):
    for env, want in (("0,1", ["0", "1"]), ("", []), ("-1", []), ("2, 3,-1,4", ["2", "3"]), ("GPU-ab", ["GPU-ab"])):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
        assert md.cluster._visible_ids() == want
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert md.cluster._visible_ids() is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spgemm_matches_scipy(client, rng, dtype):
    A = messy_csr(rng, 300, 200, dtype)           # empty rows, one very long row, duplicates
    B = random_csr(rng, 200, 150, 0.05, dtype)
    C = md.spgemm(A, B, client=client, nblocks=6)
    _same(C.to_scipy(), A, B, 1e-12 if dtype == np.float64 else 1e-5)
    assert C.dtype == dtype and C.shape == (300, 150)
    assert C.to_scipy().dtype == dtype
    assert C.nnz == C.to_scipy().nnz == (A @ B).nnz
    infos = C.blocks_info()
    assert sum(i["nnz"] for i in infos) == C.nnz and all(i["nbytes"] > 0 for i in infos)
    assert all(i["location"] == "host" and i["check_worst"] <= 1.0 for i in infos)
    long_row = int(np.argmax(np.diff(A.indptr)))
    assert long_row in C.bounds and long_row + 1 in C.bounds   # the hub row is a block of its own
    workers = set(client.nthreads())
    for p in C.plans:
        assert p["kernel"] == "cpu.scipy" and p["reasons"] and p["worker"] in workers
        assert p["backend"] == "cpu" and p["products"] == sum(
            int(np.diff(B.indptr)[A.indices[A.indptr[r]:A.indptr[r + 1]]].sum()) for r in range(*p["rows"]))
    assert isinstance(C.plan(0), matplan.Plan) and C.plan(0).kernel == "cpu.scipy"
    for i in (0, len(C) - 1, -1):
        r0, r1 = C.bounds[i % len(C)], C.bounds[i % len(C) + 1]
        _same(C.block(i), A[r0:r1], B, 1e-12 if dtype == np.float64 else 1e-5)
    with pytest.raises(IndexError, match="block index"):
        C.block(len(C))
    text = C.explain()
    assert "cpu.scipy" in text and "DistributedCSR" in repr(C) and "row blocks" in repr(C)
    t = C.timings
    assert t["total_s"] >= t["run_s"] >= t["busy_critical_s"] >= 0 and t["overhead_s"] >= 0
    assert t["kernel_sum_s"] > 0 and t["workers_used"] >= 1


def test_empty_block_empty_rows_and_mixed_dtypes(client, rng):
    keep = np.ones(50)
    keep[10:20] = 0                                # a run of empty rows
    A = (sp.diags(keep.astype(np.float32)) @ messy_csr(rng, 50, 40, np.float32)).tocsr()
    A.eliminate_zeros()
    B = random_csr(rng, 40, 30, 0.1, np.float64)
    C = md.spgemm(A, B, client=client, blocks=[0, 10, 10, 20, 50])
    assert C.dtype == np.float64 and len(C) == 4
    assert C.block(1).shape == (0, 30) and C.block(2).nnz == 0
    _same(C.to_scipy(), A, B)


def test_empty_matrices(client):
    A = sp.csr_matrix((0, 5))
    B = sp.csr_matrix((5, 7))
    C = md.spgemm(A, B, client=client)
    assert C.to_scipy().shape == (0, 7) and C.nnz == 0
    C = md.spgemm(sp.csr_matrix((6, 5)), B, client=client, nblocks=3)
    assert C.to_scipy().shape == (6, 7) and C.nnz == 0


def test_save_and_load(client, rng, tmp_path):
    A, B = messy_csr(rng, 120, 80), random_csr(rng, 80, 60, 0.1)
    C = md.spgemm(A, B, client=client, nblocks=4)
    path = C.save(tmp_path / "c")
    assert path.name == "index.json" and len(list((tmp_path / "c").glob("block-*.npz"))) == len(C)
    with pytest.raises(FileExistsError):
        C.save(tmp_path / "c")
    here = md.load(tmp_path / "c")
    assert (here.to_scipy() != C.to_scipy()).nnz == 0 and here.bounds == C.bounds
    assert here.plans[0]["kernel"] == "cpu.scipy" and here.plan(0) is None and "in this process" in repr(here)
    there = md.load(tmp_path / "c", client=client)
    assert (there.block(1) != C.block(1)).nnz == 0 and there.nnz == C.nnz
    there.release()
    with pytest.raises(md.DistributedProductError, match="released"):
        there.block(0)


def test_to_cupy_without_a_gpu(client, rng):
    if matplan.core.xp.cupy_module() is not None:
        pytest.skip("a GPU is present")
    C = md.spgemm(random_csr(rng, 10, 10, 0.3), random_csr(rng, 10, 10, 0.3), client=client)
    with pytest.raises(RuntimeError, match="to_cupy"):
        C.to_cupy()


def test_bad_inputs(client, rng):
    A = random_csr(rng, 10, 8, 0.3)
    with pytest.raises(ValueError, match="spmm"):
        md.spgemm(A, np.ones((8, 2)), client=client)
    with pytest.raises(ValueError, match="do not conform"):
        md.spgemm(A, random_csr(rng, 9, 8, 0.3), client=client)
    with pytest.raises(TypeError, match="client"):
        md.spgemm(A, A.T, client="tcp://nowhere")
    with pytest.raises(ValueError, match="on"):
        md.spgemm(A, A.T, client=client, on="tpu")
    with pytest.raises(ValueError, match="retries"):
        md.spgemm(A, A.T, client=client, retries=-1)
    with pytest.raises(md.DistributedProductError, match="no usable GPU") if \
            matplan.core.xp.cupy_module() is None else pytest.raises(AssertionError):
        md.spgemm(A, A.T, client=client, on="gpu")
        raise AssertionError("a GPU is present: on='gpu' ran")


def test_a_block_failing_its_check_fails_the_call(client, rng, monkeypatch):
    """A kernel that loses an entry: its block fails the row-sum check and no C is returned."""
    lossy_plans(monkeypatch, worker_mod)
    A = random_csr(rng, 40, 30, 0.2)
    with pytest.raises(md.BlockCheckError, match="row sums"):
        md.spgemm(A, random_csr(rng, 30, 20, 0.2), client=client, nblocks=3)


def test_block_records_count_products_exactly_past_the_plans_sample(client, rng):
    """A host plan samples SpGEMM's products past PRODUCT_SAMPLES nonzeros; a block's record
    counts them."""
    from matplan.core.features import PRODUCT_SAMPLES
    A = random_csr(rng, 2000, 1500, 0.02)
    B = messy_csr(rng, 1500, 700)
    C = md.spgemm(A, B, client=client, nblocks=2)
    _same(C.to_scipy(), A, B)
    lengths = np.diff(B.indptr)
    for p in C.plans:
        r0, r1 = p["rows"]
        assert A.indptr[r1] - A.indptr[r0] > PRODUCT_SAMPLES
        assert p["products"] == int(lengths[A.indices[A.indptr[r0]:A.indptr[r1]]].sum())
