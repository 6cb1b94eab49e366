"""Shared fixtures: the GPU marker skips cleanly where CuPy or a GPU is missing."""
import numpy as np
import pytest

from matplan.core.xp import cupy_module


def pytest_collection_modifyitems(config, items):
    if cupy_module() is not None:
        return
    skip = pytest.mark.skip(reason="needs CuPy and an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _measure_cache_file(tmp_path_factory):
    """The planner's measurement cache in a file of this session, not the user's cache folder."""
    import os
    old = os.environ.get("MATPLAN_MEASURE_CACHE")
    os.environ["MATPLAN_MEASURE_CACHE"] = str(tmp_path_factory.mktemp("measure") / "measurements.sqlite")
    yield
    if old is None:
        os.environ.pop("MATPLAN_MEASURE_CACHE", None)
    else:
        os.environ["MATPLAN_MEASURE_CACHE"] = old


@pytest.fixture
def cp():
    """The cupy module (GPU tests only)."""
    mod = cupy_module()
    if mod is None:
        pytest.skip("needs CuPy and an NVIDIA GPU")
    return mod


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test name so failures reproduce."""
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def random_csr(rng, m, n, density, dtype=np.float64, index_dtype=np.int32):
    """Random CSR with values in [0.5, 1.5) and random signs (never zeros)."""
    import scipy.sparse as sp
    A = sp.random(m, n, density=density, format="csr", random_state=rng, dtype=np.float64)
    A.data = (rng.random(A.nnz) + 0.5) * rng.choice([-1.0, 1.0], A.nnz)
    A = A.astype(dtype)
    A.indices = A.indices.astype(index_dtype)
    A.indptr = A.indptr.astype(index_dtype)
    return A


def messy_csr(rng, m, n, dtype=np.float64):
    """CSR with empty rows, one very long row, duplicate and unsorted column indices."""
    import scipy.sparse as sp
    lengths = rng.integers(0, 6, m)
    lengths[rng.random(m) < 0.3] = 0
    if m:
        lengths[m // 2] = 3 * n  # one very long row, with duplicates
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    indices = rng.integers(0, n, indptr[-1]).astype(np.int32) if n else np.zeros(0, np.int32)
    data = ((rng.random(indptr[-1]) + 0.5) * rng.choice([-1.0, 1.0], indptr[-1])).astype(dtype)
    A = sp.csr_matrix((data, indices, indptr), shape=(m, n))
    A.has_sorted_indices = False
    return A


def lossy_plans(monkeypatch, worker_mod, loses=lambda B: True):
    """Make ``worker_mod.make_plan``'s plans (matplan.distributed's workers) drop C's largest entry
    wherever ``loses(B)``: a kernel that loses an entry, for the row-sum checks to catch."""
    real = worker_mod.make_plan

    class Lossy:
        def __init__(self, p):
            self._p = p

        def __getattr__(self, name):
            return getattr(self._p, name)

        def run(self, A, B, **kw):
            C = self._p.run(A, B, **kw).tocsr()
            if C.nnz and loses(B):
                C.data[np.argmax(np.abs(C.data))] = 0.0
            return C

    monkeypatch.setattr(worker_mod, "make_plan", lambda *a, **k: Lossy(real(*a, **k)))


def csr_edge_cases(rng):
    """(name, SciPy CSR) of the edge cases every SpMV/SpMM kernel is checked on."""
    import scipy.sparse as sp
    yield "messy", messy_csr(rng, 300, 200)            # empty rows, one long row, duplicates, unsorted
    yield "random", random_csr(rng, 1000, 700, 0.01)
    yield "all-empty", sp.csr_matrix((40, 30))
    yield "0x0", sp.csr_matrix((0, 0))
    yield "1x1", sp.csr_matrix(np.array([[-1.25]]))


def nonzero_random(rng, shape, dtype):
    """Values in [-1.5, -0.5) U [0.5, 1.5): never zero, both signs (dense TSM2 operands)."""
    v = (rng.random(shape) + 0.5) * rng.choice([-1.0, 1.0], shape)
    return v.astype(dtype)


def check_dense_product(C, A_host, B_host, rtol):
    """C (GPU) == A_host @ B_host in float64 within rtol * (|A| @ |B|) elementwise; every element
    written (outputs are NaN-poisoned by the callers)."""
    ref = A_host.astype(np.float64) @ B_host.astype(np.float64)
    bound = np.abs(A_host.astype(np.float64)) @ np.abs(B_host.astype(np.float64))
    got = C.get().astype(np.float64)
    assert got.shape == ref.shape
    bad = np.count_nonzero(~np.isfinite(got))
    assert bad == 0, f"{bad} unwritten (NaN-poisoned) or non-finite elements in C"
    err = np.abs(got - ref)
    assert (err <= rtol * bound + 1e-30).all(), f"max relative error {np.max(err / bound):.3g}"


def int64_indices(cp, M):
    """cupyx CSR M with int64 indices and indptr. cupyx's csr_matrix((data, indices, indptr))
    casts indices that fit back to int32 (CuPy 14.2), so a test built that way never sees int64;
    ``_from_parts`` keeps them (the test is skipped where this cupyx has none)."""
    import pytest
    import cupyx.scipy.sparse as csp
    from_parts = getattr(csp.csr_matrix, "_from_parts", None)
    if from_parts is None:
        pytest.skip("this cupyx has no csr_matrix._from_parts to hold int64 indices")
    M = from_parts(M.data, M.indices.astype(cp.int64), M.indptr.astype(cp.int64), M.shape)
    assert M.indices.dtype == cp.int64 and M.indptr.dtype == cp.int64
    return M
