"""First use in a fresh environment: import, first plan + run, and `matplan demo`, each in a new
process with empty caches (CuPy's kernel cache, matplan's kernel and measurement caches).

One subprocess per operation. Each reports ``import_s`` (``import matplan``), then creates the
CUDA context and its inputs (not counted), then ``first_plan_run_s`` (``planner.plan`` + ``run``
+ synchronisation, checked against SciPy) and ``warm_plan_run_s`` (the same again in the same
process), the kernel chosen and every module NVRTC compiled on the way. ``demo_s`` is the wall
time of ``python -m matplan.cli demo`` in a fresh process, CUDA context and Python start included.

    python benchmarks/coldstart.py [--out benchmarks/results] [--no-prebuilt]

``--no-prebuilt`` ignores the package's prebuilt kernels (MATPLAN_PREBUILT=0): every kernel is
compiled by NVRTC, as before kernels shipped compiled. Writes ``coldstart-<gpu>.json``:
``{"device", "rows": [{"op", "import_s", "first_plan_run_s", "warm_plan_run_s", ...}], "demo_s"}``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPS = ("spmv", "spmm", "spgemm", "sptrans", "tsgemm")
#: Problem size of every sparse operation: 20k x 20k, 200k nonzeros; TS-GEMM 20k x 20k times 20k x 8.
N, NNZ, K = 20_000, 200_000, 8


def _child(op: str) -> dict:
    """Runs in the fresh process: the figures of one operation."""
    t0 = time.perf_counter()
    import matplan
    import_s = time.perf_counter() - t0
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import numpy as np
    import scipy.sparse as sp
    cp.cuda.runtime.getDeviceCount()
    cp.empty(1).sum()   # the CUDA context and CuPy's first kernel: not matplan's cost
    cp.cuda.Device().synchronize()
    rng = np.random.default_rng(0)
    A = sp.random(N, N, density=NNZ / N / N, format="csr", random_state=0, dtype=np.float64)
    A.data += 0.5
    if op == "tsgemm":
        A = rng.random((N, N))
        B = rng.random((N, K))
    else:
        B = {"spmv": rng.random(N), "spmm": rng.random((N, K)), "spgemm": A, "sptrans": None}[op]
    ref = A.T.tocsr() if op == "sptrans" else A @ B
    Ad = cp.asarray(A) if op == "tsgemm" else csp.csr_matrix(A)
    Bd = None if B is None else (csp.csr_matrix(B) if sp.issparse(B) else cp.asarray(B))
    cp.cuda.Device().synchronize()

    def once():
        start = time.perf_counter()
        p = matplan.planner.plan_transpose(Ad) if op == "sptrans" else matplan.plan(Ad, Bd)
        C = p.run(Ad, Bd)
        cp.cuda.Device().synchronize()
        return time.perf_counter() - start, p, C

    first_s, p, C = once()
    warm_s, _, _ = once()
    C = C.get()
    got = C.toarray() if sp.issparse(C) else np.asarray(C)
    want = ref.toarray() if sp.issparse(ref) else np.asarray(ref)
    correct = bool(np.allclose(got, want, rtol=1e-10, atol=1e-12 * max(1.0, float(np.abs(want).max()))))
    from matplan.kernels import _cuda
    return dict(op=op, import_s=round(import_s, 4), first_plan_run_s=round(first_s, 4),
                warm_plan_run_s=round(warm_s, 4), kernel=p.kernel, correct=correct,
                compiled=[{"file": f, "kernels": len(n), "target": t, "s": round(s, 2)} for f, n, t, s in _cuda.COMPILED],
                loaded=sorted({key[0] for key in _cuda._LOADED}))


def _fresh_env(root: Path, prebuilt: bool) -> dict:
    env = dict(os.environ)
    env.update(CUPY_CACHE_DIR=str(root / "cupy"), MATPLAN_KERNEL_CACHE=str(root / "kernels"),
               MATPLAN_MEASURE_CACHE=str(root / "measurements.sqlite"), XDG_CACHE_HOME=str(root / "cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                        env.get("PYTHONPATH")])))
    if not prebuilt:
        env["MATPLAN_PREBUILT"] = "0"
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--no-prebuilt", action="store_true", help="NVRTC compiles every kernel (MATPLAN_PREBUILT=0)")
    ap.add_argument("--child", choices=OPS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child)))
        return 0
    rows = []
    for op in OPS:
        with tempfile.TemporaryDirectory() as tmp:
            run = subprocess.run([sys.executable, __file__, "--child", op], env=_fresh_env(Path(tmp), not args.no_prebuilt),
                                 capture_output=True, text=True, check=False)
        if run.returncode:
            raise SystemExit(f"coldstart {op} failed:\n{run.stderr}")
        rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
        print(f"{op:8s} import {rows[-1]['import_s']:.3f} s  first plan+run {rows[-1]['first_plan_run_s']:.3f} s  "
              f"warm {rows[-1]['warm_plan_run_s'] * 1e3:.1f} ms  {rows[-1]['kernel']}  correct={rows[-1]['correct']}  "
              f"compiled={len(rows[-1]['compiled'])}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        demo = subprocess.run([sys.executable, "-m", "matplan.cli", "demo"], env=_fresh_env(Path(tmp), not args.no_prebuilt),
                              capture_output=True, text=True, check=False)
        demo_s = time.perf_counter() - start
    print(demo.stdout + demo.stderr)
    print(f"demo {demo_s:.1f} s (exit {demo.returncode})")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _common
    import cupy as cp
    name = _common.cuda_device_name(cp)
    bench = "coldstart-nvrtc" if args.no_prebuilt else "coldstart"
    path = _common.write_result(args.out, bench, name, {"device": name, "rows": rows, "demo_s": round(demo_s, 2),
                                                         "demo_ok": demo.returncode == 0, "prebuilt": not args.no_prebuilt})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
