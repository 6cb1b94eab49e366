"""The client's side of a distributed product: the client, inputs kept alive on the cluster, tasks
per block (and one record task per worker), and what happens when a worker is lost.

A block's inputs are scattered data (its resident rows of A, the replicated B or X); Dask cannot
recompute scattered data, so when a worker dies with them its futures are cancelled. The client
can rebuild them (a resident matrix from the host matrix it keeps, see
:mod:`matplan.distributed.csr`; :class:`Live` scatters an operand again when its future is gone),
and blocks are pure functions of them: :func:`collect` resubmits a block (or a worker's group of
blocks) whose task was cancelled, up to ``retries`` times, then raises
:class:`DistributedProductError`. A task that merely ran on a worker that died, with its inputs
alive elsewhere, is rescheduled by Dask itself. Any other failure (a block that failed its check,
a bad input, an input that cannot be rebuilt, a task that killed its workers repeatedly) cancels
the call's other tasks and raises: a call returns every block or none.
"""
from __future__ import annotations

import itertools
import time
import uuid
from concurrent.futures import CancelledError

import distributed
from distributed import as_completed, wait
from distributed.scheduler import KilledWorker

from .checks import BlockCheckError
from .runner import HeldBlockLost
from .worker import block_infos

#: Default number of times a block whose worker was lost is submitted again.
RETRIES = 2
#: Seconds before the first resubmission, doubled for each later one: a block resubmitted within
#: milliseconds of its worker's death can depend on inputs the scheduler still believes alive.
RETRY_BACKOFF_S = 0.25


def backoff(attempt: int) -> None:
    """Wait before resubmission number ``attempt`` (0 first), so the scheduler hears of the loss."""
    time.sleep(RETRY_BACKOFF_S * 2 ** attempt)


#: Seconds to wait for blocks Dask is computing again (their worker died after their record came
#: back) before they count as lost and are resubmitted.
SETTLE_S = 30.0


def settle(futures) -> None:
    """Wait (at most SETTLE_S) for those of ``futures`` that are pending: Dask recomputes a lost
    block whose inputs it still has, and a check of its status the moment it is lost says pending."""
    pending = [f for f in futures if f.status == "pending"]
    if pending:
        try:
            wait(pending, timeout=SETTLE_S)
        except TimeoutError:   # still pending: counted as lost by the caller
            pass


class DistributedProductError(RuntimeError):
    """A distributed product could not complete: no partial result is returned."""


def resolve_client(client):
    """``client``, or the default Dask client where there is one; a clear error otherwise."""
    if client is None:
        try:
            return distributed.get_client()
        except ValueError:
            raise ValueError("client: no distributed.Client was given and none is running; pass client=... "
                             "(matplan.distributed.local_cluster() starts a local one)") from None
    if not isinstance(client, distributed.Client):
        raise TypeError(f"client: expected a distributed.Client, got {type(client).__name__}")
    if client.status not in ("running", "connecting", "newly-created"):
        raise ValueError(f"client: this distributed.Client is {client.status}, not running")
    return client


def task_key(what: str) -> str:
    """A fresh key prefix: tasks of one call are named after it in Dask's dashboard, never reused."""
    return f"matplan-{what}-{uuid.uuid4().hex[:12]}"


class Live:
    """A future for a value the client can always rebuild: ``get()`` returns it, making it again
    (``make()``) when it was never made or its data was lost with a worker."""

    def __init__(self, make):
        self._make, self._future, self.remade = make, None, 0

    def get(self):
        f = self._future
        if f is None or f.status in ("cancelled", "lost", "error"):
            if f is not None:
                self.remade += 1
            f = self._future = self._make()
        return f

    def set(self, future) -> None:
        self._future = future

    def release(self) -> None:
        if self._future is not None:
            self._future.release()
            self._future = None


def _lost(exc) -> bool:
    return isinstance(exc, (CancelledError, distributed.comm.CommClosedError, HeldBlockLost))


def collect(submit, indices, *, retries: int, what: str, describe) -> tuple:
    """Run ``submit(i)`` (a future of a small result) for each block index and gather every result.

    A block whose future is cancelled (its worker lost with its inputs) is submitted again, at
    most ``retries`` times; anything else raises, after cancelling the remaining tasks.
    ``describe(i)`` names block i in messages. Returns ({index: result}, {index: resubmissions})."""
    futures, attempts, results = {}, {i: 0 for i in indices}, {}
    try:
        for i in indices:   # a block whose input cannot be rebuilt raises here: the others are cancelled
            futures[submit(i)] = i
        pending = as_completed(list(futures))
        for f in pending:
            i = futures.pop(f)
            try:
                results[i] = f.result()
                continue
            except BlockCheckError:
                raise
            except KilledWorker as e:
                raise DistributedProductError(f"{what}: {describe(i)} killed the workers that ran it ({e}); "
                                              "it may need more memory than a worker has") from e
            except Exception as e:
                if not _lost(e):
                    raise DistributedProductError(f"{what}: {describe(i)} failed on its worker: "
                                                  f"{type(e).__name__}: {e}") from e
                if attempts[i] >= retries:
                    raise DistributedProductError(f"{what}: {describe(i)} was lost with its worker on each of "
                                                  f"{attempts[i] + 1} attempt(s); no partial result is returned") from e
            backoff(attempts[i])
            attempts[i] += 1
            g = submit(i)
            futures[g] = i
            pending.add(g)
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    return results, attempts


def groups_of(indices, hint) -> list:
    """[(worker or None, [block indices])]: blocks with the same worker ``hint(i)`` together, each
    block without one (None) alone."""
    by_worker, alone = {}, []
    for i in indices:
        w = hint(i)
        if w is None:
            alone.append((None, [i]))
        else:
            by_worker.setdefault(w, []).append(i)
    return list(by_worker.items()) + alone


def collect_blocks(client, indices, submit_block, *, hint, key: str, retries: int, what: str, describe) -> tuple:
    """Run ``submit_block(i, worker)`` (a future of a Block that stays on its worker) for each index,
    and one task per worker gathering the records of its blocks, placed where ``hint(i)`` says the
    block's inputs are (a hint, not a restriction: a block may run elsewhere if its worker is gone).

    One record task per worker rather than one per block: a call's round trips do not grow with its
    blocks. A group lost with its worker is submitted again (``retries`` times), as :func:`collect`
    does. Returns ({index: block future}, {index: record}, blocks resubmitted)."""
    futures, serial = {}, itertools.count()
    groups = groups_of(list(indices), hint)

    def submit(g):
        w, members = groups[g]
        fs = [submit_block(i, w) for i in members]
        futures.update(zip(members, fs))
        opts = {} if w is None else dict(workers=[w], allow_other_workers=True)
        return client.submit(block_infos, *fs, key=f"{key}-info-{g}-{next(serial)}", pure=False, **opts)

    def name(g):
        w, members = groups[g]
        return describe(members[0]) if len(members) == 1 else \
            f"blocks {', '.join(str(i) for i in members)}" + (f" on {w}" if w else "")
    results, attempts = collect(submit, range(len(groups)), retries=retries, what=what, describe=name)
    records = {i: rec for g, recs in results.items() for i, rec in zip(groups[g][1], recs)}
    return futures, records, sum(n * len(groups[g][1]) for g, n in attempts.items())


class Timer:
    """Wall-clock phases of a call, in seconds."""

    def __init__(self):
        self.t, self.phases = time.perf_counter(), {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.t
        self.t = now


def split_times(wall_s: float, infos, keys=("place_s", "plan_s", "kernel_s", "check_s")) -> dict:
    """The run's wall time split into the work on the workers and what Dask adds.

    ``busy_critical_s``: the largest sum of a worker's block times (its ``keys``), the run's critical
    path if every worker were always busy; ``overhead_s``: wall time past it (scheduling, transfers
    of inputs and results, waiting), never negative."""
    per_worker, sums = {}, {k: 0.0 for k in keys}
    for info in infos:
        busy = sum(float(info.get(k, 0.0)) for k in keys)
        per_worker[info["worker"]] = per_worker.get(info["worker"], 0.0) + busy
        for k in keys:
            sums[k] += float(info.get(k, 0.0))
    critical = max(per_worker.values(), default=0.0)
    return dict(run_s=wall_s, busy_critical_s=critical, overhead_s=max(0.0, wall_s - critical),
                workers_used=len(per_worker), **{f"{k[:-2]}_sum_s": v for k, v in sums.items()})
