"""Host-side rules of the hash SpGEMM, pure functions of sizes (no GPU): the numeric_esc classes,
the table ladder and launch shapes, the row classification (the NumPy/CuPy reference of
hash_analysis.cu's classify_rows), which big tables are lifted to the global path, how numeric
tables are sorted, and when the one-pass path is taken. The launch path and the planner's cost
(kernel.py) both read them.

Table sizes are powers of two from 32 up to the largest that fits the device's shared memory per
block (227 KB on an H100: 16384 slots of 12 bytes in float64, 32768 key-only slots in the
symbolic pass); ``smem_limit`` sets another cap (the paper's 48 KB, for instance).
"""
from __future__ import annotations

import functools

import numpy as np

from ...core.xp import array_module
from ...models import spgemm as spgemm_model

#: Lanes of a row's group in the shared-table kernels (template argument W): 8 or 16 lanes of a
#: warp for short rows, else whole warps (32).
GROUP_WIDTHS = (8, 16, 32)
#: The sort-based numeric kernel of the one-pass path (numeric_esc<T, W, P>): a row of at most
#: W * P products is expanded into registers (P a lane of a W-lane group), bitonic-sorted by column
#: and its runs summed; (W, P) by class, the smallest that holds the row. It replaces the hash
#: table and its rank sort for short rows (``spgemm(..., esc=False)`` keeps the hash).
ESC_CLASSES = ((8, 2), (8, 4), (16, 4), (32, 4), (32, 8), (32, 16))
ESC_CAPS = tuple(w * p for w, p in ESC_CLASSES)
#: numeric_esc's values sit in shared memory sized for blocks of ESC_BLOCK threads.
ESC_BLOCK = 256


def esc_max_columns(cap: int) -> int:
    """Most columns B may have for the numeric_esc class of ``cap`` slots: a product travels as
    column << log2(cap) | slot in an int below EMPTY_KEY (2^31 - 1); wider B keep the hash tables."""
    return (1 << (32 - cap.bit_length())) - 1


@functools.lru_cache(maxsize=None)
def esc_caps(k: int) -> tuple:
    """The numeric_esc classes a product with B of ``k`` columns may use (a prefix of ESC_CAPS)."""
    return tuple(cap for cap in ESC_CAPS if k <= esc_max_columns(cap))


#: Smallest hash table (one warp's worth of slots).
MIN_TABLE = 32
#: Static shared memory of the kernels plus margin, taken off the per-block budget.
STATIC_SMEM = 1024
#: Threads per row: table size / slots per thread, clamped to [32, MAX_TPR], or to [MIN_TPR,
#: MAX_TPR] for tables of at most SUBWARP_MAX_TABLE slots (a row is then 8 or 16 lanes of a warp,
#: several short rows a warp); rows per block fill BLOCK_THREADS, at most MAX_RPB (the kernels'
#: per-row shared counters). H100, MIN_TPR 8/16/32 (benchmarks/spgemm_phases.py):
#: world_highways' symbolic pass (rows of <= 16 products) 298 -> 154 us at 8 lanes, 208 at 16;
#: its numeric pass 484 -> 305 us at 16 lanes; rows of 64 products (uniform) lost at 16 lanes
#: (symbolic 185 -> 286 us), hence the cap. The numeric table is ~2x the row's nnz (TABLE_LOAD)
#: and its rank sort holds 2 slots a thread (NUMERIC_SUBWARP_SLOTS, at most 4, for sub-warp
#: tables); the symbolic table is ~2x the row's products (an upper bound of its nnz), so
#: 2 slots a thread gave a thread per product (banded: 512 threads for 289 products a row); 8
#: measured best of 2/4/8 on the H100 (symbolic pass: banded 1469 -> 539 us, ice40 2814 -> 1676,
#: Poisson 260 -> 185).
MIN_TPR = 8
SUBWARP_MAX_TABLE = 64
MAX_TPR = 1024
MAX_RPB = 32
NUMERIC_SLOTS_PER_THREAD = 2
NUMERIC_SUBWARP_SLOTS = 2
SYMBOLIC_SLOTS_PER_THREAD = 8
BLOCK_THREADS = 256
#: A row takes the smallest table whose size times its load holds it (the largest table may fill
#: up): SMALL_TABLE_LOAD for tables of at most SUBWARP_MAX_TABLE slots, TABLE_LOAD above. H100,
#: 0.5 -> 0.75 for every table (benchmarks/spgemm_phases.py): numeric pass
#: block-dense 3624 -> 2298 us, ice40 23.9 -> 17.1 ms, R-MAT 53.1 -> 48.5 ms, banded 710 -> 547
#: (its symbolic pass 684 -> 459); rows of small tables gained nothing (dragon lost, 748 -> 829).
TABLE_LOAD = 0.75
SMALL_TABLE_LOAD = 0.5
#: Load up to which the largest numeric table takes rows (past it: the global path). H100, R-MAT
#: scale 16, 1.0 -> 0.75: numeric_shared 21.1 -> 5.2 ms (1,162 rows of 12k-16k columns
#: probed long chains in a 16384-slot table), the global path 11.4 -> 16.1 ms, the call 31.0 -> 26.3.
NUMERIC_LAST_TABLE_LOAD = 0.75
#: Sorted rows of tables past RANK_SORT_MAX slots (hash_shared.cu's, the rank sort's limit) are ordered
#: by a bitmap of B's columns instead of a bitonic sort of the table (numeric_shared; bitmap_words)
#: when the bitmap fits beside the table and has at most BITMAP_WORDS_PER_SLOT 32-bit words a slot
#: (its clearing and scan cost ~k/32 words a row, the bitonic network ~S log2(S)^2 / 4 exchanges).
RANK_SORT_MAX = 256
BITMAP_WORDS_PER_SLOT = 4
INT32_MAX = np.iinfo(np.int32).max
KEY_BYTES = 4


# ----------------------------------------------------------------------------- tables and launch shapes
@functools.lru_cache(maxsize=None)
def table_ladder(smem_bytes: int, slot_bytes: int) -> tuple:
    """Power-of-two table sizes from MIN_TABLE up to the largest that fits ``smem_bytes`` per block."""
    sizes, size = [], MIN_TABLE
    while size * slot_bytes + STATIC_SMEM <= smem_bytes:
        sizes.append(size)
        size *= 2
    if not sizes:
        raise ValueError(f"smem_limit: {smem_bytes} bytes of shared memory per block hold no "
                         f"{MIN_TABLE}-slot table of {slot_bytes}-byte slots; expected at least "
                         f"{MIN_TABLE * slot_bytes + STATIC_SMEM}")
    return tuple(sizes)


def launch_shape(size: int, slot_bytes: int, smem_bytes: int,
                 slots_per_thread: int = NUMERIC_SLOTS_PER_THREAD) -> tuple:
    """(threads per row, rows per block) for tables of ``size`` slots."""
    floor = MIN_TPR if size <= SUBWARP_MAX_TABLE else 32
    tpr = min(MAX_TPR, max(floor, size // slots_per_thread))
    rpb = max(1, min(MAX_RPB, BLOCK_THREADS // tpr))
    while rpb > 1 and table_smem(size, slot_bytes, rpb) + STATIC_SMEM > smem_bytes:
        rpb //= 2
    return tpr, rpb


def group_width(tpr: int) -> int:
    """The shared-table kernels' W for rows of ``tpr`` threads: tpr below a warp, else 32."""
    return tpr if tpr < 32 else 32


def table_smem(size: int, slot_bytes: int, rpb: int) -> int:
    """Dynamic shared memory of a launch: rpb tables of ``size`` slots."""
    return rpb * size * slot_bytes


def table_load(size: int) -> float:
    """Fraction of a ``size``-slot table a row may fill (the largest table aside)."""
    return SMALL_TABLE_LOAD if size <= SUBWARP_MAX_TABLE else TABLE_LOAD


@functools.lru_cache(maxsize=None)
def table_caps(ladder: tuple, last_load: float = 1.0) -> tuple:
    """Most nonzeros a row may need for each table of ``ladder``: table_load(size) * size, the
    largest table last_load of it (numeric tables: NUMERIC_LAST_TABLE_LOAD)."""
    return tuple(int(s * table_load(s)) for s in ladder[:-1]) + (int(ladder[-1] * last_load),)


def table_index(need, ladder: tuple, last_load: float = 1.0):
    """Per row: index in ``ladder`` of the smallest table with need <= its cap (table_caps; the largest
    table takes need <= last_load * size), ``len(ladder)`` when none does (global path), -1 when
    need == 0."""
    xp = array_module(need)
    idx = xp.searchsorted(xp.asarray(table_caps(ladder, last_load), dtype=xp.int64), need.astype(xp.int64),
                          side="left")
    return xp.where(need > 0, idx, -1)


def symbolic_index(row_ct, k: int, ladder: tuple):
    """Symbolic-pass table of each row: sized from min(nnz_RowCt, k) (a bound: no overflow) when it
    fits; else the largest table when the paper's estimate alpha = nnz_RowCt / pi fits in it (the
    row may still overflow and is then redone globally); else the global path directly."""
    xp = array_module(row_ct)
    bound = xp.minimum(row_ct, k)
    idx = table_index(bound, ladder)
    alpha = xp.minimum(row_ct.astype(xp.float64) / spgemm_model.RBS_COMPRESSION, k)
    risky = (idx == len(ladder)) & (alpha <= ladder[-1])
    return xp.where(risky, len(ladder) - 1, idx)


def one_pass_index(row_ct, k: int, classes: tuple, n_esc: int):
    """One-pass class of each row (classify_rows' idx2): the first class whose limit holds it,
    nnz_RowCt for the n_esc numeric_esc classes, min(nnz_RowCt, k) for the tables after them;
    len(classes) when none does, -1 for a row of no products."""
    xp = array_module(row_ct)
    row_ct = row_ct.astype(xp.int64)
    fig = xp.stack([row_ct if c < n_esc else xp.minimum(row_ct, k) for c in range(len(classes))])
    fits = fig <= xp.asarray(classes, dtype=xp.int64)[:, None]
    idx = xp.where(fits.any(axis=0), fits.argmax(axis=0), len(classes))
    return xp.where(row_ct > 0, idx, -1)


def balance(idx, balanced, n_tables: int):
    """The balanced rule: every shared-memory row takes the largest table any of them needs.

    ``balanced`` is a bool or a 0-d boolean xp array (decided on the GPU: no host transfer)."""
    xp = array_module(idx)
    shared = (idx >= 0) & (idx < n_tables)
    if idx.size == 0:
        return idx
    top = xp.where(shared, idx, -1).max()
    return xp.where(shared & xp.asarray(balanced), top, idx)


def bitmap_words(size: int, rpb: int, ncols: int, slot_bytes: int, smem_bytes: int, sort: bool) -> int:
    """Words of numeric_shared's column bitmap for sorted rows in ``size``-slot tables (0: the
    bitonic sort): tables past RANK_SORT_MAX slots, one row a block, B's ``ncols`` columns at most
    BITMAP_WORDS_PER_SLOT words a slot, and the bitmap beside the table within ``smem_bytes``."""
    words = -(-ncols // 32)
    fits = table_smem(size, slot_bytes, rpb) + 4 * words + STATIC_SMEM <= smem_bytes
    use = sort and rpb == 1 and size > RANK_SORT_MAX and words <= BITMAP_WORDS_PER_SLOT * size and fits
    return words if use else 0


# ----------------------------------------------------------------------------- lifted tables
#: Few rows in big shared tables run one block each on as many SMs while the rest of the GPU
#: idles (skewed-spgemm, H100: 6 rows of 50k-125k products took 340 us in 16384-slot
#: tables, 12 rows in 8192-slot ones 186 us, while the global path split the 12 largest rows over
#: 22 blocks each in 91 us): rows of tables of at least LIFT_MIN_TABLE slots move to the global
#: path, several blocks a row, when they and the rows of every larger table number at most
#: LIFT_ROWS_PER_SM per SM, and the largest row has at least LIFT_MIN_PRODUCTS products (the
#: global path's launches cost more host time than a one-block row of a few thousand products:
#: skewed-small's row of 2,469 products was lifted from a 4096-key symbolic table).
LIFT_MIN_TABLE = 4096
LIFT_ROWS_PER_SM = 0.5
LIFT_MIN_PRODUCTS = 32768


def lift_index(counts, ladder: tuple, sms: int, peak: int) -> int:
    """The smallest table index from which rows take the global path (-1: none): tables of at
    least LIFT_MIN_TABLE slots, whose rows together with every larger table's are at most
    LIFT_ROWS_PER_SM * sms (counts: rows per table index + 1, host); none when the largest row
    (``peak`` products) has fewer than LIFT_MIN_PRODUCTS."""
    if peak < LIFT_MIN_PRODUCTS:
        return -1
    lift, total = -1, 0
    for t in range(len(ladder) - 1, -1, -1):
        if ladder[t] < LIFT_MIN_TABLE:
            break
        total += int(counts[t + 1])
        if total > LIFT_ROWS_PER_SM * sms:
            break
        if counts[t + 1]:
            lift = t
    return lift


# ----------------------------------------------------------------------------- the one-pass path
#: The one-pass path (one_pass.py): rows whose bound min(nnz_RowCt, k) fits this table, an upper-bound
#: buffer of at most this fraction of the device's memory.
ONE_PASS_MAX_TABLE = 256
ONE_PASS_MEM_FRACTION = 1 / 16
#: ... and also when at most ONE_PASS_LONG_ROWS rows fit neither (their slabs of B.shape[1] columns
#: at most ONE_PASS_LONG_BYTES): those take the global path in the one-pass layout, which
#: saves the symbolic pass and two of the four host round trips of the two passes (skewed-spgemm:
#: 34 such rows of 499,966 short ones).
ONE_PASS_LONG_ROWS = 64
ONE_PASS_LONG_BYTES = 256 << 20


def one_pass_table(peak: int, k: int, top: int, products: int, itemsize: int, total_bytes: int,
                   esc_cap: int = 0) -> bool:
    """Whether C = A @ B takes the one-pass path: every row's bound min(nnz_RowCt, k) fits a table
    of ONE_PASS_MAX_TABLE slots (and the largest numeric table, ``top``), or every row's products
    fit numeric_esc's largest class (``esc_cap``), and the upper-bound buffer (products entries) is
    at most ONE_PASS_MEM_FRACTION of the device's memory and below 2^31 entries."""
    return ((min(int(peak), int(k)) <= min(ONE_PASS_MAX_TABLE, int(top)) or int(peak) <= esc_cap)
            and upper_bound_fits(products, itemsize, total_bytes))


def one_pass_lift(classes: tuple, n_esc: int) -> int:
    """The first one-pass class (numeric_esc's n_esc, then the tables) of rows too long for the
    one-pass tables: the first table past ONE_PASS_MAX_TABLE slots, else len(classes) (the rows no
    class holds)."""
    return next((c for c in range(n_esc, len(classes)) if classes[c] > ONE_PASS_MAX_TABLE), len(classes))


def one_pass_long(n_long: int, k: int, products: int, itemsize: int, total_bytes) -> bool:
    """Whether C = A @ B takes the one-pass path with ``n_long`` rows past its classes
    (one_pass_lift) on the global path: at most ONE_PASS_LONG_ROWS, their slabs of k columns
    (where the segments do not take them) at most ONE_PASS_LONG_BYTES, and the upper-bound buffer
    fits (upper_bound_fits). The other way in is one_pass_table."""
    return (n_long <= ONE_PASS_LONG_ROWS and n_long * k * (KEY_BYTES + itemsize) <= ONE_PASS_LONG_BYTES
            and upper_bound_fits(products, itemsize, total_bytes))


def upper_bound_fits(products: int, itemsize: int, total_bytes) -> bool:
    """Whether an upper-bound buffer of ``products`` entries (the one-pass path, the hybrid's
    numeric_esc rows) is below 2^31 entries and ONE_PASS_MEM_FRACTION of the device's memory."""
    return products <= INT32_MAX and products * (KEY_BYTES + itemsize) <= ONE_PASS_MEM_FRACTION * total_bytes



# ----------------------------------------------------------------------------- the values-only replay
#: A pair's values-only replay (values.py) keeps 8 bytes a product, C's entry offsets and the
#: structure it checks: it is set up only when those bytes are at most VALUES_MEM_FRACTION of the
#: device memory free at setup and VALUES_MAX_BYTES, and the setup's peak (the kept bytes plus an
#: unsorted copy of the keys and two counters an entry of C) at most VALUES_SETUP_FRACTION of it.
#: The kept bytes stay allocated while the pair is kept (guesses.VALUES_CACHE_SIZE pairs): a
#: quarter of free memory leaves C, the operands and the guess path's scratch room; the cap keeps
#: a pair that would fit an 80 GB device (R-MAT scale 17: 1.1e9 products, ~13 GB) from holding a
#: fifth of it unasked. Past either the pair keeps the guess replay.
VALUES_MEM_FRACTION = 0.25
VALUES_MAX_BYTES = 16 << 30
VALUES_SETUP_FRACTION = 0.5
#: Entries of C of at most VALUES_SHORT_SEGMENT products have their keys sorted a thread each
#: (values_sort_short), longer ones a block each (values_sort_long); both rank every key against
#: the entry's others (len^2 comparisons), so an entry past VALUES_MAX_SEGMENT products (a block
#: would take ~len^2 / 1024 steps: 4e6 at 65,536) refuses the setup.
VALUES_SHORT_SEGMENT = 32
VALUES_MAX_SEGMENT = 1 << 16
#: Lanes summing one entry of C in values_replay (a power of two, the instantiated ones): about a
#: quarter of the mean products an entry, so that entries of many products (block-dense: ~67)
#: read their keys coalesced and short ones (Poisson: ~2) keep a lane each.
VALUES_LANES = (1, 2, 4, 8, 16, 32)


def values_lanes(products: int, nnz_c: int) -> int:
    """values_replay's lanes an entry of C for a product of ``products`` over ``nnz_c`` entries."""
    mean = products / max(nnz_c, 1)
    return next((w for w in VALUES_LANES if 4 * w >= mean), VALUES_LANES[-1])


def values_offset_bytes(products: int) -> int:
    """Bytes of one entry offset of the values replay: int32 while the products fit it."""
    return 4 if products <= INT32_MAX else 8


def values_kept_bytes(products: int, nnz_c: int, m: int, structure_words: int) -> int:
    """Device bytes a values replay keeps: a key (A and B entry, int32 each) a product, an offset
    an entry of C (values_offset_bytes), C's indptr and indices, and ``structure_words`` int32
    words of A's and B's indptr and indices (what each call is checked against)."""
    return (8 * products + values_offset_bytes(products) * (nnz_c + 1) + 4 * (m + 1 + nnz_c)
            + 4 * structure_words)


def values_setup_bytes(products: int, nnz_c: int, m: int, structure_words: int) -> int:
    """Peak device bytes of a values replay's setup beyond C and the operands: the kept bytes, the
    keys' unsorted copy and two int64 words an entry of C (counts, offsets)."""
    return values_kept_bytes(products, nnz_c, m, structure_words) + 8 * products + 16 * (nnz_c + 1)


def values_refusal(products: int, nnz_c: int, m: int, structure_words: int, free_bytes) -> str | None:
    """Why a values replay is not set up for these sizes (None: it fits the rule above), with
    ``free_bytes`` the device's free memory (None: not known, only the cap applies)."""
    kept = values_kept_bytes(products, nnz_c, m, structure_words)
    if kept > VALUES_MAX_BYTES:
        return f"it would keep {kept:,} bytes, past rules.VALUES_MAX_BYTES = {VALUES_MAX_BYTES:,}"
    if free_bytes is not None and kept > VALUES_MEM_FRACTION * free_bytes:
        return (f"it would keep {kept:,} bytes, past {VALUES_MEM_FRACTION:.0%} of the {int(free_bytes):,} "
                f"bytes free")
    setup = values_setup_bytes(products, nnz_c, m, structure_words)
    if free_bytes is not None and setup > VALUES_SETUP_FRACTION * free_bytes:
        return (f"its setup would need {setup:,} bytes, past {VALUES_SETUP_FRACTION:.0%} of the "
                f"{int(free_bytes):,} bytes free")
    return None
