"""TSM2 in float32 on tensor cores (3xTF32): C (m x k) = A (m x n) @ B (n x k) for small k.

``tsm2_tc.cu`` (its header has the details) multiplies by ``mma.sync`` in TF32 with each operand
split in a high and a low TF32 part, three products a term: float32-level accuracy for finite
values without the FP32 units' FMA rate, which bounds tsm2.cu's kernels and cuBLAS at k = 32.
Both layouts of A, never copied; A 16-byte aligned with its rows (row-major) or columns
(column-major) starting on 16-byte boundaries (:func:`check_a`). Each tile's tensor-core sums
are added into float32 sums (FL), so the result is as exact as the FP32 kernels' (max |error| /
max |C| against cupy.matmul at n = 16384: 1.0-3.2e-6, FP32 TSM2 2-3e-6; without FL 1.4e-5).
Non-finite values: the split turns Inf (and a finite value past ~3.4e38, whose high part rounds
to Inf) into NaN in every element of C whose sum meets it, so the kernel computes each element it
left non-finite again by FP32 FMAs from A and B at the store: C has the Inf, -Inf and NaN of the
FP32 kernels (Inf . 0 is NaN), and only those elements pay a dot product each. At tiny
magnitudes it is less exact than FP32: TF32's subnormal step is 2^-136 (float32's 2^-149), so the
low parts lose bits for values below ~2^-110 (H100: max |error| / (|A| @ |B|) 3.3e-8 at 2^-100,
1.6e-5 at 2^-115, 2.6e-3 at 2^-126, cuBLAS 2.6e-8); MATPLAN_TF32X3=0 for such data.

A planner candidate by default (:data:`ENABLED`; environment ``MATPLAN_TF32X3=0`` turns it off):
the planner's measurement of TSM2 tries its :func:`variants` for float32 with k in :data:`TC_K`
and keeps one where it is fastest. On an H100, single calls at k = 32: column-major 0.82-0.85 of
the copy bandwidth at n = 16384 and 0.59-0.62 at n = 8192, 1.17-1.30x cuBLAS; row-major 0.70 /
0.56, 1.20-1.32x cuBLAS; at k = 64 (two passes) row-major 1.10x cuBLAS, column-major 0.89-0.94x
(see docs/tsgemm.md for what was tried on the way).

:class:`TcLaunch` is one launch for arrays of given shapes and strides, :func:`matmul` the
standalone call (tests, benchmarks/tsm2_tc_bench.py).
"""
from __future__ import annotations

import os

import numpy as np

from ...core.xp import cupy_module
from .. import _cuda
from .launch import SplitSum, resident_blocks, sms, split_waves
from .rules import layout_of
from .tsm2_async import check_a as async_check_a

SOURCE = "tsgemm/tsm2_tc.cu"
#: Variants (warps a block W, 16-row tiles a warp RT, min resident blocks MB, 16-column steps of
#: A in flight D, LO: 1 rounds a's low part to TF32, 0 leaves the mma to truncate it, FL: 1 adds
#: each tile's mma sums into float32 sums); each comes with NT = 2 and 4 n-tiles (k <= 16: 2, else
#: 4 a pass). Must match tsm2_tc.cu's instantiations. H100 sweeps: FL = 1 took max |error| /
#: max |C| at n = 16384 from 1.4e-5 to 1.0-3.2e-6 (the FP32 kernels 2-3e-6) for 0-2% of time at
#: D = 1; LO = 0 costs ~3% of time less than LO = 1 at no measured error; one block of 255
#: registers per SM was slower; on row-major A one tile a warp with D = 4 (r1d4) beat two tiles
#: with D = 1-2 by 20-30%.
VARIANTS = {"d1": (8, 2, 2, 1, 0, 1), "d2": (8, 2, 2, 2, 0, 1), "r1d2": (8, 1, 2, 2, 0, 1), "r1d4": (8, 1, 2, 4, 0, 1)}
#: Variants for row-major A only (RT = 1: column-major A needs tiles in pairs).
ROW_ONLY = ("r1d2", "r1d4")
#: Rows of B a shared-memory tile holds (the kernels' KC).
KC = 64
#: Most slices of n (split-K) a launch uses.
MAX_SPLIT = 64
#: k for which the planner's measurement tries this kernel when enabled: at k <= 16 the FP32
#: kernels already stream A at about the copy bandwidth (and are exact to FP32 FMA).
TC_K = (17, 64)
#: Whether the planner's measurement of TSM2 also tries this kernel for float32 (set this before
#: planning, or the environment MATPLAN_TF32X3=0 to turn it off). Its configs are timed and cached
#: like any other, so turning it on later times only them.
ENABLED = os.environ.get("MATPLAN_TF32X3", "1") != "0"


def variants(layout: str) -> tuple:
    """The VARIANTS names for A of this layout ("row" or "col")."""
    return tuple(v for v in VARIANTS if layout == "row" or v not in ROW_ONLY)


def _names() -> tuple:
    flags = ("false", "true")
    return (tuple(kernel_name(col, nt, v) for col in (False, True) for v in variants("col" if col else "row")
                  for nt in (2, 4))
            + tuple(f"tsm2_tc_b<{c},{nt}>" for nt in (2, 4) for c in flags))


def kernel_name(col: bool, nt: int, variant: str) -> str:
    w, rt, mb, d, lo, fl = VARIANTS[variant]
    return f"tsm2_tf32x3<{'true' if col else 'false'},{nt},{w},{rt},{KC},{mb},{d},{lo},{fl}>"


def n_tiles(k: int) -> int:
    """8-column n-tiles a pass: 2 for k <= 16, else 4 (k > 32 takes several passes)."""
    return 2 if k <= 16 else 4


def threads(variant: str) -> int:
    """Threads a block of ``variant``."""
    return 32 * VARIANTS[variant][0]


def eligible(dtype, k: int, layout: str, m: int, n: int, compute_capability: str = "8.0") -> bool:
    """Whether the planner's measurement tries this kernel: ENABLED, float32, k in TC_K, A's
    rows (row-major: n % 4 == 0) or columns (column-major: m % 4 == 0) on 16-byte boundaries
    in the contiguous layout, and a GPU of ``compute_capability`` 8.0 or later (mma.sync TF32;
    the device spec's, e.g. "9.0")."""
    if not ENABLED or np.dtype(dtype) != np.float32 or not TC_K[0] <= k <= TC_K[1]:
        return False
    if (n if layout == "row" else m) % 4:
        return False
    return float(compute_capability or 0) >= 8.0


def check_a(A, layout: str) -> int:
    """A's leading dimension (elements) when this kernel can read it; else ValueError naming A."""
    return async_check_a(A, layout == "col", kernel="tensor-core (3xTF32)")


class TcLaunch:
    """One call of the 3xTF32 kernel for arrays of these shapes and strides: B's preparation
    (``tsm2_tc_b``: split and in fragment order, once a call), the kernel, the split over n (enough
    blocks for whole waves of resident blocks, launch.split_waves) and the scalar arguments worked
    out once; calling it only allocates the workspace and launches (and sums the slices)."""

    def __init__(self, A, B, C, layout: str, lda: int, variant: str = "d1", slices: int | None = None):
        if variant not in variants(layout):
            raise ValueError(f"variant: {variant!r}; expected one of {list(variants(layout))} for "
                             f"{layout}-major A")
        if A.dtype != np.float32:
            raise ValueError(f"A: the 3xTF32 kernel is float32 only, got {A.dtype}")
        m, n = A.shape
        k = B.shape[1]
        w, rt = VARIANTS[variant][:2]
        col, nt = layout == "col", n_tiles(k)
        self.fn = _cuda.function(SOURCE, kernel_name(col, nt, variant), _names())
        self.launch = _cuda.packed(self.fn, SOURCE, "tsm2_tf32x3")
        prep = _cuda.function(SOURCE, f"tsm2_tc_b<{'true' if col else 'false'},{nt}>", _names())
        self.prep = _cuda.packed(prep, SOURCE, "tsm2_tc_b")
        rows = w * rt * 16
        bx = -(-m // rows)
        n_sms = sms()
        slots = resident_blocks(self.fn, 32 * w) * n_sms
        if slices:
            S, L = split_waves(int(slices), int(slices), bx, n, KC, 0)
        else:
            S0 = max(1, min(-(-max(slots, n_sms) // bx), MAX_SPLIT, n // (4 * KC)))
            S, L = split_waves(S0, min(2 * S0, MAX_SPLIT, max(S0, n // (4 * KC))), bx, n, KC, slots)
        # workspace (float32): prepared B (passes x n_pad x 8 NT x 2; a multiple of 4, so what
        # follows stays 16-byte aligned), then the slices' partial C when split
        n_pad = -(-n // KC) * KC
        bf_pass = n_pad * 8 * nt * 2
        self.bf_size = -(-k // (8 * nt)) * bf_pass
        self.split = SplitSum(A.dtype, m, k, C.strides, S)
        self.S, self.ws_size = S, self.bf_size + self.split.size
        self.grid, self.block = (bx, S), (32 * w,)
        self.prep_grid = (min(-(-self.bf_size // 2 // 256), 8 * n_sms),)
        self.prep_args = (n, k, n_pad)
        self.lda, self.mid = int(lda), bf_pass // 4
        self.tail = (*self.split.ldc, m, n, k, int(L), self.split.mk)

    def __call__(self, A, B, C) -> None:
        ws = cupy_module().empty(self.ws_size, dtype=np.float32)
        bf, ldb = ws.data.ptr, B.strides[0] // 4
        self.prep(self.prep_grid, (256,), (B, ldb, *self.prep_args, bf))
        out = C if self.S == 1 else bf + 4 * self.bf_size
        self.launch(self.grid, self.block, (A, self.lda, bf, self.mid, B, ldb, out, *self.tail))
        self.split(out, C)


def matmul(A, B, out=None, variant: str = "d1", slices: int | None = None):
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


__all__ = ["TcLaunch", "matmul", "check_a", "eligible", "threads", "VARIANTS", "TC_K", "ENABLED"]
