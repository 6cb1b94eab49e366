"""Whole-call time of hash SpGEMM and SpTRANS on host-bound products, for an A/B of two trees run
one after the other (alternating) on one machine: host speed differs between machines of one
GPU model by up to 2x, so launch-path changes are compared only within a session.

Per matrix (float64): spgemm(A, A) and sptrans.transpose(A), CUDA events around each call with
the GPU idle before it (``_common.timed``, median of 30 after 3 warm-ups); and SpTRANS's host time
a call over 50 calls without synchronising. One line a matrix, tagged with the first argument:

    (cd OLD_TREE && PYTHONPATH=$PWD python3 NEW/benchmarks/launch_path_ab.py old)
    (cd NEW && PYTHONPATH=$PWD python3 benchmarks/launch_path_ab.py new)
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import timed  # noqa: E402

CORPUS = (("poisson3d", "small"), ("skewed", "small"), ("rmat", "small"), ("poisson3d", "spgemm"),
          ("skewed", "spgemm"), ("uniform", "spgemm"))
REAL = ("metis_copter2", "world_highways", "dragon_mesh_laplacian")


def main(tag: str) -> None:
    import cupy as cp
    import cupyx.scipy.sparse as csp
    from matplan import corpus
    from matplan.kernels import spgemm as hs
    from matplan.kernels.sptrans import gpu as sptrans
    real = dict(corpus.real_matrices(os.environ["MATPLAN_MATRICES"]))
    mats = [(f"{family}-{size}", corpus.load(family, size)) for family, size in CORPUS]
    mats += [(name, real[name]) for name in REAL]
    for name, H in mats:
        A = csp.csr_matrix(sp.csr_matrix(H, dtype=np.float64))
        g = timed(cp, lambda: hs.spgemm(A, A), 30, warmup=3)[0] * 1e3
        t = timed(cp, lambda: sptrans.transpose(A), 30, warmup=3)[0] * 1e3
        h0 = time.perf_counter()
        for _ in range(50):
            r = sptrans.transpose(A)
        host = (time.perf_counter() - h0) / 50 * 1e6
        cp.cuda.Device().synchronize()
        del r
        print(f"{tag} {name:<24} spgemm {g:8.1f} us  sptrans {t:7.1f} us  sptrans host {host:6.1f} us", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tree")
