"""matplan.distributed on a Dask cluster against one-GPU matplan on the same products (issue 41).

    PYTHONPATH=. python3 benchmarks/distributed_scaling.py [--gpus 1 2 4] [--only NAME ...] [--reps 3]
    PYTHONPATH=. python3 benchmarks/distributed_scaling.py --cpu [--workers 1 2] [--out DIR]

(Not named distributed.py: with benchmarks/ on sys.path, as its scripts and tests put it, that
name would hide Dask's own ``distributed`` package.)

Rows of ``results/distributed-<gpu>.json``: {"op", "matrix", "products", "gpus", "ms", "one_gpu_ms",
"speedup", "correct"} and, apart from the kernels, where the distributed time went:

* ``ms``: median wall time of one distributed call with inputs on the host. SpGEMM: a whole
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
* ``correct``: every SpGEMM block passed its row-sum check (the call raises otherwise) and C equals
  SciPy's entry by entry up to CHECK_PRODUCTS products (past that, nnz equals one-GPU matplan's);
  SpMM: Y equals SciPy's A @ X within 1e-12 of |A| @ |X|.

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
from matplan.planner import plan as make_plan  # noqa: E402

#: Up to this many products C is also compared with SciPy's entry by entry.
CHECK_PRODUCTS = 200_000_000
#: SpMM's columns of X (the issue's target is k >= 32).
SPMM_K = 32


def problems(cpu: bool, only=None):
    """(op, name, A, B or k) of the rows: small ones on the CPU, the issue's sizes on GPUs."""
    if cpu:
        out = [("spgemm", "rmat-scale11", corpus.rmat(scale=11, edge_factor=8, seed=0), None),
               ("spgemm", "uniform-10k", corpus.uniform(10_000, 10_000, 6, seed=0), None),
               ("spmm", "uniform-20k", corpus.uniform(20_000, 20_000, 10, seed=0), 8)]
    else:
        out = [("spgemm", f"rmat-scale{s}", corpus.rmat(scale=s, edge_factor=16, seed=0), None) for s in (18, 19, 20)]
        out += [("spmm", "uniform-4M-25", corpus.uniform(4_000_000, 4_000_000, 25, seed=0), SPMM_K)]
        folder = ".data/matrices" if os.path.isdir(".data/matrices") else None
        out += [("spgemm", name, A, None) for name, A in corpus.real_matrices(folder)
                if only and name in only]
    for op, name, A, extra in out:
        if not only or name in only:
            yield op, name, sp.csr_matrix(A, dtype=np.float64), extra


def second_operand(op, A, k):
    if op == "spmm":
        return np.random.default_rng(0).random((A.shape[1], k))
    return A if A.shape[0] == A.shape[1] else A.T.tocsr()


def products_of(A, B):
    return int(np.diff(B.indptr)[A.indices].sum()) if sp.issparse(B) else int(A.nnz) * B.shape[1]


def median_ms(fn, reps):
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
            bound = make_plan(A, B, reuse=reps + 1).bind(A)
            return median_ms(lambda: bound(B), reps)
        return median_ms(lambda: make_plan(A, B).run(A, B), reps)
    import cupyx.scipy.sparse as csp
    sync = cp.cuda.Device().synchronize
    if op == "spmm":
        Ag = csp.csr_matrix(A)
        bound = make_plan(Ag, cp.asarray(B), reuse=reps + 1).bind(Ag)
        return median_ms(lambda: cp.asnumpy(bound(cp.asarray(B))), reps)

    def call():
        Ag, Bg = csp.csr_matrix(A), csp.csr_matrix(B)
        try:
            C = make_plan(Ag, Bg).run(Ag, Bg)
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


def spgemm_row(client, name, A, B, reps, one, gpus):
    import matplan.distributed as md
    ms, C = median_ms(lambda: md.spgemm(A, B, client=client), reps)
    one_ms, one_out = one
    t = C.timings
    row = dict(op="spgemm", matrix=name, products=products_of(A, B), gpus=gpus, ms=ms, one_gpu_ms=one_ms,
               speedup=one_ms / ms, kernel_ms=t["busy_critical_s"] * 1e3, overhead_ms=t["overhead_s"] * 1e3,
               partition_ms=t["partition_s"] * 1e3, scatter_ms=t["scatter_s"] * 1e3, plan_sum_ms=t["plan_sum_s"] * 1e3,
               kernel_sum_ms=t["kernel_sum_s"] * 1e3, blocks=len(C), nnz_c=C.nnz,
               kernels=sorted({p["kernel"] for p in C.plans}), resubmitted=t["resubmitted"])
    if row["products"] <= CHECK_PRODUCTS:
        ref = (A @ B).tocsr()
        got = C.to_scipy()
        row["correct"] = bool(got.shape == ref.shape and abs(got - ref).max() <= 1e-12 * max(abs(ref).max(), 1))
        row["check"] = "row sums per block; entries vs SciPy"
    else:
        nnz_one = one_out if isinstance(one_out, int) else one_out.nnz
        row["correct"] = bool(C.nnz == nnz_one)
        row["check"] = "row sums per block; nnz vs one-GPU matplan"
    C.release()
    return row


def spmm_row(client, name, A, X, reps, one, gpus):
    import matplan.distributed as md
    t0 = time.perf_counter()
    with md.DistributedOperator(A, client=client, reuse=reps + 1) as op:
        op @ X                                    # plans and binds every block on its worker
        setup_ms = (time.perf_counter() - t0) * 1e3
        ms, Y = median_ms(lambda: op @ X, reps)
        t, kernels = op.last_timings, sorted(set(op.last_kernels))
        blocks = len(op.rblocks)
    ref = A @ X
    scale = abs(A) @ abs(X)
    one_ms, _ = one
    return dict(op="spmm", matrix=name, products=products_of(A, X), gpus=gpus, ms=ms, one_gpu_ms=one_ms,
                speedup=one_ms / ms, correct=bool(np.all(np.abs(Y - ref) <= 1e-12 * scale + 1e-300)),
                k=X.shape[1], kernel_ms=t["busy_critical_s"] * 1e3, overhead_ms=t["overhead_s"] * 1e3,
                scatter_ms=t["scatter_s"] * 1e3, setup_ms=setup_ms, blocks=blocks, kernels=kernels)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="CPU LocalCluster, small matrices (tests this script)")
    ap.add_argument("--gpus", type=int, nargs="+", default=None,
                    help="GPU counts to run (default: those of 1 2 4 that are visible)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="with --cpu: CPU worker counts")
    ap.add_argument("--threads", action="store_true", help="with --cpu: workers as threads of this process")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", nargs="+", help="matrix names to run")
    ap.add_argument("--out", default=None, help="results folder (default: benchmarks/results; with --cpu a temp one)")
    args = ap.parse_args(argv)
    import matplan.distributed as md

    cp = None
    if args.cpu:
        device, counts = "cpu", args.workers
        out = args.out or os.path.join(tempfile.gettempdir(), "matplan-benchmarks")
    else:
        from matplan.core.xp import cupy_module
        cp = cupy_module()
        if cp is None:
            sys.exit("no GPU: run with --cpu to test this script on the host")
        device, out = cuda_device_name(cp), args.out or str(RESULTS)
        visible = len(md.cluster.visible_gpus()[0])
        counts = [g for g in (args.gpus or [1, 2, 4]) if g <= visible]
    if not counts:
        sys.exit("no worker counts to run (--gpus past the visible GPUs, or dask-cuda missing)")
    rows = []
    cases = list(problems(args.cpu, args.only))
    singles = {}
    for op, name, A, extra in cases:
        B = second_operand(op, A, extra)
        singles[name] = one_device(op, A, B, args.reps, cp)
        print(f"{op} {name}: one {'GPU' if cp else 'host process'} {singles[name][0]:.1f} ms", flush=True)
    for n in counts:
        with md.local_cluster(n, gpu=not args.cpu, processes=not (args.cpu and args.threads)) as lc:
            client = lc.client()
            print(lc, flush=True)
            for op, name, A, extra in cases:
                B = second_operand(op, A, extra)
                make = spgemm_row if op == "spgemm" else spmm_row
                row = make(client, name, A, B, args.reps, singles[name], n)
                rows.append(row)
                print(f"  {op} {name} x{n}: {row['ms']:.1f} ms (kernels {row['kernel_ms']:.1f}, Dask "
                      f"{row['overhead_ms']:.1f}) vs {row['one_gpu_ms']:.1f} ms: {row['speedup']:.2f}x, "
                      f"correct {row['correct']}", flush=True)
                path = write_result(out, "distributed", device, dict(
                    device=device, rows=rows, reps=args.reps,
                    note="CPU LocalCluster test run, not a measurement" if args.cpu else ""))
    print(f"wrote {path}")
    if not args.cpu and os.path.abspath(out) == str(RESULTS):
        from summarize import write_summary
        write_summary(RESULTS)
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
