"""Distributed SpMV/SpMM and the resident DistributedOperator on an in-process CPU LocalCluster,
compared with SciPy in float64; the power-iteration example runs."""
import runpy
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

distributed = pytest.importorskip("dask.distributed")
import matplan.distributed as md  # noqa: E402
from conftest import messy_csr, random_csr  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client():
    with md.local_cluster(2, gpu=False, processes=False) as lc:
        yield lc.client()


def _close(Y, A, X, dtype):
    ref = A.astype(np.float64) @ X.astype(np.float64)
    scale = abs(A.astype(np.float64)) @ abs(X.astype(np.float64))
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    assert Y.shape == ref.shape
    np.testing.assert_array_less(np.abs(Y.astype(np.float64) - ref), rtol * scale + 1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [None, 1, 5])
def test_spmm_and_spmv_match_scipy(client, rng, dtype, k):
    A = messy_csr(rng, 400, 300, dtype)            # empty rows, one very long row, duplicates
    X = rng.random(300 if k is None else (300, k)).astype(dtype)
    info = {}
    Y = md.spmm(A, X, client=client, nblocks=5, info=info)
    assert Y.dtype == dtype and isinstance(Y, np.ndarray)
    _close(Y, A, X, dtype)
    rb = info["blocks"]
    long_row = int(np.argmax(np.diff(A.indptr)))
    assert rb.measure == "nonzeros" and long_row in rb.bounds and long_row + 1 in rb.bounds
    assert len(info["plans"]) == len(rb) and all(p["kernel"] == "cpu.scipy" and p["reasons"] for p in info["plans"])
    assert info["timings"]["run_s"] >= info["timings"]["busy_critical_s"] >= 0


def test_empty_block_and_mixed_dtypes(client, rng):
    A = messy_csr(rng, 60, 40, np.float32)
    X = rng.random((40, 3))                        # float64 X, float32 A: computed in float64
    Y = md.spmm(A, X, client=client, blocks=[0, 20, 20, 60])
    assert Y.dtype == np.float64
    _close(Y, A, X, np.float64)
    assert md.spmm(sp.csr_matrix((0, 4)), np.ones(4), client=client).shape == (0,)
    np.testing.assert_array_equal(md.spmm(sp.csr_matrix((3, 4)), np.ones((4, 2)), client=client), np.zeros((3, 2)))


def test_operator_keeps_blocks_and_plans_resident(client, rng):
    A = random_csr(rng, 500, 500, 0.02)
    with md.DistributedOperator(A, client=client, nblocks=4) as op:
        residents = [op.matrix.future(i).key for i in range(len(op.matrix))]
        x = rng.random(500)
        for _ in range(3):
            y = op @ x
            _close(y, A, x, np.float64)
        plans = op.plans
        assert len(plans) == 4 and {p["k"] for p in plans} == {1}      # planned once per block
        Y = op.matmat(rng.random((500, 3)))
        assert Y.shape == (500, 3)
        assert len(op.plans) == 8                                    # one more plan per block for k = 3
        first = {(p["index"], p["k"]): p["plan_s"] for p in plans}
        assert all(first[p["index"], p["k"]] == p["plan_s"] for p in op.plans if p["k"] == 1)   # not re-planned
        assert [op.matrix.future(i).key for i in range(len(op.matrix))] == residents   # the blocks never sent again
        assert all(info["worker"] in client.nthreads() for info in op.blocks_info())
        assert "resident" in repr(op) and op.last_kernels == ["cpu.scipy"] * 4
        assert op.last_timings["overhead_s"] >= 0
        lin = op.as_linear_operator()
        np.testing.assert_allclose(lin.matvec(x), A @ x, rtol=1e-12)
    assert "closed" in repr(op)
    with pytest.raises(RuntimeError, match="closed"):
        op @ x


def test_operator_in_a_solver(client, rng):
    """SciPy's CG over the operator's LinearOperator solves what it solves over A itself."""
    M = random_csr(rng, 300, 300, 0.02)
    S = (M @ M.T + 10 * sp.eye(300)).tocsr()       # symmetric positive definite, well conditioned
    b = rng.random(300)
    with md.DistributedOperator(S, client=client, nblocks=3) as op:
        x, status = spla.cg(op.as_linear_operator(), b, rtol=1e-10)
    assert status == 0
    np.testing.assert_allclose(S @ x, b, rtol=1e-8)
    np.testing.assert_allclose(x, spla.spsolve(S.tocsc(), b), rtol=1e-7)


def test_bad_inputs(client, rng):
    A = random_csr(rng, 10, 8, 0.3)
    with pytest.raises(TypeError, match="A: expected a sparse"):
        md.DistributedOperator(np.ones((3, 3)), client=client)
    with pytest.raises(TypeError, match="A: expected float32"):
        md.DistributedOperator(A.astype(np.int64), client=client)
    with pytest.raises(ValueError, match="reuse"):
        md.DistributedOperator(A, client=client, reuse=0)
    with md.DistributedOperator(A, client=client) as op:
        with pytest.raises(ValueError, match=r"X: expected shape \(8,\)"):
            op @ np.ones(9)
        with pytest.raises(TypeError, match="X: expected float32"):
            op @ np.ones(8, dtype=np.int64)


def test_power_iteration_example(capsys):
    example = runpy.run_path(str(ROOT / "examples" / "distributed_power_iteration.py"), run_name="example")
    assert example["main"](["--scale", "11", "--workers", "2", "--threads", "--gpu", "no"]) == 0
    out = capsys.readouterr().out
    assert "PageRank" in out and "CPU workers" in out and "vs SciPy" in out and ": OK" in out
