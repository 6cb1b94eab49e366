"""The learned cost model: measured timings -> predicted time of each (kernel, params) candidate.

Two gradient-boosted regressors (scikit-learn's HistGradientBoostingRegressor)
predict log run time and log format-conversion time from the planner's
statistics, the device and the candidate's parameters. Log time because
timings span six decades and the planner compares ratios; trees because the
paper rules are thresholds (sort when the warp ratio <= 0.665, one hash size
when var/mean <= 0.5, ...) that trees represent directly and that missing
parameters (NaN) do not disturb.

With ``per_op`` (``matplan train --per-op``) each op of at least PER_OP_MIN_SAMPLES timings
gets its own pair, fitted on its timings alone, and the pair fitted on every timing serves the
rest. One model over every op moved its SpMM predictions when only the SpGEMM timings were
re-taken (H100: leave-family-out worst 1.61 / 2.37 at reuse 1 / 100; per op on the same timings
1.35 / 1.74, geomean 1.012 / 1.016 against 1.011 / 1.019), but on the H200's timings per op did
worse (worst 2.12 / 1.58 against 1.57 / 1.58, geomean 1.044 / 1.031 against 1.039 / 1.028): it
is an option, off by default, and the shipped models are fitted on every op.

``kind='combined'`` (the default) learns the correction to the analytic
model: its target is log(measured / analytic) and the analytic prediction is
also a feature, so it keeps the analytic model's scaling outside the training
range. ``kind='learned'`` predicts log time from the features alone.
``matplan report`` compares both with the analytic model (leave-family-out).
Kernels whose ``prepare`` keeps A's own arrays (``reads_a_at_run``) convert
nothing; their prepare time is predicted as the training mean of that kernel.
What the model reads of a candidate is a :class:`~.learned_features.Query`; its caller supplies
the analytic Cost and the kernel's ``reads_a_at_run`` (this layer never imports the kernels).

Saved models are a joblib file (a pickle: never load one from an untrusted
place) beside a JSON metadata file: the feature schema, matplan and
scikit-learn versions, device class, training-set hash and the SHA-256 of the
joblib file. :func:`load` reads only from the package's ``models/data`` folder
and the user's model folder, refuses a file whose hash or feature schema does
not match, and warns on a version mismatch. The planner asks
:func:`rescore` for every plan; without a model for the device class it keeps
the analytic costs (``source='analytic'``).
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import re
import warnings
from pathlib import Path

import numpy as np

from ..core import device as device_mod
from ..core.paths import user_folder
from ..core.types import Cost
from ..core.version import __version__
from .learned_features import FEATURE_SCHEMA_VERSION, OPS, FeatureSchema, Query, log_floor

#: Version of the metadata file layout.
MODEL_FORMAT = 1
#: The user's model folder (default ``$XDG_DATA_HOME/matplan/models``).
MODEL_DIR_ENV = "MATPLAN_MODEL_DIR"
#: "auto" (use a learned model when one exists for the device class) or "analytic" (never).
COST_MODEL_ENV = "MATPLAN_COST_MODEL"
#: Models shipped with the package.
PACKAGE_DIR = Path(__file__).resolve().parent / "data"
KINDS = ("combined", "learned")
#: Fewest timings a model is fitted from.
MIN_SAMPLES = 10
#: With ``per_op``, an op of at least this many timings gets regressors of its own (a re-timing of
#: one op then leaves the others' predictions alone); other ops take the ones fitted on every timing.
PER_OP_MIN_SAMPLES = 40


class ModelLoadError(Exception):
    """A saved model cannot be used (outside the allowed folders, tampered, wrong schema or device)."""


class ModelVersionWarning(UserWarning):
    """A saved model was made by another matplan or scikit-learn version."""


# --- device classes ------------------------------------------------------------------------
def device_class(device_name: str, backend: str) -> str:
    """The model family a device belongs to: 'cpu', a known GPU key ('H100'), or its cleaned name."""
    if backend == "cpu":
        return "cpu"
    upper = str(device_name).upper()
    for key in device_mod.KNOWN_GPUS:
        if key.upper() in upper:
            return key
    return re.sub(r"[^A-Za-z0-9]+", "-", str(device_name)).strip("-") or "gpu"


# --- fixed prepare times ----------------------------------------------------------------
def _fixed_prepare(queries, y) -> dict:
    """Mean measured prepare seconds of each kernel whose ``prepare`` keeps A's own arrays
    (``Query.reads_a_at_run``: CSR scalar, vector, SpMM): it converts nothing, so its time does
    not depend on the matrix and the model predicts this constant instead of fitting features to
    noise. On the H100 tuning data these prepares were 35-110 us whatever the matrix (handle
    lookups and host work; the same kernel varied 2-3x between neighbouring problems), and tree
    predictions of them erred more than a constant did (mean |log error| 0.30 vs 0.26 for CSR
    vector, leave-family-out).

    The mean, not the median: the times are bimodal (CSR vector 35 or 65 us, CSR SpMM 60 or
    105 us; 36-41% of timings in the slow mode, which follows the host's state during a run,
    not the matrix), and the planner minimises the expected cost, which is the mean (H100: CSR
    vector 48.6 us, SpMM 79.1; medians 38.6 and 63.2). The median is the fast mode: it made
    reuse=1 plans prefer these kernels over cuSPARSE (3 us prepare) by margins the slow-mode
    runs do not have. With the measured run times and this constant instead of the median,
    the H100 data's worst reuse=1 regret is 1.35 instead of 1.48 (leave-family-out)."""
    times: dict = {}
    fixed: dict = {}
    for q, (_, prep_s) in zip(queries, y):
        times.setdefault(q.kernel, []).append(prep_s)
        fixed[q.kernel] = fixed.get(q.kernel, True) and bool(q.reads_a_at_run)
    return {kernel: float(np.mean(t)) for kernel, t in sorted(times.items()) if fixed[kernel]}


# --- fast prediction -----------------------------------------------------------------------
class _FlatForest:
    """Every tree of a fitted HistGradientBoostingRegressor in flat arrays, walked together.

    scikit-learn predicts tree by tree (a few microseconds of Python per tree),
    which costs milliseconds per plan; this walks all trees for all rows at once
    with NumPy, one level per step. It reads scikit-learn's fitted predictor
    nodes, so it is checked against ``predict`` on stored rows before use and
    not used (plain ``predict`` instead) when it disagrees or the layout changed.
    """

    def __init__(self, hgb):
        trees = [p[0].nodes for p in hgb._predictors]
        if any(len(p) != 1 for p in hgb._predictors):
            raise ValueError("one tree per iteration expected")
        sizes = np.array([len(t) for t in trees])
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        nodes = np.concatenate(trees)
        shift = np.repeat(offsets, sizes)
        if np.any(nodes["is_categorical"]):
            raise ValueError("categorical splits are not supported")
        leaf = nodes["is_leaf"].astype(bool)
        here = np.arange(len(nodes), dtype=np.intp)
        # leaves point to themselves (and never go left on NaN), so every row can take `depth` steps
        self.feature = np.where(leaf, 0, nodes["feature_idx"]).astype(np.intp)
        self.threshold = np.where(leaf, np.inf, nodes["num_threshold"]).astype(np.float64)
        self.missing_left = nodes["missing_go_to_left"].astype(bool) & ~leaf
        self.left = np.where(leaf, here, nodes["left"].astype(np.intp) + shift)
        self.right = np.where(leaf, here, nodes["right"].astype(np.intp) + shift)
        self.value = nodes["value"].astype(np.float64)
        self.roots = offsets.astype(np.intp)
        self.depth = int(nodes["depth"].max())
        self.baseline = float(np.ravel(hgb._baseline_prediction)[0])

    def predict(self, X):
        X = np.asarray(X, dtype=np.float64)
        idx = np.broadcast_to(self.roots, (len(X), len(self.roots))).copy()
        rows = np.arange(len(X))[:, None]
        for _ in range(self.depth):
            x = X[rows, self.feature[idx]]
            go_left = (x <= self.threshold[idx]) | (np.isnan(x) & self.missing_left[idx])
            idx = np.where(go_left, self.left[idx], self.right[idx])
        return self.baseline + self.value[idx].sum(axis=1)


# --- the estimator -------------------------------------------------------------------------
try:
    from sklearn.base import BaseEstimator
except ImportError:  # pragma: no cover - scikit-learn is a core dependency
    BaseEstimator = object


class LearnedCostModel(BaseEstimator):
    """Predicts (run seconds, prepare seconds) of candidates; scikit-learn estimator conventions.

    ``fit(X, y, groups=None)``: X a sequence of :class:`Query`, y an (n, 2)
    array of measured (run_s, prepare_s); ``groups`` (e.g. matrix families)
    makes the validation error a leave-group-out estimate. ``predict(X)``
    returns an (n, 2) array of seconds. Fitted state ends in ``_``.
    """

    per_op = False   # models saved before the parameter existed were fitted on every op

    def __init__(self, kind="combined", max_iter=300, learning_rate=0.08, max_leaf_nodes=31, max_depth=8,
                 min_samples_leaf=5, l2_regularization=0.0, cv=5, random_state=0, per_op=False):
        self.kind = kind
        self.per_op = per_op
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.l2_regularization = l2_regularization
        self.cv = cv
        self.random_state = random_state

    # -- fitting ----------------------------------------------------------------------------
    def _check_params(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")
        if isinstance(self.cv, bool) or not isinstance(self.cv, int) or self.cv < 0 or self.cv == 1:
            raise ValueError(f"cv: expected 0 (no validation) or an integer >= 2 folds, got {self.cv!r}")

    def _regressor(self):
        from sklearn.ensemble import HistGradientBoostingRegressor
        return HistGradientBoostingRegressor(
            max_iter=self.max_iter, learning_rate=self.learning_rate, max_leaf_nodes=self.max_leaf_nodes,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf, l2_regularization=self.l2_regularization,
            early_stopping=False, random_state=self.random_state)

    def _fit_regressor(self, Z, t):
        """One regressor on (Z, t). A column with no value in Z (a feature of a kernel family absent from
        this fold) is set to 0 for the fit: scikit-learn's binning fails on an all-NaN column, and a constant
        column is never split on, so predictions are the same."""
        empty = np.all(np.isnan(Z), axis=0)
        if empty.any():
            Z = Z.copy()
            Z[:, empty] = 0.0
        return self._regressor().fit(Z, t)

    def _ops_of(self, Z) -> np.ndarray:
        """Each row's op (from the op_* columns), "" where none is set."""
        onehot = Z[:, [self._col(f"op_{op}") for op in OPS]]
        ops = np.array(OPS, dtype=object)[np.argmax(np.nan_to_num(onehot), axis=1)]
        ops[~(np.nan_to_num(onehot).max(axis=1) == 1.0)] = ""
        return ops

    def _fit_models(self, Z, T) -> dict:
        """{"*": the (run, prepare) regressors of every row} and, with per_op, {op: its own} for each
        op of at least PER_OP_MIN_SAMPLES rows (when the rows hold more than that op)."""
        models = {"*": [self._fit_regressor(Z, T[:, j]) for j in range(2)]}
        if getattr(self, "per_op", False):
            ops = self._ops_of(Z)
            for op in OPS:
                rows = ops == op
                if PER_OP_MIN_SAMPLES <= rows.sum() < len(Z):
                    models[op] = [self._fit_regressor(Z[rows], T[rows, j]) for j in range(2)]
        return models

    def _route(self, models, Z) -> np.ndarray:
        """The (log) targets of Z's rows from ``models`` ({key: [run, prepare] regressors} as
        _fit_models gives, or a list: a model saved before per_op): a row's op's own, else "*"."""
        if isinstance(models, list):
            models = {"*": models}
        T = np.empty((len(Z), 2))
        own = self._ops_of(Z) if len(models) > 1 else np.full(len(Z), "", dtype=object)
        pooled = ~np.isin(own, [op for op in models if op != "*"])
        for key, rows in [("*", pooled)] + [(op, own == op) for op in models if op != "*"]:
            if rows.any():
                T[rows] = np.column_stack([m.predict(Z[rows]) for m in models[key]])
        return T

    def _targets(self, Z, y):
        t = log_floor(y)
        if self.kind == "combined":
            t = t - Z[:, [self._col("log_analytic_run"), self._col("log_analytic_prepare")]]
        return t

    def _col(self, name):
        return self.schema_.columns.index(name)

    def fit(self, X, y, groups=None):
        self._check_params()
        X = list(X)
        y = np.asarray(y, dtype=np.float64)
        if y.ndim != 2 or y.shape[1] != 2:
            raise ValueError(f"y: expected an (n, 2) array of (run_s, prepare_s), got shape {y.shape}")
        if len(X) != len(y):
            raise ValueError(f"X and y: {len(X)} queries but {len(y)} timings")
        if len(X) < MIN_SAMPLES:
            raise ValueError(f"X: need at least {MIN_SAMPLES} timings to fit, got {len(X)}")
        if not np.all(np.isfinite(y)) or np.any(y < 0):
            raise ValueError("y: timings must be finite and non-negative")
        if groups is not None and len(groups) != len(X):
            raise ValueError(f"groups: expected {len(X)} labels, got {len(groups)}")
        self.schema_ = FeatureSchema.fit(X, analytic=self.kind == "combined")
        Z = self.schema_.transform(X)
        T = self._targets(Z, y)
        self.validation_ = self._validate(Z, T, groups)
        self.models_ = self._fit_models(Z, T)
        self.fixed_prepare_ = _fixed_prepare(X, y)
        ops = self._ops_of(Z)   # rows checked against the flat forests: spread, and a few of every op
        check = set(np.linspace(0, len(Z) - 1, min(len(Z), 32)).astype(int).tolist())
        for op in self.models_:
            check.update(np.flatnonzero(ops == op)[:4].tolist())
        self.check_X_ = Z[sorted(check)]
        self.check_y_ = self._route(self.models_, self.check_X_)
        self.kernels_ = self.schema_.kernels
        self.n_samples_ = len(X)
        h = hashlib.sha256(np.ascontiguousarray(Z).tobytes())
        h.update(np.ascontiguousarray(y).tobytes())
        self.training_hash_ = h.hexdigest()
        return self

    def _validate(self, Z, T, groups) -> dict:
        """Out-of-fold error of log run/prepare time (by group when groups are given)."""
        if not self.cv:
            return {}
        from sklearn.model_selection import GroupKFold, KFold
        if groups is not None and len(set(groups)) >= 2:
            splitter = GroupKFold(n_splits=min(self.cv, len(set(groups))))
            splits, how = splitter.split(Z, groups=groups), "group k-fold (held-out groups)"
        else:
            splitter = KFold(n_splits=min(self.cv, len(Z)), shuffle=True, random_state=self.random_state)
            splits, how = splitter.split(Z), "k-fold"
        oof = np.empty_like(T)
        folds = 0
        for train, test in splits:
            folds += 1
            oof[test] = self._route(self._fit_models(Z[train], T[train]), Z[test])
        err = np.abs(oof - T)
        return {"method": how, "folds": folds,
                "run_median_factor": float(np.exp(np.median(err[:, 0]))),
                "run_p90_factor": float(np.exp(np.quantile(err[:, 0], 0.9))),
                "run_log_rmse": float(np.sqrt(np.mean(err[:, 0] ** 2))),
                "prepare_median_factor": float(np.exp(np.median(err[:, 1])))}

    # -- predicting -------------------------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "models_"):
            raise RuntimeError("this LearnedCostModel is not fitted yet; call fit(X, y) first")

    def knows(self, kernel: str) -> bool:
        """Whether ``kernel`` was in the training data (others keep their analytic cost)."""
        self._check_fitted()
        return kernel in self.kernels_

    def predict(self, X) -> np.ndarray:
        self._check_fitted()
        X = list(X)
        if not X:
            return np.zeros((0, 2))
        Z = self.schema_.transform(X)
        return self._predict_z(Z)

    def _fast(self):
        """The flat forests, built once per process and checked against scikit-learn; None if unusable."""
        if "_flat" not in self.__dict__:
            try:
                models = self.models_ if isinstance(self.models_, dict) else {"*": self.models_}
                flat = {key: [_FlatForest(m) for m in ms] for key, ms in models.items()}
                got = self._route(flat, self.check_X_)
                ok = np.allclose(got, self.check_y_, rtol=1e-9, atol=1e-9)
            except (AttributeError, ValueError, KeyError, IndexError):
                ok = False
            self.__dict__["_flat"] = flat if ok else None
        return self.__dict__["_flat"]

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_flat", None)
        state.pop("metadata_", None)
        return state

    def _predict_z(self, Z):
        T = self._route(self._fast() or self.models_, Z)
        if self.kind == "combined":
            T = T + Z[:, [self._col("log_analytic_run"), self._col("log_analytic_prepare")]]
        out = np.exp(T)
        for kernel, prep_s in getattr(self, "fixed_prepare_", {}).items():   # absent in older models
            col = f"kernel:{kernel}"
            if col in self.schema_.columns:
                out[Z[:, self._col(col)] == 1.0, 1] = prep_s
        return out

    def describe(self) -> str:
        """Which model and how confident: the sentence plans quote."""
        self._check_fitted()
        meta = getattr(self, "metadata_", {})
        name = meta.get("name", "unsaved")
        v = self.validation_
        conf = (f"validation ({v['method']}): median error x{v['run_median_factor']:.2f}, "
                f"90% within x{v['run_p90_factor']:.2f}" if v else "no validation error recorded")
        return (f"learned model '{name}' ({self.kind}, {meta.get('device_class', '?')}, "
                f"{self.n_samples_} timings; {conf})")


# --- saving and loading --------------------------------------------------------------------
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def user_model_dir() -> Path:
    """``$MATPLAN_MODEL_DIR``, else ``matplan/models`` in the user's data folder."""
    env = os.environ.get(MODEL_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return user_folder("data") / "models"


def model_dirs() -> list:
    """The folders models load from, in order of precedence: the user's, then the package's."""
    return [user_model_dir(), PACKAGE_DIR]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _versions() -> dict:
    import sklearn   # scikit-learn's version only where a model is saved or loaded
    return {"matplan": __version__, "sklearn": sklearn.__version__, "numpy": np.__version__}


def save(model: LearnedCostModel, name: str, *, device_class: str, dir=None,
         extra: dict | None = None) -> Path:
    """Write ``<dir>/<name>.joblib`` and ``<name>.json`` (metadata); returns the joblib path.

    ``dir`` defaults to the user's model folder; pass ``PACKAGE_DIR`` to ship a model.
    """
    import joblib
    model._check_fitted()
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"name: expected letters, digits, '.', '_' or '-' (a file name), got {name!r}")
    d = Path(dir) if dir is not None else user_model_dir()
    d.mkdir(parents=True, exist_ok=True)
    path, meta_path = d / f"{name}.joblib", d / f"{name}.json"
    tmp = d / f".{name}.joblib.tmp{os.getpid()}"
    joblib.dump(model, tmp, compress=3)
    digest = _sha256(tmp)
    meta = {"format": MODEL_FORMAT, "name": name, "device_class": device_class, "kind": model.kind,
            "feature_schema": model.schema_.to_dict(), "versions": _versions(),
            "training_set_hash": model.training_hash_, "n_samples": model.n_samples_,
            "validation": model.validation_, "params": model.get_params(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "sha256": digest, **(extra or {})}
    os.replace(tmp, path)
    tmp_meta = d / f".{name}.json.tmp{os.getpid()}"
    tmp_meta.write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(tmp_meta, meta_path)
    _cached_model.cache_clear()
    return path


def _allowed(path: Path) -> bool:
    parent = path.resolve().parent
    return any(parent == d.resolve() for d in model_dirs())


def load_file(path, *, device_class: str | None = None) -> LearnedCostModel:
    """Load a saved model after checking where it is, its hash, schema, versions and device class."""
    import joblib
    path = Path(path)
    if path.suffix != ".joblib":
        path = path.with_suffix(".joblib")
    if not _allowed(path):
        raise ModelLoadError(f"refusing to load {path}: models load only from "
                             f"{', '.join(str(d) for d in model_dirs())} (joblib files are pickles)")
    meta_path = path.with_suffix(".json")
    if not path.is_file() or not meta_path.is_file():
        raise ModelLoadError(f"model {path} or its metadata {meta_path.name} is missing")
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as e:
        raise ModelLoadError(f"model metadata {meta_path} is not valid JSON: {e}") from e
    if meta.get("format") != MODEL_FORMAT:
        raise ModelLoadError(f"model metadata {meta_path} has format {meta.get('format')}, expected {MODEL_FORMAT}")
    digest = _sha256(path)
    if digest != meta.get("sha256"):
        raise ModelLoadError(f"model {path} does not match the SHA-256 in {meta_path.name} "
                             f"(file changed after it was saved); refusing to load it")
    schema_version = meta.get("feature_schema", {}).get("version")
    if schema_version != FEATURE_SCHEMA_VERSION:
        raise ModelLoadError(f"model {path} uses feature schema {schema_version}, this matplan "
                             f"computes schema {FEATURE_SCHEMA_VERSION}; retrain it with `matplan train`")
    if device_class is not None and meta.get("device_class") != device_class:
        raise ModelLoadError(f"model {path} is for device class {meta.get('device_class')!r}, "
                             f"not {device_class!r}")
    now = _versions()
    for lib in ("matplan", "sklearn"):
        if meta.get("versions", {}).get(lib) != now[lib]:
            warnings.warn(f"model {path} was saved with {lib} {meta.get('versions', {}).get(lib)}, "
                          f"this is {now[lib]}; retrain with `matplan train` if predictions look wrong",
                          ModelVersionWarning, stacklevel=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn's own version warning: ours above says it once
        model = joblib.load(path)
    if not isinstance(model, LearnedCostModel):
        raise ModelLoadError(f"{path} holds a {type(model).__name__}, not a LearnedCostModel")
    if list(model.schema_.columns) != meta["feature_schema"]["columns"]:
        raise ModelLoadError(f"model {path}: feature columns differ from its metadata")
    model.metadata_ = meta
    return model


def find(device_class: str) -> Path | None:
    """The model to use for ``device_class``: the user's folder first, then the package's; newest first."""
    for d in model_dirs():
        if not d.is_dir():
            continue
        best = None
        for meta_path in sorted(d.glob("*.json")):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            if meta.get("device_class") == device_class and (d / f"{meta_path.stem}.joblib").is_file():
                key = (meta.get("created", ""), meta_path.stem)
                if best is None or key > best[0]:
                    best = (key, d / f"{meta_path.stem}.joblib")
        if best:
            return best[1]
    return None


def load(device_class: str) -> LearnedCostModel | None:
    """The model for ``device_class`` from the allowed folders, or None when there is none."""
    path = find(device_class)
    return None if path is None else load_file(path, device_class=device_class)


def _signature(device_class: str) -> tuple:
    sig = [device_class]
    for d in model_dirs():
        if d.is_dir():
            sig += sorted((str(p), p.stat().st_mtime_ns) for p in d.iterdir()
                          if p.suffix in (".json", ".joblib"))
    return tuple(sig)


@functools.lru_cache(maxsize=16)
def _cached_model(signature: tuple):
    try:
        return load(signature[0])
    except ModelLoadError as e:
        warnings.warn(f"learned cost model not used, planning with the analytic models: {e}",
                      RuntimeWarning, stacklevel=3)
        return None


def model_for(backend: str, dev) -> LearnedCostModel | None:
    """The learned model the planner uses for ``dev`` (cached until the model folders change)."""
    if os.environ.get(COST_MODEL_ENV, "auto").lower() == "analytic":
        return None
    return _cached_model(_signature(device_class(dev.name, backend)))


def rescore(feats, dev, pending) -> list:
    """Costs for the planner: ``pending`` is [(kernel name, params, analytic Cost)];
    returns [(Cost, source)] in the same order, learned where the model knows the kernel."""
    model = model_for(feats.backend, dev)
    out = [(cost, "analytic") for _, _, cost in pending]
    if model is None:
        return out
    # costs calibrated by an online timing on this device (TSM2 and cuBLAS for tsgemm) stay
    idx = [i for i, (name, _, cost) in enumerate(pending)
           if model.knows(name) and not getattr(cost, "calibrated", False)]
    if not idx:
        return out
    queries = [Query(feats, pending[i][0], pending[i][1], dev, pending[i][2]) for i in idx]
    Z = model.schema_.transform(queries)
    outside = model.schema_.outside(Z[0])
    if outside:  # trees do not extrapolate: past the training range the analytic models decide
        return [(Cost(cost.prepare_s, cost.run_s,
                      f"{cost.why} (analytic: {', '.join(outside)} outside the training range of "
                      f"{model.describe()})"), "analytic") for _, _, cost in pending]
    pred = model._predict_z(Z)
    about = model.describe()
    for row, i in enumerate(idx):
        analytic = pending[i][2]
        run_s, prep_s = float(pred[row, 0]), float(pred[row, 1])
        why = (f"{about}: predicts run {run_s * 1e3:.4f} ms, prepare {prep_s * 1e3:.4f} ms "
               f"(analytic model: run {analytic.run_s * 1e3:.4f} ms; {analytic.why})")
        out[i] = (Cost(prep_s, run_s, why), "learned")
    for i, (name, _, cost) in enumerate(pending):
        if out[i][1] == "analytic" and not getattr(cost, "calibrated", False):
            out[i] = (Cost(cost.prepare_s, cost.run_s,
                           f"{cost.why} (analytic: {name} is not in {model.describe()})"), "analytic")
    return out


def clear_cache() -> None:
    """Forget loaded models (they reload on the next plan)."""
    _cached_model.cache_clear()


__all__ = ["LearnedCostModel", "Query", "FeatureSchema", "save", "load", "load_file", "find",
           "model_for", "rescore", "device_class", "user_model_dir", "model_dirs", "clear_cache",
           "ModelLoadError", "ModelVersionWarning", "FEATURE_SCHEMA_VERSION", "PACKAGE_DIR"]
