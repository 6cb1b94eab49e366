"""The kernel registry: every kernel registers once; the planner asks it by op and backend."""
from __future__ import annotations

import importlib
import threading

from .base import BACKENDS, OPS, Kernel

#: Family modules of this package imported on first use of the registry. Add a new family here.
BUILTIN_MODULES = ["cpu", "spmv", "tsgemm", "spgemm", "sptrans"]

_REGISTRY: dict[str, Kernel] = {}


def register(kernel: Kernel) -> Kernel:
    """Add ``kernel`` (an instance); names are unique."""
    if not kernel.name or not kernel.ops or kernel.backend not in BACKENDS:
        raise ValueError(f"register: kernel {kernel!r} needs a name, ops and a backend in {BACKENDS}")
    bad = [op for op in kernel.ops if op not in OPS]
    if bad:
        raise ValueError(f"register: kernel {kernel.name!r} has unknown ops {bad}; expected a subset of {OPS}")
    if kernel.name in _REGISTRY and type(_REGISTRY[kernel.name]) is not type(kernel):
        raise ValueError(f"register: a kernel named {kernel.name!r} is already registered")
    _REGISTRY[kernel.name] = kernel
    return kernel


def get(name: str) -> Kernel:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"kernel {name!r} is not registered; known: {sorted(_REGISTRY)}") from None


def kernels_for(op: str, backend: str | None = None) -> list[Kernel]:
    """Registered kernels for ``op`` (and ``backend``), sorted by name for stable plans."""
    _load_builtin()
    return sorted((k for k in _REGISTRY.values()
                   if op in k.ops and (backend is None or k.backend == backend)),
                  key=lambda k: k.name)


def all_kernels() -> list[Kernel]:
    _load_builtin()
    return sorted(_REGISTRY.values(), key=lambda k: k.name)


_LOADED = False
_LOAD_LOCK = threading.Lock()


def _load_builtin() -> None:
    """Import the built-in kernel modules (each registers itself on import), once, thread-safely.

    The flag is set only after every module is imported, so a thread never sees a
    half-filled registry.
    """
    global _LOADED
    if _LOADED:
        return
    with _LOAD_LOCK:
        if _LOADED:
            return
        for mod in BUILTIN_MODULES:
            importlib.import_module(f"{__package__}.{mod}")
        _LOADED = True
