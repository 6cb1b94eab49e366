"""TSM2 tall-and-skinny GEMM (SEEDS section 5): C (m x k) = A (m x n) . B (n x k) for small k.

Two CUDA kernels in ``tsm2.cu``, one per layout of A, neither copies A:

* ``"col"`` -- column-major A (Fortran order, or any view with unit stride down a column):
  the paper's outer-product kernel, one thread per row, B tiles in shared memory, prefetch.
* ``"row"`` -- row-major A (C order, CuPy's default, or any view with unit stride along a row):
  a warp per ``t3`` rows, 16-byte coalesced loads, a transposed B tile in shared memory reused
  for the ``t3`` rows, a shuffle reduction at the end; ``depth`` warp steps of A in flight (more
  than one: the lane groups share the loads through shuffles).

A view with neither unit stride is rejected with a clear error (the planner routes it to cuBLAS).
A B without unit column stride is copied (it is n x k, small); A never is.

Parameters (the paper's): ``t1`` threads per block (= rows of a B tile for ``"col"``), ``t2``
columns of C per pass (A is read ceil(k / t2) times), ``t3`` loads of A in flight per thread
(``"col"``: elements of the row; ``"row"``: rows per warp, each a 16-byte vector per lane).
``t2`` and ``t3`` come from the performance model in :mod:`matplan.models.tsm2`; ``t1`` (and t3's
multiples, and the row kernel's depth) is chosen by timing the candidates on the device once per
(device, dtype, layout, buckets of k, n and the duel's rows: :func:`t1_key`) and kept in
:data:`T1_STORE` (an in-process dict; the tuning database plugs in with :func:`set_t1_store`).
A split over n is evened out to whole waves of resident blocks. The same timing tries the
cp.async kernels of ``tsm2_async.cu`` (both layouts, A streamed through shared memory) for k in
ASYNC_K, then times the winner and cuBLAS in alternation on the planned rows (up to
DUEL_ELEMENTS) to calibrate both costs (:func:`_duel`).
A prepared TSM2 keeps one :class:`Launch` (or ``tsm2_async.AsyncLaunch``) per k and strides, so a
plan's run only launches.
"""
from __future__ import annotations

import functools
import math
import warnings

import numpy as np

from ...core.timing import cuda_median_s, cuda_queued_s, warm_up
from ...core.xp import cupy_module
from .. import _cuda
from ...core.types import Cost
from ..base import Kernel, Prepared
from ..registry import register
from ...models.tsgemm import LAUNCH_S

SOURCE = "tsgemm/tsm2.cu"
#: Block sizes the online choice times (the model's candidate list is intersected with these).
#: 384: 12 warps of up to 168 registers, where the row kernel with depth > 1 compiles with fewer
#: spills than at 512 threads (128 registers; nvcc 13, sm_90: fp32 k = 16, depth 2: none).
T1_CHOICES = (64, 128, 256, 384, 512)
#: Static shared memory a kernel may use (bytes): the B tile must fit.
SMEM_LIMIT = 48 * 1024
#: Most accumulators (columns of C) a thread keeps per pass, by element size: the register budget.
MAX_T2 = {"col": {4: 32, 8: 16}, "row": {4: 32, 8: 32}}
#: Row-major kernel: most accumulators per lane (rows x columns of its group) and most rows per warp.
MAX_ROW_ACC = {4: 64, 8: 32}
MAX_ROWS_PER_WARP = 8
#: Row-major kernel: lane groups per warp it may use (each group computes t2 / G columns of C).
ROW_GROUPS = (1, 2, 4)
#: Row-major kernel: accumulators per lane past which the warp is split in more lane groups
#: (registers: t3 rows x ceil(t2 / G) columns; the compiler's copies of A and B come on top).
ROW_ACC_TARGET = {4: 32, 8: 32}
#: Row-major kernel: shared-memory bytes a lane reads per byte of A it loads are t2 / t3 (each B
#: element serves t3 rows); rows per warp are raised to at least t2 / ROW_SMEM_COLUMNS. The online
#: timing tries up to 4x that (H100 sweep at n = 16384, benchmarks/results/tsgemm-sweep-*: k = 16
#: best at t3 = 4 with 2 groups, k = 32 at t3 = 4 with 4 groups, both with t1 = 512).
ROW_SMEM_COLUMNS = 8
#: Split over n (split-K) until about this many threads per SM run: one thread per row (or a
#: warp per t3 rows) leaves an H100 mostly idle for m of a few thousand to tens of thousands.
SPLIT_THREADS_PER_SM = 768
#: ... but keep each slice at least this many B tiles long, and at most MAX_SPLIT slices.
SPLIT_MIN_TILES = 4
MAX_SPLIT = 64
#: Column-major kernel: 32-bit registers of accumulators (V rows x t2 columns) a thread may hold.
COL_ACC_WORDS = 64
#: The model's t3 is a lower bound of the loads in flight a kernel needs; the online timing also
#: tries t3 multiplied by these factors (on an H100 the model's t3 of 1-3 reached only 0.1-0.5 of
#: the copy bandwidth with the column kernel, t3 = 16 about 0.8: the model's memory latency is
#: the unloaded one, and loaded latency is several times higher).
T3_FACTORS = (1, 2, 4)
#: Most elements of A in the synthetic problem the online choice times (1 GiB of float32): up to
#: this the timed problem has the planned m, so the calibration ratio is the planned size's.
TIMING_ELEMENTS = 1 << 28
TIMING_REPEATS = 5
#: Calls queued back to back in each of the search's TIMING_REPEATS rounds: candidates are ranked
#: by their GPU time (host work is the same launch path for all of them). Ranked by single calls,
#: whose host jitter is 10-20 us against a ~100 us kernel at n = 8192, the search took variants
#: 3-4% slower back to back than the one it took in the run before (float32 row-major k = 16:
#: s3 at 0.870 of the copy bandwidth, the preset at 0.907; H100, 2026-11-25, eb48fb9).
SEARCH_CALLS = 3
#: GPU seconds of back-to-back calls before the search's timings (:func:`matplan._timing.warm_up`).
WARM_UP_S = 0.02
#: Rounds of the winner-against-cuBLAS timing that closes the search (_duel).
DUEL_ROUNDS = 5
#: Most elements of A in the duel's problem (8 GiB of float64), which has the planned m up to this
#: and up to DUEL_MEMORY of the GPU's free memory: the calibration that decides between TSM2 and
#: cuBLAS is taken at the planned size. Timed on TIMING_ELEMENTS (8192 of n = 32768's rows),
#: cuBLAS read 7-9% slower per row than it ran on all of them while TSM2 scaled as its model says,
#: and the planner took TSM2 at 0.963-0.966x cuBLAS (H100, float64 row-major k = 4, 8,
#: tsgemm-NVIDIA-H100-80GB-HBM3-2026-11-24-53f7ed7.json).
DUEL_ELEMENTS = 1 << 30
DUEL_MEMORY = 0.5
#: k for which the online timing of row-major A also tries the cp.async kernel (tsm2_async.cu),
#: with these knob sets over tsm2_async.default_config. H100, 2026-11-23, n = 16384-32768: 0.89-0.93
#: of copy bandwidth at k = 16 (this file's row kernel 0.76-0.79) and 0.58-0.62 at k = 32
#: (0.39-0.42) (benchmarks/results/tsm2-async-h100-2026-11-23-c7624ef.log). At k = 5..8 neither
#: kernel wins on every machine, so both are timed: H100s on 2026-11-24, n = 16384 float32 k = 8,
#: one machine ran the async preset at 0.95 of copy bandwidth (back to back), another ran the
#: register kernel at 0.90 and the async preset at 0.84 (tsm2-async-sweep-h100-2026-11-24-1323d22.log,
#: tsm2-online-choice-h100-2026-11-24-b21f221.log). At k = 3..4 row-major the register kernel
#: was faster on both, column-major the async kernel (n = 16384, k = 4: float32 0.99 of copy
#: bandwidth against 0.92, float64 1.00 against 0.98; tsgemm-h100-2026-11-24-818deae.log), so
#: both are timed there too. Column-major A is timed from k = 1: at n = 8192 the async kernel
#: with ``minb1`` ran float32 k = 1, 2 at 0.94-0.95 of copy bandwidth back to back against the
#: column register kernel's 0.86-0.87, float64 at 1.02 against 1.00
#: (benchmarks/results/tsm2-small-n-h100-2026-11-24-f828fdd.log).
ASYNC_K = (3, 32)
#: Knob sets over tsm2_async.default_config that the online timing tries (those equal to an
#: earlier one's config are skipped, :func:`async_variants`). ``minb1``: one resident block
#: asked of the compiler (more registers); ``wr1``: one warp along the rows, half the rows per
#: block where the preset has two (twice the blocks: at n = 8192 float64 k = 16, 256 blocks
#: where the preset's 128 leave SMs idle, 0.92 of copy bandwidth against 0.83-0.85 row-major and
#: 1.01 against 0.91 column-major, same log).
ASYNC_VARIANTS = {"preset": {}, "s3": {"stages": 3}, "minb1": {"minb": 1}, "wr1": {"wr": 1}}
#: Variants for grids of about one wave, tried only when the online timing runs the problem's own
#: rows (m <= TIMING_ELEMENTS / n): timed on 8192 of n = 32768's rows they won and then ran the
#: full problem 5-8% slower than the preset (float32 k = 16 minb1, float64 k = 16 wr1; H100,
#: tsgemm-h100-2026-11-24-b3ab259.log), where the planner took TSM2 at 0.87x cuBLAS.
SMALL_GRID_VARIANTS = ("minb1", "wr1")
#: The split-K reduction kernel (both element types, one module).
SPLIT_SUM_NAMES = ("tsm2_split_sum<float>", "tsm2_split_sum<double>")


# --- layout ------------------------------------------------------------------------------------
def layout_of(A) -> tuple[str, int]:
    """(kernel layout, leading dimension in elements) for A; ValueError if neither stride is unit.

    ``"row"`` when A has unit stride along a row (C order), ``"col"`` when it has unit stride
    down a column (Fortran order); views with a unit stride are handled in place. The stride of a
    dimension of length 1 does not matter.
    """
    m, n = A.shape
    item = A.itemsize
    if m == 0 or n == 0:
        return "row", max(n, 1)
    s0, s1 = A.strides
    if n <= 1:
        s1 = item
    if m <= 1:
        s0 = max(n, 1) * item if s1 == item else item
    if s1 == item and s0 > 0 and s0 % item == 0:
        return "row", s0 // item
    if s0 == item and s1 > 0 and s1 % item == 0:
        return "col", s1 // item
    raise ValueError(f"A: TSM2 needs unit stride along the rows or the columns of A, got strides "
                     f"{A.strides} (bytes) for shape {A.shape} and itemsize {item}; pass "
                     f"cupy.ascontiguousarray(A) or plan with the cuBLAS kernel")


def layout_of_features(f) -> str | None:
    """The kernel layout the planner's features imply ('C' -> 'row', 'F' -> 'col'), None if strided."""
    return {"C": "row", "F": "col"}.get(f.layout)


# --- parameters ----------------------------------------------------------------------------------
def balance_t2(t2: int, k: int, layout: str, itemsize: int) -> int:
    """t2 clipped to [1, k] and the register budget, then evened out over the passes it implies."""
    t2 = max(1, min(int(t2), k, MAX_T2[layout][itemsize]))
    passes = math.ceil(k / t2)
    return math.ceil(k / passes)


def _row_top(t2: int, itemsize: int) -> int:
    """Most rows per warp of the row-major kernel for t2 (with the most lane groups)."""
    return max(1, min(MAX_ROWS_PER_WARP, MAX_ROW_ACC[itemsize] // -(-t2 // max(ROW_GROUPS))))


def row_rows_per_warp(t2: int, t3_model: int, itemsize: int) -> int:
    """Adapter from the model's t3 (elements of A in flight per thread) to the row-major kernel's
    rows per warp: t3 / (elements per 16-byte load), at least t2 / ROW_SMEM_COLUMNS, within the
    register budget."""
    vec = 16 // itemsize
    rows = max(math.ceil(max(int(t3_model), 1) / vec), math.ceil(t2 / ROW_SMEM_COLUMNS))
    return max(1, min(rows, _row_top(t2, itemsize)))


def row_groups(t2: int, t3: int, itemsize: int) -> int:
    """Lane groups of the row-major kernel: the fewest whose t3 x ceil(t2 / G) accumulators stay
    within ROW_ACC_TARGET (the most groups if none does)."""
    for g in ROW_GROUPS:
        if t3 * -(-t2 // g) <= ROW_ACC_TARGET[itemsize]:
            return g
    return max(ROW_GROUPS)


def col_t3(t3_model: int) -> int:
    """The column-major kernel's t3: the power of two at or above the model's, at most 16
    (T1 must be a multiple of it; rounding up keeps at least the modelled memory concurrency)."""
    t3 = max(1, min(int(t3_model), 16))
    return 1 << (t3 - 1).bit_length()


#: Row-major kernel: most warp steps per B tile (one barrier per tile), within SMEM_LIMIT.
ROW_MAX_STEPS = 4


def row_steps(t2: int, groups: int, vec: int, itemsize: int) -> int:
    """Warp steps per B tile of the row kernel: as many as the double-buffered tile fits in
    SMEM_LIMIT, at most ROW_MAX_STEPS."""
    tile = 2 * groups * -(-t2 // groups) * (32 // groups) * vec * itemsize   # bytes for one step
    return max(1, min(ROW_MAX_STEPS, SMEM_LIMIT // tile))


def row_share(t3: int, groups: int) -> int:
    """Lane groups that share the row kernel's A loads when depth > 1 (the kernel's SH): G, 2 or 1,
    the largest dividing both t3 and G."""
    if t3 % groups == 0:
        return groups
    return 2 if t3 % 2 == 0 and groups % 2 == 0 else 1


def row_depths(t3: int, groups: int, steps: int) -> list[int]:
    """Depths (warp steps of A in flight) the online timing tries for the row kernel: 1, and the
    share factor when groups share loads and it divides the steps per B tile (same A registers as
    depth 1 without sharing, SH times the bytes in flight)."""
    sh = row_share(t3, groups)
    return [1, sh] if sh > 1 and steps % sh == 0 else [1]


def t1_fits(layout: str, t1: int, t2: int, itemsize: int) -> bool:
    """Whether the two B tile buffers of block size t1 fit the shared-memory limit."""
    vb = 16 // itemsize
    if layout == "col":
        return 2 * t1 * (-(-t2 // vb) * vb) * itemsize <= SMEM_LIMIT
    # G groups x ceil(t2 / G) rows of 32 / G x V columns: at most (t2 + 3) x 32 V elements
    return 2 * (t2 + max(ROW_GROUPS) - 1) * 32 * vb * itemsize <= SMEM_LIMIT


def kernel_params(layout: str, dtype, k: int, t2: int, t3: int) -> tuple[int, int]:
    """(t2, t3) as the kernel of ``layout`` runs them, from the model's (t2, t3)."""
    item = np.dtype(dtype).itemsize
    t2 = balance_t2(t2, k, layout, item)
    t3 = row_rows_per_warp(t2, t3, item) if layout == "row" else col_t3(t3)
    return t2, t3


def t1_candidates(layout: str, dtype, t2: int, model_t1=()) -> list[int]:
    """Block sizes to time: the model's candidates among T1_CHOICES (all of them if it gives none)
    that fit shared memory. The row kernel times every size: its B tile, reloaded from L2 for
    each step, serves all warps of a block, so 512 threads won at k >= 16 on an H100 where the
    model's occupancy (written for the column kernel's registers) dropped it."""
    item = np.dtype(dtype).itemsize
    if layout == "row":
        model_t1 = ()
    want = [t for t in (model_t1 or T1_CHOICES) if t in T1_CHOICES] or list(T1_CHOICES)
    return [t for t in want if t1_fits(layout, t, t2, item)] or [64]


# --- compiling and launching ------------------------------------------------------------------
def kernel_name(layout: str, dtype, t1: int, t2: int, t3: int, vec: int = 1, groups: int = 1,
                steps: int = 1, depth: int = 1) -> str:
    ct = _cuda.ctype(dtype)
    if layout == "col":
        return f"tsm2_colmajor<{ct},{t1},{t2},{t3},{vec}>"
    return f"tsm2_rowmajor<{ct},{t1},{t2},{t3},{vec},{groups},{steps},{depth}>"


def _function(layout, dtype, t1, t2, t3, vec, groups=1, steps=1, depth=1):
    """The compiled kernel; one module holds every T1_CHOICES block size of this
    (t2, t3, vec, groups, steps, depth).

    Memoised per device: building the names and looking the handle up took tens of microseconds
    of every TSM2 call."""
    return _compiled(layout, np.dtype(dtype), int(t1), int(t2), int(t3), int(vec), int(groups),
                     int(steps), int(depth), _cuda.device_id(SOURCE))


@functools.lru_cache(maxsize=None)
def _compiled(layout, dtype, t1, t2, t3, vec, groups, steps, depth, device_id):
    item = dtype.itemsize
    names = tuple(kernel_name(layout, dtype, t, t2, t3, vec, groups, steps, depth) for t in T1_CHOICES
                  if t1_fits(layout, t, t2, item))
    name = kernel_name(layout, dtype, t1, t2, t3, vec, groups, steps, depth)
    if name not in names:
        raise ValueError(f"t1: block size {t1} is not one of {T1_CHOICES} or its B tile does not fit "
                         f"{SMEM_LIMIT} bytes of shared memory (t2={t2}, {np.dtype(dtype)})")
    return _cuda.function(SOURCE, name, names)


def _vector_width(A, layout: str, lda: int, t2: int, col_words: int | None = None) -> int:
    """Elements of A one thread loads at once (one 16-byte load), 1 if A is not 16-byte aligned.

    Row kernel: consecutive columns of a row. Column kernel: consecutive rows of a column (the
    rows a thread owns), fewer when V x t2 accumulators would exceed COL_ACC_WORDS registers.
    """
    vec = 16 // A.itemsize
    if A.data.ptr % 16 or lda % vec:
        return 1
    if layout == "col":
        words = A.itemsize // 4
        while vec > 1 and vec * t2 * words > (col_words or COL_ACC_WORDS):
            vec //= 2
    return vec


def split_count(layout: str, m: int, n: int, t1: int, t3: int, vec: int, sms: int, groups: int = 1) -> int:
    """Slices of n (split-K) that bring the launch to about SPLIT_THREADS_PER_SM threads per SM."""
    threads = -(-m // vec) if layout == "col" else -(-m // t3) * 32
    tile = t1 if layout == "col" else 32 // groups * vec
    want = -(-sms * SPLIT_THREADS_PER_SM // max(threads, 1))
    return int(max(1, min(want, MAX_SPLIT, n // (SPLIT_MIN_TILES * tile))))


@functools.lru_cache(maxsize=4096)                 # on every split launch's path: keep it off the host time
def split_waves(S: int, s_max: int, blocks_x: int, n: int, align: int, slots: int) -> tuple[int, int]:
    """(slices, slice length: a multiple of ``align``) for a split of ``S`` to ``s_max`` slices
    (before rounding to whole tiles) that wastes the least of the last wave of ``slots`` resident
    blocks (ties: fewer slices). S <= 1 or slots < 1 (occupancy unknown): ``S`` slices.

    A memory-bound kernel whose blocks each keep a fixed number of loads in flight runs the last
    partial wave at that wave's share of the bandwidth: on an H100 the column kernel at n = 32768
    ran 416 blocks of 255 registers, one per SM (3.15 waves of 132), at 0.78 of the copy
    bandwidth, and 896 blocks at two per SM (3.39 waves of 264) at 0.85 (blocks per SM from the
    nvcc register counts, not measured)."""
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


def _sms() -> int:
    """Multiprocessors of the current device (read once per device and process)."""
    return _cuda.device_attribute("MultiProcessorCount", cupy_module().cuda.Device().id)


def _resident_blocks(fn, t1: int) -> int:
    """Blocks of ``fn`` an SM holds at once (the driver's occupancy query), 0 if unknown."""
    key = (_cuda.driver_function(fn).ptr, t1)
    if key not in _RESIDENT:
        try:
            _RESIDENT[key] = _cuda.resident_blocks(fn, t1)
        except Exception:  # an older CuPy without the query: no wave balancing
            _RESIDENT[key] = 0
    return _RESIDENT[key]


_RESIDENT: dict = {}


def launch(A, layout: str, lda: int, B, C, t1: int, t2: int, t3: int, groups: int | None = None,
           col_words: int | None = None, steps: int | None = None, depth: int = 1,
           slices: int | None = None) -> None:
    """C[...] = A @ B with the TSM2 kernel of ``layout`` (all arrays CuPy, validated by the caller).

    When too few rows fill the GPU, n is split in slices whose partial products go to a
    workspace and are summed in slice order afterwards (deterministic); the split is evened out
    to whole waves of resident blocks (:func:`split_waves`). ``depth``: the row kernel's warp
    steps of A in flight (:func:`row_depths`; lowered to a divisor of its steps per B tile;
    ignored by the column kernel). For sweeps, ``groups`` and ``steps`` (row kernel) and
    ``col_words`` (column kernel) override the rules :func:`row_groups`, :func:`row_steps` and
    COL_ACC_WORDS, and ``slices`` the split (instead of :func:`split_count`; rounded to whole
    tiles, not balanced).
    """
    Launch(A, layout, lda, B.shape[1], C.strides, t1, t2, t3, groups, col_words, steps, depth, slices)(A, B, C)


class Launch:
    """One TSM2 launch with everything :func:`launch` decides from the shapes, A's alignment, k
    and C's strides worked out once: the kernel, grid, split and scalar arguments. Calling it
    with arrays of those shapes and strides only launches; :func:`_launch_for` keeps one per
    shapes, strides and parameters, as FFT plans do, because the decisions cost tens of
    microseconds of host time a call (H100, n = 16384, fp32: a single call ran at 0.77 of copy
    bandwidth where calls back to back ran at 0.90, tsgemm-h100-2026-11-24-70d9d05.log)."""

    def __init__(self, A, layout, lda, k, c_strides, t1, t2, t3, groups=None, col_words=None,
                 steps=None, depth=1, slices=None):
        m, n = A.shape
        item = A.itemsize
        vec = _vector_width(A, layout, lda, t2, col_words)
        g = 1 if layout == "col" else int(groups or row_groups(t2, t3, item))
        u = 1 if layout == "col" else int(steps or row_steps(t2, g, vec, item))
        d = 1 if layout == "col" else max(1, min(int(depth), u))
        while u % d:                                        # the kernel's register slots need d | u
            d -= 1
        self.fn = _function(layout, A.dtype, t1, t2, t3, vec, g, u, d)
        rows_per_block = t1 * vec if layout == "col" else (t1 // 32) * t3
        sms = _sms()
        S = int(slices or split_count(layout, m, n, t1, t3, vec, sms, g))
        align = t1 if layout == "col" else 32 // g * vec * u
        s_max = min(2 * S, MAX_SPLIT, max(S, n // (SPLIT_MIN_TILES * align)))
        slots = _resident_blocks(self.fn, t1) * sms if S > 1 and not slices else 0
        S, L = split_waves(S, s_max, -(-m // rows_per_block), n, align, slots)
        self.split = SplitSum(A.dtype, m, k, c_strides, S)
        self.S, self.item, self.dtype, self.ws_shape = S, item, A.dtype, (S, m, k)
        self.grid, self.block = (-(-m // rows_per_block), S), (t1,)
        # packed driver launches (_cuda.Launcher: ~5 us of host time against CuPy's ~10 for these
        # 12 parameters), the scalars as plain ints
        self.launch = _cuda.packed(self.fn, SOURCE, f"tsm2_{layout}major")
        self.lda, self.tail = int(lda), (*self.split.ldc, m, n, k, int(L), self.split.mk)

    def __call__(self, A, B, C) -> None:
        out = C if self.S == 1 else cupy_module().empty(self.ws_shape, dtype=self.dtype)
        self.launch(self.grid, self.block, (A, self.lda, B, B.strides[0] // self.item, out, *self.tail))
        self.split(out, C)


class SplitSum:
    """The split over n (split-K) side of a launch of S slices, worked out once: the kernel's C
    strides (C's own when S == 1, else (k, 1) in slice y of an S x m x k workspace at y * m * k),
    the workspace's size and the ordered sum of the slices into C (tsm2_split_sum:
    deterministic). :class:`Launch` and tsm2_tc.TcLaunch each keep one."""

    def __init__(self, dtype, m: int, k: int, c_strides, S: int):
        item = np.dtype(dtype).itemsize
        cs = (int(c_strides[0] // item), int(c_strides[1] // item))
        self.S, self.mk = S, m * k
        self.ldc = cs if S == 1 else (k, 1)          # the kernel's (ldc_r, ldc_c)
        self.size = S * self.mk if S > 1 else 0       # workspace elements
        if S > 1:
            fn = _cuda.function(SOURCE, f"tsm2_split_sum<{_cuda.ctype(dtype)}>", SPLIT_SUM_NAMES)
            self.launch = _cuda.packed(fn, SOURCE, "tsm2_split_sum")
            self.grid = (min(-(-self.mk // 256), 4 * _sms()),)
            self.args = (S, self.mk, k, *cs)

    def __call__(self, ws, C) -> None:
        """The slices in ``ws`` (the workspace or its address) summed into C; nothing when S == 1."""
        if self.S > 1:
            S, mk, k, c0, c1 = self.args
            self.launch(self.grid, (256,), (ws, S, mk, k, C, c0, c1))


# --- online t1 choice -----------------------------------------------------------------------------
class InProcessT1Store:
    """The winners of the online timing, per :func:`t1_key` (device, dtype, layout, buckets of k, n
    and the duel's rows).

    Each entry keeps the winning ``{"t1": .., "t3": ..}`` (and ``"depth"`` for the row kernel when
    timed with depths), every candidate's seconds and
    ``ratio``: the winner's measured time (a call that allocates its C, as plan.run's does) over
    the model's prediction for the duel's problem, which calibrates the model's cost for this
    bucket. The tuning database replaces this class
    through :func:`set_t1_store` with an object that has the same ``get`` / ``put`` / ``ratio``.
    """

    def __init__(self):
        self._best: dict = {}
        self._ratio: dict = {}
        self.timings: dict = {}

    def get(self, key):
        return self._best.get(key)

    def ratio(self, key):
        return self._ratio.get(key)

    def put(self, key, best: dict, timings: dict, ratio: float | None = None) -> None:
        self._best[key] = {x: int(best[x]) for x in ("t1", "t3", "depth") if x in best}
        for x in ("async", "tc"):
            if best.get(x):
                self._best[key][x] = str(best[x])
        self.timings[key] = {_candidate_label(c): float(v) for c, v in timings.items()}
        if ratio is not None and math.isfinite(ratio) and ratio > 0:
            self._ratio[key] = float(ratio)

    def clear(self) -> None:
        self._best.clear()
        self._ratio.clear()
        self.timings.clear()


T1_STORE = InProcessT1Store()


def set_t1_store(store) -> None:
    """Use ``store`` (``get``/``put``/``ratio`` like :class:`InProcessT1Store`) for the online winners."""
    global T1_STORE
    if not all(hasattr(store, a) for a in ("get", "put", "ratio")):
        raise TypeError("store: expected an object with get(key), ratio(key) and put(key, best, timings, ratio)")
    T1_STORE = store


def _candidate_label(c: tuple) -> str:
    """'t1=256,t3=4,depth=2' for a register-kernel candidate, 'async=s3' for a cp.async one,
    'tc=d1' for a tensor-core one."""
    if c[0] in ("async", "tc"):
        return f"{c[0]}={c[1]}"
    return ",".join(f"{n}={x}" for n, x in zip(("t1", "t3", "depth"), c))


def async_eligible(layout: str, dtype, k: int, m: int, n: int) -> bool:
    """Whether the online timing tries the cp.async kernel: ASYNC_K[0] <= k <= ASYNC_K[1]
    (column-major: 1 <= k) and A's rows (row-major, C order: n * itemsize % 16 == 0) or columns
    (column-major, F order: m * itemsize % 16 == 0) start on 16-byte boundaries."""
    lead = n if layout == "row" else m
    low = ASYNC_K[0] if layout == "row" else 1
    return low <= k <= ASYNC_K[1] and lead * np.dtype(dtype).itemsize % 16 == 0


def async_variants(dtype, k: int, layout: str, m: int, n: int) -> tuple:
    """The ASYNC_VARIANTS names the online timing tries for an m x n A: those whose knobs the
    kernel accepts and differ from every earlier variant's (``wr1`` is the preset where it
    already has one warp along the rows), SMALL_GRID_VARIANTS only where the timing runs all m
    rows."""
    from . import tsm2_async
    seen, names = set(), []
    for name in ASYNC_VARIANTS:
        if name in SMALL_GRID_VARIANTS and timed_rows(m, n) < m:
            continue
        cfg = _async_config_items(np.dtype(dtype), int(k), name, layout)
        try:
            tsm2_async.check_config(dict(cfg), np.dtype(dtype).itemsize, layout == "col")
        except ValueError:
            continue
        if cfg not in seen:
            seen.add(cfg)
            names.append(name)
    return tuple(names)


def _bucket(x: int) -> int:
    """The power of two at or above ``x``."""
    return 1 << max(int(x) - 1, 0).bit_length()


def timed_rows(m: int, n: int, elements: int | None = None) -> int:
    """Rows of the online timing's problem for an m x n A: m, capped at ``elements`` (default
    TIMING_ELEMENTS) / n."""
    return max(1, min(int(m), (elements or TIMING_ELEMENTS) // max(int(n), 1)))


def duel_rows(m: int, n: int) -> int:
    """Rows of the duel's problem (:func:`_duel_problem`) when the GPU has the memory for it."""
    return timed_rows(m, n, DUEL_ELEMENTS)


def t1_key(device_name: str, dtype, layout: str, k: int, n: int, m: int) -> tuple:
    """The online timing's cache key: device, dtype, layout and the buckets of k, n and the
    duel's rows (:func:`duel_rows`, at least the search's :func:`timed_rows`), so neither a winner
    timed on a few thousand rows nor a calibration taken on them is reused for a problem whose
    grid is several times larger (or smaller)."""
    return (device_name, str(np.dtype(dtype)), layout, _bucket(k), _bucket(n), _bucket(duel_rows(m, n)))


def time_kernel(fn, repeats: int = TIMING_REPEATS, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` by CUDA events (the t1 search's timer)."""
    return cuda_median_s(fn, repeats, warmup)


def t3_candidates(layout: str, dtype, t2: int, t3: int) -> list[int]:
    """The kernel's t3 from the model and its T3_FACTORS multiples, within the kernel's limits."""
    item = np.dtype(dtype).itemsize
    if layout == "row":
        top = _row_top(t2, item)
        return sorted({min(t3 * f, top) for f in T3_FACTORS})
    return sorted({min(col_t3(t3 * f), 16) for f in T3_FACTORS})


#: cuBLAS (cupy.matmul) measured/model ratios per t1_key, timed beside the TSM2 candidates on the
#: same synthetic problem so both candidates are calibrated on the device alike (in-process).
VENDOR_RATIO: dict = {}


def vendor_ratio(device, f):
    """cuBLAS's measured/model ratio for the planner's tsgemm features: timed now on the bucket's
    synthetic problem if this process plans for its GPU and has not yet; None when not timed."""
    layout = layout_of_features(f)
    if layout is None:
        return None
    key = t1_key(device.name, f.dtype, layout, f.k, f.n, f.m)
    if key not in VENDOR_RATIO and f.m >= 1 and f.n >= 1 and f.k >= 1 and _can_time(f, device):
        if TSM2().supports(f) is None:
            list(TSM2().candidates(f, device))   # the t1 search's duel calibrates cuBLAS alongside
        if key not in VENDOR_RATIO:
            A, B, _ = _duel_problem(f.dtype, layout, f.m, f.n, f.k)
            _time_vendor(device, key, A, B, f.dtype)
    return VENDOR_RATIO.get(key)


def _vendor_model_s(device, m, n, k, dtype) -> float:
    """cuBLAS's analytic time (vendor.Cublas.cost without the launch) for an m x n A."""
    from ...models.tsgemm import CUBLAS_TS_EFFICIENCY
    item = np.dtype(dtype).itemsize
    eff = CUBLAS_TS_EFFICIENCY.get(str(np.dtype(dtype)), 0.5)
    return (m * n + n * k + m * k) * item / (device.mem_bandwidth * eff)


def _timing_problem(dtype, layout, m, n, k, rows=None):
    """Random A (``rows`` rows, default m capped so A has at most TIMING_ELEMENTS elements; in the
    layout, drawn in place), B and C."""
    cp = cupy_module()
    mb = rows or timed_rows(m, n)
    rng = cp.random.default_rng(12345)
    A = rng.random((mb, n) if layout == "row" else (n, mb), dtype=dtype)
    B = rng.random((n, k), dtype=dtype)
    return (A if layout == "row" else A.T), B, cp.empty((mb, k), dtype=dtype)


def _duel_problem(dtype, layout, m, n, k):
    """The duel's problem: :func:`duel_rows` rows where A, B and C take at most DUEL_MEMORY of the
    GPU's free memory (the pool's free blocks included), else the search's (:func:`timed_rows`)."""
    cp = cupy_module()
    rows = duel_rows(m, n)
    free = cp.cuda.runtime.memGetInfo()[0] + cp.get_default_memory_pool().free_bytes()
    if (rows * n + n * k + rows * k) * np.dtype(dtype).itemsize > DUEL_MEMORY * free:
        rows = timed_rows(m, n)
    return _timing_problem(dtype, layout, m, n, k, rows)


def _time_vendor(device, key, A, B, dtype, seconds: float | None = None) -> None:
    """VENDOR_RATIO[key]: cupy.matmul(A, B)'s seconds (timed here unless given) over cuBLAS's model."""
    if seconds is None:
        cp = cupy_module()
        seconds = time_kernel(lambda: cp.matmul(A, B))
    mb, n = A.shape
    VENDOR_RATIO[key] = seconds / _vendor_model_s(device, mb, n, B.shape[1], dtype)


def _candidate_launch(A, B, C, layout, lda, k, t2, c):
    """The launch a plan would keep for candidate ``c`` of the t1 search (("async", variant),
    ("tc", variant) or (t1, t3, depth)), so the search times host work as a plan's run pays it."""
    if c[0] == "async":
        return _async_launch(A, B, C, c[1], layout)
    if c[0] == "tc":
        from . import tsm2_tc
        return tsm2_tc.TcLaunch(A, B, C, layout, lda, c[1])
    t1, t3, d = c
    return Launch(A, layout, lda, k, C.strides, t1, t2, t3, depth=d)


def _duel(device, key, dtype, layout: str, m: int, n: int, k: int, t2: int, best: dict) -> tuple[float, int]:
    """The search's winner ``best`` ({"t1", "t3"[, "depth"][, "async" | "tc"]}) and cuBLAS timed in
    alternation on the duel's problem (:func:`_duel_problem`: the planned rows where memory
    allows), DUEL_ROUNDS rounds of TIMING_REPEATS calls each, the fastest round's median of each
    (a slow spell of the host inflates some rounds: with medians over the rounds, one read cuBLAS
    at 2.6x and TSM2 at 1.4x their benchmark times, and the planner took TSM2 at 1.12x cuBLAS;
    H100, n = 8192 float64 column-major k = 32, tsgemm-h100-2026-11-25-97c8658.log), so the two
    calibrations that decide between them see the same GPU state and size; sets VENDOR_RATIO[key]
    and returns (the winner's seconds, the rows timed). TSM2 is timed as a plan's run calls it (TSM2.run on
    the prepared A, its launch kept, C allocated), cuBLAS as ``cupy.matmul``: each with the host
    work a call pays. Timed apart (cuBLAS before the search), cuBLAS read 6.5% slow on an H100
    (n = 16384 float64 k = 16 row-major, 2026-11-24) and the planner took TSM2, 4.6% slower than
    cuBLAS in the benchmark. Timed into a given C, TSM2 read 1.064x faster than cuBLAS at
    n = 8192 float32 column-major k = 1, and plan.run, which allocates C (4-9 us of host time), ran
    1.039x slower than cupy.matmul (H100, tsgemm-NVIDIA-H100-80GB-HBM3-2026-11-24-0322449.json)."""
    cp = cupy_module()
    A, B, _ = _duel_problem(dtype, layout, m, n, k)
    kern = TSM2()
    prepared = kern.prepare(A, dict(best, layout=layout, t2=t2))
    kern.run(prepared, B)   # keeps the launch, as a plan's first call does
    mine, theirs = [], []
    for _ in range(DUEL_ROUNDS):
        mine.append(time_kernel(lambda: kern.run(prepared, B)))
        theirs.append(time_kernel(lambda: cp.matmul(A, B)))
    _time_vendor(device, key, A, B, dtype, float(min(theirs)))
    return float(min(mine)), A.shape[0]


def tune_t1(device, dtype, layout: str, m: int, n: int, k: int, t2: int, t3s, t1s,
            async_variants=(), tc_variants=()) -> tuple[dict, dict]:
    """Time every (t1, t3) candidate (row kernel: every (t1, t3, depth), depths from
    :func:`row_depths`, and the cp.async kernel with each of ``async_variants``, names of
    ASYNC_VARIANTS) on random data of this problem's shape (m capped so A has at most
    TIMING_ELEMENTS elements), SEARCH_CALLS calls back to back a round; cache the winner for the
    bucket and return it: {"t1", "t3", "depth"}, plus {"async": name} when the cp.async kernel
    won (its t1 is its block size, t3 the smallest of t3s, for the model's cost), or {"tc": name}
    when the 3xTF32 kernel with one of ``tc_variants`` (tsm2_tc.VARIANTS names; where
    tsm2_tc.ENABLED) won. The winner and cuBLAS
    are then timed in alternation on the planned rows (:func:`_duel`), which calibrates both for
    the bucket (VENDOR_RATIO, the store's ratio).

    A candidate that fails to compile or launch scores infinity (it is never chosen) and is named
    in a RuntimeWarning; RuntimeError when every candidate fails (:func:`score_candidates`).
    """
    key = t1_key(device.name, dtype, layout, k, n, m)
    hit = T1_STORE.get(key)
    if hit is not None:
        if key not in VENDOR_RATIO:   # a stored winner (another process, the tuning database)
            kinds = {"async": bool(async_variants), "tc": bool(tc_variants)}
            _duel(device, key, dtype, layout, m, n, k, t2,
                  {x: v for x, v in hit.items() if kinds.get(x, True)})
        return hit, {}
    A, B, C = _timing_problem(dtype, layout, m, n, k)
    _, lda = layout_of(A)
    configs = {((t1, t3) if layout == "col" else (t1, t3, d)): (t1, t3, d)
               for t3 in t3s for d in _depths(layout, A, lda, t2, t3) for t1 in t1s}
    configs.update({("async", v): ("async", v) for v in async_variants})
    configs.update({("tc", v): ("tc", v) for v in tc_variants})

    def launch_of(c):
        try:
            return _candidate_launch(A, B, C, layout, lda, k, t2, configs[c])
        except Exception as exc:  # noqa: BLE001  scored (and named) by score_candidates
            return exc
    # every candidate compiled first, then the GPU warmed up, so no timing starts on clocks that
    # the compiles let drop (a cold machine's first search once kept a variant at 0.68 of the
    # copy bandwidth where the runs before and after took one at 0.93-0.95; 2402ee0)
    launches = {c: launch_of(c) for c in configs}
    warm = next((go for go in launches.values() if not isinstance(go, Exception)), None)
    if warm is not None:
        warm_up(lambda: warm(A, B, C), WARM_UP_S)

    def time_one(c):
        go = launches[c]
        if isinstance(go, Exception):
            raise go
        return cuda_queued_s(lambda: go(A, B, C), SEARCH_CALLS, TIMING_REPEATS)
    timings = score_candidates(configs, time_one, f"tsm2 t1 search {key}")
    win = min(timings, key=lambda c: (timings[c], str(c)))
    if win[0] == "async":
        best = {"t1": _async_threads(dtype, k, win[1], layout), "t3": min(t3s), "depth": 1, "async": win[1]}
    elif win[0] == "tc":
        from . import tsm2_tc
        best = {"t1": tsm2_tc.threads(win[1]), "t3": min(t3s), "depth": 1, "tc": win[1]}
    else:
        best = dict(zip(("t1", "t3", "depth"), win))
    del A, B, C                      # before the duel allocates its (larger) problem
    win_s, rows = _duel(device, key, dtype, layout, m, n, k, t2, best)
    predicted = model_time(device, rows, n, k, dtype, layout, best["t1"], t2, best["t3"])
    T1_STORE.put(key, best, timings, win_s / predicted if predicted > 0 else None)
    return best, timings


def _async_config(dtype, k: int, variant: str, layout: str = "row") -> dict:
    return dict(_async_config_items(np.dtype(dtype), int(k), variant, layout))


@functools.lru_cache(maxsize=None)
def _async_config_items(dtype: np.dtype, k: int, variant: str, layout: str) -> tuple:
    """The knobs of an async variant, built once per (dtype, k, variant, layout) for the online
    timing's and the plans' launches (_async_launch)."""
    from . import tsm2_async
    return tuple(dict(tsm2_async.default_config(dtype, k, layout == "col"), **ASYNC_VARIANTS[variant]).items())


def _async_threads(dtype, k: int, variant: str, layout: str = "row") -> int:
    from . import tsm2_async
    return tsm2_async.shape_of(_async_config(dtype, k, variant, layout), np.dtype(dtype).itemsize,
                               layout == "col")["threads"]


def _async_launch(A, B, C, variant: str, layout: str = "row"):
    """The cp.async kernel's launch for these arrays' shapes and strides (tsm2_async.AsyncLaunch);
    A's alignment was checked by TSM2.prepare (or is the timing problem's)."""
    from . import tsm2_async
    return tsm2_async.AsyncLaunch(A, B, C, _async_config(A.dtype, B.shape[1], variant, layout),
                                  col=layout == "col")


def score_candidates(candidates, time_one, what: str) -> dict:
    """{candidate: seconds of time_one(candidate)}. One that raises (does not compile or launch)
    scores infinity, so it is never chosen, and is named in a RuntimeWarning: a broken launch path
    must not hide behind the candidates that work. RuntimeError when every candidate fails."""
    timings, failed = {}, {}
    for c in candidates:
        try:
            timings[c] = time_one(c)
        except Exception as exc:  # noqa: BLE001  any failure of one candidate is recorded, not fatal
            timings[c] = float("inf")
            failed[c] = f"{type(exc).__name__}: {exc}"
    if failed:
        first = next(iter(failed))
        msg = (f"{what}: {len(failed)} of {len(timings)} candidates failed to compile or launch "
               f"(first {first}: {failed[first]})")
        if len(failed) == len(timings):
            raise RuntimeError(msg)
        warnings.warn(msg + "; they are never chosen", RuntimeWarning, stacklevel=3)
    return timings


def _depths(layout: str, A, lda: int, t2: int, t3: int) -> list[int]:
    """The row kernel's depths to time for A (its rules' groups and steps); [1] for the column kernel."""
    if layout == "col":
        return [1]
    item = A.itemsize
    g = row_groups(t2, t3, item)
    return row_depths(t3, g, row_steps(t2, g, _vector_width(A, layout, lda, t2), item))


# --- the kernel ---------------------------------------------------------------------------------
def _model():
    from ...models import tsgemm as model  # written alongside; imported lazily
    return model


class TSM2(Kernel):
    name = "tsgemm.tsm2"
    reads_a_at_run = True
    ops = ("tsgemm",)
    backend = "gpu"
    deterministic = True   # no atomics: each element of C is one fixed-order sum

    def supports(self, f):
        if layout_of_features(f) is None:
            return (f"A is a non-contiguous view (layout {f.layout!r}); TSM2 is planned for C- or "
                    f"F-ordered A only")
        if f.k < 1 or f.m < 1 or f.n < 1:
            return "empty product"
        if max(f.m, f.n, f.k) >= 2 ** 31:
            return "a dimension is 2**31 or more (the kernels index rows with 32-bit counts)"
        return None

    def candidates(self, f, device):
        layout = layout_of_features(f)
        mp = _model_params(device, f)
        t2, t3 = kernel_params(layout, f.dtype, f.k, mp["t2"], mp["t3"])
        t1s = t1_candidates(layout, f.dtype, t2, mp["t1"])
        t1, depth, variant, tc_variant, source = t1s[0], 1, None, None, "model's first candidate (no GPU timing)"
        if _can_time(f, device):
            from . import tsm2_tc
            eligible = async_eligible(layout, f.dtype, f.k, f.m, f.n)
            tc = tsm2_tc.eligible(f.dtype, f.k, layout, f.m, f.n)
            best, _ = tune_t1(device, f.dtype, layout, f.m, f.n, f.k, t2,
                              t3_candidates(layout, f.dtype, t2, t3), t1s,
                              async_variants(f.dtype, f.k, layout, f.m, f.n) if eligible else (),
                              tsm2_tc.variants(layout) if tc else ())
            t1, t3, depth = best["t1"], best["t3"], best.get("depth", 1)
            # a bucket's winner may be the async kernel while this n's rows are not 16-byte
            # aligned: the register kernel then runs with the bucket's t1/t3
            variant = best.get("async") if eligible else None
            tc_variant = best.get("tc") if tc else None
            source = "timed on the device"
        p = {"layout": layout, "t1": int(t1), "t2": int(t2), "t3": int(t3), "t1_source": source}
        if layout == "row":
            p["depth"] = int(depth)
        if variant:
            p["async"] = variant
        if tc_variant:
            p["tc"] = tc_variant
        yield p

    def cost(self, f, params, device):
        mp = _model_params(device, f)
        t = model_time(device, f.m, f.n, f.k, f.dtype, params["layout"], params["t1"], params["t2"], params["t3"])
        ratio = T1_STORE.ratio(t1_key(device.name, f.dtype, params["layout"], f.k, f.n, f.m))
        k, thr = f.k, mp["t2threshold"]
        why = (f"TSM2 {params['layout']}-major kernel: k={k} {'<=' if k <= thr else '>'} "
               f"t2threshold={thr:.1f} ({mp['bound']}-bound); model t2={mp['t2']}, t3={mp['t3']} "
               f"(kernel t2={params['t2']}, t3={params['t3']}), predicted memory utilisation "
               f"{mp['util_mem']:.2f}, compute utilisation {mp['util_comp']:.2f}, "
               f"{t * 1e3:.4f} ms; t1={params['t1']} ({params.get('t1_source', '')})")
        if params.get("async"):
            why += (f"; the cp.async row kernel (tsm2_async, knobs {params['async']!r}) won the "
                    f"online timing")
        if params.get("tc"):
            why += (f"; the 3xTF32 tensor-core kernel (tsm2_tc {params['tc']!r}; "
                    f"MATPLAN_TF32X3=0 turns it off) won the online timing")
        if ratio is not None:
            why += f"; calibrated by the online timing: measured/model = {ratio:.2f}"
            return Cost(0.0, t * ratio + LAUNCH_S, why, calibrated=True)
        return Cost(0.0, t + LAUNCH_S, why)

    def prepare(self, A, params):
        layout, lda = layout_of(A)
        if layout != params["layout"]:
            raise ValueError(f"A: this plan's TSM2 kernel is for {params['layout']}-major A, got "
                             f"{layout}-major A; make a new plan for this layout")
        if params.get("async"):
            from . import tsm2_async
            tsm2_async.check_a(A, layout == "col")   # ValueError naming A when not 16-byte aligned
        if params.get("tc"):
            from . import tsm2_tc
            tsm2_tc.check_a(A, layout)
        return Prepared(self.name, dict(params), {"A": A}, A.shape, A.dtype,
                        meta={"layout": layout, "lda": lda})

    def run(self, prepared, B, out=None):
        """C = A @ B for the prepared A. A B (and out) of shapes, strides, dtype and alignment seen
        before with this prepared A goes straight to its kept launch: in a single call the GPU
        waits for the host's work before the launch. H100 host, 2026-11-24, n = 8192: a call's
        host time 11.2-12.5 -> 8.2-8.9 us, against a kernel of ~95 us in float32
        (tsm2-run-kept-h100-2026-11-24-7ef1831.log). Its C, with out None, is one that an earlier
        such call allocated after launching (:func:`_launch_kept`)."""
        cp = cupy_module()
        A = prepared.arrays["A"]
        kept = prepared.meta.setdefault("kept", {})
        key = _kept_key(cp, B, out)
        go = kept.get(key) if key is not None else None
        if go is not None:
            return _launch_kept(cp, go, A, B, out)
        m, n = A.shape
        p = prepared.params
        vector = B.ndim == 1
        B2 = B.reshape(-1, 1) if vector else B
        if B2.shape[0] != n:
            raise ValueError(f"B: expected {n} rows to match A ({m}x{n}), got {B2.shape[0]}")
        if B2.dtype != A.dtype:
            raise ValueError(f"B: dtype {B2.dtype} does not match A's {A.dtype}")
        k = B2.shape[1]
        if not _b_as_is(B2, bool(p.get("async"))):
            B2 = cp.ascontiguousarray(B2)   # n x k: small; A is never copied
        shape = (m,) if vector else (m, k)
        C = cp.empty(shape, dtype=A.dtype) if out is None else _check_out(out, shape, A.dtype)
        C2 = C[:, None] if vector else C
        if m == 0 or k == 0:
            return C
        if n == 0:
            C2.fill(0)
            return C
        go = _launch_for(A, B2, C2, p, prepared.meta["layout"], prepared.meta["lda"])
        go(A, B2, C2)
        if key is not None and B2 is B and C2 is C:   # launched on B and C as they are: keep it
            _keep(kept, key, go)
        return C

    def runner(self, params):
        """``Plan.run``'s call: the first call for each A layout and alignment and B / out layout
        (:func:`_kept_key`) goes through prepare and run; later ones only launch, with the launch
        run kept, which saves the 5-7 us of prepare and run's checks on a host where a call's
        whole host time is 12-28 us (H100, 2026-11-24). What is kept, and when, is run's rule."""
        general = super().runner(params)
        cp = cupy_module()
        if cp is None:
            return general
        p, kept = dict(params), {}

        def run(A, B, out=None):
            b_key = _kept_key(cp, B, out)
            key = None if b_key is None else (A.strides, A.data.ptr % 16, b_key)
            go = kept.get(key) if key is not None else None
            if go is not None:
                return _launch_kept(cp, go, A, B, out)
            prepared = self.prepare(A, p)
            C = self.run(prepared, B, out=out)
            go = prepared.meta["kept"].get(b_key) if key is not None else None
            if go is not None:
                _keep(kept, key, go)
            return C
        return run


#: Spare Cs by shape, dtype, device and stream (:func:`_launch_kept`), at most SPARE_CACHE_SIZE
#: in the process however many plans run.
_SPARES: dict = {}
SPARE_CACHE_SIZE = 4


def _launch_kept(cp, go, A, B, out):
    """``go(A, B, C)`` with C = out, or else a C that an earlier kept call of this shape and dtype
    on this device and stream allocated after its own launch (_SPARES): a single call's
    allocation (4-12 us of host time, H100 hosts, 2026-11-25) then overlaps the GPU's work of the
    earlier call instead of delaying this launch. A spare is handed out once (``dict.pop``: no
    two threads share one); the stream is in the key because CuPy's pool reuses memory by the
    stream it was taken on."""
    if out is not None:
        go(A, B, out)
        return out
    shape = (A.shape[0], B.shape[1])
    key = (shape, A.dtype.char, cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr)
    C = _SPARES.pop(key, None)
    if C is None:
        C = cp.empty(shape, dtype=A.dtype)
    go(A, B, C)
    _keep(_SPARES, key, cp.empty(shape, dtype=A.dtype), SPARE_CACHE_SIZE)
    return C


def _kept_key(cp, B, out):
    """What run's checks and launch depend on besides the prepared A and the parameters: the
    device, B's shape, dtype, strides and 16-byte alignment, and out's shape, dtype and strides;
    None (never kept) unless B and out are 2-D CuPy arrays (or out is None)."""
    if type(B) is not cp.ndarray or B.ndim != 2 or not (out is None or type(out) is cp.ndarray):
        return None
    return (cp.cuda.runtime.getDevice(), B.shape, B.dtype.char, B.strides, B.data.ptr % 16,
            None if out is None else (out.shape, out.dtype.char, out.strides))


def _b_as_is(B2, contiguous: bool) -> bool:
    """Whether the kernels read this n x k B without a copy: unit stride along its rows, rows not
    overlapping, and C-contiguous where ``contiguous`` (the cp.async kernel)."""
    return (B2.strides[1] == B2.itemsize and B2.strides[0] >= B2.shape[1] * B2.itemsize
            and (B2.flags.c_contiguous or not contiguous))


#: Launch decisions (:class:`Launch`, tsm2_async.AsyncLaunch) by everything they depend on: the
#: device, A's shape, dtype, layout, leading dimension and alignment, B's and C's strides and
#: alignment, k and the parameters. Kept across prepared inputs, so ``plan.run``, which prepares
#: A on every call, pays them once (they cost 40-180 us of host time a call on an H100 host,
#: n = 8192-16384, 2026-11-24). A launch holds no buffers: sharing one between threads is safe.
_LAUNCHES: dict = {}
#: Entries kept before the cache is emptied (a launch is a few hundred bytes).
LAUNCH_CACHE_SIZE = 512


def _launch_for(A, B2, C2, p: dict, layout: str, lda: int):
    """The launch (:class:`Launch` or the async kernel's) of these arrays and parameters ``p``,
    from _LAUNCHES or made and kept there."""
    k = B2.shape[1]
    key = (cupy_module().cuda.runtime.getDevice(), A.shape, A.dtype.char, layout, lda, A.data.ptr % 16,
           k, B2.strides, B2.data.ptr % 16, C2.strides,
           p["t1"], p["t2"], p["t3"], p.get("depth", 1), p.get("async"), p.get("tc"))
    go = _LAUNCHES.get(key)
    if go is None:
        if p.get("async"):
            go = _async_launch(A, B2, C2, p["async"], layout)
        elif p.get("tc"):
            from . import tsm2_tc
            go = tsm2_tc.TcLaunch(A, B2, C2, layout, lda, p["tc"])
        else:
            go = Launch(A, layout, lda, k, C2.strides, p["t1"], min(p["t2"], k), p["t3"], depth=p.get("depth", 1))
        _keep(_LAUNCHES, key, go)
    return go


def _keep(cache: dict, key, value, size: int | None = None) -> None:
    """cache[key] = value, the cache emptied first when it holds ``size`` (default
    LAUNCH_CACHE_SIZE) entries."""
    if len(cache) >= (size or LAUNCH_CACHE_SIZE):
        cache.clear()
    cache[key] = value


def _check_out(out, shape, dtype):
    cp = cupy_module()
    if not isinstance(out, cp.ndarray):
        raise TypeError(f"out: expected a CuPy array, got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype:
        raise ValueError(f"out: expected shape {shape} and dtype {np.dtype(dtype)}, got {out.shape} {out.dtype}")
    if any(s % out.itemsize or (s == 0 and d > 1) for s, d in zip(out.strides, out.shape)):
        raise ValueError(f"out: strides {out.strides} must be nonzero multiples of the itemsize")
    return out


def _can_time(f, device) -> bool:
    """Time t1 online only when planning for the GPU in this process."""
    return f.backend == "gpu" and getattr(device, "source", "") == "measured" and cupy_module() is not None


def _model_params(device, f) -> dict:
    """The model's choice (:func:`matplan.models.tsm2.choose_params`) for the planner's features."""
    raw = _model().choose_params(device, f.m, f.n, f.k, f.dtype)
    return {"t1": [int(t) for t in raw["t1"]], "t2": int(raw["t2"]), "t3": int(raw["t3"]),
            "predicted_s": float(raw["predicted_s"]), "bound": str(raw["bound"]),
            "t2threshold": float(raw["t2threshold"]), "util_mem": float(raw["mem_util"]),
            "util_comp": float(raw["comp_util"])}


def model_time(device, m, n, k, dtype, layout, t1, t2, t3) -> float:
    """The model's predicted seconds for these kernel parameters.

    Adapter: the model describes the paper's column-major kernel; the row kernel is costed with
    the same figures, its t3 (rows per warp, a 16-byte load each) converted to elements of A per
    thread. Infeasible figures in the model (inf) are returned as they are.
    """
    model = _model()
    item = np.dtype(dtype).itemsize
    t3e = min(t3 * (16 // item), model.T3_MAX) if layout == "row" else t3
    t = float(model.predict_time(device, m, n, k, dtype, t1, t2, t3e))
    while layout == "row" and not math.isfinite(t) and t3e > 1:   # the model's register count for
        t3e //= 2                                                  # the column kernel's figures
        t = float(model.predict_time(device, m, n, k, dtype, t1, t2, t3e))
    if layout == "row" and not math.isfinite(t):
        # The column kernel's register count (c + 3 t2 + 2 t3 values) does not describe the row
        # kernel, whose lanes hold t3 x t2 / G accumulators: where it leaves no whole block of t1
        # threads (t1 = 512 at k >= 16 on an H100: inf, so the planner never chose the measured
        # winner), cost it with the occupancy not rounded to blocks.
        t = float(model.predict_time(device, m, n, k, dtype, None, t2, t3e))
    return t


register(TSM2())
