"""Where a hash SpGEMM call waits: its launches on a host clock beside the GPU's, for calls whose
time is not the kernels' (small and medium products, where spgemm.hash is host-bound).

For each matrix (float64, A·A or A·Aᵀ), two calls after a warm-up:

* an instrumented call (``runtime._launch`` wrapped, the device synchronised around every launch)
  gives each launch's GPU time, in launch order;
* a timeline call, as a user makes it: an event is recorded on the launching stream after each
  launch, so each launch has its host time (when the launch returned) and the GPU time its kernel
  was done, both from the call's start (the GPU idle before it). A kernel's start is taken as its
  end less its instrumented time; the GPU's idle time before it is its start less the previous
  kernel's end (launches on side streams overlap: the idle time is then 0).

The last column says who waited: ``gpu`` (the GPU idled for the host, which was still issuing or
had waited at a host transfer) or ``host`` (the kernel queued behind earlier work). Recording the
events adds ~2 us of host time a launch. Host transfers (``_cuda.read_at`` / ``read_words``) are
rows of their own, at the host time they returned. ``--first`` times first calls
(``guess=False``: the analysis read back before the numeric launches) instead of the default
calls, which replay a guess from the second call on.

    PYTHONPATH=. python3 benchmarks/spgemm_timeline.py [--first] [--only skewed-small metis_copter2 ...]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import git_commit  # noqa: E402
from spgemm_phases import launch_alone_us  # noqa: E402

SMALL = ("poisson3d", "uniform", "skewed", "rmat")


def matrices(only):
    from matplan import corpus
    from spgemm import matrices as spgemm_matrices
    for family in SMALL:
        if not only or f"{family}-small" in only:
            yield f"{family}-small", corpus.load(family, "small")
    for name, A in spgemm_matrices(1e9, time.time(), only):
        if name.startswith("rmat-scale") or name in ("gene_go_bp_ancestors", "wordnet_gloss_doc_term"):
            continue   # GPU-bound products: their waits do not matter
        if not only or name in only:
            yield name, A


def launches(cp, hs, A, B, timeline: bool, guess: bool = True):
    """[(name, host_us, gpu_done event or GPU us; None for a host transfer)] of one call, and its
    wall us (host, synchronised)."""
    from matplan.kernels import _cuda
    from matplan.kernels.spgemm import runtime   # every module launches through runtime._launch
    real, reads = runtime._launch, {name: getattr(_cuda, name) for name in ("read_at", "read_words")}
    rec = []
    start = cp.cuda.Event()

    def transfer(name):
        def read(*args, **kw):
            got = reads[name](*args, **kw)
            rec.append((f"({name})", (time.perf_counter() - t0) * 1e6 if timeline else 0.0, None))
            return got
        return read

    def launch(name, grid, block, args, smem=0):
        if timeline:
            real(name, grid, block, args, smem)
            ev = cp.cuda.Event()
            ev.record()
            rec.append((name.split("<")[0], (time.perf_counter() - t0) * 1e6, ev))
        else:
            rec.append((name.split("<")[0], 0.0, launch_alone_us(cp, real, name, grid, block, args, smem)))

    runtime._launch = launch
    for name in reads:
        setattr(_cuda, name, transfer(name))
    try:
        cp.cuda.Device().synchronize()
        start.record()
        t0 = time.perf_counter()
        C = hs.spgemm(A, B, guess=guess)
        host = (time.perf_counter() - t0) * 1e6
        stop = cp.cuda.Event()
        stop.record()
        stop.synchronize()
    finally:
        runtime._launch = real
        for name, fn in reads.items():
            setattr(_cuda, name, fn)
    del C
    wall = cp.cuda.get_elapsed_time(start, stop) * 1e3
    if timeline:
        rec = [(n, h, None if ev is None else cp.cuda.get_elapsed_time(start, ev) * 1e3) for n, h, ev in rec]
    return rec, host, wall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--first", action="store_true", help="first calls (guess=False), not guessed replays")
    args = ap.parse_args(argv)
    from matplan.core.xp import cupy_module
    cp = cupy_module()
    if cp is None:
        sys.exit("benchmarks/spgemm_timeline.py needs CuPy and an NVIDIA GPU")
    import cupyx.scipy.sparse as csp
    from matplan.kernels import spgemm as hs
    print(f"# spgemm_timeline.py, commit {git_commit()}, {time.strftime('%Y-%m-%d', time.gmtime())}, "
          f"CuPy {cp.__version__}: microseconds from the call's start")
    for name, H in matrices(args.only):
        H = sp.csr_matrix(H, dtype=np.float64)
        A = csp.csr_matrix(H)
        B = A if H.shape[0] == H.shape[1] else csp.csr_matrix(H.T.tocsr())
        guess = not args.first
        for _ in range(2):
            hs.spgemm(A, B, guess=guess)
        durs, _, _ = launches(cp, hs, A, B, timeline=False, guess=guess)
        line, host, wall = launches(cp, hs, A, B, timeline=True, guess=guess)
        if [n for n, _, _ in durs] != [n for n, _, _ in line]:
            print(f"# {name}: the two calls launched different kernels; skipped")
            continue
        print(f"\n{name}: wall {wall:.1f} us, host {host:.1f} us, "
              f"GPU busy {sum(d for _, _, d in durs if d is not None):.1f} us")
        print(f"  {'kernel':<22} {'host':>8} {'start':>8} {'end':>8} {'gpu us':>7} {'idle':>7}  waited")
        prev_end, idle_total = 0.0, 0.0
        for (kname, h, end), (_, _, d) in zip(line, durs):
            if end is None:   # a host transfer: when it returned
                print(f"  {kname:<22} {h:8.1f}")
                continue
            start = end - d
            idle = max(0.0, start - prev_end)
            idle_total += idle
            who = "gpu" if start - h < 15 else "host"   # the kernel ran as soon as it was launched
            print(f"  {kname:<22} {h:8.1f} {start:8.1f} {end:8.1f} {d:7.1f} {idle:7.1f}  {who}")
            prev_end = max(prev_end, end)
        print(f"  GPU idle between kernels {idle_total:.1f} us; after the last kernel {wall - prev_end:.1f} us")
        del A, B
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
