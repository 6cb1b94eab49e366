"""The learned model's two-part fit: each problem's mean of the target, then each candidate's
difference from it, saved and scored as one forest (learned_fit.offset_share,
learned_forest.concat)."""
import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingRegressor

from matplan.models import learned
from matplan.models.learned_fit import LearnedCostModel, _problem_ids, _problem_mean
from matplan.models.learned_forest import concat, export_hgb, stack
from learned_helpers import training_set
from tuning_helpers import CHOICE_KERNELS, registered


@pytest.fixture(scope="module")
def data():
    """The helpers' host candidates with the test kernels registered: a real choice per problem."""
    with registered(*CHOICE_KERNELS):
        yield training_set()


def _data(seed=0, n=300):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    X[rng.random(X.shape) < 0.05] = np.nan
    return X, np.nan_to_num(X[:, 0]) * 3 + np.sin(np.nan_to_num(X[:, 1])) + rng.normal(scale=0.1, size=n)


def test_concatenated_forest_predicts_the_sum():
    """concat of two exported forests == the sum of scikit-learn's two predictions, by the level
    walk and the leaf-mask stack alike, with the trees and baselines of both."""
    X, y = _data()
    a = HistGradientBoostingRegressor(max_iter=20, max_leaf_nodes=15, random_state=0).fit(X, y)
    b = HistGradientBoostingRegressor(max_iter=30, max_leaf_nodes=15, random_state=0).fit(X, y - a.predict(X))
    fa, fb = export_hgb(a), export_hgb(b)
    both = concat([fa, fb], X.shape[1])
    Xt, _ = _data(seed=1, n=100)
    want = a.predict(Xt) + b.predict(Xt)
    assert both.n_trees == fa.n_trees + fb.n_trees == 50
    assert both.baseline == fa.baseline + fb.baseline
    np.testing.assert_allclose(both.predict_levels(Xt), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stack([both]).predict(Xt)[:, 0], want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="at least one forest"):
        concat([], X.shape[1])


def test_problem_ids_and_means():
    """Rows of equal base features share a label, NaN included; the mean is over those rows only."""
    Z = np.array([[1.0, np.nan, 7.0], [1.0, np.nan, 8.0], [2.0, 0.0, 7.0], [1.0, np.nan, 9.0]])
    ids = _problem_ids(Z, np.array([0, 1]))
    assert ids[0] == ids[1] == ids[3] != ids[2]
    np.testing.assert_allclose(_problem_mean(np.array([1.0, 2.0, 10.0, 6.0]), ids), [3.0, 3.0, 10.0, 3.0])


def test_the_two_parts_are_the_problem_mean_and_the_rest(data):
    """offset_share=0.5: the run forest is a fit of each problem's mean log(measured / analytic)
    plus a fit of the differences, half the iterations each (as many trees as one fit)."""
    queries, y = data
    model = LearnedCostModel(cv=0, max_iter=40, offset_share=0.5).fit(queries, y)
    Z = model.schema_.transform(queries)
    t = np.log(np.maximum(y[:, 0], 1e-7)) - Z[:, model._col("log_analytic_run")]
    level = _problem_mean(t, _problem_ids(Z, model.schema_._base_positions))
    assert len(set(np.round(level, 12))) > 1          # the problems differ
    offset, rest = model.regressors_["*"][0].parts
    assert (offset.max_iter, rest.max_iter) == (20, 20)
    params = dict(max_leaf_nodes=31, max_depth=8, min_samples_leaf=5, learning_rate=0.08, early_stopping=False,
                  random_state=0)
    Zf = np.where(np.all(np.isnan(Z), axis=0), 0.0, Z)
    by_hand = (HistGradientBoostingRegressor(max_iter=20, **params).fit(Zf, level).predict(Z)
               + HistGradientBoostingRegressor(max_iter=20, **params).fit(Zf, t - level).predict(Z))
    want = np.exp(by_hand + Z[:, model._col("log_analytic_run")])
    np.testing.assert_allclose(model.predict(queries)[:, 0], want, rtol=1e-10)
    assert model.forests_["*"][0].n_trees == 40


def test_one_part_is_the_single_fit(data):
    """offset_share=0 fits one regressor to the target, as before the split."""
    queries, y = data
    model = LearnedCostModel(cv=0, max_iter=30, offset_share=0).fit(queries, y)
    assert isinstance(model.regressors_["*"][0], HistGradientBoostingRegressor)
    assert model.forests_["*"][0].n_trees == 30


def test_a_two_part_model_saves_and_loads_as_it_predicts(data, tmp_path):
    queries, y = data
    model = LearnedCostModel(cv=2, max_iter=20, per_op=True).fit(queries, y, groups=[q.kernel for q in queries])
    path = learned.save(model, "two", device_class="cpu", dir=tmp_path)
    loaded = learned.load_file(path, device_class="cpu", trusted=True)
    np.testing.assert_array_equal(loaded.predict(queries), model.predict(queries))
    assert model.get_params()["offset_share"] is None and model._iterations() == (10, 10)


def test_the_default_share_by_kind(data):
    """None: half the iterations to the problems' mean for the combined kind, none for the learned."""
    queries, y = data
    assert LearnedCostModel(cv=0, max_iter=30)._iterations() == (15, 15)
    learned_only = LearnedCostModel(kind="learned", cv=0, max_iter=30).fit(queries, y)
    assert learned_only._iterations() == (0, 30)
    assert isinstance(learned_only.regressors_["*"][0], HistGradientBoostingRegressor)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, "half", True, float("nan")])
def test_offset_share_is_checked(data, bad):
    queries, y = data
    with pytest.raises(ValueError, match="offset_share"):
        LearnedCostModel(cv=0, max_iter=5, offset_share=bad).fit(queries, y)
