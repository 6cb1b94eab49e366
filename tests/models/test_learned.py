"""The learned cost model: fit, save/load with metadata, refusal of tampered files, planner use, report.

Loading safety, load failures and staleness: test_learned_files.py and test_learned_fingerprint.py."""
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone

from matplan import planner
from matplan.models import learned, learned_fit
from matplan.tuning_db import tune as tune_mod
from matplan.tuning_db import units as units_mod
from matplan.tuning_db.dataset import load_dataset
from matplan.tuning_db import report as report_mod
from matplan.tuning_db.report import evaluate, format_report
from matplan.tuning_db.store import TuningDB
from matplan.tuning_db.train import fit, train
from tuning_helpers import CHOICE_KERNELS, registered

FAMILIES = ["poisson2d", "poisson3d", "rmat", "uniform", "skewed", "block_dense", "banded"]


@pytest.fixture(scope="module")
def kernels():
    with registered(*CHOICE_KERNELS):
        yield


@pytest.fixture(scope="module")
def tuned_db(tmp_path_factory, kernels):
    """A host tuning database with a real choice: built-in SciPy, three row-chunk sizes, densify."""
    path = tmp_path_factory.mktemp("db") / "tuning.sqlite"
    units = units_mod.corpus_units(["small"], families=FAMILIES, ops=("spmv", "spmm"), spmm_ks=(4, 16),
                                  dtypes=("float64",))
    s = tune_mod.tune(units, db=path, backend="cpu", progress=False, repeats=3, warmup=1, budget_s=0.3)
    assert s.failed == 0 and s.mismatched == 0 and s.timed >= 4 * len(units)
    return path


@pytest.fixture(autouse=True)
def model_dir(tmp_path, monkeypatch):
    """Each test has its own empty user model folder (where train saves), no named model, no cached model."""
    d = tmp_path / "models"
    monkeypatch.setenv(learned.MODEL_DIR_ENV, str(d))
    monkeypatch.delenv(learned.MODEL_ENV, raising=False)
    monkeypatch.delenv(learned.COST_MODEL_ENV, raising=False)
    learned.clear_cache()
    yield d
    learned.clear_cache()


@pytest.fixture(scope="module")
def dataset(tuned_db):
    with TuningDB(tuned_db) as db:
        return load_dataset(db)


def test_dataset_rows(dataset):
    assert dataset.device_class == "cpu"
    kernels = {r.kernel for r in dataset.rows}
    assert kernels == {"cpu.scipy", "test.rowchunk", "test.dense"}
    assert set(dataset.groups()) == set(FAMILIES)
    y = dataset.y()
    assert y.shape == (len(dataset), 2) and np.all(y[:, 0] > 0)
    dense_prep = [r.prepare_s for r in dataset.rows if r.kernel == "test.dense"]
    assert dense_prep and min(dense_prep) > 0


@pytest.mark.parametrize("kind", learned_fit.KINDS)
def test_fit_predict_and_validation(dataset, kind):
    model = fit(dataset, kind=kind, cv=3, max_iter=150)
    pred = model.predict(dataset.queries())
    assert pred.shape == (len(dataset), 2) and np.all(pred > 0)
    v = model.validation_
    assert v["method"].startswith("group k-fold") and v["folds"] == 3 and v["run_median_factor"] >= 1
    # the model learned the row-chunk overhead: on the largest matrix, chunk 16 is slower than 4096
    big = max(dataset.problems, key=lambda fp: dataset.features(fp).m)
    q = [dataset.query(big, "test.rowchunk", {"chunk": c}) for c in (16, 4096)]
    run16, run4096 = model.predict(q)[:, 0]
    assert run16 > 2 * run4096
    in_sample = np.exp(np.median(np.abs(np.log(pred[:, 0] / dataset.y()[:, 0]))))
    assert in_sample < 1.5
    # only the combined model sees the analytic prediction
    assert ("log_analytic_run" in model.schema_.columns) == (kind == "combined")


def test_numpy_forests_match_scikit_learn(dataset):
    """The exported NumPy forests give scikit-learn's predictions, missing values (NaN) included."""
    model = fit(dataset, kind="learned", cv=0, max_iter=80)
    Z = model.schema_.transform(dataset.queries())
    Z[::3, 5] = np.nan
    Z[1::4] = Z[1::4] * 1.7
    ref = np.exp(model._route(model.regressors_, Z))   # scikit-learn's regressors, routed by op
    model.fixed_prepare_ = {}   # compare the tree walks alone (see test_fixed_prepare)
    np.testing.assert_array_equal(model.predict_z(Z), ref)   # to the last bit


def test_fixed_prepare(dataset):
    """Kernels whose prepare keeps A's arrays (reads_a_at_run) are predicted their mean prepare time
    (the expected cost the planner minimises; measured prepares are bimodal, the median is the fast mode)."""
    from matplan.kernels import get
    model = fit(dataset, kind="combined", cv=0, max_iter=30)
    queries, y = dataset.queries(), dataset.y()
    fixed = {q.kernel for q in queries if get(q.kernel).reads_a_at_run}
    assert fixed and set(model.fixed_prepare_) == fixed
    pred = model.predict(queries)
    for k in fixed:
        rows = [i for i, q in enumerate(queries) if q.kernel == k]
        assert np.allclose(pred[rows, 1], np.mean(y[rows, 1]))


def test_fixed_prepare_is_the_mean_of_a_bimodal_sample():
    """Two modes (35 us x 3, 65 us x 2): the median is the fast mode, the expected time is 47 us."""
    from matplan.models.learned import Query
    from matplan.models.learned_fit import _fixed_prepare
    queries = [Query(None, "spmv.csr_vector", {"W": 8}, None, reads_a_at_run=True) for _ in range(5)]
    y = np.array([[1e-5, 35e-6]] * 3 + [[1e-5, 65e-6]] * 2)
    assert _fixed_prepare(queries, y) == {"spmv.csr_vector": pytest.approx(47e-6)}


def test_sklearn_conventions(dataset):
    m = learned_fit.LearnedCostModel(kind="learned", max_iter=50)
    assert m.get_params()["max_iter"] == 50 and not hasattr(m, "forests_")
    c = clone(m).set_params(max_iter=20)
    assert c.max_iter == 20 and m.max_iter == 50
    with pytest.raises(RuntimeError, match="not fitted"):
        m.predict(dataset.queries()[:2])
    q, y = dataset.queries(), dataset.y()
    with pytest.raises(ValueError, match=r"y: expected an \(n, 2\) array"):
        m.fit(q, y[:, 0])
    with pytest.raises(ValueError, match="X and y"):
        m.fit(q, y[:-1])
    with pytest.raises(ValueError, match="at least 10 timings"):
        m.fit(q[:3], y[:3])
    with pytest.raises(ValueError, match="kind: expected one of"):
        learned_fit.LearnedCostModel(kind="magic").fit(q, y)
    with pytest.raises(ValueError, match="cv: expected"):
        learned_fit.LearnedCostModel(cv=1).fit(q, y)
    for bad in (np.int64(1), -2, True, np.bool_(True), 2.0, "3"):   # issue 40 item 4: one rule for integers
        with pytest.raises(ValueError, match=r"cv: expected 0 \(no validation\) or an integer >= 2 folds"):
            learned_fit.LearnedCostModel(cv=bad).fit(q, y)
    fitted = learned_fit.LearnedCostModel(kind="learned", max_iter=5, cv=np.int64(2)).fit(q, y)
    assert fitted.validation_["folds"] == 2
    bad = y.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        m.fit(q, bad)


def test_train_save_load_roundtrip_with_metadata(tuned_db, dataset, model_dir):
    path, model = train(tuned_db, kind="combined", cv=3)
    assert path == model_dir / "cpu.npz" and path.with_suffix(".json").is_file()
    meta = json.loads(path.with_suffix(".json").read_text())
    import hashlib
    import sklearn
    assert meta["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert meta["device_class"] == "cpu" and meta["kind"] == "combined"
    assert meta["versions"]["sklearn"] == sklearn.__version__
    assert meta["feature_schema"]["version"] == learned.FEATURE_SCHEMA_VERSION
    assert meta["feature_schema"]["columns"] == list(model.schema_.columns)
    assert meta["training_set_hash"] == dataset.hash()
    assert meta["training_set"]["families"] == sorted(FAMILIES)
    assert meta["format"] == 2 and meta["sources"] == learned.learned_fingerprint.current()
    loaded = learned.load_file(path)
    assert type(loaded) is learned.CostModel
    np.testing.assert_array_equal(loaded.predict(dataset.queries()), model.predict(dataset.queries()))
    assert loaded.metadata_["name"] == "cpu" and "learned model 'cpu'" in loaded.describe()
    assert learned.find("cpu") is None     # saved, but not named: the planner does not load it
    with pytest.raises(learned.ModelLoadError, match="device class 'cpu', not 'H100'"):
        learned.load_file(path, device_class="H100")


@pytest.fixture(scope="module")
def trained(tuned_db, tmp_path_factory):
    """One model trained for the module; each test gets a copy in its own model folder."""
    d = tmp_path_factory.mktemp("trained")
    path, _ = train(tuned_db, cv=3, dir=d, model_params={"max_iter": 100})
    return path


@pytest.fixture
def saved(trained, model_dir, monkeypatch):
    """A copy of the trained model in the test's model folder, named by MATPLAN_MODEL."""
    model_dir.mkdir(parents=True, exist_ok=True)
    for suffix in (".npz", ".json"):
        (model_dir / f"cpu{suffix}").write_bytes(trained.with_suffix(suffix).read_bytes())
    monkeypatch.setenv(learned.MODEL_ENV, str(model_dir / "cpu.npz"))
    learned.clear_cache()
    return model_dir / "cpu.npz"


def test_tampered_model_is_refused(saved):
    raw = bytearray(saved.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    saved.write_bytes(bytes(raw))
    with pytest.raises(learned.ModelLoadError, match=f"{saved}.*SHA-256"):
        learned.load_file(saved)


def test_version_and_schema_mismatch(saved):
    """Another scikit-learn version is no matter (the trees are plain arrays); another schema is refused."""
    meta_path = saved.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta["versions"]["sklearn"] = "0.0.1"
    meta_path.write_text(json.dumps(meta))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert learned.load_file(saved) is not None
    meta["feature_schema"]["version"] = learned.FEATURE_SCHEMA_VERSION + 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(learned.ModelLoadError, match="feature schema"):
        learned.load_file(saved)


def _spmv_problem():
    from matplan import corpus
    A = corpus.load("skewed", "small", seed=3)
    x = np.random.default_rng(1).random(A.shape[1]) - 0.5
    return A, x


def test_planner_uses_learned_model_when_present(kernels, saved):
    A, x = _spmv_problem()
    p = planner.plan(A, x)
    sources = {c.kernel: c.source for c in p.candidates if c.source != "rejected"}
    assert set(sources.values()) == {"learned"}
    assert any("learned model 'cpu'" in r and "validation (group k-fold" in r for r in p.reasons)
    chosen = p.candidates[0]
    assert "learned model 'cpu'" in chosen.why and "analytic model" in chosen.why
    np.testing.assert_allclose(p.run(A, x), A @ x, rtol=1e-12)
    assert "learned" in str(p)


def test_planner_falls_back_to_analytic(kernels, saved, monkeypatch):
    A, x = _spmv_problem()
    monkeypatch.setenv(learned.COST_MODEL_ENV, "analytic")
    assert {c.source for c in planner.plan(A, x).candidates} <= {"analytic", "rejected"}
    monkeypatch.delenv(learned.COST_MODEL_ENV)
    saved.unlink()                                    # the named model is gone: one warning, analytic costs
    with pytest.warns(learned.ModelWarning, match="cannot be read"):
        assert {c.source for c in planner.plan(A, x).candidates} <= {"analytic", "rejected"}


def test_planner_keeps_analytic_costs_outside_the_training_range(kernels, saved):
    """Trees do not extrapolate: a matrix larger than any in the training data is planned analytically."""
    from matplan import corpus
    A = corpus.load("uniform", "medium", seed=0)       # the model saw only the 'small' size
    x = np.random.default_rng(2).random(A.shape[1])
    p = planner.plan(A, x)
    assert {c.source for c in p.candidates} <= {"analytic", "rejected"}
    assert "outside the training range of learned model 'cpu'" in p.candidates[0].why
    np.testing.assert_allclose(p.run(A, x), A @ x, rtol=1e-12)


def test_planner_warns_and_falls_back_on_a_tampered_model(kernels, saved):
    saved.write_bytes(saved.read_bytes()[:-10] + b"0123456789")
    A, x = _spmv_problem()
    with pytest.warns(learned.ModelWarning, match="analytic costs.*SHA-256"):
        p = planner.plan(A, x)
    assert {c.source for c in p.candidates} <= {"analytic", "rejected"}


def test_kernels_unknown_to_the_model_keep_analytic_costs(kernels, saved):
    from tuning_helpers import Wrong
    A, x = _spmv_problem()
    with registered(Wrong()):
        p = planner.plan(A, x)
    by = {c.kernel: c for c in p.candidates}
    assert by["test.wrong"].source == "analytic" and "is not in learned model" in by["test.wrong"].why
    assert by["cpu.scipy"].source == "learned"


def test_plans_are_stable(kernels, saved):
    """The same inputs give the same plan, in this process and in a fresh one."""
    A, x = _spmv_problem()
    a, b = planner.plan(A, x), planner.plan(A, x)
    strip = lambda p: {k: v for k, v in p.to_dict().items() if k != "planning_s"}  # noqa: E731
    assert strip(a) == strip(b)
    here = Path(__file__).resolve().parent
    code = ("import sys, json; sys.path[:0] = [%r, %r]\n"
            "from tuning_helpers import registered, CHOICE_KERNELS\n"
            "from test_learned import _spmv_problem\n"
            "from matplan import planner\n"
            "with registered(*CHOICE_KERNELS):\n"
            "    p = planner.plan(*_spmv_problem())\n"
            "print(json.dumps([p.kernel, p.params, [c.total_s for c in p.candidates]]))\n"
            % (str(here), str(here.parent)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ})
    kernel, params, totals = json.loads(out.stdout.strip().splitlines()[-1])
    assert (kernel, params) == (a.kernel, a.params)
    # predicted costs agree closely (the host kernels' analytic inputs use a measured bandwidth)
    assert len(totals) == len(a.candidates)


def test_report_leave_family_out(tuned_db, tmp_path):
    rep = evaluate(tuned_db, reuses=(1, 10), out=tmp_path / "results", plots=True,
                   model_params={"max_iter": 60})
    assert rep["evaluation"] == "leave-matrix-family-out" and rep["families"] == sorted(FAMILIES)
    for reuse in ("1", "10"):
        res = rep["results"][reuse]
        for method in ("analytic", "learned", "combined"):
            e = res[method]
            assert e["problems"] == rep["problems_with_a_choice"] > 0
            assert 1.0 <= e["geomean_regret"] <= e["worst_regret"]
            assert 0.0 <= e["top1_accuracy"] <= e["within_tie_margin"] <= 1.0
        assert set(res["targets"]) == {"combined_geomean_le_1.02", "combined_worst_le_1.3",
                                       "learned_better_than_analytic"}
    saved = json.loads(Path(rep["json"]).read_text())
    assert saved["results"]["1"]["combined"]["geomean_regret"] == rep["results"]["1"]["combined"]["geomean_regret"]
    text = format_report(rep)
    assert "geomean regret" in text and "combined" in text
    import importlib.util
    if importlib.util.find_spec("matplotlib"):
        assert len(rep["plots"]) == 2 and all(Path(p).is_file() for p in rep["plots"])
    else:
        assert rep["plots"] == []


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1,100", 5, (), (1, np.int64(0))])
def test_report_reuses_are_checked_by_name(bad, tmp_path):
    """Issue 40 item 4: evaluate's reuses are positive integers, NumPy ones included; checked
    before the database is read."""
    with pytest.raises(ValueError, match="reuses: expected a sequence of positive integers"):
        evaluate(tmp_path / "absent.sqlite", reuses=bad, out=False)
    assert report_mod._check_reuses((np.int64(1), np.uint16(100))) == [1, 100]


def test_report_says_whether_the_installed_model_saw_its_timings(tuned_db, dataset, model_dir, monkeypatch):
    """The report records its timings' training-set hash and whether the model the planner loads for
    the device class was fitted on exactly those timings (else the report's figures are not its own)."""
    def report():
        return evaluate(tuned_db, reuses=(1,), out=False, model_params={"max_iter": 20})
    rep = report()
    assert rep["training_set_hash"] == dataset.hash() and rep["installed_model"] is None
    path, _ = train(tuned_db, cv=0, model_params={"max_iter": 20})
    assert report()["installed_model"] is None       # saved, but the planner loads only a named model
    monkeypatch.setenv(learned.MODEL_ENV, str(path))
    rep = report()
    assert rep["installed_model"] == {"name": path.stem, "folder": str(model_dir), "same_timings": True,
                                      "training_set_hash": dataset.hash()}
    assert f"installed model {path.stem} ({model_dir}): fitted on these timings" in format_report(rep)
    meta_path = path.with_suffix(".json")
    meta_path.write_text(json.dumps(dict(json.loads(meta_path.read_text()), training_set_hash="0" * 64)))
    rep = report()
    assert rep["installed_model"]["same_timings"] is False
    assert "training-set hash differs" in format_report(rep)


def test_cli_train_and_report(tuned_db, tmp_path, capsys, model_dir):
    from matplan.cli import main
    assert main(["train", "--db", str(tuned_db), "--name", "cli-model", "--cv", "2",
                 "--max-iter", "40"]) == 0
    out = capsys.readouterr().out
    assert "cli-model.npz" in out and "learned model 'cli-model'" in out
    assert f"{learned.MODEL_ENV}={model_dir / 'cli-model.npz'}" in out
    assert (model_dir / "cli-model.json").is_file()
    assert main(["report", "--db", str(tuned_db), "--out", str(tmp_path), "--no-plots", "--reuse", "1",
                 "--max-iter", "40"]) == 0
    assert "geomean regret" in capsys.readouterr().out
    assert main(["train", "--db", str(tuned_db), "--device-class", "H100"]) == 2
    assert "device_class: 'H100' has no timings" in capsys.readouterr().err


def test_device_class_names():
    assert learned.device_class("NVIDIA H100 80GB HBM3", "gpu") == "H100"
    assert learned.device_class("Tesla K40c", "gpu") == "K40c"
    assert learned.device_class("Some New GPU 9000", "gpu") == "Some-New-GPU-9000"
    assert learned.device_class("AMD EPYC", "cpu") == "cpu"


def test_save_refuses_bad_names(dataset, tmp_path):
    model = fit(dataset, cv=0, max_iter=20)
    with pytest.raises(ValueError, match="name: expected"):
        learned.save(model, "../escape", device_class="cpu", dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        learned.save(model, "ok-name_1.2", device_class="cpu", dir=tmp_path)
    assert learned.load_file(tmp_path / "ok-name_1.2").metadata_["name"] == "ok-name_1.2"
    with pytest.raises(ValueError, match="named after its device class"):
        learned.save(model, "mine", device_class="cpu", dir=learned.PACKAGE_DIR)


def test_shipped_h100_model_loads_and_checks_out():
    """The default model shipped in the package: its file hash matches, and it knows the main kernels."""
    model = learned.load_file(learned.PACKAGE_DIR / "h100.npz", device_class="H100")
    assert model.metadata_["device_class"] == "H100" and model.n_samples_ >= 400
    assert {"spmv.csr_vector", "tsgemm.tsm2", "spgemm.hash"} <= set(model.kernels_)


def test_per_op_regressors(dataset, monkeypatch):
    """Ops with PER_OP_MIN_SAMPLES timings get regressors of their own, and their rows are predicted
    by them; per_op=False keeps one pair for every op; the NumPy forests agree with both."""
    ops = [q.features.op for q in dataset.queries()]
    assert {"spmv", "spmm"} <= set(ops)
    monkeypatch.setattr(learned_fit, "PER_OP_MIN_SAMPLES", min(ops.count("spmv"), ops.count("spmm")))
    model = fit(dataset, kind="combined", cv=0, max_iter=40, per_op=True)
    assert set(model.regressors_) == set(model.forests_) == {"*", "spmv", "spmm"}
    Z = model.schema_.transform(dataset.queries())
    rows = np.array(ops) == "spmm"
    own = np.column_stack([m.predict(Z[rows]) for m in model.regressors_["spmm"]])
    np.testing.assert_array_equal(model._route(model.regressors_, Z)[rows], own)
    np.testing.assert_array_equal(model._route(model.forests_, Z), model._route(model.regressors_, Z))
    model.fixed_prepare_ = {}   # predict_z's one stack of all six forests, each row routed to its op's pair
    np.testing.assert_array_equal(model.predict_z(Z), np.exp(model._route(model.regressors_, Z) + model._analytic_cols(Z)))
    pooled = fit(dataset, kind="combined", cv=0, max_iter=40, per_op=False)
    assert set(pooled.forests_) == {"*"}
    np.testing.assert_array_equal(pooled._route(pooled.forests_, Z),
                                  np.column_stack([m.predict(Z) for m in pooled.regressors_["*"]]))
