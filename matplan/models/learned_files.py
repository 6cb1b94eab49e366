"""Saved learned models: plain arrays and JSON, so that loading one runs no code.

A model is two files (``MODEL_FORMAT`` 2):

* ``<name>.npz``: each forest's arrays (:data:`.learned_forest.ARRAYS`) as ``forest<i>.<array>``,
  read with ``np.load(..., allow_pickle=False)``: numbers only, never a pickle;
* ``<name>.json``: the metadata: format, name, device class, kind, feature schema, which forest
  is which (``forests``: op key and target), fixed prepare times, validation errors, training
  set and its hash, parameters, the library versions it was fitted with, the fingerprint of the
  sources it was trained against (``sources``, :mod:`.learned_fingerprint`) and the SHA-256 of the
  .npz (which checks integrity, not trust).

:func:`load_file` checks all of it and raises :class:`ModelLoadError` naming the file and the
reason for any problem, whatever it is (the planner turns that into one warning). A model the
user names is refused when others could replace it: its files, their folder or the folder above
that are group- or world-writable. Which models the planner loads is :mod:`.learned`'s business.
"""
from __future__ import annotations

import datetime
import hashlib
import io
import json
import math
import os
import re
import stat
import zipfile
from pathlib import Path

import numpy as np

from ..core.paths import user_folder
from ..core.version import __version__
from . import learned_fingerprint
from .learned_features import FeatureSchema
from .learned_fingerprint import PACKAGE_DIR, metadata_path
from .learned_forest import ARRAYS, Forest
from .learned_model import KINDS, TARGETS, CostModel

#: Version of the saved layout (1 was a joblib pickle, no longer read).
MODEL_FORMAT = 2
#: The folder ``matplan train`` saves into by default (default ``$XDG_DATA_HOME/matplan/models``).
#: Models are never loaded from it unless named (see :mod:`.learned`).
MODEL_DIR_ENV = "MATPLAN_MODEL_DIR"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_VALIDATION_KEYS = ("method", "run_median_factor", "run_p90_factor")


class ModelLoadError(Exception):
    """A saved model cannot be used: unreadable, malformed, tampered, another format, schema or
    device class, or in a place others can write to."""


def user_model_dir() -> Path:
    """``$MATPLAN_MODEL_DIR``, else ``matplan/models`` in the user's data folder."""
    env = os.environ.get(MODEL_DIR_ENV)
    return Path(env).expanduser() if env else user_folder("data") / "models"


def model_paths(path) -> tuple:
    """(.npz, .json) of a model named by either file or by the path without extension."""
    meta = metadata_path(path)
    return meta.with_suffix(".npz"), meta


def package_model(device_class: str) -> Path | None:
    """The shipped model of ``device_class`` (``<class in lower case>.npz``), if there is one."""
    path = PACKAGE_DIR / f"{device_class.lower()}.npz"
    return path if path.is_file() else None


# --- saving --------------------------------------------------------------------------------
def _versions() -> dict:
    import sklearn   # recorded only: the version a model was fitted with (it is loaded without)
    return {"matplan": __version__, "sklearn": sklearn.__version__, "numpy": np.__version__}


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save(model: CostModel, name: str, *, device_class: str, dir=None, extra: dict | None = None) -> Path:
    """Write ``<dir>/<name>.npz`` and ``<name>.json``; returns the .npz path.

    ``dir`` defaults to :func:`user_model_dir`; pass ``PACKAGE_DIR`` to ship a model (it is then
    named after its device class, which is how the planner finds it).
    """
    model._check_fitted()
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"name: expected letters, digits, '.', '_' or '-' (a file name), got {name!r}")
    d = Path(dir) if dir is not None else user_model_dir()
    if d.resolve() == PACKAGE_DIR.resolve() and name != device_class.lower():
        raise ValueError(f"name: a shipped model is named after its device class ({device_class.lower()!r}), "
                         f"got {name!r}")
    arrays, forests = {}, []
    for key, pair in sorted(model.forests_.items()):
        for target, forest in zip(TARGETS, pair):
            arrays.update({f"forest{len(forests)}.{a}": v for a, v in forest.to_arrays().items()})
            forests.append({"key": key, "target": target, "trees": forest.n_trees})
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    data = buf.getvalue()
    params = model.get_params() if hasattr(model, "get_params") else model.metadata_.get("params", {})
    meta = {"format": MODEL_FORMAT, "name": name, "device_class": device_class, "kind": model.kind,
            "feature_schema": model.schema_.to_dict(), "forests": forests,
            "fixed_prepare": model.fixed_prepare_, "versions": _versions(),
            "training_set_hash": model.training_hash_, "n_samples": model.n_samples_,
            "validation": model.validation_, "params": params,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "sources": learned_fingerprint.compute(),
            **(extra or {}), "sha256": hashlib.sha256(data).hexdigest()}
    d.mkdir(parents=True, exist_ok=True)
    npz, meta_path = model_paths(d / name)
    _write(npz, data)
    _write(meta_path, json.dumps(meta, indent=1, sort_keys=True).encode())
    return npz


# --- loading -------------------------------------------------------------------------------
def check_private(path) -> None:
    """ModelLoadError unless only the owner can write the model's files, their folder and the
    folder above it (symbolic links followed). POSIX only: elsewhere the permissions are not modes."""
    if os.name != "posix":
        return
    npz, meta = model_paths(path)
    checked = set()
    for f in (npz, meta):
        real = f.resolve()
        for p in (real, real.parent, real.parent.parent):
            if p in checked or not p.exists():
                continue
            checked.add(p)
            mode = p.stat().st_mode
            if mode & (stat.S_IWGRP | stat.S_IWOTH):
                who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("world", stat.S_IWOTH)) if mode & bit)
                raise ModelLoadError(f"refusing to load {npz}: {p} is {who}-writable (mode {stat.S_IMODE(mode):o}), "
                                     f"so others could replace the model; run `chmod go-w {p}` or keep the "
                                     "model in a folder only you can write")


def read_metadata(path) -> dict:
    """The metadata of the model at ``path`` as a dict; ModelLoadError if missing or not a JSON object."""
    _, meta_path = model_paths(path)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelLoadError(f"model metadata {meta_path} cannot be read: {e.strerror or e}") from e
    except ValueError as e:
        raise ModelLoadError(f"model metadata {meta_path} is not valid JSON: {e}") from e
    if not isinstance(meta, dict):
        raise ModelLoadError(f"model metadata {meta_path} is not a JSON object")
    return meta


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_metadata(meta: dict, device_class: str | None) -> FeatureSchema:
    """The schema, after checking every field the model is built from (ValueError: what is wrong)."""
    if meta.get("format") != MODEL_FORMAT:
        raise ValueError(f"format {meta.get('format')!r}, this matplan reads format {MODEL_FORMAT}; "
                         "retrain it with `matplan train`")
    if device_class is not None and meta.get("device_class") != device_class:
        raise ValueError(f"it is for device class {meta.get('device_class')!r}, not {device_class!r}")
    for key, ok in (("name", isinstance(meta.get("name"), str)),
                    ("device_class", isinstance(meta.get("device_class"), str)),
                    ("kind", meta.get("kind") in KINDS), ("sha256", isinstance(meta.get("sha256"), str)),
                    ("n_samples", isinstance(meta.get("n_samples"), int)),
                    ("training_set_hash", isinstance(meta.get("training_set_hash"), str)),
                    ("forests", isinstance(meta.get("forests"), list) and meta["forests"]
                     and all(isinstance(f, dict) and isinstance(f.get("key"), str) and f.get("target") in TARGETS
                             for f in meta["forests"])),
                    ("fixed_prepare", isinstance(meta.get("fixed_prepare"), dict)
                     and all(_number(v) and v >= 0 for v in meta["fixed_prepare"].values())),
                    ("validation", isinstance(meta.get("validation"), dict)
                     and (not meta["validation"] or (isinstance(meta["validation"].get("method"), str)
                          and all(_number(meta["validation"].get(k)) for k in _VALIDATION_KEYS[1:]))))):
            if not ok:
                raise ValueError(f"field {key!r} is missing or malformed")
    schema = FeatureSchema.from_dict(meta.get("feature_schema"))
    if meta["kind"] == "combined" and not {"log_analytic_run", "log_analytic_prepare"} <= set(schema.columns):
        raise ValueError("a combined model without the analytic columns in its feature schema")
    return schema


def load_file(path, *, device_class: str | None = None, trusted: bool = False) -> CostModel:
    """The model at ``path`` (its .npz, .json or the path without extension), fully checked.

    ``device_class``: refuse a model for another class. ``trusted``: skip :func:`check_private`
    (the package's own models, which are as safe as its code). Any problem raises ModelLoadError
    naming the file and the reason.
    """
    try:
        return _load(path, device_class, trusted)
    except ModelLoadError:
        raise
    except Exception as e:   # np.load, the file system and the checks raise many kinds: each is a bad model
        raise ModelLoadError(f"model {model_paths(path)[0]} cannot be loaded: {type(e).__name__}: {e}") from e


def _load(path, device_class, trusted) -> CostModel:
    npz, meta_path = model_paths(path)
    if not trusted:
        check_private(npz)
    meta = read_metadata(npz)
    try:
        schema = _check_metadata(meta, device_class)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ModelLoadError(f"model metadata {meta_path}: {e}") from e
    try:
        data = npz.read_bytes()
    except OSError as e:
        raise ModelLoadError(f"model {npz} cannot be read: {e.strerror or e}") from e
    if hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise ModelLoadError(f"model {npz} does not match the SHA-256 in {meta_path.name} "
                             "(changed after it was saved); refusing to load it")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        pairs: dict = {}
        for i, entry in enumerate(meta["forests"]):
            forest = Forest.from_arrays({a: arrays[f"forest{i}.{a}"] for a in ARRAYS if f"forest{i}.{a}" in arrays},
                                        len(schema.columns))
            pairs.setdefault(entry["key"], {})[entry["target"]] = forest
        if any(set(p) != set(TARGETS) for p in pairs.values()):
            raise ValueError("every op key needs a run and a prepare forest")
        return CostModel.from_parts(
            kind=meta["kind"], schema=schema, forests={k: tuple(p[t] for t in TARGETS) for k, p in pairs.items()},
            fixed_prepare={str(k): float(v) for k, v in meta["fixed_prepare"].items()},
            validation=meta["validation"], n_samples=meta["n_samples"],
            training_hash=meta["training_set_hash"], metadata=meta)
    except (ValueError, KeyError, TypeError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise ModelLoadError(f"model {npz} is malformed: {type(e).__name__}: {e}") from e


__all__ = ["save", "load_file", "read_metadata", "check_private", "package_model", "model_paths",
           "user_model_dir", "ModelLoadError", "MODEL_FORMAT", "MODEL_DIR_ENV", "PACKAGE_DIR"]
