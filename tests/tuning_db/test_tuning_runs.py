"""Offline tuning runs on the host: records, resumes, failures, worker processes and Dask, the
command line, refreshing stored features (GPU test marked gpu)."""
import dataclasses

import numpy as np
import pytest

from matplan import __version__
from matplan.tuning_db import reference as reference_mod
from matplan.tuning_db import tune as tune_mod
from matplan.tuning_db import units as units_mod
from matplan.tuning_db.records import ProblemRecord
from matplan.tuning_db.store import TuningDB
from tuning_helpers import BAD_KERNELS, CHOICE_KERNELS, registered
from conftest import random_csr

SMALL = dict(families=["poisson2d", "rmat", "banded", "tall_skinny"], ops=("spmv", "spmm", "tsgemm"),
             spmm_ks=(4,), tsgemm_ks=(2, 8), dtypes=("float64",))
FAST = dict(progress=False, repeats=2, warmup=0, budget_s=0.2)


def test_tune_records_checks_and_resumes(tmp_path):
    path = tmp_path / "t.sqlite"
    units = units_mod.corpus_units(["small"], **SMALL)
    first = tune_mod.tune(units[:4], db=path, backend="cpu", **FAST)
    assert first.units == 4 and first.timed == 4 and first.failed == 0 and first.skipped == 0
    full = tune_mod.tune(units, db=path, backend="cpu", **FAST)     # an interrupted run resumes
    assert full.skipped == 4 and full.timed == len(units) - 4
    again = tune_mod.tune(units, db=path, backend="cpu", **FAST)
    assert again.timed == 0 and again.skipped == len(units)
    with TuningDB(path) as db:
        rows = db.timings()
        assert len(rows) == len(units) and all(t.status == "ok" and t.matched for t in rows)
        assert all(t.matplan_version == __version__ and t.run_ms_min <= t.run_ms_median <= t.run_ms_max
                   for t in rows)
        probs = {p.fingerprint: p for p in db.problems()}
        assert {p.source for p in probs.values()} == {u.key for u in units}
        assert {t.kernel for t in rows} == {"cpu.scipy", "cpu.numpy"}
        f = next(p for p in probs.values() if p.op == "spmm").features
        assert f["k"] == 4 and f["nnz"] > 0 and f["row_mean"] > 0


def test_failing_and_wrong_candidates_are_recorded_not_fatal(tmp_path):
    path = tmp_path / "t.sqlite"
    units = units_mod.corpus_units(["small"], families=["poisson2d", "banded"], ops=("spmv", "spmm"),
                                  spmm_ks=(3,), dtypes=("float64",))
    with registered(*BAD_KERNELS):
        s = tune_mod.tune(units, db=path, backend="cpu", **FAST)
        assert s.units == len(units) and s.failed == len(units) and s.mismatched == 2 * len(units)
        with TuningDB(path) as db:
            by = {}
            for t in db.timings():
                by.setdefault(t.kernel, []).append(t)
        assert all(t.status == "failed" and "boom: simulated launch failure" in t.error for t in by["test.broken"])
        assert all(t.status == "ok" and t.matched is False and t.max_error > 1e-4 for t in by["test.wrong"])
        assert all(t.matched is False and t.max_error == np.inf for t in by["test.lazy"])   # NaN poisoning
        assert all(t.status == "ok" and t.matched for t in by["cpu.scipy"])
        # failures count as recorded (resumable) unless retried
        assert tune_mod.tune(units, db=path, backend="cpu", **FAST).timed == 0
        retry = tune_mod.tune(units, db=path, backend="cpu", retry_failed=True, **FAST)
        assert retry.timed == len(units) and retry.failed == len(units)


def test_new_kernel_is_timed_on_resume(tmp_path):
    path = tmp_path / "t.sqlite"
    units = units_mod.corpus_units(["small"], families=["banded"], ops=("spmv",), dtypes=("float64",))
    tune_mod.tune(units, db=path, backend="cpu", **FAST)
    with registered(*CHOICE_KERNELS):
        s = tune_mod.tune(units, db=path, backend="cpu", **FAST)
    assert s.skipped == 1 and s.timed == 3           # the three row-chunk candidates; densify refuses 5000x5000


def test_unbuildable_unit_is_reported_not_fatal(tmp_path):
    bad = tmp_path / "bad.mtx"
    bad.write_text("not a matrix market file\n")
    units = units_mod.file_units([bad], ops=("spmv",), dtypes=("float64",))
    units += units_mod.corpus_units(["small"], families=["banded"], ops=("spmv",), dtypes=("float64",))
    s = tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", **FAST)
    assert s.units == 2 and s.timed == 1 and len(s.unit_errors) == 1 and "bad.mtx" in s.unit_errors[0]


def test_spgemm_whose_reference_cannot_fit_the_host_is_reported_not_fatal(tmp_path, monkeypatch):
    """A product whose SciPy reference would exhaust host memory is reported and not timed (it
    killed a whole tuning run before); the other units still run."""
    from matplan.kernels.spgemm import panels as spgemm_mod
    from matplan.core import features as stats
    units = units_mod.corpus_units(["small"], families=["banded"], ops=("spmv", "spgemm"), dtypes=("float64",))
    monkeypatch.setattr(spgemm_mod, "host_available_bytes", lambda: 1 << 20)
    s = tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", **FAST)
    assert s.units == 2 and s.timed == 1 and len(s.unit_errors) == 1
    assert "spgemm" in s.unit_errors[0] and "SciPy reference needs about" in s.unit_errors[0]
    f = stats.Features(op="spgemm", dtype="float64", backend="cpu", m=10, n=10, k=10, products=100,
                       compression=2.0)
    reference_mod.check_reference_fits(f, available=1 << 30)               # 50 nonzeros: fits
    with pytest.raises(MemoryError, match="GB of host memory"):
        reference_mod.check_reference_fits(dataclasses.replace(f, m=10**6, k=10**6, products=10**10), available=1 << 30)


def test_mtx_folder_units(tmp_path, rng):
    from matplan.corpus import write_mtx
    write_mtx(tmp_path / "one.mtx", random_csr(rng, 50, 50, 0.1))
    write_mtx(tmp_path / "two.mtx", random_csr(rng, 60, 40, 0.1))
    units = units_mod.file_units([tmp_path], dtypes=("float64",), spmm_ks=(2,))
    assert {u.family for u in units} == {"one", "two"}
    assert {(u.matrix, u.op) for u in units if u.op == "spgemm"} == {("one", "spgemm"), ("two", "spgemm")}
    s = tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", **FAST)
    assert s.timed == len(units) and s.failed == 0 and s.mismatched == 0


def test_parallel_workers_match_serial(tmp_path):
    """joblib's loky backend, two worker processes: the same records as a serial run."""
    units = units_mod.corpus_units(["small"], **SMALL)
    tune_mod.tune(units, db=tmp_path / "serial.sqlite", backend="cpu", **FAST)
    s = tune_mod.tune(units, db=tmp_path / "par.sqlite", backend="cpu", n_jobs=2, **FAST)
    assert s.timed == len(units)
    with TuningDB(tmp_path / "serial.sqlite") as a, TuningDB(tmp_path / "par.sqlite") as b:
        key = lambda t: (t.device_key, t.problem, t.kernel, t.params)  # noqa: E731
        assert sorted(map(key, a.timings())) == sorted(map(key, b.timings()))
        assert a.problems() == b.problems()


def test_lost_device_replaces_the_worker_and_finishes(tmp_path, monkeypatch):
    """A candidate that breaks its device: recorded as failed, its worker replaced, the rest still timed."""
    import sys
    from matplan.kernels import registry
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))   # the plugin registers here too
    monkeypatch.delitem(sys.modules, "tuning_plugin", raising=False)
    units = units_mod.corpus_units(["small"], families=["rmat", "banded", "poisson2d"], ops=("spmv",),
                                  dtypes=("float64",))
    try:
        s = tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", n_jobs=2, imports=["tuning_plugin"],
                          **FAST)
    finally:
        sys.modules.pop("tuning_plugin", None)
    # the broken worker exits on its next task; when the other worker takes the last problems first,
    # no replacement is needed, so s.restarts is 0 or more (asserting >= 1 failed under CPU load)
    assert s.units == 3 and not s.unit_errors
    with TuningDB(tmp_path / "t.sqlite") as db:
        rows = db.timings()
        probs = {p.fingerprint: p.matrix for p in db.problems()}
    by = {(probs[t.problem], t.kernel, t.params): t for t in rows}
    lost = by[("rmat-small", "test.lost", "{}")]
    assert lost.status == "failed" and lost.error.startswith("device context lost")
    # every candidate of every problem got recorded, the row-chunk ones after the lost one included
    for m in ("rmat-small", "banded-small", "poisson2d-small"):
        assert {k for (mm, k, _) in by if mm == m} == {"cpu.scipy", "test.lost", "test.rowchunk"}
        assert sum(1 for (mm, k, _) in by if mm == m and k == "test.rowchunk") == 3
    assert [t for t in rows if t.status == "failed"] == [lost]


def test_dask_local_cluster(tmp_path):
    """The Dask backend on a local two-worker cluster (skipped without matplan[distributed])."""
    distributed = pytest.importorskip("distributed")
    units = units_mod.corpus_units(["small"], **SMALL)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        s = tune_mod.tune(units, db=tmp_path / "d.sqlite", backend="cpu", scheduler=cluster.scheduler_address,
                          **FAST)
    assert s.units == len(units) and s.timed == len(units) and not s.unit_errors
    with TuningDB(tmp_path / "d.sqlite") as db:
        assert len(db.timings()) == len(units) and all(t.matched for t in db.timings())


def test_bad_arguments(tmp_path):
    units = units_mod.corpus_units(["small"], families=["banded"], ops=("spmv",), dtypes=("float64",))
    with pytest.raises(ValueError, match="n_jobs"):
        tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", n_jobs=0)
    # issue 40 item 4: NumPy integers are integers, bools and floats are not, each error names its argument
    for name, bad, expected in [("n_jobs", True, "None or a positive number of worker processes"),
                                ("n_jobs", np.int64(0), "None or a positive number of worker processes"),
                                ("n_jobs", 2.0, "None or a positive number of worker processes"),
                                ("repeats", np.int32(0), "None or a positive number of timed runs"),
                                ("repeats", np.bool_(True), "None or a positive number of timed runs"),
                                ("warmup", -1, r"None or a number >= 0 of untimed runs"),
                                ("warmup", np.float64(1), r"None or a number >= 0 of untimed runs")]:
        with pytest.raises(ValueError, match=f"{name}: expected {expected}"):
            tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", **{name: bad})
    s = tune_mod.tune(units[:1], db=tmp_path / "np.sqlite", backend="cpu", n_jobs=np.int64(1),
                      repeats=np.int32(2), warmup=np.uint8(0), progress=False, budget_s=0.2)
    assert s.units == 1 and s.timed == 1 and s.failed == 0
    with pytest.raises(ValueError, match="backend"):
        tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="tpu")
    with pytest.raises(TypeError, match="WorkUnit"):
        tune_mod.tune(["poisson2d"], db=tmp_path / "t.sqlite", backend="cpu")


# --- command line ----------------------------------------------------------------------------
def test_cli_tune_db_export_import(tmp_path, capsys):
    from matplan.cli import main
    db = str(tmp_path / "t.sqlite")
    assert main(["tune", "--db", db, "--backend", "cpu", "--family", "banded", "rmat", "--ops", "spmv",
                 "--dtype", "float64", "--no-progress", "--repeats", "2"]) == 0
    assert "tuned 2 problems" in capsys.readouterr().out
    assert main(["db", "info", "--db", db]) == 0
    assert "'timings': 2" in capsys.readouterr().out
    assert main(["db", "export", str(tmp_path / "e.jsonl"), "--db", db]) == 0
    assert main(["db", "import", str(tmp_path / "e.jsonl"), "--db", str(tmp_path / "u.sqlite")]) == 0
    assert "'timings_added': 2" in capsys.readouterr().out
    assert main(["tune", "--list", "--size", "small", "--family", "rmat"]) == 0
    assert "corpus:rmat:small:0|spgemm|k=0|float32" in capsys.readouterr().out
    (tmp_path / "junk.sqlite").write_text("junk")
    with pytest.raises(SystemExit, match="junk.sqlite.*not an SQLite file"):
        main(["db", "info", "--db", str(tmp_path / "junk.sqlite")])


def test_refresh_features_adds_missing_statistics_only(tmp_path, capsys):
    from matplan.cli import main
    from matplan.tuning_db.refresh import refresh_features
    path = tmp_path / "t.sqlite"
    units = units_mod.corpus_units(["small"], families=["banded"], ops=("spgemm", "spmv"), dtypes=("float64",))
    tune_mod.tune(units, db=path, backend="cpu", **FAST)
    with TuningDB(path) as db:
        before = {p.fingerprint: p for p in db.problems()}
        spgemm = next(p for p in before.values() if p.op == "spgemm")
        assert spgemm.features["compression"] > 1
        # as an older matplan stored them: no compression; and a value that must be kept
        stale = {fp: {k: v for k, v in p.features.items() if k != "compression"} for fp, p in before.items()}
        stale[spgemm.fingerprint]["row_mean"] = 123.0
        db.update_features(stale)
        db.put(problem=ProblemRecord("feedbeef", "spmv", "float64", "corpus:banded:small:7|spmv|k=1|float64",
                                     "banded", "banded-small", {"m": 1}))     # fingerprint of other operands
        counts = refresh_features(db, log=lambda msg: print(msg))
        assert counts == {"updated": len(before), "current": 0, "skipped": 1}
        assert "skipped corpus:banded:small:7" in capsys.readouterr().out
        after = {p.fingerprint: p.features for p in db.problems()}
    assert after[spgemm.fingerprint]["compression"] == spgemm.features["compression"]
    assert after[spgemm.fingerprint]["row_mean"] == 123.0
    assert all(after[fp] == dict(p.features, row_mean=after[fp]["row_mean"]) for fp, p in before.items())
    assert main(["db", "refresh-features", "--db", str(path)]) == 0
    assert "'updated': 0, 'current': 2, 'skipped': 1" in capsys.readouterr().out


# --- on the GPU ------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_tune_times_every_registered_kernel(tmp_path, cp):
    """Every GPU candidate of a few small problems runs, matches SciPy and is timed with CUDA events."""
    from matplan.kernels import kernels_for
    units = units_mod.corpus_units(["small"], families=["poisson2d", "skewed", "rmat", "tall_skinny"],
                                  ops=("spmv", "spmm", "spgemm", "tsgemm"), spmm_ks=(4,), tsgemm_ks=(8,),
                                  dtypes=("float64", "float32"))
    s = tune_mod.tune(units, db=tmp_path / "g.sqlite", backend="gpu", progress=False, repeats=5)
    assert s.units == len(units) and not s.unit_errors and s.restarts == 0
    from matplan.core.features import Features
    with TuningDB(tmp_path / "g.sqlite") as db:
        rows = db.timings()
        (dev,) = db.devices()
        problems = db.problems()
    assert dev.backend == "gpu" and dev.sms > 0 and dev.cupy == cp.__version__
    bad = [(t.kernel, t.params, t.error.splitlines()[0] if t.error else "") for t in rows
           if t.status != "ok" or not t.matched]
    assert not bad, bad
    timed = {(t.problem, t.kernel) for t in rows}
    for p in problems:                      # every kernel that accepts the problem was timed on it
        f = Features.from_dict(p.features)
        expected = {k.name for k in kernels_for(p.op, "gpu") if k.supports(f) is None}
        assert expected and {k for (fp, k) in timed if fp == p.fingerprint} == expected, p.source
    assert all(0 < t.run_ms_min <= t.run_ms_median <= t.run_ms_max for t in rows)
    again = tune_mod.tune(units, db=tmp_path / "g.sqlite", backend="gpu", progress=False)
    assert again.timed == 0 and again.skipped == len(rows)


@pytest.mark.gpu
def test_gpu_tune_precompiles_the_configs_modules(tmp_path, cp, monkeypatch):
    """A tuning run hands every candidate's modules to _cuda.precompile before timing them (and
    the planner's measurement of TSM2's search space, which a tuning run records as calibrations,
    its configs' modules): those without a prebuilt binary are compiled ahead of use, in a kernel
    cache of its own, and no candidate compiles at its first run."""
    from matplan.kernels import _cuda, _store
    store = _store.Store(_store.PACKAGE_DIR, tmp_path / "kernels")
    monkeypatch.setattr(_store, "default_store", lambda: store)
    calls = []

    real = _cuda.precompile

    def spy(specs, *args, **kw):   # the tuning run's candidates and TSM2's search space (its calibration)
        specs = list(specs)
        missing = {(f, tuple(n), tuple(o)) for f, n, o in specs if not _cuda.available(f, n, o)}
        calls.append((specs, missing, real(specs, *args, **kw)))
        return calls[-1][2]
    monkeypatch.setattr(_cuda, "precompile", spy)
    units = units_mod.corpus_units(["small"], families=["tall_skinny"], ops=("tsgemm",), tsgemm_ks=(5,),
                                  dtypes=("float64",))
    compiled_before = len(_cuda.COMPILED)
    s = tune_mod.tune(units, db=tmp_path / "p.sqlite", backend="gpu", progress=False, repeats=3)
    assert s.units == len(units) and not s.unit_errors and s.failed == 0
    specs = [m for c in calls for m in c[0]]
    assert specs and all(f.startswith("tsgemm/") for f, _, _ in specs)
    assert all(_cuda.available(f, n, o) for f, n, o in specs)   # every module now kept or loaded
    assert all(compiled == len(missing) for _, missing, compiled in calls)   # each missing one, once
    assert sum(len(missing) for _, missing, _ in calls) > 0, "nothing to compile: every config was prebuilt"
    assert compiled_before == len(_cuda.COMPILED) - sum(c for _, _, c in calls)   # none at a first run
