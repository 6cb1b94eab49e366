"""cuSPARSE SpMV / SpMM prepared once, through CuPy's low-level bindings, and the cupyx call beside it.

:class:`PreparedCsr` makes A's descriptor once. Each layout of B it meets (a vector, or k
columns, on one stream) gets its dense descriptors, buffer size and workspace once, on first use;
a later run re-points the dense descriptors (``cusparseDnVecSetValues`` / ``DnMatSetValues``) and
calls ``cusparseSpMV`` / ``SpMM``. This is the vendor's kernel as a C++ user runs it.

Its configurations (:func:`configs`): the algorithm (``alg``: cuSPARSE's default, or a named CSR
algorithm) and, for SpMM, the order cuSPARSE reads B and writes C in (``order``): "row"
(``CUSPARSE_ORDER_ROW``: a C-contiguous B and ``out`` are used as they are) or "col"
(``CUSPARSE_ORDER_COL``, cupyx's: B is copied into a column-major buffer kept with the layout and C
computed into another, then copied into ``out``; a B or ``out`` already in the order is used as
it is). The copies are part of the call, as they are of cupyx's. Parameters at their defaults
are left out of a config (``{}`` is the default algorithm, row-major).

:func:`cupyx_matmul` is what a CuPy user pays: ``A @ B`` on a cupyx CSR, which creates three
descriptors, sizes and allocates a workspace on every call and, for SpMM, multiplies a
column-major copy of B. It is the benchmarks' ``cupyx_ms`` and the fallback of a prepared call
that cannot run (its reason kept in :attr:`PreparedCsr.fallback` or ``layout_fallbacks``).

Not used: ``cusparseSpMM_preprocess`` and ``cusparseSpMV_preprocess``, which CuPy does not bind.
"""
from __future__ import annotations

import collections
import threading
import weakref

import numpy as np

from ...core.xp import cupy_module, cupyx_sparse
from .. import _cuda
from ..base import out_or_new
from .formats import result_shape

#: cusparseSpMVAlg_t and cusparseSpMMAlg_t values (cusparse.h) by name; "default" lets cuSPARSE
#: choose. CuPy's module names only the older ones, so the numbers are given here.
SPMV_ALGS = {"default": 0, "csr_alg1": 2, "csr_alg2": 3}
SPMM_ALGS = {"default": 0, "csr_alg1": 4, "csr_alg2": 6, "csr_alg3": 12}
#: The SpMV algorithms a search times: cuSPARSE's documentation names CSR_ALG1 the default for CSR,
#: so it would time the default twice; CSR_ALG2 is the one for irregular rows (deterministic).
SPMV_SEARCH = ("default", "csr_alg2")
#: cudaDataType_t of the values, cusparseIndexType_t of the indices, cusparseOrder_t.
VALUE_TYPES = {"float32": 0, "float64": 1}          # CUDA_R_32F, CUDA_R_64F
INDEX_TYPES = {"int32": 2, "int64": 3}              # CUSPARSE_INDEX_32I, CUSPARSE_INDEX_64I
ORDER_COL, ORDER_ROW = 1, 2
#: SpMM's ``order`` param: the cusparseOrder_t of B and C, and the array order ("C"/"F") it reads.
ORDERS = {"row": (ORDER_ROW, "C"), "col": (ORDER_COL, "F")}
#: Layouts (B shape class, order, stream) kept per prepared A; beyond it the oldest is dropped.
MAX_LAYOUTS = 8
#: (value dtype, index dtype, order, alg) that cuSPARSE refused in this process (bufferSize's
#: status): :func:`configs` leaves them out, so a search does not time a refusal again.
REFUSED: set = set()


#: CuPy's generic-API bindings the prepared call uses.
CUPY_BINDINGS = ("createCsr", "destroySpMat", "createDnVec", "destroyDnVec", "createDnMat", "destroyDnMat",
                 "spMV_bufferSize", "spMV", "spMM_bufferSize", "spMM")


def bindings():
    """(CuPy's cuSPARSE bindings module, None) or (None, the reason they cannot be used)."""
    return _cuda.cusparse_bindings(CUPY_BINDINGS)


def check_alg(params: dict) -> str:
    """params["alg"] ("default" when absent), or ValueError naming the allowed values."""
    alg = params.get("alg", "default")
    if alg not in SPMV_ALGS and alg not in SPMM_ALGS:
        raise ValueError(f"params['alg']: expected one of {sorted(set(SPMV_ALGS) | set(SPMM_ALGS))}, got {alg!r}")
    return alg


def check_params(params: dict) -> tuple:
    """(alg, order) of a ``spmv.cusparse`` config ("default" and "row" when absent), or ValueError
    naming the parameter and what it takes."""
    if not isinstance(params, dict):
        raise TypeError(f"params: expected a dict, got {type(params).__name__}")
    unknown = sorted(set(params) - {"alg", "order"})
    if unknown:
        raise ValueError(f"params: unknown {unknown}; spmv.cusparse takes 'alg' and 'order'")
    order = params.get("order", "row")
    if order not in ORDERS:
        raise ValueError(f"params['order']: expected one of {sorted(ORDERS)}, got {order!r}")
    return check_alg(params), order


def config(alg: str = "default", order: str = "row") -> dict:
    """The params of (alg, order), defaults left out: ``{}`` is cuSPARSE's default, row-major."""
    return {**({"alg": alg} if alg != "default" else {}), **({"order": order} if order != "row" else {})}


def configs(op: str, dtype=None, index_dtype=None) -> list:
    """Every configuration of the prepared call for ``op`` ("spmv": the algorithms of SPMV_SEARCH;
    "spmm": each order with each SpMM algorithm), defaults left out (:func:`config`), less the
    combinations cuSPARSE refused in this process for these dtypes (``REFUSED``)."""
    if op == "spmv":
        return [config(alg) for alg in SPMV_SEARCH]
    if op != "spmm":
        raise ValueError(f"op: expected 'spmv' or 'spmm', got {op!r}")
    key = (np.dtype(dtype).name if dtype is not None else None,
           np.dtype(index_dtype).name if index_dtype is not None else None)
    return [config(alg, order) for order in ORDERS for alg in SPMM_ALGS
            if key + (order, alg) not in REFUSED]


def unsupported(A) -> str | None:
    """Why the prepared call cannot take A (None: it can): value and index types cuSPARSE's
    generic API takes here, one index type for indptr and indices, contiguous CuPy arrays."""
    arrays = [getattr(A, name, None) for name in ("data", "indices", "indptr")]
    if any(a is None for a in arrays):
        return "A is not a CSR matrix (data, indices, indptr)"
    dtype, it, pt = (np.dtype(a.dtype).name for a in arrays)
    if dtype not in VALUE_TYPES:
        return f"values of {dtype} (the prepared call takes float32 and float64)"
    if it not in INDEX_TYPES or pt != it:
        return f"indptr of {pt} with indices of {it} (the prepared call takes int32 or int64 for both)"
    cp = cupy_module()
    for name, arr in zip(("data", "indices", "indptr"), arrays):
        if cp is None or not isinstance(arr, cp.ndarray):
            return f"A's {name} is not a CuPy array"
        if not arr.flags.c_contiguous:
            return f"A's {name} is not contiguous"
    return None


def as_cupyx(A):
    """A as a cupyx CSR matrix: A itself if it is one, else one made on A's arrays."""
    csp = cupyx_sparse()
    if csp is None:
        raise RuntimeError("cuSPARSE through cupyx needs CuPy and an NVIDIA GPU")
    if csp.issparse(A):
        return A
    return csp.csr_matrix((A.data, A.indices, A.indptr), shape=tuple(A.shape))


def cupyx_matmul(A, B, out=None):
    """``A @ B`` as a CuPy user calls it (cupyx: descriptors and workspace made per call, SpMM on a
    column-major copy of B), then copied into ``out`` where one is given."""
    C = as_cupyx(A) @ B
    if out is None:
        return C
    out[...] = C
    return out


def _destroy(lib, kind: str, handle: int) -> None:
    """Destroy one descriptor; errors are dropped (at teardown the context goes with them)."""
    try:
        getattr(lib, "destroy" + kind)(handle)
    except Exception:   # a finalizer must not raise: cuSPARSE may already be unloaded
        pass


class _Owned:
    """A cuSPARSE descriptor destroyed when this object is collected or closed."""
    __slots__ = ("handle", "_finalizer", "__weakref__")

    def __init__(self, lib, kind: str, handle: int):
        self.handle = handle
        self._finalizer = weakref.finalize(self, _destroy, lib, kind, handle)
        self._finalizer.atexit = False   # at interpreter exit the CUDA context is torn down anyway

    def close(self) -> None:
        self._finalizer()


class _Layout:
    """One B layout's dense descriptors (None where SetValues is not bound: made per run), its
    workspace, cusparseOrder_t and algorithm number, and the buffers B and C are converted in
    where the caller's are in the other order (made on first need, kept)."""
    __slots__ = ("b", "c", "workspace", "ptr", "order", "alg", "b_buf", "c_buf")

    def __init__(self, b, c, workspace, order, alg):
        self.b, self.c, self.workspace, self.order, self.alg = b, c, workspace, order, alg
        self.ptr = workspace.data.ptr if workspace is not None else 0
        self.b_buf = self.c_buf = None


class PreparedCsr:
    """cuSPARSE SpMV/SpMM on CSR ``A`` (its own arrays, kept and read on every run), with
    algorithm ``alg`` and, for SpMM, B and C in ``order`` ("row" or "col").

    ``fallback`` is None, or why the prepared call cannot take A (then every run is
    :func:`cupyx_matmul`); ``layout_fallbacks`` maps a B layout cuSPARSE refused with its default
    algorithm to the reason (such runs are cupyx's too). A named algorithm cuSPARSE refuses raises
    RuntimeError instead: that config cannot run. ``buffer_size_calls`` counts workspace sizings
    (one per layout: runs reuse them).
    """

    def __init__(self, A, alg: str = "default", order: str = "row"):
        if not all(hasattr(A, name) for name in ("data", "indices", "indptr", "shape")):
            raise TypeError(f"A: expected a CSR matrix (data, indices, indptr, shape), got {type(A).__name__}")
        self.alg, self.order = check_params({"alg": alg, "order": order})
        self.shape = (int(A.shape[0]), int(A.shape[1]))
        self.lib, reason = bindings()
        self.fallback = reason or unsupported(A)
        self.dtype = np.dtype(A.data.dtype)
        self.layout_fallbacks: dict = {}
        self.buffer_size_calls = 0
        self._lock = threading.Lock()
        self._layouts: collections.OrderedDict = collections.OrderedDict()
        self._arrays = (A.data, A.indices, A.indptr)    # keeps the pointers in the descriptor valid
        self.nnz = int(A.indices.size)
        self._spmat = None
        if self.fallback is None and self.nnz and min(self.shape):
            self._make_spmat()

    @property
    def params(self) -> dict:
        """This call's config, defaults left out (:func:`config`)."""
        return config(self.alg, self.order)

    # -- A ------------------------------------------------------------------
    def _make_spmat(self):
        lib = self.lib
        data, indices, indptr = self._arrays
        it = INDEX_TYPES[np.dtype(indices.dtype).name]
        self._vtype = VALUE_TYPES[self.dtype.name]
        self._one = np.ones((), self.dtype)          # host scalars (CuPy's handle: host pointer mode)
        self._zero = np.zeros((), self.dtype)
        self._spmat = _Owned(lib, "SpMat", lib.createCsr(
            self.shape[0], self.shape[1], self.nnz, indptr.data.ptr, indices.data.ptr, data.data.ptr,
            it, it, 0, self._vtype))     # 0: CUSPARSE_INDEX_BASE_ZERO

    def same_arrays(self, A) -> bool:
        """Whether A still holds the arrays this was prepared on (an attribute can be reassigned)."""
        data, indices, indptr = self._arrays
        return A.data is data and A.indices is indices and A.indptr is indptr

    # -- running ------------------------------------------------------------
    def run(self, A, B, out=None):
        """C = A @ B into ``out`` (C- or F-contiguous; allocated C-contiguous when None); A is the
        matrix prepared on."""
        cp = cupy_module()
        if cp is None:
            raise RuntimeError("spmv.cusparse needs CuPy and an NVIDIA GPU")
        m, n = self.shape
        out = out_or_new(out, result_shape(self.shape, self.dtype, B), self.dtype, cp, orders="CF")
        k = 1 if B.ndim == 1 else B.shape[1]
        if m == 0 or k == 0:
            return out
        if self.nnz == 0 or n == 0:
            out.fill(0)
            return out
        if self.fallback is not None:
            return cupyx_matmul(A, B, out)
        if B.ndim == 1:
            if not B.flags.c_contiguous:
                B = cp.ascontiguousarray(B)
            key = (0, ORDER_COL)
        else:
            key = (k, ORDERS[self.order][0])
        if key in self.layout_fallbacks:
            return cupyx_matmul(A, B, out)
        stream = cp.cuda.get_current_stream().ptr
        layout = self._layouts.get(key + (stream,))
        if layout is None:
            layout = self._new_layout(key, stream, B, out)
            if layout is None:
                return cupyx_matmul(A, B, out)
        self._launch(layout, k, B, out)
        return out

    def _launch(self, layout, k, B, out):
        lib, cp = self.lib, cupy_module()
        handle = cp.cuda.device.get_cusparse_handle()
        with self._lock:   # descriptors and buffers are shared: convert, point, call and copy as one step
            b, c = self._operands(layout, B, out)
            bd, cd = layout.b, layout.c
            if bd is None:   # no SetValues binding: fresh dense descriptors (cheap) per run
                bd, cd = self._dense(k, b, c, layout.order)
            elif B.ndim == 1:
                lib.dnVecSetValues(bd.handle, b.data.ptr)
                lib.dnVecSetValues(cd.handle, c.data.ptr)
            else:
                lib.dnMatSetValues(bd.handle, b.data.ptr)
                lib.dnMatSetValues(cd.handle, c.data.ptr)
            if B.ndim == 1:
                lib.spMV(handle, 0, self._one.ctypes.data, self._spmat.handle, bd.handle, self._zero.ctypes.data,
                         cd.handle, self._vtype, layout.alg, layout.ptr)
            else:
                lib.spMM(handle, 0, 0, self._one.ctypes.data, self._spmat.handle, bd.handle,
                         self._zero.ctypes.data, cd.handle, self._vtype, layout.alg, layout.ptr)
            if c is not out:
                out[...] = c     # C back into the caller's order (a copy kernel on this stream)

    def _operands(self, layout, B, out) -> tuple:
        """(B, C) as cuSPARSE reads and writes them: B and ``out`` themselves where they are in
        the layout's order, else its kept buffers, B copied into its own."""
        if B.ndim == 1:
            return B, out
        cp, order = cupy_module(), "C" if layout.order == ORDER_ROW else "F"

        def fits(x):
            return x.flags.c_contiguous if order == "C" else x.flags.f_contiguous
        b, c = B, out
        if not fits(B):
            if layout.b_buf is None or layout.b_buf.shape != B.shape:
                layout.b_buf = cp.empty(B.shape, dtype=self.dtype, order=order)
            layout.b_buf[...] = B
            b = layout.b_buf
        if not fits(out):
            if layout.c_buf is None or layout.c_buf.shape != out.shape:
                layout.c_buf = cp.empty(out.shape, dtype=self.dtype, order=order)
            c = layout.c_buf
        return b, c

    def _dense(self, k, b, c, order):
        """(B's, C's) dense descriptors on arrays ``b`` and ``c``: vectors for a 1-D ``b``, else
        k-column matrices of cusparseOrder_t ``order``."""
        lib, m, n = self.lib, self.shape[0], self.shape[1]
        if b.ndim == 1:
            return (_Owned(lib, "DnVec", lib.createDnVec(n, b.data.ptr, self._vtype)),
                    _Owned(lib, "DnVec", lib.createDnVec(m, c.data.ptr, self._vtype)))
        ldb, ldc = (k, k) if order == ORDER_ROW else (n, m)
        return (_Owned(lib, "DnMat", lib.createDnMat(n, k, ldb, b.data.ptr, self._vtype, order)),
                _Owned(lib, "DnMat", lib.createDnMat(m, k, ldc, c.data.ptr, self._vtype, order)))

    def _new_layout(self, key, stream, B, out):
        """Size and allocate the workspace of a new layout (once). None where cuSPARSE refuses it
        with its default algorithm (recorded; the run is cupyx's); RuntimeError naming the config
        where it refuses a named one."""
        cp, lib = cupy_module(), self.lib
        k, order = key
        algs = SPMV_ALGS if B.ndim == 1 else SPMM_ALGS
        if self.alg not in algs:
            raise ValueError(f"params['alg']: {self.alg!r} is not a cuSPARSE {'SpMV' if B.ndim == 1 else 'SpMM'} "
                             f"algorithm; expected one of {sorted(algs)}")
        alg = algs[self.alg]
        handle = cp.cuda.device.get_cusparse_handle()
        # descriptors on B and out as given: the pointers are set again on every run, the
        # leading dimensions follow from the order alone
        try:
            b, c = self._dense(k, B, out, order)
            self.buffer_size_calls += 1
            if B.ndim == 1:
                size = lib.spMV_bufferSize(handle, 0, self._one.ctypes.data, self._spmat.handle, b.handle,
                                           self._zero.ctypes.data, c.handle, self._vtype, alg)
            else:
                size = lib.spMM_bufferSize(handle, 0, 0, self._one.ctypes.data, self._spmat.handle, b.handle,
                                           self._zero.ctypes.data, c.handle, self._vtype, alg)
        except getattr(lib, "CuSparseError", RuntimeError) as exc:
            what = "a vector" if B.ndim == 1 else f"{k} columns, {'row' if order == ORDER_ROW else 'column'}-major"
            reason = f"cuSPARSE refused B of {what} with alg {self.alg!r}: {type(exc).__name__}: {exc}"
            if self.alg != "default":    # a named config that cannot run fails, never runs another call
                if B.ndim == 2:
                    REFUSED.add((self.dtype.name, np.dtype(self._arrays[1].dtype).name, self.order, self.alg))
                raise RuntimeError(f"spmv.cusparse params {self.params}: {reason}") from exc
            self.layout_fallbacks[key] = reason
            return None
        workspace = cp.empty(size, dtype=cp.int8) if size else None
        settable = hasattr(lib, "dnVecSetValues") and hasattr(lib, "dnMatSetValues")
        layout = _Layout(b if settable else None, c if settable else None, workspace, order, alg)
        self._layouts[key + (stream,)] = layout
        while len(self._layouts) > MAX_LAYOUTS:
            self._layouts.popitem(last=False)
        return layout

    def close(self) -> None:
        """Destroy the descriptors now and drop the workspaces and buffers (also done when
        collected); later runs take the cupyx path."""
        self._layouts.clear()
        if self._spmat is not None:
            self._spmat.close()
            self._spmat = None
        self.fallback = self.fallback or "closed: its descriptors were destroyed"
