"""cuSPARSE SpGEMM with reuse (``cusparseSpGEMMreuse_*``), prepared once: the vendor's best call
for a product whose pattern is fixed and whose values change, as a C++ user runs it.

:class:`PreparedSpGEMMReuse` follows NVIDIA's documented sequence once, at construction:
``workEstimation`` twice (buffer 1's size, then with it), ``nnz`` twice (buffers 2-4's sizes,
then with them; buffers 1 and 2 are freed), C's column and value arrays allocated and set on C's
descriptor (``cusparseCsrSetPointers``), ``copy`` twice (buffer 5's size, then C's structure;
buffer 3 is freed). Each :meth:`~PreparedSpGEMMReuse.compute` is one ``cusparseSpGEMMreuse_compute``
into C's values, on the current stream, reading A's and B's values where they are now. Buffers 4
and 5 are kept with C: reuse holds more memory than the one-shot call.

CuPy binds the one-shot ``cusparseSpGEMM_*`` and the descriptors, not the reuse functions. Those
four are called through ``ctypes`` on the libcusparse CuPy already loaded: found in
``/proc/self/maps`` (else by its sonames) and opened with ``RTLD_NOLOAD``, so it is the same
library instance and CuPy's handle and descriptors (plain addresses) are valid in it. Their
signatures are cusparse.h's: descriptors and buffers ``void*``, sizes ``size_t*`` out-parameters,
alpha and beta host pointers to scalars of the compute type (CuPy's handle keeps the default host
pointer mode). CuPy's SpGEMM bindings do not set the handle's stream; every step here sets the
current one first.

Errors: :class:`ReuseUnavailable` where it cannot run here (no CuPy or GPU, bindings or library
symbols missing: it says which); TypeError / ValueError naming the operand for what it does not
take (values other than float32/float64, index arrays other than int32/int64 or of two dtypes,
shapes that do not conform, operands not canonical); :class:`ReuseOutOfMemory` (a MemoryError)
where CuPy's pool or cuSPARSE ran out of memory; :class:`CusparseReuseError` naming the step and
cuSPARSE's status otherwise (an int64 refusal says so). A product with an empty operand never
calls cuSPARSE, and one whose C is structurally empty stops after the count: C has no entries.
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import time
import weakref

import numpy as np

from ...core.xp import cupy_module
from .. import _cuda
from .operands import csr_from_parts
import matplan.kernels.spgemm.vendor as vendor

#: cusparseOperation_t NON_TRANSPOSE, cusparseSpGEMMAlg_t DEFAULT, cusparseIndexBase_t ZERO.
OP_N, ALG_DEFAULT, BASE_ZERO = 0, 0, 0
#: cudaDataType_t of the values (also the compute type), cusparseIndexType_t of the indices.
VALUE_TYPES = {"float32": 0, "float64": 1}          # CUDA_R_32F, CUDA_R_64F
INDEX_TYPES = {"int32": 2, "int64": 3}              # CUSPARSE_INDEX_32I, CUSPARSE_INDEX_64I
#: cusparseStatus_t names (cusparse.h), for messages where CuPy's error class is not at hand.
STATUS_NAMES = {0: "SUCCESS", 1: "NOT_INITIALIZED", 2: "ALLOC_FAILED", 3: "INVALID_VALUE", 4: "ARCH_MISMATCH",
                5: "MAPPING_ERROR", 6: "EXECUTION_FAILED", 7: "INTERNAL_ERROR", 8: "MATRIX_TYPE_NOT_SUPPORTED",
                9: "ZERO_PIVOT", 10: "NOT_SUPPORTED", 11: "INSUFFICIENT_RESOURCES"}
#: Statuses that mean memory ran out: ALLOC_FAILED, INSUFFICIENT_RESOURCES.
MEMORY_STATUSES = frozenset({2, 11})
#: Statuses with which a cuSPARSE refuses an index type it does not take: INVALID_VALUE, NOT_SUPPORTED.
REFUSAL_STATUSES = frozenset({3, 10})
#: CuPy's bindings this module calls (descriptors, C's pointers and size, the stream).
CUPY_BINDINGS = ("createCsr", "destroySpMat", "csrSetPointers", "spMatGetSize", "spMatSetValues",
                 "spGEMM_createDescr", "spGEMM_destroyDescr", "setStream")
_P, _I, _SIZE = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)
#: The reuse functions' argument types, from cusparse.h (every one returns cusparseStatus_t, an int):
#: (handle, opA, opB, matA, matB, matC, alg, spgemmDescr, size_t* bufferSize1, void* buffer1) ...
SIGNATURES = {
    "cusparseSpGEMMreuse_workEstimation": (_P, _I, _I, _P, _P, _P, _I, _P, _SIZE, _P),
    "cusparseSpGEMMreuse_nnz": (_P, _I, _I, _P, _P, _P, _I, _P, _SIZE, _P, _SIZE, _P, _SIZE, _P),
    "cusparseSpGEMMreuse_copy": (_P, _I, _I, _P, _P, _P, _I, _P, _SIZE, _P),
    # (handle, opA, opB, alpha, matA, matB, beta, matC, computeType, alg, spgemmDescr)
    "cusparseSpGEMMreuse_compute": (_P, _I, _I, _P, _P, _P, _P, _P, _I, _I, _P),
}
#: A mapped file that is cuSPARSE itself (libcusparseLt and others are not).
_LIBCUSPARSE = re.compile(r"^libcusparse\.so(\.\d+)*$")
#: Sonames tried where /proc/self/maps names no libcusparse file (only an already loaded one opens).
SONAMES = ("libcusparse.so.13", "libcusparse.so.12", "libcusparse.so.11")


class ReuseUnavailable(RuntimeError):
    """cuSPARSE's SpGEMM reuse cannot be called in this process (the message says why)."""


class CusparseReuseError(RuntimeError):
    """A reuse step returned an error status (``status``: the cusparseStatus_t value)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ReuseOutOfMemory(MemoryError):
    """CuPy's pool or cuSPARSE ran out of device memory during a reuse step."""


def bindings():
    """(CuPy's cuSPARSE bindings module, None) or (None, why they cannot be used)."""
    return _cuda.cusparse_bindings(CUPY_BINDINGS)


def cusparse_paths(maps_text: str) -> list:
    """The distinct files named libcusparse.so[.N...] mapped in a process, from the text of its
    /proc/<pid>/maps (the path is the sixth field on)."""
    found = []
    for line in maps_text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6:
            path = fields[5].strip()
            if _LIBCUSPARSE.match(os.path.basename(path)) and path not in found:
                found.append(path)
    return found


def declare(library) -> str | None:
    """Set the reuse functions' argument and return types on a ctypes library; None, or which of
    them it lacks."""
    missing = []
    for name, argtypes in SIGNATURES.items():
        try:
            fn = getattr(library, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return f"lacks {', '.join(missing)}" if missing else None


@functools.lru_cache(maxsize=None)
def reuse_library():
    """(ctypes library of the libcusparse CuPy loaded, with the reuse functions declared, None), or
    (None, why not). The library is opened with RTLD_NOLOAD (found only if already loaded, so it
    is CuPy's instance): by the one libcusparse file mapped in the process, else by its sonames."""
    lib, why = bindings()
    if lib is None:
        return None, why
    cupy_module().cuda.device.get_cusparse_handle()      # makes CuPy load cuSPARSE where it loads it lazily
    try:
        with open("/proc/self/maps") as f:
            paths = cusparse_paths(f.read())
    except OSError:   # not Linux: the sonames below may still name it
        paths = []
    files = sorted({os.path.realpath(p) for p in paths})
    if len(files) > 1:
        return None, f"{len(files)} different libcusparse files are loaded ({', '.join(files)}); cannot tell CuPy's"
    library, tried = None, []
    for name in paths[:1] or SONAMES:
        try:
            library = ctypes.CDLL(name, mode=os.RTLD_NOLOAD)
            break
        except (OSError, AttributeError) as exc:   # AttributeError: no os.RTLD_NOLOAD on this platform
            tried.append(f"{name}: {exc}")
    if library is None:
        return None, f"no libcusparse found loaded after CuPy's cuSPARSE handle was made ({'; '.join(tried)})"
    reason = declare(library)
    if reason:
        return None, f"{library._name} {reason} (cusparseSpGEMMreuse_*: CUDA 11.3 update 1 or later)"
    return library, None


def unavailable() -> str | None:
    """Why :class:`PreparedSpGEMMReuse` cannot run in this process; None where it can."""
    return reuse_library()[1]


def status_error(step: str, status: int, index: str = "int32", cupy_lib=None) -> Exception:
    """The exception for a reuse step that returned ``status``: ReuseOutOfMemory for the memory
    statuses, else CusparseReuseError, naming the step, the status and, with int64 indices, that
    int32 ones are the way out."""
    name = STATUS_NAMES.get(status, "unknown status")
    text = f"CUSPARSE_STATUS_{name}" if status in STATUS_NAMES else name
    error_class = getattr(cupy_lib, "CuSparseError", None)
    if error_class is not None:
        try:
            text = str(error_class(status))
        except Exception:   # an unknown status CuPy cannot name: keep ours
            pass
    message = f"{step} returned {status} ({text})"
    if status in MEMORY_STATUSES:
        return ReuseOutOfMemory(f"{message}: out of device memory (reuse keeps buffers 4 and 5 beside C)")
    if index == "int64":
        message += ("; this cuSPARSE refuses int64 indices in SpGEMM reuse" if status in REFUSAL_STATUSES else
                    "; the operands have int64 indices, which this cuSPARSE's SpGEMM reuse may not take")
        message += ": use int32 indices (nnz < 2^31)"
    return CusparseReuseError(message, status)


def _csr_arrays(name: str, M) -> tuple:
    """(data, indices, indptr, shape) of CSR ``M``, or TypeError naming ``name``."""
    if not all(hasattr(M, attr) for attr in ("data", "indices", "indptr", "shape")):
        raise TypeError(f"{name}: expected a CSR matrix (data, indices, indptr, shape), got {type(M).__name__}")
    shape = tuple(int(d) for d in M.shape)
    if len(shape) != 2:
        raise ValueError(f"{name}: expected a 2-D matrix, got shape {shape}")
    return M.data, M.indices, M.indptr, shape


def check_operands(A, B) -> tuple:
    """(value dtype name, index dtype name) of A @ B, or an error naming the operand: values
    float32 or float64 alike, indptr and indices of one dtype (int32 or int64) alike, conforming
    shapes. Needs no GPU."""
    kinds = []
    for name, M in (("A", A), ("B", B)):
        data, indices, indptr, _ = _csr_arrays(name, M)
        value, index, offsets = (np.dtype(a.dtype).name for a in (data, indices, indptr))
        if value not in VALUE_TYPES:
            raise TypeError(f"{name}: values of {value}; SpGEMM reuse here takes float32 or float64")
        if index not in INDEX_TYPES or offsets != index:
            raise TypeError(f"{name}: indptr of {offsets} with indices of {index}; expected int32 or int64 for both")
        kinds.append((value, index))
    if kinds[0] != kinds[1]:
        raise TypeError(f"A and B: A has {kinds[0][0]} values and {kinds[0][1]} indices, B {kinds[1][0]} and "
                        f"{kinds[1][1]}; cuSPARSE takes one type of each (cast one of them)")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A and B do not conform: A is {A.shape[0]}x{A.shape[1]}, B has {B.shape[0]} rows")
    return kinds[0]


def _check_device_arrays(name: str, M, cp) -> None:
    """TypeError / ValueError naming ``name`` unless M's arrays are contiguous CuPy arrays of the
    current device and M is canonical (sorted, no duplicates: cuSPARSE's SpGEMM needs it)."""
    device = cp.cuda.runtime.getDevice()
    for what in ("data", "indices", "indptr"):
        arr = getattr(M, what)
        if not isinstance(arr, cp.ndarray):
            raise TypeError(f"{name}.{what}: expected a CuPy array, got {type(arr).__name__}")
        if not arr.flags.c_contiguous:
            raise ValueError(f"{name}.{what}: expected a contiguous array")
        if arr.device.id != device:
            raise ValueError(f"{name}.{what}: on device {arr.device.id}, the current device is {device}")
    if not vendor.is_canonical(M):
        raise ValueError(f"{name}: not canonical (a row's columns unsorted or repeated); cuSPARSE's SpGEMM needs "
                         f"sorted rows without duplicates: call {name}.sum_duplicates() first")


def _release(cupy_lib, owned: list) -> None:
    """Destroy the descriptors in ``owned`` ((binding name, handle) in creation order), the last
    made first; errors are dropped (at teardown cuSPARSE may be gone)."""
    while owned:
        kind, handle = owned.pop()
        try:
            getattr(cupy_lib, kind)(handle)
        except Exception:   # a finalizer must not raise
            pass


class PreparedSpGEMMReuse:
    """C = A @ B by cuSPARSE's SpGEMM reuse: C's structure made once here, its values by
    :meth:`compute` (also :meth:`run`), as often as A's and B's values change.

    A and B are CSR matrices on the GPU (cupyx, or any object with ``data``, ``indices``,
    ``indptr`` and ``shape``; canonical) of float32 or float64 and int32 or int64 indices, one
    type of each. Their arrays are kept and read by every compute: change values in place, or pass
    new value arrays to :meth:`compute`; the pattern must not change.

    Attributes: ``C`` (a cupyx CSR whose arrays every compute fills in place, in cuSPARSE's
    order: reorder a copy, never C, e.g. by ``sort_indices`` or a cupyx product that sums its
    duplicates), ``nnz`` (C's),
    ``calls_cusparse`` (False where C is structurally empty and nothing is computed),
    ``setup_s`` (host seconds of the construction, queued work not waited for), ``buffer_bytes``
    (each buffer cuSPARSE asked for), ``kept_bytes`` (buffers 4 and 5 kept after setup),
    ``cusparse_path`` (the library the reuse functions came from). One call at a time; a closed
    object (:meth:`close`, or collected) cannot compute.
    """

    def __init__(self, A, B):
        t0 = time.perf_counter()
        self.dtype_name, self.index_name = check_operands(A, B)
        library, why = reuse_library()
        if library is None:
            raise ReuseUnavailable(f"cuSPARSE SpGEMM reuse cannot run here: {why}")
        cp = cupy_module()
        self._cp, self._fn, (self._lib, _) = cp, library, bindings()
        self.cusparse_path = library._name
        for name, M in (("A", A), ("B", B)):
            _check_device_arrays(name, M, cp)
        self.device_id = cp.cuda.runtime.getDevice()
        m, k, n = int(A.shape[0]), int(A.shape[1]), int(B.shape[1])
        self.shape = (m, n)
        self._a, self._b = (A.data, A.indices, A.indptr), (B.data, B.indices, B.indptr)
        self._vtype = VALUE_TYPES[self.dtype_name]
        dtype, index = np.dtype(self.dtype_name), np.dtype(self.index_name)
        self._alpha, self._beta = np.ones((), dtype), np.zeros((), dtype)   # host scalars of the compute type
        self._scalars = (self._alpha.ctypes.data, self._beta.ctypes.data)
        self._owned: list = []
        self._finalizer = weakref.finalize(self, _release, self._lib, self._owned)
        self._finalizer.atexit = False      # at interpreter exit the CUDA context goes anyway
        self.buffer_bytes, self.kept_bytes, self._kept = {}, 0, ()
        self._descr = self._mats = None
        c_indptr = _cuda.zeroed(m + 1, index)
        nnz_a, nnz_b = int(A.indices.size), int(B.indices.size)
        self.calls_cusparse = bool(m and n and nnz_a and nnz_b)
        try:
            if self.calls_cusparse:
                c_indices, c_data = self._setup(A, B, (m, k, n), c_indptr, dtype, index)
            else:
                c_indices, c_data = cp.empty(0, index), cp.empty(0, dtype)
        except MemoryError as exc:
            self.close()
            if isinstance(exc, ReuseOutOfMemory):
                raise
            raise ReuseOutOfMemory(f"SpGEMM reuse setup: {exc}") from exc
        except BaseException:
            self.close()
            raise
        self.nnz = int(c_indices.size)
        self.C = csr_from_parts(c_data, c_indices, c_indptr, self.shape, sorted_rows=False, canonical=None)
        self.setup_s = time.perf_counter() - t0

    # -- setup ---------------------------------------------------------------
    def _call(self, name: str, *args) -> None:
        status = getattr(self._fn, name)(*args)
        if status:
            raise status_error(name, status, self.index_name, self._lib)

    def _setup(self, A, B, dims, c_indptr, dtype, index):
        """NVIDIA's sequence up to C's structure; returns C's (indices, data)."""
        cp, lib = self._cp, self._lib
        m, k, n = dims
        it = INDEX_TYPES[self.index_name]
        handle = cp.cuda.device.get_cusparse_handle()
        lib.setStream(handle, cp.cuda.get_current_stream().ptr)

        def csr(rows, cols, nnz, indptr, indices, data):
            desc = lib.createCsr(rows, cols, nnz, indptr, indices, data, it, it, BASE_ZERO, self._vtype)
            self._owned.append(("destroySpMat", desc))
            return desc
        mat_a = csr(m, k, int(A.indices.size), A.indptr.data.ptr, A.indices.data.ptr, A.data.data.ptr)
        mat_b = csr(k, n, int(B.indices.size), B.indptr.data.ptr, B.indices.data.ptr, B.data.data.ptr)
        mat_c = csr(m, n, 0, c_indptr.data.ptr, 0, 0)     # NVIDIA's example: C's offsets given, the rest later
        descr = lib.spGEMM_createDescr()
        self._owned.append(("spGEMM_destroyDescr", descr))
        head = (handle, OP_N, OP_N, mat_a, mat_b, mat_c, ALG_DEFAULT, descr)
        sizes = [ctypes.c_size_t(0) for _ in range(5)]

        def buffer(i):     # never a null pointer: with one, a step would only report its sizes again
            self.buffer_bytes[f"buffer{i + 1}"] = sizes[i].value
            return cp.empty(max(sizes[i].value, 1), dtype=np.int8)
        self._call("cusparseSpGEMMreuse_workEstimation", *head, ctypes.byref(sizes[0]), None)
        buf1 = buffer(0)
        self._call("cusparseSpGEMMreuse_workEstimation", *head, ctypes.byref(sizes[0]), buf1.data.ptr)
        self._call("cusparseSpGEMMreuse_nnz", *head, ctypes.byref(sizes[1]), None, ctypes.byref(sizes[2]), None,
                   ctypes.byref(sizes[3]), None)
        buf2, buf3, buf4 = buffer(1), buffer(2), buffer(3)
        self._call("cusparseSpGEMMreuse_nnz", *head, ctypes.byref(sizes[1]), buf2.data.ptr,
                   ctypes.byref(sizes[2]), buf3.data.ptr, ctypes.byref(sizes[3]), buf4.data.ptr)
        del buf1, buf2          # as NVIDIA's example: only buffers 3 and 4 are read after the count
        got = np.zeros(3, np.int64)
        lib.spMatGetSize(mat_c, got.ctypes.data, got.ctypes.data + 8, got.ctypes.data + 16)
        nnz_c = int(got[2])
        if (int(got[0]), int(got[1])) != (m, n):
            raise CusparseReuseError(f"cuSPARSE sized C {int(got[0])}x{int(got[1])}, expected {m}x{n}")
        if nnz_c > np.iinfo(index).max:
            raise ValueError(f"A and B: C has {nnz_c:,} nonzeros, past {self.index_name} indices; use int64 indices")
        if nnz_c == 0:          # structurally empty: C's offsets stay zeroed, nothing to copy or compute
            self.calls_cusparse = False
            return cp.empty(0, index), cp.empty(0, dtype)
        c_indices, c_data = cp.empty(nnz_c, index), _cuda.zeroed(nnz_c, dtype)
        lib.csrSetPointers(mat_c, c_indptr.data.ptr, c_indices.data.ptr, c_data.data.ptr)
        self._call("cusparseSpGEMMreuse_copy", *head, ctypes.byref(sizes[4]), None)
        buf5 = buffer(4)
        self._call("cusparseSpGEMMreuse_copy", *head, ctypes.byref(sizes[4]), buf5.data.ptr)
        del buf3                # freed after the copy, as in NVIDIA's example
        self._kept = (buf4, buf5)
        self.kept_bytes = int(buf4.nbytes + buf5.nbytes)
        self._descr, self._mats = descr, (mat_a, mat_b, mat_c)
        return c_indices, c_data

    # -- computing -----------------------------------------------------------
    def compute(self, a_data=None, b_data=None):
        """Recompute C's values (``self.C``, filled in place and returned) from A's and B's values
        as they are now, on the current stream: one ``cusparseSpGEMMreuse_compute``. ``a_data`` /
        ``b_data``: new value arrays for A / B (CuPy, the dtype and nnz of the ones they replace),
        kept and read by this and later calls."""
        if not self._finalizer.alive:
            raise RuntimeError("PreparedSpGEMMReuse: closed (its descriptors were destroyed); prepare again")
        cp = self._cp
        if cp.cuda.runtime.getDevice() != self.device_id:
            raise RuntimeError(f"PreparedSpGEMMReuse: prepared on device {self.device_id}, the current device is "
                               f"{cp.cuda.runtime.getDevice()}")
        for which, new in ((0, a_data), (1, b_data)):
            if new is not None:
                self._set_values(which, new)
        if not self.calls_cusparse:
            return self.C
        handle = cp.cuda.device.get_cusparse_handle()
        self._lib.setStream(handle, cp.cuda.get_current_stream().ptr)
        mat_a, mat_b, mat_c = self._mats
        alpha, beta = self._scalars
        status = self._fn.cusparseSpGEMMreuse_compute(handle, OP_N, OP_N, alpha, mat_a, mat_b, beta, mat_c,
                                                      self._vtype, ALG_DEFAULT, self._descr)
        if status:
            raise status_error("cusparseSpGEMMreuse_compute", status, self.index_name, self._lib)
        return self.C

    run = compute

    def _set_values(self, which: int, new) -> None:
        """Point A's (0) or B's (1) descriptor at ``new`` values, checked against the old ones."""
        name, old = ("a_data", self._a) if which == 0 else ("b_data", self._b)
        cp = self._cp
        if not isinstance(new, cp.ndarray):
            raise TypeError(f"{name}: expected a CuPy array, got {type(new).__name__}")
        if new.dtype != old[0].dtype or new.shape != old[0].shape or not new.flags.c_contiguous:
            raise ValueError(f"{name}: expected a contiguous {old[0].dtype} array of shape {old[0].shape}, got "
                             f"{new.dtype} {new.shape}{'' if new.flags.c_contiguous else ' (not contiguous)'}")
        if new.device.id != self.device_id:
            raise ValueError(f"{name}: on device {new.device.id}, prepared on {self.device_id}")
        if self._mats is not None:
            self._lib.spMatSetValues(self._mats[which], new.data.ptr)
        if which == 0:
            self._a = (new,) + self._a[1:]
        else:
            self._b = (new,) + self._b[1:]

    def close(self) -> None:
        """Destroy the descriptors and drop the kept buffers now (also done when collected)."""
        self._finalizer()
        self._kept, self._mats, self._descr = (), None, None
        self.kept_bytes = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
