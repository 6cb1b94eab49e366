"""The plan cache: per thread and per device, LRU, bounded by count and by bytes held.

Modelled on ``cupy.fft``'s plan cache. Each thread has its own caches (a
``threading.local``), one per device: ``"cpu"`` for host matrices, the CUDA
device id for GPU ones. Threads therefore never share an entry; a thread's
cache is only ever touched by that thread. The entries are kept in a
``core.cache.BoundedCache``, so ``matplan.cache_info()`` reports them (and
``matplan.clear_caches()`` empties them) with every other cache. An entry maps a
:class:`~matplan.dispatch.fingerprint.Fingerprint` to a
:class:`~matplan.planner.BoundPlan` (the plan and A in the chosen format), and
is charged the bytes it keeps alive: its prepared format and, for a format made
from a private copy of A, that copy (kept to confirm hits bit for bit, see
fingerprint.py); each buffer counts once. A format that is A's own arrays (SciPy,
NumPy, the CSR kernels, cuSPARSE, cuBLAS, TSM2) keeps the caller's arrays alive
instead of a copy. Entries are also found by identity key (``find``/``claim``).
The cache also keeps a small history per matrix *structure* (calls, and how many value versions were
prepared), from which ``matmul(reuse=None)`` estimates the reuse of a new version.
An entry registered under an identity key that keeps the key's objects alive
(pins: a format that is A's own arrays, a SpGEMM's B, or a copied format the
caller vouches for with ``assume_unchanged``) is charged their bytes too.

    cache = matplan.get_plan_cache()   # this thread, current device ("cpu" without a GPU)
    cache.set_size(32); cache.set_memsize(2 << 30)
    cache.set_assume_unchanged(True)   # trust identity for copied formats (see dispatch.auto)
    cache.show_info()
"""
from __future__ import annotations

import functools
import threading

from ..core.cache import BoundedCache
from ..core.validation import check_int
from ..core.xp import cupy_module
from ..kernels import get
from ..models.spgemm import VENDOR_LIMITS

_ABSENT = object()

#: Entries per cache (count bound); 0 disables caching.
DEFAULT_SIZE = 16
#: Bytes of prepared formats per cache (byte bound); -1 means unbounded.
DEFAULT_MEMSIZE = 1 << 30
#: Matrix structures whose call history is remembered for reuse estimates.
HISTORY_SIZE = 256


@functools.lru_cache(maxsize=None)
def product_limit(name: str):
    """The most products kernel ``name`` is known to compute correctly (None: no limit); a hit with
    such a kernel checks the operands' products first (``identity.start_product_check``)."""
    return VENDOR_LIMITS.get(name, {}).get("max_products")


def nbytes_of(x) -> int:
    """Bytes held by an array or a sparse matrix (data + indices + indptr)."""
    if hasattr(x, "indptr"):
        return int(x.data.nbytes + x.indices.nbytes + x.indptr.nbytes)
    return int(getattr(x, "nbytes", 0))


def held_nbytes(*objs) -> int:
    """Bytes of the arrays inside ``objs`` (Prepared formats, sparse matrices, arrays), each buffer once."""
    seen = {}
    for obj in objs:
        for a in leaves(obj):
            seen[buffer_key(a)] = int(a.nbytes)
    return sum(seen.values())


def prepared_nbytes(bound) -> int:
    """Bytes of a BoundPlan's prepared format, sparse matrices inside it included."""
    return held_nbytes(bound.prepared)


def leaves(x):
    if x is None:
        return
    arrays = getattr(x, "arrays", None)
    if isinstance(arrays, dict):                       # a kernels.base.Prepared
        for a in arrays.values():
            yield from leaves(a)
    elif hasattr(x, "indptr"):
        yield from (x.data, x.indices, x.indptr)
    elif hasattr(x, "nbytes"):
        yield x


def buffer_key(a):
    iface = getattr(a, "__array_interface__", None)    # NumPy
    if iface is not None:
        return iface["data"][0], a.nbytes
    ptr = getattr(getattr(a, "data", None), "ptr", None)  # CuPy
    return (ptr if ptr is not None else id(a)), a.nbytes


class _Entry:
    """One cached BoundPlan, its registered kernel, the A copy confirming hits (None when the
    format is A's own arrays), its counters, and the identity key that finds it without a digest.
    ``run_prepared`` (the kernel's ``run``), ``prepared``, ``limit`` (the kernel's products limit,
    ``identity.product_limit``) and ``planned`` (the plan's reuse) are read from ``bound`` once,
    for the hit path (:meth:`rebind`)."""
    __slots__ = ("fp", "bound", "kernel", "reference", "nbytes", "calls", "next_replan", "history",
                 "key", "pins", "run_prepared", "prepared", "limit", "planned")

    def __init__(self, fp, bound, reference, nbytes, next_replan, history):
        self.fp, self.reference, self.nbytes = fp, reference, nbytes
        self.calls, self.next_replan, self.history = 1, next_replan, history
        self.key = self.pins = None
        self.rebind(bound)

    def rebind(self, bound) -> None:
        """Hold ``bound`` (and what a hit reads of it)."""
        self.bound, self.kernel = bound, get(bound.plan.kernel)
        self.run_prepared, self.prepared = self.kernel.run, bound.prepared
        self.limit = product_limit(self.kernel.name)
        self.planned = bound.plan.reuse

    def run(self, B):
        """The kernel on B, which the caller validated for this entry's fingerprint (op, k, dtype)."""
        return self.run_prepared(self.prepared, B)


class _Entries(BoundedCache):
    """The plan cache's LRU store: a BoundedCache whose entries' charges change while they are
    cached (they gain or lose the objects they pin) and whose bounds the user may change. It
    works on BoundedCache's own fields (lock, sizes, shrink): keep it in step with core/cache.py.

    It also knows its most recently used key (``_mru``: set by every method that reorders or
    inserts, cleared by every one that removes it), so that ``PlanCache.count_hit``, run on every
    hit, need not hash the key (a Fingerprint, rehashed on each lookup) when it is already the
    most recent, as it is on every hit of a loop over one product (the count is then unlocked,
    as ``get_fast``'s: a concurrent ``clear_caches()`` may drop one)."""
    _mru = None

    def get(self, key, default=None):
        value = super().get(key, _ABSENT)
        if value is _ABSENT:
            return default
        self._mru = key
        return value

    def put(self, key, value) -> None:
        self._mru = key          # before put's evictions, which clear it if they drop the key
        super().put(key, value)

    def pop(self, key, default=None):
        self._forget(key)
        return super().pop(key, default)

    def discard(self, key) -> None:
        self._forget(key)
        super().discard(key)

    def clear(self) -> None:
        self._mru = None
        super().clear()

    def _shrink(self) -> list:
        dropped = super()._shrink()
        for key, _ in dropped:
            self._forget(key)
        return dropped

    def _forget(self, key) -> None:
        if self._mru is not None and self._mru == key:
            self._mru = None

    def recharge(self, key, nbytes: int) -> None:
        """Charge ``key``'s entry ``nbytes`` from now on, keeping its place (:meth:`shrink` evicts)."""
        with self._lock:
            if key in self._data:
                self._nbytes += nbytes - self._sizes[key]
                self._sizes[key] = nbytes

    def shrink(self) -> None:
        """Evict least recently used entries until the bounds hold."""
        with self._lock:
            dropped = self._shrink()
        self._evicted(dropped)

    def resize(self, maxsize: int, maxbytes: int | None) -> None:
        self.maxsize, self.maxbytes = maxsize, maxbytes
        self.shrink()

    def reset_counters(self) -> None:
        with self._lock:
            self._hits = self._misses = self._evictions = 0


def _unregister(by_key: dict, last: list, fp, entry) -> None:
    """Drop an entry leaving the cache from the identity index and from ``last`` (a plain function:
    no reference cycle between a PlanCache and its store)."""
    if entry.key is not None and by_key.get(entry.key) is entry:
        del by_key[entry.key]
    entry.key = entry.pins = None
    if last[0] is entry:
        last[0] = None


class PlanCache:
    """LRU map fingerprint -> BoundPlan for one device of one thread (see the module docstring).

    Entries live in a :class:`~matplan.core.cache.BoundedCache` (``matplan.cache_info()`` lists it
    as ``dispatch.plans[<device>]``), the structure history in another."""

    def __init__(self, device, size: int = DEFAULT_SIZE, memsize: int = DEFAULT_MEMSIZE):
        self.device = device
        self._size = _check_size(size)
        self._memsize = _check_memsize(memsize)
        self._by_key: dict = {}          # identity key (see identity.py) -> entry
        self._last = [None]              # the entry find() returned last (while it is cached)
        self._entries = _Entries(f"dispatch.plans[{device}]", self._size, maxbytes=_maxbytes(self._memsize),
                                 sizeof=_charged, on_evict=functools.partial(_unregister, self._by_key, self._last))
        self._history = BoundedCache(f"dispatch.plan_history[{device}]", HISTORY_SIZE)
        self.replans = self.too_large = 0
        self.assume_unchanged = False    # matmul(assume_unchanged=None) takes this (see dispatch.auto)

    @property
    def hits(self) -> int:
        return self._entries.info().hits

    @property
    def misses(self) -> int:
        return self._entries.info().misses

    @property
    def evictions(self) -> int:
        return self._entries.info().evictions

    # -- used by matmul ------------------------------------------------------
    def lookup(self, fp, confirm=None):
        """The entry for ``fp`` (counted as a hit, moved to most recent) or None (a miss).

        confirm: for entries that keep their A, ``confirm(reference)`` must say the
        caller's A equals it; otherwise the entry is an older version under the same
        key and is dropped (a miss).
        """
        entry = self._entries.peek(fp)
        if entry is not None and entry.reference is not None and confirm is not None \
                and not confirm(entry.reference):
            self._remove(fp)
        entry = self._entries.get(fp)    # counted: a hit (now the most recent) or a miss
        if entry is None:
            self._history_for(fp)[0] += 1
            return None
        entry.history[0] += 1
        entry.calls += 1
        return entry

    def find(self, key):
        """The entry registered under identity ``key`` (not counted: the caller confirms it first).

        The entry found last is tried first, by comparing ``key`` with the key it is registered
        under (an entry's ``key`` is set exactly while ``_by_key`` maps it to the entry), which
        saves hashing the key on every hit of a loop over one product."""
        entry = self._last[0]
        if entry is None or entry.key != key:
            entry = self._last[0] = self._by_key.get(key)
        return entry

    def count_hit(self, entry) -> None:
        """Count a confirmed hit on ``entry`` and make it the most recently used."""
        entry.history[0] += 1
        entry.calls += 1
        entries, fp = self._entries, entry.fp
        if entries._mru is fp:       # already the most recent: no reorder, no hash (see _Entries)
            entries._hits += 1
        else:
            entries.get(fp)

    def claim(self, entry, key, pins=None) -> None:
        """Register ``entry`` under identity ``key`` instead of its older key (None: under none), taking
        the key from any other entry; ``pins`` are kept alive while it is registered."""
        if entry.key is not None and self._by_key.get(entry.key) is entry:
            del self._by_key[entry.key]
        entry.key = entry.pins = None
        if self._entries.peek(entry.fp) is not entry:
            return
        if key is None:
            self._charge(entry)
            return
        other = self._by_key.get(key)
        if other is not None and other is not entry:
            other.key = other.pins = None
            self._charge(other)
        self._by_key[key] = entry
        entry.key, entry.pins = key, pins
        if self._charge(entry):
            self._entries.shrink()

    def _charge(self, entry) -> bool:
        """Charge ``entry`` for its format, its copy of A and the objects it pins; whether it grew."""
        nbytes = held_nbytes(entry.bound.prepared, entry.reference, *(entry.pins or ()))
        grew = nbytes > entry.nbytes
        entry.nbytes = nbytes
        self._entries.recharge(entry.fp, nbytes)
        return grew

    def _history_for(self, fp) -> list:
        """[calls, versions prepared] of ``fp``'s structure (LRU-bounded; refreshed on misses)."""
        skey = fp.structure_key()
        hist = self._history.get(skey)
        if hist is None:
            hist = [0, 0]
            self._history.put(skey, hist)
        return hist

    def estimate_reuse(self, fp) -> int:
        """Expected applications of a new version of this structure: the mean over earlier versions.

        ``calls / versions`` from the structure's history (the current call
        excluded); 1 for a structure never prepared before.
        """
        calls, versions = self._history.peek(fp.structure_key(), (1, 0))
        return max(1, (calls - 1) // versions) if versions else 1

    def fits(self, nbytes: int) -> bool:
        """Whether an entry of ``nbytes`` can be cached at all."""
        return self._size > 0 and (self._memsize < 0 or nbytes <= self._memsize)

    def insert(self, fp, bound, next_replan: int, reference=None, key=None, pins=None):
        """Cache ``bound`` (and the A copy it was prepared from, to confirm hits) under ``fp`` and
        identity ``key``, evicting least recently used entries; the entry, or None if it does not fit."""
        nbytes = held_nbytes(bound.prepared, reference)
        if not self.fits(nbytes):
            self.decline(fp)
            return None
        hist = self._history_for(fp)
        hist[1] += 1
        if fp in self._entries:
            self._remove(fp)
        entry = _Entry(fp, bound, reference, nbytes, next_replan, hist)
        self._entries.put(fp, entry)
        if key is not None:
            self.claim(entry, key, pins)
        self._entries.shrink()
        return entry

    def decline(self, fp) -> None:
        """Record a version of ``fp``'s structure that was prepared but is too large to cache."""
        self.too_large += 1
        self._history_for(fp)[1] += 1

    def replace(self, entry, bound, reference=None, replan=True) -> None:
        """Give ``entry`` a new ``bound`` (re-planned, or the same plan bound to other arrays) and the
        A copy it was prepared from (None: the format is A's own arrays); drop it if it no longer fits."""
        self.replans += replan
        entry.rebind(bound)
        entry.reference = reference
        self._charge(entry)
        if not self.fits(entry.nbytes):
            self.too_large += 1
            self._remove(entry.fp)
        self._entries.shrink()

    def _remove(self, fp) -> None:
        """Drop ``fp``'s entry (not an eviction: it is stale or too large)."""
        entry = self._entries.peek(fp)
        self._entries.discard(fp)
        _unregister(self._by_key, self._last, fp, entry)

    # -- cupy.fft-style controls ----------------------------------------------
    def get_size(self) -> int:
        return self._size

    def set_size(self, size: int) -> None:
        """Keep at most ``size`` entries (0 disables the cache), evicting now if needed."""
        self._size = _check_size(size)
        self._entries.resize(self._size, _maxbytes(self._memsize))

    def get_memsize(self) -> int:
        return self._memsize

    def set_memsize(self, memsize: int) -> None:
        """Keep at most ``memsize`` bytes of prepared formats (-1: unbounded), evicting now if needed."""
        self._memsize = _check_memsize(memsize)
        self._entries.resize(self._size, _maxbytes(self._memsize))

    def get_assume_unchanged(self) -> bool:
        return self.assume_unchanged

    def set_assume_unchanged(self, flag: bool) -> None:
        """What ``matmul(assume_unchanged=None)`` does in this thread on this device: True trusts the
        caller that A is not written in place between calls, so a hit on a format copied from A
        skips the bit-for-bit comparison (see ``dispatch.auto``). Default False: every hit checked."""
        if not isinstance(flag, bool):
            raise TypeError(f"flag: expected True or False, got {flag!r}")
        self.assume_unchanged = flag

    def get_curr_size(self) -> int:
        return len(self._entries)

    def get_curr_memsize(self) -> int:
        return self._entries.info().nbytes

    def clear(self) -> None:
        """Drop every entry and the history, and zero the counters."""
        self._entries.clear()
        self._by_key.clear()
        self._last[0] = None
        self._history.clear()
        self._entries.reset_counters()
        self.replans = self.too_large = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, fp) -> bool:
        return fp in self._entries

    def __iter__(self):
        """(fingerprint, BoundPlan) pairs, most recently used first."""
        return iter([(fp, e.bound) for fp, e in reversed(self._entries.items())])

    def __repr__(self) -> str:
        return (f"<matplan PlanCache device={self.device} entries={len(self)}/{self._size} "
                f"bytes={self.get_curr_memsize():,}/{_fmt_mem(self._memsize)} hits={self.hits} "
                f"misses={self.misses}>")

    def info(self) -> str:
        """The summary :meth:`show_info` prints."""
        title = f" matplan plan cache (device {self.device}, thread {threading.current_thread().name}) "
        lines = [title.center(72, "-"),
                 f"cache enabled? {self._size > 0}",
                 f"assume unchanged (copied formats trusted without comparison)? {self.assume_unchanged}",
                 f"current / max size   : {len(self)} / {self._size} (counts)",
                 f"current / max memsize: {self.get_curr_memsize():,} / {_fmt_mem(self._memsize)} (bytes)",
                 f"hits / misses: {self.hits} / {self.misses} (counts)",
                 f"evictions: {self.evictions}, re-plans: {self.replans}, too large to cache: {self.too_large}",
                 "", "cached plans (most recently used first):"]
        entries = self._entries.items()
        for fp, e in reversed(entries):
            p = e.bound.plan
            lines.append(f"  {fp.describe()}: {p.candidates[0].label() if p.candidates else p.kernel} "
                         f"(reuse={p.reuse}), {e.nbytes:,} bytes, {e.calls} calls")
        if not entries:
            lines.append("  (none)")
        return "\n".join(lines)

    def show_info(self) -> None:
        print(self.info())


def _charged(entry) -> int:
    return entry.nbytes


def _maxbytes(memsize: int) -> int | None:
    return None if memsize < 0 else memsize


def _check_size(size) -> int:
    return check_int(size, "size", "a non-negative integer number of entries (0 disables)", minimum=0)


def _check_memsize(memsize) -> int:
    return check_int(memsize, "memsize", "a byte count >= 0, or -1 for unbounded", minimum=-1)


def _fmt_mem(memsize: int) -> str:
    return "(unbounded)" if memsize < 0 else f"{memsize:,}"


_local = threading.local()


def _caches() -> dict:
    caches = getattr(_local, "caches", None)
    if caches is None:
        caches = _local.caches = {}
    return caches


def cache_for(device) -> PlanCache:
    """This thread's cache for ``device`` (no argument checking: the hot path, one call)."""
    cache = getattr(_local, "caches", _NO_CACHES).get(device)
    if cache is None:
        cache = _caches()[device] = PlanCache(device)
    return cache


_NO_CACHES: dict = {}


def get_plan_cache(device=None) -> PlanCache:
    """This thread's plan cache for ``device``.

    device: ``"cpu"`` for host (SciPy/NumPy) matrices, a CUDA device id for GPU
    ones; None means the current CUDA device when CuPy sees a GPU, else ``"cpu"``.
    """
    if device is None:
        cp = cupy_module()
        device = cp.cuda.runtime.getDevice() if cp is not None else "cpu"
    elif not (isinstance(device, str) and device == "cpu"):
        device = check_int(device, "device", "'cpu' or a CUDA device id (int >= 0)", minimum=0)
    return cache_for(device)


def show_plan_cache_info() -> None:
    """Print every plan cache of this thread."""
    caches = _caches()
    if not caches:
        print(f"matplan: no plan cache in thread {threading.current_thread().name} yet")
    for device in sorted(caches, key=str):
        caches[device].show_info()


__all__ = ["PlanCache", "get_plan_cache", "show_plan_cache_info", "cache_for", "DEFAULT_SIZE",
           "DEFAULT_MEMSIZE", "HISTORY_SIZE", "nbytes_of", "product_limit", "held_nbytes", "prepared_nbytes", "leaves",
           "buffer_key"]
