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

    def no_walk(Z):
        raise AssertionError("the forests were walked for a problem outside the training range")
    monkeypatch.setattr(h100, "predict_z", no_walk)
    Z, outside, pred = learned._predict(h100, far)
    assert outside and pred is None and not getattr(h100, "unusable_", None)
    monkeypatch.undo()
    Z, outside, pred = learned._predict(h100, queries)   # inside: predicted as before
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
    """Kernels whose prepare time the model keeps as a constant skip the prepare forest; every
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
