"""Kernels: one package per family (spmv, spgemm, sptrans, tsgemm) and the host family (cpu),
each registering its kernels on import; the registry imports them on first use.

GPU kernel modules keep their CUDA sources as ``.cu`` files beside them and
compile them lazily with ``cupy.RawModule``; importing them never needs CuPy.
"""
from .base import Kernel, Prepared
from .registry import BUILTIN_MODULES, all_kernels, get, kernels_for, register

__all__ = ["Kernel", "Prepared", "register", "get", "kernels_for", "all_kernels", "BUILTIN_MODULES"]
