"""Spill to host: past a byte budget of GPU-resident C blocks, a worker moves its oldest ones to host memory.

Each worker process keeps one :class:`SpillRegistry` (weak references: a block Dask has released
leaves it by itself). When a new GPU block would take the resident total past the budget, the
least recently added blocks move to host memory (``block.to_host()``: a SciPy CSR replaces the
cupyx one in place, so the future that holds the block stays valid). Host blocks are the SciPy
path's from the start and never counted. Writing blocks to disk is :meth:`DistributedCSR.save`.
"""
from __future__ import annotations

import collections
import threading
import weakref


class SpillRegistry:
    """GPU blocks of one worker, oldest first, and the budget (bytes) they may take together."""

    def __init__(self):
        self._blocks = collections.OrderedDict()   # id -> weakref to a block
        self._lock = threading.Lock()

    def resident_bytes(self) -> int:
        """Bytes of the GPU blocks still alive and on the GPU."""
        with self._lock:
            return sum(b.device_nbytes for b in self._alive())

    def _alive(self) -> list:
        out = []
        for key, ref in list(self._blocks.items()):
            b = ref()
            if b is None or not b.device_nbytes:
                del self._blocks[key]
            else:
                out.append(b)
        return out

    def add(self, block, budget: int | None) -> list:
        """Register ``block`` (whose ``device_nbytes`` > 0 when on a GPU); move the oldest resident
        blocks, then ``block`` itself if need be, to host memory while the total exceeds ``budget``
        (None: no budget). Returns the blocks moved."""
        moved = []
        with self._lock:
            alive = self._alive()
            if block.device_nbytes:
                self._blocks[id(block)] = weakref.ref(block)
                alive.append(block)
            if budget is None:
                return moved
            total = sum(b.device_nbytes for b in alive)
            for b in alive:
                if total <= budget:
                    break
                total -= b.device_nbytes
                b.to_host()
                self._blocks.pop(id(b), None)
                moved.append(b)
        return moved


#: The registry of this process (a worker process, or the threads of an in-process cluster).
REGISTRY = SpillRegistry()
