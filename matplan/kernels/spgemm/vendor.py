"""cuSPARSE SpGEMM through CuPy (``A @ B``), a candidate like any other, never routed past
its known limits (:data:`matplan.models.spgemm.VENDOR_LIMITS`)."""
from __future__ import annotations

from ...core.types import Cost
from ...models import traffic
from ...models.spgemm import (CUSPARSE_SPGEMM_BYTES, CUSPARSE_SPGEMM_LONG_ROW_BYTES,
                               CUSPARSE_SPGEMM_OVERHEAD_S, RBS_GROUP_BOUNDS, VENDOR_LIMITS)
from ..base import VendorKernel
from ..registry import register

class CusparseSpGEMM(VendorKernel):
    name = "spgemm.cusparse"
    reads_a_at_run = True   # cupyx's A @ B reads A and B on every call (products limit: see dispatch.identity)
    ops = ("spgemm",)
    deterministic = False

    def supports(self, f):
        limit = VENDOR_LIMITS[self.name]["max_products"]
        if f.products > limit:
            return (f"{f.products:,} products exceed the known limit {limit:,} "
                    f"({VENDOR_LIMITS[self.name]['evidence']})")
        return None

    def cost(self, f, params, device):
        nbytes, per_product, per_output = traffic.spgemm_fitted_bytes(f, CUSPARSE_SPGEMM_BYTES)
        long_nnz = traffic.spgemm_long_row_nnz(f)
        per_long = traffic.for_dtype(CUSPARSE_SPGEMM_LONG_ROW_BYTES, f)
        t = (nbytes + long_nnz * per_long) / device.mem_bandwidth + CUSPARSE_SPGEMM_OVERHEAD_S
        return Cost(0.0, t, f"cuSPARSE SpGEMM via CuPy: {per_product:.0f} B per product + {per_output:.0f} B "
                            f"per nonzero of C (~{traffic.spgemm_nnz_c(f):,.0f}) at the copy bandwidth + "
                            + (f"{per_long:.0f} B per nonzero of C in rows of alpha >= "
                               f"{RBS_GROUP_BOUNDS[-1]} (~{long_nnz:,.0f}) + " if long_nnz else "")
                            + f"{CUSPARSE_SPGEMM_OVERHEAD_S * 1e6:.0f} us")

    def run(self, prepared, B, out=None):
        if out is not None:
            raise ValueError("out: not supported for spgemm (the output's sparsity is not known in advance)")
        C = prepared.arrays["A"] @ B
        C.sort_indices()
        return C


register(CusparseSpGEMM())
