"""SpGEMM cost model: the RBSparse paper's rules (SEEDS section 1) and the fitted constants and
known limits of the cuSPARSE candidate."""
from __future__ import annotations

from ..core.features import (RBS_COMPRESSION, RBS_GROUP_BOUNDS, rbsparse_group_ids,  # noqa: F401
                             rbsparse_histogram)

# --- RBSparse hash SpGEMM (SEEDS section 1) --------------------------------
#: variance(nnz_RowCt) / mean(nnz_RowCt) at or under this: one hash-table size for all rows.
RBS_BALANCED_RATIO = 0.5
RBS_GROUP_TABLE = (32, 64, 128, 256, 512, 2048)


def rbsparse_balanced(var_over_mean: float) -> bool:
    return var_over_mean <= RBS_BALANCED_RATIO


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
#: the six smallest corpus matrices (67k-410k products), float32 and float64, H100 2026-11-24:
#: 0.36-0.60 ms, median 0.44 (benchmarks/results/spgemm-onepass-study-h100-2026-11-24-70d9d05.log);
#: and its effective bytes per product and per nonzero of C at the copy bandwidth, by dtype: least
#: squares (relative error) of the H100 tuning data less that fixed cost
#: (tuning-h100-2026-11-24-training.jsonl, nnz(C) exact), within 0.7-1.3x except the large
#: skewed rows of R-MAT, skewed and ice40 (0.4-0.55x), as for the hash kernels.
CUSPARSE_SPGEMM_OVERHEAD_S = 440e-6
CUSPARSE_SPGEMM_BYTES = {"float32": (76.0, 104.0), "float64": (100.0, 122.0)}
#: ... and what rows of many products add: effective bytes at the copy bandwidth per expected
#: nonzero of C in rows of alpha >= 512 (traffic.spgemm_long_row_nnz), by dtype, least squares
#: (relative error) of the residuals on the H100 SpGEMM timings at 4b6aad4 with the tuning run's
#: measured bandwidth (tuning-h100-2026-11-24-training-launch.jsonl). Measured / model, float64 /
#: float32: R-MAT medium 0.41 / 0.47 -> 1.05 / 1.10, ice40 0.40 / 0.42 -> 0.77 / 0.76,
#: skewed-medium 0.49 / 0.60 -> 0.84 / 0.92; block-dense (compression 58) 1.12 / 1.28 -> 1.22 /
#: 1.38 and rmat-small float64 1.02 -> 1.32 overshoot; no other matrix has such rows.
CUSPARSE_SPGEMM_LONG_ROW_BYTES = {"float32": 400.0, "float64": 580.0}
