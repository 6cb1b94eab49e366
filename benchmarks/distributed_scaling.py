"""matplan.distributed on a Dask cluster against one-GPU matplan on the same products (issue 41).

    PYTHONPATH=. python3 benchmarks/distributed_scaling.py [--gpus 1 2 4] [--only NAME ...] [--reps 3]
        [--spmm-k 32 128 256] [--gpu-cluster auto|dask-cuda|nanny] [--budget-s S] [--out DIR]
    PYTHONPATH=. python3 benchmarks/distributed_scaling.py --cpu [--workers 1 2] [--out DIR]

Rows on GPUs (the issue's targets; more with --only): SpGEMM A·A of R-MAT scale 17 and 18 (1.1e9
and ~3e9 products) and SpMM (k = 32) of a 500k x 500k matrix with 200 stratified random columns a
row (1e8 nonzeros, built in a second or two), one row per ``--spmm-k`` (default 32); ``--only``
also takes the real matrices' names (A·Aᵀ for a non-square one: WordNet's) and rmat-scale19 /
rmat-scale20.

(Not named distributed.py: with benchmarks/ on sys.path, as its scripts and tests put it, that
name would hide Dask's own ``distributed`` package.)

Rows of ``results/distributed-<gpu>.json``: {"op", "matrix", "products", "gpus", "ms", "one_gpu_ms",
"speedup", "correct"} and, apart from the kernels, where the distributed time went. Both sides are
timed as a user who keeps the data where it computes sees them:

* ``ms``: median wall time of the steady call on resident operands: A's row blocks made resident
  on the workers' GPUs (``DistributedCSR.from_matrix``, SpGEMM's balanced by products) and B or X
  replicated (``replicate``) before, the blocks' plans kept from the first call. SpGEMM: a whole
  ``spgemm(Ad, Br)`` (tasks, kernels, row-sum checks; C left on the workers); SpMM: ``spmm(Ad,
  Xr)`` with Y left on the workers as a DistributedDense. ``planned_steady`` (0) counts blocks
  planned in it. ``path`` says how the steady call ran: "runner" (one message per worker to its
  runner, past the scheduler: what a steady call on resident operands takes) or "tasks" (with
  ``fallback``, why); ``tasks_ms`` / ``tasks_overhead_ms`` time the same steady call forced through
  tasks (``path="tasks"``: one task per block, the path before the runners) for comparison.
* ``one_gpu_ms``: the same product by matplan in this process on one GPU, operands already on the
  GPU and the plan made before (SpGEMM: ``plan.run`` with C left on the GPU, or where C does not
  fit the hash kernel's row panels, each freed; SpMM: the bound plan, Y left on the GPU).
* ``first_ms`` / ``one_gpu_first_ms`` / ``first_speedup``: the first call a user starting from
  host data makes, after one untimed such call (so neither side pays first-use compilation):
  distributed, replicate B or X + distribute A + the product (blocks planned on their workers);
  one GPU, copy the operands in, plan and run (SpMM: copy X in and Y out through a bound plan).
  ``distribute_ms`` is from_matrix's part; ``first_*_ms`` split the first product as below.
* ``kernel_ms``: the steady call's critical path of the workers' own time (per worker, the sum of
  its blocks' placement, planning, kernel and check; the busiest worker); ``overhead_ms``: the
  tasks' wall time past kernel_ms (Dask's scheduling, moving records and inputs between workers,
  waiting); ``run_ms`` the tasks' wall time; ``client_ms`` = ms - run_ms (the client's own work);
  ``plan_sum_ms``, ``kernel_sum_ms``, ``check_sum_ms`` sums over blocks. SpMM's ``host_io_ms``: a
  call with X from the host and Y gathered to it (``DistributedOperator @ X``), its split as
  ``host_io_*_ms``.
* ``correct``: every SpGEMM block passed its row-sum check (the call raises otherwise), SAMPLE_ROWS
  rows of C (the heaviest by products and random ones, fetched from their workers) equal SciPy's
  entry by entry within (row products + 2)·eps·(|A|·|B|), and, up to CHECK_PRODUCTS products, all
  of C equals SciPy's (past that, nnz equals one-GPU matplan's); SpMM: Y equals SciPy's A @ X
  within 1e-12 of |A| @ |X|; and the steady calls planned nothing.
* ``--budget-s``: rows not started once this many seconds have passed are skipped (and listed as
  ``skipped``), so a run under a time limit ends with its file written; the file is rewritten
  after every row, so a run cut short keeps what it measured.

``--cpu`` runs the same rows on a CPU LocalCluster (SciPy path; "gpus" counts CPU workers and
``one_gpu_ms`` is matplan's host path) on small matrices, writes ``distributed-cpu.json`` under
``--out`` (default: a temporary folder, printed; such a file is a test of this script, not a
measurement to commit) and leaves SUMMARY.md alone.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.append(os.path.dirname(os.path.abspath(__file__)))   # _common, summarize (also when run by runpy)
from _common import RESULTS, cuda_device_name, write_result  # noqa: E402  (this folder is on sys.path)
from matplan import corpus  # noqa: E402
from matplan.core.xp import cupy_module, is_gpu_array  # noqa: E402
from matplan.planner import plan as make_plan  # noqa: E402

#: Up to this many products C is also compared with SciPy's entry by entry.
CHECK_PRODUCTS = 200_000_000
#: Rows of C compared with SciPy entry by entry, fetched from their workers, whatever C's size.
SAMPLE_ROWS = 64
#: SpMM's columns of X (the issue's target is k >= 32).
SPMM_K = 32
#: Past this many SpMM products Y is compared with SciPy on SPMM_SAMPLE_ROWS rows only (SciPy's
#: single-threaded A @ X takes a minute at k = 512) and with one-GPU matplan's Y everywhere.
SPMM_FULL_CHECK_PRODUCTS = 4_000_000_000
SPMM_SAMPLE_ROWS = 4096


#: The planner's measure on both sides (--measure).
MEASURE = "auto"


def strided_random(m: int, n: int, per_row: int, seed=0) -> sp.csr_matrix:
    """m x n CSR with ``per_row`` nonzeros a row, the j-th drawn uniformly from columns
    [j·s, (j+1)·s), s = n // per_row: sorted and distinct by construction, so 1e8 nonzeros take a
    second or two (corpus.uniform's sampling without replacement takes ten times longer)."""
    if not 1 <= per_row <= n:
        raise ValueError(f"per_row: expected 1..n ({n}), got {per_row}")
    rng = np.random.default_rng(seed)
    stride = n // per_row
    indices = rng.integers(0, stride, size=(m, per_row), dtype=np.int32)
    indices += np.arange(0, per_row * stride, stride, dtype=np.int32)
    indptr = np.arange(0, (m + 1) * per_row, per_row, dtype=np.int64 if m * per_row >= 2**31 else np.int32)
    return sp.csr_matrix((rng.random(m * per_row) + 0.5, indices.ravel(), indptr), shape=(m, n))


def problems(cpu: bool, only=None, spmm_k=None):
    """(op, name, A, B or k) of the rows: small ones on the CPU, the issue's sizes on GPUs; each
    matrix is built only when its row is asked for; SpMM rows once per ``spmm_k`` where given."""
    def rmat(s, ef=16):
        return lambda: corpus.rmat(scale=s, edge_factor=ef, seed=0)
    if cpu:
        out = [("spgemm", "rmat-scale11", rmat(11, 8), None),
               ("spgemm", "uniform-10k", lambda: corpus.uniform(10_000, 10_000, 6, seed=0), None),
               ("spmm", "uniform-20k", lambda: corpus.uniform(20_000, 20_000, 10, seed=0), 8),
               ("spmm", "strided-20k-10", lambda: strided_random(20_000, 20_000, 10), 8)]
        extra = []
    else:
        out = [("spgemm", f"rmat-scale{s}", rmat(s), None) for s in (17, 18)]
        out += [("spmm", "strided-500k-200", lambda: strided_random(500_000, 500_000, 200), SPMM_K)]
        extra = [("spgemm", f"rmat-scale{s}", rmat(s), None) for s in (19, 20)]
        folder = ".data/matrices" if os.path.isdir(".data/matrices") else None
        if only:
            extra += [("spgemm", name, lambda A=A: A, None) for name, A in corpus.real_matrices(folder)
                      if name in only]
    for entry in (out + extra if only else out):
        if not only or entry[1] in only:
            if entry[0] == "spmm" and spmm_k:
                yield from ((*entry[:3], k) for k in spmm_k)
            else:
                yield entry


def second_operand(op, A, k):
    if op == "spmm":
        return np.random.default_rng(0).random((A.shape[1], k))
    return A if A.shape[0] == A.shape[1] else A.T.tocsr()


def products_of(A, B):
    return int(np.diff(B.indptr)[A.indices].sum()) if sp.issparse(B) else int(A.nnz) * B.shape[1]


def median_ms(fn, reps, warmup=1):
    """(median ms of ``reps`` calls after ``warmup`` untimed ones, the last call's result)."""
    for _ in range(warmup):
        fn()
    times, out = [], None
    for _ in range(reps):
        out = None
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times)), out


def one_device(op, A, B, reps, cp):
    """One-device matplan on the same product: {"ms", "first_ms", "out"}. ``ms``: the steady call,
    operands already where it computes (on the GPU) and the plan made before (SpGEMM: plan.run, C
    left on the GPU; SpMM: the bound plan, Y left on the GPU); ``first_ms``: the call a user
    starting from host data makes (copy the operands in, plan (and bind), run; the result left on
    the GPU). ``out``: C's nnz or Y on the host (host matplan without a GPU)."""
    if cp is None:
        if op == "spmm":
            first, _ = median_ms(lambda: make_plan(A, B, reuse=reps + 2, measure=MEASURE).bind(A)(B), reps)
            bound = make_plan(A, B, reuse=reps + 2, measure=MEASURE).bind(A)
            ms, Y = median_ms(lambda: bound(B), reps)
            return dict(ms=ms, first_ms=first, out=Y)
        first, _ = median_ms(lambda: make_plan(A, B, measure=MEASURE).run(A, B), reps)
        p = make_plan(A, B, measure=MEASURE)
        ms, C = median_ms(lambda: p.run(A, B), reps)
        return dict(ms=ms, first_ms=first, out=int(C.nnz))
    import cupyx.scipy.sparse as csp
    sync = cp.cuda.Device().synchronize
    if op == "spmm":
        def first_call():
            Ag, Xg = csp.csr_matrix(A), cp.asarray(B)
            Y = make_plan(Ag, Xg, reuse=reps + 2, measure=MEASURE).bind(Ag)(Xg)
            sync()
            return Y
        first, _ = median_ms(first_call, reps)
        Ag, Xg = csp.csr_matrix(A), cp.asarray(B)
        bound = make_plan(Ag, Xg, reuse=reps + 2, measure=MEASURE).bind(Ag)

        def steady():
            Y = bound(Xg)
            sync()
            return Y
        ms, Y = median_ms(steady, reps)
        return dict(ms=ms, first_ms=first, out=cp.asnumpy(Y))

    def product(Ag, Bg, p=None):
        try:
            C = (p or make_plan(Ag, Bg, measure=MEASURE)).run(Ag, Bg)
            sync()
            return int(C.nnz)
        except (MemoryError, OverflowError):   # C fits no single GPU: the hash kernel's row panels
            from matplan.kernels import spgemm as hs
            cp.get_default_memory_pool().free_all_blocks()
            nnz = 0
            for _, _, P in hs.spgemm_panels(Ag, Bg):
                nnz += int(P.nnz)
                del P
            sync()
            return nnz
    first, nnz = median_ms(lambda: product(csp.csr_matrix(A), csp.csr_matrix(B)), reps)
    Ag, Bg = csp.csr_matrix(A), csp.csr_matrix(B)
    p = make_plan(Ag, Bg, measure=MEASURE)
    ms, nnz = median_ms(lambda: product(Ag, Bg, p), reps)
    del Ag, Bg
    return dict(ms=ms, first_ms=first, out=nnz)


def row_products(A, B) -> np.ndarray:
    """Products of each row of A @ B (sparse B: the sum of B's row lengths over A's row; dense B:
    the row's nonzeros times B's columns)."""
    if not sp.issparse(B):
        return np.diff(A.indptr).astype(np.int64) * B.shape[1]
    per = np.concatenate([[0], np.cumsum(np.diff(B.indptr)[A.indices], dtype=np.int64)])
    return per[A.indptr[1:]] - per[A.indptr[:-1]]


def sampled_rows(A, B, n=None, seed=0):
    """Row indices to check entry by entry: the SAMPLE_ROWS // 8 heaviest by products, the rest at random."""
    n = SAMPLE_ROWS if n is None else n
    m = A.shape[0]
    work = row_products(A, B)
    heavy = np.argsort(work)[::-1][: max(1, n // 8)]
    rest = np.random.default_rng(seed).choice(m, size=min(m, n - len(heavy)), replace=False)
    return np.unique(np.concatenate([heavy, rest]))


def take_rows(blk, local):
    """Rows ``local`` of a block of C as SciPy CSR, taken where the block is (a GPU block's rows are
    gathered on its GPU, so a block of gigabytes is never copied whole to the host)."""
    if is_gpu_array(blk.C):
        try:
            return blk.C[cupy_module().asarray(local)].get()
        except (TypeError, IndexError, NotImplementedError):   # a CuPy without row fancy indexing
            pass
    return blk.host()[local]


def rows_of(C, rows):
    """Rows of a DistributedCSR as one SciPy CSR, each block's rows taken on its worker (only they travel)."""
    b = np.asarray(C.bounds)
    which = np.searchsorted(b, rows, side="right") - 1
    parts = []
    for i in np.unique(which):
        local = rows[which == i] - b[i]
        parts.append(C._on_block(int(i), lambda blk, local=local: take_rows(blk, local)))
    return sp.vstack(parts, format="csr")


def rows_match(C, A, B, rows) -> bool:
    """C's rows equal SciPy's A[rows] @ B within (row products + 2)·eps·(|A|·|B|), entry by entry."""
    Ar = A[rows]
    got, ref = rows_of(C, rows).toarray(), (Ar @ B).toarray()
    bound = (abs(Ar) @ abs(B)).toarray()
    tol = (row_products(Ar, B)[:, None] + 2) * np.finfo(np.float64).eps * bound
    return bool(got.shape == ref.shape and np.all(np.abs(got - ref) <= tol))


def split(t: dict, prefix: str = "") -> dict:
    """A call's timings (seconds) as the row's fields (ms): the busiest worker's own time, Dask's
    share of the tasks' wall time (scheduling, moving records and inputs, waiting) and the phases."""
    out = {f"{prefix}kernel_ms": t["busy_critical_s"] * 1e3, f"{prefix}overhead_ms": t["overhead_s"] * 1e3,
           f"{prefix}run_ms": t["run_s"] * 1e3, f"{prefix}scatter_ms": t.get("scatter_s", 0.0) * 1e3}
    for k in ("partition_s", "plan_sum_s", "kernel_sum_s", "check_sum_s", "place_sum_s"):
        if k in t:
            out[f"{prefix}{k[:-2]}_ms"] = t[k] * 1e3
    return out


def first_call(fn):
    """(ms, result) of ``fn()`` once: a user's first product on data sent to the cluster for it."""
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1e3, out


def spgemm_row(client, name, A, B, reps, one, gpus):
    """SpGEMM on the cluster: the first call (A's blocks and B sent, blocks planned) and the steady
    call on the same resident operands (plans kept on the blocks), each against one GPU's."""
    import matplan.distributed as md

    def setup_and_call():
        Br = md.replicate(B, client=client)
        Ad = md.DistributedCSR.from_matrix(A, client=client, balance=Br)
        return Ad, Br, md.spgemm(Ad, Br, measure=MEASURE)
    for obj in setup_and_call():   # warm-up: first use of the kernels and plans in the workers' processes
        obj.release()
    first_ms, (Ad, Br, C) = first_call(setup_and_call)
    distribute_ms = Ad.timings["total_s"] * 1e3
    first = split(C.timings, "first_")
    C.release()
    ms, C = median_ms(lambda: md.spgemm(Ad, Br, measure=MEASURE), reps, warmup=0)
    t = C.timings
    tasks_ms, Ct = median_ms(lambda: md.spgemm(Ad, Br, measure=MEASURE, path="tasks"), reps, warmup=0)
    tasks = dict(tasks_ms=tasks_ms, tasks_overhead_ms=Ct.timings["overhead_s"] * 1e3,
                 tasks_kernel_ms=Ct.timings["busy_critical_s"] * 1e3)
    Ct.release()
    row = dict(op="spgemm", matrix=name, products=products_of(A, B), gpus=gpus, ms=ms, one_gpu_ms=one["ms"],
               speedup=one["ms"] / ms, first_ms=first_ms, one_gpu_first_ms=one["first_ms"],
               first_speedup=one["first_ms"] / first_ms, **split(t), client_ms=ms - t["run_s"] * 1e3, **first,
               distribute_ms=distribute_ms, planned_steady=t["planned"], blocks=len(C),
               workers_used=t["workers_used"], nnz_c=C.nnz,
               kernels=sorted({p["kernel"] for p in C.plans}), resubmitted=t["resubmitted"],
               path=t["path"], fallback=t["fallback"], **tasks)
    rows = sampled_rows(A, B)
    checks = {"row sums per block": all(info["check_worst"] <= 1.0 for info in C.blocks_info()),
              f"{len(rows)} sampled rows vs SciPy": rows_match(C, A, B, rows),
              "steady calls planned nothing": t["planned"] == 0}
    if row["products"] <= CHECK_PRODUCTS:
        ref = (A @ B).tocsr()
        got = C.to_scipy()
        checks["all entries vs SciPy"] = bool(got.shape == ref.shape and
                                              abs(got - ref).max() <= 1e-12 * max(abs(ref).max(), 1))
    else:
        checks["nnz vs one-GPU matplan"] = bool(C.nnz == one["out"])
    row["correct"] = all(checks.values())
    row["check"] = "; ".join(f"{k}: {'ok' if v else 'FAILED'}" for k, v in checks.items())
    for obj in (C, Ad, Br):
        obj.release()
    return row


def spmm_reference(A, X, one_gpu_Y) -> dict:
    """What Y is checked against: SciPy's A @ X on every row up to SPMM_FULL_CHECK_PRODUCTS
    products; past it SciPy on SPMM_SAMPLE_ROWS rows (the heaviest and random ones) and one-GPU
    matplan's Y on all. Tolerance 1e-12 of |A| @ |X|, which for nonnegative A and X is A @ X itself."""
    if products_of(A, X) <= SPMM_FULL_CHECK_PRODUCTS or A.data.min(initial=0) < 0 or X.min(initial=0) < 0:
        return dict(rows=None, Y=A @ X, scale=abs(A) @ abs(X), one=None,
                    what="Y vs SciPy within 1e-12 of |A| @ |X|")
    rows = sampled_rows(A, X, SPMM_SAMPLE_ROWS)
    Ys = A[rows] @ X
    return dict(rows=rows, Y=Ys, scale=Ys, one=one_gpu_Y,
                what=f"Y vs SciPy on {len(rows)} sampled rows and all of Y vs one-GPU matplan's, within "
                     "1e-12 of |A| @ |X| (= A @ X: A and X are nonnegative)")


def spmm_matches(Yh, ref: dict) -> bool:
    """Y (on the host) equals spmm_reference's reference within its tolerance."""
    rows = slice(None) if ref["rows"] is None else ref["rows"]
    ok = np.all(np.abs(Yh[rows] - ref["Y"]) <= 1e-12 * ref["scale"] + 1e-300)
    if ref["one"] is not None:
        ok = ok and np.all(np.abs(Yh - ref["one"]) <= 1e-12 * np.abs(ref["one"]) + 1e-300)
    return bool(ok)


def spmm_row(client, name, A, X, reps, one, gpus, ref):
    """SpMM on the cluster with X replicated and Y left on the workers: the first call (A's blocks
    and X sent, blocks planned and bound) and the steady call; ``host_io_ms``: a call with X from
    the host and Y gathered to it, as an iterative method on the client makes."""
    import matplan.distributed as md

    def setup_and_call():
        Xr = md.replicate(X, client=client)
        Ad = md.DistributedCSR.from_matrix(A, client=client)
        return Ad, Xr, md.spmm(Ad, Xr, measure=MEASURE, reuse=reps + 2)
    for obj in setup_and_call():
        obj.release()
    first_ms, (Ad, Xr, Y) = first_call(setup_and_call)
    first = split(Y.timings, "first_")
    distribute_ms = Ad.timings["total_s"] * 1e3
    Y.release()
    ms, Y = median_ms(lambda: md.spmm(Ad, Xr, measure=MEASURE, reuse=reps + 2), reps, warmup=0)
    t = Y.timings
    tasks_ms, Yt = median_ms(lambda: md.spmm(Ad, Xr, measure=MEASURE, reuse=reps + 2, path="tasks"), reps, warmup=0)
    tasks = dict(tasks_ms=tasks_ms, tasks_overhead_ms=Yt.timings["overhead_s"] * 1e3,
                 tasks_kernel_ms=Yt.timings["busy_critical_s"] * 1e3)
    Yt.release()
    Yh = Y.gather()
    with md.DistributedOperator(Ad, reuse=reps + 2, measure=MEASURE) as op:
        host_io_ms, _ = median_ms(lambda: op @ X, reps)
        host_io = split(op.last_timings, "host_io_")
        host_io["host_io_path"] = op.last_timings["path"]
    one_ms = one["ms"]
    row = dict(op="spmm", matrix=name, products=products_of(A, X), gpus=gpus, ms=ms, one_gpu_ms=one_ms,
               speedup=one_ms / ms, first_ms=first_ms, one_gpu_first_ms=one["first_ms"],
               first_speedup=one["first_ms"] / first_ms, host_io_ms=host_io_ms,
               correct=spmm_matches(Yh, ref) and t["planned"] == 0,
               k=X.shape[1], **split(t), client_ms=ms - t["run_s"] * 1e3, **first, **host_io,
               distribute_ms=distribute_ms, planned_steady=t["planned"], blocks=len(Y),
               workers_used=t["workers_used"], kernels=sorted({p["kernel"] for p in Y.plans}),
               path=t["path"], fallback=t["fallback"], **tasks,
               check=f"{ref['what']}; steady calls planned nothing")
    for obj in (Y, Ad, Xr):
        obj.release()
    return row


def table(rows) -> str:
    """The rows as a short fixed-width table: steady and first calls against one GPU's, and the
    steady call's busiest worker (kernel) and Dask's share."""
    head = (f"{'op':7}{'matrix':19}{'products':>9}{'gpus':>5}{'ms':>9}{'1-GPU':>9}{'speedup':>8}"
            f"{'first':>9}{'1-GPU':>9}{'speedup':>8}{'kernel':>8}{'Dask':>7}{'tasks':>9}  path    correct")
    lines = [head, f"{'':40}{'steady call':^26}{'first call':^26}{'steady split':^15}"]
    for r in rows:
        lines.append(f"{r['op']:7}{r['matrix'][:18]:19}{r['products']:>9.2g}{r['gpus']:>5}{r['ms']:>9.1f}"
                     f"{r['one_gpu_ms']:>9.1f}{r['speedup']:>8.2f}{r.get('first_ms', float('nan')):>9.1f}"
                     f"{r.get('one_gpu_first_ms', float('nan')):>9.1f}{r.get('first_speedup', float('nan')):>8.2f}"
                     f"{r['kernel_ms']:>8.1f}{r['overhead_ms']:>7.1f}{r.get('tasks_ms', float('nan')):>9.1f}"
                     f"  {r.get('path', '?'):8}{r['correct']}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="CPU LocalCluster, small matrices (tests this script)")
    ap.add_argument("--gpus", type=int, nargs="+", default=None,
                    help="GPU counts to run (default: those of 1 2 4 that are visible)")
    ap.add_argument("--gpu-cluster", default="auto", choices=("auto", "dask-cuda", "nanny"),
                    help="how GPU workers start (matplan.distributed.local_cluster's gpu_cluster)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="with --cpu: CPU worker counts")
    ap.add_argument("--threads", action="store_true", help="with --cpu: workers as threads of this process")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--measure", default="auto", choices=("auto", "never", "always"),
                    help="the planner's measure, the same on both sides (each block's plan and the one-GPU plan)")
    ap.add_argument("--only", nargs="+", help="matrix names to run")
    ap.add_argument("--spmm-k", type=int, nargs="+", default=None,
                    help=f"SpMM rows: one per number of columns of X (default {SPMM_K} on GPUs, 8 on the CPU)")
    ap.add_argument("--budget-s", type=float, default=None, help="start no row past this many seconds")
    ap.add_argument("--out", default=None, help="results folder (default: benchmarks/results; with --cpu a temp one)")
    args = ap.parse_args(argv)
    global MEASURE
    MEASURE = args.measure
    import matplan.distributed as md

    start = time.perf_counter()
    cp = None
    if args.cpu:
        device, counts = "cpu", args.workers
        out = args.out or os.path.join(tempfile.gettempdir(), "matplan-benchmarks")
    else:
        cp = cupy_module()
        if cp is None:
            sys.exit("no GPU: run with --cpu to test this script on the host")
        device, out = cuda_device_name(cp), args.out or str(RESULTS)
        visible = len(md.cluster.visible_gpus()[0])
        counts = [g for g in (args.gpus or [1, 2, 4]) if g <= visible]
    if not counts:
        sys.exit("no worker counts to run (--gpus past the visible GPUs)")

    def over_budget():
        return args.budget_s is not None and time.perf_counter() - start > args.budget_s

    if args.spmm_k and min(args.spmm_k) < 1:
        sys.exit("--spmm-k: expected positive numbers of columns")
    rows, skipped, cases, singles, refs, built = [], [], [], {}, {}, {}
    for op, name, make, k in problems(args.cpu, args.only, args.spmm_k):
        case = name if op == "spgemm" else f"{name} k={k}"
        if over_budget():
            skipped.append(case)
            continue
        A = built[name] if name in built else sp.csr_matrix(make(), dtype=np.float64)
        built = {name: A}   # SpMM rows of several k share their matrix
        B = second_operand(op, A, k)
        cases.append((op, name, A, B, case))
        singles[case] = one_device(op, A, B, args.reps, cp)
        if cp is not None:   # GPU 0 is shared with a worker later: give back what this process cached
            cp.get_default_memory_pool().free_all_blocks()
        if op == "spmm":
            refs[case] = spmm_reference(A, B, singles[case]["out"])
        print(f"{op} {case} ({A.shape[0]:,}x{A.shape[1]:,}, {A.nnz:,} nonzeros, {products_of(A, B):.3g} products): "
              f"one {'GPU' if cp else 'host process'} {singles[case]['ms']:.1f} ms steady, "
              f"{singles[case]['first_ms']:.1f} ms first", flush=True)
    built.clear()
    path = None

    def write():
        return write_result(out, "distributed", device, dict(
            device=device, rows=rows, reps=args.reps, measure=MEASURE, skipped=skipped,
            note="CPU LocalCluster test run, not a measurement" if args.cpu else ""))
    for n in counts:
        if over_budget():
            skipped.extend(f"{case} x{n}" for *_, case in cases)
            continue
        with md.local_cluster(n, gpu=not args.cpu, processes=not (args.cpu and args.threads),
                              **({} if args.cpu else {"gpu_cluster": args.gpu_cluster})) as lc:
            client = lc.client()
            client.wait_for_workers(n)
            print(lc, flush=True)
            for op, name, A, B, case in cases:
                if over_budget():
                    skipped.append(f"{case} x{n}")
                    continue
                if op == "spgemm":
                    row = spgemm_row(client, name, A, B, args.reps, singles[case], n)
                else:
                    row = spmm_row(client, name, A, B, args.reps, singles[case], n, refs[case])
                rows.append(row)
                print(f"  {op} {case} x{n}: steady {row['ms']:.1f} ms on the {row['path']} path (busiest worker "
                      f"{row['kernel_ms']:.1f}, Dask {row['overhead_ms']:.1f}; through tasks {row['tasks_ms']:.1f}) "
                      f"vs {row['one_gpu_ms']:.1f} ms: {row['speedup']:.2f}x; first "
                      f"{row['first_ms']:.1f} ms (plans {row['first_plan_sum_ms']:.1f} summed, Dask "
                      f"{row['first_overhead_ms']:.1f}) vs {row['one_gpu_first_ms']:.1f} ms: "
                      f"{row['first_speedup']:.2f}x; correct {row['correct']} ({row['check']})", flush=True)
                path = write()
    path = write()
    print(f"wrote {path}")
    if skipped:
        print(f"skipped past --budget-s {args.budget_s}: {', '.join(skipped)}")
    print(table(rows))
    if not args.cpu and os.path.abspath(out) == str(RESULTS):
        from summarize import write_summary
        write_summary(RESULTS)
    return 0 if rows and all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
