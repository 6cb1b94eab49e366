"""kernels._cuda: the text NVRTC compiles names its headers' digest (CuPy's disk cache keys on it)."""
import glob
import os

from matplan.kernels import _cuda

KERNELS = os.path.dirname(_cuda.__file__)


def _cu_files():
    return sorted(os.path.relpath(p, KERNELS) for p in glob.glob(os.path.join(KERNELS, "*", "*.cu")))


def test_every_header_a_cu_includes_is_found_and_digested():
    with_headers = 0
    for cu in _cu_files():
        for h in _cuda.headers(cu):
            assert os.path.isfile(os.path.join(KERNELS, h)), f"{cu} includes {h}, which is not there"
        text = _cuda.compiled_source(cu)
        assert text.startswith(_cuda.source(cu)) and "// headers " in text
        with_headers += bool(_cuda.headers(cu))
    assert with_headers, "no .cu includes a header: the digest is untested"


def test_a_header_change_changes_the_compiled_text(tmp_path, monkeypatch):
    (tmp_path / "fam").mkdir()
    (tmp_path / "fam" / "a.cu").write_text('#include "b.cuh"\nextern "C" __global__ void k() {}\n')
    (tmp_path / "fam" / "b.cuh").write_text('#include "c.cuh"\n')
    (tmp_path / "fam" / "c.cuh").write_text("#define X 1\n")
    monkeypatch.setattr(_cuda, "_HERE", str(tmp_path))
    for f in (_cuda.source, _cuda.headers):
        f.cache_clear()
    try:
        assert _cuda.headers("fam/a.cu") == ("fam/b.cuh", "fam/c.cuh")
        before = _cuda.compiled_source("fam/a.cu")
        (tmp_path / "fam" / "c.cuh").write_text("#define X 2\n")
        _cuda.source.cache_clear()
        assert _cuda.compiled_source("fam/a.cu") != before
    finally:
        for f in (_cuda.source, _cuda.headers):
            f.cache_clear()
