"""Cheap plans choose what the planner chose before: the learned model asked through its kept
candidate templates (``CostModel.predict_problem``), the candidates ranked without a params key
for each, picked by name first, made from ``learned.rescored`` without a Cost each, the base
features as a list and the analytic costs' ceilings in Python give the plan of the reference
path (the Queries transformed from the old dict of base features, every forest walked level by
level, the full sort key, the old pick, reasons and score_candidates, np.ceil), every figure and
sentence of it, for random problems of every op."""
import dataclasses
import importlib
import math

import numpy as np
import pytest
import scipy.sparse as sp

from matplan import corpus
from matplan.core import device as device_mod, features as stats, validation
from matplan.kernels import base as kernel_base, kernels_for
from matplan.core.types import Candidate, Cost
from matplan.models import learned, learned_features, spmv as spmv_model
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


def reference_pick(scored):
    """choose.pick as it was: the least (kernel, params key) of the tied candidates."""
    limit = scored[0].total_s * (1 + choose.TIE_MARGIN)
    return min([c for c in scored if c.total_s <= limit], key=lambda c: (c.kernel, choose._param_key(c.params)))


def reference_rescore(feats, dev, pending):
    """learned.rescore as it was, before rescored: a Cost for every candidate the model touches."""
    model = learned.model_for(feats.backend, dev)
    out = [(cost, "analytic") for _, _, cost in pending]
    if model is None:
        return out
    known = model.known_kernels()
    idx = [i for i, (name, _, cost) in enumerate(pending) if name in known and not getattr(cost, "calibrated", False)]
    if not idx:
        return out
    got = learned._predict(model, feats, dev, [pending[i][:2] for i in idx], [pending[i][2] for i in idx])
    if got is None:
        return out
    outside, pred = got
    if outside:
        return [(Cost(cost.prepare_s, cost.run_s, f"{cost.why} (analytic: {', '.join(outside)} outside the training "
                      f"range of {model.describe()})"), "analytic") for _, _, cost in pending]
    for i, (run_s, prep_s) in zip(idx, pred.tolist()):
        analytic = pending[i][2]
        out[i] = (Cost(prep_s, run_s, f"{model.describe()}: predicts run {run_s * 1e3:.4f} ms, prepare "
                                      f"{prep_s * 1e3:.4f} ms (analytic model: run {analytic.run_s * 1e3:.4f} ms; "
                                      f"{analytic.why})"), "learned")
    for i, (name, _, cost) in enumerate(pending):
        if out[i][1] == "analytic" and not getattr(cost, "calibrated", False):
            out[i] = (Cost(cost.prepare_s, cost.run_s, f"{cost.why} (analytic: {name} is not in {model.describe()})"),
                      "analytic")
    return out


def reference_score_candidates(feats, dev, reuse, deterministic, only=None, per_call=None):
    """choose.score_candidates as it was: the rescored Costs (per_call's through dataclasses.replace)
    made Candidates by Cost.total."""
    pending, rejected, extras = choose.admissible(feats, dev, deterministic, only, per_call)   # unchanged part
    scored = []
    for (name, params, _), (cost, source) in zip(pending, reference_rescore(feats, dev, pending)):
        extra_s, extra_why = extras.get(name, (0.0, ""))
        if extra_s:
            cost = dataclasses.replace(cost, run_s=cost.run_s + extra_s,
                                       why=f"{cost.why}; +{extra_s * 1e6:.0f} us per call: {extra_why}")
        scored.append(Candidate(name, params, cost.prepare_s, cost.run_s, cost.total(reuse), source, cost.why))
    return reference_ranked(scored), rejected


def reference_base_features(f, dev) -> dict:
    """learned_features.base_features as it was: a dict built name by name."""
    itemsize, index_size, t2, log2_bandwidth, log2_peak_flops = learned_features._device_part(dev, f.dtype,
                                                                                              f.index_dtype)
    l2 = learned_features._l2
    groups = list(f.rbs_groups) + [0] * (6 - len(f.rbs_groups))
    m = max(f.m, 1)
    out = {f"op_{op}": float(f.op == op) for op in learned_features.OPS}
    out.update(
        itemsize=itemsize, index_size=index_size, log2_m=l2(f.m), log2_n=l2(f.n), log2_k=l2(f.k),
        log2_nnz=l2(f.nnz), log10_density=math.log10(f.density + 1e-12), row_mean=f.row_mean, row_std=f.row_std,
        row_cv=f.row_std / f.row_mean if f.row_mean else 0.0, log2_row_max=l2(f.row_max), row_min=f.row_min,
        empty_frac=f.empty_rows / m, T=f.T, log2_warp_before=l2(f.warp_len_before),
        log2_warp_after=l2(f.warp_len_after), warp_ratio=f.warp_ratio, log2_nnz_b=l2(f.nnz_b),
        log2_products=l2(f.products), log2_rowct_mean=l2(f.rowct_mean), log2_rowct_max=l2(f.rowct_max),
        log_rowct_var_over_mean=math.log1p(f.rowct_var_over_mean), log2_compression=l2(f.compression),
        col_spread=f.col_spread, layout_F=float(f.layout == "F"), k_over_t2=f.k / t2 if t2 > 0 else 0.0,
        log2_bandwidth=log2_bandwidth, sms=dev.sms, log2_peak_flops=log2_peak_flops)
    out.update({f"rbs_group{i}_frac": g / m for i, g in enumerate(groups[:6])})
    return out


def reference_explain(f, best, scored, reuse, deterministic):
    """choose.explain as it was: the other candidates and the vendor paths listed in full."""
    reasons = [choose._describe(f), *choose._rules(f), f"{best.label()}: {best.why}" if best.why else best.label()]
    others = [c for c in scored if c is not best]
    if others:
        nxt = others[0]
        reasons.append(f"next best {nxt.label()} is {choose._how(nxt)} {nxt.total_s / best.total_s:.2f}x "
                       f"the chosen cost ({nxt.total_s * 1e3:.4f} vs {best.total_s * 1e3:.4f} ms)")
    vendor = [c for c in scored if c.kernel.endswith((".cusparse", ".cublas")) and c is not best]
    if vendor:
        reasons.append(f"vendor path {vendor[0].label()} {choose._how(vendor[0])} "
                       f"{vendor[0].total_s / best.total_s:.2f}x the chosen cost")
    if reuse > 1 and best.prepare_s > 0:
        reasons.append(f"format conversion ({best.prepare_s * 1e3:.3f} ms) amortised over reuse={reuse}")
    if deterministic:
        reasons.append("deterministic=True: only bitwise-reproducible kernels were admitted")
    return reasons


def reference_paths(m):
    """Every function the cheap plans replaced, set back to what it was (``m``: a monkeypatch
    context): the learned model's Queries walked level by level, the full sort key, the old pick
    and reasons, the Costs of rescore, the base features' dict and the analytic costs' np.ceil."""
    m.setattr(learned.CostModel, "predict_problem", reference_predict)
    m.setattr(choose, "_ranked", reference_ranked)
    m.setattr(plan_mod, "pick", reference_pick)
    m.setattr(plan_mod, "explain", reference_explain)
    m.setattr(plan_mod, "score_candidates", reference_score_candidates)
    m.setattr(learned_features, "base_features", reference_base_features)
    m.setattr(spmv_model, "_ceil", np.ceil)


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
    stats.compute = lambda problem, dev, detail=True: feats
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
                reference_paths(m)
                want = make(A, B, reuse)
            for got in new:
                assert _figures(got) == _figures(want), name
                assert str(got).split("\n  planning took")[0] == str(want).split("\n  planning took")[0]
            sources |= {c.source for c in want.candidates}
    if make is _gpu_plan:
        assert {"learned", "analytic", "rejected"} <= sources   # inside and outside the model's range


def test_ties_are_ranked_by_params():
    """Equal cost and kernel: by params, numbers by value (W=8 before W=16), as the full key."""
    c = [Candidate("k", {"W": w}, 0.0, 1.0, 1.0, "analytic") for w in (16, 8, 32)] + \
        [Candidate("a", {"W": 4}, 0.0, 1.0, 1.0, "analytic"), Candidate("k", {}, 0.0, 0.5, 0.5, "analytic")]
    assert choose._ranked(list(c)) == reference_ranked(c)
    assert [x.params for x in choose._ranked(list(c))] == [{}, {"W": 4}, {"W": 8}, {"W": 16}, {"W": 32}]
    near = [Candidate(k, {"W": w}, 0.0, t, t, "analytic") for k, w, t in
            [("b", 1, 1.0), ("k", 16, 1.01), ("k", 8, 1.02), ("a", 2, 1.5), ("k", 4, 1.04)]]
    for tied in (near, near[:1], near[1:3], near[1:]):
        assert choose.pick(tied) is reference_pick(tied)
    assert choose.pick(near).label() == "b[W=1]" and choose.pick(near[1:]).label() == "k[W=4]"


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


def test_rescore_keeps_calibrated_costs_and_names_unknown_kernels(gpu_kernels):
    """rescore (through rescored) against the old rescore where one list mixes a calibrated cost,
    kernels the model knows and one it does not: the same Costs, the calibrated one untouched."""
    A = corpus.FAMILIES["uniform"](m=2000, n=2000, nnz_per_row=8)
    f = dataclasses.replace(stats.compute(validation.normalize(A, np.ones(2000)), H100), backend="gpu")
    pending = [(k.name, dict(p), k.cost(f, p, H100)) for k in kernels_for(f.op, "gpu") if not k.supports(f)
               for p in k.candidates(f, H100)]
    calibrated = dataclasses.replace(pending[1][2], calibrated=True)
    pending[1] = pending[1][:2] + (calibrated,)
    pending.append(("spmv.not_in_the_model", {}, Cost(0.0, 1e-5, "a kernel of a plugin")))
    got, want = learned.rescore(f, H100, pending), reference_rescore(f, H100, pending)
    assert got == want and got[1][0] is calibrated
    assert {s for _, s in got} == {"learned", "analytic"} and "is not in learned model" in got[-1][0].why


def test_per_call_costs_are_the_reference_paths(gpu_kernels):
    """score_candidates with a per_call cost on some kernels (none on others): the Candidates, their
    figures' types and their text of the old score_candidates."""
    A = corpus.load("skewed", "small", seed=4)
    for B in (np.ones(A.shape[1]), np.ones((A.shape[1], 4))):
        f = dataclasses.replace(stats.compute(validation.normalize(A, B), H100), backend="gpu")

        def per_call(kernel, feats, dev):
            return (3e-6, "a host copy") if kernel.name.endswith(("_vector", ".cusparse", ".ellr")) else (0.0, "")
        for reuse in (1, 100):
            got, want = (fn(f, H100, reuse, False, None, per_call) for fn in (choose.score_candidates,
                                                                            reference_score_candidates))
            assert got == want
            assert [type(x) for c in got[0] for x in (c.prepare_s, c.run_s, c.total_s)] == \
                   [type(x) for c in want[0] for x in (c.prepare_s, c.run_s, c.total_s)]
            assert any(c.why.endswith("us per call: a host copy") for c in got[0])
            assert {c.source for c in got[0]} >= {"learned"}
