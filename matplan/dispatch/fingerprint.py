"""Fingerprints, and exactly what a plan-cache hit checks.

A fingerprint holds the op, backend and device, A's shape, nnz, dtypes and
(dense A) memory layout, B's column count, for SpGEMM a digest of B's
structure (the plan depends on it), the ``deterministic`` flag, the matplan,
NumPy, SciPy and CuPy versions, and digests of A's structure (``indptr``,
``indices``) and of A's values.

What a hit checks. NumPy and CuPy arrays carry no modification counter, so an
in-place write (``A.data[i] = v``, ``A.sort_indices()``, a solver updating a
matrix) is invisible to identity, pointers or shapes. A cached format can
therefore only be reused in one of two ways, and ``matmul`` never takes another
(unless the caller opts in to trusting identity, 1c):

1. The identity fast path (``identity.py``; no validation, no digest). The call's
   (A, B) are of exact types that ``normalize`` passes through unchanged, and
   their identity key (ids of A and of its data/indices/indptr with their
   shapes, strides and dtypes; B's type and shape, and for SpGEMM B's ids like
   A's; ``deterministic``; versions) names a cache entry. Then either

   a. the entry's format *is* A's own arrays (its kernel declares
      ``reads_a_at_run`` and ``identity.aliases`` was true when it was
      bound): the kernel reads A's current values, indices and indptr on every
      run and keeps nothing derived from their content, so no write to them can
      make it stale. The entry holds the objects its key names, so their ids
      cannot pass to other objects while the key is registered. An in-place
      change keeps the plan chosen for A's earlier statistics (results exact; the
      choice may be worse until the next re-plan). Both SpGEMM kernels read A and
      B on every run; before cuSPARSE, whose known products limit an in-place
      change could pass, the hit checks the products (``identity.start_product_check``:
      free when nnz(A) * nnz(B) is within the limit, else one GPU launch that the
      product runs behind; past the limit its result is dropped), or
   b. the format was prepared from the entry's private copy of A, and A equals
      that copy bit for bit: host, :func:`same_content`; GPU, one launch of
      ``matplan_differs`` (fingerprint.cu) over data, indices and indptr and an
      8-byte flag copied into pinned memory. The GPU kernel is launched behind
      the comparison on the same stream and its result dropped if A differs.
      Exact: any changed bit is a miss.
   c. opt-in, ``matmul(..., assume_unchanged=True)`` or
      ``PlanCache.set_assume_unchanged(True)``: the caller promises A's arrays
      are not written in place between calls. A hit on a copied format then
      runs with no comparison once the entry pins the key's objects (the first
      trusted hit compares, then pins), so ids cannot pass to other objects;
      replacing an array (``A.data = new``) still changes the key. The cost of
      (b), reading A and its copy (bandwidth bound: about 1x the SpMV's own
      traffic), is saved; a broken promise returns a product with A's old values.

2. The full path, for everything else: validate, fingerprint, look up.

   * GPU: full 128-bit digests, one launch of ``fingerprint.cu`` (a sum of
     splitmix64-mixed words in two 64-bit lanes per digest) that reads A once,
     then a 32-byte copy to the host, which synchronises. A stale format could
     only come back through a digest collision (probability about 2^-128 per pair).
   * host: the digests cover a strided sample of ``SAMPLE`` elements per array
     (first and last included), and a hit is confirmed by comparing A bit for bit
     with the entry's copy (:func:`same_content`). Versions of one matrix that
     differ only outside the sample share a key; the newer replaces the older.

   A hit on an entry of kind (a) binds the plan to *this* A's arrays (a zero-copy
   prepare) before running, so it never runs on another object's arrays.

Callers that apply one A many times and know it does not change skip even the
identity check with ``planner.plan(...).bind(A)`` or ``plan.as_linear_operator(A)``.
``benchmarks/dispatch.py`` measures both paths.
"""
from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import struct
import threading
from typing import NamedTuple

import numpy as np
import scipy

from ..core.cache import BoundedCache
from ..core.features import dense_layout
from ..core.version import __version__
from ..core.xp import cupy_module
from ..kernels import _cuda

SPARSE_OPS = ("spmv", "spmm", "spgemm")
#: Host keys digest this many evenly spaced elements of each array (the rest is compared on a hit).
SAMPLE = 256
#: Host arrays at least this large are hashed in chunks on a thread pool ...
PARALLEL_MIN_BYTES = 8 << 20
#: ... of this many bytes each.
CHUNK_BYTES = 2 << 20
#: Threads per block of the GPU digest kernel, and blocks per SM at most.
GPU_BLOCK = 256
GPU_BLOCKS_PER_SM = 4
_CU_FILE = "../dispatch/fingerprint.cu"  # relative to matplan/kernels, where _cuda looks


class Fingerprint(NamedTuple):
    """The plan cache's key (hashable, cheap to compare)."""
    op: str
    backend: str
    device: object               # "cpu" or a CUDA device id
    shape: tuple
    nnz: int
    dtype: np.dtype
    index_dtype: object          # np.dtype of sparse A's indices; "" for dense A
    k: int                       # columns of B (1 for a vector)
    layout: str                  # dense A: "C" / "F" / "strided"; "" for sparse A
    structure: bytes             # digest of indptr + indices (b"" for dense A); host: of a sample
    values: bytes                # digest of the values; host: of a sample
    b_structure: bytes           # SpGEMM: digest of B's indptr + indices
    deterministic: bool
    versions: tuple

    def structure_key(self) -> "Fingerprint":
        """The same fingerprint without the values: one key for every version of a matrix."""
        return self._replace(values=b"")

    def describe(self) -> str:
        m, n = self.shape
        return (f"{self.op} {m}x{n} nnz={self.nnz:,} {self.dtype} k={self.k}"
                f"{' deterministic' if self.deterministic else ''} "
                f"[structure {self.structure.hex()[:8] or '-'} values {self.values.hex()[:8]}]")


def fingerprint(problem, deterministic: bool) -> Fingerprint:
    """The fingerprint of a validated :class:`matplan.validation.Problem`."""
    A, B, op = problem.A, problem.B, problem.op
    gpu = problem.backend == "gpu"
    digest = _gpu_digest if gpu else _host_sample_digest
    if op in SPARSE_OPS:
        nnz = int(A.nnz)
        values, structure = digest(_head(A.data, nnz), _head(A.indices, nnz), A.indptr)
        index_dtype, layout = A.indices.dtype, ""
    else:
        nnz, layout, index_dtype = int(A.size), dense_layout(A), ""
        values, structure = digest(A if gpu else A.ravel(order="K"), None, None)   # memory order
    b_structure = b""
    if op == "spgemm":   # in full on the host too: nothing confirms B on a hit
        _, b_structure = (_gpu_digest if gpu else _host_digest)(None, _head(B.indices, int(B.nnz)), B.indptr)
    k = 1 if B.ndim == 1 else int(B.shape[1])
    return Fingerprint(op, problem.backend, device_of(A) if gpu else "cpu", tuple(A.shape), nnz,
                       problem.dtype, index_dtype, k, layout, structure, values, b_structure,
                       bool(deterministic), versions())


def same_content(A, reference) -> bool:
    """Whether host matrix A equals ``reference`` bit for bit (confirms a host cache hit)."""
    if hasattr(A, "indptr"):
        nnz = int(A.nnz)
        if int(reference.nnz) != nnz:
            return False
        pairs = ((A.indptr, reference.indptr), (_head(A.indices, nnz), _head(reference.indices, nnz)),
                 (_head(A.data, nnz), _head(reference.data, nnz)))
    else:
        pairs = ((A, reference),)
    return all(a.shape == r.shape and a.dtype == r.dtype and _equal_bits(a, r) for a, r in pairs)


#: Below this size, comparing bytes objects beats NumPy's per-call overhead ...
SMALL_COMPARE_BYTES = 1 << 14
#: ... above it, arrays are compared in blocks of this many items (no large temporary).
COMPARE_BLOCK = 1 << 18


def _equal_bits(a, r) -> bool:
    """Bitwise equality (NaNs with equal bits match, -0.0 differs from 0.0)."""
    if a.nbytes <= SMALL_COMPARE_BYTES:
        return a.tobytes() == r.tobytes()
    bits = _UINT[a.dtype.itemsize]
    a, r = a.ravel(order="K").view(bits), r.ravel(order="K").view(bits)
    return all((a[i:i + COMPARE_BLOCK] == r[i:i + COMPARE_BLOCK]).all()
               for i in range(0, a.shape[0], COMPARE_BLOCK))


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def device_of(A) -> int:
    """The CUDA device id where a CuPy array or cupyx sparse matrix lives."""
    arr = A.data if hasattr(A, "indptr") else A
    return int(arr.device.id)


@functools.lru_cache(maxsize=None)
def versions() -> tuple:
    """matplan, NumPy, SciPy and CuPy versions: a cached plan is never reused across upgrades."""
    cp = cupy_module()
    return (__version__, np.__version__, scipy.__version__, cp.__version__ if cp is not None else "")


def _head(a, n):
    return a if a.shape[0] == n else a[:n]


# -- host: BLAKE2b ---------------------------------------------------------------
def _host_sample_digest(vals, idx, ptr):
    """(values, structure) digests of ``SAMPLE`` evenly spaced elements of each host array."""
    values = _small_blake((vals,), b"matplan-values") if vals is not None else b""
    structure = _small_blake((idx, ptr), b"matplan-struct") if idx is not None else b""
    return values, structure


def _small_blake(arrays, person: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16, person=person)
    for a in arrays:
        length, picked = _sample(a)
        h.update(length)
        h.update(picked)
    return h.digest()


def _sample(a):
    """Length and ``SAMPLE`` evenly spaced elements (first and last included) of 1-D ``a``, as arrays."""
    n = a.shape[0]
    picked = a if n <= SAMPLE else a[_SAMPLE_POSITIONS.get_or_create(n, lambda: _sample_positions(n))]
    return _LENGTH.pack(n), np.ascontiguousarray(picked)


def _sample_positions(n: int) -> np.ndarray:
    return np.linspace(0, n - 1, SAMPLE).astype(np.intp)


#: The sampled positions of the array lengths seen last (one matrix's arrays share a few lengths).
_SAMPLE_POSITIONS = BoundedCache("dispatch.sample_positions", 256)


_LENGTH = struct.Struct("<q")


def _host_digest(vals, idx, ptr):
    """(values digest, structure digest) of host arrays; None stands for "absent"."""
    values = _blake((vals,), b"matplan-values") if vals is not None else b""
    structure = _blake((idx, ptr), b"matplan-struct") if idx is not None else b""
    return values, structure


def _blake(arrays, person: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16, person=person)
    for a in arrays:
        mv = memoryview(np.ascontiguousarray(a)).cast("B")
        h.update(mv.nbytes.to_bytes(8, "little"))
        if mv.nbytes >= PARALLEL_MIN_BYTES and _workers() > 1:
            chunks = [mv[i:i + CHUNK_BYTES] for i in range(0, mv.nbytes, CHUNK_BYTES)]
            for d in _pool().map(_chunk_digest, chunks):
                h.update(d)
        else:
            h.update(mv)
    return h.digest()


def _chunk_digest(mv) -> bytes:
    return hashlib.blake2b(mv, digest_size=16).digest()


def _workers() -> int:
    return min(32, os.cpu_count() or 1)


_pool_lock = threading.Lock()
_pool_obj = None


def _pool():
    global _pool_obj
    if _pool_obj is None:
        with _pool_lock:
            if _pool_obj is None:
                _pool_obj = concurrent.futures.ThreadPoolExecutor(_workers(), thread_name_prefix="matplan-hash")
    return _pool_obj


# -- GPU: fingerprint.cu -----------------------------------------------------------
def _gpu_digest(vals, idx, ptr):
    """(values digest, structure digest) of CuPy arrays, by one kernel launch and one 32-byte copy."""
    cp = cupy_module()
    args, keep, longest = [], [], 0
    for a in (vals, idx, ptr):
        if a is None:
            args += (_NULL, _NONE)
            continue
        if not (a.flags.c_contiguous or a.flags.f_contiguous):   # one dense block of memory, any order
            a = cp.ascontiguousarray(a)
            keep.append(a)                     # alive until out.get() has synchronised
        words = a.nbytes >> 2                  # float32/64 and int32/64 items: whole 32-bit words
        args += (np.uint64(a.data.ptr), np.int64(words))
        longest = max(longest, words)
    out = cp.zeros(4, dtype=cp.uint64)
    dev = cp.cuda.runtime.getDevice()
    grid = max(1, min(-(-longest // GPU_BLOCK), _max_blocks(dev)))
    _kernel(dev)((grid,), (GPU_BLOCK,), (*args, out))
    lanes = out.get()
    values = lanes[:2].tobytes() if vals is not None else b""
    structure = lanes[2:].tobytes() if idx is not None else b""
    return values, structure


_NULL, _NONE = np.uint64(0), np.int64(0)


@functools.lru_cache(maxsize=None)
def _kernel(device_id: int):
    return _cuda.function(_CU_FILE, "matplan_fingerprint", ())


@functools.lru_cache(maxsize=None)
def _max_blocks(device_id: int) -> int:
    cp = cupy_module()
    return GPU_BLOCKS_PER_SM * int(cp.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def reference_gpu_lanes(vals, idx, ptr) -> np.ndarray:
    """NumPy twin of ``fingerprint.cu`` (the four uint64 lanes), for testing the kernel."""
    seeds = dict(vals=0x6a09e667f3bcc908, idx=0xbb67ae8584caa73b, ptr=0x3c6ef372fe94f82b)
    out = np.zeros(4, dtype=np.uint64)
    for name, arr, lane in (("vals", vals, 0), ("idx", idx, 2), ("ptr", ptr, 2)):
        if arr is None:
            continue
        w = np.ascontiguousarray(arr).view(np.uint32).astype(np.uint64)
        pos = np.arange(w.size, dtype=np.uint64)
        with np.errstate(over="ignore"):
            key = ((pos << np.uint64(32)) | w) ^ ((pos >> np.uint64(32)) * np.uint64(0x9e3779b97f4a7c15))
            key ^= np.uint64(seeds[name])
            h = _mix64(key)
            out[lane] += h.sum(dtype=np.uint64)
            out[lane + 1] += _mix64(h ^ np.uint64(0xa54ff53a5f1d36f1)).sum(dtype=np.uint64)
    return out


def _mix64(z):
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xbf58476d1ce4e5b9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94d049bb133111eb)
    return z ^ (z >> np.uint64(31))


__all__ = ["Fingerprint", "fingerprint", "same_content", "device_of", "versions", "reference_gpu_lanes", "SAMPLE"]
