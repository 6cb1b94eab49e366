"""Where arrays live: optional CuPy, host/GPU detection, moving data for checks."""
from __future__ import annotations

import functools
import types

import numpy as np

#: Where the prebuilt statistics kernel is not available (``core.figures``: no binary for the GPU
#: and no NVRTC), sparse operands on the GPU with at most this many stored entries have their
#: statistics and structure checks computed on the host, from one copy of their index arrays (~1 ms
#: at the bound): CuPy's elementwise and reduction kernels compile on a process's first use, ~40 of
#: them for a first plan (16-19 s on an H100 host with an empty CuPy cache), NumPy's need nothing.
#: Larger operands then stay on the GPU (``matplan warmup`` compiles CuPy's kernels they use).
HOST_STATS_NNZ = 1 << 21


@functools.lru_cache(maxsize=None)
def cupy_module():
    """CuPy if it imports and sees a GPU, else None (cached per process)."""
    return None if why_no_gpu() else _cupy


_cupy = None


@functools.lru_cache(maxsize=None)
def why_no_gpu() -> str | None:
    """Why matplan runs on the host here, in one line for a user; None when CuPy sees a GPU."""
    global _cupy
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed: pip install 'matplan[cuda]'"
    except Exception as exc:  # noqa: BLE001  a broken install: say what it raised
        return f"CuPy failed to import ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001  no driver, or a driver too old for CuPy's CUDA
        return f"CuPy found no usable NVIDIA driver ({type(exc).__name__}: {exc})"
    if count < 1:
        return "CuPy found no NVIDIA GPU"
    _cupy = cupy
    return None


@functools.lru_cache(maxsize=None)
def cupyx_sparse():
    """cupyx.scipy.sparse, imported once, or None without CuPy and a GPU (an import statement in a
    function goes through cupyx.scipy's lazy ``__getattr__``: several microseconds a call)."""
    if cupy_module() is None:
        return None
    import cupyx.scipy.sparse as csp
    return csp


def gpu_available() -> bool:
    return cupy_module() is not None


def is_gpu_array(x) -> bool:
    """True for CuPy arrays, cupyx sparse matrices and __cuda_array_interface__ objects."""
    cp = cupy_module()
    if cp is None:
        return False
    if isinstance(x, cp.ndarray):
        return True
    return cupyx_sparse().issparse(x) or hasattr(x, "__cuda_array_interface__")


def array_module(x):
    """numpy or cupy, for the device where ``x`` lives."""
    return cupy_module() if is_gpu_array(x) else np


def host_index_arrays(M):
    """CSR ``M``'s shape, indptr and indices on the host (its values stay where they are), where
    M is on the GPU with at most HOST_STATS_NNZ entries; None otherwise."""
    if not is_gpu_array(M) or not hasattr(M, "indptr") or M.indices.shape[0] > HOST_STATS_NNZ:
        return None
    return types.SimpleNamespace(shape=M.shape, indptr=M.indptr.get(), indices=M.indices.get())


def to_host(x):
    """NumPy array / SciPy sparse copy of ``x`` wherever it lives."""
    if is_gpu_array(x):
        return x.get()
    return x
