"""Prebuilt kernels on the GPU: first plans compile nothing, the NVRTC fallback compiles once
and keeps its output, and warm-up loads every kernel. Each case runs in a fresh process with
empty kernel caches, as a user's first session would."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

#: Every operation planned and run once, checked against SciPy; prints what NVRTC compiled.
FIRST_USE = """
import json, numpy as np, scipy.sparse as sp, cupy as cp, cupyx.scipy.sparse as csp
import matplan
from matplan.kernels import _cuda
rng = np.random.default_rng(1)
A = sp.random(3000, 3000, density=0.002, format="csr", random_state=1); A.data += 0.5
Ad = csp.csr_matrix(A)
ok = []
for B in (rng.random(3000), rng.random((3000, 8))):
    y = matplan.plan(Ad, cp.asarray(B)).run(Ad, cp.asarray(B))
    ok.append(bool(np.allclose(y.get(), A @ B, rtol=1e-12)))
C = matplan.plan(Ad, Ad).run(Ad, Ad)
ok.append(bool(abs(C.get() - A @ A).max() < 1e-12))
T = matplan.planner.plan_transpose(Ad).run(Ad)
ok.append(bool((T.get() != A.T.tocsr()).nnz == 0))
D, X = rng.random((20000, 2000)), rng.random((2000, 8))
p = matplan.plan(cp.asarray(D), cp.asarray(X))
ok.append(bool(np.allclose(p.run(cp.asarray(D), cp.asarray(X)).get(), D @ X, rtol=1e-12)))
print(json.dumps({"ok": ok, "compiled": [c[0] for c in _cuda.COMPILED], "tsgemm": p.kernel,
                  "why": " ".join(p.reasons)}))
"""


def _run(code, tmp_path, **env):
    tmp_path.mkdir(parents=True, exist_ok=True)
    full = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cupy"), MATPLAN_KERNEL_CACHE=str(tmp_path / "kernels"),
                MATPLAN_MEASURE_CACHE=str(tmp_path / "m.sqlite"), PYTHONPATH=str(ROOT), **env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_first_plans_compile_nothing(tmp_path):
    got, stderr = _run(FIRST_USE, tmp_path)
    assert all(got["ok"]), got
    assert got["compiled"] == [], (got, stderr)
    assert "compiled" not in stderr


def test_without_prebuilt_kernels_nvrtc_compiles_once_and_keeps_them(tmp_path):
    code = FIRST_USE.replace('D, X = rng.random((20000, 2000)), rng.random((2000, 8))',
                             'D, X = rng.random((64, 64)), rng.random((64, 8))')
    assert code != FIRST_USE
    got, stderr = _run(code, tmp_path, MATPLAN_PREBUILT="0")
    assert all(got["ok"]) and got["compiled"], got
    lines = [ln for ln in stderr.splitlines() if ln.startswith("matplan: compiled")]
    assert len(lines) == len(got["compiled"]) and all("NVRTC in" in ln and "once" in ln for ln in lines)
    assert list((tmp_path / "kernels").glob("*.json"))   # kept for later processes
    again, stderr = _run(code, tmp_path, MATPLAN_PREBUILT="0")
    assert all(again["ok"]) and again["compiled"] == [], stderr


def test_warmup_loads_every_kernel_without_compiling(tmp_path):
    code = ("import json; from matplan.kernels import prebuild, _cuda; done = prebuild.warmup(); "
            "print(json.dumps({'units': len(done), 'compiled': len(_cuda.COMPILED)}))")
    got, _ = _run(code, tmp_path)
    assert got == {"units": len(__import__("matplan.kernels.prebuild", fromlist=["units"]).units()), "compiled": 0}


def test_tsgemm_configs_are_timed_once_warmed_up(tmp_path):
    """Row-major A, fresh kernel cache: at k = 4 the register configs are not prebuilt (left out,
    said so) until ``warmup_tsgemm`` compiles them; at k = 2 they are (prebuild.REGISTER_KS), so
    TSM2 is timed with nothing compiled."""
    code = ("import json, cupy as cp, numpy as np, matplan; from matplan.kernels import prebuild, _cuda\n"
            "warm = {warm}\n"
            "if warm: prebuild.warmup_tsgemm([(20000, 2000, {k})])\n"
            "A, B = cp.random.random((20000, 2000)), cp.random.random((2000, {k}))\n"
            "p = matplan.plan(A, B, measure='always'); C = p.run(A, B)\n"
            "ok = bool(cp.allclose(C, A @ B, rtol=1e-12))\n"
            "print(json.dumps({{'ok': ok, 'why': ' '.join(p.reasons), 'compiled': len(_cuda.COMPILED)}}))")
    cold, _ = _run(code.format(warm=False, k=4), tmp_path / "cold")
    assert cold["ok"] and cold["compiled"] == 0 and "not timed: not compiled" in cold["why"], cold
    warm, _ = _run(code.format(warm=True, k=4), tmp_path / "warm")
    assert warm["ok"] and warm["compiled"] > 0 and "not timed" not in warm["why"], warm
    prebuilt, _ = _run(code.format(warm=False, k=2), tmp_path / "k2")
    assert prebuilt["ok"] and prebuilt["compiled"] == 0 and "not timed" not in prebuilt["why"], prebuilt
    assert "tsgemm.tsm2[depth=1,layout=row" in prebuilt["why"].split("measured", 1)[-1], prebuilt


#: An SpGEMM and an SpTRANS plan run three times (first call, recording, replay), each checked;
#: prints how many of CuPy's own kernels the repeated runs compiled.
REPEATED = """
import json, numpy as np, scipy.sparse as sp, cupyx.scipy.sparse as csp
import cupy.cuda.compiler as cc
import matplan
A = sp.random(3000, 3000, density=0.002, format="csr", random_state=2); A.data += 0.5
Ad = csp.csr_matrix(A)
compiles, real = [], cc._compile_with_cache_cuda
def counted(*a, **k):
    compiles.append(1)
    return real(*a, **k)
cc._compile_with_cache_cuda = counted
ok, after_first = [], {}
for op in ("spgemm", "sptrans"):
    p = matplan.planner.plan_transpose(Ad) if op == "sptrans" else matplan.plan(Ad, Ad)
    want = A.T.tocsr() if op == "sptrans" else A @ A
    for i in range(3):
        C = p.run(Ad) if op == "sptrans" else p.run(Ad, Ad)
        ok.append(bool(abs(C.get() - want).max() < 1e-12 and C.nnz == want.nnz))
        if i == 0:
            after_first[op] = len(compiles)
    after_first[op] = len(compiles) - after_first[op]
print(json.dumps({"ok": ok, "repeated_compiles": after_first}))
"""


def test_repeated_runs_compile_none_of_cupys_kernels(tmp_path):
    got, _ = _run(REPEATED, tmp_path)
    assert all(got["ok"]), got
    assert got["repeated_compiles"] == {"spgemm": 0, "sptrans": 0}, got
