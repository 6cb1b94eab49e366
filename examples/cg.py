"""A 3-D Poisson system solved by conjugate gradients: matplan's LinearOperator vs the plain matrix.

    PYTHONPATH=. python3 examples/cg.py [--n 96] [--rtol 1e-8] [--repeats 3] [--host]

With a GPU, cupyx.scipy.sparse.linalg.cg runs three ways on the same system:

  plain     the cupyx CSR matrix (cupyx's own cuSPARSE SpMV, descriptors made once)
  operator  planner.plan(A, b, reuse=...).as_linear_operator(A): the planned SpMV, bound once
  routed    cupyx's aslinearoperator(A) inside matplan.dispatch.route_sparse_matmul(): every
            A @ p inside the solver goes through matplan.matmul (a fingerprint and a cache
            hit per product), without editing the solver

Without a GPU (or with --host) the same three run with SciPy on the host. Printed:
iterations, the median wall time of the solves after a warm-up solve, the time per
iteration, and the true relative residual ||b - A x|| / ||b|| computed with the plain matrix.
"""
from __future__ import annotations

import argparse
import inspect
import statistics
import time

import numpy as np

import matplan
from matplan import corpus, planner
from matplan.core.xp import cupy_module


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=None, help="grid points per side (default 96 GPU, 32 host)")
    ap.add_argument("--rtol", type=float, default=1e-8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--host", action="store_true", help="use SciPy even when a GPU is present")
    args = ap.parse_args(argv)
    cp = None if args.host else cupy_module()
    n = args.n or (96 if cp is not None else 32)
    A_host = corpus.poisson3d(n)
    b_host = np.random.default_rng(0).standard_normal(A_host.shape[0])
    if cp is not None:
        import cupyx.scipy.sparse as csp
        import cupyx.scipy.sparse.linalg as la
        A, b, sync = csp.csr_matrix(A_host), cp.asarray(b_host), cp.cuda.get_current_stream().synchronize
        where = f"GPU ({_gpu_name(cp)}), cupyx CG"
    else:
        import scipy.sparse.linalg as la
        A, b, sync = A_host, b_host, (lambda: None)
        where = "host, SciPy CG"
    tol_kw = "rtol" if "rtol" in inspect.signature(la.cg).parameters else "tol"
    print(f"3-D Poisson {n}^3: {A.shape[0]:,} unknowns, {A.nnz:,} nonzeros; {where}; rtol={args.rtol:g}")

    def solve(op):
        its = [0]

        def count(xk):
            its[0] += 1
        sync()
        t = time.perf_counter()
        x, info = la.cg(op, b, **{tol_kw: args.rtol}, maxiter=20 * n, callback=count)
        sync()
        return x, info, its[0], time.perf_counter() - t

    def timed(name, op, context=None):
        results = []
        for _ in range(args.repeats + 1):            # the first solve warms up (compiles, plans)
            if context is None:
                results.append(solve(op))
            else:
                with context():
                    results.append(solve(op))
        x, info, its, _ = results[-1]
        secs = statistics.median(r[3] for r in results[1:])
        res = float(_norm(A @ x - b) / _norm(b))
        print(f"  {name:<9} {its:6d} iterations  {secs * 1e3:9.2f} ms  {secs / max(its, 1) * 1e6:8.1f} us/iter  "
              f"residual {res:.2e}  info {info}")
        return its, secs

    t0 = time.perf_counter()
    plan = planner.plan(A, b, reuse=4 * n)          # CG on this grid needs O(n) iterations
    op = plan.as_linear_operator(A)
    sync()
    print(f"planned and bound in {(time.perf_counter() - t0) * 1e3:.1f} ms: "
          f"{plan.candidates[0].label()} (reuse={plan.reuse}): {plan.candidates[0].why}")
    base_its, base_s = timed("plain", A)
    its, secs = timed("operator", op)
    r_its, r_secs = timed("routed", la.aslinearoperator(A), matplan.dispatch.route_sparse_matmul)
    cache = matplan.get_plan_cache(A.data.device.id if cp is not None else "cpu")
    print(f"operator / plain: {secs / base_s:.2f}x the time, {its - base_its:+d} iterations; "
          f"routed / plain: {r_secs / base_s:.2f}x the time, {r_its - base_its:+d} iterations "
          f"(routed products: {cache.hits} cache hits, {cache.misses} misses)")


def _norm(v):
    return float((v * v).sum()) ** 0.5


def _gpu_name(cp):
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"]
    return name.decode() if isinstance(name, bytes) else name


if __name__ == "__main__":
    main()
