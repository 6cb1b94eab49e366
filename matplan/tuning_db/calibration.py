"""The planner's measurements kept in the tuning database (its ``calibrations`` table).

For tall-and-skinny products the live planner decides on measurements, not on the raw models: it
times TSM2's configs and cuBLAS on the device, kept by a shape bucket (:mod:`matplan.planner.
measure`). A tuning run does the same for each such kernel (:func:`tuned_params`), records each
new measurement (:func:`recording`, :func:`records`) and times the config the planner would run.
``matplan train`` and ``matplan report`` install the recorded measurements again
(:func:`installed`): while installed, the costs of the kernels they measured are scaled by
measured / predicted for the bucket, as the live planner's measured candidates are, and marked
``calibrated`` so the learned model keeps them (scoring the raw model instead made the report's
worst regrets TSM2 picks the planner never makes). A ratio is measured over the shipped model's
time, so it scales the shipped model's cost also inside a leave-family-out fold that installed
refitted constants (:func:`.refit.shipped`); scaling the fold's model by it counted cuBLAS's and
TSM2's fixed costs twice.

Records written before the planner's measurement cache (one per TSM2 bucket: its winner, its
timings, a ``ratio`` and cuBLAS's ``vendor_ratio``) are migrated, so an old training file scores
as it did when it was written: their ratios apply to every config of the bucket their key names,
as the planner that wrote them applied them (measured / model of the time without the launch;
:func:`legacy_keys`). Their keys predate the measurement cache's bucket: ``[device, dtype, layout,
k bucket, n bucket]`` at first, then with the bucket of the timed rows appended. A record that
cannot be read is ignored, and :func:`installed` warns once with the count and the reasons.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import math
import warnings

import numpy as np

from ..core.types import Cost
from ..kernels import registry
from ..kernels.tsgemm.rules import layout_of_features
from ..models.tsgemm import LAUNCH_S
from ..planner import measure, measure_cache
from . import refit
from .store import CalibrationRecord

#: Kernel names of the records written before the measurement cache (TSM2 with cuBLAS's ratio).
LEGACY_TSM2, LEGACY_CUBLAS = "tsgemm.tsm2", "gemm.cublas"
#: Parameters of old plans that are provenance, not configuration.
PROVENANCE = ("t1_source",)
#: Legacy keys' rows element: the bucket of m capped at this many elements / n (the timing's
#: problem size when those records were written; frozen with their format).
LEGACY_TIMING_ELEMENTS = 1 << 28
#: Legacy keys' lengths: without the rows bucket (the first format), and with it.
LEGACY_KEY_LENGTHS = (5, 6)


class Recorder:
    """The planner's measurements in this process (those it made, and those a tuning run used
    from the cache: :func:`tuned_params`), kept until :meth:`drain`."""

    def __init__(self):
        self._new: dict = {}

    def __call__(self, entries) -> None:
        self._new.update((e.key, e) for e in entries)

    def drain(self) -> list:
        """The entries made or used since the last drain, each once."""
        out, self._new = list(self._new.values()), {}
        return out


_RECORDER = Recorder()


def recording() -> Recorder:
    """This process's recorder, listening to the planner's measurement cache from the first call."""
    if _RECORDER not in measure_cache.LISTENERS:
        measure_cache.LISTENERS.append(_RECORDER)
    return _RECORDER


def tuned_params(kernel, problem, feats, dev) -> list | None:
    """[the params the live planner would run] for a kernel whose timings the planner keeps by a
    shape bucket (its configs measured now unless cached; every entry used goes to the
    recorder), None for any other kernel."""
    used: list = []
    params = measure.tune(kernel, problem, feats, dev, used)
    recording()(used)
    return params


def records(device_key: str, version: str, entries) -> list:
    """CalibrationRecords of measurement-cache entries: kernel, key [problem, params] and the
    entry's figures (seconds, predicted seconds, their ratio, device, source digest, versions)."""
    out = []
    for e in entries:
        d = e.to_dict()
        key = json.dumps([d["problem"], d["params"]], sort_keys=True)
        value = dict(d, ratio=e.ratio)
        out.append(CalibrationRecord(device_key, e.key.config.kernel, key, value, version))
    return out


def ratios_from(calibrations) -> dict:
    """{(kernel, problem JSON, params JSON or None): measured / predicted} of recorded entries; of
    one key the latest recorded wins. None as params: a legacy record's ratio for the whole bucket
    (its problem is ``["legacy", key without the device]``, see :func:`legacy_keys`)."""
    return classify(calibrations)[0]


def classify(calibrations) -> tuple:
    """(:func:`ratios_from`'s table, [(record, why it is ignored)] of the records that give none)."""
    table, ignored = {}, []
    for c in sorted(calibrations, key=lambda c: c.created_at):
        why = _read_one(c, table)
        if why is not None:
            ignored.append((c, why))
    return table, ignored


def _read_one(c, table) -> str | None:
    """Put record ``c``'s ratios in ``table``; the reason it gives none, or None."""
    v = c.value if isinstance(c.value, dict) else {}
    try:
        key = json.loads(c.key)
    except (TypeError, ValueError):
        return "its key is not JSON"
    if "seconds" in v:                                  # a measurement-cache entry
        if not (isinstance(key, list) and len(key) == 2 and isinstance(key[1], dict)):
            return "its key is not [problem, params]"
        ratio = _positive(v.get("ratio"))
        if ratio is None:
            return "it has no positive measured/predicted ratio"
        table[c.kernel, measure_cache.canonical(key[0]), _params_text(key[1])] = ratio
        return None
    if c.kernel != LEGACY_TSM2:
        return f"kernel {c.kernel!r} without measured seconds is no format this version reads"
    if not (isinstance(key, list) and len(key) in LEGACY_KEY_LENGTHS and _legacy_fields_ok(key[1:])):
        return (f"a legacy {LEGACY_TSM2} key must be [device, dtype, layout, k bucket, n bucket"
                f"(, rows bucket)], got {c.key}")
    problem = _legacy_problem(key[1:])
    found = False
    for kernel, name in ((LEGACY_TSM2, "ratio"), (LEGACY_CUBLAS, "vendor_ratio")):
        ratio = _positive(v.get(name))
        if ratio is not None:
            table[kernel, problem, None] = ratio
            found = True
    return None if found else "it has neither a positive ratio nor vendor_ratio"


def _positive(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def _legacy_fields_ok(fields) -> bool:
    dtype, layout, *buckets = fields
    return (isinstance(dtype, str) and layout in ("row", "col")
            and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in buckets))


def _legacy_problem(fields) -> str:
    return measure_cache.canonical(["legacy", list(fields)])


def _pow2_at_or_above(x: int) -> int:
    """The power of two at or above ``x``: the legacy keys' buckets (as they were written)."""
    return 1 << max(int(x) - 1, 0).bit_length()


def legacy_keys(f) -> list:
    """The problems (:func:`ratios_from`'s form) of the legacy records that applied to features
    ``f``, most specific first: [dtype, layout, k, n, rows buckets], then [dtype, layout, k, n
    buckets]; [] for a strided or empty A. The rows were m capped at LEGACY_TIMING_ELEMENTS / n."""
    layout = layout_of_features(f)
    if layout is None or min(f.m, f.n, f.k) < 1:
        return []
    base = [str(np.dtype(f.dtype)), layout, _pow2_at_or_above(f.k), _pow2_at_or_above(f.n)]
    rows = max(1, min(int(f.m), LEGACY_TIMING_ELEMENTS // max(int(f.n), 1)))
    return [_legacy_problem(base + [_pow2_at_or_above(rows)]), _legacy_problem(base)]


def _params_text(params: dict) -> str:
    clean = {k: v for k, v in params.items() if k not in PROVENANCE}
    return measure_cache.Config.of("", clean).text()


@dataclasses.dataclass
class Calibrated:
    """A registered kernel whose cost is scaled by recorded measurements (see :func:`installed`);
    everything else is the kernel's."""
    kernel: object
    ratios: dict

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def ratio(self, f, params) -> float | None:
        """measured / predicted of the recorded measurement for ``f`` and ``params``, else None."""
        return self.lookup(f, params)[0]

    def lookup(self, f, params) -> tuple:
        """(ratio or None, whether it comes from a legacy record). Of the records that apply, the
        config's own measurement first, then its bucket's, then a legacy record's."""
        bucket = getattr(self.kernel, "measure_key", lambda f: None)(f)
        if bucket is None:
            return None, False
        problem = measure_cache.canonical(["bucket", list(bucket)])
        name = self.kernel.name
        for key in ((name, problem, _params_text(params)), (name, problem, None)):
            if self.ratios.get(key) is not None:
                return self.ratios[key], False
        for problem in legacy_keys(f):
            if self.ratios.get((name, problem, None)) is not None:
                return self.ratios[name, problem, None], True
        return None, False

    def cost(self, f, params, device) -> Cost:
        r, legacy = self.lookup(f, params)
        if r is None:
            return self.kernel.cost(f, params, device)
        with refit.shipped():   # the ratio is of the model it was measured against
            c = self.kernel.cost(f, params, device)
        if legacy:   # the planner that wrote it scaled the model's time without the launch
            run_s = max(c.run_s - LAUNCH_S, 0.0) * r + min(c.run_s, LAUNCH_S)
            how = "calibrated by a recorded online timing (legacy record)"
        else:
            run_s, how = c.run_s * r, "calibrated by the planner's measurement"
        return Cost(c.prepare_s, run_s, f"{c.why}; {how}: measured/model = {r:.2f}", calibrated=True)


def applying_to(ratios, uses) -> dict:
    """The entries of ``ratios`` (:func:`ratios_from`'s table) that some of ``uses``, pairs of (kernel
    name, Features), would look up (:meth:`Calibrated.lookup`): a leave-family-out fold keeps only
    those its training families reach, so a held-out family is never scored by its own timings."""
    names = {k for k, _, _ in ratios}
    reached = set()
    for name, f in uses:
        if name not in names or not _registered(name):
            continue
        kernel = registry.get(name)
        try:
            bucket = getattr(kernel, "measure_key", lambda f: None)(f)
            legacy = legacy_keys(f)
        except Exception:  # noqa: BLE001  features this kernel does not bucket reach no entry
            continue
        if bucket is not None:
            reached.add((name, measure_cache.canonical(["bucket", list(bucket)])))
        reached.update((name, problem) for problem in legacy)
    return {key: r for key, r in ratios.items() if key[:2] in reached}


@contextlib.contextmanager
def installed(calibrations, only=None):
    """For the ``with`` block, the kernels the recorded measurements are of are registered as
    :class:`Calibrated` (their costs scaled by measured / predicted of each bucket); restored after.
    ``only``: (kernel name, Features) pairs; when given, only the entries they reach apply
    (:func:`applying_to`). Records that give no ratio are named in one warning (:func:`warn_ignored`)."""
    ratios, ignored = classify(calibrations)
    warn_ignored(ignored, len(calibrations))
    if only is not None:
        ratios = applying_to(ratios, only)
    names = sorted({k for k, _, _ in ratios})
    old = {name: registry.get(name) for name in names if _registered(name)}
    try:
        for name, kernel in old.items():
            registry._REGISTRY[name] = Calibrated(kernel, ratios)
        yield ratios
    finally:
        registry._REGISTRY.update(old)


def warn_ignored(ignored, total: int) -> None:
    """One RuntimeWarning with how many of ``total`` records were ignored and why (none if none)."""
    if not ignored:
        return
    reasons = collections.Counter(why for _, why in ignored)
    detail = "; ".join(f"{n} because {why}" for why, n in reasons.most_common())
    warnings.warn(f"{len(ignored)} of {total} recorded online calibrations ignored (their kernels' "
                  f"costs are the uncalibrated model's, so figures may differ from the live "
                  f"planner's): {detail}", RuntimeWarning, stacklevel=3)


def _registered(name: str) -> bool:
    try:
        registry.get(name)
        return True
    except KeyError:
        return False


__all__ = ["Recorder", "recording", "tuned_params", "records", "ratios_from", "classify", "legacy_keys",
           "installed", "applying_to", "warn_ignored", "Calibrated"]
