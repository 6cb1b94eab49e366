"""benchmarks/spmv.py's result rows: vendor_ms is the prepared cuSPARSE call in its fastest config
checked correct, cupyx_ms the cupyx call, and every ratio and geomean counts only figures checked
correct (no GPU needed)."""
import json
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import spmv as bench  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import summarize  # noqa: E402

INFO = dict(matrix="poisson3d-large", dtype="float64", nnz=7_000_000, m=1_000_000, n=1_000_000)
MIN_BYTES, BW = 100e6, 3e12


def cand(kernel, ms, correct=True, ms_b2b=None, **extra):
    return dict(kernel=kernel, ms=ms, ms_b2b=ms_b2b, prepare_ms=0.0, correct=correct,
                frac_of_copy_bw=MIN_BYTES / (ms * 1e-3) / BW, **extra)


def row(cands, cupyx=None, chosen="spmv.ellr[sorted=False]", model="spmv.csr_scalar"):
    cupyx = dict(ms=0.12, ms_b2b=0.09, correct=True) if cupyx is None else cupyx
    return bench.matrix_row(dict(INFO), cands, cupyx, chosen, model, MIN_BYTES, BW, BW)


def test_vendor_is_the_prepared_call_and_cupyx_beside_it():
    r = row([cand("spmv.csr_scalar", 0.05, ms_b2b=0.04), cand("spmv.ellr[sorted=False]", 0.06),
             cand("spmv.cusparse", 0.08, ms_b2b=0.07, path="prepared")])
    assert r["kernel"] == "spmv.csr_scalar" and r["ms"] == 0.05
    assert r["vendor_ms"] == 0.08 and r["vendor_path"] == "prepared" and r["cupyx_ms"] == 0.12
    assert r["speedup_vs_vendor"] == pytest.approx(0.08 / 0.05)
    assert r["speedup_vs_cupyx"] == pytest.approx(0.12 / 0.05)
    assert r["vendor_speedup_vs_cupyx"] == pytest.approx(0.12 / 0.08)
    assert r["planner_speedup_vs_vendor"] == pytest.approx(0.08 / 0.06) and r["planner_correct"]
    assert r["oracle_kernel"] == "spmv.csr_scalar" and r["planner_vs_oracle"] == pytest.approx(0.06 / 0.05)
    assert r["vendor_ms_b2b"] == 0.07 and r["cupyx_ms_b2b"] == 0.09 and r["ms_b2b"] == 0.04
    assert r["cupyx_frac_of_copy_bw"] == pytest.approx(MIN_BYTES / 0.12e-3 / BW)
    assert r["all_correct"]
    json.dumps(r)   # the row goes into the result file as it is


def test_a_wrong_vendor_gives_no_ratio():
    r = row([cand("spmv.csr_scalar", 0.05), cand("spmv.ellr[sorted=False]", 0.06),
             cand("spmv.cusparse", 0.01, correct=False)])
    assert r["vendor_ms"] is None and r["vendor_correct"] is False
    assert r["speedup_vs_vendor"] is None and r["planner_speedup_vs_vendor"] is None
    assert r["oracle_kernel"] == "spmv.csr_scalar"          # a wrong candidate is never the oracle
    assert not r["all_correct"]


def test_a_wrong_planner_choice_and_a_wrong_cupyx_count_nowhere():
    r = row([cand("spmv.csr_scalar", 0.05), cand("spmv.ellr[sorted=False]", 0.03, correct=False),
             cand("spmv.cusparse", 0.08)], cupyx=dict(ms=0.01, correct=False))
    assert r["planner_ms"] is None and r["planner_correct"] is False and r["planner_vs_oracle"] is None
    assert r["kernel"] == "spmv.csr_scalar"                  # the fastest correct one, not the wrong one
    assert r["cupyx_ms"] is None and r["speedup_vs_cupyx"] is None and r["cupyx_correct"] is False


def test_failed_candidates_and_a_failed_cupyx_call():
    r = row([dict(kernel="spmv.brc", error="CUDARuntimeError: boom"), cand("spmv.cusparse", 0.08)],
            cupyx=dict(error="RuntimeError: no spmv"), chosen="spmv.cusparse")
    assert r["kernel"] is None and r["ms"] is None and r["speedup_vs_vendor"] is None
    assert r["planner_speedup_vs_vendor"] == pytest.approx(1.0)   # the planner may pick the vendor
    assert r["cupyx_error"] == "RuntimeError: no spmv" and not r["all_correct"]


def test_summary_geomeans_count_only_checked_rows():
    good = row([cand("spmv.csr_scalar", 0.05), cand("spmv.ellr[sorted=False]", 0.04), cand("spmv.cusparse", 0.1)])
    other = row([cand("spmv.csr_scalar", 0.02), cand("spmv.ellr[sorted=False]", 0.04), cand("spmv.cusparse", 0.08)])
    wrong_vendor = row([cand("spmv.csr_scalar", 0.05), cand("spmv.ellr[sorted=False]", 0.05),
                        cand("spmv.cusparse", 0.001, correct=False)])
    s = bench.summary_of([good, other, wrong_vendor])["float64"]
    assert s["rows"] == 3 and s["planner_rows_counted"] == 2 and s["best_rows_counted"] == 2
    assert s["planner_geomean_speedup_vs_vendor"] == pytest.approx((0.1 / 0.04 * 0.08 / 0.04) ** 0.5)
    assert s["best_geomean_speedup_vs_vendor"] == pytest.approx((0.1 / 0.04 * 0.08 / 0.02) ** 0.5)
    assert s["min_planner_speedup_vs_vendor"] == pytest.approx(2.0)
    assert bench.summary_of([]) == {}


def test_vendor_is_its_fastest_config_checked_correct():
    """Every vendor config is a timed candidate; vendor_ms is the least single-call median of those
    checked correct (a faster wrong or failed one never counts), b2b its own least."""
    r = row([cand("spmv.csr_scalar", 0.05, ms_b2b=0.045),
             cand("spmv.cusparse", 0.09, ms_b2b=0.05, path="prepared"),
             cand("spmv.cusparse[order=col]", 0.07, ms_b2b=0.066, path="prepared"),
             cand("spmv.cusparse[alg=csr_alg2]", 0.02, correct=False, path="prepared"),
             dict(kernel="spmv.cusparse[alg=csr_alg3,order=col]", error="RuntimeError: cuSPARSE refused"),
             cand("spmv.cusparse[alg=csr_alg1,order=col]", 0.08, path="prepared")],
            chosen="spmv.cusparse[order=col]")
    assert r["vendor_ms"] == 0.07 and r["vendor_config"] == "spmv.cusparse[order=col]"
    assert r["vendor_ms_b2b"] == 0.05 and r["vendor_config_b2b"] == "spmv.cusparse"
    assert r["vendor_correct"] and r["vendor_path"] == "prepared"
    assert r["vendor_configs_correct"] == 3 and r["vendor_configs_failed"] == 2
    assert r["kernel"] == "spmv.csr_scalar" and r["speedup_vs_vendor"] == pytest.approx(0.07 / 0.05)
    assert r["oracle_kernel"] == "spmv.csr_scalar" and r["planner_speedup_vs_vendor"] == pytest.approx(1.0)
    assert r["kernel_b2b"] == "spmv.csr_scalar"            # a vendor config is never "ours"
    s = bench.summary_of([r, row([cand("spmv.csr_scalar", 0.05), cand("spmv.cusparse", 0.06)])])["float64"]
    assert s["vendor_configs_won"] == {"order=col": 1, "default": 1}
    assert bench.vendor_config_name("spmv.cusparse[alg=csr_alg2,order=col]") == "alg=csr_alg2,order=col"


def test_no_correct_vendor_config_gives_no_vendor_figure():
    r = row([cand("spmv.csr_scalar", 0.05), cand("spmv.cusparse", 0.01, correct=False, path="prepared"),
             dict(kernel="spmv.cusparse[order=col]", error="RuntimeError: boom")])
    assert r["vendor_ms"] is None and r["vendor_config"] is None and not r["vendor_correct"]
    assert r["vendor_path"] == "prepared" and r["vendor_configs_failed"] == 2
    assert r["speedup_vs_vendor"] is None


def test_every_vendor_config_is_timed():
    """candidates_to_time adds the vendor's search space to the planner's candidates, once each."""
    from matplan.core import device
    from matplan.core.features import Features
    from matplan.core.types import Candidate
    f = Features(op="spmm", dtype="float32", backend="gpu", m=1000, n=800, k=4, nnz=9000, index_dtype="int32")
    pl = types.SimpleNamespace(features=f, candidates=[
        Candidate("spmv.csr_scalar", {}, 0.0, 1e-4, 1e-4, "analytic", ""),
        Candidate("spmv.cusparse", {}, 0.0, 2e-4, 2e-4, "analytic", ""),
        Candidate("spmv.brc", {}, 0.0, 0.0, float("inf"), "rejected", "no")])
    todo = bench.candidates_to_time(pl, device.known("H100"))
    vendor = [p for k, p, _ in todo if k == "spmv.cusparse"]
    assert len(vendor) == 8 and vendor[0] == {} and {"alg": "csr_alg3", "order": "col"} in vendor
    assert [k for k, _, _ in todo if k != "spmv.cusparse"] == ["spmv.csr_scalar"]
    assert all(t > 0 for k, _, t in todo)
    spmv = types.SimpleNamespace(features=Features(op="spmv", dtype="float64", backend="gpu", m=10, n=10, k=1,
                                                   nnz=30, index_dtype="int64"),
                                 candidates=[Candidate("spmv.cusparse", {}, 0.0, 2e-5, 2e-5, "analytic", "")])
    assert [p for _, p, _ in bench.candidates_to_time(spmv, device.known("H100"))] == [{}, {"alg": "csr_alg2"}]


def test_vendor_path_names_the_fallback():
    call = types.SimpleNamespace(layout_fallbacks={(4, 2): "cuSPARSE refused B of 4 columns, row-major: X"})
    assert bench.vendor_path(types.SimpleNamespace(meta={"cusparse": call, "fallback": None})) == \
        "cupyx A @ x: cuSPARSE refused B of 4 columns, row-major: X"
    call.layout_fallbacks = {}
    assert bench.vendor_path(types.SimpleNamespace(meta={"cusparse": call, "fallback": None})) == "prepared"
    assert bench.vendor_path(types.SimpleNamespace(meta={"cusparse": call, "fallback": "values of float16"})) == \
        "cupyx A @ x: values of float16"


def test_result_names():
    args = types.SimpleNamespace(k=16, sizes=["large"], only=None, quick=False, no_real=False, tag="")
    assert bench.result_name(args) == "spmv-k16"
    args.only = ["poisson3d-large"]
    assert bench.result_name(args) == "spmv-k16-only"


def test_summary_says_which_vendor_is_which(tmp_path):
    r1 = row([cand("spmv.csr_scalar", 0.05), cand("spmv.ellr[sorted=False]", 0.06), cand("spmv.cusparse", 0.08)])
    r2 = row([cand("spmv.csr_scalar", 0.05), cand("spmv.ellr[sorted=False]", 0.06),
              cand("spmv.cusparse", 0.08, path="cupyx A @ x: values of float16")],
             cupyx=dict(ms=0.2, correct=False))
    r2["matrix"], r2["vendor_path"] = "rmat-large", "cupyx A @ x: values of float16"
    doc = dict(benchmark="spmv", device="NVIDIA H100 80GB HBM3", device_slug="h100", commit="a" * 40,
               commit_source="git", k=1, reuse=1000, sizes=["large"], results=[r1, r2])
    (tmp_path / "spmv-h100.json").write_text(json.dumps(doc))
    md, tables = summarize.build_summary(tmp_path)
    text = "\n".join(md)
    assert "Vendor: cuSPARSE prepared once (`spmv.cusparse`" in text
    assert "the fastest of its configurations checked correct" in text      # the rows name vendor_config
    assert "what a CuPy user's call costs: cupyx `A @ x` (descriptors and workspace made per call" in text
    rows = tables[0][2].rows
    assert rows[0].cupy_ms == 0.12 and rows[0].planner_vs_cupy == pytest.approx(0.12 / 0.06)
    assert rows[1].cupy_ms is None and rows[1].planner_vs_cupy is None          # cupyx was wrong there
    assert rows[1].extra["vendor ran"][0] == "cupyx A @ x: values of float16"


def test_summary_states_the_bandwidth_beside_the_planners(tmp_path):
    doc = dict(benchmark="spmv", device="NVIDIA H100 80GB HBM3", device_slug="h100", commit="a" * 40,
               commit_source="git", copy_bandwidth_gbs=2919.3, planner_bandwidth_gbs=2874.0, k=1, reuse=1000,
               sizes=["large"], results=[row([cand("spmv.csr_scalar", 0.05), cand("spmv.ellr[sorted=False]", 0.06),
                                              cand("spmv.cusparse", 0.08)])])
    (tmp_path / "spmv-h100.json").write_text(json.dumps(doc))
    text = "\n".join(summarize.build_summary(tmp_path)[0])
    assert "copy bandwidth 2,919 GB/s measured (the planner's: 2,874)" in text
