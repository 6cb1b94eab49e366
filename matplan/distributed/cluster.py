"""local_cluster(): a Dask cluster on this host for matplan.distributed, one worker per visible GPU.

With dask-cuda installed and GPUs visible it starts ``dask_cuda.LocalCUDACluster`` (one worker
process per GPU, each seeing only its own as device 0, so the planner on that worker plans for
its GPU); otherwise a CPU ``distributed.LocalCluster`` whose workers take the SciPy path. The
returned object says which, and why, in its repr and in the "matplan.distributed" log. Any
other ``distributed.Client`` (a multi-node cluster already running) works with matplan.distributed
as well: pass it as ``client=``.
"""
from __future__ import annotations

import logging
import os

import distributed

LOG = logging.getLogger("matplan.distributed")
#: CPU workers started when ``n_workers`` is not given (two-core machines get two).
DEFAULT_CPU_WORKERS = 4
_GPU_CHOICES = ("auto", True, False)


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


def visible_gpus() -> tuple:
    """(the GPU ids a LocalCUDACluster would use, why none where empty): those of
    $CUDA_VISIBLE_DEVICES, else every GPU NVML counts."""
    try:
        import dask_cuda.utils   # the optional cuda-distributed extra
    except ImportError:
        return [], "dask-cuda is not installed (pip install matplan[cuda-distributed])"
    ids = _visible_ids()
    if ids is None:
        try:
            ids = [str(i) for i in range(int(dask_cuda.utils.get_gpu_count()))]
        except Exception as e:   # no driver, NVML missing: the CPU path
            return [], f"no GPU visible to dask-cuda ({type(e).__name__}: {e})"
    return (ids, "") if ids else ([], "no GPU visible (CUDA_VISIBLE_DEVICES or NVML)")


class LocalMatplanCluster:
    """A local Dask cluster started by :func:`local_cluster`: ``cluster`` (the Dask object), ``kind``
    ("cuda" or "cpu"), ``why`` (why that kind), ``client()``, and ``close()`` / a with-block."""

    def __init__(self, cluster, kind: str, why: str):
        self.cluster, self.kind, self.why = cluster, kind, why
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
        what = ("GPU workers (dask_cuda.LocalCUDACluster)" if self.kind == "cuda"
                else "CPU workers (distributed.LocalCluster, SciPy path)")
        return f"<matplan local cluster: {self.n_workers} {what}; {self.why}; at {self.scheduler_address}>"


def local_cluster(n_workers: int | None = None, *, gpu="auto", processes: bool = True, threads_per_worker: int = 1,
                  dashboard_address=":0", **kwargs) -> LocalMatplanCluster:
    """Start a local Dask cluster for matplan.distributed.

    gpu: "auto" (GPUs where dask-cuda is installed and sees some, else CPU), True (GPUs or an
    error saying why not) or False (CPU). n_workers: GPU workers (default: every visible GPU) or
    CPU workers (default: min(4, cores)). processes, threads_per_worker: the CPU cluster's (a
    GPU cluster has one process per GPU). dashboard_address: Dask's (default: a free port, so
    several clusters never clash). Other keywords go to the Dask cluster's constructor."""
    if gpu not in _GPU_CHOICES:
        raise ValueError(f"gpu: expected one of {_GPU_CHOICES}, got {gpu!r}")
    if n_workers is not None and (isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1):
        raise ValueError(f"n_workers: expected None or a positive integer, got {n_workers!r}")
    gpus, why = visible_gpus() if gpu is not False else ([], "gpu=False")
    if gpu is True and not gpus:
        raise RuntimeError(f"gpu=True: cannot start GPU workers: {why}")
    if gpus:
        import dask_cuda   # present: visible_gpus imported it
        if n_workers is not None and n_workers > len(gpus):
            raise ValueError(f"n_workers: {n_workers} GPU workers asked, {len(gpus)} GPU(s) visible")
        ids = gpus[: n_workers or len(gpus)]
        cluster = dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(ids), dashboard_address=dashboard_address,
                                             **kwargs)
        out = LocalMatplanCluster(cluster, "cuda", f"one worker per GPU, devices {','.join(ids)}")
    else:
        n = n_workers or max(1, min(DEFAULT_CPU_WORKERS, os.cpu_count() or 1))
        cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=threads_per_worker, processes=processes,
                                           dashboard_address=dashboard_address, **kwargs)
        out = LocalMatplanCluster(cluster, "cpu", why)
    LOG.info("started %r", out)
    return out
