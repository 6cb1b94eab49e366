"""The kept kernels (kernels/_store), the package's prebuilt build (kernels/prebuild) and the
light import: what a CPU can check. GPU loading and the NVRTC fallback: test_prebuilt_gpu.py."""
import json
import lzma
import os
import subprocess
import sys

import pytest

from matplan.kernels import _cuda, _store, prebuild
from matplan.planner import measure


def test_targets_for_prefer_own_cubin_then_compatible_then_ptx():
    assert _store.targets_for((9, 0)) == ("sm_90", "compute_90")
    t86 = _store.targets_for((8, 6))
    assert t86[0] == "sm_86" and t86.index("sm_86") < t86.index("sm_80") and "compute_90" not in t86
    assert _store.targets_for((12, 0))[0] == "sm_120" and _store.targets_for((12, 0))[-1] == "compute_90"
    assert "sm_90" not in _store.targets_for((10, 0))   # a cubin runs on its own major only


def _store_in(tmp_path, package_units=()):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    records = []
    for i, (file, digest, target, names) in enumerate(package_units):
        name = f"u{i}.{target}.cubin.xz"
        (pkg / name).write_bytes(lzma.compress(b"binary %d" % i))
        records.append({"format": _store.FORMAT, "file": file, "digest": digest, "target": target,
                        "binary": name, "names": names})
    (pkg / _store.MANIFEST).write_text(json.dumps({"format": _store.FORMAT, "units": records}))
    return _store.Store(pkg, tmp_path / "user")


def test_store_finds_a_unit_by_file_digest_names_and_target(tmp_path):
    store = _store_in(tmp_path, [("a/x.cu", "d1", "sm_80", {"k<float>": "_Z1kIfEvv"})])
    path, lowered, target = store.find("a/x.cu", "d1", ("k<float>", "plain_c"), _store.targets_for((8, 9)))
    assert target == "sm_80" and lowered == {"k<float>": "_Z1kIfEvv", "plain_c": "plain_c"}
    assert path.read_bytes() == b"binary 0"          # unpacked into the user folder
    assert path.parent == tmp_path / "user" / "prebuilt"
    assert store.find("a/x.cu", "other", ("k<float>",), ("sm_80",)) is None      # source changed
    assert store.find("a/x.cu", "d1", ("k<double>",), ("sm_80",)) is None        # not built
    assert store.find("a/x.cu", "d1", ("k<float>",), ("sm_90", "compute_90")) is None


def test_store_adds_units_compiled_here_and_other_processes_see_them(tmp_path):
    store = _store_in(tmp_path)
    store.add("a/x.cu", "d1", "sm_90", b"cubin", {"k<double>": "_Z1kIdEvv"})
    assert store.find("a/x.cu", "d1", ("k<double>",), ("sm_90",))[0].read_bytes() == b"cubin"
    fresh = _store.Store(tmp_path / "pkg", tmp_path / "user")   # another process
    assert fresh.find("a/x.cu", "d1", ("k<double>",), ("sm_90",)) is not None
    (tmp_path / "user" / "broken.json").write_text("{not json")   # ignored, not fatal
    assert _store.Store(tmp_path / "pkg", tmp_path / "user").find("a/x.cu", "d1", ("k<double>",), ("sm_90",))


def test_prebuilt_off_ignores_the_package_units(tmp_path, monkeypatch):
    store = _store_in(tmp_path, [("a/x.cu", "d1", "sm_90", {"k<float>": "m"})])
    monkeypatch.setenv("MATPLAN_PREBUILT", "0")
    assert store.find("a/x.cu", "d1", ("k<float>",), ("sm_90",)) is None


def test_the_package_build_is_current():
    """Fails when a .cu, a header or the list of instantiations changed after the build:
    run `python -m matplan.kernels.prebuild` (docs/adding-a-kernel.md)."""
    assert prebuild.stale() == []


def test_a_build_recompiles_only_what_changed(tmp_path, monkeypatch):
    """A current unit keeps its binary; one whose source changed is compiled again."""
    try:
        prebuild._nvrtc.Nvrtc()
    except (FileNotFoundError, OSError) as exc:
        pytest.skip(f"no NVRTC here: {exc}")
    folder = tmp_path / "bin"
    folder.mkdir()
    for f in _store.PACKAGE_DIR.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    before = json.loads((folder / _store.MANIFEST).read_text())
    compiled = []
    monkeypatch.setattr(prebuild, "ProcessPoolExecutor", _InlinePool)
    monkeypatch.setattr(prebuild, "_build_one", lambda job: compiled.append(job) or pytest.fail("compiled"))
    assert prebuild.build(folder, progress=lambda line: None) == before
    assert compiled == []
    cu = "sptrans/replay.cu"
    real = _cuda.compiled_source
    monkeypatch.setattr(_cuda, "compiled_source", lambda f: real(f) + ("// changed\n" if f == cu else ""))
    monkeypatch.setattr(prebuild, "_build_one", lambda job: compiled.append(job) or (
        dict(next(r for r in before["units"] if r["binary"] == prebuild._binary_name(*job[:3])), digest="new"), 0.0))
    after = prebuild.build(folder, progress=lambda line: None)
    assert sorted(j[2] for j in compiled) == sorted(_store.TARGETS) and {j[0] for j in compiled} == {cu}
    assert [r["binary"] for r in after["units"]] == [r["binary"] for r in before["units"]]
    assert {r["file"] for r in after["units"] if r["digest"] == "new"} == {cu}


class _InlinePool:
    """ProcessPoolExecutor's map in this process (the test's stand-ins do not pickle)."""

    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, items):
        return map(fn, items)


def test_the_build_covers_every_target_and_instantiation():
    manifest = json.loads((_store.PACKAGE_DIR / _store.MANIFEST).read_text())
    assert tuple(manifest["targets"]) == _store.TARGETS
    built = {(r["file"], r["target"]): set() for r in manifest["units"]}
    for r in manifest["units"]:
        built[(r["file"], r["target"])].update(r["names"])
    for cu, names in prebuild.instances().items():
        for target in _store.TARGETS:
            assert set(names) <= built[(cu, target)], (cu, target)


def test_instances_name_real_kernels_of_their_sources():
    for cu, names in prebuild.instances().items():
        text = _cuda.source(cu)
        for name in names:
            assert name.split("<")[0] in text, (cu, name)


def test_import_matplan_is_light():
    code = ("import sys, matplan; heavy = [m for m in sys.modules if m.startswith(('scipy', 'sklearn', "
            "'joblib', 'cupy', 'matplan.kernels', 'matplan.planner', 'matplan.models'))]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_planning_an_spmv_loads_only_its_families():
    code = ("import sys, numpy as np, scipy.sparse as sp, matplan; A = sp.random(50, 50, 0.1, 'csr', "
            "random_state=0); matplan.plan(A, np.ones(50)).run(A, np.ones(50)); "
            "print(sorted(m for m in ('sklearn', 'joblib', 'matplan.kernels.spgemm', 'matplan.kernels.sptrans', "
            "'matplan.kernels.tsgemm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_measurement_times_only_configs_that_compile_nothing(monkeypatch):
    """A kernel's configs whose binaries are not kept are left out and counted; a kernel with
    none left is not timed at all."""
    class Fake:
        name = "fake"

        def measure_key(self, f):
            return ("bucket",)

        def search_space(self, f, dev):
            return [{"t": 1}, {"t": 2}, {"t": 3}]

        def ready(self, f, params):
            return params["t"] != 2

        def cost(self, f, params, dev):
            from matplan.core.types import Cost
            return Cost(0.0, 1e-3, "fake")

    from matplan.core.types import Candidate
    monkeypatch.setattr(measure, "get", lambda name: Fake())
    c = Candidate("fake", {"t": 1}, 0.0, 1e-3, 1e-3, "analytic", "")
    group, skipped = measure._configs(c, None, None, 1, lambda name: 0.0)
    assert [g.params for g in group] == [{"t": 1}, {"t": 3}] and skipped == 1
    monkeypatch.setattr(Fake, "ready", lambda self, f, p: False)
    assert measure._configs(c, None, None, 1, lambda name: 0.0) == ([], 3)


def test_warmup_without_a_gpu_says_why(capsys):
    from matplan import cli
    if cli.why_no_gpu() is None:
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit, match="needs CuPy and an NVIDIA GPU"):
        cli.main(["warmup"])


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_a_cache_folder_others_may_write_is_not_used(tmp_path, monkeypatch):
    """Kernels in a group- or world-writable folder could be replaced by someone else: such a
    folder is neither read nor written; a private one under the temporary folder is used."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(_store.tempfile, "gettempdir", lambda: str(tmp_path))
    store = _store_in(tmp_path)
    store.cache_dir = shared
    with pytest.warns(RuntimeWarning, match="others may write to it"):
        path = store.add("a/x.cu", "d9", "sm_90", b"cubin", {"k<int>": "_Z1kIiEvv"})
    assert shared not in path.parents and not list(shared.iterdir())
    assert path.parent == tmp_path / f"matplan-kernels-{os.getuid()}"
    assert oct(path.parent.stat().st_mode & 0o777) == oct(0o700)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_the_cache_folder_is_made_private_whatever_the_umask(tmp_path):
    old = os.umask(0o002)   # group-writable by default, as on systems with user-private groups
    try:
        store = _store_in(tmp_path)
        store.cache_dir = tmp_path / "fresh" / "kernels"
        path = store.add("a/x.cu", "d9", "sm_90", b"cubin", {"k<int>": "_Z1kIiEvv"})
    finally:
        os.umask(old)
    assert path.parent == tmp_path / "fresh" / "kernels"
    assert path.parent.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_prebuilt_register_modules_cover_the_row_kernels_measurement_at_small_k(gpu):
    """Row-major A at k = 1 and 2 (no cp.async kernel there): every register module the planner's
    measurement times, at shapes from a few hundred rows to a million, is prebuilt whole in one
    unit, so a fresh install times TSM2 there instead of keeping cuBLAS."""
    from matplan.core import device as device_mod
    units = [set(names) for cu, names in prebuild.units() if cu == "tsgemm/tsm2.cu"]
    device = device_mod.known(gpu)
    for m, n in ((256, 256), (1024, 2048), (8192, 8192), (65536, 1024), (1 << 20, 64)):
        for k in prebuild.REGISTER_KS:
            modules = prebuild.tsgemm_modules(device, (m, n, k), orders=("C",))
            assert modules, (m, n, k)
            for names in modules:
                assert any(set(names) <= u for u in units), (gpu, m, n, k, names[0])


def test_units_keep_each_register_module_whole_and_other_files_in_order():
    for cu, names in prebuild.instances().items():
        chunks = [n for c, n in prebuild.units() if c == cu]
        assert tuple(x for chunk in chunks for x in chunk) == names      # every name once, in order
        assert all(len(chunk) <= prebuild.UNIT_NAMES for chunk in chunks)
    for mod in prebuild._register_modules():
        assert sum(set(mod) <= set(n) for c, n in prebuild.units() if c == "tsgemm/tsm2.cu") == 1
