"""The measured choice among finalists (planner.measure): host kernels whose models are wrong on
purpose, so only a measurement finds the faster one; the GPU test measures the real candidates."""
import time

import numpy as np
import pytest

from matplan import planner
from matplan.kernels import registry
from matplan.core.types import Cost
from matplan.kernels.base import Kernel, Prepared
from matplan.planner import measure
from matplan.core.types import Candidate
from conftest import random_csr


class _Sleepy(Kernel):
    """A host SpMV predicted to take ``predicted_s`` that sleeps ``sleep_s`` a run."""
    backend, ops = "cpu", ("spmv",)

    def __init__(self, name, predicted_s, sleep_s, fail=False):
        self.name, self.predicted_s, self.sleep_s, self.fail = name, predicted_s, sleep_s, fail

    def cost(self, f, params, device):
        return Cost(0.0, self.predicted_s, "test model")

    def prepare(self, A, params):
        return Prepared(self.name, dict(params), {"A": A}, A.shape, A.dtype)

    def run(self, prepared, B, out=None):
        if self.fail:
            raise FloatingPointError("simulated kernel failure")
        time.sleep(self.sleep_s)
        return prepared.arrays["A"] @ B


@pytest.fixture
def sleepy(monkeypatch):
    """Three registered test kernels (removed after the test): the model ranks 'model_fast' first,
    'model_close' 5% behind it and 'model_far' 3x behind; 'model_close' runs fastest."""
    ks = [_Sleepy("test.model_fast", 1e-3, 4e-3), _Sleepy("test.model_close", 1.05e-3, 0.0),
          _Sleepy("test.model_far", 3e-3, 0.0)]
    for k in ks:
        monkeypatch.setitem(registry._REGISTRY, k.name, k)
    return [k.name for k in ks]


@pytest.fixture
def spmv(rng):
    A = random_csr(rng, 120, 90, 0.05)
    return A, rng.random(90)


def test_measured_finalist_beats_the_models_choice(sleepy, spmv):
    A, x = spmv
    p = planner.plan(A, x, kernels=sleepy, measure="always")
    assert p.kernel == "test.model_close"
    by_name = {c.kernel: c for c in p.candidates}
    assert by_name["test.model_close"].source == by_name["test.model_fast"].source == "measured"
    assert by_name["test.model_fast"].run_s >= 4e-3 > by_name["test.model_close"].run_s
    assert by_name["test.model_far"].source != "measured"         # predicted 3x: not a finalist
    assert any(r.startswith("measured 2 of the candidates predicted within 30%") for r in p.reasons)
    assert "next best test.model_fast is measured" in str(p)
    np.testing.assert_allclose(p.run(A, x), A @ x, rtol=1e-12)


def test_never_and_auto_on_the_host_keep_the_models_choice(sleepy, spmv):
    for mode in ("never", False, "auto"):      # "auto" measures on the GPU only
        p = planner.plan(*spmv, kernels=sleepy, measure=mode)
        assert p.kernel == "test.model_fast"
        assert all(c.source != "measured" for c in p.candidates)


def test_failing_finalist_raises_naming_it(monkeypatch, spmv):
    ks = [_Sleepy("test.model_fast", 1e-3, 0.0, fail=True), _Sleepy("test.model_close", 1.05e-3, 0.0)]
    for k in ks:
        monkeypatch.setitem(registry._REGISTRY, k.name, k)
    with pytest.raises(RuntimeError, match=r"measuring candidate test.model_fast .*simulated kernel failure"):
        planner.plan(*spmv, kernels=[k.name for k in ks], measure=True)


@pytest.mark.parametrize("bad", ["sometimes", 1, None])
def test_bad_measure(spmv, bad):
    with pytest.raises(ValueError, match="measure: expected one of"):
        planner.plan(*spmv, measure=bad)


def test_always_refuses_another_device(sleepy, spmv):
    with pytest.raises(ValueError, match="cannot be combined with device"):
        planner.plan(*spmv, kernels=sleepy, measure="always", device="H100")
    assert planner.plan(*spmv, kernels=sleepy, device="H100").kernel == "test.model_fast"


def _cand(total_s, prepare_s=0.0):
    return Candidate("k", {}, prepare_s, total_s, total_s, "learned")


def test_finalists_and_budget():
    scored = [_cand(t) for t in (1.0e-4, 1.2e-4, 1.28e-4, 1.32e-4, 5e-4)]
    finals = measure.finalists(scored)
    assert [c.total_s for c in finals] == [1.0e-4, 1.2e-4, 1.28e-4]
    cost = measure.predicted_cost_s(finals)
    reuse_enough = int(np.ceil(cost / (measure.BUDGET * 1.0e-4)))
    assert measure.to_measure("auto", "gpu", False, finals, reuse_enough) == finals
    assert measure.to_measure("auto", "gpu", False, finals, reuse_enough - 1) == finals[:2]
    assert measure.to_measure("auto", "gpu", False, finals, 1) == []
    assert measure.to_measure("auto", "cpu", False, finals, 10**9) == []
    short = [_cand(t * measure.MIN_RUN_S / 2e-4) for t in (1.0e-4, 1.1e-4)]    # runs below MIN_RUN_S
    assert measure.to_measure("auto", "gpu", False, short, 10**9) == []
    assert measure.to_measure("always", "gpu", False, short, 1) == short
    assert measure.to_measure("always", "gpu", False, finals[:1], 10**9) == []   # nothing to choose
    # a finalist whose conversion does not fit is left out, the others still measured
    dear = [finals[0], _cand(1.1e-4, prepare_s=1.0), finals[1]]
    assert measure.to_measure("auto", "gpu", False, dear, reuse_enough) == [finals[0], finals[1]]


class _Searched(_Sleepy):
    """A host SpMV whose configs the model cannot tell apart (as cuSPARSE's algorithms): it
    offers {} and searches ``sleeps`` (config name -> seconds a run), no shape bucket."""

    def __init__(self, name, predicted_s, sleeps):
        super().__init__(name, predicted_s, 0.0)
        self.sleeps = sleeps

    def search_space(self, f, device):
        return [{}] + [{"cfg": c} for c in self.sleeps]

    def run(self, prepared, B, out=None):
        time.sleep(self.sleeps.get(prepared.params.get("cfg"), 4e-3))
        return prepared.arrays["A"] @ B


def test_a_finalists_search_space_is_timed_and_its_fastest_kept(monkeypatch, spmv):
    ks = [_Searched("test.searched", 1.0e-3, {"slow": 6e-3, "fast": 0.0}), _Sleepy("test.plain", 1.05e-3, 2e-3)]
    for k in ks:
        monkeypatch.setitem(registry._REGISTRY, k.name, k)
    p = planner.plan(*spmv, kernels=[k.name for k in ks], measure="always")
    assert p.kernel == "test.searched" and p.params == {"cfg": "fast"}
    searched = next(c for c in p.candidates if c.kernel == "test.searched")
    assert searched.source == "measured" and "fastest of 2 configs measured in full of 3 screened" in searched.why
    np.testing.assert_allclose(p.run(*spmv), spmv[0] @ spmv[1], rtol=1e-12)


def test_the_budget_counts_every_config_a_search_times():
    """The finalists are chosen one config each, as before; a finalist's search (every config of
    its kernel) runs only where the budget holds it, the earlier finalists' first."""
    finals, eight = [_cand(1.0e-4), _cand(1.1e-4)], (lambda c: 8)
    one = measure.predicted_cost_s(finals)
    screen = 8 * (1 + measure.SCREEN_CALLS) * (finals[1].run_s + measure.CALL_OVERHEAD_S)
    assert measure.predicted_cost_s(finals, lambda c: 8 if c is finals[1] else 1) == pytest.approx(
        one + (measure.SCREEN_KEEP - 1) * measure.predicted_cost_s(finals[1:]) + screen)
    reuse = int(np.ceil(one / (measure.BUDGET * 1.0e-4)))
    assert measure.to_measure("auto", "gpu", False, finals, reuse, eight) == finals
    assert measure.to_search("auto", finals, reuse, eight) == []
    first = int(np.ceil(measure.predicted_cost_s(finals, lambda c: 8 if c is finals[0] else 1)
                        / (measure.BUDGET * 1.0e-4)))
    assert measure.to_search("auto", finals, first, eight) == finals[:1]
    assert measure.to_search("auto", finals, 8 * reuse, eight) == finals
    assert measure.to_search("always", finals, 1, eight) == finals
    assert measure.to_search("auto", finals, 10**9) == []                      # nothing to search
    # one finalist whose configs are searched is measured alone, where its search fits
    assert measure.to_measure("always", "gpu", False, finals[:1], 1, eight) == finals[:1]
    assert measure.to_measure("auto", "gpu", False, finals[:1], 8 * reuse, eight) == finals[:1]
    assert measure.to_measure("auto", "gpu", False, finals[:1], 1, eight) == []
    assert measure.to_measure("auto", "gpu", False, finals[:1], 10**9) == []


def test_a_lone_searched_finalist_is_searched(monkeypatch, spmv):
    k = _Searched("test.searched", 1.0e-3, {"slow": 6e-3, "fast": 0.0})
    monkeypatch.setitem(registry._REGISTRY, k.name, k)
    p = planner.plan(*spmv, kernels=[k.name], measure="always")
    assert p.kernel == "test.searched" and p.params == {"cfg": "fast"}


@pytest.mark.gpu
def test_gpu_measured_plan_runs_and_is_the_fastest_measured(cp, rng):
    import cupyx.scipy.sparse as csp
    m = 200_000
    A = random_csr(rng, m, m, 11 / m)
    x = rng.standard_normal(m)
    Ag, xg = csp.csr_matrix(A), cp.asarray(x)
    p = planner.plan(Ag, xg, reuse=10**6, measure="always")
    measured = [c for c in p.candidates if c.source == "measured"]
    assert len(measured) >= 2, str(p)
    assert p.candidates[0] is measured[0] and p.kernel == measured[0].kernel
    assert measured[0].total_s == min(c.total_s for c in measured)
    assert all(np.isfinite(c.run_s) and c.run_s > 0 for c in measured)
    y = cp.full(m, np.nan)
    p.run(Ag, xg, out=y)
    np.testing.assert_allclose(y.get(), A @ x, rtol=1e-10, atol=1e-10)


def test_a_search_without_a_bucket_screens_its_configs_and_times_the_fastest_in_full(monkeypatch, spmv):
    """Eight configs: each screened by SCREEN_CALLS calls, only the SCREEN_KEEP fastest timed in
    full; the screen's timings are cached apart from full ones."""
    sleeps = {"a": 6e-3, "b": 5e-3, "c": 0.0, "d": 4e-3, "e": 1e-3, "f": 7e-3, "g": 8e-3}
    k = _Searched("test.screened", 1.0e-3, sleeps)
    monkeypatch.setitem(registry._REGISTRY, k.name, k)
    timed = []
    real = measure._Session.time

    def spy(self, kernel, params, screen=False):
        timed.append((params.get("cfg"), screen))
        return real(self, kernel, params, screen)
    monkeypatch.setattr(measure._Session, "time", spy)
    p = planner.plan(*spmv, kernels=[k.name], measure="always")
    assert p.kernel == "test.screened" and p.params == {"cfg": "c"}
    assert sorted(str(c) for c, screen in timed if screen) == sorted(["None", *sleeps])
    assert sorted(c for c, screen in timed if not screen) == ["c", "e"]
    assert f"fastest of {measure.SCREEN_KEEP} configs measured in full of 8 screened" in p.candidates[0].why
    np.testing.assert_allclose(p.run(*spmv), spmv[0] @ spmv[1], rtol=1e-12)


def test_a_screened_search_costs_less_than_timing_every_config_in_full():
    c = _cand(1.6e-4)
    full = measure.predicted_cost_s([c])
    assert measure.predicted_cost_s([c], lambda x: 8) == pytest.approx(
        8 * (c.prepare_s + (1 + measure.SCREEN_CALLS) * (c.run_s + measure.CALL_OVERHEAD_S))
        + measure.SCREEN_KEEP * full)
    assert measure.predicted_cost_s([c], lambda x: 8) < 0.5 * 8 * full


def test_unsearched_finalists_give_way_to_a_search():
    """A search that does not fit beside every finalist: the unsearched finalists predicted
    farthest behind are left out (never the model's best) until it fits; else nothing changes."""
    best, plain, vendor, last = _cand(1.0e-4), _cand(1.1e-4), _cand(1.2e-4), _cand(1.25e-4)
    chosen, four = [best, plain, vendor, last], (lambda c: 4 if c is vendor else 1)
    need = measure.predicted_cost_s([best, plain, vendor], four)
    reuse = int(np.ceil(need / (measure.BUDGET * 1.0e-4)))
    assert measure.to_search("auto", chosen, reuse, four) == []                # all four: no room
    assert measure.room_for_search("auto", chosen, reuse, four) == ([best, plain, vendor], [vendor])
    alone = int(np.ceil(measure.predicted_cost_s([best, vendor], four) / (measure.BUDGET * 1.0e-4)))
    assert measure.room_for_search("auto", chosen, alone, four) == ([best, vendor], [vendor])
    assert measure.room_for_search("auto", chosen, alone - 1, four) == (chosen, [])  # never fits: unchanged
    assert measure.room_for_search("always", chosen, 1, four) == (chosen, [vendor])
    roomy = 10 * reuse
    assert measure.room_for_search("auto", chosen, roomy, four) == (chosen, [vendor])
