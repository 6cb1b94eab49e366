"""The command line as a new user meets it: --version, option values checked, .npz files read,
--device on the host said to be ignored, report's --out, progress bars and Ctrl-C in tune."""
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from matplan import planner
from matplan.cli import main
from matplan.core.version import __version__
from matplan.tuning_db import tune as tune_mod
from matplan.tuning_db import units as units_mod
from matplan.tuning_db.store import TuningDB
from tuning_helpers import CHOICE_KERNELS, registered

A = sp.random(60, 50, density=0.1, format="csr", random_state=0)


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"matplan {__version__}"


@pytest.mark.parametrize("argv, option", [(["--k", "0"], "--k"), (["--k", "-2"], "--k"), (["--k", "x"], "--k"),
                                          (["--reuse", "0"], "--reuse")])
def test_plan_refuses_non_positive_counts(tmp_path, capsys, argv, option):
    scipy.io.mmwrite(str(tmp_path / "a.mtx"), A)
    with pytest.raises(SystemExit) as info:
        main(["plan", str(tmp_path / "a.mtx"), "--cpu", *argv])
    assert info.value.code == 2
    assert f"argument {option}: expected a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("argv, option", [(["tune", "--spmm-k", "4,0"], "--spmm-k"), (["tune", "--n-jobs", "0"], "--n-jobs"),
                                          (["report", "--reuse", "1,-5"], "--reuse"),
                                          (["train", "--cv", "-1"], "--cv")])
def test_tuning_commands_refuse_bad_counts(capsys, argv, option):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and f"argument {option}: expected" in capsys.readouterr().err


def _saved(tmp_path, how):
    path = tmp_path / f"a-{how}.npz"
    if how == "shared":               # the shared real-matrix format: shape, indptr, indices, data
        np.savez(path, shape=np.array(A.shape), indptr=A.indptr, indices=A.indices, data=A.data)
    else:                             # scipy.sparse.save_npz of a CSR or a CSC matrix
        sp.save_npz(path, A.asformat(how))
    return path


@pytest.mark.parametrize("how", ["shared", "csr", "csc"])
def test_plan_reads_npz(tmp_path, capsys, how):
    path = _saved(tmp_path, how)
    assert main(["plan", str(path), "--cpu", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["op"] == "spmv" and d["features"]["nnz"] == A.nnz and (d["features"]["m"], d["features"]["n"]) == A.shape
    square = sp.random(40, 40, density=0.1, format="csr", random_state=1)
    sp.save_npz(tmp_path / "s.npz", square)
    scipy.io.mmwrite(str(tmp_path / "s.mtx"), square)
    assert main(["plan", str(tmp_path / "s.npz"), str(tmp_path / "s.mtx"), "--cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["op"] == "spgemm"


def test_device_on_the_host_is_said_to_be_ignored(tmp_path, capsys):
    scipy.io.mmwrite(str(tmp_path / "a.mtx"), A)
    assert main(["plan", str(tmp_path / "a.mtx"), "--cpu", "--device", "H100"]) == 0
    out, err = capsys.readouterr()
    assert "note: --device H100 ignored: --cpu given, so this is the host's plan (NumPy/SciPy)" in err
    assert "on host (NumPy/SciPy)" in out
    assert main(["plan", str(tmp_path / "a.mtx"), "--cpu", "--device", "H999"]) == 2
    assert "unknown GPU 'H999'" in capsys.readouterr().err


def test_device_on_host_inputs_warns_in_the_api():
    x = np.ones(A.shape[1])
    with pytest.warns(UserWarning, match=r"device='K40c' ignored: the inputs are on the host"):
        p = planner.plan(A, x, device="K40c")
    assert p.device == "host (NumPy/SciPy)" and any("device='K40c' ignored" in r for r in p.reasons)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = planner.plan(A, x)                     # no device: no warning, no such reason
    assert not any("ignored" in r for r in q.reasons)


# --- report, train, refresh-features: files and progress -----------------------------------------
@pytest.fixture(scope="module")
def small_db(tmp_path_factory):
    """A host database with a choice (the test kernels) on three families: enough to fit and report."""
    path = tmp_path_factory.mktemp("db") / "t.sqlite"
    with registered(*CHOICE_KERNELS):
        units = units_mod.corpus_units(["small"], families=["banded", "rmat", "poisson2d"], ops=("spmv",),
                                      dtypes=("float64",))
        tune_mod.tune(units, db=path, backend="cpu", progress=False, repeats=2, warmup=0, budget_s=0.1)
    return path


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    from matplan.models import learned
    monkeypatch.setenv(learned.MODEL_DIR_ENV, str(tmp_path / "models"))
    learned.clear_cache()
    yield tmp_path / "models"
    learned.clear_cache()


def test_report_writes_into_the_current_folder_or_out(small_db, tmp_path, monkeypatch, capsys):
    with registered(*CHOICE_KERNELS):
        monkeypatch.chdir(tmp_path)
        argv = ["report", "--db", str(small_db), "--no-plots", "--reuse", "1", "--max-iter", "10"]
        assert main(argv) == 0
        assert (tmp_path / "learned_report_cpu.json").is_file() and not (tmp_path / "benchmarks").exists()
        out = capsys.readouterr()
        assert "written: learned_report_cpu.json" in out.out
        assert "matplan report" in out.err and "100%" in out.err            # the progress bar
        assert main(argv + ["--out", "sub/dir", "--no-progress"]) == 0
        assert (tmp_path / "sub" / "dir" / "learned_report_cpu.json").is_file()
        assert "matplan report" not in capsys.readouterr().err


def test_train_and_refresh_features_show_progress(small_db, tmp_path, capsys, model_dir):
    with registered(*CHOICE_KERNELS):
        argv = ["train", "--db", str(small_db), "--cv", "2", "--max-iter", "10", "--out-dir", str(tmp_path)]
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "matplan train" in err and "3/3" in err
        assert main(argv + ["--no-progress"]) == 0
        assert "matplan train" not in capsys.readouterr().err
    assert main(["db", "refresh-features", "--db", str(small_db)]) == 0
    out = capsys.readouterr()
    assert "'current': 3" in out.out and "matplan db refresh-features" in out.err
    assert main(["db", "refresh-features", "--db", str(small_db), "--no-progress"]) == 0
    assert "refresh-features" not in capsys.readouterr().err


# --- Ctrl-C in tune ----------------------------------------------------------------------------
TUNE = ["tune", "--backend", "cpu", "--family", "banded", "rmat", "poisson2d", "--ops", "spmv",
        "--dtype", "float64", "--repeats", "2", "--warmup", "0", "--budget", "0.1"]


def test_ctrl_c_in_tune_says_how_to_resume(tmp_path, capsys, monkeypatch):
    db = str(tmp_path / "t.sqlite")
    record, calls = tune_mod._record, []

    def interrupted_after_one(*args):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        record(*args)
    monkeypatch.setattr(tune_mod, "_record", interrupted_after_one)
    assert main(TUNE + ["--db", db, "--no-progress"]) == 130
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [f"matplan tune: interrupted after 1 of 3 problems; what was timed is "
                                        f"kept in {db}: run the same command again to resume"]
    monkeypatch.setattr(tune_mod, "_record", record)
    assert main(TUNE + ["--db", db, "--no-progress"]) == 0
    assert "2 candidates timed (0 failed, 0 did not match the reference), 1 already recorded" in \
        capsys.readouterr().out                                  # the one recorded is not timed again
    with TuningDB(db) as store:
        assert store.counts()["problems"] == 3


SLOW_PLUGIN = """
import time
from matplan.core.types import Cost
from matplan.kernels import register
from tuning_helpers import _Host


class Slow(_Host):
    name = "test.slow"

    def cost(self, f, params, device):
        return Cost(0.0, 1.0, "slow")

    def run(self, prepared, B, out=None):
        time.sleep(0.3)
        return prepared.arrays["A"] @ B


register(Slow())
"""


def _problems(path) -> int:
    if not path.exists():
        return 0
    try:
        with TuningDB(path, create=False) as db:
            return db.counts()["problems"]
    except Exception:      # noqa: BLE001  not created yet, or locked for a moment
        return 0


def test_sigint_to_tune_and_its_workers_prints_no_traceback(tmp_path):
    """Ctrl-C at a terminal signals the whole process group: the command and its worker processes."""
    (tmp_path / "slow_plugin.py").write_text(SLOW_PLUGIN)
    db = tmp_path / "t.sqlite"
    cmd = [sys.executable, "-m", "matplan.cli", *TUNE, "--n-jobs", "2", "--import", "slow_plugin", "--db", str(db)]
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), here, os.path.dirname(here)]))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env)
    deadline = time.time() + 300
    while _problems(db) < 1 and proc.poll() is None and time.time() < deadline:     # one problem recorded
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1].decode()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert text.rstrip().splitlines()[-1].endswith("run the same command again to resume"), text
