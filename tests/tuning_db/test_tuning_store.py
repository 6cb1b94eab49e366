"""The tuning database on the host: schema and migrations, refused files, writes from
several processes, export and import."""
import json
import multiprocessing
import sqlite3

import pytest

from matplan.tuning_db import store as store_mod
from matplan.tuning_db.records import DeviceRecord, ProblemRecord, TimingRecord, canonical_params
from matplan.tuning_db.store import TuningDB, TuningDBError

DEVICE = DeviceRecord(key="dev0", device_class="cpu", backend="cpu", name="test CPU", spec={"name": "x"})


def problem(i):
    return ProblemRecord(f"fp{i}", "spmv", "float64", f"src{i}", "fam", f"m{i}", {"m": i})


def timing(i, status="ok", run=1.0, version="0.1", device="dev0", kernel="k"):
    extra = dict(run_ms_median=run, run_ms_min=run, run_ms_max=run, repeats=3, matched=True) if status == "ok" \
        else dict(error="boom")
    return TimingRecord(device, f"fp{i}", kernel, canonical_params({"p": i % 3}), version, status, **extra)


# --- schema ----------------------------------------------------------------------------------
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


# --- writes ----------------------------------------------------------------------------------
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



def test_runs_of_other_labels_keep_a_timing_each_and_pool_by_their_median(tmp_path):
    """``matplan tune --run``: a second run of one device keeps its own timing of a candidate (the
    natural key holds the run's label), a run resumes only its own label's work, exports carry the
    label, and the dataset pools the runs by their median."""
    import dataclasses
    from matplan.tuning_db import identity
    from matplan.tuning_db.dataset import load_dataset
    db = TuningDB(tmp_path / "t.sqlite")
    dev = identity.device_record("cpu")
    spmv = ProblemRecord("fp1", "spmv", "float64", "src1", "fam", "m1")
    base = TimingRecord(dev.key, "fp1", "cpu.scipy", "{}", "0.1", "ok", run_ms_median=1.0, repeats=3, matched=True)
    runs = [dataclasses.replace(base, run_ms_median=ms, run=label) for label, ms in (("", 1.0), ("b", 3.0), ("c", 2.5))]
    assert db.put(dev, spmv, runs) == 3
    assert db.put(timings=[dataclasses.replace(runs[1], run_ms_median=9.0)]) == 0    # first writer of a run wins
    assert sorted(t.run for t in db.timings()) == ["", "b", "c"]
    assert db.done_for_source("src1", "0.1", run="b") == {dev.key: {"fp1": {("cpu.scipy", "{}")}}}
    assert db.done_for_source("src1", "0.1", run="d") == {}
    (row,) = load_dataset(db).rows
    assert row.run_s == pytest.approx(2.5e-3)                                           # the median of 1, 3, 2.5
    db.export(tmp_path / "e.jsonl")
    assert sum('"run": "b"' in line for line in open(tmp_path / "e.jsonl")) == 1
    other = TuningDB(tmp_path / "o.sqlite")
    assert other.merge(tmp_path / "e.jsonl")["timings_added"] == 3


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


# --- pooling ---------------------------------------------------------------------------------
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
