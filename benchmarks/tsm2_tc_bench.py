"""The 3xTF32 tensor-core TSM2 kernel (matplan/kernels/tsgemm/tsm2_tc.py) against cuBLAS and the FP32
TSM2 kernel the planner would run without it, float32, both layouts of A (n x n), in one run.

For each (n, k, layout): every tsm2_tc variant (its launch made once, as a plan keeps it),
cupy.matmul and the FP32 TSM2 kernel with the planner's parameters (tsm2_tc.ENABLED off for it),
single calls timed in alternation by CUDA events (median of --repeats), each checked against
cupy.matmul first. Prints milliseconds, the ratio to cuBLAS and the fraction of the
device-to-device copy bandwidth measured in this run (bytes: A once, B and C).

    PYTHONPATH=. python3 benchmarks/tsm2_tc_bench.py [--n 8192 16384] [--k 16 24 32 64] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import git_commit  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--k", type=int, nargs="+", default=[16, 24, 32, 64])
    ap.add_argument("--layout", nargs="+", default=["C", "F"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import cupy as cp
    from matplan import planner
    from matplan.core.timing import cuda_medians_alternating_s
    from matplan.kernels import get
    from matplan.kernels.tsgemm import launch as launch_mod, rules, tsm2_tc
    from matplan.core import device as device_mod

    tsm2_tc.ENABLED = False   # the planner's FP32 TSM2 parameters, as the baseline
    dev = device_mod.current()
    copy_bw = device_mod.measure_copy_bandwidth(1 << 30, repeats=10)
    print(f"# {dev.name}: copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + write), CuPy {cp.__version__}, "
          f"commit {git_commit()}", flush=True)
    print(f"{'n':>6} {'k':>3} {'lay':>3} {'kernel':>10} {'ms':>8} {'x cuBLAS':>8} {'frac_bw':>7} {'max_err':>8}")
    rows, kern = [], get("tsgemm.tsm2")
    rng = cp.random.default_rng(7)
    for n in args.n:
        A0 = rng.random((n, n), dtype=np.float64).astype(np.float32) - 0.5
        for layout in args.layout:
            A = A0 if layout == "C" else cp.asfortranarray(A0)
            lay, lda = rules.layout_of(A)
            for k in args.k:
                B = rng.random((n, k), dtype=np.float64).astype(np.float32) - 0.5
                ref = cp.matmul(A, B)
                scale = float(cp.max(cp.abs(ref)))
                p = next(c for c in planner.plan(A, B).candidates if c.kernel == "tsgemm.tsm2").params
                prep = kern.prepare(A, p)
                fns = {"cublas": lambda: cp.matmul(A, B), "tsm2_fp32": lambda: kern.run(prep, B)}
                errs = {"cublas": 0.0, "tsm2_fp32": float(cp.max(cp.abs(kern.run(prep, B) - ref))) / scale}
                for v in tsm2_tc.variants(lay):
                    C = cp.empty((n, k), dtype=cp.float32)
                    go = tsm2_tc.TcLaunch(A, B, C, lay, lda, v)
                    C.fill(cp.nan)
                    go(A, B, C)
                    errs[f"tc_{v}"] = float(cp.max(cp.abs(C - ref))) / scale

                    def call(go=go):
                        out = cp.empty((n, k), dtype=cp.float32)
                        go(A, B, out)
                    fns[f"tc_{v}"] = call
                t = cuda_medians_alternating_s(fns, args.repeats, 3)
                nbytes = (n * n + 2 * n * k) * 4
                for name, s in t.items():
                    r = dict(n=n, k=k, layout=layout, kernel=name, ms=s * 1e3, speedup_vs_cublas=t["cublas"] / s,
                             frac_of_copy_bw=nbytes / s / copy_bw, max_rel_err=errs[name],
                             params=p if name == "tsm2_fp32" else None)
                    rows.append(r)
                    print(f"{n:>6} {k:>3} {layout:>3} {name:>10} {r['ms']:8.4f} {r['speedup_vs_cublas']:8.3f} "
                          f"{r['frac_of_copy_bw']:7.3f} {r['max_rel_err']:8.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": dev.name, "commit": git_commit(), "copy_bandwidth": copy_bw, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
