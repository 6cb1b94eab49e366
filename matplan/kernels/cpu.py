"""The CPU family: SciPy / NumPy, the path used when there is no GPU (and the reference)."""
from __future__ import annotations

import scipy.sparse as sp

from ..core import device as device_mod
from ..models import traffic
from ..core.types import Cost
from .base import KeepsA
from .registry import register

#: Rough sustained FLOP/s of NumPy's BLAS on a small host, for costing dense products.
HOST_FLOPS = 20e9
#: SciPy's sparse kernels reach about this fraction of the host copy bandwidth.
HOST_SPARSE_EFFICIENCY = 0.3


class _HostKernel(KeepsA):
    backend = "cpu"
    deterministic = True

    def run(self, prepared, B, out=None):
        C = self._product(prepared.arrays["A"], B)
        if out is not None:
            if sp.issparse(C):
                raise ValueError(f"out: not supported for {prepared.kernel}'s sparse result")
            out[...] = C
            return out
        return C


class ScipySparse(_HostKernel):
    name = "cpu.scipy"
    reads_a_at_run = True
    ops = ("spmv", "spmm", "spgemm", "sptrans")

    def reads_detailed_statistics(self, op: str) -> bool:
        return False   # its cost: the bytes of A, B and C (SpGEMM's from the products, sampled)

    def cost(self, f, params, device):
        bw = device_mod.host_bandwidth_estimate() * HOST_SPARSE_EFFICIENCY
        nbytes = (traffic.spgemm_bytes(f) if f.op == "spgemm" else 2 * traffic.csr_bytes(f) if f.op == "sptrans"
                  else traffic.csr_spmm_bytes(f))
        return Cost(0.0, nbytes / bw, f"SciPy CSR on the host: {nbytes / 1e6:.2f} MB at ~{bw / 1e9:.1f} GB/s")

    def _product(self, A, B):
        C = A.T.tocsr() if B is None else A @ B   # B None: SpTRANS
        if sp.issparse(C):
            C = C.tocsr()
            C.sort_indices()
        return C


class NumpyDense(_HostKernel):
    name = "cpu.numpy"
    reads_a_at_run = True
    ops = ("tsgemm", "gemm")

    def cost(self, f, params, device):
        bw = device_mod.host_bandwidth_estimate()
        t = max(traffic.dense_gemm_bytes(f) / bw, traffic.dense_gemm_flops(f) / HOST_FLOPS)
        return Cost(0.0, t, "NumPy/BLAS on the host")

    def _product(self, A, B):
        return A @ B


register(ScipySparse())
register(NumpyDense())
