"""Saved learned models are safe to load and never crash a plan (issue 40, items 7 and 8).

* the trees are plain arrays: NumPy's walk gives scikit-learn's predictions, the shipped files
  load with allow_pickle=False, and loading imports no scikit-learn;
* a model is loaded only from a path the user names (MATPLAN_MODEL), never from a folder scanned
  by default, and not when others can write its files or folders;
* any load failure gives one warning naming the file and the reason, and plans stay analytic.
"""
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from sklearn.ensemble import HistGradientBoostingRegressor

from matplan import planner
from matplan.cli import main
from matplan.models import learned, learned_files
from matplan.models.learned_forest import Forest, export_hgb
from learned_helpers import fit_and_save, problem
from tuning_helpers import CHOICE_KERNELS, registered


@pytest.fixture(scope="module")
def kernels():
    with registered(*CHOICE_KERNELS):
        yield


@pytest.fixture(autouse=True)
def clean_env(tmp_path, monkeypatch):
    """No named model, user folders under tmp_path, nothing cached."""
    for var in (learned.MODEL_ENV, learned.COST_MODEL_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(learned.MODEL_DIR_ENV, str(tmp_path / "xdg" / "matplan" / "models"))
    learned.clear_cache()
    yield
    learned.clear_cache()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, kernels):
    folder = tmp_path_factory.mktemp("trained")
    folder.chmod(0o700)
    return fit_and_save(folder)


@pytest.fixture
def mine(trained, tmp_path, monkeypatch):
    """A copy of the trained model in a private folder, named by MATPLAN_MODEL."""
    d = tmp_path / "mine"
    d.mkdir(mode=0o700)
    for suffix in (".npz", ".json"):
        (d / f"cpu{suffix}").write_bytes(trained.with_suffix(suffix).read_bytes())
    monkeypatch.setenv(learned.MODEL_ENV, str(d / "cpu.npz"))
    return d / "cpu.npz"


def _sources(p) -> set:
    return {c.source for c in p.candidates if c.source != "rejected"}


def _plan_twice():
    """Two plans of one problem; (the plans, the ModelWarnings they gave)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plans = [planner.plan(*problem(), measure="never") for _ in range(2)]
    return plans, [w for w in caught if issubclass(w.category, learned.ModelWarning)]


# --- the NumPy forest ----------------------------------------------------------------------
def _hgb_data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(400, 6))
    X[rng.random(X.shape) < 0.1] = np.nan           # missing values, so NaN goes either way
    y = np.nan_to_num(X[:, 0]) * 2 + np.where(np.isnan(X[:, 1]), 3.0, np.sin(np.nan_to_num(X[:, 1])))
    return X, y + rng.normal(scale=0.1, size=len(y))


def test_exported_forest_predicts_as_scikit_learn():
    """A freshly fitted regressor: export + NumPy predict == scikit-learn's predict, on rows with
    NaN, infinities and values exactly at the split thresholds, and after an .npz round trip."""
    X, y = _hgb_data()
    hgb = HistGradientBoostingRegressor(max_iter=60, max_leaf_nodes=15, random_state=0).fit(X, y)
    forest = export_hgb(hgb)
    Xt, _ = _hgb_data(seed=1)
    at = Xt[:50].copy()
    thresholds = forest.threshold[np.isfinite(forest.threshold)]
    at[:, :] = thresholds[np.arange(at.size) % len(thresholds)].reshape(at.shape)
    Xt = np.vstack([Xt, at, np.full((1, 6), np.inf), np.full((1, 6), -np.inf), np.full((1, 6), np.nan)])
    want = hgb.predict(Xt)
    np.testing.assert_array_equal(forest.predict(Xt), want)          # to the last bit
    np.testing.assert_array_equal(forest.predict_levels(Xt), want)
    for r in (1, 2, 3):   # one row and a few
        np.testing.assert_array_equal(forest.predict(Xt[:r]), want[:r])
    buf = io.BytesIO()
    np.savez(buf, **forest.to_arrays())
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as z:
        back = Forest.from_arrays({k: z[k] for k in z.files}, n_features=6)
    np.testing.assert_array_equal(back.predict(Xt), want)
    assert back.depth == forest.depth and back.n_trees == 60


def test_export_refuses_what_the_walk_does_not_reproduce():
    X, y = _hgb_data()
    X[:, 2] = np.floor(np.abs(np.nan_to_num(X[:, 2])) * 3)
    cat = HistGradientBoostingRegressor(max_iter=5, categorical_features=[2], random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="categorical"):
        export_hgb(cat)
    other = HistGradientBoostingRegressor(max_iter=5, loss="absolute_error", random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="squared-error"):
        export_hgb(other)


def _share(a):
    """The root's two children are one node: a tree no more, though the level walk would run it."""
    root = a["roots"][0]
    a["right"][root] = a["left"][root]


def _loop(a):
    """The root's left child sends both ways back to the root."""
    root = a["roots"][0]
    child = a["left"][root]
    assert a["left"][child] != child
    a["left"][child] = a["right"][child] = root


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(left=a["left"] + len(a["left"])), "node index"),
    (lambda a: a.update(feature=a["feature"] + 100), "column outside"),
    (lambda a: a.update(value=a["value"].astype(np.int64)), "expected floats"),
    (lambda a: a.update(threshold=np.full_like(a["threshold"], np.nan)), "NaN threshold"),
    (lambda a: a.pop("roots"), "missing: roots"),
    (lambda a: _loop(a), "cycle"),
    (lambda a: _share(a), "child of two nodes"),
])
def test_forest_arrays_are_checked(change, match):
    """Arrays that would index outside themselves, loop, or have other types are refused on load."""
    X, y = _hgb_data()
    arrays = export_hgb(HistGradientBoostingRegressor(max_iter=3, random_state=0).fit(X, y)).to_arrays()
    change(arrays)
    with pytest.raises(ValueError, match=match):
        Forest.from_arrays(arrays, n_features=6)


# --- the shipped models --------------------------------------------------------------------
def test_shipped_models_are_plain_arrays():
    """No pickle in the package's models: every array is numeric and loads with allow_pickle=False."""
    shipped = sorted(learned.PACKAGE_DIR.iterdir())
    assert {p.suffix for p in shipped if p.is_file()} <= {".npz", ".json"}
    npzs = [p for p in shipped if p.suffix == ".npz"]
    assert {p.stem for p in npzs} >= {"h100", "h200"}
    for path in npzs:
        with np.load(path, allow_pickle=False) as z:
            assert z.files and all(z[name].dtype.kind in "biuf" for name in z.files)
        meta = json.loads(path.with_suffix(".json").read_text())
        model = learned.load_file(path, device_class=meta["device_class"])
        assert path.stem == meta["device_class"].lower() and model.n_samples_ == meta["n_samples"]


def test_loading_and_planning_need_no_scikit_learn():
    """Importing matplan (and its CLI), loading a shipped model and predicting import no scikit-learn."""
    code = ("import sys, numpy as np, matplan, matplan.cli\n"
            "from matplan.models import learned\n"
            "m = learned.load_file(learned.PACKAGE_DIR / 'h100.npz', device_class='H100')\n"
            "m.predict_z(np.zeros((3, len(m.schema_.columns))))\n"
            "print(m.n_samples_, 'sklearn' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[1:] == ["False"]


# --- where models come from ----------------------------------------------------------------
class _Marker:
    """Unpickling this writes a file: the issue's reproduction of code run by loading a model."""
    path = ""

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _plant(folder: Path, marker: Path):
    """A pickle-bearing model in ``folder`` under every name and format the old loader accepted."""
    folder.mkdir(parents=True, exist_ok=True)
    _Marker.path = str(marker)
    payload = pickle.dumps(_Marker())
    (folder / "cpu.joblib").write_bytes(payload)
    buf = io.BytesIO()
    np.savez(buf, **{"forest0.value": np.array([_Marker()], dtype=object)})
    (folder / "cpu.npz").write_bytes(buf.getvalue())
    for fmt, data in ((1, payload), (2, buf.getvalue())):
        meta = {"format": fmt, "name": "cpu", "device_class": "cpu", "kind": "combined", "created": "9999",
                "sha256": hashlib.sha256(data).hexdigest(), "forests": [{"key": "*", "target": "run"}]}
        (folder / ("cpu.json" if fmt == 2 else "old.json")).write_text(json.dumps(meta))


def test_models_in_default_folders_are_never_loaded(kernels, tmp_path):
    """The issue's reproduction: a pickle planted in the user's model folders runs nothing, and a
    trained model there is not used until named."""
    marker = tmp_path / "marker"
    for folder in (tmp_path / "xdg" / "matplan" / "models", Path(os.environ[learned.MODEL_DIR_ENV])):
        _plant(folder, marker)
    plans, caught = _plan_twice()
    mtx = tmp_path / "a.mtx"
    scipy.io.mmwrite(str(mtx), problem()[0])
    assert main(["plan", str(mtx), "--cpu"]) == 0
    assert not marker.exists() and not caught
    assert all(_sources(p) == {"analytic"} for p in plans)


def test_a_named_pickle_is_refused_without_running_it(kernels, tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    folder = tmp_path / "planted"
    folder.mkdir(mode=0o700)
    _plant(folder, marker)
    monkeypatch.setenv(learned.MODEL_ENV, str(folder / "cpu.npz"))
    plans, caught = _plan_twice()
    assert not marker.exists() and len(caught) == 1 and str(folder / "cpu.npz") in str(caught[0].message)
    assert _sources(plans[0]) == {"analytic"}


def test_a_named_model_is_used(kernels, mine):
    plans, caught = _plan_twice()
    assert not caught and _sources(plans[0]) == {"learned"}
    assert learned.find("cpu") == mine and learned.find("H100") == learned.PACKAGE_DIR / "h100.npz"


def test_named_models_for_other_device_classes(kernels, mine, tmp_path, monkeypatch):
    """One named model per device class: a model for another class is not used here, with a note."""
    meta = json.loads(mine.with_suffix(".json").read_text())
    mine.with_suffix(".json").write_text(json.dumps(dict(meta, device_class="V100")))
    plans, caught = _plan_twice()
    assert len(caught) == 1 and "names no model for device class cpu" in str(caught[0].message)
    assert _sources(plans[0]) == {"analytic"}


@pytest.mark.parametrize("where", ["file", "folder", "parent"])
@pytest.mark.parametrize("bits, who", [(0o020, "group"), (0o002, "world")])
def test_writable_by_others_is_refused(kernels, mine, where, bits, who):
    target = {"file": mine, "folder": mine.parent, "parent": mine.parent.parent}[where]
    mode = target.stat().st_mode & 0o777
    target.chmod(mode | bits)
    try:
        with pytest.raises(learned.ModelLoadError, match=f"{target} is {who}-writable"):
            learned.load_file(mine)
        plans, caught = _plan_twice()
        assert len(caught) == 1 and f"{who}-writable" in str(caught[0].message)
        assert _sources(plans[0]) == {"analytic"}
    finally:
        target.chmod(mode)
    learned.clear_cache()
    assert _sources(_plan_twice()[0][0]) == {"learned"}


# --- load failures: one warning, analytic costs, no crash ----------------------------------
def _rehash(npz: Path, data: bytes):
    """Write ``data`` as the model and record its hash: a corrupt file that passes the integrity check."""
    npz.write_bytes(data)
    meta = json.loads(npz.with_suffix(".json").read_text())
    npz.with_suffix(".json").write_text(json.dumps(dict(meta, sha256=hashlib.sha256(data).hexdigest())))


def _edit_meta(npz: Path, edit):
    meta = json.loads(npz.with_suffix(".json").read_text())
    edit(meta)
    npz.with_suffix(".json").write_text(json.dumps(meta))


def _edit_arrays(npz: Path, edit):
    with np.load(npz, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    _rehash(npz, buf.getvalue())


BREAKAGES = {
    "truncated, re-hashed": (lambda p: _rehash(p, p.read_bytes()[:1000]), "cannot be loaded|malformed"),
    "not a zip, re-hashed": (lambda p: _rehash(p, b"\x80\x04garbage" * 10), "malformed"),
    "tampered": (lambda p: p.write_bytes(p.read_bytes()[:-4] + b"0000"), "SHA-256"),
    "npz missing": (lambda p: p.unlink(), "cannot be read"),
    "metadata missing": (lambda p: p.with_suffix(".json").unlink(), "cannot be read"),
    "invalid JSON": (lambda p: p.with_suffix(".json").write_text("{not json"), "not valid JSON"),
    "JSON not an object": (lambda p: p.with_suffix(".json").write_text("[1, 2]"), "not a JSON object"),
    "old format": (lambda p: _edit_meta(p, lambda m: m.update(format=1)), "format 1"),
    "missing key": (lambda p: _edit_meta(p, lambda m: m.pop("forests")), "'forests' is missing"),
    "bad validation": (lambda p: _edit_meta(p, lambda m: m.update(validation={"method": 3})), "'validation'"),
    "schema version": (lambda p: _edit_meta(p, lambda m: m["feature_schema"].update(version=99)), "feature schema 99"),
    "schema columns": (lambda p: _edit_meta(p, lambda m: m["feature_schema"].update(columns=["x"])), "columns"),
    "forest missing": (lambda p: _edit_meta(p, lambda m: m["forests"].append({"key": "spmv", "target": "run"})),
                       "missing|run and a prepare"),
    "node out of range": (lambda p: _edit_arrays(p, lambda a: a.update({"forest0.left": a["forest0.left"] + 10**6})),
                          "node index"),
}


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_a_broken_model_warns_once_and_plans_analytically(kernels, mine, name):
    breakage, reason = BREAKAGES[name]
    breakage(mine)
    with pytest.raises(learned.ModelLoadError, match=reason):
        learned.load_file(mine)
    plans, caught = _plan_twice()
    assert len(caught) == 1, [str(w.message) for w in caught]
    text = str(caught[0].message)
    assert str(mine.parent) in text and "analytic costs" in text
    assert all(_sources(p) == {"analytic"} for p in plans)


def test_cli_plan_and_demo_survive_a_broken_model(mine, tmp_path, capsys):
    mine.with_suffix(".json").write_text("{broken")
    mtx = tmp_path / "a.mtx"
    scipy.io.mmwrite(str(mtx), problem()[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["plan", str(mtx), "--cpu"]) == 0
        learned.clear_cache()
        assert main(["demo", "--cpu"]) == 0
    assert "results match SciPy" in capsys.readouterr().out
    assert len([w for w in caught if issubclass(w.category, learned.ModelWarning)]) == 2   # one per cache


def test_a_model_that_cannot_predict_warns_once(kernels, mine, monkeypatch):
    """Should prediction itself fail, the model is dropped with one warning (no crash)."""
    def boom(self, *args):
        raise ValueError("simulated")
    monkeypatch.setattr(learned.CostModel, "predict_z", boom)
    monkeypatch.setattr(learned.CostModel, "predict_problem", boom)   # the planner's way in
    plans, caught = _plan_twice()
    assert len(caught) == 1 and "prediction failed: ValueError: simulated" in str(caught[0].message)
    assert all(_sources(p) == {"analytic"} for p in plans)
