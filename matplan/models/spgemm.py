"""SpGEMM cost model: the RBSparse paper's rules (SEEDS section 1), and the fitted constants and
cost formulas of the three candidates: the hash kernels (``spgemm.hash``), the row-row segmented
merge (``spgemm.merge``) and cuSPARSE (with its known limits).

The fits use the H100 tuning data: whole calls, nnz(C) exact, effective bytes at the copy
bandwidth plus a fixed cost; ``benchmarks/spgemm.py`` times the three candidates.
"""
from __future__ import annotations

import math

from ..core.features import (RBS_COMPRESSION, RBS_GROUP_BOUNDS, rbsparse_group_ids,  # noqa: F401
                             rbsparse_histogram)
from ..core.types import Cost
from . import traffic

# --- RBSparse hash SpGEMM (SEEDS section 1) --------------------------------
#: variance(nnz_RowCt) / mean(nnz_RowCt) at or under this: one hash-table size for all rows.
RBS_BALANCED_RATIO = 0.5
RBS_GROUP_TABLE = (32, 64, 128, 256, 512, 2048)


def rbsparse_balanced(var_over_mean: float) -> bool:
    return var_over_mean <= RBS_BALANCED_RATIO


# --- the fitted-bytes terms every SpGEMM cost is made of ------------------------
def long_row_nnz(f) -> float:
    """Expected nonzeros of C in the rows of the top RBSparse group (alpha = nnz_RowCt / pi of at
    least RBS_GROUP_BOUNDS[-1]): the products the lower groups cannot hold (each at least its
    group's lower bound), over the compression, at most traffic.spgemm_nnz_c. 0 when no row is in
    that group."""
    groups = tuple(f.rbs_groups)
    if not groups or not groups[-1]:
        return 0.0
    lower = RBS_COMPRESSION * sum(n * lo for n, lo in zip(groups[:-1], RBS_GROUP_BOUNDS[:-1]))
    ratio = f.compression if f.compression > 0 else RBS_COMPRESSION
    return min(max(0.0, f.products - lower) / ratio, traffic.spgemm_nnz_c(f))


def fitted_bytes(f, per_dtype: dict, nnz_c: float | None = None) -> tuple:
    """(bytes, per product, per nonzero of C) of a SpGEMM kernel's fitted effective bytes:
    ``per_dtype`` maps a dtype name to (bytes per product, bytes per expected nonzero of C);
    a dtype it lacks takes float64's. ``nnz_c``: C's expected nonzeros where known already."""
    per_product, per_output = traffic.for_dtype(per_dtype, f)
    nnz_c = traffic.spgemm_nnz_c(f) if nnz_c is None else nnz_c
    return f.products * per_product + nnz_c * per_output, per_product, per_output


def compression_text(f) -> str:
    """Where the expected nnz(C) comes from: the sampled compression, or pi."""
    return (f"products / {f.compression:.2f}, the sampled compression" if f.compression > 0
            else "products / pi, none sampled")


# --- spgemm.hash ----------------------------------------------------------------
#: Effective bytes the hash passes move per product and per nonzero of C, by dtype, at the copy
#: bandwidth; HASH_TABLE_BYTES more per nonzero of C where rows go through hash tables; and
#: HASH_ROW_BYTES per row of A: least squares (relative error) of whole calls less HASH_FIXED_S
#: over the H100 tuning data (17 matrices, nnz(C) exact; repeated calls, as the tuner times them).
#: A nonzero of C that numeric_esc makes (rows of at most 512 products on the one-pass path) is
#: sorted in registers and written once; one a table makes is inserted by atomicCAS, sorted in
#: shared memory, written to the upper-bound buffer and copied again by the compaction (one pass),
#: or counted by the symbolic pass first (two passes): without the table term ice40 and R-MAT
#: medium were 0.4-0.55x their time and block-dense medium 1.4x, with it 0.66-1.22x. A row costs
#: apart from its products: numeric_esc gives each row a W-lane group sized for its class whatever
#: its length, and the analysis, counts and scans go a row at a time (world_highways, 560k rows of
#: ~10 products, 0.29-0.32 ms against 0.12-0.17 for Poisson and uniform of the same products over
#: 100-160k rows). Within 0.7-1.3x on the corpus. Global rows that take dense slabs are charged the
#: slabs' bytes on top; by column segments in shared memory they are not.
HASH_BYTES = {"float32": (19.3, 9.4), "float64": (21.0, 17.2)}
HASH_TABLE_BYTES = 134.0
HASH_ROW_BYTES = 681.0
#: The fixed cost of a call outside the pass kernels, by the path spgemm() takes
#: (kernels/spgemm/kernel.py hash_path; :func:`hash_fixed_key`), on repeated calls of one pair:
#: a one-pass call replays its guessed analysis as a CUDA graph, and where every row takes
#: numeric_esc ("one pass, direct") it writes C in place (no upper-bound buffer, scan or
#: compaction: one graph launch and one read back). Least squares with HASH_BYTES on the H100
#: tuning data: direct 70 us (Poisson, banded, uniform small: 75-126 us whole), one pass with
#: tables or global rows 86-122 us besides its launches (block-dense- and skewed-small, metis,
#: 123-364 us whole). The two
#: passes (no guess: symbolic pass, scan, two host round trips more) from rmat-small (0.83-1.20 ms
#: whole) and the hybrid (two passes too) are host time read off the smallest calls of each path,
#: not fitted: the few other problems of those paths are large enough that their fixed cost is
#: not identifiable (a fit without rmat-small set it to 0). Host time: another H100 host ran the
#: same calls up to 1.5x slower. matplan report reads the two passes' off each fold's smallest
#: two-pass calls instead (tuning_db.refit._two_passes_fixed).
HASH_FIXED_S = {"one pass, direct": 70e-6, "one pass, balanced": 122e-6, "one pass, grouped": 86e-6,
                "hybrid": 0.65e-3, "two passes": 0.75e-3}
#: What a pair's first call pays beyond its guessed replays on the one-pass paths: it waits for
#: the analysis's read-back, issues its launches one by one instead of one graph, and compacts C
#: out of the upper-bound buffer. The median first_ms - run_ms_median of the one-pass problems
#: in training-h200.jsonl (0.15-0.45 ms; docs/spgemm.md). The two passes and the hybrid are
#: never guessed.
HASH_FIRST_EXTRA_S = 0.22e-3
#: The planner takes a product for the hybrid when at most this fraction of its rows has
#: alpha = nnz_RowCt / pi >= 256 (the RBSparse groups past numeric_esc's 512 products).
HYBRID_LONG_ROWS = 0.01
#: One kernel launch of the hash path's launches, seconds.
LAUNCH_S = 6e-6


def one_pass(path: str) -> bool:
    """Whether hash_path's ``path`` is a one-pass one: the paths a pair's later calls go on from a
    guessed analysis (so a first call pays HASH_FIRST_EXTRA_S more)."""
    return path.startswith("one pass")


def hash_fixed_key(path: str, direct: bool) -> str:
    """The key of HASH_FIXED_S for a call on ``path`` (hash_path's); ``direct``: every row takes
    numeric_esc, so a one-pass call's repeated calls write C in place."""
    return "one pass, direct" if direct and one_pass(path) else path


def hash_table_nnz(f, path: str, direct: bool) -> float:
    """Expected nonzeros of C that hash tables make: none where every row takes numeric_esc on the
    one-pass path, else all of them (the hybrid's short rows are numeric_esc's too: an upper bound)."""
    return _table_nnz(hash_fixed_key(path, direct), traffic.spgemm_nnz_c(f))


def _table_nnz(key: str, nnz_c: float) -> float:
    """hash_table_nnz for the HASH_FIXED_S ``key`` of the path and C's expected ``nnz_c``."""
    return 0.0 if key == "one pass, direct" else nnz_c


def hash_seconds(f, device, path: str, launches: int, slab_bytes: float = 0.0, direct: bool = False) -> float:
    """Seconds of an spgemm.hash call: HASH_BYTES, HASH_TABLE_BYTES (:func:`hash_table_nnz`) and
    HASH_ROW_BYTES at the copy bandwidth, ``slab_bytes`` (global rows on dense slabs of B.shape[1]
    columns, written and scanned) likewise, HASH_FIXED_S of the ``path`` (:func:`hash_fixed_key`)
    and LAUNCH_S a launch."""
    return _hash_seconds(f, device, hash_fixed_key(path, direct), launches, slab_bytes, traffic.spgemm_nnz_c(f))


def _hash_seconds(f, device, key: str, launches: int, slab_bytes: float, nnz_c: float) -> float:
    """hash_seconds for the HASH_FIXED_S ``key`` of its path and C's expected ``nnz_c``."""
    nbytes, _, _ = fitted_bytes(f, HASH_BYTES, nnz_c)
    nbytes += _table_nnz(key, nnz_c) * HASH_TABLE_BYTES + f.m * HASH_ROW_BYTES
    t = (nbytes + slab_bytes) / device.mem_bandwidth
    return t + HASH_FIXED_S[key] + launches * LAUNCH_S


def hash_terms(f, path: str, direct: bool) -> str:
    """The bandwidth terms of hash_seconds, for a cost's explanation."""
    return _hash_terms(f, hash_fixed_key(path, direct), traffic.spgemm_nnz_c(f))


def _hash_terms(f, key: str, nnz_c: float) -> str:
    """hash_terms for the HASH_FIXED_S ``key`` of its path and C's expected ``nnz_c``."""
    per_product, per_output = traffic.for_dtype(HASH_BYTES, f)   # fitted_bytes' figures, without its sum
    tables = _table_nnz(key, nnz_c)
    return (f"~{nnz_c:,.0f} nonzeros of C expected ({compression_text(f)}); "
            f"{per_product:.0f} B per product + {per_output:.0f} B per nonzero of C"
            + (f" + {HASH_TABLE_BYTES:.0f} B per nonzero of C from hash tables" if tables else
               " (all from numeric_esc)")
            + f" + {HASH_ROW_BYTES:.0f} B per row at the copy bandwidth")


def hash_cost_parts(f, device, path: str, launches: int, slab_bytes: float = 0.0, direct: bool = False) -> tuple:
    """(hash_seconds, hash_terms, values_replay_seconds, C's expected nonzeros) of one spgemm.hash
    candidate: what its Cost reads, the path's key and nnz(C) taken once (every plan scores it)."""
    key, nnz_c = hash_fixed_key(path, direct), traffic.spgemm_nnz_c(f)
    return (_hash_seconds(f, device, key, launches, slab_bytes, nnz_c), _hash_terms(f, key, nnz_c),
            _values_replay_seconds(f, device, nnz_c), nnz_c)


# --- spgemm.hash's values-only replay (kernels/spgemm/values.py) ------------------
#: A plan's runs from the third on an unchanged pattern replay C's values only, where the kept
#: bytes fit (kernels/spgemm/rules.py values_refusal): per product its 8-byte key and the two
#: values it gathers (mostly L2 hits: half an item counted), per entry of C its offset, its value
#: written and C's indptr and indices copied (read and written), plus VALUES_FIXED_S (four
#: launches, three allocations, one read back). Estimated from the kernels' traffic, not fitted.
VALUES_FIXED_S = 40e-6


def values_replay_seconds(f, device) -> float:
    """Seconds of a values replay of spgemm.hash for the planner's features (the setup, paid once
    on a pair's second call, is not in it)."""
    return _values_replay_seconds(f, device, traffic.spgemm_nnz_c(f))


def _values_replay_seconds(f, device, nnz_c: float) -> float:
    """values_replay_seconds for C's expected ``nnz_c``."""
    item = 4 if str(f.dtype) == "float32" else 8
    per_entry = 4 + item + 16
    nbytes = f.products * (8 + item / 2) + nnz_c * per_entry
    return nbytes / device.mem_bandwidth + VALUES_FIXED_S


# --- spgemm.merge ---------------------------------------------------------------
#: MERGE_FIXED_S + MERGE_ROUND_S a tree round of spt_sort + at the copy bandwidth:
#: MERGE_BYTES_PER_PRODUCT a product and a row (expand, tile sort, heads, scan, write: the merge
#: path runs over rows and products) and MERGE_ROUND_BYTES a product a round it takes part in.
#: spt_sort sorts tiles of TILE slots, then merges the runs of rows that cross tiles in binary-tree
#: rounds with a grid barrier each (the whole grid visits every tile each round): a row of L
#: products crosses a tile boundary with probability about L / TILE and takes log2(L / TILE)
#: rounds when longer, so the products' rounds are charged at the product-weighted row length
#: (rowct_var_over_mean + rowct_mean) as log2(1 + L_w / TILE), at most the longest row's rounds.
#: Least squares (relative error) on the H100 tuning data (17 matrices, float32 and float64):
#: 0.20 ms, 61 us a round, 305 B and 81 B; within 0.8-1.25x but the small calls' jitter
#: (0.55-0.8x) and skewed-medium (0.64-0.83x). The earlier (1 + rounds of the longest row) x
#: every product put ice40, R-MAT medium and block-dense at 2.1-4x their time: a round moves
#: about a quarter of what the first sort does, and only the products of rows that cross tiles.
MERGE_FIXED_S = 0.20e-3
MERGE_ROUND_S = 61e-6
MERGE_BYTES_PER_PRODUCT = 305.0
MERGE_ROUND_BYTES = 81.0


def merge_rounds(longest_row: int, tile: int) -> int:
    """spt_sort's tree rounds for a longest row of this many products (its loop: q, the runs of
    that row, is 1 + ceil((L - 1) / tile); ceil(log2(q)) rounds; none for rows of one product)."""
    if longest_row <= 1:
        return 0
    q = 1 + -(-(int(longest_row) - 1) // int(tile))
    return (q - 1).bit_length()


def merge_cost(f, device, tile: int) -> Cost:
    """spgemm.merge: every product expanded and sorted in tiles of ``tile`` slots (spt_sort's),
    then the tree rounds of the rows that cross tiles."""
    rounds = merge_rounds(f.rowct_max, tile)
    weighted = f.rowct_var_over_mean + f.rowct_mean          # E[L^2] / E[L] of the rows' products
    product_rounds = min(math.log2(1.0 + weighted / tile), float(rounds))
    nbytes = (f.products + f.m) * MERGE_BYTES_PER_PRODUCT + f.products * product_rounds * MERGE_ROUND_BYTES
    t = MERGE_FIXED_S + rounds * MERGE_ROUND_S + nbytes / device.mem_bandwidth
    return Cost(0.0, t, f"row-row segmented merge (deterministic): {f.products:,} products expanded and "
                        f"sorted in tiles of {tile} slots, {rounds} tree round(s) for the longest row "
                        f"({f.rowct_max:,} products), {product_rounds:.2f} a product at the product-weighted "
                        f"row length {weighted:,.0f}; ~{MERGE_BYTES_PER_PRODUCT:.0f} B a product + "
                        f"{MERGE_ROUND_BYTES:.0f} B a product a round at the copy bandwidth (sort-bound) + "
                        f"{MERGE_ROUND_S * 1e6:.0f} us a round + {MERGE_FIXED_S * 1e3:.2f} ms fixed")


# --- cuSPARSE through CuPy ----------------------------------------------------
#: kernel -> {limit: value, "evidence": why}. Measured on an H100, CuPy 14.2, CUDA 13 (issue 8).
VENDOR_LIMITS = {
    "spgemm.cusparse": {
        "max_products": 1_500_000_000,
        "evidence": "cusparseSpGEMM through CuPy raised INSUFFICIENT_RESOURCES at 1.8-2.0e9 products "
                    "and returned an empty matrix without error at 4.6e9 and 1.44e10 products",
    },
}
#: cuSPARSE SpGEMM through CuPy (11-70 GFLOP/s on the corpus): its fixed cost, from whole calls on
#: the six smallest corpus matrices (67k-410k products), float32 and float64, H100: 0.36-0.60 ms,
#: median 0.44; and its effective bytes per product and per nonzero of C at the copy bandwidth, by
#: dtype: least squares (relative error) of the H100 tuning data less that fixed cost (nnz(C)
#: exact), within 0.7-1.3x except the large skewed rows of R-MAT, skewed and ice40 (0.4-0.55x),
#: as for the hash kernels.
CUSPARSE_SPGEMM_OVERHEAD_S = 440e-6
CUSPARSE_SPGEMM_BYTES = {"float32": (76.0, 104.0), "float64": (100.0, 122.0)}
#: ... and what rows of many products add: effective bytes at the copy bandwidth per expected
#: nonzero of C in rows of alpha >= 512 (long_row_nnz), by dtype, least squares (relative error)
#: of the residuals on the H100 SpGEMM timings with the tuning run's measured bandwidth.
#: Measured / model, float64 / float32: R-MAT medium 0.41 / 0.47 -> 1.05 / 1.10, ice40 0.40 /
#: 0.42 -> 0.77 / 0.76, skewed-medium 0.49 / 0.60 -> 0.84 / 0.92; block-dense (compression 58)
#: 1.12 / 1.28 -> 1.22 / 1.38 and rmat-small float64 1.02 -> 1.32 overshoot; no other matrix has
#: such rows.
CUSPARSE_SPGEMM_LONG_ROW_BYTES = {"float32": 400.0, "float64": 580.0}


def cusparse_cost(f, device) -> Cost:
    """cuSPARSE SpGEMM: CUSPARSE_SPGEMM_BYTES and the long rows' bytes at the copy bandwidth plus
    its fixed cost."""
    nbytes, per_product, per_output = fitted_bytes(f, CUSPARSE_SPGEMM_BYTES)
    long_nnz = long_row_nnz(f)
    per_long = traffic.for_dtype(CUSPARSE_SPGEMM_LONG_ROW_BYTES, f)
    t = (nbytes + long_nnz * per_long) / device.mem_bandwidth + CUSPARSE_SPGEMM_OVERHEAD_S
    return Cost(0.0, t, f"cuSPARSE SpGEMM via CuPy: {per_product:.0f} B per product + {per_output:.0f} B "
                        f"per nonzero of C (~{traffic.spgemm_nnz_c(f):,.0f}) at the copy bandwidth + "
                        + (f"{per_long:.0f} B per nonzero of C in rows of alpha >= "
                           f"{RBS_GROUP_BOUNDS[-1]} (~{long_nnz:,.0f}) + " if long_nnz else "")
                        + f"{CUSPARSE_SPGEMM_OVERHEAD_S * 1e6:.0f} us")
