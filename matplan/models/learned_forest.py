"""Gradient-boosted regression trees as plain arrays, predicted with NumPy.

A fitted scikit-learn ``HistGradientBoostingRegressor`` is exported once, where the model is
trained (:func:`export_hgb`), to seven arrays of numbers. Reading them back needs no pickle
(``np.load(..., allow_pickle=False)``) and predicting needs NumPy only, so a saved model runs no
code when loaded and planning does not import scikit-learn. :meth:`Forest.predict` walks every
tree for every row at once, one level per step, and adds the leaves in scikit-learn's order, so
it gives ``predict``'s numbers to the last bit (tests/models/test_learned_files.py checks it).
"""
from __future__ import annotations

import dataclasses

import numpy as np

#: The arrays of a forest, as saved.
ARRAYS = ("feature", "threshold", "missing_left", "left", "right", "value", "roots", "baseline")
_INTS = ("feature", "left", "right", "roots")


@dataclasses.dataclass(frozen=True, eq=False)
class Forest:
    """The nodes of every tree in flat arrays; a leaf's children are itself.

    Node arrays: ``feature`` (column split on), ``threshold`` (go left when x <= it),
    ``missing_left`` (NaN goes left), ``left`` / ``right`` (node indices), ``value`` (a leaf's
    contribution). ``roots``: each tree's first node. ``baseline``: the constant the trees add to.
    """
    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    roots: np.ndarray
    baseline: float
    depth: int

    @classmethod
    def from_arrays(cls, arrays, n_features: int) -> "Forest":
        """A forest from saved arrays, checked so that no index can fall outside them (else ValueError)."""
        missing = [name for name in ARRAYS if name not in arrays]
        if missing:
            raise ValueError(f"forest arrays missing: {', '.join(missing)}")
        a = {name: np.asarray(arrays[name]) for name in ARRAYS}
        for name in _INTS:
            if a[name].dtype.kind not in "iu":
                raise ValueError(f"forest array {name}: expected integers, got {a[name].dtype}")
        for name in ("threshold", "value", "baseline"):
            if a[name].dtype.kind != "f":
                raise ValueError(f"forest array {name}: expected floats, got {a[name].dtype}")
        if a["missing_left"].dtype.kind != "b":
            raise ValueError(f"forest array missing_left: expected booleans, got {a['missing_left'].dtype}")
        n = len(a["value"]) if a["value"].ndim == 1 else -1
        if n < 1 or any(a[name].shape != (n,) for name in ARRAYS[:6]):
            raise ValueError("forest node arrays: expected equal lengths of at least 1, got shapes "
                             + ", ".join(f"{name} {a[name].shape}" for name in ARRAYS[:6]))
        if a["roots"].ndim != 1 or len(a["roots"]) < 1 or a["baseline"].shape != ():
            raise ValueError(f"forest: expected a list of roots and one baseline, got shapes "
                             f"{a['roots'].shape} and {a['baseline'].shape}")
        for name in ("left", "right", "roots"):
            if a[name].min() < 0 or a[name].max() >= n:
                raise ValueError(f"forest array {name}: node index outside 0..{n - 1}")
        if a["feature"].min() < 0 or a["feature"].max() >= n_features:
            raise ValueError(f"forest array feature: column outside 0..{n_features - 1}")
        if not (np.all(np.isfinite(a["value"])) and np.isfinite(a["baseline"])
                and not np.any(np.isnan(a["threshold"]))):
            raise ValueError("forest: non-finite leaf value, baseline or NaN threshold")
        here = np.arange(n)
        left, right = a["left"].astype(np.intp), a["right"].astype(np.intp)
        if np.any((left == here) != (right == here)):
            raise ValueError("forest: a node is its own child on one side only")
        return cls(a["feature"].astype(np.intp), a["threshold"].astype(np.float64),
                   a["missing_left"].astype(bool), left, right, a["value"].astype(np.float64),
                   a["roots"].astype(np.intp), float(a["baseline"]), _depth(left, right, a["roots"]))

    def to_arrays(self) -> dict:
        """The arrays to save (indices as int32: a forest has far fewer than 2**31 nodes)."""
        return {"feature": self.feature.astype(np.int32), "threshold": self.threshold,
                "missing_left": self.missing_left, "left": self.left.astype(np.int32),
                "right": self.right.astype(np.int32), "value": self.value,
                "roots": self.roots.astype(np.int32), "baseline": np.float64(self.baseline)}

    @property
    def n_trees(self) -> int:
        return len(self.roots)

    def predict(self, X) -> np.ndarray:
        """The baseline plus each tree's leaf for every row of ``X`` (rows x features, NaN = missing).

        Every (row, tree) steps down one level at a time: node i is kept as 2 i, so its two
        children sit at 2 i and 2 i + 1 of one array and the comparison picks one by adding 0 or
        1. A node sends NaN left or right: x <= t is false for NaN (right), and nodes that send it
        left read a copy of X with NaN as -inf (always <= t)."""
        X = np.asarray(X, dtype=np.float64)
        R, C = X.shape
        col, thr, child, value = self._walk(C)
        j, off = self._start(R, C)
        Xc = np.concatenate([X, np.where(np.isnan(X), -np.inf, X)], axis=1).ravel()
        T = len(self.roots)
        for _ in range(self.depth):   # fancy indexing: about twice as fast as take on these sizes
            c = col[j]
            c += off
            j = child[j + (Xc[c] <= thr[j])]
        # added one tree after another from the baseline, as scikit-learn does: the same rounding
        terms = np.empty((R, T + 1))
        terms[:, 0] = self.baseline
        terms[:, 1:] = value[j].reshape(R, T)
        return np.cumsum(terms, axis=1)[:, -1]

    def _start(self, n_rows: int, n_columns: int) -> tuple:
        """(each (row, tree)'s root as 2 root, the row's offset in the flattened [X, X]) for
        ``n_rows`` x ``n_columns`` X, row-major; kept for the few row counts plans meet (read only)."""
        kept = self.__dict__.setdefault("_starts", {})
        got = kept.get((n_rows, n_columns))
        if got is None:
            T = len(self.roots)
            got = (np.tile(2 * self.roots, n_rows), np.repeat(np.arange(n_rows, dtype=np.intp) * (2 * n_columns), T))
            if len(kept) < 16:
                kept[(n_rows, n_columns)] = got
        return got

    def _walk(self, n_columns: int) -> tuple:
        """The node arrays of :meth:`predict` for X of ``n_columns`` columns (made once each): at
        2 i and 2 i + 1 node i's column in [X, X with NaN as -inf], its threshold and value, and
        its right and left child (as 2 child)."""
        kept = self.__dict__.setdefault("_walks", {})   # a cache, not a field (eq=False: no hash of it)
        got = kept.get(n_columns)
        if got is None:
            col = self.feature + n_columns * self.missing_left.astype(np.intp)
            got = kept[n_columns] = (np.repeat(col, 2), np.repeat(self.threshold, 2),
                                     2 * np.stack([self.right, self.left], axis=1).ravel(), np.repeat(self.value, 2))
        return got


def _depth(left, right, roots) -> int:
    """Levels from the roots to the deepest leaf; ValueError when the children form a cycle."""
    frontier = np.unique(roots)
    for depth in range(len(left) + 1):
        inner = frontier[left[frontier] != frontier]
        if not len(inner):
            return depth
        frontier = np.unique(np.concatenate([left[inner], right[inner]]))
    raise ValueError("forest: the nodes' children form a cycle")


def export_hgb(hgb, n_features: int | None = None) -> Forest:
    """The trees of a fitted ``HistGradientBoostingRegressor`` (squared error, numeric features).

    Reads scikit-learn's fitted predictors (``_predictors``' TreePredictor ``nodes`` and
    ``_baseline_prediction``); raises ValueError for anything else this walk does not reproduce
    (categorical splits, several trees per iteration, another loss).
    """
    if getattr(hgb, "loss", None) != "squared_error":
        raise ValueError(f"only the squared-error loss is exported, got {getattr(hgb, 'loss', None)!r}")
    categorical = getattr(hgb, "is_categorical_", None)
    if getattr(hgb, "_preprocessor", None) is not None or (categorical is not None and np.any(categorical)):
        raise ValueError("categorical features are not exported")
    predictors = hgb._predictors
    if any(len(p) != 1 for p in predictors):
        raise ValueError("one tree per iteration expected")
    trees = [p[0].nodes for p in predictors]
    if any(np.any(t["is_categorical"]) for t in trees):
        raise ValueError("categorical splits are not exported")
    sizes = np.array([len(t) for t in trees])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
    nodes = np.concatenate(trees)
    shift = np.repeat(offsets, sizes)
    leaf = nodes["is_leaf"].astype(bool)
    here = np.arange(len(nodes), dtype=np.intp)
    baseline = np.ravel(hgb._baseline_prediction)
    if baseline.shape != (1,):
        raise ValueError(f"one baseline expected, got {baseline.shape}")
    # leaves point to themselves and never go left on NaN, so every row can take `depth` steps
    arrays = {"feature": np.where(leaf, 0, nodes["feature_idx"]).astype(np.intp),
              "threshold": np.where(leaf, np.inf, nodes["num_threshold"]).astype(np.float64),
              "missing_left": nodes["missing_go_to_left"].astype(bool) & ~leaf,
              "left": np.where(leaf, here, nodes["left"].astype(np.intp) + shift),
              "right": np.where(leaf, here, nodes["right"].astype(np.intp) + shift),
              "value": nodes["value"].astype(np.float64), "roots": offsets,
              "baseline": np.float64(baseline[0])}
    return Forest.from_arrays(arrays, int(n_features if n_features is not None else hgb.n_features_in_))


__all__ = ["Forest", "export_hgb", "ARRAYS"]
