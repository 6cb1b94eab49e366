"""``matplan train``: fit the learned cost model of a device class from the tuning database and save it."""
from __future__ import annotations

import json

from ..models import learned, learned_fit
from .dataset import DEFAULT_TIMING, load_dataset
from .progress import Stages
from .store import open_db


def fit(dataset, kind: str = "combined", cv: int = 5, **params) -> learned_fit.LearnedCostModel:
    """A LearnedCostModel fitted on every row of ``dataset``, validated leave-family-out (analytic
    costs, a feature of the combined model, with the online calibrations the planner made)."""
    with dataset.calibrated():
        return learned_fit.LearnedCostModel(kind=kind, cv=cv, **params).fit(
            dataset.queries(), dataset.y(), groups=dataset.groups())


def train(db=None, device_class: str | None = None, *, kind: str = "combined", name: str | None = None,
          dir=None, cv: int = 5, model_params: dict | None = None, progress: bool = False,
          timing: str = DEFAULT_TIMING):
    """Fit on the database's timings of ``device_class`` and save; returns (path, model).

    ``db`` must exist (TuningDBError otherwise). ``name`` defaults to the device class in lower
    case ('h100'); ``dir`` to the user's model folder (pass ``learned.PACKAGE_DIR`` to ship the
    model with the package); ``model_params`` are further LearnedCostModel parameters;
    ``progress``: a bar on stderr over reading, fitting and saving; ``timing``: which recorded run
    time the model learns (:data:`.dataset.TIMINGS`).
    """
    with Stages(3, "matplan train", progress) as stages:
        stages.step("reading the database")
        store = open_db(db, create=False)
        try:
            ds = load_dataset(store, device_class, timing)
            source = str(store.path)
        finally:
            if store is not db:
                store.close()
        stages.step(f"fitting on {len(ds)} timings" + (f" ({cv}-fold validation first)" if cv else ""))
        model = fit(ds, kind=kind, cv=cv, **(model_params or {}))
        stages.step("saving")
        path = _save(model, ds, name, dir, source)
    return path, model


def _save(model, ds, name, dir, source):
    """Save ``model`` with what it was fitted on (the rows' hash, counts, the device); its path."""
    families = sorted({p.family for p in ds.problems.values()})
    path = learned.save(model, name or ds.device_class.lower(), device_class=ds.device_class, dir=dir,
                        extra={"training_set_hash": ds.hash(),
                               "training_set": {"database": source, "rows": len(ds),
                                                "problems": len({r.problem for r in ds.rows}),
                                                "timing": ds.timing,
                                                "families": families,
                                                "kernels": sorted({r.kernel for r in ds.rows}),
                                                "excluded_failed_or_mismatched": len(ds.failed),
                                                "excluded_unregistered_kernels": ds.unregistered,
                                                "online_calibrations": len(ds.calibrations)},
                               "device": ds.device.to_dict()})
    model.metadata_ = json.loads(path.with_suffix(".json").read_text())
    return path


__all__ = ["train", "fit"]
