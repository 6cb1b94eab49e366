"""The one interface every kernel follows, so the planner, the tuner and the tests treat them alike.

A kernel is a stateless strategy object:

* ``candidates(features, device)`` yields parameter dicts (JSON-able values);
* ``cost(features, params, device)`` predicts ``Cost(prepare_s, run_s, why)``
  from the analytic model (the learned model may override it);
* ``prepare(A, params)`` converts A to the kernel's format (timed separately; ``KeepsA``'s
  keeps A as it is, for kernels that run on A's own arrays);
* ``run(prepared, B, out=None)`` computes the product;
* ``runner(params)`` returns what ``Plan.run`` calls, ``(A, B, out=None) -> C``: by default
  prepare then run; a kernel whose call is dominated by host time gives a shorter path.

``Prepared`` carries the converted arrays and their byte size, so plan caches
can bound themselves by bytes; :func:`out_or_new` is the one check of a kernel's ``out``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import numpy as np

from ..core.types import Cost
from ..core.xp import gpu_available

OPS = ("spmv", "spmm", "spgemm", "sptrans", "tsgemm", "gemm")
BACKENDS = ("cpu", "gpu")


@dataclasses.dataclass
class Prepared:
    """A kernel's format of A: arrays by name, the parameters used, and the bytes held."""
    kernel: str
    params: dict
    arrays: dict
    shape: tuple
    dtype: Any
    meta: dict = dataclasses.field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays, sparse matrices counted by their data, indices and indptr."""
        return int(sum(_nbytes(a) for a in self.arrays.values()))


def _nbytes(a) -> int:
    if hasattr(a, "indptr"):  # SciPy / cupyx compressed sparse matrix
        return sum(getattr(a, name).nbytes for name in ("data", "indices", "indptr"))
    return getattr(a, "nbytes", 0)


def out_or_new(out, shape, dtype, xp, orders: str = "C"):
    """The array a kernel's ``run`` writes its result into: a new C-contiguous ``xp.empty`` when
    ``out`` is None, else ``out`` itself once checked to be an ``xp`` array of exactly ``shape`` and
    ``dtype``, contiguous in one of ``orders`` ("C", "F" or "CF"). Otherwise TypeError (not such an
    array) or ValueError (shape, dtype, contiguity) naming ``out``: a kernel writes through raw
    pointers, so a wrong ``out`` would be written wrongly, never cast or copied silently."""
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if out is None:
        return xp.empty(shape, dtype=dtype)
    if not isinstance(out, xp.ndarray):
        raise TypeError(f"out: expected a {xp.__name__}.ndarray, got {type(out).__module__}.{type(out).__name__}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out: expected shape {shape}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise ValueError(f"out: expected dtype {dtype}, got {out.dtype}")
    if not ((out.flags.c_contiguous and "C" in orders) or (out.flags.f_contiguous and "F" in orders)):
        what = " or ".join(f"{o}-contiguous" for o in orders)
        raise ValueError(f"out: expected a {what} array, got strides {out.strides}")
    return out


class Kernel:
    """Base class: subclasses set the class attributes and implement the four methods."""
    name: str = ""
    ops: tuple = ()
    backend: str = "gpu"          # "cpu" (NumPy/SciPy) or "gpu" (CuPy)
    deterministic: bool = True    # bitwise-identical output run to run
    vendor: bool = False          # a vendor library (cuSPARSE/cuBLAS) path
    #: prepare() keeps A's own arrays (no copy) and run() reads them on every call, keeping nothing
    #: derived from their content: a cached plan then cannot go stale when A changes in place.
    reads_a_at_run: bool = False

    def available(self) -> bool:
        """Whether the kernel can run in this process (CuPy present for GPU kernels)."""
        if self.backend == "gpu":
            return gpu_available()
        return True

    def supports(self, features) -> str | None:
        """None if the kernel handles this problem, else the reason it does not."""
        return None

    def reads_detailed_statistics(self, op: str) -> bool:
        """Whether supports, candidates and cost read more of A than its sizes and row moments for
        ``op``: the ELL-R warp lengths and column spread (SpMV, SpMM, SpGEMM), SpGEMM's products
        per row and compression, SpTRANS's longest column. A plan whose every candidate answers
        False skips measuring them (and samples SpGEMM's total products)."""
        return True

    def candidates(self, features, device) -> Iterable[dict]:
        yield {}

    def cost(self, features, params, device) -> Cost:
        raise NotImplementedError

    def prepare(self, A, params: dict) -> Prepared:
        raise NotImplementedError

    def run(self, prepared: Prepared, B, out=None):
        raise NotImplementedError

    def runner(self, params: dict):
        """``Plan.run``'s call ``(A, B, out=None) -> C`` for operands already validated against the
        plan (type, shape, dtype): prepare A, then run. One is made per plan and kept."""
        def run(A, B, out=None):
            return self.run(self.prepare(A, dict(params)), B, out=out)
        return run

    def tuning_calls(self, prepared: Prepared, B) -> dict:
        """The calls a tuning run times on ``prepared``: ``"run"``, what :meth:`cost`'s run_s prices,
        and for a kernel whose repeated runs replay what an earlier call recorded, ``"first"``, a
        call that replays and keeps nothing (a first call; recorded as ``first_ms``)."""
        return {"run": lambda: self.run(prepared, B)}

    def modules(self, features, params) -> tuple:
        """The compiled modules running ``params`` on these features loads that may have no
        prebuilt binary, as (source file, instantiations, options) each: a tuning run compiles
        the missing ones in parallel before timing (``_cuda.precompile``). () where every
        module is prebuilt."""
        return ()

    def __repr__(self) -> str:
        return f"<kernel {self.name} ops={self.ops} backend={self.backend}>"


class KeepsA(Kernel):
    """A kernel that runs on A as it is: prepare converts nothing and keeps A's own arrays."""

    def prepare(self, A, params: dict) -> Prepared:
        return Prepared(self.name, dict(params), {"A": A}, A.shape, A.dtype)


class VendorKernel(KeepsA):
    """cuSPARSE / cuBLAS through CuPy: runs ``A @ B`` on A as it is."""
    backend = "gpu"
    vendor = True

    def run(self, prepared, B, out=None):
        C = prepared.arrays["A"] @ B
        if out is not None:
            out[...] = C
            return out
        return C
