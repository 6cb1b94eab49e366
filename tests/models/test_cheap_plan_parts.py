"""The parts of a plan made cheaper without changing a number: the forests' leaves summed by a
reduction in tree order, the table rows looked up without a NaN test where no value is NaN and
without the rows that rule out nothing, the base features as a list, and the SpMV costs' ceilings
in Python floats (the same numbers and types as np.ceil's)."""
import dataclasses

import numpy as np
import pytest

from matplan import corpus
from matplan.core import device as device_mod, features as stats
from matplan.core.validation import normalize
from matplan.kernels import kernels_for
from matplan.models import learned, learned_features, spmv as spmv_model
from matplan.models.learned_forest import _sum_trees

H100 = device_mod.known("H100")


@pytest.fixture(scope="module")
def h100():
    return learned.load_file(learned.PACKAGE_DIR / "h100.npz", device_class="H100")


@pytest.mark.parametrize("rows, forests", [(1, 1), (1, 2), (2, 1), (3, 2), (8, 2), (5, 4)])
@pytest.mark.parametrize("trees", [1, 2, 17, 301])
def test_leaves_are_summed_in_tree_order(rows, forests, trees):
    """Each (row, forest) sum is the baseline plus one tree after another, as a Python loop adds
    them: leaves of magnitudes 1e-12 to 1e12, where a pairwise sum would round otherwise."""
    rng = np.random.default_rng(rows * 100 + forests * 10 + trees)
    for _ in range(10):
        leaves = rng.standard_normal((rows, forests, trees)) * 10.0 ** rng.integers(-12, 13, (rows, forests, trees))
        want = np.empty((rows, forests))
        for r in range(rows):
            for f in range(forests):
                total = leaves[r, f, 0]
                for t in range(1, trees):
                    total = total + leaves[r, f, t]
                want[r, f] = total
        got = _sum_trees(leaves)
        assert got.shape == (rows, forests) and np.array_equal(got, want)


def test_rows_of_without_the_nan_test_and_the_rows_that_rule_out_nothing(h100):
    stack = h100._compiled()[1]
    rng = np.random.default_rng(3)
    lookup = stack.lookup(np.arange(len(stack.cols)))
    thresholds = stack.keys.imag[np.isfinite(stack.keys.imag)]
    for _ in range(20):
        values = rng.choice(thresholds, len(stack.cols)) + rng.choice([-1e-9, 0.0, 1e-9, 5.0], len(stack.cols))
        assert np.array_equal(stack.rows_of(lookup, values, False), stack.rows_of(lookup, values))
    values[::3] = np.nan        # NaN rows are found with the test (the default)
    assert np.array_equal(stack.rows_of(lookup, values)[::3], stack.nan_row[::3])
    full = (stack.table == stack.full).all(axis=1)
    assert np.array_equal(stack.partial, ~full) and full.any() and stack.partial.any()


def _queries(A, B, **changes):
    f = dataclasses.replace(stats.compute(normalize(A, B), H100), backend="gpu", **changes)
    return [learned.Query(f, k.name, dict(p), H100, k.cost(f, p, H100), k.reads_a_at_run)
            for k in kernels_for(f.op, "gpu") if not k.supports(f) for p in k.candidates(f, H100)]


@pytest.mark.parametrize("changes", [{}, {"col_spread": np.nan}, {"warp_ratio": np.nan, "row_std": np.nan}])
def test_predict_problem_with_missing_features_is_predict(h100, changes):
    """A NaN base feature (a missing value) takes the NaN rows, as transform's row does."""
    A = corpus.load("skewed", "small", seed=2)
    for B in (np.ones(A.shape[1]), np.ones((A.shape[1], 8))):
        q = _queries(A, B, **changes)
        outside, got = h100.predict_problem(q[0].features, H100, [(x.kernel, x.params) for x in q],
                                            [x.analytic for x in q])
        assert not outside
        np.testing.assert_array_equal(got, h100.predict(q))


def test_base_values_are_the_base_features_in_column_order(h100):
    A = corpus.load("rmat", "small", seed=1)
    for B in (np.ones(A.shape[1]), A.T.tocsr()):
        f = stats.compute(normalize(A, B), H100)
        values = learned_features.base_values(f, H100)
        assert list(learned_features.base_features(f, H100)) == list(learned_features.BASE_COLUMNS)
        assert list(learned_features.base_features(f, H100).values()) == values
        assert h100.schema_.columns[:len(values)] == learned_features.BASE_COLUMNS   # as fit orders them
        assert h100.schema_.outside_base(values) == h100.schema_.outside(
            h100.schema_.transform(_queries(A, B)[:1])[0])


def test_spmv_costs_are_np_ceils(monkeypatch):
    """Every SpMV/SpMM GPU candidate's cost, its numbers, their types and its text, as with np.ceil."""
    rng = np.random.default_rng(5)
    problems = [(corpus.load(family, "small", seed=int(rng.integers(100))), k)
                for family in ("uniform", "skewed", "poisson2d", "rmat", "block_dense") for k in (1, 3, 16)]
    got, want = [], []
    for out in (got, want):
        with monkeypatch.context() as m:
            if out is want:
                m.setattr(spmv_model, "_ceil", np.ceil)
            for A, k in problems:
                f = dataclasses.replace(stats.compute(normalize(A, np.ones((A.shape[1], k))), H100), backend="gpu")
                for kernel in kernels_for(f.op, "gpu"):
                    for p in kernel.candidates(f, H100):
                        c = kernel.cost(f, p, H100)
                        out.append((kernel.name, p, c, type(c.prepare_s), type(c.run_s)))
    assert len(got) > 100 and got == want
    assert {t for *_, t in got} == {float, np.float64}   # np.float64 where np.ceil made one, as before


def test_log_floor_works_in_place_on_its_own_copy():
    """The numbers and types of np.log(np.maximum(x, floor)) for lists, arrays and scalars; the
    caller's array is left as it was."""
    rng = np.random.default_rng(1)
    x = np.exp(rng.uniform(-30, 3, 40))
    x[::7] = 0.0
    x[3] = np.nan
    for arg in (x, x.tolist(), x.astype(np.float32), x.reshape(20, 2), 1e-3, 0.0, 5, np.float64(2.5)):
        want = np.log(np.maximum(np.asarray(arg, dtype=np.float64), learned_features.TIME_FLOOR_S))
        got = learned_features.log_floor(arg)
        assert type(got) is type(want) and np.array_equal(got, want, equal_nan=True)
    before = x.copy()
    learned_features.log_floor(x)
    assert np.array_equal(x, before, equal_nan=True)
