"""Route other libraries' sparse products through ``matplan.matmul`` without editing their code.

    with matplan.dispatch.route_sparse_matmul():
        y = A @ x                                  # A: SciPy or cupyx CSR -> matplan.matmul(A, x)
        x, info = scipy.sparse.linalg.cg(A, b)     # SciPy's own A.dot(p) inside cg is routed too

The protocol, modelled on ``scipy.fft``'s ``set_backend`` / ``skip_backend``:

* Targets: the methods ``METHODS`` (``__matmul__``, ``dot``) of the classes ``targets()``
  returns (SciPy's ``csr_matrix`` and ``csr_array``; cupyx's ``csr_matrix``
  when CuPy sees a GPU). ``A * x`` on ``spmatrix``, ``x @ A`` and other formats
  are not routed.
* Install / restore: opening the first block in the process replaces those
  methods on the classes with routers; closing the last one puts the originals
  back exactly (an inherited method is un-shadowed, an own one re-set), in a
  ``finally``, so an exception raised inside the block restores them too.
* Decision, per call: a router consults the innermost open block *of the calling
  thread*. Without one, inside ``skip_routing()``, inside matplan itself (a kernel
  calling ``A @ x``) or when the caller's module is part of matplan, the original
  method runs. Otherwise the operands are validated as ``matplan.matmul`` would;
  operands matplan does not take (integer or complex dtypes, scalars, NumPy
  matrix subclasses, host/GPU mixes, ...) fall through to the original, as a
  scipy.fft backend returning ``NotImplemented`` does, unless the block was
  opened with ``only=True``: then matplan's error is raised (scalars still fall
  through: scaling is not a product).
* Nesting: blocks nest; the innermost one's options (``reuse``,
  ``deterministic``, ``only``, ``assume_unchanged``) apply, and ``skip_routing()`` inside a block turns
  routing off until it closes (a block opened inside it turns it on again).
* Threads: routing is per thread. A block in one thread does not route another
  thread's products, although while any block is open the class attributes are
  patched process-wide, so other threads pass through a router that falls
  through at once (about a microsecond).

Every routed product pays ``matplan.matmul``'s check of A (the identity fast path
when A is the same object as before, else a fingerprint reading A's bytes once);
loops over one A do better with ``plan.as_linear_operator(A)``.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import warnings
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ..core.validation import normalize
from ..core.xp import cupy_module, cupyx_sparse
from .auto import busy, check_args, run

#: Methods replaced on each target class.
METHODS = ("__matmul__", "dot")
_MISSING = object()


def targets() -> list:
    """The classes whose products are routed (cupyx's only when CuPy sees a GPU)."""
    classes = [sp.csr_matrix, sp.csr_array]
    if cupy_module() is not None:
        classes.append(cupyx_sparse().csr_matrix)
    return classes


class _Options(NamedTuple):
    reuse: object
    deterministic: bool
    only: bool
    assume_unchanged: object = None


_install_lock = threading.Lock()
_open_blocks = 0
_saved: list = []          # (cls, name, own attribute or _MISSING, router)
_local = threading.local()


def _stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@contextlib.contextmanager
def route_sparse_matmul(*, reuse=None, deterministic=False, only=False, assume_unchanged=None):
    """Inside the block, this thread's CSR ``A @ B`` and ``A.dot(B)`` run ``matplan.matmul``.

    reuse, deterministic, assume_unchanged: passed to ``matplan.matmul`` for every routed
        product (assume_unchanged=True: the routed code does not write A in place, e.g. a
        solver loop; a hit on a copied format then skips its comparison with A).
    only: raise matplan's error for operands it does not take instead of falling
        through to the library's own product.
    See the module docstring for the full protocol.
    """
    check_args(reuse, deterministic, assume_unchanged)
    if not isinstance(only, bool):
        raise TypeError(f"only: expected True or False, got {only!r}")
    with _pushed(_Options(reuse, deterministic, only, assume_unchanged)):
        yield


@contextlib.contextmanager
def skip_routing():
    """Inside the block, this thread's products use the libraries' own implementations."""
    with _pushed(None):
        yield


@contextlib.contextmanager
def _pushed(options):
    _install()
    stack = _stack()
    stack.append(options)
    try:
        yield
    finally:
        stack.pop()
        _uninstall()


def is_routing() -> bool:
    """Whether products in this thread are routed right now."""
    stack = _stack()
    return bool(stack) and stack[-1] is not None


def _install() -> None:
    global _open_blocks
    with _install_lock:
        if _open_blocks == 0:
            try:
                for cls in targets():
                    for name in METHODS:
                        own = cls.__dict__.get(name, _MISSING)
                        router = _router(getattr(cls, name))
                        setattr(cls, name, router)
                        _saved.append((cls, name, own, router))
            except BaseException:
                _restore()
                raise
        _open_blocks += 1


def _uninstall() -> None:
    global _open_blocks
    with _install_lock:
        _open_blocks -= 1
        if _open_blocks == 0:
            _restore()


def _restore() -> None:
    while _saved:
        cls, name, own, router = _saved.pop()
        if cls.__dict__.get(name) is not router:
            warnings.warn(f"matplan routing: {cls.__qualname__}.{name} was replaced by someone else while "
                          "routed; leaving their version in place", RuntimeWarning, stacklevel=4)
            continue
        if own is _MISSING:
            delattr(cls, name)
        else:
            setattr(cls, name, own)


def _router(original):
    @functools.wraps(original)
    def router(self, other):
        stack = getattr(_local, "stack", None)
        options = stack[-1] if stack else None
        if options is not None and not busy() and not _from_matplan(sys._getframe(1)):
            result = _route(self, other, options)
            if result is not NotImplemented:
                return result
        return original(self, other)
    router.__matplan_router__ = True
    return router


def _from_matplan(frame) -> bool:
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "matplan" or name.startswith("matplan.")


def _route(A, other, options):
    if np.isscalar(other) or getattr(other, "ndim", None) == 0:
        return NotImplemented
    if isinstance(other, np.ndarray) and type(other) is not np.ndarray:
        if options.only:
            raise TypeError(f"B: {type(other).__name__} (an ndarray subclass) is not routed through matplan; "
                            "pass numpy.asarray(B)")
        return NotImplemented
    try:
        problem = normalize(A, other)
    except (TypeError, ValueError):
        if options.only:
            raise
        return NotImplemented
    return run(problem, options.reuse, options.deterministic, options.assume_unchanged)


__all__ = ["route_sparse_matmul", "skip_routing", "is_routing", "targets", "METHODS"]
