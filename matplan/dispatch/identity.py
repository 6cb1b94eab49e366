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
* SpGEMM (both operands CSR): the key names B's objects too (the plan was chosen
  for B's structure). Both SpGEMM kernels read A and B on every run, so an
  in-place change of either is computed correctly; but cuSPARSE is only planned
  below a known products limit (``models.spgemm.VENDOR_LIMITS``), and such a
  change can move the product past it. A hit with such a kernel therefore checks
  the products of the operands as they are now: free when
  ``len(A.indices) * len(B.indices)`` is within the limit (no valid CSR change
  can exceed that), else one launch of ``matplan_products`` and a 16-byte copy
  into pinned memory (:func:`start_product_check`), with the product launched
  behind it and its result dropped when the count passes the limit. Past the
  limit: the full path, a re-plan.
* ``assume_unchanged`` (``matplan.matmul`` argument or ``PlanCache`` setting):
  the caller promises that A's (and a sparse B's) arrays are not written in
  place between calls. A hit on a copied format then skips the comparison (and
  a SpGEMM hit the products check) once the entry pins the key's objects: the
  first trusted hit still compares and then pins them, so an id can never pass
  to another object while trusted. A broken promise returns a stale product.
"""
from __future__ import annotations

import itertools
import threading

import numpy as np
import scipy.sparse as sp

from ..core.xp import cupy_module, cupyx_sparse
from ..kernels import _cuda, get
import matplan.dispatch.fingerprint as fp_mod   # versions() read through the module: tests patch it
from .cache import buffer_key, leaves, product_limit   # product_limit: re-exported (its home is cache.py)
from .fingerprint import GPU_BLOCK, _CU_FILE, _max_blocks


def _kinds() -> dict:
    """type -> (sparse?, backend) for the exact types the fast path takes (made once: _KINDS)."""
    kinds = {np.ndarray: (False, "cpu"), sp.csr_matrix: (True, "cpu"), sp.csr_array: (True, "cpu")}
    cp = cupy_module()
    if cp is not None:
        kinds.update({cp.ndarray: (False, "gpu"), cupyx_sparse().csr_matrix: (True, "gpu")})
        _GET_DEVICE[0] = cp.cuda.runtime.getDevice
    _KINDS.update(kinds)
    return _KINDS


_KINDS: dict = {}
_GET_DEVICE = [None]    # CuPy's cudaGetDevice binding, once a GPU kind is known


def identity_key(A, B, deterministic):
    """(cache device, key) for the identity fast path, or None when (A, B) do not qualify.

    B is a dense array (SpMV/SpMM/dense products: its type and shape are keyed) or, when A
    is CSR, a CSR matrix of the same kind (SpGEMM: B's objects are keyed like A's). Every hit
    runs this, so it reads each attribute once and calls nothing it can avoid (a CSR's dtype
    is its data's: SciPy's and cupyx's ``dtype`` property returns ``data.dtype``)."""
    kinds = _KINDS or _kinds()
    ka, kb = kinds.get(type(A)), kinds.get(type(B))
    if ka is None or kb is None or ka[1] != kb[1]:
        return None
    if ka[0]:
        d, i, p = A.data, A.indices, A.indptr
        dtype = d.dtype
        arrays = (id(d), d.shape, d.strides, id(i), i.shape, i.strides, i.dtype, id(p), p.shape, p.strides, p.dtype)
        if kb[0]:
            e, j, q = B.data, B.indices, B.indptr
            if e.dtype != dtype:
                return None
            b_ids = (id(B), (id(e), e.shape, e.strides, id(j), j.shape, j.strides, j.dtype,
                             id(q), q.shape, q.strides, q.dtype))
        else:
            if B.dtype != dtype:
                return None
            b_ids = ()
    else:
        dtype = A.dtype
        if kb[0] or B.dtype != dtype:
            return None
        arrays, b_ids = (A.strides,), ()
    key = (id(A), type(A), A.shape, dtype, type(B), B.shape, deterministic, fp_mod.versions(), arrays, b_ids)
    return ("cpu" if ka[1] == "cpu" else _GET_DEVICE[0]()), key


def pins(A, B=None) -> tuple:
    """The objects a key names by id (A's, and a sparse B's), kept alive while the key is registered."""
    objs = (A, A.data, A.indices, A.indptr) if hasattr(A, "indptr") else (A,)
    if B is not None and hasattr(B, "indptr"):
        objs += (B, B.data, B.indices, B.indptr)
    return objs


def within_product_limit(limit: int, A, B, device) -> bool:
    """Whether C = A @ B takes at most ``limit`` products with A's and B's arrays as they are now
    (waits for the count; :func:`start_product_check` lets work run meanwhile)."""
    return start_product_check(limit, A, B, device).ok()


class _Known:
    """A products check decided without the GPU."""
    __slots__ = ("value",)

    def __init__(self, value: bool):
        self.value = value

    def ok(self) -> bool:
        return self.value


class PendingCount:
    """A products count in flight on the current stream; :meth:`ok` waits for the count only."""
    __slots__ = ("probe", "limit")

    def __init__(self, probe, limit):
        self.probe, self.limit = probe, limit

    def ok(self) -> bool:
        self.probe.count_event.synchronize()
        return not self.probe.count_host[1] and int(self.probe.count_host[0]) <= self.limit


def start_product_check(limit: int, A, B, device):
    """Start checking that C = A @ B takes at most ``limit`` products; ``.ok()`` gives the answer.

    Decided at once when ``len(A.indices) * len(B.indices) <= limit`` (a bound no valid CSR A
    and B of these sizes can pass) and on the host (NumPy); else counted on the GPU by
    ``matplan_products`` (fingerprint.cu) on the current stream, read back into pinned memory,
    so a caller can launch the product behind it and read the count afterwards. An index
    outside B's rows counts as past the limit.
    """
    idx, ptr = A.indices, B.indptr
    if int(idx.shape[0]) * int(B.indices.shape[0]) <= limit:
        return _Known(True)
    if device == "cpu":
        j = idx.astype(np.int64, copy=False)
        if j.size and (j.min() < 0 or j.max() >= B.shape[0]):
            return _Known(False)
        lengths = np.maximum(np.diff(ptr.astype(np.int64, copy=False)), 0)
        return _Known(int(lengths[j].sum()) <= limit)
    if not (idx.flags.c_contiguous and ptr.flags.c_contiguous):
        return _Known(False)
    cp = cupy_module()
    probe = _probe(cp, device)
    stream = cp.cuda.get_current_stream()
    cp.cuda.runtime.memsetAsync(probe.count.data.ptr, 0, 16, stream.ptr)
    n = int(idx.shape[0])
    grid = max(1, min(-(-n // GPU_BLOCK), probe.grid_cap))
    probe.products_fn((grid,), (GPU_BLOCK,), (np.uint64(idx.data.ptr), np.int64(n), np.int32(idx.itemsize == 8),
                                              np.uint64(ptr.data.ptr), np.int64(B.shape[0]),
                                              np.int32(ptr.itemsize == 8), probe.count))
    cp.cuda.runtime.memcpyAsync(probe.count_host.ctypes.data, probe.count.data.ptr, 16,
                                cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
    probe.count_event.record(stream)
    return PendingCount(probe, limit)


def aliasing_kernel(name: str) -> bool:
    """Whether kernel ``name`` declares ``reads_a_at_run``: its prepared format is A's own arrays,
    read on every run (only A's shape, dtype and strides matter, which the identity key covers)."""
    try:
        return bool(get(name).reads_a_at_run)
    except KeyError:
        return False


#: A GPU hit on a format copied from A compares A with the entry's copy (reading both) before
#: its result is returned: fitted on an H100 (benchmarks/dispatch.py, hit minus kernel time):
#: 62 / 58 / 170 us for 20 / 46 / 400 MB compared, i.e. ~45 us fixed (comparison launch, flag
#: copy, event wait) plus the bytes at about the device's copy bandwidth (overlapped with the
#: kernel behind it).
HIT_CHECK_FIXED_S = 45e-6


def hit_check(kernel, f, device) -> tuple:
    """(seconds, reason) a GPU cache hit pays on top of ``kernel``'s run: the bit-for-bit
    comparison of A with the entry's copy when the kernel's format is a copy of A (nothing
    when it reads A's own arrays at run time). ``planner.plan(per_call=hit_check)``."""
    if kernel.reads_a_at_run or f.backend != "gpu":
        return 0.0, ""
    index = np.dtype(f.index_dtype or "int32").itemsize
    nbytes = 2 * (f.nnz * (np.dtype(f.dtype).itemsize + index) + (f.m + 1) * index)
    return (HIT_CHECK_FIXED_S + nbytes / device.mem_bandwidth,
            f"matmul's cache compares A with its copy on each hit ({nbytes / 1e6:.1f} MB read; "
            "assume_unchanged=True skips it)")


def aliases(prepared, A) -> bool:
    """Whether ``prepared`` is A's own arrays (a format that cannot go stale; see the module docstring)."""
    if not aliasing_kernel(prepared.kernel):
        return False
    own = {buffer_key(a) for a in leaves(A)}
    held = [buffer_key(a) for a in leaves(prepared)]
    return bool(held) and all(k in own for k in held)


# -- GPU: fused bitwise comparison ------------------------------------------------------------
class _Probe:
    """Per thread and device: the flag word on the GPU, its pinned host mirror, an event (and the
    same for the products count)."""

    def __init__(self, cp):
        self.flag = cp.zeros(1, dtype=cp.int64)
        import cupyx    # CuPy is optional: imported only where a GPU probe is made
        self.host = cupyx.empty_pinned(1, dtype=np.int64)       # the D2H copy below is truly async
        self.host_ptr = self.host.ctypes.data
        self.event = cp.cuda.Event(block=False, disable_timing=True)
        self.fn = _cuda.function(_CU_FILE, "matplan_differs", ())
        self.grid_cap = _max_blocks(cp.cuda.runtime.getDevice())
        # within_product_limit: (products, out-of-range flag) on the GPU, their pinned mirror, an event
        self.count = cp.zeros(2, dtype=cp.uint64)
        self.count_host = cupyx.empty_pinned(2, dtype=np.uint64)
        self.count_event = cp.cuda.Event(block=False, disable_timing=True)
        self.products_fn = _cuda.function(_CU_FILE, "matplan_products", ())


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


__all__ = ["identity_key", "pins", "aliases", "aliasing_kernel", "hit_check", "start_compare", "Pending", "product_limit",
           "within_product_limit", "start_product_check", "PendingCount"]
