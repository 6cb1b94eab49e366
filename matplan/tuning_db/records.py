"""The records the tuning database holds: a device, a problem, a timing of one candidate on
one problem, and a calibration a kernel measured online; each keyed by its natural key."""
from __future__ import annotations

import dataclasses
import json
import math

#: A timing ran and was checked (``ok``) or raised (``failed``).
STATUSES = ("ok", "failed")


def canonical_params(params: dict) -> str:
    """The params dict as canonical JSON (sorted keys): the form stored and compared."""
    if not isinstance(params, dict):
        raise TypeError(f"params: expected a dict, got {type(params).__name__}")
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class DeviceRecord:
    key: str                     # hash of the identity fields (see identity.device_record)
    device_class: str            # "H100", "A100", ..., or "cpu": which learned model applies
    backend: str                 # "gpu" | "cpu"
    name: str
    compute_capability: str = ""
    sms: int = 0
    memory_bytes: int = 0
    driver: str = ""
    cuda: str = ""
    cupy: str = ""
    spec: dict = dataclasses.field(default_factory=dict)   # DeviceSpec.to_dict() the planner used


@dataclasses.dataclass(frozen=True)
class ProblemRecord:
    fingerprint: str             # content hash of (op, dtype, A, B)
    op: str
    dtype: str
    source: str                  # work-unit key, e.g. "corpus:poisson3d:small:0|spmm|k=16|float64"
    family: str                  # matrix family, the unit of leave-family-out evaluation
    matrix: str                  # matrix name, e.g. "poisson3d-small"
    features: dict = dataclasses.field(default_factory=dict)  # planner Features.to_dict()


@dataclasses.dataclass(frozen=True)
class TimingRecord:
    device_key: str
    problem: str                 # ProblemRecord.fingerprint
    kernel: str
    params: str                  # canonical_params(...)
    matplan_version: str
    status: str                  # "ok" | "failed"
    prepare_ms: float | None = None
    run_ms_median: float | None = None
    run_ms_min: float | None = None
    run_ms_max: float | None = None
    repeats: int = 0             # synchronised single calls timed (run_ms_median, _min, _max)
    matched: bool | None = None  # result equal to the SciPy float64 reference within tolerance
    max_error: float | None = None  # max |C - ref| / (|A||B|) elementwise
    error: str = ""
    created_at: str = ""
    host: str = ""
    run_ms_queued: float | None = None  # per call of calls queued back to back (None: not timed so)
    first_ms: float | None = None       # a first call, where repeated runs replay (Kernel.tuning_calls)
    run: str = ""                # the tuning run's label: runs of different labels keep a timing each

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status: expected one of {STATUSES}, got {self.status!r}")
        if self.status == "ok" and (self.run_ms_median is None or self.repeats < 1):
            raise ValueError("an 'ok' timing needs run_ms_median and repeats >= 1")

    @property
    def key(self) -> tuple:
        return (self.device_key, self.problem, self.kernel, self.params, self.matplan_version, self.run)


@dataclasses.dataclass(frozen=True)
class CalibrationRecord:
    device_key: str
    kernel: str                  # "tsgemm.tsm2"
    key: str                     # canonical JSON of the kernel's own key (e.g. dtype, layout, k, n and m buckets)
    value: dict                  # what the kernel measured (e.g. best t1/t3, per-candidate seconds, ratio)
    matplan_version: str
    created_at: str = ""

    @property
    def natural_key(self) -> tuple:
        return (self.device_key, self.kernel, self.key, self.matplan_version)


#: Each record type by the name an export line gives it.
RECORD_TYPES = {"device": DeviceRecord, "problem": ProblemRecord, "timing": TimingRecord,
                 "calibration": CalibrationRecord}


#: Fields of a natural key: a non-empty string.
_KEYS = {"key", "device_class", "backend", "name", "fingerprint", "op", "dtype", "device_key", "problem",
         "kernel", "params", "matplan_version"}
#: Fields holding milliseconds: a finite number >= 0 (or None).
_TIMES = {"prepare_ms", "run_ms_median", "run_ms_min", "run_ms_max", "run_ms_queued", "first_ms"}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _field_problem(name: str, type_: str, v) -> str | None:
    """What is wrong with value ``v`` of field ``name`` (annotated ``type_``), or None."""
    if type_ == "str":
        if not isinstance(v, str):
            return "expected a string"
        if name in _KEYS and not v:
            return "expected a non-empty string"
        if name == "params":
            try:
                parsed = json.loads(v)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                return "expected a JSON object (the kernel's parameters)"
    elif type_ == "int":
        if not (isinstance(v, int) and not isinstance(v, bool)) or v < 0:
            return "expected a non-negative integer"
    elif type_ == "float | None":
        if v is not None and not _is_number(v):
            return "expected a number or null"
        if v is not None and name in _TIMES and not (math.isfinite(v) and v >= 0):
            return "expected a finite number of milliseconds >= 0"
    elif type_ == "bool | None":
        if v is not None and not isinstance(v, bool):
            return "expected true, false or null"
    elif type_ == "dict" and not isinstance(v, dict):
        return "expected a JSON object"
    return None


def record_from_dict(kind: str, d: dict):
    """The ``kind`` record ('device', 'problem', 'timing', 'calibration') of an export line's or a
    row's fields, every field checked: ValueError naming the field otherwise. Unknown fields (a
    newer matplan's) are ignored."""
    if kind not in RECORD_TYPES:
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(RECORD_TYPES)}")
    if not isinstance(d, dict):
        raise ValueError(f"{kind} record: expected a JSON object, got {type(d).__name__}")
    cls = RECORD_TYPES[kind]
    fields = dataclasses.fields(cls)
    missing = [f.name for f in fields if f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and f.name not in d]
    if missing:
        raise ValueError(f"{kind} record lacks {missing}")
    for f in fields:
        if f.name in d:
            wrong = _field_problem(f.name, f.type, d[f.name])
            if wrong:
                raise ValueError(f"{kind} record: {f.name}: {wrong}, got {d[f.name]!r}")
    try:
        return cls(**{f.name: d[f.name] for f in fields if f.name in d})
    except ValueError as e:
        raise ValueError(f"{kind} record: {e}") from e


__all__ = ["DeviceRecord", "ProblemRecord", "TimingRecord", "CalibrationRecord", "canonical_params",
           "record_from_dict", "RECORD_TYPES", "STATUSES"]
