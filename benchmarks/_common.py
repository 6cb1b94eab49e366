"""What every benchmark script records beside its figures."""
from __future__ import annotations

import os
import subprocess

import numpy as np

from matplan.core.timing import cuda_queued_s


def git_commit() -> str:
    """The tree's commit: $MATPLAN_COMMIT (the device's copy of the tree has no .git), else git's."""
    if os.environ.get("MATPLAN_COMMIT"):
        return os.environ["MATPLAN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def queued_s(cp, fn, calls, rounds, warmup=1):
    """Seconds per call of ``fn`` queued back to back (``matplan._timing.cuda_queued_s``; ``cp`` is
    kept for the scripts' call sites)."""
    return cuda_queued_s(fn, calls, rounds, warmup)


def timed(cp, fn, reps, warmup=1):
    """(median CUDA-event ms, last result) of ``fn()`` over ``reps`` runs after ``warmup`` runs.

    Each result is dropped before the next call: SpGEMM and SpTRANS outputs can be large."""
    out = None
    for _ in range(warmup):
        out = fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        del out
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        out = fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times)), out


def geomean(xs):
    """Geometric mean of positive figures; None for none."""
    return float(np.exp(np.mean(np.log(xs)))) if len(xs) else None
