"""Distributed tuning on a CPU LocalCluster: every problem's records written once by the client,
one problem per worker at a time, and a worker killed mid-run losing and doubling nothing."""
import os
import signal
import sys
import threading
import time

import pytest

distributed = pytest.importorskip("distributed")
from matplan import cli as matplan_cli  # noqa: E402
from matplan.kernels import registry  # noqa: E402
from matplan.tuning_db import tune as tune_mod  # noqa: E402
from matplan.tuning_db import units as units_mod  # noqa: E402
from matplan.tuning_db.store import TuningDB  # noqa: E402

FAST = dict(progress=False, repeats=2, warmup=0, budget_s=0.2)
UNITS = dict(families=["rmat", "banded", "poisson2d"], ops=("spmv", "spmm"), spmm_ks=(4,), dtypes=("float64",))


@pytest.fixture
def slow_plugin(monkeypatch):
    """``test.slow`` registered here and, through tune(imports=...), in every worker."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.delitem(sys.modules, "tune_slow_plugin", raising=False)
    yield ["tune_slow_plugin"]
    sys.modules.pop("tune_slow_plugin", None)


def _records(path):
    with TuningDB(path) as db:
        rows = db.timings()
        probs = {p.fingerprint: p.source for p in db.problems()}
    return rows, probs


def _check_complete(path, units, kernels):
    rows, probs = _records(path)
    assert sorted(probs.values()) == sorted(u.key for u in units)   # every problem, once
    keys = [(t.problem, t.kernel, t.params) for t in rows]
    assert len(keys) == len(set(keys)) == len(units) * len(kernels)   # every candidate, once
    assert {k for _, k, _ in keys} == set(kernels)
    assert all(t.status == "ok" and t.matched for t in rows)


def test_tuning_on_three_workers_writes_every_record_once(tmp_path, slow_plugin):
    units = units_mod.corpus_units(["small"], **UNITS)
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        s = tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", scheduler=lc.scheduler_address,
                          kernels=["cpu.scipy", "test.slow"], imports=slow_plugin, **FAST)
    assert s.units == len(units) and s.timed == 2 * len(units) and not s.unit_errors
    assert len(s.workers) >= 2   # spread over the workers
    _check_complete(tmp_path / "t.sqlite", units, {"cpu.scipy", "test.slow"})


def test_a_worker_killed_mid_run_loses_and_doubles_nothing(tmp_path, slow_plugin):
    units = units_mod.corpus_units(["small"], **UNITS)
    killed = []
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
            distributed.Client(lc) as watcher:
        pids = watcher.run(os.getpid)

        def kill_one_busy_worker():   # SIGKILL a worker while it runs a tuning task
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not killed:
                for addr, keys in watcher.processing().items():
                    if any(str(k).startswith("matplan-tune-") for k in keys) and addr in pids:
                        time.sleep(0.1)   # inside the problem, past its start
                        os.kill(pids[addr], signal.SIGKILL)
                        killed.append(addr)
                        return
                time.sleep(0.02)

        t = threading.Thread(target=kill_one_busy_worker, daemon=True)
        t.start()
        s = tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", scheduler=lc.scheduler_address,
                          kernels=["cpu.scipy", "test.slow"], imports=slow_plugin, **FAST)
        t.join(5)
    assert killed, "no worker was killed: the test did not exercise a loss"
    assert s.units == len(units) and s.timed == 2 * len(units) and not s.unit_errors
    _check_complete(tmp_path / "t.sqlite", units, {"cpu.scipy", "test.slow"})


def test_multithreaded_workers_without_gpu_resources_are_refused(tmp_path):
    units = units_mod.corpus_units(["small"], families=["banded"], ops=("spmv",), dtypes=("float64",))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as lc:
        with pytest.raises(ValueError, match="scheduler: worker .* 2 threads .*--nthreads 1"):
            tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", scheduler=lc.scheduler_address, **FAST)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None,
                                  resources={"GPU": 2}) as lc:
        with pytest.raises(ValueError, match="GPU=2"):
            tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", scheduler=lc.scheduler_address, **FAST)


def test_gpu_resource_workers_run_one_problem_at_a_time(tmp_path):
    """Workers with several threads but GPU=1: tasks ask for the GPU, so never two on one worker."""
    units = units_mod.corpus_units(["small"], **UNITS)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=3, processes=False, dashboard_address=None,
                                  resources={"GPU": 1}) as lc, distributed.Client(lc) as c:
        assert tune_mod.dask_resources(c) == {"GPU": 1}
        with distributed.get_task_stream(client=c) as ts:
            s = tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", scheduler=lc.scheduler_address,
                              **FAST)
    assert s.units == len(units) and not s.unit_errors
    spans = {}
    for task in ts.data:
        if str(task["key"]).startswith("matplan-tune-"):
            for ss in task["startstops"]:
                if ss["action"] == "compute":
                    spans.setdefault(task["worker"], []).append((ss["start"], ss["stop"]))
    assert sum(len(v) for v in spans.values()) == len(units)
    for runs in spans.values():   # one problem at a time on each worker: no two compute spans overlap
        runs.sort()
        assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:]))
    rows, probs = _records(tmp_path / "t.sqlite")
    assert sorted(probs.values()) == sorted(u.key for u in units)


def test_cli_scheduler_local(tmp_path, capsys, monkeypatch):
    """`matplan tune --scheduler local` runs on matplan.distributed.local_cluster (the CLI wires it)."""
    import matplan.distributed as md
    started = []
    real = md.local_cluster

    def spy(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]
    monkeypatch.setattr(md, "local_cluster", spy)
    db = tmp_path / "c.sqlite"
    rc = matplan_cli.main(["tune", "--backend", "cpu", "--scheduler", "local", "--n-jobs", "2", "--size", "small",
                           "--family", "banded", "--ops", "spmv", "--dtype", "float64", "--repeats", "2",
                           "--warmup", "0", "--budget", "0.2", "--no-progress", "--db", str(db)])
    out = capsys.readouterr()
    assert rc == 0 and "tuned 1 problems" in out.out
    assert len(started) == 1 and started[0].kind == "cpu" and started[0].n_workers == 0   # closed after the run
    assert "matplan tune: started <matplan local cluster: 2 CPU workers" in out.err
    rows, probs = _records(db)
    assert len(probs) == 1
    assert rows and all(t.matched for t in rows)
