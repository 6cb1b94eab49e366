"""Backfill the planner statistics a newer matplan computes into problems an older one recorded.

Timings stay valid when the planner gains a statistic (the operands, hence the fingerprints,
do not change), but the stored features lack it, so a model trained on them would see the
default (SpGEMM's sampled ``compression``, for example, arrived after most H100 timings).
:func:`refresh_features` rebuilds each such problem's operands from its source key (the corpus
is seeded; a file is taken from its recorded path, or by name from a matrices folder), checks
the fingerprint, computes the features on the host and adds only the missing ones: stored values
stay as the device that took the timings measured them.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..core import device as device_mod
from ..core import features as stats
from ..core.features import Features
from ..core.validation import normalize
from ..corpus.io import matrices_dir as default_matrices
from .identity import problem_fingerprint
from .progress import bar
from .store import TuningDB
from .units import WorkUnit


def _missing(stored: dict) -> list:
    return sorted({f.name for f in dataclasses.fields(Features)} - set(stored))


def _unit(problem, matrices_dir):
    unit = WorkUnit.from_key(problem.source, family=problem.family, matrix=problem.matrix)
    if unit.origin == "file" and not Path(unit.path).is_file() and matrices_dir is not None:
        found = sorted(Path(matrices_dir).glob(Path(unit.path).name))
        if found:
            unit = dataclasses.replace(unit, path=str(found[0]))
    return unit


def refresh_features(store: TuningDB, matrices_dir=None, log=None, progress: bool = False) -> dict:
    """Add missing feature keys to every stored problem that lacks some; returns counts
    ``{'updated', 'current', 'skipped'}`` (skipped: operands not rebuildable or fingerprint
    differs; each is reported through ``log``, a function of one line, default printing it).
    ``progress``: a bar on stderr over the problems to rebuild (each costs its matrix's build)."""
    matrices_dir = matrices_dir if matrices_dir is not None else default_matrices()
    counts = {"updated": 0, "current": 0, "skipped": 0}
    updates = {}
    todo = []
    for p in store.problems():
        missing = _missing(p.features)
        if missing:
            todo.append((p, missing))
        else:
            counts["current"] += 1
    with bar(len(todo), "matplan db refresh-features", "problem", progress) as shown:
        say = log or shown.write
        for p, missing in todo:
            fresh = _fresh(p, matrices_dir, say)
            shown.update(1)
            if fresh is None:
                counts["skipped"] += 1
                continue
            updates[p.fingerprint] = dict(p.features, **{k: fresh[k] for k in missing})
            counts["updated"] += 1
    store.update_features(updates)
    return counts


def _fresh(p, matrices_dir, say) -> dict | None:
    """The features of problem ``p`` rebuilt from its source, or None (said why) when it cannot be."""
    try:
        unit = _unit(p, matrices_dir)
        A, B = unit.build()
        if problem_fingerprint(unit.op, A, B) != p.fingerprint:
            raise ValueError("the rebuilt operands have another fingerprint (generator or file changed)")
        return stats.compute(normalize(A, B), device_mod.current()).to_dict()
    except (OSError, ValueError, TypeError) as e:
        say(f"skipped {p.source}: {e}")
        return None


__all__ = ["refresh_features"]
