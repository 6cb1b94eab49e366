"""SpMV/SpMM benchmark: every candidate kernel, cuSPARSE, the planner's choice and the oracle, per matrix.

    PYTHONPATH=. python3 benchmarks/spmv.py [--quick] [--reps 30] [--out DIR] [--k K] [--only M ...]

Matrices: the corpus at size 'large' (>= 5M nonzeros: 3-D Poisson, R-MAT,
uniform, skewed, block-dense, banded) and the real matrices in
``.data/matrices`` (or ../shared/matrices) when present; float64 and float32
(``--only`` and ``--dtypes`` pick some).
Times are CUDA-event medians of ``--reps`` runs after warm-up, taken as ``matplan tune`` takes them:
every candidate of a matrix (and the CuPy call) prepared at once, then timed in rounds rotating
over them, each timed call right after two untimed calls of its own (``_common.rotated_ms``), so
a transient falls on all alike and each finds L2 as its own calls leave it. Two vendor figures, measured in the
same run: ``vendor_ms`` is cuSPARSE prepared once (``spmv.cusparse``: A's descriptor, the dense
descriptors and the workspace made once, y preallocated; the kernel as a C++ user runs it) in its
best configuration: every config of its search space (SpMV: the algorithms; SpMM: B and C
row-major, or column-major with B and C copied in kept buffers, each with each SpMM algorithm,
copies timed) is prepared once and timed as a candidate, and ``vendor_ms`` is the least median of
those checked correct, ``vendor_config`` which one (``vendor_ms_b2b`` / ``vendor_config_b2b`` the
same back to back); ``speedup_vs_vendor`` uses it. ``cupyx_ms`` is cupyx's ``A @ x`` as a CuPy user
calls it (descriptors and workspace made per call, SpMM on a column-major copy of B, a new result).
``vendor_path`` says if the winning config fell back to cupyx, and why.
Every figure is checked against SciPy in float64 first; a ratio with a wrong side is None and
the summary's geomeans count only rows checked correct (``*_rows_counted``).
``frac_of_copy_bw`` = the CSR SpMV's minimum traffic (values, indices, indptr,
x, y once) / time / copy bandwidth, measured in the same run and recorded beside the figure the
planner plans with (``_common.provenance``). The planner plans with ``reuse=REUSE``
(an iterative solver's view: conversion of 2-11 ms is amortised over 1000
applications); planning (first and warm) and each format's conversion (warm,
``prepare_ms``) are reported separately. The oracle is the candidate of the least cost per
application, ``ms + prepare_ms / REUSE`` (the planner's objective), and ``planner_vs_oracle``
compares those costs. The planner plans by default (``measure="auto"``: at this reuse it times the
candidates predicted within 30% of the best, ``planner_measured`` of them, inside ``planning_ms``);
``model_*`` is the models' own choice (``measure="never"``), whose ``predicted_ms`` the
candidates carry. The last table times a 10k-nonzero matrix per call
from Python: ``plan.run``, ``bound(x)``, the prepared cuSPARSE call and cupyx.

Two timings per candidate: ``ms`` times one call between two CUDA events (so it
includes the launch latency from Python, ~5-10 us, and is what one call costs);
``ms_b2b`` times ``B2B`` calls queued back to back between two events, divided by
``B2B`` (the GPU's throughput with the queue kept full, as in an iterative solver), the median of
``B2B_REPS`` rounds rotating over the candidates.
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
import collections
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _common import (bandwidth_info, cuda_device_name, geomean, git_commit, queued_s, rotated_b2b_ms,  # noqa: E402
                     rotated_ms, write_result)
from summarize import write_summary  # noqa: E402

from matplan import corpus, plan as make_plan  # noqa: E402
from matplan.corpus import generators  # noqa: E402
from matplan.corpus.io import matrices_dir, matrix_name, read_matrix  # noqa: E402
from matplan.core.timing import cuda_median_s  # noqa: E402
from matplan.kernels import get  # noqa: E402
from matplan.kernels.spmv.cusparse_prepared import configs as vendor_configs  # noqa: E402
from matplan.core import device as device_mod  # noqa: E402
from matplan.models import traffic  # noqa: E402

REUSE = 1000
#: The vendor candidate: cuSPARSE prepared once (its best config's time is vendor_ms; cupyx's A @ x
#: is cupyx_ms).
VENDOR = "spmv.cusparse"
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
#: The CuPy user's call among the timed candidates (not a kernel's label).
CUPYX = "cupyx A @ x"
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


def is_vendor(kernel_label) -> bool:
    """Whether a candidate's label is one of the vendor's configs (``spmv.cusparse[...]``)."""
    return kernel_label == VENDOR or str(kernel_label).startswith(VENDOR + "[")


def candidates_to_time(pl, dev=None):
    """The planner's scored candidates, plus the ELL-R variant the sorting rule did not pick and
    every config of the prepared vendor call, also those the planner's search leaves out (the
    vendor figure is the best of them)."""
    out = [(c.kernel, dict(c.params), c.total_s) for c in pl.candidates if c.source != "rejected"]
    for kernel, params, _ in list(out):
        if kernel == "spmv.ellr":
            out.append((kernel, {"sorted": not params["sorted"]}, float("nan")))
    if any(kernel == VENDOR for kernel, _, _ in out):
        vendor = get(VENDOR)
        dev = dev or device_mod.current()
        have = [params for kernel, params, _ in out if kernel == VENDOR]
        f = pl.features
        for params in vendor_configs("spmv" if f.op == "spmv" else "spmm", f.dtype, f.index_dtype or None):
            if params not in have:
                out.append((VENDOR, dict(params), vendor.cost(pl.features, params, dev).total(REUSE)))
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


def timed_calls(cp, fns: dict, reps) -> dict:
    """{label: (ms, ms_b2b, reps)} of ``fns`` ({label: callable}): the median single call and back
    to back, both in rounds rotating over the candidates (_common.rotated_ms: each timed call after
    two of its own); a candidate whose first call is slower than SLOW_MS is timed 3 times on its own,
    without back to back; one that raises there gets its error's text instead."""
    out, fast = {}, {}
    for label, fn in fns.items():
        try:
            if cuda_median_s(fn, 1, warmup=1) * 1e3 > SLOW_MS:
                out[label] = (cuda_median_s(fn, 3, warmup=0) * 1e3, None, 3)
            else:
                fast[label] = fn
        except Exception as e:  # reported in the candidate's row
            out[label] = f"{type(e).__name__}: {e}"
    if fast:
        ms, b2b = rotated_ms(cp, fast, reps), rotated_b2b_ms(cp, fast, B2B, B2B_REPS)
        out.update({label: (ms[label], b2b[label], reps) for label in fast})
    return out


def checked(y, ref, scale, tol) -> bool:
    """Every element of ``y`` (a CuPy array) within ``tol`` of ``ref`` relative to |A||x|."""
    err = np.abs(y.get().astype(np.float64).reshape(ref.shape) - ref)
    return bool(np.all(err <= tol * (scale + 1e-30)))


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
    rows, calls = [], {}
    for kernel_name, params, predicted in candidates_to_time(pm):
        kernel = get(kernel_name)
        try:
            kernel.prepare(Ag, dict(params))                  # first call compiles (NVRTC, CuPy ops)
            t_prep, prep = sync_time(cp, lambda: kernel.prepare(Ag, dict(params)))
            y = cp.full(yshape, np.nan, dtype=dtype)
            kernel.run(prep, x, out=y)
            ok = checked(y, ref, scale, tol)
            path = vendor_path(prep) if kernel_name == VENDOR else None
        except Exception as e:  # a failing candidate is reported, never silently dropped
            rows.append(dict(kernel=label(kernel_name, params), error=f"{type(e).__name__}: {e}"))
            continue
        # every format stays prepared until the rounds over all of them are timed
        calls[label(kernel_name, params)] = lambda kernel=kernel, prep=prep, y=y: kernel.run(prep, x, out=y)
        rows.append(dict(kernel=label(kernel_name, params), prepare_ms=t_prep * 1e3,
                         predicted_ms=predicted * 1e3 if predicted == predicted else None,
                         correct=ok, **({"path": path} if path else {})))
    try:                                      # what a CuPy user pays: A @ x, a new result per call
        cupyx = dict(correct=checked(Ag @ x, ref, scale, tol))
        calls[CUPYX] = lambda: Ag @ x
    except Exception as e:
        cupyx = dict(error=f"{type(e).__name__}: {e}")
    timed = timed_calls(cp, calls, reps)
    calls.clear()                             # the formats go
    for row in rows:
        if isinstance(timed.get(row["kernel"]), str):
            row["error"] = timed[row["kernel"]]
        elif row["kernel"] in timed:
            ms, ms_b2b, n_reps = timed[row["kernel"]]
            row.update(ms=ms, ms_b2b=ms_b2b, reps=n_reps, frac_of_copy_bw=min_bytes / (ms * 1e-3) / copy_bw,
                       frac_of_copy_bw_b2b=(min_bytes / (ms_b2b * 1e-3) / copy_bw_b2b) if ms_b2b else None)
    if isinstance(timed.get(CUPYX), str):
        cupyx = dict(error=timed[CUPYX])
    elif CUPYX in timed:
        cupyx.update(ms=timed[CUPYX][0], ms_b2b=timed[CUPYX][1])
    info = dict(matrix=name, dtype=np.dtype(dtype).name, nnz=int(A.nnz), m=A.shape[0], n=A.shape[1],
                row_mean=f.row_mean, row_max=f.row_max, warp_ratio=f.warp_ratio, T=f.T,
                planning_ms=t_plan * 1e3, planning_first_ms=t_plan_first * 1e3,
                planner_measured=sum(c.source == "measured" for c in pl.candidates),
                model_planning_ms=t_model * 1e3)
    return matrix_row(info, rows, cupyx, label(pl.kernel, pl.params), label(pm.kernel, pm.params),
                      min_bytes, copy_bw, copy_bw_b2b)


def vendor_path(prep) -> str:
    """How the vendor candidate ran: "prepared", or the cupyx path with cuSPARSE's reason."""
    call = prep.meta.get("cusparse")
    reasons = ([prep.meta["fallback"]] if prep.meta.get("fallback") else []) + (
        list(call.layout_fallbacks.values()) if call is not None else [])
    return "prepared" if not reasons else "cupyx A @ x: " + "; ".join(reasons)


def matrix_row(info, rows, cupyx, chosen, model, min_bytes, copy_bw, copy_bw_b2b) -> dict:
    """One result row from the timed candidates ``rows`` (dicts with ``kernel``, ``ms``, ``ms_b2b``,
    ``prepare_ms``, ``correct``, or ``error``), the cupyx call's timing ``cupyx`` and the labels of
    the planner's and the models' choices. Every ratio needs both of its sides checked correct;
    a figure of a wrong or failed side is None. ``vendor_ms`` is the prepared cuSPARSE call in its
    fastest config checked correct (``vendor_config``, of ``vendor_configs_correct``; failed or
    wrong ones are counted in ``vendor_configs_failed``), ``cupyx_ms`` the cupyx ``A @ x``."""
    timed = [r for r in rows if "ms" in r and r.get("correct")]
    for r in timed:              # what one application costs, the planner's objective
        r["per_use_ms"] = r["ms"] + r["prepare_ms"] / REUSE
        r["per_use_ms_b2b"] = r["ms_b2b"] + r["prepare_ms"] / REUSE if r.get("ms_b2b") else None
    # the vendor's figure: its fastest config checked correct (each prepared once, timed alike)
    vendors = [r for r in timed if is_vendor(r["kernel"])]
    vendor = min(vendors, key=lambda r: r["ms"], default={})
    vendor_b2b = min((r for r in vendors if r.get("ms_b2b")), key=lambda r: r["ms_b2b"], default={})
    vendor_row = vendor or next((r for r in rows if is_vendor(r["kernel"])), {})
    ours = [r for r in timed if not is_vendor(r["kernel"])]
    best = min(ours, key=lambda r: r["ms"], default={})
    oracle = min(timed, key=lambda r: r["per_use_ms"], default={})
    chosen_row = next((r for r in timed if r["kernel"] == chosen), {})
    model_row = next((r for r in timed if r["kernel"] == model), {})
    fast = [r for r in timed if r.get("ms_b2b")]
    best_b2b = min((r for r in fast if not is_vendor(r["kernel"])), key=lambda r: r["ms_b2b"], default={})
    oracle_b2b = min(fast, key=lambda r: r["per_use_ms_b2b"], default={})
    cupyx_ms = cupyx.get("ms") if cupyx.get("correct") else None
    cupyx_b2b = cupyx.get("ms_b2b") if cupyx.get("correct") else None

    def ratio(a, b):
        return a / b if a and b else None
    return dict(info, kernel=best.get("kernel"), ms=best.get("ms"), vendor_ms=vendor.get("ms"),
                vendor_config=vendor.get("kernel"), vendor_configs_correct=len(vendors),
                vendor_configs_failed=sum(is_vendor(r["kernel"]) and not r.get("correct") for r in rows),
                vendor_path=vendor_row.get("path"), vendor_correct=bool(vendor),
                cupyx_ms=cupyx_ms, cupyx_correct=cupyx.get("correct", False), cupyx_error=cupyx.get("error"),
                speedup_vs_vendor=ratio(vendor.get("ms"), best.get("ms")),
                speedup_vs_cupyx=ratio(cupyx_ms, best.get("ms")),
                vendor_speedup_vs_cupyx=ratio(cupyx_ms, vendor.get("ms")),
                frac_of_copy_bw=best.get("frac_of_copy_bw"),
                vendor_frac_of_copy_bw=vendor.get("frac_of_copy_bw"),
                cupyx_frac_of_copy_bw=ratio(min_bytes, cupyx_ms * 1e-3 * copy_bw if cupyx_ms else None),
                planner_kernel=chosen, planner_ms=chosen_row.get("ms"), planner_correct=bool(chosen_row),
                planner_speedup_vs_vendor=ratio(vendor.get("ms"), chosen_row.get("ms")),
                planner_speedup_vs_cupyx=ratio(cupyx_ms, chosen_row.get("ms")),
                oracle_kernel=oracle.get("kernel"), oracle_ms=oracle.get("ms"),
                planner_vs_oracle=ratio(chosen_row.get("per_use_ms"), oracle.get("per_use_ms")),
                model_kernel=model, model_ms=model_row.get("ms"),
                model_vs_oracle=ratio(model_row.get("per_use_ms"), oracle.get("per_use_ms")),
                kernel_b2b=best_b2b.get("kernel"), ms_b2b=best_b2b.get("ms_b2b"),
                vendor_ms_b2b=vendor_b2b.get("ms_b2b"), vendor_config_b2b=vendor_b2b.get("kernel"),
                cupyx_ms_b2b=cupyx_b2b, frac_of_copy_bw_b2b=best_b2b.get("frac_of_copy_bw_b2b"),
                vendor_frac_of_copy_bw_b2b=vendor_b2b.get("frac_of_copy_bw_b2b"),
                cupyx_frac_of_copy_bw_b2b=ratio(min_bytes, cupyx_b2b * 1e-3 * copy_bw_b2b if cupyx_b2b else None),
                planner_ms_b2b=chosen_row.get("ms_b2b"), oracle_kernel_b2b=oracle_b2b.get("kernel"),
                planner_vs_oracle_b2b=ratio(chosen_row.get("per_use_ms_b2b"), oracle_b2b.get("per_use_ms_b2b")),
                all_correct=all(r.get("correct", False) for r in rows) and bool(cupyx.get("correct")),
                candidates=rows)


def summary_of(results) -> dict:
    """Per dtype: geomeans and extremes over the rows whose figures were checked correct (a ratio
    of a row is None where either side was wrong), with how many rows each counts. The vendor's
    figure of a row is its best prepared config; ``vendor_configs_won`` counts which won."""
    summary = {}
    for dt in sorted({r["dtype"] for r in results}):
        rs = [r for r in results if r["dtype"] == dt]

        def vals(key):
            return [r[key] for r in rs if r.get(key)]
        planner, best = vals("planner_speedup_vs_vendor"), vals("speedup_vs_vendor")
        summary[dt] = dict(
            rows=len(rs),
            planner_geomean_speedup_vs_vendor=geomean(planner), planner_rows_counted=len(planner),
            best_geomean_speedup_vs_vendor=geomean(best), best_rows_counted=len(best),
            planner_geomean_speedup_vs_cupyx=geomean(vals("planner_speedup_vs_cupyx")),
            vendor_geomean_speedup_vs_cupyx=geomean(vals("vendor_speedup_vs_cupyx")),
            min_planner_speedup_vs_vendor=min(planner, default=None),
            worst_planner_vs_oracle=max(vals("planner_vs_oracle"), default=None),
            worst_model_vs_oracle=max(vals("model_vs_oracle"), default=None),
            planner_geomean_vs_oracle=geomean(vals("planner_vs_oracle")),
            model_geomean_vs_oracle=geomean(vals("model_vs_oracle")),
            min_best_frac_of_copy_bw=min(vals("frac_of_copy_bw"), default=None),
            worst_planner_vs_oracle_b2b=max(vals("planner_vs_oracle_b2b"), default=None),
            min_best_frac_of_copy_bw_b2b=min(vals("frac_of_copy_bw_b2b"), default=None),
            vendor_configs_won=dict(collections.Counter(vendor_config_name(r["vendor_config"])
                                                        for r in rs if r.get("vendor_config"))))
    return summary


def vendor_config_name(kernel_label) -> str:
    """A vendor config's label without the kernel's name: ``alg=csr_alg2,order=col``, or
    ``default`` for cuSPARSE's default algorithm on row-major B."""
    rest = str(kernel_label)[len(VENDOR):].strip("[]")
    return rest or "default"


def small_overhead(cp, csp, rng, calls=300):
    """Per-call microseconds from Python on a ~10k-nonzero matrix: plan.run, bound(x), the prepared
    cuSPARSE call into a kept y, cupyx."""
    A = corpus.uniform(m=1250, n=1250, nnz_per_row=8, seed=1)
    Ag = csp.csr_matrix(A)
    x = cp.asarray(rng.random(A.shape[1]))
    pl = make_plan(Ag, x, reuse=1)
    bound = pl.bind(Ag)
    vendor = get(VENDOR)
    prepared, y = vendor.prepare(Ag, {}), cp.empty(A.shape[0])
    out = {}
    for what, fn in (("plan.run", lambda: pl.run(Ag, x)), ("bound(x)", lambda: bound(x)),
                     ("cuSPARSE prepared", lambda: vendor.run(prepared, x, out=y)),
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


def _f(x, fmt):
    """``x`` formatted, or n/a for a figure that is missing (wrong or failed)."""
    return format(x, fmt) if isinstance(x, (int, float)) else format("n/a", ">" + fmt.split(".")[0].lstrip("<>"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="float64, three families, no real matrices")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--sizes", nargs="+", default=["large"], choices=["large", "xl"],
                    help="corpus sizes: 'large' (5-8M nonzeros, the issue's), 'xl' (27-40M)")
    ap.add_argument("--no-real", action="store_true", help="skip the real matrices")
    ap.add_argument("--only", nargs="+", metavar="MATRIX",
                    help="only these matrices (e.g. poisson3d-large ice40_5k_routing); the file is tagged 'only'")
    ap.add_argument("--dtypes", nargs="+", choices=["float64", "float32"],
                    help="value types (default: float64 and float32; float64 with --quick)")
    ap.add_argument("--tag", default="", help="added to the benchmark's name in the JSON file's name")
    ap.add_argument("--k", type=int, default=1, help="columns of X: 1 = SpMV, more = SpMM (Y = A X)")
    args = ap.parse_args(argv)
    import cupy as cp
    import cupyx.scipy.sparse as csp
    rng = np.random.default_rng(0)
    dev = device_mod.current()
    bandwidth = bandwidth_info(cp.cuda.Device().id)
    copy_bw = bandwidth["copy_bandwidth_gbs"] * 1e9
    gpu = cuda_device_name(cp)
    copy_bw_b2b = copy_bandwidth_b2b(cp)
    print(f"# {gpu}, commit {git_commit()}: device-to-device copy {copy_bw / 1e9:.0f} GB/s one call, "
          f"{copy_bw_b2b / 1e9:.0f} GB/s back to back (read + write); the planner plans with "
          f"{bandwidth['planner_bandwidth_gbs']:.0f} GB/s ({bandwidth['planner_bandwidth_source']}); CuPy {cp.__version__}")
    fams = QUICK_FAMILIES if args.quick and not args.only else FAMILIES
    mats = []
    if "large" in args.sizes:
        mats += [(f"{fam}-large", (lambda fam=fam: corpus.load(fam, "large"))) for fam in fams]
    if "xl" in args.sizes:
        mats += [(f"{fam}-xl", (lambda fam=fam: getattr(generators, fam)(**XL[fam]))) for fam in fams]
    data_dir = matrices_dir()   # $MATPLAN_MATRICES or ../shared/matrices (the README's setup)
    if (args.only or not args.quick) and not args.no_real:
        if data_dir is None:
            print("# no real matrices folder ($MATPLAN_MATRICES or ../shared/matrices): corpus only")
        else:
            mats += [(matrix_name(p), (lambda p=p: read_matrix(p))) for p in sorted(data_dir.iterdir())
                     if matrix_name(p) is not None and p.is_file()]   # read one at a time, when benched
    if args.only:
        unknown = sorted(set(args.only) - {name for name, _ in mats})
        if unknown:
            ap.error(f"--only: unknown matrices {unknown}; known: {[name for name, _ in mats]}")
        mats = [(name, load) for name, load in mats if name in args.only]
    dtypes = [np.dtype(d).type for d in args.dtypes] if args.dtypes else (
        (np.float64,) if args.quick else (np.float64, np.float32))
    results = []
    print("vendor = cuSPARSE prepared once (descriptors, workspace; y preallocated), the fastest of its configs "
          "(algorithm; SpMM: B/C order) checked correct, named [in brackets]; cupyx = A @ x as a "
          "CuPy user calls it; ratios are the other's time over ours, n/a where a side was wrong")
    hdr = (f"{'matrix':<24} {'dtype':<7} {'nnz':>10} {'best kernel':<30} {'ms':>7} {'vendor':>7} {'cupyx':>7} "
           f"{'x vend':>6} {'x cupx':>6} {'bw':>5} {'vnd bw':>6} {'planner':<30} {'pl ms':>7} {'pl/vnd':>6} "
           f"{'pl/orc':>6} {'plan ms':>7} {'mdl/orc':>7} | b2b ms: {'ours':>7} {'vendor':>7} {'cupyx':>7}")
    print(hdr)
    for name, load in mats:
        A = load()
        for dt in dtypes:
            r = bench_matrix(cp, csp, name, A, dt, args.reps, copy_bw, rng, copy_bw_b2b, args.k)
            results.append(r)
            pl_vs_vendor = r["vendor_ms"] / r["planner_ms"] if r["vendor_ms"] and r["planner_ms"] else None
            print(f"{name:<24} {r['dtype']:<7} {r['nnz']:>10,} {str(r['kernel']):<30} {_f(r['ms'], '7.3f')} "
                  f"{_f(r['vendor_ms'], '7.3f')} {_f(r['cupyx_ms'], '7.3f')} {_f(r['speedup_vs_vendor'], '6.2f')} "
                  f"{_f(r['speedup_vs_cupyx'], '6.2f')} {_f(r['frac_of_copy_bw'], '5.2f')} "
                  f"{_f(r['vendor_frac_of_copy_bw'], '6.2f')} {r['planner_kernel']:<30} "
                  f"{_f(r['planner_ms'], '7.3f')} {_f(pl_vs_vendor, '6.2f')} {_f(r['planner_vs_oracle'], '6.2f')} "
                  f"{r['planning_ms']:7.1f} {_f(r['model_vs_oracle'], '7.2f')} | "
                  f"{_f(r['ms_b2b'], '15.3f')} {_f(r['vendor_ms_b2b'], '7.3f')} {_f(r['cupyx_ms_b2b'], '7.3f')}"
                  + (f"  [{vendor_config_name(r['vendor_config'])}]" if r["vendor_config"] else "")
                  + ("" if r["vendor_path"] in (None, "prepared") else f"  vendor ran {r['vendor_path']}")
                  + ("" if r["all_correct"] else "  WRONG/ERROR: see JSON"), flush=True)
            save(args, gpu, copy_bw, copy_bw_b2b, dev, results, None, None)
        del A
        cp.get_default_memory_pool().free_all_blocks()
    summary = summary_of(results)
    print("summary (rows checked correct only; vendor = the best prepared cuSPARSE config of each row):",
          json.dumps(summary, indent=1))
    overhead = small_overhead(cp, csp, rng)
    print(f"10k-nonzero matrix ({overhead['nnz']:,} nnz, planner picks {overhead['planner_kernel']}), "
          "us per call from Python:")
    for k, v in overhead["us_per_call"].items():
        print(f"  {k:<22} {v:8.1f}")
    path = save(args, gpu, copy_bw, copy_bw_b2b, dev, results, summary, overhead)
    print("wrote", path, "and", write_summary(args.out))


def result_name(args) -> str:
    """The benchmark's name in its file name: spmv, spmv-k16, spmv-xl, ... and the run's tags."""
    return ("spmv" + (f"-k{args.k}" if args.k > 1 else "")
            + ("" if args.sizes == ["large"] else "-" + "-".join(args.sizes))
            + ("-only" if args.only else "-quick" if args.quick else "-noreal" if args.no_real else "")
            + (f"-{args.tag}" if args.tag else ""))


def save(args, gpu, copy_bw, copy_bw_b2b, dev, results, summary, overhead):
    """Write (or rewrite) the JSON of everything measured so far; returns its path. The measured
    copy bandwidth and the planner's figure are in the provenance fields (``_common.provenance``)."""
    doc = dict(copy_bandwidth_b2b_gbs=copy_bw_b2b / 1e9, k=args.k, reuse=REUSE, reps=args.reps,
               b2b_calls=B2B, sizes=args.sizes, matrices=args.only, results=results, summary=summary,
               small_matrix_overhead=overhead, complete=summary is not None,
               vendor="cuSPARSE SpMV/SpMM prepared once (spmv.cusparse), the fastest of its configurations "
                      "(algorithm; SpMM: B and C row- or column-major, copies timed) checked correct: "
                      "vendor_ms, the config in vendor_config",
               cupyx="cupyx A @ x, as a CuPy user calls it: cupyx_ms")
    return write_result(args.out, result_name(args), gpu, doc)


if __name__ == "__main__":
    main()
