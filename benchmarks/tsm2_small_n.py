"""TSM2 at small n (default 8192): where the single call loses its time, and which kernel shapes
fill the GPU there (issue #5's 0.9-of-copy-bandwidth misses are all at n = 8192).

For each (dtype, layout, k): the planner's TSM2 launch, then variants of it (cp.async kernels with
fewer rows per block, more stages; the register kernel with a forced split over n), each checked
against cupy.matmul and timed three ways with CUDA events: ``single`` (one call between two
events, the GPU idle before it: what a user's call costs), ``b2b`` (10 calls queued between two
events: the kernel's throughput) and ``host_us`` (the host's time a call, 50 calls queued, no
waiting). An empty kernel's single and queued times calibrate the launch gap. Fractions are of
the copy bandwidth measured in the same run (bytes of A + B + C once).

    PYTHONPATH=. python3 benchmarks/tsm2_small_n.py [--n 8192] [--k 1 2 4 8 16] --json out.json
        [--extra '{"name": {"tj": 128, "stages": 3}}'] [--no-register]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import git_commit  # noqa: E402

TOL = {"float32": 1e-4, "float64": 1e-10}


def async_variants(tsm2_async, dtype, k, col, extra=None):
    """The preset and knob changes that give more blocks (fewer rows a block) or more bytes in
    flight, and ``extra`` ({name: knobs over the preset}); configs the kernel would reject are
    left out."""
    base = tsm2_async.default_config(dtype, k, col)
    out = {"preset": base, "s6": dict(base, stages=6), "minb1": dict(base, minb=1)}
    out.update({name: dict(base, **knobs) for name, knobs in (extra or {}).items()})
    if base["rr"] >= 2 and not col:
        out["rr/2"] = dict(base, rr=base["rr"] // 2)
        out["rr/2,s6"] = dict(base, rr=base["rr"] // 2, stages=6)
        out["rr/2,minb3"] = dict(base, rr=base["rr"] // 2, minb=3)
    if base["wr"] >= 2:
        out["wr/2"] = dict(base, wr=base["wr"] // 2)
    if base["wj"] >= 2:
        out["wj/2"] = dict(base, wj=base["wj"] // 2)
    item = np.dtype(dtype).itemsize
    keep = {}
    for name, cfg in out.items():
        try:
            tsm2_async.check_config(cfg, item, col)
            keep[name] = cfg
        except ValueError:
            pass
    return keep


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[8192])
    ap.add_argument("--shape", nargs="+", default=None, metavar="MxN",
                    help="A's shapes m x n (rectangular), instead of --n's squares")
    ap.add_argument("--slices", type=int, nargs="*", default=[1, 2, 4],
                    help="forced splits over n of the register kernel")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--dtype", nargs="+", default=["float32", "float64"])
    ap.add_argument("--layout", nargs="+", default=["C", "F"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", required=True)
    ap.add_argument("--extra", default=None, metavar="JSON",
                    help='more cp.async configs, e.g. \'{"tj128": {"tj": 128, "stages": 3}}\'')
    ap.add_argument("--params", nargs="*", default=[], metavar="JSON",
                    help="more TSM2 configs to time where their layout (and k, if given) match")
    ap.add_argument("--no-register", action="store_true", help="skip the register kernel's splits")
    ap.add_argument("--no-async", action="store_true", help="skip the cp.async kernel's variants")
    args = ap.parse_args(argv)

    import cupy as cp
    from matplan import planner
    from matplan.kernels import get
    from matplan.kernels.tsgemm import launch as launch_mod, rules, tsm2_async
    from matplan.kernels.tsgemm.configs import TSM2Config
    from matplan.core import device as device_mod
    from matplan.core.timing import cuda_medians_alternating_s, cuda_queued_s

    copy_bw = device_mod.measure_copy_bandwidth(1 << 30, repeats=10)
    empty = cp.RawKernel(r'extern "C" __global__ void nothing() {}', "nothing")
    e = cuda_medians_alternating_s({"e": lambda: empty((1,), (32,), ())}, 50, 5)["e"]
    eq = cuda_queued_s(lambda: empty((1,), (32,), ()), 10, 20)
    print(f"# {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}: copy bandwidth "
          f"{copy_bw / 1e9:.0f} GB/s; empty kernel single {e * 1e6:.1f} us, queued {eq * 1e6:.1f} us", flush=True)
    kern = get("tsgemm.tsm2")
    rng = cp.random.default_rng(7)
    rows = []
    print(f"{'n':>6} {'dtype':>7} {'lay':>3} {'k':>3} {'variant':>22} {'single':>8} {'b2b':>8} {'host_us':>7} "
          f"{'f_single':>8} {'f_b2b':>6} {'vs_cublas':>9}", flush=True)
    shapes = ([tuple(int(x) for x in s.lower().split("x")) for s in args.shape] if args.shape
              else [(n, n) for n in args.n])
    for m, n in shapes:
        for dtype in args.dtype:
            A0 = rng.random((m, n), dtype=np.float64).astype(dtype)
            for layout in args.layout:
                A = A0 if layout == "C" else cp.asfortranarray(A0)
                col = layout == "F"
                lay, lda = rules.layout_of(A)
                for k in args.k:
                    B = rng.random((n, k), dtype=np.float64).astype(dtype)
                    C = cp.empty((m, k), dtype=dtype)
                    ref = cp.matmul(A, B)
                    plan = planner.plan(A, B)
                    p = next(c for c in plan.candidates if c.kernel == "tsgemm.tsm2").params
                    prep = kern.prepare(A, p)
                    cands = {"planned[" + TSM2Config.of(p).label() + "]": lambda: kern.run(prep, B, out=C),
                             "cublas": lambda: cp.matmul(A, B, out=C)}
                    for extra_p in map(json.loads, args.params):
                        if extra_p.get("layout") == lay and extra_p.pop("k", k) == k:
                            extra_p = dict(extra_p, t2=min(extra_p.get("t2", k), k))
                            prep_x = kern.prepare(A, extra_p)
                            cands["cfg[" + TSM2Config.of(extra_p).label() + "]"] = (
                                lambda prep_x=prep_x: kern.run(prep_x, B, out=C))
                    if (k >= 3 and A.flags.c_contiguous or col) and not args.no_async:
                        extra = json.loads(args.extra) if args.extra else None
                        for name, cfg in async_variants(tsm2_async, dtype, k, col, extra).items():
                            try:
                                go = tsm2_async.AsyncLaunch(A, B, C, cfg, col=col)
                            except ValueError as exc:
                                print(f"# skip async {name}: {exc}")
                                continue
                            cands[f"async {name}"] = (lambda go=go: go(A, B, C))
                    if not p.get("async") and not p.get("tc") and not args.no_register:
                        for S in [None, *args.slices]:
                            go = launch_mod.Launch(A, lay, lda, k, C.strides, p["t1"], min(p["t2"], k), p["t3"],
                                             depth=p.get("depth", 1), slices=S)
                            cands[f"reg {'auto ' if S is None else ''}S={go.S}"] = (lambda go=go: go(A, B, C))
                    nbytes = (m * n + n * k + m * k) * np.dtype(dtype).itemsize
                    vms = None
                    for name, fn in cands.items():
                        C.fill(cp.nan)
                        fn()
                        err = float(cp.max(cp.abs(C - ref)) / cp.max(cp.abs(ref)))
                        if not err <= TOL[dtype]:
                            print(f"# {name}: max rel err {err:.2e} over {TOL[dtype]}: not timed")
                            continue
                        t = cuda_medians_alternating_s({"x": fn, "v": lambda: cp.matmul(A, B)}, args.repeats, 3)
                        q = cuda_queued_s(fn, 10, 7)
                        cp.cuda.Device().synchronize()
                        h0 = time.perf_counter()
                        for _ in range(50):
                            fn()
                        host = (time.perf_counter() - h0) / 50
                        cp.cuda.Device().synchronize()
                        vms = t["v"]
                        row = dict(m=m, n=n, dtype=dtype, layout=layout, k=k, variant=name, single_ms=t["x"] * 1e3,
                                   b2b_ms=q * 1e3, host_us=host * 1e6, vendor_ms=vms * 1e3,
                                   frac_single=nbytes / t["x"] / copy_bw, frac_b2b=nbytes / q / copy_bw,
                                   speedup_vs_vendor=vms / t["x"], max_rel_err=err)
                        rows.append(row)
                        print(f"{m:>6}x{n:<6} {dtype:>7} {layout:>3} {k:>3} {name:>22} "
                              f"{row['single_ms']:8.4f} {row['b2b_ms']:8.4f} "
                              f"{row['host_us']:7.1f} {row['frac_single']:8.3f} {row['frac_b2b']:6.3f} "
                              f"{row['speedup_vs_vendor']:9.3f}", flush=True)
    with open(args.json, "w") as f:
        json.dump(dict(commit=git_commit(), date=time.strftime("%Y-%m-%d"), copy_bandwidth=copy_bw,
                       empty_single_us=e * 1e6, empty_queued_us=eq * 1e6, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
