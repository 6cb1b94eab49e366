"""Launches of TSM2's register kernels (``tsm2.cu``): compiling, the split over n, one Launch.

Two CUDA kernels, one per layout of A, neither copies A:

* ``"col"`` -- column-major A (Fortran order, or any view with unit stride down a column):
  the paper's outer-product kernel, one thread per row, B tiles in shared memory, prefetch.
* ``"row"`` -- row-major A (C order, CuPy's default, or any view with unit stride along a row):
  a warp per ``t3`` rows, 16-byte coalesced loads, a transposed B tile in shared memory reused
  for the ``t3`` rows, a shuffle reduction at the end; ``depth`` warp steps of A in flight (more
  than one: the lane groups share the loads through shuffles).

When too few rows fill the GPU, n is split in slices whose partial products go to a workspace;
the last block of each row tile to finish sums the tile's slices in slice order (deterministic)
into C, in the same launch; the slices are evened out to whole waves of resident blocks.
:class:`Launch` works all of that out once for arrays of given shapes and strides; a small
split's workspace and tickets are kept for the next launch of its sizes on its stream (_SCRATCH).
"""
from __future__ import annotations

import numpy as np

from ...core.cache import BoundedCache
from ...core.xp import cupy_module
from .. import _cuda
from .rules import SMEM_LIMIT, T1_CHOICES, row_groups, row_steps, t1_fits, vector_width

SOURCE = "tsgemm/tsm2.cu"
#: Split over n (split-K) until about this many threads per SM run: one thread per row (or a
#: warp per t3 rows) leaves an H100 mostly idle for m of a few thousand to tens of thousands.
SPLIT_THREADS_PER_SM = 768
#: ... but keep each slice at least this many B tiles long, and at most MAX_SPLIT slices.
SPLIT_MIN_TILES = 4
MAX_SPLIT = 64
#: A split's workspace of at most this many bytes, with its tickets, is kept for the next launch
#: of its size on its stream (larger ones, whose calls are long enough not to notice an
#: allocation, are allocated per call); at most SCRATCH_CACHE_SIZE such sets in the process.
KEEP_SCRATCH_BYTES = 4 << 20
SCRATCH_CACHE_SIZE = 8
#: The split-K reduction kernel of tsm2_tc.TcLaunch (both element types, one module).
SPLIT_SUM_NAMES = ("tsm2_split_sum<float>", "tsm2_split_sum<double>")

#: Compiled kernels by their template arguments and device (a lookup took tens of microseconds).
_COMPILED = BoundedCache("tsgemm.compiled", 4096)
#: Kept split workspaces and tickets by device, stream, dtype and sizes (Launch._scratch).
_SCRATCH = BoundedCache("tsgemm.split_scratch", SCRATCH_CACHE_SIZE)
#: split_waves' answers (pure; on every Launch's construction).
_WAVES = BoundedCache("tsgemm.split_waves", 4096)
#: Resident blocks per SM of a compiled kernel and block size (the driver's occupancy query).
_RESIDENT = BoundedCache("tsgemm.resident_blocks", 4096)


def kernel_name(layout: str, dtype, t1: int, t2: int, t3: int, vec: int = 1, groups: int = 1,
                steps: int = 1, depth: int = 1) -> str:
    ct = _cuda.ctype(dtype)
    if layout == "col":
        return f"tsm2_colmajor<{ct},{t1},{t2},{t3},{vec}>"
    return f"tsm2_rowmajor<{ct},{t1},{t2},{t3},{vec},{groups},{steps},{depth}>"


def _function(layout, dtype, t1, t2, t3, vec, groups=1, steps=1, depth=1):
    """The compiled kernel; one module holds every T1_CHOICES block size of this
    (t2, t3, vec, groups, steps, depth)."""
    key = (layout, np.dtype(dtype), int(t1), int(t2), int(t3), int(vec), int(groups), int(steps),
           int(depth), _cuda.device_id(SOURCE))
    return _COMPILED.get_or_create(key, lambda: _compile(*key))


def module_names(layout, dtype, t1, t2, t3, vec, groups=1, steps=1, depth=1) -> tuple:
    """(the kernel's name, every name of the module it is compiled in); ValueError naming t1 when
    that block size's B tile does not fit."""
    item = np.dtype(dtype).itemsize
    names = tuple(kernel_name(layout, dtype, t, t2, t3, vec, groups, steps, depth) for t in T1_CHOICES
                  if t1_fits(layout, t, t2, item))
    name = kernel_name(layout, dtype, t1, t2, t3, vec, groups, steps, depth)
    if name not in names:
        raise ValueError(f"t1: block size {t1} is not one of {T1_CHOICES} or its B tile does not "
                         f"fit {SMEM_LIMIT} bytes of shared memory (t2={t2}, {np.dtype(dtype)})")
    return name, names


def template_args(layout: str, itemsize: int, vec: int, t2: int, t3: int, groups=None, steps=None,
                  depth: int = 1) -> tuple:
    """(groups, steps, depth) the kernel of ``layout`` is instantiated with: the rules' groups and
    steps unless given, depth lowered to a divisor of the steps (its register slots need it)."""
    if layout == "col":
        return 1, 1, 1
    g = int(groups or row_groups(t2, t3, itemsize))
    u = int(steps or row_steps(t2, g, vec, itemsize))
    d = max(1, min(int(depth), u))
    while u % d:
        d -= 1
    return g, u, d


def config_module(layout, dtype, lda: int, t1, t2, t3, depth=1) -> tuple:
    """Every name of the module a config's kernel is compiled in, for a 16-byte aligned A of
    leading dimension ``lda`` (:func:`module_names`' ValueError where t1 does not fit)."""
    item = np.dtype(dtype).itemsize
    vec = vector_width(item, True, lda, layout, t2)
    return module_names(layout, dtype, t1, t2, t3, vec, *template_args(layout, item, vec, t2, t3, depth=depth))[1]


def _compile(layout, dtype, t1, t2, t3, vec, groups, steps, depth, device_id):
    name, names = module_names(layout, dtype, t1, t2, t3, vec, groups, steps, depth)
    return _cuda.function(SOURCE, name, names)


def vector_width_of(A, layout: str, lda: int, t2: int, col_words: int | None = None) -> int:
    """:func:`vector_width` of the array A (its pointer's alignment and ``lda``)."""
    return vector_width(A.itemsize, A.data.ptr % 16 == 0, lda, layout, t2, col_words)


def split_count(layout: str, m: int, n: int, t1: int, t3: int, vec: int, sms: int, groups: int = 1) -> int:
    """Slices of n (split-K) that bring the launch to about SPLIT_THREADS_PER_SM threads per SM."""
    threads = -(-m // vec) if layout == "col" else -(-m // t3) * 32
    tile = t1 if layout == "col" else 32 // groups * vec
    want = -(-sms * SPLIT_THREADS_PER_SM // max(threads, 1))
    return int(max(1, min(want, MAX_SPLIT, n // (SPLIT_MIN_TILES * tile))))


def column_walk(m: int, n: int, itemsize: int, t1: int, t2: int, t3: int, sms: int) -> int:
    """Columns of A each of the column kernel's threads walks, one after another: its slice of n
    (the split as split_count makes it, A taken 16-byte aligned). At models.tsgemm.COL_COLUMN_S
    a column, the floor of a call whose rows are too few to fill the GPU."""
    vec = vector_width(itemsize, True, m, "col", t2)
    return -(-n // split_count("col", m, n, t1, t3, vec, sms))


def split_waves(S: int, s_max: int, blocks_x: int, n: int, align: int, slots: int) -> tuple[int, int]:
    """(slices, slice length: a multiple of ``align``) for a split of ``S`` to ``s_max`` slices
    (before rounding to whole tiles) that wastes the least of the last wave of ``slots`` resident
    blocks (ties: fewer slices). S <= 1 or slots < 1 (occupancy unknown): ``S`` slices.

    A memory-bound kernel whose blocks each keep a fixed number of loads in flight runs the last
    partial wave at that wave's share of the bandwidth: on an H100 the column kernel at n = 32768
    ran 416 blocks of 255 registers, one per SM (3.15 waves of 132), at 0.78 of the copy
    bandwidth, and 896 blocks at two per SM (3.39 waves of 264) at 0.85 (blocks per SM from the
    nvcc register counts, not measured)."""
    key = (S, s_max, blocks_x, n, align, slots)
    return _WAVES.get_or_create(key, lambda: _split_waves(*key))


def _split_waves(S, s_max, blocks_x, n, align, slots):
    def shape(s):
        L = -(-(-(-n // s)) // align) * align
        return -(-n // L), L

    def useful(s):                                 # slice-blocks of work per block slot used
        S2, L = shape(s)
        return blocks_x * n / L / (-(-blocks_x * S2 // slots) * slots)

    if S <= 1 or slots < 1:
        return shape(max(S, 1))
    best = max(range(S, max(S, s_max) + 1), key=lambda s: (round(useful(s), 2), -s))
    return shape(best)


def sms() -> int:
    """Multiprocessors of the current device (read once per device and process)."""
    return _cuda.device_attribute("MultiProcessorCount", cupy_module().cuda.Device().id)


def resident_blocks(fn, t1: int) -> int:
    """Blocks of ``fn`` an SM holds at once (the driver's occupancy query), 0 if unknown."""
    return _RESIDENT.get_or_create((_cuda.driver_function(fn).ptr, t1), lambda: _resident(fn, t1))


def _resident(fn, t1: int) -> int:
    try:
        return _cuda.resident_blocks(fn, t1)
    except Exception:  # an older CuPy without the query: no wave balancing
        return 0


def launch(A, layout: str, lda: int, B, C, t1: int, t2: int, t3: int, groups: int | None = None,
           col_words: int | None = None, steps: int | None = None, depth: int = 1,
           slices: int | None = None) -> None:
    """C[...] = A @ B with the TSM2 kernel of ``layout`` (all arrays CuPy, validated by the caller).

    ``depth``: the row kernel's warp steps of A in flight (:func:`rules.row_depths`; lowered to a
    divisor of its steps per B tile; ignored by the column kernel). For sweeps, ``groups`` and
    ``steps`` (row kernel) and ``col_words`` (column kernel) override the rules
    :func:`row_groups`, :func:`row_steps` and COL_ACC_WORDS, and ``slices`` the split
    (instead of :func:`split_count`; rounded to whole tiles, not balanced).
    """
    Launch(A, layout, lda, B.shape[1], C.strides, t1, t2, t3, groups, col_words, steps, depth, slices)(A, B, C)


def element_strides(byte_strides, itemsize: int) -> tuple:
    """C's (row, column) strides in elements, as the kernels take them."""
    return int(byte_strides[0] // itemsize), int(byte_strides[1] // itemsize)


class Launch:
    """One TSM2 launch with everything :func:`launch` decides from the shapes, A's alignment, k
    and C's strides worked out once: the kernel, grid, split and scalar arguments. Calling it
    with arrays of those shapes and strides only launches; the TSM2 kernel keeps one per shapes,
    strides and parameters, as FFT plans do, because the decisions cost tens of microseconds of
    host time a call (H100, n = 16384, fp32: a single call ran at 0.77 of copy bandwidth where
    calls back to back ran at 0.90)."""

    def __init__(self, A, layout, lda, k, c_strides, t1, t2, t3, groups=None, col_words=None,
                 steps=None, depth=1, slices=None):
        m, n = A.shape
        item = A.itemsize
        vec = vector_width_of(A, layout, lda, t2, col_words)
        g, u, d = template_args(layout, item, vec, t2, t3, groups, steps, depth)
        self.fn = _function(layout, A.dtype, t1, t2, t3, vec, g, u, d)
        rows_per_block = t1 * vec if layout == "col" else (t1 // 32) * t3
        n_sms = sms()
        S = int(slices or split_count(layout, m, n, t1, t3, vec, n_sms, g))
        align = t1 if layout == "col" else 32 // g * vec * u
        s_max = min(2 * S, MAX_SPLIT, max(S, n // (SPLIT_MIN_TILES * align)))
        slots = resident_blocks(self.fn, t1) * n_sms if S > 1 and not slices else 0
        S, L = split_waves(S, s_max, -(-m // rows_per_block), n, align, slots)
        self.S, self.item, self.dtype = S, item, A.dtype
        self.grid, self.block = (-(-m // rows_per_block), S), (t1,)
        # packed driver launches (_cuda.Launcher: ~5 us of host time against CuPy's ~10 for these
        # 16 parameters), the scalars as plain ints
        self.launch = _cuda.packed(self.fn, SOURCE, f"tsm2_{layout}major")
        cs = element_strides(c_strides, item)
        self.lda = int(lda)
        if S == 1:   # the kernel writes C; no workspace, no finish
            self.tail = (*cs, m, n, k, int(L), 0, 0, 0, 0, 0)
        else:        # slices to the S x m x k workspace (ldc k, 1), summed into C through its strides
            self.tail, self.c_strides = (k, 1, m, n, k, int(L), m * k), cs
            self.ws_size = S * m * k
            self.keep = self.ws_size * item <= KEEP_SCRATCH_BYTES
            self.scratch_key = (cupy_module().cuda.runtime.getDevice(), A.dtype.char, self.ws_size, self.grid[0])

    def _scratch(self):
        """The split's workspace and tickets (one a row tile, zero). The kernels leave the tickets
        at zero, so a set serves any launch of its sizes on its stream in turn: where small, it is
        kept (_SCRATCH) and a small call saves its allocation's host time; else allocated here."""
        cp = cupy_module()
        key = (*self.scratch_key, cp.cuda.get_current_stream().ptr) if self.keep else None
        got = _SCRATCH.get_fast(key) if key is not None else None
        if got is None:
            got = (cp.empty(self.ws_size, dtype=self.dtype), _cuda.zeroed(self.grid[0], cp.uint32))
            if key is not None:
                _SCRATCH.put(key, got)
        _cuda.hold(*got)   # a recorded call's graph reads and writes them on every replay
        return got

    def __call__(self, A, B, C) -> None:
        if self.S == 1:
            self.launch(self.grid, self.block, (A, self.lda, B, B.strides[0] // self.item, C, *self.tail))
            return
        ws, tickets = self._scratch()
        self.launch(self.grid, self.block, (A, self.lda, B, B.strides[0] // self.item, ws, *self.tail,
                                            C, *self.c_strides, tickets))


class SplitSum:
    """The split over n (split-K) side of a launch of S slices, worked out once: the kernel's C
    strides (C's own when S == 1, else (k, 1) in slice y of an S x m x k workspace at y * m * k),
    the workspace's size and the ordered sum of the slices into C (tsm2_split_sum:
    deterministic), a second launch. tsm2_tc.TcLaunch keeps one (the register kernels sum their
    slices in their own launch, :class:`Launch`)."""

    def __init__(self, dtype, m: int, k: int, c_strides, S: int):
        cs = element_strides(c_strides, np.dtype(dtype).itemsize)
        self.S, self.mk = S, m * k
        self.ldc = cs if S == 1 else (k, 1)          # the kernel's (ldc_r, ldc_c)
        self.size = S * self.mk if S > 1 else 0       # workspace elements
        if S > 1:
            fn = _cuda.function(SOURCE, f"tsm2_split_sum<{_cuda.ctype(dtype)}>", SPLIT_SUM_NAMES)
            self.launch = _cuda.packed(fn, SOURCE, "tsm2_split_sum")
            self.grid = (min(-(-self.mk // 256), 4 * sms()),)
            self.args = (S, self.mk, k, *cs)

    def __call__(self, ws, C) -> None:
        """The slices in ``ws`` (the workspace or its address) summed into C; nothing when S == 1."""
        if self.S > 1:
            S, mk, k, c0, c1 = self.args
            self.launch(self.grid, (256,), (ws, S, mk, k, C, c0, c1))


__all__ = ["Launch", "SplitSum", "launch", "kernel_name", "split_count", "split_waves", "column_walk", "sms",
           "resident_blocks", "vector_width_of", "SOURCE"]
