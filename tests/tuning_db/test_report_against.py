"""``matplan report --against``: the picks scored on a second tuning of the same problems, beside
what a perfect model of either tuning scores on the other (the timings' own noise)."""
import dataclasses

import numpy as np
import pytest

from matplan.tuning_db import report
from matplan.tuning_db.dataset import Dataset, Row

from test_report_held_out import DEVICE, _problem


def _pair():
    """Two tunings of three problems, two candidates each: 'p0' agrees; in 'p1' the first tuning
    has x slow (a transient) where the second has it 2x faster than y; 'p2' is in the first only."""
    problems = {fp: _problem(fp, "a", seed=j) for j, fp in enumerate(("p0", "p1", "p2"))}
    first = [("p0", 1e-5, 2e-5), ("p1", 9e-5, 3e-5), ("p2", 1e-5, 2e-5)]
    second = [("p0", 1e-5, 2e-5), ("p1", 1.5e-5, 3e-5)]

    def dataset(times):
        rows = []
        for fp, x, y in times:
            rows += [Row(fp, "spmv.csr_vector", {"W": 8}, x, 0.0), Row(fp, "spmv.csr_vector", {"W": 32}, y, 0.0)]
        return Dataset("H100", DEVICE, "NVIDIA H100 80GB HBM3", problems, rows, [], [], [])
    return dataset(first), dataset(second)


def test_picks_and_floors_scored_on_the_other_tuning():
    first, second = _pair()
    measured = first.y()
    # a model that predicts the second tuning exactly, and one that predicts the first
    truth = np.array([[1e-5, 0.0], [2e-5, 0.0], [1.5e-5, 0.0], [3e-5, 0.0], [1e-5, 0.0], [2e-5, 0.0]])
    preds = {"analytic": truth, "learned": measured, "combined": truth}
    got = report._against(first, second, preds, measured, [1], "second.sqlite")
    assert got["problems"] == 2 and got["database"] == "second.sqlite"
    res = got["results"]["1"]
    # p1 on the second tuning: W=8 takes 15 us, W=32 30 us
    assert res["combined"] == {"problems": 2, "geomean_regret": 1.0, "worst_regret": 1.0}
    assert res["learned"]["worst_regret"] == pytest.approx(2.0)
    assert res["first_best_on_second"]["geomean_regret"] == pytest.approx(np.sqrt(2.0))
    # the second tuning's pick (W=8) on the first: 90 us against 30
    assert res["second_best_on_first"]["worst_regret"] == pytest.approx(3.0)
    assert res["second_best_on_first"]["geomean_regret"] == pytest.approx(np.sqrt(3.0))


def test_a_problem_missing_a_candidate_in_the_second_is_left_out():
    first, second = _pair()
    rows = [r for r in second.rows if not (r.problem == "p0" and r.params["W"] == 32)]
    second = dataclasses.replace(second, rows=rows)
    got = report._against(first, second, {m: first.y() for m in report.METHODS}, first.y(), [1, 100], "x")
    assert got["problems"] == 1 and set(got["results"]) == {"1", "100"}


def test_the_report_prints_the_second_tuning():
    rep = {"device_class": "H100", "device": "d", "timings": 4, "problems_with_a_choice": 2, "problems": 2,
           "families": ["a"], "results": {"1": {m: {"problems": 0} for m in report.METHODS}},
           "against": {"problems": 2, "results": {"1": {"combined": {"problems": 2, "geomean_regret": 1.01,
                                                                     "worst_regret": 1.2}}}}}
    assert "on the second tuning (2 problems in both): combined 1.010 (worst 1.20)" in report.format_report(rep)
