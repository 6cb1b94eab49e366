"""Distributed SpMM/SpMV: A's row blocks (balanced by nonzeros) resident on the workers with their
bound plans, applied to a replicated X as often as the caller likes.

A :class:`DistributedOperator` scatters A's blocks once and makes, on each block's worker, a
:class:`~matplan.distributed.worker.Resident` that holds the block (on the worker's GPU where it
has one) and, per shape of X, the block's own plan bound to it (``plan(A_block, X).bind``). A
call scatters X to every worker, runs one task per block on the block it keeps, and gathers the
rows of Y in order. Between calls nothing is planned, converted or sent again but X: the pattern
of an iterative method (examples/distributed_power_iteration.py). :func:`spmm` is one call of a
fresh operator.
"""
from __future__ import annotations

import itertools

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ..core import validation
from ..core.validation import SUPPORTED_DTYPES, check_int
from ..core.xp import cupy_module, is_gpu_array, to_host
from .blocks import row_blocks, slice_rows
from .spgemm import BLOCKS_PER_WORKER, check_options
from .tasks import RETRIES, Live, Timer, collect, resolve_client, scatter_blocks, split_times, task_key, worker_count
from .worker import Operand, apply_resident, make_resident, resident_plans, resident_summary

#: An operator's default ``reuse`` for its blocks' plans: iterative methods apply it many times.
OPERATOR_REUSE = 100


def _sparse_matrix(A):
    """A as a host SciPy CSR matrix of float32/float64, its structure checked; a clear error otherwise."""
    A_h = to_host(A)
    if not sp.issparse(A_h):
        raise TypeError(f"A: expected a sparse matrix (SciPy or cupyx), got {type(A).__name__}")
    A_h = A_h.tocsr()
    if np.dtype(A_h.dtype) not in SUPPORTED_DTYPES:
        raise TypeError(f"A: expected float32 or float64 values, got {A_h.dtype} (cast it with A.astype)")
    validation.check_csr(A_h, "A")
    return A_h


class DistributedOperator:
    """y = A @ x and Y = A @ X on a Dask cluster, A's blocks and bound plans kept on the workers.

    client, blocks, nblocks, on, measure, retries: as for :func:`matplan.distributed.spgemm` (blocks
    are balanced by nonzeros); reuse: the planner's, the applications each block's plan will serve.
    ``plans`` lists each block's plan per shape of X; ``last_timings`` the last call's time split."""

    def __init__(self, A, *, client=None, blocks=None, nblocks: int | None = None, on: str = "auto",
                 reuse: int = OPERATOR_REUSE, measure="auto", retries: int = RETRIES):
        self.client = resolve_client(client)
        self.retries, _ = check_options(on, retries)
        self.on, self.measure = on, measure
        self.reuse = check_int(reuse, "reuse", "a positive integer (applications of the operator)")
        A_h = _sparse_matrix(A)
        self.shape, self.dtype = A_h.shape, np.dtype(A_h.dtype)
        if blocks is None and nblocks is None:
            nblocks = BLOCKS_PER_WORKER * worker_count(self.client)
        self.rblocks = row_blocks(A_h, None, blocks=blocks, nblocks=nblocks)
        self._A = A_h
        self.key = task_key("spmm")
        self._serial = itertools.count()
        n = len(self.rblocks)
        self._parts = [Live(lambda i=i: self.client.scatter(self._part(i), hash=False)) for i in range(n)]
        self._residents = [Live(lambda i=i: self._make(i)) for i in range(n)]
        for live, f in zip(self._parts, scatter_blocks(self.client, [self._part(i) for i in range(n)])):
            live.set(f)
        self._where = self._ready()
        self.last_timings = {}

    def blocks_info(self) -> list:
        """Per block: rows, nonzeros, bytes, worker and location ("gpu" or "host") as made resident."""
        return [dict(w) for w in self._where]

    def _part(self, i):
        return slice_rows(self._A, self.rblocks.bounds[i], self.rblocks.bounds[i + 1])

    def _make(self, i):
        r0, r1 = self.rblocks.bounds[i], self.rblocks.bounds[i + 1]
        return self.client.submit(make_resident, i, r0, r1, self._parts[i].get(), self.on, self.reuse, self.measure,
                                  key=f"{self.key}-resident-{i}-{next(self._serial)}")

    def describe(self, i) -> str:
        return f"block {i} (rows {self.rblocks.bounds[i]}-{self.rblocks.bounds[i + 1]})"

    def _collect(self, submit) -> list:
        if self._residents is None:
            raise RuntimeError("this DistributedOperator was closed")
        out, _ = collect(submit, list(range(len(self.rblocks))), retries=self.retries, what="spmm",
                         describe=self.describe)
        return [out[i] for i in range(len(self.rblocks))]

    def _ready(self) -> list:
        """Each block made resident on a worker: its rows, nonzeros, worker and whether it is on a GPU."""
        return self._collect(lambda i: self.client.submit(resident_summary, self._residents[i].get(),
                                                          key=f"{self.key}-where-{i}-{next(self._serial)}"))

    # -- products ----------------------------------------------------------------------------
    def _operand(self, X):
        gpu = is_gpu_array(X)
        X_h = np.asarray(to_host(X))
        if X_h.ndim not in (1, 2) or X_h.shape[0] != self.shape[1]:
            raise ValueError(f"X: expected shape ({self.shape[1]},) or ({self.shape[1]}, k) for this "
                             f"{self.shape[0]}x{self.shape[1]} operator, got {X_h.shape}")
        if np.dtype(X_h.dtype) not in SUPPORTED_DTYPES:
            raise TypeError(f"X: expected float32 or float64 values, got {X_h.dtype} (cast it with X.astype)")
        dtype = np.promote_types(self.dtype, X_h.dtype)
        return X_h, gpu, dtype

    def matmat(self, X):
        """A @ X (X: (n,) or (n, k), NumPy or CuPy; the result on the same side, in the promoted dtype)."""
        timer = Timer()
        X_h, gpu, dtype = self._operand(X)
        x = Live(lambda: self.client.scatter(Operand(X_h), broadcast=True, hash=False))
        x.get()
        timer.lap("scatter_s")
        results = self._collect(lambda i: self.client.submit(
            apply_resident, self._residents[i].get(), x.get(), key=f"{self.key}-apply-{i}-{next(self._serial)}"))
        timer.lap("run_s")
        x.release()
        shape = (self.shape[0],) + X_h.shape[1:]
        Y = np.concatenate([y for y, _ in results]) if results else np.zeros(shape, dtype)
        if Y.shape != shape:
            raise RuntimeError(f"the blocks make a result of shape {Y.shape}, expected {shape}")
        Y = Y.astype(dtype, copy=False)
        if gpu:
            Y = cupy_module().asarray(Y)
        timer.lap("assemble_s")
        infos = [info for _, info in results]
        self.last_timings = dict(timer.phases, **split_times(timer.phases["run_s"], infos,
                                                             keys=("place_s", "kernel_s", "fetch_s")))
        self.last_timings["total_s"] = sum(timer.phases.values())
        self.last_kernels = [info["kernel"] for info in infos]
        return Y

    matvec = matmat
    __call__ = matmat

    def __matmul__(self, X):
        return self.matmat(X)

    @property
    def plans(self) -> list:
        """Per block and per shape of X met so far: rows, k, dtype, kernel and reasons, worker, bytes bound."""
        per_block = self._collect(lambda i: self.client.submit(
            resident_plans, self._residents[i].get(), key=f"{self.key}-plans-{i}-{next(self._serial)}"))
        return [p for block in per_block for p in block]

    def as_linear_operator(self) -> spla.LinearOperator:
        """A SciPy LinearOperator over this operator (host vectors in and out)."""
        return spla.LinearOperator(self.shape, matvec=self.matmat, matmat=self.matmat, dtype=self.dtype)

    def close(self) -> None:
        """Free the blocks and their plans on the workers."""
        for live in (self._residents or []) + (self._parts or []):
            live.release()
        self._residents = self._parts = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._residents is None else f"{len(self.rblocks)} row blocks resident"
        return (f"<DistributedOperator {self.shape[0]:,}x{self.shape[1]:,} {self.dtype}, {state} "
                f"({self.rblocks.measure})>")


def spmm(A, X, *, client=None, blocks=None, nblocks: int | None = None, on: str = "auto", measure="auto",
         retries: int = RETRIES, info: dict | None = None):
    """A @ X (SpMV for a vector X, SpMM for a matrix) over A's row blocks on a Dask cluster, X
    replicated; one call of a fresh :class:`DistributedOperator` planned for one use. ``info``, a
    dict, receives the blocks' plans and the call's timings."""
    with DistributedOperator(A, client=client, blocks=blocks, nblocks=nblocks, on=on, reuse=1, measure=measure,
                             retries=retries) as op:
        Y = op @ X
        if info is not None:
            info.update(plans=op.plans, timings=op.last_timings, blocks=op.rblocks)
        return Y
