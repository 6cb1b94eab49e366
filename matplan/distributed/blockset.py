"""What the distributed matrices share: row blocks on a Dask cluster, one future each, and the
client's record of each block; blocks lost with their workers are computed again, where the
object knows how, when they are read or used.

:class:`~matplan.distributed.csr.DistributedCSR` (sparse rows: an operand made resident, or
SpGEMM's C) and :class:`~matplan.distributed.dense.DistributedDense` (dense rows: SpMM's Y) are
built on :class:`BlockSet`. ``source`` is what rebuilds a block (``source.recompute(i) ->
(future, record)``): the product call that made it, or the host matrix it was cut from; without
one a lost block is a clear error.
"""
from __future__ import annotations

from concurrent.futures import CancelledError

import numpy as np

from .tasks import DistributedProductError
from .worker import block_host, block_location

#: A future in one of these states still holds (or will hold) its block.
ALIVE = ("finished", "pending")


class BlockSet:
    """Row blocks [bounds[i], bounds[i + 1]) of an m-row matrix: futures of worker Blocks (or, loaded
    without a client, the blocks themselves in this process) and one record per block."""

    #: What the class is called in messages.
    what = "matrix"

    def __init__(self, shape, dtype, bounds, infos, *, futures=None, local=None, client=None, source=None,
                 timings=None, lost_hint: str = ""):
        self.shape = tuple(int(x) for x in shape)
        self.dtype = np.dtype(dtype)
        self.bounds = tuple(int(b) for b in bounds)
        self._infos = list(infos)
        self._futures = None if futures is None else list(futures)
        self._local = None if local is None else list(local)
        self._client, self._source = client, source
        self.timings = dict(timings or {})
        self._lost_hint = lost_hint   # why a lost block cannot be rebuilt, and what to do

    # -- what it holds ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.bounds) - 1

    @property
    def nblocks(self) -> int:
        return len(self)

    @property
    def client(self):
        return self._client

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks (data, indices, indptr) wherever they are."""
        return sum(int(info["nbytes"]) for info in self._infos)

    @property
    def plans(self) -> list:
        """Per block: index, rows, the kernel its worker's plan chose and why, worker and device."""
        keys = ("index", "rows", "kernel", "reasons", "worker", "device", "backend", "products")
        return [{k: info.get(k) for k in keys} for info in self._infos]

    def plan(self, i: int):
        """Block i's full :class:`matplan.planner.Plan` (None where no plan made it)."""
        return self._infos[self._index(i)].get("plan")

    def blocks_info(self, refresh: bool = False) -> list:
        """Per block: rows, nnz, bytes, location ("gpu", "host" after a spill, "client" when loaded
        without a client), kernel, worker and timings; ``refresh`` asks the cluster now where each
        block is and on which worker (Dask may have computed a lost block again elsewhere)."""
        if refresh and self._futures is not None:
            for i in range(len(self)):
                self._infos[i].update(location=self._on_block(i, block_location))
            held = self._client.who_has(self._futures)
            for i, f in enumerate(self._futures):
                if held.get(f.key):
                    self._infos[i]["worker"] = held[f.key][0]
        return [{k: v for k, v in info.items() if k not in ("plan", "panel_plans", "home")} for info in self._infos]

    def workers(self) -> list:
        """The worker of each block, as last recorded (a hint for placing the tasks that use it;
        None where unknown, as for a loaded result)."""
        return [info.get("home", info.get("worker")) for info in self._infos]

    # -- blocks ----------------------------------------------------------------------------------
    def _index(self, i) -> int:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) or not -len(self) <= i < len(self):
            raise IndexError(f"i: expected a block index in [0, {len(self)}), got {i!r}")
        return int(i) % len(self)

    def _describe(self, i: int) -> str:
        return f"block {i} (rows {self.bounds[i]}-{self.bounds[i + 1]}) of this {self.what}"

    def _alive(self):
        if self._futures is None:
            raise DistributedProductError(f"this {type(self).__name__} was released")
        return self._futures

    def future(self, i: int):
        """Block i's future, computed again first where its worker was lost (a clear error where
        this object cannot do that)."""
        f = self._alive()[i]
        return f if f.status in ALIVE else self._recompute(i)

    def _recompute(self, i: int, cause=None):
        if self._source is None:
            raise DistributedProductError(f"{self._describe(i)} was lost with its worker and cannot be computed "
                                          f"again{self._lost_hint}") from cause
        future, info = self._source.recompute(i)
        self._futures[i] = future
        self._infos[i] = info
        return future

    def _on_block(self, i: int, fn):
        """``fn(block i)`` where the block lives (on its worker: only the result travels), the block
        computed again first if its worker was lost (where this object knows how)."""
        if self._local is not None:
            return fn(self._local[i])
        try:
            return self._client.submit(fn, self.future(i), pure=False).result()
        except CancelledError as e:
            return self._client.submit(fn, self._recompute(i, e), pure=False).result()

    def block(self, i: int):
        """Rows [bounds[i], bounds[i + 1]) as a SciPy CSR matrix (sparse) or NumPy array (dense)."""
        return self._on_block(self._index(i), block_host)

    def release(self) -> None:
        """Let the cluster free the blocks now (they are freed anyway when this object is)."""
        for f in self._futures or ():
            f.release()
        self._futures, self._source = None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
