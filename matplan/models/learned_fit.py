"""Fitting the learned cost model: measured timings -> the forests of a :class:`~.learned_model.CostModel`.

Two gradient-boosted regressors (scikit-learn's HistGradientBoostingRegressor)
predict log run time and log format-conversion time from the planner's
statistics, the device and the candidate's parameters. Log time because
timings span six decades and the planner compares ratios; trees because the
paper rules are thresholds (sort when the warp ratio <= 0.665, one hash size
when var/mean <= 0.5, ...) that trees represent directly and that missing
parameters (NaN) do not disturb. Once fitted, the regressors are exported to
NumPy forests (:mod:`.learned_forest`), which predict from then on: here, when
saved, and when loaded by the planner, which never needs scikit-learn.

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

The combined kind fits each target in two parts (``offset_share`` of the iterations to the
first): its mean over a problem's candidates, then each candidate's difference from that mean; the
two forests are saved as one (:func:`.learned_forest.concat`: as many trees as one fit, so scoring
costs the same). A choice among a problem's candidates depends mostly on their differences, and a
single forest spent its splits on how far the analytic model is off for a problem as a whole,
which varies more than its candidates do (docs/tuning.md gives the held-out regret of each).
"""
from __future__ import annotations

import hashlib
import inspect

import numpy as np

from ..core.validation import check_int
from .learned_features import OPS, FeatureSchema
from .learned_forest import concat, export_hgb
from .learned_model import ALL_OPS, KINDS, CostModel

#: Fewest timings a model is fitted from.
MIN_SAMPLES = 10
#: With ``per_op``, an op of at least this many timings gets regressors of its own (a re-timing of
#: one op then leaves the others' predictions alone); other ops take the ones fitted on every timing.
PER_OP_MIN_SAMPLES = 40
#: Training rows each exported forest is checked against scikit-learn's predict on.
CHECK_ROWS = 64
#: Default share of each target's boosting iterations fitted to the problems' mean (the rest to
#: each candidate's difference from it), by kind; 0 fits one regressor to the target as it is. The
#: learned kind's problem mean is the whole time scale (six decades), which half the iterations
#: fit worse than all of them.
OFFSET_SHARE = {"combined": 0.5, "learned": 0.0}


class _Sum:
    """Two fitted regressors whose predictions add (a problem's level, a candidate's difference),
    predicting as the one forest they are saved as, so that a fitted model and its forests agree to
    the last bit (scikit-learn's two predictions, added, round differently)."""

    def __init__(self, parts, n_features: int):
        self.parts = tuple(parts)
        self.n_features = n_features
        self._forest = None

    def forest(self):
        if self._forest is None:
            self._forest = concat([export_hgb(r, self.n_features) for r in self.parts], self.n_features)
        return self._forest

    def predict(self, Z) -> np.ndarray:
        return self.forest().predict(Z)

    def sklearn_predict(self, Z) -> np.ndarray:
        """scikit-learn's two predictions, added: what the forest is checked against."""
        return self.parts[0].predict(Z) + self.parts[1].predict(Z)


def _problem_ids(Z, base_positions) -> np.ndarray:
    """A label per row of ``Z``, equal for rows of equal base features (one problem's candidates)."""
    B = np.ascontiguousarray(Z[:, base_positions])
    keys = B.view(np.dtype((np.void, B.dtype.itemsize * B.shape[1]))).ravel()
    return np.unique(keys, return_inverse=True)[1].ravel()


def _problem_mean(t, ids) -> np.ndarray:
    """Each row's mean of ``t`` over the rows of its problem."""
    ids = np.unique(ids, return_inverse=True)[1].ravel()   # 0..k-1: a subset of rows leaves gaps
    return (np.bincount(ids, weights=t) / np.bincount(ids))[ids]


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


def _export_one(regressor, n_features: int):
    return regressor.forest() if isinstance(regressor, _Sum) else export_hgb(regressor, n_features)


def export(regressors: dict, check_X) -> dict:
    """{key: (run forest, prepare forest)} of fitted regressors (a :class:`_Sum` as one forest),
    each checked against scikit-learn's ``predict`` on ``check_X`` (ValueError if they differ:
    scikit-learn changed its tree layout)."""
    forests = {}
    for key, pair in regressors.items():
        forests[key] = tuple(_export_one(r, check_X.shape[1]) for r in pair)
        for r, f in zip(pair, forests[key]):
            want = r.sklearn_predict(check_X) if isinstance(r, _Sum) else r.predict(check_X)
            if not np.allclose(f.predict(check_X), want, rtol=1e-12, atol=1e-12):
                raise ValueError("the exported forest does not reproduce scikit-learn's predictions")
    return forests


class LearnedCostModel(CostModel):
    """A CostModel fitted from timings, with scikit-learn's estimator conventions.

    ``fit(X, y, groups=None)``: X a sequence of :class:`~.learned_features.Query`, y an (n, 2)
    array of measured (run_s, prepare_s); ``groups`` (e.g. matrix families) makes the validation
    error a leave-group-out estimate. ``predict(X)`` returns an (n, 2) array of seconds.
    ``regressors_``: the fitted scikit-learn regressors, by the keys of ``forests_``.
    ``max_iter``: boosting iterations of each target, ``offset_share`` of them fitted to the
    problems' mean and the rest to each candidate's difference from it (module docstring; None:
    ``OFFSET_SHARE`` of the kind).
    """

    def __init__(self, kind="combined", max_iter=300, learning_rate=0.08, max_leaf_nodes=31, max_depth=8,
                 min_samples_leaf=5, l2_regularization=0.0, cv=5, random_state=0, per_op=False,
                 offset_share=None):
        self.kind = kind
        self.per_op = per_op
        self.offset_share = offset_share
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.l2_regularization = l2_regularization
        self.cv = cv
        self.random_state = random_state

    # -- estimator conventions (sklearn.base.clone works with these; scikit-learn is not imported
    # -- until fit, so that importing matplan's CLI does not load it)
    @classmethod
    def _param_names(cls) -> list:
        return sorted(p for p in inspect.signature(cls.__init__).parameters if p != "self")

    def get_params(self, deep=True) -> dict:
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params):
        for name, value in params.items():
            if name not in self._param_names():
                raise ValueError(f"invalid parameter {name!r} for LearnedCostModel")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        return f"LearnedCostModel({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"

    # -- fitting ----------------------------------------------------------------------------
    def _check_params(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")
        expected = "0 (no validation) or an integer >= 2 folds"
        if check_int(self.cv, "cv", expected, minimum=0) == 1:
            raise ValueError(f"cv: expected {expected}, got 1")
        check_int(self.max_iter, "max_iter", "a positive number of boosting iterations", minimum=1)
        share = self._offset_share()
        if isinstance(share, bool) or not isinstance(share, (int, float, np.integer, np.floating)) \
                or not 0.0 <= float(share) < 1.0:
            raise ValueError(f"offset_share: expected a number in [0, 1) (the share of iterations fitted "
                             f"to the problems' mean), got {share!r}")

    def _offset_share(self):
        return OFFSET_SHARE.get(self.kind, 0.0) if self.offset_share is None else self.offset_share

    def _iterations(self) -> tuple:
        """(iterations of the problems' mean, of the differences from it); (0, max_iter) for one fit."""
        offset = int(round(self.max_iter * float(self._offset_share())))
        offset = min(offset, self.max_iter - 1) if self.max_iter > 1 else 0
        return offset, self.max_iter - offset

    def _regressor(self, max_iter=None):
        from sklearn.ensemble import HistGradientBoostingRegressor   # scikit-learn: only to fit
        return HistGradientBoostingRegressor(
            max_iter=self.max_iter if max_iter is None else max_iter, learning_rate=self.learning_rate,
            max_leaf_nodes=self.max_leaf_nodes,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf, l2_regularization=self.l2_regularization,
            early_stopping=False, random_state=self.random_state)

    def _fit_regressor(self, Z, t, ids=None):
        """The regressor of target ``t`` on Z: one fit, or with ``offset_share`` and the rows'
        problem ``ids`` a :class:`_Sum` of a fit to each problem's mean of t and one to the rest. A
        column with no value in Z (a feature of a kernel family absent from this fold) is set to 0
        for the fit: scikit-learn's binning fails on an all-NaN column, and a constant column is
        never split on, so predictions are the same."""
        empty = np.all(np.isnan(Z), axis=0)
        if empty.any():
            Z = Z.copy()
            Z[:, empty] = 0.0
        offset_iter, rest_iter = self._iterations()
        if not offset_iter or ids is None:
            return self._regressor().fit(Z, t)
        level = _problem_mean(t, ids)
        return _Sum([self._regressor(offset_iter).fit(Z, level), self._regressor(rest_iter).fit(Z, t - level)],
                    Z.shape[1])

    def _fit_models(self, Z, T) -> dict:
        """{ALL_OPS: the (run, prepare) regressors of every row} and, with per_op, {op: its own} for each
        op of at least PER_OP_MIN_SAMPLES rows (when the rows hold more than that op)."""
        ids = _problem_ids(Z, self.schema_._base_positions)
        models = {ALL_OPS: [self._fit_regressor(Z, T[:, j], ids) for j in range(2)]}
        if self.per_op:
            ops = self._ops_of(Z)
            for op in OPS:
                rows = ops == op
                if PER_OP_MIN_SAMPLES <= rows.sum() < len(Z):
                    models[op] = [self._fit_regressor(Z[rows], T[rows, j], ids[rows]) for j in range(2)]
        return models

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
        self.regressors_ = self._fit_models(Z, T)
        # rows the export is checked on: spread over the data, and a few of every op
        ops = self._ops_of(Z)
        check = set(np.linspace(0, len(Z) - 1, min(len(Z), CHECK_ROWS)).astype(int).tolist())
        for op in OPS:
            check.update(np.flatnonzero(ops == op)[:4].tolist())
        self.forests_ = export(self.regressors_, Z[sorted(check)])
        self.fixed_prepare_ = _fixed_prepare(X, y)
        self.n_samples_ = len(X)
        h = hashlib.sha256(np.ascontiguousarray(Z).tobytes())
        h.update(np.ascontiguousarray(y).tobytes())
        self.training_hash_ = h.hexdigest()
        self.metadata_ = {}
        return self

    def _validate(self, Z, T, groups) -> dict:
        """Out-of-fold error of log run/prepare time (by group when groups are given)."""
        if not self.cv:
            return {}
        from sklearn.model_selection import GroupKFold, KFold   # scikit-learn: only to fit
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


__all__ = ["LearnedCostModel", "export", "MIN_SAMPLES", "PER_OP_MIN_SAMPLES", "OFFSET_SHARE", "KINDS"]
