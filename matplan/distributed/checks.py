"""The row-sum check every SpGEMM block passes before it counts: C @ 1 against A @ (B @ 1).

This is how matplan checks SpGEMM elsewhere (benchmarks/spgemm.py, the panel tests): one SpMV
with A's block and B's row sums, cheap next to the product, which catches a lost, doubled or
misplaced row or entry of any size above the rounding of the sums. The tolerance is rounding's
own bound for a row: (products of the row + 2) * eps(dtype) * (|A| @ (|B| @ 1)) of that row, so a
float32 product is held to float32's precision and a float64 one to float64's.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..core.xp import array_module, to_host


class BlockCheckError(ArithmeticError):
    """A block of C failed its row-sum check (it does not count; the product raises)."""


@dataclasses.dataclass(frozen=True)
class RowSums:
    """B's row sums and absolute row sums in float64, computed once and sent with B."""
    sums: object       # B @ 1
    abs_sums: object   # |B| @ 1

    @classmethod
    def of(cls, B) -> "RowSums":
        xp = array_module(B)
        ones = xp.ones(B.shape[1], dtype=xp.float64)
        return cls(_float64(B) @ ones, _float64(B, absolute=True) @ ones)


def _float64(M, absolute: bool = False):
    """CSR ``M`` in float64 (|M| if ``absolute``) as a new matrix over M's index arrays: never
    SciPy's abs(M), which sums M's duplicates in place, changing the caller's matrix."""
    xp = array_module(M)
    data = M.data.astype(xp.float64, copy=False)
    return type(M)((xp.abs(data) if absolute else data, M.indices, M.indptr), shape=M.shape)


class RowCheck:
    """The row-sum check of C = A_block @ B with everything that depends only on (A_block, B) made
    once: the reference A_block @ (B @ 1) and each row's tolerance. ``verify(C)`` then costs one
    pass over C (a resident block checks every product it computes at that price)."""

    def __init__(self, A_block, rowsums: RowSums, products, dtype):
        xp = array_module(A_block)
        self.m = A_block.shape[0]
        self.ref = _float64(A_block) @ xp.asarray(rowsums.sums) if self.m else None
        if self.m:
            scale = _float64(A_block, absolute=True) @ xp.asarray(rowsums.abs_sums)
            eps = float(np.finfo(np.dtype(dtype)).eps)
            self.tol = (xp.asarray(products, dtype=xp.float64) + 2.0) * eps * scale

    def verify(self, C_block) -> tuple:
        """(ok, worst): whether every row of C sums, within rounding, to A_block @ (B @ 1); ``worst``
        is the largest |difference| / tolerance over the rows (<= 1 passes; inf for a NaN where
        the reference is finite). Rows whose reference is not finite (inf or NaN in the inputs) pass
        when C's sum is not finite either. One transfer of two floats to the host."""
        if C_block.shape[0] != self.m:
            return False, float("inf")
        if self.m == 0:
            return True, 0.0
        xp = array_module(C_block)
        ref, tol = self.ref, self.tol
        got = _float64(C_block) @ xp.ones(C_block.shape[1], dtype=xp.float64)
        finite = xp.isfinite(ref)
        diff = xp.abs(xp.where(finite, got, 0.0) - xp.where(finite, ref, 0.0))
        excess = xp.where(tol > 0, diff / xp.where(tol > 0, tol, 1.0), xp.where(diff > 0, xp.inf, 0.0))
        excess = xp.where(finite & ~xp.isfinite(got), xp.inf, excess)   # NaN in C where none should be
        bad_nonfinite = (~finite & xp.isfinite(got)).any()
        worst, flag = (float(v) for v in to_host(xp.stack([excess.max(), bad_nonfinite.astype(xp.float64)])))
        if flag:
            worst = float("inf")
        return bool(worst <= 1.0), worst


def check_rowsums(A_block, C_block, rowsums: RowSums, products, dtype) -> tuple:
    """(ok, worst) of :meth:`RowCheck.verify` for one product (nothing kept)."""
    return RowCheck(A_block, rowsums, products, dtype).verify(C_block)
