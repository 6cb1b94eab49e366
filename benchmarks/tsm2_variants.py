"""TSM2 at k = 8, 16, 32: the parameter sets the planner picked before issue #5's changes against
the new variants, one GPU run (H100: under 4 minutes).

For n in {16384, 32768} (A is n x n), float32 and float64, C order (row kernel) and F order
(column kernel), k in {8, 16, 32}:

* ``old``: the planner's pick on an H100 before the change (t1, t2, t3 from
  tsgemm-*-2850f4e.log at n = 16384 and tsgemm-n32768-*-bb69dc5.log at n = 32768), run as it ran
  then: row kernel with depth 1 (its code is the old kernel's), column kernel with the old split
  count (``slices``: no wave balancing).
* row kernel: t3 in {4, 8} with each depth > 1 :func:`tsm2.row_depths` allows (lane groups share
  the A loads by shuffles, that many warp steps of A in flight), t1 = 512 and 384 (12 warps of
  168 registers instead of 16 of 128), and the old pick at t1 = 384.
* column kernel: the old pick with the split evened out to whole waves (the new default).

Each variant is first checked against NumPy float64 on fresh random data (m = 1531 != n = 5133,
n not a multiple of t1 or of a step, NaN-poisoned output); then timed on the n x n problem with
CUDA events (warm-up, median of --repeats), beside cupy.matmul on the same arrays (whose result
it must also match) and the device-to-device copy bandwidth. Prints one line per variant (fraction of the copy bandwidth,
speedup over cupy.matmul) and writes JSON to --json.

    PYTHONPATH=. python3 benchmarks/tsm2_variants.py --json OUT.json [--n 32768] [--k 16] [--list]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import git_commit  # noqa: E402

#: (n, dtype, order, k) -> (t1, t2, t3) the planner picked on an H100 before issue #5's changes.
OLD_PICKS = {
    (32768, "float32", "C", 8): (512, 8, 4), (32768, "float32", "C", 16): (512, 16, 4),
    (32768, "float32", "C", 32): (512, 32, 4), (32768, "float32", "F", 8): (512, 8, 8),
    (32768, "float32", "F", 16): (256, 16, 16), (32768, "float32", "F", 32): (128, 32, 8),
    (32768, "float64", "C", 8): (512, 8, 4), (32768, "float64", "C", 16): (512, 16, 4),
    (32768, "float64", "C", 32): (512, 32, 4), (32768, "float64", "F", 8): (64, 8, 8),
    (32768, "float64", "F", 16): (128, 16, 8), (32768, "float64", "F", 32): (128, 16, 16),
    (16384, "float32", "C", 8): (512, 8, 4), (16384, "float32", "C", 16): (512, 16, 4),
    (16384, "float32", "C", 32): (512, 32, 4), (16384, "float32", "F", 8): (256, 8, 8),
    (16384, "float32", "F", 16): (256, 16, 16), (16384, "float32", "F", 32): (128, 32, 8),
    (16384, "float64", "C", 8): (512, 8, 4), (16384, "float64", "C", 16): (512, 16, 4),
    (16384, "float64", "C", 32): (512, 32, 4), (16384, "float64", "F", 8): (128, 8, 8),
    (16384, "float64", "F", 16): (128, 16, 8), (16384, "float64", "F", 32): (128, 16, 16),
}
#: Error allowed relative to |A| @ |B| in the small check (as tests/test_tsm2_gpu.py).
RTOL = {"float32": 2e-5 * 8, "float64": 1e-13 * 8}
CHECK_SHAPE = (1531, 5133)
#: Largest |C - cupy.matmul| / max|cupy.matmul| accepted on the timed n x n problem (as benchmarks/tsgemm.py).
BIG_RTOL = {"float32": 1e-4, "float64": 1e-12}


def variants(n: int, dtype: str, order: str, k: int, sms: int = 132) -> list[dict]:
    """The launches to compare for one case: dicts of launch() keywords plus a ``name``
    (``sms``: multiprocessors, for the old split count)."""
    from matplan.kernels.tsgemm import tsm2
    item = np.dtype(dtype).itemsize
    layout = "row" if order == "C" else "col"
    t1, t2, t3 = OLD_PICKS[(n, dtype, order, k)]
    if layout == "col":
        vec = 16 // item                    # aligned A: the launch's vector width before COL_ACC_WORDS
        while vec > 1 and vec * t2 * max(1, item // 4) > tsm2.COL_ACC_WORDS:
            vec //= 2
        old_split = tsm2.split_count("col", n, n, t1, t3, vec, sms)
        return [dict(name="old", t1=t1, t2=t2, t3=t3, slices=old_split),
                dict(name="waves", t1=t1, t2=t2, t3=t3)]
    out = [dict(name="old", t1=t1, t2=t2, t3=t3, depth=1),
           dict(name=f"t1=384,t3={t3},D=1", t1=384, t2=t2, t3=t3, depth=1)]
    t2 = tsm2.balance_t2(k, k, "row", item)
    for t3 in (4, 8):
        g = tsm2.row_groups(t2, t3, item)
        if t3 * -(-t2 // g) > tsm2.MAX_ROW_ACC[item]:
            continue
        u = tsm2.row_steps(t2, g, 16 // item, item)
        for d in tsm2.row_depths(t3, g, u):
            if d == 1 and t3 != out[0]["t3"]:      # depth 1 at other t3: timed before, slower
                continue
            for t1 in ((512, 384) if d > 1 else (512,)):
                v = dict(name=f"t1={t1},t3={t3},G={g},D={d}", t1=t1, t2=t2, t3=t3, depth=d)
                if (t1, t2, t3, d) != (out[0]["t1"], out[0]["t2"], out[0]["t3"], 1):
                    out.append(v)
    return out


def cases(ns, dtypes, orders, ks):
    return [(n, dt, o, k) for n in ns for dt in dtypes for o in orders for k in ks]


def _launch_kw(v):
    return {x: v[x] for x in ("depth", "slices") if x in v}


def check_small(cp, tsm2, dtype, order, k, v, seed) -> float:
    """Max error / (|A| @ |B|) of variant ``v`` on fresh random data against NumPy float64 (NaN: unwritten)."""
    rng = np.random.default_rng(seed)
    m, n = CHECK_SHAPE
    A_h = ((rng.random((m, n)) + 0.5) * rng.choice([-1.0, 1.0], (m, n))).astype(dtype)
    B_h = ((rng.random((n, k)) + 0.5) * rng.choice([-1.0, 1.0], (n, k))).astype(dtype)
    A = cp.asarray(A_h, order=order)
    B = cp.asarray(B_h)
    C = cp.full((m, k), cp.nan, dtype=dtype)
    layout, lda = tsm2.layout_of(A)
    kw = _launch_kw(v)
    kw.pop("slices", None)                   # the old split count is for the n x n problem
    tsm2.launch(A, layout, lda, B, C, v["t1"], min(v["t2"], k), v["t3"], **kw)
    got = C.get().astype(np.float64)
    if not np.isfinite(got).all():
        return float("nan")
    ref = A_h.astype(np.float64) @ B_h.astype(np.float64)
    bound = np.abs(A_h.astype(np.float64)) @ np.abs(B_h.astype(np.float64))
    return float(np.max(np.abs(got - ref) / bound))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="where to write the results")
    ap.add_argument("--n", type=int, nargs="+", default=[32768, 16384], choices=[16384, 32768])
    ap.add_argument("--k", type=int, nargs="+", default=[8, 16, 32], choices=[8, 16, 32])
    ap.add_argument("--dtype", nargs="+", default=["float32", "float64"], choices=["float32", "float64"])
    ap.add_argument("--order", nargs="+", default=["C", "F"], choices=["C", "F"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--budget-s", type=float, default=220.0,
                    help="start no new case after this many seconds (the JSON keeps what ran)")
    ap.add_argument("--list", action="store_true", help="print the variants and exit (no GPU needed)")
    args = ap.parse_args(argv)
    todo = cases(args.n, args.dtype, args.order, args.k)
    if args.list:
        for c in todo:
            for v in variants(*c):
                print(*c, v)
        return 0

    import cupy as cp
    from matplan.kernels.tsgemm import tsm2
    from matplan.core import device as device_mod
    from matplan.core.timing import cuda_median_s

    t0 = time.perf_counter()
    dev = device_mod.current()
    copy_bw = device_mod.measure_copy_bandwidth(1 << 30, repeats=10)
    print(f"# {dev.name}: copy bandwidth {copy_bw / 1e9:.0f} GB/s, CuPy {cp.__version__}, "
          f"commit {git_commit()}", flush=True)
    print(f"{'n':>6} {'dtype':>7} {'ord':>3} {'k':>3} {'variant':>22} {'t1':>4} {'t2':>3} {'t3':>3} "
          f"{'ms':>8} {'frac_bw':>7} {'vs_cupy':>7} {'check':>8}", flush=True)
    rows, result = [], {"device": dev.name, "copy_bandwidth": copy_bw, "commit": git_commit(),
                        "cupy": cp.__version__, "repeats": args.repeats}

    def save():
        result.update(rows=rows, summary=summarise(rows), seconds=time.perf_counter() - t0)
        with open(args.json + ".tmp", "w") as fh:
            json.dump(result, fh, indent=1)
        os.replace(args.json + ".tmp", args.json)

    rng = cp.random.default_rng(2026)
    sms = tsm2._sms()
    A, a_key = None, None
    for ci, (n, dtype, order, k) in enumerate(todo):
        if time.perf_counter() - t0 > args.budget_s:
            print(f"# budget of {args.budget_s:.0f} s spent: {len(todo) - ci} cases left out", flush=True)
            result["left_out"] = [list(c) for c in todo[ci:]]
            break
        if a_key != (n, dtype, order):            # one A per (n, dtype, order), fresh random data
            A = None
            cp.get_default_memory_pool().free_all_blocks()
            A = rng.random((n, n), dtype=dtype)
            if order == "F":
                A = cp.asfortranarray(A)
            cp.get_default_memory_pool().free_all_blocks()
            a_key = (n, dtype, order)
        layout, lda = tsm2.layout_of(A)
        B = rng.random((n, k), dtype=dtype)
        nbytes = (n * n + 2 * n * k) * np.dtype(dtype).itemsize
        ref = cp.matmul(A, B)
        cupy_s = cuda_median_s(lambda: cp.matmul(A, B), args.repeats, 3)
        C = cp.empty((n, k), dtype=dtype)
        for vi, v in enumerate(variants(n, dtype, order, k, sms)):
            row = dict(n=n, dtype=dtype, order=order, layout=layout, k=k, cupy_ms=cupy_s * 1e3,
                       cupy_frac_bw=nbytes / cupy_s / copy_bw, **v)
            try:
                err = check_small(cp, tsm2, dtype, order, k, v, seed=1000 * ci + vi)
                row["check_rel_err"] = err
                row["check_ok"] = bool(err <= RTOL[dtype])
                C.fill(cp.nan)
                run = lambda: tsm2.launch(A, layout, lda, B, C, v["t1"], v["t2"], v["t3"], **_launch_kw(v))  # noqa: E731
                s = cuda_median_s(run, args.repeats, 3)
                err = float(cp.max(cp.abs(C - ref)) / cp.max(cp.abs(ref)))   # NaN: unwritten
                row.update(ms=s * 1e3, frac_bw=nbytes / s / copy_bw, speedup_vs_cupy=cupy_s / s,
                           rel_err_vs_cupy=err)
                row["check_ok"] = row["check_ok"] and err <= BIG_RTOL[dtype]
            except Exception as exc:  # record and go on: one broken variant must not hide the others
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            if "ms" in row:
                flag = "ok" if row["check_ok"] else f"BAD {row['check_rel_err']:.0e}/{row['rel_err_vs_cupy']:.0e}"
                print(f"{n:>6} {dtype:>7} {order:>3} {k:>3} {v['name']:>22} {v['t1']:>4} {v['t2']:>3} "
                      f"{v['t3']:>3} {row['ms']:8.3f} {row['frac_bw']:7.3f} {row['speedup_vs_cupy']:7.2f} "
                      f"{flag:>8}", flush=True)
            else:
                print(f"{n:>6} {dtype:>7} {order:>3} {k:>3} {v['name']:>22} ERROR {row['error']}", flush=True)
        print(f"{n:>6} {dtype:>7} {order:>3} {k:>3} {'cupy.matmul':>22} {'':>4} {'':>3} {'':>3} "
              f"{cupy_s * 1e3:8.3f} {nbytes / cupy_s / copy_bw:7.3f} {1.0:7.2f}", flush=True)
        del B, C, ref
        save()
    A = None
    save()
    print(json.dumps(result["summary"], indent=1), flush=True)
    print(f"# wrote {args.json} in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def summarise(rows):
    """Per case: the old variant's and the best checked new variant's fraction of the copy
    bandwidth and speedup over cupy.matmul; per (n, dtype, order): geomean speedups over cupy.matmul
    across k of the old variant and of the best of all (what the online timing would pick)."""
    out, by_case = {}, {}
    for r in rows:
        by_case.setdefault((r["n"], r["dtype"], r["order"], r["k"]), []).append(r)
    for (n, dt, o, k), rs in sorted(by_case.items()):
        ok = [r for r in rs if "ms" in r and r["check_ok"]]
        old = next((r for r in ok if r["name"] == "old"), None)
        new = [r for r in ok if r["name"] != "old"]
        best = min(new, key=lambda r: r["ms"]) if new else None
        out[f"{n}/{dt}/{o}/k={k}"] = {
            "old_frac_bw": old and round(old["frac_bw"], 3),
            "best_new": best and best["name"], "best_new_frac_bw": best and round(best["frac_bw"], 3),
            "best_new_vs_old": best and old and round(old["ms"] / best["ms"], 3),
            "old_vs_cupy": old and round(old["speedup_vs_cupy"], 3),
            "best_new_vs_cupy": best and round(best["speedup_vs_cupy"], 3),
            "cupy_frac_bw": round(rs[0]["cupy_frac_bw"], 3),
            "failed": [r["name"] for r in rs if "error" in r or not r.get("check_ok", False)],
        }
    geo = {}
    for key, v in out.items():
        n, dt, o, _ = key.split("/")
        g = geo.setdefault(f"{n}/{dt}/{o}", {"old": [], "best_of_all": []})
        if v["old_vs_cupy"]:
            g["old"].append(math.log(v["old_vs_cupy"]))
        best = max(v["best_new_vs_cupy"] or 0, v["old_vs_cupy"] or 0)
        if best:
            g["best_of_all"].append(math.log(best))
    for key, g in geo.items():
        out[f"{key}/geomean_vs_cupy"] = {x: round(math.exp(np.mean(g[x])), 3) if g[x] else None
                                         for x in ("old", "best_of_all")}
    return out


if __name__ == "__main__":
    sys.exit(main())
