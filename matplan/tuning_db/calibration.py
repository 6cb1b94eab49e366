"""Online calibrations kept in the tuning database.

The live planner times TSM2's block sizes and cuBLAS on the device and scales
both models' costs by measured/model for that shape bucket
(:data:`matplan.kernels.tsm2.T1_STORE`, :data:`~matplan.kernels.tsm2.VENDOR_RATIO`):
for tall-and-skinny products the planner decides on measurements, not on the
raw models. A tuning run records
each new entry of that store beside its timings; ``matplan train`` and
``matplan report`` install the recorded entries again, so candidates are
scored with the calibrated costs the live planner uses (scoring the raw model
instead made the report's worst regrets TSM2 picks the planner never makes).
"""
from __future__ import annotations

import contextlib
import json

from ..kernels.tsgemm import tsm2
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
                                "ratio": self.ratio(key), "vendor_ratio": tsm2.VENDOR_RATIO.get(key)}))

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


def store_from(calibrations) -> tuple:
    """(TSM2 store, cuBLAS ratios by key) of recorded entries; of one key, the latest recorded wins."""
    store, vendor = tsm2.InProcessT1Store(), {}
    for c in sorted(calibrations, key=lambda c: c.created_at):
        if c.kernel != TSM2:
            continue
        key, v = tuple(json.loads(c.key)), c.value
        store.put(key, v["best"], {}, v.get("ratio"))
        store.timings[key] = dict(v.get("timings", {}))   # already in the store's printable form
        if v.get("vendor_ratio") is not None:
            vendor[key] = float(v["vendor_ratio"])
    return store, vendor


@contextlib.contextmanager
def installed(calibrations):
    """Install the recorded entries (TSM2's store and cuBLAS's ratios) for the ``with`` block, then
    restore what was there."""
    old_store, old_vendor = tsm2.T1_STORE, dict(tsm2.VENDOR_RATIO)
    store, vendor = store_from(calibrations)
    tsm2.set_t1_store(store)
    tsm2.VENDOR_RATIO.clear()
    tsm2.VENDOR_RATIO.update(vendor)
    try:
        yield
    finally:
        tsm2.set_t1_store(old_store)
        tsm2.VENDOR_RATIO.clear()
        tsm2.VENDOR_RATIO.update(old_vendor)


__all__ = ["RecordingT1Store", "recording_store", "records", "store_from", "installed", "TSM2"]
