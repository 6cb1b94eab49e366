"""benchmarks/dispatch.py's plan-cost rows and targets, and their section in SUMMARY.md."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import dispatch as bench  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import summarize  # noqa: E402

HIT = dict(case="spgemm poisson3d 16^3 A@A", op="spgemm", target_us=10.0, kernel="spgemm.hash", nnz=27136,
           kernel_us=50.0, hit_us=58.0, overhead_us=8.0, path="alias", plan_x=3.0)
PLAN = dict(op="spmv", nnz=100_000, kernel="spmv.csr_vector", plan_ms=0.42, kernel_us=12.0, plan_x=35.0,
            target_ms=0.5, device="NVIDIA H100 80GB HBM3")


def test_plan_targets_by_size():
    assert bench.plan_target_ms(8_000) == 0.5 and bench.plan_target_ms(100_000) == 0.5
    assert bench.plan_target_ms(1_000_000) == 2.0 and bench.plan_target_ms(10_000_000) == 2.0
    assert bench.plan_target_ms(16_000_000) is None
    assert bench.HIT_TARGET_US == {"spmv": 5.0, "spmm": 5.0, "spgemm": 10.0}


def test_plan_cost_row_on_the_host(capsys):
    """One small row of every op, measured for real on the host: a plan, its kernel, the ratio."""
    for op in bench.PLAN_OPS:
        row = bench.plan_cost(op, 20_000, np, lambda A: A, lambda: None, "cpu")
        assert row["op"] == op and row["kernel"].startswith("cpu.")
        assert 0.8 * 20_000 <= row["nnz"] <= 1.2 * 20_000
        assert row["plan_ms"] > 0 and row["kernel_us"] > 0
        assert abs(row["plan_x"] - row["plan_ms"] * 1e3 / row["kernel_us"]) < 1e-6 * row["plan_x"]
        assert row["target_ms"] == 0.5
    assert "spgemm" in capsys.readouterr().out


def test_summary_shows_both_tables_with_targets():
    doc = dict(benchmark="dispatch", device="NVIDIA H100 80GB HBM3", commit="a" * 40, date="2026-01-02",
               gpu=[HIT], host=[], plan_never=dict(gpu=[PLAN], host=[dict(op="sptrans", nnz=100_000, error="X: y")]))
    text = "\n".join(summarize.overhead_section([("dispatch-h100.json", doc)]))
    assert "| spgemm poisson3d 16^3 A@A | spgemm.hash | 50.0 | 58.0 | 8.0 | 10.0 | alias | 3.00 | n/a |" in text
    assert 'measure="never"' in text
    assert "| spmv | 100,000 | GPU | spmv.csr_vector | 0.42 | 35.00 | 0.5 | n/a |" in text
    assert "| sptrans | 100,000 | host | n/a | n/a | n/a | n/a | X: y |" in text
    # a file written before the plan-cost rows still summarises
    old = {k: v for k, v in doc.items() if k != "plan_never"}
    assert 'measure="never"' not in "\n".join(summarize.overhead_section([("dispatch-h100.json", old)]))


def test_plan_only_writes_its_rows_and_profiles(tmp_path, capsys):
    """--plan-only: the plan-cost rows alone (with the statistics' part), their file and profiles."""
    import json
    rc = bench.main(["--plan-only", "--host-only", "--plan-sizes", "20000", "--plan-ops", "spmv,sptrans",
                     "--out", str(tmp_path), "--plan-profile", str(tmp_path / "p.txt")])
    assert rc == 0
    doc = json.loads((tmp_path / "dispatch-plan-cpu.json").read_text())
    rows = doc["plan_never"]["host"]
    assert [r["op"] for r in rows] == ["spmv", "sptrans"] and doc["plan_never"]["gpu"] == []
    assert all(0 < r["stats_ms"] and 0 < r["plan_ms"] and r["target_ms"] == 0.5 for r in rows)
    text = (tmp_path / "p.txt").read_text()
    assert "=== spmv 20,000" in text and "=== sptrans 20,000" in text and "tottime" in text
    assert "stats ms" in capsys.readouterr().out
