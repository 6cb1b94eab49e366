"""TSM2 with A streamed through shared memory by cp.async.

C (m x k) = A (m x n) @ B (n x k) for small k. The kernels (``tsm2_async.cu``:
``tsm2_rowmajor_async`` for row-major A, ``tsm2_colmajor_async`` for column-major A, one body)
keep S stages of R x TJ tiles of A (and the TJ x KP tiles of B that multiply them) in flight per
block through 16-byte ``cp.async`` copies, so the bytes of A in flight per SM are not limited by
registers as in ``tsm2.cu``'s kernels. See the .cu header for the thread mapping.

On an H100 the kernels read A at 0.92 or more of the copy bandwidth back to back for every
k <= 16, both precisions and layouts (the register kernels 0.76-0.79 at k = 16), and 0.58-0.62
at k = 32 (0.39-0.42); see docs/tsgemm.md. The planner reaches both through ``tsgemm.tsm2``:
its measurement tries the ``rules.ASYNC_VARIANTS`` knob sets for ``rules.ASYNC_K`` and keeps the
fastest. ``matmul_rowmajor_async`` is the standalone row-major launcher
(benchmarks/tsm2_async_bench.py, tests); :class:`AsyncLaunch` launches either layout.

Config knobs (``config`` dict; missing keys come from :func:`default_config`):

* ``wr``, ``wj``: warps of a block along the rows of the band and along the columns of a tile
  (threads per block = 32 * wr * wj);
* ``tr``: lanes of a warp along the rows (32 / tr lanes along the columns of C);
* ``rr``: rows per lane, ``cc``: columns of C per lane (a multiple of 16 bytes of elements);
  rows per block R = wr * tr * rr, columns of C per pass KP = (32 / tr) * cc,
  accumulators per thread rr * cc; A is read ceil(k / KP) times;
* ``tj``: columns of A per tile (row-major: a multiple of wj * 16 bytes of elements);
* ``stages``: tiles in shared memory (stages - 1 in flight while one is computed);
* ``bvec``: elements per cp.async of B (None: the largest that B's alignment allows);
* ``minb``: min resident blocks per SM for ``__launch_bounds__`` (register cap), default 2.
"""
from __future__ import annotations

import math

import numpy as np

from ...core import device as device_mod
from ...core.features import Features
from ...core.xp import cupy_module
from .. import _cuda
from .launch import launch as register_launch
from .rules import default_params, layout_of

SOURCE = "tsgemm/tsm2_async.cu"
#: The default knobs per (itemsize, largest k of the bucket): (wr, wj, tr, rr, cc, tj, stages).
#: R = 64 rows per block everywhere (B tile traffic k / 64 of A's), 256 threads, 256 bytes of
#: each row per tile, 4 stages: A stage 16 KB, 3 tiles (48 KB of A) in flight per block.
PRESETS = {
    4: {4: (1, 8, 32, 2, 4, 64, 4), 8: (1, 8, 16, 4, 4, 64, 4),
        16: (1, 8, 8, 8, 4, 64, 4), 32: (2, 4, 4, 8, 4, 64, 4)},
    8: {4: (1, 8, 32, 2, 4, 32, 4), 8: (1, 8, 16, 4, 4, 32, 4),
        16: (2, 4, 8, 4, 4, 32, 4), 32: (2, 4, 8, 4, 8, 32, 4)},
}
KEYS = ("wr", "wj", "tr", "rr", "cc", "tj", "stages")
#: Knobs with a default outside the presets: ``minb`` (min resident blocks per SM for
#: __launch_bounds__: caps registers per thread at 65536 / (minb * threads)).
DEFAULT_MINB = 2
#: Presets whose accumulators need more than 65536 / (2 * threads) registers take minb = 1:
#: float64 k = 32 (64 accumulators, 2 x 8 B each) spilled 76-100 bytes a thread with minb 2 and
#: ran at 0.39-0.60 of the copy bandwidth, 0.66-0.75 with minb 1 (H100).
PRESET_MINB = {(8, 32): 1}
#: Shared memory a block may opt into when the device cannot be asked (H100: 227 KB).
SMEM_OPTIN_DEFAULT = 227 * 1024


#: Column-major A (tsm2_colmajor_async) takes the same presets except where a lane's rows
#: (rr) are not whole 16-byte chunks of a column: float32 k <= 4 (rr = 2) takes 4 rows a lane,
#: one column of C per lane (KP = 4).
COL_PRESETS = {4: {4: (1, 8, 32, 4, 4, 64, 4)}}


def default_config(dtype, k: int, col: bool = False) -> dict:
    """The preset knobs for ``dtype`` and ``k`` (k > 32: the k = 32 preset, several passes);
    ``col``: for column-major A."""
    item = np.dtype(dtype).itemsize
    table = PRESETS[item]
    bucket = next((b for b in sorted(table) if k <= b), max(table))
    knobs = COL_PRESETS.get(item, {}).get(bucket, table[bucket]) if col else table[bucket]
    return dict(zip(KEYS, knobs), minb=PRESET_MINB.get((item, bucket), DEFAULT_MINB))


def shape_of(config: dict, itemsize: int, col: bool = False) -> dict:
    """Derived sizes of a config: rows per block, columns per pass, threads, shared memory, ...
    (the A stage is unpadded in both layouts: r rows of tj, or ``col`` tj columns of r)."""
    v = 16 // itemsize
    wr, wj, tr, rr, cc, tj, s = (int(config[x]) for x in KEYS)
    tc = 32 // tr
    kp = tc * cc
    r = wr * tr * rr
    a_stage = r * tj
    stage = a_stage + tj * kp
    red = wj * r * kp if wj > 1 else 0
    elems = max(s * stage, red)
    return dict(vec=v, tc=tc, kp=kp, rows=r, threads=32 * wr * wj, smem_bytes=elems * itemsize,
                a_tile_bytes=r * tj * itemsize, b_tile_bytes=tj * kp * itemsize,
                a_bytes_in_flight_per_block=(s - 1) * r * tj * itemsize, acc_per_thread=rr * cc)


def check_config(config: dict, itemsize: int, col: bool = False) -> None:
    """ValueError naming the knob when the kernel's static_asserts would reject the config."""
    v = 16 // itemsize
    missing = [x for x in KEYS if x not in config]
    if missing:
        raise ValueError(f"config: missing {missing}")
    unknown = set(config) - set(KEYS) - {"bvec", "minb"}
    if unknown:
        raise ValueError(f"config: unknown knobs {sorted(unknown)} (known: {KEYS + ('bvec', 'minb')})")
    if not 1 <= int(config.get("minb", DEFAULT_MINB)) <= 32:
        raise ValueError(f"config: minb = {config.get('minb')} must be in 1..32")
    wr, wj, tr, rr, cc, tj, s = (int(config[x]) for x in KEYS)
    if min(wr, wj, tr, rr, cc, tj, s) < 1:
        raise ValueError(f"config: every knob must be >= 1, got {config}")
    if 32 * wr * wj > 1024:
        raise ValueError(f"config: wr * wj = {wr * wj} warps exceeds 32 (1024 threads)")
    if 32 % tr:
        raise ValueError(f"config: tr = {tr} must divide 32")
    if cc % v:
        raise ValueError(f"config: cc = {cc} must be a multiple of {v} (16 bytes of elements)")
    if col and (rr % v or tj % wj):
        raise ValueError(f"config: column-major A needs rr = {rr} a multiple of {v} (16 bytes of a "
                         f"column) and tj = {tj} a multiple of wj = {wj}")
    if not col and tj % (wj * v):
        raise ValueError(f"config: tj = {tj} must be a multiple of wj * {v} = {wj * v}")
    if not 2 <= s <= 8:
        raise ValueError(f"config: stages = {s} must be in 2..8")
    bv = config.get("bvec")
    if bv is not None:
        kp = (32 // tr) * cc
        if bv * itemsize not in (4, 8, 16) or kp % bv:
            raise ValueError(f"config: bvec = {bv} must be 1..{v} elements (4, 8 or 16 bytes) "
                             f"dividing the {kp} columns per pass")


def kernel_name(dtype, config: dict, bvec: int, col: bool = False) -> str:
    ct = _cuda.ctype(dtype)
    return (f"tsm2_{'col' if col else 'row'}major_async<"
            + ",".join([ct] + [str(int(config[x])) for x in KEYS] + [str(bvec)])
            + f",{int(config.get('minb', DEFAULT_MINB))}>")


def allocator_bvec(config: dict, itemsize: int, k: int, col: bool = False) -> int:
    """:func:`_bvec` of a B as CuPy's allocator makes it (C-contiguous, 256-byte aligned, ld = k)."""
    sh = shape_of(config, itemsize, col)
    v = sh["vec"]
    return next((b for b in (v, v // 2, v // 4) if b >= 1 and b * itemsize >= 4 and sh["kp"] % b == 0
                 and k % b == 0), 1)


def _smem_optin() -> int:
    """Opt-in shared memory per block of the current device (read once per device: this runs on
    every launch and inside the planner's measurement of the kernel)."""
    try:
        return _cuda.device_attribute("MaxSharedMemoryPerBlockOptin", cupy_module().cuda.Device().id)
    except Exception:  # noqa: BLE001  a runtime that cannot say: the H100's figure
        return SMEM_OPTIN_DEFAULT


#: name -> every name compiled in the same RawModule (see :func:`compile_together`).
_GROUPS: dict = {}


def compile_together(items) -> tuple:
    """Compile the kernels of ``items`` ((dtype, config, bvec) triples; configs completed by
    :func:`default_config` for k = 16 when partial) in one NVRTC module, so a benchmark sweeping
    configs pays one compilation instead of one per config. Returns the names."""
    names = []
    for dtype, config, bvec in items:
        cfg = dict(config)
        for key, val in default_config(dtype, 16).items():
            cfg.setdefault(key, val)
        names.append(kernel_name(dtype, cfg, bvec))
    names = tuple(dict.fromkeys(names))
    for nm in names:
        _GROUPS[nm] = names
    return names


def _function(name: str, smem_bytes: int):
    """The compiled kernel with its dynamic shared-memory limit raised to ``smem_bytes``."""
    fn = _cuda.function(SOURCE, name, _GROUPS.get(name, (name,)))
    if smem_bytes > 48 * 1024:
        _cuda.allow_dynamic_smem(fn, smem_bytes)
    return fn


def _is_cupy(x) -> bool:
    cp = cupy_module()
    return cp is not None and isinstance(x, cp.ndarray)


def check_a(A, col: bool = False, kernel: str = "async") -> int:
    """The leading dimension of A (elements) if the async path (or the ``kernel`` named, which
    has the same needs: tsm2_tc) can stream it; else ValueError.

    Row-major (``col`` false): unit stride along the rows, rows starting on 16-byte boundaries
    (lda * itemsize a multiple of 16). Column-major: unit stride down the columns, columns
    starting on 16-byte boundaries. Both: a 16-byte aligned data pointer (the kernel copies
    16-byte chunks)."""
    m, n = A.shape
    item = A.itemsize
    s_lead, s_unit = A.strides if not col else A.strides[::-1]   # leading stride, unit stride
    along, count = ("rows", n) if not col else ("columns", m)
    what = f"the {kernel} {'column' if col else 'row'}-major TSM2 kernel"
    fallback = "pass fallback=True or " if kernel == "async" else ""
    if count > 1 and s_unit != item:
        raise ValueError(f"A: {what} needs unit stride along the {along}, got strides {A.strides} "
                         f"(bytes) for shape {A.shape}; pass cupy.ascontiguousarray(A) or use the "
                         f"planner (matplan.planner.plan)")
    if (n if col else m) <= 1:
        s_lead = -(-max(count, 1) * item // 16) * 16
    if s_lead <= 0 or s_lead % 16:
        raise ValueError(f"A: {what} needs {along} starting on 16-byte boundaries, got a stride of "
                         f"{s_lead} bytes between them (shape {A.shape}, itemsize {item}); pad them to "
                         f"a multiple of 16 bytes, {fallback}use matplan's planner / tsm2 kernel")
    if A.data.ptr % 16:
        raise ValueError(f"A: {what} needs a 16-byte aligned data pointer, got an offset of "
                         f"{A.data.ptr % 16} bytes (a view starting mid-{along[:-1]}?); {fallback}use "
                         f"matplan's planner / tsm2 kernel")
    return s_lead // item


def _bvec(B, kp: int, v: int) -> int:
    """Largest B chunk (elements) that B's pointer and row stride (C-contiguous: k) allow."""
    item = B.itemsize
    ldb = B.strides[0] // item if B.shape[0] > 1 else B.shape[1]
    for bv in (v, v // 2, v // 4):
        if bv >= 1 and bv * item >= 4 and kp % bv == 0 and ldb % bv == 0 and B.data.ptr % (bv * item) == 0:
            return bv
    return 1


def matmul_rowmajor_async(A, B, *, out=None, config: dict | None = None, fallback: bool = False):
    """C = A @ B with the cp.async row-major TSM2 kernel, standalone (plans reach both layouts
    through ``tsgemm.tsm2``).

    A: 2-D CuPy array, float32 or float64, unit stride along rows, 16-byte aligned rows (C order
    with n * itemsize % 16 == 0, or a row-padded view). B: C-contiguous (n, k) CuPy array of the
    same dtype. out: optional (m, k) CuPy array of the dtype (any element strides). config: knobs
    overriding :func:`default_config` (see the module docstring). An A that fails the alignment
    needs raises ValueError unless ``fallback`` is true, which runs TSM2's register kernel instead
    (:func:`register_kernel_matmul`).
    """
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("matmul_rowmajor_async needs CuPy and an NVIDIA GPU")
    for name, x in (("A", A), ("B", B)):
        if not _is_cupy(x):
            raise ValueError(f"{name}: expected a CuPy array, got {type(x).__name__}")
        if x.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D array, got {x.ndim}-D shape {x.shape}")
        if x.dtype not in (np.float32, np.float64):
            raise ValueError(f"{name}: dtype must be float32 or float64, got {x.dtype}")
    if B.dtype != A.dtype:
        raise ValueError(f"B: dtype {B.dtype} does not match A's {A.dtype}")
    m, n = A.shape
    if B.shape[0] != n:
        raise ValueError(f"B: expected {n} rows to match A {A.shape}, got shape {B.shape}")
    k = B.shape[1]
    if not B.flags.c_contiguous:
        raise ValueError(f"B: must be C-contiguous (strides {B.strides} for shape {B.shape}); pass "
                         f"cupy.ascontiguousarray(B)")
    if out is not None:
        if not _is_cupy(out):
            raise ValueError(f"out: expected a CuPy array, got {type(out).__name__}")
        if out.shape != (m, k) or out.dtype != A.dtype:
            raise ValueError(f"out: expected shape {(m, k)} and dtype {A.dtype}, got {out.shape} {out.dtype}")
        if any(s % out.itemsize or s < 0 or (s == 0 and d > 1) for s, d in zip(out.strides, out.shape)):
            raise ValueError(f"out: strides {out.strides} must be non-negative multiples of the itemsize, "
                             f"nonzero along a dimension longer than 1 (elements must not alias)")
    try:
        lda = check_a(A) if m and n else max(n, 1)
    except ValueError:
        if not fallback:
            raise
        return register_kernel_matmul(A, B, out)

    C = cp.empty((m, k), dtype=A.dtype) if out is None else out
    go = AsyncLaunch(A, B, C, config, lda)   # checks the knobs, also for empty products
    if m == 0 or k == 0:
        return C
    if n == 0:
        C.fill(0)
        return C
    go(A, B, C)
    return C


def register_kernel_matmul(A, B, out=None):
    """C = A @ B by TSM2's register kernel (``tsm2.cu``) with the model's parameters for the GPU in
    use: the fallback for an A this kernel cannot stream. ValueError (naming A) for an A with no
    unit stride along its rows or columns."""
    cp = cupy_module()
    layout, lda = layout_of(A)
    (m, n), k = A.shape, B.shape[1]
    C = cp.empty((m, k), dtype=A.dtype) if out is None else out
    if m == 0 or k == 0:
        return C
    if n == 0:
        C.fill(0)
        return C
    f = Features(op="tsgemm", dtype=str(A.dtype), backend="gpu", m=m, n=n, k=k,
                 layout="C" if layout == "row" else "F")
    p = default_params(device_mod.current(), f)
    register_launch(A, layout, lda, B, C, p["t1"], p["t2"], p["t3"])
    return C


class AsyncLaunch:
    """One launch of the async kernel with the knobs, B's chunk width, the grid and the scalar
    arguments worked out once for arrays of these shapes, strides and alignment (A checked by
    :func:`check_a`); calling it only launches. The TSM2 kernel keeps one per shapes and strides. ``col``:
    A is column-major (tsm2_colmajor_async)."""

    def __init__(self, A, B, C, config: dict | None = None, lda: int | None = None, col: bool = False):
        m, n = A.shape
        k = B.shape[1]
        item = A.itemsize
        lda = check_a(A, col) if lda is None else lda
        cfg = default_config(A.dtype, k, col)
        if config:
            cfg.update(config)
        check_config(cfg, item, col)
        sh = shape_of(cfg, item, col)
        limit = _smem_optin()
        if sh["smem_bytes"] > limit:
            raise ValueError(f"config: needs {sh['smem_bytes']} bytes of shared memory per block, the "
                             f"device allows {limit}; lower stages, tj or the rows per block")
        bv = cfg.get("bvec") or _bvec(B, sh["kp"], sh["vec"])
        self.fn = _function(kernel_name(A.dtype, cfg, bv, col), sh["smem_bytes"])
        # packed driver launch (_cuda.Launcher): CuPy's launch converts the 11 arguments each call
        self.launch = _cuda.packed(self.fn, SOURCE, "tsm2_colmajor_async" if col else "tsm2_rowmajor_async")
        passes = math.ceil(k / sh["kp"])
        self.grid, self.block, self.smem = (math.ceil(m / sh["rows"]) * passes,), (sh["threads"],), sh["smem_bytes"]
        ldc_r, ldc_c = (s // item for s in C.strides)
        self.head = (int(lda),)
        self.mid = (int(k),)
        self.tail = (int(ldc_r), int(ldc_c), int(m), int(n), int(k), int(passes))

    def __call__(self, A, B, C) -> None:
        self.launch(self.grid, self.block, (A, *self.head, B, *self.mid, C, *self.tail), shared_mem=self.smem)


def kernel_info(dtype, k: int, config: dict | None = None, B=None) -> dict:
    """Registers, local memory (spills), resident blocks per SM and A bytes in flight per SM of
    the kernel a call would launch (compiles it; GPU only). For benchmark records."""
    item = np.dtype(dtype).itemsize
    cfg = default_config(dtype, k)
    if config:
        cfg.update(config)
    check_config(cfg, item)
    sh = shape_of(cfg, item)
    bv = cfg.get("bvec") or (_bvec(B, sh["kp"], sh["vec"]) if B is not None else 1)
    fn = _function(kernel_name(dtype, cfg, bv), sh["smem_bytes"])
    info = dict(cfg, bvec=bv, **sh)
    for attr in ("num_regs", "local_size_bytes"):
        info[attr] = getattr(fn, attr, None)
    try:
        info["blocks_per_sm"] = _cuda.resident_blocks(fn, sh["threads"], sh["smem_bytes"])
        info["a_bytes_in_flight_per_sm"] = info["blocks_per_sm"] * sh["a_bytes_in_flight_per_block"]
    except Exception:
        info["blocks_per_sm"] = None
    return info
