"""B in column panels: when B does not fit one worker's budget, C = A @ B is computed panel by panel.

B's columns are cut into contiguous ranges balanced by nonzeros (the same cut as row blocks, on
column counts), each panel is scattered once (to one worker, not to all), each (row block, panel)
product is its own task planned on its worker and checked by row sums against that panel, and a
last task per row block concatenates its panels' columns (shifted by each panel's first column;
rows stay in panel order, so sorted panels give sorted rows) and checks the assembled block
against A_block @ (B @ 1) with the whole of B's row sums.
"""
from __future__ import annotations

import dataclasses
import math
import time
import types

import numpy as np
import scipy.sparse as sp

from ..core.features import products_per_row
from ..core.validation import check_int
from ..core.xp import array_module, cupyx_sparse, to_host
from .block_tasks import spill_register
from .blocks import balanced_bounds, check_bounds
from .checks import BlockCheckError, check_rowsums
from .worker import Block, Operand, sync, use_gpu, where, worker_address

#: Without ``panel_bytes``, B may take this fraction of the smallest worker memory limit Dask reports
#: (the rest holds A's blocks, C's blocks and the products' working memory).
PANEL_FRACTION = 0.25


@dataclasses.dataclass(frozen=True)
class ColumnPanels:
    """Column panels [bounds[p], bounds[p + 1]) of B, their nonzeros and CSR bytes, and why."""
    bounds: tuple
    nnz: tuple
    nbytes: tuple
    reason: str

    def __len__(self) -> int:
        return len(self.bounds) - 1


def csr_bytes(M) -> int:
    return int(M.data.nbytes + M.indices.nbytes + M.indptr.nbytes)


def default_panel_bytes(client, on: str = "auto") -> int | None:
    """PANEL_FRACTION of the smallest memory among the client's workers (None: none known): each
    worker's host ``memory_limit`` and, unless ``on`` is "host", its GPU's total memory where the
    worker reports one (Dask's NVML metrics, ``gpu-memory-total``), a GPU worker computing there."""
    limits = []
    for w in client.scheduler_info(n_workers=-1).get("workers", {}).values():
        mine = [int(w.get("memory_limit") or 0)]
        if on != "host":
            mine.append(int((w.get("metrics") or {}).get("gpu-memory-total") or 0))
        mine = [x for x in mine if x > 0]
        if mine:
            limits.append(min(mine))
    return int(PANEL_FRACTION * min(limits)) if limits else None


def slice_cols(B, c0: int, c1: int):
    """Columns [c0, c1) of host CSR B, indices shifted to start at 0; each row's order (and any
    duplicates) kept."""
    keep = (B.indices >= c0) & (B.indices < c1)
    counts = np.add.reduceat(keep.astype(np.int64), B.indptr[:-1]) if B.nnz else np.zeros(B.shape[0], np.int64)
    counts[np.diff(B.indptr) == 0] = 0   # reduceat gives the next row's first entry for an empty row
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(B.indptr.dtype)
    return type(B)((B.data[keep], (B.indices[keep] - c0).astype(B.indices.dtype), indptr),
                   shape=(B.shape[0], c1 - c0))


def column_panels(B, *, panels=None, panel_bytes: int | None = None) -> ColumnPanels:
    """How B is sent: one panel (replicated whole) when it fits ``panel_bytes`` or no budget is
    known; else ceil(nnz bytes / (budget - one panel's row pointers)) panels balanced by column
    nonzeros. ``panels``: a number of panels or column boundaries [0, ..., n] (empty panels allowed)."""
    n = B.shape[1]
    counts = np.bincount(np.asarray(B.indices, dtype=np.int64), minlength=n) if n else np.zeros(0, np.int64)
    if panels is not None:
        if isinstance(panels, (int, np.integer)) and not isinstance(panels, bool):
            bounds = balanced_bounds(counts, check_int(panels, "panels", "a positive number of column panels"))
            reason = f"panels={int(panels)} given"
        else:
            try:
                bounds = check_bounds(panels, n)
            except ValueError as e:
                raise ValueError(str(e).replace("blocks:", "panels:").replace("row boundaries", "column boundaries")
                                 .replace("A's rows", "B's columns")) from None
            reason = "column boundaries given"
    else:
        whole = csr_bytes(B)
        if panel_bytes is None or whole <= panel_bytes:
            bounds = np.array([0, n], dtype=np.int64)
            reason = (f"B ({whole:,} bytes) is replicated: " +
                      ("no worker memory limit is known" if panel_bytes is None else f"within {panel_bytes:,} bytes"))
        else:
            row_ptrs = B.indptr.nbytes
            if panel_bytes <= row_ptrs:
                raise ValueError(f"panel_bytes: {panel_bytes:,} bytes cannot hold a column panel of B, whose row "
                                 f"pointers alone take {row_ptrs:,}; give a larger budget")
            k = max(1, math.ceil((whole - row_ptrs) / (panel_bytes - row_ptrs)))
            bounds = balanced_bounds(counts, min(k, max(n, 1)))
            reason = f"B ({whole:,} bytes) exceeds {panel_bytes:,} bytes per worker: {len(bounds) - 1} column panels"
    prefix = np.concatenate([[0], np.cumsum(counts)])
    nnz = tuple(int(x) for x in prefix[bounds[1:]] - prefix[bounds[:-1]])
    per_nz = B.data.itemsize + B.indices.itemsize
    nbytes = tuple(int(z * per_nz + B.indptr.nbytes) for z in nnz)
    return ColumnPanels(tuple(int(x) for x in bounds), nnz, nbytes, reason)


def hstack_rows(parts, col_bounds, m: int, n: int):
    """One CSR m x n from CSR parts of columns [col_bounds[p], col_bounds[p + 1]) (SciPy or cupyx,
    all alike): row r is part 0's row r, then part 1's, ..., column indices shifted by each
    part's first column. Indices int32 where they fit (cupyx's only kind), else int64."""
    if not parts:
        return None
    xp = array_module(parts[0].data)
    counts = [xp.diff(P.indptr).astype(xp.int64) for P in parts]
    total = sum(counts) if counts else xp.zeros(m, dtype=xp.int64)
    indptr = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(total)])
    nnz = int(indptr[-1])
    idx_t = xp.int32 if max(nnz, n) <= np.iinfo(np.int32).max else xp.int64
    data = xp.empty(nnz, dtype=parts[0].data.dtype)
    indices = xp.empty(nnz, dtype=idx_t)
    before = xp.zeros(m, dtype=xp.int64)   # entries of earlier panels in each row
    for P, c, c0 in zip(parts, counts, col_bounds):
        if P.nnz:
            # each entry's row (searchsorted, not repeat: CuPy's repeat takes no device array of counts)
            row = xp.searchsorted(P.indptr[1:].astype(xp.int64), xp.arange(P.nnz, dtype=xp.int64), side="right")
            pos = xp.arange(P.nnz, dtype=xp.int64) - P.indptr[row].astype(xp.int64)
            dest = indptr[row] + before[row] + pos
            data[dest] = P.data
            indices[dest] = P.indices.astype(idx_t) + c0
        before += c
    cls = cupyx_sparse().csr_matrix if xp is not np else type(to_host(parts[0]))
    return cls((data, indices, indptr.astype(idx_t)), shape=(m, n))


class Whole:
    """What the assembled check needs of B where B is in panels: its row pointers and row sums."""

    def __init__(self, B, rowsums):
        self.operand = Operand(np.asarray(B.indptr), rowsums)
        self.n = B.shape[1]


def assemble_block(index: int, r0: int, r1: int, A_block, whole: Whole, col_bounds, on: str, spill_bytes,
                   *panels) -> Block:
    """Row block ``index`` of C from its panel blocks (one per non-empty panel, in column order, or
    None for a zero-width panel), checked against A_block @ (B @ 1) before it counts."""
    gpu = use_gpu(on)
    t0 = time.perf_counter()
    indptr, rowsums = whole.operand.placed(gpu)
    A = A_block.matrix(gpu) if isinstance(A_block, Block) else where(A_block, gpu)
    live = [(p, b) for p, b in enumerate(panels) if b is not None]
    parts = [b.matrix(gpu) for _, b in live]
    C = hstack_rows(parts, [col_bounds[p] for p, _ in live], r1 - r0, whole.n)
    if C is None:   # every panel is zero-width: B has no columns
        C = (cupyx_sparse() if gpu else sp).csr_matrix((r1 - r0, whole.n), dtype=A.dtype)
    dtype = live[0][1].plan.features.dtype if live else np.dtype(C.dtype)
    products = products_per_row(A, types.SimpleNamespace(indptr=indptr))
    ok, worst = check_rowsums(A, C, rowsums, products, dtype)
    sync(gpu)
    t1 = time.perf_counter()
    if not ok:
        raise BlockCheckError(f"block {index} (rows {r0}-{r1}): the row sums of its assembled panels differ from "
                              f"A @ (B @ 1) by {worst:.3g}x the rounding tolerance (on {worker_address()})")
    records = [dict(b.meta, panel=p, cols=(col_bounds[p], col_bounds[p + 1]), nnz=int(b.C.nnz)) for p, b in live]
    kernels = sorted({r["kernel"] for r in records})
    main = max(live, key=lambda pb: pb[1].meta["products"])[1] if live else None
    sums = {k: sum(r[k] for r in records) for k in ("place_s", "plan_s", "kernel_s", "check_s")}
    meta = dict(index=index, rows=(r0, r1), kernel="+".join(kernels) or None,
                reasons=tuple(main.meta["reasons"]) if main else (), backend=main.meta["backend"] if main else None,
                device=main.meta["device"] if main else None, worker=worker_address(),
                products=sum(r["products"] for r in records), check_worst=worst, assemble_s=t1 - t0,
                panels=[{k: v for k, v in r.items() if k != "index"} for r in records], **sums)
    meta["check_s"] += t1 - t0   # assembling and the whole block's check count as checking
    block = Block(index, r0, r1, C, main.plan if main else None, meta, panel_plans=[b.plan for _, b in live])
    spill_register(block, spill_bytes)
    return block
