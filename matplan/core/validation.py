"""Input checking at the entry point: one place that turns (A, B) into a Problem or raises a clear error.

Accepted: SciPy sparse (any format; converted once to CSR), NumPy arrays, and
with CuPy present cupyx sparse matrices, CuPy arrays, objects exposing
``__cuda_array_interface__`` and DLPack capsules' producers. Dtypes float32
and float64; a float32/float64 mix is upcast to float64 (documented), anything
else is an error. Both operands must live on the same side (host or GPU).

The rules every path of a plan follows (``Plan.run``, ``Plan.bind`` and the bound call,
``matplan.matmul``), kept here so they cannot drift apart:

* dtype: a plan computes in its dtype, NumPy's promotion of the dtypes of the A and B it was
  made for. Operands are accepted when NumPy's promotion of A's and B's dtypes gives the
  plan's dtype, and are then cast to it (a float32 operand beside a float64 one is upcast, as
  ``plan()`` did; a sparse operand entry by entry, duplicates kept, before its CSR conversion); ``bind(A)`` accepts an A that promotes to it, and the bound call a B that
  promotes with that A's dtype to it. Anything else is a ValueError naming the dtypes.
* B's form: a plan for k = 1 takes B as ``(n,)`` or ``(n, 1)``; the result follows NumPy:
  ``(m,)`` for a vector, ``(m, k)`` for an ``(n, k)`` B (:func:`check_operand_shape`).
* ``out`` (:func:`check_out`): an array of the plan's backend (NumPy / CuPy, on the operands'
  GPU) of exactly the result's shape and the plan's dtype (no casting), C-contiguous for sparse
  products on the GPU (the kernels write rows by pointer), writeable, sharing no memory with
  an operand; no ``out`` for a sparse result (SpGEMM, SpTRANS).
* CSR structure (:func:`check_csr`): indptr of m + 1 entries from 0, non-decreasing, ending at
  len(indices) = len(data), column indices in [0, n). Checked where A lives, one pass, when
  a plan is made or bound and when ``Plan.run`` meets a new A; ``check=False`` skips it for
  callers who vouch for their arrays (malformed indices then read out of bounds).
"""
from __future__ import annotations

import dataclasses
import functools
import weakref

import numpy as np
import scipy.sparse as sp

from . import figures
from .xp import cupy_module, cupyx_sparse, host_index_arrays

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: B counts as tall and skinny (op "tsgemm") when it has at most this many columns ...
TSGEMM_MAX_K = 64
#: ... and at least this many times more rows than columns.
TSGEMM_MIN_ASPECT = 16


@dataclasses.dataclass(frozen=True)
class Problem:
    op: str            # spmv | spmm | spgemm | tsgemm | gemm | sptrans
    A: object          # CSR (SciPy or cupyx) or dense 2-D array
    B: object          # dense 1-D/2-D array or CSR; None for sptrans (A.T alone)
    backend: str       # "cpu" | "gpu"
    dtype: np.dtype

    @functools.cached_property
    def host_index(self) -> dict:
        """{"A": .., "B": ..}: each small GPU CSR operand's index arrays on the host
        (``xp.host_index_arrays``; None otherwise), copied once for the structure check and the
        statistics alike."""
        return {"A": host_index_arrays(self.A), "B": None if self.B is None else host_index_arrays(self.B)}


def _is_sparse(x) -> bool:
    if sp.issparse(x):
        return True
    csp = cupyx_sparse()
    return csp is not None and csp.issparse(x)


def _as_array(x, name):
    """The array behind ``x`` and its backend, without copying where possible."""
    cp = cupy_module()
    if isinstance(x, np.ndarray):
        return x, "cpu"
    if sp.issparse(x):
        return x, "cpu"
    if cp is not None:
        if isinstance(x, cp.ndarray) or cupyx_sparse().issparse(x):
            return x, "gpu"
        if hasattr(x, "__cuda_array_interface__"):
            return cp.asarray(x), "gpu"
    if hasattr(x, "__dlpack_device__"):
        dev_type = x.__dlpack_device__()[0]
        if dev_type == 1:  # kDLCPU
            return np.from_dlpack(x), "cpu"
        if dev_type in (2, 3, 13) and cp is not None:  # CUDA, CUDA host, CUDA managed
            return cp.from_dlpack(x), "gpu"
        raise TypeError(f"{name}: DLPack device type {dev_type} is not supported"
                        + ("" if cp is not None else " (CuPy with a GPU is needed for device arrays)"))
    if hasattr(x, "__cuda_array_interface__"):
        raise TypeError(f"{name}: a GPU array was passed but CuPy with a GPU is not available")
    if isinstance(x, (list, tuple)):
        return np.asarray(x), "cpu"
    raise TypeError(f"{name}: expected a SciPy/cupyx sparse matrix or a NumPy/CuPy array, "
                    f"got {type(x).__name__}")


def _check_dtype(x, name):
    dt = np.dtype(x.dtype)
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: dtype {dt} is not supported; expected float32 or float64 "
                        f"(cast with {name}.astype(numpy.float64))")
    return dt


def check_int(value, name: str, expected: str, minimum: int = 1) -> int:
    """``value`` as an int: a Python or NumPy integer of at least ``minimum``; anything else (bool
    included) is a ValueError naming ``name`` and ``expected``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        kind = " (a bool)" if isinstance(value, (bool, np.bool_)) else ""
        raise ValueError(f"{name}: expected {expected}, got {value!r}{kind}")
    return int(value)


def check_csr(M, name: str, host=None, flags=None) -> None:
    """Raise ValueError naming ``name`` unless CSR ``M`` is well formed: indptr of m + 1 entries
    from 0, non-decreasing, ending at len(indices) = len(data); column indices in [0, n).

    Vectorised where M lives: one pass over indices (as unsigned, so a negative index counts as
    too large) and one over indptr, one transfer to the host. On the GPU the statistics kernel
    does it (``figures``; ``flags``: its findings where the caller has them), else NumPy or CuPy.
    Duplicates and unsorted indices are allowed. ``host``: M's index arrays already on the host
    (``Problem.host_index``), else copied here where M is a small GPU operand without the kernel."""
    m, n = M.shape
    indptr, indices, data = M.indptr, M.indices, M.data
    for arr, what in ((indptr, "indptr"), (indices, "indices")):
        if arr.ndim != 1 or np.dtype(arr.dtype).kind not in "iu":
            raise ValueError(f"{name}: CSR {what} must be a 1-D integer array, got {arr.dtype} of shape {arr.shape}")
    if indptr.shape[0] != m + 1:
        raise ValueError(f"{name}: CSR indptr has {indptr.shape[0]} entries, expected {m + 1} (rows + 1)")
    nnz = indices.shape[0]
    if data.shape != (nnz,):
        raise ValueError(f"{name}: CSR data has shape {data.shape} but indices has {nnz} entries")
    cp = cupy_module()
    if flags is None and host is None:   # a GPU operand: one launch of the kernel, one small copy
        found = figures.kernel_figures("check", M)
        flags = None if found is None else found.a
    if flags is None:
        if host is None:   # a small GPU operand: checked on the host (no CuPy kernel compiles)
            host = host_index_arrays(M)
        if host is not None:
            indptr, indices = host.indptr, host.indices
        if cp is not None and isinstance(indptr, cp.ndarray):
            with indptr.device:
                bad = _csr_flags(cp, indptr, indices, n, nnz).get()
        else:
            bad = _csr_flags(np, indptr, indices, n, nnz)
        flags = figures.CsrFlags(*(bool(b) for b in bad), indptr[0], indptr[-1])
    first, last, falls, cols = flags.first, flags.last, flags.falls, flags.cols
    if first:
        raise ValueError(f"{name}: malformed CSR: indptr[0] is {int(flags.ptr0)}, expected 0")
    if falls:
        raise ValueError(f"{name}: malformed CSR: indptr decreases (row lengths must be >= 0)")
    if last:
        raise ValueError(f"{name}: malformed CSR: indptr[-1] is {int(flags.ptrm)} but indices has {nnz} "
                         "entries (trim spare capacity: SciPy's A.prune())")
    if cols:
        raise ValueError(f"{name}: malformed CSR: a column index is negative or >= {n} (the number of columns)")


def _csr_flags(xp, indptr, indices, n, nnz):
    """[indptr[0] != 0, indptr[-1] != nnz, indptr decreases, a column outside [0, n)] as one array."""
    falls = (indptr[1:] < indptr[:-1]).any() if indptr.shape[0] > 1 else xp.asarray(False)
    if nnz:
        unsigned = indices.view(np.dtype(f"u{indices.dtype.itemsize}"))
        cols = unsigned.max() >= n
    else:
        cols = xp.asarray(False)
    return xp.stack([indptr[0] != 0, indptr[-1] != nnz, falls, cols])


def check_structure(problem) -> None:
    """:func:`check_csr` on a Problem's CSR operands (A, and B for SpGEMM); on the GPU from the
    statistics kernel's findings, which the statistics then reuse (``figures.problem_figures``)."""
    found = figures.problem_figures(problem)
    if _is_sparse(problem.A):
        if found is not None:
            check_csr(problem.A, "A", flags=found.a)
        else:
            check_csr(problem.A, "A", problem.host_index["A"])
    if problem.B is not None and _is_sparse(problem.B) and problem.B is not problem.A:   # A @ A: checked once
        if found is not None and found.b is not None:
            check_csr(problem.B, "B", flags=found.b)
        else:
            check_csr(problem.B, "B", problem.host_index["B"])


class CheckedOnce:
    """The CSR operands whose structure was last checked, so a run with the same objects skips the
    check: weak references to each and to its indptr / indices / data (replacing ``A.indices``
    counts as new; arrays without weak references are matched by id). Writes in place are not
    seen (the caller vouches for them)."""
    __slots__ = ("_seen",)

    def __init__(self):
        self._seen = {}

    def ensure(self, M, name: str) -> None:
        """check_csr(M) unless M is the object last checked under ``name``, with the same arrays."""
        last = self._seen.get(name)
        if last is None or not _same(last, (M, M.indptr, M.indices, M.data)):
            check_csr(M, name)
            self.remember(M, name)

    def remember(self, M, name: str) -> None:
        """Record M (already checked) under ``name``."""
        self._seen[name] = tuple(_ref(x) for x in (M, M.indptr, M.indices, M.data))


def _ref(x):
    try:
        return weakref.ref(x)
    except TypeError:
        return id(x)


def _same(refs, objs) -> bool:
    for r, o in zip(refs, objs):
        if (r() is not o) if type(r) is weakref.ref else r != id(o):
            return False
    return True


def _cast(x, dtype):
    """``x`` as ``dtype``, before any CSR conversion: a sparse x keeps its entries as they are
    (duplicates included), so its product multiplies each as SciPy's does (SciPy's ``astype`` and a
    COO's ``tocsr`` sum duplicates, which moves NaN and Inf and rounds the sum in x's dtype)."""
    if not _is_sparse(x):
        return x.astype(dtype)
    y = x.copy()
    y.data = x.data.astype(dtype)
    return y


def _to_csr(x):
    """CSR once; a CSR input is kept as is (duplicates and unsorted indices are allowed)."""
    return x if x.format == "csr" else x.tocsr()


def normalize(A, B) -> Problem:
    """Validate (A, B) and infer the operation; raises TypeError/ValueError naming the argument."""
    A, backend_a = _as_array(A, "A")
    B, backend_b = _as_array(B, "B")
    if backend_a != backend_b:
        where = {"cpu": "host memory", "gpu": "GPU memory"}
        raise ValueError(f"A is in {where[backend_a]} but B is in {where[backend_b]}; "
                         "move both to the same side (cupy.asarray / .get())")
    dt_a, dt_b = _check_dtype(A, "A"), _check_dtype(B, "B")
    dtype = np.promote_types(dt_a, dt_b)
    a_sparse, b_sparse = _is_sparse(A), _is_sparse(B)
    if not a_sparse and A.ndim != 2:
        raise ValueError(f"A: expected a 2-D matrix, got an array of shape {A.shape}")
    if not b_sparse and B.ndim not in (1, 2):
        raise ValueError(f"B: expected a vector or a 2-D matrix, got an array of shape {B.shape}")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A and B do not conform: A is {A.shape[0]}x{A.shape[1]} "
                         f"but B has {B.shape[0]} rows (expected {A.shape[1]})")
    if a_sparse:
        op = "spgemm" if b_sparse else "spmv" if B.ndim == 1 else "spmm"
    elif b_sparse:
        raise TypeError("A is dense and B is sparse: not supported; compute (B.T @ A.T).T instead")
    else:
        k = 1 if B.ndim == 1 else B.shape[1]
        op = "tsgemm" if k <= TSGEMM_MAX_K and B.shape[0] >= TSGEMM_MIN_ASPECT * k else "gemm"
    if dt_a != dtype:
        A = _cast(A, dtype)
    if dt_b != dtype:
        B = _cast(B, dtype)
    if a_sparse:
        A = _to_csr(A)
    if b_sparse:
        B = _to_csr(B)
    return Problem(op, A, B, backend_a, dtype)


def normalize_transpose(A) -> Problem:
    """Validate A for SpTRANS (A.T as CSR): a sparse matrix of float32 / float64, made CSR once;
    raises TypeError naming A otherwise."""
    A, backend = _as_array(A, "A")
    if not _is_sparse(A):
        raise TypeError(f"A: SpTRANS plans transpose a sparse matrix (SciPy or cupyx); got a dense "
                        f"{type(A).__name__} (transpose a dense array with A.T)")
    dtype = _check_dtype(A, "A")
    return Problem("sptrans", _to_csr(A), None, backend, dtype)


def _check_backend(name, backend, plan):
    if backend != plan.backend:
        raise ValueError(f"{name}: this plan runs on the {plan.backend}, but {name} is on the {backend}")


def dtype_for_plan(dt, name, plan, other=None) -> np.dtype:
    """The plan's dtype if ``dt`` (promoted with ``other``, the other operand's dtype, when known)
    gives it by NumPy's promotion, as plan() promoted its operands; ValueError naming ``name``
    otherwise. With ``other`` None, ``dt`` need only promote to the plan's dtype (bind's A, whose
    B is not known yet)."""
    want = np.dtype(plan.features.dtype)
    got = np.promote_types(dt, other) if other is not None else np.promote_types(dt, want)
    if got != want or (plan.op == "sptrans" and dt != want):
        beside = "" if other is None else f" (with {'B' if name == 'A' else 'A'} of {np.dtype(other)}: {got})"
        raise ValueError(f"{name}: this plan is for {want}, got {dt}{beside}; make a plan for these dtypes")
    return want


def bind_matrix(A, plan):
    """(A checked against ``plan`` and cast to its dtype, A's own dtype): shape, backend, dtype
    (:func:`dtype_for_plan`), sparse or dense; sparse A becomes CSR."""
    A, backend = _as_array(A, "A")
    _check_backend("A", backend, plan)
    dt = _check_dtype(A, "A")
    want = dtype_for_plan(dt, "A", plan)
    f = plan.features
    if A.shape != (f.m, f.n):
        raise ValueError(f"A: this plan is for a {f.m}x{f.n} matrix, got {A.shape[0]}x{A.shape[1]}")
    sparse_op = plan.op in ("spmv", "spmm", "spgemm", "sptrans")
    if sparse_op != _is_sparse(A):
        raise TypeError(f"A: this plan ({plan.op}) expects a {'sparse' if sparse_op else 'dense'} matrix")
    A = A if dt == want else _cast(A, want)
    return (_to_csr(A) if sparse_op else A), dt


def normalize_matrix(A, plan):
    """A alone, checked against ``plan`` (shape, dtype, backend) and cast to its dtype; sparse A
    becomes CSR."""
    return bind_matrix(A, plan)[0]


def check_transpose_call(B, out) -> None:
    """A SpTRANS run takes A alone: TypeError naming B, ValueError naming out otherwise (the
    SpTRANS kernels' run and :func:`normalize_operand`)."""
    if B is not None:
        raise TypeError("B: a SpTRANS plan transposes A alone; pass no B")
    if out is not None:
        raise ValueError("out: not supported for sptrans (A.T is a new sparse matrix)")


def normalize_operand(B, plan, a_dtype=None):
    """B alone, checked against ``plan`` and cast to its dtype: rows, columns (for dense B: ``(n,)``
    or ``(n, k)``, :func:`check_operand_shape`), dtype (promoted with ``a_dtype``, the bound A's,
    by :func:`dtype_for_plan`), backend; None for a SpTRANS plan, which takes no B."""
    if plan.op == "sptrans":
        check_transpose_call(B, None)   # TypeError naming B unless B is None
        return None
    if B is None:
        raise TypeError(f"B: this plan ({plan.op}) needs B; got None")
    B, backend = _as_array(B, "B")
    _check_backend("B", backend, plan)
    dt = _check_dtype(B, "B")
    want = dtype_for_plan(dt, "B", plan, np.dtype(plan.features.dtype) if a_dtype is None else a_dtype)
    f = plan.features
    if B.shape[0] != f.n:
        raise ValueError(f"B: expected {f.n} rows to match A ({f.m}x{f.n}), got {B.shape[0]}")
    if plan.op == "spgemm":
        if not _is_sparse(B):
            raise TypeError("B: this plan (spgemm) expects a sparse matrix")
    else:
        if _is_sparse(B):
            raise TypeError(f"B: this plan ({plan.op}) expects a dense array, got a sparse matrix")
        check_operand_shape(B, plan)
    B = B if dt == want else _cast(B, want)
    return _to_csr(B) if plan.op == "spgemm" else B


def check_operand_shape(B, plan) -> None:
    """A dense B of a plan for k columns is ``(n, k)``, or ``(n,)`` when k = 1; ValueError otherwise."""
    f = plan.features
    if not ((B.ndim == 1 and f.k == 1) or (B.ndim == 2 and B.shape[1] == f.k)):
        want = f"({f.n},) or ({f.n}, 1)" if f.k == 1 else f"({f.n}, {f.k})"
        raise ValueError(f"B: this plan expects shape {want}, got {B.shape}")


def as_planned(x, plan):
    """A k = 1 operand or output in the form the plan's SpMV/SpMM kernel was chosen for: a view,
    ``(n, 1)`` -> ``(n,)`` for an SpMV plan and ``(n,)`` -> ``(n, 1)`` for an SpMM plan; else ``x``."""
    if plan.op == "spmv" and x.ndim == 2:
        return x.reshape(x.shape[0])
    if plan.op == "spmm" and x.ndim == 1:
        return x.reshape(x.shape[0], 1)
    return x


def result_shape(plan, B) -> tuple | None:
    """The shape of A @ B for this plan's A and a dense B, as NumPy gives it; None for a sparse
    result (no B, or a sparse B)."""
    if B is None or _is_sparse(B):
        return None
    return (plan.features.m,) if B.ndim == 1 else (plan.features.m, B.shape[1])


def check_out(out, plan, shape, B, A) -> None:
    """Raise TypeError / ValueError naming ``out`` unless it can take this plan's result of ``shape``
    (see the module docstring): NumPy or CuPy as the plan runs, on B's GPU, exactly ``shape`` and
    the plan's dtype, C-contiguous for a sparse product on the GPU, writeable, and sharing no memory
    with B or A (a matrix, a CSR, or a prepared format's arrays)."""
    check_result_out(out, plan.op, plan.backend, np.dtype(plan.features.dtype), shape, B, A)


def check_result_out(out, op, backend, dtype, shape, B, A) -> None:
    """:func:`check_out` for a product of ``op`` on ``backend`` whose result has ``dtype`` and ``shape``."""
    if op in ("spgemm", "sptrans"):
        raise ValueError(f"out: not supported for {op} (the result is a new sparse matrix)")
    gpu = backend == "gpu"
    xp = cupy_module() if gpu else np
    if xp is None or not isinstance(out, xp.ndarray):
        want = "a CuPy array (this plan runs on the GPU)" if gpu else "a NumPy array (this plan runs on the host)"
        raise TypeError(f"out: expected {want}, got {type(out).__module__}.{type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"out: expected shape {shape} (the result's), got {out.shape}")
    if out.dtype != dtype:
        raise TypeError(f"out: expected dtype {dtype} (the result's; out is never cast), got {out.dtype}")
    if gpu:
        if op in ("spmv", "spmm") and not out.flags.c_contiguous:
            raise ValueError("out: a sparse product on the GPU writes a C-contiguous out; got strides "
                             f"{out.strides} (pass cupy.empty({shape}, dtype) or None)")
        if out.device.id != B.device.id:
            raise ValueError(f"out: on GPU {out.device.id}, but the operands are on GPU {B.device.id}")
    elif not out.flags.writeable:
        raise ValueError("out: read-only array")
    for name, x in (("B", B), ("A", A)):
        if any(_overlap(xp, out, a) for a in _arrays(x)):
            raise ValueError(f"out: shares memory with {name}; pass a separate array (or None)")


def _overlap(xp, out, a) -> bool:
    if not isinstance(a, xp.ndarray):   # a host array kept beside a GPU format, or a scalar
        return False
    if xp is np:
        return np.shares_memory(out, a)
    return xp.may_share_memory(out, a) and xp.shares_memory(out, a)   # bounds first: exact is a GPU sort


def _arrays(x):
    """The arrays behind an operand: itself, a CSR's data / indices / indptr, a prepared format's
    arrays (dicts, lists and tuples walked)."""
    if x is None:
        return
    if hasattr(x, "indptr"):
        yield from (x.data, x.indices, x.indptr)
    elif hasattr(x, "strides") and hasattr(x, "dtype"):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _arrays(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _arrays(v)
