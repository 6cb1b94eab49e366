"""The planner's measurement (one autotuner) on the host: hashable configs, cache keys (sources,
versions), persistence in the SQLite file, a searched kernel's configs measured and reused, a
timing scaled to another problem of its bucket, failing configs, and measure="never" timing nothing."""
import dataclasses
import json
import sqlite3
import time

import numpy as np
import pytest
from conftest import random_csr

from matplan import planner
from matplan.core import device as device_mod, features as stats
from matplan.core.types import Cost
from matplan.core.validation import normalize
from matplan.kernels import registry
from matplan.kernels.base import Kernel, Prepared
from matplan.planner import measure, measure_cache as mc


class _Searched(Kernel):
    """A host SpMV with a search space of configs ``{"ms": sleep per run}``, timings kept by a
    bucket of A's rows; configs in ``fail`` raise in prepare. The model predicts f.m microseconds."""
    backend, ops = "cpu", ("spmv",)

    def __init__(self, name, sleeps, fail=()):
        self.name, self.sleeps, self.fail = name, tuple(sleeps), set(fail)

    def measure_key(self, f):
        return ("rows", 1 << max(f.m - 1, 0).bit_length())

    def search_space(self, f, device):
        return [{"ms": s} for s in self.sleeps]

    def candidates(self, f, device):
        yield {"ms": self.sleeps[0]}

    def cost(self, f, params, device):
        return Cost(0.0, f.m * 1e-6, "test model")

    def prepare(self, A, params):
        if params["ms"] in self.fail:
            raise ValueError(f"config ms={params['ms']} does not compile")
        return Prepared(self.name, dict(params), {"A": A}, A.shape, A.dtype)

    def run(self, prepared, B, out=None):
        time.sleep(prepared.params["ms"] * 1e-3)
        return prepared.arrays["A"] @ B


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh measurement cache file for the test (and the cache objects of other files kept apart)."""
    monkeypatch.setenv(mc.CACHE_ENV, str(tmp_path / "m.sqlite"))
    monkeypatch.setattr(mc, "_CACHES", {})
    return mc.cache()


@pytest.fixture
def new_entries(monkeypatch):
    got = []
    monkeypatch.setattr(mc, "LISTENERS", [got.extend])
    return got


def _problem(rng, m=100, n=80):
    problem = normalize(random_csr(rng, m, n, 0.05), rng.random(n))
    return problem, stats.compute(problem, device_mod.current())


def _group(kernel, problem, feats):
    dev = device_mod.current()
    return [measure._candidate(kernel, p, feats, dev, 1) for p in kernel.search_space(feats, dev)]


def _register(monkeypatch, kernel):
    monkeypatch.setitem(registry._REGISTRY, kernel.name, kernel)
    return kernel


def test_configs_are_hashable_and_canonical():
    a = mc.Config.of("k", {"t1": 256, "layout": "row", "tiles": [1, 2]})
    b = mc.Config.of("k", {"tiles": (1, 2), "layout": "row", "t1": np.int64(256)})
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a.text() == '{"layout":"row","t1":256,"tiles":[1,2]}'
    assert a.params() == {"layout": "row", "t1": 256, "tiles": (1, 2)}
    assert mc.Config.of("other", a.params()) != a
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.kernel = "x"


def test_key_digest_covers_every_field():
    key = mc.Key(mc.Config.of("k", {"t1": 64}), mc.canonical(["bucket", ["float32", "row", 8]]), "H100",
                 "0123abcd", mc.canonical({"matplan": "0.1.0", "cupy": "14.2"}))
    changed = [dataclasses.replace(key, config=mc.Config.of("k", {"t1": 128})),
               dataclasses.replace(key, problem=mc.canonical(["bucket", ["float32", "row", 16]])),
               dataclasses.replace(key, device="A100"), dataclasses.replace(key, source="0123abce"),
               dataclasses.replace(key, versions=mc.canonical({"matplan": "0.1.0", "cupy": "14.3"}))]
    digests = {key.digest()} | {k.digest() for k in changed}
    assert len(digests) == 1 + len(changed) and key.digest() == dataclasses.replace(key).digest()


def test_versions_name_the_libraries():
    v = json.loads(mc.versions("cpu"))
    assert v["matplan"] and v["numpy"] == np.__version__
    assert "matplan" in json.loads(mc.versions("gpu"))   # CuPy's and the runtime's where there is a GPU


def test_source_digest_follows_the_sources_and_their_includes(tmp_path):
    (tmp_path / "k.cu").write_text('#include "k.cuh"\n__global__ void k() {}\n')
    (tmp_path / "k.cuh").write_text("// v1\n")

    class WithSources(Kernel):
        name, sources = "test.sources", (str(tmp_path / "k.cu"),)
    kern = WithSources()
    first = mc.source_digest(kern)
    assert first == mc.source_digest(kern) and len(first) == 16
    assert {p.name for p in mc._source_files(kern)} == {"test_measure_cache.py", "k.cu", "k.cuh"}
    (tmp_path / "k.cuh").write_text("// version two of the header\n")
    assert mc.source_digest(kern) != first           # a header the .cu includes changed

    class Plain(Kernel):
        name = "test.plain"
    assert mc.source_digest(Plain()) != first        # only this test file


def test_persistence_a_second_lookup_comes_from_the_file(tmp_path, new_entries):
    path = tmp_path / "m.sqlite"
    key = mc.Key(mc.Config.of("k", {"t1": 64}), mc.canonical(["bucket", [1]]), "H100", "abc", mc.canonical({}))
    one = mc.MeasureCache(path)
    one.put([mc.Entry(key, 2e-4, 1e-4, "2000-01-01T00:00:00+00:00"),
             mc.Entry(dataclasses.replace(key, device="X"), float("inf"), 1e-4)])   # failures are not kept
    assert [e.key for e in new_entries] == [key]
    other = mc.MeasureCache(path)                    # another process: an empty memory layer
    hit = other.get(key)
    assert hit == mc.Entry(key, 2e-4, 1e-4, "2000-01-01T00:00:00+00:00") and hit.ratio == 2.0
    assert other.memory.info().misses == 1 and other.get(key) is hit and other.memory.info().hits == 1
    assert other.get(dataclasses.replace(key, source="abd")) is None          # a changed source misses
    assert other.get(dataclasses.replace(key, versions=mc.canonical({"cupy": "1"}))) is None
    assert [e.key for e in other.entries()] == [key] and other.entries("k")[0].to_dict()["seconds"] == 2e-4
    with sqlite3.connect(str(path)) as db:
        (kernel, config), = db.execute("SELECT kernel, config FROM measurements").fetchall()
    assert (kernel, json.loads(config)) == ("k", {"t1": 64})
    other.clear()
    assert mc.MeasureCache(path).get(key) is None


def test_cache_file_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(mc.CACHE_ENV, "off")
    assert mc.cache_path() is None and mc.cache().path is None
    monkeypatch.setenv(mc.CACHE_ENV, str(tmp_path / "x.sqlite"))
    assert mc.cache_path() == tmp_path / "x.sqlite" and mc.cache() is mc.cache()
    monkeypatch.delenv(mc.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert mc.cache_path() == tmp_path / "cache" / "matplan" / "measurements.sqlite"


def test_an_unusable_file_is_warned_about_once_and_memory_still_serves(tmp_path):
    (tmp_path / "dir.sqlite").mkdir()
    c = mc.MeasureCache(tmp_path / "dir.sqlite")
    key = mc.Key(mc.Config.of("k", {}), "[]", "host", "s", "{}")
    with pytest.warns(RuntimeWarning, match="kept in memory only"):
        c.put([mc.Entry(key, 1.0, 1.0)])
    assert c.get(key).seconds == 1.0 and c.entries() == [c.get(key)]


def test_searched_configs_are_measured_and_the_fastest_kept_then_reused(rng, monkeypatch, store, new_entries):
    kern = _register(monkeypatch, _Searched("test.searched", (3, 0, 1)))
    problem, feats = _problem(rng)
    dev = device_mod.current()
    (best,), note = measure.measure(problem, feats, dev, [_group(kern, problem, feats)], 1)
    assert best.params == {"ms": 0} and best.source == "measured"
    assert "fastest of 3 configs measured; next test.searched[ms=1]" in best.why
    assert "3 timed, 0 from the measurement cache" in note and len(new_entries) == 3
    assert best.run_s < 1e-3 and {json.loads(e.key.problem)[0] for e in new_entries} == {"bucket"}
    # again: every config from the cache, in this process and in another (a new memory layer)
    for fresh in (False, True):
        if fresh:
            monkeypatch.setattr(mc, "_CACHES", {})
        (again,), note = measure.measure(problem, feats, dev, [_group(kern, problem, feats)], 1)
        assert "0 timed, 3 from the measurement cache" in note and again.params == {"ms": 0}
        assert "from the measurement cache" in again.why
    assert len(new_entries) == 3
    # an edited kernel (another source digest) is timed again
    monkeypatch.setattr(measure, "source_digest", lambda kernel: "edited")
    _, note = measure.measure(problem, feats, dev, [_group(kern, problem, feats)], 1)
    assert "3 timed" in note and len(new_entries) == 6


def test_a_bucket_timing_scales_to_another_problem_of_the_bucket(rng, monkeypatch, store):
    kern = _register(monkeypatch, _Searched("test.scaled", (1,)))
    dev = device_mod.current()
    p1, f1 = _problem(rng, m=100)
    (c1,), _ = measure.measure(p1, f1, dev, [_group(kern, p1, f1)], 1)
    p2, f2 = _problem(rng, m=120)                    # same bucket (128 rows): not timed again
    (c2,), note = measure.measure(p2, f2, dev, [_group(kern, p2, f2)], 1)
    assert "0 timed" in note and "measured/model" in c2.why
    assert c2.run_s == pytest.approx(c1.run_s * 120 / 100)    # measured / predicted x predicted here


def test_failing_configs_are_left_out_with_a_warning_and_all_failing_raises(rng, monkeypatch, store):
    problem, feats = _problem(rng)
    dev = device_mod.current()
    kern = _register(monkeypatch, _Searched("test.failing", (0, 1, 2), fail=(0,)))
    with pytest.warns(RuntimeWarning, match=r"test.failing: 1 of 3 configs failed to compile or launch "
                                            r"\(first test.failing\[ms=0\]: ValueError: config ms=0"):
        (best,), _ = measure.measure(problem, feats, dev, [_group(kern, problem, feats)], 1)
    assert best.params == {"ms": 1}
    kern = _register(monkeypatch, _Searched("test.all_failing", (0, 1), fail=(0, 1)))
    with pytest.raises(RuntimeError, match="test.all_failing: 2 of 2 configs failed"):
        measure.measure(problem, feats, dev, [_group(kern, problem, feats)], 1)
    alone = _register(monkeypatch, _Searched("test.alone", (0,), fail=(0,)))   # one candidate: raises
    with pytest.raises(RuntimeError, match=r"measuring candidate test.alone\[ms=0\] on these inputs failed"):
        measure.measure(problem, feats, dev, [_group(alone, problem, feats)], 1)


def test_plans_on_the_host_and_never_time_nothing_kept_by_bucket(rng, monkeypatch, store, new_entries):
    """Kernels kept by a bucket are measured on the GPU in use only; measure="never" times nothing;
    the host's "always" times the finalists (kept by the features), as before."""
    kern = _register(monkeypatch, _Searched("test.bucketed", (0, 1)))
    A, x = random_csr(rng, 100, 80, 0.05), rng.random(80)
    for mode in ("never", "auto"):
        p = planner.plan(A, x, kernels=[kern.name], measure=mode)
        assert p.params == {"ms": 0} and all(c.source != "measured" for c in p.candidates)
    assert new_entries == []
    problem, feats = _problem(rng)
    assert measure.tune(kern, problem, feats, device_mod.current()) is None    # host: not the GPU's


def test_refine_keeps_the_models_choice_for_never(rng):
    problem, feats = _problem(rng)
    scored = [measure._candidate(_Searched("test.x", (0,)), {"ms": 0}, feats, device_mod.current(), 1)]
    assert measure.refine(problem, feats, device_mod.current(), scored, "never", 1, False) == (scored, None)
