"""cuSPARSE SpMV/SpMM through CuPy (``A @ x``), a candidate like any other."""
from __future__ import annotations

from ...models import spmv as spmv_model
from ..base import VendorKernel
from ..registry import register


class CusparseSpMV(VendorKernel):
    name = "spmv.cusparse"
    reads_a_at_run = True
    ops = ("spmv", "spmm")
    deterministic = False  # cuSPARSE's default SpMV algorithm does not promise run-to-run reproducibility

    def cost(self, f, params, device):
        return spmv_model.cusparse(f, device)


register(CusparseSpMV())
