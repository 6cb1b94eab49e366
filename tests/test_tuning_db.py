"""The tuning database and offline tuning runs, on the host (no GPU needed)."""
import dataclasses
import json
import multiprocessing
import sqlite3

import numpy as np
import scipy.sparse as sp
import pytest

from matplan import __version__
from matplan.tuning_db import store as store_mod
from matplan.tuning_db import tune as tune_mod
from matplan.tuning_db.store import (DeviceRecord, ProblemRecord, TimingRecord, TuningDB, TuningDBError,
                                     canonical_params)
from tuning_helpers import BAD_KERNELS, CHOICE_KERNELS, registered
from conftest import random_csr

DEVICE = DeviceRecord(key="dev0", device_class="cpu", backend="cpu", name="test CPU", spec={"name": "x"})


def problem(i):
    return ProblemRecord(f"fp{i}", "spmv", "float64", f"src{i}", "fam", f"m{i}", {"m": i})


def timing(i, status="ok", run=1.0, version="0.1", device="dev0", kernel="k"):
    extra = dict(run_ms_median=run, run_ms_min=run, run_ms_max=run, repeats=3, matched=True) if status == "ok" \
        else dict(error="boom")
    return TimingRecord(device, f"fp{i}", kernel, canonical_params({"p": i % 3}), version, status, **extra)


# --- schema -------------------------------------------------------------------------------
def test_fresh_file_has_latest_schema_and_marker(tmp_path):
    db = TuningDB(tmp_path / "sub" / "t.sqlite")
    assert db.schema_version == store_mod.latest_version()
    conn = sqlite3.connect(str(db.path))
    assert conn.execute("PRAGMA application_id").fetchone()[0] == store_mod.APPLICATION_ID
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")} >= \
        {"devices", "problems", "timings", "schema_version"}
    db.close()


def test_default_path_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(store_mod.DB_ENV, str(tmp_path / "env.sqlite"))
    with TuningDB() as db:
        assert db.path == tmp_path / "env.sqlite"
    monkeypatch.delenv(store_mod.DB_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert store_mod.default_path() == tmp_path / "cache" / "matplan" / "tuning.sqlite"


def test_migration_adds_a_step_and_keeps_records(tmp_path):
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        db.put(DEVICE, problem(1), [timing(1)])
    nxt = store_mod.latest_version() + 1
    v2 = store_mod.MIGRATIONS + [(nxt, ["CREATE INDEX timings_kernel ON timings(kernel)",
                                        "ALTER TABLE devices ADD COLUMN note TEXT NOT NULL DEFAULT ''"])]
    with TuningDB(path, migrations=v2) as db:
        assert db.schema_version == nxt
        assert len(db.timings()) == 1
        names = {r[0] for r in db._conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "timings_kernel" in names
        assert db.devices()[0] == DEVICE          # the added column is ignored by the record type
    with pytest.raises(TuningDBError, match=rf"schema version {nxt}, newer than .* \({nxt - 1}\)"):
        TuningDB(path)


def test_not_sqlite_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "notes.sqlite"
    path.write_bytes(b"this is not a database at all\n" * 10)
    with pytest.raises(TuningDBError, match=f"{path}.*not an SQLite file"):
        TuningDB(path)
    assert path.read_bytes().startswith(b"this is not")      # untouched


def test_foreign_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(str(path))
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(TuningDBError, match=f"{path}.*another application"):
        TuningDB(path)
    conn = sqlite3.connect(str(path))
    conn.execute("PRAGMA application_id = 1234")
    conn.commit()
    conn.close()
    with pytest.raises(TuningDBError, match=r"application_id 0x4d2"):
        TuningDB(path)


def test_damaged_file_is_refused(tmp_path):
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        db.put(DEVICE, problem(1), [timing(1)])
        db._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = bytearray(path.read_bytes())
    raw[100:4096] = b"\xff" * (4096 - 100)        # the schema page, after the 100-byte header
    path.write_bytes(bytes(raw))
    with pytest.raises(TuningDBError, match=f"{path}"):
        db = TuningDB(path)
        db.check()
        db.timings()


# --- writes -------------------------------------------------------------------------------
def test_same_key_never_duplicates_and_ok_supersedes_failed(tmp_path):
    with TuningDB(tmp_path / "t.sqlite") as db:
        assert db.put(DEVICE, problem(1), [timing(1, "failed")]) == 1
        assert db.put(DEVICE, problem(1), [timing(1, "failed")]) == 0
        assert db.put(DEVICE, problem(1), [timing(1, "ok", run=2.0)]) == 1     # ok replaces failed
        assert db.put(DEVICE, problem(1), [timing(1, "ok", run=9.0)]) == 0     # first ok stays
        assert db.put(DEVICE, problem(1), [timing(1, "failed")]) == 0
        (t,) = db.timings()
        assert t.status == "ok" and t.run_ms_median == 2.0
        assert db.put(DEVICE, problem(1), [timing(1, version="0.2")]) == 1     # another version is another record
        assert db.counts()["timings"] == 2


def test_records_validate():
    with pytest.raises(ValueError, match="status"):
        TimingRecord("d", "p", "k", "{}", "v", "maybe")
    with pytest.raises(ValueError, match="run_ms_median"):
        TimingRecord("d", "p", "k", "{}", "v", "ok")
    with pytest.raises(TypeError, match="params"):
        canonical_params([1, 2])
    assert canonical_params({"b": 1, "a": True}) == '{"a":true,"b":1}'


N_PROCS, SHARED, OWN = 4, 60, 60


def _writer(path, proc):
    """One process: SHARED records every process writes, OWN records only it writes, one transaction each."""
    db = TuningDB(path)
    dev = DeviceRecord(key="dev0", device_class="cpu", backend="cpu", name="test CPU")
    for i in range(max(SHARED, OWN)):
        recs = []
        if i < SHARED:
            recs.append(timing(i, run=float(proc)))
        if i < OWN:
            recs.append(timing(1000 * (proc + 1) + i, run=float(proc)))
        db.put(dev, None, [])
        for r in recs:
            db.put(dev, problem(int(r.problem[2:])), [r])
    db.close()


def test_concurrent_writers_lose_nothing_and_duplicate_nothing(tmp_path):
    path = str(tmp_path / "t.sqlite")
    TuningDB(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, p)) for p in range(N_PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with TuningDB(path) as db:
        rows = db.timings()
        keys = [t.key for t in rows]
        assert len(keys) == len(set(keys)) == SHARED + N_PROCS * OWN
        problems = {t.problem for t in rows}
        for p in range(N_PROCS):
            assert {f"fp{1000 * (p + 1) + i}" for i in range(OWN)} <= problems
        assert {f"fp{i}" for i in range(SHARED)} <= problems
        assert db.counts()["problems"] == SHARED + N_PROCS * OWN
        db.check()


# --- pooling ------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".jsonl", ".sqlite"])
def test_export_import_roundtrip(tmp_path, suffix):
    src = TuningDB(tmp_path / "a.sqlite")
    src.put(DEVICE, problem(1), [timing(1), timing(1, kernel="other")])
    src.put(DEVICE, problem(2), [timing(2, "failed")])
    out = tmp_path / f"export{suffix}"
    src.export(out)
    dst = TuningDB(tmp_path / "b.sqlite")
    dst.put(DEVICE, problem(3), [timing(3)])
    got = dst.merge(out)
    assert got["timings_added"] == 3 and got["timings_read"] == 3
    have = list(dst.records())
    assert all(r in have for r in src.records()) and len(dst.timings()) == 4
    assert dst.merge(out)["timings_added"] == 0                # importing twice adds nothing
    # a pool that has an 'ok' for the failed one upgrades it
    third = TuningDB(tmp_path / "c.sqlite")
    third.put(DEVICE, problem(2), [timing(2, "ok", run=5.0)])
    third.export(tmp_path / "c.jsonl")
    assert dst.merge(tmp_path / "c.jsonl")["timings_added"] == 1
    assert {t.status for t in dst.timings()} == {"ok"}


def test_bad_export_is_refused(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"hello": 1}\n')
    with TuningDB(tmp_path / "t.sqlite") as db, pytest.raises(TuningDBError, match="not a matplan tuning export"):
        db.merge(bad)
    bad.write_text(json.dumps({"format": store_mod.EXPORT_FORMAT, "version": 1}) + '\n{"kind": "timing"}\n')
    with TuningDB(tmp_path / "t.sqlite") as db, pytest.raises(TuningDBError, match="line 2: bad record"):
        db.merge(bad)


# --- checking results ---------------------------------------------------------------------
def test_max_error_dense_and_sparse(rng):
    A = random_csr(rng, 40, 30, 0.2)
    x = rng.random(30) - 0.5
    ref, bound = tune_mod.reference(A, x)
    assert tune_mod.max_error(A @ x, ref, bound) < 1e-15
    y = A @ x
    y[3] = np.nan
    assert tune_mod.max_error(y, ref, bound) == np.inf
    assert tune_mod.max_error(y[:-1], ref, bound) == np.inf
    B = random_csr(rng, 30, 20, 0.2)
    ref, bound = tune_mod.reference(A, B)
    C = (A @ B).tocsr()
    assert tune_mod.max_error(C, ref, bound) < 1e-15
    extra = C.tolil()
    i, j = np.argwhere(bound.toarray() == 0)[0]
    extra[i, j] = 1e-3                                      # an entry where the product has none
    assert tune_mod.max_error(extra.tocsr(), ref, bound) == np.inf
    C2 = C.copy()
    C2.data[0] *= 1.01
    assert tune_mod.max_error(C2, ref, bound) > 1e-4
    C2.data[0] = np.nan
    assert tune_mod.max_error(C2, ref, bound) == np.inf
    P = abs(A)                                              # non-negative operands: the scale is the product
    ref, bound = tune_mod.reference(P, P.T.tocsr())
    assert bound is ref
    assert tune_mod.max_error((P @ P.T).astype(np.float32), ref, bound) < 1e-6


# --- tuning runs --------------------------------------------------------------------------
SMALL = dict(families=["poisson2d", "rmat", "banded", "tall_skinny"], ops=("spmv", "spmm", "tsgemm"),
             spmm_ks=(4,), tsgemm_ks=(2, 8), dtypes=("float64",))
FAST = dict(progress=False, repeats=2, warmup=0, budget_s=0.2)


def test_units_cover_families_ops_and_dtypes():
    units = tune_mod.corpus_units(["small"], families=["rmat", "tall_skinny"], dtypes=("float64", "float32"))
    keys = [u.key for u in units]
    assert len(keys) == len(set(keys))
    assert {u.op for u in units} == {"spmv", "spmm", "spgemm", "tsgemm"}
    assert {u.dtype for u in units} == {"float64", "float32"}
    # tsgemm k respects the tall-and-skinny aspect rule for n=256 (k <= 16)
    assert {u.k for u in units if u.op == "tsgemm"} == {1, 2, 4, 8, 16}
    assert {u.layout for u in units if u.op == "tsgemm"} == {"C", "F"}
    A, B = next(u for u in units if u.op == "tsgemm" and u.layout == "F").build()
    assert A.flags.f_contiguous and not A.flags.c_contiguous
    both = tune_mod.corpus_units(["medium", "spgemm"], families=["rmat"], ops=("spgemm",), dtypes=("float64",))
    from matplan import corpus
    same = corpus.SIZES["medium"]["rmat"] == corpus.SIZES["spgemm"]["rmat"]
    assert len(both) == (1 if same else 2)                  # the same matrix is tuned once
    with pytest.raises(ValueError, match="not a corpus size"):
        tune_mod.corpus_units(["huge"])
    A, B = next(u for u in units if u.op == "spmm" and u.dtype == "float32").build()
    assert A.dtype == B.dtype == np.float32 and B.shape == (A.shape[1], 4) and np.all(B != 0)


def test_tune_records_checks_and_resumes(tmp_path):
    path = tmp_path / "t.sqlite"
    units = tune_mod.corpus_units(["small"], **SMALL)
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
    units = tune_mod.corpus_units(["small"], families=["poisson2d", "banded"], ops=("spmv", "spmm"),
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
    units = tune_mod.corpus_units(["small"], families=["banded"], ops=("spmv",), dtypes=("float64",))
    tune_mod.tune(units, db=path, backend="cpu", **FAST)
    with registered(*CHOICE_KERNELS):
        s = tune_mod.tune(units, db=path, backend="cpu", **FAST)
    assert s.skipped == 1 and s.timed == 3           # the three row-chunk candidates; densify refuses 5000x5000


def test_unbuildable_unit_is_reported_not_fatal(tmp_path):
    bad = tmp_path / "bad.mtx"
    bad.write_text("not a matrix market file\n")
    units = tune_mod.file_units([bad], ops=("spmv",), dtypes=("float64",))
    units += tune_mod.corpus_units(["small"], families=["banded"], ops=("spmv",), dtypes=("float64",))
    s = tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", **FAST)
    assert s.units == 2 and s.timed == 1 and len(s.unit_errors) == 1 and "bad.mtx" in s.unit_errors[0]


def test_spgemm_whose_reference_cannot_fit_the_host_is_reported_not_fatal(tmp_path, monkeypatch):
    """A product whose SciPy reference would exhaust host memory is reported and not timed (it
    killed a whole tuning run before); the other units still run."""
    from matplan.kernels.spgemm import gpu as spgemm_mod
    from matplan.core import features as stats
    units = tune_mod.corpus_units(["small"], families=["banded"], ops=("spmv", "spgemm"), dtypes=("float64",))
    monkeypatch.setattr(spgemm_mod, "host_available_bytes", lambda: 1 << 20)
    s = tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", **FAST)
    assert s.units == 2 and s.timed == 1 and len(s.unit_errors) == 1
    assert "spgemm" in s.unit_errors[0] and "SciPy reference needs about" in s.unit_errors[0]
    f = stats.Features(op="spgemm", dtype="float64", backend="cpu", m=10, n=10, k=10, products=100,
                       compression=2.0)
    tune_mod.check_reference_fits(f, available=1 << 30)               # 50 nonzeros: fits
    with pytest.raises(MemoryError, match="GB of host memory"):
        tune_mod.check_reference_fits(dataclasses.replace(f, m=10**6, k=10**6, products=10**10), available=1 << 30)


def test_mtx_folder_units(tmp_path, rng):
    from matplan.corpus import write_mtx
    write_mtx(tmp_path / "one.mtx", random_csr(rng, 50, 50, 0.1))
    write_mtx(tmp_path / "two.mtx", random_csr(rng, 60, 40, 0.1))
    units = tune_mod.file_units([tmp_path], dtypes=("float64",), spmm_ks=(2,))
    assert {u.family for u in units} == {"one", "two"}
    assert {(u.matrix, u.op) for u in units if u.op == "spgemm"} == {("one", "spgemm"), ("two", "spgemm")}
    s = tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", **FAST)
    assert s.timed == len(units) and s.failed == 0 and s.mismatched == 0


def test_parallel_workers_match_serial(tmp_path):
    """joblib's loky backend, two worker processes: the same records as a serial run."""
    units = tune_mod.corpus_units(["small"], **SMALL)
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
    units = tune_mod.corpus_units(["small"], families=["rmat", "banded", "poisson2d"], ops=("spmv",),
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
    units = tune_mod.corpus_units(["small"], **SMALL)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        s = tune_mod.tune(units, db=tmp_path / "d.sqlite", backend="cpu", scheduler=cluster.scheduler_address,
                          **FAST)
    assert s.units == len(units) and s.timed == len(units) and not s.unit_errors
    with TuningDB(tmp_path / "d.sqlite") as db:
        assert len(db.timings()) == len(units) and all(t.matched for t in db.timings())


def test_bad_arguments(tmp_path):
    units = tune_mod.corpus_units(["small"], families=["banded"], ops=("spmv",), dtypes=("float64",))
    with pytest.raises(ValueError, match="n_jobs"):
        tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="cpu", n_jobs=0)
    with pytest.raises(ValueError, match="backend"):
        tune_mod.tune(units, db=tmp_path / "t.sqlite", backend="tpu")
    with pytest.raises(TypeError, match="WorkUnit"):
        tune_mod.tune(["poisson2d"], db=tmp_path / "t.sqlite", backend="cpu")


# --- command line -------------------------------------------------------------------------
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


def test_unit_keys_parse_back(tmp_path):
    units = tune_mod.corpus_units(["small"], families=["rmat", "tall_skinny"], tsgemm_ks=(4,))
    units += tune_mod.file_units([_mtx(tmp_path)], ops=("spmm",), spmm_ks=(4,))
    for u in units:
        assert tune_mod.WorkUnit.from_key(u.key, family=u.family, matrix=u.matrix) == u
    with pytest.raises(ValueError, match="source: 'nonsense' is not a work unit key"):
        tune_mod.WorkUnit.from_key("nonsense")


def _mtx(tmp_path):
    from matplan.corpus import write_mtx
    return write_mtx(tmp_path / "m.mtx", sp.random(50, 50, density=0.1, format="csr", random_state=0))


def test_refresh_features_adds_missing_statistics_only(tmp_path, capsys):
    from matplan.cli import main
    from matplan.tuning_db.refresh import refresh_features
    path = tmp_path / "t.sqlite"
    units = tune_mod.corpus_units(["small"], families=["banded"], ops=("spgemm", "spmv"), dtypes=("float64",))
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
        counts = refresh_features(db, progress=lambda msg: print(msg))
        assert counts == {"updated": len(before), "current": 0, "skipped": 1}
        assert "skipped corpus:banded:small:7" in capsys.readouterr().out
        after = {p.fingerprint: p.features for p in db.problems()}
    assert after[spgemm.fingerprint]["compression"] == spgemm.features["compression"]
    assert after[spgemm.fingerprint]["row_mean"] == 123.0
    assert all(after[fp] == dict(p.features, row_mean=after[fp]["row_mean"]) for fp, p in before.items())
    assert main(["db", "refresh-features", "--db", str(path)]) == 0
    assert "'updated': 0, 'current': 2, 'skipped': 1" in capsys.readouterr().out


# --- on the GPU ---------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_tune_times_every_registered_kernel(tmp_path, cp):
    """Every GPU candidate of a few small problems runs, matches SciPy and is timed with CUDA events."""
    from matplan.kernels import kernels_for
    units = tune_mod.corpus_units(["small"], families=["poisson2d", "skewed", "rmat", "tall_skinny"],
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
