"""Tall-and-skinny GEMM: TSM2 (FP32/FP64 FMA, cp.async and 3xTF32 tensor-core variants) and cuBLAS."""
from . import tsm2, vendor  # noqa: F401  registers the kernels
