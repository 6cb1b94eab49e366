"""local_cluster(): a Dask cluster on this host for matplan.distributed, one worker per visible GPU.

With GPUs visible it starts one single-threaded worker process per GPU, each seeing only its own
GPU as device 0 (so the planner on that worker plans for its GPU) and declaring the resource
``GPU=1``: through ``dask_cuda.LocalCUDACluster`` where dask-cuda imports, else through matplan's
own ``distributed.SpecCluster`` of ``distributed.Nanny`` workers, each started with its own
``CUDA_VISIBLE_DEVICES`` (what LocalCUDACluster does, without its device-memory spilling and
UCX), so a host with Dask but without dask-cuda still gets one worker per GPU. Without GPUs: a CPU
``distributed.LocalCluster`` whose workers take the SciPy path. The returned object says which, and
why, in its repr and in the "matplan.distributed" log. Any other ``distributed.Client`` (a
multi-node cluster already running) works with matplan.distributed as well: pass it as ``client=``.
"""
from __future__ import annotations

import logging
import os

import distributed

from ..core.xp import cupy_module
from .worker import HostOnly

LOG = logging.getLogger("matplan.distributed")
#: CPU workers started when ``n_workers`` is not given (two-core machines get two).
DEFAULT_CPU_WORKERS = 4
_GPU_CHOICES = ("auto", True, False)
#: How GPU workers are started: dask-cuda where it imports, else matplan's Nanny per GPU ("auto").
GPU_CLUSTERS = ("auto", "dask-cuda", "nanny")


def _visible_ids() -> list | None:
    """The devices $CUDA_VISIBLE_DEVICES lists (up to the first -1, which hides the rest), None if unset."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return None
    ids = []
    for d in (x.strip() for x in env.split(",")):
        if not d or d == "-1":
            break
        ids.append(d)
    return ids


def dask_cuda_module() -> tuple:
    """(dask_cuda, "") where it imports, else (None, why not)."""
    try:
        import dask_cuda   # the optional cuda-distributed extra
        return dask_cuda, ""
    except ImportError as e:
        return None, f"dask-cuda is not installed ({e})"
    except Exception as e:   # installed but broken against this Dask: say so, start the Nanny workers
        return None, f"dask-cuda failed to import ({type(e).__name__}: {e})"


def _gpu_count() -> tuple:
    """(GPUs on this host, how counted) through NVML (pynvml, which dask-cuda uses too), else CuPy."""
    try:
        import pynvml   # nvidia-ml-py: optional, present wherever dask-cuda is
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount()), "NVML"
        finally:
            pynvml.nvmlShutdown()
    except Exception:   # no pynvml, no driver: ask CuPy (workers are spawned, so this process's context is harmless)
        cp = cupy_module()
        return (0, "no NVML and no CuPy GPU") if cp is None else (int(cp.cuda.runtime.getDeviceCount()), "CuPy")


def visible_gpus() -> tuple:
    """(the GPU ids GPU workers would use, why none where empty): those of $CUDA_VISIBLE_DEVICES,
    else every GPU NVML (or CuPy) counts."""
    ids = _visible_ids()
    if ids is None:
        n, how = _gpu_count()
        if n == 0:
            return [], f"no GPU visible ({how}; CUDA_VISIBLE_DEVICES unset)"
        ids = [str(i) for i in range(n)]
    return (ids, "") if ids else ([], "no GPU visible (CUDA_VISIBLE_DEVICES hides every device)")


def nanny_gpu_cluster(ids, *, dashboard_address=":0", memory_limit=None, **worker_options) -> distributed.SpecCluster:
    """One single-threaded ``distributed.Nanny`` worker process per GPU id, started with
    ``CUDA_VISIBLE_DEVICES=<id>`` (set in the worker before it imports anything) and ``resources
    {"GPU": 1}``, named ``gpu-<id>``. memory_limit: each worker's host memory for Dask (default:
    this host's memory split evenly, as LocalCluster does). Other keywords go to each Nanny."""
    if not ids:
        raise ValueError("ids: expected at least one GPU id")
    if memory_limit is None:
        memory_limit = max(1, distributed.system.MEMORY_LIMIT // len(ids))
    scheduler = {"cls": distributed.Scheduler, "options": {"dashboard_address": dashboard_address}}
    workers = {f"gpu-{d}": {"cls": distributed.Nanny,
                            "options": dict(worker_options, nthreads=1, name=f"gpu-{d}", memory_limit=memory_limit,
                                            env={"CUDA_VISIBLE_DEVICES": str(d)}, resources={"GPU": 1})}
               for d in ids}
    return distributed.SpecCluster(workers=workers, scheduler=scheduler, name="matplan-gpu")


_WHAT = {"dask-cuda": "GPU workers (dask_cuda.LocalCUDACluster)",
         "nanny": "GPU workers (one distributed.Nanny per GPU, no dask-cuda)",
         "cpu": "CPU workers (distributed.LocalCluster, SciPy path)"}


class LocalMatplanCluster:
    """A local Dask cluster started by :func:`local_cluster`: ``cluster`` (the Dask object), ``kind``
    ("cuda": GPU workers, or "cpu"), ``backend`` ("dask-cuda", "nanny" or "cpu"), ``why`` (why
    that kind), ``client()``, and ``close()`` / a with-block."""

    def __init__(self, cluster, kind: str, why: str, backend: str | None = None):
        self.cluster, self.kind, self.why = cluster, kind, why
        self.backend = backend or ("dask-cuda" if kind == "cuda" else "cpu")
        self._clients = []

    @property
    def scheduler_address(self) -> str:
        return self.cluster.scheduler_address

    @property
    def n_workers(self) -> int:
        return len(self.cluster.workers)

    def client(self, **kwargs) -> distributed.Client:
        """A new ``distributed.Client`` of this cluster (closed with it)."""
        c = distributed.Client(self.cluster, **kwargs)
        self._clients.append(c)
        return c

    def close(self) -> None:
        for c in self._clients:
            c.close()
        self._clients.clear()
        self.cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"<matplan local cluster: {self.n_workers} {_WHAT[self.backend]}; {self.why}; "
                f"at {self.scheduler_address}>")


def _gpu_cluster(ids, gpu_cluster, dashboard_address, kwargs) -> LocalMatplanCluster:
    dask_cuda, why_not = (None, "gpu_cluster='nanny'") if gpu_cluster == "nanny" else dask_cuda_module()
    devices = ",".join(ids)
    if dask_cuda is not None:
        cluster = dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, dashboard_address=dashboard_address,
                                             **kwargs)
        return LocalMatplanCluster(cluster, "cuda", f"one worker per GPU, devices {devices}", "dask-cuda")
    if gpu_cluster == "dask-cuda":
        raise RuntimeError(f"gpu_cluster='dask-cuda': {why_not} (pip install matplan[cuda-distributed])")
    cluster = nanny_gpu_cluster(ids, dashboard_address=dashboard_address, **kwargs)
    return LocalMatplanCluster(cluster, "cuda", f"one worker per GPU, devices {devices}; {why_not}", "nanny")


def local_cluster(n_workers: int | None = None, *, gpu="auto", processes: bool = True, threads_per_worker: int = 1,
                  dashboard_address=":0", gpu_cluster: str = "auto", **kwargs) -> LocalMatplanCluster:
    """Start a local Dask cluster for matplan.distributed.

    gpu: "auto" (GPU workers where a GPU is visible, else CPU), True (GPUs or an error saying why
    not) or False (CPU workers, on which on="auto" computes on the host). n_workers: GPU workers
    (default: every visible GPU) or CPU workers (default: min(4, cores)). gpu_cluster: how GPU
    workers start: "dask-cuda" (LocalCUDACluster, or an error), "nanny" (matplan's Nanny per GPU)
    or "auto" (dask-cuda where it imports, else the Nanny workers). processes, threads_per_worker:
    the CPU cluster's (a GPU cluster has one single-threaded process per GPU). dashboard_address:
    Dask's (default: a free port, so several clusters never clash). Other keywords go to the Dask
    cluster's constructor (the Nanny workers': to each Nanny)."""
    if gpu not in _GPU_CHOICES:
        raise ValueError(f"gpu: expected one of {_GPU_CHOICES}, got {gpu!r}")
    if gpu_cluster not in GPU_CLUSTERS:
        raise ValueError(f"gpu_cluster: expected one of {GPU_CLUSTERS}, got {gpu_cluster!r}")
    if n_workers is not None and (isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1):
        raise ValueError(f"n_workers: expected None or a positive integer, got {n_workers!r}")
    gpus, why = visible_gpus() if gpu is not False else ([], "gpu=False")
    if gpu is True and not gpus:
        raise RuntimeError(f"gpu=True: cannot start GPU workers: {why}")
    if gpus:
        if n_workers is not None and n_workers > len(gpus):
            raise ValueError(f"n_workers: {n_workers} GPU workers asked, {len(gpus)} GPU(s) visible")
        out = _gpu_cluster(gpus[: n_workers or len(gpus)], gpu_cluster, dashboard_address, kwargs)
    else:
        n = n_workers or max(1, min(DEFAULT_CPU_WORKERS, os.cpu_count() or 1))
        if gpu is False:   # the SciPy path even where the workers' processes see a GPU
            kwargs = dict(kwargs, plugins={HostOnly(), *kwargs.get("plugins", ())})
        cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=threads_per_worker, processes=processes,
                                           dashboard_address=dashboard_address, **kwargs)
        out = LocalMatplanCluster(cluster, "cpu", why)
    LOG.info("started %r", out)
    return out
