"""The ``matplan`` command: plan, demo (and tune/train/report from the tuning database)."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import scipy.sparse as sp

from . import corpus, planner
from .core import device as device_mod
from .core.version import __version__
from .core.xp import cupy_module, cupyx_sparse, to_host, why_no_gpu
from .kernels import _store as kernel_store, prebuild
from .corpus.io import read_matrix
from .tuning_db import cli as tuning_cli, progress
from .tuning_db.cli import INTERRUPTED_EXIT, positive_int
from .tuning_db.tune import LOCAL as LOCAL_SCHEDULER


def _to_device(x, gpu: bool):
    if not gpu:
        return x
    if sp.issparse(x):
        return cupyx_sparse().csr_matrix(x)
    return cupy_module().asarray(x)


def _use_gpu(args) -> bool:
    if args.cpu:
        return False
    why = why_no_gpu()
    if args.gpu and why:
        raise SystemExit(f"matplan: --gpu given but there is no GPU to use: {why}")
    return why is None


def _where(args, gpu: bool) -> str:
    """'the GPU (NVIDIA H100 80GB HBM3)', or 'the CPU' and why."""
    if gpu:
        cp = cupy_module()
        name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
        return f"the GPU ({name.decode() if isinstance(name, bytes) else name})"
    return "the CPU (" + ("--cpu given" if args.cpu else why_no_gpu()) + ")"


def cmd_plan(args) -> int:
    if args.B and args.k is not None:
        raise SystemExit("matplan plan: give B (a matrix file) or --k, not both")
    A = read_matrix(args.A)
    rng = np.random.default_rng(args.seed)
    if args.B:
        B = read_matrix(args.B)
    elif args.k is not None:
        B = rng.random((A.shape[1], args.k)) + 0.5
    else:
        B = rng.random(A.shape[1]) + 0.5
    gpu = _use_gpu(args)
    device = args.device
    if device is not None and not gpu:
        device_mod.known(device)      # a misspelt name is still an error
        print(f"matplan plan: note: --device {device} ignored: "
              + ("--cpu given" if args.cpu else "no GPU here (CuPy with an NVIDIA GPU is not available)")
              + ", so this is the host's plan (NumPy/SciPy); --device applies on a GPU machine", file=sys.stderr)
        device = None
    p = planner.plan(_to_device(A, gpu), _to_device(B, gpu), reuse=args.reuse,
                     deterministic=args.deterministic, device=device, measure=args.measure)
    print(p.to_json() if args.json else p)
    return 0


def _demo_problems(rng):
    """(op label, matrix name, A, B) pairs from the small corpus: a few per op."""
    for fam in ("poisson3d", "rmat", "skewed", "banded"):
        A = corpus.load(fam, "small", seed=0)
        yield "spmv", fam, A, rng.random(A.shape[1]) + 0.5
    for fam in ("uniform", "block_dense"):
        A = corpus.load(fam, "small", seed=0)
        yield "spmm", fam, A, rng.random((A.shape[1], 8)) + 0.5
    for fam in ("poisson3d", "rmat"):
        A = corpus.load(fam, "small", seed=0)
        yield "spgemm", fam, A, A
    for fam in ("banded", "rmat"):   # A.T: no B
        yield "sptrans", fam, corpus.load(fam, "small", seed=0), None
    A, B = corpus.generators.tall_skinny(4096, 8, np.float64, seed=0)
    yield "tsgemm", "dense 4096x4096, k=8", A, B


def _check(C, ref) -> float:
    """Relative max error of C against the float64 SciPy/NumPy reference."""
    C = to_host(C)
    if sp.issparse(ref):
        C, ref = sp.csr_matrix(C).toarray(), ref.toarray()
    scale = max(float(np.abs(ref).max()), 1e-300) if ref.size else 1.0
    return float(np.abs(np.asarray(C) - ref).max() / scale) if ref.size else 0.0


def cmd_demo(args) -> int:
    gpu = _use_gpu(args)
    rng = np.random.default_rng(args.seed)
    rows, plans, failures = [], [], 0
    for op, name, A, B in _demo_problems(rng):
        ref = A.T.tocsr() if B is None else A @ B
        Ad, Bd = _to_device(A, gpu), None if B is None else _to_device(B, gpu)
        p = planner.plan_transpose(Ad) if B is None else planner.plan(Ad, Bd)
        plans.append(p)
        p.run(Ad, Bd)  # warm-up (compilation, handles)
        t = time.perf_counter()
        C = p.run(Ad, Bd)
        if gpu:
            cupy_module().cuda.Device().synchronize()
        ms = (time.perf_counter() - t) * 1e3
        err = _check(C, ref)
        ok = err <= 1e-10
        failures += not ok
        params = ",".join(f"{k}={v}" for k, v in sorted(p.params.items())) or "-"
        rows.append((op, name, f"{A.nnz if hasattr(A, 'nnz') else A.size:,}", p.kernel, params,
                     f"{ms:.3f}", f"{'ok' if ok else 'FAIL'} ({err:.1e})"))
    head = ("op", "matrix", "nnz", "kernel", "params", "ms", "check vs SciPy")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    print(f"matplan demo on {_where(args, gpu)}")
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    if args.explain:
        for p in plans:
            print(f"\n{p}")
    print(f"{len(rows) - failures}/{len(rows)} results match SciPy")
    return 1 if failures else 0


def _shape(text: str) -> tuple:
    """'20000x20000x8' -> (20000, 20000, 8)."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected MxNxK with positive integers (e.g. 20000x20000x8), got {text!r}")
    return tuple(int(p) for p in parts)


def cmd_warmup(args) -> int:
    why = why_no_gpu()
    if why:
        raise SystemExit(f"matplan warmup: needs CuPy and an NVIDIA GPU ({why})")
    def bar(desc):
        def wrap(items):
            with progress.bar(len(items), desc, "module", not args.no_progress) as b:
                for item in items:
                    yield item
                    b.update(1)
        return wrap

    start = time.perf_counter()
    units = prebuild.warmup(bar("matplan warmup"))
    kernels = sum(n for _, n, _ in units)
    prebuild.warmup_statistics()   # CuPy's kernels for the statistics of large operands
    print(f"matplan warmup: {kernels} kernels of {len(units)} modules and the statistics' CuPy kernels ready in "
          f"{time.perf_counter() - start:.1f} s on {_where(args, True)}")
    if args.tsgemm:
        start = time.perf_counter()
        mods = prebuild.warmup_tsgemm(args.tsgemm, bar("TSM2 register kernels"))
        print(f"matplan warmup: {sum(n for n, _ in mods)} TSM2 register kernels of {len(mods)} modules ready "
              f"in {time.perf_counter() - start:.1f} s (kept in {kernel_store.user_dir()})")
    return 0


def cmd_tune(args) -> int:
    """matplan tune; ``--scheduler local`` runs it on ``matplan.distributed.local_cluster()`` (one
    single-threaded worker per GPU, or ``--n-jobs`` CPU workers), started here and closed after."""
    if args.scheduler != LOCAL_SCHEDULER or args.list:
        return tuning_cli.cmd_tune(args)
    try:
        from . import distributed as md   # the optional Dask extra, imported for this option only
    except ImportError as exc:
        raise SystemExit(f"matplan tune: --scheduler local needs Dask: pip install 'matplan[distributed]' ({exc})")
    gpu = args.backend == "gpu" or (args.backend is None and cupy_module() is not None)
    try:
        cluster = md.local_cluster(args.n_jobs if gpu else args.n_jobs or 1, gpu=gpu)
    except RuntimeError as exc:   # no GPU worker can start (no GPU, or gpu_cluster's extra missing)
        raise SystemExit(f"matplan tune: --scheduler local: {exc}") from exc
    with cluster:
        print(f"matplan tune: started {cluster!r}", file=sys.stderr)
        args.scheduler = cluster.scheduler_address
        return tuning_cli.cmd_tune(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="matplan", description=__doc__)
    ap.add_argument("--version", action="version", version=f"matplan {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def where(p):
        g = p.add_mutually_exclusive_group()
        g.add_argument("--gpu", action="store_true", help="require the GPU")
        g.add_argument("--cpu", action="store_true", help="run on the host even if a GPU is present")
        p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("plan", help="print the plan for A times B (.mtx, .mtx.gz or .npz files), "
                                    "a dense k-column B, or a vector")
    p.add_argument("A", help="matrix file: Matrix Market (.mtx, .mtx.gz) or .npz")
    p.add_argument("B", nargs="?", help="second matrix file (SpGEMM)")
    p.add_argument("--k", type=positive_int, help="B is dense with K >= 1 columns (random)")
    p.add_argument("--reuse", type=positive_int, default=1)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--measure", choices=["auto", "always", "never"], default="auto",
                   help="time the finalists on the GPU (planner.plan's measure; default auto)")
    p.add_argument("--device", help="plan for a known GPU (H100, A100, K40c, ...) instead of the one in use; "
                                    "ignored, with a note, when the plan is for the host")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    where(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("demo", help="plan and run corpus matrices of each op, checked against SciPy")
    p.add_argument("--explain", action="store_true", help="also print every plan in full")
    where(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("warmup", help="load (or compile once) every kernel for the GPU in use, for images "
                                      "that bake the cost in")
    p.add_argument("--tsgemm", type=_shape, nargs="+", metavar="MxNxK",
                   help="also compile TSM2's register kernels that planning these products times")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_warmup)

    tuning_cli.add_subparsers(sub)
    sub.choices["tune"].set_defaults(func=cmd_tune)   # --scheduler local through matplan.distributed
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"matplan: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"matplan {args.cmd}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT


if __name__ == "__main__":
    sys.exit(main())
