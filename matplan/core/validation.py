"""Input checking at the entry point: one place that turns (A, B) into a Problem or raises a clear error.

Accepted: SciPy sparse (any format; converted once to CSR), NumPy arrays, and
with CuPy present cupyx sparse matrices, CuPy arrays, objects exposing
``__cuda_array_interface__`` and DLPack capsules' producers. Dtypes float32
and float64; a float32/float64 mix is upcast to float64 (documented), anything
else is an error. Both operands must live on the same side (host or GPU).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

from .xp import cupy_module, cupyx_sparse

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
        A = _to_csr(A)
        if b_sparse:
            op, B = "spgemm", _to_csr(B)
        else:
            op = "spmv" if B.ndim == 1 else "spmm"
    elif b_sparse:
        raise TypeError("A is dense and B is sparse: not supported; compute (B.T @ A.T).T instead")
    else:
        k = 1 if B.ndim == 1 else B.shape[1]
        op = "tsgemm" if k <= TSGEMM_MAX_K and B.shape[0] >= TSGEMM_MIN_ASPECT * k else "gemm"
    if dt_a != dtype:
        A = A.astype(dtype)
    if dt_b != dtype:
        B = B.astype(dtype)
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


def _check_against_plan(x, name, backend, plan):
    if backend != plan.backend:
        raise ValueError(f"{name}: this plan runs on the {plan.backend}, but {name} is on the {backend}")
    dt = _check_dtype(x, name)
    if str(dt) != plan.features.dtype:
        raise ValueError(f"{name}: this plan is for {plan.features.dtype}, got {dt}")


def normalize_matrix(A, plan):
    """A alone, checked against ``plan`` (shape, dtype, backend); sparse A becomes CSR."""
    A, backend = _as_array(A, "A")
    _check_against_plan(A, "A", backend, plan)
    f = plan.features
    if A.shape != (f.m, f.n):
        raise ValueError(f"A: this plan is for a {f.m}x{f.n} matrix, got {A.shape[0]}x{A.shape[1]}")
    sparse_op = plan.op in ("spmv", "spmm", "spgemm", "sptrans")
    if sparse_op != _is_sparse(A):
        raise TypeError(f"A: this plan ({plan.op}) expects a {'sparse' if sparse_op else 'dense'} matrix")
    return _to_csr(A) if sparse_op else A


def check_transpose_call(B, out) -> None:
    """A SpTRANS run takes A alone: TypeError naming B, ValueError naming out otherwise (the
    SpTRANS kernels' run and :func:`normalize_operand`)."""
    if B is not None:
        raise TypeError("B: a SpTRANS plan transposes A alone; pass no B")
    if out is not None:
        raise ValueError("out: not supported for sptrans (A.T is a new sparse matrix)")


def normalize_operand(B, plan):
    """B alone, checked against ``plan``: rows, columns (for dense B), dtype, backend; None for a
    SpTRANS plan, which takes no B."""
    if plan.op == "sptrans":
        check_transpose_call(B, None)   # TypeError naming B unless B is None
        return None
    if B is None:
        raise TypeError(f"B: this plan ({plan.op}) needs B; got None")
    B, backend = _as_array(B, "B")
    _check_against_plan(B, "B", backend, plan)
    f = plan.features
    if B.shape[0] != f.n:
        raise ValueError(f"B: expected {f.n} rows to match A ({f.m}x{f.n}), got {B.shape[0]}")
    if plan.op == "spgemm":
        if not _is_sparse(B):
            raise TypeError("B: this plan (spgemm) expects a sparse matrix")
        return _to_csr(B)
    if _is_sparse(B):
        raise TypeError(f"B: this plan ({plan.op}) expects a dense array, got a sparse matrix")
    want_ndim = 1 if plan.op == "spmv" or (plan.op == "tsgemm" and f.k == 1 and B.ndim == 1) else 2
    if B.ndim != want_ndim or (want_ndim == 2 and B.shape[1] != f.k):
        raise ValueError(f"B: this plan expects shape {(f.n,) if want_ndim == 1 else (f.n, f.k)}, got {B.shape}")
    return B
