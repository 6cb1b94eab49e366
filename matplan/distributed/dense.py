"""DistributedDense: a dense m x k result (SpMM's Y = A @ X, or a vector) kept as row blocks on the
workers that computed them, so an iterative method or a pipeline need not bring it back.

``gather()`` stacks the blocks on the client (NumPy), ``to_cupy()`` on the client's GPU,
``block(i)`` brings one back; passed as X to :func:`~matplan.distributed.spmm` or a
:class:`~matplan.distributed.DistributedOperator`, each worker assembles X from the blocks (its
own where they are, the others sent by their workers) and nothing goes through the client. A block
lost with its worker is computed again by the call that made it.
"""
from __future__ import annotations

import numpy as np

from ..core.xp import cupy_module
from .blockset import BlockSet
from .tasks import DistributedProductError
from .worker import block_host


class DistributedDense(BlockSet):
    """Row blocks of a dense result on a Dask cluster: ``shape``, ``dtype``, ``bounds``, ``plans``
    (the kernel each block's plan chose, and why), ``blocks_info()``, ``timings`` of the call that
    made it, ``gather()`` / ``to_numpy()``, ``to_cupy()``, ``block(i)``, ``release()``."""

    what = "result"

    def gather(self) -> np.ndarray:
        """All rows as one NumPy array, block by block."""
        parts = self._map_blocks(block_host)
        if not parts:
            return np.zeros(self.shape, dtype=self.dtype)
        Y = np.concatenate(parts).astype(self.dtype, copy=False)
        if Y.shape != self.shape:
            raise DistributedProductError(f"the blocks make a result of shape {Y.shape}, expected {self.shape}")
        return Y

    to_numpy = gather

    def to_cupy(self):
        """All rows as one CuPy array on the current GPU (built from the blocks gathered to the host)."""
        cp = cupy_module()
        if cp is None:
            raise RuntimeError("to_cupy: needs CuPy and a GPU in this process (use gather())")
        return cp.asarray(self.gather())

    def __repr__(self) -> str:
        kernels = sorted({info.get("kernel") for info in self._infos if info.get("kernel")})
        where = f"on {len({i.get('worker') for i in self._infos})} worker(s)" if self._futures is not None \
            else "released"
        return (f"<DistributedDense {'x'.join(f'{d:,}' for d in self.shape)} {self.dtype} in {len(self)} row blocks "
                f"{where}; kernels {', '.join(kernels) or 'none'}>")
