"""cuBLAS through CuPy (``cupy.matmul``), a candidate like any other.

For tall-and-skinny products its timings are kept by the same shape bucket as TSM2's
(:meth:`Cublas.measure_key`), so the planner measures it beside TSM2's configs on every plan for
the GPU in use and reuses both for the bucket.
"""
from __future__ import annotations

from ...core.types import Cost
from ...core.xp import cupy_module
from ...models import traffic
from ...models import tsgemm as model
from ..base import VendorKernel
from ..registry import register
from .rules import bucket_of_features


class Cublas(VendorKernel):
    name = "gemm.cublas"
    reads_a_at_run = True
    ops = ("tsgemm", "gemm")
    deterministic = True

    def cost(self, f, params, device):
        if f.op == "tsgemm":   # the model's constants read at each call: matplan report refits them
            eff = model.CUBLAS_TS_EFFICIENCY.get(f.dtype, 0.5)
            fixed = model.CUBLAS_TS_FIXED_S["gemv" if f.k == 1 else "gemm"]
            t = traffic.dense_gemm_bytes(f) / (device.mem_bandwidth * eff) + fixed
            why = f"cuBLAS on tall-and-skinny B: ~{eff:.2f} of bandwidth (measured on an H100)"
        else:
            t = traffic.dense_gemm_flops(f) / (device.peak_flops(f.dtype) * model.CUBLAS_GEMM_EFFICIENCY)
            why = "cuBLAS GEMM, compute bound"
        return Cost(0.0, t + model.LAUNCH_S, why)

    def measure_key(self, f):
        """TSM2's shape bucket for tall-and-skinny products (rules.bucket); None otherwise."""
        return bucket_of_features(f) if f.op == "tsgemm" else None

    def runner(self, params):
        """``cupy.matmul(A, B)`` itself when no ``out`` is given: a plan's call then costs what
        cupy.matmul's does (prepare-then-run added 5-10 us to a single 150-170 us call at n = 8192
        float32 k = 32, 1.05-1.07x, on an H100 host)."""
        general = super().runner(params)
        cp = cupy_module()
        if cp is None:
            return general
        matmul = cp.matmul

        def run(A, B, out=None):
            return matmul(A, B) if out is None else general(A, B, out)
        return run


register(Cublas())
