"""Row-major TSM2 with A streamed by cp.async (matplan/kernels/tsgemm/tsm2_async.py) vs the
planner's TSM2 row-major path (tsm2.cu, as benchmarks/tsgemm.py runs it) vs cupy.matmul (cuBLAS),
with the device-to-device copy bandwidth measured in the same run.

For n = m in {16384, 32768} (A n x n, C-ordered, cupy.random data), k in {4, 8, 16, 32}, float32
and float64: every result is first checked against cupy.matmul (max |C - ref| / max |ref|; a
variant over the tolerance is reported and not timed), then timed with CUDA events: median over
ROUNDS rounds of CALLS calls queued back to back (benchmarks/_common.queued_s) after a warm-up.
Fraction of copy bandwidth: bytes of A + B + C (each once) / time / copy bandwidth, the copy
bandwidth from back-to-back cupy.copyto of a 256 MiB array (bytes read + written).

    PYTHONPATH=. python3 benchmarks/tsm2_async_bench.py --out /tmp/tsm2_async.json \\
        [--n 16384 32768] [--k 4 8 16 32] [--dtype float32 float64]

Prints a table and writes JSON (rows, copy bandwidth, per-config registers / spills / blocks per
SM / bytes of A in flight per SM) to --out, rewritten after every (n, dtype) so a cut-short run
keeps its rows. Designed to finish in well under 4 minutes on an H100 (stops timing new cases
past --budget seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import git_commit, queued_s  # noqa: E402

CALLS = 4       # calls queued back to back per round
ROUNDS = 20     # rounds; the median is reported (>= 20 repetitions)
TOL = {"float32": 1e-4, "float64": 1e-10}


def variants(dtype: str, k: int) -> dict:
    """Async configs timed per (dtype, k): the preset and a few knob changes."""
    from matplan.kernels.tsgemm import tsm2_async
    base = tsm2_async.default_config(dtype, k)
    out = {
        "preset": base,
        "s3": dict(base, stages=3),
        "s5": dict(base, stages=5),
        "tj2_s3": dict(base, tj=2 * base["tj"], stages=3),
        "minb1": dict(base, minb=1),
    }
    if k > 16 and dtype == "float32":   # 64 accumulators per lane: fewer shared reads per FMA
        out["cc8_rr8"] = dict(base, wr=1, wj=8, tr=8, rr=8, cc=8, minb=1)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[16384, 32768])
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--dtype", nargs="+", default=["float32", "float64"])
    ap.add_argument("--budget", type=float, default=200.0, help="seconds after which no new case starts")
    ap.add_argument("--no-planner", action="store_true", help="skip the planner's TSM2 path")
    ap.add_argument("--out", required=True, help="JSON output path")
    args = ap.parse_args(argv)

    import cupy as cp
    from matplan.kernels import get
    from matplan.kernels.tsgemm import tsm2_async

    t0 = time.perf_counter()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    src = cp.random.default_rng(1).random(1 << 25)          # 256 MiB of float64
    dst = cp.empty_like(src)
    copy_s = queued_s(cp, lambda: cp.copyto(dst, src), 10, ROUNDS, warmup=3)
    copy_bw = 2 * src.nbytes / copy_s
    del src, dst
    print(f"# {gpu}: copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + write, 256 MiB cupy.copyto), "
          f"CuPy {cp.__version__}, commit {git_commit()}", flush=True)

    # One NVRTC module per dtype with every async config the run times.
    t_c = time.perf_counter()
    for dtype in args.dtype:
        v = 16 // np.dtype(dtype).itemsize
        items = []
        for k in args.k:
            for cfg in variants(dtype, k).values():
                kp = (32 // cfg["tr"]) * cfg["cc"]
                bv = next(b for b in (v, v // 2, v // 4) if b >= 1 and kp % b == 0 and k % b == 0)
                items.append((dtype, cfg, bv))
        tsm2_async.compile_together(items)
        for dt, cfg, bv in items:   # compile now, not inside a timing (same names as the runs)
            tsm2_async.kernel_info(dt, 16, dict(cfg, bvec=bv))
    print(f"# compiled the async kernels in {time.perf_counter() - t_c:.1f} s", flush=True)

    rows, infos = [], {}
    kern = get("tsgemm.tsm2")
    hdr = (f"{'n':>6} {'k':>3} {'dtype':>7} {'variant':>12} {'ms':>8} {'frac_bw':>7} {'vs_cublas':>9} "
           f"{'rel_err':>8}  {'regs':>4} {'blk/SM':>6} {'KB_fly/SM':>9}")
    print(hdr, flush=True)
    stopped = False
    for n in args.n:
        for dtype in args.dtype:
            if stopped:
                break
            item = np.dtype(dtype).itemsize
            rng = cp.random.default_rng(n + item)
            A = rng.random((n, n), dtype=dtype)                 # never time on zeros
            for k in args.k:
                if time.perf_counter() - t0 > args.budget:
                    print(f"# budget of {args.budget:.0f} s spent: stopping before n={n} {dtype} k={k}", flush=True)
                    stopped = True
                    break
                B = rng.random((n, k), dtype=dtype)
                ref = cp.matmul(A, B)
                scale = float(cp.max(cp.abs(ref)))
                nbytes = (n * n + n * k + n * k) * item
                case = []

                def record(name, fn, C, info=None, extra=None):
                    C.fill(cp.nan)
                    try:
                        fn()
                        err = float(cp.max(cp.abs(C - ref))) / scale
                    except Exception as exc:   # record and go on
                        print(f"{n:>6} {k:>3} {dtype:>7} {name:>12}  FAILED: {str(exc)[:150]}", flush=True)
                        case.append(dict(n=n, k=k, dtype=dtype, variant=name, error=str(exc)[:300]))
                        return
                    if not err <= TOL[dtype]:   # NaN too
                        print(f"{n:>6} {k:>3} {dtype:>7} {name:>12}  WRONG: rel err {err:.3g} (not timed)", flush=True)
                        case.append(dict(n=n, k=k, dtype=dtype, variant=name, rel_err=err, wrong=True, **(extra or {})))
                        return
                    s = queued_s(cp, fn, CALLS, ROUNDS, warmup=2)
                    case.append(dict(n=n, k=k, dtype=dtype, variant=name, ms=s * 1e3, rel_err=err,
                                     frac_of_copy_bw=nbytes / s / copy_bw, **(extra or {})))
                    case[-1]["_info"] = info

                C = cp.empty((n, k), dtype=dtype)
                record("cublas", lambda: cp.matmul(A, B, out=C), C)
                if not args.no_planner:
                    from matplan import planner
                    try:
                        plan = planner.plan(A, B)
                        cand = next(c for c in plan.candidates if c.kernel == "tsgemm.tsm2")
                        prep = kern.prepare(A, cand.params)
                        p = dict(cand.params)
                        record("tsm2_planner", lambda: kern.run(prep, B, out=C), C,
                               extra=dict(params={x: p[x] for x in p if isinstance(p[x], (int, float, str))},
                                          planner_kernel=plan.kernel))
                    except Exception as exc:
                        print(f"# planner path failed: {str(exc)[:200]}", flush=True)
                for name, cfg in variants(dtype, k).items():
                    try:
                        info = tsm2_async.kernel_info(dtype, k, cfg, B)
                    except Exception as exc:
                        info = {"error": str(exc)[:200]}
                    infos[f"{dtype}/k={k}/{name}"] = info
                    record(f"async_{name}", lambda cfg=cfg: tsm2_async.matmul_rowmajor_async(A, B, out=C, config=cfg),
                           C, info=info, extra=dict(config=cfg))
                cub = next((r for r in case if r["variant"] == "cublas" and "ms" in r), None)
                for r in case:
                    info = r.pop("_info", None) or {}
                    if "ms" in r and cub:
                        r["speedup_vs_cublas"] = cub["ms"] / r["ms"]
                    if "ms" in r:
                        fly = info.get("a_bytes_in_flight_per_sm")
                        print(f"{n:>6} {k:>3} {dtype:>7} {r['variant'].replace('async_', 'a_'):>12} {r['ms']:8.3f} "
                              f"{r['frac_of_copy_bw']:7.3f} {r.get('speedup_vs_cublas', float('nan')):9.2f} "
                              f"{r['rel_err']:8.1e}  {str(info.get('num_regs', '')):>4} {str(info.get('blocks_per_sm', '')):>6} "
                              f"{'' if fly is None else f'{fly / 1024:.0f}':>9}", flush=True)
                best = max((r for r in case if r["variant"].startswith("async") and "ms" in r),
                           key=lambda r: r["frac_of_copy_bw"], default=None)
                if best:
                    print(f"# best async n={n} k={k} {dtype}: {best['variant']} frac {best['frac_of_copy_bw']:.3f}", flush=True)
                rows += case
                del B, ref, C
            del A
            cp.get_default_memory_pool().free_all_blocks()
            save(args.out, gpu, copy_bw, cp, rows, infos, t0)
    save(args.out, gpu, copy_bw, cp, rows, infos, t0)
    print(f"# total {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


def summarise(rows):
    out = {}
    for dt in sorted({r["dtype"] for r in rows}):
        for k in sorted({r["k"] for r in rows if r["dtype"] == dt}):
            sel = [r for r in rows if r["dtype"] == dt and r["k"] == k and "ms" in r]
            best = {}
            for kind in ("async", "tsm2_planner", "cublas"):
                cand = [r for r in sel if r["variant"].startswith(kind)]
                if cand:
                    b = {}
                    for nn in sorted({r["n"] for r in cand}):
                        rn = max((r for r in cand if r["n"] == nn), key=lambda r: r["frac_of_copy_bw"])
                        b[str(nn)] = dict(variant=rn["variant"], frac_of_copy_bw=round(rn["frac_of_copy_bw"], 4),
                                          ms=round(rn["ms"], 4))
                    best[kind] = b
            out[f"{dt}/k={k}"] = best
    return out


def save(path, gpu, copy_bw, cp, rows, infos, t0):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        json.dump({"device": gpu, "commit": git_commit(), "copy_bandwidth": copy_bw,
                   "cupy": cp.__version__, "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
                   "calls_per_round": CALLS, "rounds": ROUNDS, "seconds": time.perf_counter() - t0,
                   "rows": rows, "summary": summarise(rows), "kernels": infos}, fh, indent=1, default=str)
    os.replace(path + ".tmp", path)
    print(f"# wrote {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
