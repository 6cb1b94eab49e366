"""SpGEMM cost model: the RBSparse paper's rules (SEEDS section 1), and the fitted constants and
cost formulas of the three candidates: the hash kernels (``spgemm.hash``), the row-row segmented
merge (``spgemm.merge``) and cuSPARSE (with its known limits).

The fits use the H100 tuning data: whole calls, nnz(C) exact, effective bytes at the copy
bandwidth plus a fixed cost; ``benchmarks/spgemm.py`` times the three candidates.
"""
from __future__ import annotations

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


def fitted_bytes(f, per_dtype: dict) -> tuple:
    """(bytes, per product, per nonzero of C) of a SpGEMM kernel's fitted effective bytes:
    ``per_dtype`` maps a dtype name to (bytes per product, bytes per expected nonzero of C);
    a dtype it lacks takes float64's."""
    per_product, per_output = traffic.for_dtype(per_dtype, f)
    return f.products * per_product + traffic.spgemm_nnz_c(f) * per_output, per_product, per_output


def compression_text(f) -> str:
    """Where the expected nnz(C) comes from: the sampled compression, or pi."""
    return (f"products / {f.compression:.2f}, the sampled compression" if f.compression > 0
            else "products / pi, none sampled")


# --- spgemm.hash ----------------------------------------------------------------
#: Effective bytes the hash passes move per product and per nonzero of C, by dtype, at the copy
#: bandwidth: least squares (relative error) of whole calls less HASH_FIXED_S over the H100 tuning
#: data (17 matrices, nnz(C) exact). Per nonzero of C costs 4-5x per product: a distinct key fills
#: a slot, is counted, compacted, sorted and written; a repeated key is one atomic add. The fit is
#: within 0.6-1.4x on the corpus but under-predicts R-MAT medium (0.3x) and ice40 (0.5x): large
#: rows with many distinct columns (big tables, few resident blocks, the global path) cost more
#: than a linear model says. Global rows that take dense slabs are charged the slabs' bytes on
#: top; by column segments in shared memory they are not (the slab term had R-MAT 16 / 17 at
#: 26 / 89 ms predicted against 13 / 37 measured; without it 15.6 / 44.0).
HASH_BYTES = {"float32": (41.0, 149.0), "float64": (42.0, 197.0)}
#: The fixed cost of a call outside the pass kernels (product scan, classification, allocation,
#: host round trips), by the path spgemm() takes (kernels/spgemm/kernel.py hash_path): whole call
#: less the bandwidth term on the smallest problems of each path of the H100 tuning data: one pass
#: balanced 0.19-0.26 ms (poisson2d-, block_dense-, banded-small), grouped 0.28-0.42 (poisson3d-,
#: uniform-small), the hybrid 0.57-0.63 (metis) and 0.67-0.87 (skewed-small), two passes
#: 0.53-0.84 (rmat-small) and 0.81-0.87 (skewed-medium). One constant for every path predicted
#: skewed-small's hash call below cuSPARSE's and poisson2d-small's above it; at the two passes'
#: cost the hybrid's metis went to cuSPARSE (2.07x the best). They are host time: another H100
#: host ran the same calls up to 1.5x slower.
HASH_FIXED_S = {"one pass, balanced": 0.22e-3, "one pass, grouped": 0.33e-3, "hybrid": 0.65e-3,
                "two passes": 0.75e-3}
#: The planner takes a product for the hybrid when at most this fraction of its rows has
#: alpha = nnz_RowCt / pi >= 256 (the RBSparse groups past numeric_esc's 512 products).
HYBRID_LONG_ROWS = 0.01
#: One kernel launch of the hash path's launches, seconds.
LAUNCH_S = 6e-6


def hash_seconds(f, device, path: str, launches: int, slab_bytes: float = 0.0) -> float:
    """Seconds of an spgemm.hash call: HASH_BYTES at the copy bandwidth, ``slab_bytes`` (global rows
    on dense slabs of B.shape[1] columns, written and scanned) likewise, HASH_FIXED_S of the
    ``path`` and LAUNCH_S a launch."""
    nbytes, _, _ = fitted_bytes(f, HASH_BYTES)
    t = nbytes / device.mem_bandwidth
    if slab_bytes:
        t += slab_bytes / device.mem_bandwidth
    return t + (HASH_FIXED_S[path] + launches * LAUNCH_S)


def hash_terms(f) -> str:
    """The bandwidth terms of hash_seconds, for a cost's explanation."""
    _, per_product, per_output = fitted_bytes(f, HASH_BYTES)
    return (f"~{traffic.spgemm_nnz_c(f):,.0f} nonzeros of C expected ({compression_text(f)}); "
            f"{per_product:.0f} B per product + {per_output:.0f} B per nonzero of C at the copy bandwidth")


# --- spgemm.merge ---------------------------------------------------------------
#: MERGE_FIXED_S + products x MERGE_BYTES_PER_PRODUCT at the copy bandwidth x (1 + the tree
#: rounds of the longest row). Fitted on the H100 (float64) on the short-row products:
#: world_highways 5.4M products 0.95 ms, metis 9.9M 1.27, Poisson 12.5M 1.53, dragon 22M 2.49,
#: banded 58M 6.2 (fit: 0.45 ms + 92 ps a product, 274 B at 2.98 TB/s). Long rows cost more than
#: the rounds say (ice40 244M products 53 ms, block-dense 249M 73 ms): the cost stays an
#: underestimate there, where the hash kernel is 5-20x faster anyway.
MERGE_FIXED_S = 0.45e-3
MERGE_BYTES_PER_PRODUCT = 280.0


def merge_cost(f, device, rounds: int) -> Cost:
    """spgemm.merge: every product expanded and sorted, ``rounds`` tree rounds for the longest row."""
    t = MERGE_FIXED_S + f.products * MERGE_BYTES_PER_PRODUCT * (1 + rounds) / device.mem_bandwidth
    return Cost(0.0, t, f"row-row segmented merge (deterministic): {f.products:,} products expanded and "
                        f"each row sorted by merge-path tiles, {rounds} tree round(s) for the longest row "
                        f"({f.rowct_max:,} products); ~{MERGE_BYTES_PER_PRODUCT:.0f} B a product a pass at the "
                        f"copy bandwidth (sort-bound) + {MERGE_FIXED_S * 1e3:.2f} ms fixed")


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
