"""Sweep MERGE_BLOCKS_PER_SM (columns per csr_merge block) on the SpMM problems csr_merge supports."""
import os, sys, numpy as np, cupy as cp, cupyx.scipy.sparse as csp
from matplan.tuning_db import tune as T
from matplan.kernels import get, spmv
units = T.corpus_units(["medium", "large"], families=["skewed", "rmat"], ops=("spmm",))
units += T.file_units([os.environ["MATPLAN_MATRICES"] + "/ice40_5k_routing.npz"], ops=("spmm",))
kern = get("spmv.csr_merge"); vend = get("spmv.cusparse")
SET = (1 << 20, 64, 32, 16, 8)
def med(fn, n=25):
    for _ in range(3): fn()
    ev = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(n)]
    for a, b in ev:
        a.record(); fn(); b.record()
    b.synchronize()
    return float(np.median([cp.cuda.get_elapsed_time(a, b) for a, b in ev]))
print(f"{'problem':38s} ntiles " + " ".join(f"bps={s if s < 1e6 else 'inf':>5}" for s in SET) + "  cusparse")
for u in units:
    A, B = u.build()
    Ad, Bd = csp.csr_matrix(A), cp.asarray(B)
    p = kern.prepare(Ad, {}); out = cp.empty((A.shape[0], B.shape[1]), dtype=B.dtype)
    row = []
    for s in SET:
        spmv.MERGE_BLOCKS_PER_SM = s
        row.append(med(lambda: kern.run(p, Bd, out=out)))
    pv = vend.prepare(Ad, {})
    v = med(lambda: vend.run(pv, Bd))
    print(f"{u.matrix + ' k=' + str(u.k) + ' ' + u.dtype:38s} {p.meta['ntiles']:6d} " + " ".join(f"{t:9.3f}" for t in row) + f" {v:9.3f}", flush=True)
