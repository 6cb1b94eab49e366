"""DistributedCSR: a sparse matrix kept as CSR row blocks on the workers of a Dask cluster.

Two kinds, one class: an operand made resident (``DistributedCSR.from_matrix(A)``: each block's
rows scattered once to its worker and placed on that worker's GPU, to stay across products), and
the result C of a distributed SpGEMM (each block where it was computed). Either is an operand of
:func:`~matplan.distributed.spgemm` and :func:`~matplan.distributed.spmm`; a block keeps the plans
made for it with each second operand. The client holds only each block's record: rows, nonzeros,
bytes, kernel and the plan's reasons, worker, timings. Blocks come back to the client one at a
time (``block(i)``, ``to_scipy()``, ``save(dir)``), always as host data.

A block lost with its worker is made again when it is next read or used: a resident operand's
from the host matrix the client keeps (``keep_source``, by reference), C's from A and B by the
call that computed it; a loaded result, or an operand distributed without its source, cannot,
and says so.
"""
from __future__ import annotations

import itertools
import types
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..core.validation import check_int
from ..core.xp import cupy_module, cupyx_sparse
from .blocks import RowBlocks, assign_blocks, default_nblocks, row_blocks, row_weights, slice_rows
from .blockset import ALIVE, BlockSet
from .replicated import Replicated, sparse_operand
from .store import BLOCK_FIELDS, INDEX, read_block, read_index, write_block, write_index
from .tasks import RETRIES, DistributedProductError, Timer, collect, collect_blocks, resolve_client, task_key
from .worker import Block, block_host, block_plans, check_placement, place_block

#: Largest nnz of one cupyx CSR (its indices are int32).
CUPY_MAX_NNZ = 2**31 - 1


def balance_operand(balance, n: int):
    """What row_weights needs of SpGEMM's B to balance A's blocks by products: B's shape and row pointers."""
    if isinstance(balance, Replicated):
        if not balance.sparse:
            raise TypeError("balance: expected a sparse B (a SciPy/cupyx matrix or a replicated sparse B), "
                            "got a replicated dense X (SpMM's blocks are balanced by nonzeros: leave balance None)")
        shape, indptr = balance.shape, balance.indptr
    else:
        H = sparse_operand(balance, "balance")
        shape, indptr = H.shape, np.asarray(H.indptr)
    if shape[0] != n:
        raise ValueError(f"balance: A has {n} columns but this B has {shape[0]} rows")
    return types.SimpleNamespace(shape=shape, indptr=indptr)


class MatrixSource:
    """Where a resident matrix's blocks come from: rows of the client's host matrix, scattered to
    the worker assigned to each block (balanced by work) and placed there by a task."""

    def __init__(self, client, A, rblocks, on: str, retries: int):
        self.client, self.A, self.rblocks, self.on, self.retries = client, A, rblocks, on, retries
        workers = sorted(client.nthreads())
        if not workers:
            raise DistributedProductError("the Dask cluster has no workers (start some, or wait_for_workers)")
        self.home = [workers[w] for w in assign_blocks(rblocks.weights, len(workers))]
        self.key = task_key("resident")
        self._serial = itertools.count()
        self._rows = {}   # block -> future of its scattered rows, until placed

    def _slice(self, i):
        return slice_rows(self.A, self.rblocks.bounds[i], self.rblocks.bounds[i + 1])

    def describe(self, i) -> str:
        return f"block {i} (rows {self.rblocks.bounds[i]}-{self.rblocks.bounds[i + 1]}) of A"

    def _submit(self, i, worker):
        rows = self._rows.get(i)
        if rows is None or rows.status not in ALIVE:   # lost, or a rebuild: anywhere Dask likes
            rows = self._rows[i] = self.client.scatter(self._slice(i), hash=False)
        r0, r1 = self.rblocks.bounds[i], self.rblocks.bounds[i + 1]
        opts = {} if worker is None else dict(workers=[worker], allow_other_workers=True)
        return self.client.submit(place_block, i, r0, r1, rows, self.on,
                                  key=f"{self.key}-block-{i}-{next(self._serial)}", **opts)

    def place(self, indices) -> tuple:
        """({i: future}, {i: record}) of the given blocks placed on their workers."""
        by_worker = {}
        for i in indices:
            if self.home[i] is not None:
                by_worker.setdefault(self.home[i], []).append(i)
        for w, members in by_worker.items():   # each block's rows straight to its worker
            self._rows.update(zip(members, self.client.scatter([self._slice(i) for i in members], workers=[w],
                                                               hash=False)))
        try:
            futures, records, _ = collect_blocks(self.client, indices, self._submit, hint=lambda i: self.home[i],
                                                 key=self.key, retries=self.retries, what="distribute",
                                                 describe=self.describe)
        finally:
            for i in indices:   # placed: the host rows scattered to the worker are no longer needed
                f = self._rows.pop(i, None)
                if f is not None:
                    f.release()
        for i, rec in records.items():
            self.home[i] = rec.get("worker")
        return futures, records

    def recompute(self, i):
        """(future, record) of block i placed again (its worker was lost): its rows sent anew."""
        self.home[i] = None
        futures, records = self.place([i])
        return futures[i], records[i]


class DistributedCSR(BlockSet):
    """Row blocks of an m x n CSR matrix on a Dask cluster (or, loaded without a client, in this process).

    ``plans``: per block, the kernel chosen on its worker and the plan's reasons (a product's C);
    ``blocks_info()``: rows, nnz, bytes and where each block lives; ``timings``: where the call's
    time went. ``from_matrix(A)`` makes an operand resident. ``release()`` frees the blocks."""

    what = "matrix"

    def __init__(self, shape, dtype, bounds, infos, *, futures=None, local=None, client=None, call=None,
                 timings=None, panels=None, lost_hint: str = "", rblocks=None):
        super().__init__(shape, dtype, bounds, infos, futures=futures, local=local, client=client, source=call,
                         timings=timings, lost_hint=lost_hint)
        self.panels = panels   # B's ColumnPanels (None: not a product, or loaded)
        self._rblocks = rblocks

    @property
    def rblocks(self) -> RowBlocks:
        """The row blocks and the work of each (as balanced by from_matrix; else their nonzeros)."""
        if self._rblocks is None:
            return RowBlocks(self.bounds, tuple(int(i["nnz"]) for i in self._infos), "nonzeros")
        return self._rblocks

    @classmethod
    def from_matrix(cls, A, *, client=None, blocks=None, nblocks: int | None = None, balance=None, on: str = "auto",
                    keep_source: bool = True, retries: int = RETRIES) -> "DistributedCSR":
        """A (SciPy or cupyx CSR) cut into row blocks that stay on the workers: each block's rows
        are scattered once to the worker assigned to it and placed on that worker's GPU (``on``:
        "auto", "gpu" or "host"), so products with it send nothing of A again.

        blocks, nblocks: as for :func:`~matplan.distributed.spgemm` (default: one block per
        worker, more for a SpGEMM share past MAX_BLOCK_PRODUCTS products; a hub row gets its own);
        balance: SpGEMM's B (sparse, or a :class:`Replicated` one) to balance the blocks by the
        products of A @ B; None balances by nonzeros (SpMM/SpMV). Blocks are spread so that each
        worker's total work is balanced. keep_source: keep a reference to A's host data (a copy
        for a cupyx A) on the client, so a block lost with its worker is rebuilt; False: a lost
        block is an error. retries: placements of a block whose worker was lost."""
        timer = Timer()
        client = resolve_client(client)
        check_placement(on)
        retries = check_int(retries, "retries", "a non-negative number of resubmissions of a lost block", minimum=0)
        A_h = sparse_operand(A, "A")
        B = None if balance is None else balance_operand(balance, A_h.shape[1])
        weights = row_weights(A_h, B)
        measure = "products" if B is not None else "nonzeros"
        if blocks is None and nblocks is None:
            nblocks = default_nblocks(len(client.nthreads()), int(weights.sum()), measure)
        rb = row_blocks(A_h, B, blocks=blocks, nblocks=nblocks, weights=weights)
        timer.lap("partition_s")
        source = MatrixSource(client, A_h, rb, on, retries)
        futures, records = source.place(range(len(rb)))
        timer.lap("place_s")
        timings = dict(timer.phases, total_s=sum(timer.phases.values()))
        if not keep_source:
            source = None
        return cls(A_h.shape, A_h.dtype, rb.bounds, [records[i] for i in range(len(rb))],
                   futures=[futures[i] for i in range(len(rb))], client=client, call=source, timings=timings,
                   lost_hint="; A was distributed with keep_source=False: distribute it again", rblocks=rb)

    # -- what it holds ---------------------------------------------------------------------------
    @property
    def nnz(self) -> int:
        return sum(int(info["nnz"]) for info in self._infos)

    @property
    def panel_plans(self) -> list:
        """Per (block, column panel of B): block, panel, rows, columns, the kernel its worker's plan
        chose and why, worker, products, nnz and the full Plan. B replicated whole: one panel per block."""
        out = []
        for info in self._infos:
            plans = info.get("panel_plans") or [info.get("plan")]
            recs = info.get("panels") or [dict(info, panel=0, cols=(0, self.shape[1]))]
            for rec, p in zip(recs, plans):
                out.append(dict(block=info["index"], panel=rec["panel"], rows=tuple(info["rows"]),
                                cols=tuple(rec["cols"]), kernel=rec.get("kernel"), reasons=rec.get("reasons"),
                                worker=rec.get("worker"), products=rec.get("products"), nnz=rec.get("nnz"),
                                check_worst=rec.get("check_worst"), plan=p))
        return out

    def bound_plans(self) -> list:
        """The plans kept on this matrix's blocks as an operand, per block and second operand (B's
        token, or SpMM's k): op, kernel, why, worker, bytes prepared and how long planning took."""
        if self._local is not None:
            return [p for b in self._local for p in block_plans(b)]
        self._alive()
        out, _ = collect(lambda i: self._client.submit(block_plans, self.future(i), pure=False),
                         list(range(len(self))), retries=0, what="bound_plans", describe=self._describe)
        return [p for i in range(len(self)) for p in out[i]]

    def explain(self) -> str:
        """A table of the blocks: rows, products, nnz, bytes, kernel, worker, and why each plan chose its kernel."""
        lines = [f"{self!r}", f"{'block':>5} {'rows':>21} {'products':>13} {'nnz':>12} {'bytes':>12}  kernel / worker"]
        for info in self._infos:
            r0, r1 = info["rows"]
            lines.append(f"{info['index']:>5} {f'{r0:,}-{r1:,}':>21} {info.get('products') or 0:>13,} "
                         f"{info['nnz']:>12,} {info['nbytes']:>12,}  {info.get('kernel')} on {info.get('worker')} "
                         f"({info.get('location')})")
            why = [r for r in info.get("reasons") or () if r.startswith(f"{info.get('kernel')}:")]
            if why:
                lines.append(f"{'':>6}{why[0]}")
            for rec in info.get("panels") or ():
                lines.append(f"{'':>6}panel {rec['panel']} (columns {rec['cols'][0]:,}-{rec['cols'][1]:,}): "
                             f"{rec['products']:,} products, {rec['nnz']:,} nnz, {rec['kernel']} on {rec['worker']}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        kernels = {}
        for info in self._infos:
            if info.get("kernel") is not None:
                kernels[info["kernel"]] = kernels.get(info["kernel"], 0) + 1
        where = (f"on {len({i.get('worker') for i in self._infos})} worker(s)" if self._futures is not None
                 else "in this process" if self._local is not None else "released")
        ks = ", ".join(f"{k} x{n}" for k, n in sorted(kernels.items(), key=lambda kv: -kv[1]))
        return (f"<DistributedCSR {self.shape[0]:,}x{self.shape[1]:,} {self.dtype}: {self.nnz:,} nonzeros "
                f"({self.nbytes:,} bytes) in {len(self)} row blocks {where}; "
                + (f"kernels {ks}>" if ks else f"resident, balanced by {self.rblocks.measure}>"))

    # -- getting blocks back ---------------------------------------------------------------------
    def to_scipy(self):
        """All of it as one SciPy CSR matrix (int64 indices past 2^31 - 1 nonzeros), block by block."""
        parts = self._map_blocks(block_host)
        if not parts:
            return sp.csr_matrix(self.shape, dtype=self.dtype)
        C = sp.vstack(parts, format="csr", dtype=self.dtype)
        if C.shape != self.shape:
            raise DistributedProductError(f"the blocks make a {C.shape} matrix, expected {self.shape}")
        return C

    def to_cupy(self):
        """All of it as one cupyx CSR matrix on the current GPU, where it fits: at most 2^31 - 1
        nonzeros (cupyx's int32 indices) and the GPU's free memory; otherwise a clear error
        (use blocks, ``to_scipy()`` or ``save(dir)``). Built on the host first."""
        cp = cupy_module()
        if cp is None:
            raise RuntimeError("to_cupy: needs CuPy and a GPU in this process (use to_scipy())")
        if self.nnz > CUPY_MAX_NNZ:
            raise MemoryError(f"to_cupy: C has {self.nnz:,} nonzeros, past a cupyx CSR's {CUPY_MAX_NNZ:,} "
                              "(int32 indices); use block(i), to_scipy() or save(dir)")
        free = int(cp.cuda.Device().mem_info[0])
        if self.nbytes > free:
            raise MemoryError(f"to_cupy: C takes {self.nbytes:,} bytes, the GPU has {free:,} free; "
                              "use block(i), to_scipy() or save(dir)")
        H = self.to_scipy()
        return cupyx_sparse().csr_matrix((cp.asarray(H.data), cp.asarray(H.indices.astype(np.int32)),
                                          cp.asarray(H.indptr.astype(np.int32))), shape=H.shape)

    # -- disk --------------------------------------------------------------------------------
    def save(self, folder, *, overwrite: bool = False) -> Path:
        """Write the matrix to ``folder`` as one .npz per block and index.json
        (:mod:`matplan.distributed.store`), one block in this process's memory at a time; returns
        the index's path."""
        folder = Path(folder)
        if (folder / INDEX).exists() and not overwrite:
            raise FileExistsError(f"dir: {folder} already holds a saved result (overwrite=True replaces it)")
        folder.mkdir(parents=True, exist_ok=True)
        records = []
        for i in range(len(self)):
            rec = write_block(folder, i, self.block(i))
            info = self._infos[i]
            rec.update(rows=list(info["rows"]), **{k: info.get(k) for k in BLOCK_FIELDS})
            records.append(rec)
        return write_index(folder, self.shape, self.dtype, self.bounds, records)


def load(folder, client=None) -> DistributedCSR:
    """A result saved by :meth:`DistributedCSR.save`: its blocks scattered to ``client``'s workers,
    or, without a client, held in this process. Every block's digest, shape and nnz are checked."""
    doc = read_index(folder)
    bounds = doc["bounds"]
    blocks, infos = [], []
    for i, rec in enumerate(doc["blocks"]):
        C = read_block(folder, doc, i)
        meta = {k: rec.get(k) for k in BLOCK_FIELDS}
        if isinstance(meta.get("reasons"), list):
            meta["reasons"] = tuple(meta["reasons"])
        blocks.append(Block(i, bounds[i], bounds[i + 1], C, None, meta))
        infos.append(dict(blocks[-1].info(), location="client" if client is None else "host", home=None))
    hint = "; a loaded result cannot recompute its blocks: load it again"
    if client is None:
        return DistributedCSR(doc["shape"], doc["dtype"], bounds, infos, local=blocks, lost_hint=hint)
    futures = client.scatter(blocks, hash=False) if blocks else []
    return DistributedCSR(doc["shape"], doc["dtype"], bounds, infos, futures=futures, client=client, lost_hint=hint)
