"""Whole-call time (CUDA events, GPU idle before each call, median of 30) of hash spgemm and sptrans
on host-bound products, for an A/B of two trees run one after the other in one session:

    (cd OLD_TREE && PYTHONPATH=$PWD python3 NEW/benchmarks/launch_path_ab.py old); (cd NEW && PYTHONPATH=$PWD python3 benchmarks/launch_path_ab.py new)
"""
import os, sys, time
import numpy as np, scipy.sparse as sp, cupy as cp, cupyx.scipy.sparse as csp
import matplan
from matplan import corpus
from matplan.kernels import spgemm as hs, sptrans
real = dict(corpus.real_matrices(os.environ["MATPLAN_MATRICES"]))
mats = [("poisson3d-small", corpus.load("poisson3d", "small")), ("skewed-small", corpus.load("skewed", "small")),
        ("rmat-small", corpus.load("rmat", "small")), ("poisson3d-spgemm", corpus.load("poisson3d", "spgemm")),
        ("skewed-spgemm", corpus.load("skewed", "spgemm")), ("uniform-spgemm", corpus.load("uniform", "spgemm"))] + \
       [(n, real[n]) for n in ("metis_copter2", "world_highways", "dragon_mesh_laplacian")]
def med(fn, reps=30):
    for _ in range(3):
        r = fn(); del r
    ts = []
    for _ in range(reps):
        cp.cuda.Device().synchronize()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(); r = fn(); b.record(); b.synchronize(); del r
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
    return float(np.median(ts))
tag = sys.argv[1]
for name, H in mats:
    A = csp.csr_matrix(sp.csr_matrix(H, dtype=np.float64))
    g = med(lambda: hs.spgemm(A, A))
    t = med(lambda: sptrans.transpose(A))
    h0 = time.perf_counter()
    for _ in range(50):
        r = sptrans.transpose(A)
    host = (time.perf_counter() - h0) / 50 * 1e6
    cp.cuda.Device().synchronize(); del r
    print(f"{tag} {name:<24} spgemm {g:8.1f} us  sptrans {t:7.1f} us  sptrans host {host:6.1f} us", flush=True)
