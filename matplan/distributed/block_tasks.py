"""The product tasks a worker runs on one row block: SpGEMM (planned, run, checked by row sums)
and SpMM/SpMV, and the assembly of a distributed X on the worker that needs all of it.

Each is a pure function of its arguments (a block of C is recomputable from its block of A and
B), which is what lets the client resubmit a block whose worker was lost. Where the row block of
A is a resident :class:`~matplan.distributed.worker.Block`, what depends only on the pair (the
plan, bound where binding converts A; the row-sum check's reference sums) is made on the first
product and kept on the block: a repeated product plans nothing.
"""
from __future__ import annotations

import time

import numpy as np

from ..core.features import products_per_row, products_sampled
from ..core.xp import array_module, to_host
from ..planner import plan as make_plan
from .checks import BlockCheckError, RowCheck
from .spill import REGISTRY
from .worker import SPILL_FRACTION, Block, Operand, gpu_total_bytes, sync, use_gpu, where, worker_address


def _matrix(a, gpu: bool):
    """Operand ``a`` (a resident Block, or rows scattered as a SciPy matrix) where this worker computes."""
    return a.matrix(gpu) if isinstance(a, Block) else where(a, gpu)


def _cached(a, key, make) -> tuple:
    """(value, seconds, made now): kept on a resident block ``a``, made each time for anything else."""
    if isinstance(a, Block):
        return a.bound(key, make)
    t = time.perf_counter()
    value = make()
    return value, time.perf_counter() - t, True


def spill_register(block: Block, spill_bytes) -> None:
    """Count a new GPU block of C against this worker's budget (the oldest move to host memory past it)."""
    if block.device_nbytes:
        REGISTRY.add(block, spill_bytes if spill_bytes is not None else int(SPILL_FRACTION * gpu_total_bytes()))


def spgemm_block(index: int, r0: int, r1: int, a, B: Operand, on: str, measure, spill_bytes,
                 panel: str = "") -> Block:
    """C[r0:r1] = A[r0:r1] @ B, planned here with this worker's statistics, then checked by row sums;
    a failed check raises BlockCheckError (the block does not count). ``a``: the rows of A (a
    resident Block keeps the plan and the check's reference for B, by B's token); ``panel`` names
    B's column panel in messages where B is one."""
    gpu = use_gpu(on)
    t0 = time.perf_counter()
    Bv, rowsums = B.placed(gpu)
    A = _matrix(a, gpu)
    sync(gpu)
    t1 = time.perf_counter()

    def make():   # the client validated A and B once: no structure checks per block
        p = make_plan(A, Bv, measure=measure, check=False)
        rowct = products_per_row(A, Bv)
        products = int(rowct.sum()) if products_sampled(p.features) else int(p.features.products)
        return p, RowCheck(A, rowsums, rowct, p.features.dtype), products
    (p, check, products), plan_s, planned = _cached(a, ("spgemm", B.token, gpu, str(measure)), make)
    C = p.run(A, Bv, check=False)
    sync(gpu)
    t3 = time.perf_counter()
    ok, worst = check.verify(C)
    t4 = time.perf_counter()
    if not ok:
        raise BlockCheckError(f"block {index} (rows {r0}-{r1}){panel}: the row sums of C differ from A @ (B @ 1) "
                              f"by {worst:.3g}x the rounding tolerance (kernel {p.kernel} on {worker_address()})")
    plan_s = plan_s if planned else 0.0
    meta = dict(kernel=p.kernel, reasons=tuple(p.reasons), backend=p.backend, device=p.device,
                worker=worker_address(), products=products, planned=planned,
                place_s=t1 - t0, plan_s=plan_s, kernel_s=t3 - t1 - plan_s, check_s=t4 - t3, check_worst=worst)
    block = Block(index, r0, r1, C, p, meta)
    spill_register(block, spill_bytes)
    return block


def spmm_block(a: Block, X: Operand, on: str, reuse: int, measure, keep: bool):
    """Y = A_block @ X with the block's own plan, bound to it (planned on first use of each shape
    and dtype of X). ``keep``: Y stays here as a Block (a row block of a distributed result);
    otherwise (Y on the host, the call's record) for the client to gather."""
    gpu = use_gpu(on)
    t0 = time.perf_counter()
    Xv, _ = X.placed(gpu)
    A = a.matrix(gpu)
    sync(gpu)
    t1 = time.perf_counter()
    k = 1 if Xv.ndim == 1 else Xv.shape[1]
    key = ("spmm", k, np.dtype(Xv.dtype).str, gpu, reuse, str(measure))
    (bound,), plan_s, planned = a.bound(key, lambda: (make_plan(A, Xv, reuse=reuse, measure=measure, check=False)
                                                      .bind(A, check=False),))
    Y = bound(Xv)
    sync(gpu)
    t2 = time.perf_counter()
    plan_s = plan_s if planned else 0.0
    p = bound.plan
    meta = dict(kernel=p.kernel, reasons=tuple(p.reasons), backend=p.backend, device=p.device,
                worker=worker_address(), planned=planned, place_s=t1 - t0, plan_s=plan_s,
                kernel_s=t2 - t1 - plan_s)
    if keep:
        return Block(a.index, a.r0, a.r1, Y, p, meta)
    Y = to_host(Y)
    return Y, dict(meta, index=a.index, rows=(a.r0, a.r1), plan=p if planned else None,
                   fetch_s=time.perf_counter() - t2)


def gather_operand(on: str, token: str, *parts) -> Operand:
    """X whole on this worker, from its row blocks (Blocks of a distributed result, in order):
    those held here are used where they are, the others arrive from their workers. Placed where
    this worker computes, so the products that use it copy nothing."""
    gpu = use_gpu(on)
    arrays = [where(b.C, gpu) for b in parts]
    if not arrays:
        raise ValueError("X: a distributed X with no blocks")
    xp = array_module(arrays[0]) if gpu else np
    X = xp.concatenate(arrays) if len(arrays) > 1 else arrays[0]
    sync(gpu)
    return Operand(X, None, token)
