"""TSM2's t1 search and cuBLAS's calibration through the planner's one measurement (GPU only):
every config of the search space and cuBLAS timed once per shape bucket, the fastest kept, the
timings reused from the measurement cache by later plans in this process and in another one,
failing configs left out, measure="never" timing nothing."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import check_dense_product, nonzero_random as _random

from matplan import planner
from matplan.core import device as device_mod, features as stats
from matplan.core.validation import normalize
from matplan.kernels import get, prebuild
from matplan.kernels.tsgemm import configs, tsm2
from matplan.planner import measure, measure_cache as mc
from matplan.tuning_db import calibration

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[3]
RTOL = {np.float32: 2e-5 * 8, np.float64: 1e-13 * 8}


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty measurement cache file for the test; the new entries it gets."""
    monkeypatch.setenv(mc.CACHE_ENV, str(tmp_path / "m.sqlite"))
    monkeypatch.setattr(mc, "_CACHES", {})
    got = []
    monkeypatch.setattr(mc, "LISTENERS", [got.extend])
    return got


def _operands(cp, rng, m, n, k, dtype=np.float32, order="C"):
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    return A_h, B_h, cp.asarray(A_h, order=order), cp.asarray(B_h)


@pytest.mark.parametrize("order", ["C", "F"])
def test_every_config_and_cublas_timed_once_per_bucket(cp, rng, fresh, order):
    m, n, k = 4096, 2048, 8
    A_h, B_h, A, B = _operands(cp, rng, m, n, k, order=order)
    prebuild.warmup_tsgemm([(m, n, k)], dtypes=("float32",), orders=(order,))   # every config ready
    p = planner.plan(A, B)                                         # reuse=1: timed all the same
    f = p.features
    space = get("tsgemm.tsm2").search_space(f, device_mod.current())
    kinds = sorted(e.key.config.kernel for e in fresh)
    assert kinds == ["gemm.cublas"] + ["tsgemm.tsm2"] * len(space)
    assert {json.dumps(e.key.config.params(), sort_keys=True) for e in fresh if e.key.config.kernel == "tsgemm.tsm2"} \
        == {json.dumps(s, sort_keys=True) for s in space}
    note = p.reasons[-1]
    assert "every candidate kept by a shape bucket" in note and f"{len(space) + 1} timed" in note
    measured = [c for c in p.candidates if c.source == "measured"]
    assert {c.kernel for c in measured} == {"tsgemm.tsm2", "gemm.cublas"}
    assert p.candidates[0] is measured[0] and measured[0].total_s == min(c.total_s for c in measured)
    best_tsm2 = min((e for e in fresh if e.key.config.kernel == "tsgemm.tsm2"), key=lambda e: e.seconds)
    tsm2_cand = next(c for c in measured if c.kernel == "tsgemm.tsm2")
    assert tsm2_cand.params == best_tsm2.key.config.params()        # the search's winner
    check_dense_product(p.run(A, B), A_h, B_h, RTOL[np.float32])
    # a later plan of this problem, and of another problem of the same bucket: nothing timed
    del fresh[:]
    again = planner.plan(A, B)
    assert "0 timed" in again.reasons[-1] and fresh == [] and again.kernel == p.kernel
    A2_h, B2_h, A2, B2 = _operands(cp, rng, 3000, n, k, order=order)   # 3000 rows: bucket 4096 too
    other = planner.plan(A2, B2)
    assert "0 timed" in other.reasons[-1] and fresh == []
    assert "measured/model" in next(c for c in other.candidates if c.kernel == "gemm.cublas").why
    check_dense_product(other.run(A2, B2), A2_h, B2_h, RTOL[np.float32])


def test_a_second_process_plans_without_timing(cp, tmp_path):
    """The persistent cache: a second process's plan of the same bucket times nothing and makes
    the same choice."""
    script = (
        "import json, cupy as cp\n"
        "from matplan import planner\n"
        "A = cp.random.default_rng(1).random((4096, 2048), dtype=cp.float32)\n"
        "B = cp.random.default_rng(2).random((2048, 4), dtype=cp.float32)\n"
        "p = planner.plan(A, B)\n"
        "print(json.dumps({'note': p.reasons[-1], 'kernel': p.kernel, 'params': p.params}))\n")
    env = dict(os.environ, MATPLAN_MEASURE_CACHE=str(tmp_path / "m.sqlite"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        out.append(json.loads(run.stdout.strip().splitlines()[-1]))
    assert " 0 timed" not in out[0]["note"] and " 0 timed" in out[1]["note"]
    assert (out[1]["kernel"], out[1]["params"]) == (out[0]["kernel"], out[0]["params"])


def test_never_times_nothing_and_runs_the_models_config(cp, rng, fresh):
    A_h, B_h, A, B = _operands(cp, rng, 4096, 2048, 8)
    p = planner.plan(A, B, kernels=["tsgemm.tsm2"], measure="never")
    assert fresh == [] and all(c.source != "measured" for c in p.candidates)
    assert p.params == configs.default(device_mod.current(), p.features).params()
    check_dense_product(p.run(A, B), A_h, B_h, RTOL[np.float32])


def test_a_failing_config_is_left_out_with_a_warning(cp, rng, fresh, monkeypatch):
    """A config whose launch cannot be made (here every cp.async one) scores nothing and is named
    in a RuntimeWarning; the others are measured and the plan runs."""
    def broken(*args, **kwargs):
        raise RuntimeError("no launch for this one")
    monkeypatch.setattr(tsm2, "AsyncLaunch", broken)
    tsm2._LAUNCHES.clear()                                   # no launch made by an earlier test
    A_h, B_h, A, B = _operands(cp, rng, 4096, 2048, 16)
    prebuild.warmup_tsgemm([(4096, 2048, 16)], dtypes=("float32",), orders=("C",))   # register configs ready
    assert any("async" in c for c in get("tsgemm.tsm2").search_space(
        stats.compute(normalize(A, B), device_mod.current()), device_mod.current()))
    with pytest.warns(RuntimeWarning, match="tsgemm.tsm2: [0-9]+ of [0-9]+ configs failed to compile or "
                                            "launch .*no launch for this one"):
        p = planner.plan(A, B, kernels=["tsgemm.tsm2"])
    assert "async" not in p.params and not any("async" in e.key.config.params() for e in fresh)
    check_dense_product(p.run(A, B), A_h, B_h, RTOL[np.float32])


def test_the_gpu_is_warmed_up_before_timing(cp, rng, fresh, monkeypatch):
    warmed = []
    real = measure.warm_up
    monkeypatch.setattr(measure, "warm_up", lambda fn, s: warmed.append(s) or real(fn, s))
    _, _, A, B = _operands(cp, rng, 2048, 1024, 4)
    planner.plan(A, B)
    assert warmed and warmed[0] == measure.WARM_UP_S


def test_tuning_runs_take_the_planners_choice_and_record_it(cp, rng, fresh):
    """calibration.tuned_params: the config the planner would run (measured now or from the cache)
    and every measurement it used, for the tuning database."""
    _, _, A, B = _operands(cp, rng, 4096, 2048, 8, np.float64, "F")
    problem = normalize(A, B)
    dev = device_mod.current()
    feats = stats.compute(problem, dev)
    rec = calibration.recording()
    rec.drain()
    got = calibration.tuned_params(get("tsgemm.tsm2"), problem, feats, dev)
    plan = planner.plan(A, B, kernels=["tsgemm.tsm2"])
    assert got == [plan.params]
    drained = rec.drain()
    assert len(drained) == len(get("tsgemm.tsm2").search_space(feats, dev))
    assert calibration.tuned_params(get("gemm.cublas"), problem, feats, dev) == [{}]
    assert [e.key.config.kernel for e in rec.drain()] == ["gemm.cublas"]
    assert all(r.value["ratio"] > 0 for r in calibration.records("dev", "0.1", drained))
