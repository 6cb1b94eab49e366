"""The learned model's cheaper scoring reads the same table rows and leaves: the stack's row keys
find the rows :meth:`Stack.rows_of` finds, leaves are read off the top bit of 32-bit masks, and
rows with a NaN (a missing feature or analytic time) take the rows as transform makes them; every
prediction is ``predict``'s of the Queries, to the last bit."""
import dataclasses

import numpy as np
import pytest

from matplan import corpus
from matplan.core import device as device_mod, features as stats
from matplan.core.types import Cost
from matplan.core.validation import normalize
from matplan.kernels import kernels_for
from matplan.models import learned, learned_features, spgemm as spgemm_model, spmv as spmv_model
from matplan.models.learned_forest import Stack
from spgemm_old_costs import reference_hash_terms

H100 = device_mod.known("H100")


@pytest.fixture(scope="module")
def h100():
    return learned.load_file(learned.PACKAGE_DIR / "h100.npz", device_class="H100")


def _queries(A, B):
    f = dataclasses.replace(stats.compute(normalize(A, B), H100), backend="gpu")
    return [learned.Query(f, k.name, dict(p), H100, k.cost(f, p, H100), k.reads_a_at_run)
            for k in kernels_for(f.op, "gpu") if not k.supports(f) for p in k.candidates(f, H100)]


def _fitted_stack(leaves):
    """A Stack of two forests of up to ``leaves`` leaves a tree, fitted on random data."""
    sklearn = pytest.importorskip("sklearn.ensemble")
    from matplan.models.learned_forest import export_hgb
    rng = np.random.default_rng(leaves)
    X = rng.standard_normal((3000, 5))
    X[rng.random(X.shape) < 0.05] = np.nan
    forests = []
    for seed in range(2):
        y = np.nan_to_num(X[:, 0]) * (seed + 1) + np.nan_to_num(X[:, 1]) ** 2 + rng.standard_normal(3000) * 0.1
        hgb = sklearn.HistGradientBoostingRegressor(max_iter=15, max_leaf_nodes=leaves, min_samples_leaf=2,
                                                    random_state=seed).fit(X, y)
        forests.append(export_hgb(hgb))
    return Stack(forests), X


def _values(stack, rng, n):
    """Values for random tested columns: thresholds themselves, infinities of both signs, others."""
    slots = rng.integers(0, len(stack.cols), n)
    values = np.where(rng.random(n) < 0.4, rng.choice(stack.keys.imag, n), rng.standard_normal(n) * 5)
    values[:20], values[20:40] = np.inf, -np.inf
    return slots, values


@pytest.mark.parametrize("source", ["shipped", 31, 48])
def test_row_keys_find_the_rows_rows_of_finds(h100, source):
    stack = h100._compiled()[1] if source == "shipped" else _fitted_stack(source)[0]
    assert stack.high_first == (stack.mask is np.uint32) and stack.mask is (np.uint64 if source == 48 else np.uint32)
    slots, values = _values(stack, np.random.default_rng(3), 5000)
    lookup = stack.lookup(slots)
    query = np.empty(len(values), dtype=np.complex128)
    query.real, query.imag = lookup[0], values
    assert np.array_equal(stack.row_keys.searchsorted(query), stack.rows_of(lookup, values, missing=False))


@pytest.mark.parametrize("leaves", [31, 48])
def test_masks_give_the_level_walks_leaves(leaves):
    """32-bit masks number leaves from the top bit, 64-bit ones from the bottom: both give the walk's
    sums, NaN rows included."""
    stack, X = _fitted_stack(leaves)
    want = np.stack([f.predict_levels(X) for f in stack.forests], axis=1)
    assert np.array_equal(stack.predict(X), want)
    assert np.array_equal(stack.predict(X[:1]), want[:1])   # one row: summed by accumulation


def test_nan_rows_are_predicted_as_transform_makes_them(h100):
    """A NaN among a problem's features or a candidate's analytic times: predict's numbers."""
    A = corpus.load("skewed", "small", seed=2)
    queries = _queries(A, np.ones((A.shape[1], 4)))
    cells = [(q.kernel, q.params) for q in queries]
    f = queries[0].features
    nan_feature = dataclasses.replace(f, col_spread=float("nan"))
    cases = [(f, [dataclasses.replace(q.analytic, run_s=float("nan")) if i == 1 else q.analytic
                  for i, q in enumerate(queries)]),
             (nan_feature, [q.analytic for q in queries])]
    for feats, analytic in cases:
        qs = [dataclasses.replace(q, features=feats, analytic=a) for q, a in zip(queries, analytic)]
        outside, got = h100.predict_problem(feats, H100, cells, analytic)
        assert not outside
        want = h100.predict(qs)
        assert np.array_equal(got, want, equal_nan=True)
        assert np.isfinite(got).sum() >= got.size - 1   # a NaN analytic run time: that one run time
    # and without a NaN the fast rows agree with the same Queries too
    outside, got = h100.predict_problem(f, H100, cells, [q.analytic for q in queries])
    assert np.array_equal(got, h100.predict(queries))


def test_a_missing_range_checked_feature_counts_as_inside(h100):
    A = corpus.load("uniform", "small", seed=1)
    queries = _queries(A, np.ones(A.shape[1]))
    schema = h100.schema_
    values = learned_features.base_values(queries[0].features, H100)
    at = learned_features.BASE_COLUMNS.index("log2_row_max")
    for v in (float("nan"), 1e9, -1e9):
        changed = list(values)
        changed[at] = v
        row = schema.transform(queries[:1])[0]
        row[schema._index["log2_row_max"]] = v
        assert schema.outside_base(changed) == schema.outside(row)
    assert schema.outside_base(values) == []


def test_an_analytic_time_below_the_floor_reads_the_floor(h100):
    """log_floor's numbers: times are floored at TIME_FLOOR_S before their logs."""
    A = corpus.load("uniform", "small", seed=3)
    queries = _queries(A, np.ones(A.shape[1]))
    analytic = [Cost(q.analytic.prepare_s * 0.0, 1e-12, q.analytic.why) if i % 2 else q.analytic
                for i, q in enumerate(queries)]
    qs = [dataclasses.replace(q, analytic=a) for q, a in zip(queries, analytic)]
    outside, got = h100.predict_problem(queries[0].features, H100, [(q.kernel, q.params) for q in queries], analytic)
    assert not outside and np.array_equal(got, h100.predict(qs))


def reference_brc(f, T, long_factor, device):
    """models.spmv.brc as it was: the BRCP layout's Cost, then a second Cost with y's zeroing added."""
    v, i = spmv_model._sizes(f)
    c = spmv_model._blocked("spmv.brc", f, T, long_factor, device, i + v * f.k, 2, "; atomics into a zeroed y")
    return Cost(c.prepare_s, c.run_s + f.m * f.k * v / device.mem_bandwidth, c.why)


def test_brc_costs_are_the_two_step_costs():
    """BRC's y zeroing added inside _blocked: the same numbers, types and text, long rows included."""
    rng = np.random.default_rng(11)
    seen = 0
    for family in ("uniform", "skewed", "poisson2d", "rmat", "block_dense", "banded"):
        A = corpus.load(family, "small", seed=int(rng.integers(100)))
        for k in (1, 3, 16):
            f = stats.compute(normalize(A, np.ones(A.shape[1]) if k == 1 else np.ones((A.shape[1], k))), H100)
            for T, lf in ((f.T, 64), (max(1, f.T // 3), 8192), (1, 2)):
                got, want = spmv_model.brc(f, T, lf, H100), reference_brc(f, T, lf, H100)
                assert got == want
                assert (type(got.run_s), type(got.prepare_s)) == (type(want.run_s), type(want.prepare_s))
                seen += 1
    assert seen == 54


def test_every_number_of_candidates_sums_as_predict(h100):
    """Few sums are accumulated, more reduced with the trees outermost: predict's numbers either way."""
    A = corpus.load("poisson2d", "small", seed=0)
    queries = _queries(A, np.ones((A.shape[1], 16)))
    assert len(queries) >= 8
    for r in range(1, len(queries) + 1):
        q = queries[:r]
        outside, got = h100.predict_problem(q[0].features, H100, [(x.kernel, x.params) for x in q],
                                            [x.analytic for x in q])
        assert not outside and np.array_equal(got, h100.predict(q)), r


def test_shipped_stamps_are_taken_again_after_a_while(tmp_path, monkeypatch):
    """A named model's files are stamped at every plan; the shipped files' at most every
    SHIPPED_RECHECK_S, and at once after clear_cache."""
    monkeypatch.delenv(learned.MODEL_ENV, raising=False)
    learned.clear_cache()
    stamped = []
    stamp = learned._stamp
    monkeypatch.setattr(learned, "_stamp", lambda path: stamped.append(path) or stamp(path))
    clock = [100.0]
    monkeypatch.setattr(learned, "_clock", lambda: clock[0])
    shipped = {str(learned.PACKAGE_DIR / "h100.npz"), str(learned.PACKAGE_DIR / "h100.json")}
    first = learned._signature("H100")
    assert set(stamped) == shipped and {s[0] for s in first[2:]} == shipped
    clock[0] += learned.SHIPPED_RECHECK_S / 2
    assert learned._signature("H100") == first and len(stamped) == 2    # within the window: kept
    clock[0] += learned.SHIPPED_RECHECK_S
    learned._signature("H100")
    assert len(stamped) == 4                                             # past it: taken again
    learned.clear_cache()
    learned._signature("H100")
    assert len(stamped) == 6                                             # cleared: taken again
    named = tmp_path / "mine.npz"
    monkeypatch.setenv(learned.MODEL_ENV, str(named))
    stamped.clear()
    for _ in range(3):
        learned._signature("H100")
    assert stamped.count(str(named)) == 3 and str(learned.PACKAGE_DIR / "h100.npz") not in stamped   # shipped: kept
    learned.clear_cache()


def test_hash_terms_are_the_reference_text():
    rng = np.random.default_rng(12)
    for family in ("uniform", "skewed", "rmat", "block_dense"):
        A = corpus.load(family, "small", seed=int(rng.integers(100)))
        for dtype in (np.float32, np.float64):
            A = A.astype(dtype)
            f = stats.compute(normalize(A, A.T.tocsr()), H100)
            for path in spgemm_model.HASH_FIXED_S:
                for direct in (False, True):
                    assert spgemm_model.hash_terms(f, path, direct) == reference_hash_terms(f, path, direct)
