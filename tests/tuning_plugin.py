"""A kernel plugin for the tuning tests: imported by `tune(imports=...)` in every worker process.

It registers the row-chunk kernel and ``test.lost``, which on R-MAT matrices
behaves like a kernel that breaks its CUDA context (raises DeviceContextLost).
"""
from matplan.kernels import register
from matplan.core.types import Cost
from matplan.tuning_db.tune import DeviceContextLost
from tuning_helpers import RowChunk, _Host

RMAT_SMALL_ROWS = 2048


class Lost(_Host):
    name = "test.lost"

    def cost(self, f, params, device):
        return Cost(0.0, 1.0, "lost")

    def run(self, prepared, B, out=None):
        if prepared.shape[0] == RMAT_SMALL_ROWS:
            raise DeviceContextLost("simulated sticky CUDA error")
        C = self._out(prepared, B, out)
        C[...] = prepared.arrays["A"] @ B
        return C


register(RowChunk())
register(Lost())
