"""Old training files report what they reported: their TSM2 calibrations (keys written before the
planner's measurement cache, without or with the timed rows' bucket) are migrated, and records
that cannot be read are counted in one warning (issue 40 item 10)."""
import json
import warnings

import pytest

from matplan.core import device as device_mod
from matplan.core.features import Features
from matplan.kernels import get
from matplan.models.tsgemm import LAUNCH_S
from matplan.tuning_db import calibration, report
from matplan.tuning_db.dataset import load_dataset
from matplan.tuning_db.store import CalibrationRecord, TuningDB, EXPORT_FORMAT

DEVICE_NAME = "NVIDIA H100 80GB HBM3"
PARAMS = {"layout": "col", "t1": 128, "t2": 16, "t3": 4, "t1_source": "timed on the device"}


def tsgemm_features(m, n, k, dtype="float32"):
    return Features(op="tsgemm", backend="gpu", dtype=dtype, index_dtype="", m=m, n=n, k=k, layout="F",
                    density=1.0, nnz=m * n)


def old_file(path, key, ratio=3.0, vendor_ratio=0.5, extra=()):
    """A training file as `matplan db export` wrote it before the measurement cache: one device,
    one tall-and-skinny problem timed with TSM2 and cuBLAS, and one TSM2 calibration per key."""
    spec = device_mod.known("H100").to_dict()
    lines = [{"format": EXPORT_FORMAT, "version": 2, "schema_version": 2},
             {"kind": "device", "key": "d1", "device_class": "H100", "backend": "gpu", "name": DEVICE_NAME,
              "compute_capability": "9.0", "sms": 132, "memory_bytes": 80 << 30, "spec": spec},
             {"kind": "problem", "fingerprint": "p1", "op": "tsgemm", "dtype": "float32",
              "source": "corpus:tall_skinny:medium:0|tsgemm|k=16|float32", "family": "tall_skinny",
              "matrix": "tall_skinny-medium", "features": tsgemm_features(4096, 4096, 16).to_dict()}]
    for kernel, params, ms in (("tsgemm.tsm2", PARAMS, 0.05), ("gemm.cublas", {}, 0.04)):
        lines.append({"kind": "timing", "device_key": "d1", "problem": "p1", "kernel": kernel,
                      "params": json.dumps(params, sort_keys=True, separators=(",", ":")),
                      "matplan_version": "0.1.0", "status": "ok", "prepare_ms": 0.0, "run_ms_median": ms,
                      "run_ms_min": ms, "run_ms_max": ms, "repeats": 20, "matched": True, "max_error": 1e-7,
                      "error": "", "created_at": "2026-11-23T01:05:40+00:00", "host": "vm"})
    lines.append({"kind": "calibration", "device_key": "d1", "kernel": "tsgemm.tsm2", "key": json.dumps(key),
                  "matplan_version": "0.1.0", "created_at": "2026-11-23T01:21:27+00:00",
                  "value": {"best": {"t1": 128, "t3": 4}, "timings": {"t1=128,t3=4": 4e-5},
                            "ratio": ratio, "vendor_ratio": vendor_ratio}})
    lines += list(extra)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("key", [[DEVICE_NAME, "float32", "col", 16, 4096],            # the first format
                                 [DEVICE_NAME, "float32", "col", 16, 4096, 4096]])     # with the rows bucket
def test_old_training_file_scores_calibrated_as_when_written(tmp_path, key):
    """The report's analytic costs of an old file's tsgemm rows are calibrated by its records, as
    its planner scaled them (measured/model of the time without the launch); with no warning."""
    with TuningDB(tmp_path / "t.sqlite") as db:
        db.merge(old_file(tmp_path / "old.jsonl", key))
        ds = load_dataset(db, "H100")
    f, dev = ds.features("p1"), ds.device
    raw_tsm2 = get("tsgemm.tsm2").cost(f, PARAMS, dev).run_s
    raw_cublas = get("gemm.cublas").cost(f, {}, dev).run_s
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ds.calibrated():
            pred, calibrated = report._analytic_predictions(ds)
    by_kernel = {r.kernel: i for i, r in enumerate(ds.rows)}
    assert calibrated.all()
    assert pred[by_kernel["tsgemm.tsm2"], 0] == pytest.approx((raw_tsm2 - LAUNCH_S) * 3.0 + LAUNCH_S)
    assert pred[by_kernel["gemm.cublas"], 0] == pytest.approx((raw_cublas - LAUNCH_S) * 0.5 + LAUNCH_S)
    assert ds.calibration_counts() == {"recorded": 1, "legacy_migrated": 1, "ignored": 0}


def test_legacy_rows_bucket_is_the_one_its_planner_wrote():
    """A key with the rows bucket names m capped at 2**28 / n (the timing's size then), not the
    measurement cache's 2**30 / n: a large A finds its record, another rows bucket does not."""
    dev = device_mod.known("H100")
    f = tsgemm_features(1 << 20, 4096, 16)      # rows capped at 2**28 / 4096 = 65536
    assert calibration.legacy_keys(f)[0] == json.dumps(["legacy", ["float32", "col", 16, 4096, 65536]],
                                                       separators=(",", ":"))
    hit = CalibrationRecord("d1", "tsgemm.tsm2", json.dumps([DEVICE_NAME, "float32", "col", 16, 4096, 65536]),
                            {"ratio": 2.0}, "0.1.0", "2026-01-01")
    miss = CalibrationRecord("d1", "tsgemm.tsm2", json.dumps([DEVICE_NAME, "float32", "col", 16, 4096, 262144]),
                             {"ratio": 9.0}, "0.1.0", "2026-01-02")
    raw = get("tsgemm.tsm2").cost(f, PARAMS, dev).run_s
    with calibration.installed([hit, miss]):
        c = get("tsgemm.tsm2").cost(f, PARAMS, dev)
    assert c.calibrated and c.run_s == pytest.approx((raw - LAUNCH_S) * 2.0 + LAUNCH_S)
    assert "legacy record" in c.why


def test_a_newer_measurement_beats_a_legacy_record():
    """Where both apply, the planner's own measurement of a config wins over a legacy record of
    its bucket (even a later one); other configs of the bucket take the legacy record."""
    dev = device_mod.known("H100")
    f = tsgemm_features(4096, 4096, 16)
    bucket = get("tsgemm.tsm2").measure_key(f)
    cfg, other = {"layout": "col", "t1": 64, "t2": 16, "t3": 4}, {"layout": "col", "t1": 256, "t2": 16, "t3": 4}
    new = CalibrationRecord("d1", "tsgemm.tsm2", json.dumps([["bucket", list(bucket)], cfg]),
                            {"seconds": 1e-4, "ratio": 1.25}, "0.1.0", "2026-01-01")
    old = CalibrationRecord("d1", "tsgemm.tsm2", json.dumps([DEVICE_NAME, "float32", "col", 16, 4096]),
                            {"ratio": 7.0}, "0.1.0", "2099-01-01")
    raw, raw_other = (get("tsgemm.tsm2").cost(f, p, dev).run_s for p in (cfg, other))
    with calibration.installed([new, old]):
        got, got_other = (get("tsgemm.tsm2").cost(f, p, dev).run_s for p in (cfg, other))
    assert got == pytest.approx(raw * 1.25)
    assert got_other == pytest.approx((raw_other - LAUNCH_S) * 7.0 + LAUNCH_S)


def test_unreadable_records_are_counted_in_one_warning(tmp_path):
    """Records that give no ratio (a key of another length, a missing ratio, an unknown kernel,
    a key that is not JSON) are ignored, named by count and reason in ONE warning per use, and
    counted by the dataset; the readable record still calibrates."""
    bad = [{"kind": "calibration", "device_key": "d1", "kernel": kernel, "key": key, "matplan_version": "0.1.0",
            "created_at": "2026-11-23T01:00:00+00:00", "value": value}
           for kernel, key, value in [
               ("tsgemm.tsm2", json.dumps([DEVICE_NAME, "float32", "col", 16]), {"ratio": 2.0}),
               ("tsgemm.tsm2", json.dumps([DEVICE_NAME, "float32", "col", 32, 4096]), {"best": {}}),
               ("tsgemm.other", json.dumps([DEVICE_NAME, "float32", "col", 16, 8192]), {"ratio": 2.0}),
               ("tsgemm.tsm2", "not json", {"ratio": 2.0})]]
    with TuningDB(tmp_path / "t.sqlite") as db:
        db.merge(old_file(tmp_path / "old.jsonl", [DEVICE_NAME, "float32", "col", 16, 4096], extra=bad))
        ds = load_dataset(db, "H100")
    assert ds.calibration_counts() == {"recorded": 5, "legacy_migrated": 1, "ignored": 4}
    with pytest.warns(RuntimeWarning) as caught:
        with ds.calibrated():
            _, calibrated = report._analytic_predictions(ds)
    assert calibrated.all()
    msgs = [str(w.message) for w in caught if "calibrations ignored" in str(w.message)]
    assert len(msgs) == 1
    assert msgs[0].startswith("4 of 5 recorded online calibrations ignored")
    for reason in ("a legacy tsgemm.tsm2 key must be", "neither a positive ratio", "'tsgemm.other'",
                   "not JSON"):
        assert reason in msgs[0]


def test_report_names_migrated_records():
    text = report.format_report({"device_class": "H100", "device": DEVICE_NAME, "timings": 2,
                                 "problems_with_a_choice": 1, "problems": 1, "families": ["x"],
                                 "online_calibrations_read": {"recorded": 3, "legacy_migrated": 2, "ignored": 1},
                                 "results": {}})
    assert "3 recorded, 2 in the format before the measurement cache (migrated), 1 ignored" in text
