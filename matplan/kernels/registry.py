"""The kernel registry: every kernel registers once; the planner asks it by op and backend."""
from __future__ import annotations

import importlib
import operator
import threading

from .base import BACKENDS, OPS, Kernel

#: Family packages of this package and the ops their kernels serve: a family is imported on the
#: first question about one of its ops or kernels (its kernels register on import), so planning
#: an SpMV never loads the SpGEMM code. Add a new family here.
BUILTIN_FAMILIES = {"cpu": OPS, "spmv": ("spmv", "spmm"), "tsgemm": ("tsgemm", "gemm"),
                    "spgemm": ("spgemm",), "sptrans": ("sptrans",)}
BUILTIN_MODULES = list(BUILTIN_FAMILIES)
#: The family of a kernel name's prefix where it differs from the prefix ("gemm.cublas").
_FAMILY_OF_PREFIX = {"gemm": "tsgemm"}

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
    prefix = str(name).split(".")[0]
    family = _FAMILY_OF_PREFIX.get(prefix, prefix)
    if name not in _REGISTRY:
        _load(family if family in BUILTIN_FAMILIES else None)
    if name not in _REGISTRY:
        _load(None)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"kernel {name!r} is not registered; known: {sorted(_REGISTRY)}") from None


def kernels_for(op: str, backend: str | None = None) -> list[Kernel]:
    """Registered kernels for ``op`` (and ``backend``), sorted by name for stable plans; the sorted
    list is kept per (op, backend) while the registry holds the same kernel objects (every plan
    asks; tests and calibration replace entries of ``_REGISTRY`` directly)."""
    for family, ops in BUILTIN_FAMILIES.items():
        if op in ops and family not in _LOADED:
            _load(family)
    now = tuple(_REGISTRY.values())
    kept = _SORTED.get((op, backend))
    if kept is None or len(kept[0]) != len(now) or not all(map(operator.is_, kept[0], now)):
        serve = [k for k in now if op in k.ops and (backend is None or k.backend == backend)]
        kept = _SORTED[(op, backend)] = (now, sorted(serve, key=lambda k: k.name))
    return list(kept[1])


_SORTED: dict = {}   # (op, backend) -> (the registry's kernels when sorted, the sorted list)


def all_kernels() -> list[Kernel]:
    _load(None)
    return sorted(_REGISTRY.values(), key=lambda k: k.name)


def family(name: str):
    """The family package ``name`` (a key of BUILTIN_FAMILIES), imported (and registered) once."""
    if name not in BUILTIN_FAMILIES:
        raise ValueError(f"family: expected one of {sorted(BUILTIN_FAMILIES)}, got {name!r}")
    _load(name)
    return importlib.import_module(f"{__package__}.{name}")


_LOADED: set = set()
_LOAD_LOCK = threading.Lock()


def _load(name: str | None) -> None:
    """Import the built-in family ``name`` (every family: None) once, thread-safely; a family
    counts as loaded only after its import finished, so a thread never sees it half-registered."""
    names = list(BUILTIN_FAMILIES) if name is None else [name]
    if all(n in _LOADED for n in names):
        return
    with _LOAD_LOCK:
        for n in names:
            if n not in _LOADED:
                importlib.import_module(f"{__package__}.{n}")
                _LOADED.add(n)
