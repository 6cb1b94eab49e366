"""SpMV/SpMM cost model: the ELL-R and BRCP papers' rules (SEEDS sections 2 and 4) and the
fitted constants of the cuSPARSE candidate. The statistics the rules read are in
:mod:`matplan.core.features`."""
from __future__ import annotations

from ..core.features import WARP, brcp_T, warp_lengths  # noqa: F401  the statistics these rules read

# --- ELL-R row sorting (SEEDS section 2) -----------------------------------
#: Sorting rows by length pays when avg warp length after / before is at most this.
#: The paper says "about 66%": Harbor (0.663) sorts and wins, Protein (0.668) does not;
#: the constant sits between the two.
ELLR_SORT_RATIO = 0.665


def ellr_should_sort(before: float, after: float) -> bool:
    """The ELL-R rule: sort rows by length when the warp length shrinks to <= ELLR_SORT_RATIO."""
    if before <= 0:
        return False
    return after / before <= ELLR_SORT_RATIO


# --- BRCP (SEEDS section 4) --------------------------------------------------
#: Rows per BRCP block (one warp, one thread a block row).
BRCP_H = 32
#: A row longer than BRCP_LONG_FACTOR * T is cut into blocks of width ceil(nnz / BRCP_LONG_FACTOR).
BRCP_LONG_FACTOR = 64


# --- cuSPARSE through CuPy ----------------------------------------------------
#: Fraction of the copy bandwidth cuSPARSE SpMV reaches (0.11-0.58 measured on the corpus) and
#: the fixed cost of one cupyx SpMV call (about 46 us measured, descriptor creation included).
CUSPARSE_SPMV_EFFICIENCY = 0.35
CUSPARSE_SPMV_OVERHEAD_S = 46e-6
#: cupyx multiplies CSR by a 2-D B (k > 1) through cuSPARSE SpMM on a column-major copy of B,
#: so each nonzero gathers its k values from k columns, a sector each; past L2 (see
#: traffic.column_major_gathers_missed) each missed gather costs CUSPARSE_SPMM_GATHER_BYTES at
#: the copy bandwidth. With A's bytes and the dense bytes (B and C, with the copies) at their
#: efficiencies and the fixed cost, fitted on the H100 tuning data (2026-11-24, 111 timings,
#: k = 4 and 16): measured / model 0.71-1.96. The SpMV cost above gave 0.98-3.55 there, and
#: 0.1-0.3x on random columns at k = 16 (uniform-large 3.7 ms, R-MAT large 1.7 ms).
CUSPARSE_SPMM_OVERHEAD_S = 83e-6
CUSPARSE_SPMM_A_EFFICIENCY = 0.2
CUSPARSE_SPMM_DENSE_EFFICIENCY = 0.23
CUSPARSE_SPMM_GATHER_BYTES = 42.0
