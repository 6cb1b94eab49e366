"""The statistics kernel on the GPU: its figures equal the NumPy formulas' bit for bit on fresh
random CSR matrices and the edge cases (empty matrix, empty rows, rows past the histogram, int32
and int64 indices, unsorted and duplicate columns, subsampled SpGEMM rows), planned features on
GPU operands equal those of the same matrices on the host, malformed structures raise the host's
errors, and plans of GPU operands compile nothing in a fresh process."""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import matplan
from matplan.core import device, features, validation
from matplan.core.figures import KernelFigures
from matplan.kernels import statistics as S
from stats_reference import matrices, partner, reference_figures

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def _seed():
    seed = int(np.random.SeedSequence().entropy % (1 << 32))
    print(f"seed {seed}")
    return seed


def fresh(seed):
    """Fresh random CSR matrices (seeded, printed) and the edge cases the kernel's paths meet."""
    rng = np.random.default_rng(seed)
    out = dict(matrices())
    m = int(rng.integers(1, 5000))
    n = int(rng.integers(1, 5000))
    nnz = int(rng.integers(0, 200_000))
    out["fresh uniform"] = sp.csr_matrix((rng.random(nnz), (rng.integers(0, m, nnz), rng.integers(0, n, nnz))), (m, n))
    lengths = rng.choice([0, 1, 3, 40, 2_100, 70_000], size=60, p=[0.3, 0.2, 0.2, 0.15, 0.1, 0.05])
    lengths[int(rng.integers(0, 60))] = 70_000   # past the histogram: listed and ranked
    lengths[int(rng.integers(0, 60))] = 70_000   # (equal lengths: ranks broken by the list's order)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    cols = rng.integers(0, 80_000, int(indptr[-1]))   # unsorted, duplicates
    out["long rows"] = sp.csr_matrix((np.ones(indptr[-1]), cols, indptr), shape=(60, 80_000))
    # a row of 3000 entries over B rows of 40: 120k products, every second entry examined
    A = sp.random(200, 3_000, density=0.01, format="csr", random_state=seed % 1000)
    A = sp.vstack([A, sp.csr_matrix((np.ones(3000), rng.integers(0, 3000, 3000), [0, 3000]), shape=(1, 3000))]).tocsr()
    out["subsampled products"] = A
    return out


def _gpu(A):
    """A cupyx CSR of host CSR ``A`` with its own index dtypes (cupyx may narrow them, so the
    arrays are handed over as they are)."""
    import cupy as cp
    return types.SimpleNamespace(shape=A.shape, indptr=cp.asarray(A.indptr), indices=cp.asarray(A.indices),
                                 data=cp.asarray(A.data))


def _operands(name, A):
    B = partner(A)
    if name == "subsampled products":
        B = sp.csr_matrix((np.ones(40 * 3000), np.random.default_rng(1).integers(0, 500, 40 * 3000),
                           np.arange(0, 40 * 3000 + 1, 40)), shape=(3000, 500))
    return A, B


def _host_features(A, B=None):
    """The host's features of (A, B) (of A's transpose without B) with every statistic measured:
    a host plan skips those its one kernel does not read, a GPU plan measures them all."""
    problem = validation.normalize(A, B) if B is not None else validation.normalize_transpose(A)
    want = features.compute(problem, device.current(), detail=True).to_dict()
    want["backend"] = "gpu"
    return want


def _compare(got: KernelFigures, want: KernelFigures, what):
    assert got is not None, what
    diff = {f: (getattr(got, f), getattr(want, f)) for f in KernelFigures.__dataclass_fields__
            if getattr(got, f) != getattr(want, f)}
    assert not diff, (what, diff)


def test_figures_equal_the_numpy_reference(cp):
    seed = _seed()
    for name, A in fresh(seed).items():
        A, B = _operands(name, A)
        dA, dB = _gpu(A), _gpu(B)
        for op in ("check", "spmv", "sptrans", "spgemm"):
            _compare(S.figures(op, dA, dB if op == "spgemm" else None), reference_figures(op, A, B),
                     (seed, name, op))
        wide = _gpu(A)
        wide.indptr, wide.indices = wide.indptr.astype(cp.int64), wide.indices.astype(cp.int64)
        _compare(S.figures("spgemm", wide, dB), reference_figures("spgemm", A, B), (seed, name, "int64"))


def test_figures_run_to_run_identical(cp):
    """No order of atomics or blocks moves a figure."""
    A = fresh(7)["skewed, unsorted, duplicates"]
    dA = _gpu(A)
    first = S.figures("spgemm", dA, dA)
    for _ in range(5):
        assert S.figures("spgemm", dA, dA) == first


@pytest.mark.parametrize("op", ["spmv", "spmm", "spgemm", "sptrans"])
def test_planned_features_on_gpu_equal_the_hosts(cp, op):
    import cupyx.scipy.sparse as csp
    seed = _seed()
    for name, A in fresh(seed).items():
        if A.shape[0] == 0 or name in ("subsampled products", "int64 indices"):   # (cupyx narrows indices)
            continue
        A, B = _operands(name, A)
        A = A.astype(np.float64)
        dA = csp.csr_matrix(A)
        if op == "sptrans":
            want, gpu = _host_features(A), matplan.planner.plan_transpose(dA, measure="never")
        else:
            B = B if op == "spgemm" else np.ones(A.shape[1]) if op == "spmv" else np.ones((A.shape[1], 4))
            dB = csp.csr_matrix(B) if op == "spgemm" else cp.asarray(B)
            want, gpu = _host_features(A, B), matplan.plan(dA, dB, measure="never")
        assert gpu.features.to_dict() == want, (seed, name)


def test_past_the_old_host_bound(cp):
    """An operand of more than 2M entries (measured with CuPy before the kernel) gives the host's figures."""
    import cupyx.scipy.sparse as csp
    rng = np.random.default_rng(_seed())
    m, nnz = 300_000, 2_500_000
    A = sp.csr_matrix((rng.random(nnz), (rng.integers(0, m, nnz), rng.integers(0, m, nnz))), shape=(m, m))
    want = _host_features(A, A)
    assert matplan.plan(csp.csr_matrix(A), csp.csr_matrix(A), measure="never").features.to_dict() == want


def test_malformed_structures_raise_the_hosts_errors(cp):
    import cupyx.scipy.sparse as csp
    base = sp.random(300, 200, density=0.05, format="csr", random_state=3)
    spoil = {"first": lambda p, i: (p + 1, i), "falls": lambda p, i: (np.r_[p[:5], p[4] - 1, p[6:]], i),
             "last": lambda p, i: (np.r_[p[:-1], p[-1] - 1], i), "cols": lambda p, i: (p, np.r_[i[:-1], 200]),
             "negative": lambda p, i: (p, np.r_[-1, i[1:]])}
    for what, f in spoil.items():
        p, i = f(base.indptr.copy(), base.indices.copy())
        host = base.copy()   # arrays set after construction: SciPy's constructor checks them
        host.indptr, host.indices = p, i
        dev = csp.csr_matrix(base)
        dev.indptr, dev.indices = cp.asarray(p.astype(dev.indptr.dtype)), cp.asarray(i.astype(dev.indices.dtype))
        with pytest.raises(ValueError) as want:
            validation.check_csr(host, "A")
        with pytest.raises(ValueError) as got:
            validation.check_csr(dev, "A")
        assert str(got.value) == str(want.value), what
        assert S.figures("check", dev).a == reference_figures("check", host).a, what
    with pytest.raises(ValueError, match="a column index"):
        bad = csp.csr_matrix(base)
        bad.indices[3] = 500
        matplan.plan(bad, cp.ones(200), measure="never")


#: Plans of every sparse op on GPU operands, small and past the old host bound, in a fresh process;
#: prints how many of CuPy's kernels and matplan's NVRTC compilations they caused.
FIRST_PLANS = """
import json, numpy as np, scipy.sparse as sp, cupy as cp, cupyx.scipy.sparse as csp
import cupy.cuda.compiler as cc
compiles, real = [], cc._compile_with_cache_cuda
def counted(*a, **k):
    compiles.append(str(a[0])[:200])   # the kernel's source
    return real(*a, **k)
import matplan
from matplan.kernels import _cuda
rng = np.random.default_rng(3)
cases = []
for m, nnz in ((3000, 20000), (400000, 2500000)):
    A = sp.csr_matrix((rng.random(nnz), (rng.integers(0, m, nnz), rng.integers(0, m, nnz))), shape=(m, m))
    dA = csp.csr_matrix(A)   # operands made before counting (cp.ones would compile a fill kernel)
    cases.append((A.nnz, dA, (cp.asarray(np.ones(m)), cp.asarray(np.ones((m, 8))), dA)))
cc._compile_with_cache_cuda = counted
ok = []
for nnz, dA, Bs in cases:
    for B in Bs:
        ok.append(matplan.plan(dA, B, measure="never").features.nnz == nnz)
    ok.append(matplan.planner.plan_transpose(dA, measure="never").features.col_max > 0)
print(json.dumps({"ok": ok, "cupy": compiles, "nvrtc": [c[0] for c in _cuda.COMPILED]}))
"""


def test_plans_of_gpu_operands_compile_nothing(tmp_path):
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cupy"), MATPLAN_KERNEL_CACHE=str(tmp_path / "kernels"),
               MATPLAN_MEASURE_CACHE=str(tmp_path / "m.sqlite"), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", FIRST_PLANS], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(got["ok"]) and got["cupy"] == [] and got["nvrtc"] == [], got
