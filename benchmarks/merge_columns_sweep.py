"""csr_merge SpMV/SpMM on the problems it supports (skewed, R-MAT, ice40): columns per block
(MERGE_BLOCKS_PER_SM) and column chunk (MERGE_V) settings against cuSPARSE, CUDA-event medians.

    MATPLAN_MATRICES=... python benchmarks/merge_columns_sweep.py
"""
import os

import cupy as cp
import cupyx.scipy.sparse as csp
import numpy as np

from matplan.kernels import get
from matplan.kernels.spmv import gpu as spmv
from matplan.tuning_db import tune as T

#: (label, MERGE_BLOCKS_PER_SM, MERGE_V)
SETTINGS = (("kc=1", 1 << 20, 1 << 20), ("bps16 V1", 16, 1 << 20), ("bps16 V4", 16, 4), ("bps32 V4", 32, 4))


def median_ms(fn, n=25):
    for _ in range(3):
        fn()
    ev = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(n)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    b.synchronize()
    return float(np.median([cp.cuda.get_elapsed_time(a, b) for a, b in ev]))


def main():
    units = T.corpus_units(["medium", "large"], families=["skewed", "rmat"], ops=("spmv", "spmm"))
    units += T.file_units([os.environ["MATPLAN_MATRICES"] + "/ice40_5k_routing.npz"], ops=("spmv", "spmm"))
    kern, vend = get("spmv.csr_merge"), get("spmv.cusparse")
    print(f"{'problem':34s} ntiles " + " ".join(f"{s[0]:>9}" for s in SETTINGS) + "  cusparse")
    for u in units:
        A, B = u.build()
        Ad, Bd = csp.csr_matrix(A), cp.asarray(B)
        p = kern.prepare(Ad, {})
        out = cp.empty((A.shape[0],) + B.shape[1:], dtype=B.dtype)
        row = []
        for _, bps, v in SETTINGS:
            spmv.MERGE_BLOCKS_PER_SM, spmv.MERGE_V = bps, v
            row.append(median_ms(lambda: kern.run(p, Bd, out=out)))
        pv = vend.prepare(Ad, {})
        ms_v = median_ms(lambda: vend.run(pv, Bd))
        print(f"{u.matrix + ' k=' + str(u.k) + ' ' + u.dtype:34s} {p.meta['ntiles']:6d} "
              + " ".join(f"{t:9.3f}" for t in row) + f" {ms_v:9.3f}", flush=True)


if __name__ == "__main__":
    main()
