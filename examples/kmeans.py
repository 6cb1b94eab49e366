"""Lloyd K-means with the distance GEMM planned once (TSM2 example, SEEDS section 5).

Each iteration needs the squared distances of n points (rows of X, d = 4096) to k = 16
centroids: ||x||^2 - 2 X.C^T + ||c||^2. X.C^T is a tall-and-skinny product (n x d times d x 16),
the paper's K-means case. The plan is made once for X and reused every iteration
(``plan.bind(X)``); the same iterations are timed with ``cupy.matmul`` for comparison, the two
taken in turn ``--rounds`` times (medians of the seconds per iteration).

    PYTHONPATH=. python3 examples/kmeans.py [--n 1024 4096 ... 262144] [--iters 10] [--rounds 5]
"""
from __future__ import annotations

import argparse
import sys


def lloyd(X, C0, iters, product):
    """Lloyd iterations; ``product(Ct)`` returns X @ Ct. Returns (centroids, labels, seconds per iteration)."""
    import cupy as cp
    xsq = (X * X).sum(axis=1)
    C = C0.copy()
    k = C.shape[0]
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        Ct = cp.ascontiguousarray(C.T)                       # d x k: the skinny operand
        dots = product(Ct)                                   # n x k
        dist = xsq[:, None] - 2 * dots + (C * C).sum(axis=1)[None, :]
        labels = dist.argmin(axis=1)
        # clusters' counts and sums from one-hot(labels) (a k x n by n x d GEMM for the sums):
        # cupy.bincount reads max(labels) back to the host, a wait for the GPU every iteration
        onehot = (labels[None, :] == cp.arange(k)[:, None]).astype(X.dtype)
        counts = onehot.sum(axis=1)
        sums = onehot @ X
        C = cp.where(counts[:, None] > 0, sums / cp.maximum(counts, 1)[:, None], C)
    stop.record()
    stop.synchronize()
    return C, labels, cp.cuda.get_elapsed_time(start, stop) * 1e-3 / iters


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384, 65536, 262144])
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=5, help="runs of each, taken in turn (medians)")
    args = ap.parse_args(argv)

    import cupy as cp
    import numpy as np
    from matplan import planner

    print(f"{'n':>7} {'kernel':>12} {'ms/iter matplan':>16} {'ms/iter cupy':>13} {'speedup':>8} {'same labels':>11}")
    for n in args.n:
        rng = cp.random.default_rng(n)
        centers = rng.standard_normal((args.k, args.d), dtype=args.dtype) * 4
        X = centers[rng.integers(0, args.k, n)] + rng.standard_normal((n, args.d), dtype=args.dtype)
        C0 = X[: args.k].copy()                              # the points are in random order
        Ct0 = cp.ascontiguousarray(C0.T)
        plan = planner.plan(X, Ct0, reuse=args.iters)        # planned once ...
        bound = plan.bind(X)                                 # ... and X prepared once
        lloyd(X, C0, 2, bound)                               # warm-up (compiles, caches)
        lloyd(X, C0, 2, lambda Ct: X @ Ct)
        runs = {"plan": [], "cupy": []}                      # in turn, medians: one run each read
        for _ in range(args.rounds):                         # up to +-30% apart on an H100 (b768d9d)
            C1, l1, t = lloyd(X, C0, args.iters, bound)
            runs["plan"].append(t)
            C2, l2, t = lloyd(X, C0, args.iters, lambda Ct: X @ Ct)
            runs["cupy"].append(t)
        t_plan, t_cupy = (float(np.median(runs[key])) for key in ("plan", "cupy"))
        same = float((l1 == l2).mean())
        print(f"{n:>7} {plan.kernel:>12} {t_plan * 1e3:16.3f} {t_cupy * 1e3:13.3f} {t_cupy / t_plan:8.2f} {same:11.4f}",
              flush=True)
        del X, C0, Ct0, plan, bound
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    sys.exit(main())
