"""matplan.distributed on a Dask cluster against one-GPU matplan on the same products (issue 41).

    PYTHONPATH=. python3 benchmarks/distributed_scaling.py [--gpus 1 2 4] [--only NAME ...] [--reps 3]
        [--gpu-cluster auto|dask-cuda|nanny] [--budget-s S] [--out DIR]
    PYTHONPATH=. python3 benchmarks/distributed_scaling.py --cpu [--workers 1 2] [--out DIR]

Rows on GPUs (the issue's targets; more with --only): SpGEMM A·A of R-MAT scale 17 and 18 (1.1e9
and ~3e9 products) and SpMM (k = 32) of a 500k x 500k matrix with 200 stratified random columns a
row (1e8 nonzeros, built in a second or two); ``--only`` also takes the real matrices' names
(A·Aᵀ for a non-square one: WordNet's) and rmat-scale19 / rmat-scale20.

(Not named distributed.py: with benchmarks/ on sys.path, as its scripts and tests put it, that
name would hide Dask's own ``distributed`` package.)

Rows of ``results/distributed-<gpu>.json``: {"op", "matrix", "products", "gpus", "ms", "one_gpu_ms",
"speedup", "correct"} and, apart from the kernels, where the distributed time went:

* ``ms``: median wall time of one distributed call with inputs on the host, after one untimed call
  (so neither side pays first-use compilation or the measurement of its plan's finalists). SpGEMM: a whole
  ``matplan.distributed.spgemm`` (partition, scatter of A's blocks and B, planning on each worker,
  kernels, row-sum checks; C left on the workers). SpMM: one ``op @ X`` of a DistributedOperator
  made before (scatter of X, kernels on the resident blocks, gathering Y to the host).
* ``one_gpu_ms``: the same product by matplan in this process on one GPU, inputs on the host too:
  SpGEMM copies A and B to the GPU, plans and runs (C left on the GPU; where C does not fit,
  the hash kernel's row panels, each freed); SpMM copies X in, runs a plan bound before, copies
  Y out. On the host (--cpu): plan and run, and the bound plan's run.
* ``kernel_ms``: the critical path of the workers' own time (per worker, the sum of its blocks'
  placement, planning, kernel and check; the busiest worker); ``overhead_ms``: the tasks' wall
  time past kernel_ms (Dask's scheduling, moving results' records and waiting). SpGEMM's
  ``partition_ms`` (row blocks by products) and ``scatter_ms`` (A's blocks and B sent) come
  before the tasks, so ms ~ partition + scatter + kernel + overhead; SpMM's ``scatter_ms`` is X's.
* ``correct``: every SpGEMM block passed its row-sum check (the call raises otherwise), SAMPLE_ROWS
  rows of C (the heaviest by products and random ones, fetched from their workers) equal SciPy's
  entry by entry within (row products + 2)·eps·(|A|·|B|), and, up to CHECK_PRODUCTS products, all
  of C equals SciPy's (past that, nnz equals one-GPU matplan's); SpMM: Y equals SciPy's A @ X
  within 1e-12 of |A| @ |X|.
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


def problems(cpu: bool, only=None):
    """(op, name, A, B or k) of the rows: small ones on the CPU, the issue's sizes on GPUs; each
    matrix is built only when its row is asked for."""
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
    """(ms, result on the host or its nnz) of one-GPU matplan (host matplan without a GPU)."""
    if cp is None:
        if op == "spmm":
            bound = make_plan(A, B, reuse=reps + 2, measure=MEASURE).bind(A)
            return median_ms(lambda: bound(B), reps)
        return median_ms(lambda: make_plan(A, B, measure=MEASURE).run(A, B), reps)
    import cupyx.scipy.sparse as csp
    sync = cp.cuda.Device().synchronize
    if op == "spmm":
        Ag = csp.csr_matrix(A)
        bound = make_plan(Ag, cp.asarray(B), reuse=reps + 2, measure=MEASURE).bind(Ag)
        return median_ms(lambda: cp.asnumpy(bound(cp.asarray(B))), reps)

    def call():
        Ag, Bg = csp.csr_matrix(A), csp.csr_matrix(B)
        try:
            C = make_plan(Ag, Bg, measure=MEASURE).run(Ag, Bg)
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
    return median_ms(call, reps)


def row_products(A, B) -> np.ndarray:
    """Products of each row of A @ B (sparse B: the sum of B's row lengths over A's row)."""
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


def spgemm_row(client, name, A, B, reps, one, gpus):
    import matplan.distributed as md
    ms, C = median_ms(lambda: md.spgemm(A, B, client=client, measure=MEASURE), reps)
    one_ms, one_out = one
    t = C.timings
    row = dict(op="spgemm", matrix=name, products=products_of(A, B), gpus=gpus, ms=ms, one_gpu_ms=one_ms,
               speedup=one_ms / ms, kernel_ms=t["busy_critical_s"] * 1e3, overhead_ms=t["overhead_s"] * 1e3,
               partition_ms=t["partition_s"] * 1e3, scatter_ms=t["scatter_s"] * 1e3, plan_sum_ms=t["plan_sum_s"] * 1e3,
               kernel_sum_ms=t["kernel_sum_s"] * 1e3, check_sum_ms=t["check_sum_s"] * 1e3, blocks=len(C),
               workers_used=t["workers_used"], nnz_c=C.nnz, kernels=sorted({p["kernel"] for p in C.plans}),
               resubmitted=t["resubmitted"])
    rows = sampled_rows(A, B)
    checks = {"row sums per block": all(info["check_worst"] <= 1.0 for info in C.blocks_info()),
              f"{len(rows)} sampled rows vs SciPy": rows_match(C, A, B, rows)}
    if row["products"] <= CHECK_PRODUCTS:
        ref = (A @ B).tocsr()
        got = C.to_scipy()
        checks["all entries vs SciPy"] = bool(got.shape == ref.shape and
                                              abs(got - ref).max() <= 1e-12 * max(abs(ref).max(), 1))
    else:
        checks["nnz vs one-GPU matplan"] = bool(C.nnz == (one_out if isinstance(one_out, int) else one_out.nnz))
    row["correct"] = all(checks.values())
    row["check"] = "; ".join(f"{k}: {'ok' if v else 'FAILED'}" for k, v in checks.items())
    C.release()
    return row


def spmm_row(client, name, A, X, reps, one, gpus, ref):
    import matplan.distributed as md
    t0 = time.perf_counter()
    with md.DistributedOperator(A, client=client, reuse=reps + 2, measure=MEASURE) as op:
        op @ X                                    # plans and binds every block on its worker (the warm-up)
        setup_ms = (time.perf_counter() - t0) * 1e3
        ms, Y = median_ms(lambda: op @ X, reps, warmup=0)
        t, kernels = op.last_timings, sorted(set(op.last_kernels))
        blocks = len(op.rblocks)
    Yref, scale = ref
    one_ms, _ = one
    return dict(op="spmm", matrix=name, products=products_of(A, X), gpus=gpus, ms=ms, one_gpu_ms=one_ms,
                speedup=one_ms / ms, correct=bool(np.all(np.abs(Y - Yref) <= 1e-12 * scale + 1e-300)),
                k=X.shape[1], kernel_ms=t["busy_critical_s"] * 1e3, overhead_ms=t["overhead_s"] * 1e3,
                scatter_ms=t["scatter_s"] * 1e3, assemble_ms=t["assemble_s"] * 1e3, setup_ms=setup_ms,
                blocks=blocks, workers_used=t["workers_used"], kernels=kernels,
                check="Y vs SciPy within 1e-12 of |A| @ |X|")


def table(rows) -> str:
    """The rows as a short fixed-width table."""
    head = f"{'op':7}{'matrix':22}{'products':>10}{'gpus':>5}{'ms':>10}{'1-GPU ms':>10}{'speedup':>8}" \
           f"{'kernel':>9}{'Dask':>9}{'scatter':>9}  correct"
    lines = [head]
    for r in rows:
        lines.append(f"{r['op']:7}{r['matrix'][:21]:22}{r['products']:>10.3g}{r['gpus']:>5}{r['ms']:>10.1f}"
                     f"{r['one_gpu_ms']:>10.1f}{r['speedup']:>8.2f}{r['kernel_ms']:>9.1f}{r['overhead_ms']:>9.1f}"
                     f"{r['scatter_ms']:>9.1f}  {r['correct']}")
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

    rows, skipped, cases, singles, refs = [], [], [], {}, {}
    for op, name, make, k in problems(args.cpu, args.only):
        if over_budget():
            skipped.append(name)
            continue
        A = sp.csr_matrix(make(), dtype=np.float64)
        B = second_operand(op, A, k)
        cases.append((op, name, A, B))
        singles[name] = one_device(op, A, B, args.reps, cp)
        if cp is not None:   # GPU 0 is shared with a worker later: give back what this process cached
            cp.get_default_memory_pool().free_all_blocks()
        if op == "spmm":
            refs[name] = (A @ B, abs(A) @ abs(B))
        print(f"{op} {name} ({A.shape[0]:,}x{A.shape[1]:,}, {A.nnz:,} nonzeros, {products_of(A, B):.3g} products): "
              f"one {'GPU' if cp else 'host process'} {singles[name][0]:.1f} ms", flush=True)
    path = None

    def write():
        return write_result(out, "distributed", device, dict(
            device=device, rows=rows, reps=args.reps, measure=MEASURE, skipped=skipped,
            note="CPU LocalCluster test run, not a measurement" if args.cpu else ""))
    for n in counts:
        if over_budget():
            skipped.extend(f"{name} x{n}" for _, name, _, _ in cases)
            continue
        with md.local_cluster(n, gpu=not args.cpu, processes=not (args.cpu and args.threads),
                              **({} if args.cpu else {"gpu_cluster": args.gpu_cluster})) as lc:
            client = lc.client()
            client.wait_for_workers(n)
            print(lc, flush=True)
            for op, name, A, B in cases:
                if over_budget():
                    skipped.append(f"{name} x{n}")
                    continue
                if op == "spgemm":
                    row = spgemm_row(client, name, A, B, args.reps, singles[name], n)
                else:
                    row = spmm_row(client, name, A, B, args.reps, singles[name], n, refs[name])
                rows.append(row)
                print(f"  {op} {name} x{n}: {row['ms']:.1f} ms (kernels {row['kernel_ms']:.1f}, Dask "
                      f"{row['overhead_ms']:.1f}, scatter {row['scatter_ms']:.1f}) vs {row['one_gpu_ms']:.1f} ms: "
                      f"{row['speedup']:.2f}x, correct {row['correct']} ({row['check']})", flush=True)
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
