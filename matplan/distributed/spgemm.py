"""Distributed SpGEMM: C = A @ B by row blocks of A balanced by products, each planned on its worker.

A is a :class:`~matplan.distributed.csr.DistributedCSR` whose blocks stay on the workers (made
here from a SciPy/cupyx A for one call, or by the caller once with ``DistributedCSR.from_matrix``
for many); B is a :class:`~matplan.distributed.replicated.Replicated` on every worker (made here
from a host B, or by the caller once with ``replicate(B)``), or, past a per-worker budget, column
panels sent for the call. Each block is one task, placed on its block of A's worker, that plans
``matplan.planner.plan(A_block, B)`` with the statistics of its rows on its worker's device (the
plan kept on the resident block for the next product with the same B), runs it and checks its rows
by row sums. The result stays on the workers as a DistributedCSR.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..core.validation import check_int
from .block_tasks import spgemm_block
from .blockset import BlockSet
from .checks import RowSums
from .csr import DistributedCSR
from .fastpath import Fallback, Held, call_token, check_path, run_calls
from .panels import ColumnPanels, Whole, assemble_block, column_panels, default_panel_bytes, slice_cols
from .replicated import Replicated, sparse_operand
from .tasks import (RETRIES, DistributedProductError, Live, Timer, backoff, collect_blocks, resolve_client, settle,
                    split_times, task_key)
from .worker import Operand, check_placement


def check_options(on, retries, spill_bytes=None):
    check_placement(on)
    retries = check_int(retries, "retries", "a non-negative number of resubmissions of a lost block", minimum=0)
    if spill_bytes is not None:
        spill_bytes = check_int(spill_bytes, "spill_bytes", "None or a byte budget >= 0 of GPU-resident blocks",
                                minimum=0)
    return retries, spill_bytes


def operand_client(client, *operands):
    """The client of a call: ``client`` where given (and then every distributed operand must be on
    it), else the distributed operands' own, else the running one."""
    theirs = [op.client for op in operands if isinstance(op, (BlockSet, Replicated))]
    client = resolve_client(client if client is not None else (theirs[0] if theirs else None))
    for op in operands:
        if isinstance(op, (BlockSet, Replicated)) and op.client is not client:
            raise ValueError(f"client: {type(op).__name__} operands must live on the call's client "
                             "(distribute or replicate them with client=... of this call)")
    return client


def _is_sparse(M) -> bool:
    if isinstance(M, Replicated):
        return M.sparse
    return hasattr(M, "indptr") or isinstance(M, DistributedCSR)


class SpgemmCall:
    """One distributed SpGEMM's operands on the cluster and its block tasks; recomputes lost blocks."""

    def __init__(self, client, A: DistributedCSR, B, cpanels, on, measure, spill_bytes, retries, B_host=None):
        self.client, self.A, self.cpanels = client, A, cpanels
        self.on, self.measure, self.spill_bytes, self.retries = on, measure, spill_bytes, retries
        self.paneled = len(cpanels) > 1
        if self.paneled:   # each panel scattered once (to one worker); B's row pointers and sums to all
            whole = Whole(B_host, RowSums.of(B_host))
            self.whole = Live(lambda: client.scatter(whole, broadcast=True, hash=False))
            cb = cpanels.bounds
            self.panels = [None if cb[p] == cb[p + 1] else
                           Live(lambda p=p: client.scatter(self._panel(B_host, p), hash=False))
                           for p in range(len(cpanels))]
            for live in [self.whole] + [p for p in self.panels if p is not None]:
                live.get()
        self.B = B   # a Replicated (None where B is in panels)
        self.blocks = [None] * len(A)
        self.key = task_key("spgemm")
        self._serial = itertools.count()
        self.resubmitted = 0   # blocks submitted again after their worker was lost

    def _panel(self, B, p):
        P = slice_cols(B, self.cpanels.bounds[p], self.cpanels.bounds[p + 1])
        return Operand(P, RowSums.of(P))

    def describe(self, i) -> str:
        return f"block {i} (rows {self.A.bounds[i]}-{self.A.bounds[i + 1]})"

    def _submit(self, i, worker):
        r0, r1 = self.A.bounds[i], self.A.bounds[i + 1]
        a = self.A.future(i)   # rebuilt first if it was lost with its worker (or a clear error)
        n = next(self._serial)
        opts = {} if worker is None else dict(workers=[worker], allow_other_workers=True)
        if self.paneled:
            self.blocks[i] = self._submit_panels(i, r0, r1, a, n, opts)
        else:
            self.blocks[i] = self.client.submit(spgemm_block, i, r0, r1, a, self.B.future(), self.on, self.measure,
                                                self.spill_bytes, key=f"{self.key}-block-{i}-{n}", **opts)
        return self.blocks[i]

    def _submit_panels(self, i, r0, r1, a, n, opts):
        """One task per (block i, non-empty panel), then one assembling block i from them."""
        cb = self.cpanels.bounds
        parts = [None if live is None else
                 self.client.submit(spgemm_block, i, r0, r1, a, live.get(), self.on, self.measure, self.spill_bytes,
                                    f" panel {p} (columns {cb[p]}-{cb[p + 1]})", key=f"{self.key}-panel-{i}-{p}-{n}")
                 for p, live in enumerate(self.panels)]
        return self.client.submit(assemble_block, i, r0, r1, a, self.whole.get(), cb, self.on, self.spill_bytes,
                                  *parts, key=f"{self.key}-block-{i}-{n}", **opts)

    def _collect(self, indices) -> dict:
        hints = self.A.workers()
        _, infos, again = collect_blocks(self.client, indices, self._submit, hint=lambda i: hints[i], key=self.key,
                                         retries=self.retries, what="spgemm", describe=self.describe)
        self.resubmitted += again
        for info in infos.values():
            info["path"] = "tasks"
        return infos

    def run_runners(self) -> dict:
        """Every block on the runner of its block of A's worker, one message per worker; returns
        {index: block record}, or raises Fallback (nothing kept) where a precondition fails."""
        if self.paneled:
            raise Fallback("spgemm: B is sent in column panels")
        b = self.B.future()
        if b.status != "finished":
            raise Fallback("spgemm: B is not in memory on the workers")
        refs = self.A.refs()
        token = call_token("spgemm")
        items = {}
        for i, (w, ref) in enumerate(refs):
            items.setdefault(w, []).append((i, self.A.bounds[i], self.A.bounds[i + 1], ref))
        per_worker = {w: ("spgemm", (token, its, ("data", b.key), self.on, self.measure, self.spill_bytes),
                          [f"{token}-{it[0]}" for it in its]) for w, its in items.items()}
        infos = {}
        for w, (runner, reply) in run_calls(self.client, per_worker, "spgemm").items():
            for rec in reply["records"]:
                i = rec["index"]
                self.blocks[i] = Held(w, runner, f"{token}-{i}")
                infos[i] = rec
        return infos

    def run(self, indices) -> dict:
        """Compute the given blocks; returns {index: block record}. Blocks whose data was lost after
        their record came back (a worker died meanwhile) are computed again, ``retries`` rounds at most."""
        infos = self._collect(list(indices))
        for round_ in range(self.retries + 1):
            settle([self.blocks[i] for i in infos])
            lost = [i for i in infos if self.blocks[i].status != "finished"]
            if not lost:
                return infos
            if round_ == self.retries:
                raise DistributedProductError(f"spgemm: {self.describe(lost[0])} and {len(lost) - 1} other(s) were "
                                              "lost with their workers after they were computed (Dask future "
                                              f"{self.blocks[lost[0]].status!r}); no partial result is returned")
            backoff(round_)
            self.resubmitted += len(lost)
            infos.update(self._collect(lost))
        return infos

    def recompute(self, i):
        """(future, record) of block i computed again (its worker was lost after the call returned)."""
        info = self.run([i])[i]
        return self.blocks[i], info


def spgemm(A, B, *, client=None, blocks=None, nblocks: int | None = None, on: str = "auto", measure="auto",
           retries: int = RETRIES, spill_bytes: int | None = None, panels=None,
           panel_bytes: int | None = None, path: str = "auto") -> DistributedCSR:
    """C = A @ B (both sparse) on a Dask cluster, as a :class:`DistributedCSR` of row blocks.

    A: a SciPy/cupyx CSR (cut into blocks balanced by products and sent for this call) or a
    DistributedCSR already on the workers (``DistributedCSR.from_matrix(A, balance=B)``; its blocks
    and the plans they keep are reused, nothing of A is sent). B: a SciPy/cupyx CSR (sent for this
    call) or a :func:`replicate`-d B already on every worker (reused, never sent again).

    client: a ``distributed.Client`` (default: the operands', else the running one); blocks,
    nblocks: row boundaries or a ``RowBlocks``, or a count (default: one per worker, more past
    MAX_BLOCK_PRODUCTS products a worker), for a host A only; on: "auto" (each worker's GPU where
    it has one, else its host), "gpu" or "host"; measure: the planner's; retries: resubmissions of
    a block whose worker was lost (then DistributedProductError); spill_bytes: GPU bytes of C
    blocks a worker keeps before moving the oldest to host memory (default: half its GPU);
    panel_bytes: the most bytes of a host B (CSR) one worker is sent: a larger B goes in column
    panels balanced by nonzeros, each scattered once, each (block, panel) product its own task
    (default: PANEL_FRACTION of the smallest worker memory Dask reports, host limit or GPU; none
    known: B whole); panels: a number of column panels or column boundaries [0, ..., n] instead; path:
    "auto" runs the blocks on each worker's runner in one message per worker where A's blocks are
    in memory on known workers and B is replicated (else, or for "tasks", one task per block;
    ``timings["path"]`` says which ran, ``timings["fallback"]`` why not the runners)."""
    timer = Timer()
    client = operand_client(client, A, B)
    retries, spill_bytes = check_options(on, retries, spill_bytes)
    check_path(path)
    if not _is_sparse(B):
        raise ValueError("A, B: distributed spgemm multiplies two sparse matrices; this B is dense, a 'spmm' "
                         "product (matplan.distributed.spmm takes a dense B)")
    if isinstance(B, DistributedCSR):
        raise TypeError("B: a DistributedCSR is row blocks; SpGEMM needs all of B on every worker: pass "
                        "replicate(B) (or B itself, sent for this call)")
    A_h = None if isinstance(A, DistributedCSR) else sparse_operand(A, "A")
    B_h = None if isinstance(B, Replicated) else sparse_operand(B, "B")
    a_shape = A.shape if A_h is None else A_h.shape
    b_shape = B.shape if B_h is None else B_h.shape
    if a_shape[1] != b_shape[0]:
        raise ValueError(f"A, B: shapes {a_shape} and {b_shape} do not conform (A's columns must equal B's rows)")
    dtype = np.promote_types(A.dtype if A_h is None else A_h.dtype, B.dtype if B_h is None else B_h.dtype)
    if A_h is None and (blocks is not None or nblocks is not None):
        raise ValueError("blocks, nblocks: A is a DistributedCSR, whose row blocks are fixed "
                         "(DistributedCSR.from_matrix chooses them)")
    if B_h is None and (panels is not None or panel_bytes is not None):
        raise ValueError("panels, panel_bytes: B is replicated whole on every worker; column panels apply to a "
                         "host B only")
    if panel_bytes is not None:
        if panels is not None:
            raise ValueError("panels, panel_bytes: give column panels or a byte budget for them, not both")
        panel_bytes = check_int(panel_bytes, "panel_bytes", "None or a positive budget of B's bytes per worker")
    elif panels is None and B_h is not None:
        panel_bytes = default_panel_bytes(client, on)
    if B_h is not None:
        cp = column_panels(B_h, panels=panels, panel_bytes=panel_bytes)
    else:
        cp = ColumnPanels((0, b_shape[1]), (int(B.indptr[-1]),), (B.nbytes,), "replicated beforehand (replicate(B))")
    timer.lap("partition_s")
    if A_h is not None:   # A's blocks made resident for this call (C keeps them to recompute lost blocks)
        A = DistributedCSR.from_matrix(A_h, client=client, blocks=blocks, nblocks=nblocks,
                                       balance=B if B_h is None else B_h, on=on, retries=retries)
        timer.lap("scatter_s")
        timer.phases["scatter_s"] -= A.timings["partition_s"]
        timer.phases["partition_s"] += A.timings["partition_s"]
    paneled = len(cp) > 1
    if B_h is not None and not paneled:
        B = Replicated(B_h, client=client)
    call = SpgemmCall(client, A, None if paneled else B, cp, on, measure, spill_bytes, retries, B_host=B_h)
    timer.lap("scatter_s")
    route, fallback = run_blocks(call, path)
    timer.lap("run_s")
    records = [route[i] for i in range(len(A))]
    timings = dict(timer.phases, **split_times(timer.phases["run_s"], records))
    timings.update(total_s=sum(timer.phases.values()), resubmitted=call.resubmitted,
                   planned=sum(bool(r.get("planned")) for r in records),
                   path="runner" if fallback is None else "tasks", fallback=fallback)
    return DistributedCSR((a_shape[0], b_shape[1]), dtype, A.bounds, records, futures=call.blocks, client=client,
                          call=call, timings=timings, panels=cp)



def run_blocks(call: SpgemmCall, path: str) -> tuple:
    """({index: record}, why the runners were not used or None): the runner path where it may run,
    else (or when it finds a precondition failing) the tasks."""
    if path == "tasks":
        return call.run(range(len(call.A))), "path='tasks'"
    try:
        return call.run_runners(), None
    except Fallback as e:
        call.A.refresh_workers()   # a block Dask moved is found there by the tasks
        done = call.run(range(len(call.A)))
        call.A.refresh_workers()   # and where the tasks left it by the next call
        return done, str(e)
