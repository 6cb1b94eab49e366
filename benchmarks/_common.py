"""What every benchmark script shares: timing helpers, and its one current result file.

A benchmark writes ``results/<benchmark>-<device>.json`` (``write_result``), overwritten in place
on every run (git keeps the history), with the device, the commit read from git at run time, the
date and the copy bandwidth inside it (``provenance``); then it regenerates ``results/SUMMARY.md``
(``summarize.write_summary``). Logs are printed, never written to ``results/``.

    python3 benchmarks/_common.py slug     # the short name of GPU 0, e.g. "h100" (for shell scripts)
    python3 benchmarks/_common.py attest FILE...   # name the commit of results run from a copy

A copy of the checkout made elsewhere (a GPU machine that receives the working tree) may carry a
stale or no ``.git``: its results record that commit as modified, or none. ``attest`` then names
this checkout's HEAD in such a file only where the file's ``source_digest`` equals HEAD's (so
the package's sources it ran are exactly HEAD's), and says so in ``commit_source``.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from matplan.core import device
from matplan.core.timing import cuda_queued_s, rotated
from matplan.core.xp import cupy_module
from matplan.tuning_db.timing import OWN_CALLS

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


#: The checkout this script runs from: the folder above benchmarks/.
REPO = Path(__file__).resolve().parent.parent
#: What the sources' digest covers: the package's code and CUDA sources.
SOURCE_SUFFIXES = (".py", ".cu", ".cuh")
NO_GIT = "unknown (no .git)"


def _git(*args):
    """git's stripped output in REPO, or None where git is missing or fails."""
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO)
    except OSError:            # no git program
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def commit_info() -> dict:
    """The commit of the checkout this script runs from, read from git when the process first
    asks (``git rev-parse HEAD``), and whether tracked files differ from it; NO_GIT where REPO is
    not itself a git checkout (a copy without .git, even inside another repository). No
    environment variable is read: a stated commit can be stale. ``source_digest`` hashes the
    package's sources, so two results of one tree match even without git."""
    top = _git("rev-parse", "--show-toplevel")
    head = _git("rev-parse", "HEAD") if top and Path(top).resolve() == REPO else None
    if head:
        status = _git("status", "--porcelain", "--untracked-files=no")
        info = dict(commit=head, commit_source="git", tree_dirty=None if status is None else bool(status))
    else:
        info = dict(commit=NO_GIT, commit_source="none", tree_dirty=None)
    return dict(info, source_digest=source_digest())


def source_digest(root=REPO / "matplan") -> str:
    """First 16 hex digits of SHA-256 over the package's source files (relative path and bytes, in
    path order)."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_commit() -> str:
    """The commit alone (see ``commit_info``), for scripts that print it."""
    return commit_info()["commit"]


@functools.lru_cache(maxsize=None)
def bandwidth_info(device_id: int = 0) -> dict:
    """The device-to-device copy bandwidth measured now (``device.measure_copy_bandwidth``), beside
    the figure the planner plans with (``device.current().mem_bandwidth``: its own measurement, or
    the table's figure for this GPU where that measurement was within ``COPY_BW_SNAP``), in GB/s.
    Measured once per process and device; {} without a GPU."""
    cp = cupy_module()
    if cp is None:
        return {}
    with cp.cuda.Device(device_id):
        measured = device.measure_copy_bandwidth()
        spec = device.current()
    snapped = spec.copy_bandwidth > 0 and spec.mem_bandwidth == spec.copy_bandwidth
    return dict(copy_bandwidth_gbs=measured / 1e9, planner_bandwidth_gbs=spec.mem_bandwidth / 1e9,
                planner_bandwidth_source=("the table's figure for this GPU (its measurement within "
                                          f"{device.COPY_BW_SNAP:.0%})" if snapped else "its own measurement"))


def provenance(benchmark: str, device_name: str) -> dict:
    """The fields every result file starts with: benchmark, device, commit (``commit_info``), date,
    versions and, on a GPU, the copy bandwidth measured beside the planner's (``bandwidth_info``)."""
    versions = dict(python=platform.python_version(), numpy=np.__version__)
    cp = sys.modules.get("cupy")
    if cp is not None:
        versions["cupy"] = cp.__version__
    bandwidth = bandwidth_info(cp.cuda.Device().id) if cp is not None and cupy_module() is not None else {}
    return dict(benchmark=benchmark, device=device_name, device_slug=device_slug(device_name),
                **commit_info(),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                **versions, **bandwidth)


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


def rotated_ms(cp, fns: dict, reps: int, own: int = OWN_CALLS, warmup: int = 3) -> dict:
    """{label: median CUDA-event ms of one call} of ``fns`` ({label: callable}), timed in ``reps``
    rounds over all of them in rotated order, each timed call right after ``own`` untimed calls of
    its own and a synchronisation, as ``matplan tune`` times them: a transient of the host or the GPU
    falls on every candidate alike, and each finds L2 as its own repeated calls leave it
    (docs/tuning.md, the timing method)."""
    labels = list(fns)
    for label in labels:
        for _ in range(warmup):
            fns[label]()
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = {label: [] for label in labels}
    for r in range(reps):
        for label in rotated(labels, r):
            fn = fns[label]
            for _ in range(own):
                fn()
            cp.cuda.Device().synchronize()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times[label].append(cp.cuda.get_elapsed_time(start, stop))
    return {label: float(np.median(v)) for label, v in times.items()}


def rotated_b2b_ms(cp, fns: dict, calls: int, rounds: int) -> dict:
    """{label: ms a call} of ``calls`` calls of each of ``fns`` queued back to back, the median
    over ``rounds`` rounds over all of them in rotated order."""
    labels = list(fns)
    times = {label: [] for label in labels}
    for r in range(rounds):
        for label in rotated(labels, r):
            times[label].append(cuda_queued_s(fns[label], calls, 1, 1) * 1e3)
    return {label: float(np.median(v)) for label, v in times.items()}


def geomean(xs):
    """Geometric mean of positive figures; None for none."""
    return float(np.exp(np.mean(np.log(xs)))) if len(xs) else None


def head_source_digest() -> str | None:
    """``source_digest`` of the package's sources at this checkout's HEAD (from git, not the working
    tree), or None without git."""
    head = _git("rev-parse", "HEAD")
    names = _git("ls-tree", "-r", "--name-only", "HEAD", "matplan")
    if not head or names is None:
        return None
    h = hashlib.sha256()
    for name in sorted(n for n in names.splitlines() if Path(n).suffix in SOURCE_SUFFIXES):
        blob = subprocess.run(["git", "show", f"HEAD:{name}"], capture_output=True, cwd=REPO, check=True).stdout
        h.update(str(Path(name).relative_to("matplan")).encode() + b"\0" + blob + b"\0")
    return h.hexdigest()[:16]


def attest(paths) -> list:
    """Name HEAD as the commit of each result file whose ``source_digest`` is HEAD's; returns lines
    saying what was done to each."""
    head, digest = _git("rev-parse", "HEAD"), head_source_digest()
    out = []
    for path in map(Path, paths):
        doc = json.loads(path.read_text())
        if doc.get("commit_source") == "git" and doc.get("commit") == head and not doc.get("tree_dirty"):
            out.append(f"{path}: already names {head[:10]}")
        elif digest is None or doc.get("source_digest") != digest:
            out.append(f"{path}: left as is (its sources {doc.get('source_digest')} are not HEAD's {digest})")
        else:
            doc.update(commit=head, tree_dirty=False,
                       commit_source=f"source digest {digest} equals HEAD's (run from a copy whose .git "
                                     f"said {str(doc.get('commit'))[:10]})")
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1, default=str))
            os.replace(tmp, path)
            out.append(f"{path}: commit {head[:10]} (source digest {digest})")
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["attest"] and len(sys.argv) > 2:
        print("\n".join(attest(sys.argv[2:])))
    elif sys.argv[1:] == ["slug"]:
        import cupy
        print(device_slug(cuda_device_name(cupy)))
    else:
        sys.exit("usage: python3 benchmarks/_common.py slug | attest FILE...")
