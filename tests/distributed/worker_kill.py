"""A worker killed in the middle of a distributed product, for the fault tests (CPU and GPU):
import it after ``pytest.importorskip("dask.distributed")``."""
import os
import re
import signal
import time

import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from conftest import random_csr


@pytest.fixture(scope="module")
def cluster():
    """(LocalCluster, Client) of four single-threaded worker processes, shared by a module's tests
    (each kills at most one worker)."""
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        with Client(c) as client:
            client.wait_for_workers(4)
            yield c, client


def fault_problem(rng):
    """(A, B) of the fault tests: 600 x 400 times 400 x 300, 2% dense."""
    return random_csr(rng, 600, 400, 0.02), random_csr(rng, 400, 300, 0.02)


def crash(nanny, restart: bool = False):
    """SIGKILL the worker process, as a crash would; unless ``restart``, its nanny is told not to
    start another (a restart would only cost the test time)."""
    if not restart:
        nanny.close_gracefully()
    os.kill(nanny.process.pid, signal.SIGKILL)


def crash_worker(cluster, address: str, restart: bool = False, client=None, timeout: float = 20.0) -> None:
    """:func:`crash` the worker of ``cluster`` (a LocalCluster) at ``address``; with ``client``,
    wait until that client knows the worker is gone (a read sooner races the scheduler's news)."""
    for nanny in list(cluster.workers.values()):
        if nanny.worker_address == address:
            crash(nanny, restart)
    if client is not None:
        deadline = time.monotonic() + timeout
        while address in client.nthreads() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert address not in client.nthreads(), f"worker {address} still in the cluster after {timeout} s"


class KillOnFirstBlock(SchedulerPlugin):
    """Kills (through its nanny) the worker that has just finished the first block task of a product
    (a key matching ``marker``): the product's other blocks are still to run, and the killed worker
    takes its finished block, and any rows of A it holds, with it."""

    def __init__(self, cluster, marker=r"matplan-spgemm-\w+-block-", restart: bool = False):
        self.cluster, self.scheduler, self.marker, self.restart = cluster, cluster.scheduler, marker, restart
        self.killed = None

    def transition(self, key, start, finish, *args, **kwargs):
        if self.killed or finish != "memory" or not re.search(self.marker, str(key)):
            return
        address = next(iter(self.scheduler.tasks[key].who_has)).address
        for nanny in self.cluster.workers.values():
            if nanny.worker_address == address:
                self.killed = address
                crash(nanny, self.restart)


class SlowRunner(WorkerPlugin):
    """A worker plugin that makes the runners' SpGEMM blocks start ``seconds`` late (the tasks'
    blocks are untouched), so a worker can be killed while a runner call is in flight."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def setup(self, worker):
        import time
        from matplan.distributed import runner
        real, seconds = runner.spgemm_block, self.seconds

        def slow(*args, **kwargs):
            time.sleep(seconds)
            return real(*args, **kwargs)
        runner.spgemm_block = slow
