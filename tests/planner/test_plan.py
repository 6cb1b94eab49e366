"""The planner end to end on the host: plans explain themselves, round-trip, and run correctly."""
import json

import numpy as np
import pytest
import scipy.sparse as sp

from matplan import planner
from matplan.planner import Plan
from conftest import messy_csr, random_csr


@pytest.fixture
def problems(rng):
    A = random_csr(rng, 200, 150, 0.05)
    return {
        "spmv": (A, rng.random(150)),
        "spmm": (A, rng.random((150, 7))),
        "spgemm": (A, random_csr(rng, 150, 90, 0.05)),
        "tsgemm": (rng.random((300, 256)), rng.random((256, 3))),
        "gemm": (rng.random((30, 40)), rng.random((40, 50))),
    }


@pytest.mark.parametrize("op", ["spmv", "spmm", "spgemm", "tsgemm", "gemm"])
def test_plan_runs_and_matches_reference(problems, op):
    A, B = problems[op]
    p = planner.plan(A, B)
    assert p.op == op and p.backend == "cpu"
    C = p.run(A, B)
    ref = A @ B
    if sp.issparse(ref):
        assert sp.issparse(C) and C.has_sorted_indices
        np.testing.assert_allclose(C.toarray(), ref.toarray(), rtol=1e-12)
    else:
        np.testing.assert_allclose(C, ref, rtol=1e-12)


def test_plan_is_immutable_and_roundtrips(problems):
    p = planner.plan(*problems["spmm"], reuse=10)
    with pytest.raises(Exception):
        p.kernel = "other"
    q = Plan.from_dict(json.loads(p.to_json()))
    assert q == p and str(q) == str(p)


@pytest.mark.parametrize("op", ["spmv", "tsgemm"])
def test_plan_pickles_after_a_run(problems, op):
    """A plan that has run (its runner cached) pickles and unpickles, equal, and runs again."""
    import pickle
    A, B = problems[op]
    p = planner.plan(A, B)
    first = p.run(A, B)
    q = pickle.loads(pickle.dumps(p))
    assert q == p
    np.testing.assert_array_equal(q.run(A, B), first)


def test_plan_explains_itself(problems):
    p = planner.plan(*problems["spgemm"])
    text = str(p)
    f = p.features
    assert f"nnz={f.nnz:,}" in text and f"T=round(mu+sigma)={f.T}" in text
    assert f"{f.products:,} products" in text   # a host plan: the per-row figures no candidate reads are not measured
    assert "nnz_RowCt per row and the compression not measured" in text
    assert p.kernel in text and "why:" in text


def test_bind_reuses_prepared_format(problems, rng):
    A, x = problems["spmv"]
    bound = planner.plan(A, x, reuse=5).bind(A)
    for _ in range(3):
        x = rng.random(150)
        np.testing.assert_allclose(bound(x), A @ x, rtol=1e-12)
    with pytest.raises(ValueError, match="B: expected 150 rows"):
        bound(rng.random(149))


def test_plan_rejects_other_inputs(problems, rng):
    A, x = problems["spmv"]
    p = planner.plan(A, x)
    with pytest.raises(ValueError, match="this plan is for a 200x150 matrix"):
        p.run(random_csr(rng, 201, 150, 0.05), x)
    with pytest.raises(ValueError, match="this plan is for op 'spmv'"):
        p.run(A, rng.random((150, 2)))
    with pytest.raises(ValueError, match="this plan is for float64"):
        p.run(A.astype(np.float32), x.astype(np.float32))


@pytest.mark.parametrize("op", ["spmv", "spmm", "spgemm", "tsgemm", "gemm"])
def test_run_skips_validation_only_for_the_planned_inputs(problems, op, monkeypatch):
    """Plan.run takes operands of exactly the planned types, dtype and shapes without the general
    validation (normalize); anything else still goes through it."""
    import matplan.core.validation as validation
    A, B = problems[op]
    p = planner.plan(sp.csr_matrix(A) if sp.issparse(A) else A, sp.csr_matrix(B) if sp.issparse(B) else B)
    A = sp.csr_matrix(A) if sp.issparse(A) else A
    B = sp.csr_matrix(B) if sp.issparse(B) else B
    normalize = validation.normalize
    calls = []
    monkeypatch.setattr(validation, "normalize", lambda a, b: calls.append(1) or normalize(a, b))
    ref = A @ B
    dense = (lambda M: M.toarray()) if sp.issparse(ref) else np.asarray
    np.testing.assert_allclose(dense(p.run(A, B)), dense(ref), rtol=1e-12)
    assert calls == []
    B32 = B.astype(np.float32)                 # another dtype: validated, upcast to the plan's
    np.testing.assert_allclose(dense(p.run(A, B32)), dense(A @ B32.astype(np.float64)), rtol=1e-12)
    assert calls == [1]
    with pytest.raises(ValueError, match="this plan is for a"):
        p.run(A[:-1], B)
    assert Plan.from_dict(p.to_dict()) == p   # the cached fast-path types are no field


@pytest.mark.parametrize("reuse", [0, -1, 1.5, True])
def test_bad_reuse(problems, reuse):
    with pytest.raises(ValueError, match="reuse: expected a positive integer"):
        planner.plan(*problems["spmv"], reuse=reuse)


def test_edge_cases_on_host(rng):
    A = messy_csr(rng, 100, 40)
    x = rng.random(40)
    np.testing.assert_allclose(planner.plan(A, x).run(A, x), A @ x, rtol=1e-12)
    E = sp.csr_matrix((0, 0))
    assert planner.plan(E, np.zeros(0)).run(E, np.zeros(0)).shape == (0,)


def test_deterministic_excludes_nondeterministic(problems):
    p = planner.plan(*problems["spmv"], deterministic=True)
    from matplan.kernels import get
    assert get(p.kernel).deterministic
    assert "deterministic=True" in str(p)


def test_same_inputs_same_plan(problems):
    A, x = problems["spmm"]
    assert planner.plan(A, x).to_dict()["candidates"] == planner.plan(A, x).to_dict()["candidates"]


def test_ties_go_by_kernel_name_then_parameter_values():
    """Candidates within TIE_MARGIN of the cheapest are a tie: the first by kernel name wins, then by
    parameter values as numbers (W=8 before W=16), whatever the order they come in."""
    from matplan.planner.choose import TIE_MARGIN, pick
    from matplan.core.types import Candidate

    def cand(kernel, params, total):
        return Candidate(kernel, params, 0.0, total, total, "analytic")
    tied = 1.0 + TIE_MARGIN / 2
    for order in (1, -1):
        c = [cand("spmv.csr_vector", {"W": 16}, 1.0), cand("spmv.csr_vector", {"W": 8}, tied),
             cand("spmv.csr_vector", {"W": 32}, tied)][::order]
        assert pick(sorted(c, key=lambda x: x.total_s)).params == {"W": 8}
    c = [cand("spmv.ellr", {"sorted": False}, 1.0), cand("spmv.csr_scalar", {}, tied),
         cand("spmv.brc", {"T": 8}, 1.0 + 2 * TIE_MARGIN)]
    assert pick(sorted(c, key=lambda x: x.total_s)).kernel == "spmv.csr_scalar"   # brc is not tied
