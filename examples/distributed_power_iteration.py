"""PageRank by power iteration over a matrix distributed on a Dask cluster (matplan.distributed).

    PYTHONPATH=. python3 examples/distributed_power_iteration.py [--scale 16] [--workers 2]
        [--threads] [--gpu auto|yes|no] [--scheduler ADDRESS]

The link matrix M = (D^-1 A)^T of an R-MAT graph is cut into row blocks balanced by nonzeros; a
``DistributedOperator`` keeps each block and its bound plan (planned on its worker) resident
between iterations, so an iteration sends only r to the workers and gathers M r. r <- alpha M r
+ (alpha * dangling mass + 1 - alpha) / n, alpha = 0.85, until ||r_new - r||_1 < 1e-10. The
same iteration with SciPy in this process is the reference. Without GPUs (or dask-cuda) the local
cluster is a CPU one and the blocks take the SciPy path: the program runs anywhere.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

from matplan import corpus  # noqa: E402
import matplan.distributed as md  # noqa: E402   (needs matplan[distributed])
from pagerank import transition  # noqa: E402   (the link matrix, as examples/pagerank.py builds it)

ALPHA, TOL, MAX_ITER = 0.85, 1e-10, 500


def pagerank(spmv, n, dangling):
    """Iterate with ``spmv(r) -> M r``; returns (ranks, iterations, seconds)."""
    r = np.full(n, 1.0 / n)
    t = time.perf_counter()
    for it in range(1, MAX_ITER + 1):
        leak = ALPHA * r[dangling].sum() + (1.0 - ALPHA)
        r_new = ALPHA * spmv(r) + leak / n
        delta = float(np.abs(r_new - r).sum())
        r = r_new
        if delta < TOL:
            break
    return r, it, time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=int, default=16, help="R-MAT scale: 2^scale nodes")
    ap.add_argument("--workers", type=int, default=None, help="local workers (default: one per GPU, or 2 CPU)")
    ap.add_argument("--threads", action="store_true", help="CPU workers as threads of this process")
    ap.add_argument("--gpu", choices=["auto", "yes", "no"], default="auto")
    ap.add_argument("--scheduler", help="address of a running Dask scheduler (else a local cluster starts)")
    args = ap.parse_args(argv)

    M, dangling = transition(corpus.rmat(scale=args.scale, edge_factor=8, seed=0))
    n = M.shape[0]
    if args.scheduler:
        import distributed
        cluster, client = None, distributed.Client(args.scheduler)
    else:
        gpu = {"auto": "auto", "yes": True, "no": False}[args.gpu]
        workers = args.workers if args.workers is not None else (None if gpu is not False else 2)
        cluster = md.local_cluster(workers, gpu=gpu, processes=not args.threads)
        client = cluster.client()
        print(cluster)
    try:
        t = time.perf_counter()
        with md.DistributedOperator(M, client=client) as op:
            op @ np.full(n, 1.0 / n)      # plans and binds every block on its worker
            setup = time.perf_counter() - t
            kernels = sorted({p["kernel"] for p in op.plans})
            print(f"PageRank on R-MAT scale {args.scale}: {n:,} nodes, {M.nnz:,} edges; {len(op.rblocks)} row "
                  f"blocks (largest/mean nonzeros {op.rblocks.imbalance():.2f}) on "
                  f"{len({b['worker'] for b in op.blocks_info()})} worker(s), kernels {', '.join(kernels)}; "
                  f"set-up {setup * 1e3:.0f} ms")
            r, it, sec = pagerank(op.matvec, n, dangling)
            split = op.last_timings
        ref, ref_it, ref_sec = pagerank(lambda v: M @ v, n, dangling)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    diff = float(np.abs(r - ref).max())
    print(f"distributed: {it} iterations, {sec / it * 1e3:.2f} ms each (last: {split['run_s'] * 1e3:.2f} ms on the "
          f"{split['path']} path, of which {split['overhead_s'] * 1e3:.2f} ms Dask and transfers); SciPy in this "
          f"process: {ref_it} iterations, {ref_sec / ref_it * 1e3:.2f} ms each")
    ok = diff <= 1e-12 and it == ref_it
    print(f"max |difference| vs SciPy {diff:.2e}: {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
