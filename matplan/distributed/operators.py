"""Distributed SpMM/SpMV: A's row blocks (balanced by nonzeros) resident on the workers with their
bound plans, applied to X as often as the caller likes.

A :class:`DistributedOperator` holds A as a :class:`~matplan.distributed.csr.DistributedCSR` (made
from a host A, or one the caller made resident) whose blocks keep, per shape and dtype of X, their
own plan bound to them (``plan(A_block, X).bind``), planned on first use. X may be

* a NumPy/CuPy array: sent to every worker for the call, one task per block, the rows of Y gathered
  in order (NumPy; CuPy for a CuPy X), as an iterative method on the client wants;
* a :func:`~matplan.distributed.replicate`-d X already on every worker, or a
  :class:`~matplan.distributed.dense.DistributedDense` (a previous Y): nothing goes through the
  client; each worker assembles a distributed X from its blocks, and Y stays on the workers as a
  DistributedDense (``gather()``, ``to_cupy()``).

:func:`spmm` is one call of an operator (over a host A: made for that call).
"""
from __future__ import annotations

import itertools

import numpy as np
import scipy.sparse.linalg as spla

from ..core.validation import check_int
from ..core.xp import cupy_module, is_gpu_array
from .block_tasks import gather_operand, spmm_block
from .csr import DistributedCSR
from .dense import DistributedDense
from .fastpath import Fallback, Held, alive, call_token, check_path, run_calls, runners
from .replicated import Replicated, dense_operand
from .spgemm import check_options, operand_client
from .tasks import RETRIES, Live, Timer, collect, collect_blocks, resolve_client, split_times, task_key

#: An operator's default ``reuse`` for its blocks' plans: iterative methods apply it many times.
OPERATOR_REUSE = 100
#: What the workers' own time of an SpMM call is made of.
SPMM_PHASES = ("place_s", "plan_s", "kernel_s", "fetch_s")


class DistributedOperator:
    """y = A @ x and Y = A @ X on a Dask cluster, A's blocks and bound plans kept on the workers.

    A: a SciPy/cupyx CSR (made resident here, blocks balanced by nonzeros; freed by ``close()``) or
    a DistributedCSR (used as it is, left to its owner). client, blocks, nblocks, on, measure,
    retries, path: as for :func:`matplan.distributed.spgemm`; reuse: the planner's, the applications
    each block's plan will serve. ``plans`` lists each block's plan per shape of X; ``last_timings`` the
    last call's time split; ``matrix`` the DistributedCSR."""

    def __init__(self, A, *, client=None, blocks=None, nblocks: int | None = None, on: str = "auto",
                 reuse: int = OPERATOR_REUSE, measure="auto", retries: int = RETRIES, path: str = "auto"):
        self.retries, _ = check_options(on, retries)
        self.on, self.measure, self.path = on, measure, check_path(path)
        self.reuse = check_int(reuse, "reuse", "a positive integer (applications of the operator)")
        if isinstance(A, DistributedCSR):
            if blocks is not None or nblocks is not None:
                raise ValueError("blocks, nblocks: A is a DistributedCSR, whose row blocks are fixed")
            self.client, self.matrix, self._owned = operand_client(client, A), A, False
        else:
            self.client = resolve_client(client)
            self.matrix = DistributedCSR.from_matrix(A, client=self.client, blocks=blocks, nblocks=nblocks, on=on,
                                                     retries=self.retries)
            self._owned = True
        self.shape, self.dtype = self.matrix.shape, self.matrix.dtype
        self.key = task_key("spmm")
        self._serial = itertools.count()
        self._closed = False
        self.last_timings, self.last_kernels = {}, []

    @property
    def rblocks(self):
        return self.matrix.rblocks

    def blocks_info(self) -> list:
        """Per block: rows, nonzeros, bytes, worker and location ("gpu" or "host") as made resident."""
        return self.matrix.blocks_info()

    def describe(self, i) -> str:
        return f"block {i} (rows {self.matrix.bounds[i]}-{self.matrix.bounds[i + 1]})"

    def _check_open(self):
        if self._closed:
            raise RuntimeError("this DistributedOperator was closed")

    def _opts(self, worker):
        return {} if worker is None else dict(workers=[worker], allow_other_workers=True)

    # -- products ----------------------------------------------------------------------------
    def matmat(self, X):
        """A @ X. X: (n,) or (n, k), NumPy or CuPy (the result on the same side, in the promoted
        dtype), or a replicated X / DistributedDense (the result a DistributedDense on the workers)."""
        self._check_open()
        if isinstance(X, (Replicated, DistributedDense)):
            return SpmmCall(self, X).result()
        timer = Timer()
        gpu = is_gpu_array(X)
        X_h = dense_operand(X, "X", self.shape[1])
        dtype = np.promote_types(self.dtype, X_h.dtype)
        fallback = "path='tasks'"
        if self.path == "auto":
            timer.lap("scatter_s")
            try:   # X goes with each runner's message: nothing to scatter first
                out, fallback = self._runners_host(X_h), None
            except Fallback as e:
                fallback = str(e)
                self.matrix.refresh_workers()
        if fallback is not None:
            out = self._tasks_host(X_h, timer)
            self.matrix.refresh_workers()   # where the tasks left its blocks, for the next call
        timer.lap("run_s")
        results = [out[i] for i in range(len(self.matrix))]
        shape = (self.shape[0],) + X_h.shape[1:]
        Y = np.concatenate([y for y, _ in results]) if results else np.zeros(shape, dtype)
        if Y.shape != shape:
            raise RuntimeError(f"the blocks make a result of shape {Y.shape}, expected {shape}")
        Y = Y.astype(dtype, copy=False)
        if gpu:
            Y = cupy_module().asarray(Y)
        timer.lap("assemble_s")
        self._timed(timer, [info for _, info in results], fallback)
        return Y

    def _tasks_host(self, X_h, timer) -> dict:
        """{index: (Y block on the host, record)}: X scattered to every worker, one task per block."""
        x = Replicated(X_h, client=self.client, pin_copies=False)
        timer.lap("scatter_s")
        hints = self.matrix.workers()
        try:
            out, _ = collect(lambda i: self.client.submit(
                spmm_block, self.matrix.future(i), x.future(), self.on, self.reuse, self.measure, False,
                key=f"{self.key}-apply-{i}-{next(self._serial)}", **self._opts(hints[i])),
                list(range(len(self.matrix))), retries=self.retries, what="spmm", describe=self.describe)
        finally:
            x.release()
        for _, info in out.values():
            info["path"] = "tasks"
        return out

    def _runners_host(self, X_h) -> dict:
        """{index: (Y block on the host, record)}: X sent with one message per worker to its runner,
        which runs that worker's blocks; Fallback where a block is not where it was."""
        items = {}
        for i, (w, ref) in enumerate(self.matrix.refs()):
            items.setdefault(w, []).append(ref)
        per_worker = {w: ("spmm", (call_token("spmm"), refs, ("value", X_h), self.on, self.reuse, self.measure,
                                   False), []) for w, refs in items.items()}
        return {res[1]["index"]: tuple(res) for _, reply in run_calls(self.client, per_worker, "spmm").values()
                for res in reply["results"]}

    def _timed(self, timer, infos, fallback=None) -> dict:
        self.last_timings = dict(timer.phases, **split_times(timer.phases["run_s"], infos, keys=SPMM_PHASES))
        self.last_timings.update(total_s=sum(timer.phases.values()), planned=sum(bool(i.get("planned")) for i in infos),
                                 path="runner" if fallback is None else "tasks", fallback=fallback,
                                 operand_s=max((float(i.get("operand_s", 0.0)) for i in infos), default=0.0))
        self.last_kernels = [info["kernel"] for info in infos]
        return self.last_timings

    matvec = matmat
    __call__ = matmat

    def __matmul__(self, X):
        return self.matmat(X)

    @property
    def plans(self) -> list:
        """Per block and per shape of X met so far: rows, k, dtype, kernel and reasons, worker, bytes bound."""
        self._check_open()
        return [p for p in self.matrix.bound_plans() if p["op"] == "spmm"]

    def as_linear_operator(self) -> spla.LinearOperator:
        """A SciPy LinearOperator over this operator (host vectors in and out)."""
        return spla.LinearOperator(self.shape, matvec=self.matmat, matmat=self.matmat, dtype=self.dtype)

    def close(self) -> None:
        """Free A's blocks and their plans on the workers (where this operator made them)."""
        if self._owned and not self._closed:
            self.matrix.release()
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.matrix)} row blocks resident"
        return (f"<DistributedOperator {self.shape[0]:,}x{self.shape[1]:,} {self.dtype}, {state} "
                f"({self.rblocks.measure})>")


class SpmmCall:
    """A @ X for a distributed X (replicated, or a previous DistributedDense), Y left on the workers;
    recomputes Y's blocks lost with their workers (the source of the DistributedDense it returns)."""

    def __init__(self, op: DistributedOperator, X):
        self.op, self.X = op, X
        operand_client(op.client, X)
        if isinstance(X, Replicated) and X.sparse:
            raise ValueError("X: a replicated sparse B is SpGEMM's operand (matplan.distributed.spgemm)")
        shape = X.shape
        if len(shape) not in (1, 2) or shape[0] != op.shape[1]:
            raise ValueError(f"X: expected shape ({op.shape[1]},) or ({op.shape[1]}, k) for this "
                             f"{op.shape[0]}x{op.shape[1]} operator, got {tuple(shape)}")
        self.shape = (op.shape[0],) + tuple(shape[1:])
        self.dtype = np.promote_types(op.dtype, X.dtype)
        self.key = task_key("spmm")
        self._serial = itertools.count()
        self._gathered = {}   # worker -> Live future of X assembled there

    def _operand(self, worker):
        """X where a block on ``worker`` runs: the replicated future, or X assembled on that worker."""
        if isinstance(self.X, Replicated):
            return self.X.future()
        live = self._gathered.get(worker)
        if live is None:
            token = f"{self.key}-x"
            live = self._gathered[worker] = Live(lambda: self.op.client.submit(
                gather_operand, self.op.on, token, *[self.X.future(j) for j in range(len(self.X))],
                key=f"{self.key}-x-{next(self._serial)}", **self.op._opts(worker)))
        return live.get()

    def _submit(self, i, worker):
        return self.op.client.submit(spmm_block, self.op.matrix.future(i), self._operand(worker), self.op.on,
                                     self.op.reuse, self.op.measure, True,
                                     key=f"{self.key}-block-{i}-{next(self._serial)}", **self.op._opts(worker))

    def run(self, indices) -> tuple:
        hints = self.op.matrix.workers()
        futures, infos, _ = collect_blocks(self.op.client, indices, self._submit, hint=lambda i: hints[i], key=self.key,
                                           retries=self.op.retries, what="spmm", describe=self.op.describe)
        for info in infos.values():
            info["path"] = "tasks"
        return futures, infos

    def run_runners(self) -> tuple:
        """({index: Held}, {index: record}): every block on its worker's runner, one message per
        worker, X found there (replicated) or assembled there from its blocks' runners (distributed);
        Fallback where a precondition fails."""
        client = self.op.client
        refs = self.op.matrix.refs()
        if isinstance(self.X, Replicated):
            f = self.X.future()
            if f.status != "finished":
                raise Fallback("spmm: X is not in memory on the workers")
            keys, spec = runners(client, [w for w, _ in refs]), ("ref", ("data", f.key))
        else:
            xrefs = self.X.refs()
            keys = runners(client, [w for w, _ in refs] + [w for w, _ in xrefs])
            held = self.X.handles()
            parts = [(w, h.runner if isinstance(h, Held) else keys[w], ref) for (w, ref), h in zip(xrefs, held)]
            gone = [w for w, r, _ in parts if not alive(client, w, r)]
            if gone:   # a runner would wait on a dead peer for Dask's connect timeout
                raise Fallback(f"spmm: X's blocks on {gone[0]} are not held by a live runner")
            spec = ("parts", f"{self.key}-x", parts)
        token = call_token("spmm")
        items = {}
        for i, (w, ref) in enumerate(refs):
            items.setdefault(w, []).append((i, ref))
        per_worker = {w: ("spmm", (token, [r for _, r in its], spec, self.op.on, self.op.reuse, self.op.measure, True),
                          [f"{token}-{i}" for i, _ in its]) for w, its in items.items()}
        handles, infos = {}, {}
        for w, (runner, reply) in run_calls(client, per_worker, "spmm", keys=keys).items():
            for rec in reply["records"]:
                handles[rec["index"]] = Held(w, runner, f"{token}-{rec['index']}")
                infos[rec["index"]] = rec
        return handles, infos

    def result(self) -> DistributedDense:
        timer = Timer()
        timer.lap("scatter_s")
        n = len(self.op.matrix)
        fallback = "path='tasks'"
        if self.op.path == "auto":
            try:
                futures, infos = self.run_runners()
                fallback = None
            except Fallback as e:
                fallback = str(e)
                self.op.matrix.refresh_workers()
        if fallback is not None:
            futures, infos = self.run(range(n))
            self.op.matrix.refresh_workers()   # where the tasks left its blocks, for the next call
        timer.lap("run_s")
        for live in self._gathered.values():   # X assembled on the workers is not needed after the call
            live.release()
        self._gathered.clear()
        records = [infos[i] for i in range(n)]
        timings = self.op._timed(timer, records, fallback)
        return DistributedDense(self.shape, self.dtype, self.op.matrix.bounds, records,
                                futures=[futures[i] for i in range(n)], client=self.op.client, source=self,
                                timings=timings)

    def recompute(self, i):
        """(future, record) of Y's block i computed again (its worker was lost)."""
        futures, infos = self.run([i])
        self._gathered.clear()
        return futures[i], infos[i]


def spmm(A, X, *, client=None, blocks=None, nblocks: int | None = None, on: str = "auto", measure="auto",
         retries: int = RETRIES, reuse: int | None = None, info: dict | None = None, path: str = "auto"):
    """A @ X (SpMV for a vector X, SpMM for a matrix) over A's row blocks on a Dask cluster: one
    call of a :class:`DistributedOperator`.

    A: a SciPy/cupyx CSR (made resident for this call) or a DistributedCSR (its blocks and the plans
    they keep are reused). X: NumPy/CuPy (sent; Y gathered, on X's side) or a replicated X /
    DistributedDense (Y a DistributedDense left on the workers). reuse: the planner's (default 1
    for a host A, OPERATOR_REUSE for a resident one). path: "auto" (each worker's runner, one
    message per worker, where A's blocks and X are in memory on known workers) or "tasks".
    ``info``, a dict, receives the blocks' plans, the call's timings and the row blocks."""
    if reuse is None:
        reuse = OPERATOR_REUSE if isinstance(A, DistributedCSR) else 1
    op = DistributedOperator(A, client=client, blocks=blocks, nblocks=nblocks, on=on, reuse=reuse, measure=measure,
                             retries=retries, path=path)
    Y = op @ X
    if info is not None:
        info.update(plans=op.plans, timings=op.last_timings, blocks=op.rblocks)
    if not isinstance(Y, DistributedDense):   # a distributed Y keeps A to recompute lost blocks
        op.close()
    return Y
