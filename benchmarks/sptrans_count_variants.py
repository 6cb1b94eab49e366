"""Compile-time variants of SpTRANS's ``spt_count`` (sptrans.cu SEG_CNT_BATCHED, SEG_CNT_ITEMS,
SEG_CNT_HASH_BITS, set with -D) on the sptrans.py matrices, float64, same run: per variant the
count launch's GPU time (events between the launches, queued behind a spin kernel) and the whole
call's queued GPU time, for the segsort (``spt_count<true>``, ranks) and the radix method
(``spt_count<false>``). A variant whose transpose differs from the default build's is marked
``!`` (the pool is poisoned before that call).

    PYTHONPATH=. python3 benchmarks/sptrans_count_variants.py [--variant 1,8,11 ...] [--reps 15]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import geomean, git_commit  # noqa: E402
from sptrans import matrices  # noqa: E402
from sptrans_phases import _spin, phases  # noqa: E402
from sptrans_radix_variants import poison_pool  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=None, metavar="BATCHED,ITEMS,HASH_BITS")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)
    from matplan._xp import cupy_module
    cp = cupy_module()
    if cp is None:
        sys.exit("benchmarks/sptrans_count_variants.py needs CuPy and an NVIDIA GPU")
    import cupyx.scipy.sparse as csp
    from matplan.kernels import _cuda
    from matplan.kernels import sptrans as st
    variants = [tuple(int(x) for x in v.split(",")) for v in (args.variant or ["0,8,11", "1,8,11", "1,16,12"])]
    spin = _spin(cp)
    ks = st._kernels(cp)
    default = dict(ks.count), st.CNT_CHUNK
    names = ["b%d/i%d/h%d" % v for v in variants]
    print(f"# commit {git_commit()}: us, count launch / whole call (GPU time queued), median of {args.reps}; "
          "seg: the segsort (ranks), rdx: the radix method")
    print(f"{'matrix':24s} " + " ".join(f"{'seg ' + v:>20s} {'rdx ' + v:>20s}" for v in names))
    ratios = {v: [] for v in names}
    for name, load in matrices():
        H = sp.csr_matrix(load(), dtype=np.float64)
        A = csp.csr_matrix((cp.asarray(H.data), cp.asarray(H.indices.astype(np.int32)),
                            cp.asarray(H.indptr.astype(np.int32))), shape=H.shape)
        refs = {m: st.transpose(A, method=m) for m in ("segsort", "radix")}
        cells, first = [], None
        try:
            for v, (batched, items, hash_bits) in zip(names, variants):
                opts = (f"-DSEG_CNT_BATCHED={batched}", f"-DSEG_CNT_ITEMS={items}", f"-DSEG_CNT_HASH_BITS={hash_bits}")
                ks.count = {r: _cuda.packed(_cuda.compiled(st._CU, f"spt_count<{str(r).lower()}>", st._NAMES,
                                                           options=opts), st._CU, f"spt_count<{str(r).lower()}>")
                            for r in (True, False)}
                st.CNT_CHUNK = st.BLOCK * items
                total = 0.0
                for method in ("segsort", "radix"):
                    poison_pool(cp, A)
                    T, ref = st.transpose(A, method=method), refs[method]
                    same = all(bool(cp.array_equal(a, b)) for a, b in
                               ((T.indptr, ref.indptr), (T.indices, ref.indices), (T.data, ref.data)))
                    per, queued = phases(cp, st, A, spin, args.reps, method)
                    cells.append(f"{per['count']:6.1f}/{queued:6.1f}{'' if same else '!'}")
                    total += queued
                first = total if first is None else first
                ratios[v].append(first / total)
        finally:
            ks.count, st.CNT_CHUNK = default
        print(f"{name:24s} " + " ".join(f"{c:>20s}" for c in cells), flush=True)
    print("geomean speed-up of the whole calls (segsort + radix) over the first variant: "
          + ", ".join(f"{v} {geomean(r):.3f}" for v, r in ratios.items()))


if __name__ == "__main__":
    main()
