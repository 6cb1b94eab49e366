"""benchmarks/tune_agreement.py on two small exports whose answers are known."""
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tune_agreement  # noqa: E402


def _export(path, rows):
    with open(path, "w") as f:
        f.write(json.dumps({"format": "matplan-tuning-export"}) + "\n")
        for problem, kernel, prep, run in rows:
            f.write(json.dumps(dict(kind="timing", problem=problem, kernel=kernel, params="{}", status="ok",
                                    matched=True, prepare_ms=prep, run_ms_median=run)) + "\n")
        f.write(json.dumps(dict(kind="timing", problem="p1", kernel="bad", params="{}", status="failed")) + "\n")


def test_a_uniform_shift_leaves_the_picks_and_centred_ratios_alone(tmp_path):
    rows = [("p1", "a", 0.0, 0.010), ("p1", "b", 0.0, 0.012), ("p2", "a", 1.0, 0.5), ("p2", "b", 0.0, 0.6)]
    _export(tmp_path / "1.jsonl", rows)
    _export(tmp_path / "2.jsonl", [(p, k, prep, 1.25 * run) for p, k, prep, run in rows])
    a = tune_agreement.agreement(tune_agreement.load(tmp_path / "1.jsonl"), tune_agreement.load(tmp_path / "2.jsonl"))
    assert a["timings"] == 4
    assert a["bins"]["0-20 us"]["n"] == 2 and a["bins"]["200-1000 us"]["n"] == 2
    for b in a["bins"].values():
        assert b["shift"] == pytest.approx(1.25) and b["centred"] == pytest.approx(1.0)
    # p2 at reuse 1: a costs 1.5 ms, b 0.6; at reuse 100 a 0.51, b 0.6; the same picks in both tunes
    for reuse in (1, 100):
        p = a["picks"][reuse]
        assert p["problems"] == 2 and p["same_best"] == 2
        assert p["first_on_second"] == p["second_on_first"] == pytest.approx(1.0) and p["worst"] == pytest.approx(1.0)


def test_a_swapped_pick_is_scored_on_the_other_tune(tmp_path):
    _export(tmp_path / "1.jsonl", [("p", "a", 0.0, 0.010), ("p", "b", 0.0, 0.011)])
    _export(tmp_path / "2.jsonl", [("p", "a", 0.0, 0.013), ("p", "b", 0.0, 0.011)])
    a = tune_agreement.agreement(tune_agreement.load(tmp_path / "1.jsonl"), tune_agreement.load(tmp_path / "2.jsonl"))
    p = a["picks"][1]
    assert p["same_best"] == 0
    assert p["first_on_second"] == pytest.approx(0.013 / 0.011)      # the first's pick, a, on the second
    assert p["second_on_first"] == pytest.approx(0.011 / 0.010)      # the second's pick, b, on the first
    assert p["worst"] == pytest.approx(0.013 / 0.011)
    assert a["bins"]["0-20 us"]["centred"] == pytest.approx(math.exp(abs(math.log(1.3) - math.log(1.3) / 2)))
