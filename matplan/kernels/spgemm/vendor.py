"""cuSPARSE SpGEMM through CuPy (``A @ B``), a candidate like any other, never routed past
its known limits (:data:`matplan.models.spgemm.VENDOR_LIMITS`)."""
from __future__ import annotations

from ...models import spgemm as spgemm_model
from ...models.spgemm import VENDOR_LIMITS
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
        return spgemm_model.cusparse_cost(f, device)

    def run(self, prepared, B, out=None):
        if out is not None:
            raise ValueError("out: not supported for spgemm (the output's sparsity is not known in advance)")
        C = prepared.arrays["A"] @ B
        C.sort_indices()
        return C


register(CusparseSpGEMM())
