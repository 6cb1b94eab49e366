"""SpMV/SpMM benchmark: every candidate kernel, cuSPARSE, the planner's choice and the oracle, per matrix.

    PYTHONPATH=. python3 benchmarks/spmv.py [--quick] [--reps 30] [--out DIR] [--k K]

Matrices: the corpus at size 'large' (>= 5M nonzeros: 3-D Poisson, R-MAT,
uniform, skewed, block-dense, banded) and the real matrices in
``.data/matrices`` (or ../shared/matrices) when present; float64 and float32.
Times are CUDA-event medians of ``--reps`` runs after warm-up; cuSPARSE (cupyx
``A @ x``) and the device-to-device copy bandwidth are measured in the same run.
``frac_of_copy_bw`` = the CSR SpMV's minimum traffic (values, indices, indptr,
x, y once) / time / copy bandwidth. The planner plans with ``reuse=REUSE``
(an iterative solver's view: conversion of 2-11 ms is amortised over 1000
applications); planning (first and warm) and each format's conversion (warm,
``prepare_ms``) are reported separately. The oracle is the candidate of the least cost per
application, ``ms + prepare_ms / REUSE`` (the planner's objective), and ``planner_vs_oracle``
compares those costs. The planner plans by default (``measure="auto"``: at this reuse it times the
candidates predicted within 30% of the best, ``planner_measured`` of them, inside ``planning_ms``);
``model_*`` is the models' own choice (``measure="never"``), whose ``predicted_ms`` the
candidates carry. The last table times a 10k-nonzero matrix per call
from Python: ``plan.run``, ``bound(x)`` and cupyx.

Two timings per candidate: ``ms`` times one call between two CUDA events (so it
includes the launch latency from Python, ~5-10 us, and is what one call costs);
``ms_b2b`` times ``B2B`` calls queued back to back between two events, divided by
``B2B`` (the GPU's throughput with the queue kept full, as in an iterative solver).
``frac_of_copy_bw_b2b`` divides by the copy bandwidth measured the same way. A
candidate slower than ``SLOW_MS`` on its first call gets 3 repetitions and no
back-to-back figure. ``--sizes large xl``: 'xl' adds the six families at 27-40M
nonzeros (generator arguments in ``XL``), where launch latency and L2 residency
matter less. Output: ``results/spmv-<device>.json`` (``spmv-k<K>-``, ``spmv-xl-`` ... for
the variants), rewritten after every matrix so a run cut short keeps what it measured;
then ``results/SUMMARY.md`` is regenerated.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _common import cuda_device_name, geomean, queued_s, write_result  # noqa: E402  (beside this script)
from summarize import write_summary  # noqa: E402

from matplan import corpus, plan as make_plan  # noqa: E402
from matplan.corpus import generators  # noqa: E402
from matplan.corpus.io import matrices_dir  # noqa: E402
from matplan.core.timing import cuda_median_s  # noqa: E402
from matplan.kernels import get  # noqa: E402
from matplan.core import device as device_mod
from matplan.models import traffic  # noqa: E402

REUSE = 1000
FAMILIES = ("poisson3d", "rmat", "uniform", "skewed", "block_dense", "banded")
QUICK_FAMILIES = ("poisson3d", "rmat", "skewed")
#: Generator arguments of the 'xl' size (nnz with seed 0, longest row).
XL = {"poisson3d": dict(n=170, points=7),                        # 34,217,600
      "rmat": dict(scale=21, edge_factor=16),                     # 32,417,175, longest 61,923
      "uniform": dict(m=4_000_000, n=4_000_000, nnz_per_row=8),   # 32,000,000
      "skewed": dict(m=8_000_000),                                # 39,587,025, longest 800,000
      "block_dense": dict(nblocks=48, block=700),                 # 29,366,400
      "banded": dict(n=3_000_000, bandwidth=5)}                   # 32,999,970
#: Calls per back-to-back timing, and the number of such timings (median taken).
B2B, B2B_REPS = 20, 7
#: A candidate whose first call takes longer than this is timed 3 times, without back to back.
SLOW_MS = 2.0


def sync_time(cp, fn):
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    r = fn()
    cp.cuda.Device().synchronize()
    return time.perf_counter() - t, r


def label(kernel, params):
    if not params:
        return kernel
    return kernel + "[" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + "]"


def candidates_to_time(pl):
    """The planner's scored candidates, plus the ELL-R variant the sorting rule did not pick."""
    out = [(c.kernel, dict(c.params), c.total_s) for c in pl.candidates if c.source != "rejected"]
    for kernel, params, _ in list(out):
        if kernel == "spmv.ellr":
            out.append((kernel, {"sorted": not params["sorted"]}, float("nan")))
    return out


def b2b_s(cp, fn, calls=B2B, repeats=B2B_REPS):
    """Median seconds per call of ``calls`` calls queued back to back between two CUDA events."""
    return queued_s(cp, fn, calls, repeats)


def copy_bandwidth_b2b(cp, nbytes=1 << 28):
    """Device-to-device copy bandwidth (read + write bytes/s), back-to-back timing."""
    src = cp.random.random(nbytes // 8)
    dst = cp.empty_like(src)

    def copy():
        dst[...] = src
    return 2 * src.nbytes / b2b_s(cp, copy, calls=10)


def bench_matrix(cp, csp, name, A, dtype, reps, copy_bw, rng, copy_bw_b2b, k=1):
    A = A.astype(dtype)
    A.sort_indices()
    Ag = csp.csr_matrix(A)
    x = cp.asarray(rng.random(A.shape[1] if k == 1 else (A.shape[1], k)).astype(dtype) + 0.5)
    yshape = (A.shape[0],) + x.shape[1:]
    ref = A.astype(np.float64) @ cp.asnumpy(x).astype(np.float64)
    scale = abs(A).astype(np.float64) @ np.abs(cp.asnumpy(x).astype(np.float64))
    tol = 1e-10 if dtype == np.float64 else 1e-4
    Ag @ x                                    # warm cupyx/cuSPARSE once before planning
    t_plan_first, pl = sync_time(cp, lambda: make_plan(Ag, x, reuse=REUSE))
    t_plan, pl = sync_time(cp, lambda: make_plan(Ag, x, reuse=REUSE))
    t_model, pm = sync_time(cp, lambda: make_plan(Ag, x, reuse=REUSE, measure="never"))
    f = pl.features
    min_bytes = traffic.csr_spmm_bytes(f)
    rows = []
    for kernel_name, params, predicted in candidates_to_time(pm):
        kernel = get(kernel_name)
        try:
            kernel.prepare(Ag, dict(params))                  # first call compiles (NVRTC, CuPy ops)
            t_prep, prep = sync_time(cp, lambda: kernel.prepare(Ag, dict(params)))
            y = cp.full(yshape, np.nan, dtype=dtype)
            kernel.run(prep, x, out=y)
            err = np.abs(cp.asnumpy(y).astype(np.float64) - ref)
            ok = bool(np.all(err <= tol * (scale + 1e-30)))
            first = cuda_median_s(lambda: kernel.run(prep, x, out=y), 1, warmup=1) * 1e3
            slow = first > SLOW_MS
            ms = cuda_median_s(lambda: kernel.run(prep, x, out=y), 3 if slow else reps, warmup=0 if slow else 3) * 1e3
            ms_b2b = None if slow else b2b_s(cp, lambda: kernel.run(prep, x, out=y)) * 1e3
            del prep
        except Exception as e:  # a failing candidate is reported, never silently dropped
            rows.append(dict(kernel=label(kernel_name, params), error=f"{type(e).__name__}: {e}"))
            continue
        rows.append(dict(kernel=label(kernel_name, params), ms=ms, ms_b2b=ms_b2b, reps=3 if slow else reps,
                         prepare_ms=t_prep * 1e3,
                         predicted_ms=predicted * 1e3 if predicted == predicted else None,
                         correct=ok, frac_of_copy_bw=min_bytes / (ms * 1e-3) / copy_bw,
                         frac_of_copy_bw_b2b=(min_bytes / (ms_b2b * 1e-3) / copy_bw_b2b) if ms_b2b else None))
    timed = [r for r in rows if "ms" in r and r["correct"]]
    vendor = next(r for r in timed if r["kernel"] == "spmv.cusparse")
    ours = [r for r in timed if r["kernel"] != "spmv.cusparse"]
    best = min(ours, key=lambda r: r["ms"])
    for r in timed:              # what one application costs, the planner's objective
        r["per_use_ms"] = r["ms"] + r["prepare_ms"] / REUSE
        r["per_use_ms_b2b"] = r["ms_b2b"] + r["prepare_ms"] / REUSE if r["ms_b2b"] else None
    oracle = min(timed, key=lambda r: r["per_use_ms"])
    chosen = label(pl.kernel, pl.params)
    chosen_row = next((r for r in rows if r["kernel"] == chosen), {})
    model = label(pm.kernel, pm.params)
    model_row = next((r for r in rows if r["kernel"] == model), {})
    fast = [r for r in timed if r["ms_b2b"]]
    best_b2b = min((r for r in fast if r["kernel"] != "spmv.cusparse"), key=lambda r: r["ms_b2b"],
                   default=dict(kernel=None, ms_b2b=None, frac_of_copy_bw_b2b=float("nan")))
    oracle_b2b = min(fast, key=lambda r: r["per_use_ms_b2b"], default=dict(kernel=None, per_use_ms_b2b=None))
    return dict(matrix=name, dtype=np.dtype(dtype).name, nnz=int(A.nnz), m=A.shape[0], n=A.shape[1],
                row_mean=f.row_mean, row_max=f.row_max, warp_ratio=f.warp_ratio, T=f.T,
                kernel=best["kernel"], ms=best["ms"], vendor_ms=vendor["ms"],
                speedup_vs_vendor=vendor["ms"] / best["ms"], frac_of_copy_bw=best["frac_of_copy_bw"],
                vendor_frac_of_copy_bw=vendor["frac_of_copy_bw"],
                planner_kernel=chosen, planner_ms=chosen_row.get("ms"),
                planner_speedup_vs_vendor=(vendor["ms"] / chosen_row["ms"]) if "ms" in chosen_row else None,
                planning_ms=t_plan * 1e3, planning_first_ms=t_plan_first * 1e3, oracle_kernel=oracle["kernel"], oracle_ms=oracle["ms"],
                planner_vs_oracle=(chosen_row["per_use_ms"] / oracle["per_use_ms"]) if "per_use_ms" in chosen_row else None,
                planner_measured=sum(c.source == "measured" for c in pl.candidates),
                model_kernel=model, model_ms=model_row.get("ms"), model_planning_ms=t_model * 1e3,
                model_vs_oracle=(model_row["per_use_ms"] / oracle["per_use_ms"]) if "per_use_ms" in model_row else None,
                kernel_b2b=str(best_b2b["kernel"]), ms_b2b=best_b2b["ms_b2b"], vendor_ms_b2b=vendor["ms_b2b"],
                frac_of_copy_bw_b2b=best_b2b["frac_of_copy_bw_b2b"],
                vendor_frac_of_copy_bw_b2b=vendor["frac_of_copy_bw_b2b"],
                planner_ms_b2b=chosen_row.get("ms_b2b"), oracle_kernel_b2b=oracle_b2b["kernel"],
                planner_vs_oracle_b2b=(chosen_row["per_use_ms_b2b"] / oracle_b2b["per_use_ms_b2b"])
                if chosen_row.get("per_use_ms_b2b") else None,
                all_correct=all(r.get("correct", False) for r in rows), candidates=rows)


def small_overhead(cp, csp, rng, calls=300):
    """Per-call microseconds from Python on a ~10k-nonzero matrix: plan.run, bound(x), cupyx."""
    A = corpus.uniform(m=1250, n=1250, nnz_per_row=8, seed=1)
    Ag = csp.csr_matrix(A)
    x = cp.asarray(rng.random(A.shape[1]))
    pl = make_plan(Ag, x, reuse=1)
    bound = pl.bind(Ag)
    out = {}
    for what, fn in (("plan.run", lambda: pl.run(Ag, x)), ("bound(x)", lambda: bound(x)),
                     ("cupyx A @ x", lambda: Ag @ x)):
        for _ in range(20):
            fn()
        t, _ = sync_time(cp, lambda: [fn() for _ in range(calls)])
        out[what] = t / calls * 1e6
    launch = cp.ElementwiseKernel("T x", "T y", "y = x", "mp_copy")
    y = cp.empty_like(x)
    for _ in range(20):
        launch(x, y)
    t, _ = sync_time(cp, lambda: [launch(x, y) for _ in range(calls)])
    out["one empty-ish launch"] = t / calls * 1e6
    return dict(nnz=int(A.nnz), planner_kernel=label(pl.kernel, pl.params), us_per_call=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="float64, three families, no real matrices")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--sizes", nargs="+", default=["large"], choices=["large", "xl"],
                    help="corpus sizes: 'large' (5-8M nonzeros, the issue's), 'xl' (27-40M)")
    ap.add_argument("--no-real", action="store_true", help="skip the real matrices")
    ap.add_argument("--tag", default="", help="added to the benchmark's name in the JSON file's name")
    ap.add_argument("--k", type=int, default=1, help="columns of X: 1 = SpMV, more = SpMM (Y = A X)")
    args = ap.parse_args(argv)
    import cupy as cp
    import cupyx.scipy.sparse as csp
    rng = np.random.default_rng(0)
    dev = device_mod.current()
    copy_bw = device_mod.measure_copy_bandwidth()
    gpu = cuda_device_name(cp)
    copy_bw_b2b = copy_bandwidth_b2b(cp)
    print(f"# {gpu}: device-to-device copy {copy_bw / 1e9:.0f} GB/s one call, {copy_bw_b2b / 1e9:.0f} GB/s "
          f"back to back (read + write), CuPy {cp.__version__}")
    fams = QUICK_FAMILIES if args.quick else FAMILIES
    mats = []
    if "large" in args.sizes:
        mats += [(f"{fam}-large", (lambda fam=fam: corpus.load(fam, "large"))) for fam in fams]
    if "xl" in args.sizes:
        mats += [(f"{fam}-xl", (lambda fam=fam: getattr(generators, fam)(**XL[fam]))) for fam in fams]
    data_dir = matrices_dir()   # $MATPLAN_MATRICES or ../shared/matrices (the README's setup)
    if not args.quick and not args.no_real:
        if data_dir is None:
            print("# no real matrices folder ($MATPLAN_MATRICES or ../shared/matrices): corpus only")
        else:
            mats += [(name, (lambda A=A: A)) for name, A in corpus.real_matrices(data_dir)]
    dtypes = (np.float64,) if args.quick else (np.float64, np.float32)
    results = []
    hdr = (f"{'matrix':<26} {'dtype':<7} {'nnz':>9} {'best kernel':<34} {'ms':>7} {'cuSP ms':>7} "
           f"{'x cuSP':>6} {'bw':>5} {'cuSP bw':>7} {'planner':<34} {'pl ms':>7} {'pl/orc':>6} {'plan ms':>7} "
           f"{'meas':>4} {'mdl/orc':>7} "
           f"| b2b: {'best kernel':<34} {'bw':>5} {'cuSP bw':>7} {'pl/orc':>6}")
    print(hdr)
    for name, load in mats:
        A = load()
        for dt in dtypes:
            r = bench_matrix(cp, csp, name, A, dt, args.reps, copy_bw, rng, copy_bw_b2b, args.k)
            results.append(r)
            print(f"{name:<26} {r['dtype']:<7} {r['nnz']:>9,} {r['kernel']:<34} {r['ms']:7.3f} "
                  f"{r['vendor_ms']:7.3f} {r['speedup_vs_vendor']:6.2f} {r['frac_of_copy_bw']:5.2f} "
                  f"{r['vendor_frac_of_copy_bw']:7.2f} {r['planner_kernel']:<34} "
                  f"{r['planner_ms'] or float('nan'):7.3f} {r['planner_vs_oracle'] or float('nan'):6.2f} "
                  f"{r['planning_ms']:7.1f} {r['planner_measured']:4d} {r['model_vs_oracle'] or float('nan'):7.2f} "
                  f"| {r['kernel_b2b']:<34} {r['frac_of_copy_bw_b2b']:5.2f} "
                  f"{r['vendor_frac_of_copy_bw_b2b'] or float('nan'):7.2f} "
                  f"{r['planner_vs_oracle_b2b'] or float('nan'):6.2f}"
                  + ("" if r["all_correct"] else "  WRONG/ERROR: see JSON"), flush=True)
            save(args, gpu, copy_bw, copy_bw_b2b, dev, results, None, None)
        del A
        cp.get_default_memory_pool().free_all_blocks()
    summary = {}
    for dt in {r["dtype"] for r in results}:
        rs = [r for r in results if r["dtype"] == dt and r["planner_ms"]]
        if rs:
            summary[dt] = dict(
                planner_geomean_speedup_vs_vendor=geomean([r["planner_speedup_vs_vendor"] for r in rs]),
                best_geomean_speedup_vs_vendor=geomean([r["speedup_vs_vendor"] for r in rs]),
                worst_planner_vs_oracle=max(r["planner_vs_oracle"] for r in rs),
                worst_model_vs_oracle=max((r["model_vs_oracle"] for r in rs if r["model_vs_oracle"]), default=None),
                min_best_frac_of_copy_bw=min(r["frac_of_copy_bw"] for r in rs),
                worst_planner_vs_oracle_b2b=max((r["planner_vs_oracle_b2b"] for r in rs
                                                 if r["planner_vs_oracle_b2b"]), default=None),
                min_best_frac_of_copy_bw_b2b=min(r["frac_of_copy_bw_b2b"] for r in rs))
    print("summary:", json.dumps(summary, indent=1))
    overhead = small_overhead(cp, csp, rng)
    print(f"10k-nonzero matrix ({overhead['nnz']:,} nnz, planner picks {overhead['planner_kernel']}), "
          "us per call from Python:")
    for k, v in overhead["us_per_call"].items():
        print(f"  {k:<22} {v:8.1f}")
    path = save(args, gpu, copy_bw, copy_bw_b2b, dev, results, summary, overhead)
    print("wrote", path, "and", write_summary(args.out))


def save(args, gpu, copy_bw, copy_bw_b2b, dev, results, summary, overhead):
    """Write (or rewrite) the JSON of everything measured so far; returns its path."""
    name = ("spmv" + (f"-k{args.k}" if args.k > 1 else "")
            + ("" if args.sizes == ["large"] else "-" + "-".join(args.sizes)) + ("-quick" if args.quick else "-noreal" if args.no_real else "") + (f"-{args.tag}" if args.tag else ""))
    doc = dict(copy_bandwidth_gbs=copy_bw / 1e9, copy_bandwidth_b2b_gbs=copy_bw_b2b / 1e9,
               planner_device_bw_gbs=dev.mem_bandwidth / 1e9, k=args.k, reuse=REUSE, reps=args.reps, b2b_calls=B2B,
               sizes=args.sizes, results=results, summary=summary, small_matrix_overhead=overhead,
               complete=summary is not None)
    return write_result(args.out, name, gpu, doc)


if __name__ == "__main__":
    main()
