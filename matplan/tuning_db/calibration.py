"""The planner's measurements kept in the tuning database (its ``calibrations`` table).

For tall-and-skinny products the live planner decides on measurements, not on the raw models: it
times TSM2's configs and cuBLAS on the device, kept by a shape bucket (:mod:`matplan.planner.
measure`). A tuning run does the same for each such kernel (:func:`tuned_params`), records each
new measurement (:func:`recording`, :func:`records`) and times the config the planner would run.
``matplan train`` and ``matplan report`` install the recorded measurements again
(:func:`installed`): while installed, the costs of the kernels they measured are scaled by
measured / predicted for the bucket, as the live planner's measured candidates are, and marked
``calibrated`` so the learned model keeps them (scoring the raw model instead made the report's
worst regrets TSM2 picks the planner never makes).

Records written before the planner's measurement cache (one per TSM2 bucket: its winner, its
timings, a ``ratio`` and cuBLAS's ``vendor_ratio``) are read too: their ratios apply to every
config of the bucket.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json

from ..core.types import Cost
from ..kernels import registry
from ..planner import measure, measure_cache
from .store import CalibrationRecord

#: Kernel names of the records written before the measurement cache (TSM2 with cuBLAS's ratio).
LEGACY_TSM2, LEGACY_CUBLAS = "tsgemm.tsm2", "gemm.cublas"
#: Parameters of old plans that are provenance, not configuration.
PROVENANCE = ("t1_source",)


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
    one key the latest recorded wins. None as params: a legacy record's ratio for the whole bucket."""
    table = {}
    for c in sorted(calibrations, key=lambda c: c.created_at):
        v = c.value
        key = json.loads(c.key)
        if "seconds" in v:                                  # a measurement-cache entry
            problem, params = key
            if v.get("ratio") is not None:
                table[c.kernel, measure_cache.canonical(problem), _params_text(params)] = float(v["ratio"])
        elif c.kernel == LEGACY_TSM2:                       # one bucket's winner and both ratios
            problem = measure_cache.canonical(["bucket", key[1:]])
            for kernel, ratio in ((LEGACY_TSM2, v.get("ratio")), (LEGACY_CUBLAS, v.get("vendor_ratio"))):
                if ratio is not None:
                    table[kernel, problem, None] = float(ratio)
    return table


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
        bucket = getattr(self.kernel, "measure_key", lambda f: None)(f)
        if bucket is None:
            return None
        problem = measure_cache.canonical(["bucket", list(bucket)])
        name = self.kernel.name
        hit = self.ratios.get((name, problem, _params_text(params)))
        return hit if hit is not None else self.ratios.get((name, problem, None))

    def cost(self, f, params, device) -> Cost:
        c = self.kernel.cost(f, params, device)
        r = self.ratio(f, params)
        if r is None:
            return c
        return Cost(c.prepare_s, c.run_s * r, f"{c.why}; calibrated by the planner's measurement: "
                                              f"measured/model = {r:.2f}", calibrated=True)


@contextlib.contextmanager
def installed(calibrations):
    """For the ``with`` block, the kernels the recorded measurements are of are registered as
    :class:`Calibrated` (their costs scaled by measured / predicted of each bucket); restored after."""
    ratios = ratios_from(calibrations)
    names = sorted({k for k, _, _ in ratios})
    old = {name: registry.get(name) for name in names if _registered(name)}
    try:
        for name, kernel in old.items():
            registry._REGISTRY[name] = Calibrated(kernel, ratios)
        yield ratios
    finally:
        registry._REGISTRY.update(old)


def _registered(name: str) -> bool:
    try:
        registry.get(name)
        return True
    except KeyError:
        return False


__all__ = ["Recorder", "recording", "tuned_params", "records", "ratios_from", "installed", "Calibrated"]
