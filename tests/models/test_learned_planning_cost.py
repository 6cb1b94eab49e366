"""What a plan pays to ask the learned model, made cheaper without changing an answer: the schema's
transform (one base row per problem, columns indexed once), no forest walk for a problem outside
the training range, and the model files' paths built once per setting."""
import dataclasses

import numpy as np
import pytest

from matplan import corpus
from matplan.core import device as device_mod, features as stats
from matplan.core.validation import normalize
from matplan.kernels import kernels_for
from matplan.models import learned
from matplan.models.learned_model import ALL_OPS
from matplan.models.learned_forest import Stack
from matplan.models.learned_features import _analytic, _param_items, base_features, log_floor


@pytest.fixture(scope="module")
def h100():
    return learned.load_file(learned.PACKAGE_DIR / "h100.npz", device_class="H100")


def gpu_queries(op="spmm", size="small"):
    """Every GPU candidate of one corpus problem, as the planner puts them to the model."""
    dev = device_mod.known("H100")
    A = corpus.load("skewed", size)
    B = np.ones(A.shape[1]) if op == "spmv" else np.ones((A.shape[1], 8))
    f = dataclasses.replace(stats.compute(normalize(A, B), dev), backend="gpu")
    return [learned.Query(f, k.name, dict(p), dev, k.cost(f, p, dev), k.reads_a_at_run)
            for k in kernels_for(f.op, "gpu") for p in k.candidates(f, dev)]


def reference_transform(schema, queries):
    """The schema's transform cell by cell, as it was written before it was made cheaper."""
    index = {c: i for i, c in enumerate(schema.columns)}
    X = np.full((len(queries), len(schema.columns)), np.nan)
    for r, q in enumerate(queries):
        for c, v in base_features(q.features, q.device).items():
            X[r, index[c]] = v
        for k in schema.kernels:
            X[r, index[f"kernel:{k}"]] = float(q.kernel == k)
        for c, v in _param_items(q.kernel, q.params):
            if c in index:
                X[r, index[c]] = v
        if "log_analytic_run" in index:
            X[r, index["log_analytic_run"]] = log_floor(_analytic(q).run_s)
            X[r, index["log_analytic_prepare"]] = log_floor(_analytic(q).prepare_s)
    return X


@pytest.mark.parametrize("op", ["spmv", "spmm"])
def test_transform_matches_cell_by_cell(h100, op):
    queries = gpu_queries(op)
    assert len(queries) >= 4
    got, want = h100.schema_.transform(queries), reference_transform(h100.schema_, queries)
    assert got.shape == want.shape
    assert np.array_equal(got, want, equal_nan=True)
    # two problems in one call: each row keeps its own base features
    mixed = queries[:2] + gpu_queries(op, "medium")[:2]
    assert np.array_equal(h100.schema_.transform(mixed), reference_transform(h100.schema_, mixed), equal_nan=True)


def test_outside_the_training_range_asks_no_tree(h100, monkeypatch):
    """The analytic costs decide past the training range, so the forests are not walked at all."""
    queries = gpu_queries("spmv")
    f = dataclasses.replace(queries[0].features, m=1 << 40, n=1 << 40, nnz=1 << 44)
    far = [dataclasses.replace(q, features=f) for q in queries]
    assert h100.schema_.outside(h100.schema_.transform(far)[0])

    def no_walk(*args):
        raise AssertionError("the forests were walked for a problem outside the training range")
    monkeypatch.setattr(h100, "predict_z", no_walk)
    monkeypatch.setattr(Stack, "from_masks", no_walk)
    cells, analytic = [(q.kernel, q.params) for q in queries], [q.analytic for q in queries]
    outside, pred = learned._predict(h100, f, queries[0].device, cells, analytic)
    assert outside and pred is None and not getattr(h100, "unusable_", None)
    monkeypatch.undo()
    outside, pred = learned._predict(h100, queries[0].features, queries[0].device, cells, analytic)   # inside
    assert not outside and pred.shape == (len(queries), 2) and np.all(np.isfinite(pred))
    assert np.array_equal(pred, h100.predict_z(h100.schema_.transform(queries)))


def test_model_file_signature_follows_the_environment(tmp_path, monkeypatch):
    """The files whose state picks the model are built once per setting, yet follow $MATPLAN_MODEL."""
    monkeypatch.delenv(learned.MODEL_ENV, raising=False)
    plain = learned._signature("H100")
    assert any(str(learned.PACKAGE_DIR / "h100.npz") == s[0] for s in plain[2:])
    named = tmp_path / "mine.npz"
    monkeypatch.setenv(learned.MODEL_ENV, str(named))
    with_named = learned._signature("H100")
    assert with_named[1] == str(named) and with_named[2][0] == str(named) and with_named[2][1] is None
    named.write_bytes(b"x")   # the file appears: its stamp (not a cached one) is in the signature
    assert learned._signature("H100")[2][1] is not None


@pytest.mark.parametrize("op", ["spmv", "spmm"])
def test_constant_prepare_rows_walk_no_prepare_trees(h100, op):
    """Kernels whose prepare time the model keeps as a constant get that constant; every other
    figure is what walking both forests for every row gives."""
    queries = gpu_queries(op)
    Z = h100.schema_.transform(queries)
    fixed = [q.kernel in h100.fixed_prepare_ for q in queries]
    assert any(fixed) and not all(fixed)
    T = h100._route(h100.forests_, Z)   # both targets of every row
    want = np.exp(T + h100._analytic_cols(Z) if h100.kind == "combined" else T)
    for r, q in enumerate(queries):
        if q.kernel in h100.fixed_prepare_:
            want[r, 1] = h100.fixed_prepare_[q.kernel]
    assert np.array_equal(h100.predict_z(Z), want)


def reference_predict_z(model, Z):
    """predict_z as it was before the Stack: each row's op's pair (else ALL_OPS's), each forest
    walked level by level for its rows, the prepare forest skipped where the time is fixed."""
    Z = np.asarray(Z, dtype=np.float64)
    T = np.zeros((len(Z), 2))
    fixed = {k: (Z[:, model.schema_.columns.index(f"kernel:{k}")] == 1.0, s) for k, s in model.fixed_prepare_.items()
             if f"kernel:{k}" in model.schema_.columns}
    skip = np.zeros(len(Z), dtype=bool)
    for rows, _ in fixed.values():
        skip |= rows
    own = model._ops_of(Z)
    pooled = ~np.isin(own, [op for op in model.forests_ if op != ALL_OPS])
    for key, rows in [(ALL_OPS, pooled)] + [(op, own == op) for op in model.forests_ if op != ALL_OPS]:
        for col, forest in enumerate(model.forests_[key]):
            take = rows if col == 0 else rows & ~skip
            if take.any():
                T[take, col] = forest.predict_levels(Z[take])
    out = np.exp(T + model._analytic_cols(Z) if model.kind == "combined" else T)
    for rows, s in fixed.values():
        out[rows, 1] = s
    return out


def fresh_problems(op, count=6):
    """Random problems of every corpus family (sizes and seeds drawn), with the GPU candidates the
    planner puts to the model for them."""
    rng = np.random.default_rng({"spmv": 1, "spmm": 2, "spgemm": 3}[op])
    dev = device_mod.known("H100")
    for i in range(count):
        family = ["uniform", "skewed", "poisson2d", "banded", "rmat", "block_dense"][i % 6]
        A = corpus.load(family, ["small", "medium"][int(rng.integers(2))], seed=int(rng.integers(1000)))
        n = A.shape[1]
        B = {"spmv": lambda: np.ones(n), "spmm": lambda: np.ones((n, int(rng.choice([2, 8, 32])))),
             "spgemm": lambda: A.T.tocsr()}[op]()
        f = dataclasses.replace(stats.compute(normalize(A, B), dev), backend="gpu")
        pending = [(k.name, dict(p), k.cost(f, p, dev)) for k in kernels_for(f.op, "gpu") if not k.supports(f)
                   for p in k.candidates(f, dev)]
        yield f, dev, pending


@pytest.mark.parametrize("op", ["spmv", "spmm", "spgemm"])
def test_plans_of_fresh_problems_are_the_reference_walks(h100, op, monkeypatch):
    """Every candidate's learned figures, and so the choice, are the reference walk's to the last
    bit, for random problems of each op (the shipped H100 model, whatever its source stamp)."""
    monkeypatch.setattr(learned, "model_for", lambda backend, dev: h100)
    learned_rows = 0
    for f, dev, pending in fresh_problems(op):
        queries = [learned.Query(f, name, params, dev, cost) for name, params, cost in pending]
        Z = h100.schema_.transform(queries)
        assert np.array_equal(Z, reference_transform(h100.schema_, queries), equal_nan=True)
        assert np.array_equal(h100.predict_z(Z), reference_predict_z(h100, Z))
        got = learned.rescore(f, dev, pending)

        def reference(features, device, cells, analytic):   # the Queries transformed, walked level by level
            rows = h100.schema_.transform([learned.Query(features, k, p, device, a)
                                           for (k, p), a in zip(cells, analytic)])
            outside = h100.schema_.outside(rows[0])
            return outside, None if outside else reference_predict_z(h100, rows)
        h100.predict_problem = reference   # shadows the method on this instance
        try:
            want = learned.rescore(f, dev, pending)
        finally:
            del h100.predict_problem
        assert got == want
        learned_rows += sum(source == "learned" for _, source in got)
    assert learned_rows > 0   # some problems lie inside the training range
