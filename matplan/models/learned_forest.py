"""Gradient-boosted regression trees as plain arrays, predicted with NumPy.

A fitted scikit-learn ``HistGradientBoostingRegressor`` is exported once, where the model is
trained (:func:`export_hgb`), to seven arrays of numbers. Reading them back needs no pickle
(``np.load(..., allow_pickle=False)``) and predicting needs NumPy only, so a saved model runs no
code when loaded and planning does not import scikit-learn. :class:`Stack` predicts several
forests at once from per-column tables of leaf masks (QuickScorer), :meth:`Forest.predict_levels`
by walking every tree one level per step (for trees of more than 64 leaves, and to check the
stack against); both add the leaves in scikit-learn's order, so they give ``predict``'s numbers to
the last bit (tests/models/test_learned_files.py and test_learned_stack.py check it).
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
        depth = _depth(left, right, a["roots"])
        inner = left != here
        below = np.concatenate([a["roots"].astype(np.intp), left[inner], right[inner]])
        if len(np.unique(below)) != len(below):   # the leaf masks number each tree's leaves once
            raise ValueError("forest: a node is the child of two nodes, or a root is a child or two trees' root")
        return cls(a["feature"].astype(np.intp), a["threshold"].astype(np.float64),
                   a["missing_left"].astype(bool), left, right, a["value"].astype(np.float64),
                   a["roots"].astype(np.intp), float(a["baseline"]), depth)

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
        """The baseline plus each tree's leaf for every row of ``X`` (rows x features, NaN = missing)."""
        return stack((self,)).predict(X)[:, 0]

    def predict_levels(self, X) -> np.ndarray:
        """:meth:`predict` by stepping every (row, tree) down one level at a time: the general walk,
        for trees of more leaves than a mask holds (:class:`Stack`), and the one it is checked against.

        Node i is kept as 2 i, so its two children sit at 2 i and 2 i + 1 of one array and the
        comparison picks one by adding 0 or 1. A node sends NaN left or right: x <= t is false for
        NaN (right), and nodes that send it left read a copy of X with NaN as -inf (always <= t)."""
        X = _rows(X, int(self.feature.max()) + 1)
        R, C = X.shape
        col, thr, child, value = self._walk(C)
        T = len(self.roots)
        j = np.tile(2 * self.roots, R)
        off = np.repeat(np.arange(R, dtype=np.intp) * (2 * C), T)
        Xc = np.concatenate([X, np.where(np.isnan(X), -np.inf, X)], axis=1).ravel()
        for _ in range(self.depth):   # fancy indexing: about twice as fast as take on these sizes
            c = col[j]
            c += off
            j = child[j + (Xc[c] <= thr[j])]
        # added one tree after another from the baseline, as scikit-learn does: the same rounding
        terms = np.empty((R, T + 1))
        terms[:, 0] = self.baseline
        terms[:, 1:] = value[j].reshape(R, T)
        return np.cumsum(terms, axis=1)[:, -1]

    def _walk(self, n_columns: int) -> tuple:
        """The node arrays of :meth:`predict_levels` for X of ``n_columns`` columns (made once each):
        at 2 i and 2 i + 1 node i's column in [X, X with NaN as -inf], its threshold and value, and
        its right and left child (as 2 child)."""
        kept = self.__dict__.setdefault("_walks", {})   # a cache, not a field (eq=False: no hash of it)
        got = kept.get(n_columns)
        if got is None:
            col = self.feature + n_columns * self.missing_left.astype(np.intp)
            got = kept[n_columns] = (np.repeat(col, 2), np.repeat(self.threshold, 2),
                                     2 * np.stack([self.right, self.left], axis=1).ravel(), np.repeat(self.value, 2))
        return got

    def _shape(self) -> tuple:
        """(each node's tree, -1 where no root reaches it; the in-order rank of its first leaf within
        its tree; the leaves under it): what a leaf mask numbers leaves by (made once, read only)."""
        got = self.__dict__.get("_shapes")
        if got is None:
            n = len(self.left)
            leaf = self.left == np.arange(n)
            below = leaf.astype(np.intp)
            for _ in range(self.depth):        # a node's count is right once its subtree's are
                below = np.where(leaf, 1, below[self.left] + below[self.right])
            tree = np.full(n, -1, dtype=np.intp)
            first = np.zeros(n, dtype=np.intp)
            tree[self.roots] = np.arange(len(self.roots))
            level = self.roots
            for _ in range(self.depth):        # each node has one parent (from_arrays checks it)
                level = level[~leaf[level]]
                left, right = self.left[level], self.right[level]
                first[left], first[right] = first[level], first[level] + below[left]
                tree[left] = tree[right] = tree[level]
                level = np.concatenate([left, right])
            got = self.__dict__["_shapes"] = (tree, first, below)
        return got


#: Mask types by the most leaves a tree of the forests has; more than 64 takes the level walk.
_MASKS = ((32, np.uint32), (64, np.uint64))


def _rows(X, need: int) -> np.ndarray:
    """X as float64 rows, ValueError unless it has the ``need`` columns the forests read."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] < need:
        raise ValueError(f"X: expected rows x at least {need} features, got shape {X.shape}")
    return X


def _sum_trees(leaves) -> np.ndarray:
    """(rows, forests) from leaves (rows x forests x (baseline + trees)): added one tree after
    another from the baseline, as scikit-learn does, so with the same rounding. NumPy adds
    pairwise only along the innermost axis of a reduction: with the trees outermost and the
    rows x forests sums (at least two) innermost, each tree's numbers are added into the running
    sums in tree order. That pass costs about the same for 2 sums as for 16; accumulating each sum
    along its trees costs in proportion to the sums, so up to 6 sums (a problem of 3 candidates and
    one pair of forests) are accumulated."""
    R, F, _ = leaves.shape
    if R * F > 6:
        return np.add.reduce(np.ascontiguousarray(leaves.transpose(2, 0, 1)), axis=0)
    return np.add.accumulate(leaves, axis=2)[:, :, -1]


class Stack:
    """Forests predicted together (QuickScorer, Lucchese et al., SIGIR 2015): for every row, a
    tree's leaf is the leftmost one that no failed test rules out.

    Each tree's leaves are numbered left to right, bit b for leaf b of a mask (bit 31 - b in
    32-bit masks). A node whose test fails (the row goes right) rules out the leaves of its left
    subtree; the leaf a row reaches is never ruled out, and every leaf left of it is (their last
    common node sent the row right), so it is the lowest bit left in the AND of the failed nodes'
    masks (the highest in 32-bit masks, read off the mask's float64 exponent). Which nodes of a
    column fail depends only on how many of the column's thresholds lie below the row's value
    (NaN: the nodes that send NaN right), so ``table`` holds, for each column and each such count,
    the AND over every tree's failed nodes on that column; a row's masks are the AND of one table
    row per column. The columns with one value in all rows (the problem's features, which its candidates
    share) are looked up once. Each forest's baseline is a tree of one leaf before its first, and
    the leaves are added in scikit-learn's order: its numbers to the last bit
    (tests/models/test_learned_files.py). Forests with a tree of more than 64 leaves are
    predicted by :meth:`Forest.predict_levels`.
    """

    def __init__(self, forests):
        self.forests = tuple(forests)
        self.need = max(int(f.feature.max()) for f in self.forests) + 1
        shapes = [f._shape() for f in self.forests]
        widest = max(int(below[f.roots].max()) for f, (_, _, below) in zip(self.forests, shapes))
        self.mask = next((t for most, t in _MASKS if widest <= most), None)
        if self.mask is None:
            return
        # 32-bit masks number leaves from the top bit down: a mask's highest bit is then the leaf
        # reached, which its float64 (exact below 2**53) holds as its exponent with no bit to isolate
        self.high_first = self.mask is np.uint32
        sizes = [f.n_trees + 1 for f in self.forests]     # the baseline, then the trees
        at = np.concatenate([[0], np.cumsum(sizes)]).astype(np.intp)
        # forests of as many trees, added together (None: all of them, in order)
        self.groups = [(k, None if len(k) == len(sizes) else np.concatenate([np.arange(at[i], at[i + 1]) for i in k]))
                       for T in sorted(set(sizes)) for k in [[i for i, n in enumerate(sizes) if n == T]]]
        parts = {name: [] for name in ("col", "thr", "nan_right", "tree", "keep", "ltree", "lrank", "lvalue")}
        for k, (f, (tree, first, below)) in enumerate(zip(self.forests, shapes)):
            here = np.arange(len(f.left))
            inner = (tree >= 0) & (f.left != here)
            leaf = (tree >= 0) & (f.left == here)
            left = f.left[inner]
            # the leaves a failed test rules out: those under its left child (bits first .. first + below - 1,
            # or from the top down in 32-bit masks: 31 - first down to 32 - first - below)
            lowest = (32 - first[left] - below[left] if self.high_first else first[left]).astype(np.uint64)
            ruled = ((np.ones(1, np.uint64) << below[left].astype(np.uint64)) - np.uint64(1)) << lowest
            parts["col"].append(f.feature[inner])
            parts["thr"].append(f.threshold[inner])
            parts["nan_right"].append(~f.missing_left[inner])
            parts["tree"].append(tree[inner] + at[k] + 1)
            parts["keep"].append((~ruled).astype(self.mask))
            parts["ltree"].append(np.concatenate([[at[k]], tree[leaf] + at[k] + 1]))
            parts["lrank"].append(np.concatenate([[0], first[leaf]]))
            parts["lvalue"].append(np.concatenate([[0.0 + f.baseline], f.value[leaf]]))   # 0 + b: as scikit-learn starts
        p = {name: np.concatenate(v) for name, v in parts.items()}
        self.n_trees = int(at[-1])
        width = 32 if self.high_first else int(p["lrank"].max()) + 1
        values = np.zeros((self.n_trees, width))
        values[p["ltree"], 31 - p["lrank"] if self.high_first else p["lrank"]] = p["lvalue"]   # at the leaf's bit
        self.values = values.ravel()
        # each tree's first leaf in ``values``, less the exponent bias of a float64 (see predict)
        self.tree_base = np.arange(self.n_trees, dtype=np.intp) * width - 1023
        self._tables(p)

    def _tables(self, p) -> None:
        """The distinct thresholds of each column, sorted (``keys``: column + 1j threshold, which
        NumPy orders by column, then threshold), and the table of masks by column and count."""
        order = np.lexsort((p["thr"], p["col"]))
        col, thr = p["col"][order], p["thr"][order]
        new = np.ones(len(col), dtype=bool)
        new[1:] = (col[1:] != col[:-1]) | (thr[1:] != thr[:-1])
        test = np.empty(len(col), dtype=np.intp)
        test[order] = np.cumsum(new) - 1           # each node's distinct (column, threshold)
        self.keys = np.empty(int(new.sum()), dtype=np.complex128)
        self.keys.real, self.keys.imag = col[new], thr[new]   # set apart: 1j * inf would be NaN
        self.cols, seg, counts = np.unique(col[new], return_index=True, return_counts=True)
        pos = np.full(self.need, -1, dtype=np.intp)
        pos[self.cols] = np.arange(len(self.cols))
        # column j's rows: base[j] + (its thresholds below the value), then its NaN row; a key's
        # position in ``keys`` is seg[j] + that count, so the row is the position + shift[j]
        self.shift = 2 * np.arange(len(self.cols), dtype=np.intp)
        base = seg + self.shift
        self.nan_row = base + counts + 1
        # ``keys`` with two keys (column, inf) after each column's: a value's place among them is its
        # row (the place among ``keys`` + shift) where it is not NaN, with no shift to add (predict_problem)
        self.row_keys = np.empty(len(self.keys) + 2 * len(self.cols), dtype=np.complex128)
        self.row_keys[np.arange(len(self.keys)) + np.repeat(self.shift, counts)] = self.keys
        for end in (base + counts, base + counts + 1):
            self.row_keys.real[end], self.row_keys.imag[end] = self.cols, np.inf
        at = pos[p["col"]]
        rank = test - seg[at]
        self.full = np.iinfo(self.mask).max
        table = np.full((int(self.nan_row[-1]) + 1 if len(self.cols) else 0, self.n_trees), self.full, dtype=self.mask)
        np.bitwise_and.at(table, (base[at] + rank + 1, p["tree"]), p["keep"])
        right = p["nan_right"]
        np.bitwise_and.at(table, (self.nan_row[at[right]], p["tree"][right]), p["keep"][right])
        for b, c in zip(base, counts):   # a count rules out what every smaller count does
            np.bitwise_and.accumulate(table[b:b + c + 1], axis=0, out=table[b:b + c + 1])
        self.table = table
        # rows that rule out some leaf: a row of all ones (a value below every threshold of its
        # column) changes no AND, and most of a problem's base features look up such rows
        self.partial = (table != self.full).any(axis=1)

    def predict(self, X) -> np.ndarray:
        """(rows, forests): every forest's prediction for every row of ``X`` (NaN = missing)."""
        X = _rows(X, self.need)
        R = len(X)
        if R == 0:
            return np.empty((0, len(self.forests)))
        if self.mask is None:
            return np.stack([f.predict_levels(X) for f in self.forests], axis=1)
        return self.from_masks(self._masks(X))

    def from_masks(self, masks) -> np.ndarray:
        """(rows, forests) from the (rows, trees) AND of each row's failed nodes' masks."""
        R = len(masks)
        # the leaf reached: the highest bit of a 32-bit mask, else the lowest; as a float64 (exact), the
        # exponent of that bit alone is its place
        exponent = (masks if self.high_first else masks & -masks).astype(np.float64).view(np.int64)
        exponent >>= 52
        exponent += self.tree_base
        leaves = self.values.take(exponent)   # (rows, trees)
        if self.groups[0][1] is None:
            return _sum_trees(leaves.reshape(R, len(self.forests), -1))
        out = np.empty((R, len(self.forests)))
        for ks, slots in self.groups:
            out[:, ks] = _sum_trees(leaves[:, slots].reshape(R, len(ks), -1))
        return out

    def slots(self, columns) -> np.ndarray:
        """Each of ``columns`` (positions in X) as its position in ``cols``, -1 where no node tests it."""
        pos = np.full(self.need, -1, dtype=np.intp)
        pos[self.cols] = np.arange(len(self.cols))
        columns = np.asarray(columns, dtype=np.intp)
        return np.where(columns < self.need, pos[np.minimum(columns, self.need - 1)], -1)

    def lookup(self, slots) -> tuple:
        """What :meth:`rows_of` reads of the columns at ``slots`` (positions in ``cols``, any shape):
        their column numbers, shifts and NaN rows."""
        slots = np.asarray(slots, dtype=np.intp)
        return self.cols[slots].astype(np.float64), self.shift[slots], self.nan_row[slots]

    def rows_of(self, lookup, values, missing: bool = True) -> np.ndarray:
        """The rows of ``table`` for ``values`` of the columns of ``lookup`` (:meth:`lookup`; shapes
        that broadcast): what :meth:`_masks` looks up, for columns looked up apart. ``missing``
        False: the caller knows no value is NaN (no NaN rows to look for)."""
        cols, shift, nan_row = lookup
        values = np.asarray(values, dtype=np.float64)
        shape = values.shape if values.shape == cols.shape else np.broadcast_shapes(cols.shape, values.shape)
        queries = np.empty(shape, dtype=np.complex128)
        queries.real, queries.imag = cols, values   # set apart: 1j * inf would be NaN
        rows = np.searchsorted(self.keys, queries)
        rows += shift
        return np.where(np.isnan(values), nan_row, rows) if missing else rows

    def _masks(self, X) -> np.ndarray:
        """(rows, trees) AND of the masks of each tree's failed nodes."""
        R = len(X)
        if not len(self.cols):
            return np.full((R, self.n_trees), self.full, dtype=self.mask)
        V = X[:, self.cols]
        nan = np.isnan(V)
        same = nan.all(axis=0) | (V == V[0]).all(axis=0)
        varying = np.flatnonzero(~same)
        n = len(self.cols)
        queries = np.empty(n + R * len(varying), dtype=np.complex128)   # row 0's values, then the varying ones
        queries.real[:n], queries.imag[:n] = self.cols, V[0]
        queries.real[n:], queries.imag[n:] = np.tile(self.cols[varying], R), V[:, varying].ravel()
        rows = np.searchsorted(self.keys, queries)
        first = np.where(nan[0], self.nan_row, rows[:n] + self.shift)
        shared = np.bitwise_and.reduce(self.table[first[same]], axis=0)
        if not len(varying):
            return np.broadcast_to(shared, (R, self.n_trees))
        rows = np.where(nan[:, varying], self.nan_row[varying], rows[n:].reshape(R, -1) + self.shift[varying])
        return np.bitwise_and.reduce(self.table[rows], axis=1) & shared


def stack(forests) -> Stack:
    """The :class:`Stack` of ``forests`` (a tuple), made once and kept on the first forest."""
    kept = forests[0].__dict__.setdefault("_stacks", {})
    key = tuple(id(f) for f in forests)
    got = kept.get(key)
    if got is None or got.forests != tuple(forests):
        got = Stack(forests)
        if len(kept) < 8:
            kept[key] = got
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


def concat(forests, n_features: int) -> Forest:
    """One forest predicting the sum of ``forests``' predictions: their trees one after another
    (node indices shifted), the baselines added. A model fitted in two parts (each problem's level,
    then each candidate's difference from it) is saved and scored as one forest this way."""
    forests = list(forests)
    if not forests:
        raise ValueError("forests: expected at least one forest to concatenate")
    sizes = np.array([len(f.value) for f in forests])
    shifts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
    arrays = {name: np.concatenate([getattr(f, name) + (s if name in ("left", "right", "roots") else 0)
                                    for f, s in zip(forests, shifts)])
              for name in ("feature", "threshold", "missing_left", "left", "right", "value", "roots")}
    arrays["missing_left"] = arrays["missing_left"].astype(bool)
    arrays["baseline"] = np.float64(sum(f.baseline for f in forests))
    return Forest.from_arrays(arrays, n_features)


__all__ = ["Forest", "export_hgb", "concat", "ARRAYS"]
