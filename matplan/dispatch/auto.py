"""``matplan.matmul(A, B)``: plan and run in one call, reusing plans from the plan cache.

Per call, first the identity fast path: the same A and B objects as an earlier
call (by identity key), and either a format that is A's own arrays or A equal
to the entry's private copy bit for bit; then the kernel runs on the prepared A
and B with no validation, fingerprint, statistics or choice. Otherwise the full
path: validate (A, B), fingerprint A, look the fingerprint up in this thread's
cache for A's device (on the host, confirm a hit by comparing A with the entry's
copy). A miss plans and prepares the chosen format: on A's own arrays when the
kernel reads them at run time (such a format cannot go stale), else on a private
copy of A the entry keeps (A may change later). See fingerprint.py for why no
hit can reuse a stale format.

``reuse`` (applications of the plan to the same A, which amortise format
conversion, see ``planner.plan``):

* an int: plan with it, as ``planner.plan(reuse=...)`` does;
* None (default): estimate it from the cache's history. A new version of a known
  structure (same pattern, new values) is planned with the mean number of calls
  earlier versions got; an unknown structure with 1. A cached entry is re-planned
  with ``reuse = calls so far`` once its calls reach ``REPLAN_FACTOR`` times the
  reuse it was planned for (then 8x that, and so on), and only if some candidate
  with a costlier conversion could win at a larger reuse. The format is prepared
  again only when the choice changes.
"""
from __future__ import annotations

import threading

from .. import planner
from .._xp import cupy_module
from ..planner import BoundPlan
from ..validation import normalize
from .cache import cache_for, nbytes_of
from .fingerprint import device_of, fingerprint, same_content
from .identity import aliases, aliasing_kernel, identity_key, pins, start_compare

#: Re-plan a cached entry when its calls reach this multiple of the reuse it was planned for.
REPLAN_FACTOR = 8

_state = threading.local()
_ready_lock = threading.Lock()
_ready = False


def check_args(reuse, deterministic) -> None:
    if reuse is not None and (isinstance(reuse, bool) or not isinstance(reuse, int) or reuse < 1):
        raise ValueError("reuse: expected None (estimated from the plan cache) or a positive integer "
                         f"(applications of the plan to the same A), got {reuse!r}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected True or False, got {deterministic!r}")


def matmul(A, B, *, reuse=None, deterministic=False):
    """C = A @ B, planned once per distinct A and reused from this thread's plan cache.

    A, B: as for ``planner.plan`` (SciPy/cupyx sparse, NumPy/CuPy arrays, ...).
    reuse: None estimates it from the cache's history (see the module docstring); an
        int is passed to the planner.
    deterministic: admit only bitwise-reproducible kernels; part of the cache key.

    A changed A (values or structure, in place or not) is never served a stale
    prepared format: see ``dispatch.fingerprint`` for what a hit checks. For a loop
    over one A known not to change, ``planner.plan(A, B, reuse=n).bind(A)`` avoids
    even the identity check.
    """
    check_args(reuse, deterministic)
    return _dispatch(A, B, reuse, deterministic, None)


def busy() -> bool:
    """Whether this thread is inside matplan.matmul (routed products then fall through)."""
    return getattr(_state, "depth", 0) > 0


def run(problem, reuse=None, deterministic=False):
    """matmul on an already validated Problem (the routing hook enters here)."""
    return _dispatch(problem.A, problem.B, reuse, deterministic, problem)


_MISS = object()


def _dispatch(A, B, reuse, deterministic, problem):
    """The identity fast path (no validation, no fingerprint) when it applies, else the full path."""
    found = identity_key(A, B, deterministic)
    if found is not None:
        C = _identity_hit(found[0], found[1], A, B, reuse, deterministic)
        if C is not _MISS:
            return C
    if problem is None:
        problem = normalize(A, B)
    key = found[1] if found is not None and problem.A is A and problem.B is B else None
    _load_kernels_once()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        if problem.backend == "gpu":
            cp = cupy_module()
            dev = device_of(problem.A)
            if dev != cp.cuda.runtime.getDevice():      # run where A lives
                with cp.cuda.Device(dev):
                    return _run(problem, reuse, deterministic, key)
        return _run(problem, reuse, deterministic, key)
    finally:
        _state.depth -= 1


def _identity_hit(device, key, A, B, reuse, deterministic):
    """C from the entry registered under identity ``key`` once A is known to be unchanged, else _MISS.

    A and B are as ``normalize`` would return them (the key says so). A format that is A's
    own arrays needs no check; otherwise A is compared bit for bit with the entry's copy (on
    the GPU the kernel is launched behind the comparison on the same stream and its result
    dropped if A differs, so the check costs no extra round trip before the launch).
    """
    cache = cache_for(device)
    entry = cache.find(key)
    if entry is None:
        return _MISS
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        if entry.reference is None:
            C = entry.run(B)
        elif device == "cpu":
            if not same_content(A, entry.reference):
                return _MISS
            C = entry.run(B)
        else:
            pending = start_compare(A, entry.reference, device)
            if pending is None:
                return _MISS
            C = entry.run(B)
            if not pending.same():
                return _MISS
        cache.count_hit(entry)
        _maybe_replan(cache, entry, A, B, reuse, deterministic, key)
        return C
    finally:
        _state.depth -= 1


def _run(problem, reuse, deterministic, key):
    """The full path: fingerprint, lookup (confirmed on the host), plan on a miss."""
    A = problem.A
    fp = fingerprint(problem, deterministic)
    cache = cache_for(fp.device)
    host = problem.backend == "cpu"
    entry = cache.lookup(fp, (lambda ref: same_content(A, ref)) if host else None)
    if entry is None:
        want = reuse if reuse is not None else cache.estimate_reuse(fp)
        plan = planner.plan(A, problem.B, reuse=want, deterministic=deterministic)
        if not cache.fits(nbytes_of(A)):
            cache.decline(fp)
            return plan.bind(A)(problem.B)
        bound, reference = _prepare(plan, A)
        cache.insert(fp, bound, plan.reuse * REPLAN_FACTOR, reference, key, _pins(key, reference, A))
        return bound(problem.B)
    if entry.reference is None and (key is not None or not aliases(entry.bound.prepared, A)):
        bound = entry.bound.plan.bind(A)         # the format aliases another object: A's arrays instead
        if not aliases(bound.prepared, A):       # (converted on the way: right for this call only)
            return bound(problem.B)
        cache.replace(entry, bound, None, replan=False)
        cache.claim(entry, key, _pins(key, None, A))
    elif entry.reference is not None and key is not None:
        cache.claim(entry, key)
    _maybe_replan(cache, entry, A, problem.B, reuse, deterministic, key)
    return entry.run(problem.B)


def _prepare(plan, A):
    """(BoundPlan, private copy of A or None): the chosen format on A's own arrays when the
    kernel aliases them (it cannot go stale), else on a copy the cache owns (A may change later)."""
    if aliasing_kernel(plan.kernel):
        bound = plan.bind(A)
        if aliases(bound.prepared, A):
            return bound, None
    copy = _private_copy(A)
    return plan.bind(copy), copy


def _pins(key, reference, A):
    """What an entry registered under ``key`` keeps alive: A's objects when its format aliases them."""
    return pins(A) if key is not None and reference is None else None


def _maybe_replan(cache, entry, A, B, reuse, deterministic, key) -> None:
    """Re-plan ``entry`` when its calls or the caller's ``reuse`` ask for it (see the module docstring).

    A is the object registered under identity ``key`` (or None) if the entry has one.
    """
    want = _wanted_reuse(entry, reuse)
    if want is None:
        return
    old = entry.bound
    plan = planner.plan(A, B, reuse=want, deterministic=deterministic)
    if (plan.kernel, plan.params) == (old.plan.kernel, old.plan.params):
        cache.replace(entry, BoundPlan(plan, old.prepared), entry.reference)
    elif entry.reference is not None:            # A equals the entry's copy: prepare from the copy
        cache.replace(entry, plan.bind(entry.reference), entry.reference)
    else:
        bound, reference = _prepare(plan, A)
        cache.replace(entry, bound, reference)
        cache.claim(entry, key, _pins(key, reference, A))


def _wanted_reuse(entry, reuse):
    """The reuse to re-plan ``entry`` with, or None to keep its plan."""
    planned = entry.bound.plan.reuse
    if reuse is not None:
        return reuse if reuse != planned else None
    if entry.calls < entry.next_replan:
        return None
    entry.next_replan = entry.calls * REPLAN_FACTOR
    return entry.calls if larger_reuse_may_change(entry.bound.plan) else None


def larger_reuse_may_change(plan) -> bool:
    """Whether a larger reuse could change the choice: only a costlier conversion can start to win.

    Candidate totals are run + prepare/reuse; as reuse grows, one with a conversion no
    dearer than the chosen one's gains no more than the chosen one, so it stays behind.
    """
    chosen = next((c for c in plan.candidates if c.kernel == plan.kernel and c.params == plan.params), None)
    if chosen is None:
        return True
    return any(c.source != "rejected" and c.prepare_s > chosen.prepare_s for c in plan.candidates)


def _private_copy(A):
    """A copy the cache owns: the caller may later change its own A in place."""
    return A.copy() if hasattr(A, "indptr") else A.copy(order="K")


def _load_kernels_once() -> None:
    """Import the kernel modules under a lock before threads plan concurrently."""
    global _ready
    if not _ready:
        with _ready_lock:
            if not _ready:
                from ..kernels import all_kernels
                all_kernels()
                _ready = True


__all__ = ["matmul", "run", "busy", "check_args", "REPLAN_FACTOR", "larger_reuse_may_change"]
