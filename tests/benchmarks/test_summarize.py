"""benchmarks/summarize.py builds SUMMARY.md from small fake result files; _common names them."""
import builtins
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _common  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import summarize  # noqa: E402


def _cand(kernel, ms, correct=True):
    return dict(kernel=kernel, ms=ms, correct=correct, prepare_ms=0.0)


SPMV = dict(benchmark="spmv", device="NVIDIA H100 80GB HBM3", device_slug="h100", commit="a" * 40, date="2026-01-02",
            k=1, reuse=1000, sizes=["large"], results=[
                dict(matrix="poisson3d-large", dtype="float64", kernel="spmv.csr_scalar", ms=0.05, vendor_ms=0.15,
                     frac_of_copy_bw=0.73, frac_of_copy_bw_b2b=0.86, planner_kernel="spmv.ellr", planner_ms=0.06,
                     planner_vs_oracle=1.2, planning_ms=11.0,
                     candidates=[_cand("spmv.csr_scalar", 0.05), _cand("spmv.ellr", 0.06),
                                 _cand("spmv.cusparse", 0.15)]),
                dict(matrix="rmat-large", dtype="float64", kernel="spmv.csr_merge", ms=0.1, vendor_ms=0.12,
                     frac_of_copy_bw=0.4, planner_kernel="spmv.brc", planner_ms=0.09, planner_vs_oracle=1.0,
                     candidates=[_cand("spmv.csr_merge", 0.1), _cand("spmv.brc", 0.09, correct=False),
                                 _cand("spmv.cusparse", 0.12)])])
SPGEMM = dict(benchmark="spgemm", device="NVIDIA H100 80GB HBM3", device_slug="h100", commit="b" * 40, dtype="float64",
              results=[dict(matrix="poisson3d-spgemm", ms=0.3, unguessed_ms=0.6, vendor_ms=1.2, merge_ms=1.8,
                            status="ok", correct_rowsums=True, vendor_status="ok", merge_status="ok",
                            planner_kernel="spgemm.hash", planner_ms=0.33, products=1000),
                       dict(matrix="wordnet", ms=800.0, status="ok", correct_rowsums=True, vendor_ms=None,
                            vendor_status="not run: past the known limit", planner_kernel="spgemm.hash",
                            planner_ms=800.0)])
TSGEMM = dict(device="NVIDIA H200", commit="c" * 7, rows=[
    dict(n=8192, k=4, dtype="float32", layout="C", ms=0.1, vendor_ms=0.2, frac_of_copy_bw=0.85,
         frac_of_copy_bw_b2b=0.95, planner_kernel="tsgemm.tsm2", planner_ms=0.11, max_rel_err=1e-7, variant="register"),
    dict(n=8192, k=32, dtype="float64", layout="F", ms=0.5, vendor_ms=0.4, frac_of_copy_bw=0.6,
         planner_kernel="gemm.cublas", planner_ms=0.41, max_rel_err=1e-3)])


@pytest.fixture
def folder(tmp_path):
    for name, doc in (("spmv-h100.json", SPMV), ("spgemm-h100.json", SPGEMM), ("tsgemm-h200.json", TSGEMM)):
        (tmp_path / name).write_text(json.dumps(doc))
    return tmp_path


def test_rows_and_ratios(folder):
    md, tables = summarize.build_summary(folder)
    by_op = {t.op: t for _, _, t in tables}
    spmv = by_op["spmv"].rows
    assert [r.matrix for r in spmv] == ["poisson3d-large", "rmat-large"]
    assert spmv[0].speedup == pytest.approx(3.0) and spmv[0].planner_speedup == pytest.approx(2.5)
    assert spmv[0].planner_vs_oracle == pytest.approx(1.2) and spmv[0].frac_bw == pytest.approx(0.73)
    # the planner's kernel was wrong on rmat: its ratio does not count, ours does
    assert spmv[1].speedup == pytest.approx(1.2) and spmv[1].planner_speedup is None
    assert spmv[1].checked == "WRONG: planner"
    spgemm = by_op["spgemm"].rows
    assert spgemm[0].speedup == pytest.approx(4.0) and spgemm[0].extra["full x vendor"][0] == pytest.approx(2.0)
    assert spgemm[0].planner_vs_oracle == pytest.approx(1.0) and spgemm[0].frac_bw is None
    assert spgemm[1].speedup is None and spgemm[1].vendor_ms is None
    tsgemm = by_op["tsgemm"].rows
    assert tsgemm[0].matrix == "n=8192 k=4 C" and tsgemm[0].speedup == pytest.approx(2.0)
    assert tsgemm[1].ours_ok is False and tsgemm[1].speedup is None   # error 1e-3 in float64
    assert tsgemm[1].planner_vs_oracle == pytest.approx(1.0)          # cuBLAS was the faster
    text = "\n".join(md)
    assert ("| poisson3d-large | float64 | spmv.csr_scalar | 0.05 | 0.15 | 3.00 | 0.73 | 0.86 | spmv.ellr | 0.06 "
            "| 2.50 | 1.20 |") in text
    assert "| wordnet | float64 | spgemm.hash | 800 | n/a | n/a |" in text
    # geomeans over checked rows only: SpMV ours (3.0 * 1.2) ** 0.5, planner 2.5 alone
    assert "float64: geomean over the vendor ours 1.90x, plan 2.50x" in text
    assert "(1 of 2 rows checked correct, ours and vendor)" in text
    assert "| `tsgemm-h200.json` | tsgemm | NVIDIA H200 | ccccccc |" in text
    assert "| `spmv-h100.json` | spmv | NVIDIA H100 80GB HBM3 | aaaaaaaaaa | 2026-01-02 |" in text


def test_write_summary_without_matplotlib(folder, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    path = summarize.write_summary(folder)
    text = path.read_text()
    assert path.name == "SUMMARY.md" and "## SpMV" in text and "## Tall-and-skinny GEMM" in text
    assert "Plots skipped: matplotlib is not installed" in text
    assert not list(folder.glob("summary-*.png"))


def test_device_slug_and_result_file(tmp_path):
    assert _common.device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert _common.device_slug("NVIDIA H200") == "h200"
    assert _common.device_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert _common.device_slug("NVIDIA H100 PCIe") == "h100pcie"
    path = _common.write_result(tmp_path, "spmv-k16", "NVIDIA H100 80GB HBM3", {"results": [], "commit": "stale"})
    doc = json.loads(path.read_text())
    assert path.name == "spmv-k16-h100.json"
    assert doc["benchmark"] == "spmv-k16" and doc["device"] == "NVIDIA H100 80GB HBM3" and doc["device_slug"] == "h100"
    assert doc["commit"] != "stale" and doc["commit_source"] in ("git", "none") and "source_digest" in doc
    assert doc["date"].endswith("Z") and doc["results"] == []


def test_commit_without_git(monkeypatch):
    def no_git(*args, **kwargs):
        raise OSError("no git")
    monkeypatch.setattr(_common.subprocess, "run", no_git)
    monkeypatch.setenv("MATPLAN_COMMIT", "abc1234")       # never read: a stated commit can be stale
    _common.commit_info.cache_clear()
    try:
        info = _common.commit_info()
    finally:
        _common.commit_info.cache_clear()
    assert info["commit"] == "unknown (no .git)" and info["commit_source"] == "none" and info["tree_dirty"] is None
    assert info["source_digest"] == _common.source_digest() and len(info["source_digest"]) == 16


def test_commit_of_a_copy_inside_another_repository(monkeypatch, tmp_path):
    """A tree copied without .git under some other checkout must not take that checkout's commit."""
    monkeypatch.setattr(_common, "REPO", tmp_path / "copy")
    (tmp_path / "copy").mkdir()
    monkeypatch.setattr(_common, "_git", lambda *a: str(tmp_path) if a[:2] == ("rev-parse", "--show-toplevel")
                        else "f" * 40)
    _common.commit_info.cache_clear()
    try:
        assert _common.commit_info()["commit"] == "unknown (no .git)"
    finally:
        _common.commit_info.cache_clear()


def test_commit_read_from_git(monkeypatch):
    info = _common.commit_info()
    if info["commit_source"] != "git":
        pytest.skip("no git checkout here")
    head = _common.subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                  cwd=_common.REPO).stdout.strip()
    assert info["commit"] == head and isinstance(info["tree_dirty"], bool)
    assert summarize._commit(dict(commit="a" * 40, commit_source="git", tree_dirty=True, source_digest="d" * 16)) == \
        "aaaaaaaaaa (tree modified)"
    assert summarize._commit(dict(commit="unknown (no .git)", commit_source="none", source_digest="d" * 16)) == \
        "unknown (no .git) (sources dddddddddddddddd)"


def test_source_digest_follows_the_sources(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "k.cu").write_text("// kernel\n")
    (tmp_path / "notes.txt").write_text("not a source")
    first = _common.source_digest(tmp_path)
    (tmp_path / "notes.txt").write_text("changed")
    assert _common.source_digest(tmp_path) == first
    (tmp_path / "k.cu").write_text("// kernel, changed\n")
    assert _common.source_digest(tmp_path) != first


def test_provenance_without_a_gpu_has_no_bandwidth(monkeypatch):
    monkeypatch.setattr(_common, "cupy_module", lambda: None)
    _common.bandwidth_info.cache_clear()
    assert _common.bandwidth_info() == {}
    doc = _common.provenance("spmv", "cpu")
    assert "copy_bandwidth_gbs" not in doc and doc["commit"] == _common.commit_info()["commit"]
