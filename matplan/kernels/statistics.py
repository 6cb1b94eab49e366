"""The planner's statistics of GPU CSR operands by one prebuilt kernel (``statistics.cu``): one
launch and one copy of its figures to the host, shared by the structure check
(``core.validation.check_csr``) and the statistics (``core.features``). Core cannot import
kernels, so this module registers :func:`figures` with ``core.figures`` on import (the planner
package imports it).

CuPy's own reductions and sorts compile on a process's first use of each (0.1-3.5 s on an H100
host) and launch several kernels a figure; a host copy of the index arrays costs a transfer and
NumPy passes on every later plan. Where the kernel cannot load (no prebuilt binary for the GPU
and no NVRTC) or does not take the operands (index types other than int32 / int64, arrays not
contiguous, malformed shapes), :func:`figures` returns None and those general paths measure them.
"""
from __future__ import annotations

import functools
import sys
import threading

import numpy as np

from ..core import compression, features, figures as core_figures
from ..core.figures import CsrFlags, KernelFigures
from ..core.xp import cupy_module
from . import _cuda

SOURCE = "statistics.cu"
NAMES = ("csr_statistics",)
BLOCK = 256
#: Mode bits (statistics.cu's ST_*) of each op: the structure check always comes with them.
CHECK, ROWS, TRANS, GEMM = 1, 2, 4, 8
MODES = {"check": CHECK, "sptrans": CHECK | TRANS, "spmv": CHECK | ROWS, "spmm": CHECK | ROWS,
         "spgemm": CHECK | ROWS | GEMM}
#: statistics.cu's sizes: row lengths in the histogram, listed long rows at most, and features'.
HIST, LONG_CAP = 65536, 16384
SAMPLES, DRAWS, ROW_CAP = features.SPREAD_SAMPLES, compression.COMPRESSION_SAMPLES, compression.COMPRESSION_ROW_CAP
BIAS = 1 << 62
#: Words of the kernel's figures (statistics.cu's O_*).
(O_FLAGS_A, O_PTR0_A, O_PTRM_A, O_FLAGS_B, O_PTR0_B, O_PTRM_B, O_MIN, O_MAX, O_EMPTY, O_WARP_BEFORE,
 O_WARP_AFTER, O_LONG, O_ROW_SS, O_SPREAD, O_COL_MAX, O_PRODUCTS, O_RCT_MIN, O_RCT_MAX, O_RCT_SS) = range(19)
O_RBS, O_DRAWN = 19, 26
O_DRAWN_P, O_DISTINCT, O_EXAMINED = O_DRAWN + DRAWS, O_DRAWN + 2 * DRAWS, O_DRAWN + 3 * DRAWS
WORDS = O_DRAWN + 4 * DRAWS
#: Largest column count whose columns fit the hash sets' 32-bit slots (column + 1).
MAX_HASHED_COLS = (1 << 32) - 2


def _windows(n: int) -> int:
    """Counters / slots of a pairwise sum over n values: one per 64 positions, and one spare."""
    return (n + 63) // 64 + 1


def layout(mode: int, m: int, n: int, grid: int, table: int) -> tuple:
    """(words zeroed, {region: (word offset, words)}) of the workspace: the zeroed regions first."""
    rows, trans, gemm = bool(mode & ROWS), bool(mode & TRANS), bool(mode & GEMM)
    zeroed = (("out", WORDS), ("hist", HIST * rows), ("cnt_row", _windows(m) * rows),
              ("cnt_spread", _windows(SAMPLES) * rows), ("cnt_rct", _windows(m) * gemm), ("rowct", m * gemm),
              ("colcnt", n * trans))
    free = (("longs", LONG_CAP * rows), ("vals", SAMPLES * rows), ("slot_row", _windows(m) * rows),
            ("slot_spread", _windows(SAMPLES) * rows), ("slot_rct", _windows(m) * gemm), ("seg", grid * gemm),
            ("tables", (DRAWS * table + 1) // 2 * gemm))
    regions, at = {}, 0
    for name, size in zeroed:
        regions[name] = (at, size)
        at += size
    cleared = at
    for name, size in free:
        regions[name] = (at, size)
        at += size
    return cleared, regions, at


def table_size(b_cols: int, b_nnz: int) -> int:
    """Slots of each drawn row's hash set: a power of two at least twice the distinct columns it
    can meet (at most 2 x ROW_CAP examined products, B's columns, B's nonzeros)."""
    bound = max(1, min(2 * ROW_CAP, int(b_cols), int(b_nnz)))
    return max(64, 1 << (2 * bound - 1).bit_length())


def _takes(M, rows: int, nd) -> bool:
    """Whether the kernel reads CSR ``M`` as it is: CuPy (``nd``) int32 / int64 index arrays, 1-D
    and C-contiguous, indptr of rows + 1 entries, both on one device (anything else goes to the
    general paths, which raise the structure check's errors)."""
    ptr, idx = getattr(M, "indptr", None), getattr(M, "indices", None)
    return (isinstance(ptr, nd) and isinstance(idx, nd) and ptr.ndim == 1 and idx.ndim == 1
            and ptr.dtype in _WIDE and idx.dtype in _WIDE and ptr.shape[0] == rows + 1
            and ptr.flags.c_contiguous and idx.flags.c_contiguous and ptr.data.device_id == idx.data.device_id)


_WIDE = {np.dtype(np.int32): 0, np.dtype(np.int64): 1}


class _Kernel:
    """The compiled kernel of one device: its packed launcher and cooperative grid cap."""

    def __init__(self, device_id: int):
        fn = _cuda.function(SOURCE, NAMES[0], NAMES)
        self.launch = _cuda.packed(fn, SOURCE, NAMES[0])
        self.sms = _cuda.device_attribute("MultiProcessorCount", device_id)
        self.cap = self.sms * _cuda.resident_blocks(fn, BLOCK)
        if self.cap < 1:
            raise RuntimeError(f"{SOURCE}: no block of {BLOCK} threads fits on this GPU")


_KERNELS: dict = {}
_FAILED: dict = {}
_LOCK = threading.Lock()


def _kernel(device_id: int):
    """The device's kernel, loaded once; None (said once on stderr) where it cannot load."""
    k = _KERNELS.get(device_id)
    if k is None and device_id not in _FAILED:
        with _LOCK:
            try:
                k = _KERNELS.setdefault(device_id, _Kernel(device_id))
            except Exception as exc:  # noqa: BLE001  no binary and no compiler: the general paths measure
                _FAILED[device_id] = f"{type(exc).__name__}: {exc}"
                sys.stderr.write(f"matplan: the statistics kernel is not available on GPU {device_id} "
                                 f"({_FAILED[device_id]}); planning measures operands with CuPy instead\n")
    return k


def figures(op: str, A, B=None) -> KernelFigures | None:
    """``op``'s figures of GPU CSR ``A`` (and ``B`` for SpGEMM) from one launch and one copy, or
    None where the kernel does not take them (module docstring). ``op``: "check" (the structure
    check alone), "sptrans", "spmv", "spmm" or "spgemm"."""
    cp = cupy_module()
    mode = MODES[op]
    m, n = (int(v) for v in A.shape)
    if cp is None or not _takes(A, m, cp.ndarray) or (mode & GEMM and not (
            _takes(B, n, cp.ndarray) and B.indptr.data.device_id == A.indptr.data.device_id)):
        return None
    device_id = A.indptr.data.device_id
    if device_id != cp.cuda.runtime.getDevice():
        with cp.cuda.Device(device_id):
            return figures(op, A, B)
    kern = _kernel(device_id)
    if kern is None:
        return None
    a_len = int(A.indices.shape[0])
    b_len = int(B.indices.shape[0]) if mode & GEMM else 0
    b_cols = int(B.shape[1]) if mode & GEMM else 0
    cooperative = bool(mode & (ROWS | GEMM))
    if cooperative:
        work = max(m, a_len // 4, b_len // 4, min(a_len, SAMPLES), DRAWS * BLOCK if mode & GEMM else 1)
        grid = max(1, min(kern.cap, -(-work // BLOCK)))
    else:
        grid = max(1, min(16 * kern.sms, -(-max(m, a_len) // BLOCK)))
    table = table_size(b_cols, b_len) if mode & GEMM else 0
    cleared, offsets, words = _layout(mode, m, n, grid, table)
    ws = cp.empty(words, dtype=cp.int64)
    base = ws.data.ptr
    _cuda.zero(base, 8 * cleared)
    b_ptr, b_idx = (B.indptr, B.indices) if mode & GEMM else (None, None)
    b_wide = (_WIDE[b_ptr.dtype], _WIDE[b_idx.dtype]) if mode & GEMM else (0, 0)
    args = (A.indptr, A.indices, m, n, a_len, _WIDE[A.indptr.dtype], _WIDE[A.indices.dtype], b_ptr, b_idx,
            b_cols, b_len, b_wide[0], b_wide[1], mode, table, *(base + off if off >= 0 else 0 for off in offsets))
    kern.launch((grid,), (BLOCK,), args, cooperative=cooperative)   # cooperative: grid barriers between phases
    raw = _cuda.read_at(base, WORDS, np.int64)   # the one copy (it waits for the kernel)
    return decode(raw, mode, b_cols)


@functools.lru_cache(maxsize=1024)
def _layout(mode: int, m: int, n: int, grid: int, table: int) -> tuple:
    """(words zeroed, byte offset of each region of :data:`_POINTERS` or -1 where it is empty,
    words) of :func:`layout`: the same sizes recur plan after plan."""
    cleared, regions, words = layout(mode, m, n, grid, table)
    return cleared, tuple(8 * regions[name][0] if regions[name][1] else -1 for name in _POINTERS), words


#: The workspace regions in the kernel's parameter order.
_POINTERS = ("out", "hist", "cnt_row", "cnt_spread", "cnt_rct", "rowct", "colcnt", "longs", "vals",
             "slot_row", "slot_spread", "slot_rct", "seg", "tables")


def _flags(word, ptr0, ptrm) -> CsrFlags:
    return CsrFlags(bool(word & 1), bool(word & 2), bool(word & 4), bool(word & 8), ptr0, ptrm)


def _biased(word, sign: int) -> int:
    """A minimum (sign -1: kept as the maximum of BIAS - v) or maximum (+1: of BIAS + v); 0 where
    no row was seen (the word is still zero)."""
    return 0 if word == 0 else sign * (word - BIAS)


def decode(raw: np.ndarray, mode: int, b_cols: int = 0) -> KernelFigures:
    """The :class:`KernelFigures` of the kernel's ``WORDS`` int64 words (``raw``), turned into
    Python numbers by one ``tolist`` (not a NumPy scalar a word: SpGEMM reads about 280)."""
    raw = np.asarray(raw, dtype=np.int64)
    w = raw.tolist()
    a = _flags(w[O_FLAGS_A], w[O_PTR0_A], w[O_PTRM_A])
    kw = {}
    if mode & (ROWS | TRANS):
        kw.update(row_min=_biased(w[O_MIN], -1), row_max=_biased(w[O_MAX], 1))
    if mode & TRANS:
        kw.update(col_max=w[O_COL_MAX])
    if mode & (ROWS | GEMM):
        f = raw[O_ROW_SS:O_RCT_SS + 1].view(np.float64).tolist()   # the float64 sums
    if mode & ROWS:
        long_rows = w[O_LONG]
        kw.update(empty_rows=w[O_EMPTY], warp_before=w[O_WARP_BEFORE],
                  warp_after=w[O_WARP_AFTER] if long_rows <= LONG_CAP else None,
                  row_ss=f[0], spread_sum=f[O_SPREAD - O_ROW_SS])
    if mode & GEMM:
        kw.update(b=_flags(w[O_FLAGS_B], w[O_PTR0_B], w[O_PTRM_B]), products=w[O_PRODUCTS],
                  rowct_min=_biased(w[O_RCT_MIN], -1), rowct_max=_biased(w[O_RCT_MAX], 1),
                  rowct_ss=f[O_RCT_SS - O_ROW_SS], rbs_groups=tuple(w[O_RBS:O_RBS + 6]),
                  drawn=tuple(w[O_DRAWN:O_DRAWN + DRAWS]), drawn_products=tuple(w[O_DRAWN_P:O_DRAWN_P + DRAWS]),
                  distinct=tuple(w[O_DISTINCT:O_DISTINCT + DRAWS]),
                  examined=tuple(w[O_EXAMINED:O_EXAMINED + DRAWS]), compression_ok=b_cols <= MAX_HASHED_COLS)
    return KernelFigures(a=a, **kw)


core_figures.use_kernel(figures)

__all__ = ["figures", "decode", "layout", "table_size", "MODES", "WORDS"]
