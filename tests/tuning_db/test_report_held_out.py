"""Leave-family-out leaves the family out of everything fitted (issue 42): the analytic constants'
least-squares refits and the online calibrations, not only the learned correction."""
import json
import types

import numpy as np
import pytest
import scipy.sparse as sp

from matplan.core import device as device_mod
from matplan.core.features import Features, sparse_features
from matplan.kernels import get
from matplan.models import spmv as spmv_model
from matplan.tuning_db import refit, report
from matplan.tuning_db.dataset import Dataset, Row
from matplan.tuning_db.progress import Stages
from matplan.tuning_db.store import CalibrationRecord

DEVICE = device_mod.known("H100")
TRUE_EFFICIENCY = 0.5          # the prepared cuSPARSE SpMM's efficiency on the ordinary families
ODD_FACTOR = 8.0               # the odd family's cuSPARSE runs this many times the model's time


def _problem(fp, family, seed, tsgemm=False):
    if tsgemm:
        f = Features(op="tsgemm", backend="gpu", dtype="float32", index_dtype="", m=4096, n=4096, k=16,
                     layout="F", density=1.0, nnz=4096 * 4096)
    else:
        A = sp.random(3000 + 500 * seed, 3000, density=0.002 * (1 + seed % 3), format="csr",
                      random_state=seed)
        f = Features(**{**sparse_features(A), "op": "spmm", "backend": "gpu", "dtype": "float64", "k": 8})
    return types.SimpleNamespace(fingerprint=fp, family=family, features=f.to_dict(), matrix=fp,
                                 op=f.op, dtype=f.dtype)


def _dataset(calibrations=()):
    """Four SpMM families timed with the prepared cuSPARSE call and CSR vector (run = its model), and
    one tall-and-skinny family; the cuSPARSE times follow TRUE_EFFICIENCY except the odd family's."""
    problems, rows = {}, []
    for family in ("a", "b", "c", "odd"):
        for j in range(4):
            fp = f"{family}{j}"
            problems[fp] = _problem(fp, family, seed=len(problems))
            f = Features.from_dict(problems[fp].features)
            with refit.installed({"spmv.CUSPARSE_PREPARED_SPMM_EFFICIENCY": TRUE_EFFICIENCY}):
                t = get("spmv.cusparse").cost(f, {}, DEVICE).run_s * (ODD_FACTOR if family == "odd" else 1.0)
            rows.append(Row(fp, "spmv.cusparse", {}, t, 3e-6))
            params = {"W": 8}
            rows.append(Row(fp, "spmv.csr_vector", params, get("spmv.csr_vector").cost(f, params, DEVICE).run_s,
                            5e-5))
    problems["ts0"] = _problem("ts0", "tall_skinny", 0, tsgemm=True)
    for kernel, params, t in (("tsgemm.tsm2", {"layout": "col", "t1": 128, "t2": 16, "t3": 4}, 5e-5),
                              ("gemm.cublas", {}, 4e-5)):
        rows.append(Row("ts0", kernel, params, t, 0.0))
    rows.sort(key=lambda r: (r.problem, r.kernel))
    return Dataset("H100", DEVICE, "NVIDIA H100 80GB HBM3", problems, rows, [], [], list(calibrations))


def _idx(ds, keep):
    return [i for i, g in enumerate(ds.groups()) if keep(g)]


def test_refit_reproduces_the_constants_it_was_given():
    """On timings made by the model with known constants, the refit finds them."""
    ds = _dataset()
    got = refit.fit(ds, _idx(ds, lambda g: g in ("a", "b", "c")))
    assert got["spmv.CUSPARSE_PREPARED_SPMM_EFFICIENCY"] == pytest.approx(TRUE_EFFICIENCY, rel=1e-6)
    assert got["spmv.CUSPARSE_PREPARED_OVERHEAD_S"] == pytest.approx(spmv_model.CUSPARSE_PREPARED_OVERHEAD_S,
                                                                     rel=1e-6)
    assert refit.current() == refit.current()   # restored after fitting
    assert spmv_model.CUSPARSE_PREPARED_SPMM_EFFICIENCY != TRUE_EFFICIENCY


def test_each_fold_fits_its_constants_without_the_held_out_family():
    ds = _dataset()
    shipped = refit.current()
    preds, folds = report._leave_family_out(ds, {"max_iter": 5}, Stages(100, "test", False))
    everything = refit.fit(ds)
    without_odd = refit.fit(ds, _idx(ds, lambda g: g != "odd"))
    label = "spmv.CUSPARSE_PREPARED_SPMM_EFFICIENCY"
    assert folds["odd"]["constants"] == without_odd
    assert folds["odd"]["constants"][label] == pytest.approx(TRUE_EFFICIENCY, rel=1e-6)
    assert everything[label] < 0.9 * TRUE_EFFICIENCY        # the odd family pulls the all-data fit
    # the held-out family was scored with the constants fitted without it, not the all-data ones
    odd = _idx(ds, lambda g: g == "odd")
    with refit.installed(without_odd):
        expected, _ = report._analytic_predictions(ds, odd)
    with refit.installed(everything):
        leaked, _ = report._analytic_predictions(ds, odd)
    np.testing.assert_allclose(preds["analytic"][odd], expected, rtol=1e-12)
    assert not np.allclose(preds["analytic"][odd], leaked, rtol=1e-3)
    assert refit.current() == shipped


def test_held_out_family_is_not_scored_with_its_own_calibrations():
    """A TSM2 calibration only the tall-and-skinny family reaches scales its costs in the full fit,
    never in its own fold."""
    key = ["NVIDIA H100 80GB HBM3", "float32", "col", 16, 4096]
    rec = CalibrationRecord("d1", "tsgemm.tsm2", json.dumps(key),
                            {"ratio": 3.0, "vendor_ratio": 0.5}, "0.1.0", "2026-01-01T00:00:00+00:00")
    ds = _dataset([rec])
    ts = _idx(ds, lambda g: g == "tall_skinny")
    with ds.calibrated() as ratios:
        full, calibrated = report._analytic_predictions(ds, ts)
    assert len(ratios) == 2 and calibrated.all()
    preds, folds = report._leave_family_out(ds, {"max_iter": 5}, Stages(100, "test", False))
    with refit.installed(folds["tall_skinny"]["constants"]):   # the fold's (TSM2's column walk: 0)
        raw, _ = report._analytic_predictions(ds, ts)
    assert folds["tall_skinny"]["constants"]["tsgemm.COL_COLUMN_S"] == 0.0
    assert folds["tall_skinny"]["online_calibrations_applied"] == 0
    np.testing.assert_allclose(preds["analytic"][ts], raw, rtol=1e-12)
    assert not np.allclose(raw[:, 0], full[:, 0])
    for kind in ("learned", "combined"):   # and no calibrated cost replaced their predictions
        assert not np.allclose(preds[kind][ts], full)


def test_column_walk_is_read_off_the_walk_bound_column_timings():
    """COL_COLUMN_S: a column-kernel timing's excess over cuBLAS's (plus cuBLAS's modelled time) a
    walked column, the median of the timings the walk bounds; a timing the paper's model explains
    is left out, and none at all gives 0."""
    from matplan.kernels.tsgemm.launch import column_walk
    from matplan.models import tsgemm as tsgemm_model
    ds = _dataset()
    f = ds.features("ts0")
    cublas = next(r.run_s for r in ds.rows if r.problem == "ts0" and r.kernel == "gemm.cublas")
    vendor = get("gemm.cublas").cost(f, {}, DEVICE).run_s - tsgemm_model.LAUNCH_S
    rows = []
    for t1, rate in ((64, 700e-9), (128, 900e-9), (256, 800e-9)):
        params = {"layout": "col", "t1": t1, "t2": 16, "t3": 4}
        columns = column_walk(f.m, f.n, 4, t1, 16, 4, DEVICE.sms)
        rows.append(Row("ts0", "tsgemm.tsm2", params, cublas - vendor + rate * columns, 0.0))
    explained = Row("ts0", "tsgemm.tsm2", {"layout": "col", "t1": 128, "t2": 8, "t3": 4}, cublas - vendor, 0.0)
    got = refit._column_walk(ds, rows + [explained])["tsgemm.COL_COLUMN_S"]
    assert got == pytest.approx(800e-9, rel=1e-9)
    assert refit._column_walk(ds, [explained]) == {"tsgemm.COL_COLUMN_S": 0.0}
    row_kernel = Row("ts0", "tsgemm.tsm2", {"layout": "row", "t1": 128, "t2": 16, "t3": 4}, 1.0, 0.0)
    assert refit._column_walk(ds, [row_kernel]) == {"tsgemm.COL_COLUMN_S": 0.0}
