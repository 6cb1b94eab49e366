"""Where the time of spgemm.hash goes: GPU time of each of our kernels, the rest (CuPy calls, host
transfers, allocation, host work) and the whole call, beside cuSPARSE, on the spgemm.py matrices
(float64, A·A or A·Aᵀ).

* ``kernel_us[name]``: CUDA events around every launch of that kernel in an instrumented call
  (``runtime._launch`` wrapped: the device is synchronised before each launch, so the events time
  the kernel alone), summed over the call's launches; median of ``--reps`` calls.
* ``instrumented_us``: host wall time of that instrumented call (synchronised at the end);
  ``other_us`` = instrumented_us - sum(kernel_us): what is not our kernels.
* ``total_us``: CUDA events around a normal call (GPU idle before it), as spgemm.py times it;
  ``host_ms``: the call's own phase clock (``info['host_ms']``).

    PYTHONPATH=. python3 benchmarks/spgemm_phases.py [--reps 5] [--json out.json] [--max-products 5e8]
        [--set MIN_TPR=32 ...]   # override spgemm's numeric (or tuple) tuning constants (variants, same run)
        [--define SUBWARP_MIN_BLOCKS=6 ...]   # compile the hash_*.cu with -D (their #ifndef constants)
        [--no-esc]   # short rows in hash tables (spgemm(..., esc=False)), for comparison
        [--first]    # every call a first call (guess=False): full analysis, nothing replayed

Without --first, repeated calls on the one-pass paths replay the guessed analysis as recorded
launches, which do not pass through runtime._launch: their time shows as ``other_us``.
"""
from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import git_commit, timed  # noqa: E402
from spgemm import matrices  # noqa: E402


def launch_alone_us(cp, real, name, grid, block, args, smem):
    """GPU microseconds of one spgemm launch (``real``: runtime._launch) with the device idle before
    it and synchronised after it: the kernel alone."""
    cp.cuda.Device().synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    real(name, grid, block, args, smem)
    b.record()
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) * 1e3


def instrumented(cp, hs, A, B, reps, **kw):
    """(median kernel_us by name, median wall us) over ``reps`` calls with every launch timed."""
    from matplan.kernels.spgemm import runtime   # every module launches through runtime._launch
    real = runtime._launch
    per_call = []

    def launch(name, grid, block, args, smem=0):
        per_call[-1][name.split("<")[0]] += launch_alone_us(cp, real, name, grid, block, args, smem)

    walls = []
    runtime._launch = launch
    try:
        for _ in range(reps + 1):
            per_call.append(collections.Counter())
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            C = hs.spgemm(A, B, **kw)
            cp.cuda.Device().synchronize()
            walls.append((time.perf_counter() - t) * 1e6)
            del C
    finally:
        runtime._launch = real
    names = sorted({n for c in per_call for n in c})
    return ({n: float(np.median([c[n] for c in per_call[1:]])) for n in names},
            float(np.median(walls[1:])))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--max-products", type=float, default=5e8, help="skip larger products")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override a numeric or boolean constant of matplan.kernels.spgemm (e.g. MIN_TPR=32, ESC_WINDOW=0)")
    ap.add_argument("--no-esc", action="store_true",
                    help="spgemm(..., esc=False): short rows in hash tables, not numeric_esc")
    ap.add_argument("--first", action="store_true",
                    help="spgemm(..., guess=False): every call analyses its operands, as a first call does")
    ap.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                    help="compile the hash_*.cu with -DNAME=VALUE (e.g. SUBWARP_MIN_BLOCKS=6)")
    args = ap.parse_args(argv)
    from matplan.core.xp import cupy_module
    cp = cupy_module()
    if cp is None:
        sys.exit("benchmarks/spgemm_phases.py needs CuPy and an NVIDIA GPU")
    import cupyx.scipy.sparse as csp
    import glob
    from matplan.kernels import spgemm as hs
    from matplan.kernels.spgemm import global_rows, guesses, numeric, one_pass, panels, rules, runtime, symbolic
    overrides = {}
    for item in args.set:   # each constant is set on the module that reads it
        name, _, value = item.partition("=")
        owner = next((m for m in (rules, global_rows, numeric, one_pass, symbolic, guesses, panels, runtime)
                      if type(getattr(m, name, None)) in (int, float, bool, tuple)), None)
        kind = type(getattr(owner, name, None))
        if owner is None:
            sys.exit(f"--set {item}: spgemm has no numeric, boolean or tuple constant {name!r}")
        overrides[name] = (value.lower() in ("1", "true") if kind is bool
                           else ast.literal_eval(value) if kind is tuple else kind(value))
        setattr(owner, name, overrides[name])
    sources = glob.glob(os.path.join(os.path.dirname(hs.__file__), "hash_*.cu")) + \
        glob.glob(os.path.join(os.path.dirname(hs.__file__), "*.cuh"))
    for item in args.define:   # compile-time constants of the hash kernels (#ifndef NAME ... in a source)
        name, _, value = item.partition("=")
        if not any(f"#ifndef {name}" in open(path).read() for path in sources):
            sys.exit(f"--define {item}: the hash kernels' sources have no overridable {name}")
        overrides[name] = value
        runtime.NVRTC_DEFINES = runtime.NVRTC_DEFINES + (f"-D{name}={value}",)
    if args.no_esc:
        overrides["esc"] = False
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    rows = []
    for name, H in matrices(1e9, time.time()):
        H = sp.csr_matrix(H, dtype=np.float64)
        Bh = H if H.shape[0] == H.shape[1] else H.T.tocsr()
        products = int(np.diff(Bh.indptr)[H.indices].sum())
        if products > args.max_products:
            print(f"# skip {name}: {products:,} products", flush=True)
            continue
        A = csp.csr_matrix(H)
        B = A if Bh is H else csp.csr_matrix(Bh)
        info = {}
        kw = {**({"esc": False} if args.no_esc else {}), **({"guess": False} if args.first else {})}
        total, C = timed(cp, lambda: hs.spgemm(A, B, info=info, **kw), args.reps)
        nnz_c = int(C.nnz)
        del C
        kern, wall = instrumented(cp, hs, A, B, args.reps, **kw)
        vendor, Cv = timed(cp, lambda: A @ B, args.reps)
        del Cv
        rows.append(dict(matrix=name, nnz=int(H.nnz), products=products, nnz_c=nnz_c,
                         total_us=total * 1e3, vendor_us=vendor * 1e3, kernel_us=kern,
                         instrumented_us=wall, other_us=wall - sum(kern.values()),
                         host_ms=info.get("host_ms"), balanced=info.get("balanced")))
        del A, B
        cp.get_default_memory_pool().free_all_blocks()
    doc = dict(benchmark="spgemm_phases", gpu=gpu, commit=git_commit(), cupy=cp.__version__,
               date=time.strftime("%Y-%m-%d", time.gmtime()), reps=args.reps, overrides=overrides,
               results=rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    print(f"# {gpu}, CuPy {cp.__version__}, commit {doc['commit']}, {doc['date']}: microseconds, median of {args.reps}"
          + (f", overrides {overrides}" if overrides else ""))
    names = sorted({n for r in rows for n in r["kernel_us"]})
    print(f"{'matrix':<24} {'products':>11} " + " ".join(f"{n[:14]:>14}" for n in names)
          + f" {'other':>8} {'total':>8} {'cuSPARSE':>8} {'x':>5}")
    for r in rows:
        print(f"{r['matrix']:<24} {r['products']:>11,} "
              + " ".join(f"{r['kernel_us'].get(n, 0.0):14.1f}" for n in names)
              + f" {r['other_us']:8.1f} {r['total_us']:8.1f} {r['vendor_us']:8.1f}"
              f" {r['vendor_us'] / r['total_us']:5.2f}")


if __name__ == "__main__":
    main()
