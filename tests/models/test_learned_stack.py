"""The forests' QuickScorer prediction (learned_forest.Stack) against a plain walk of each tree,
node by node, for every row: the same numbers to the last bit, on the shipped models and on
freshly fitted ones (NaN either way, infinities, values exactly at thresholds, rows sharing
columns as a plan's candidates do), and scikit-learn's own for trees of more than 64 leaves."""
import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingRegressor

from matplan.models import learned
from matplan.models.learned_forest import Forest, Stack, export_hgb


def reference_walk(forest, X) -> np.ndarray:
    """Each row down each tree one node at a time, leaves added from the baseline in tree order."""
    out = []
    for x in np.asarray(X, dtype=np.float64):
        total = 0.0 + forest.baseline
        for root in forest.roots:
            n = root
            while forest.left[n] != n:
                v = x[forest.feature[n]]
                n = forest.left[n] if (forest.missing_left[n] if np.isnan(v) else v <= forest.threshold[n]) \
                    else forest.right[n]
            total += forest.value[n]
        out.append(total)
    return np.array(out)


def hard_rows(forests, n_columns, n_rows, seed, shared=0):
    """Rows mixing normal values with the forests' own thresholds, NaN and infinities; the first
    ``shared`` columns of all rows equal (the problem's features among a plan's candidates)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_rows, n_columns)) * 3
    thresholds = np.concatenate([f.threshold[np.isfinite(f.threshold)] for f in forests])
    at = rng.random(X.shape) < 0.3
    X[at] = rng.choice(thresholds, at.sum())
    X[rng.random(X.shape) < 0.1] = np.nan
    X[rng.random(X.shape) < 0.02] = np.inf
    X[rng.random(X.shape) < 0.02] = -np.inf
    X[:, :shared] = X[0, :shared]
    return X


@pytest.fixture(scope="module", params=["h100", "h200"])
def shipped(request):
    return learned.load_file(learned.PACKAGE_DIR / f"{request.param}.npz", device_class=request.param.upper())


def test_stack_matches_the_plain_walk_on_the_shipped_models(shipped):
    forests = shipped.forests_["*"]
    stack = Stack(forests)
    assert stack.mask is np.uint32   # 31 leaves a tree at most
    C = len(shipped.schema_.columns)
    for seed, (rows, shared) in enumerate([(40, 0), (12, 41), (2, 41), (1, 0), (9, C)]):
        X = hard_rows(forests, C, rows, seed, shared)
        got = stack.predict(X)
        assert got.shape == (rows, 2)
        for k, forest in enumerate(forests):
            want = reference_walk(forest, X)
            assert np.array_equal(got[:, k], want)
            assert np.array_equal(forest.predict_levels(X), want)
            assert np.array_equal(forest.predict(X), want)


def _fitted(seed, **params):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(500, 7))
    X[rng.random(X.shape) < 0.15] = np.nan
    y = np.nan_to_num(X[:, 0]) * 2 + np.where(np.isnan(X[:, 1]), 3.0, np.sin(np.nan_to_num(X[:, 1]))) \
        + rng.normal(scale=0.1, size=len(X))
    hgb = HistGradientBoostingRegressor(random_state=seed, **params).fit(X, y)
    return hgb, export_hgb(hgb)


@pytest.mark.parametrize("leaves, mask", [(4, np.uint32), (31, np.uint32), (48, np.uint64), (90, None)])
def test_stack_gives_scikit_learns_numbers(leaves, mask):
    """Masks of 32 or 64 bits by the widest tree; wider trees take the level walk; every way
    gives scikit-learn's predict exactly."""
    hgb, forest = _fitted(leaves, max_iter=25, max_leaf_nodes=leaves, min_samples_leaf=2)
    stack = Stack((forest,))
    assert stack.mask is mask
    X = hard_rows((forest,), 7, 60, leaves, shared=3)
    want = hgb.predict(X)
    assert np.array_equal(stack.predict(X)[:, 0], want)
    assert np.array_equal(forest.predict(X), want) and np.array_equal(forest.predict_levels(X), want)
    assert np.array_equal(stack.predict(X[:1])[:, 0], want[:1])


def test_forests_of_different_sizes_stack_together():
    """Forests of other tree counts are added in their own groups; each keeps its own numbers."""
    a_hgb, a = _fitted(1, max_iter=10)
    b_hgb, b = _fitted(2, max_iter=17, max_leaf_nodes=8)
    X = hard_rows((a, b), 7, 30, 3, shared=2)
    got = Stack((a, b, a)).predict(X)
    assert np.array_equal(got[:, 0], a_hgb.predict(X)) and np.array_equal(got[:, 2], got[:, 0])
    assert np.array_equal(got[:, 1], b_hgb.predict(X))
    assert Stack((a, b)).predict(X[:0]).shape == (0, 2)


def test_a_single_leaf_tree_and_too_few_columns():
    arrays = {"feature": np.zeros(1, np.int32), "threshold": np.array([np.inf]), "missing_left": np.zeros(1, bool),
              "left": np.zeros(1, np.int32), "right": np.zeros(1, np.int32), "value": np.array([0.25]),
              "roots": np.zeros(1, np.int32), "baseline": np.float64(1.5)}
    stump = Forest.from_arrays(arrays, n_features=2)
    assert np.array_equal(stump.predict(np.zeros((3, 2))), np.full(3, 1.75))
    _, forest = _fitted(4, max_iter=5)
    need = int(forest.feature.max()) + 1
    with pytest.raises(ValueError, match=f"at least {need} features"):
        forest.predict(np.zeros((2, need - 1)))
