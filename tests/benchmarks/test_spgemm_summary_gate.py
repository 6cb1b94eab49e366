"""SUMMARY.md's SpGEMM and SpTRANS tables count only rows checked correct, and label replays."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import summarize  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

HEAD = dict(benchmark="spgemm", device="NVIDIA H100 80GB HBM3", device_slug="h100", commit="b" * 40, dtype="float64")
GOOD = dict(matrix="good", ms=0.5, ms_kind="guess replay", full_ms=1.0, unguessed_ms=1.0, vendor_ms=2.0,
            status="ok", correct=True, check="ok", vendor_status="ok", vendor_correct=True, vendor_check="ok",
            planner_kernel="spgemm.hash", planner_ms=0.5, planner_correct=True, products=10)
OURS_WRONG = dict(GOOD, matrix="ours-wrong", ms=0.1, full_ms=0.2, correct=False,
                  check="row 7: column 3 missing", planner_correct=False, planner_check="row 7: column 3 missing")
VENDOR_WRONG = dict(GOOD, matrix="vendor-wrong", ms=0.4, ms_kind="full product", full_ms=0.4, vendor_correct=False,
                    vendor_status="wrong: row 2: 5 entries stored", vendor_check="row 2: 5 entries stored")
VENDOR_WRONG.pop("unguessed_ms")


def _table(tmp_path, results):
    (tmp_path / "spgemm-h100.json").write_text(json.dumps(dict(HEAD, results=results)))
    md, tables = summarize.build_summary(tmp_path)
    return "\n".join(md), tables[0][2]


def test_only_rows_checked_correct_count(tmp_path):
    text, table = _table(tmp_path, [GOOD, OURS_WRONG, VENDOR_WRONG])
    good, ours_wrong, vendor_wrong = table.rows
    assert good.speedup == pytest.approx(4.0) and good.extra["full x vendor"][0] == pytest.approx(2.0)
    assert ours_wrong.speedup is None and ours_wrong.planner_speedup is None
    assert ours_wrong.extra["full x vendor"][0] is None
    assert vendor_wrong.speedup is None and vendor_wrong.planner_speedup is None
    assert ours_wrong.checked == "WRONG: ours, planner" and vendor_wrong.checked == "WRONG: vendor"
    # the geomeans are the good row's alone
    assert "float64: geomean over the vendor ours 4.00x, plan.run 4.00x, full x vendor 2.00x" in text
    assert "(1 of 3 rows checked correct, ours and vendor)" in text
    assert "ours: row 7: column 3 missing; plan.run: row 7: column 3 missing" in text
    assert "vendor: row 2: 5 entries stored" in text


def test_replays_are_labelled(tmp_path):
    text, table = _table(tmp_path, [GOOD, VENDOR_WRONG])
    assert table.rows[0].ours_kernel == "spgemm.hash (guess replay)"
    assert table.rows[1].ours_kernel == "spgemm.hash"           # every call a full product
    assert "full product ms" in text and "a replay, not a full product" in text


def test_rows_of_older_files_still_read(tmp_path):
    old = dict(matrix="old", ms=0.3, unguessed_ms=0.6, vendor_ms=1.2, status="ok", correct_rowsums=True,
               vendor_status="ok", planner_kernel="spgemm.hash", planner_ms=0.33)
    _, table = _table(tmp_path, [old])
    assert table.rows[0].speedup == pytest.approx(4.0) and table.rows[0].ours_kernel.endswith("(guess replay)")


def test_sptrans_plan_replays(tmp_path):
    row = dict(matrix="m", dtype="float64", ms=1.0, vendor_ms=2.0, correct=True, vendor_correct=True,
               planner_kernel="sptrans.transpose[method=radix]", plan_replay_ms=0.5, plan_replay_correct=True,
               radix_graph_ms=0.5, radix_graph_correct=True)
    wrong = dict(row, matrix="w", plan_replay_correct=False)
    (tmp_path / "sptrans-h100.json").write_text(json.dumps(dict(HEAD, benchmark="sptrans", results=[row, wrong])))
    md, tables = summarize.build_summary(tmp_path)
    text, rows = "\n".join(md), tables[0][2].rows
    assert rows[0].planner_ms == 0.5 and rows[0].planner_speedup == pytest.approx(4.0)
    assert rows[1].planner_speedup is None and rows[1].speedup == pytest.approx(2.0)
    assert "| plan.run (replay) |" in text and "a replay, not a full transpose" in text
    assert "ours 2.00x, plan.run (replay) 4.00x" in text


def test_tsgemm_plan_run_error():
    import tsgemm
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((50, 50)), rng.standard_normal((50, 4))
    C = A @ B
    assert tsgemm.plan_run_error(C, A, B) < 1e-14
    assert tsgemm.plan_run_error(C.astype(np.float32), A, B) < summarize.TSGEMM_TOL["float32"]
    bad = C.copy()
    bad[3, 1] += 1e-3 * (abs(A) @ abs(B))[3, 1]
    assert tsgemm.plan_run_error(bad, A, B) == pytest.approx(1e-3, rel=1e-6)
    bad[0, 0] = np.nan
    assert tsgemm.plan_run_error(bad, A, B) == float("inf")
    assert tsgemm.plan_run_error(C[:, :3], A, B) == float("inf")
