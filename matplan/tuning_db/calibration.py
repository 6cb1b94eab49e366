"""Online calibrations kept in the tuning database.

The live planner times TSM2's block sizes on the device and scales the TSM2
model's cost by measured/model for that shape bucket
(:data:`matplan.kernels.tsm2.T1_STORE`): for tall-and-skinny products the
planner decides on a measurement, not on the raw model. A tuning run records
each new entry of that store beside its timings; ``matplan train`` and
``matplan report`` install the recorded entries again, so candidates are
scored with the calibrated costs the live planner uses (scoring the raw model
instead made the report's worst regrets TSM2 picks the planner never makes).
"""
from __future__ import annotations

import contextlib
import json

from ..kernels import tsm2
from .store import CalibrationRecord

#: The kernel whose online calibration is recorded.
TSM2 = "tsgemm.tsm2"


class RecordingT1Store(tsm2.InProcessT1Store):
    """The in-process store of TSM2 winners, also remembering each new entry until :meth:`drain`."""

    def __init__(self):
        super().__init__()
        self._new: list = []

    def put(self, key, best, timings, ratio=None) -> None:
        super().put(key, best, timings, ratio)
        self._new.append((key, {"best": self.get(key), "timings": self.timings[key],
                                "ratio": self.ratio(key)}))

    def drain(self) -> list:
        """The (key, value) entries put since the last drain."""
        out, self._new = self._new, []
        return out


def recording_store() -> RecordingT1Store:
    """This process's recording store, installed as TSM2's store on first use (a tuning worker's)."""
    if not isinstance(tsm2.T1_STORE, RecordingT1Store):
        tsm2.set_t1_store(RecordingT1Store())
    return tsm2.T1_STORE


def records(device_key: str, version: str, entries) -> list:
    """CalibrationRecords of drained ``(key, value)`` entries."""
    return [CalibrationRecord(device_key, TSM2, json.dumps(list(key)), value, version)
            for key, value in entries]


def store_from(calibrations) -> tsm2.InProcessT1Store:
    """A TSM2 store holding recorded entries; of one key, the latest recorded wins."""
    store = tsm2.InProcessT1Store()
    for c in sorted(calibrations, key=lambda c: c.created_at):
        if c.kernel != TSM2:
            continue
        key, v = tuple(json.loads(c.key)), c.value
        store.put(key, v["best"], {}, v.get("ratio"))
        store.timings[key] = dict(v.get("timings", {}))   # already in the store's printable form
    return store


@contextlib.contextmanager
def installed(calibrations):
    """Install the recorded entries as TSM2's store for the ``with`` block, then restore the old one."""
    old = tsm2.T1_STORE
    tsm2.set_t1_store(store_from(calibrations))
    try:
        yield
    finally:
        tsm2.set_t1_store(old)


__all__ = ["RecordingT1Store", "recording_store", "records", "store_from", "installed", "TSM2"]
