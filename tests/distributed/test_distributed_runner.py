"""The runner path (matplan.distributed.runner / fastpath) on CPU LocalClusters (the SciPy path):
steady calls on resident operands as one message per worker, results equal to SciPy's in
float64, the records saying which path ran, outputs held by the runners and freed on release,
the task path taken where a precondition fails, and workers killed between two steady calls."""
import gc
import time

import numpy as np
import pytest

distributed = pytest.importorskip("dask.distributed")
import matplan.distributed as md  # noqa: E402
from matplan.distributed import block_tasks as worker_mod, fastpath  # noqa: E402
from matplan.distributed.runner import HeldBlockLost, held_block  # noqa: E402
from dist_checks import same as _same  # noqa: E402
from conftest import lossy_plans, messy_csr, random_csr  # noqa: E402
from worker_kill import SlowRunner, cluster, crash_worker  # noqa: E402,F401 (fixture)


@pytest.fixture(scope="module")
def client():
    with md.local_cluster(2, gpu=False, processes=False) as lc:
        yield lc.client()


def _runner_state(client) -> dict:
    """{worker: its runner's info()} (blocks held, operands pinned)."""
    keys = fastpath.runners(client, sorted(client.nthreads()))
    out = fastpath.call_all(client, [(w, r, "info", ()) for w, r in keys.items()])
    assert all(status == "ok" for status, _ in out)
    return {w: v for w, (_, v) in zip(keys, out)}


def _held(client) -> int:
    return sum(s["held"] for s in _runner_state(client).values())


def _wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spgemm_on_the_runners(client, rng, dtype):
    A, B = messy_csr(rng, 300, 200, dtype), random_csr(rng, 200, 150, 0.05, dtype)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    Br = md.replicate(B, client=client)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br)
    C1, C2 = md.spgemm(Ad, Br), md.spgemm(Ad, Br)
    for C in (C1, C2):
        assert C.timings["path"] == "runner" and C.timings["fallback"] is None and C.path == "runner"
        assert all(isinstance(h, md.Held) for h in C.handles())
        assert all(i["path"] == "runner" and i["check_worst"] <= 1.0 for i in C.blocks_info())
        _same(C.to_scipy(), ref, rtol)
        assert C.dtype == dtype and C.plan(0).kernel == "cpu.scipy" and "cpu.scipy" in C.explain()
        assert C.timings["run_s"] >= C.timings["busy_critical_s"] > 0 and C.timings["overhead_s"] >= 0
    assert C1.timings["planned"] == len(Ad) and C2.timings["planned"] == 0   # the plans kept on A's blocks
    _same(C2.block(1), ref[C2.bounds[1]:C2.bounds[2]], rtol)
    assert {i["location"] for i in C2.blocks_info(refresh=True)} == {"host"}
    assert [i["worker"] for i in C2.blocks_info()] == [h.worker for h in C2.handles()]
    D = random_csr(rng, 150, 90, 0.05)
    Dr = md.replicate(D, client=client)
    C3 = md.spgemm(C2, Dr)                                    # held blocks as A: found in the runners
    assert C3.timings["path"] == "runner", C3.timings["fallback"]
    _same(C3.to_scipy(), ref @ D, 1e-4 if dtype == np.float32 else 1e-12)
    C4 = md.spgemm(C2, Dr, path="tasks")                      # held blocks as a task's input
    assert C4.timings["path"] == "tasks" and C4.timings["fallback"] == "path='tasks'"
    assert all(i["path"] == "tasks" for i in C4.blocks_info())
    _same(C4.to_scipy(), C3.to_scipy(), 1e-12)


def test_spgemm_block_check_fails_on_the_runners(client, rng, monkeypatch):
    """A kernel that loses an entry: the runner's block fails its row-sum check, the call raises
    and keeps nothing."""
    lossy_plans(monkeypatch, worker_mod)
    A, B = random_csr(rng, 60, 40, 0.2), random_csr(rng, 40, 30, 0.2)
    Ad = md.DistributedCSR.from_matrix(A, client=client, nblocks=3)
    held = _held(client)
    with pytest.raises(md.BlockCheckError, match="row sums"):
        md.spgemm(Ad, md.replicate(B, client=client))
    assert _wait_for(lambda: _held(client) == held)


def test_spmm_spmv_and_iterations_on_the_runners(client, rng):
    S = random_csr(rng, 300, 300, 0.03)
    X = rng.random((300, 3))
    Sd = md.DistributedCSR.from_matrix(S, client=client, nblocks=3)
    Xr = md.replicate(X, client=client)
    Y = md.spmm(Sd, Xr)
    assert isinstance(Y, md.DistributedDense) and Y.timings["path"] == "runner" and Y.path == "runner"
    np.testing.assert_allclose(Y.gather(), S @ X, rtol=1e-12)
    np.testing.assert_allclose(Y.block(2), (S @ X)[Y.bounds[2]:], rtol=1e-12)
    y = md.spmm(Sd, md.replicate(X[:, 0], client=client))   # SpMV
    assert y.shape == (300,) and y.timings["path"] == "runner"
    np.testing.assert_allclose(y.gather(), S @ X[:, 0], rtol=1e-12)
    ref = S @ X
    with md.DistributedOperator(Sd) as op:                  # Y = op @ Y: X assembled from the runners' blocks
        for _ in range(3):
            Y = op @ Y
            ref = S @ ref
            assert op.last_timings["path"] == "runner" and op.last_timings["planned"] == 0
        np.testing.assert_allclose(Y.gather(), ref, rtol=1e-12)
        Yt = md.spmm(Sd, Y, path="tasks")                     # a runner's Y as X of the task path
        assert Yt.timings["path"] == "tasks" and not any(isinstance(h, md.Held) for h in Yt.handles())
        np.testing.assert_allclose(Yt.gather(), S @ ref, rtol=1e-12)
        Yr = op @ Yt                                          # a task path's Y as X of the runners
        assert op.last_timings["path"] == "runner"
        np.testing.assert_allclose(Yr.gather(), S @ (S @ ref), rtol=1e-12)
        x = rng.random(300)                                   # host x: sent with the runners' messages
        np.testing.assert_allclose(op @ x, S @ x, rtol=1e-12)
        assert op.last_timings["path"] == "runner" and op.last_timings["overhead_s"] >= 0


def test_power_iteration_on_the_runners(capsys):
    import runpy
    from pathlib import Path
    example = runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "distributed_power_iteration.py"),
                             run_name="example")
    assert example["main"](["--scale", "10", "--workers", "2", "--gpu", "no"]) == 0   # worker processes
    out = capsys.readouterr().out
    assert "on the runner path" in out and ": OK" in out


def test_release_frees_the_registry(client, rng):
    S = random_csr(rng, 200, 200, 0.05)
    B = random_csr(rng, 200, 100, 0.05)
    Sd = md.DistributedCSR.from_matrix(S, client=client)
    Xr, Br = md.replicate(rng.random((200, 2)), client=client), md.replicate(B, client=client)
    assert _wait_for(lambda: _held(client) == 0)
    Y, C = md.spmm(Sd, Xr), md.spgemm(Sd, Br)
    assert _held(client) == len(Y) + len(C)
    Y.release()
    assert _wait_for(lambda: _held(client) == len(C))
    with pytest.raises(md.DistributedProductError, match="released"):
        Y.gather()
    del C                                                     # garbage collected: freed as well
    gc.collect()
    assert _wait_for(lambda: _held(client) == 0)
    pinned = sum(s["pinned"] for s in _runner_state(client).values())
    Br.release()                                              # the runners let go of B's copies
    assert _wait_for(lambda: sum(s["pinned"] for s in _runner_state(client).values()) <= pinned - 2)


def test_copies_dropped_before_the_pin_are_sent_again(client, rng, monkeypatch):
    """A broadcast whose copy Dask's memory manager dropped before the runners pinned it is sent
    again (the runner path then finds B on every worker), and the first key's pins are let go."""
    from matplan.distributed import replicated
    real, keys = replicated.pin, []

    def pin(c, key):
        keys.append(key)
        missed = real(c, key)
        return missed + (["a worker whose copy was dropped"] if len(keys) == 1 else [])
    monkeypatch.setattr(replicated, "pin", pin)
    pinned = sum(s["pinned"] for s in _runner_state(client).values())
    A, B = random_csr(rng, 200, 150, 0.05), random_csr(rng, 150, 120, 0.05)
    Br = md.replicate(B, client=client)
    assert len(keys) == 2 and Br.future().key == keys[1] and Br._keys == [keys[1]]
    pinned_now = lambda: sum(s["pinned"] for s in _runner_state(client).values())   # noqa: E731
    assert _wait_for(lambda: pinned_now() == pinned + len(client.nthreads()))
    C = md.spgemm(md.DistributedCSR.from_matrix(A, client=client, balance=Br), Br)
    assert C.timings["path"] == "runner" and C.timings["fallback"] is None
    _same(C.to_scipy(), A @ B, 1e-12)


def test_tasks_where_a_precondition_fails(client, rng, tmp_path):
    A, B = random_csr(rng, 200, 150, 0.05), random_csr(rng, 150, 120, 0.05)
    Br = md.replicate(B, client=client)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br)
    C = md.spgemm(Ad, Br, path="tasks")                       # asked for
    assert C.timings["path"] == "tasks" and all(i["path"] == "tasks" for i in C.blocks_info())
    P = md.spgemm(Ad, B, panels=2)                            # B in column panels: not replicated
    assert P.timings["path"] == "tasks" and "column panels" in P.timings["fallback"]
    _same(P.to_scipy(), A @ B)
    R = md.spgemm(Ad, Br)
    R.save(tmp_path / "c")                                    # a runner's C saved block by block
    _same(md.load(tmp_path / "c").to_scipy(), A @ B)
    L = md.load(tmp_path / "c", client=client)                 # blocks on workers nobody recorded
    CL = md.spgemm(L, md.replicate(random_csr(rng, 120, 50, 0.1), client=client))
    assert CL.timings["path"] == "tasks" and "known worker" in CL.timings["fallback"]
    with pytest.raises(ValueError, match="path"):
        md.spgemm(Ad, Br, path="fast")
    with pytest.raises(ValueError, match="path"):
        md.DistributedOperator(Ad, path="runners")


def test_a_runner_answers_not_here(client, rng):
    """A block or operand not in the worker's memory is an answer, not a crash; a held block
    asked for by a task where it is not raises HeldBlockLost."""
    w = sorted(client.nthreads())[0]
    runner = fastpath.runners(client, [w])[w]
    [(status, reply)] = fastpath.call_all(client, [(w, runner, "spgemm", (
        "t", [(0, 0, 5, ("data", "no-such-key"))], ("data", "no-such-operand"), "auto", "never", None))])
    assert status == "ok" and reply["missing"] == [("data", "no-such-operand"), ("data", "no-such-key")]
    [(status, got)] = fastpath.call_all(client, [(w, runner, "fetch", ([("held", "nope")],))])
    assert status == "ok" and got == [None]
    [(status, err)] = fastpath.call_all(client, [(w, runner, "apply", (["nope"], len))])
    assert status == "error" and isinstance(err, HeldBlockLost)
    [(status, _)] = fastpath.call_all(client, [(w, "matplan-runner-none", "info", ())])
    assert status == "lost"
    with pytest.raises(HeldBlockLost, match="nope"):
        client.submit(held_block, runner, "nope", workers=[w], pure=False).result()


def test_a_block_error_on_the_runners_is_a_clear_error(client, rng):
    """A block that raises on its runner (here: on="gpu" where no worker has one) fails the call as
    the tasks would, naming the worker and the cause; nothing is kept."""
    from matplan.core.xp import cupy_module
    if cupy_module() is not None:
        pytest.skip("needs workers without a GPU")
    A, B = random_csr(rng, 60, 40, 0.2), random_csr(rng, 40, 30, 0.2)
    Ad = md.DistributedCSR.from_matrix(A, client=client, nblocks=2)
    held = _held(client)
    with pytest.raises(md.DistributedProductError, match="spgemm: a block failed on .*no usable GPU"):
        md.spgemm(Ad, md.replicate(B, client=client), on="gpu")
    assert _wait_for(lambda: _held(client) == held)


# -- workers killed between steady calls (a process cluster) -----------------------------------


def test_worker_killed_between_steady_calls(cluster, rng):
    """A worker holding blocks of A, of C and of Y dies between two steady calls: the next calls
    run through tasks (A's lost blocks rebuilt from the client's A), then on the runners again;
    results made before are computed again when read. Every result equals SciPy's."""
    c, client = cluster
    A, B = random_csr(rng, 400, 300, 0.03), random_csr(rng, 300, 200, 0.03)
    S, X = random_csr(rng, 300, 300, 0.03), rng.random((300, 2))
    Br, Xr = md.replicate(B, client=client), md.replicate(X, client=client)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br, nblocks=4)
    Sd = md.DistributedCSR.from_matrix(S, client=client, nblocks=4)
    C1, Y1 = md.spgemm(Ad, Br), md.spmm(Sd, Xr)
    assert C1.timings["path"] == Y1.timings["path"] == "runner", (C1.timings["fallback"], Y1.timings["fallback"])
    crash_worker(c, C1.handles()[0].worker, client=client)
    C2 = md.spgemm(Ad, Br)
    assert C2.timings["path"] == "tasks" and C2.timings["fallback"]   # A's block 0 is gone: why is said
    _same(C2.to_scipy(), A @ B)
    Y2 = md.spmm(Sd, Y1)                                      # X's blocks on the dead worker: recomputed
    np.testing.assert_allclose(Y2.gather(), S @ (S @ X), rtol=1e-12)
    C3 = md.spgemm(Ad, Br)                                    # runners again, on the workers left ...
    if C3.timings["path"] == "tasks":   # ... unless Dask's memory manager dropped the copy of a block
        assert "is not on" in C3.timings["fallback"], C3.timings["fallback"]   # the tasks left: said
        _same(C3.to_scipy(), A @ B)
        C3 = md.spgemm(Ad, Br)                                # found where the last call left it
    assert C3.timings["path"] == "runner", C3.timings["fallback"]
    _same(C3.to_scipy(), A @ B)
    _same(C1.to_scipy(), A @ B)                               # made before: its lost held block recomputed
    np.testing.assert_allclose(Y1.gather(), S @ X, rtol=1e-12)
    # back on the runners (a call may still find a block Dask moved for the tasks: that one says why)
    paths = [md.spmm(Sd, Y1).timings["path"] for _ in range(3)]
    assert paths[-1] == "runner", paths


def test_worker_killed_without_a_source_is_a_clear_error(cluster, rng):
    c, client = cluster
    A, B = random_csr(rng, 400, 300, 0.03), random_csr(rng, 300, 200, 0.03)
    Br = md.replicate(B, client=client)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br, nblocks=4, keep_source=False)
    assert md.spgemm(Ad, Br).timings["path"] == "runner"
    crash_worker(c, Ad.blocks_info()[0]["worker"], client=client)
    with pytest.raises(md.DistributedProductError, match="lost with its worker.*keep_source=False"):
        md.spgemm(Ad, Br)


def test_worker_killed_during_a_runner_call(cluster, rng):
    """A worker dies while its runner computes: the call runs through tasks instead and C is
    complete and equal to SciPy's (the last test: it leaves the runners slow)."""
    import threading
    c, client = cluster
    A, B = random_csr(rng, 400, 300, 0.03), random_csr(rng, 300, 200, 0.03)
    Br = md.replicate(B, client=client)
    Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br, nblocks=4)
    client.register_plugin(SlowRunner(1.5), name="slow-runner")
    victim = Ad.blocks_info()[0]["worker"]
    killer = threading.Timer(0.5, crash_worker, (c, victim), dict(client=client))
    killer.start()
    C = md.spgemm(Ad, Br)
    killer.join()
    assert C.timings["path"] == "tasks" and "could not be reached" in C.timings["fallback"]
    _same(C.to_scipy(), A @ B)
    assert all(i["check_worst"] <= 1.0 and i["worker"] != victim for i in C.blocks_info())



def test_runner_arguments_go_plain_where_they_can():
    """References and options travel as msgpack (cheaper than pickling each); arrays are pickled;
    a tuple Dask key arriving as a list is found under the tuple."""
    from distributed.protocol.serialize import Serialize
    from matplan.distributed.runner import _key
    refs = [("data", "csr-block-0-1"), ("held", "matplan-spmm-ab-0")]
    assert fastpath.wire(refs) is refs and fastpath.wire("auto") == "auto" and fastpath.wire(None) is None
    assert isinstance(fastpath.wire(("value", np.ones(3))), Serialize)
    assert isinstance(fastpath.wire(object()), Serialize)
    assert _key(["x", ["y", 0]]) == ("x", ("y", 0)) and _key("k") == "k"
