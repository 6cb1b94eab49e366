"""TSM2's rules: A's layout, the kernels' parameters from the model's, the candidate lists the
planner's measurement tries, the shape buckets its timings are kept by, and the model adapter.

Everything here is a function of shapes, dtypes and the device spec: nothing touches the GPU.
Parameters (the paper's): ``t1`` threads per block (= rows of a B tile for ``"col"``), ``t2``
columns of C per pass (A is read ceil(k / t2) times), ``t3`` loads of A in flight per thread
(``"col"``: elements of the row; ``"row"``: rows per warp, each a 16-byte vector per lane).
``t2`` and ``t3`` come from the performance model in :mod:`matplan.models.tsgemm`; ``t1`` (and
t3's multiples, and the row kernel's depth) is chosen by the planner's measurement.
"""
from __future__ import annotations

import math

import numpy as np

from ...core.cache import BoundedCache
from ...models import tsgemm as model

#: Block sizes the measurement tries (the model's candidate list is intersected with these).
#: 384: 12 warps of up to 168 registers, where the row kernel with depth > 1 compiles with fewer
#: spills than at 512 threads (128 registers; nvcc 13, sm_90: fp32 k = 16, depth 2: none).
T1_CHOICES = (64, 128, 256, 384, 512)
#: The row kernel's block size where none was timed (a plan that does not measure, a config not yet
#: compiled): its warps share one B tile, so a small block reloads B for few rows. H200, n = 8192,
#: k = 2, untimed: 64 threads (the first size) ran at 0.26 of the copy bandwidth; the tuning runs'
#: row-kernel winners are 128-512 threads, most of them 256 or 512.
DEFAULT_ROW_T1 = 256
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
#: element serves t3 rows); rows per warp are raised to at least t2 / ROW_SMEM_COLUMNS. The
#: measurement tries up to 4x that (H100 sweep at n = 16384: k = 16 best at t3 = 4 with 2 groups,
#: k = 32 at t3 = 4 with 4 groups, both with t1 = 512).
ROW_SMEM_COLUMNS = 8
#: Row-major kernel: most warp steps per B tile (one barrier per tile), within SMEM_LIMIT.
ROW_MAX_STEPS = 4
#: Column-major kernel: 32-bit registers of accumulators (V rows x t2 columns) a thread may hold.
COL_ACC_WORDS = 64
#: The model's t3 is a lower bound of the loads in flight a kernel needs; the measurement also
#: tries t3 multiplied by these factors (on an H100 the model's t3 of 1-3 reached only 0.1-0.5 of
#: the copy bandwidth with the column kernel, t3 = 16 about 0.8: the model's memory latency is
#: the unloaded one, and loaded latency is several times higher).
T3_FACTORS = (1, 2, 4)
#: Rows of A past which the measurement's small-grid variants are not tried
#: (:data:`SMALL_GRID_ELEMENTS` / n rows, see :func:`timed_rows`).
SMALL_GRID_ELEMENTS = 1 << 28
#: Most elements of A a shape bucket distinguishes (8 GiB of float64): every m past
#: BUCKET_ELEMENTS / n rows shares one bucket, so a timing is reused for every larger problem
#: while a timing on a few thousand rows is not reused for a grid several times larger.
BUCKET_ELEMENTS = 1 << 30
#: k for which the measurement of row-major A also tries the cp.async kernel (tsm2_async.cu).
#: H100, n = 16384-32768: 0.89-0.93 of copy bandwidth at k = 16 (the register kernel 0.76-0.79)
#: and 0.58-0.62 at k = 32 (0.39-0.42). At k = 5..8 neither kernel wins on every machine, so both
#: are timed (one H100 ran the async preset at 0.95 of copy bandwidth back to back, another the
#: register kernel at 0.90 and the async preset at 0.84). At k = 3..4 row-major the register
#: kernel was faster, column-major the async kernel (n = 16384, k = 4: float32 0.99 of copy
#: bandwidth against 0.92, float64 1.00 against 0.98), so both are timed there too. Column-major
#: A is timed from k = 1: at n = 8192 the async kernel with ``minb1`` ran float32 k = 1, 2 at
#: 0.94-0.95 of copy bandwidth back to back against the column register kernel's 0.86-0.87.
ASYNC_K = (3, 32)
#: Knob sets over tsm2_async.default_config that the measurement tries (those equal to an earlier
#: one's config are skipped, configs.async_variants). ``minb1``: one resident block asked of the
#: compiler (more registers); ``wr1``: one warp along the rows, half the rows per block where the
#: preset has two (twice the blocks: at n = 8192 float64 k = 16, 256 blocks where the preset's
#: 128 leave SMs idle, 0.92 of copy bandwidth against 0.83-0.85 row-major and 1.01 against 0.91
#: column-major).
ASYNC_VARIANTS = {"preset": {}, "s3": {"stages": 3}, "minb1": {"minb": 1}, "wr1": {"wr": 1}}
#: Variants for grids of about one wave, tried only for A of at most :func:`timed_rows` rows:
#: timed on 8192 of n = 32768's rows they won and then ran the full problem 5-8% slower than the
#: preset (float32 k = 16 minb1, float64 k = 16 wr1; H100).
SMALL_GRID_VARIANTS = ("minb1", "wr1")


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
    """Depths (warp steps of A in flight) the measurement tries for the row kernel: 1, and the
    share factor when groups share loads and it divides the steps per B tile (same A registers as
    depth 1 without sharing, SH times the bytes in flight)."""
    sh = row_share(t3, groups)
    return [1, sh] if sh > 1 and steps % sh == 0 else [1]


def vector_width(itemsize: int, aligned: bool, lda: int, layout: str, t2: int,
                 col_words: int | None = None) -> int:
    """Elements of A one thread loads at once (one 16-byte load), 1 if A is not 16-byte aligned
    (``aligned``: its data pointer; ``lda`` a multiple of the vector).

    Row kernel: consecutive columns of a row. Column kernel: consecutive rows of a column (the
    rows a thread owns), fewer when V x t2 accumulators would exceed COL_ACC_WORDS registers.
    """
    vec = 16 // itemsize
    if not aligned or lda % vec:
        return 1
    if layout == "col":
        words = itemsize // 4
        while vec > 1 and vec * t2 * words > (col_words or COL_ACC_WORDS):
            vec //= 2
    return vec


def depths(layout: str, itemsize: int, vec: int, t2: int, t3: int) -> list[int]:
    """The row kernel's depths to try for t2, t3 and A's vector width (its rules' groups and
    steps); [1] for the column kernel."""
    if layout == "col":
        return [1]
    g = row_groups(t2, t3, itemsize)
    return row_depths(t3, g, row_steps(t2, g, vec, itemsize))


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


def t3_candidates(layout: str, dtype, t2: int, t3: int) -> list[int]:
    """The kernel's t3 from the model and its T3_FACTORS multiples, within the kernel's limits."""
    item = np.dtype(dtype).itemsize
    if layout == "row":
        top = _row_top(t2, item)
        return sorted({min(t3 * f, top) for f in T3_FACTORS})
    return sorted({min(col_t3(t3 * f), 16) for f in T3_FACTORS})


def async_eligible(layout: str, dtype, k: int, m: int, n: int) -> bool:
    """Whether the measurement tries the cp.async kernel: ASYNC_K[0] <= k <= ASYNC_K[1]
    (column-major: 1 <= k) and A's rows (row-major, C order: n * itemsize % 16 == 0) or columns
    (column-major, F order: m * itemsize % 16 == 0) start on 16-byte boundaries."""
    lead = n if layout == "row" else m
    low = ASYNC_K[0] if layout == "row" else 1
    return low <= k <= ASYNC_K[1] and lead * np.dtype(dtype).itemsize % 16 == 0


# --- shape buckets -------------------------------------------------------------------------------
def _bucket(x: int) -> int:
    """The power of two at or above ``x``."""
    return 1 << max(int(x) - 1, 0).bit_length()


def timed_rows(m: int, n: int, elements: int | None = None) -> int:
    """m capped at ``elements`` (default SMALL_GRID_ELEMENTS) / n rows."""
    return max(1, min(int(m), (elements or SMALL_GRID_ELEMENTS) // max(int(n), 1)))


def bucket_rows(m: int, n: int) -> int:
    """The rows a bucket tells apart: m capped at BUCKET_ELEMENTS / n."""
    return timed_rows(m, n, BUCKET_ELEMENTS)


def bucket(dtype, layout: str, m: int, n: int, k: int) -> tuple:
    """The planner's measurement key of a tall-and-skinny product (TSM2 and cuBLAS alike): dtype,
    layout and the power-of-two buckets of k, n and the rows (:func:`bucket_rows`)."""
    return (str(np.dtype(dtype)), layout, _bucket(k), _bucket(n), _bucket(bucket_rows(m, n)))


def bucket_of_features(f) -> tuple | None:
    """:func:`bucket` of the planner's features; None for a strided or empty A."""
    layout = layout_of_features(f)
    if layout is None or min(f.m, f.n, f.k) < 1:
        return None
    return bucket(f.dtype, layout, f.m, f.n, f.k)


# --- the model -----------------------------------------------------------------------------------
#: The model's choice per (device, m, n, k, dtype): the descent takes milliseconds, and the
#: planner costs every config of the search space with it.
_MODEL_PARAMS = BoundedCache("tsgemm.model_params", 1024)


def model_params(device, f) -> dict:
    """The model's choice (:func:`matplan.models.tsgemm.choose_params`) for the planner's features."""
    key = (device, f.m, f.n, f.k, f.dtype)
    hit = _MODEL_PARAMS.get(key)
    if hit is None:
        raw = model.choose_params(device, f.m, f.n, f.k, f.dtype)
        hit = {"t1": [int(t) for t in raw["t1"]], "t2": int(raw["t2"]), "t3": int(raw["t3"]),
               "predicted_s": float(raw["predicted_s"]), "bound": str(raw["bound"]),
               "t2threshold": float(raw["t2threshold"]), "util_mem": float(raw["mem_util"]),
               "util_comp": float(raw["comp_util"])}
        _MODEL_PARAMS.put(key, hit)
    return hit


def model_time(device, m, n, k, dtype, layout, t1, t2, t3) -> float:
    """The model's predicted seconds for these kernel parameters.

    Adapter: the model describes the paper's column-major kernel; the row kernel is costed with
    the same figures, its t3 (rows per warp, a 16-byte load each) converted to elements of A per
    thread. Infeasible figures in the model (inf) are returned as they are.
    """
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


def default_params(device, f) -> dict:
    """The model's parameters without any timing: its t2 and t3 as the kernel of A's layout runs
    them, depth 1, and a block size the model does not rank (``"layout"``, ``"t1"``, ``"t2"``,
    ``"t3"``): the column kernel's first candidate, the row kernel's DEFAULT_ROW_T1 where it fits."""
    layout = layout_of_features(f)
    mp = model_params(device, f)
    t2, t3 = kernel_params(layout, f.dtype, f.k, mp["t2"], mp["t3"])
    t1s = t1_candidates(layout, f.dtype, t2, mp["t1"])
    t1 = max((t for t in t1s if t <= DEFAULT_ROW_T1), default=t1s[0]) if layout == "row" else t1s[0]
    return {"layout": layout, "t1": t1, "t2": t2, "t3": t3}
