"""benchmarks/distributed_scaling.py runs on a CPU LocalCluster and writes the issue's schema."""
import json
import runpy
from pathlib import Path

import pytest

pytest.importorskip("dask.distributed")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "distributed_scaling.py"


def test_cpu_run_writes_the_schema(tmp_path, capsys):
    bench = runpy.run_path(str(SCRIPT), run_name="bench")
    rc = bench["main"](["--cpu", "--threads", "--workers", "2", "--reps", "1", "--out", str(tmp_path),
                        "--only", "rmat-scale11", "uniform-20k", "--spmm-k", "4", "8"])
    assert rc == 0
    path = tmp_path / "distributed-cpu.json"
    assert f"wrote {path}" in capsys.readouterr().out
    doc = json.loads(path.read_text())
    assert doc["device"] == "cpu" and doc["benchmark"] == "distributed"
    assert [r["op"] for r in doc["rows"]] == ["spgemm", "spmm", "spmm"]
    for r in doc["rows"]:
        assert {"op", "matrix", "products", "gpus", "ms", "one_gpu_ms", "speedup", "correct"} <= set(r)
        assert r["correct"] is True and r["gpus"] == 2 and r["products"] > 0
        assert r["speedup"] == pytest.approx(r["one_gpu_ms"] / r["ms"])
        assert r["kernel_ms"] >= 0 and r["overhead_ms"] >= 0 and r["scatter_ms"] >= 0
        assert r["first_ms"] > 0 and r["one_gpu_first_ms"] > 0 and r["distribute_ms"] > 0
        assert r["first_speedup"] == pytest.approx(r["one_gpu_first_ms"] / r["first_ms"])
        assert r["planned_steady"] == 0 and r["first_plan_sum_ms"] > 0   # plans made once, in the first call
        assert r["run_ms"] >= r["kernel_ms"] and r["ms"] >= r["run_ms"]
        assert r["path"] == "runner" and r["fallback"] is None and r["tasks_ms"] > 0   # steady calls skip the scheduler
    assert doc["rows"][0]["products"] > doc["rows"][0]["blocks"] > 0
    assert doc["rows"][1]["host_io_ms"] > 0 and [r["k"] for r in doc["rows"][1:]] == [4, 8]
    assert doc["rows"][1]["host_io_path"] == "runner"
