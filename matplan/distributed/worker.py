"""What lives on a Dask worker: operands placed on the worker's GPU (or kept on the host), row
blocks of a matrix (an operand made resident, or a product's rows of C) with the plans bound to
them, and the small records the client gathers.

Objects that travel between processes travel as host (SciPy/NumPy) data: a block or an operand
pickles its arrays to the host and is placed again where it lands (its GPU copies and bound plans
are not pickled), so a worker, client or scheduler without a GPU can always receive one. The
product tasks themselves are in :mod:`matplan.distributed.block_tasks`.
"""
from __future__ import annotations

import collections
import threading
import time
import uuid

import distributed
import numpy as np

from ..core.xp import cupy_module, cupyx_sparse, is_gpu_array, to_host
from .checks import RowSums

#: Where a block runs: on the worker's GPU where CuPy sees one ("auto"), always there ("gpu"), or on the host.
PLACEMENTS = ("auto", "gpu", "host")
#: Without a budget, GPU-resident C blocks of one worker may take this fraction of its GPU's memory.
SPILL_FRACTION = 0.5
#: Plans a resident block keeps bound, one per second operand (and shape of X), least recently used out.
MAX_BOUND = 4


def check_placement(on) -> str:
    if on not in PLACEMENTS:
        raise ValueError(f"on: expected one of {PLACEMENTS}, got {on!r}")
    return on


#: Set on the workers of ``local_cluster(gpu=False)`` (:class:`HostOnly`): there ``on="auto"`` takes
#: the host (the SciPy path the cluster says it runs) even where the process sees a GPU.
HOST_ONLY_ATTR = "_matplan_host_only"


class HostOnly(distributed.WorkerPlugin):
    """Marks a worker host-only (:data:`HOST_ONLY_ATTR`)."""
    name = "matplan-host-only"

    def setup(self, worker):
        setattr(worker, HOST_ONLY_ATTR, True)


def _host_only() -> bool:
    try:
        return bool(getattr(distributed.get_worker(), HOST_ONLY_ATTR, False))
    except ValueError:   # not in a Dask worker
        return False


def use_gpu(on: str) -> bool:
    """Whether this worker computes on its GPU for placement ``on`` (a clear error for "gpu" without
    one); "auto" on a host-only worker (:class:`HostOnly`) takes the host."""
    if on == "host" or (on == "auto" and _host_only()):
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


def device_id() -> int:
    return cupy_module().cuda.Device().id


def to_gpu(M):
    if is_gpu_array(M):
        return M
    if hasattr(M, "indptr"):
        return cupyx_sparse().csr_matrix(M)
    return cupy_module().asarray(M)


def where(M, gpu: bool):
    """``M`` where this worker computes: on its GPU (copied there unless it is) or on the host."""
    return to_gpu(M) if gpu else to_host(M)


def sync(gpu: bool) -> None:
    if gpu:
        cupy_module().cuda.Device().synchronize()


def gpu_total_bytes() -> int:
    return int(cupy_module().cuda.Device().mem_info[1])


def nbytes_of(M) -> int:
    if M is None:
        return 0
    if hasattr(M, "indptr"):
        return int(M.data.nbytes + M.indices.nbytes + M.indptr.nbytes)
    return int(M.nbytes)


class Operand:
    """A replicated operand (SpGEMM's B with its row sums, SpMM's X) and the token that names it
    in the plans bound to resident blocks. Its GPU copy is made once per worker and device, on
    first use, and kept on the object: as long as Dask keeps the operand, across calls."""

    def __init__(self, value, rowsums: RowSums | None = None, token: str | None = None):
        self.value = value             # host data from the client; GPU data when assembled on a worker
        self.rowsums = rowsums
        self.token = token or uuid.uuid4().hex
        self._placed = {}              # device id -> (value, row sums) on that GPU
        self._lock = threading.Lock()

    def placed(self, gpu: bool):
        """(value, row sums) where this worker computes."""
        if not gpu:
            return to_host(self.value), self.rowsums
        dev = device_id()
        with self._lock:   # workers that are threads of one process may share one operand
            got = self._placed.get(dev)
            if got is None:
                rs = None if self.rowsums is None else RowSums(*(cupy_module().asarray(x) for x in
                                                                  (self.rowsums.sums, self.rowsums.abs_sums)))
                got = self._placed[dev] = (to_gpu(self.value), rs)
            return got

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.value)

    def __getstate__(self):   # travels as host data
        return dict(value=to_host(self.value), rowsums=self.rowsums, token=self.token)

    def __setstate__(self, state):
        self.__init__(**state)


class Block:
    """Rows [r0, r1) of a matrix on the worker that holds them: an operand's rows made resident
    (``plan`` None), or rows of a product (sparse C or dense Y) with the plan that made them.

    As an operand, a block keeps the plans made for it, one per second operand: ``bound(key,
    make)``, so a product repeated with the same operands plans nothing."""

    def __init__(self, index: int, r0: int, r1: int, C, plan=None, meta: dict | None = None, panel_plans=None):
        self.index, self.r0, self.r1, self.C, self.plan = index, r0, r1, C, plan
        self.meta = dict(meta or {})
        self.panel_plans = panel_plans   # B in column panels: each panel's Plan, in column order
        self._bound = collections.OrderedDict()   # key -> (value, seconds it took to make)
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.C)

    @property
    def device_nbytes(self) -> int:
        """Bytes on the GPU (0 for a host block)."""
        return self.nbytes if is_gpu_array(self.C) else 0

    @property
    def location(self) -> str:
        return "gpu" if is_gpu_array(self.C) else "host"

    def matrix(self, gpu: bool):
        """The block's matrix where this worker computes (a spilled block is copied back each use)."""
        return where(self.C, gpu)

    def to_host(self) -> None:
        """Move C to host memory in place (spilling); plans bound to the GPU copy go with it."""
        self.C = to_host(self.C)
        with self._lock:
            self._bound.clear()

    def host(self):
        """C as a SciPy CSR matrix or NumPy array (a copy from the GPU, C itself on the host)."""
        return to_host(self.C)

    def bound(self, key, make) -> tuple:
        """(value, seconds it took, made now): what ``make()`` returned for ``key``, made on first use."""
        with self._lock:   # two tasks of one worker may meet this block at once
            hit = self._bound.get(key)
            if hit is not None:
                self._bound.move_to_end(key)
                return hit + (False,)
            t = time.perf_counter()
            value = make()
            hit = self._bound[key] = (value, time.perf_counter() - t)
            while len(self._bound) > MAX_BOUND:
                self._bound.popitem(last=False)
            return hit + (True,)

    def bound_plans(self) -> list:
        """Per plan bound to this block: its key's kind, the kernel, why, bytes prepared and planning time."""
        out = []
        with self._lock:
            entries = list(self._bound.items())
        for key, (value, seconds) in entries:
            p = value[0]
            plan = getattr(p, "plan", p)   # a BoundPlan or a Plan
            out.append(dict(index=self.index, rows=(self.r0, self.r1), op=key[0],
                            operand=key[1] if key[0] == "spgemm" else None,
                            k=plan.features.k, dtype=plan.features.dtype, kernel=plan.kernel,
                            reasons=tuple(plan.reasons), backend=plan.backend, device=plan.device,
                            worker=worker_address(), nbytes=int(getattr(p, "nbytes", 0)), plan_s=seconds))
        return out

    def info(self) -> dict:
        nnz = int(self.C.nnz) if hasattr(self.C, "nnz") else int(np.prod(self.C.shape))
        return dict(self.meta, index=self.index, rows=(self.r0, self.r1), nnz=nnz, nbytes=self.nbytes,
                    location=self.location)

    def __getstate__(self):   # travels as host data (see the module's docstring)
        return dict(index=self.index, r0=self.r0, r1=self.r1, C=self.host(), plan=self.plan, meta=self.meta,
                    panel_plans=self.panel_plans)

    def __setstate__(self, state):
        self.__init__(**state)


def place_block(index: int, r0: int, r1: int, rows, on: str) -> Block:
    """Rows [r0, r1) of an operand (a SciPy CSR slice scattered here) placed where this worker
    computes, to stay: copied to its GPU once, or kept on the host."""
    gpu = use_gpu(on)
    t = time.perf_counter()
    M = where(rows, gpu)
    sync(gpu)
    return Block(index, r0, r1, M, None, dict(worker=worker_address(), place_s=time.perf_counter() - t,
                                               kernel=None, reasons=()))


def block_info(block: Block) -> dict:
    """The small record the client gathers of each block, with its Plan (the block stays on its worker)."""
    return dict(block.info(), plan=block.plan, panel_plans=block.panel_plans)


def block_infos(*blocks) -> list:
    """The records of several blocks of one worker, in one task (one round trip for all)."""
    return [block_info(b) for b in blocks]


def block_host(block: Block):
    """The block's rows as a SciPy CSR matrix or NumPy array, for the client."""
    return block.host()


def block_location(block: Block) -> str:
    """Where the block is: "gpu", or "host" (the SciPy path, or spilled)."""
    return block.location


def block_plans(block: Block) -> list:
    return block.bound_plans()
