"""Offline tuning runs: time every registered candidate on every problem of a corpus.

A *work unit* is one problem (a matrix, the op, k and dtype). For each unit a
worker builds the operands, computes the planner's features, asks every
registered kernel for the op and backend for its parameter sets (the optional
``tuning_candidates`` method when a kernel offers a wider search space than
``candidates``), and for each candidate: prepares the format, runs once into
a NaN-poisoned output and checks it against the SciPy float64 reference,
then times format preparation and the run (CUDA events on the GPU, after
warm-up; ``perf_counter`` on the host; median/min/max). A candidate that
raises is recorded as failed with its error; the run goes on.

Work is split with joblib: in-process for one worker, loky processes for
several (on the GPU one worker per GPU, each holding a GPU from a shared pool
while it times), or a Dask cluster when a scheduler address is given (or
"local": a local cluster started for the run). On Dask each problem is one task
that never shares its worker (and so its GPU) with another: tasks ask for one
``GPU`` resource where the workers declare it, else every worker must have one
thread (dask-cuda's default); other clusters are refused. Workers return
records; the calling process alone writes them, once per problem, as they
arrive, so an interrupted run resumes where it stopped: candidates recorded for
this device and matplan version are skipped.

The units are in :mod:`.units`, the reference a candidate is checked against in :mod:`.reference`.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import signal
import socket
import time
import uuid

import joblib
import numpy as np
import scipy.sparse as sp

from ..core import device as device_mod
from ..core import features as stats
from ..core.validation import check_int, normalize
from ..core.version import __version__
from ..core.xp import cupy_module, cupyx_sparse, gpu_available
from ..kernels import _cuda, kernels_for
from . import calibration, identity
from .progress import bar as progress_bar
from .reference import check_reference_fits, reference, tolerance
from .records import ProblemRecord, TimingRecord, canonical_params
from .store import TuningDB, open_db
from .timing import BUDGET_S, CudaTimer, DeviceContextLost, HostTimer, error_text, time_candidates
from .units import WorkUnit

#: Timing defaults per backend: (timed repeats, warm-up runs). Repeats stop early past the budget.
REPEATS = {"gpu": (20, 3), "cpu": (5, 1)}


# --- one unit ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TuneSettings:
    backend: str
    repeats: int
    warmup: int
    budget_s: float = BUDGET_S
    kernels: tuple | None = None         # restrict to these kernel names
    version: str = __version__
    imports: tuple = ()                  # modules that register extra kernels, imported in every worker
    isolated: bool = False               # running in a worker process (which may exit if its device is lost)
    run: str = ""                        # the run's label (TimingRecord.run)


@dataclasses.dataclass
class UnitResult:
    unit: WorkUnit
    device: object = None                # DeviceRecord
    problem: ProblemRecord | None = None
    timings: list = dataclasses.field(default_factory=list)
    calibrations: list = dataclasses.field(default_factory=list)   # online calibrations made meanwhile
    skipped: int = 0
    error: str = ""                      # the unit itself could not be built
    seconds: float = 0.0
    context_lost: bool = False           # a candidate left the device unusable; the rest did not run
    worker: str = ""                     # where it ran: host, process id and GPU


#: Set in a worker process whose device context was lost: its next task exits the process.
_BROKEN = False
#: Exit status of such a worker (joblib/loky then starts a fresh one).
LOST_EXIT_CODE = 75
#: Worker replacements before a run gives up.
MAX_RESTARTS = 10
_RESTARTABLE = ("TerminatedWorkerError", "BrokenProcessPool", "KilledWorker")


def _candidate_params(kernel, feats, dev):
    gen = getattr(kernel, "tuning_candidates", None) or kernel.candidates
    return [dict(p) for p in gen(feats, dev)]


def run_unit(unit: WorkUnit, done: dict, settings: TuneSettings, gpu_pool=None) -> UnitResult:
    """Tune one unit (in whichever process joblib runs it); ``done`` maps device key ->
    problem fingerprint -> {(kernel, params)} already recorded. With ``gpu_pool`` (a queue of
    GPU ids) the unit holds one GPU for its whole run."""
    if _BROKEN and settings.isolated:
        os._exit(LOST_EXIT_CODE)   # this process's device is unusable: joblib replaces the worker
    _import_plugins(settings.imports)
    if settings.backend != "gpu" or gpu_pool is None:
        return _run_unit(unit, done, settings)
    gpu = gpu_pool.get()
    try:
        with cupy_module().cuda.Device(gpu):
            res = _run_unit(unit, done, settings)
        res.worker += f" GPU {gpu}"
        return res
    finally:
        gpu_pool.put(gpu)


def _import_plugins(names):
    for name in names:
        importlib.import_module(name)


def _run_unit(unit, done, s: TuneSettings) -> UnitResult:
    global _BROKEN
    t0 = time.perf_counter()
    res = UnitResult(unit, device=identity.device_record(s.backend),
                     worker=f"{socket.gethostname()} pid {os.getpid()}")
    cp = cupy_module() if s.backend == "gpu" else None
    try:
        A, B = unit.build()
        fp = identity.problem_fingerprint(unit.op, A, B)
        if cp is not None:
            csp = cupyx_sparse()
            Ad = csp.csr_matrix(A) if sp.issparse(A) else cp.asarray(A)
            Bd = csp.csr_matrix(B) if sp.issparse(B) else cp.asarray(B)
        else:
            Ad, Bd = A, B
        problem = normalize(Ad, Bd)
        dev = device_mod.current()
        feats = stats.compute(problem, dev)
        check_reference_fits(feats)
    except Exception as exc:
        res.error, res.seconds = f"{unit.key}: {error_text(exc)}", time.perf_counter() - t0
        return res
    res.problem = ProblemRecord(fp, problem.op, str(problem.dtype), unit.key, unit.family, unit.matrix,
                                feats.to_dict())
    recorded = done.get(res.device.key, {}).get(fp, set())
    host = socket.gethostname()

    def record(kernel_name, params, fields):
        res.timings.append(TimingRecord(device_key=res.device.key, problem=fp, kernel=kernel_name,
                                        params=canonical_params(params), matplan_version=s.version,
                                        host=host, run=s.run, **fields))
    todo = []
    online = calibration.recording()
    online.drain()          # what an earlier unit left in this process was recorded with that unit
    for kernel in kernels_for(problem.op, s.backend):
        if (s.kernels is not None and kernel.name not in s.kernels) or not kernel.available():
            continue
        try:
            if kernel.supports(feats):
                continue
            plist = (calibration.tuned_params(kernel, problem, feats, dev)   # what the planner would run
                     or _candidate_params(kernel, feats, dev))
        except Exception as exc:
            if (kernel.name, canonical_params({})) not in recorded:
                record(kernel.name, {}, dict(status="failed",
                                             error=f"supports()/candidates(): {error_text(exc)}"))
            continue
        for params in plist:
            if (kernel.name, canonical_params(params)) in recorded:
                res.skipped += 1
            else:
                todo.append((kernel, params))
    res.calibrations = calibration.records(res.device.key, s.version, online.drain())
    if todo:
        if cp is not None:   # the configs' modules without a prebuilt binary, compiled over every core
            _cuda.precompile([m for kernel, params in todo for m in kernel.modules(feats, params)])
        ref, bound = reference(A, B)
        timer = CudaTimer(cp) if cp is not None else HostTimer()
        if time_candidates(todo, problem, ref, bound, tolerance(feats), timer, cp if cp is not None else np, s,
                           record, cp.cuda.Device().mem_info[1] if cp is not None else 0):
            res.context_lost = True          # the candidates not recorded run again (in a fresh worker)
            _BROKEN = _BROKEN or s.isolated
    res.seconds = time.perf_counter() - t0
    return res


# --- the run -------------------------------------------------------------------------------
@dataclasses.dataclass
class TuneSummary:
    db: str
    device_classes: set
    units: int = 0
    timed: int = 0
    failed: int = 0
    mismatched: int = 0
    skipped: int = 0
    unit_errors: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    restarts: int = 0
    workers: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: Seconds each worker spent in its problems (building, checking, timing): against ``seconds``,
    #: what the run's wall time spent elsewhere (starting a cluster, waiting, recording).
    busy: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def __str__(self):
        s = (f"tuned {self.units} problems in {self.seconds:.1f} s on {', '.join(sorted(self.device_classes)) or '-'}: "
             f"{self.timed} candidates timed ({self.failed} failed, {self.mismatched} did not match the "
             f"reference), {self.skipped} already recorded; database {self.db}")
        if len(self.workers) > 1:
            s += "\nproblems per worker: " + ", ".join(f"{w}: {n} ({self.busy[w]:.1f} s busy)"
                                                       for w, n in sorted(self.workers.items()))
        if self.restarts:
            s += f"\n{self.restarts} worker processes were replaced after a device was left unusable"
        if self.unit_errors:
            s += f"\n{len(self.unit_errors)} problems could not be built or checked:\n  " + "\n  ".join(
                e.splitlines()[0] for e in self.unit_errors)
        return s


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`tune`: every problem finished before it is recorded (``summary``
    counts them), so the same call resumes the run."""

    def __init__(self, summary: TuneSummary):
        super().__init__(f"interrupted after {summary.units} problems")
        self.summary = summary


def _gpu_count() -> int:
    cp = cupy_module()
    return cp.cuda.runtime.getDeviceCount() if cp is not None else 0


def tune(units, db=None, *, backend: str | None = None, n_jobs: int | None = None,
         scheduler: str | None = None, repeats: int | None = None, warmup: int | None = None,
         budget_s: float = BUDGET_S, kernels=None, retry_failed: bool = False,
         progress: bool = True, imports=(), run: str = "") -> TuneSummary:
    """Time every registered candidate of every unit and write the results to the database.

    backend: 'gpu' (default when CuPy sees a GPU) or 'cpu'.
    n_jobs: worker processes (default: one per GPU, or 1 on the host); on the GPU at most
        one per GPU, so timings never share a device.
    scheduler: a Dask scheduler address ('tcp://host:8786'), or "local" to start a local
        cluster for the run (one worker per GPU with dask-cuda; ``n_jobs`` CPU workers on the
        host); each problem is one task holding its worker alone (needs ``matplan[distributed]``).
    retry_failed: time again the candidates recorded as failed.
    imports: modules that register extra kernels; imported here and in every worker.
    run: a label for this tuning run: candidates recorded under another label are timed again and
        kept beside those (the dataset pools them); a run resumes only its own label's work.

    On the GPU the units always run in worker processes, so that a candidate that breaks
    its CUDA context costs only that worker: it is recorded as failed and a fresh worker
    runs the rest (at most MAX_RESTARTS times per run).
    """
    units = list(dict.fromkeys(units))
    for u in units:
        if not isinstance(u, WorkUnit):
            raise TypeError(f"units: expected WorkUnit items (see corpus_units/file_units), got {type(u).__name__}")
    backend = backend or ("gpu" if gpu_available() else "cpu")
    if backend not in ("cpu", "gpu"):
        raise ValueError(f"backend: expected 'cpu' or 'gpu', got {backend!r}")
    if backend == "gpu" and not gpu_available():
        raise RuntimeError("backend='gpu' needs CuPy and an NVIDIA GPU")
    gpus = _gpu_count() if backend == "gpu" else 0
    if n_jobs is None:
        n_jobs = max(gpus, 1) if backend == "gpu" else 1
    n_jobs = check_int(n_jobs, "n_jobs", "None or a positive number of worker processes")
    if repeats is not None:
        repeats = check_int(repeats, "repeats", "None or a positive number of timed runs per candidate")
    if warmup is not None:
        warmup = check_int(warmup, "warmup", "None or a number >= 0 of untimed runs", minimum=0)
    if backend == "gpu" and scheduler is None and n_jobs > gpus:
        raise ValueError(f"n_jobs: {n_jobs} workers but {gpus} GPUs; use at most one worker per GPU "
                         "so that timings never share a device")
    rep, warm = REPEATS[backend]
    imports = tuple(imports)
    _import_plugins(imports)
    if not isinstance(run, str):
        raise TypeError(f"run: expected a string label, got {type(run).__name__}")
    settings = TuneSettings(backend, repeats or rep, warm if warmup is None else warmup,
                            budget_s, tuple(kernels) if kernels is not None else None, imports=imports, run=run)
    opened_here = not isinstance(db, TuningDB)
    store = open_db(db)
    summary = TuneSummary(db=str(store.path), device_classes=set())
    pending = {u.key: u for u in units}
    t0 = time.perf_counter()
    try:
        with progress_bar(len(units), "matplan tune", "problem", progress) as bar:
            restarts = 0
            while pending:
                done = {u: store.done_for_source(u.key, settings.version, include_failed=not retry_failed,
                                                 run=run) for u in pending.values()}
                try:
                    for res in _results(list(pending.values()), done, settings, n_jobs, scheduler, backend, bar):
                        _record(store, res, summary, bar)
                        if not res.context_lost:
                            pending.pop(res.unit.key, None)
                            bar.update(1)
                        bar.set_postfix(timed=summary.timed, failed=summary.failed, skipped=summary.skipped,
                                        refresh=False)
                except Exception as exc:
                    if type(exc).__name__ not in _RESTARTABLE or restarts >= MAX_RESTARTS:
                        raise
                    restarts += 1
                    bar.write(f"matplan tune: a worker process ended ({type(exc).__name__}); "
                              f"starting fresh workers for the {len(pending)} problems left "
                              f"(restart {restarts} of at most {MAX_RESTARTS})")
        summary.restarts = restarts
    except KeyboardInterrupt:
        summary.seconds = time.perf_counter() - t0
        raise Interrupted(summary) from None
    finally:
        summary.seconds = time.perf_counter() - t0
        if opened_here:
            store.close()
    return summary


def _record(store, res, summary, bar):
    """Write one unit's records and count them."""
    if res.error:
        summary.units += 1
        summary.unit_errors.append(res.error)
        bar.write(f"matplan tune: could not build or check {res.error.splitlines()[0]}")
        return
    summary.device_classes.add(res.device.device_class)
    store.put(res.device, res.problem, res.timings, res.calibrations)
    summary.units += not res.context_lost
    summary.workers[res.worker] += 1
    summary.busy[res.worker] += res.seconds
    summary.timed += len(res.timings)
    summary.failed += sum(t.status == "failed" for t in res.timings)
    summary.mismatched += sum(t.matched is False for t in res.timings)
    summary.skipped += res.skipped
    if res.context_lost:
        bar.write(f"matplan tune: {res.timings[-1].kernel} left the device unusable on {res.unit.key}; "
                  "recorded as failed, the rest of that problem runs in a fresh worker")


def _ignore_sigint():
    """Loky workers' initializer: Ctrl-C (sent to the whole process group) is the calling
    process's to handle; a worker that took it would print its own traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _results(units, done, settings, n_jobs, scheduler, backend, bar):
    """Yield UnitResults as they finish: in this process, in loky worker processes, or on Dask."""
    if scheduler is None and n_jobs == 1 and backend == "cpu":
        for u in units:
            yield run_unit(u, done[u], settings)
        return
    isolated = dataclasses.replace(settings, isolated=True)
    with contextlib.ExitStack() as stack:
        if scheduler is not None:
            yield from _dask_results(stack, units, done, isolated, n_jobs, scheduler, backend, bar)
            return
        pool = None
        if backend == "gpu":   # GPU ids handed to one unit at a time: timings never share a GPU
            manager = stack.enter_context(multiprocessing.Manager())
            pool = manager.Queue()
            for i in range(n_jobs):
                pool.put(i)
        jobs = (joblib.delayed(run_unit)(u, done[u], isolated, pool) for u in units)
        stack.enter_context(joblib.parallel_config(backend="loky", initializer=_ignore_sigint))
        yield from joblib.Parallel(n_jobs=n_jobs, return_as="generator_unordered")(jobs)


#: ``scheduler=LOCAL``: a local Dask cluster started for the run and closed after it.
LOCAL = "local"


def _dask_client(stack, scheduler, backend, n_jobs):
    """A ``distributed.Client`` of the scheduler at ``scheduler``, or of a local cluster started
    here for "local" (dask-cuda's one worker per GPU for the GPU; ``n_jobs`` one-thread CPU workers)."""
    try:
        import distributed   # the optional matplan[distributed] extra
    except ImportError as e:
        raise RuntimeError("scheduler: the Dask backend needs `pip install matplan[distributed]`") from e
    if scheduler != LOCAL:
        return stack.enter_context(distributed.Client(scheduler))
    if backend == "gpu":
        try:
            import dask_cuda   # the optional matplan[cuda-distributed] extra
        except ImportError as e:
            raise RuntimeError("scheduler='local' on the GPU needs dask-cuda: pip install "
                               "'matplan[cuda-distributed]'") from e
        cluster = stack.enter_context(dask_cuda.LocalCUDACluster(threads_per_worker=1, dashboard_address=None))
    else:
        cluster = stack.enter_context(distributed.LocalCluster(n_workers=n_jobs, threads_per_worker=1,
                                                               processes=True, dashboard_address=None))
    return stack.enter_context(distributed.Client(cluster))


def dask_resources(client) -> dict | None:
    """What each tuning task asks of its worker so that no two ever share one (and its GPU):
    ``{"GPU": 1}`` where every worker declares exactly one GPU resource; None where every worker
    has one thread; a ValueError for any other cluster, saying how to start its workers."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    if not workers:
        raise RuntimeError("scheduler: the Dask cluster has no workers")
    gpus = {a: (w.get("resources") or {}).get("GPU") for a, w in workers.items()}
    if all(g == 1 for g in gpus.values()):
        return {"GPU": 1}
    wrong = {a: g for a, g in gpus.items() if g not in (None, 1)}
    if wrong:
        a, g = next(iter(wrong.items()))
        raise ValueError(f"scheduler: worker {a} declares GPU={g}; a tuning worker holds one GPU: start one worker "
                         "per GPU with --resources GPU=1 (dask-cuda-worker starts one per GPU)")
    many = {a: w.get("nthreads") for a, w in workers.items() if w.get("nthreads") != 1}
    if many or any(g is not None for g in gpus.values()):
        a = next(iter(many or {a: g for a, g in gpus.items() if g is None}))
        raise ValueError(f"scheduler: worker {a} has {workers[a].get('nthreads')} threads and "
                         f"{'no' if gpus[a] is None else 'a'} GPU resource, so two problems could be timed on one "
                         "device at once; start workers with one thread each (--nthreads 1, dask-cuda's default) "
                         "or give every worker --resources GPU=1")
    return None


def _dask_results(stack, units, done, settings, n_jobs, scheduler, backend, bar):
    """UnitResults of ``units`` run as one Dask task each, one result per problem: a task Dask runs
    again after its worker died comes back once, through its one future."""
    from distributed import as_completed   # present: _dask_client imported distributed
    client = _dask_client(stack, scheduler, backend, n_jobs)
    resources = dask_resources(client)
    bar.write(f"matplan tune: running on the Dask cluster at {client.scheduler.address} "
              f"({len(client.nthreads())} workers, " + ("one GPU resource per problem)" if resources
                                                      else "one thread each: one problem per worker at a time)"))
    tag = uuid.uuid4().hex[:8]
    futures = [client.submit(run_unit, u, done[u], settings, key=f"matplan-tune-{tag}-{i}", pure=False,
                             resources=resources) for i, u in enumerate(units)]
    try:
        for f in as_completed(futures):
            yield f.result()
            f.release()
    finally:
        for f in futures:
            f.cancel()


__all__ = ["tune", "run_unit", "TuneSummary", "TuneSettings", "DeviceContextLost", "Interrupted"]
