"""Kernels: one module per family, each registering its kernels on import.

GPU kernel modules keep their CUDA sources as ``.cu`` files beside them and
compile them lazily with ``cupy.RawModule``; importing them never needs CuPy.
"""
from .base import Cost, Kernel, Prepared
from .registry import all_kernels, get, kernels_for, register

#: Modules imported on first use of the registry. Add a new family here.
BUILTIN_MODULES = ["cpu", "vendor", "spmv", "tsm2", "spgemm", "spgemm_merge", "sptrans"]

__all__ = ["Cost", "Kernel", "Prepared", "register", "get", "kernels_for", "all_kernels",
           "BUILTIN_MODULES"]
