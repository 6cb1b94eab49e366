"""Host kernels for the tuning and learned-model tests: real (if slow) products with a real choice.

The built-in host path has one candidate per op, so there is nothing to
choose on a CPU-only machine. These kernels give the tuner and the models
something to rank: a row-chunked CSR product whose chunk size changes its
time by a large factor, a densifying kernel with a real preparation cost, and
deliberately broken ones (raising, wrong, leaving outputs unwritten).
"""
import contextlib

import numpy as np
import pytest

from matplan.kernels import registry
from matplan.core.types import Cost
from matplan.kernels.base import Kernel, Prepared
from matplan.models import traffic


class _Host(Kernel):
    backend = "cpu"
    ops = ("spmv", "spmm")

    def prepare(self, A, params):
        return Prepared(self.name, dict(params), {"A": A}, A.shape, A.dtype)

    def _out(self, prepared, B, out):
        shape = (prepared.shape[0],) + B.shape[1:]
        return out if out is not None else np.empty(shape, dtype=np.result_type(prepared.dtype, B.dtype))


class RowChunk(_Host):
    """CSR product computed ``chunk`` rows at a time (small chunks pay Python overhead per slice)."""
    name = "test.rowchunk"

    def candidates(self, f, device):
        for chunk in (16, 256, 4096):
            yield {"chunk": chunk}

    def cost(self, f, params, device):
        # deliberately underestimates the per-slice overhead, so the analytic model can be beaten
        return Cost(0.0, traffic.csr_spmm_bytes(f) / 5e9 + f.m / params["chunk"] * 2e-6, "row chunks")

    def run(self, prepared, B, out=None):
        A, c = prepared.arrays["A"], prepared.params["chunk"]
        C = self._out(prepared, B, out)
        for s in range(0, A.shape[0], c):
            C[s:s + c] = A[s:s + c] @ B
        return C


class Densify(_Host):
    """Converts A to a dense array once (a real preparation cost), then a BLAS product."""
    name = "test.dense"

    def supports(self, f):
        return None if f.m * f.n <= 4_000_000 else f"{f.m}x{f.n} is too large to densify"

    def cost(self, f, params, device):
        return Cost(f.m * f.n * 8 / 5e9, 2.0 * f.m * f.n * f.k / 20e9, "dense BLAS")

    def prepare(self, A, params):
        D = A.toarray()
        return Prepared(self.name, dict(params), {"D": D}, A.shape, A.dtype)

    def run(self, prepared, B, out=None):
        C = self._out(prepared, B, out)
        C[...] = prepared.arrays["D"] @ B
        return C


class Broken(_Host):
    """Fails at run time, like a kernel that does not compile or launch."""
    name = "test.broken"

    def cost(self, f, params, device):
        return Cost(0.0, 1.0, "broken")

    def run(self, prepared, B, out=None):
        raise RuntimeError("boom: simulated launch failure")


class Wrong(_Host):
    """Runs, but its result is off by 0.1%."""
    name = "test.wrong"

    def cost(self, f, params, device):
        return Cost(0.0, 1.0, "wrong")

    def run(self, prepared, B, out=None):
        C = self._out(prepared, B, out)
        C[...] = (prepared.arrays["A"] @ B) * 1.001
        return C


class Lazy(_Host):
    """Writes only the first half of the output rows (the NaN poisoning must catch it)."""
    name = "test.lazy"

    def cost(self, f, params, device):
        return Cost(0.0, 1.0, "lazy")

    def run(self, prepared, B, out=None):
        A = prepared.arrays["A"]
        C = self._out(prepared, B, out)
        h = A.shape[0] // 2
        C[:h] = A[:h] @ B
        return C


CHOICE_KERNELS = (RowChunk(), Densify())
BAD_KERNELS = (Broken(), Wrong(), Lazy())


@contextlib.contextmanager
def registered(*kernels):
    """Register ``kernels`` for the duration of the block (the registry is process-global)."""
    registry.all_kernels()  # load the built-in modules first
    with pytest.MonkeyPatch.context() as mp:
        for k in kernels:
            mp.setitem(registry._REGISTRY, k.name, k)
        yield
