"""SpTRANS (A.T as CSR): segmented sort, radix and segmented merge methods, and cuSPARSE csr2csc.

gpu.py          transpose(A, method=...): the entry point, choosing a method
launches.py     the three methods' launches
compiled.py     the compiled kernels per device and the constants shared with the .cu files
replay.py       a plan's launches replayed as CUDA graphs, with pattern replays
kernel.py       SpTrans, the planner's kernel (candidates, cost, run, runner)
vendor.py       cuSPARSE's csr2csc as a candidate
"""
from . import kernel, vendor  # noqa: F401  registers the kernels
from .gpu import transpose
from .kernel import SpTrans

__all__ = ["transpose", "SpTrans"]
