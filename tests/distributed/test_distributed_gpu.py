"""The GPU path of matplan.distributed (CuPy blocks), on workers that are threads of this process and
share its GPU; compared with SciPy in float64. Skipped without CuPy and a GPU."""
import numpy as np
import pytest

pytest.importorskip("dask.distributed")
import matplan.distributed as md  # noqa: E402
from conftest import messy_csr, random_csr  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def client():
    with md.local_cluster(2, gpu=False, processes=False) as lc:   # CPU cluster object, GPU work (on="gpu")
        yield lc.client()


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


def test_spmm_on_the_gpu_returns_cupy(cp, client, rng):
    A = messy_csr(rng, 3000, 2000)
    X = rng.random((2000, 4))
    Y = md.spmm(A, cp.asarray(X), client=client, on="gpu", nblocks=3)
    assert isinstance(Y, cp.ndarray)
    np.testing.assert_allclose(Y.get(), A @ X, rtol=1e-12, atol=1e-12)
    with md.DistributedOperator(A, client=client, on="gpu") as op:
        assert {b["location"] for b in op.blocks_info()} == {"gpu"}
        np.testing.assert_allclose(op @ X[:, 0], A @ X[:, 0], rtol=1e-12, atol=1e-12)
