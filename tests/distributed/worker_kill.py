"""A worker killed in the middle of a distributed product, for the fault tests (CPU and GPU):
import it after ``pytest.importorskip("dask.distributed")``."""
import os
import re
import signal

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin


def crash(nanny, restart: bool = False):
    """SIGKILL the worker process, as a crash would; unless ``restart``, its nanny is told not to
    start another (a restart would only cost the test time)."""
    if not restart:
        nanny.close_gracefully()
    os.kill(nanny.process.pid, signal.SIGKILL)


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
