"""Training and evaluation data from the tuning database: one row per (problem, kernel, params).

Only timings that ran and matched the reference, of kernels registered in this process, are
rows. Repeated measurements of the same candidate (several devices of the class, tuning runs of
different labels: ``matplan tune --run``) are pooled by their median (of three runs, one run's
transient drops out); when a candidate was timed by several matplan versions, only the newest
version's timings count (kernels change).

A row's run time is one of two timings a tuning run records (``timing``): ``"single"``, the
median of synchronised single calls taken in rounds over the problem's candidates (a short call
right after two untimed calls of its own, timing.OWN_CALLS; tunes before that timed it after
another candidate's call, which left some 1.1-4x slower than back to back:
benchmarks/tuning_order.py), or ``"queued"``, calls of the candidate queued back to back (the
host's work overlapping the GPU's: what a plan's repeated runs and the planner's own measurement
see); records without a queued time (before schema 3) give their single calls either way.

A row's preparation is what a plan's first run pays beyond its later runs: ``prepare`` and,
where the kernel's repeated runs replay what a first call recorded (``first_ms``, see
:meth:`matplan.kernels.base.Kernel.tuning_calls`), the first call's excess over a run, as
SpTRANS's cost puts it; so reuse=1 scores a first call.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

from ..kernels import all_kernels, get
from ..core import device as device_mod
from ..models.learned import Query
from ..core.features import Features
from . import calibration
from .store import TuningDB


@dataclasses.dataclass(frozen=True)
class Row:
    problem: str                 # fingerprint
    kernel: str
    params: dict
    run_s: float
    prepare_s: float


#: The timings a row's run time can come from (module docstring).
TIMINGS = ("single", "queued")
DEFAULT_TIMING = "single"


@dataclasses.dataclass
class Dataset:
    device_class: str
    device: object               # DeviceSpec the planner used on that device
    device_name: str             # the measured device's own name (first of the class)
    problems: dict               # fingerprint -> ProblemRecord
    rows: list                   # of Row, sorted by (problem, kernel, params)
    failed: list                 # (problem, kernel, params, error) of failed or mismatched timings
    unregistered: list = dataclasses.field(default_factory=list)  # kernels timed but not registered now
    calibrations: list = dataclasses.field(default_factory=list)  # CalibrationRecords of the class
    timing: str = DEFAULT_TIMING  # which timing the rows' run times are (TIMINGS)

    def calibrated(self, idx=None):
        """Context manager: the planner's online calibrations of these timings installed (see
        :mod:`.calibration`), so kernels' analytic costs are the ones the live planner used.
        ``idx``: only the calibrations rows ``idx`` reach (a leave-family-out fold's training rows)."""
        if idx is None:
            return calibration.installed(self.calibrations)
        uses = {(self.rows[i].kernel, self.rows[i].problem) for i in idx}
        return calibration.installed(self.calibrations, [(k, self.features(fp)) for k, fp in sorted(uses)])

    def calibration_counts(self) -> dict:
        """How the recorded calibrations are read: recorded, legacy (migrated: records written before
        the planner's measurement cache), ignored (warned about by :meth:`calibrated`)."""
        _, ignored = calibration.classify(self.calibrations)
        bad = {id(c) for c, _ in ignored}
        legacy = sum(1 for c in self.calibrations if id(c) not in bad and "seconds" not in c.value)
        return {"recorded": len(self.calibrations), "legacy_migrated": legacy, "ignored": len(ignored)}

    def __len__(self):
        return len(self.rows)

    def features(self, fp) -> Features:
        cache = self.__dict__.setdefault("_features", {})
        if fp not in cache:
            cache[fp] = Features.from_dict(self.problems[fp].features)
        return cache[fp]

    def queries(self, idx=None) -> list:
        rows = self.rows if idx is None else [self.rows[i] for i in idx]
        return [self.query(r.problem, r.kernel, r.params) for r in rows]

    def query(self, fp, kernel: str, params: dict) -> Query:
        """The learned model's Query of ``kernel`` with ``params`` on problem ``fp``: with the
        kernel's analytic Cost (as calibrated where :meth:`calibrated` is in force; None where its
        cost() rejects the row) and its ``reads_a_at_run``."""
        f, k = self.features(fp), get(kernel)
        try:
            analytic = k.cost(f, params, self.device)
        except Exception:  # noqa: BLE001  only the combined model reads it, and says so when it is missing
            analytic = None
        return Query(f, kernel, params, self.device, analytic, k.reads_a_at_run)

    def y(self, idx=None) -> np.ndarray:
        rows = self.rows if idx is None else [self.rows[i] for i in idx]
        return np.array([[r.run_s, r.prepare_s] for r in rows], dtype=np.float64).reshape(-1, 2)

    def groups(self, idx=None) -> list:
        rows = self.rows if idx is None else [self.rows[i] for i in idx]
        return [self.problems[r.problem].family for r in rows]

    def hash(self) -> str:
        """SHA-256 of the rows (problem, kernel, params, times): names the training set."""
        h = hashlib.sha256()
        for r in self.rows:
            h.update(json.dumps([r.problem, r.kernel, r.params, f"{r.run_s:.6e}", f"{r.prepare_s:.6e}"],
                                sort_keys=True).encode())
        return h.hexdigest()


def pick_device_class(store: TuningDB, device_class: str | None) -> str:
    classes = store.device_classes()
    if device_class is None:
        if len(classes) != 1:
            raise ValueError(f"device_class: the database {store.path} holds "
                             f"{classes or 'no devices'}; name one with --device-class")
        return classes[0]
    if device_class not in classes:
        raise ValueError(f"device_class: {device_class!r} has no timings in {store.path} (it has {classes})")
    return device_class


def _run_ms(t, timing: str) -> float:
    """A timing's run time by ``timing`` (module docstring), milliseconds."""
    return t.run_ms_queued if timing == "queued" and t.run_ms_queued is not None else t.run_ms_median


def _first_run_extra_ms(t, timing: str) -> float:
    """What a plan's first run pays beyond a later run (module docstring), milliseconds."""
    excess = max(0.0, t.first_ms - _run_ms(t, timing)) if t.first_ms is not None else 0.0
    return (t.prepare_ms or 0.0) + excess


def load_dataset(store: TuningDB, device_class: str | None = None, timing: str = DEFAULT_TIMING) -> Dataset:
    """The rows of ``device_class`` (the only class in the database when None), their run times
    by ``timing`` (one of TIMINGS)."""
    if timing not in TIMINGS:
        raise ValueError(f"timing: expected one of {TIMINGS}, got {timing!r}")
    device_class = pick_device_class(store, device_class)
    devices = [d for d in store.devices() if d.device_class == device_class]
    known = {f.name for f in dataclasses.fields(device_mod.DeviceSpec)}
    spec = device_mod.DeviceSpec(**{k: v for k, v in devices[0].spec.items() if k in known})
    problems = {p.fingerprint: p for p in store.problems()}
    latest: dict = {}
    for t in sorted(store.timings(device_class=device_class), key=lambda t: t.created_at):
        key = (t.problem, t.kernel, t.params)
        kept = latest.get(key)
        if kept is None or kept[0] != t.matplan_version:
            latest[key] = (t.matplan_version, [t])
        else:
            kept[1].append(t)
    registered = {k.name for k in all_kernels()}
    rows, failed, unregistered = [], [], set()
    for (fp, kernel, params), (_, recs) in sorted(latest.items()):
        if kernel not in registered:       # the analytic cost (a feature) needs the kernel
            unregistered.add(kernel)
            continue
        good = [t for t in recs if t.status == "ok" and t.matched]
        if good:
            rows.append(Row(fp, kernel, json.loads(params),
                            float(np.median([_run_ms(t, timing) for t in good])) * 1e-3,
                            float(np.median([_first_run_extra_ms(t, timing) for t in good])) * 1e-3))
        else:
            failed.append((fp, kernel, json.loads(params), recs[-1].error.splitlines()[0] if recs[-1].error else ""))
    return Dataset(device_class, spec, devices[0].name, problems, rows, failed, sorted(unregistered),
                   store.calibrations(device_class), timing)


__all__ = ["Dataset", "Row", "load_dataset", "pick_device_class", "TIMINGS", "DEFAULT_TIMING"]
