"""Distributed SpGEMM: C = A @ B by row blocks of A balanced by products, each planned on its worker.

B (with its row sums) is scattered once to every worker; A's blocks are scattered round-robin;
each block is one task that plans ``matplan.planner.plan(A_block, B)`` with the statistics of its
rows on its worker's device, runs the plan and checks its rows by row sums (a block that fails
raises). The result stays on the workers as a :class:`~matplan.distributed.csr.DistributedCSR`.
"""
from __future__ import annotations

import itertools

from ..core import validation
from ..core.validation import check_int
from ..core.xp import to_host
from .blocks import row_blocks, slice_rows
from .checks import RowSums
from .csr import DistributedCSR
from .panels import Whole, assemble_block, column_panels, default_panel_bytes, slice_cols
from .tasks import (RETRIES, DistributedProductError, Live, Timer, collect, resolve_client, scatter_blocks,
                    split_times, task_key, worker_count)
from .worker import Operand, block_info, check_placement, spgemm_block

#: Blocks per worker when neither ``blocks`` nor ``nblocks`` is given: several, so a slow block or a
#: lost worker costs a fraction of a worker's share, and Dask can even the load out.
BLOCKS_PER_WORKER = 4


def check_options(on, retries, spill_bytes=None):
    check_placement(on)
    retries = check_int(retries, "retries", "a non-negative number of resubmissions of a lost block", minimum=0)
    if spill_bytes is not None:
        spill_bytes = check_int(spill_bytes, "spill_bytes", "None or a byte budget >= 0 of GPU-resident blocks",
                                minimum=0)
    return retries, spill_bytes


class SpgemmCall:
    """One distributed SpGEMM's inputs on the cluster and its block tasks; recomputes lost blocks."""

    def __init__(self, client, A, B, rblocks, on, measure, spill_bytes, retries, cpanels):
        self.client, self.A, self.rblocks, self.cpanels = client, A, rblocks, cpanels
        self.on, self.measure, self.spill_bytes, self.retries = on, measure, spill_bytes, retries
        rowsums = RowSums.of(B)
        self.paneled = len(cpanels) > 1
        if self.paneled:   # each panel scattered once (to one worker); B's row pointers and sums to all
            self.whole = Live(lambda: client.scatter(Whole(B, rowsums), broadcast=True, hash=False))
            cb = cpanels.bounds
            self.panels = [None if cb[p] == cb[p + 1] else
                           Live(lambda p=p: client.scatter(self._panel(B, p), hash=False)) for p in range(len(cpanels))]
        else:
            self.B = Live(lambda: client.scatter(Operand(B, rowsums), broadcast=True, hash=False))
        self.parts = [Live(lambda i=i: client.scatter(self._part(i), hash=False)) for i in range(len(rblocks))]
        self.blocks = [None] * len(rblocks)
        self.key = task_key("spgemm")
        self._serial = itertools.count()
        self.resubmitted = 0   # blocks submitted again after their worker was lost

    def _part(self, i):
        return slice_rows(self.A, self.rblocks.bounds[i], self.rblocks.bounds[i + 1])

    def _panel(self, B, p):
        P = slice_cols(B, self.cpanels.bounds[p], self.cpanels.bounds[p + 1])
        return Operand(P, RowSums.of(P))

    def scatter(self) -> None:
        """B to every worker (or each of its panels to one), A's blocks spread over them."""
        for live in ([self.whole] + [p for p in self.panels if p is not None]) if self.paneled else [self.B]:
            live.get()
        for live, f in zip(self.parts, scatter_blocks(self.client, [self._part(i) for i in range(len(self.parts))])):
            live.set(f)

    def describe(self, i) -> str:
        return f"block {i} (rows {self.rblocks.bounds[i]}-{self.rblocks.bounds[i + 1]})"

    def _submit(self, i):
        r0, r1 = self.rblocks.bounds[i], self.rblocks.bounds[i + 1]
        n = next(self._serial)
        if self.paneled:
            self.blocks[i] = blk = self._submit_panels(i, r0, r1, n)
            return self.client.submit(block_info, blk, key=f"{self.key}-info-{i}-{n}")
        blk = self.client.submit(spgemm_block, i, r0, r1, self.parts[i].get(), self.B.get(), self.on, self.measure,
                                 self.spill_bytes, key=f"{self.key}-block-{i}-{n}")
        self.blocks[i] = blk
        return self.client.submit(block_info, blk, key=f"{self.key}-info-{i}-{n}")

    def _submit_panels(self, i, r0, r1, n):
        """One task per (block i, non-empty panel), then one assembling block i from them."""
        A_f, cb = self.parts[i].get(), self.cpanels.bounds
        parts = [None if live is None else
                 self.client.submit(spgemm_block, i, r0, r1, A_f, live.get(), self.on, self.measure, self.spill_bytes,
                                    f" panel {p} (columns {cb[p]}-{cb[p + 1]})", key=f"{self.key}-panel-{i}-{p}-{n}")
                 for p, live in enumerate(self.panels)]
        return self.client.submit(assemble_block, i, r0, r1, A_f, self.whole.get(), cb, self.on, self.spill_bytes,
                                  *parts, key=f"{self.key}-block-{i}-{n}")

    def run(self, indices) -> dict:
        """Compute the given blocks; returns {index: block record}. Blocks whose data was lost after
        their record came back (a worker died meanwhile) are computed again, ``retries`` rounds at most."""
        infos, again = collect(self._submit, list(indices), retries=self.retries, what="spgemm", describe=self.describe)
        self.resubmitted += sum(again.values())
        for round_ in range(self.retries + 1):
            lost = [i for i in infos if self.blocks[i].status != "finished"]
            if not lost:
                return infos
            if round_ == self.retries:
                raise DistributedProductError(f"spgemm: {self.describe(lost[0])} and {len(lost) - 1} other(s) were "
                                              "lost with their workers after they were computed; no partial result "
                                              "is returned")
            self.resubmitted += len(lost)
            infos.update(collect(self._submit, lost, retries=self.retries, what="spgemm", describe=self.describe)[0])
        return infos

    def recompute(self, i):
        """(future, record) of block i computed again (its worker was lost after the call returned)."""
        info = self.run([i])[i]
        return self.blocks[i], info


def spgemm(A, B, *, client=None, blocks=None, nblocks: int | None = None, on: str = "auto", measure="auto",
           retries: int = RETRIES, spill_bytes: int | None = None, panels=None,
           panel_bytes: int | None = None) -> DistributedCSR:
    """C = A @ B (both sparse) on a Dask cluster, as a :class:`DistributedCSR` of row blocks.

    client: a ``distributed.Client`` (default: the running one); blocks: row boundaries or a
    ``RowBlocks``; nblocks: blocks balanced by products (default: 4 per worker); on: "auto" (each
    worker's GPU where it has one, else its host), "gpu" or "host"; measure: the planner's; retries:
    resubmissions of a block whose worker was lost (then DistributedProductError); spill_bytes:
    GPU bytes of C blocks a worker keeps before moving the oldest to host memory (default: half its
    GPU); panel_bytes: the most bytes of B (CSR) one worker is sent: a larger B goes in column
    panels balanced by nonzeros, each scattered once, each (block, panel) product its own task
    (default: PANEL_FRACTION of the smallest worker memory limit Dask reports; none known: B
    whole); panels: a number of column panels or column boundaries [0, ..., n] instead of the
    budget. A and B may be SciPy or cupyx (sent to the workers as host data)."""
    timer = Timer()
    client = resolve_client(client)
    retries, spill_bytes = check_options(on, retries, spill_bytes)
    problem = validation.normalize(A, B)
    if problem.op != "spgemm":
        raise ValueError(f"A, B: distributed spgemm multiplies two sparse matrices; this is a {problem.op!r} "
                         "product (matplan.distributed.spmm takes a dense B)")
    validation.check_structure(problem)
    A_h, B_h = to_host(problem.A), to_host(problem.B)
    if blocks is None and nblocks is None:
        nblocks = BLOCKS_PER_WORKER * worker_count(client)
    rb = row_blocks(A_h, B_h, blocks=blocks, nblocks=nblocks)
    if panel_bytes is not None:
        if panels is not None:
            raise ValueError("panels, panel_bytes: give column panels or a byte budget for them, not both")
        panel_bytes = check_int(panel_bytes, "panel_bytes", "None or a positive budget of B's bytes per worker")
    elif panels is None:
        panel_bytes = default_panel_bytes(client)
    cp = column_panels(B_h, panels=panels, panel_bytes=panel_bytes)
    timer.lap("partition_s")
    call = SpgemmCall(client, A_h, B_h, rb, on, measure, spill_bytes, retries, cp)
    call.scatter()
    timer.lap("scatter_s")
    infos = call.run(range(len(rb)))
    timer.lap("run_s")
    records = [infos[i] for i in range(len(rb))]
    timings = dict(timer.phases, **split_times(timer.phases["run_s"], records))
    timings.update(total_s=sum(timer.phases.values()), resubmitted=call.resubmitted)
    return DistributedCSR((A_h.shape[0], B_h.shape[1]), problem.dtype, rb.bounds, records, futures=call.blocks,
                          client=client, call=call, timings=timings, panels=cp)
