"""A fitted learned cost model: what it needs to predict, and prediction with NumPy only.

:class:`CostModel` holds the feature schema, the forests (run and prepare; one pair fitted on every
op, ``"*"``, and with ``per_op`` a pair of its own for some ops) and the fixed prepare times. Both
a model just fitted (:class:`~.learned_fit.LearnedCostModel`, a subclass) and one read from disk
(:func:`~.learned_files.load_file`) are CostModels, so they predict the same numbers.
"""
from __future__ import annotations

import numpy as np

from .learned_features import OPS, FeatureSchema, log_floor
from .learned_forest import Stack

KINDS = ("combined", "learned")
#: The two predicted times, in the order of a prediction's columns.
TARGETS = ("run", "prepare")
#: The key of the forests fitted on every op.
ALL_OPS = "*"


class CostModel:
    """Predicts (run seconds, prepare seconds) of candidates. Fitted state ends in ``_``.

    ``kind``: 'combined' (the forests predict log(measured / analytic)) or 'learned' (log
    time). ``forests_``: {ALL_OPS or an op: (run forest, prepare forest)}. ``fixed_prepare_``:
    {kernel: seconds} predicted whatever the problem. ``metadata_``: what a saved model's JSON says.
    """
    kind = "combined"

    @classmethod
    def from_parts(cls, *, kind: str, schema: FeatureSchema, forests: dict, fixed_prepare: dict,
                   validation: dict, n_samples: int, training_hash: str, metadata: dict | None = None):
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
        if ALL_OPS not in forests or any(k != ALL_OPS and k not in OPS for k in forests):
            raise ValueError(f"forests: expected the key {ALL_OPS!r} and ops of {OPS}, got {sorted(forests)}")
        model = cls.__new__(cls)
        model.kind = kind
        model.schema_ = schema
        model.forests_ = {k: tuple(v) for k, v in forests.items()}
        model.fixed_prepare_ = dict(fixed_prepare)
        model.validation_ = dict(validation)
        model.n_samples_ = int(n_samples)
        model.training_hash_ = training_hash
        model.metadata_ = dict(metadata or {})
        return model

    # -- columns and routing ----------------------------------------------------------------
    def _col(self, name):
        return self.schema_.columns.index(name)

    def _ops_of(self, Z) -> np.ndarray:
        """Each row's op (from the op_* columns), "" where none is set."""
        onehot = np.nan_to_num(Z[:, [self._col(f"op_{op}") for op in OPS]])
        ops = np.array(OPS, dtype=object)[np.argmax(onehot, axis=1)]
        ops[~(onehot.max(axis=1) == 1.0)] = ""
        return ops

    def _route(self, models, Z) -> np.ndarray:
        """The (log) targets of Z's rows from ``models`` ({key: (run, prepare) regressors or
        forests}): a row's op's own where it has them, else the ones fitted on every op."""
        T = np.zeros((len(Z), 2))
        own = self._ops_of(Z) if len(models) > 1 else np.full(len(Z), "", dtype=object)
        pooled = ~np.isin(own, [op for op in models if op != ALL_OPS])
        for key, rows in [(ALL_OPS, pooled)] + [(op, own == op) for op in models if op != ALL_OPS]:
            for col, model in enumerate(models[key]):
                if rows.any():
                    T[rows, col] = model.predict(Z[rows])
        return T

    def _compiled(self) -> tuple:
        """What :meth:`predict_z` reads that depends on the model alone, made once: the
        :class:`~.learned_forest.Stack` of every forest (ALL_OPS's pair first), each op's pair in it,
        the op and analytic columns, and the kernel columns and seconds of the fixed prepare times.
        Remade when fitting replaces ``forests_``, ``schema_`` or ``fixed_prepare_``."""
        parts = (self.forests_, self.schema_, self.fixed_prepare_)
        got = self.__dict__.get("_compiled_")
        if got is None or any(a is not b for a, b in zip(got[0], parts)):
            keys = [ALL_OPS] + sorted(k for k in self.forests_ if k != ALL_OPS)
            index = {c: i for i, c in enumerate(self.schema_.columns)}
            fixed = [(index[f"kernel:{k}"], s) for k, s in self.fixed_prepare_.items() if f"kernel:{k}" in index]
            got = (parts, Stack([f for key in keys for f in self.forests_[key]]),
                   np.array([keys.index(op) if op in keys else 0 for op in OPS], dtype=np.intp),
                   [index[f"op_{op}"] for op in OPS],
                   [index["log_analytic_run"], index["log_analytic_prepare"]] if self.kind == "combined" else None,
                   np.array([c for c, _ in fixed], dtype=np.intp), np.array([s for _, s in fixed]))
            self.__dict__["_compiled_"] = got
        return got

    def _analytic_cols(self, Z):
        return Z[:, [self._col("log_analytic_run"), self._col("log_analytic_prepare")]]

    # -- predicting -------------------------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "forests_"):
            raise RuntimeError("this LearnedCostModel is not fitted yet; call fit(X, y) first")

    @property
    def kernels_(self) -> tuple:
        return self.schema_.kernels

    def knows(self, kernel: str) -> bool:
        """Whether ``kernel`` was in the training data (others keep their analytic cost)."""
        self._check_fitted()
        return kernel in self.schema_.kernels

    def predict(self, X) -> np.ndarray:
        """(n, 2) seconds (run, prepare) of a sequence of :class:`~.learned_features.Query`."""
        self._check_fitted()
        X = list(X)
        if not X:
            return np.zeros((0, 2))
        return self.predict_z(self.schema_.transform(X))

    def predict_z(self, Z) -> np.ndarray:
        """(n, 2) seconds of rows already transformed by the schema: every forest predicts every
        row in one :class:`~.learned_forest.Stack` (cheaper than asking each its rows), and each
        row keeps its op's pair (else ALL_OPS's) and, for a kernel whose prepare time is a
        constant, that constant."""
        _, stack, own, op_cols, analytic, fixed_cols, fixed_s = self._compiled()
        Z = np.asarray(Z, dtype=np.float64)
        n = len(Z)
        if n == 0:
            return np.zeros((0, 2))
        P = stack.predict(Z)
        if P.shape[1] == 2:
            T = P
        else:     # the row's op's pair where it has one (one-hot op columns), else ALL_OPS's
            onehot = np.nan_to_num(Z[:, op_cols])
            key = np.where(onehot.max(axis=1) == 1.0, own[np.argmax(onehot, axis=1)], 0)
            T = P[np.arange(n)[:, None], 2 * key[:, None] + np.arange(2)]
        if analytic is not None:
            T = T + Z[:, analytic]
        out = np.exp(T)
        if len(fixed_cols):
            hit = Z[:, fixed_cols] == 1.0
            rows, which = np.nonzero(hit)
            out[rows, 1] = fixed_s[which]
        return out

    def _targets(self, Z, y):
        """What the forests fit: log time, less the analytic prediction's log for 'combined'."""
        t = log_floor(y)
        return t - self._analytic_cols(Z) if self.kind == "combined" else t

    def describe(self) -> str:
        """Which model and how confident: the sentence plans quote."""
        self._check_fitted()
        meta = self.metadata_
        v = self.validation_
        conf = (f"validation ({v['method']}): median error x{v['run_median_factor']:.2f}, "
                f"90% within x{v['run_p90_factor']:.2f}" if v else "no validation error recorded")
        return (f"learned model '{meta.get('name', 'unsaved')}' ({self.kind}, {meta.get('device_class', '?')}, "
                f"{self.n_samples_} timings; {conf})")


__all__ = ["CostModel", "KINDS", "TARGETS", "ALL_OPS"]
