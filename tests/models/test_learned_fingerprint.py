"""Learned models never go stale silently (issue 40, item 9).

Each model records the fingerprint of the kernel and cost-model sources it was trained against;
a planner that meets another warns once and keeps the analytic costs (and its measurement); and
a shipped model that no longer matches the sources fails this suite, until it is re-tuned and
retrained or re-stamped as a recorded decision (python -m matplan.models.learned_restamp).
"""
import json
import shutil
import warnings

import pytest

from matplan import planner
from matplan.core import device as device_mod
from matplan.models import learned, learned_fingerprint, learned_restamp
from learned_helpers import fit_and_save, problem
from tuning_helpers import CHOICE_KERNELS, registered


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in (learned.MODEL_ENV, learned.COST_MODEL_ENV):
        monkeypatch.delenv(var, raising=False)
    learned.clear_cache()
    yield
    learned.clear_cache()


def test_shipped_models_match_the_installed_sources():
    """Fails when a kernel or cost model changed after the shipped models were trained: re-tune and
    retrain them (matplan tune; matplan train --package), or, where the change leaves the kernels'
    times alone, re-stamp them and record the decision in CHANGELOG.md."""
    stale = {path.name: why for path, why in learned_restamp.check().items() if why}
    assert not stale, (f"shipped learned models are stale: {stale}. Re-tune and retrain them, or run "
                       f"`{learned.RESTAMP}` and record the decision in CHANGELOG.md")


def test_the_fingerprint_covers_kernels_and_cost_models():
    files = learned_fingerprint.source_files()
    assert {"kernels/spmv/spmv.cu", "kernels/registry.py", "models/spmv.py", "models/tsgemm.py"} <= set(files)
    assert any(f.endswith(".cuh") for f in files) and any(f.startswith("kernels/tsgemm/") for f in files)
    assert not [f for f in files if f.startswith("models/learned") or "__pycache__" in f]
    now = learned_fingerprint.current()
    assert set(now["files"]) == set(files) and len(now["sha256"]) == 64


def _copy_sources(tmp_path):
    root = tmp_path / "matplan"
    for rel in learned_fingerprint.source_files():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(learned_fingerprint.ROOT / rel, root / rel)
    return root


def test_a_source_change_is_named_and_line_endings_are_not(tmp_path):
    root = _copy_sources(tmp_path)
    before = learned_fingerprint.compute(root)
    assert before == learned_fingerprint.current()
    cu = root / "kernels" / "spmv" / "spmv.cu"
    cu.write_bytes(cu.read_bytes().replace(b"\n", b"\r\n"))
    assert learned_fingerprint.compute(root) == before           # CRLF checkout: same sources
    cu.write_bytes(cu.read_bytes() + b"// a change\n")
    (root / "models" / "new_model.py").write_text("X = 1\n")
    (root / "models" / "learned_other.py").write_text("ignored = True\n")
    why = learned_fingerprint.mismatch(before, learned_fingerprint.compute(root))
    assert why == "sources changed since it was trained: kernels/spmv/spmv.cu, models/new_model.py"
    assert learned_fingerprint.mismatch({}, before) == "it records no source fingerprint"


@pytest.fixture
def stale_model(tmp_path, monkeypatch):
    """A trained model, named by MATPLAN_MODEL, whose recorded sources differ in one kernel file."""
    d = tmp_path / "mine"
    d.mkdir(mode=0o700)
    with registered(*CHOICE_KERNELS):
        path = fit_and_save(d)
    meta = json.loads(path.with_suffix(".json").read_text())
    meta["sources"]["files"]["kernels/spmv/spmv.cu"] = "0" * 64
    meta["sources"]["sha256"] = "1" * 64
    path.with_suffix(".json").write_text(json.dumps(meta))
    monkeypatch.setenv(learned.MODEL_ENV, str(path))
    return path


def test_a_stale_model_warns_once_and_plans_analytically(stale_model):
    with registered(*CHOICE_KERNELS), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plans = [planner.plan(*problem(), measure="never") for _ in range(2)]
    stale = [w for w in caught if issubclass(w.category, learned.StaleModelWarning)]
    assert len(stale) == 1 and len([w for w in caught if issubclass(w.category, learned.ModelWarning)]) == 1
    text = str(stale[0].message)
    assert str(stale_model) in text and "kernels/spmv/spmv.cu" in text and "learned_restamp" in text
    for p in plans:
        assert {c.source for c in p.candidates} <= {"analytic", "rejected"}


def test_restamp_records_the_decision(stale_model, capsys):
    meta_path = stale_model.with_suffix(".json")
    assert learned_restamp.main(["--check", str(meta_path)]) == 1
    assert "kernels/spmv/spmv.cu" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        learned_restamp.main(["--restamp", str(meta_path)])          # no reason given: refused
    assert learned_restamp.main(["--restamp", "--reason", "moved code only", str(stale_model)]) == 0
    meta = json.loads(meta_path.read_text())
    assert meta["sources"]["restamped"] == "moved code only"
    assert learned_restamp.main(["--check", str(stale_model)]) == 0
    learned.clear_cache()
    with registered(*CHOICE_KERNELS), warnings.catch_warnings():
        warnings.simplefilter("error", learned.ModelWarning)
        p = planner.plan(*problem(), measure="never")
    assert {c.source for c in p.candidates} - {"rejected"} == {"learned"}


def test_the_planner_checks_a_shipped_model_too(monkeypatch):
    """The package's H100 model (the GPU path, asked for directly): used while its sources match,
    dropped with one StaleModelWarning when they do not."""
    h100 = device_mod.known("H100")
    meta = json.loads((learned.PACKAGE_DIR / "h100.json").read_text())
    monkeypatch.setattr(learned_fingerprint, "current", lambda: meta["sources"])
    assert learned.model_for("gpu", h100).metadata_["name"] == "h100"
    learned.clear_cache()
    other = dict(meta["sources"], sha256="2" * 64, files=dict(meta["sources"]["files"], **{"models/spmv.py": "x"}))
    monkeypatch.setattr(learned_fingerprint, "current", lambda: other)
    with pytest.warns(learned.StaleModelWarning, match="h100.npz.*models/spmv.py"):
        assert learned.model_for("gpu", h100) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert learned.model_for("gpu", h100) is None                # cached: no second warning
