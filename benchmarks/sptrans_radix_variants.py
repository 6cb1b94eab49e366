"""Compile-time variants of SpTRANS's radix passes (sptrans/radix.cu RDX_ITEMS, RDX_LOOKBACK,
RDX_MIN_BLOCKS, set with -D) on the sptrans.py matrices, float64, same run: per variant the GPU
time of ``transpose(A, method="radix")`` queued behind a spin kernel (host overhead hidden) and
the whole call, then the default transpose and CuPy's ``A.T.tocsr()``, and the default radix
build's time per launch. A variant whose result differs from the default's is marked ``!`` (the
pool's blocks are poisoned before that call, so an unwritten element cannot pass for the
previous call's).

    PYTHONPATH=. python3 benchmarks/sptrans_radix_variants.py [--variant 8,4,4 ...] [--reps 15]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import git_commit, timed  # noqa: E402
from sptrans import matrices  # noqa: E402
from sptrans_phases import _spin, phases  # noqa: E402


def poison_pool(cp, A):
    """Fill the pool blocks the next transpose's outputs will get with NaN / -1 and free them, so
    an element the call leaves unwritten shows (it would otherwise often hold the previous call's
    correct value: the pool hands the same blocks back)."""
    cp.cuda.Device().synchronize()
    cp.get_default_memory_pool().free_all_blocks()
    junk = [cp.full(A.nnz, np.nan, dtype=A.dtype), cp.full(A.nnz, -1, dtype=cp.int32),
            cp.full(A.shape[1] + 1, -1, dtype=cp.int32)]
    del junk


def queued_us(cp, spin, fn, reps):
    """GPU time of fn() with its launches queued behind a spin kernel: median of reps."""
    ts = []
    for _ in range(reps + 2):
        spin()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        out = fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
        del out
    return float(np.median(ts[2:]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=None, metavar="ITEMS,LOOKBACK,MIN_BLOCKS")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)
    from matplan.core.xp import cupy_module
    cp = cupy_module()
    if cp is None:
        sys.exit("benchmarks/sptrans_radix_variants.py needs CuPy and an NVIDIA GPU")
    import cupyx.scipy.sparse as csp
    from matplan.kernels import _cuda
    from matplan.kernels.sptrans import compiled, launches, gpu as st
    variants = [tuple(int(x) for x in v.split(",")) for v in (args.variant or ["8,16,1", "8,4,4"])]
    spin = _spin(cp)
    ks = compiled._kernels(cp)
    default = dict(ks.radix_pass), launches.RADIX_TILE
    print(f"# commit {git_commit()}: us, queued GPU time / whole call, median of {args.reps}")
    print(f"{'matrix':24s} " + " ".join(f"{'i%d/lb%d/b%d' % v:>14s}" for v in variants)
          + "   default    cupy  (default radix build, GPU us a launch)")
    for name, load in matrices():
        H = sp.csr_matrix(load(), dtype=np.float64)
        A = csp.csr_matrix((cp.asarray(H.data), cp.asarray(H.indices.astype(np.int32)),
                            cp.asarray(H.indptr.astype(np.int32))), shape=H.shape)
        ref = st.transpose(A)
        cells = []
        try:
            for items, lookback, min_blocks in variants:
                opts = (f"-DRDX_ITEMS={items}", f"-DRDX_LOOKBACK={lookback}", f"-DRDX_MIN_BLOCKS={min_blocks}")
                ks.radix_pass = {ct: _cuda.packed(_cuda.compiled("sptrans/radix.cu", f"spt_radix_pass<{ct}>",
                                                                 compiled.SOURCES["sptrans/radix.cu"], options=opts),
                                                  "sptrans/radix.cu", "spt_radix_pass")
                                 for ct in ("float", "double")}   # packed launchers, as compiled._kernels makes them
                launches.RADIX_TILE = compiled.BLOCK * items
                poison_pool(cp, A)
                T = st.transpose(A, method="radix")
                same = all(bool(cp.array_equal(a, b)) for a, b in
                           ((T.indptr, ref.indptr), (T.indices, ref.indices), (T.data, ref.data)))
                q = queued_us(cp, spin, lambda: st.transpose(A, method="radix"), args.reps)
                f = timed(cp, lambda: st.transpose(A, method="radix"), args.reps, warmup=3)[0] * 1e3
                cells.append(f"{q:6.0f}/{f:5.0f}{'' if same else '!'}")
        finally:
            ks.radix_pass, launches.RADIX_TILE = default
        q = queued_us(cp, spin, lambda: st.transpose(A), args.reps)
        f = timed(cp, lambda: st.transpose(A), args.reps, warmup=3)[0] * 1e3
        vendor = timed(cp, lambda: A.T.tocsr(), args.reps, warmup=3)[0] * 1e3
        per_launch, _ = phases(cp, st, A, spin, 10, "radix")
        print(f"{name:24s} " + " ".join(f"{c:>14s}" for c in cells) + f"  {q:4.0f}/{f:4.0f} {vendor:6.0f}  "
              + " ".join(f"{k}={v:.0f}" for k, v in per_launch.items()), flush=True)


if __name__ == "__main__":
    main()
