"""ABFT checksum encoding with TSM2 (SEEDS section 5): C = A . [e, w], two weight vectors.

Algorithm-based fault tolerance encodes a large matrix A (n x n) with checksum columns
A.e (e = ones) and A.w (w = 1, 2, ..., n): a tall-and-skinny product with k = 2. The product is
planned once and timed against cupy.matmul; the checksums are verified against float64 sums.

    PYTHONPATH=. python3 examples/abft_checksum.py [--n 8192 16384 32768] [--dtype float64]
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--dtype", nargs="+", default=["float32", "float64"])
    ap.add_argument("--order", default="C", choices=["C", "F"])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)

    import cupy as cp
    from matplan import planner
    from matplan.core.timing import cuda_median_s as time_kernel

    print(f"{'n':>6} {'dtype':>8} {'kernel':>12} {'ms matplan':>11} {'ms cupy':>8} {'speedup':>8} {'max rel err':>11}")
    for n in args.n:
        for dtype in args.dtype:
            rng = cp.random.default_rng(n)
            A = cp.asarray(rng.random((n, n), dtype="float64").astype(dtype), order=args.order)
            W = cp.stack([cp.ones(n), cp.arange(1, n + 1) / n]).T.astype(dtype).copy()   # n x 2
            plan = planner.plan(A, W, reuse=args.repeats)
            bound = plan.bind(A)
            out = cp.full((n, 2), cp.nan, dtype=dtype)
            t_plan = time_kernel(lambda: bound(W, out=out), args.repeats, 3)
            t_cupy = time_kernel(lambda: A @ W, args.repeats, 3)
            ref = A.astype(cp.float64) @ W.astype(cp.float64)
            err = float(cp.max(cp.abs(out - ref) / cp.abs(ref)))
            print(f"{n:>6} {dtype:>8} {plan.kernel:>12} {t_plan * 1e3:11.3f} {t_cupy * 1e3:8.3f} "
                  f"{t_cupy / t_plan:8.2f} {err:11.2e}", flush=True)
            del A, W, out, ref, plan, bound
            cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    sys.exit(main())
