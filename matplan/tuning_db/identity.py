"""Who measured what: device identity records and content fingerprints of problems.

The device key hashes the fields that change timings (model, compute
capability, SMs, memory, driver/CUDA/CuPy versions; on the host the CPU model,
core count and NumPy/SciPy versions) but not the device index, so the GPUs of
one machine share a key. Fingerprints hash the operands' bytes, so a problem
is recognised whatever it is called and wherever it was built.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform

import numpy as np
import scipy
import scipy.sparse as sp

from ..core.xp import cupy_module, to_host
from ..core import device as device_mod
from ..models.learned import device_class
from .records import DeviceRecord


def _hash(*parts) -> str:
    return hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=16).hexdigest()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _host_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def device_record(backend: str) -> DeviceRecord:
    """The record of the device that runs ``backend`` kernels in this process (current CuPy device)."""
    spec = device_mod.current()
    if backend == "cpu":
        name = _cpu_name()
        fields = dict(backend="cpu", name=name, compute_capability="", sms=os.cpu_count() or 0,
                      memory_bytes=_host_memory(),
                      driver=f"numpy {np.__version__}, scipy {scipy.__version__}", cuda="", cupy="")
    elif backend == "gpu":
        cp = cupy_module()
        if cp is None:
            raise RuntimeError("device_record('gpu') needs CuPy and a GPU")
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        raw = props["name"]
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        fields = dict(backend="gpu", name=name, compute_capability=f"{props['major']}.{props['minor']}",
                      sms=int(props["multiProcessorCount"]), memory_bytes=int(props["totalGlobalMem"]),
                      driver=str(cp.cuda.runtime.driverGetVersion()),
                      cuda=str(cp.cuda.runtime.runtimeGetVersion()), cupy=cp.__version__)
    else:
        raise ValueError(f"backend: expected 'cpu' or 'gpu', got {backend!r}")
    key = _hash(sorted(fields.items()))
    return DeviceRecord(key=key, device_class=device_class(fields["name"], backend), spec=spec.to_dict(),
                        **fields)


def array_fingerprint(x) -> str:
    """Content hash of a dense array or sparse matrix (shape, dtype, layout and bytes)."""
    x = to_host(x)
    h = hashlib.blake2b(digest_size=16)
    if sp.issparse(x):
        x = x.tocsr()
        h.update(f"csr{x.shape}{x.dtype}{x.indices.dtype}".encode())
        for a in (x.indptr, x.indices, x.data):
            h.update(np.ascontiguousarray(a).tobytes())
    else:
        x = np.asarray(x)
        layout = "F" if x.ndim == 2 and x.flags.f_contiguous and not x.flags.c_contiguous else "C"
        h.update(f"dense{x.shape}{x.dtype}{layout}".encode())
        h.update(np.ascontiguousarray(x).tobytes())
    return h.hexdigest()


def problem_fingerprint(op: str, A, B) -> str:
    """Fingerprint of the product A @ B as the operation ``op``."""
    return _hash(op, array_fingerprint(A), array_fingerprint(B))


__all__ = ["device_record", "array_fingerprint", "problem_fingerprint"]
