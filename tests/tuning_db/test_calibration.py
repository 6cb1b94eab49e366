"""The planner's measurements (TSM2's configs and cuBLAS, kept by shape bucket) recorded in the
tuning database as calibrations, and installed again for scoring."""
import dataclasses
import json
import sqlite3

import pytest

from matplan.kernels import get
from matplan.kernels.tsgemm import rules
from matplan.core import device as device_mod
from matplan.core.features import Features
from matplan.models.tsgemm import LAUNCH_S
from matplan.planner import measure_cache as mc
from matplan.tuning_db import calibration
from matplan.tuning_db import store as store_mod
from matplan.tuning_db.store import CalibrationRecord, DeviceRecord, TuningDB

DEVICE = DeviceRecord("dev1", "H100", "gpu", "NVIDIA H100 80GB HBM3", "9.0", 132, 80 << 30,
                      spec={"name": "NVIDIA H100 80GB HBM3"})
KEY = ("NVIDIA H100 80GB HBM3", "float32", "row", 16, 4096)
PARAMS = {"layout": "row", "t1": 256, "t2": 16, "t3": 2, "depth": 1}


def cal(ratio, created, key=KEY, version="0.1"):
    """A record written before the measurement cache: one TSM2 bucket's winner and ratio."""
    value = {"best": {"t1": 256, "t3": 2}, "timings": {"t1=256,t3=2": 1e-4}, "ratio": ratio}
    return CalibrationRecord("dev1", calibration.LEGACY_TSM2, json.dumps(list(key)), value, version, created)


def entry(kernel, params, bucket, seconds, predicted_s):
    key = mc.Key(mc.Config.of(kernel, params), mc.canonical(["bucket", list(bucket)]), "NVIDIA H100 80GB HBM3",
                 "abc", mc.canonical({"matplan": "0.1.0"}))
    return mc.Entry(key, seconds, predicted_s, "2026-01-01T00:00:00+00:00")


@pytest.fixture
def recorder():
    rec = calibration.recording()
    rec.drain()
    yield rec
    rec.drain()


def test_schema_v2_table_roundtrip_and_first_writer_wins(tmp_path):
    with TuningDB(tmp_path / "t.sqlite") as db:
        assert db.schema_version == store_mod.latest_version() >= 2
        db.put(DEVICE, calibrations=[cal(0.5, "2026-01-01")])
        db.put(DEVICE, calibrations=[cal(0.9, "2026-01-02")])       # same key and version: kept as is
        got = db.calibrations("H100")
        assert len(got) == 1 and got[0].value["ratio"] == 0.5 and got[0].key == json.dumps(list(KEY))
        assert db.calibrations("A100") == [] and db.counts()["calibrations"] == 1
        with pytest.raises(TypeError, match="calibrations: expected CalibrationRecord"):
            db.put(DEVICE, calibrations=[{"ratio": 1}])


def test_v1_file_migrates_and_keeps_its_timings(tmp_path):
    path = tmp_path / "old.sqlite"
    with TuningDB(path, migrations=store_mod.MIGRATIONS[:1]) as db:
        db.put(DEVICE)
        assert db.schema_version == 1
    with TuningDB(path) as db:
        assert db.schema_version == store_mod.latest_version()
        assert db.devices() == [DEVICE] and db.calibrations() == []
        tables = {r[0] for r in sqlite3.connect(str(path)).execute("SELECT name FROM sqlite_master")}
        assert "calibrations" in tables


@pytest.mark.parametrize("suffix", [".jsonl", ".sqlite"])
def test_calibrations_export_and_import(tmp_path, suffix):
    with TuningDB(tmp_path / "a.sqlite") as src:
        src.put(DEVICE, calibrations=[cal(0.5, "2026-01-01"), cal(2.0, "2026-01-01", key=KEY[:4] + (8192,))])
        src.export(tmp_path / f"e{suffix}")
    with TuningDB(tmp_path / "b.sqlite") as dst:
        got = dst.merge(tmp_path / f"e{suffix}")
        assert got["calibrations_added"] == 2 and got["calibrations_read"] == 2
        assert sorted(c.value["ratio"] for c in dst.calibrations()) == [0.5, 2.0]
        assert dst.merge(tmp_path / f"e{suffix}")["calibrations_added"] == 0


def test_version_1_exports_are_still_read(tmp_path):
    old = tmp_path / "v1.jsonl"
    old.write_text(json.dumps({"format": store_mod.EXPORT_FORMAT, "version": 1}) + "\n"
                   + json.dumps({"kind": "device", **{**DEVICE.__dict__}}) + "\n")
    with TuningDB(tmp_path / "t.sqlite") as db:
        assert db.merge(old)["devices_added"] == 1
    bad = tmp_path / "v9.jsonl"
    bad.write_text(json.dumps({"format": store_mod.EXPORT_FORMAT, "version": 9}) + "\n")
    with TuningDB(tmp_path / "t.sqlite") as db, pytest.raises(Exception, match="export version 9"):
        db.merge(bad)


def test_recording_drains_the_measurements_made_or_used(recorder):
    """The recorder hears every new entry of the planner's measurement cache and the entries a
    tuning run used (tuned_params), each once per drain; records carry the kernel, the key
    [problem, params] and the figures."""
    assert calibration.recording() is recorder and recorder in mc.LISTENERS
    bucket = ("float32", "row", 16, 4096, 4096)
    e1 = entry("tsgemm.tsm2", PARAMS, bucket, 2e-4, 1e-4)
    e2 = entry("gemm.cublas", {}, bucket, 3e-4, 4e-4)
    mc.MeasureCache(None).put([e1, e2])
    recorder([e1])                                  # used again by a tuning run: still once
    drained = recorder.drain()
    assert drained == [e1, e2] and recorder.drain() == []
    recs = calibration.records("dev1", "0.1", drained)
    assert [r.kernel for r in recs] == ["tsgemm.tsm2", "gemm.cublas"]
    problem, params = json.loads(recs[0].key)
    assert problem == ["bucket", list(bucket)] and params == PARAMS
    assert recs[0].value["ratio"] == 2.0 and recs[0].value["seconds"] == 2e-4 and recs[1].value["ratio"] == pytest.approx(0.75)
    assert recs[0].value["source"] == "abc" and recs[0].value["versions"] == {"matplan": "0.1.0"}


def test_records_round_trip_the_database(tmp_path):
    bucket = ("float32", "row", 16, 4096, 4096)
    recs = calibration.records("dev1", "0.1", [entry("tsgemm.tsm2", PARAMS, bucket, 2e-4, 1e-4)])
    with TuningDB(tmp_path / "t.sqlite") as db:
        db.put(DEVICE, calibrations=recs)
        got = db.calibrations("H100")
    assert calibration.ratios_from(got) == {("tsgemm.tsm2", mc.canonical(["bucket", list(bucket)]),
                                             mc.Config.of("", PARAMS).text()): 2.0}


def test_installed_measurements_calibrate_the_costs_and_restore():
    """While installed, TSM2's and cuBLAS's costs for a recorded bucket are scaled by measured /
    predicted (the latest recorded of a key wins; a config recorded by itself over a legacy
    bucket-wide ratio) and marked calibrated; the kernels are restored after."""
    dev = device_mod.known("H100")
    f = Features(op="tsgemm", backend="gpu", dtype="float32", index_dtype="", m=4096, n=4096, k=16,
                 layout="C")
    bucket = rules.bucket_of_features(f)
    tsm, cub = get("tsgemm.tsm2"), get("gemm.cublas")
    raw, raw_cub = tsm.cost(f, PARAMS, dev), cub.cost(f, {}, dev)
    other = dict(PARAMS, t1=512)
    rows = calibration.records("dev1", "0.1", [entry("tsgemm.tsm2", PARAMS, bucket, 3e-4, 1e-4),
                                               entry("gemm.cublas", {}, bucket, 1.5e-4, 1e-4)])
    later = dataclasses.replace(calibration.records("dev1", "0.2", [entry("tsgemm.tsm2", PARAMS, bucket, 2e-4, 1e-4)])[0],
                                created_at="2099-01-01")
    legacy = cal(5.0, "2020-01-01", key=("H100",) + bucket)
    with calibration.installed(rows + [later, legacy]):
        c = get("tsgemm.tsm2").cost(f, PARAMS, dev)
        assert "calibrated by the planner's measurement: measured/model = 2.00" in c.why and c.calibrated
        assert c.run_s == pytest.approx(raw.run_s * 2.0)
        legacy_s = (tsm.cost(f, other, dev).run_s - LAUNCH_S) * 5.0 + LAUNCH_S   # as its planner scaled it
        assert get("tsgemm.tsm2").cost(f, other, dev).run_s == pytest.approx(legacy_s)
        v = get("gemm.cublas").cost(f, {}, dev)
        assert v.calibrated and v.run_s == pytest.approx(raw_cub.run_s * 1.5)
        g = Features(op="tsgemm", backend="gpu", dtype="float64", m=4096, n=4096, k=16, layout="C")
        assert not get("tsgemm.tsm2").cost(g, PARAMS, dev).calibrated            # another bucket
        assert get("tsgemm.tsm2").name == "tsgemm.tsm2" and get("tsgemm.tsm2").search_space(f, dev)
    assert get("tsgemm.tsm2") is tsm and get("gemm.cublas") is cub
    assert not tsm.cost(f, PARAMS, dev).calibrated


def test_legacy_records_calibrate_both_kernels():
    """A record from before the measurement cache (one per bucket: TSM2's ratio and cuBLAS's
    vendor_ratio) calibrates every config of its bucket; old params' provenance is ignored."""
    dev = device_mod.known("H100")
    f = Features(op="tsgemm", backend="gpu", dtype="float32", index_dtype="", m=4096, n=4096, k=16,
                 layout="C")
    key = ("NVIDIA H100 80GB HBM3",) + rules.bucket_of_features(f)
    rows = [cal(3.0, "2026-01-01", key=key), cal(2.0, "2026-02-01", key=key, version="0.2")]
    rows[1].value["vendor_ratio"] = 1.5
    raw = get("tsgemm.tsm2").cost(f, PARAMS, dev).run_s
    with calibration.installed(rows):
        c = get("tsgemm.tsm2").cost(f, dict(PARAMS, t1_source="timed on the device"), dev)
        assert c.calibrated and c.run_s == pytest.approx((raw - LAUNCH_S) * 2.0 + LAUNCH_S)   # the latest wins
        assert get("gemm.cublas").cost(f, {}, dev).calibrated


def test_a_fold_with_refitted_constants_scales_the_shipped_cost():
    """A measurement's ratio is over the shipped model's time: inside a leave-family-out fold that
    installs refitted constants (here cuBLAS's and TSM2's fixed costs), a calibrated cost is the
    shipped cost times the ratio, not the fold's (which would count the fixed cost twice), while
    uncalibrated costs take the fold's constants."""
    from matplan.tuning_db import refit
    dev = device_mod.known("H100")
    f = Features(op="tsgemm", backend="gpu", dtype="float32", index_dtype="", m=4096, n=4096, k=16,
                 layout="C")
    g = dataclasses.replace(f, dtype="float64")
    bucket = rules.bucket_of_features(f)
    shipped = {r: get(r).cost(f, p, dev).run_s for r, p in (("tsgemm.tsm2", PARAMS), ("gemm.cublas", {}))}
    fold = {"tsgemm.CUBLAS_TS_FIXED_S[gemm]": 5e-5, "tsgemm.TSM2_FIXED_S": 4e-5}
    rows = calibration.records("dev1", "0.1", [entry("tsgemm.tsm2", PARAMS, bucket, 3e-4, 1e-4),
                                               entry("gemm.cublas", {}, bucket, 1.5e-4, 1e-4)])
    raw_g = get("gemm.cublas").cost(g, {}, dev).run_s
    with refit.installed(fold), calibration.installed(rows):
        assert get("tsgemm.tsm2").cost(f, PARAMS, dev).run_s == pytest.approx(shipped["tsgemm.tsm2"] * 3.0)
        assert get("gemm.cublas").cost(f, {}, dev).run_s == pytest.approx(shipped["gemm.cublas"] * 1.5)
        assert get("gemm.cublas").cost(g, {}, dev).run_s > raw_g + 4e-5      # no record: the fold's
        assert refit.current()["tsgemm.TSM2_FIXED_S"] == 4e-5                  # restored after each cost
    assert refit.current()["tsgemm.TSM2_FIXED_S"] != 4e-5
