"""What a single call's time depends on: the calls before it (the tuner's rotated rounds against
spmv.py's consecutive calls), for every SpMV candidate of one corpus problem.

    PYTHONPATH=. python3 benchmarks/tuning_order.py [--family skewed] [--size large] [--dtype float32]

Each candidate is prepared once, as ``matplan tune`` prepares it, and its single calls (CUDA events
around the call, synchronised, median of ``--repeats``) are timed eight ways: its own calls back to
back (spmv.py's way), the same with y preallocated, the same with L2 flushed before each call (four
times L2 written, then read), in rounds rotating over every candidate (the tuner's way), in rounds
over the fast candidates only, in rounds with one or three untimed calls of the candidate before
each timed one, in rounds with L2 flushed before each, and every call after 2 ms of a memory-bound
busy kernel. A table on stdout, in us; docs/tuning.md ("The timing method") gives what it found.
"""
from __future__ import annotations

import argparse

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="skewed")
    ap.add_argument("--size", default="large")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)

    import cupy as cp
    import cupyx.scipy.sparse as csp
    from matplan.core import device as device_mod
    from matplan.core import features as stats
    from matplan.core.timing import cuda_queued_s, rotated
    from matplan.core.validation import normalize
    from matplan.kernels import kernels_for
    from matplan.tuning_db.timing import CudaTimer
    from matplan.tuning_db.tune import _candidate_params
    from matplan.tuning_db.units import WorkUnit

    unit = WorkUnit("corpus", f"{args.family}-{args.size}", args.family, "spmv", 1, args.dtype, size=args.size)
    A, B = unit.build()
    problem = normalize(csp.csr_matrix(A), cp.asarray(B))
    dev = device_mod.current()
    feats = stats.compute(problem, dev)
    calls, into_y = {}, {}
    for k in kernels_for("spmv", "gpu"):
        if k.supports(feats):
            continue
        for p in _candidate_params(k, feats, dev):
            label = k.name.removeprefix("spmv.") + "".join(f" {a}={b}" for a, b in p.items())
            prepared, y = k.prepare(problem.A, dict(p)), cp.empty(A.shape[0], dtype=args.dtype)
            calls[label] = k.tuning_calls(prepared, problem.B)["run"]
            into_y[label] = lambda k=k, prepared=prepared, y=y: k.run(prepared, problem.B, out=y)
    timer = CudaTimer(cp)
    buf = cp.ones(1 << 22, dtype=cp.float32)

    def busy():
        buf.__imul__(1.0)

    per_busy = cuda_queued_s(busy, 20, 3)

    def after_busy(seconds):
        def prime(_label=None):
            for _ in range(max(1, int(seconds / per_busy))):
                busy()
            timer.sync()
        return prime

    l2 = int(cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["l2CacheSize"])
    flush_buf, clean_buf = cp.empty(4 * l2, dtype=cp.uint8), cp.ones(4 * l2, dtype=cp.uint8)

    def flush():
        """L2 emptied of the candidates' lines: written over, then read over (clean lines left)."""
        flush_buf.fill(1)
        clean_buf.max()
        timer.sync()

    def own(label, n):
        def prime():
            for _ in range(n):
                calls[label]()
            timer.sync()
        return prime

    def consecutive(fns, before=None):
        out = {}
        for label, fn in fns.items():
            for _ in range(3):
                fn()
            timer.sync()
            ts = []
            for _ in range(args.repeats):
                if before is not None:
                    before()
                ts.append(timer.once(fn))
            out[label] = np.median(ts)
        return out

    def rounds(labels, before=None):
        times = {label: [] for label in labels}
        timer.warm(calls[labels[0]])
        for label in labels:
            calls[label]()
        timer.sync()
        for r in range(args.repeats):
            for label in rotated(list(labels), r):
                if before is not None:
                    before(label)
                times[label].append(timer.once(calls[label]))
        return {label: np.median(v) for label, v in times.items()}

    fast = [label for label in calls if any(s in label for s in ("split", "merge", "cusparse", "T=32 "))]
    ways = {"back to back": consecutive(calls), "back to back, y": consecutive(into_y),
            "b2b, L2 flushed": consecutive(calls, flush),
            "rounds, all": rounds(list(calls)), "rounds, fast": rounds(fast),
            "rounds, 1 own": rounds(list(calls), lambda label: own(label, 1)()),
            "rounds, 3 own": rounds(list(calls), lambda label: own(label, 3)()),
            "rounds, L2 flushed": rounds(list(calls), lambda label: flush()),
            "after 2 ms": rounds(list(calls), after_busy(2e-3))}
    print(f"{unit.matrix} {args.dtype}: us a single call (median of {args.repeats}); "
          f"the busy kernel {per_busy * 1e6:.1f} us a call")
    print(f"{'candidate':28s}" + "".join(f"{w:>16s}" for w in ways))
    for label in calls:
        print(f"{label:28s}" + "".join(f"{ways[w].get(label, float('nan')) * 1e3:16.1f}" for w in ways))


if __name__ == "__main__":
    main()
