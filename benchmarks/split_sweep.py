"""Sweep csr_split's chunk size and trip limit (prepare-time constants of spmv_formats) on the
skewed matrices, back to back: ``PYTHONPATH=. python3 benchmarks/split_sweep.py`` on a GPU (H100
2026-11-24: within noise of the defaults 4096 / 16, ``results/split-sweep-h100-2026-11-24-724178c.log``)."""
import numpy as np, cupy as cp, cupyx.scipy.sparse as csp
from matplan import corpus, planner
from matplan.core.timing import cuda_queued_s
from matplan.kernels import get
from matplan.kernels.spmv import formats as fmt
from matplan.models import traffic
src = cp.ones(1 << 27, dtype=cp.float32); dst = cp.empty_like(src)
def cpy(): dst[...] = src
bw = 2 * src.nbytes / cuda_queued_s(cpy, 20, 7)
mats = [("skewed-large", corpus.load("skewed", "large")), ("rmat-large", corpus.load("rmat", "large"))]
from matplan.corpus.io import matrices_dir
mats += [(nm, A) for nm, A in corpus.real_matrices(matrices_dir()) if nm in ("ice40_5k_routing", "gene_go_bp_ancestors")]
k = get("spmv.csr_split")
print(f"copy {bw/1e9:.0f} GB/s")
for name, A0 in mats:
    for dt in (np.float64, np.float32):
        A = A0.astype(dt); A.sort_indices()
        Ag = csp.csr_matrix(A); x = cp.asarray(np.random.default_rng(0).random(A.shape[1]).astype(dt) + 0.5)
        y = cp.empty(A.shape[0], dt)
        f = planner.plan(Ag, x, measure="never").features
        mb = traffic.csr_spmm_bytes(f)
        res = []
        for chunk in (2048, 4096, 8192, 16384):
            for trips in (4, 8, 16, 32):
                fmt.SPLIT_CHUNK, fmt.SPLIT_TRIPS = chunk, trips
                for W in (2, 4, 8, 16, 32):
                    p = k.prepare(Ag, {"W": W})
                    t = cuda_queued_s(lambda: k.run(p, x, out=y), 10, 5, 2)
                    res.append((t, chunk, trips, W, int(p.meta["nchunks"])))
        res.sort()
        print(f"{name} {np.dtype(dt).name}: best " + "; ".join(f"{t*1e3:.4f} ms ({mb/t/bw:.2f} bw) chunk={c} trips={tr} W={W} nchunks={nc}" for t, c, tr, W, nc in res[:4]))
        for t, c, tr, W, nc in res:
            if c == 4096 and tr == 16: print(f"    default chunk/trips W={W}: {t*1e3:.4f} ms ({mb/t/bw:.2f})")
