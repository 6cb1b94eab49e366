"""One bounded cache for everything matplan keeps between calls (launches, graph replays, guesses,
spare outputs, tuned configs), and :func:`cache_info` reporting them all.

A :class:`BoundedCache` is a thread-safe LRU map bounded by entries and, where ``sizeof`` is
given, by bytes; it counts hits, misses and evictions. Each is registered by name on creation, so
``matplan.cache_info()`` lists every cache in the process and ``clear_all()`` empties them.
"""
from __future__ import annotations

import collections
import dataclasses
import numbers
import threading
import weakref
from typing import Any, Callable, Hashable

_MISSING = object()


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """A cache's counters: lookups that hit and missed, entries dropped to stay in bounds, what it
    holds now and its bounds (``maxbytes`` None: bounded by entries only)."""
    name: str
    hits: int
    misses: int
    evictions: int
    entries: int
    nbytes: int
    maxsize: int
    maxbytes: int | None


def _count(value, name: str, expected: str) -> int:
    """``value`` as an int >= 0: core.validation.check_int's rule (Python or NumPy integers, never a
    bool), kept here so the lowest module imports neither NumPy nor SciPy."""
    is_bool = isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")
    if is_bool or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name}: expected {expected}, got {value!r}{' (a bool)' if is_bool else ''}")
    return int(value)


class BoundedCache:
    """A named, thread-safe LRU map of at most ``maxsize`` entries and ``maxbytes`` bytes.

    ``sizeof(value) -> int`` gives an entry's bytes (0 for all without it). ``on_evict(key, value)``
    is called, outside the lock, for each entry dropped to stay in bounds or by :meth:`clear`.
    """

    def __init__(self, name: str, maxsize: int, *, maxbytes: int | None = None,
                 sizeof: Callable[[Any], int] | None = None,
                 on_evict: Callable[[Hashable, Any], None] | None = None):
        maxsize = _count(maxsize, "maxsize", "a non-negative integer")
        if maxbytes is not None:
            maxbytes = _count(maxbytes, "maxbytes", "None or a non-negative integer")
        self.name = name
        self.maxsize = maxsize
        self.maxbytes = maxbytes
        self._sizeof = sizeof
        self._on_evict = on_evict
        self._data: collections.OrderedDict = collections.OrderedDict()
        self._sizes: dict = {}
        self._nbytes = 0
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.RLock()
        _register(self)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key) -> bool:
        return key in self._data

    def get(self, key, default=None):
        """The value kept under ``key`` (now the most recently used), else ``default``; counted."""
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                self._misses += 1
                return default
            self._data.move_to_end(key)
            self._hits += 1
            return value

    def get_fast(self, key, default=None):
        """:meth:`get` for launch paths: no lock and no reordering (entries then age as if
        first in, first out); the hit and miss counts may drop an update under contention."""
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self._misses += 1
            return default
        self._hits += 1
        return value

    def peek(self, key, default=None):
        """The value under ``key`` without counting a lookup or reordering."""
        return self._data.get(key, default)

    def put(self, key, value) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used entries past the bounds."""
        size = int(self._sizeof(value)) if self._sizeof is not None else 0
        with self._lock:
            if key in self._data:
                self._nbytes -= self._sizes.pop(key)
                del self._data[key]
            self._data[key] = value
            self._sizes[key] = size
            self._nbytes += size
            dropped = self._shrink()
        self._evicted(dropped)

    def get_or_create(self, key, factory: Callable[[], Any]):
        """The value under ``key``, made by ``factory()`` and kept on a miss."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            value = factory()
            self.put(key, value)
        return value

    def pop(self, key, default=None):
        """Remove and return the value under ``key`` (a hit), else ``default`` (a miss)."""
        with self._lock:
            if key not in self._data:
                self._misses += 1
                return default
            self._hits += 1
            self._nbytes -= self._sizes.pop(key)
            return self._data.pop(key)

    def discard(self, key) -> None:
        """Drop ``key`` if kept, uncounted and without ``on_evict``: the caller owns the value."""
        with self._lock:
            if key in self._data:
                self._nbytes -= self._sizes.pop(key)
                del self._data[key]

    def values(self) -> list:
        """The values kept, least recently used first (a copy)."""
        with self._lock:
            return list(self._data.values())

    def items(self) -> list:
        with self._lock:
            return list(self._data.items())

    def clear(self) -> None:
        with self._lock:
            dropped = list(self._data.items())
            self._data.clear()
            self._sizes.clear()
            self._nbytes = 0
        self._evicted(dropped)

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self.name, self._hits, self._misses, self._evictions, len(self._data),
                             self._nbytes, self.maxsize, self.maxbytes)

    def _shrink(self) -> list:
        dropped = []
        while self._data and (len(self._data) > self.maxsize
                              or (self.maxbytes is not None and self._nbytes > self.maxbytes)):
            key, value = self._data.popitem(last=False)
            self._nbytes -= self._sizes.pop(key)
            self._evictions += 1
            dropped.append((key, value))
        return dropped

    def _evicted(self, dropped) -> None:
        if self._on_evict is not None:
            for key, value in dropped:
                self._on_evict(key, value)

    def __repr__(self) -> str:
        i = self.info()
        return f"<BoundedCache {i.name}: {i.entries}/{i.maxsize} entries, {i.nbytes:,} B, {i.hits} hits, {i.misses} misses>"


_CACHES: "weakref.WeakValueDictionary[str, BoundedCache]" = weakref.WeakValueDictionary()
_CACHES_LOCK = threading.Lock()


def _register(cache: BoundedCache) -> None:
    with _CACHES_LOCK:
        name, n = cache.name, 2
        while name in _CACHES:   # two caches of one name (per-thread caches, tests) both listed
            name, n = f"{cache.name}#{n}", n + 1
        cache.name = name
        _CACHES[name] = cache


def cache_info() -> dict:
    """Every live cache's :class:`CacheInfo`, by name."""
    with _CACHES_LOCK:
        caches = list(_CACHES.values())
    return {c.name: c.info() for c in sorted(caches, key=lambda c: c.name)}


def clear_all() -> None:
    """Empty every live cache (tests, and a user freeing GPU memory held for reuse)."""
    with _CACHES_LOCK:
        caches = list(_CACHES.values())
    for c in caches:
        c.clear()
