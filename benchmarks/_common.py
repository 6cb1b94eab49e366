"""What every benchmark script shares: timing helpers, and its one current result file.

A benchmark writes ``results/<benchmark>-<device>.json`` (``write_result``), overwritten in place
on every run (git keeps the history), with the device, the commit and the date inside it; then it
regenerates ``results/SUMMARY.md`` (``summarize.write_summary``). Logs are printed, never written
to ``results/``.

    python3 benchmarks/_common.py slug     # the short name of GPU 0, e.g. "h100" (for shell scripts)
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from matplan.core.timing import cuda_queued_s

#: The results folder beside this file.
RESULTS = Path(__file__).resolve().parent / "results"
#: Words of a device name that say nothing about which GPU it is.
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro", "amd", "radeon", "instinct"}
#: Name parts that vary within one GPU model: memory size and type, the SXM form factor.
_SKU_PART = re.compile(r"^(\d+gb|hbm\d*e?|gddr\d*x?|sxm\d*)$")


def device_slug(name: str) -> str:
    """Short lower-case name of a device for file names, one spelling per GPU model:
    "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA H200" -> "h200", "NVIDIA A100-SXM4-80GB" -> "a100",
    "NVIDIA H100 PCIe" -> "h100pcie" (a different part from the SXM H100); "cpu" for the host."""
    words = [w for w in re.split(r"[^a-z0-9]+", str(name).lower()) if w]
    kept = [w for w in words if w not in _VENDOR_WORDS and not _SKU_PART.match(w)]
    return "".join(kept) or "unknown"


def cuda_device_name(cp) -> str:
    """The current CUDA device's name as the driver reports it."""
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def commit_info() -> dict:
    """The commit this tree is at, read from git now, and whether the tree differs from it; where
    there is no git checkout (the device's copy of the tree), $MATPLAN_COMMIT as the caller states
    it, else "unknown: no .git". A $MATPLAN_COMMIT that disagrees with git is kept beside it
    (``commit_given``): a copied tree can carry a stale .git."""
    here = os.path.dirname(os.path.abspath(__file__))
    given = os.environ.get("MATPLAN_COMMIT")
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here)
        if head.returncode == 0 and head.stdout.strip():
            commit = head.stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, cwd=here)
            info = dict(commit=commit, commit_source="git",
                        tree_dirty=bool(dirty.stdout.strip()) if dirty.returncode == 0 else None)
            if given and not commit.startswith(given) and not given.startswith(commit):
                info["commit_given"] = given
            return info
    except OSError:   # no git program: fall through to the environment
        pass
    if given:
        return dict(commit=given, commit_source="MATPLAN_COMMIT (no .git)", tree_dirty=None)
    return dict(commit="unknown: no .git", commit_source="none", tree_dirty=None)


def git_commit() -> str:
    """The commit alone (see ``commit_info``), for scripts that print it."""
    return commit_info()["commit"]


def provenance(benchmark: str, device_name: str) -> dict:
    """The fields every result file starts with."""
    versions = dict(python=platform.python_version(), numpy=np.__version__)
    cp = sys.modules.get("cupy")
    if cp is not None:
        versions["cupy"] = cp.__version__
    return dict(benchmark=benchmark, device=device_name, device_slug=device_slug(device_name),
                **commit_info(),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                **versions)


def result_path(out, benchmark: str, device_name: str) -> Path:
    """``<out>/<benchmark>-<device slug>.json``: the one current file of that benchmark and device."""
    return Path(out) / f"{benchmark}-{device_slug(device_name)}.json"


def write_result(out, benchmark: str, device_name: str, doc: dict) -> Path:
    """Write ``doc`` behind the provenance fields to its current file, atomically; returns its path.
    Called after every matrix by some scripts, so a run cut short keeps what it measured."""
    head = provenance(benchmark, device_name)
    path = result_path(out, benchmark, device_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump({**head, **{k: v for k, v in doc.items() if k not in head}}, fh, indent=1, default=str)
    os.replace(tmp, path)
    return path


def queued_s(cp, fn, calls, rounds, warmup=1):
    """Seconds per call of ``fn`` queued back to back (``matplan.core.timing.cuda_queued_s``; ``cp``
    is kept for the scripts' call sites)."""
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


if __name__ == "__main__":
    if sys.argv[1:] != ["slug"]:
        sys.exit("usage: python3 benchmarks/_common.py slug")
    import cupy
    print(device_slug(cuda_device_name(cupy)))
