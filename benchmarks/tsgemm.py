"""Tall-and-skinny GEMM benchmark: TSM2 vs cuBLAS (cupy.matmul) and the copy bandwidth, one run.

For n in {8192, 16384, 32768} (A is n x n), k in {1, 2, 4, 8, 16, 32}, float32 and float64, and
both layouts of A (C order: the row-major kernel; F order: the paper's column-major kernel):
the planner plans the product (its measurement times TSM2's configs and cuBLAS), TSM2 runs with the
planned parameters, cuBLAS runs on the same arrays, both timed with CUDA events (median after
warm-up; the single calls of TSM2, cuBLAS and plan.run taken in turn, call by call). Output: a
table on stdout and JSON in benchmarks/results/tsgemm-<device>.json (``tsgemm-subset-<device>.json``
when --n, --k, --dtype or --layout leave out part of the default grid; results/SUMMARY.md is
regenerated at the end), with the planner's times (TSM2 and cuBLAS, measured by the planner or from its cache) and their
errors, and which kernel the planner picked. ``ms`` is the kernel on the prepared A with C given
(TSM2's launch alone); ``planner_ms`` ("plan.run" in the table) is the user's whole call,
``plan.run(A, B)``: validation, preparing A, allocating C and the chosen kernel, against the same
single ``cupy.matmul`` call. plan.run's output is checked against NumPy's product in float64
(``planner_max_rel_err``: the largest error over |A||B| at its entry; ``planner_correct`` under
``summarize.TSGEMM_TOL`` of the dtype); the planner's geomeans count only rows where it is correct. Per n and dtype a device-to-device copy moving as many bytes as one
product reads (half of them read, half written) is timed the same two ways: its fraction of the
copy bandwidth as a single call is the most any single call of that size can show, launch and
all (``same_bytes_copy_frac`` / ``_b2b`` in the rows). A t3 marked * ran the row kernel with
more than one warp step of A in flight (its ``depth``, in the JSON).

    PYTHONPATH=. python3 benchmarks/tsgemm.py [--n 8192 16384] [--k 1 2 4] [--sweep]

--sweep additionally times every (t1, t3) for a few k at n = 16384 (for refining the model).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from _common import geomean, write_result  # noqa: E402  (this folder is on sys.path when run as a script)
from summarize import TSGEMM_TOL, write_summary  # noqa: E402

#: The default grid; a run over part of it writes tsgemm-subset-<device>.json.
GRID = dict(n=[8192, 16384, 32768], k=[1, 2, 4, 8, 16, 32], dtype=["float32", "float64"], layout=["C", "F"])

HERE = os.path.dirname(os.path.abspath(__file__))
#: Calls queued between the two events of the back-to-back timing.
B2B = 10


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=GRID["n"])
    ap.add_argument("--k", type=int, nargs="+", default=GRID["k"])
    ap.add_argument("--dtype", nargs="+", default=GRID["dtype"])
    ap.add_argument("--layout", nargs="+", default=GRID["layout"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-only", metavar="JSON", help="only the kernel-variant sweep, written to JSON")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)

    import cupy as cp
    from matplan import planner
    from matplan.kernels import get
    from matplan.kernels.tsgemm import rules
    from matplan.planner import measure_cache
    from matplan.core import device as device_mod
    from matplan.core.timing import cuda_median_s, cuda_medians_alternating_s

    dev = device_mod.current()
    copy_bw = device_mod.measure_copy_bandwidth(1 << 30, repeats=10)
    gpu = dev.name
    print(f"# {gpu}: copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + write), CuPy {cp.__version__}, "
          f"CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}", flush=True)
    kern = get("tsgemm.tsm2")
    rng = cp.random.default_rng(2024)
    if args.sweep_only:
        run_sweep(cp, copy_bw, rng, out_path=args.sweep_only)
        return 0
    rows = []
    t_start = time.perf_counter()
    hdr = (f"{'n':>6} {'k':>3} {'dtype':>7} {'lay':>3} {'t1':>4} {'t2':>3} {'t3':>3}  {'ms':>7} "
           f"{'cublas':>8} {'speedup':>7} {'frac_bw':>7} {'cub_bw':>6} {'model':>8} {'cubpred':>8} {'planner':>12} {'plan.run':>8}")
    print(hdr, flush=True)
    for n in args.n:
        for dtype in args.dtype:
            A0 = rng.random((n, n), dtype=np.float64).astype(dtype)
            copy_single, copy_b2b = same_bytes_copy(cp, A0, copy_bw)
            A_host = cp.asnumpy(A0).astype(np.float64)   # the reference's A, once for every layout and k
            print(f"# n = {n} {dtype}: a copy moving A's bytes reads {copy_single:.3f} of the copy bandwidth "
                  f"as a single call, {copy_b2b:.3f} back to back", flush=True)
            for layout in args.layout:
                A = A0 if layout == "C" else cp.asfortranarray(A0)
                for k in args.k:
                    B = rng.random((n, k), dtype=np.float64).astype(dtype)
                    plan = planner.plan(A, B)
                    cand = next(c for c in plan.candidates if c.kernel == "tsgemm.tsm2")
                    vcand = next(c for c in plan.candidates if c.kernel == "gemm.cublas")
                    raw_ms = rules.model_time(dev, n, n, k, dtype, p_layout(layout), cand.params["t1"],
                                             cand.params["t2"], cand.params["t3"]) * 1e3
                    p = cand.params
                    prep = kern.prepare(A, p)
                    C = cp.full((n, k), cp.nan, dtype=dtype)
                    kern.run(prep, B, out=C)
                    ref = A @ B
                    err = float(cp.max(cp.abs(C - ref)) / cp.max(cp.abs(ref)))
                    # the user's call plan.run, checked against NumPy in float64 (the tolerance scaled by |A||B|)
                    plan_err = plan_run_error(cp.asnumpy(plan.run(A, B)), A_host, cp.asnumpy(B))
                    plan_ok = plan_err < TSGEMM_TOL[dtype]
                    # back to back: B2B calls between two events (the host's per-call work overlaps);
                    # first, so the GPU's clocks are up after the planner's compiles left it idle
                    # (timed after them, single calls at n = 8192 float32 k = 32 once read 2.6x
                    # their back-to-back time, TSM2 and cuBLAS alike)
                    ms_q = cuda_median_s(lambda: [kern.run(prep, B, out=C) for _ in range(B2B)], 5, 1) * 1e3 / B2B
                    vms_q = cuda_median_s(lambda: [cp.matmul(A, B) for _ in range(B2B)], 5, 1) * 1e3 / B2B
                    # single calls in turn (a drift of the host's speed falls on each alike); the
                    # user's call plan.run validates, prepares A, allocates C and launches
                    t = cuda_medians_alternating_s({"ms": lambda: kern.run(prep, B, out=C), "vms": lambda: cp.matmul(A, B),
                                                    "run_ms": lambda: plan.run(A, B)}, args.repeats, 3)
                    ms, vms, run_ms = (t[key] * 1e3 for key in ("ms", "vms", "run_ms"))
                    nbytes = (n * n + 2 * n * k) * np.dtype(dtype).itemsize
                    row = dict(n=n, k=k, dtype=dtype, layout=layout, t1=p["t1"], t2=p["t2"], t3=p["t3"],
                               depth=p.get("depth", 1),
                               ms=ms, vendor_ms=vms, speedup_vs_vendor=vms / ms,
                               frac_of_copy_bw=nbytes / (ms * 1e-3) / copy_bw,
                               vendor_frac_of_copy_bw=nbytes / (vms * 1e-3) / copy_bw,
                               ms_b2b=ms_q, vendor_ms_b2b=vms_q,
                               frac_of_copy_bw_b2b=nbytes / (ms_q * 1e-3) / copy_bw,
                               vendor_frac_of_copy_bw_b2b=nbytes / (vms_q * 1e-3) / copy_bw,
                               model_predicted_ms=cand.run_s * 1e3, model_source=cand.source,
                               model_uncalibrated_ms=raw_ms, vendor_predicted_ms=vcand.run_s * 1e3,
                               vendor_source=vcand.source, groups=(rules.row_groups(p["t2"], p["t3"], np.dtype(dtype).itemsize)
                                                                   if layout == "C" else 1),
                               planner_kernel=plan.kernel,
                               planner_ms=run_ms, planner_frac_of_copy_bw=nbytes / (run_ms * 1e-3) / copy_bw,
                               max_rel_err=err, planner_max_rel_err=plan_err, planner_correct=plan_ok,
                               t1_source=p.get("t1_source", ""),
                               same_bytes_copy_frac=copy_single, same_bytes_copy_frac_b2b=copy_b2b,
                               variant=(f"tc:{p['tc']}" if p.get("tc") else f"async:{p['async']}" if p.get("async")
                                        else "register"))
                    rows.append(row)
                    print(f"{n:>6} {k:>3} {dtype:>7} {layout:>3} {p['t1']:>4} {p['t2']:>3} {p['t3']:>3}{'*' if p.get('depth', 1) > 1 else ' '}"
                          f"{ms:8.3f} {vms:8.3f} {vms / ms:7.2f} {row['frac_of_copy_bw']:7.3f} "
                          f"{row['vendor_frac_of_copy_bw']:6.3f} {cand.run_s * 1e3:8.3f} {vcand.run_s * 1e3:8.3f} {plan.kernel:>12}"
                          f" {run_ms:8.3f}"
                          + ("" if err < (1e-4 if dtype == "float32" else 1e-12) else f"  ERR {err:.2e}")
                          + ("" if plan_ok else f"  plan.run ERR {plan_err:.2e}"),
                          flush=True)
                    del B, C, ref, prep
                del A
            del A0, A_host
            cp.get_default_memory_pool().free_all_blocks()
        save(args, gpu, copy_bw, cp, measure_cache, rows, [], t_start)

    sweep = run_sweep(cp, copy_bw, rng) if args.sweep else []
    print(json.dumps(save(args, gpu, copy_bw, cp, measure_cache, rows, sweep, t_start), indent=1), flush=True)
    print(f"# wrote {write_summary(args.out)}", flush=True)


def plan_run_error(C, A, B) -> float:
    """Largest |C - A @ B| over (|A| @ |B|) at that entry, the product taken by NumPy in float64 on
    the host (C, A, B NumPy arrays): the error of plan.run's output C relative to the magnitudes
    that made each entry; inf where C's shape is wrong or it holds a NaN."""
    A64, B64, C64 = (np.asarray(X, dtype=np.float64) for X in (A, B, C))
    if C64.shape != (A64.shape[0], B64.shape[1]) or not np.all(np.isfinite(C64)):
        return float("inf")
    scale = np.abs(A64) @ np.abs(B64)
    err = np.abs(C64 - A64 @ B64)
    return float(np.max(err / np.maximum(scale, np.finfo(np.float64).tiny)))


def same_bytes_copy(cp, A0, copy_bw) -> tuple:
    """(single call, back to back) fractions of ``copy_bw`` of a device-to-device copy of half of
    A0's bytes (A0's bytes moved: read plus written), on data that is not zeros (A0's)."""
    from matplan.core.timing import cuda_median_s
    src = A0.ravel()[: A0.size // 2]
    dst = cp.empty_like(src)

    def copy():
        dst[...] = src
    single = cuda_median_s(copy, 15, 3)
    b2b = cuda_median_s(lambda: [copy() for _ in range(B2B)], 5, 1) / B2B
    moved = 2 * src.nbytes
    return moved / single / copy_bw, moved / b2b / copy_bw


def p_layout(order: str) -> str:
    return "row" if order == "C" else "col"


def save(args, gpu, copy_bw, cp, measure_cache, rows, sweep, t_start):
    """Write the JSON (atomically; called after every n so a cut-short run keeps its rows)."""
    summary = summarise(rows)
    full = all(set(GRID[key]) <= set(getattr(args, key)) for key in GRID)
    path = write_result(args.out, "tsgemm" if full else "tsgemm-subset", gpu, {
        "copy_bandwidth": copy_bw, "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "seconds": time.perf_counter() - t_start, "grid": {key: getattr(args, key) for key in GRID},
        "rows": rows, "summary": summary, "sweep": sweep,
        "measurements": [e.to_dict() for e in measure_cache.cache().entries()
                         if e.key.config.kernel in ("tsgemm.tsm2", "gemm.cublas")]})
    print(f"# wrote {path}", flush=True)
    return summary


def summarise(rows):
    """Geomean speedups per (dtype, layout) and per dtype over both layouts ("float32/all", the
    issue's float32 geomean), min frac of copy bw for k <= 16, model error, planner loss."""
    out = {}
    for dt in sorted({r["dtype"] for r in rows}):
        for lay in sorted({r["layout"] for r in rows}) + ["all"]:
            sel = [r for r in rows if r["dtype"] == dt and lay in ("all", r["layout"])]
            if not sel:
                continue
            small = [r["frac_of_copy_bw"] for r in sel if r["k"] <= 16]
            small_q = [r["frac_of_copy_bw_b2b"] for r in sel if r["k"] <= 16]
            small_rel = [r["frac_of_copy_bw"] / r["same_bytes_copy_frac"] for r in sel if r["k"] <= 16]
            out[f"{dt}/{lay}"] = {
                "geomean_speedup_vs_cublas": geomean([r["speedup_vs_vendor"] for r in sel]),
                "min_frac_copy_bw_k_le_16": min(small) if small else None,
                "min_frac_copy_bw_k_le_16_b2b": min(small_q) if small_q else None,
                "min_single_vs_same_bytes_copy_k_le_16": min(small_rel) if small_rel else None,
                "geomean_speedup_vs_cublas_b2b": geomean([r["vendor_ms_b2b"] / r["ms_b2b"] for r in sel]),
                "frac_copy_bw_by_k": {r["k"]: round(r["frac_of_copy_bw"], 3) for r in sel if r["n"] == max(x["n"] for x in sel)},
                "model_abs_rel_err_median": float(np.median([abs(r["model_predicted_ms"] / r["ms"] - 1) for r in sel])),
                "model_abs_rel_err_max": float(max(abs(r["model_predicted_ms"] / r["ms"] - 1) for r in sel)),
                "uncalibrated_model_abs_rel_err_median": float(np.median([abs(r["model_uncalibrated_ms"] / r["ms"] - 1) for r in sel])),
                "vendor_model_abs_rel_err_median": float(np.median([abs(r["vendor_predicted_ms"] / r["vendor_ms"] - 1) for r in sel])),
                "planner_picks_tsm2": sum(r["planner_kernel"] == "tsgemm.tsm2" for r in sel),
                "planner_geomean_speedup_vs_cublas": geomean([r["vendor_ms"] / r["planner_ms"] for r in sel
                                                              if r.get("planner_correct", True)]),
                "planner_worst_vs_cublas": max((r["planner_ms"] / r["vendor_ms"] for r in sel
                                                if r.get("planner_correct", True)), default=None),
                "planner_wrong": sum(r.get("planner_correct") is False for r in sel),
                "planner_min_frac_copy_bw_k_le_16": min(r["planner_frac_of_copy_bw"] for r in sel if r["k"] <= 16),
            }
    return out


def run_sweep(cp, copy_bw, rng, n=16384, out_path=None, cols=False):
    """Kernel variants at n = 16384: row kernel (k = 8, 16, 32) over rows per warp t3 (lane groups
    by the rule) with 1 or row_steps() warp steps per B tile; with ``cols`` also the column kernel
    (float32) over t3 and the accumulator budget that sets V. Each row: dtype, layout, k, t1, t2,
    t3, groups/steps or col_words, ms, frac of the copy bandwidth."""
    from matplan.core.timing import cuda_median_s
    from matplan.kernels.tsgemm import launch, rules
    res = []

    def record(**row):
        res.append(row)
        if out_path:
            with open(out_path, "w") as fh:
                json.dump(res, fh, indent=0)

    def bench(A, layout, lda, B, C, t1, t2, t3, **kw):
        item = A.itemsize
        try:
            s = cuda_median_s(lambda: launch.launch(A, layout, lda, B, C, t1, t2, t3, **kw), 7, 2)
        except Exception as exc:  # record and go on
            return dict(error=str(exc)[:200])
        return dict(ms=s * 1e3, frac=(A.size + 2 * A.shape[0] * B.shape[1]) * item / s / copy_bw)

    for dtype in ("float32", "float64"):
        A0 = rng.random((n, n), dtype=np.float64).astype(dtype)
        item = np.dtype(dtype).itemsize
        for layout in (("row", "col") if cols else ("row",)):
            if layout == "col" and dtype == "float64":
                continue
            A = A0 if layout == "row" else cp.asfortranarray(A0)
            _, lda = rules.layout_of(A)
            for k in ((8, 16, 32) if layout == "row" else (8, 16, 32)):
                B = rng.random((n, k), dtype=np.float64).astype(dtype)
                C = cp.empty((n, k), dtype=dtype)
                t2 = rules.balance_t2(k, k, layout, item)
                if layout == "row":   # steps per B tile: 1 against the rule's (row_steps)
                    variants = [dict(t3=t3, groups=rules.row_groups(t2, t3, item), steps=u)
                                for t3 in (2, 4, 8) for u in (1, rules.row_steps(t2, rules.row_groups(t2, t3, item), 16 // item, item))
                                if t3 * -(-t2 // rules.row_groups(t2, t3, item)) <= rules.MAX_ROW_ACC[item]]
                    variants = [v for i, v in enumerate(variants) if v not in variants[:i]]
                else:
                    variants = [dict(t3=t3, col_words=w) for t3 in (4, 8, 16) for w in (32, 64)]
                for v in variants:
                    for t1 in (256, 512):
                        if not rules.t1_fits(layout, t1, t2, item):
                            continue
                        r = bench(A, layout, lda, B, C, t1, t2, v["t3"],
                                  **{x: v[x] for x in ("groups", "col_words", "steps") if x in v})
                        record(dtype=dtype, layout=layout, k=k, t1=t1, t2=t2, **v, **r)
                ok = [r for r in res if r.get("k") == k and r["dtype"] == dtype and r["layout"] == layout and "frac" in r]
                for r in sorted(ok, key=lambda r: -r["frac"])[:3]:
                    print(f"# sweep {dtype} {layout} k={k}: " + " ".join(f"{x}={r[x]}" for x in ("t1", "t3", "groups", "steps", "col_words") if x in r)
                          + f" {r['ms']:.3f} ms frac {r['frac']:.3f}", flush=True)
            del A
        del A0
        cp.get_default_memory_pool().free_all_blocks()
    return res


if __name__ == "__main__":
    sys.exit(main())
