"""The sort-based numeric kernel (numeric_esc) against the hash tables, whole spgemm calls in
float64 and float32, interleaved in rounds so both see the same GPU and host state, beside
cuSPARSE: on the one-pass path, numeric_esc against esc=False; on the two-pass path, the hybrid
(numeric_esc's rows skip the symbolic pass) against the plain two passes (HYBRID_MIN_ROWS past any
count). Corpus matrices small and medium and the real matrices of ../shared/matrices.

    PYTHONPATH=. python3 benchmarks/spgemm_esc.py [--reps 30] [--rounds 3] [--json out.json]

Prints, per matrix and dtype, the median ms of each (CUDA events around a whole call, the GPU idle
before it) and the ratios; every result is checked against the other kernel's (same pattern,
values within 1e-12 / 1e-5 relative).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import geomean, git_commit, timed  # noqa: E402


def problems():
    from matplan import corpus
    for size in ("small", "medium"):
        for fam in ("poisson2d", "poisson3d", "uniform", "banded", "block_dense", "skewed"):
            yield f"{fam}-{size}", corpus.load(fam, size)
    for name, A in corpus.real_matrices(None):   # MATPLAN_MATRICES or ../shared/matrices
        if name in ("world_highways", "dragon_mesh_laplacian", "metis_copter2", "ice40_5k_routing"):
            yield name, A


def _two_passes(hs, A, B):
    """spgemm with the hybrid off: every row through the symbolic pass and the hash tables."""
    from matplan.kernels.spgemm import symbolic   # the module that reads HYBRID_MIN_ROWS
    saved, symbolic.HYBRID_MIN_ROWS = symbolic.HYBRID_MIN_ROWS, 1 << 62
    try:
        return hs.spgemm(A, B)
    finally:
        symbolic.HYBRID_MIN_ROWS = saved


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from matplan.core.xp import cupy_module
    cp = cupy_module()
    if cp is None:
        sys.exit("benchmarks/spgemm_esc.py needs CuPy and an NVIDIA GPU")
    import cupyx.scipy.sparse as csp
    from matplan.kernels import spgemm as hs
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    print(f"# {gpu}, commit {git_commit()}, {time.strftime('%Y-%m-%d', time.gmtime())}: ms, median over "
          f"{args.rounds} rounds of {args.reps} calls; 'hash' is esc=False on the one-pass path, the plain "
          f"two passes where the hybrid runs")
    print(f"{'matrix':<24} {'dtype':<8} {'products':>11} {'esc':>8} {'hash':>8} {'cuSPARSE':>8} "
          f"{'hash/esc':>8} {'cus/esc':>8}  classes")
    rows = []
    for name, H in problems():
        for dtype in (np.float64, np.float32):
            Hd = sp.csr_matrix(H, dtype=dtype)
            Bh = Hd if Hd.shape[0] == Hd.shape[1] else Hd.T.tocsr()
            A = csp.csr_matrix(Hd)
            B = A if Bh is Hd else csp.csr_matrix(Bh)
            info = {}
            C1 = hs.spgemm(A, B, info=info)
            if not (info.get("one_pass") or info.get("hybrid")):
                print(f"# {name} {np.dtype(dtype).name}: two passes, no row for numeric_esc", flush=True)
                break
            if info.get("hybrid"):
                def plain():
                    return _two_passes(hs, A, B)
            else:
                def plain():
                    return hs.spgemm(A, B, esc=False)
            C2 = plain()
            same = (C1.nnz == C2.nnz and bool((C1.indptr == C2.indptr).all()) and bool((C1.indices == C2.indices).all()))
            tol = 1e-12 if dtype == np.float64 else 1e-5
            err = float(abs(C1.data - C2.data).max() / max(1.0, float(abs(C2.data).max()))) if same and C1.nnz else 0.0
            if not same or err > tol:
                sys.exit(f"{name}: numeric_esc and the hash tables disagree (pattern same: {same}, error {err:.2e})")
            del C1, C2
            t = {"esc": [], "hash": [], "cusparse": []}
            for _ in range(args.rounds):
                t["esc"].append(timed(cp, lambda: hs.spgemm(A, B), args.reps, 3)[0])
                t["hash"].append(timed(cp, plain, args.reps, 3)[0])
                t["cusparse"].append(timed(cp, lambda: A @ B, args.reps, 3)[0])
            ms = {k: float(np.median(v)) for k, v in t.items()}
            rows.append(dict(matrix=name, dtype=np.dtype(dtype).name, products=info["products"], esc_rows=info["esc_rows"],
                             path="hybrid" if info.get("hybrid") else "one pass",
                             numeric_tables=info["numeric_tables"], balanced=info["balanced"], **{f"{k}_ms": v for k, v in ms.items()}))
            print(f"{name:<24} {np.dtype(dtype).name:<8} {info['products']:>11,} {ms['esc']:8.3f} {ms['hash']:8.3f} "
                  f"{ms['cusparse']:8.3f} {ms['hash'] / ms['esc']:8.2f} {ms['cusparse'] / ms['esc']:8.2f}  "
                  f"{'hybrid ' if info.get('hybrid') else ''}{info['esc_rows']} {info['numeric_tables'] or ''}", flush=True)
            del A, B
            cp.get_default_memory_pool().free_all_blocks()
    r = [x["hash_ms"] / x["esc_ms"] for x in rows]
    c = [x["cusparse_ms"] / x["esc_ms"] for x in rows]
    if rows:
        print(f"geomean hash/esc {geomean(r):.3f}, cuSPARSE/esc {geomean(c):.3f} "
              f"over {len(rows)} calls; hash/esc range {min(r):.2f}-{max(r):.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(benchmark="spgemm_esc", gpu=gpu, commit=git_commit(), rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
