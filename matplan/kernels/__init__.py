"""Kernels: one module per family, each registering its kernels on import.

GPU kernel modules keep their CUDA sources as ``.cu`` files beside them and
compile them lazily with ``cupy.RawModule``; importing them never needs CuPy.
"""
from ..core.types import Cost
from .base import Kernel, Prepared
from .registry import all_kernels, get, kernels_for, register

#: Modules imported on first use of the registry. Add a new family here.
BUILTIN_MODULES = ["cpu", "spmv", "tsgemm", "spgemm", "sptrans"]

__all__ = ["Cost", "Kernel", "Prepared", "register", "get", "kernels_for", "all_kernels",
           "BUILTIN_MODULES"]
