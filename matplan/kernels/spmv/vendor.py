"""cuSPARSE SpMV/SpMM through CuPy (``A @ x``), a candidate like any other."""
from __future__ import annotations

from ...core.types import Cost
from ...models import traffic
from ...models.spmv import (CUSPARSE_SPMM_A_EFFICIENCY, CUSPARSE_SPMM_DENSE_EFFICIENCY,
                             CUSPARSE_SPMM_GATHER_BYTES, CUSPARSE_SPMM_OVERHEAD_S, CUSPARSE_SPMV_EFFICIENCY,
                             CUSPARSE_SPMV_OVERHEAD_S)
from ..base import VendorKernel
from ..registry import register

class CusparseSpMV(VendorKernel):
    name = "spmv.cusparse"
    reads_a_at_run = True
    ops = ("spmv", "spmm")
    deterministic = False  # cuSPARSE's default SpMV algorithm does not promise run-to-run reproducibility

    def cost(self, f, params, device):
        if f.k == 1:
            t = traffic.csr_spmm_bytes(f) / (device.mem_bandwidth * CUSPARSE_SPMV_EFFICIENCY)
            return Cost(0.0, t + CUSPARSE_SPMV_OVERHEAD_S,
                        f"cuSPARSE SpMV via CuPy: ~{CUSPARSE_SPMV_EFFICIENCY:.2f} of bandwidth + "
                        f"{CUSPARSE_SPMV_OVERHEAD_S * 1e6:.0f} us per call")
        bw = device.mem_bandwidth
        missed = traffic.column_major_gathers_missed(f, device.l2_bytes)
        t = (CUSPARSE_SPMM_OVERHEAD_S + traffic.csr_bytes(f) / (bw * CUSPARSE_SPMM_A_EFFICIENCY)
             + traffic.dense_bytes(f) / (bw * CUSPARSE_SPMM_DENSE_EFFICIENCY)
             + missed * CUSPARSE_SPMM_GATHER_BYTES / bw)
        return Cost(0.0, t, f"cuSPARSE SpMM via CuPy on a column-major copy of B: A at ~"
                            f"{CUSPARSE_SPMM_A_EFFICIENCY:.2f} and B, C at ~{CUSPARSE_SPMM_DENSE_EFFICIENCY:.2f} "
                            f"of bandwidth, {missed:,.0f} gathers past L2 (column spread {f.col_spread:.2f}) + "
                            f"{CUSPARSE_SPMM_OVERHEAD_S * 1e6:.0f} us per call")


register(CusparseSpMV())
