"""The tuning database: measured timings of every (matrix, kernel, params) on every device.

SQLite in WAL mode, one file (default ``~/.cache/matplan/tuning.sqlite``;
``$MATPLAN_TUNING_DB`` or the ``db=`` argument override it). Four tables keyed
by natural keys, so records from different machines pool without renumbering:

* ``devices``  -- one row per device identity (name, compute capability, SMs,
  memory, driver/CUDA/CuPy versions), keyed by a hash of those fields;
* ``problems`` -- one row per (op, dtype, A, B), keyed by a content fingerprint,
  with the corpus name, family and the planner's features as JSON;
* ``timings``  -- one row per (device, problem, kernel, params, matplan version,
  tuning run's label): prepare ms, run ms median/min/max, repeats, whether the
  result matched the SciPy reference, status ``ok``/``failed`` with the error;
  tunes of one device under different ``run`` labels keep a timing each, which
  the dataset pools (:mod:`.dataset`);
* ``calibrations`` -- what a kernel measured online while planning (TSM2's timed
  block size and measured/model ratio per shape bucket), one row per (device,
  kernel, key, matplan version), so training and ``matplan report`` score
  candidates with the calibrated costs the live planner uses.

Several processes may write at once: every write is one ``BEGIN IMMEDIATE``
transaction of ``INSERT ... ON CONFLICT`` on the natural key (never a
duplicate), with SQLite's busy timeout plus retries (never a lost record). An
``ok`` record supersedes a ``failed`` one for the same key; otherwise the first
writer wins. A file that is not SQLite, is damaged, or belongs to another
application is refused with a message naming it. WAL needs a local file system
(not NFS); pool timings across machines with :meth:`TuningDB.export` /
:meth:`TuningDB.merge` instead (like FFTW wisdom).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import random
import sqlite3
import time
from pathlib import Path
from typing import Iterable, Iterator

from ..core.paths import user_folder
from .records import (RECORD_TYPES, CalibrationRecord, DeviceRecord, ProblemRecord, TimingRecord,
                      record_from_dict)
from .schema import (MIGRATIONS, VERSION_TABLE, apply_migrations, describe_schema, expected_schema,
                     latest_version, schema_differences)

#: Environment variable naming the database file.
DB_ENV = "MATPLAN_TUNING_DB"
#: Written to SQLite's ``application_id`` header field ("MPLN"): marks the file as ours.
APPLICATION_ID = 0x4D504C4E
#: Seconds a writer waits for a lock inside SQLite, and how many times a write is retried after that.
BUSY_TIMEOUT_S = 30.0
WRITE_RETRIES = 8
#: First line of a JSON-lines export.
EXPORT_FORMAT = "matplan-tuning-export"
EXPORT_VERSION = 3
#: Export versions this matplan reads (1 has no calibration records, 2 no tuning-run labels).
EXPORT_VERSIONS_READ = (1, 2, 3)
_SQLITE_MAGIC = b"SQLite format 3\x00"


class TuningDBError(Exception):
    """The database file cannot be used (corrupt, foreign, newer schema, unreadable export)."""


def default_path() -> Path:
    """``$MATPLAN_TUNING_DB``, else ``tuning.sqlite`` in the user's cache folder."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    return user_folder("cache") / "tuning.sqlite"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


class TuningDB:
    """One open tuning database. ``TuningDB()`` opens the default file, creating it if needed.

    Safe to use from several processes at once (each opens its own); a
    ``TuningDB`` object itself belongs to one process and thread.
    """

    def __init__(self, db=None, *, create: bool = True, migrations=None):
        self.path = Path(db).expanduser() if db is not None else default_path()
        self._migrations = migrations or MIGRATIONS
        exists = self.path.exists()
        if exists:
            self._check_header()
        elif not create:
            raise TuningDBError(f"tuning database {self.path} does not exist (check the path; "
                                "`matplan tune` and `matplan db import` create one)")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._retry(lambda: self._conn.execute("PRAGMA journal_mode = WAL").fetchone())
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._open_schema()
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError) and _is_locked(e):
                raise
            self._conn.close()
            raise TuningDBError(f"tuning database {self.path} is damaged or not a matplan database: {e}") from e

    # -- opening ---------------------------------------------------------------------------
    def _check_header(self):
        try:
            with open(self.path, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except OSError as e:
            raise TuningDBError(f"tuning database {self.path} cannot be read: {e}") from e
        if head and head != _SQLITE_MAGIC:
            raise TuningDBError(f"{self.path} is not a matplan tuning database (not an SQLite file); "
                                f"move it away or pass another db= / ${DB_ENV}")

    def _open_schema(self):
        app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
        if app_id not in (0, APPLICATION_ID):
            raise TuningDBError(f"{self.path} is an SQLite file of another application "
                                f"(application_id {app_id:#x}), not a matplan tuning database")
        if app_id == 0:
            tables = self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables:
                raise TuningDBError(f"{self.path} is an SQLite file of another application "
                                    f"(it has tables but no matplan marker)")
        version = self.schema_version
        latest = latest_version(self._migrations)
        if version > latest:
            raise TuningDBError(f"{self.path} has schema version {version}, newer than this matplan "
                                f"understands ({latest}); upgrade matplan")
        if version < latest:
            self._write(self._migrate)

    def _migrate(self, conn):
        """Apply the missing steps inside the caller's write transaction (re-read under the lock)."""
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(VERSION_TABLE)
        current = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
        apply_migrations(conn, self._migrations, current)

    @property
    def schema_version(self) -> int:
        has = self._conn.execute("SELECT count(*) FROM sqlite_master WHERE type='table' "
                                 "AND name='schema_version'").fetchone()[0]
        if not has:
            return 0
        return self._conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0

    def check(self) -> list[str]:
        """Check the whole file: SQLite's integrity check, the schema (every table, column with its
        type and constraints, foreign key and index the migrations build) and that every timing and
        calibration refers to a recorded device and problem. Raises TuningDBError naming the file
        and listing every difference; returns what was checked."""
        try:
            rows = self._conn.execute("PRAGMA integrity_check").fetchall()
        except sqlite3.DatabaseError as e:
            raise TuningDBError(f"tuning database {self.path} is damaged: {e}") from e
        messages = [r[0] for r in rows]
        if messages != ["ok"]:
            raise TuningDBError(f"tuning database {self.path} is damaged: " + "; ".join(messages[:5]))
        want = expected_schema(self._migrations)
        diffs = schema_differences(describe_schema(self._conn), want)
        if diffs:
            raise TuningDBError(f"tuning database {self.path} does not have the schema of version "
                                f"{self.schema_version} ({len(diffs)} differences):\n  " + "\n  ".join(diffs))
        dangling = self._query("PRAGMA foreign_key_check")
        if dangling:
            by_table: dict = {}
            for r in dangling:
                key = f"{r[0]} -> {r[2]}"
                by_table[key] = by_table.get(key, 0) + 1
            raise TuningDBError(f"tuning database {self.path}: records refer to rows that do not exist: "
                                + ", ".join(f"{n} {k}" for k, n in sorted(by_table.items())))
        return ["integrity", f"schema v{self.schema_version}: {len(want)} tables, "
                f"{sum(len(t['columns']) for t in want.values())} columns, "
                f"{sum(len(t['indexes']) for t in want.values())} indexes", "references"]

    def close(self):
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<TuningDB {self.path} schema v{self.schema_version}>"

    # -- writing ----------------------------------------------------------------------------
    def _retry(self, fn):
        delay = 0.05
        for attempt in range(WRITE_RETRIES + 1):
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if not _is_locked(e) or attempt == WRITE_RETRIES:
                    raise
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)

    def _write(self, fn):
        """Run ``fn(conn)`` in one BEGIN IMMEDIATE transaction, retried while the file is locked."""
        def attempt():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                out = fn(self._conn)
                self._conn.execute("COMMIT")    # may fail too (a deferred foreign key): then roll back
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            return out
        try:
            return self._retry(attempt)
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError) and _is_locked(e):
                raise TuningDBError(f"tuning database {self.path} stayed locked after "
                                    f"{WRITE_RETRIES} retries: {e}") from e
            if isinstance(e, sqlite3.IntegrityError):
                raise
            raise TuningDBError(f"tuning database {self.path}: {e}") from e

    @staticmethod
    def _insert_device(conn, d: DeviceRecord) -> int:
        cur = conn.execute(
            "INSERT INTO devices (key, device_class, backend, name, compute_capability, sms, memory_bytes, "
            "driver, cuda, cupy, spec) VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (key) DO NOTHING",
            (d.key, d.device_class, d.backend, d.name, d.compute_capability, int(d.sms),
             int(d.memory_bytes), d.driver, d.cuda, d.cupy, json.dumps(d.spec, sort_keys=True)))
        return cur.rowcount

    @staticmethod
    def _insert_problem(conn, p: ProblemRecord) -> int:
        cur = conn.execute(
            "INSERT INTO problems (fingerprint, op, dtype, source, family, matrix, features) "
            "VALUES (?,?,?,?,?,?,?) ON CONFLICT (fingerprint) DO NOTHING",
            (p.fingerprint, p.op, p.dtype, p.source, p.family, p.matrix,
             json.dumps(p.features, sort_keys=True)))
        return cur.rowcount

    _TIMING_COLS = ("device_key", "problem", "kernel", "params", "matplan_version", "status",
                    "prepare_ms", "run_ms_median", "run_ms_min", "run_ms_max", "repeats", "matched",
                    "max_error", "error", "created_at", "host", "run_ms_queued", "first_ms", "run")
    #: The natural key's columns; an insert that meets one of them updates the others.
    _TIMING_KEY = ("device_key", "problem", "kernel", "params", "matplan_version", "run")

    @classmethod
    def _insert_timing(cls, conn, t: TimingRecord) -> int:
        values = [getattr(t, c) for c in cls._TIMING_COLS]
        values[cls._TIMING_COLS.index("matched")] = None if t.matched is None else int(bool(t.matched))
        values[cls._TIMING_COLS.index("created_at")] = t.created_at or _now()
        updates = ", ".join(f"{c} = excluded.{c}" for c in cls._TIMING_COLS if c not in cls._TIMING_KEY)
        cur = conn.execute(
            f"INSERT INTO timings ({', '.join(cls._TIMING_COLS)}) VALUES ({', '.join('?' * len(values))}) "
            f"ON CONFLICT ({', '.join(cls._TIMING_KEY)}) DO UPDATE SET "
            f"{updates} WHERE timings.status = 'failed' AND excluded.status = 'ok'", values)
        return cur.rowcount

    @staticmethod
    def _insert_calibration(conn, c: CalibrationRecord) -> int:
        cur = conn.execute(
            "INSERT INTO calibrations (device_key, kernel, key, value, matplan_version, created_at) "
            "VALUES (?,?,?,?,?,?) ON CONFLICT (device_key, kernel, key, matplan_version) DO NOTHING",
            (c.device_key, c.kernel, c.key, json.dumps(c.value, sort_keys=True), c.matplan_version,
             c.created_at or _now()))
        return cur.rowcount

    def put(self, device: DeviceRecord | None = None, problem: ProblemRecord | None = None,
            timings: Iterable[TimingRecord] = (), calibrations: Iterable[CalibrationRecord] = ()) -> int:
        """Write a device, a problem, its timings and calibrations in one transaction; returns timings
        added/updated (a calibration already recorded for its key and version is kept, not replaced)."""
        timings, calibrations = list(timings), list(calibrations)
        for name, items, cls in (("timings", timings, TimingRecord),
                                 ("calibrations", calibrations, CalibrationRecord)):
            for t in items:
                if not isinstance(t, cls):
                    raise TypeError(f"{name}: expected {cls.__name__} items, got {type(t).__name__}")

        def write(conn):
            if device is not None:
                self._insert_device(conn, device)
            if problem is not None:
                self._insert_problem(conn, problem)
            for c in calibrations:
                self._insert_calibration(conn, c)
            return sum(self._insert_timing(conn, t) for t in timings)
        try:
            return self._write(write)
        except sqlite3.IntegrityError as e:
            raise TuningDBError(f"tuning database {self.path}: {e} (a timing or calibration must refer to a "
                                "device and problem recorded before or with it); nothing was written") from e

    def update_features(self, features: dict) -> int:
        """Replace the stored features of problems: ``{fingerprint: features dict}``; rows changed."""
        def write(conn):
            return sum(conn.execute("UPDATE problems SET features = ? WHERE fingerprint = ?",
                                    (json.dumps(f, sort_keys=True), fp)).rowcount
                       for fp, f in features.items())
        return self._write(write) if features else 0

    # -- reading ----------------------------------------------------------------------------
    def _query(self, sql, args=()):
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise TuningDBError(f"tuning database {self.path}: {e}") from e

    def counts(self) -> dict:
        out = {t: self._query(f"SELECT count(*) FROM {t}")[0][0]
               for t in ("devices", "problems", "timings", "calibrations")}
        out["failed"] = self._query("SELECT count(*) FROM timings WHERE status='failed'")[0][0]
        out["mismatched"] = self._query("SELECT count(*) FROM timings WHERE matched = 0")[0][0]
        return out

    def done_for_source(self, source: str, version: str, include_failed: bool = True, run: str = "") -> dict:
        """{device_key: {problem fingerprint: {(kernel, params)}}} already recorded for a work unit
        in the tuning run labelled ``run``."""
        sql = ("SELECT t.device_key, t.problem, t.kernel, t.params FROM timings t "
               "JOIN problems p ON p.fingerprint = t.problem "
               "WHERE p.source = ? AND t.matplan_version = ? AND t.run = ?")
        if not include_failed:
            sql += " AND t.status = 'ok'"
        out: dict = {}
        for dev, prob, kernel, params in self._query(sql, (source, version, run)):
            out.setdefault(dev, {}).setdefault(prob, set()).add((kernel, params))
        return out

    def devices(self) -> list[DeviceRecord]:
        return [self._record("device", r) for r in self._query("SELECT * FROM devices ORDER BY key")]

    def problems(self) -> list[ProblemRecord]:
        return [self._record("problem", r) for r in self._query("SELECT * FROM problems ORDER BY fingerprint")]

    def timings(self, device_class: str | None = None, status: str | None = None) -> list[TimingRecord]:
        sql = "SELECT t.* FROM timings t JOIN devices d ON d.key = t.device_key WHERE 1=1"
        args: list = []
        if device_class is not None:
            sql += " AND d.device_class = ?"
            args.append(device_class)
        if status is not None:
            sql += " AND t.status = ?"
            args.append(status)
        sql += " ORDER BY t.device_key, t.problem, t.kernel, t.params, t.matplan_version, t.run"
        return [self._record("timing", r) for r in self._query(sql, args)]

    def calibrations(self, device_class: str | None = None, kernel: str | None = None) -> list[CalibrationRecord]:
        sql = "SELECT c.* FROM calibrations c JOIN devices d ON d.key = c.device_key WHERE 1=1"
        args: list = []
        for col, value in (("d.device_class", device_class), ("c.kernel", kernel)):
            if value is not None:
                sql += f" AND {col} = ?"
                args.append(value)
        sql += " ORDER BY c.device_key, c.kernel, c.key, c.matplan_version"
        return [self._record("calibration", r) for r in self._query(sql, args)]

    def device_classes(self) -> list[str]:
        return [r[0] for r in self._query("SELECT DISTINCT device_class FROM devices ORDER BY 1")]

    #: Columns stored as JSON text, by record kind.
    _JSON_COLUMNS = {"device": "spec", "problem": "features", "calibration": "value"}

    def _record(self, kind: str, row):
        """The ``kind`` record of a row read back; TuningDBError naming the file and row if invalid
        (a row an older matplan imported unchecked)."""
        d = dict(row)
        d.pop("id", None)
        try:
            col = self._JSON_COLUMNS.get(kind)
            if col is not None:
                d[col] = json.loads(d[col])
            if kind == "timing" and d["matched"] is not None:
                d["matched"] = bool(d["matched"])
            return record_from_dict(kind, d)
        except (ValueError, TypeError) as e:
            raise TuningDBError(f"tuning database {self.path}: a stored {kind} is invalid: {e}") from e

    # -- pooling ----------------------------------------------------------------------------
    def records(self) -> Iterator[tuple[str, object]]:
        """Every record as (kind, record): devices, problems, timings, then calibrations."""
        for d in self.devices():
            yield "device", d
        for p in self.problems():
            yield "problem", p
        for t in self.timings():
            yield "timing", t
        for c in self.calibrations():
            yield "calibration", c

    def export(self, path) -> dict:
        """Write every record to ``path``: JSON lines, or an SQLite copy when it ends in .sqlite/.db."""
        path = Path(path)
        if path.suffix in (".sqlite", ".db"):
            if path.exists():
                raise FileExistsError(f"export: {path} exists; remove it or choose another name")
            dest = sqlite3.connect(str(path))
            try:
                self._conn.backup(dest)
            finally:
                dest.close()
            return self.counts()
        counts = dict.fromkeys(RECORD_TYPES, 0)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(json.dumps({"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                                "schema_version": self.schema_version, "exported_at": _now()}) + "\n")
            for kind, rec in self.records():
                f.write(json.dumps({"kind": kind, **dataclasses.asdict(rec)}, sort_keys=True) + "\n")
                counts[kind] += 1
        os.replace(tmp, path)
        return counts

    def merge(self, path) -> dict:
        """Import the records of an export (JSON lines or an SQLite copy), all or nothing.

        Every record is checked first: its fields (types, required ones, numbers that are
        numbers), and that each timing's device and problem and each calibration's device are in
        the file or already in this database. A bad record raises TuningDBError naming its line
        (or, in an SQLite copy, its key) and nothing is imported; the good ones are then written in
        one transaction. Returns counts added and read. Existing records win, except that an
        'ok' timing replaces a 'failed' one; importing a file twice adds nothing.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"import: no file at {path}")
        try:
            source = self._import_source(path)
            self._check_references(path, source())
            return self._write(lambda conn: self._insert_all(conn, source()))
        except (sqlite3.IntegrityError, TuningDBError) as e:
            where = "" if isinstance(e, TuningDBError) else f"import {path}: "
            raise TuningDBError(f"{where}{e}\nnothing was imported (the import is one transaction): "
                                "fix the file and run the same command again") from e

    def _insert_all(self, conn, records) -> dict:
        """Insert (where, kind, record) items inside the caller's transaction; counts added and read."""
        conn.execute("PRAGMA defer_foreign_keys = ON")   # a record may come before its device
        inserters = {"device": self._insert_device, "problem": self._insert_problem,
                     "timing": self._insert_timing, "calibration": self._insert_calibration}
        added, seen = dict.fromkeys(RECORD_TYPES, 0), dict.fromkeys(RECORD_TYPES, 0)
        for _, kind, rec in records:
            seen[kind] += 1
            added[kind] += inserters[kind](conn, rec)
        return {f"{k}s_added": added[k] for k in added} | {f"{k}s_read": seen[k] for k in seen}

    @staticmethod
    def _import_source(path: Path):
        """A function returning an iterator of (where, kind, record) over the file's records."""
        with open(path, "rb") as f:
            is_sqlite = f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
        if not is_sqlite:
            return lambda: _read_export(path)
        with TuningDB(path, create=False) as other:
            records = [(f"{kind} {getattr(rec, _KEY_OF[kind])!r}", kind, rec) for kind, rec in other.records()]
        return lambda: iter(records)

    def _check_references(self, path, records) -> None:
        """TuningDBError naming the first records whose device or problem is neither among
        ``records`` nor in this database."""
        devices, problems, refs = set(), set(), []
        for where, kind, rec in records:
            if kind == "device":
                devices.add(rec.key)
            elif kind == "problem":
                problems.add(rec.fingerprint)
            else:
                refs.append((where, kind, "device", rec.device_key))
                if kind == "timing":
                    refs.append((where, kind, "problem", rec.problem))
        for what, keys, table, col in (("device", devices, "devices", "key"),
                                       ("problem", problems, "problems", "fingerprint")):
            wanted = {key for _, _, w, key in refs if w == what} - keys
            if wanted:     # those already in this database
                keys |= {r[0] for r in self._query(f"SELECT {col} FROM {table}") if r[0] in wanted}
        bad = [(where, kind, what, key) for where, kind, what, key in refs
               if key not in (devices if what == "device" else problems)]
        if bad:
            lines = [f"{path}, {where}: the {kind} refers to {what} {key!r}, which is neither in the file "
                     "nor in the database" for where, kind, what, key in bad[:5]]
            more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
            raise TuningDBError("\n".join(lines) + more)


#: The attribute naming each kind of record (where an SQLite copy's bad record is reported).
_KEY_OF = {"device": "key", "problem": "fingerprint", "timing": "key", "calibration": "natural_key"}


def _read_export(path: Path):
    """(where, kind, record) of every line of a JSON-lines export, each checked; TuningDBError
    naming the line otherwise."""
    with open(path) as f:
        try:
            head = json.loads(f.readline() or "null")
        except ValueError:
            head = None
        if not isinstance(head, dict) or head.get("format") != EXPORT_FORMAT:
            raise TuningDBError(f"{path} is not a matplan tuning export (first line should name "
                                f"format {EXPORT_FORMAT!r})")
        if head.get("version") not in EXPORT_VERSIONS_READ:
            raise TuningDBError(f"{path}: export version {head.get('version')} is not supported "
                                f"(this matplan reads {EXPORT_VERSIONS_READ})")
        for lineno, line in enumerate(f, start=2):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if not isinstance(d, dict) or "kind" not in d:
                    raise ValueError("expected a JSON object with a 'kind'")
                kind = d.pop("kind")
                yield f"line {lineno}", kind, record_from_dict(kind, d)
            except (ValueError, TypeError) as e:
                raise TuningDBError(f"{path}, line {lineno}: bad record: {e}") from e


def open_db(db=None, **kw) -> TuningDB:
    """A :class:`TuningDB` for ``db`` (path), an already open TuningDB, or the default file."""
    if isinstance(db, TuningDB):
        return db
    return TuningDB(db, **kw)


__all__ = ["TuningDB", "TuningDBError", "open_db", "default_path", "MIGRATIONS", "DB_ENV"]
