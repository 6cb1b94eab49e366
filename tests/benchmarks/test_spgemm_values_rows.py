"""benchmarks/spgemm.py's values-replay figures: each ratio and geomean counts only figures checked
correct, and the summary names where the replay was not timed (no GPU needed)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import spgemm as bench  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

GOOD = dict(matrix="good", ms=0.4, correct=True, vendor_reuse_ms=0.2, vendor_reuse_correct=True,
            values_replay_ms=0.1, values_correct=True, values_status="ok")


def test_ratios_need_both_figures_correct():
    assert bench.values_ratios(GOOD) == {"speedup_values_vs_vendor_reuse": pytest.approx(2.0),
                                         "values_speedup_vs_ms": pytest.approx(4.0)}
    assert bench.values_ratios(dict(GOOD, values_correct=False)) == {}
    assert bench.values_ratios(dict(GOOD, vendor_reuse_correct=False)) == {"values_speedup_vs_ms": pytest.approx(4.0)}
    assert bench.values_ratios(dict(GOOD, correct=False)) == {"speedup_values_vs_vendor_reuse": pytest.approx(2.0)}
    assert bench.values_ratios(dict(GOOD, values_replay_ms=None, values_status="not kept: ...")) == {}


def test_summary_counts_only_rows_checked_correct():
    slow = dict(GOOD, matrix="slow", values_replay_ms=0.4)
    wrong = dict(GOOD, matrix="wrong", values_replay_ms=0.001, values_correct=False, values_status="wrong: nnz")
    refused = dict(matrix="big", ms=9.0, correct=True, values_replay_ms=None,
                   values_status="not kept: values replay not set up: it would keep 20 bytes")
    rows = [dict(r, **bench.values_ratios(r)) for r in (GOOD, slow, wrong, refused)]
    s = bench.values_summary(rows)
    assert s["matrices_compared_values"] == 2
    assert s["geomean_speedup_values_vs_vendor_reuse"] == pytest.approx((2.0 * 0.5) ** 0.5)
    assert s["geomean_values_speedup_vs_ms"] == pytest.approx((4.0 * 1.0) ** 0.5)
    assert s["values_not_ok"] == ["wrong: wrong: nnz", "big: not kept: values replay not set up: it would keep 20 bytes"]
    assert bench.values_summary([])["geomean_speedup_values_vs_vendor_reuse"] is None
