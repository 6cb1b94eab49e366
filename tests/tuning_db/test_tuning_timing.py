"""How a tuning run times one problem's candidates (matplan.tuning_db.timing): prepared and checked
one by one, their runs timed in rotated rounds, then queued; failures recorded, the rest timed;
groups bounded by memory; the run_ms_queued column's migration."""
import dataclasses
import json
import types

import numpy as np
import pytest
import scipy.sparse as sp

from matplan.tuning_db import identity, schema
from matplan.tuning_db.dataset import load_dataset
from matplan.tuning_db import timing
from matplan.tuning_db.records import DeviceRecord, ProblemRecord, TimingRecord
from matplan.tuning_db.store import TuningDB


class _Timer(timing.HostTimer):
    """A host timer that logs who was called and how, and answers a fixed time per kernel."""

    def __init__(self, held=None):
        self.log = []
        self.held = held or (lambda: 0)

    def once(self, fn):
        got = fn()
        return got if isinstance(got, float) else 0.5     # a prepare returns its format

    def queued(self, fn, calls):
        self.log.append(("queued", calls))
        return sum(fn() for _ in range(calls)) / calls

    def warm(self, fn):
        self.log.append(("warm",))

    def held_bytes(self):
        return self.held()


class _Kernel:
    """prepare -> the name; run -> appends the name to the log and returns ``ms`` (or raises)."""

    def __init__(self, name, log, ms=1.0, fail_at=None, prepares=None):
        self.name, self.log, self.ms, self.fail_at, self.calls = name, log, ms, fail_at, 0
        self.prepares = prepares if prepares is not None else []

    def prepare(self, A, params):
        self.prepares.append(self.name)
        return self.name

    def tuning_calls(self, prepared, B):
        return {"run": lambda: self.run(prepared, B)}

    def run(self, prepared, B, out=None):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError(f"{self.name} failed at call {self.calls}")
        self.log.append(self.name)
        if out is not None:
            out[...] = np.asarray(B).sum() * 0 + REF
            return out
        return self.ms


REF = 2.0
PROBLEM = types.SimpleNamespace(op="spmv", A=sp.eye(4, format="csr"), B=np.ones(4), dtype=np.float64)
SETTINGS = types.SimpleNamespace(repeats=4, warmup=1, budget_s=10.0)
DEVICE = DeviceRecord(key="d", device_class="cpu", backend="cpu", name="test CPU", spec={"name": "x"})
PROBLEM_RECORD = ProblemRecord("p", "spmv", "float64", "corpus:x|spmv", "x", "x")


def _run(kernels, timer, memory_bytes=0, monkeypatch=None):
    got = {}
    lost = timing.time_candidates([(k, {}) for k in kernels], PROBLEM, np.full(4, REF), 1.0, 1e-9, timer, np,
                                  SETTINGS, lambda name, params, fields: got.setdefault(name, fields),
                                  memory_bytes)
    return got, lost


def test_runs_are_timed_in_rotated_rounds_after_every_check():
    timer = _Timer()
    log = timer.log
    ks = [_Kernel(n, log, ms) for n, ms in (("a", 1.0), ("b", 2.0), ("c", 3.0))]
    got, lost = _run(ks, timer)
    assert not lost and set(got) == {"a", "b", "c"}
    runs = [e for e in log if isinstance(e, str)]
    # the checks (one run each), one warm-up round, then rounds rotated by one each time; the first
    # round's calls each follow OWN_CALLS untimed calls of their own (no time yet says they are long)
    assert runs[:3] == ["a", "b", "c"]
    assert log.index(("warm",)) == 3
    own = timing.OWN_CALLS + 1
    first, timed = runs[6:6 + 3 * own], runs[6 + 3 * own:6 + 3 * own + 9]
    assert first == [n for n in "abc" for _ in range(own)]
    assert [timed[i:i + 3] for i in range(0, 9, 3)] == [list("bca"), list("cab"), list("abc")]
    for name, ms in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        f = got[name]
        assert f["status"] == "ok" and f["matched"] and f["repeats"] == 4
        assert f["run_ms_median"] == f["run_ms_min"] == f["run_ms_max"] == ms == f["run_ms_queued"]
    # queued rounds: at most QUEUED_CALLS calls, fewer when they take longer than QUEUED_ROUND_S
    queued = [e[1] for e in log if isinstance(e, tuple) and e[0] == "queued"]
    assert len(queued) == 3 * timing.QUEUED_ROUNDS
    assert sorted(queued) == [1] * 6 + [2] * 3     # a 1 ms call twice a 2 ms round, 2-3 ms ones once


def test_short_calls_follow_untimed_calls_of_their_own_candidate():
    timer = _Timer()
    ks = [_Kernel("s", timer.log, ms=timing.OWN_CALLS_BELOW_MS / 2), _Kernel("l", timer.log, ms=2.0)]
    got, lost = _run(ks, timer)
    assert not lost and got["s"]["repeats"] == got["l"]["repeats"] == 4
    runs = [e for e in timer.log if isinstance(e, str)]
    own = ["s"] * (timing.OWN_CALLS + 1)
    # after the checks and the warm-up round: the short call always after its own, the long one once
    assert runs[4:4 + 18] == own + ["l"] * (timing.OWN_CALLS + 1) + ["l"] + own + own + ["l"] + ["l"] + own


def test_a_kernel_that_replays_has_its_first_calls_timed_after_each_run():
    timer = _Timer()

    class Replays(_Kernel):
        def tuning_calls(self, prepared, B):
            return {"run": lambda: self.run(prepared, B), "first": lambda: self.first()}

        def first(self):
            self.log.append("first")
            return 5.0

    ks = [_Kernel("a", timer.log), Replays("r", timer.log, ms=2.0)]
    got, lost = _run(ks, timer)
    assert not lost and got["r"]["first_ms"] == 5.0 and got["r"]["run_ms_median"] == 2.0
    assert got["a"]["first_ms"] is None
    runs = [e for e in timer.log if isinstance(e, str)]
    own = timing.OWN_CALLS
    timed = runs[runs.index("first") - 2 * own - 2:]
    first_round = ["a"] * (own + 1) + ["r"] * (own + 1) + ["first"]
    assert timed[:2 * own + 9] == first_round + ["r", "first", "a", "a", "r", "first"]
    assert runs.count("first") == 4      # once after each of the four timed runs, not in warm-up or queued


def test_a_run_that_fails_is_recorded_and_the_others_go_on():
    timer = _Timer()
    ks = [_Kernel("a", timer.log), _Kernel("b", timer.log, fail_at=4), _Kernel("c", timer.log)]
    got, lost = _run(ks, timer)
    assert not lost
    assert got["b"]["status"] == "failed" and "b failed at call 4" in got["b"]["error"]
    assert got["a"]["repeats"] == got["c"]["repeats"] == 4 and got["a"]["status"] == "ok"


def test_failed_checks_and_wrong_results_are_recorded():
    timer = _Timer()

    class Wrong(_Kernel):
        def run(self, prepared, B, out=None):
            if out is not None:
                out[...] = REF + 1
                return out
            return super().run(prepared, B)

    ks = [_Kernel("a", timer.log), _Kernel("boom", timer.log, fail_at=1), Wrong("w", timer.log)]
    got, lost = _run(ks, timer)
    assert got["boom"]["status"] == "failed" and "repeats" not in got["boom"]
    assert got["w"]["status"] == "ok" and got["w"]["matched"] is False and "differs" in got["w"]["error"]
    assert got["a"]["matched"] is True and got["a"]["repeats"] == 4


def test_groups_are_timed_before_memory_runs_out():
    held = []
    timer = _Timer(held=lambda: len(set(held)) * 100)

    class Big(_Kernel):
        def prepare(self, A, params):
            held.append(self.name)
            return super().prepare(A, params)

    ks = [Big(n, timer.log) for n in "abcd"]
    got, lost = _run(ks, timer, memory_bytes=int(150 / timing.GROUP_MEMORY_FRACTION))
    assert not lost and all(got[n]["repeats"] == 4 for n in "abcd")
    warms = [i for i, e in enumerate(timer.log) if e == ("warm",)]
    assert len(warms) == 3   # a and b (200 > 150 bytes held), then c and d alone (the fake frees nothing)
    runs = [e for e in timer.log if isinstance(e, str)]
    # a and b checked, then their rounds, before c is prepared
    first_c = runs.index("c")
    assert set(runs[:first_c]) == {"a", "b"}
    assert runs[:first_c].count("a") == 1 + 1 + timing.OWN_CALLS + 4 + 2 * timing.QUEUED_ROUNDS


def test_a_lost_device_stops_the_problem():
    timer = _Timer()
    ks = [_Kernel("a", timer.log), _Kernel("lost", timer.log, fail_at=3), _Kernel("c", timer.log)]
    timer.healthy = lambda: not any(k.calls >= 3 for k in ks if k.name == "lost")
    got, lost = _run(ks, timer)
    assert lost and set(got) == {"lost"}
    assert got["lost"]["error"].startswith("device context lost")


def test_run_ms_queued_is_stored_and_a_v2_database_migrates(tmp_path):
    path = tmp_path / "v2.sqlite"
    old = TimingRecord("d", "p", "k", "{}", "0", "ok", run_ms_median=1.0, repeats=1, created_at="then")
    with TuningDB(path, migrations=schema.MIGRATIONS[:2]) as db:
        db.put(DEVICE, PROBLEM_RECORD)
        with db._conn:   # a timing as a version-2 matplan wrote it
            db._conn.execute("INSERT INTO timings (device_key, problem, kernel, params, matplan_version, status, "
                             "run_ms_median, repeats, created_at) VALUES ('d', 'p', 'k', '{}', '0', 'ok', 1.0, 1, 'then')")
        assert db.schema_version == 2
    with TuningDB(path) as db:
        assert db.schema_version == schema.latest_version() == 4
        assert db.check()[0] == "integrity"
        assert db.timings() == [old]
        new = dataclasses.replace(old, kernel="k2", run_ms_queued=0.25, first_ms=3.0)
        db.put(timings=[new])
        assert {t.kernel: (t.run_ms_queued, t.first_ms) for t in db.timings()} == {"k": (None, None),
                                                                                 "k2": (0.25, 3.0)}
    with pytest.raises(ValueError, match="run_ms_queued"):
        from matplan.tuning_db.records import record_from_dict
        record_from_dict("timing", dict(device_key="d", problem="p", kernel="k", params="{}",
                                        matplan_version="0", status="ok", run_ms_median=1.0, repeats=1,
                                        run_ms_queued=-1.0))
    assert TimingRecord("d", "p", "k", "{}", "0", "ok", run_ms_median=1.0, repeats=1).run_ms_queued is None


def test_a_first_calls_excess_counts_as_preparation(tmp_path):
    """load_dataset: a row's prepare is what a plan's first run pays beyond a later run: prepare_ms
    plus first_ms - run_ms_median where the kernel's runs replay (never below prepare_ms)."""
    dev = identity.device_record("cpu")
    problem = ProblemRecord("p", "spmv", "float64", "corpus:x|spmv", "x", "x")
    rows = [TimingRecord(dev.key, "p", "cpu.scipy", "{}", "0", "ok", prepare_ms=0.5, run_ms_median=2.0, repeats=3,
                         matched=True)]
    rows += [dataclasses.replace(rows[0], params='{"a": 1}', first_ms=5.0),
             dataclasses.replace(rows[0], params='{"a": 2}', first_ms=1.0)]
    with TuningDB(tmp_path / "t.sqlite") as db:
        db.put(dev, problem, rows)
        ds = load_dataset(db)
    got = {json.dumps(r.params, sort_keys=True): r.prepare_s for r in ds.rows}
    assert got == pytest.approx({"{}": 0.5e-3, '{"a": 1}': 3.5e-3, '{"a": 2}': 0.5e-3})


def test_the_run_time_is_the_single_or_the_queued_calls(tmp_path):
    """load_dataset(timing=...): "single" takes run_ms_median, "queued" run_ms_queued where recorded
    (older records fall back to their single calls), and a first call's excess is over that run time."""
    dev = identity.device_record("cpu")
    problem = ProblemRecord("p", "spmv", "float64", "corpus:x|spmv", "x", "x")
    first = TimingRecord(dev.key, "p", "cpu.scipy", "{}", "0", "ok", prepare_ms=0.5, run_ms_median=2.0, repeats=3,
                         matched=True, run_ms_queued=1.5, first_ms=4.0)
    old = dataclasses.replace(first, params='{"a": 1}', run_ms_queued=None, first_ms=None)
    with TuningDB(tmp_path / "t.sqlite") as db:
        db.put(dev, problem, [first, old])
        single, queued = load_dataset(db), load_dataset(db, timing="queued")
        with pytest.raises(ValueError, match="timing"):
            load_dataset(db, timing="fastest")
    assert (single.timing, queued.timing) == ("single", "queued")
    # rows sort by params: {"a": 1} first
    assert [t for r in single.rows for t in (r.run_s, r.prepare_s)] == pytest.approx([2.0e-3, 0.5e-3, 2.0e-3, 2.5e-3])
    assert [t for r in queued.rows for t in (r.run_s, r.prepare_s)] == pytest.approx([2.0e-3, 0.5e-3, 1.5e-3, 3.0e-3])
    assert single.hash() != queued.hash()
