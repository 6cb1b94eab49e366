"""A kernel plugin for the distributed tuning tests: ``test.slow``, a CSR product that sleeps first,
so a problem takes long enough on a worker to kill that worker in the middle of it."""
import time

from matplan.core.types import Cost
from matplan.kernels import register
from tuning_helpers import _Host

SLEEP_S = 0.15


class Slow(_Host):
    name = "test.slow"

    def cost(self, f, params, device):
        return Cost(0.0, 1.0, "slow")

    def run(self, prepared, B, out=None):
        time.sleep(SLEEP_S)
        C = self._out(prepared, B, out)
        C[...] = prepared.arrays["A"] @ B
        return C


register(Slow())
