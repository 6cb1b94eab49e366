"""Where the time of sptrans.transpose goes: GPU time per phase, host time of the launch path, and
the same two figures for CuPy's A.T.tocsr(), on the sptrans.py matrices (float64).

* ``gpu_us[phase]``: CUDA events between the launches of the default (segsort) method
  (``sptrans._transpose`` with a mark after each launch: count, scan, scatter, sort_short,
  sort_big; ``wrap`` is the result's assembly), a ~0.3 ms spin kernel queued first so the launches
  wait on the GPU and the events time the kernels only (plus the GPU's own launch gaps); median of
  ``--reps``. ``--merge`` adds ``merge_gpu_us``, the segmented merge one phase a launch.
* ``fused_us``: CUDA events around the production call, the GPU idle before it (as
  benchmarks/sptrans.py times it); ``fused_queued_us``: the same behind a spin kernel (GPU time
  only, host overhead hidden); ``merge_fused_us`` / ``merge_queued_us``: the same for
  ``method="merge"``; ``radix_gpu_us`` / ``radix_queued_us`` / ``radix_fused_us`` /
  ``radix_host_us``: the same for ``method="radix"`` (phases digits, pass0, pass1, ..., bounds).
* ``host_us``: wall time of the call on the host (returns without waiting for the GPU);
  ``vendor_host_us`` likewise for A.T.tocsr().

    PYTHONPATH=. python3 benchmarks/sptrans_phases.py [--reps 30] [--merge] [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import geomean, git_commit, timed  # noqa: E402
from sptrans import matrices  # noqa: E402


def _spin(cp):
    k = cp.RawKernel(r'''extern "C" __global__ void spin(long long c){
        long long t = clock64(); while (clock64() - t < c) {} }''', "spin")
    return lambda: k((1,), (1,), (np.int64(500_000),))   # ~0.3 ms at 1.7 GHz


def phases(cp, st, A, spin, reps, method="segsort"):
    per = collections.defaultdict(list)   # phase names as the marks give them (radix: digits, pass0, ..., bounds)
    queued = []
    for _ in range(reps + 2):
        evs = []

        def mark(name):
            e = cp.cuda.Event()
            e.record()
            evs.append((name, e))
        spin()
        mark("start")
        T = st._transpose(A, False, mark, method)
        mark("wrap")
        evs[-1][1].synchronize()
        for (_, a), (name, b) in zip(evs, evs[1:]):
            per[name].append(cp.cuda.get_elapsed_time(a, b) * 1e3)
        del T
        spin()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        T = st.transpose(A, method=method)
        b.record()
        b.synchronize()
        queued.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
        del T
    return {k: float(np.median(v[2:])) for k, v in per.items()}, float(np.median(queued[2:]))


def host_us(cp, fn, reps):
    ts = []
    for _ in range(reps):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        out = fn()
        ts.append((time.perf_counter() - t) * 1e6)
        del out
    cp.cuda.Device().synchronize()
    return float(np.median(ts))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--merge", action="store_true", help="also the segmented merge's phases")
    args = ap.parse_args(argv)
    from matplan.core.xp import cupy_module
    cp = cupy_module()
    if cp is None:
        sys.exit("benchmarks/sptrans_phases.py needs CuPy and an NVIDIA GPU")
    import cupyx.scipy.sparse as csp
    from matplan.kernels.sptrans import gpu as st
    spin = _spin(cp)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    rows = []
    for name, load in matrices():
        H = sp.csr_matrix(load(), dtype=np.float64)
        A = csp.csr_matrix((cp.asarray(H.data), cp.asarray(H.indices.astype(np.int32)),
                            cp.asarray(H.indptr.astype(np.int32))), shape=H.shape)
        gpu_us, queued = phases(cp, st, A, spin, args.reps)
        row = dict(matrix=name, nnz=int(H.nnz), n=int(H.shape[1]), gpu_us=gpu_us, fused_queued_us=queued,
                   fused_us=timed(cp, lambda: st.transpose(A), args.reps, warmup=3)[0] * 1e3,
                   vendor_us=timed(cp, lambda: A.T.tocsr(), args.reps, warmup=3)[0] * 1e3,
                   host_us=host_us(cp, lambda: st.transpose(A), args.reps),
                   vendor_host_us=host_us(cp, lambda: A.T.tocsr(), args.reps),
                   merge_fused_us=timed(cp, lambda: st.transpose(A, method="merge"), args.reps, warmup=3)[0] * 1e3,
                   radix_fused_us=timed(cp, lambda: st.transpose(A, method="radix"), args.reps, warmup=3)[0] * 1e3,
                   radix_host_us=host_us(cp, lambda: st.transpose(A, method="radix"), args.reps))
        row["radix_gpu_us"], row["radix_queued_us"] = phases(cp, st, A, spin, args.reps, "radix")
        if args.merge:
            row["merge_gpu_us"], row["merge_queued_us"] = phases(cp, st, A, spin, args.reps, "merge")
        rows.append(row)
        del A
        cp.get_default_memory_pool().free_all_blocks()
    doc = dict(benchmark="sptrans_phases", gpu=gpu, commit=git_commit(), cupy=cp.__version__,
               date=time.strftime("%Y-%m-%d", time.gmtime()), reps=args.reps, results=rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    print(f"# {gpu}, CuPy {cp.__version__}, commit {doc['commit']}, {doc['date']}: microseconds, median of {args.reps}")
    cols = list(st.PHASES) + ["wrap"]
    print(f"{'matrix':<24} {'nnz':>8} " + " ".join(f"{c[:8]:>8}" for c in cols)
          + f" {'queued':>7} {'fused':>7} {'host':>6} {'cupy':>7} {'cupyhost':>8} {'x':>5}")
    for r in rows:
        print(f"{r['matrix']:<24} {r['nnz']:>8} " + " ".join(f"{r['gpu_us'][c]:8.1f}" for c in cols)
              + f" {r['fused_queued_us']:7.1f} {r['fused_us']:7.1f} {r['host_us']:6.1f} {r['vendor_us']:7.1f}"
              f" {r['vendor_host_us']:8.1f} {r['vendor_us'] / r['fused_us']:5.2f} {r['merge_fused_us']:7.1f}")
    print("radix: " + f"{'matrix':<24} {'passes':>6} {'digits':>7} {'bounds':>7} {'passes':>7} {'queued':>7} "
          f"{'fused':>7} {'host':>6} {'x':>5}")
    for r in rows:
        g = r["radix_gpu_us"]
        npass = sum(1 for k in g if k.startswith("pass"))
        print(f"radix: {r['matrix']:<24} {npass:>6} {g['digits']:7.1f} {g['bounds']:7.1f} "
              f"{sum(v for k, v in g.items() if k.startswith('pass')):7.1f} {r['radix_queued_us']:7.1f} "
              f"{r['radix_fused_us']:7.1f} {r['radix_host_us']:6.1f} {r['vendor_us'] / r['radix_fused_us']:5.2f}")
    for key, label in (("fused_us", "auto, the default"), ("radix_fused_us", "radix"), ("merge_fused_us", "merge")):
        xs = [r["vendor_us"] / r[key] for r in rows]
        print(f"geomean x CuPy ({label}) {geomean(xs):.2f}" if xs else "no matrices")


if __name__ == "__main__":
    main()
