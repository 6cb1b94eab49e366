"""What runs on a Dask worker: operands placed on the worker's GPU (or kept on the host), one block
planned and run there, and the blocks of an operator kept resident with their bound plans.

Every function here is a pure function of its arguments (a block of C is recomputable from its
block of A and B), which is what lets the client resubmit a block whose worker was lost. Objects
that travel between processes travel as host (SciPy/NumPy) data: a block or a resident operator
block pickles its arrays to the host and is placed again where it lands, so a worker, client or
scheduler without a GPU can always receive one.
"""
from __future__ import annotations

import threading
import time
import uuid

import numpy as np

from ..core.cache import BoundedCache
from ..core.features import products_per_row
from ..core.xp import cupy_module, cupyx_sparse, is_gpu_array, to_host
from ..planner import plan as make_plan
from .checks import BlockCheckError, RowSums, check_rowsums
from .spill import REGISTRY

#: Where a block runs: on the worker's GPU where CuPy sees one ("auto"), always there ("gpu"), or on the host.
PLACEMENTS = ("auto", "gpu", "host")
#: Without a budget, GPU-resident C blocks of one worker may take this fraction of its GPU's memory.
SPILL_FRACTION = 0.5

#: Operands copied to this worker's GPU, by (token, device): B or X once per worker and call, not once
#: per block; two, so a new call's operand soon frees the GPU memory of the one before last.
_ON_DEVICE = BoundedCache("distributed.operands", maxsize=2)


def check_placement(on) -> str:
    if on not in PLACEMENTS:
        raise ValueError(f"on: expected one of {PLACEMENTS}, got {on!r}")
    return on


def use_gpu(on: str) -> bool:
    """Whether this worker computes on its GPU for placement ``on`` (a clear error for "gpu" without one)."""
    if on == "host":
        return False
    if cupy_module() is None:
        if on == "gpu":
            raise RuntimeError("on='gpu': this worker has no usable GPU (CuPy with a visible device); "
                               "use on='auto' or 'host', or start it with dask-cuda")
        return False
    return True


def worker_address() -> str:
    """This worker's address, or 'local' outside a Dask worker."""
    try:
        from distributed import get_worker   # Dask is this package's optional dependency
        return get_worker().address
    except (ImportError, ValueError):
        return "local"


def _device_id() -> int:
    return cupy_module().cuda.Device().id


def _to_gpu(M):
    if is_gpu_array(M):
        return M
    if hasattr(M, "indptr"):
        return cupyx_sparse().csr_matrix(M)
    return cupy_module().asarray(M)


def _sync(gpu: bool) -> None:
    if gpu:
        cupy_module().cuda.Device().synchronize()


class Operand:
    """A replicated operand (SpGEMM's B with its row sums, SpMM's X), host data plus a token that
    names it in each worker's cache of GPU copies."""

    def __init__(self, value, rowsums: RowSums | None = None):
        self.value = to_host(value)
        self.rowsums = rowsums
        self.token = uuid.uuid4().hex

    def placed(self, gpu: bool):
        """(value, row sums) where this worker computes: the GPU copy made once per worker and device."""
        if not gpu:
            return self.value, self.rowsums
        key = (self.token, _device_id())

        def copy():
            rs = None if self.rowsums is None else RowSums(*(cupy_module().asarray(x) for x in
                                                              (self.rowsums.sums, self.rowsums.abs_sums)))
            return _to_gpu(self.value), rs
        return _ON_DEVICE.get_or_create(key, copy)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.value)


def _nbytes(M) -> int:
    if hasattr(M, "indptr"):
        return int(M.data.nbytes + M.indices.nbytes + M.indptr.nbytes)
    return int(M.nbytes)


class Block:
    """Rows [r0, r1) of C on the worker that computed them, with the plan that did and its figures."""

    def __init__(self, index: int, r0: int, r1: int, C, plan, meta: dict, panel_plans=None):
        self.index, self.r0, self.r1, self.C, self.plan, self.meta = index, r0, r1, C, plan, meta
        self.panel_plans = panel_plans   # B in column panels: each panel's Plan, in column order

    @property
    def nbytes(self) -> int:
        return _nbytes(self.C)

    @property
    def device_nbytes(self) -> int:
        """Bytes on the GPU (0 for a host block)."""
        return self.nbytes if is_gpu_array(self.C) else 0

    @property
    def location(self) -> str:
        return "gpu" if is_gpu_array(self.C) else "host"

    def to_host(self) -> None:
        """Move C to host memory in place (spilling)."""
        self.C = to_host(self.C)

    def host(self):
        """C as a SciPy CSR matrix (a copy from the GPU, C itself on the host)."""
        return to_host(self.C)

    def info(self) -> dict:
        return dict(self.meta, nnz=int(self.C.nnz), nbytes=self.nbytes, location=self.location)

    def __getstate__(self):   # travels as host data (see the module's docstring)
        return dict(index=self.index, r0=self.r0, r1=self.r1, C=self.host(), plan=self.plan, meta=self.meta,
                    panel_plans=self.panel_plans)

    def __setstate__(self, state):
        self.__dict__.update(state)


def spgemm_block(index: int, r0: int, r1: int, A_block, B: Operand, on: str, measure, spill_bytes,
                 panel: str = "") -> Block:
    """C[r0:r1] = A[r0:r1] @ B, planned here with this worker's statistics, then checked by row sums;
    a failed check raises BlockCheckError (the block does not count). ``panel`` names B's column
    panel in messages where B is one."""
    gpu = use_gpu(on)
    t0 = time.perf_counter()
    Bv, rowsums = B.placed(gpu)
    A = _to_gpu(A_block) if gpu else A_block
    _sync(gpu)
    t1 = time.perf_counter()
    p = make_plan(A, Bv, measure=measure)
    t2 = time.perf_counter()
    C = p.run(A, Bv)
    _sync(gpu)
    t3 = time.perf_counter()
    products = products_per_row(A, Bv)
    ok, worst = check_rowsums(A, C, rowsums, products, p.features.dtype)
    t4 = time.perf_counter()
    if not ok:
        raise BlockCheckError(f"block {index} (rows {r0}-{r1}){panel}: the row sums of C differ from A @ (B @ 1) "
                              f"by {worst:.3g}x the rounding tolerance (kernel {p.kernel} on {worker_address()})")
    meta = dict(index=index, rows=(r0, r1), kernel=p.kernel, reasons=tuple(p.reasons), backend=p.backend,
                device=p.device, worker=worker_address(), products=int(p.features.products),
                place_s=t1 - t0, plan_s=t2 - t1, kernel_s=t3 - t2, check_s=t4 - t3, check_worst=worst)
    block = Block(index, r0, r1, C, p, meta)
    if gpu:
        budget = spill_bytes if spill_bytes is not None else int(SPILL_FRACTION * _gpu_total_bytes())
        REGISTRY.add(block, budget)
    return block


def _gpu_total_bytes() -> int:
    return int(cupy_module().cuda.Device().mem_info[1])


def block_info(block: Block) -> dict:
    """The small record the client gathers of each block, with its Plan (the block stays on its worker)."""
    return dict(block.info(), plan=block.plan, panel_plans=block.panel_plans)


def block_host(block: Block):
    """The block's C as a SciPy CSR matrix, for the client."""
    return block.host()


def block_location(block: Block) -> str:
    """Where the block is: "gpu", or "host" (the SciPy path, or spilled)."""
    return block.location


class Resident:
    """Rows [r0, r1) of A placed on a worker with their bound plans, one per (columns of X, dtype),
    kept between calls of a DistributedOperator; planned on first use of each X shape."""

    def __init__(self, index: int, r0: int, r1: int, A_block, on: str, reuse: int, measure):
        self.index, self.r0, self.r1, self.on, self.reuse, self.measure = index, r0, r1, on, reuse, measure
        self.gpu = use_gpu(on)
        self.A = _to_gpu(A_block) if self.gpu else A_block
        self.bound = {}   # (k, dtype) -> (BoundPlan, seconds its planning and binding took)
        self._lock = threading.Lock()

    def _bound_for(self, X):
        key = (1 if X.ndim == 1 else X.shape[1], np.dtype(X.dtype).str)
        with self._lock:   # two tasks of one worker may meet this block at once
            if key not in self.bound:
                t = time.perf_counter()
                b = make_plan(self.A, X, reuse=self.reuse, measure=self.measure).bind(self.A)
                self.bound[key] = (b, time.perf_counter() - t)
            return self.bound[key][0]

    def apply(self, X: Operand):
        """(this block's rows of A @ X on the host, figures of the call)."""
        t0 = time.perf_counter()
        Xv, _ = X.placed(self.gpu)
        b = self._bound_for(Xv)
        _sync(self.gpu)
        t1 = time.perf_counter()
        Y = b(Xv)
        _sync(self.gpu)
        t2 = time.perf_counter()
        Y = to_host(Y)
        return Y, dict(index=self.index, kernel=b.plan.kernel, place_s=t1 - t0, kernel_s=t2 - t1,
                       fetch_s=time.perf_counter() - t2, worker=worker_address())

    def plans(self) -> list:
        return [dict(index=self.index, rows=(self.r0, self.r1), k=k, dtype=np.dtype(dt).name,
                     kernel=b.plan.kernel, reasons=tuple(b.plan.reasons), backend=b.plan.backend,
                     device=b.plan.device, worker=worker_address(), nbytes=b.nbytes, plan_s=plan_s)
                for (k, dt), (b, plan_s) in sorted(self.bound.items())]

    def __getstate__(self):   # moves as host data; its plans are made again where it lands
        return dict(index=self.index, r0=self.r0, r1=self.r1, on=self.on, reuse=self.reuse, measure=self.measure,
                    A=to_host(self.A))

    def __setstate__(self, state):
        A = state.pop("A")
        self.__init__(A_block=A, **state)


def make_resident(index, r0, r1, A_block, on, reuse, measure) -> Resident:
    return Resident(index, r0, r1, A_block, on, reuse, measure)


def resident_summary(resident: Resident) -> dict:
    """Where block ``resident`` lives: rows, nonzeros, bytes, worker and "gpu" or "host"."""
    return dict(index=resident.index, rows=(resident.r0, resident.r1), nnz=int(resident.A.nnz),
                nbytes=_nbytes(resident.A), worker=worker_address(), location="gpu" if resident.gpu else "host")


def apply_resident(resident: Resident, X: Operand):
    return resident.apply(X)


def resident_plans(resident: Resident) -> list:
    return resident.plans()
