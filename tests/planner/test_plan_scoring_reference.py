"""Cheap plans choose what the planner chose before: the learned model asked through its kept
candidate templates (``CostModel.predict_problem``) and the candidates ranked without a params key
for each give the plan of the reference path (the Queries transformed, every forest walked level
by level, the full sort key), every figure and sentence of it, for random problems of every op."""
import dataclasses
import importlib

import numpy as np
import pytest
import scipy.sparse as sp

from matplan import corpus
from matplan.core import device as device_mod, features as stats, validation
from matplan.kernels import base as kernel_base, kernels_for
from matplan.models import learned
from matplan.models.learned_fit import LearnedCostModel
from matplan.models.learned_model import ALL_OPS, _TEMPLATES
from matplan.planner import choose

plan_mod = importlib.import_module("matplan.planner.plan")
H100 = device_mod.known("H100")


def reference_predict(model, features, device, cells, analytic):
    """(outside, seconds) as the planner computed them before: each candidate a Query, the rows
    transformed, each row's op's forests (else ALL_OPS's) walked level by level."""
    Z = model.schema_.transform([learned.Query(features, k, p, device, a) for (k, p), a in zip(cells, analytic)])
    outside = model.schema_.outside(Z[0])
    if outside:
        return outside, None
    own = model._ops_of(Z)
    T = np.zeros((len(Z), 2))
    for r, op in enumerate(own):
        pair = model.forests_.get(op, model.forests_[ALL_OPS])
        T[r] = [forest.predict_levels(Z[r:r + 1])[0] for forest in pair]
    out = np.exp(T + model._analytic_cols(Z) if model.kind == "combined" else T)
    for k, s in model.fixed_prepare_.items():
        if f"kernel:{k}" in model.schema_.columns:
            out[Z[:, model.schema_.columns.index(f"kernel:{k}")] == 1.0, 1] = s
    return outside, out


def reference_ranked(scored):
    return sorted(scored, key=lambda c: (c.total_s, c.kernel, choose._param_key(c.params)))


def _csr(rng, m, n, density, dtype, index=np.int32, empty_rows=0.0):
    A = sp.random(m, n, density=density, format="csr", random_state=rng, dtype=np.float64).astype(dtype)
    if empty_rows:
        A = sp.diags((rng.random(m) >= empty_rows).astype(dtype)) @ A
        A = sp.csr_matrix(A)
        A.eliminate_zeros()
    A.indices, A.indptr = A.indices.astype(index), A.indptr.astype(index)
    return A


def problems():
    """(name, A, B or None for sptrans): corpus families of drawn sizes and seeds, both dtypes,
    SpMM at k = 1, 4, 16 and 64, and empty rows, an empty matrix and int64 indices."""
    rng = np.random.default_rng(42)
    families = ["uniform", "skewed", "poisson2d", "banded", "rmat", "block_dense"]
    out = []
    for i, family in enumerate(families):
        dtype = [np.float64, np.float32][i % 2]
        A = corpus.load(family, ["small", "medium"][int(rng.integers(2))], seed=int(rng.integers(1000))).astype(dtype)
        n = A.shape[1]
        k = [1, 4, 16, 64][i % 4]
        out += [(f"spmv {family}", A, rng.standard_normal(n).astype(dtype)),
                (f"spmm k={k} {family}", A, rng.standard_normal((n, k)).astype(dtype)),
                (f"spgemm {family}", A, A.T.tocsr()),
                (f"sptrans {family}", A, None)]
    A = corpus.FAMILIES["uniform"](m=10_000, n=10_000, nnz_per_row=10)   # the benchmark's 100k nonzeros
    out += [("spmv 100k", A, np.ones(10_000)), ("spmm k=16 100k", A, np.ones((10_000, 16))),
            ("spgemm 100k", A, A)]
    for dtype in (np.float32, np.float64):
        holes = _csr(rng, 3000, 2000, 0.004, dtype, empty_rows=0.5)
        wide = _csr(rng, 500, 4000, 0.01, dtype, index=np.int64)
        out += [(f"spmv empty rows {dtype.__name__}", holes, np.ones(2000, dtype)),
                (f"spmm k=4 int64 {dtype.__name__}", wide, np.ones((4000, 4), dtype)),
                (f"spgemm int64 {dtype.__name__}", wide, wide.T.tocsr()),
                (f"sptrans int64 {dtype.__name__}", wide, None),
                (f"spmv empty matrix {dtype.__name__}", sp.csr_matrix((300, 200), dtype=dtype), np.ones(200, dtype)),
                (f"tsgemm {dtype.__name__}", rng.standard_normal((20_000, 64)).astype(dtype),
                 rng.standard_normal((64, 8)).astype(dtype))]
    return out


def _gpu_plan(A, B, reuse):
    """The plan a GPU would make of (A, B) for an H100 after its statistics: the host's
    statistics of the operands, the GPU kernels as candidates (scored, never run)."""
    problem = validation.normalize_transpose(A) if B is None else validation.normalize(A, B)
    feats = dataclasses.replace(stats.compute(problem, H100), backend="gpu")
    problem = dataclasses.replace(problem, backend="gpu")
    compute = stats.compute
    stats.compute = lambda problem, dev: feats
    try:
        return plan_mod._plan(lambda: problem, reuse, False, "H100", None, None, "never", False)
    finally:
        stats.compute = compute


def _host_plan(A, B, reuse):
    if B is None:
        return plan_mod.plan_transpose(A, reuse=reuse, measure="never")
    return plan_mod.plan(A, B, reuse=reuse, measure="never")


def _figures(p):
    """Everything a plan says, but the time it took to make."""
    return (p.op, p.kernel, p.params, p.features, p.candidates, p.reasons, p.reuse, p.device, p.backend)


@pytest.fixture
def gpu_kernels(monkeypatch):
    """GPU kernels admitted as candidates on a machine without one (they are scored, not run)."""
    monkeypatch.setattr(kernel_base, "gpu_available", lambda: True)
    monkeypatch.delenv(learned.MODEL_ENV, raising=False)
    monkeypatch.delenv(learned.COST_MODEL_ENV, raising=False)
    learned.clear_cache()
    yield
    learned.clear_cache()


@pytest.mark.parametrize("make", [_gpu_plan, _host_plan], ids=["h100-scoring", "host"])
def test_plans_are_the_reference_paths(gpu_kernels, monkeypatch, make):
    model = learned.model_for("gpu", H100)
    assert model is not None, "the shipped H100 model must be fresh (matplan.models.learned_restamp --check)"
    sources, reuses = set(), [1, 1000]
    for name, A, B in problems():
        for reuse in reuses:
            _TEMPLATES.clear()
            new = [make(A, B, reuse), make(A, B, reuse)]   # a template made, then kept
            with monkeypatch.context() as m:
                m.setattr(learned.CostModel, "predict_problem", reference_predict)
                m.setattr(choose, "_ranked", reference_ranked)
                want = make(A, B, reuse)
            for got in new:
                assert _figures(got) == _figures(want), name
                assert str(got).split("\n  planning took")[0] == str(want).split("\n  planning took")[0]
            sources |= {c.source for c in want.candidates}
    if make is _gpu_plan:
        assert {"learned", "analytic", "rejected"} <= sources   # inside and outside the model's range


def test_ties_are_ranked_by_params():
    """Equal cost and kernel: by params, numbers by value (W=8 before W=16), as the full key."""
    from matplan.core.types import Candidate
    c = [Candidate("k", {"W": w}, 0.0, 1.0, 1.0, "analytic") for w in (16, 8, 32)] + \
        [Candidate("a", {"W": 4}, 0.0, 1.0, 1.0, "analytic"), Candidate("k", {}, 0.0, 0.5, 0.5, "analytic")]
    assert choose._ranked(list(c)) == reference_ranked(c)
    assert [x.params for x in choose._ranked(list(c))] == [{}, {"W": 4}, {"W": 8}, {"W": 16}, {"W": 32}]


def _gpu_queries():
    """The GPU candidates of SpMV, SpMM and SpGEMM problems as the planner puts them to a model,
    grouped by problem."""
    rng = np.random.default_rng(7)
    groups = []
    for i, family in enumerate(["uniform", "skewed", "poisson2d", "banded", "rmat", "block_dense"] * 2):
        A = corpus.load(family, "small", seed=i)
        n = A.shape[1]
        for B in (np.ones(n), np.ones((n, int(rng.choice([4, 16])))), A.T.tocsr()):
            f = dataclasses.replace(stats.compute(validation.normalize(A, B), H100), backend="gpu")
            groups.append([learned.Query(f, k.name, dict(p), H100, k.cost(f, p, H100), k.reads_a_at_run)
                           for k in kernels_for(f.op, "gpu") if not k.supports(f) for p in k.candidates(f, H100)])
    return [g for g in groups if g]


@pytest.mark.parametrize("kind, per_op, leaves", [("combined", False, 31), ("combined", True, 31),
                                                  ("learned", True, 31), ("combined", False, 100)])
def test_predict_problem_is_predict_of_the_queries(kind, per_op, leaves):
    """Models of either kind, with forests per op, and with trees past a leaf mask's 64 leaves (no
    masks: the rows are predicted as transform makes them) give predict's numbers to the last bit."""
    pytest.importorskip("sklearn")
    groups = _gpu_queries()
    queries = [q for g in groups for q in g]
    rng = np.random.default_rng(0)
    y = np.array([[max(q.analytic.run_s, 1e-7) * rng.uniform(0.5, 2), q.analytic.prepare_s + 1e-6] for q in queries])
    model = LearnedCostModel(kind=kind, per_op=per_op, max_leaf_nodes=leaves, max_depth=None if leaves > 64 else 8,
                             min_samples_leaf=1 if leaves > 64 else 5, max_iter=20, cv=0).fit(queries, y)
    assert (model._compiled()[1].mask is None) == (leaves > 64)
    assert (len(model.forests_) > 1) == per_op
    inside = 0
    for g in groups:
        cells, analytic = [(q.kernel, q.params) for q in g], [q.analytic for q in g]
        outside, got = model.predict_problem(g[0].features, H100, cells, analytic)
        assert outside == model.schema_.outside(model.schema_.transform(g)[0])
        if not outside:
            inside += 1
            for _ in range(2):   # the template made, then kept
                np.testing.assert_array_equal(model.predict_problem(g[0].features, H100, cells, analytic)[1],
                                              model.predict(g))
            np.testing.assert_array_equal(model.predict_problem(g[0].features, H100, cells[:1], analytic[:1])[1],
                                          model.predict(g[:1]))
    assert inside >= len(groups) // 2
