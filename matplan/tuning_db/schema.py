"""The tuning database's schema: the migrations that build it, and a check of a file against it.

The expected schema is whatever the migrations build: :func:`describe_schema` applies them to an empty
in-memory database and reads back every table's columns (name, type, NOT NULL, default, primary
key), foreign keys and indexes (named ones and the UNIQUE constraints' automatic ones);
:func:`schema_differences` compares a file's description with it, so a dropped table, a renamed or
retyped column or a missing index is named, not reported as ``ok``.
"""
from __future__ import annotations

import sqlite3

#: The timings' columns as version 1 made them (version 4 rebuilds the table with these first).
_TIMING_COLUMNS_V1 = """
        id INTEGER PRIMARY KEY,
        device_key TEXT NOT NULL REFERENCES devices(key),
        problem TEXT NOT NULL REFERENCES problems(fingerprint),
        kernel TEXT NOT NULL, params TEXT NOT NULL, matplan_version TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
        prepare_ms REAL, run_ms_median REAL, run_ms_min REAL, run_ms_max REAL,
        repeats INTEGER NOT NULL DEFAULT 0, matched INTEGER, max_error REAL,
        error TEXT NOT NULL DEFAULT '', created_at TEXT NOT NULL, host TEXT NOT NULL DEFAULT ''"""

_V1 = [
    """CREATE TABLE devices (
        key TEXT PRIMARY KEY, device_class TEXT NOT NULL, backend TEXT NOT NULL, name TEXT NOT NULL,
        compute_capability TEXT NOT NULL DEFAULT '', sms INTEGER NOT NULL DEFAULT 0,
        memory_bytes INTEGER NOT NULL DEFAULT 0, driver TEXT NOT NULL DEFAULT '',
        cuda TEXT NOT NULL DEFAULT '', cupy TEXT NOT NULL DEFAULT '', spec TEXT NOT NULL)""",
    """CREATE TABLE problems (
        fingerprint TEXT PRIMARY KEY, op TEXT NOT NULL, dtype TEXT NOT NULL, source TEXT NOT NULL,
        family TEXT NOT NULL, matrix TEXT NOT NULL, features TEXT NOT NULL)""",
    "CREATE INDEX problems_source ON problems(source)",
    f"""CREATE TABLE timings ({_TIMING_COLUMNS_V1},
        UNIQUE (device_key, problem, kernel, params, matplan_version))""",
    "CREATE INDEX timings_problem ON timings(problem)",
]

#: The timings' columns at schema version 3 (what version 4's rebuild copies).
_V3_TIMING_COLUMNS = ("id, device_key, problem, kernel, params, matplan_version, status, prepare_ms, run_ms_median, "
                      "run_ms_min, run_ms_max, repeats, matched, max_error, error, created_at, host, "
                      "run_ms_queued, first_ms")

#: (version, statements): applied in order to bring a file from the version before to this one.
#: Add a step (never edit a released one) when the schema changes.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, _V1),
    (2, ["""CREATE TABLE calibrations (
        device_key TEXT NOT NULL REFERENCES devices(key), kernel TEXT NOT NULL, key TEXT NOT NULL,
        value TEXT NOT NULL, matplan_version TEXT NOT NULL, created_at TEXT NOT NULL,
        UNIQUE (device_key, kernel, key, matplan_version))"""]),
    # calls queued back to back (throughput), beside the synchronised single call of run_ms_median;
    # first calls of kernels whose repeated runs replay (Kernel.tuning_calls)
    (3, ["ALTER TABLE timings ADD COLUMN run_ms_queued REAL", "ALTER TABLE timings ADD COLUMN first_ms REAL"]),
    # the tuning run's label joins the natural key, so repeated tunes of one device keep a timing
    # each and the dataset pools them (SQLite cannot change a UNIQUE constraint: the table is rebuilt)
    (4, [f"""CREATE TABLE timings_v4 ({_TIMING_COLUMNS_V1},
        run_ms_queued REAL, first_ms REAL, run TEXT NOT NULL DEFAULT '',
        UNIQUE (device_key, problem, kernel, params, matplan_version, run))""",
         f"INSERT INTO timings_v4 ({_V3_TIMING_COLUMNS}) SELECT {_V3_TIMING_COLUMNS} FROM timings",
         "DROP TABLE timings",
         "ALTER TABLE timings_v4 RENAME TO timings",
         "CREATE INDEX timings_problem ON timings(problem)"]),
]

#: The table every migration records its version in (not part of MIGRATIONS' statements).
VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"


def latest_version(migrations=None) -> int:
    return (migrations or MIGRATIONS)[-1][0]


def apply_migrations(conn, migrations, current: int) -> None:
    """Run the steps after version ``current`` on ``conn`` (inside the caller's transaction)."""
    conn.execute(VERSION_TABLE)
    for version, statements in migrations:
        if version <= current:
            continue
        for sql in statements:
            conn.execute(sql)
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def describe_schema(conn) -> dict:
    """{table: {"columns": {name: (type, notnull, default, pk)}, "foreign_keys": {(column, table,
    to)}, "indexes": {label: (unique, columns)}}} of every table of ``conn`` but SQLite's own.
    A named index's label is its name; a UNIQUE constraint's is ``unique(col, ...)``."""
    out = {}
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    for t in tables:
        q = _quote(t)
        columns = {r[1]: (r[2].upper(), bool(r[3]), r[4], int(r[5]))
                   for r in conn.execute(f"PRAGMA table_info({q})")}
        fks = {(r[3], r[2], r[4]) for r in conn.execute(f"PRAGMA foreign_key_list({q})")}
        indexes = {}
        for r in conn.execute(f"PRAGMA index_list({q})"):
            name, unique, origin = r[1], bool(r[2]), r[3]
            if origin == "pk":
                continue                     # the primary key is already in the columns
            cols = tuple(c[2] for c in conn.execute(f"PRAGMA index_info({_quote(name)})"))
            label = f"unique({', '.join(cols)})" if origin == "u" else name
            indexes[label] = (unique, cols)
        out[t] = {"columns": columns, "foreign_keys": fks, "indexes": indexes}
    return out


def expected_schema(migrations=None) -> dict:
    """:func:`describe_schema` of an empty database built by ``migrations``."""
    conn = sqlite3.connect(":memory:")
    try:
        apply_migrations(conn, migrations or MIGRATIONS, 0)
        return describe_schema(conn)
    finally:
        conn.close()


def _column_text(spec) -> str:
    type_, notnull, default, pk = spec
    return " ".join(filter(None, [type_ or "(no type)", "NOT NULL" if notnull else "",
                                  f"DEFAULT {default}" if default is not None else "",
                                  "PRIMARY KEY" if pk else ""]))


def schema_differences(have: dict, want: dict) -> list[str]:
    """What ``have`` (a file's :func:`describe_schema`) lacks, adds or changes relative to ``want``."""
    out = []
    for t in sorted(set(want) - set(have)):
        out.append(f"table {t} is missing")
    for t in sorted(set(have) - set(want)):
        out.append(f"table {t} is not in the schema")
    for t in sorted(set(want) & set(have)):
        w, h = want[t], have[t]
        for c in w["columns"]:
            if c not in h["columns"]:
                out.append(f"{t}: column {c} ({_column_text(w['columns'][c])}) is missing")
            elif h["columns"][c] != w["columns"][c]:
                out.append(f"{t}: column {c} is {_column_text(h['columns'][c])}, "
                           f"expected {_column_text(w['columns'][c])}")
        for c in h["columns"]:
            if c not in w["columns"]:
                out.append(f"{t}: column {c} is not in the schema")
        for fk in sorted(w["foreign_keys"] - h["foreign_keys"]):
            out.append(f"{t}: foreign key {fk[0]} -> {fk[1]}({fk[2]}) is missing")
        for fk in sorted(h["foreign_keys"] - w["foreign_keys"]):
            out.append(f"{t}: foreign key {fk[0]} -> {fk[1]}({fk[2]}) is not in the schema")
        for label, spec in sorted(w["indexes"].items()):
            got = h["indexes"].get(label)
            if got is None:
                out.append(f"{t}: index {label} on ({', '.join(spec[1])}) is missing")
            elif got != spec:
                out.append(f"{t}: index {label} is {'unique ' if got[0] else ''}on ({', '.join(got[1])}), "
                           f"expected {'unique ' if spec[0] else ''}on ({', '.join(spec[1])})")
        for label in sorted(set(h["indexes"]) - set(w["indexes"])):
            out.append(f"{t}: index {label} is not in the schema")
    return out


__all__ = ["MIGRATIONS", "VERSION_TABLE", "latest_version", "apply_migrations", "describe_schema",
           "expected_schema", "schema_differences"]
