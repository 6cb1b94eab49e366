"""The tuning database and offline tuning runs (``matplan tune``, ``train``, ``report``, ``db``).

    from matplan.tuning_db import TuningDB, corpus_units
    from matplan.tuning_db.tune import tune
    with TuningDB() as db:                         # ~/.cache/matplan/tuning.sqlite
        tune(corpus_units(["small"]), db=db)       # times every registered candidate

The workflow on a GPU machine::

    matplan tune --size small medium spgemm        # resumable; --n-jobs 2 on two GPUs
    matplan train                                  # -> the user's model folder; --package to ship it
    matplan report --out results                   # leave-family-out regret -> results/
    matplan db export timings.jsonl                # pool with `matplan db import` elsewhere

Submodules load lazily so that importing the planner never imports the tuner. (``tune`` and
``train`` name submodules here; their functions are ``tune.tune`` and ``train.train``.)
"""
import importlib

from .records import DeviceRecord, ProblemRecord, TimingRecord
from .store import TuningDB, TuningDBError, default_path, open_db

#: Names loaded from their submodule on first use.
_LAZY = {"corpus_units": "units", "file_units": "units", "WorkUnit": "units", "TuneSummary": "tune",
         "evaluate": "report"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TuningDB", "TuningDBError", "DeviceRecord", "ProblemRecord", "TimingRecord", "open_db",
           "default_path", *_LAZY]
