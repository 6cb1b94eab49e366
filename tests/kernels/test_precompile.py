"""_cuda.precompile: a tuning run's modules without a kept binary compiled in parallel threads
into the user's kernel cache, once, without a GPU (NVRTC only); and TSM2's modules (the ones its
configs load, the same ones ``ready`` checks). The tuning run's use of it: tests/tuning_db."""
import numpy as np
import pytest

from matplan.core import device as device_mod
from matplan.core.features import Features
from matplan.kernels import _cuda, _nvrtc, _store, get
from matplan.kernels.tsgemm import launch
from matplan.kernels.tsgemm.configs import TSM2Config

H200 = (9, 0)


def _tsm2_specs(dtype="float64", layout="C", k=8):
    dev = device_mod.known("H200")
    f = Features(op="tsgemm", dtype=dtype, backend="gpu", m=20000, n=8192, k=k, layout=layout,
                 t2threshold=dev.t2threshold(dtype))
    kernel = get("tsgemm.tsm2")
    return f, kernel, [m for p in kernel.search_space(f, dev) for m in kernel.modules(f, p)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A kernel cache of its own (the package's prebuilt units still count)."""
    try:
        _nvrtc.Nvrtc()
    except (FileNotFoundError, OSError) as exc:
        pytest.skip(f"no NVRTC here: {exc}")
    store = _store.Store(_store.PACKAGE_DIR, tmp_path / "user")
    monkeypatch.setattr(_store, "default_store", lambda: store)
    return store


def _missing(specs):
    return {(f, tuple(n), tuple(o)) for f, n, o in specs if _cuda._kept_for(f, tuple(n), tuple(o), H200)[0] is None}


def test_precompile_keeps_the_missing_modules_once(cache):
    _, _, specs = _tsm2_specs()
    missing = sorted(_missing(specs))
    assert missing, "every module of this search space is prebuilt: pick a rarer shape"
    one = [(f, n, o) for f, n, o in specs if (f, tuple(n), tuple(o)) == missing[0]]
    assert _cuda.precompile(one + one, compute_capability=H200, workers=2) == 1      # the same module once
    hit = _cuda._kept_for(*missing[0], H200)[0]
    assert hit is not None and hit[2] == "sm_90" and set(hit[1]) == set(missing[0][1])
    assert hit[0].read_bytes()[:4] == b"\x7fELF"                                # a cubin
    assert _cuda.precompile(one, compute_capability=H200) == 0                        # kept now


def test_precompile_skips_a_module_that_fails_to_compile(cache, capsys):
    bad = [("tsgemm/tsm2.cu", ("tsm2_rowmajor<double,64,8,2,2,1,4,1,9,9>",), ())]   # no such template
    assert _cuda.precompile(bad, compute_capability=H200) == 0
    assert "compiled 0 of 1 module(s)" in capsys.readouterr().err


def test_precompile_needs_a_gpu_or_a_compute_capability(monkeypatch):
    monkeypatch.setattr(_cuda, "cupy_module", lambda: None)
    assert _cuda.precompile([("tsgemm/tsm2.cu", ("tsm2_colmajor<double,64,13,16,2>",), ())]) == 0


@pytest.mark.parametrize("dtype,layout,k", [("float64", "C", 8), ("float32", "F", 13), ("float32", "C", 3)])
def test_tsm2_modules_are_what_ready_checks(monkeypatch, dtype, layout, k):
    f, kernel, _ = _tsm2_specs(dtype, layout, k)
    asked = []
    monkeypatch.setattr(_cuda, "available", lambda filename, names, options=(): asked.append((filename, tuple(names))) or False)
    for p in kernel.search_space(f, device_mod.known("H200")):
        asked.clear()
        assert kernel.ready(f, p) is False
        mods = kernel.modules(f, p)
        assert [(m[0], tuple(m[1])) for m in mods] == asked and all(m[2] == () for m in mods)
        c = TSM2Config.of(p)
        if not (c.async_variant or c.tc_variant):
            lda = f.n if c.layout == "row" else f.m
            assert mods[0][1] == launch.config_module(c.layout, np.dtype(dtype), lda, c.t1, c.t2, c.t3, c.depth)


def test_kernels_without_run_time_modules_list_none():
    f, _, _ = _tsm2_specs()
    assert get("spmv.csr_vector").modules(f, {}) == ()


def test_tsm2_module_takes_t2_at_most_k_as_the_launch_does():
    """A config of t2 > k launches the kernel of t2 = k (tsm2._launch_for): its module is that one."""
    f, kernel, _ = _tsm2_specs("float64", "C", 5)
    c = TSM2Config("row", 64, 8, 1)
    (mod,) = kernel.modules(f, c.params())
    assert mod[1] == launch.config_module("row", np.dtype("float64"), f.n, 64, 5, 1, 1)
