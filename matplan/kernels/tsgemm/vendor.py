"""cuBLAS through CuPy (``cupy.matmul``), a candidate like any other."""
from __future__ import annotations

from ...core.types import Cost
from ...core.xp import cupy_module
from ...models import traffic
from ...models.tsgemm import CUBLAS_GEMM_EFFICIENCY, CUBLAS_TS_EFFICIENCY, LAUNCH_S
from ..base import VendorKernel
from ..registry import register

class Cublas(VendorKernel):
    name = "gemm.cublas"
    reads_a_at_run = True
    ops = ("tsgemm", "gemm")
    deterministic = True

    def cost(self, f, params, device):
        if f.op == "tsgemm":
            eff = CUBLAS_TS_EFFICIENCY.get(f.dtype, 0.5)
            t = traffic.dense_gemm_bytes(f) / (device.mem_bandwidth * eff)
            why = f"cuBLAS on tall-and-skinny B: ~{eff:.2f} of bandwidth (measured on an H100)"
            from .tsm2 import vendor_ratio   # TSM2's online calibration also times cuBLAS
            ratio = vendor_ratio(device, f)
            if ratio is not None:
                why += f"; calibrated by the online timing: measured/model = {ratio:.2f}"
                return Cost(0.0, t * ratio + LAUNCH_S, why, calibrated=True)
        else:
            t = traffic.dense_gemm_flops(f) / (device.peak_flops(f.dtype) * CUBLAS_GEMM_EFFICIENCY)
            why = "cuBLAS GEMM, compute bound"
        return Cost(0.0, t + LAUNCH_S, why)

    def runner(self, params):
        """``cupy.matmul(A, B)`` itself when no ``out`` is given: a plan's call then costs what
        cupy.matmul's does (prepare-then-run added 5-10 us to a single 150-170 us call at n = 8192
        float32 k = 32, 1.05-1.07x, on an H100 host, 2026-11-24)."""
        general = super().runner(params)
        cp = cupy_module()
        if cp is None:
            return general
        matmul = cp.matmul

        def run(A, B, out=None):
            return matmul(A, B) if out is None else general(A, B, out)
        return run


register(Cublas())
