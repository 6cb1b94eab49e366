"""TSM2 in float32 on tensor cores (3xTF32): C (m x k) = A (m x n) @ B (n x k) for small k.

``tsm2_tc.cu`` (its header has the details) multiplies by ``mma.sync`` in TF32 with each operand
split in a high and a low TF32 part, three products a term: float32 accuracy for finite values,
without the FP32 units' FMA rate, which bounds tsm2.cu's kernels and cuBLAS at k = 32 (about 0.6
of the copy bandwidth on an H100). Both layouts of A, never copied; A 16-byte aligned with its
rows (row-major) or columns (column-major) starting on 16-byte boundaries (:func:`check_a`).
Inf in A or B gives NaN in the rows and columns it reaches (and so do finite values past ~3.4e38),
where a float32 FMA kernel gives +-Inf: the planner uses this kernel only while :data:`ENABLED`
(environment ``MATPLAN_TF32X3=0`` turns it off).

The planner reaches it through ``tsgemm.tsm2``: the online timing tries the :data:`VARIANTS` for
float32 with k in :data:`TC_K` on a GPU of compute capability 8.0 or later (:func:`eligible`) and
keeps it when it is fastest; :class:`TcLaunch` is the launch a plan keeps.
"""
from __future__ import annotations

import os

import numpy as np

from .._xp import cupy_module
from . import _cuda

SOURCE = "tsm2_tc.cu"
#: Variants (warps a block W, 16-row tiles a warp RT, min resident blocks MB, 16-column steps of
#: A in flight D, LO: 1 rounds a's low part to TF32, 0 leaves the mma to truncate it); each comes
#: with NT = 2 and 4 n-tiles (k <= 16: 2, else 4 a pass). Must match tsm2_tc.cu's instantiations.
VARIANTS = {"w8d1": (8, 2, 2, 1, 1), "w8d1t": (8, 2, 2, 1, 0), "m1d2": (8, 2, 1, 2, 1), "m1d2t": (8, 2, 1, 2, 0),
            "w8d2": (8, 2, 2, 2, 1)}
#: Rows of B a shared-memory tile holds (the kernels' KC).
KC = 64
#: k the online timing tries this kernel for (below, tsm2.cu's kernels are at the copy bandwidth).
TC_K = (9, 64)
#: Whether the planner may use this kernel (its Inf handling differs: see the module docstring).
ENABLED = os.environ.get("MATPLAN_TF32X3", "1") != "0"
#: Most slices of n (split-K) a launch uses.
MAX_SPLIT = 64


def _names() -> tuple:
    return tuple(kernel_name(col, nt, v) for v in VARIANTS for nt in (2, 4) for col in (False, True))


def kernel_name(col: bool, nt: int, variant: str) -> str:
    w, rt, mb, d, lo = VARIANTS[variant]
    return f"tsm2_tf32x3<{'true' if col else 'false'},{nt},{w},{rt},{KC},{mb},{d},{lo}>"


def n_tiles(k: int) -> int:
    """8-column n-tiles a pass: 2 for k <= 16, else 4 (k > 32 takes several passes)."""
    return 2 if k <= 16 else 4


def eligible(dtype, k: int, layout: str, m: int, n: int) -> bool:
    """Whether the online timing tries this kernel: ENABLED, float32, k in TC_K, a GPU of compute
    capability 8.0 or later, and A's rows (row-major: n % 4 == 0) or columns (column-major:
    m % 4 == 0) on 16-byte boundaries in the contiguous layout."""
    if not ENABLED or np.dtype(dtype) != np.float32 or not TC_K[0] <= k <= TC_K[1]:
        return False
    if (n if layout == "row" else m) % 4:
        return False
    cp = cupy_module()
    return cp is not None and int(cp.cuda.Device().compute_capability) >= 80


def check_a(A, layout: str) -> int:
    """A's leading dimension (elements) when this kernel can read it; else ValueError naming A."""
    from . import tsm2_async
    return tsm2_async.check_a(A, layout == "col", kernel="tensor-core (3xTF32)")


class TcLaunch:
    """One launch of the 3xTF32 kernel for arrays of these shapes and strides: the kernel, the
    split over n (enough blocks for whole waves of resident blocks, tsm2.split_waves) and the
    scalar arguments worked out once; calling it only launches (and sums the slices)."""

    def __init__(self, A, B, C, layout: str, lda: int, variant: str = "w8d2", slices: int | None = None):
        from . import tsm2
        if variant not in VARIANTS:
            raise ValueError(f"variant: {variant!r}; expected one of {sorted(VARIANTS)}")
        if A.dtype != np.float32:
            raise ValueError(f"A: the 3xTF32 kernel is float32 only, got {A.dtype}")
        m, n = A.shape
        k = B.shape[1]
        w, rt = VARIANTS[variant][:2]
        col = layout == "col"
        self.fn = _cuda.function(SOURCE, kernel_name(col, n_tiles(k), variant), _names())
        self.launch = _cuda.packed(self.fn, SOURCE, "tsm2_tf32x3")
        rows = w * rt * 16
        bx = -(-m // rows)
        sms = tsm2._sms()
        slots = tsm2._resident_blocks(self.fn, 32 * w) * sms
        if slices:
            S, L = tsm2.split_waves(int(slices), int(slices), bx, n, KC, 0)
        else:
            S0 = max(1, min(-(-max(slots, sms) // bx), MAX_SPLIT, n // (4 * KC)))
            S, L = tsm2.split_waves(S0, min(2 * S0, MAX_SPLIT, max(S0, n // (4 * KC))), bx, n, KC, slots)
        item = A.itemsize
        cs = (C.strides[0] // item, C.strides[1] // item)
        ldc_r, ldc_c = cs if S == 1 else (k, 1)
        mk = m * k
        self.S, self.ws_shape = S, (S, m, k)
        self.grid, self.block = (bx, S), (32 * w,)
        self.lda, self.tail = int(lda), (int(ldc_r), int(ldc_c), m, n, k, int(L), mk)
        if S > 1:
            sum_fn = _cuda.function(tsm2.SOURCE, "tsm2_split_sum<float>", tsm2.SPLIT_SUM_NAMES)
            self.sum_launch = _cuda.packed(sum_fn, tsm2.SOURCE, "tsm2_split_sum")
            self.sum_grid = (min(-(-mk // 256), 4 * sms),)
            self.sum_args = (S, mk, k, int(cs[0]), int(cs[1]))

    def __call__(self, A, B, C) -> None:
        out = C if self.S == 1 else cupy_module().empty(self.ws_shape, dtype=np.float32)
        self.launch(self.grid, self.block, (A, self.lda, B, B.strides[0] // 4, out, *self.tail))
        if self.S > 1:
            S, mk, k, c0, c1 = self.sum_args
            self.sum_launch(self.sum_grid, (256,), (out, S, mk, k, C, c0, c1))


def matmul(A, B, out=None, variant: str = "w8d2", slices: int | None = None):
    """C = A @ B (float32 CuPy arrays, A C- or F-ordered and aligned as :func:`check_a` says, B
    n x k with unit stride along its rows) by the 3xTF32 kernel; for tests and benchmarks (the
    planner goes through ``tsgemm.tsm2``)."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("tsm2_tc needs CuPy and an NVIDIA GPU")
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"A, B: expected (m, n) and (n, k), got {A.shape} and {B.shape}")
    if A.dtype != np.float32:
        raise ValueError(f"A: the 3xTF32 kernel is float32 only, got {A.dtype}")
    if B.dtype != A.dtype:
        raise ValueError(f"B: dtype {B.dtype} does not match A's {A.dtype}")
    from .tsm2 import layout_of
    layout, _ = layout_of(A)
    lda = check_a(A, layout)
    if B.strides[1] != B.itemsize:
        B = cp.ascontiguousarray(B)
    m, k = A.shape[0], B.shape[1]
    C = cp.empty((m, k), dtype=A.dtype) if out is None else out
    if out is not None and (out.shape != (m, k) or out.dtype != A.dtype):
        raise ValueError(f"out: expected shape {(m, k)} and dtype {A.dtype}, got {out.shape} {out.dtype}")
    if m and k:
        if A.shape[1] == 0:
            C.fill(0)
        else:
            TcLaunch(A, B, C, layout, lda, variant, slices)(A, B, C)
    return C


__all__ = ["TcLaunch", "matmul", "eligible", "check_a", "VARIANTS", "TC_K", "ENABLED"]
