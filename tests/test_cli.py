"""The command line: demo checks every result against SciPy; plan prints text and JSON."""
import json

import scipy.io
import scipy.sparse as sp

from matplan.cli import main


def test_demo_matches_scipy(capsys):
    assert main(["demo", "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "results match SciPy" in out
    for op in ("spmv", "spmm", "spgemm", "tsgemm"):
        assert op in out


def test_plan_text_and_json(tmp_path, capsys):
    A = sp.random(60, 50, density=0.1, format="csr", random_state=0)
    path = tmp_path / "a.mtx"
    scipy.io.mmwrite(str(path), A)
    assert main(["plan", str(path), "--cpu", "--k", "4"]) == 0
    assert "matplan plan: spmm" in capsys.readouterr().out
    assert main(["plan", str(path), str(path), "--cpu", "--json"]) == 2  # 60x50 @ 60x50 does not conform
    assert "A and B do not conform" in capsys.readouterr().err
    assert main(["plan", str(path), "--cpu", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["op"] == "spmv" and d["features"]["nnz"] == A.nnz


def test_plan_missing_file(capsys):
    assert main(["plan", "/nonexistent/a.mtx", "--cpu"]) == 2
    assert "/nonexistent/a.mtx" in capsys.readouterr().err
