"""LinearOperators over a bound plan, so iterative solvers use the planned product.

``plan.as_linear_operator(A)`` / ``bound.as_linear_operator()`` give SciPy's
``LinearOperator`` on the host and cupyx's on the GPU:

* matvec runs the bound plan. A plan made for a vector (op spmv) takes x as is;
  a plan made for k columns (spmm, tsgemm, gemm) takes x as column 0 of a
  zero-padded n x k block (k times the work: plan for a vector when you need matvec).
* matmat runs X in blocks of the planned width k (the last block zero-padded);
  for a vector plan, that is one planned product per column.
* rmatvec / rmatmat (A^T y): only from ``Plan.as_linear_operator(A)``, which has A
  (and passes the planner, ``replan``: this module sits below it).
  At the first call A is transposed to CSR (one O(nnz) conversion, plus a
  planning pass over A^T for a vector) and the result is kept; nothing is paid if
  it is never called. ``BoundPlan.as_linear_operator()`` has no A, so it provides
  no rmatvec (SciPy/cupyx raise NotImplementedError).

Inputs are cast to the plan's dtype (the operator's dtype), as cupyx's solvers
cast b. Like ``plan.bind``, the operator is for A as it was when bound: rebuild
it after changing A.
"""
from __future__ import annotations

import numpy as np

from ..core.validation import normalize_matrix
from ..core.xp import cupy_module
from ..kernels.registry import family

VECTOR_OPS = ("spmv", "spmm", "tsgemm", "gemm")


def linear_operator(bound, A=None, replan=None):
    """A SciPy (host) or cupyx (GPU) LinearOperator applying ``bound``; rmatvec only if A is given,
    with ``replan`` (:func:`matplan.planner.plan`) to plan A^T's products."""
    if (A is None) != (replan is None):
        raise TypeError("linear_operator: rmatvec takes both A and replan (the planner), or neither")
    plan = bound.plan
    if plan.op not in VECTOR_OPS:
        raise TypeError(f"as_linear_operator: a {plan.op} plan multiplies by a sparse B; only "
                        f"{'/'.join(VECTOR_OPS)} plans act on vectors")
    f = plan.features
    if plan.backend == "gpu":
        from cupyx.scipy.sparse.linalg import LinearOperator
        xp = cupy_module()
    else:
        from scipy.sparse.linalg import LinearOperator
        xp = np
    forward = _Apply(bound, xp)
    rmatvec = rmatmat = None
    if A is not None:
        backward = _Transposed(A, plan, xp, replan)
        rmatvec, rmatmat = backward.matvec, backward.matmat
    return LinearOperator((f.m, f.n), matvec=forward.matvec, matmat=forward.matmat,
                          rmatvec=rmatvec, rmatmat=rmatmat, dtype=np.dtype(f.dtype))


class _Apply:
    """matvec / matmat through one bound plan, in blocks of its planned width."""

    def __init__(self, bound, xp):
        plan = bound.plan
        self.bound, self.xp = bound, xp
        self.dtype = np.dtype(plan.features.dtype)
        self.m = plan.features.m
        self.vector = plan.op == "spmv"
        self.width = 1 if self.vector else plan.features.k

    def matvec(self, x):
        x = x.astype(self.dtype, copy=False).reshape(-1)
        if self.vector:
            return self.bound(self.xp.ascontiguousarray(x))
        return self._blocks(x.reshape(-1, 1)).reshape(-1)

    def matmat(self, X):
        X = X.astype(self.dtype, copy=False)
        if not self.vector and X.shape[1] == self.width:
            return self.bound(self.xp.ascontiguousarray(X))
        return self._blocks(X)

    def _blocks(self, X):
        xp, w = self.xp, self.width
        cols = X.shape[1]
        Y = xp.empty((self.m, cols), dtype=self.dtype)
        for j in range(0, cols, w):
            if self.vector:
                Y[:, j] = self.bound(xp.ascontiguousarray(X[:, j]))
                continue
            cw = min(w, cols - j)
            block = xp.zeros((X.shape[0], w), dtype=self.dtype)
            block[:, :cw] = X[:, j:j + cw]
            Y[:, j:j + cw] = self.bound(block)[:, :cw]
        return Y


class _Transposed:
    """A^T products, planned and bound at the first call."""

    def __init__(self, A, plan, xp, replan):
        self.A, self.plan, self.xp, self.replan = A, plan, xp, replan
        self._apply = None

    def _get(self, x):
        if self._apply is None:
            A = normalize_matrix(self.A, self.plan)
            if not hasattr(A, "indptr"):
                AT = self.xp.ascontiguousarray(A.T)
            elif self.plan.backend == "gpu":   # matplan's SpTRANS: stable, ~1.3x cuSPARSE's csr2csc
                AT = family("sptrans").transpose(A)
            else:
                AT = A.T.tocsr()
            tplan = self.replan(AT, x, reuse=self.plan.reuse, deterministic=self.plan.deterministic)
            self._apply = _Apply(tplan.bind(AT), self.xp)
            self.A = None  # the transposed copy is all that is needed from now on
        return self._apply

    def matvec(self, y):
        y = self.xp.ascontiguousarray(y.astype(np.dtype(self.plan.features.dtype), copy=False).reshape(-1))
        return self._get(y).matvec(y)

    def matmat(self, Y):
        Y = Y.astype(np.dtype(self.plan.features.dtype), copy=False)
        return self._get(self.xp.ascontiguousarray(Y[:, 0])).matmat(Y)


__all__ = ["linear_operator"]
