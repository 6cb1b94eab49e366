"""The vendor family: cuSPARSE and cuBLAS through CuPy, candidates like any other.

``VENDOR_LIMITS`` records where each vendor routine is known to work, with the
evidence, like CuPy's ``_available_cusparse_version`` table: the planner never
routes a problem past a limit.
"""
from __future__ import annotations

from .._xp import cupy_module
from ..models import analytic, traffic
from ..validation import check_transpose_call
from .base import Cost, KeepsA
from .registry import register

#: kernel -> {limit: value, "evidence": why}. Measured on an H100, CuPy 14.2, CUDA 13 (issue 8).
VENDOR_LIMITS = {
    "spgemm.cusparse": {
        "max_products": 1_500_000_000,
        "evidence": "cusparseSpGEMM through CuPy raised INSUFFICIENT_RESOURCES at 1.8-2.0e9 products "
                    "and returned an empty matrix without error at 4.6e9 and 1.44e10 products",
    },
}
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
#: cuBLAS tall-and-skinny GEMM: fraction of copy bandwidth. Measured on an H100 (CuPy 14.2, CUDA 13,
#: benchmarks/results/tsgemm-NVIDIA-H100-80GB-HBM3-2026-11-22.json, n = 8192..32768, k = 1..32, both
#: layouts): fp64 0.85-1.03 (median 0.98), fp32 0.24-1.01 (k = 1: 0.70-1.01, k = 2: 0.24-0.64,
#: k >= 4: 0.54-0.80; median 0.70). One figure per dtype: a little under the median.
CUBLAS_TS_EFFICIENCY = {"float64": 0.95, "float32": 0.65}
CUBLAS_GEMM_EFFICIENCY = 0.7
LAUNCH_S = 6e-6


class _VendorKernel(KeepsA):
    backend = "gpu"
    vendor = True

    def run(self, prepared, B, out=None):
        C = prepared.arrays["A"] @ B
        if out is not None:
            out[...] = C
            return out
        return C


class CusparseSpMV(_VendorKernel):
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


class CusparseSpGEMM(_VendorKernel):
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
                               f"{analytic.RBS_GROUP_BOUNDS[-1]} (~{long_nnz:,.0f}) + " if long_nnz else "")
                            + f"{CUSPARSE_SPGEMM_OVERHEAD_S * 1e6:.0f} us")

    def run(self, prepared, B, out=None):
        if out is not None:
            raise ValueError("out: not supported for spgemm (the output's sparsity is not known in advance)")
        C = prepared.arrays["A"] @ B
        C.sort_indices()
        return C


#: cuSPARSE's csr2csc through CuPy (``A.T.tocsr()``): (fixed seconds, bytes an entry of A at the
#: copy bandwidth) by dtype, relative least squares (benchmarks/sptrans_fit.py) over two runs of
#: benchmarks/sptrans.py on an H100 (c148a21, 14 matrices each; measured / model 0.87-1.16).
CUSPARSE_TRANSPOSE_COSTS = {"float64": (135.4e-6, 177.5), "float32": (126.4e-6, 183.7)}


class CusparseTranspose(_VendorKernel):
    name = "sptrans.cusparse"
    reads_a_at_run = True
    ops = ("sptrans",)
    deterministic = False   # cuSPARSE does not promise csr2csc's order to be reproducible

    def cost(self, f, params, device):
        fixed, per_entry = CUSPARSE_TRANSPOSE_COSTS[f.dtype]
        return Cost(0.0, fixed + f.nnz * per_entry / device.mem_bandwidth,
                    f"cuSPARSE csr2csc via CuPy's A.T.tocsr(): {per_entry:.0f} B an entry at the copy "
                    f"bandwidth + {fixed * 1e6:.0f} us (fitted on an H100)")

    def run(self, prepared, B, out=None):
        check_transpose_call(B, out)
        # csr2csc lists each row of A.T in A's row order: sorted already. A sort_indices() here
        # checked (and re-sorted) it on the GPU: rmat-scale18 0.85 ms against 0.40 (H100, c05df22)
        return prepared.arrays["A"].T.tocsr()


class Cublas(_VendorKernel):
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


register(CusparseSpMV())
register(CusparseSpGEMM())
register(CusparseTranspose())
register(Cublas())
