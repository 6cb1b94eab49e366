"""benchmarks/spgemm.py's cuSPARSE reuse figures: each ratio and geomean counts only figures checked
correct, and the summary names where reuse was not timed (no GPU needed)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import spgemm as bench  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

GOOD = dict(matrix="good", ms=0.5, correct=True, vendor_ms=2.0, vendor_correct=True, vendor_reuse_ms=1.0,
            vendor_reuse_correct=True, vendor_reuse_status="ok")


def test_ratios_need_both_figures_correct():
    assert bench.reuse_ratios(GOOD) == {"speedup_vs_vendor_reuse": pytest.approx(2.0),
                                        "vendor_reuse_speedup_vs_vendor": pytest.approx(2.0)}
    assert bench.reuse_ratios(dict(GOOD, correct=False)) == {"vendor_reuse_speedup_vs_vendor": pytest.approx(2.0)}
    assert bench.reuse_ratios(dict(GOOD, vendor_correct=False)) == {"speedup_vs_vendor_reuse": pytest.approx(2.0)}
    assert bench.reuse_ratios(dict(GOOD, vendor_reuse_correct=False)) == {}
    assert bench.reuse_ratios(dict(GOOD, vendor_reuse_ms=None, vendor_reuse_status="out of memory: ...")) == {}
    assert bench.reuse_ratios(dict(matrix="not run", ms=0.5, correct=True)) == {}


def test_summary_counts_only_rows_checked_correct():
    rows = [dict(GOOD, **bench.reuse_ratios(GOOD))]
    slow = dict(GOOD, matrix="slow", ms=2.0, vendor_reuse_ms=1.0)
    rows.append(dict(slow, **bench.reuse_ratios(slow)))
    wrong = dict(GOOD, matrix="wrong", ms=0.01, vendor_reuse_correct=False, vendor_reuse_status="wrong: row 3: ...")
    rows.append(dict(wrong, **bench.reuse_ratios(wrong)))
    skipped = dict(matrix="big", ms=100.0, correct=True, vendor_reuse_ms=None,
                   vendor_reuse_status="not run: 2,000,000,000 products > known limit 1,500,000,000")
    rows.append(dict(skipped, **bench.reuse_ratios(skipped)))
    s = bench.reuse_summary(rows)
    assert s["matrices_compared_vendor_reuse"] == 2
    assert s["geomean_speedup_vs_vendor_reuse"] == pytest.approx((2.0 * 0.5) ** 0.5)
    assert s["geomean_vendor_reuse_speedup_vs_vendor"] == pytest.approx(2.0)
    assert s["vendor_reuse_not_ok"] == ["wrong: wrong: row 3: ...",
                                        "big: not run: 2,000,000,000 products > known limit 1,500,000,000"]
    assert bench.reuse_summary([])["geomean_speedup_vs_vendor_reuse"] is None
