"""The planner's measurement cache: every timing taken at plan time, kept in memory and in a
SQLite file under the user's cache folder, so a later plan (in this process or another) of the
same kernel, config and problem skips the timing.

A :class:`Key` says what was timed and where: the kernel's name and :class:`Config` (its
parameters, canonical), the problem (the kernel's shape bucket, ``measure_key``, or a digest of
the planner's features), the device, a digest of the kernel's sources (:func:`source_digest`:
its module and the ``.cu`` / Python files it lists in ``sources``, with their local includes) and
the library versions (:func:`versions`: matplan, NumPy, and CuPy with the CUDA runtime on the
GPU). An edited kernel, a new CuPy or another GPU misses. An :class:`Entry` keeps the seconds a
call took and the model's prediction for the problem it was timed on: their ratio scales the
model to another problem of the same bucket.

The file is ``$MATPLAN_MEASURE_CACHE``, else ``measurements.sqlite`` in matplan's cache folder
(:func:`matplan.core.paths.user_folder`); ``MATPLAN_MEASURE_CACHE=off`` keeps timings in memory only.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import inspect
import json
import math
import os
import re
import sqlite3
import threading
import warnings
from pathlib import Path

import numpy as np

from ..core.cache import BoundedCache
from ..core.paths import user_folder
from ..core.version import __version__
from ..core.xp import cupy_module
from ..kernels import registry

#: Environment variable naming the cache file ("off": memory only).
CACHE_ENV = "MATPLAN_MEASURE_CACHE"
CACHE_FILE = "measurements.sqlite"
#: Entries the in-memory layer keeps (a few hundred bytes each).
MEMORY_ENTRIES = 4096
#: Root of the paths a kernel lists in ``sources``.
KERNELS_DIR = Path(registry.__file__).resolve().parent
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Config:
    """A kernel's parameter set, hashable: its (name, value) pairs sorted by name."""
    kernel: str
    items: tuple

    @classmethod
    def of(cls, kernel: str, params: dict) -> "Config":
        return cls(kernel, tuple(sorted((str(k), _plain(v)) for k, v in params.items())))

    def params(self) -> dict:
        return dict(self.items)

    def text(self) -> str:
        """The parameters as canonical JSON (the file's column)."""
        return json.dumps(self.params(), sort_keys=True, separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class Key:
    """Everything a timing depends on (see the module docstring); ``problem`` and ``versions`` are
    canonical JSON."""
    config: Config
    problem: str
    device: str
    source: str
    versions: str

    def digest(self) -> str:
        """The file's primary key: SHA-256 of every field."""
        text = "\n".join([self.config.kernel, self.config.text(), self.problem, self.device, self.source,
                          self.versions])
        return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Entry:
    """A timing: seconds per call of ``key``'s kernel and config, and the model's predicted seconds
    for the problem it ran on."""
    key: Key
    seconds: float
    predicted_s: float
    created: str = ""

    @property
    def ratio(self) -> float | None:
        """measured / predicted, None where the prediction is not a positive finite number."""
        if math.isfinite(self.predicted_s) and self.predicted_s > 0:
            return self.seconds / self.predicted_s
        return None

    def to_dict(self) -> dict:
        k = self.key
        return {"kernel": k.config.kernel, "params": k.config.params(), "problem": json.loads(k.problem),
                "device": k.device, "source": k.source, "versions": json.loads(k.versions),
                "seconds": self.seconds, "predicted_s": self.predicted_s, "created": self.created}


def _plain(v):
    """A parameter value as a hashable JSON value (lists become tuples)."""
    if isinstance(v, (list, tuple)):
        return tuple(_plain(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


def canonical(value) -> str:
    """Canonical JSON of a problem key or versions (tuples as lists)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --- what a timing depends on ------------------------------------------------------------------
#: Per kernel class and sources: (the files' sizes and times, their digest, the files).
_DIGESTS = BoundedCache("planner.source_digests", 256)


def source_digest(kernel) -> str:
    """SHA-256 (16 hex digits) of the kernel's sources: the file of its class, then each path in
    ``kernel.sources`` (relative to matplan/kernels, or absolute) with the headers it includes by
    relative name, recursively. Read again when a file's size or modification time changes."""
    ident = (type(kernel), tuple(getattr(kernel, "sources", ())))
    hit = _DIGESTS.get(ident)
    if hit is not None and _stamp(hit[2]) == hit[0]:
        return hit[1]
    files = _source_files(kernel)
    digest = _digest(files)
    _DIGESTS.put(ident, (_stamp(files), digest, files))
    return digest


def _stamp(files) -> tuple:
    return tuple(_stat(p) for p in files)


def _source_files(kernel) -> list:
    try:
        own = [Path(inspect.getsourcefile(type(kernel)))]
    except (TypeError, OSError):   # a class defined where no file holds it
        own = []
    seen, out = set(), []
    todo = own + [KERNELS_DIR / s for s in getattr(kernel, "sources", ())]
    while todo:
        path = todo.pop(0).resolve()
        if path in seen:
            continue
        seen.add(path)
        out.append(path)
        if path.suffix in (".cu", ".cuh") and path.is_file():
            todo += [path.parent / inc for inc in _INCLUDE.findall(path.read_text(encoding="utf-8"))]
    return out


def _stat(path: Path) -> tuple:
    try:
        st = path.stat()
        return st.st_size, st.st_mtime_ns
    except OSError:
        return -1, -1


def _digest(files) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode() + b"\0")
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"<missing>")
    return h.hexdigest()[:16]


_VERSIONS: dict = {}


def versions(backend: str) -> str:
    """Canonical JSON of the library versions a timing on ``backend`` depends on."""
    if backend not in _VERSIONS:
        v = {"matplan": __version__, "numpy": np.__version__}
        cp = cupy_module() if backend == "gpu" else None
        if cp is not None:
            v.update(cupy=cp.__version__, cuda_runtime=int(cp.cuda.runtime.runtimeGetVersion()))
        _VERSIONS[backend] = canonical(v)
    return _VERSIONS[backend]


# --- the store ----------------------------------------------------------------------------------
_SCHEMA = """CREATE TABLE IF NOT EXISTS measurements (
    digest TEXT PRIMARY KEY, kernel TEXT NOT NULL, config TEXT NOT NULL, problem TEXT NOT NULL,
    device TEXT NOT NULL, source TEXT NOT NULL, versions TEXT NOT NULL, seconds REAL NOT NULL,
    predicted_s REAL NOT NULL, created TEXT NOT NULL)"""


class MeasureCache:
    """Timings by :class:`Key`: an in-memory layer (``planner.measurements`` in
    ``matplan.cache_info()``) over the SQLite file at ``path`` (None: memory only). A file that
    cannot be opened or written is warned about once and left alone."""

    def __init__(self, path: Path | None):
        self.path = path
        self.memory = BoundedCache("planner.measurements", MEMORY_ENTRIES)
        self._lock = threading.Lock()
        self._db = None
        self._broken = False

    def get(self, key: Key) -> Entry | None:
        hit = self.memory.get(key)
        if hit is None:
            hit = self._load(key)
            if hit is not None:
                self.memory.put(key, hit)
        return hit

    def put(self, entries) -> None:
        """Keep ``entries`` (in memory, and in the file in one transaction), then tell the listeners."""
        entries = [e for e in entries if math.isfinite(e.seconds)]
        for e in entries:
            self.memory.put(e.key, e)
        if entries:
            self._store(entries)
            for listener in list(LISTENERS):
                listener(entries)

    def entries(self, kernel: str | None = None) -> list:
        """Every entry in the file and in memory (of ``kernel``), oldest first."""
        found = {e.key: e for e in self._load_all()}
        found.update((k, e) for k, e in self.memory.items())
        out = [e for e in found.values() if kernel is None or e.key.config.kernel == kernel]
        return sorted(out, key=lambda e: e.created)

    def clear(self) -> None:
        """Forget every timing, in memory and in the file."""
        self.memory.clear()
        self._run(lambda db: db.execute("DELETE FROM measurements"))

    # the file: one connection per cache, opened on first use (SQLite locks it between processes)
    def _run(self, op, default=None):
        if self.path is None or self._broken:
            return default
        with self._lock:
            try:
                if self._db is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._db = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
                    self._db.execute(_SCHEMA)
                with self._db:
                    return op(self._db)
            except (sqlite3.Error, OSError) as exc:
                self._broken = True
                warnings.warn(f"measurement cache {self.path}: {exc}; timings are kept in memory only "
                              f"(set {CACHE_ENV} to another file, or to 'off')", RuntimeWarning, stacklevel=4)
                return default

    def _load(self, key: Key) -> Entry | None:
        rows = self._run(lambda db: db.execute("SELECT seconds, predicted_s, created FROM measurements "
                                               "WHERE digest = ?", (key.digest(),)).fetchall(), [])
        return Entry(key, *rows[0]) if rows else None

    def _load_all(self) -> list:
        rows = self._run(lambda db: db.execute(
            "SELECT kernel, config, problem, device, source, versions, seconds, predicted_s, created "
            "FROM measurements").fetchall(), [])
        return [Entry(Key(Config.of(r[0], json.loads(r[1])), r[2], r[3], r[4], r[5]), r[6], r[7], r[8])
                for r in rows]

    def _store(self, entries) -> None:
        rows = [(e.key.digest(), e.key.config.kernel, e.key.config.text(), e.key.problem, e.key.device,
                 e.key.source, e.key.versions, float(e.seconds), float(e.predicted_s), e.created)
                for e in entries]
        self._run(lambda db: db.executemany("INSERT OR REPLACE INTO measurements VALUES (?,?,?,?,?,?,?,?,?,?)",
                                            rows))


#: Functions called with each list of new entries (the tuning database records them).
LISTENERS: list = []
_CACHES: dict = {}


def cache_path() -> Path | None:
    """The cache file by ``$MATPLAN_MEASURE_CACHE`` (None: "off")."""
    env = os.environ.get(CACHE_ENV)
    if env is not None and env.strip().lower() in ("", "off", "0", "none"):
        return None
    return Path(env).expanduser() if env else user_folder("cache") / CACHE_FILE


def cache() -> MeasureCache:
    """The measurement cache of the file ``$MATPLAN_MEASURE_CACHE`` names now (one per file)."""
    path = cache_path()
    if path not in _CACHES:
        _CACHES[path] = MeasureCache(path)
    return _CACHES[path]


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


__all__ = ["Config", "Key", "Entry", "MeasureCache", "cache", "cache_path", "source_digest", "versions",
           "canonical", "LISTENERS", "CACHE_ENV"]
