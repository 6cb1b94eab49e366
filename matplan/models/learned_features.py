"""The learned cost model's inputs: one :class:`Query` per candidate and its feature vector.

A query carries what the model cannot compute itself: the analytic model's prediction (a feature
of the combined model) and whether the kernel's ``prepare`` keeps A's own arrays. The caller that
knows the kernels (the planner, tuning_db's dataset) fills them in, so the models never import
the kernels. :class:`FeatureSchema` fixes the ordered columns a model was fitted on.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math

import numpy as np

from ..core.types import Cost

#: Bumped when the feature vector changes; a model with another schema version is refused.
FEATURE_SCHEMA_VERSION = 3
#: Times are floored here before taking logs (a no-op format conversion measures ~0).
TIME_FLOOR_S = 1e-7
OPS = ("spmv", "spmm", "spgemm", "sptrans", "tsgemm", "gemm")
#: Features checked for extrapolation: a query outside the training range gets a low-confidence note.
RANGE_CHECKED = ("log2_m", "log2_nnz", "log2_k", "log2_row_max")
#: Entries a schema keeps of what transform looks up (base feature names, candidates' cells).
_KEPT = 1024


@dataclasses.dataclass(frozen=True)
class Query:
    """One candidate to predict: the problem's features, the kernel, its params and the device.

    ``analytic``: the kernel's analytic Cost for it (``Kernel.cost``), which the combined model
    reads; ``reads_a_at_run``: the kernel's flag of that name (its prepare converts nothing).
    """
    features: object             # core.features.Features
    kernel: str
    params: dict
    device: object               # core.device.DeviceSpec
    analytic: Cost | None = None
    reads_a_at_run: bool = False


def _l2(x) -> float:
    return math.log2(float(x) + 1.0)


_OP_COLUMNS = tuple((f"op_{op}", op) for op in OPS)
_RBS_COLUMNS = tuple(f"rbs_group{i}_frac" for i in range(6))


#: (device, dtype, index dtype) -> what base_features reads of them, by the device's id (checked).
_DEVICE_PARTS: dict = {}


def _device_part(dev, dtype: str, index_dtype: str) -> tuple:
    """(itemsize, index size, t2threshold, log2 bandwidth, log2 peak FLOP/s): the part of the base
    features a plan's device and dtypes fix, worked out once for each."""
    key = (id(dev), dtype, index_dtype)
    got = _DEVICE_PARTS.get(key)
    if got is None or got[0] is not dev:
        part = (np.dtype(dtype).itemsize, np.dtype(index_dtype).itemsize if index_dtype else 0, dev.t2threshold(dtype),
                # quantised: a per-process bandwidth measurement must not move a model's input
                round(math.log2(dev.mem_bandwidth) * 4) / 4, math.log2(dev.peak_flops(dtype)))
        if len(_DEVICE_PARTS) >= 64:
            _DEVICE_PARTS.clear()
        got = _DEVICE_PARTS[key] = (dev, part)
    return got[1]


#: The op_* columns' values of each op.
_ONE_HOT = {op: tuple(float(op == o) for o in OPS) for op in OPS}
#: The base features' names, in the order of :func:`base_values` (and of a fitted schema's columns).
BASE_COLUMNS = tuple(name for name, _ in _OP_COLUMNS) + (
    "itemsize", "index_size", "log2_m", "log2_n", "log2_k", "log2_nnz", "log10_density",
    "row_mean", "row_std", "row_cv", "log2_row_max", "row_min", "empty_frac",
    "T", "log2_warp_before", "log2_warp_after", "warp_ratio", "log2_nnz_b", "log2_products",
    "log2_rowct_mean", "log2_rowct_max", "log_rowct_var_over_mean", "log2_compression", "col_spread",
    "layout_F", "k_over_t2", "log2_bandwidth", "sms", "log2_peak_flops") + _RBS_COLUMNS


def base_values(f, dev) -> list:
    """The values of :data:`BASE_COLUMNS` for the problem and the device, in that order (a plan
    reads them as a list: no dict to build)."""
    itemsize, index_size, t2, log2_bandwidth, log2_peak_flops = _device_part(dev, f.dtype, f.index_dtype)
    groups = list(f.rbs_groups) + [0] * (6 - len(f.rbs_groups))
    m = max(f.m, 1)
    op, l2 = f.op, math.log2   # _l2 inline: l2(float(x) + 1.0), one call fewer a feature
    return [*(_ONE_HOT.get(op) or [float(op == o) for o in OPS]),
            itemsize, index_size, l2(float(f.m) + 1.0), l2(float(f.n) + 1.0), l2(float(f.k) + 1.0),
            l2(float(f.nnz) + 1.0), math.log10(f.density + 1e-12),
            f.row_mean, f.row_std, f.row_std / f.row_mean if f.row_mean else 0.0,
            l2(float(f.row_max) + 1.0), f.row_min, f.empty_rows / m,
            f.T, l2(float(f.warp_len_before) + 1.0), l2(float(f.warp_len_after) + 1.0), f.warp_ratio,
            l2(float(f.nnz_b) + 1.0), l2(float(f.products) + 1.0), l2(float(f.rowct_mean) + 1.0),
            l2(float(f.rowct_max) + 1.0), math.log1p(f.rowct_var_over_mean), l2(float(f.compression) + 1.0),
            f.col_spread, float(f.layout == "F"), f.k / t2 if t2 > 0 else 0.0,
            log2_bandwidth, dev.sms, log2_peak_flops] + [g / m for g in groups[:6]]


#: Each base feature's place in :data:`BASE_COLUMNS`.
_BASE_AT = {name: i for i, name in enumerate(BASE_COLUMNS)}


def base_features(f, dev) -> dict:
    """Numeric features of the problem and the device (the same for every candidate), by name."""
    return dict(zip(BASE_COLUMNS, base_values(f, dev)))


def _param_items(kernel: str, params: dict):
    """(column, value) of each parameter: numbers as they are, booleans 0/1, strings one-hot."""
    for name, value in sorted(params.items()):
        col = f"param:{kernel}.{name}"
        if isinstance(value, bool):
            yield col, float(value)
        elif isinstance(value, (int, float)):
            yield col, float(value)
        else:
            yield f"{col}={json.dumps(value, sort_keys=True)}", 1.0


def _analytic(q: Query) -> Cost:
    if q.analytic is None:
        raise ValueError(f"Query for {q.kernel} {q.params}: no analytic Cost, which the combined model reads; "
                         "pass analytic=kernel.cost(features, params, device)")
    return q.analytic


def log_floor(x) -> np.ndarray:
    """log of seconds, floored at TIME_FLOOR_S (a new array: ``x`` is copied, then worked in place)."""
    out = np.array(x, dtype=np.float64)
    np.maximum(out, TIME_FLOOR_S, out=out)
    np.log(out, out=out)
    return out if out.ndim else out[()]   # a scalar for a scalar, as the ufuncs give


@dataclasses.dataclass(frozen=True)
class FeatureSchema:
    """The ordered feature columns a model was fitted on, and the training range of a few."""
    columns: tuple
    kernels: tuple
    ranges: dict
    version: int = FEATURE_SCHEMA_VERSION

    @classmethod
    def fit(cls, queries, analytic: bool = True) -> "FeatureSchema":
        """The columns of ``queries``; with ``analytic`` the analytic model's log times are features too."""
        base = list(base_features(queries[0].features, queries[0].device))
        kernels = sorted({q.kernel for q in queries})
        params = sorted({col for q in queries for col, _ in _param_items(q.kernel, q.params)})
        cols = (base + [f"kernel:{k}" for k in kernels] + params
                + (["log_analytic_run", "log_analytic_prepare"] if analytic else []))
        schema = cls(tuple(cols), tuple(kernels), {})
        X = schema.transform(queries)
        ranges = {c: (float(X[:, cols.index(c)].min()), float(X[:, cols.index(c)].max()))
                  for c in RANGE_CHECKED}
        return cls(tuple(cols), tuple(kernels), ranges)

    @functools.cached_property
    def _index(self) -> dict:
        """column -> position (made once per schema: transform runs at every plan)."""
        return {c: i for i, c in enumerate(self.columns)}

    @functools.cached_property
    def _kept(self) -> dict:
        """What transform looks up again at every plan, by what it depends on (bounded): the
        positions of the base features' names and each (kernel, params)'s (positions, values)."""
        return {}

    @functools.cached_property
    def _base_positions(self) -> np.ndarray:
        """The positions of :data:`BASE_COLUMNS` (KeyError naming one the schema lacks)."""
        return self._base_cols(BASE_COLUMNS)

    def _base_cols(self, names: tuple) -> np.ndarray:
        kept = self._kept
        got = kept.get(names)
        if got is None:
            got = np.array([self._index[c] for c in names], dtype=np.intp)
            if len(kept) < _KEPT:
                kept[names] = got
        return got

    def _candidate_cells(self, kernel: str, params: dict) -> tuple:
        """(positions, values) of a candidate's own cells: its kernel's one-hot and its params."""
        try:
            key = (kernel, tuple(sorted(params.items())))
            hash(key)
        except TypeError:          # a list or dict among the params: worked out each time
            key = None
        got = self._kept.get(key) if key is not None else None
        if got is None:
            index = self._index
            cells = [(index[f"kernel:{kernel}"], 1.0)] if f"kernel:{kernel}" in index else []
            cells += [(index[c], v) for c, v in _param_items(kernel, params) if c in index]
            got = (np.array([c for c, _ in cells], dtype=np.intp), np.array([v for _, v in cells], dtype=np.float64))
            if key is not None and len(self._kept) < _KEPT:
                self._kept[key] = got
        return got

    def outside_base(self, values: list) -> list:
        """:meth:`outside` of a row whose base features are ``values`` (:func:`base_values`' list;
        the range-checked features are base features: the same test on the same values)."""
        return [c for c, i, lo, hi in self._base_ranges if (v := float(values[i])) < lo - 1e-9 or v > hi + 1e-9]

    @functools.cached_property
    def _base_ranges(self) -> tuple:
        """(name, place in BASE_COLUMNS, low, high) of each range-checked feature, in ``ranges`` order."""
        return tuple((c, _BASE_AT[c], lo, hi) for c, (lo, hi) in self.ranges.items())

    def candidate_rows(self, cells) -> np.ndarray:
        """(len(cells), columns) of [(kernel, params)]: each candidate's own cells as :meth:`transform`
        writes them (every kernel's one-hot, its params), NaN where the problem's features go."""
        X = np.full((len(cells), len(self.columns)), np.nan)
        X[:, self._base_cols(tuple(f"kernel:{k}" for k in self.kernels))] = 0.0
        for r, (kernel, params) in enumerate(cells):
            cols, values = self._candidate_cells(kernel, params)
            X[r, cols] = values
        return X

    def transform(self, queries) -> np.ndarray:
        index = self._index
        X = np.full((len(queries), len(self.columns)), np.nan)
        X[:, self._base_cols(tuple(f"kernel:{k}" for k in self.kernels))] = 0.0
        base_rows: dict = {}   # queries of one problem share its base features: one row, copied
        for r, q in enumerate(queries):
            key = id(q.features), id(q.device)
            if key not in base_rows:
                base = base_features(q.features, q.device)
                base_rows[key] = (self._base_cols(tuple(base)), np.fromiter(base.values(), np.float64, len(base)))
            cols, values = base_rows[key]
            X[r, cols] = values
            cols, values = self._candidate_cells(q.kernel, q.params)
            X[r, cols] = values
        if "log_analytic_run" in index:
            costs = [_analytic(q) for q in queries]
            X[:, index["log_analytic_run"]] = log_floor([a.run_s for a in costs])
            X[:, index["log_analytic_prepare"]] = log_floor([a.prepare_s for a in costs])
        return X

    def outside(self, row: np.ndarray) -> list:
        """Range-checked features of one transformed row that lie outside the training range."""
        out = []
        for c, (lo, hi) in self.ranges.items():
            v = row[self._index[c]]
            if v < lo - 1e-9 or v > hi + 1e-9:
                out.append(c)
        return out

    def to_dict(self) -> dict:
        return {"version": self.version, "columns": list(self.columns), "kernels": list(self.kernels),
                "ranges": {k: list(v) for k, v in self.ranges.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureSchema":
        """The schema :meth:`to_dict` wrote; ValueError naming what is missing or malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"feature_schema: expected an object, got {type(d).__name__}")
        if d.get("version") != FEATURE_SCHEMA_VERSION:
            raise ValueError(f"feature schema {d.get('version')}, this matplan computes schema "
                             f"{FEATURE_SCHEMA_VERSION}")
        columns, kernels, ranges = d.get("columns"), d.get("kernels"), d.get("ranges")
        if not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)
                and len(set(columns)) == len(columns)):
            raise ValueError("feature_schema.columns: expected a list of distinct names")
        if not (isinstance(kernels, list) and all(isinstance(k, str) for k in kernels)):
            raise ValueError("feature_schema.kernels: expected a list of kernel names")
        needed = [f"op_{op}" for op in OPS] + list(RANGE_CHECKED) + [f"kernel:{k}" for k in kernels]
        absent = [c for c in needed if c not in columns]
        if absent:
            raise ValueError(f"feature_schema.columns: missing {', '.join(absent)}")
        if not (isinstance(ranges, dict) and set(ranges) == set(RANGE_CHECKED)
                and all(isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)
                        for v in ranges.values())):
            raise ValueError(f"feature_schema.ranges: expected [low, high] of each of {', '.join(RANGE_CHECKED)}")
        return cls(tuple(columns), tuple(kernels), {c: (float(lo), float(hi)) for c, (lo, hi) in ranges.items()})


__all__ = ["Query", "FeatureSchema", "base_features", "base_values", "BASE_COLUMNS", "log_floor",
           "FEATURE_SCHEMA_VERSION", "TIME_FLOOR_S", "OPS", "RANGE_CHECKED"]
