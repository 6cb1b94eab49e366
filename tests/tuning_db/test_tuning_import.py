"""Importing into the tuning database is all or nothing and checks every record; ``check`` checks
the whole schema; reading a database that does not exist is refused."""
import json
import sqlite3

import pytest

from matplan.tuning_db import store as store_mod
from matplan.tuning_db.records import DeviceRecord, ProblemRecord, TimingRecord, canonical_params
from matplan.tuning_db.report import evaluate
from matplan.tuning_db.store import TuningDB, TuningDBError
from matplan.tuning_db.train import train

DEVICE = DeviceRecord(key="dev0", device_class="cpu", backend="cpu", name="test CPU", spec={"name": "x"})


def problem(i):
    return ProblemRecord(f"fp{i}", "spmv", "float64", f"src{i}", "fam", f"m{i}", {"m": i})


def timing(i, device="dev0", kernel="k"):
    return TimingRecord(device, f"fp{i}", kernel, canonical_params({"p": i}), "0.1", "ok",
                        run_ms_median=1.0, run_ms_min=1.0, run_ms_max=1.0, repeats=3, matched=True)


def export(tmp_path, n=700) -> list[str]:
    """The lines of a JSON-lines export of one device, ``n`` problems and a timing of each."""
    with TuningDB(tmp_path / "src.sqlite") as db:
        for i in range(n):
            db.put(DEVICE if i == 0 else None, problem(i), [timing(i)])
        db.export(tmp_path / "e.jsonl")
    return (tmp_path / "e.jsonl").read_text().splitlines()


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def line_of(lines, kind, i):
    """1-based line number of record ``kind`` number ``i`` (problems and timings by their fp)."""
    return next(n for n, line in enumerate(lines, 1)
                if json.loads(line).get("kind") == kind and json.loads(line).get(
                    "problem" if kind == "timing" else "fingerprint") == f"fp{i}")


def empty(db) -> bool:
    c = db.counts()
    return c["devices"] == c["problems"] == c["timings"] == c["calibrations"] == 0


# --- import: all or nothing, every record checked ----------------------------------------------
def test_a_bad_line_imports_nothing_and_is_named(tmp_path):
    """A bad record past the first 500 (the old batch size) used to leave the records before it
    committed; now nothing is, and the line is named. Fixed, the same command imports everything."""
    lines = export(tmp_path)
    n = line_of(lines, "timing", 650)
    rec = json.loads(lines[n - 1])
    lines[n - 1] = json.dumps(dict(rec, run_ms_median="fast"))
    bad = write(tmp_path / "bad.jsonl", lines)
    with TuningDB(tmp_path / "dst.sqlite") as db:
        with pytest.raises(TuningDBError, match=rf"line {n}: bad record: timing record: run_ms_median: "
                                                r"expected a number or null, got 'fast'(.|\n)*nothing was imported"):
            db.merge(bad)
        assert empty(db)
        lines[n - 1] = json.dumps(rec)
        got = db.merge(write(tmp_path / "bad.jsonl", lines))
        assert got["timings_added"] == got["timings_read"] == 700 and db.counts()["problems"] == 700


def test_a_timing_of_an_unknown_device_is_named_not_an_integrity_error(tmp_path):
    lines = export(tmp_path, n=3)
    n = line_of(lines, "timing", 1)
    lines[n - 1] = json.dumps(dict(json.loads(lines[n - 1]), device_key="ghost"))
    bad = write(tmp_path / "bad.jsonl", lines)
    with TuningDB(tmp_path / "dst.sqlite") as db:
        with pytest.raises(TuningDBError, match=rf"line {n}: the timing refers to device 'ghost', which is "
                                                "neither in the file nor in the database"):
            db.merge(bad)
        assert empty(db)
        # a device (or problem) already in the database is a valid reference
        db.put(DeviceRecord(key="ghost", device_class="cpu", backend="cpu", name="other CPU"))
        assert db.merge(bad)["timings_added"] == 3


def test_records_may_come_before_their_device_and_problem(tmp_path):
    lines = export(tmp_path, n=3)
    reordered = lines[:1] + lines[:0:-1]           # header, then timings, problems, device
    with TuningDB(tmp_path / "dst.sqlite") as db:
        got = db.merge(write(tmp_path / "r.jsonl", reordered))
        assert got["timings_added"] == 3 and got["devices_added"] == 1


@pytest.mark.parametrize("kind, field, value, message", [
    ("device", "sms", "many", "sms: expected a non-negative integer"),
    ("device", "spec", [1], "spec: expected a JSON object"),
    ("problem", "features", "big", "features: expected a JSON object"),
    ("problem", "fingerprint", "", "fingerprint: expected a non-empty string"),
    ("timing", "repeats", -1, "repeats: expected a non-negative integer"),
    ("timing", "repeats", 2.5, "repeats: expected a non-negative integer"),
    ("timing", "matched", "yes", "matched: expected true, false or null"),
    ("timing", "params", "chunk=4", "params: expected a JSON object"),
    ("timing", "prepare_ms", float("nan"), "prepare_ms: expected a finite number of milliseconds"),
    ("timing", "run_ms_min", -1.0, "run_ms_min: expected a finite number of milliseconds"),
    ("timing", "status", "maybe", "status: expected one of"),
    ("timing", "kernel", None, "kernel: expected a string"),
])
def test_every_field_is_checked_on_import(tmp_path, kind, field, value, message):
    lines = export(tmp_path, n=2)
    n = next(k for k, line in enumerate(lines, 1) if json.loads(line).get("kind") == kind)
    lines[n - 1] = json.dumps(dict(json.loads(lines[n - 1]), **{field: value}))
    with TuningDB(tmp_path / "dst.sqlite") as db:
        with pytest.raises(TuningDBError, match=rf"line {n}: bad record: {kind} record: {message}"):
            db.merge(write(tmp_path / "bad.jsonl", lines))
        assert empty(db)


@pytest.mark.parametrize("line, message", [
    ('{"kind": "timing"}', r"timing record lacks \["),
    ('{"kind": "planet", "x": 1}', "unknown kind 'planet'"),
    ("[1, 2]", "expected a JSON object with a 'kind'"),
    ("{not json", "Expecting property name"),
])
def test_malformed_lines_are_named(tmp_path, line, message):
    lines = export(tmp_path, n=2)
    lines.insert(3, line)
    with TuningDB(tmp_path / "dst.sqlite") as db:
        with pytest.raises(TuningDBError, match=rf"line 4: bad record: .*{message}"):
            db.merge(write(tmp_path / "bad.jsonl", lines))
        assert empty(db)


def test_an_sqlite_copy_is_checked_too(tmp_path):
    with TuningDB(tmp_path / "src.sqlite") as db:
        db.put(DEVICE, problem(1), [timing(1)])
    conn = sqlite3.connect(str(tmp_path / "src.sqlite"))      # as an unchecked import once stored it
    conn.execute("UPDATE timings SET run_ms_median = 'fast'")
    conn.commit()
    conn.close()
    with TuningDB(tmp_path / "dst.sqlite") as db:
        with pytest.raises(TuningDBError, match=r"src.sqlite: a stored timing is invalid: timing record: "
                                                r"run_ms_median: expected a number or null, got 'fast'"):
            db.merge(tmp_path / "src.sqlite")
        assert empty(db)
    with TuningDB(tmp_path / "src.sqlite") as db, pytest.raises(TuningDBError, match="stored timing is invalid"):
        db.timings()                                           # reading it names it too


def test_put_of_an_unknown_device_is_a_clear_error(tmp_path):
    with TuningDB(tmp_path / "t.sqlite") as db:
        with pytest.raises(TuningDBError, match="must refer to a device and problem recorded"):
            db.put(None, problem(1), [timing(1, device="ghost")])
        assert empty(db)


def test_cli_import_reports_the_line_and_what_to_do(tmp_path, capsys):
    from matplan.cli import main
    lines = export(tmp_path, n=2)
    lines[2] = lines[2].replace('"op": "spmv"', '"op": 7')
    bad = write(tmp_path / "bad.jsonl", lines)
    dst = tmp_path / "new.sqlite"
    with pytest.raises(SystemExit, match=r"line 3: bad record: problem record: op(.|\n)*nothing was imported "
                                         r"\(the import is one transaction\): fix the file and run the same"):
        main(["db", "import", str(bad), "--db", str(dst)])
    assert not dst.exists()                                   # no empty database left behind
    assert main(["db", "import", str(tmp_path / "e.jsonl"), "--db", str(dst)]) == 0     # import creates
    assert "in one transaction: {'devices_added': 1" in capsys.readouterr().out


# --- check: the whole schema -----------------------------------------------------------------
def _fresh(path):
    with TuningDB(path) as db:
        db.put(DEVICE, problem(1), [timing(1)])
    return sqlite3.connect(str(path))


def check_fails(path, *messages):
    with TuningDB(path) as db:
        with pytest.raises(TuningDBError) as info:
            db.check()
    for m in messages:
        assert m in str(info.value), str(info.value)
    return str(info.value)


def test_check_passes_a_fresh_database_and_says_what_it_checked(tmp_path):
    _fresh(tmp_path / "t.sqlite").close()
    with TuningDB(tmp_path / "t.sqlite") as db:
        done = db.check()
    assert done[0] == "integrity" and f"schema v{store_mod.latest_version()}: 5 tables" in done[1]


@pytest.mark.parametrize("sql, messages", [
    (["DROP TABLE calibrations"], ["table calibrations is missing"]),
    (["ALTER TABLE timings RENAME COLUMN run_ms_median TO run_ms_med"],
     ["timings: column run_ms_median (REAL) is missing", "timings: column run_ms_med is not in the schema"]),
    (["DROP INDEX timings_problem"], ["timings: index timings_problem on (problem) is missing"]),
    (["ALTER TABLE devices ADD COLUMN note TEXT"], ["devices: column note is not in the schema"]),
    (["CREATE TABLE extra (x INTEGER)"], ["table extra is not in the schema"]),
])
def test_check_names_every_schema_difference(tmp_path, sql, messages):
    conn = _fresh(tmp_path / "t.sqlite")
    for s in sql:
        conn.execute(s)
    conn.commit()
    conn.close()
    text = check_fails(tmp_path / "t.sqlite", *messages)
    assert f"does not have the schema of version {store_mod.latest_version()}" in text


def test_check_names_a_changed_column_type_and_a_lost_unique_constraint(tmp_path):
    changed = [(v, [s.replace("sms INTEGER", "sms TEXT").replace(
        "UNIQUE (device_key, kernel, key, matplan_version)", "UNIQUE (device_key, kernel, key)") for s in stmts])
        for v, stmts in store_mod.MIGRATIONS]
    TuningDB(tmp_path / "t.sqlite", migrations=changed).close()
    check_fails(tmp_path / "t.sqlite", "devices: column sms is TEXT NOT NULL DEFAULT 0, expected INTEGER NOT NULL",
                "calibrations: index unique(device_key, kernel, key, matplan_version) on "
                "(device_key, kernel, key, matplan_version) is missing",
                "calibrations: index unique(device_key, kernel, key) is not in the schema")


def test_check_names_records_that_refer_to_nothing(tmp_path):
    conn = _fresh(tmp_path / "t.sqlite")
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("DELETE FROM devices")
    conn.commit()
    conn.close()
    check_fails(tmp_path / "t.sqlite", "records refer to rows that do not exist: 1 timings -> devices")


def test_cli_check_prints_what_differs(tmp_path, capsys):
    from matplan.cli import main
    conn = _fresh(tmp_path / "t.sqlite")
    conn.execute("DROP TABLE problems")
    conn.commit()
    conn.close()
    with pytest.raises(SystemExit, match="table problems is missing"):
        main(["db", "check", "--db", str(tmp_path / "t.sqlite")])
    _fresh(tmp_path / "ok.sqlite").close()
    assert main(["db", "check", "--db", str(tmp_path / "ok.sqlite")]) == 0
    assert "ok (integrity; schema v" in capsys.readouterr().out


# --- a database that does not exist ------------------------------------------------------------
@pytest.mark.parametrize("argv", [["report"], ["train"], ["db", "info"], ["db", "check"],
                                  ["db", "export", "x.jsonl"], ["db", "refresh-features"]])
def test_reading_commands_refuse_a_missing_database(tmp_path, argv):
    from matplan.cli import main
    missing = tmp_path / "typo.sqlite"
    with pytest.raises(SystemExit, match=f"tuning database {missing} does not exist .*`matplan tune` and "
                                         "`matplan db import` create one"):
        main(argv + ["--db", str(missing), "--no-progress"])
    assert not missing.exists()


def test_reading_functions_refuse_a_missing_database(tmp_path):
    missing = tmp_path / "typo.sqlite"
    with pytest.raises(TuningDBError, match="does not exist"):
        evaluate(missing, out=False)
    with pytest.raises(TuningDBError, match="does not exist"):
        train(missing, cv=0)
    assert not missing.exists()
