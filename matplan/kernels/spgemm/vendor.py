"""cuSPARSE SpGEMM through CuPy (``A @ B``), a candidate like any other, never routed past
its known limits (:data:`matplan.models.spgemm.VENDOR_LIMITS`)."""
from __future__ import annotations

import numpy as np

from ...models import spgemm as spgemm_model
from ...models.spgemm import VENDOR_LIMITS
from .. import _cuda
from ..base import VendorKernel
from ..registry import register
import matplan.kernels.spgemm.runtime as runtime
from .operands import csr_from_parts


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
        C = canonical(prepared.arrays["A"]) @ canonical(B)
        C.sort_indices()
        return C


def is_canonical(M) -> bool:
    """Whether CSR ``M`` (GPU arrays, indptr and indices of one dtype) has every row's columns
    strictly increasing: True where it says so or is empty, else checked by our kernel (one warp
    a row; CuPy's check is a kernel compiled on first use)."""
    if getattr(M, "_has_canonical_format", None) is True or M.indices.size == 0:
        return True
    m = M.shape[0]
    flag = _cuda.zeroed(1, np.uint32)
    sms = _cuda.device_attribute("MultiProcessorCount", runtime._device_id())
    runtime._launch(f"csr_canonical<{_cuda.ctype(M.indices.dtype)}>", max(1, min(-(-m // 8), 16 * sms)), 256,
                    (M.indptr, M.indices, np.int64(m), flag))
    return not int(_cuda.read_at(flag.data.ptr, 1, np.uint32)[0])


def canonical(M):
    """M where it is canonical (sorted rows, no duplicates) or known to be; else a canonical copy.
    cupyx's ``A @ B`` sums an operand's duplicates in place (the caller's matrix would change) and
    checks the format with a CuPy kernel compiled on first use; this checks it with ours."""
    if getattr(M, "_has_canonical_format", None) is True or M.nnz == 0:
        return M
    if M.indptr.dtype == M.indices.dtype and is_canonical(M):
        return csr_from_parts(M.data, M.indices, M.indptr, M.shape, sorted_rows=True, canonical=True)
    C = M.copy()
    C.sum_duplicates()
    return C


register(CusparseSpGEMM())
