"""matplan on Dask: products over row blocks of A spread on a cluster, each block planned on its worker.

Needs the ``distributed`` extra (``pip install matplan[distributed]``; ``cuda-distributed`` adds
dask-cuda for one worker per GPU). ``import matplan`` never imports this package or Dask.

    local_cluster()          one worker process per GPU (dask-cuda or Nanny workers) or a CPU LocalCluster
    DistributedCSR.from_matrix(A)   A's row blocks made resident on the workers' GPUs, once
    replicate(B)             B (or a dense X) sent once to every worker and kept there
    spgemm(A, B, client=)    C = A @ B as a DistributedCSR of checked row blocks (A, B host or resident)
    spmm(A, X, client=)      A @ X over row blocks (X host: Y gathered; X resident: Y a DistributedDense)
    DistributedOperator(A)   A's blocks and bound plans kept on the workers between calls
    row_blocks, balanced_bounds, row_weights   blocks balanced by products / nonzeros
    load(dir)                a DistributedCSR saved by .save(dir)

blocks.py the partition (pure), worker.py what lives on a worker, block_tasks.py what a block
task runs, checks.py the row-sum check, panels.py B in column panels, spill.py the GPU byte
budget, tasks.py submission and recovery, runner.py / fastpath.py the runner path (one message
per worker for a steady call on resident operands), blockset.py / csr.py / dense.py the distributed
matrices, replicated.py operands on every worker, store.py the on-disk format, spgemm.py and
operators.py the products, cluster.py the local cluster.
See docs/distributed.md.
"""
try:
    import distributed as _distributed   # noqa: F401  (the optional extra: fail here, clearly)
    from dask.sizeof import sizeof as _sizeof
except ImportError as e:   # pragma: no cover - exercised only without the extra
    raise ImportError("matplan.distributed needs Dask: pip install 'matplan[distributed]'") from e

from .blocks import RowBlocks, balanced_bounds, row_blocks, row_weights
from .checks import BlockCheckError
from .cluster import LocalMatplanCluster, local_cluster
from .csr import DistributedCSR, load
from .dense import DistributedDense
from .fastpath import Held
from .operators import DistributedOperator, spmm
from .replicated import Replicated, replicate
from .spgemm import spgemm
from .tasks import DistributedProductError
from .worker import Block, Operand


# Dask places a task where its inputs' bytes are and spills by size: tell it what these objects hold.
@_sizeof.register(Block)
def _sizeof_block(b):
    return b.nbytes + 1024


@_sizeof.register(Operand)
def _sizeof_operand(o):
    return o.nbytes + 1024


__all__ = ["local_cluster", "LocalMatplanCluster", "spgemm", "spmm", "DistributedOperator", "DistributedCSR",
           "DistributedDense", "Replicated", "replicate", "load", "RowBlocks", "row_blocks", "row_weights",
           "balanced_bounds", "BlockCheckError", "Held",
           "DistributedProductError"]
