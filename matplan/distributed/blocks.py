"""Row blocks of A balanced by work, not by rows: pure functions of row weights (no Dask here).

The work of a row of C = A @ B is its products (SpGEMM: the sum over A's row of B's row lengths,
RBSparse's nnz_RowCt) or its nonzeros (SpMM/SpMV: each nonzero reads one row of X). Cutting the
prefix sum of those weights at equal fractions of the total gives blocks of about equal work
whatever the row lengths; a hub row (weight at least the target per block) is given a block of
its own, so one giant row never drags its neighbours into a straggler.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from ..core.features import products_per_row
from ..core.validation import check_int
from ..core.xp import to_host


@dataclasses.dataclass(frozen=True)
class RowBlocks:
    """Row blocks [bounds[i], bounds[i + 1]) of an m-row matrix and the work of each.

    ``weights[i]`` is block i's products (SpGEMM) or nonzeros (SpMM/SpMV); ``measure`` names which."""
    bounds: tuple           # m + 1 boundaries' subset: 0 = bounds[0] <= ... <= bounds[-1] = m
    weights: tuple          # work per block
    measure: str = "rows"   # "products", "nonzeros" or "rows" (user-given bounds: rows only)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __iter__(self):
        return iter(zip(self.bounds[:-1], self.bounds[1:]))

    @property
    def rows(self) -> int:
        return self.bounds[-1]

    def imbalance(self) -> float:
        """Largest block's work over the mean (1.0: perfectly balanced; 0 blocks or no work: 1.0)."""
        w = np.asarray(self.weights, dtype=np.float64)
        return float(w.max() / w.mean()) if w.size and w.sum() > 0 else 1.0

    def __repr__(self) -> str:
        return (f"<RowBlocks {len(self)} blocks over {self.rows:,} rows by {self.measure}, "
                f"largest/mean {self.imbalance():.2f}>")


def row_weights(A, B=None):
    """Work per row of A (int64 NumPy): products per row of A @ B for a sparse B (SpGEMM),
    nonzeros per row for a dense B or none (SpMM/SpMV)."""
    if not hasattr(A, "indptr"):
        raise TypeError(f"A: expected a CSR matrix (SciPy or cupyx), got {type(A).__name__}")
    if B is not None and hasattr(B, "indptr"):
        if A.shape[1] != B.shape[0]:
            raise ValueError(f"A, B: A has {A.shape[1]} columns but B has {B.shape[0]} rows")
        return np.asarray(to_host(products_per_row(A, B)), dtype=np.int64)
    return np.diff(np.asarray(to_host(A.indptr), dtype=np.int64))


def balanced_bounds(weights, nblocks: int) -> np.ndarray:
    """Row boundaries (int64, from 0 to m) cutting rows of the given weights into about ``nblocks``
    blocks of equal total weight.

    Cut j sits at the row boundary whose prefix sum is nearest j * total / nblocks, so a block's
    weight is within the largest ordinary row's weight of the mean. Every row whose weight is at
    least the mean block weight (a hub) gets a block of its own, which can add a few blocks;
    boundaries that coincide collapse, so no block is empty (except the one block of an empty
    matrix). Without any weight (all rows empty) rows are cut evenly."""
    nblocks = check_int(nblocks, "nblocks", "a positive number of blocks")
    w = np.asarray(weights)
    if w.ndim != 1 or (w.size and (w.dtype.kind not in "iuf" or np.any(w < 0) or not np.all(np.isfinite(w)))):
        raise ValueError("weights: expected a 1-D array of finite non-negative work per row")
    m = int(w.size)
    if m == 0:
        return np.zeros(2, dtype=np.int64)
    w = w.astype(np.float64)
    total = float(w.sum())
    if total == 0:
        return np.unique(np.linspace(0, m, min(nblocks, m) + 1).round().astype(np.int64))
    prefix = np.concatenate([[0.0], np.cumsum(w)])
    target = total / nblocks
    goals = target * np.arange(1, nblocks)
    right = np.searchsorted(prefix, goals, side="left").clip(1, m)
    left = right - 1
    cuts = np.where(goals - prefix[left] <= prefix[right] - goals, left, right)
    hubs = np.flatnonzero(w >= target) if nblocks > 1 else np.zeros(0, dtype=np.int64)
    bounds = np.unique(np.concatenate([[0, m], cuts, hubs, hubs + 1]).astype(np.int64))
    return bounds


def block_weights(weights, bounds) -> tuple:
    """Total weight of each block [bounds[i], bounds[i + 1])."""
    prefix = np.concatenate([[0], np.cumsum(np.asarray(weights, dtype=np.int64))])
    b = np.asarray(bounds, dtype=np.int64)
    return tuple(int(x) for x in prefix[b[1:]] - prefix[b[:-1]])


def check_bounds(bounds, m: int) -> np.ndarray:
    """User-given boundaries as int64, or a ValueError: integers from 0 to m, non-decreasing
    (a repeated boundary is an empty block, allowed)."""
    b = np.asarray(bounds)
    if b.ndim != 1 or b.size < 2 or b.dtype.kind not in "iu":
        raise ValueError(f"blocks: expected row boundaries [0, ..., {m}] (integers, at least two), got {bounds!r}")
    b = b.astype(np.int64)
    if b[0] != 0 or b[-1] != m or np.any(np.diff(b) < 0):
        raise ValueError(f"blocks: row boundaries must start at 0, end at {m} (A's rows) and never decrease, "
                         f"got {b.tolist()[:8]}{'...' if b.size > 8 else ''}")
    return b


def row_blocks(A, B=None, *, blocks=None, nblocks: int | None = None, weights=None) -> RowBlocks:
    """The RowBlocks of a distributed product of A with B (see :func:`row_weights`).

    blocks: None (balance by work into ``nblocks``), a RowBlocks (kept as is), or a sequence of
    row boundaries [0, ..., m] chosen by the caller (empty blocks allowed). weights: row_weights(A,
    B) where the caller has them already."""
    m = A.shape[0]
    weights = row_weights(A, B) if weights is None else weights
    measure = "products" if B is not None and hasattr(B, "indptr") else "nonzeros"
    if isinstance(blocks, RowBlocks):
        if blocks.rows != m:
            raise ValueError(f"blocks: these RowBlocks cover {blocks.rows} rows, A has {m}")
        return blocks
    if blocks is not None:
        if nblocks is not None:
            raise ValueError("blocks, nblocks: give row boundaries or a number of blocks, not both")
        bounds = check_bounds(blocks, m)
    else:
        bounds = balanced_bounds(weights, 1 if nblocks is None else nblocks)
    return RowBlocks(tuple(int(x) for x in bounds), block_weights(weights, bounds), measure)


def slice_rows(A, r0: int, r1: int):
    """Rows [r0, r1) of CSR A as a CSR matrix of its own (SciPy or cupyx, as A)."""
    return A[r0:r1]


#: Blocks per worker by default: one (the fewest plans and launches a call; hubs add blocks of their own).
BLOCKS_PER_WORKER = 1
#: ... unless a worker's share of a SpGEMM exceeds this many products: then more, so no block's C can
#: pass a cupyx CSR's int32 indptr (products bound nnz(C); WordNet A·Aᵀ's 4 blocks of 3.6e9 did).
MAX_BLOCK_PRODUCTS = 2**31 - 1


def default_nblocks(workers: int, total_work: int, measure: str) -> int:
    """Blocks for ``workers`` workers: BLOCKS_PER_WORKER each, more where SpGEMM blocks (``measure``
    "products") would exceed MAX_BLOCK_PRODUCTS."""
    per = BLOCKS_PER_WORKER
    if measure == "products" and workers:
        per = max(per, -(-int(total_work) // (workers * MAX_BLOCK_PRODUCTS)))
    return max(1, workers * per)


def assign_blocks(weights, n_workers: int) -> list:
    """The worker (0 .. n_workers - 1) of each block: heaviest block first to the least loaded worker,
    so each worker's total work is balanced whatever the blocks' sizes (a hub's block among them)."""
    n_workers = check_int(n_workers, "n_workers", "a positive number of workers")
    load = [0] * n_workers
    count = [0] * n_workers
    out = [0] * len(weights)
    for i in sorted(range(len(weights)), key=lambda j: (-int(weights[j]), j)):
        w = min(range(n_workers), key=lambda k: (load[k], count[k], k))
        out[i] = w
        load[w] += int(weights[i])
        count[w] += 1
    return out
