"""The kernels matplan ships compiled: which instantiations, building them without a GPU, and
loading them all for the GPU in use (``matplan warmup``).

Every kernel a plan can pick is prebuilt except most of TSM2's register kernel, one instantiation
per (t1, t2, t3, vector width, groups, steps, depth) with thousands reachable: NVRTC compiles those
on first use for the GPU in use, and the planner's measurement times only those already
compiled (docs/tsgemm.md). Prebuilt of it: the modules its measurement times for row-major A at
k = 1 and 2 (REGISTER_KS), where no cp.async kernel is eligible, so a fresh install times TSM2
there instead of keeping cuBLAS. A module's instantiations stay in one unit (:func:`units`).
Build with ``python -m matplan.kernels.prebuild`` (needs ``pip install
'nvidia-cuda-nvrtc==13.0.*'``, no GPU); a CPU test fails when a source changed after the build.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..core import device as device_mod, features, validation
from ..core.features import Features
from ..core.xp import HOST_STATS_NNZ, cupy_module, cupyx_sparse
from . import _cuda, _nvrtc, _store, statistics
from .spgemm import merge as spgemm_merge, runtime as spgemm_runtime
from .spmv import gpu as spmv_gpu
from .sptrans import compiled as sptrans_compiled
from .tsgemm import configs as tsgemm_configs, launch as tsgemm_launch, tsm2_async, tsm2_tc
from .tsgemm import rules as tsgemm_rules
from .tsgemm.rules import ASYNC_K, ASYNC_VARIANTS

#: dispatch's fingerprint kernel (its .cu sits beside dispatch/fingerprint.py, above this layer).
FINGERPRINT = ("../dispatch/fingerprint.cu", ("matplan_fingerprint",))
#: Instantiations a prebuilt unit holds at most (units build in parallel).
UNIT_NAMES = 48
#: k of the row-major register-kernel modules prebuilt (:func:`_register_modules`).
REGISTER_KS = (1, 2)


def _async_names() -> tuple:
    """The cp.async kernel's instantiations the planner's measurement reaches with B from CuPy's
    allocator (C-contiguous, ld = k): every variant of every k bucket, both layouts and types."""
    names = []
    for dtype in ("float32", "float64"):
        item = 4 if dtype == "float32" else 8
        for layout in ("row", "col"):
            for k in range(1 if layout == "col" else ASYNC_K[0], ASYNC_K[1] + 1):
                for variant in ASYNC_VARIANTS:
                    cfg = tsgemm_configs.async_config(dtype, k, variant, layout)
                    try:
                        tsm2_async.check_config(cfg, item, layout == "col")
                    except ValueError:
                        continue
                    bv = tsm2_async.allocator_bvec(cfg, item, k, layout == "col")
                    names.append(tsm2_async.kernel_name(dtype, cfg, bv, layout == "col"))
    return tuple(dict.fromkeys(names))


def _register_modules() -> tuple:
    """The register-kernel modules (name tuples) the planner's measurement times for row-major A
    at k in REGISTER_KS: t2 = k, every t3 of rules.t3_candidates from the model's t3 = 1 (the
    model's choice there on the H100 and H200 at every shape tried), depth 1, A 16-byte aligned
    with a leading dimension a multiple of 16 bytes."""
    mods = []
    for dtype in ("float32", "float64"):
        for k in REGISTER_KS:
            for t3 in tsgemm_rules.t3_candidates("row", dtype, k, 1):
                mods.append(tsgemm_launch.config_module("row", dtype, 4096, 64, k, t3, 1))
    return tuple(dict.fromkeys(mods))


def instances() -> dict:
    """Source file (relative to matplan/kernels) -> the instantiations prebuilt from it."""
    spmv = tuple(dict.fromkeys(n for ct in ("float", "double") for it in ("int", "long long")
                               for n in spmv_gpu._names(ct, it)))
    tsm2 = tsgemm_launch.SPLIT_SUM_NAMES + tuple(n for mod in _register_modules() for n in mod)
    out = {spmv_gpu.CU: spmv, **spgemm_runtime.SOURCES, spgemm_merge.SOURCE: spgemm_merge._NAMES,
           **sptrans_compiled.SOURCES, tsgemm_launch.SOURCE: tsm2,
           tsm2_tc.SOURCE: tsm2_tc._names(), tsm2_async.SOURCE: _async_names()}
    out[FINGERPRINT[0]] = FINGERPRINT[1]
    out[statistics.SOURCE] = statistics.NAMES
    return out


def units() -> list:
    """(file, names) of every prebuilt unit: each file's instantiations in order, in chunks of at
    most UNIT_NAMES that never split a register-kernel module (a module loads from one unit)."""
    modules = {n: mod for mod in _register_modules() for n in mod}
    out = []
    for cu, names in instances().items():
        chunk, i = [], 0
        while i < len(names):
            group = modules.get(names[i], (names[i],))
            if chunk and len(chunk) + len(group) > UNIT_NAMES:
                out.append((cu, tuple(chunk)))
                chunk = []
            chunk += group
            i += len(group)
        if chunk:
            out.append((cu, tuple(chunk)))
    return out


def _binary_name(cu: str, names, target: str) -> str:
    stem = f"{cu.replace('../', '').replace('/', '.').removesuffix('.cu')}.{_store.digest(''.join(names), ())[:8]}"
    return f"{stem}.{target}" + (".cubin" if target.startswith("sm_") else ".ptx") + ".xz"


def _build_one(job):
    cu, names, target, folder = job
    code = _cuda.compiled_source(cu)
    start = time.perf_counter()
    binary, lowered = _nvrtc.Nvrtc().compile(code, os.path.basename(cu), names,
                                              _cuda.NVRTC_OPTIONS + _cuda.include(cu), target)
    name = _binary_name(cu, names, target)
    (Path(folder) / name).write_bytes(lzma.compress(binary, preset=9))
    return {"format": _store.FORMAT, "file": cu, "digest": _store.digest(code, _cuda.NVRTC_OPTIONS),
            "target": target, "binary": name, "names": lowered}, time.perf_counter() - start


def _reusable(folder: Path, nvrtc_version: str) -> dict:
    """The records of ``folder``'s manifest that the same NVRTC and options built, by binary name."""
    path = folder / _store.MANIFEST
    if not path.is_file():
        return {}
    old = json.loads(path.read_text())
    if old.get("nvrtc") != nvrtc_version or old.get("options") != list(_cuda.NVRTC_OPTIONS):
        return {}
    return {r["binary"]: r for r in old["units"] if (folder / r["binary"]).is_file()}


def build(folder: Path = _store.PACKAGE_DIR, targets=_store.TARGETS, jobs: int | None = None,
          progress=print, rebuild: bool = False) -> dict:
    """Compile every unit for every target into ``folder`` and write its manifest; a unit whose
    source digest, instantiations, NVRTC and options are unchanged keeps its binary unless
    ``rebuild``. Binaries no unit names are removed. Returns the manifest."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    version = _nvrtc.Nvrtc().version()
    reuse = {} if rebuild else _reusable(folder, version)
    records, work, order = [], [], {}   # order: each binary's place in the manifest
    for cu, names in units():
        key = _store.digest(_cuda.compiled_source(cu), _cuda.NVRTC_OPTIONS)
        for t in targets:
            name = _binary_name(cu, names, t)
            order[name] = len(order)
            kept = reuse.get(name)
            if kept is not None and kept["digest"] == key and set(kept["names"]) == set(names):
                records.append(kept)
            else:
                work.append((cu, names, t, str(folder)))
    for old in folder.glob("*.xz"):
        if old.name not in order:
            old.unlink()
    start = time.perf_counter()
    progress(f"{len(records)} units current, {len(work)} to compile")
    with ProcessPoolExecutor(max(1, min(jobs or os.cpu_count(), len(work) or 1))) as pool:
        for i, (record, seconds) in enumerate(pool.map(_build_one, work), 1):
            records.append(record)
            progress(f"[{i}/{len(work)}] {record['file']} {record['target']}: {len(record['names'])} "
                     f"kernels in {seconds:.1f} s")
    records.sort(key=lambda r: order[r["binary"]])
    manifest = {"format": _store.FORMAT, "nvrtc": version, "targets": list(targets),
                "options": list(_cuda.NVRTC_OPTIONS), "units": records}
    (folder / _store.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    progress(f"{len(records)} units in {time.perf_counter() - start:.0f} s, "
             f"{sum(f.stat().st_size for f in folder.iterdir()) / 1e6:.1f} MB in {folder}")
    return manifest


def stale(folder: Path = _store.PACKAGE_DIR) -> list:
    """What the package's manifest lacks or holds out of date, as lines (empty: current)."""
    path = Path(folder) / _store.MANIFEST
    if not path.is_file():
        return [f"{path}: missing; run python -m matplan.kernels.prebuild"]
    manifest = json.loads(path.read_text())
    have = {}
    for r in manifest["units"]:
        have.setdefault((r["file"], r["target"]), (r["digest"], set()))[1].update(r["names"])
    out = []
    for cu, names in instances().items():
        key = _store.digest(_cuda.compiled_source(cu), _cuda.NVRTC_OPTIONS)
        for target in manifest["targets"]:
            digest, built = have.get((cu, target), (None, set()))
            if digest != key:
                out.append(f"{cu} ({target}): source changed since the build")
            elif set(names) - built:
                out.append(f"{cu} ({target}): {len(set(names) - built)} instantiations not built")
            elif not all((Path(folder) / r["binary"]).is_file() for r in manifest["units"] if r["file"] == cu):
                out.append(f"{cu} ({target}): a binary is missing")
    return out


def warmup(progress=None) -> list:
    """Load (or, where no prebuilt binary fits this GPU, compile once) every prebuilt kernel
    for the current GPU. Returns (file, kernels, seconds) per unit."""
    done = []
    for cu, names in (progress or (lambda x: x))(units()):
        start = time.perf_counter()
        module = _cuda.module(cu, names)
        for name in names:
            module.get_function(name)
        done.append((cu, len(names), time.perf_counter() - start))
    return done


def warmup_statistics() -> None:
    """Compute the planner's general statistics once with CuPy for an operand past ``HOST_STATS_NNZ``,
    so CuPy compiles the elementwise and reduction kernels they use now and keeps them in its own
    kernel cache: the path GPU operands take where the statistics kernel (``statistics.cu``, which
    plans use) cannot load, and the products per row of matplan.distributed's blocks."""
    cp, csp = cupy_module(), cupyx_sparse()
    m = 1 << 12
    per_row = HOST_STATS_NNZ // m + 1
    nnz = m * per_row
    indices = (cp.arange(nnz, dtype=cp.int64) * 7919 % m).astype(cp.int32)
    A = csp.csr_matrix((cp.ones(nnz), indices, cp.arange(0, nnz + 1, per_row, dtype=cp.int32)), shape=(m, m))
    validation.check_csr(A, "A")
    features.sparse_features(A)
    features.spgemm_features(A, A)
    features.transpose_features(A)
    cp.cuda.Device().synchronize()


def tsgemm_modules(device, shape, dtypes=("float32", "float64"), orders=("C", "F")) -> list:
    """The register-kernel modules (name tuples of tsm2.cu) the planner's measurement times for
    an ``(m, n, k)`` product of A in these types and orders (16-byte aligned, as allocated)."""
    m, n, k = (int(v) for v in shape)
    out = []
    for dtype in dtypes:
        for order in orders:
            f = Features(op="tsgemm", dtype=dtype, backend="gpu", m=m, n=n, k=k, layout=order)
            for c in tsgemm_configs.search_space(device, f):
                if c.async_variant or c.tc_variant:
                    continue   # prebuilt
                names = tsgemm_launch.config_module(c.layout, dtype, n if c.layout == "row" else m,
                                                    c.t1, c.t2, c.t3, c.depth)
                if names not in out:
                    out.append(names)
    return out


def warmup_tsgemm(shapes, progress=None, dtypes=("float32", "float64"), orders=("C", "F")) -> list:
    """Compile (once, kept in the user's kernel cache; in parallel threads) and load TSM2's
    register kernels for the planner's measurement of each ``(m, n, k)`` in ``shapes``. Returns
    (kernels, seconds to load) per module."""
    device = device_mod.current()
    modules = list(dict.fromkeys(names for shape in shapes for names in tsgemm_modules(device, shape, dtypes, orders)))
    _cuda.precompile([(tsgemm_launch.SOURCE, names, ()) for names in modules])   # over every core, then loaded
    done = []
    for names in (progress or (lambda x: x))(modules):
        start = time.perf_counter()
        _cuda.module(tsgemm_launch.SOURCE, names)
        done.append((len(names), time.perf_counter() - start))
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matplan.kernels.prebuild",
                                     description="Compile matplan's kernels ahead of time (no GPU needed).")
    parser.add_argument("--targets", default=",".join(_store.TARGETS),
                        help="comma-separated NVRTC targets (sm_XY cubins, compute_XY PTX)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compilations (default: CPU count)")
    parser.add_argument("--out", default=str(_store.PACKAGE_DIR), help="folder (default: the package's)")
    parser.add_argument("--check", action="store_true", help="only say whether the package's build is current")
    parser.add_argument("--rebuild", action="store_true", help="compile every unit, also those still current")
    args = parser.parse_args(argv)
    if args.check:
        lines = stale(Path(args.out))
        print("\n".join(lines) or "prebuilt kernels are current")
        return 1 if lines else 0
    build(Path(args.out), tuple(t for t in args.targets.split(",") if t), args.jobs, rebuild=args.rebuild)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
