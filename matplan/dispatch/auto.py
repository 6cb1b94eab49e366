"""``matplan.matmul(A, B)``: plan and run in one call, reusing plans from the plan cache.

Per call, first the identity fast path: the same A and B objects as an earlier
call (by identity key), and either a format that is A's own arrays or A equal
to the entry's private copy bit for bit (or, with ``assume_unchanged``, the
caller's promise that A was not written in place); then the kernel runs on the
prepared A and B with no validation, fingerprint, statistics or choice. Otherwise the full
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

``out`` and ``check`` follow :mod:`matplan.core.validation`'s rules, as ``Plan.run`` does:
``out`` is checked once per call here (shape, dtype, side, no overlap with A or B); A's CSR
structure is checked when a plan is made (a miss) and when a hit on the host binds the cached
plan to a new A, and not on other hits, whose A equals a checked one (bit for bit, or by the
GPU's full digests). ``check=False`` skips it.

``assume_unchanged`` trades the check of a hit on a copied format for a promise.
By default (False) a hit on a format made from the entry's copy of A (ELL-R, BRC,
BRCP, merge-path CSR: any kernel without ``reads_a_at_run``) compares A bit for bit
with that copy, which reads A and the copy (about as much as the SpMV itself: 92 /
161 us at 8M / 16M nonzeros on an H100), so nothing stale can come back; matmul plans
with that comparison added to such formats' run cost (``identity.hit_check``), so it
picks one only where it still wins after paying for the check. True
says A's arrays are not written in place between calls (replacing them, as
``A.data = new`` does, is still seen): the hit skips the comparison and costs a
few microseconds. A broken promise returns the product with A's old values.
None (default) takes the setting of this thread's cache for A's device
(``PlanCache.set_assume_unchanged``), which is False unless set; formats that
are A's own arrays never need the promise.
"""
from __future__ import annotations

import threading

from ..core.validation import check_int, check_result_out, normalize
from ..core.xp import cupy_module
from ..kernels import all_kernels
from ..planner import BoundPlan
from ..planner import plan as make_plan
from .cache import cache_for, nbytes_of
from .fingerprint import device_of, fingerprint, same_content
from .identity import (aliases, aliasing_kernel, hit_check, identity_key, pins, start_compare,
                       start_product_check)

#: Re-plan a cached entry when its calls reach this multiple of the reuse it was planned for.
REPLAN_FACTOR = 8

_state = threading.local()
_ready_lock = threading.Lock()
_ready = False


def check_args(reuse, deterministic, assume_unchanged=None) -> None:
    if assume_unchanged is not None and not isinstance(assume_unchanged, bool):
        raise TypeError(f"assume_unchanged: expected None (the plan cache's setting), True or False, "
                        f"got {assume_unchanged!r}")
    if reuse is not None:
        check_int(reuse, "reuse", "None (estimated from the plan cache) or a positive integer "
                  "(applications of the plan to the same A)")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected True or False, got {deterministic!r}")


def matmul(A, B, *, out=None, reuse=None, deterministic=False, assume_unchanged=None, check=True):
    """C = A @ B, planned once per distinct A and reused from this thread's plan cache.

    A, B: as for ``planner.plan`` (SciPy/cupyx sparse, NumPy/CuPy arrays, ...); C has NumPy's
        dtype and shape for them (a vector B gives a vector C).
    out: None, or an array of exactly C's shape and dtype on A's side, sharing no memory with
        A or B (``matplan.core.validation.check_out``); C is written into it and it is returned.
    reuse: None estimates it from the cache's history (see the module docstring); an
        int is passed to the planner.
    deterministic: admit only bitwise-reproducible kernels; part of the cache key.
    assume_unchanged: True promises that A's arrays (and a sparse B's) are not written
        in place between calls, so a hit on a format made from a copy of A (ELL-R, BRC,
        BRCP, merge-path CSR) skips its bit-for-bit comparison with A; None takes the
        cache's setting (False unless ``PlanCache.set_assume_unchanged(True)``). See the
        module docstring.
    check: check A's CSR structure when a plan is made for it (see the module docstring);
        False skips it for arrays you vouch for.

    By default a changed A (values or structure, in place or not) is never served a
    stale prepared format: see ``dispatch.fingerprint`` for what a hit checks. For a
    loop over one A known not to change, ``planner.plan(A, B, reuse=n).bind(A)``
    avoids even the identity check.
    """
    if not ((reuse is None or type(reuse) is int and reuse >= 1) and (deterministic is False or deterministic is True)
            and (assume_unchanged is None or assume_unchanged is True or assume_unchanged is False)
            and (check is True or check is False)):      # the common arguments pass on identity tests
        check_args(reuse, deterministic, assume_unchanged)
        if reuse is not None:
            reuse = int(reuse)
        if not isinstance(check, bool):
            raise TypeError(f"check: expected True or False, got {check!r}")
    return _dispatch(A, B, reuse, deterministic, None, assume_unchanged, out, check)


def busy() -> bool:
    """Whether this thread is inside matplan.matmul (routed products then fall through)."""
    return getattr(_state, "depth", 0) > 0


def run(problem, reuse=None, deterministic=False, assume_unchanged=None):
    """matmul on an already validated Problem (the routing hook enters here)."""
    return _dispatch(problem.A, problem.B, reuse, deterministic, problem, assume_unchanged)


_MISS = object()


def _dispatch(A, B, reuse, deterministic, problem, assume_unchanged, out=None, check=True):
    """The identity fast path (no validation, no fingerprint) when it applies, else the full path."""
    found = identity_key(A, B, deterministic)
    if found is not None:
        if out is not None:   # exact array / CSR types of one dtype (identity_key): no normalize needed
            _check_out(out, _op_of(A, B), found[0] != "cpu", A.dtype, A, B)
        C = _identity_hit(found[0], found[1], A, B, reuse, deterministic, assume_unchanged, out)
        if C is not _MISS:
            return C
    if problem is None:
        problem = normalize(A, B)
        if out is not None and found is None:
            _check_out(out, problem.op, problem.backend == "gpu", problem.dtype, problem.A, problem.B)
    key = found[1] if found is not None and problem.A is A and problem.B is B else None
    _load_kernels_once()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        if problem.backend == "gpu":
            cp = cupy_module()
            dev = device_of(problem.A)
            if dev != cp.cuda.runtime.getDevice():      # run where A lives
                with cp.cuda.Device(dev):
                    return _run(problem, reuse, deterministic, key, assume_unchanged, out, check)
        return _run(problem, reuse, deterministic, key, assume_unchanged, out, check)
    finally:
        _state.depth -= 1


def _op_of(A, B) -> str:
    """The op of exact CSR / array operands, as far as ``out`` cares (a sparse result or a sparse A)."""
    return "spgemm" if hasattr(B, "indptr") else "spmm" if hasattr(A, "indptr") else "gemm"


def _check_out(out, op, gpu, dtype, A, B) -> None:
    shape = None if hasattr(B, "indptr") else (A.shape[0],) if B.ndim == 1 else (A.shape[0], B.shape[1])
    check_result_out(out, op, "gpu" if gpu else "cpu", dtype, shape, B, A)


def _apply(entry, B, out):
    """The cached kernel on B (validated for the entry's fingerprint), into ``out`` (checked) if given."""
    return entry.run_prepared(entry.prepared, B) if out is None else entry.run_prepared(entry.prepared, B, out=out)


def _identity_hit(device, key, A, B, reuse, deterministic, assume_unchanged, out=None):
    """C from the entry registered under identity ``key`` once A is known to be unchanged, else _MISS.

    A and B are as ``normalize`` would return them (the key says so). A format that is A's
    own arrays needs no check, nor one the caller vouches for (``assume_unchanged``) once
    the entry pins the key's objects; otherwise A is compared bit for bit with the entry's
    copy (on the GPU the kernel is launched behind the comparison on the same stream and its
    result dropped if A differs, so the check costs no extra round trip before the launch).
    A SpGEMM kernel with a products limit counts the operands' products first (identity.py);
    on the GPU the product runs behind the count and is dropped if the count passes the limit
    (cupyx's SpGEMM waits for the GPU to size C, so reading the count then costs no extra wait).

    Every hit runs this: the unchecked case (the first branch) reads the entry's fields once
    and calls only the kernel before its launch; the bookkeeping after it (counting the hit, the
    re-plan test) overlaps an asynchronous kernel's run on the GPU.
    """
    cache = cache_for(device)
    entry = cache.find(key)
    if entry is None:
        return _MISS
    trusted = cache.assume_unchanged if assume_unchanged is None else assume_unchanged
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        unchecked = entry.reference is None or (trusted and entry.pins is not None)
        if unchecked and (entry.limit is None or trusted and entry.pins is not None):
            C = entry.run_prepared(entry.prepared, B) if out is None else entry.run_prepared(entry.prepared, B, out=out)
        else:
            C = _checked_hit(entry, device, A, B, out, trusted)
            if C is _MISS:
                return _MISS
        if trusted and entry.pins is None:          # A just compared equal: trust its ids from now on
            cache.claim(entry, key, pins(A, B))
        cache.count_hit(entry)
        if reuse is None and entry.calls < entry.next_replan or reuse == entry.planned:
            return C                                # no re-plan due (_wanted_reuse's first tests)
        _maybe_replan(cache, entry, A, B, reuse, deterministic, key, trusted)
        return C
    finally:
        _state.depth = depth


def _checked_hit(entry, device, A, B, out, trusted):
    """C for a hit that checks its operands first (a products limit, or a copied format without
    the caller's promise), or _MISS when the check fails."""
    check = None
    if entry.limit is not None and not (trusted and entry.pins is not None):
        check = start_product_check(entry.limit, A, B, device)
    if check is not None:                       # a vendor SpGEMM (aliases A and B) with a limit
        try:
            C = _apply(entry, B, out)
        except Exception:
            if not check.ok():                  # past its limit the vendor routine may raise
                return _MISS
            raise
        return C if check.ok() else _MISS
    if device == "cpu":
        return _apply(entry, B, out) if same_content(A, entry.reference) else _MISS
    pending = start_compare(A, entry.reference, device)
    if pending is None:
        return _MISS
    C = _apply(entry, B, out)
    return C if pending.same() else _MISS


def _run(problem, reuse, deterministic, key, assume_unchanged, out=None, check=True):
    """The full path: fingerprint, lookup (confirmed on the host), plan on a miss (checking A's
    structure unless ``check`` is False)."""
    A, B = problem.A, problem.B
    fp = fingerprint(problem, deterministic)
    cache = cache_for(fp.device)
    trusted = cache.assume_unchanged if assume_unchanged is None else assume_unchanged
    host = problem.backend == "cpu"
    entry = cache.lookup(fp, (lambda ref: same_content(A, ref)) if host else None)
    if entry is None:
        want = reuse if reuse is not None else cache.estimate_reuse(fp)
        plan = _plan(A, problem.B, want, deterministic, trusted, check)
        if not cache.fits(nbytes_of(A)):
            cache.decline(fp)
            return plan.bind(A, check=False)(problem.B, out=out)
        bound, reference = _prepare(plan, A)
        cache.insert(fp, bound, plan.reuse * REPLAN_FACTOR, reference, key, _pins(key, reference, A, B, trusted))
        return bound(problem.B, out=out)
    if entry.reference is None and (key is not None or not aliases(entry.bound.prepared, A)):
        # the format aliases another object: A's arrays instead (checked on the host, where the hit
        # rests on sampled digests; the GPU's full digests say A's structure is the checked one's)
        bound = entry.bound.plan.bind(A, check=check and host)
        if not aliases(bound.prepared, A):       # (converted on the way: right for this call only)
            return bound(problem.B, out=out)
        cache.replace(entry, bound, None, replan=False)
        cache.claim(entry, key, _pins(key, None, A, B, trusted))
    elif entry.reference is not None and key is not None:
        cache.claim(entry, key, _pins(key, entry.reference, A, B, trusted))
    _maybe_replan(cache, entry, A, problem.B, reuse, deterministic, key, trusted)
    return _apply(entry, problem.B, out)


def _plan(A, B, reuse, deterministic, trusted, check=False):
    """planner.plan, charging each format copied from A the comparison its GPU hits will make
    (unless the caller vouches for A), so such a format wins only if it still wins after it.
    ``check``: check A's structure (a miss; a re-plan's A equals a checked one)."""
    return make_plan(A, B, reuse=reuse, deterministic=deterministic,
                     per_call=None if trusted else hit_check, check=check)


def _prepare(plan, A):
    """(BoundPlan, private copy of A or None): the chosen format on A's own arrays when the
    kernel aliases them (it cannot go stale), else on a copy the cache owns (A may change later).
    A was checked when planned (or the caller vouched for it): bind checks nothing again."""
    if aliasing_kernel(plan.kernel):
        bound = plan.bind(A, check=False)
        if aliases(bound.prepared, A):
            return bound, None
    copy = _private_copy(A)
    return plan.bind(copy, check=False), copy


def _pins(key, reference, A, B, trusted):
    """What an entry registered under ``key`` keeps alive: the key's objects (A's, a sparse B's) when
    its format aliases A or the caller vouches for A (``assume_unchanged``); else nothing (the
    entry's copy of A is compared on each hit, so a reused id cannot be served stale)."""
    return pins(A, B) if key is not None and (reference is None or trusted) else None


def _maybe_replan(cache, entry, A, B, reuse, deterministic, key, trusted=False) -> None:
    """Re-plan ``entry`` when its calls or the caller's ``reuse`` ask for it (see the module docstring).

    A is the object registered under identity ``key`` (or None) if the entry has one.
    """
    want = _wanted_reuse(entry, reuse)
    if want is None:
        return
    old = entry.bound
    plan = _plan(A, B, want, deterministic, trusted)
    if (plan.kernel, plan.params) == (old.plan.kernel, old.plan.params):
        cache.replace(entry, BoundPlan(plan, old.prepared), entry.reference)
    elif entry.reference is not None:            # A equals the entry's copy: prepare from the copy
        cache.replace(entry, plan.bind(entry.reference, check=False), entry.reference)
    else:
        bound, reference = _prepare(plan, A)
        cache.replace(entry, bound, reference)
        cache.claim(entry, key, _pins(key, reference, A, B, trusted))


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
                all_kernels()
                _ready = True


__all__ = ["matmul", "run", "busy", "check_args", "REPLAN_FACTOR", "larger_reuse_may_change"]
