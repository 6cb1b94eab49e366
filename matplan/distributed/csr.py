"""DistributedCSR: C = A @ B kept as CSR row blocks where they were computed.

Each block is a Dask future of a worker-side :class:`~matplan.distributed.worker.Block` (C's rows
on the worker's GPU or host, and the plan that made them); the client holds only each block's
record: rows, nonzeros, bytes, kernel and the plan's reasons, worker, timings. Blocks come back
to the client one at a time (``block(i)``, ``to_scipy()``, ``save(dir)``), always as host data.
A block whose worker died after the product is computed again from A and B (the client still
holds them) where the product's call is known; a loaded result cannot recompute and says so.
"""
from __future__ import annotations

from concurrent.futures import CancelledError
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..core.xp import cupy_module, cupyx_sparse
from .store import BLOCK_FIELDS, INDEX, read_block, read_index, write_block, write_index
from .tasks import DistributedProductError
from .worker import Block, block_host, block_location

#: Largest nnz of one cupyx CSR (its indices are int32).
CUPY_MAX_NNZ = 2**31 - 1


class DistributedCSR:
    """Row blocks of an m x n CSR matrix on a Dask cluster (or, loaded without a client, in this process).

    ``plans``: per block, the kernel chosen on its worker and the plan's reasons; ``blocks_info()``:
    rows, nnz, bytes and where each block lives; ``timings``: where the call's time went. A result
    of ``spgemm`` keeps references to A and B (no copies) to recompute blocks lost with a worker;
    ``release()`` lets them and the blocks go."""

    def __init__(self, shape, dtype, bounds, infos, *, futures=None, local=None, client=None, call=None,
                 timings=None, panels=None):
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype = np.dtype(dtype)
        self.bounds = tuple(int(b) for b in bounds)
        self._infos = list(infos)
        self._futures = None if futures is None else list(futures)
        self._local = None if local is None else list(local)
        self._client, self._call = client, call
        self.timings = dict(timings or {})
        self.panels = panels   # B's ColumnPanels (None: a loaded result)

    # -- what it holds ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.bounds) - 1

    @property
    def nblocks(self) -> int:
        return len(self)

    @property
    def nnz(self) -> int:
        return sum(int(info["nnz"]) for info in self._infos)

    @property
    def nbytes(self) -> int:
        """Bytes of C's blocks (data, indices, indptr) wherever they are."""
        return sum(int(info["nbytes"]) for info in self._infos)

    @property
    def plans(self) -> list:
        """Per block: index, rows, the kernel its worker's plan chose and why, worker and device."""
        keys = ("index", "rows", "kernel", "reasons", "worker", "device", "backend", "products")
        return [{k: info.get(k) for k in keys} for info in self._infos]

    def plan(self, i: int):
        """Block i's full :class:`matplan.planner.Plan` (None for a loaded result)."""
        return self._infos[self._index(i)].get("plan")

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

    def blocks_info(self, refresh: bool = False) -> list:
        """Per block: rows, nnz, bytes, location ("gpu", "host" after a spill, "client" when loaded
        without a client), kernel, worker and timings; ``refresh`` asks the workers for locations now."""
        if refresh and self._futures is not None:
            for i in range(len(self)):
                self._infos[i].update(location=self._on_block(i, block_location))
        return [{k: v for k, v in info.items() if k not in ("plan", "panel_plans")} for info in self._infos]

    def explain(self) -> str:
        """A table of the blocks: rows, products, nnz, bytes, kernel, worker, and why each plan chose its kernel."""
        lines = [f"{self!r}", f"{'block':>5} {'rows':>21} {'products':>13} {'nnz':>12} {'bytes':>12}  kernel / worker"]
        for info in self._infos:
            r0, r1 = info["rows"]
            lines.append(f"{info['index']:>5} {f'{r0:,}-{r1:,}':>21} {info.get('products', 0):>13,} {info['nnz']:>12,} "
                         f"{info['nbytes']:>12,}  {info.get('kernel')} on {info.get('worker')} "
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
            kernels[info.get("kernel")] = kernels.get(info.get("kernel"), 0) + 1
        where = (f"on {len({i.get('worker') for i in self._infos})} worker(s)" if self._futures is not None
                 else "in this process")
        ks = ", ".join(f"{k} x{n}" for k, n in sorted(kernels.items(), key=lambda kv: -kv[1]))
        return (f"<DistributedCSR {self.shape[0]:,}x{self.shape[1]:,} {self.dtype}: {self.nnz:,} nonzeros "
                f"({self.nbytes:,} bytes) in {len(self)} row blocks {where}; kernels {ks or 'none'}>")

    # -- getting blocks back ---------------------------------------------------------------------
    def _index(self, i) -> int:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) or not -len(self) <= i < len(self):
            raise IndexError(f"i: expected a block index in [0, {len(self)}), got {i!r}")
        return int(i) % len(self)

    def _on_block(self, i: int, fn):
        """``fn(block i)`` where the block lives (on its worker: only the result travels), the block
        computed again first if its worker was lost (where the call is known)."""
        if self._local is not None:
            return fn(self._local[i])
        if self._futures is None:
            raise DistributedProductError("this DistributedCSR was released")
        try:
            return self._client.submit(fn, self._futures[i], pure=False).result()
        except CancelledError as e:
            if self._call is None:
                raise DistributedProductError(f"block {i} (rows {self.bounds[i]}-{self.bounds[i + 1]}) was lost "
                                              "with its worker and this result cannot recompute it") from e
            future, info = self._call.recompute(i)
            self._futures[i] = future
            self._infos[i] = info
            return self._client.submit(fn, future, pure=False).result()

    def block(self, i: int):
        """Rows [bounds[i], bounds[i + 1]) of C as a SciPy CSR matrix."""
        return self._on_block(self._index(i), block_host)

    def to_scipy(self):
        """All of C as one SciPy CSR matrix (int64 indices past 2^31 - 1 nonzeros), block by block."""
        parts = [self.block(i) for i in range(len(self))]
        if not parts:
            return sp.csr_matrix(self.shape, dtype=self.dtype)
        C = sp.vstack(parts, format="csr", dtype=self.dtype)
        if C.shape != self.shape:
            raise DistributedProductError(f"the blocks make a {C.shape} matrix, expected {self.shape}")
        return C

    def to_cupy(self):
        """All of C as one cupyx CSR matrix on the current GPU, where it fits: at most 2^31 - 1
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
        """Write C to ``folder`` as one .npz per block and index.json (:mod:`matplan.distributed.store`),
        one block in this process's memory at a time; returns the index's path."""
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

    def release(self) -> None:
        """Let the cluster free the blocks now (they are freed anyway when this object is)."""
        for f in self._futures or ():
            f.release()
        self._futures, self._call = None, None


def load(folder, client=None) -> DistributedCSR:
    """A result saved by :meth:`DistributedCSR.save`: its blocks scattered to ``client``'s workers,
    or, without a client, held in this process. Every block's digest, shape and nnz are checked."""
    doc = read_index(folder)
    bounds = doc["bounds"]
    blocks, infos = [], []
    for i, rec in enumerate(doc["blocks"]):
        C = read_block(folder, doc, i)
        meta = dict(index=i, rows=(bounds[i], bounds[i + 1]), **{k: rec.get(k) for k in BLOCK_FIELDS})
        if isinstance(meta.get("reasons"), list):
            meta["reasons"] = tuple(meta["reasons"])
        blocks.append(Block(i, bounds[i], bounds[i + 1], C, None, meta))
        infos.append(dict(meta, nnz=int(C.nnz), nbytes=blocks[-1].nbytes,
                          location="client" if client is None else "host"))
    if client is None:
        return DistributedCSR(doc["shape"], doc["dtype"], bounds, infos, local=blocks)
    futures = client.scatter(blocks, hash=False) if blocks else []
    return DistributedCSR(doc["shape"], doc["dtype"], bounds, infos, futures=futures, client=client)
