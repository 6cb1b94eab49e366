"""The learned cost model at plan time: which model prices a device's candidates, and its costs.

The planner asks :func:`rescore` for every plan. The model for the device class (``H100``,
``H200``, ..., :func:`device_class`) comes from, in order:

1. a model the user names: ``MATPLAN_MODEL=path`` (several separated by ``os.pathsep``, one per
   device class; each its .npz, .json or the path without extension). Never from a folder
   scanned by default: a file dropped into the user's data folder is not used. A named model
   whose files, folder or the folder above are group- or world-writable is refused;
2. the model shipped in the package for the class (``matplan/models/data/<class>.npz``).

Models are plain arrays and JSON (:mod:`.learned_files`): loading one runs no code, and planning
needs NumPy only. A model that fails to load gives one :class:`ModelWarning` naming the file and
the reason, and the plans keep the analytic costs. A model trained against other kernel or
cost-model sources than the installed ones (:mod:`.learned_fingerprint`) gives one
:class:`StaleModelWarning`, and the plans keep the analytic costs and the planner's measurement.
Without a model the costs stay analytic (``source='analytic'``). What the model reads of a
candidate is a :class:`~.learned_features.Query`; the caller supplies the analytic Cost and the
kernel's ``reads_a_at_run`` (this layer never imports the kernels). docs/tuning.md has the trust model.
"""
from __future__ import annotations

import functools
import os
import re
import time
import warnings
from pathlib import Path

from ..core import device as device_mod
from ..core.cache import BoundedCache
from ..core.types import Cost
from . import learned_fingerprint
from .learned_features import FEATURE_SCHEMA_VERSION, FeatureSchema, Query
from .learned_files import (MODEL_DIR_ENV, PACKAGE_DIR, ModelLoadError, load_file, model_paths, package_model,
                            read_metadata, save, user_model_dir)
from .learned_model import CostModel

#: The user's own models: paths separated by os.pathsep.
MODEL_ENV = "MATPLAN_MODEL"
#: "auto" (use a learned model when one applies to the device class) or "analytic" (never).
COST_MODEL_ENV = "MATPLAN_COST_MODEL"
#: How to keep a model whose sources changed without retraining it (a recorded decision).
RESTAMP = 'python -m matplan.models.learned_restamp --restamp --reason "..."'

_NONE = object()
_models = BoundedCache("learned cost models", maxsize=16)


class ModelWarning(RuntimeWarning):
    """A learned model was not used (it failed to load, or none named fits the device)."""


class StaleModelWarning(ModelWarning):
    """A learned model was trained against other kernel or cost-model sources than these."""


def device_class(device_name: str, backend: str) -> str:
    """The model family a device belongs to: 'cpu', a known GPU key ('H100'), or its cleaned name."""
    if backend == "cpu":
        return "cpu"
    upper = str(device_name).upper()
    for key in device_mod.KNOWN_GPUS:
        if key.upper() in upper:
            return key
    return re.sub(r"[^A-Za-z0-9]+", "-", str(device_name)).strip("-") or "gpu"


#: device_class of a (name, backend), worked out once: a plan asks for its device's at every plan.
_class_of = functools.lru_cache(maxsize=64)(device_class)


def named_models() -> list:
    """The model paths ``MATPLAN_MODEL`` names, in order."""
    return [Path(p).expanduser() for p in os.environ.get(MODEL_ENV, "").split(os.pathsep) if p.strip()]


def find(device_class: str) -> Path | None:
    """The .npz of the model the planner would use for ``device_class`` (without loading it; a named
    model whose metadata cannot be read is passed over with a warning)."""
    for path in named_models():
        try:
            if read_metadata(path).get("device_class") == device_class:
                return model_paths(path)[0]
        except ModelLoadError as e:
            warnings.warn(str(e), ModelWarning, stacklevel=2)
    return package_model(device_class)


def _warn(path, reason, category=ModelWarning) -> None:
    warnings.warn(f"learned cost model {path} not used, planning with the analytic costs: {reason}",
                  category, stacklevel=5)


def _fresh(model: CostModel, path) -> CostModel | None:
    """``model``, or None with a StaleModelWarning when its sources are not the installed ones."""
    why = learned_fingerprint.mismatch(model.metadata_.get("sources"))
    if why is None:
        return model
    _warn(path, f"{why}. It was fitted on timings of other kernels or cost models: re-tune and retrain "
                f"(matplan tune, matplan train), or, if its timings still hold, re-stamp it ({RESTAMP} {path}) "
                "and record why in CHANGELOG.md", StaleModelWarning)
    return None


def _select(cls: str) -> CostModel | None:
    """The model for device class ``cls``, warning once for each model that is not used."""
    named, others, failed = named_models(), [], False
    for path in named:
        try:
            model = load_file(path)
        except ModelLoadError as e:
            _warn(path, e)
            failed = True
            continue
        if model.metadata_["device_class"] == cls:
            return _fresh(model, path)
        others.append(f"{path} is for {model.metadata_['device_class']}")
    if failed:            # the user's model for this device may be the one that failed: not the package's
        return None
    path = package_model(cls)
    if named:
        warnings.warn(f"{MODEL_ENV} names no model for device class {cls} ({'; '.join(others)}); "
                      + (f"using the package's {path.name}" if path else "planning with the analytic costs"),
                      ModelWarning, stacklevel=4)
    if path is None:
        return None
    try:
        return _fresh(load_file(path, device_class=cls, trusted=True), path)
    except ModelLoadError as e:
        _warn(path, e)
        return None


def _stamp(path: str) -> tuple:
    try:
        st = os.stat(path)
        return path, st.st_mtime_ns, st.st_size
    except OSError:
        return path, None


def _signature(cls: str) -> tuple:
    """What the chosen model depends on: the named paths and each candidate file's state (the
    named files' taken now, the shipped files' at most SHIPPED_RECHECK_S ago)."""
    named = os.environ.get(MODEL_ENV, "")
    home = os.environ.get("HOME", "") if "~" in named else ""   # only a "~" in the paths reads $HOME
    mine, shipped = _candidate_files(cls, named, home)
    return (cls, named, *[_stamp(f) for f in mine], *_shipped_stamps(shipped))


#: The shipped model files' stamps are taken again at most this often (seconds): they change only
#: when matplan is installed anew, while a named model may be retrained between two plans.
SHIPPED_RECHECK_S = 1.0
_shipped: dict = {}   # the shipped files -> (_clock() when stamped, their stamps)
_clock = time.monotonic


def _shipped_stamps(files: tuple) -> tuple:
    """The stamps of the package's model ``files``, taken again once SHIPPED_RECHECK_S have passed
    (or after :func:`clear_cache`): two ``stat`` calls fewer in most plans."""
    now = _clock()
    got = _shipped.get(files)
    if got is None or not 0.0 <= now - got[0] < SHIPPED_RECHECK_S:
        got = _shipped[files] = (now, tuple([_stamp(f) for f in files]))
    return got[1]


@functools.lru_cache(maxsize=64)
def _candidate_files(cls: str, named: str, home: str) -> tuple:
    """The model files _signature stats for ``cls`` under $MATPLAN_MODEL = ``named`` (and $HOME,
    which ``~`` in it expands to), as (named files, shipped files): their paths as text, kept so a
    plan does not build them again."""
    files = [f for p in named_models() for f in model_paths(p)]
    return tuple(str(f) for f in files), tuple(str(f) for f in model_paths(PACKAGE_DIR / cls.lower()))


def model_for(backend: str, dev) -> CostModel | None:
    """The learned model the planner uses for ``dev``, or None (cached until its files change: a named
    model's are checked at every plan, the shipped one's at most every SHIPPED_RECHECK_S)."""
    if os.environ.get(COST_MODEL_ENV, "auto").lower() == "analytic":
        return None
    key = _signature(_class_of(dev.name, backend))
    model = _models.get_fast(key, _NONE)   # no lock: a model is put whole, and few keys are ever made
    if model is _NONE:
        model = _select(key[0])
        _models.put(key, model)
    return None if getattr(model, "unusable_", None) else model


def _predict(model, feats, dev, cells, analytic):
    """(outside, seconds) of one problem's candidates (:meth:`CostModel.predict_problem`: past the
    training range no tree is asked); None after one warning if the model cannot predict them."""
    try:
        return model.predict_problem(feats, dev, cells, analytic)
    except (ValueError, IndexError, KeyError, TypeError, FloatingPointError) as e:
        model.unusable_ = f"prediction failed: {type(e).__name__}: {e}"
        _warn(model.metadata_.get("name", "?"), model.unusable_)
        return None


def rescore(feats, dev, pending) -> list:
    """Costs for the planner: ``pending`` is [(kernel name, params, analytic Cost)];
    returns [(Cost, source)] in the same order, learned where the model knows the kernel."""
    return [(cost if why is None else Cost(prepare_s, run_s, why), source)
            for (_, _, cost), (prepare_s, run_s, why, source) in zip(pending, rescored(feats, dev, pending))]


def rescored(feats, dev, pending) -> list:
    """:func:`rescore` as the planner reads it: [(prepare seconds, run seconds, why, source)], why
    None where the analytic Cost stands as it is (no Cost made for a candidate: a plan builds its
    Candidates from these)."""
    model = model_for(feats.backend, dev)
    # costs calibrated by an online timing on this device (TSM2 and cuBLAS for tsgemm) stay
    known = model.known_kernels() if model is not None else ()
    # each candidate: True (the model prices it), False (not a kernel the model knows), None (calibrated)
    asked = [None if getattr(cost, "calibrated", False) else name in known for name, _, cost in pending]
    cells = [(name, params) for (name, params, _), a in zip(pending, asked) if a]
    got = (_predict(model, feats, dev, cells, [cost for (_, _, cost), a in zip(pending, asked) if a])
           if cells else None)
    if got is None:
        return [(cost.prepare_s, cost.run_s, None, "analytic") for _, _, cost in pending]
    outside, pred = got
    if outside:  # trees do not extrapolate: past the training range the analytic models decide
        return [(cost.prepare_s, cost.run_s,
                 f"{cost.why} (analytic: {', '.join(outside)} outside the training range of "
                 f"{model.describe()})", "analytic") for _, _, cost in pending]
    about, rows, out = model.describe(), iter(pred.tolist()), []
    for (name, _, cost), a in zip(pending, asked):   # the rows of pred are the asked candidates, in order
        if a:
            run_s, prep_s = next(rows)
            out.append((prep_s, run_s, f"{about}: predicts run {run_s * 1e3:.4f} ms, prepare {prep_s * 1e3:.4f} ms "
                                       f"(analytic model: run {cost.run_s * 1e3:.4f} ms; {cost.why})", "learned"))
        elif a is None:
            out.append((cost.prepare_s, cost.run_s, None, "analytic"))
        else:
            out.append((cost.prepare_s, cost.run_s, f"{cost.why} (analytic: {name} is not in {about})", "analytic"))
    return out


def clear_cache() -> None:
    """Forget loaded models, the shipped files' stamps and the sources' fingerprint (all are read
    again on the next plan)."""
    _models.clear()
    _shipped.clear()
    learned_fingerprint.clear()


__all__ = ["CostModel", "Query", "FeatureSchema", "save", "load_file", "find", "model_for", "rescore", "rescored",
           "device_class", "named_models", "user_model_dir", "clear_cache", "ModelLoadError", "ModelWarning",
           "StaleModelWarning", "FEATURE_SCHEMA_VERSION", "PACKAGE_DIR", "MODEL_ENV", "MODEL_DIR_ENV",
           "COST_MODEL_ENV"]
