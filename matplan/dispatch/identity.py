"""The identity fast path of a plan-cache hit: the same arrays as the call before, no digest.

What a call checks before it may skip validation and the fingerprint (see
``fingerprint.py`` for the whole argument):

* :func:`identity_key`: A is exactly a CSR matrix class (SciPy ``csr_matrix`` /
  ``csr_array``, cupyx ``csr_matrix``) or exactly a NumPy/CuPy ndarray, B exactly
  an ndarray of the same kind and dtype. The key holds ``id`` of A and of each of
  its arrays with their shape, strides and dtype, B's type and shape, the
  ``deterministic`` flag and the library versions: for such operands
  ``validation.normalize`` returns (A, B) unchanged, so a matching key stands for
  the same validated problem.
* ``Kernel.reads_a_at_run`` / :func:`aliases`: a cached format that *is* A's own
  arrays (the kernel reads them on every run, nothing derived from their content
  is kept) cannot go stale: an in-place write to A's values, indices or indptr
  is read by the next run. Such an entry pins the objects its key names, so
  their ids cannot be reused by other objects while the key is registered.
* Every other format was prepared from the entry's private copy of A, and a hit
  needs A equal to that copy bit for bit: on the host :func:`fingerprint.same_content`,
  on the GPU one launch of ``matplan_differs`` (fingerprint.cu) and an 8-byte
  copy of its flag into pinned host memory (:func:`start_compare`).
"""
from __future__ import annotations

import functools
import itertools
import threading

import numpy as np

from .._xp import cupy_module
from . import fingerprint as fp_mod
from .fingerprint import GPU_BLOCK, _CU_FILE, _max_blocks


@functools.lru_cache(maxsize=None)
def _kinds() -> dict:
    """type -> (sparse?, backend) for the exact types the fast path takes."""
    import scipy.sparse as sp
    kinds = {np.ndarray: (False, "cpu"), sp.csr_matrix: (True, "cpu"), sp.csr_array: (True, "cpu")}
    cp = cupy_module()
    if cp is not None:
        import cupyx.scipy.sparse as csp
        kinds.update({cp.ndarray: (False, "gpu"), csp.csr_matrix: (True, "gpu")})
    return kinds


def identity_key(A, B, deterministic):
    """(cache device, key) for the identity fast path, or None when (A, B) do not qualify."""
    kinds = _kinds()
    ka, kb = kinds.get(type(A)), kinds.get(type(B))
    if ka is None or kb is None or kb[0] or ka[1] != kb[1] or A.dtype != B.dtype:
        return None
    if ka[0]:
        d, i, p = A.data, A.indices, A.indptr
        arrays = (id(d), d.shape, d.strides, id(i), i.shape, i.strides, i.dtype,
                  id(p), p.shape, p.strides, p.dtype)
    else:
        arrays = (A.strides,)
    key = (id(A), type(A), A.shape, A.dtype, type(B), B.shape, deterministic, fp_mod.versions(), arrays)
    return ("cpu" if ka[1] == "cpu" else cupy_module().cuda.runtime.getDevice()), key


def pins(A) -> tuple:
    """The objects an aliasing entry's key names by id (kept alive while the key is registered)."""
    return (A, A.data, A.indices, A.indptr) if hasattr(A, "indptr") else (A,)


def aliasing_kernel(name: str) -> bool:
    """Whether kernel ``name`` declares ``reads_a_at_run``: its prepared format is A's own arrays,
    read on every run (only A's shape, dtype and strides matter, which the identity key covers)."""
    from ..kernels import get
    try:
        return bool(get(name).reads_a_at_run)
    except KeyError:
        return False


def aliases(prepared, A) -> bool:
    """Whether ``prepared`` is A's own arrays (a format that cannot go stale; see the module docstring)."""
    if not aliasing_kernel(prepared.kernel):
        return False
    from .cache import buffer_key, leaves
    own = {buffer_key(a) for a in leaves(A)}
    held = [buffer_key(a) for a in leaves(prepared)]
    return bool(held) and all(k in own for k in held)


# -- GPU: fused bitwise comparison ------------------------------------------------------------
class _Probe:
    """Per thread and device: the flag word on the GPU, its pinned host mirror, an event."""

    def __init__(self, cp):
        self.flag = cp.zeros(1, dtype=cp.int64)
        import cupyx
        self.host = cupyx.empty_pinned(1, dtype=np.int64)       # the D2H copy below is truly async
        self.host_ptr = self.host.ctypes.data
        self.event = cp.cuda.Event(block=False, disable_timing=True)
        self.fn = _compare_kernel(cp.cuda.runtime.getDevice())
        self.grid_cap = _max_blocks(cp.cuda.runtime.getDevice())


_probes = threading.local()
_tokens = itertools.count(1)


def _probe(cp, device) -> _Probe:
    probes = getattr(_probes, "by_device", None)
    if probes is None:
        probes = _probes.by_device = {}
    probe = probes.get(device)
    if probe is None:
        probe = probes[device] = _Probe(cp)
    return probe


class Pending:
    """A comparison in flight on the current stream; :meth:`same` waits for its flag only."""
    __slots__ = ("probe", "token")

    def __init__(self, probe, token):
        self.probe, self.token = probe, token

    def same(self) -> bool:
        self.probe.event.synchronize()
        return int(self.probe.host[0]) != self.token


def start_compare(A, reference, device):
    """Launch the bitwise comparison of CuPy A with ``reference`` (same type and shapes); a
    :class:`Pending`, or None when the arrays cannot be compared as flat bytes."""
    pairs = ((A.data, reference.data), (A.indices, reference.indices), (A.indptr, reference.indptr)) \
        if hasattr(A, "indptr") else ((A, reference),)
    args, longest = [], 0
    for a, r in pairs:
        if a.shape != r.shape or a.dtype != r.dtype or a.strides != r.strides \
                or not (a.flags.c_contiguous or a.flags.f_contiguous):
            return None
        args += (np.uint64(a.data.ptr), np.uint64(r.data.ptr), np.int64(a.nbytes))
        longest = max(longest, a.nbytes)
    args += (_NULL, _NULL, _NONE) * (3 - len(pairs))
    cp = cupy_module()
    probe = _probe(cp, device)
    token = next(_tokens)
    stream = cp.cuda.get_current_stream()
    grid = max(1, min(-(-longest // (16 * GPU_BLOCK)), probe.grid_cap))
    probe.fn((grid,), (GPU_BLOCK,), (*args, np.int64(token), probe.flag))
    cp.cuda.runtime.memcpyAsync(probe.host_ptr, probe.flag.data.ptr, 8,
                                cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
    probe.event.record(stream)
    return Pending(probe, token)


_NULL, _NONE = np.uint64(0), np.int64(0)


@functools.lru_cache(maxsize=None)
def _compare_kernel(device_id: int):
    from ..kernels import _cuda
    return _cuda.function(_CU_FILE, "matplan_differs", ())


__all__ = ["identity_key", "pins", "aliases", "aliasing_kernel", "start_compare", "Pending"]
