"""Shared fixtures and helpers of the dispatch tests, imported by name (pytest puts tests/dispatch/ on
sys.path). Every test module imports ``fresh_cache``: it is autouse, so each test starts with an
empty host plan cache."""
import contextlib
import inspect

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import matplan
from matplan.dispatch import cache as cache_mod
from matplan.core.types import Cost
from matplan.kernels import Kernel, Prepared, get
from matplan.kernels import registry


@pytest.fixture(autouse=True)
def fresh_cache():
    """Each test starts with an empty host cache at the default bounds."""
    cache = matplan.get_plan_cache("cpu")
    cache.clear()
    cache.set_size(cache_mod.DEFAULT_SIZE)
    cache.set_memsize(cache_mod.DEFAULT_MEMSIZE)
    yield cache
    cache.clear()
    cache.set_size(cache_mod.DEFAULT_SIZE)
    cache.set_memsize(cache_mod.DEFAULT_MEMSIZE)


def poisson2d(n, dtype=np.float64):
    """5-point 2-D Poisson matrix on an n x n grid (SPD), built from scipy.sparse.diags."""
    T = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1])
    I = sp.identity(n)
    return (sp.kron(I, T) + sp.kron(T, I)).tocsr().astype(dtype)


def entries(cache):
    return list(cache)


def check(C, A, B):
    """C equals A @ B computed by SciPy/NumPy in float64."""
    ref = A.astype(np.float64) @ (B.astype(np.float64) if not sp.issparse(B) else B.astype(np.float64))
    C = C.toarray() if sp.issparse(C) else np.asarray(C)
    ref = ref.toarray() if sp.issparse(ref) else np.asarray(ref)
    np.testing.assert_allclose(C, ref, rtol=1e-5 if C.dtype == np.float32 else 1e-12, atol=1e-6)


@contextlib.contextmanager
def registered(kernel):
    """``kernel`` in the registry (after the built-in ones) for the duration of the block."""
    registry.all_kernels()
    registry.register(kernel)
    try:
        yield kernel
    finally:
        registry._REGISTRY.pop(kernel.name, None)


class _CopyingKernel(Kernel):
    """A host SpMV/SpMM on its own copy of A, cheaper than SciPy by its cost: a format the cache
    must confirm (it is not A's own arrays), like ELL-R or BRCP on the GPU."""
    name = "cpu.zz_copying"
    ops = ("spmv", "spmm")
    backend = "cpu"

    def cost(self, f, params, device):
        return Cost(0.0, 0.5 * get("cpu.scipy").cost(f, {}, device).run_s, "test kernel")

    def prepare(self, A, params):
        return Prepared(self.name, dict(params), {"A": A.copy()}, A.shape, A.dtype)

    def run(self, prepared, B, out=None):
        return prepared.arrays["A"] @ B


@pytest.fixture(params=["aliasing", "copying"])
def host_format(request):
    """Each test runs with SciPy's format (A's own arrays) and with a copying format."""
    if request.param == "copying":
        with registered(_CopyingKernel()) as kernel:
            yield kernel.name
    else:
        yield "cpu.scipy"


def _stats(cache):
    return cache.misses, cache.hits


def _cg_iterations(A, b, **kw):
    count = [0]

    def cb(xk):
        count[0] += 1
    x, info = spla.cg(A, b, rtol=1e-10, callback=cb, **kw)
    return x, info, count[0]


class _Counter:
    """Wraps a function and counts its calls."""
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a, **kw):
        self.calls += 1
        return self.fn(*a, **kw)


@pytest.fixture
def full_path(monkeypatch):
    """Counts the full path's validations and fingerprints (the identity fast path does neither)."""
    from matplan.dispatch import auto
    counters = {"normalize": _Counter(auto.normalize), "fingerprint": _Counter(auto.fingerprint)}
    for name, c in counters.items():
        monkeypatch.setattr(auto, name, c)
    return counters


def _gpu_csr(cp, A):
    import cupyx.scipy.sparse as csp
    return csp.csr_matrix(A)


def _cg_tol_kw(func):
    return "rtol" if "rtol" in inspect.signature(func).parameters else "tol"


class PrepCostKernel(Kernel):
    """A host SpMV whose conversion costs 4x SciPy's run and whose run costs 0.5x: wins from reuse ~9."""
    name = "cpu.zz_prepcost"
    ops = ("spmv",)
    backend = "cpu"

    def cost(self, f, params, device):
        base = get("cpu.scipy").cost(f, {}, device).run_s
        return Cost(4 * base, 0.5 * base, "test kernel")

    def prepare(self, A, params):
        return Prepared(self.name, dict(params), {"A": A.copy()}, A.shape, A.dtype)

    def run(self, prepared, B, out=None):
        return prepared.arrays["A"] @ B


@pytest.fixture
def prepcost_kernel():
    with registered(PrepCostKernel()) as kernel:
        yield kernel
