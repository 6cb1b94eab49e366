"""Online calibrations (TSM2's timed t1 winners and measured/model ratios) in the tuning database."""
import json
import sqlite3

import pytest

from matplan.kernels import get
from matplan.kernels.tsgemm import tsm2
from matplan.core import device as device_mod
from matplan.core.features import Features
from matplan.tuning_db import calibration
from matplan.tuning_db import store as store_mod
from matplan.tuning_db.store import CalibrationRecord, DeviceRecord, TuningDB

DEVICE = DeviceRecord("dev1", "H100", "gpu", "NVIDIA H100 80GB HBM3", "9.0", 132, 80 << 30,
                      spec={"name": "NVIDIA H100 80GB HBM3"})
KEY = ("NVIDIA H100 80GB HBM3", "float32", "row", 16, 4096)


def cal(ratio, created, key=KEY, version="0.1"):
    value = {"best": {"t1": 256, "t3": 2}, "timings": {"t1=256,t3=2": 1e-4}, "ratio": ratio}
    return CalibrationRecord("dev1", calibration.TSM2, json.dumps(list(key)), value, version, created)


@pytest.fixture
def restore_store():
    old = tsm2.T1_STORE
    yield
    tsm2.set_t1_store(old)


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


def test_recording_store_drains_new_entries(restore_store):
    rec = calibration.recording_store()
    assert calibration.recording_store() is rec and tsm2.T1_STORE is rec
    tsm2.VENDOR_RATIO[KEY] = 0.8           # cuBLAS is timed on the bucket's problem before the winner is put
    rec.put(KEY, {"t1": 128, "t3": 4}, {(128, 4): 2e-4, (256, 4): 3e-4}, 1.7)
    del tsm2.VENDOR_RATIO[KEY]
    (key, value), = rec.drain()
    assert key == KEY and value["best"] == {"t1": 128, "t3": 4} and value["ratio"] == 1.7
    assert value["vendor_ratio"] == 0.8
    assert value["timings"] == {"t1=128,t3=4": 2e-4, "t1=256,t3=4": 3e-4}
    assert rec.drain() == [] and rec.get(KEY) == {"t1": 128, "t3": 4}    # still cached for planning
    recs = calibration.records("dev1", "0.1", [(key, value)])
    assert recs[0].kernel == "tsgemm.tsm2" and json.loads(recs[0].key) == list(KEY)


def test_installed_store_calibrates_tsm2_cost_and_restores(restore_store):
    dev = device_mod.known("H100")
    f = Features(op="tsgemm", backend="gpu", dtype="float32", index_dtype="", m=4096, n=4096, k=16,
                 layout="C")
    params = {"layout": "row", "t1": 256, "t2": 16, "t3": 2}
    key = tsm2.t1_key(dev.name, "float32", "row", 16, 4096, 4096)
    before = tsm2.T1_STORE
    raw = tsm2.TSM2().cost(f, params, dev).run_s
    rows = [cal(3.0, "2026-01-01", key=key), cal(2.0, "2026-02-01", key=key, version="0.2")]
    rows[1].value["vendor_ratio"] = 1.5
    vendor_before = dict(tsm2.VENDOR_RATIO)
    with calibration.installed(rows):
        assert tsm2.T1_STORE.ratio(key) == 2.0                        # the latest recorded wins
        c = tsm2.TSM2().cost(f, params, dev)
        assert "calibrated by the online timing" in c.why and c.calibrated
        assert c.run_s == pytest.approx((raw - tsm2.LAUNCH_S) * 2.0 + tsm2.LAUNCH_S)
        assert tsm2.VENDOR_RATIO == {key: 1.5}
        assert get("gemm.cublas").cost(f, {}, dev).calibrated
    assert tsm2.T1_STORE is before and tsm2.VENDOR_RATIO == vendor_before
