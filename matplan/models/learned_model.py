"""A fitted learned cost model: what it needs to predict, and prediction with NumPy only.

:class:`CostModel` holds the feature schema, the forests (run and prepare; one pair fitted on every
op, ``"*"``, and with ``per_op`` a pair of its own for some ops) and the fixed prepare times. Both
a model just fitted (:class:`~.learned_fit.LearnedCostModel`, a subclass) and one read from disk
(:func:`~.learned_files.load_file`) are CostModels, so they predict the same numbers.
"""
from __future__ import annotations

import operator

import numpy as np

from ..core.cache import BoundedCache
from .learned_features import OPS, TIME_FLOOR_S, FeatureSchema, base_values, log_floor
from .learned_forest import Stack

KINDS = ("combined", "learned")
#: The two predicted times, in the order of a prediction's columns.
TARGETS = ("run", "prepare")
#: The key of the forests fitted on every op.
ALL_OPS = "*"
#: What :meth:`CostModel.predict_problem` keeps of a candidate list (its rows' own cells and the
#: leaf masks they select), by model and candidates: a plan's candidates depend on few statistics.
_TEMPLATES = BoundedCache("learned scoring templates", maxsize=256, maxbytes=32 << 20,
                          sizeof=lambda t: t.nbytes)


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
        got = self.__dict__.get("_compiled_")
        if got is not None and (got[0][0] is self.forests_ and got[0][1] is self.schema_
                                and got[0][2] is self.fixed_prepare_):
            return got
        parts = (self.forests_, self.schema_, self.fixed_prepare_)
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

    def known_kernels(self) -> frozenset:
        """The kernels :meth:`knows`, as a set (made once per schema: the planner asks at every plan)."""
        self._check_fitted()
        got = self.__dict__.get("_known_")
        if got is None or got[0] is not self.schema_:
            got = self.__dict__["_known_"] = (self.schema_, frozenset(self.schema_.kernels))
        return got[1]

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

    def predict_problem(self, features, device, cells, analytic) -> tuple:
        """(range-checked features outside the training range, (n, 2) seconds or None when there are
        any) of one problem's candidates: ``cells`` [(kernel, params)], ``analytic`` their analytic
        Costs. :meth:`predict_z` of what :meth:`FeatureSchema.transform` makes of their Queries, to
        the last bit, cheaper: what depends on the candidates alone (their cells, the leaf masks
        those cells select, the fixed prepare times, the lookup of the tested columns) is kept per
        candidate list (:class:`_Template`), so a plan looks up the problem's base features once
        and each candidate's two analytic times."""
        self._check_fitted()
        if any(a is None for a in analytic):
            raise ValueError(f"no analytic Cost for {cells[[a is None for a in analytic].index(True)]}, which "
                             "the combined model reads; pass analytic=kernel.cost(features, params, device)")
        compiled = self._compiled()
        schema = self.schema_
        base = base_values(features, device)
        outside = schema.outside_base(base)
        if outside or not cells:
            return outside, None if outside else np.zeros((0, 2))
        tpl = _template(self, compiled, schema._base_positions, cells)
        n = len(cells)
        logs = times = None
        if tpl.analytic is not None:   # run times, then prepare times: log_floor's numbers, one array fewer
            times = [a.run_s for a in analytic] + [a.prepare_s for a in analytic]
            logs = np.maximum(times, TIME_FLOOR_S)
            np.log(logs, out=logs)
        # a NaN (missing value) among the base features or analytic times makes their sum NaN (as do
        # infinities of both signs): such rows, and stacks without leaf masks (trees past 64 leaves),
        # take the rows as transform makes them
        total = sum(base) + (sum(times) if times is not None else 0.0)
        if tpl.tmask is None or total != total:
            Z = tpl.X.copy()
            Z[:, schema._base_positions] = base
            if logs is not None:
                Z[:, tpl.analytic] = logs.reshape(2, n).T
            return outside, self.predict_z(Z)
        stack, nb = compiled[1], tpl.nb
        query = tpl.query.copy()   # the tested columns' numbers, then their values: Stack.rows_of's search
        part = query.imag
        part[:nb] = tpl.pick(base)
        if len(tpl.timed) == 2:
            part[nb:] = logs
        elif tpl.timed:
            part[nb:] = logs[tpl.timed[0] * n:(tpl.timed[0] + 1) * n]
        rows = stack.row_keys.searchsorted(query)   # no NaN here: the table's rows, as Stack.rows_of finds them
        shared = rows[:nb]
        shared = shared[stack.partial[shared]]   # the base features' rows that rule out a leaf
        # take: about half the time of indexing rows by an array
        masks = (tpl.tmask & np.bitwise_and.reduce(stack.table.take(shared, axis=0), axis=0) if len(shared)
                 else tpl.tmask.copy())
        if tpl.timed:   # each candidate's own analytic times
            looked = stack.table.take(rows[nb:], axis=0)
            masks &= looked[:n]
            if len(tpl.timed) == 2:
                masks &= looked[n:]
        P = stack.from_masks(masks)
        if P.shape[1] == 2:
            T = P
        else:     # every row is the problem's op: its pair where it has one (as predict_z routes)
            onehot = base[:len(OPS)]   # BASE_COLUMNS opens with the op_* columns, in OPS order
            key = int(compiled[2][onehot.index(max(onehot))]) if max(onehot) == 1.0 else 0
            T = P[:, 2 * key: 2 * key + 2]
        if compiled[4] is not None:
            T = T + logs.reshape(2, n).T
            out = np.exp(T, out=T)    # T is new here: the same numbers, no second array
        else:
            out = np.exp(T)
        if len(tpl.fixed_rows):
            out[tpl.fixed_rows, 1] = tpl.fixed_s
        return outside, out

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


class _Template:
    """What :meth:`CostModel.predict_problem` reads of one candidate list: its rows' own cells
    (``X``, NaN where the problem's features go), the fixed prepare times' rows, and for the leaf
    masks: the base features the trees test (``take``: their places among the base values), the
    analytic times' columns (``analytic``, None for a model that reads none) and those the trees
    test (``timed``: 0 run, 1 prepare), what :meth:`Stack.rows_of` needs to look those up
    (``lookup``; ``query``: their column numbers as the real parts of the search keys, ``pick``: the
    tested values off the base values' list) and the AND of the masks the candidates' own cells
    select (``tmask``; None where the stack has no leaf masks)."""

    def __init__(self, model, compiled, base_cols, cells):
        _, stack, _, _, _, fixed_cols, fixed_s = compiled
        self.stack = stack   # the key holds its id: kept so that the id is not reused
        index = model.schema_._index   # the analytic times' columns, which transform fills where present
        analytic = self.analytic = ([index["log_analytic_run"], index["log_analytic_prepare"]]
                                    if "log_analytic_run" in index else None)
        self.X = model.schema_.candidate_rows(cells)
        self.fixed_rows, which = np.nonzero(self.X[:, fixed_cols] == 1.0)
        self.fixed_s = fixed_s[which]
        self.timed = []
        self.tmask = None
        self.nbytes = self.X.nbytes
        if stack.mask is None or not len(stack.cols):
            return
        n = len(cells)
        tested = np.zeros(len(model.schema_.columns), dtype=bool)
        tested[stack.cols] = True
        base_slots = stack.slots(base_cols)
        self.take = np.flatnonzero(base_slots >= 0)
        an_slots = stack.slots(analytic) if analytic is not None else np.zeros(0, dtype=np.intp)
        self.timed = [t for t in range(len(an_slots)) if an_slots[t] >= 0]
        self.lookup = stack.lookup(np.concatenate([base_slots[self.take]]
                                                  + [np.full(n, an_slots[t]) for t in self.timed]))
        self.nb = len(self.take)
        # the tested base features' values, off the list of all of them (a tuple even for one)
        self.pick = (operator.itemgetter(*self.take.tolist()) if self.nb > 1
                     else lambda values, at=self.take.tolist(): [values[i] for i in at])
        self.query = np.zeros(len(self.lookup[0]), dtype=np.complex128)
        self.query.real = self.lookup[0]
        tested[base_cols] = False
        if analytic is not None:
            tested[analytic] = False
        cols = np.flatnonzero(tested)     # the tested columns the candidates' cells fill (or leave NaN)
        if len(cols):
            rows = stack.rows_of(stack.lookup(stack.slots(cols)), self.X[:, cols])
            self.tmask = np.bitwise_and.reduce(stack.table[rows], axis=1)
        else:
            self.tmask = np.full((n, stack.n_trees), stack.full, dtype=stack.mask)
        self.nbytes += self.tmask.nbytes


def _template(model, compiled, base_cols, cells) -> _Template:
    """The kept :class:`_Template` of ``cells`` for ``model``'s compiled stack, made on a miss
    (and not kept where a parameter is unhashable)."""
    # params in the order given: a list that orders them otherwise only misses, never mismatches; the
    # stack is made anew with the schema (CostModel._compiled), so its id stands for base_cols too
    key = (id(compiled[1]), tuple([(k, tuple(p.items())) for k, p in cells]))
    try:
        got = _TEMPLATES.get_fast(key)   # no lock: a template is put whole
    except TypeError:
        return _Template(model, compiled, base_cols, cells)
    if got is None or got.stack is not compiled[1]:
        got = _Template(model, compiled, base_cols, cells)
        _TEMPLATES.put(key, got)
    return got


__all__ = ["CostModel", "KINDS", "TARGETS", "ALL_OPS"]
