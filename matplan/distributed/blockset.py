"""What the distributed matrices share: row blocks on a Dask cluster, one future each, and the
client's record of each block; blocks lost with their workers are computed again, where the
object knows how, when they are read or used.

:class:`~matplan.distributed.csr.DistributedCSR` (sparse rows: an operand made resident, or
SpGEMM's C) and :class:`~matplan.distributed.dense.DistributedDense` (dense rows: SpMM's Y) are
built on :class:`BlockSet`. ``source`` is what rebuilds a block (``source.recompute(i) ->
(future, record)``): the product call that made it, or the host matrix it was cut from; without
one a lost block is a clear error.

A block's handle is a Dask future (the task path) or a :class:`~matplan.distributed.fastpath.Held`
reference to a block a runner keeps (the runner path: :mod:`matplan.distributed.fastpath`). Both
read the same way; a held block used as the input of a task is first turned into a future on its
worker (:func:`~matplan.distributed.runner.held_block`, no copy), and held blocks are freed on
``release()`` or when the object is garbage collected.
"""
from __future__ import annotations

import itertools
import weakref
from concurrent.futures import CancelledError

import numpy as np

from .fastpath import Fallback, Held, apply_held, release_held
from .runner import HeldBlockLost, held_block
from .tasks import DistributedProductError
from .worker import block_host, block_location

#: A future in one of these states still holds (or will hold) its block.
ALIVE = ("finished", "pending")


class BlockSet:
    """Row blocks [bounds[i], bounds[i + 1]) of an m-row matrix: handles of worker Blocks (Dask
    futures, or Held references to blocks kept by runners; loaded without a client, the blocks
    themselves in this process) and one record per block."""

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
        self._promoted = {}           # block -> future of a held block, for tasks that read it
        self._serial = itertools.count()
        self._finalizer = None
        if self._futures is not None and any(isinstance(h, Held) for h in self._futures):
            # the handle list itself, not self: held blocks are freed when this object goes
            self._finalizer = weakref.finalize(self, release_held, client, self._futures)
            self._finalizer.atexit = False

    @property
    def path(self) -> str:
        """How the call that made it ran: "runner" where every block's record says so, else "tasks"."""
        return "runner" if self._infos and all(i.get("path") == "runner" for i in self._infos) else "tasks"

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
            self.refresh_workers()
        return [{k: v for k, v in info.items() if k not in ("plan", "panel_plans", "home")} for info in self._infos]

    def refresh_workers(self) -> None:
        """Ask the cluster which worker holds each block that is a future (Dask may have computed a
        lost block again elsewhere); held blocks stay with their runner's worker."""
        futures = [h for h in self._futures or () if not isinstance(h, Held) and h.status == "finished"]
        if not futures:
            return
        holders = self._client.who_has(futures)
        for i, h in enumerate(self._futures):
            if not isinstance(h, Held) and h.status == "finished" and holders.get(h.key):
                self._infos[i]["worker"] = holders[h.key][0]
                self._infos[i].pop("home", None)

    def refs(self) -> list:
        """Per block (worker, reference) by which a runner finds it in its worker's memory:
        ("held", token) or ("data", Dask key); Fallback where one is not in memory on a known worker."""
        if self._local is not None:
            raise Fallback(f"this {self.what} is held in this process, not on the workers")
        hints, out = self.workers(), []
        for i, h in enumerate(self._alive()):
            if isinstance(h, Held):
                out.append((h.worker, ("held", h.token)))
            elif hints[i] is None or h.status != "finished":
                raise Fallback(f"{self._describe(i)} is not in memory on a known worker")
            else:
                out.append((hints[i], ("data", h.key)))
        return out

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

    def handles(self) -> list:
        """Each block's handle: a Dask future, or a Held reference to a runner's block."""
        return list(self._alive())

    def future(self, i: int):
        """Block i's future, computed again first where its worker was lost (a clear error where
        this object cannot do that). A held block becomes a future on its worker (no copy); one
        found lost there is computed again."""
        f = self._alive()[i]
        if isinstance(f, Held):
            return self._promote(i, f)
        return f if f.status in ALIVE else self._recompute(i)

    def _promote(self, i: int, h: Held):
        f = self._promoted.get(i)
        if f is not None and f.status in ALIVE:
            return f
        if f is not None:   # the held block was not there: lost with its worker
            return self._recompute(i, f.exception() if f.status == "error" else None)
        f = self._promoted[i] = self._client.submit(held_block, h.runner, h.token, pure=False,
                                                    key=f"{h.token}-held-{next(self._serial)}",
                                                    workers=[h.worker], allow_other_workers=True)
        return f

    def _recompute(self, i: int, cause=None):
        if self._source is None:
            raise DistributedProductError(f"{self._describe(i)} was lost with its worker and cannot be computed "
                                          f"again{self._lost_hint}") from cause
        future, info = self._source.recompute(i)
        old, promoted = self._futures[i], self._promoted.pop(i, None)
        if isinstance(old, Held):
            release_held(self._client, [old])
        if promoted is not None:
            promoted.release()
        self._futures[i] = future
        self._infos[i] = info
        return future

    def _on_block(self, i: int, fn):
        """``fn(block i)`` where the block lives (on its worker: only the result travels), the block
        computed again first if its worker was lost (where this object knows how)."""
        if self._local is not None:
            return fn(self._local[i])
        h = self._alive()[i]
        if isinstance(h, Held):
            got = apply_held(self._client, {i: h}, fn)[i]
            if not isinstance(got, HeldBlockLost):
                return got
            return self._client.submit(fn, self._recompute(i, got), pure=False).result()
        try:
            return self._client.submit(fn, self.future(i), pure=False).result()
        except CancelledError as e:
            return self._client.submit(fn, self._recompute(i, e), pure=False).result()

    def _map_blocks(self, fn) -> list:
        """``fn(block)`` for every block, in order: held blocks one call per runner, the runners at
        once; the others (and held blocks found lost, computed again first) one by one."""
        if self._local is not None:
            return [fn(b) for b in self._local]
        held = {i: h for i, h in enumerate(self._alive()) if isinstance(h, Held)}
        got = apply_held(self._client, held, fn) if held else {}
        return [got[i] if i in got and not isinstance(got[i], HeldBlockLost) else self._on_block(i, fn)
                for i in range(len(self))]

    def block(self, i: int):
        """Rows [bounds[i], bounds[i + 1]) as a SciPy CSR matrix (sparse) or NumPy array (dense)."""
        return self._on_block(self._index(i), block_host)

    def release(self) -> None:
        """Let the cluster free the blocks now (they are freed anyway when this object is)."""
        for f in list(self._futures or ()) + list(self._promoted.values()):
            if not isinstance(f, Held):
                f.release()
        if self._finalizer is not None:
            self._finalizer()   # frees the held blocks once
        self._futures, self._source, self._promoted = None, None, {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
