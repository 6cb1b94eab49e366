"""Per-call cost of a small SpMV (10k nonzeros): where launch overhead, not bandwidth, decides.

Times N back-to-back calls between two CUDA events (the GPU never waits for work,
so the figure is the per-call host + launch cost a user pays in a loop) for:
a bare empty RawKernel launch, ``bound(x)`` (prepared plan), ``plan.run(A, x)``,
``matplan.matmul`` (cache hit) and cupyx's ``A @ x`` (cuSPARSE); and a bound TSM2 plan
beside ``cupy.matmul`` on a small tall-skinny product. Issue 8's target:
``bound(x)`` <= 12 us on an H100 against about 46 us for cupyx.

    PYTHONPATH=. python3 benchmarks/launch_overhead.py [--out benchmarks/results]

Output: ``results/launch_overhead-<device>.json``, then ``results/SUMMARY.md`` regenerated.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _common import RESULTS, cuda_device_name, git_commit, queued_s, write_result  # noqa: E402  (beside this script)
from summarize import write_summary  # noqa: E402


def per_call_us(cp, fn, calls=2000, rounds=5):
    return queued_s(cp, fn, calls, rounds, warmup=50) * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(RESULTS), help="folder of the JSON result")
    args = ap.parse_args(argv)
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import matplan
    from matplan import corpus, planner
    A = csp.csr_matrix(corpus.generators.uniform(2000, 2000, 5, seed=0))
    x = cp.random.random(2000) + 0.5
    plan = planner.plan(A, x, reuse=1000)
    bound = plan.bind(A)
    cp.testing.assert_allclose(bound(x), A @ x, rtol=1e-12)
    # TSM2 on a small tall-skinny product (A 2048 x 2048 float32, B 2048 x 4; ~6 us of GPU time):
    # the per-call figure is the launch path's host cost
    At = cp.random.random((2048, 2048), dtype=cp.float32) + 0.5
    Bt = cp.random.random((2048, 4), dtype=cp.float32) + 0.5
    tsm2 = planner.plan(At, Bt, kernels=["tsgemm.tsm2"]).bind(At)
    cp.testing.assert_allclose(tsm2(Bt), At @ Bt, rtol=1e-4)
    empty = cp.RawKernel("extern \"C\" __global__ void empty() {}", "empty")
    rows = {
        "bare RawKernel launch": per_call_us(cp, lambda: empty((1,), (32,), ())),
        f"bound(x) [{plan.kernel}]": per_call_us(cp, lambda: bound(x)),
        "plan.run(A, x)": per_call_us(cp, lambda: plan.run(A, x), calls=500),
        "matplan.matmul(A, x) (cache hit)": per_call_us(cp, lambda: matplan.matmul(A, x), calls=500),
        "cupyx A @ x (cuSPARSE)": per_call_us(cp, lambda: A @ x, calls=500),
        f"bound(B) [{tsm2.plan.kernel}] 2048^2 x 4 float32": per_call_us(cp, lambda: tsm2(Bt), calls=500),
        "cupy.matmul 2048^2 x 4 float32 (cuBLAS)": per_call_us(cp, lambda: At @ Bt, calls=500),
    }
    name = cuda_device_name(cp)
    print(f"{name}, commit {git_commit()}, A 2000x2000 nnz={A.nnz}")
    for label, us in rows.items():
        print(f"  {label:<45} {us:8.2f} us/call")
    path = write_result(args.out, "launch_overhead", name, {"nnz": int(A.nnz), "us_per_call": rows})
    print(f"wrote {path} and {write_summary(args.out)}")


if __name__ == "__main__":
    main()
