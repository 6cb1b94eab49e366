"""matplan.matmul, its plan cache, LinearOperators and the routing hook (CPU; GPU tests marked gpu)."""
import contextlib
import inspect
import threading

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import matplan
from matplan import corpus, planner
from matplan.dispatch import cache as cache_mod
from matplan.dispatch import fingerprint as fp_mod
from matplan.dispatch import routing
from matplan.core.types import Cost
from matplan.kernels import Kernel, Prepared, get
from matplan.kernels import registry
from conftest import int64_indices, messy_csr, random_csr


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


# -- hits, misses and what the key covers -------------------------------------------------
def test_hit_after_miss_and_correct(rng, fresh_cache):
    A = random_csr(rng, 300, 200, 0.05)
    for _ in range(3):
        x = rng.standard_normal(200)
        check(matplan.matmul(A, x), A, x)
    assert (fresh_cache.misses, fresh_cache.hits, len(fresh_cache)) == (1, 2, 1)
    (fp, bound), = entries(fresh_cache)
    assert fp.op == "spmv" and fp.shape == (300, 200) and fp.nnz == A.nnz and fp.device == "cpu"


def test_equal_content_other_object_hits(rng, fresh_cache):
    A = messy_csr(rng, 60, 50)
    x = rng.standard_normal(50)
    matplan.matmul(A, x)
    check(matplan.matmul(A.copy(), x), A, x)
    assert (fresh_cache.misses, fresh_cache.hits) == (1, 1)


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


def test_changed_values_in_place_never_stale(rng, fresh_cache, host_format):
    """In place: a format that is A's own arrays reads the new values (hits); a copy is compared (misses)."""
    A = random_csr(rng, 100, 100, 0.1)
    x = rng.standard_normal(100)
    matplan.matmul(A, x)
    assert entries(fresh_cache)[0][1].plan.kernel == host_format
    A.data[7] *= -3.0
    check(matplan.matmul(A, x), A, x)
    A.data[:] = rng.standard_normal(A.nnz)
    check(matplan.matmul(A, x), A, x)
    assert _stats(fresh_cache) == ((1, 2) if host_format == "cpu.scipy" else (3, 0))


def test_changed_structure_in_place_never_stale(rng, fresh_cache, host_format):
    A = random_csr(rng, 80, 80, 0.05)
    x = rng.standard_normal(80)
    matplan.matmul(A, x)
    row = int(np.argmax(np.diff(A.indptr)))
    k = A.indptr[row]
    present = set(A.indices[A.indptr[row]:A.indptr[row + 1]].tolist())
    A.indices[k] = next(c for c in range(80) if c not in present)  # same nnz, other column
    check(matplan.matmul(A, x), A.toarray(), x)
    assert _stats(fresh_cache) == ((1, 1) if host_format == "cpu.scipy" else (2, 0))
    A.indptr[row + 1] -= 1                  # the row's last nonzero moves to the next row
    check(matplan.matmul(A, x), A.toarray(), x)
    assert _stats(fresh_cache) == ((1, 2) if host_format == "cpu.scipy" else (3, 0))


def test_change_outside_the_host_sample_is_caught(rng, fresh_cache, host_format):
    """Host keys digest a sample; a change elsewhere keeps the key but fails the bitwise check."""
    from matplan.core.validation import normalize
    A = random_csr(rng, 400, 400, 0.05)
    x = rng.standard_normal(400)
    matplan.matmul(A, x)
    before = fp_mod.fingerprint(normalize(A, x), False)
    unsampled = next(i for i in range(1, A.nnz) if i not in set(fp_mod._sample_positions(A.nnz).tolist()))
    A2 = A.copy()                             # another object: the full path, keyed by the sample
    A2.data[unsampled] += 0.5
    assert fp_mod.fingerprint(normalize(A2, x), False) == before
    check(matplan.matmul(A2, x), A2, x)
    if host_format == "cpu.scipy":            # the entry now runs on A2's arrays
        assert _stats(fresh_cache) == (1, 1) and entries(fresh_cache)[0][1].prepared.arrays["A"] is A2
    else:                                     # the bitwise check fails: the old version is replaced
        assert (fresh_cache.misses, fresh_cache.hits, len(fresh_cache)) == (2, 0, 1)
    A.data[unsampled] += 0.5                  # now equal to A2: a hit either way
    check(matplan.matmul(A, x), A, x)
    assert fresh_cache.hits == (2 if host_format == "cpu.scipy" else 1)


def test_entry_not_stale_for_other_objects(rng, fresh_cache, host_format):
    """An entry made from A1 serves A2 (equal content) right after A1 is written in place."""
    A1 = random_csr(rng, 90, 70, 0.08)
    A2 = A1.copy()
    x = rng.standard_normal(70)
    matplan.matmul(A1, x)
    A1.data *= 2.0                           # A2 still holds the original content
    check(matplan.matmul(A2, x), A2, x)      # a hit on the original fingerprint
    assert fresh_cache.hits == 1
    check(matplan.matmul(A1, x), A1, x)


def test_key_covers_k_op_deterministic_and_versions(rng, fresh_cache, monkeypatch):
    A = random_csr(rng, 50, 40, 0.1)
    matplan.matmul(A, rng.standard_normal(40))
    matplan.matmul(A, rng.standard_normal((40, 3)))
    matplan.matmul(A, rng.standard_normal((40, 4)))
    matplan.matmul(A, rng.standard_normal(40), deterministic=True)
    assert (fresh_cache.misses, fresh_cache.hits) == (4, 0)
    monkeypatch.setattr(fp_mod, "versions", lambda: ("99.0", "x", "y", ""))
    matplan.matmul(A, rng.standard_normal(40))
    assert fresh_cache.misses == 5


def test_spgemm_key_includes_B_structure(rng, fresh_cache):
    A = random_csr(rng, 40, 30, 0.1)
    B1 = random_csr(rng, 30, 20, 0.1)
    check(matplan.matmul(A, B1), A, B1)
    B1v = B1.copy()
    B1v.data = rng.standard_normal(B1.nnz)          # same structure, other values: same plan
    check(matplan.matmul(A, B1v), A, B1v)
    B2 = random_csr(rng, 30, 20, 0.2)
    check(matplan.matmul(A, B2), A, B2)
    assert (fresh_cache.misses, fresh_cache.hits) == (2, 1)


def test_dense_tall_skinny(rng, fresh_cache):
    A = np.asfortranarray(rng.standard_normal((256, 256)))
    B = rng.standard_normal((256, 4))
    check(matplan.matmul(A, B), A, B)
    check(matplan.matmul(A, B + 1.0), A, B + 1.0)
    A[3, 4] += 1.0                             # NumPy's format is A itself: read anew, a hit
    check(matplan.matmul(A, B), A, B)
    assert (fresh_cache.misses, fresh_cache.hits) == (1, 2)
    assert entries(fresh_cache)[0][0].layout == "F" and entries(fresh_cache)[0][1].prepared.arrays["A"] is A
    check(matplan.matmul(A.copy(order="C"), B), A, B)   # another layout: another key
    assert (fresh_cache.misses, fresh_cache.hits) == (2, 2)


def test_mixed_dtypes_upcast(rng, fresh_cache):
    A = random_csr(rng, 50, 50, 0.1, dtype=np.float32)
    x = rng.standard_normal(50)
    y = matplan.matmul(A, x)
    assert y.dtype == np.float64
    check(y, A, x)


def test_argument_errors(rng):
    A = random_csr(rng, 10, 10, 0.3)
    x = rng.standard_normal(10)
    with pytest.raises(ValueError, match="reuse"):
        matplan.matmul(A, x, reuse=0)
    with pytest.raises(TypeError, match="deterministic"):
        matplan.matmul(A, x, deterministic="yes")
    with pytest.raises(ValueError, match="do not conform"):
        matplan.matmul(A, rng.standard_normal(11))
    with pytest.raises(ValueError, match="device"):
        matplan.get_plan_cache("gpu0")
    with pytest.raises(ValueError, match="size"):
        matplan.get_plan_cache().set_size(-1)
    with pytest.raises(ValueError, match="memsize"):
        matplan.get_plan_cache().set_memsize(-2)


# -- bounds ---------------------------------------------------------------------------------
def test_lru_eviction_by_count(rng, fresh_cache):
    fresh_cache.set_size(2)
    A, B, C = (random_csr(rng, 60, 60, d) for d in (0.05, 0.1, 0.15))
    x = rng.standard_normal(60)
    matplan.matmul(A, x)
    matplan.matmul(B, x)
    matplan.matmul(A, x)                       # A most recent: B is the least recently used
    matplan.matmul(C, x)                       # evicts B
    assert [fp.nnz for fp, _ in entries(fresh_cache)] == [C.nnz, A.nnz]
    assert fresh_cache.evictions == 1
    check(matplan.matmul(B, x), B, x)          # a miss again
    assert (fresh_cache.misses, fresh_cache.hits) == (4, 1)
    fresh_cache.set_size(1)
    assert len(fresh_cache) == 1 and entries(fresh_cache)[0][0].nnz == B.nnz


def test_lru_eviction_by_bytes(rng, fresh_cache):
    A, B = random_csr(rng, 100, 100, 0.1), random_csr(rng, 100, 100, 0.1)
    x = rng.standard_normal(100)
    matplan.matmul(A, x)
    one = fresh_cache.get_curr_memsize()
    assert one == A.data.nbytes + A.indices.nbytes + A.indptr.nbytes   # cpu.scipy holds the CSR copy
    fresh_cache.set_memsize(int(1.5 * one))
    matplan.matmul(B, x)
    assert len(fresh_cache) == 1 and fresh_cache.get_curr_memsize() <= fresh_cache.get_memsize()
    assert entries(fresh_cache)[0][0].nnz == B.nnz and fresh_cache.evictions == 1
    fresh_cache.set_memsize(one // 2)            # shrinking evicts at once
    assert len(fresh_cache) == 0 and fresh_cache.get_curr_memsize() == 0
    check(matplan.matmul(A, x), A, x)            # too large: runs, is not cached
    assert len(fresh_cache) == 0 and fresh_cache.too_large == 1


def test_size_zero_disables(rng, fresh_cache):
    fresh_cache.set_size(0)
    A = random_csr(rng, 30, 30, 0.2)
    x = rng.standard_normal(30)
    check(matplan.matmul(A, x), A, x)
    check(matplan.matmul(A, x), A, x)
    assert (fresh_cache.misses, fresh_cache.hits, len(fresh_cache)) == (2, 0, 0)


def test_show_info_and_clear(rng, fresh_cache, capsys):
    A = random_csr(rng, 30, 30, 0.2)
    matplan.matmul(A, rng.standard_normal(30))
    matplan.matmul(A, rng.standard_normal(30))
    fresh_cache.show_info()
    out = capsys.readouterr().out
    assert "matplan plan cache (device cpu" in out and "hits / misses: 1 / 1" in out
    assert "current / max size   : 1 / 16" in out and "spmv 30x30" in out and "2 calls" in out
    matplan.show_plan_cache_info()
    assert "device cpu" in capsys.readouterr().out
    fresh_cache.clear()
    assert (len(fresh_cache), fresh_cache.hits, fresh_cache.misses, fresh_cache.get_curr_memsize()) == (0, 0, 0, 0)


# -- reuse estimation and re-planning ---------------------------------------------------
def test_reuse_estimated_from_history(rng, fresh_cache):
    A = random_csr(rng, 70, 70, 0.1)
    x = rng.standard_normal(70)
    for _ in range(10):
        matplan.matmul(A, x)
    assert entries(fresh_cache)[0][1].plan.reuse == 1       # first version: nothing known
    A = A * 1.5                                             # version 2 of the same structure
    for _ in range(6):
        matplan.matmul(A, x)
    assert entries(fresh_cache)[0][1].plan.reuse == 10      # 10 calls / 1 earlier version
    A = A * 1.5
    matplan.matmul(A, x)
    assert entries(fresh_cache)[0][1].plan.reuse == 8       # 16 calls / 2 earlier versions
    matplan.matmul(A, x, reuse=5)                           # an explicit reuse re-plans
    assert entries(fresh_cache)[0][1].plan.reuse == 5 and fresh_cache.replans == 1


class _PrepCostKernel(Kernel):
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
    with registered(_PrepCostKernel()) as kernel:
        yield kernel


def test_adaptive_replan_switches_kernel(rng, fresh_cache, prepcost_kernel):
    A = random_csr(rng, 120, 120, 0.05)
    kernels = []
    for _ in range(70):
        x = rng.standard_normal(120)
        check(matplan.matmul(A, x), A, x)
        kernels.append(entries(fresh_cache)[0][1].plan.kernel)
    # planned with reuse 1 (SciPy), re-planned at 8 calls (a tie: SciPy kept), at 64 (the test kernel wins)
    assert kernels[0] == "cpu.scipy" and kernels[62] == "cpu.scipy" and kernels[63] == "cpu.zz_prepcost"
    assert fresh_cache.replans == 2 and entries(fresh_cache)[0][1].plan.reuse == 64
    assert (fresh_cache.misses, fresh_cache.hits) == (1, 69)


def test_per_call_cost_is_charged_and_explained(rng, prepcost_kernel):
    """planner.plan(per_call=...) adds each application's extra cost to the run: a check on
    copied formats can take the win from a kernel whose format is a copy of A."""
    A = random_csr(rng, 120, 120, 0.05)
    x = rng.standard_normal(120)
    assert planner.plan(A, x, reuse=1000).kernel == "cpu.zz_prepcost"
    base = get("cpu.scipy").cost(planner.plan(A, x).features, {}, None).run_s

    def check_copies(kernel, f, device):
        return (0.0, "") if kernel.reads_a_at_run else (base, "test check")

    plan = planner.plan(A, x, reuse=1000, per_call=check_copies)
    assert plan.kernel == "cpu.scipy"
    charged = next(c for c in plan.candidates if c.kernel == "cpu.zz_prepcost")
    assert charged.run_s == pytest.approx(1.5 * base) and "per call: test check" in charged.why
    scipy = next(c for c in plan.candidates if c.kernel == "cpu.scipy")
    assert "per call" not in scipy.why


def test_hit_check_charges_only_copied_gpu_formats():
    from matplan.dispatch.identity import HIT_CHECK_FIXED_S, hit_check
    from matplan.core.device import known
    from matplan.core.features import Features
    dev = known("H100")
    f = Features(op="spmv", backend="gpu", dtype="float64", index_dtype="int32", m=1000, n=1000, k=1,
                 nnz=8000)
    s, why = hit_check(get("spmv.ellr"), f, dev)
    nbytes = 2 * (8000 * 12 + 1001 * 4)
    assert s == pytest.approx(HIT_CHECK_FIXED_S + nbytes / dev.mem_bandwidth) and "assume_unchanged" in why
    assert hit_check(get("spmv.csr_vector"), f, dev) == (0.0, "")          # reads A's own arrays
    host = Features(op="spmv", backend="cpu", dtype="float64", index_dtype="int32", m=1000, n=1000, k=1,
                    nnz=8000)
    assert hit_check(get("spmv.ellr"), host, dev) == (0.0, "")


def test_no_replan_when_no_costlier_conversion(rng, fresh_cache):
    A = random_csr(rng, 50, 50, 0.1)
    for _ in range(20):
        matplan.matmul(A, rng.standard_normal(50))
    assert fresh_cache.replans == 0   # SciPy is the only host SpMV: a larger reuse cannot change the plan


# -- threads ---------------------------------------------------------------------------
def test_threads_correct_and_caches_consistent(rng):
    mats = [random_csr(rng, 400, 300, d) for d in (0.01, 0.03, 0.05)] + [messy_csr(rng, 300, 300)]
    Bs = random_csr(rng, 300, 50, 0.05)
    nthreads, calls = 8, 40
    barrier = threading.Barrier(nthreads)
    errors, stats = [], {}

    def work(tid):
        try:
            local = np.random.default_rng(tid)
            keys = set()
            barrier.wait()
            for i in range(calls):
                A = mats[(i + tid) % len(mats)]
                if i % 7 == 3:                    # SpGEMM with a B every thread shares
                    x, kind = Bs, "spgemm"
                else:
                    x = local.standard_normal((A.shape[1], 2)) if i % 5 == 0 else local.standard_normal(A.shape[1])
                    kind = x.ndim
                keys.add((id(A), kind))
                C = matplan.matmul(A, x)
                ref = A.toarray() @ (x.toarray() if sp.issparse(x) else x)
                if sp.issparse(C):
                    C = C.toarray()
                if not np.allclose(C, ref, rtol=1e-12, atol=1e-12):
                    errors.append(f"thread {tid} call {i}: wrong result")
            cache = matplan.get_plan_cache("cpu")
            stats[tid] = (cache.hits, cache.misses, len(cache), cache.get_curr_memsize(),
                          sum(cache_mod.held_nbytes(e.bound.prepared, e.reference, *(e.pins or ()))
                              for e in cache._entries.values()), len(keys))
        except Exception as exc:  # reported below with the thread id
            errors.append(f"thread {tid}: {exc!r}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(stats) == nthreads
    for tid, (hits, misses, size, mem, held, distinct) in stats.items():
        # one miss per distinct (matrix, vector / 2 columns / SpGEMM) this thread used, hits for the rest
        assert (hits, misses, size) == (calls - distinct, distinct, distinct), (tid, hits, misses, size)
        assert mem == held
    assert matplan.get_plan_cache("cpu").misses == 0   # the main thread's cache is its own


# -- LinearOperator ------------------------------------------------------------------------
def _cg_iterations(A, b, **kw):
    count = [0]

    def cb(xk):
        count[0] += 1
    x, info = spla.cg(A, b, rtol=1e-10, callback=cb, **kw)
    return x, info, count[0]


def test_linear_operator_cg_poisson(rng):
    A = poisson2d(24)
    b = rng.standard_normal(A.shape[0])
    plan = planner.plan(A, b, reuse=200)
    op = plan.as_linear_operator(A)
    assert isinstance(op, spla.LinearOperator) and op.shape == A.shape and op.dtype == np.float64
    x, info, its = _cg_iterations(op, b)
    x_ref, info_ref, its_ref = _cg_iterations(A, b)
    assert info == 0 and info_ref == 0 and abs(its - its_ref) <= 1
    np.testing.assert_allclose(x, spla.spsolve(A.tocsc(), b), rtol=1e-7, atol=1e-9)
    assert np.linalg.norm(A @ x - b) <= 1e-9 * np.linalg.norm(b)


def test_linear_operator_matmat_blocks_and_padding(rng):
    A = random_csr(rng, 60, 45, 0.1)
    X = rng.standard_normal((45, 5))
    x = rng.standard_normal(45)
    vec_op = planner.plan(A, x).as_linear_operator(A)
    np.testing.assert_allclose(vec_op.matmat(X), A @ X, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(vec_op.matvec(x.reshape(-1, 1)).ravel(), A @ x, rtol=1e-12, atol=1e-12)
    spmm_op = planner.plan(A, X[:, :3]).bind(A).as_linear_operator()   # width 3: blocks 3 + 2 (padded)
    np.testing.assert_allclose(spmm_op.matmat(X), A @ X, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(spmm_op.matmat(X[:, :3]), A @ X[:, :3], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(spmm_op.matvec(x), A @ x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(spmm_op @ x, A @ x, rtol=1e-12, atol=1e-12)


def test_linear_operator_rmatvec(rng):
    A = random_csr(rng, 50, 35, 0.1)
    y = rng.standard_normal(50)
    Y = rng.standard_normal((50, 3))
    op = planner.plan(A, rng.standard_normal(35)).as_linear_operator(A)
    np.testing.assert_allclose(op.rmatvec(y), A.T @ y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.rmatmat(Y), A.T @ Y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.H @ y, A.T @ y, rtol=1e-12, atol=1e-12)
    bound_op = planner.plan(A, rng.standard_normal(35)).bind(A).as_linear_operator()
    with pytest.raises(NotImplementedError):
        bound_op.rmatvec(y)


def test_linear_operator_dtype_and_errors(rng):
    A = random_csr(rng, 40, 40, 0.1, dtype=np.float32)
    x = rng.standard_normal(40)                                    # float64 input is cast
    op = planner.plan(A, x.astype(np.float32)).as_linear_operator(A)
    y = op.matvec(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, A.astype(np.float64) @ x, rtol=1e-5, atol=1e-5)
    B = random_csr(rng, 40, 10, 0.2)
    with pytest.raises(TypeError, match="spgemm"):
        planner.plan(A, B.astype(np.float32)).as_linear_operator(A)


# -- the identity fast path --------------------------------------------------------------------
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


def test_identity_hit_skips_validation_and_fingerprint(rng, fresh_cache, full_path, host_format):
    A = random_csr(rng, 120, 90, 0.05)
    for _ in range(5):
        x = rng.standard_normal(90)
        check(matplan.matmul(A, x), A, x)
    assert _stats(fresh_cache) == (1, 4)
    assert full_path["normalize"].calls == 1 and full_path["fingerprint"].calls == 1
    (_, bound), = entries(fresh_cache)
    entry = fresh_cache.find(next(iter(fresh_cache._by_key)))
    if host_format == "cpu.scipy":            # the format is A itself: no copy, A pinned by the key
        assert bound.prepared.arrays["A"] is A and entry.reference is None and entry.pins[0] is A
    else:                                     # a private copy, compared on each hit
        assert entry.reference is not None and entry.reference is not A and entry.pins is None
        assert fresh_cache.get_curr_memsize() == 2 * cache_mod.nbytes_of(A)


@pytest.mark.parametrize("change", ["data", "indices", "indptr", "reassigned", "same values"])
def test_identity_path_after_in_place_change(rng, fresh_cache, full_path, host_format, change):
    """Mutate A after a hit: the next call returns the new product (never the old format's)."""
    A = random_csr(rng, 150, 150, 0.05)
    x = rng.standard_normal(150)
    matplan.matmul(A, x)
    matplan.matmul(A, x)
    row = int(np.argmax(np.diff(A.indptr)))
    if change == "data":
        A.data[A.nnz // 2] = 7.0
    elif change == "indices":
        present = set(A.indices[A.indptr[row]:A.indptr[row + 1]].tolist())
        A.indices[A.indptr[row]] = next(c for c in range(150) if c not in present)
    elif change == "indptr":
        A.indptr[row + 1] -= 1
    elif change == "reassigned":
        A.data = A.data * -2.0                # a new array object: another key, the full path
    else:
        A.data[:] = A.data.copy()             # same bits: still a hit
    for _ in range(2):
        check(matplan.matmul(A, x), A.toarray(), x)
    changed = change != "same values"
    aliasing = host_format == "cpu.scipy"
    missed = changed and (not aliasing or change == "reassigned")   # new values in new arrays: a new key
    assert _stats(fresh_cache) == ((2, 2) if missed else (1, 3))
    assert full_path["fingerprint"].calls == (2 if missed else 1)


def test_identity_shared_arrays_other_object(rng, fresh_cache, host_format):
    """Two matrix objects over the same arrays; one then gets new arrays: each call stays right."""
    A1 = random_csr(rng, 60, 60, 0.1)
    A2 = sp.csr_matrix((A1.data, A1.indices, A1.indptr), shape=A1.shape, copy=False)
    x = rng.standard_normal(60)
    check(matplan.matmul(A1, x), A1, x)
    check(matplan.matmul(A2, x), A2, x)       # the full path: a hit, the entry now on A2
    A1.data = rng.standard_normal(A1.nnz)     # A1 gets other values; A2 keeps the old ones
    check(matplan.matmul(A2, x), A2, x)
    check(matplan.matmul(A1, x), A1, x)
    check(matplan.matmul(A2, x), A2, x)


def test_identity_key_only_for_unconverted_operands(rng):
    from matplan.dispatch import identity
    A = random_csr(rng, 20, 20, 0.2)
    x = rng.standard_normal(20)
    assert identity.identity_key(A, x, False) is not None
    assert identity.identity_key(A, x, False) != identity.identity_key(A, x, True)
    assert identity.identity_key(A.tocsc(), x, False) is None                     # converted by normalize
    assert identity.identity_key(A, x.astype(np.float32), False) is None         # upcast by normalize
    assert identity.identity_key(A, list(x), False) is None
    B = sp.csr_matrix(x.reshape(-1, 1))
    assert identity.identity_key(A, B, False) is not None                         # SpGEMM: B keyed too
    assert identity.identity_key(A, B, False) != identity.identity_key(A, B.copy(), False)
    assert identity.identity_key(A, B.tocsc(), False) is None                     # converted by normalize
    assert identity.identity_key(A.toarray(), B, False) is None                   # dense A, sparse B: an error
    D = rng.standard_normal((20, 20))
    assert identity.identity_key(D, x, False)[1] != identity.identity_key(D.T, x, False)[1]


def test_identity_path_in_routed_products(rng, fresh_cache, full_path):
    A = poisson2d(10)
    b = rng.standard_normal(A.shape[0])
    with matplan.dispatch.route_sparse_matmul():
        x, info, its = _cg_iterations(A, b)
    assert info == 0 and full_path["fingerprint"].calls == 1 and fresh_cache.hits >= its - 1


# -- SpGEMM on the identity path ---------------------------------------------------------------
def _mutate_csr(M, how, rng):
    """Change one of M's arrays in place (values, a column index, a row boundary)."""
    row = int(np.argmax(np.diff(M.indptr)[:-1]))
    if how == "data":
        M.data[M.nnz // 2] = 7.0
    elif how == "indices":
        present = set(M.indices[M.indptr[row]:M.indptr[row + 1]].tolist())
        M.indices[M.indptr[row]] = next(c for c in range(M.shape[1]) if c not in present)
    elif how == "indptr":
        M.indptr[row + 1] -= 1
    else:
        M.data[:] = rng.standard_normal(M.nnz)


@pytest.mark.parametrize("change", ["A data", "A indices", "A indptr", "B data", "B indices", "B indptr",
                                    "B all values", "none"])
def test_spgemm_identity_path_after_in_place_change(rng, fresh_cache, full_path, change):
    """SpGEMM hits take the identity path (both operands read at run time); in-place changes of A
    or B are computed, never served from an older product or format."""
    A = random_csr(rng, 80, 60, 0.08)
    B = random_csr(rng, 60, 70, 0.08)
    for _ in range(3):
        check(matplan.matmul(A, B), A, B)
    entry, = fresh_cache._entries.values()
    assert entry.bound.plan.kernel == "cpu.scipy" and entry.reference is None
    assert entry.pins[0] is A and entry.pins[4] is B            # both keyed objects kept alive
    assert fresh_cache.get_curr_memsize() == cache_mod.nbytes_of(A) + cache_mod.nbytes_of(B)
    if change != "none":
        which, how = change.split(" ", 1)
        _mutate_csr(A if which == "A" else B, how if how != "all values" else "all", rng)
    for _ in range(2):
        check(matplan.matmul(A, B), A.toarray(), B.toarray())
    assert _stats(fresh_cache) == (1, 4) and full_path["fingerprint"].calls == 1
    B2 = B.copy()                                             # another B object: its own key, the full path
    check(matplan.matmul(A, B2), A.toarray(), B2.toarray())
    assert full_path["fingerprint"].calls == 2


class _LimitedSpGEMM(Kernel):
    """A host SpGEMM with a products limit (like cuSPARSE's), cheaper than SciPy by its cost; it
    fails loudly if run past its limit (cuSPARSE returns an empty matrix there, see VENDOR_LIMITS)."""
    name = "cpu.zz_limited"
    ops = ("spgemm",)
    backend = "cpu"
    reads_a_at_run = True
    limit = 0

    def supports(self, f):
        return None if f.products <= self.limit else "past the products limit"

    def cost(self, f, params, device):
        return Cost(0.0, 0.5 * get("cpu.scipy").cost(f, {}, device).run_s, "test kernel")

    def prepare(self, A, params):
        return Prepared(self.name, dict(params), {"A": A}, A.shape, A.dtype)

    def run(self, prepared, B, out=None):
        A = prepared.arrays["A"]
        products = int(np.diff(B.indptr)[A.indices].sum())
        if products > self.limit:
            raise AssertionError(f"run past the products limit: {products} > {self.limit}")
        return (A @ B).tocsr()


@pytest.fixture
def limited_spgemm(monkeypatch):
    from matplan.dispatch import identity
    from matplan.kernels.spgemm import vendor
    with registered(_LimitedSpGEMM()) as kernel:
        monkeypatch.setitem(vendor.VENDOR_LIMITS, kernel.name, {"max_products": 0, "evidence": "test"})
        identity.product_limit.cache_clear()
        yield kernel
    identity.product_limit.cache_clear()


def test_within_product_limit_host(rng):
    from matplan.dispatch import identity
    A, B = random_csr(rng, 50, 40, 0.1), random_csr(rng, 40, 30, 0.2)
    products = int(np.diff(B.indptr)[A.indices].sum())
    assert A.nnz * B.nnz > products > 0
    assert identity.within_product_limit(products, A, B, "cpu")
    assert not identity.within_product_limit(products - 1, A, B, "cpu")
    assert identity.within_product_limit(A.nnz * B.nnz, A, B, "cpu")            # the free bound
    A.indices[0] = B.shape[0]                                                  # outside B's rows
    assert not identity.within_product_limit(products + 100, A, B, "cpu")


@pytest.mark.parametrize("trust", [False, True])
def test_spgemm_products_limit_checked_on_hits(rng, fresh_cache, full_path, limited_spgemm, trust):
    """An in-place change that moves A @ B past the chosen kernel's products limit re-plans
    (unless the caller promised no in-place change, which this test then does not make)."""
    from matplan.kernels.spgemm import vendor
    A, B = random_csr(rng, 60, 50, 0.1), random_csr(rng, 50, 40, 0.1)
    products = int(np.diff(B.indptr)[A.indices].sum())
    limited_spgemm.limit = products
    vendor.VENDOR_LIMITS[limited_spgemm.name]["max_products"] = products
    for _ in range(3):
        check(matplan.matmul(A, B), A, B)
    assert [e.bound.plan.kernel for e in fresh_cache._entries.values()] == ["cpu.zz_limited"]
    assert _stats(fresh_cache) == (1, 2) and full_path["fingerprint"].calls == 1
    longest = int(np.argmax(np.diff(B.indptr)))
    A.indices[:] = longest                                    # every product now hits B's longest row
    check(matplan.matmul(A, B), A.toarray(), B.toarray())
    assert _stats(fresh_cache) == (2, 2) and full_path["fingerprint"].calls == 2
    assert list(fresh_cache)[0][1].plan.kernel == "cpu.scipy"   # the new structure is past the limit


# -- assume_unchanged: trusting identity for copied formats --------------------------------------
@pytest.fixture
def compared(monkeypatch):
    """The copying host kernel registered, and a count of matmul's comparisons of A with copies."""
    from matplan.dispatch import auto
    counter = _Counter(auto.same_content)
    monkeypatch.setattr(auto, "same_content", counter)
    with registered(_CopyingKernel()):
        yield counter


def test_assume_unchanged_skips_comparison_after_first_hit(rng, fresh_cache, compared):
    A = random_csr(rng, 100, 90, 0.05)
    x = rng.standard_normal(90)
    check(matplan.matmul(A, x, assume_unchanged=True), A, x)      # miss: prepared from a copy
    entry, = fresh_cache._entries.values()
    assert entry.reference is not None and entry.pins is not None and entry.pins[0] is A
    # the cache is charged for the format, the copy and the pinned A
    assert fresh_cache.get_curr_memsize() == 3 * cache_mod.nbytes_of(A)
    for _ in range(3):
        check(matplan.matmul(A, x, assume_unchanged=True), A, x)
    assert compared.calls == 0 and _stats(fresh_cache) == (1, 3)
    old = A @ x
    A.data[3] += 1.0                                               # the promise broken: stale
    np.testing.assert_array_equal(matplan.matmul(A, x, assume_unchanged=True), old)
    check(matplan.matmul(A, x), A, x)                              # the default checks: a miss
    assert compared.calls == 1 and fresh_cache.misses == 2
    A.data = A.data * 2.0                                          # new arrays: a new key even trusted
    check(matplan.matmul(A, x, assume_unchanged=True), A, x)
    assert fresh_cache.misses == 3


def test_assume_unchanged_first_trusted_hit_compares_then_pins(rng, fresh_cache, compared):
    """An entry made without the promise pins nothing (a reused id would only cost a comparison);
    the first trusted hit compares once, then pins A's objects so its ids stay A's."""
    try:
        A = random_csr(rng, 100, 90, 0.05)
        x = rng.standard_normal(90)
        matplan.matmul(A, x)
        entry, = fresh_cache._entries.values()
        assert entry.pins is None and fresh_cache.get_curr_memsize() == 2 * cache_mod.nbytes_of(A)
        fresh_cache.set_assume_unchanged(True)                         # the cache setting, no argument
        check(matplan.matmul(A, x), A, x)
        assert compared.calls == 1 and entry.pins[0] is A
        check(matplan.matmul(A, x), A, x)
        assert compared.calls == 1 and _stats(fresh_cache) == (1, 2)
        check(matplan.matmul(A, x, assume_unchanged=False), A, x)      # the argument wins
        assert compared.calls == 2
        assert "assume unchanged (copied formats trusted without comparison)? True" in fresh_cache.info()
    finally:
        fresh_cache.set_assume_unchanged(False)


def test_assume_unchanged_argument_errors(rng, fresh_cache):
    A, x = random_csr(rng, 10, 10, 0.3), rng.standard_normal(10)
    with pytest.raises(TypeError, match="assume_unchanged"):
        matplan.matmul(A, x, assume_unchanged=1)
    with pytest.raises(TypeError, match="flag"):
        fresh_cache.set_assume_unchanged("yes")
    with pytest.raises(TypeError, match="assume_unchanged"):
        with matplan.dispatch.route_sparse_matmul(assume_unchanged="no"):
            pass
    with matplan.dispatch.route_sparse_matmul(assume_unchanged=True):
        ys = [A @ x, A @ x]
    for y in ys:
        check(y, A, x)
    assert _stats(fresh_cache) == (1, 1)


def test_aliasing_kernels_prepare_without_copying(rng):
    """The kernels declaring reads_a_at_run (host ones here; GPU ones in the GPU tests) hold A's arrays."""
    from matplan.dispatch import identity
    A = random_csr(rng, 40, 30, 0.2)
    D = np.asfortranarray(rng.standard_normal((64, 4)))
    assert identity.aliases(get("cpu.scipy").prepare(A, {}), A)
    assert identity.aliases(get("cpu.numpy").prepare(D, {}), D)
    assert not identity.aliases(get("cpu.scipy").prepare(A.copy(), {}), A)
    assert not identity.aliases(Prepared("cpu.zz_other", {}, {"A": A}, A.shape, A.dtype), A)   # not listed


# -- routing ------------------------------------------------------------------------------
def _own(cls, name):
    return cls.__dict__.get(name, "<inherited>")


def test_routing_routes_and_restores(rng, fresh_cache):
    A = random_csr(rng, 80, 60, 0.1)
    x = rng.standard_normal(60)
    before = {(c, m): (_own(c, m), getattr(c, m)) for c in routing.targets() for m in routing.METHODS}
    with matplan.dispatch.route_sparse_matmul():
        assert routing.is_routing()
        assert getattr(sp.csr_matrix.__matmul__, "__matplan_router__", False)
        ys = [A @ x, A.dot(x), sp.csr_array(A) @ x]   # the last: same content, a hit
        assert (fresh_cache.misses, fresh_cache.hits) == (1, 2)
    for y in ys:
        check(y, A, x)
    with matplan.dispatch.route_sparse_matmul():
        with matplan.dispatch.skip_routing():
            check(A @ x, A, x)                         # check's own SciPy products are not routed
        assert (fresh_cache.misses, fresh_cache.hits) == (1, 2)
    after = {(c, m): (_own(c, m), getattr(c, m)) for c in routing.targets() for m in routing.METHODS}
    assert after == before and not routing.is_routing()
    check(A @ x, A, x)
    assert fresh_cache.hits + fresh_cache.misses == 3  # not routed any more


def test_routing_restores_on_exception(rng):
    before = {(c, m): _own(c, m) for c in routing.targets() for m in routing.METHODS}
    with pytest.raises(RuntimeError, match="boom"):
        with matplan.dispatch.route_sparse_matmul():
            random_csr(rng, 10, 10, 0.3) @ rng.standard_normal(10)
            raise RuntimeError("boom")
    assert {(c, m): _own(c, m) for c in routing.targets() for m in routing.METHODS} == before
    assert not routing.is_routing()


def test_routing_nesting_skip_and_options(rng, fresh_cache):
    A = random_csr(rng, 40, 40, 0.1)
    x = rng.standard_normal(40)
    with matplan.dispatch.route_sparse_matmul():
        with matplan.dispatch.route_sparse_matmul(deterministic=True):
            A @ x
            assert entries(fresh_cache)[0][0].deterministic is True     # the innermost options apply
            with matplan.dispatch.skip_routing():
                A @ x                                                   # not routed
                assert not routing.is_routing()
        assert getattr(sp.csr_matrix.__matmul__, "__matplan_router__", False)  # outer block still open
        A @ x
        assert entries(fresh_cache)[0][0].deterministic is False
    assert (fresh_cache.misses, fresh_cache.hits) == (2, 0)
    assert "__matmul__" not in sp.csr_matrix.__dict__ or not getattr(
        sp.csr_matrix.__dict__["__matmul__"], "__matplan_router__", False)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_routing_falls_through_or_raises_with_only(rng, fresh_cache):
    Ai = sp.csr_matrix(np.arange(12).reshape(3, 4))
    xi = np.arange(4)
    A = random_csr(rng, 3, 4, 0.9)
    with matplan.dispatch.route_sparse_matmul():
        np.testing.assert_array_equal(Ai @ xi, Ai.toarray() @ xi)      # integers: SciPy's product
        np.testing.assert_allclose((A.dot(2.0)).toarray(), 2.0 * A.toarray())  # a scalar: scaling
        M = np.asmatrix(rng.standard_normal((4, 2)))
        assert isinstance(A @ M, np.matrix)                             # ndarray subclass: SciPy's
    assert fresh_cache.hits + fresh_cache.misses == 0
    with matplan.dispatch.route_sparse_matmul(only=True):
        with pytest.raises(TypeError, match="dtype"):
            Ai @ xi
        with pytest.raises(TypeError, match="matrix"):
            A @ np.asmatrix(rng.standard_normal((4, 2)))
    with pytest.raises(TypeError, match="only"):
        with matplan.dispatch.route_sparse_matmul(only="yes"):
            pass


def test_routing_is_per_thread(rng, fresh_cache):
    A = random_csr(rng, 50, 50, 0.1)
    x = rng.standard_normal(50)
    seen = {}

    def other():
        check(A @ x, A, x)
        cache = matplan.get_plan_cache("cpu")
        seen["other"] = (routing.is_routing(), cache.hits + cache.misses)

    with matplan.dispatch.route_sparse_matmul():
        t = threading.Thread(target=other)
        t.start()
        t.join()
        A @ x
    assert seen["other"] == (False, 0) and fresh_cache.misses == 1


def test_routing_reaches_scipy_solver(rng, fresh_cache):
    A = poisson2d(16)
    b = rng.standard_normal(A.shape[0])
    with matplan.dispatch.route_sparse_matmul():
        x, info, its = _cg_iterations(A, b)
    assert info == 0 and np.linalg.norm(A @ x - b) <= 1e-9 * np.linalg.norm(b)
    assert fresh_cache.misses == 1 and fresh_cache.hits >= its - 1   # every A @ p inside cg went through matplan


# -- fingerprints ---------------------------------------------------------------------------
def test_host_fingerprint_parts(rng):
    from matplan.core.validation import normalize
    A = random_csr(rng, 30, 30, 0.2)
    x = rng.standard_normal(30)
    f1 = fp_mod.fingerprint(normalize(A, x), False)
    assert f1 == fp_mod.fingerprint(normalize(A.copy(), x), False) and len(f1.values) == 16
    B = A.copy()
    B.data[0] += 1.0
    f2 = fp_mod.fingerprint(normalize(B, x), False)
    assert f1.structure == f2.structure and f1.values != f2.values
    assert f1.structure_key() == f2.structure_key()
    C = A.copy()
    C.indices[0] = (C.indices[0] + 1) % 30
    f3 = fp_mod.fingerprint(normalize(C, x), False)
    assert f3.structure != f1.structure and f3.values == f1.values


def test_host_digest_chunked_matches_itself(monkeypatch):
    data = np.random.default_rng(0).standard_normal(1 << 17)
    one = fp_mod._blake((data,), b"t")
    monkeypatch.setattr(fp_mod, "PARALLEL_MIN_BYTES", 1 << 12)
    monkeypatch.setattr(fp_mod, "CHUNK_BYTES", 1 << 12)
    chunked = fp_mod._blake((data,), b"t")
    data2 = data.copy()
    data2[-1] += 1e-9
    assert chunked == fp_mod._blake((data.copy(),), b"t") and chunked != fp_mod._blake((data2,), b"t")
    assert len(one) == 16


def test_reference_lanes_sensitive_to_position():
    vals = np.arange(1, 101, dtype=np.float64)
    swapped = vals.copy()
    swapped[[3, 40]] = swapped[[40, 3]]
    idx = np.arange(100, dtype=np.int32)
    ptr = np.array([0, 50, 100], dtype=np.int32)
    a = fp_mod.reference_gpu_lanes(vals, idx, ptr)
    b = fp_mod.reference_gpu_lanes(swapped, idx, ptr)
    c = fp_mod.reference_gpu_lanes(vals, None, None)
    assert a[0] != b[0] and a[1] != b[1] and (a[2:] == b[2:]).all()
    assert (a[:2] == c[:2]).all() and (c[2:] == 0).all()
    moved = fp_mod.reference_gpu_lanes(vals, ptr.astype(np.int32), idx)   # idx and ptr swapped roles
    assert (moved[2:] != a[2:]).all()


# -- GPU ---------------------------------------------------------------------------------------
def _gpu_csr(cp, A):
    import cupyx.scipy.sparse as csp
    return csp.csr_matrix(A)


def _cg_tol_kw(func):
    return "rtol" if "rtol" in inspect.signature(func).parameters else "tol"


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,density,dtype,index", [(1, 1, 1.0, np.float64, np.int32),
                                                     (500, 400, 0.02, np.float64, np.int32),
                                                     (3000, 2000, 0.01, np.float32, np.int64),
                                                     (100, 100, 0.0, np.float64, np.int32)])
def test_gpu_fingerprint_kernel_matches_reference(cp, rng, m, n, density, dtype, index):
    A = random_csr(rng, m, n, density, dtype=dtype, index_dtype=index)
    dA = _gpu_csr(cp, A)
    if index == np.int64:
        dA = int64_indices(cp, dA)   # cupyx's constructor casts indices that fit to int32
    values, structure = fp_mod._gpu_digest(dA.data, dA.indices, dA.indptr)
    ref = fp_mod.reference_gpu_lanes(dA.data.get(), dA.indices.get(), dA.indptr.get())  # cupyx's own copies
    assert values == ref[:2].tobytes() and structure == ref[2:].tobytes()
    _, b_structure = fp_mod._gpu_digest(None, dA.indices, dA.indptr)
    assert b_structure == structure
    strided, _ = fp_mod._gpu_digest(dA.data[::2], None, None)          # made contiguous first
    assert strided == fp_mod.reference_gpu_lanes(dA.data.get()[::2], None, None)[:2].tobytes()


@pytest.mark.gpu
def test_gpu_fingerprint_kernel_grid_stride(cp):
    A = corpus.uniform(200_000, 150_000, 8, seed=3)      # 1.6M nonzeros: many words per thread
    dA = _gpu_csr(cp, A)
    values, structure = fp_mod._gpu_digest(dA.data, dA.indices, dA.indptr)
    ref = fp_mod.reference_gpu_lanes(dA.data.get(), dA.indices.get(), dA.indptr.get())
    assert values == ref[:2].tobytes() and structure == ref[2:].tobytes()
    dA.data[123_457] += 1.0
    assert fp_mod._gpu_digest(dA.data, None, None)[0] != values


@pytest.mark.gpu
def test_gpu_dense_tall_skinny(cp, rng):
    cache = matplan.get_plan_cache(cp.cuda.runtime.getDevice())
    cache.clear()
    A = np.asfortranarray(rng.standard_normal((512, 512)))
    B = np.asfortranarray(rng.standard_normal((512, 4)))
    dA, dB = cp.asfortranarray(cp.asarray(A)), cp.asfortranarray(cp.asarray(B))
    np.testing.assert_allclose(matplan.matmul(dA, dB).get(), A @ B, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(matplan.matmul(dA, dB).get(), A @ B, rtol=1e-10, atol=1e-10)
    dA[7, 9] += 1.0                              # cuBLAS/TSM2 read A itself: a hit, the new product
    A[7, 9] += 1.0
    np.testing.assert_allclose(matplan.matmul(dA, dB).get(), A @ B, rtol=1e-10, atol=1e-10)
    assert (cache.misses, cache.hits) == (1, 2)
    (_, bound), = list(cache)
    assert bound.prepared.arrays["A"] is dA
    cache.clear()


@pytest.mark.gpu
def test_gpu_matmul_cache_and_changes(cp, rng):
    cache = matplan.get_plan_cache(cp.cuda.runtime.getDevice())
    cache.clear()
    A = random_csr(rng, 2000, 1500, 0.01)
    dA = _gpu_csr(cp, A)
    for k in (None, None, 4, 4):
        x = rng.standard_normal(1500) if k is None else rng.standard_normal((1500, k))
        y = matplan.matmul(dA, cp.asarray(x))
        assert isinstance(y, cp.ndarray)
        np.testing.assert_allclose(y.get(), A @ x, rtol=1e-12, atol=1e-12)
    assert (cache.misses, cache.hits) == (2, 2)
    dA.data[5] *= -3.0                                   # in place, on the device
    A.data[5] *= -3.0
    x = rng.standard_normal(1500)
    aliasing = all(e.reference is None for e in cache._entries.values() if e.fp.k == 1)
    np.testing.assert_allclose(matplan.matmul(dA, cp.asarray(x)).get(), A @ x, rtol=1e-12, atol=1e-12)
    assert cache.misses == (2 if aliasing else 3)     # A's own arrays read anew, or a copy compared
    B = random_csr(rng, 1500, 300, 0.01)
    C = matplan.matmul(dA, _gpu_csr(cp, B))
    np.testing.assert_allclose(C.get().toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-12)
    cache.clear()


@pytest.mark.gpu
def test_gpu_linear_operator_cg(cp, rng):
    import cupyx.scipy.sparse.linalg as cspla
    A = poisson2d(40)
    b = rng.standard_normal(A.shape[0])
    dA, db = _gpu_csr(cp, A), cp.asarray(b)
    op = planner.plan(dA, db, reuse=200).as_linear_operator(dA)
    assert isinstance(op, cspla.LinearOperator)
    x, info = cspla.cg(op, db, **{_cg_tol_kw(cspla.cg): 1e-10}, maxiter=2000)
    assert info == 0
    np.testing.assert_allclose(x.get(), spla.spsolve(A.tocsc(), b), rtol=1e-6, atol=1e-8)
    y = rng.standard_normal(A.shape[0])
    np.testing.assert_allclose(op.rmatvec(cp.asarray(y)).get(), A.T @ y, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_gpu_linear_operator_rmatvec_of_a_rectangular_matrix(cp, rng):
    """rmatvec / rmatmat on the GPU build A^T once (matplan's SpTRANS) and match SciPy's A.T @ y on
    a rectangular A (a symmetric one, as in the CG test above, would hide a wrong transpose)."""
    A = sp.random(300, 170, density=0.05, format="csr", random_state=3)
    dA = _gpu_csr(cp, A)
    op = planner.plan(dA, cp.asarray(rng.standard_normal(170))).as_linear_operator(dA)
    y, Y = rng.standard_normal(300), rng.standard_normal((300, 3))
    np.testing.assert_allclose(op.rmatvec(cp.asarray(y)).get(), A.T @ y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.rmatmat(cp.asarray(Y)).get(), A.T @ Y, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_gpu_routing(cp, rng):
    import cupyx.scipy.sparse as csp
    cache = matplan.get_plan_cache(cp.cuda.runtime.getDevice())
    cache.clear()
    A = random_csr(rng, 300, 200, 0.05)
    dA = _gpu_csr(cp, A)
    x = rng.standard_normal(200)
    own = _own(csp.csr_matrix, "__matmul__")
    with matplan.dispatch.route_sparse_matmul():
        np.testing.assert_allclose((dA @ cp.asarray(x)).get(), A @ x, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dA.dot(cp.asarray(x)).get(), A @ x, rtol=1e-12, atol=1e-12)
    assert (cache.misses, cache.hits) == (1, 1) and _own(csp.csr_matrix, "__matmul__") == own
    cache.clear()


# -- GPU: the identity fast path ---------------------------------------------------------------
def _poison_pool(cp, nbytes):
    """Fill soon-to-be-reused pool memory with NaN, so an output element the kernel misses shows."""
    junk = cp.full(max(1, nbytes // 8), np.nan, dtype=cp.float64)
    del junk


@pytest.fixture
def gpu_format(request, cp, monkeypatch):
    """A GPU format that is A's own arrays (CSR vector) or one prepared from a copy (the compare path).
    Always chosen: matmul's charge for the comparison (identity.hit_check) is switched off."""
    from matplan.dispatch import auto
    from matplan.kernels.spmv import gpu as spmv
    monkeypatch.setattr(auto, "hit_check", lambda kernel, f, device: (0.0, ""))

    class _Pick(spmv.CsrVector):
        name = "spmv.zz_" + request.param

        def cost(self, f, params, device):
            return Cost(0.0, 1e-9, "test kernel: always chosen")

        def prepare(self, A, params):
            return super().prepare(A.copy() if request.param == "copying" else A, params)

    with registered(_Pick()) as kernel:
        kernel.reads_a_at_run = request.param == "aliasing"   # the same code as spmv.csr_vector: declared so
        yield request.param


@pytest.mark.gpu
@pytest.mark.parametrize("gpu_format", ["aliasing", "copying"], indirect=True)
@pytest.mark.parametrize("change", ["data", "indices", "indptr", "same pointer new values", "none"])
def test_gpu_identity_path_after_in_place_change(cp, rng, gpu_format, change, full_path):
    cache = matplan.get_plan_cache(cp.cuda.runtime.getDevice())
    cache.clear()
    m, n = 3000, 2500
    A = random_csr(rng, m, n, 0.004)
    dA = _gpu_csr(cp, A)
    x = rng.standard_normal(n)
    dx = cp.asarray(x)
    for _ in range(3):
        _poison_pool(cp, 8 * m)
        np.testing.assert_allclose(matplan.matmul(dA, dx).get(), A @ x, rtol=1e-12, atol=1e-12)
    entry, = cache._entries.values()
    assert entry.bound.plan.kernel == "spmv.zz_" + gpu_format
    assert (entry.reference is None) == (gpu_format == "aliasing")
    assert (cache.misses, cache.hits) == (1, 2) and full_path["fingerprint"].calls == 1
    ptr = dA.data.data.ptr
    row = int(np.argmax(np.diff(A.indptr)[:-1]))
    if change == "data":
        dA.data[A.nnz // 2] = 7.0
        A.data[A.nnz // 2] = 7.0
    elif change == "indices":
        present = set(A.indices[A.indptr[row]:A.indptr[row + 1]].tolist())
        col = next(c for c in range(n) if c not in present)
        dA.indices[int(A.indptr[row])] = col
        A.indices[A.indptr[row]] = col
    elif change == "indptr":
        dA.indptr[row + 1] -= 1
        A.indptr[row + 1] -= 1
    elif change == "same pointer new values":
        new = rng.standard_normal(A.nnz)
        dA.data[...] = cp.asarray(new)
        A.data[:] = new
    assert dA.data.data.ptr == ptr
    for _ in range(2):
        _poison_pool(cp, 8 * m)
        np.testing.assert_allclose(matplan.matmul(dA, dx).get(), A.toarray() @ x, rtol=1e-12, atol=1e-12)
    missed = change != "none" and gpu_format == "copying"
    assert (cache.misses, cache.hits) == ((2, 3) if missed else (1, 4))
    assert full_path["fingerprint"].calls == (2 if missed else 1)
    cache.clear()


@pytest.mark.gpu
def test_gpu_compare_kernel(cp, rng):
    from matplan.dispatch import identity
    dev = cp.cuda.runtime.getDevice()
    for n, offset in ((1, 0), (5, 1), (1000, 0), (1000, 1), (3_000_001, 0), (3_000_001, 3)):
        base = cp.asarray(rng.standard_normal(n + offset).astype(np.float32))
        a = base[offset:]                       # offset 1 or 3: not 16-byte aligned (the word path)
        r = a.copy()
        assert identity.start_compare(a, r, dev).same()
        for pos in sorted({0, n // 2, n - 1}):
            r2 = r.copy()
            r2[pos] = cp.float32(np.nextafter(np.float32(r2[pos].get()), np.float32(np.inf)))
            assert not identity.start_compare(a, r2, dev).same(), (n, offset, pos)
        assert identity.start_compare(a, r, dev).same()   # the flag from the last miss does not linger
    A = random_csr(rng, 500, 400, 0.02)
    dA = _gpu_csr(cp, A)
    ref = dA.copy()
    assert identity.start_compare(dA, ref, dev).same()
    ref.indptr[250] += 1
    assert not identity.start_compare(dA, ref, dev).same()
    assert identity.start_compare(cp.zeros((4, 4))[:, ::2], cp.zeros((4, 2)), dev) is None


@pytest.mark.gpu
def test_gpu_aliasing_kernels_hold_A(cp, rng):
    """Every GPU kernel listed as aliasing prepares on A's own arrays (CSR and dense problems)."""
    from matplan.dispatch import identity
    A = random_csr(rng, 2000, 1500, 0.01)
    dA, dx = _gpu_csr(cp, A), cp.asarray(rng.standard_normal(1500))
    D = cp.asfortranarray(cp.asarray(rng.standard_normal((4096, 64))))
    dB = cp.asarray(rng.standard_normal((64, 4)))
    seen = set()
    dS = _gpu_csr(cp, random_csr(rng, 1500, 800, 0.01))
    for a, b in ((dA, dx), (dA, cp.asarray(rng.standard_normal((1500, 4)))), (D, dB), (cp.ascontiguousarray(D), dB),
                 (dA, dS)):
        plan = planner.plan(a, b, reuse=1)
        for c in plan.candidates:
            if identity.aliasing_kernel(c.kernel) and c.source != "rejected":
                assert identity.aliases(get(c.kernel).prepare(a, dict(c.params)), a), c.label()
                seen.add(c.kernel)
    assert {"spmv.csr_vector", "gemm.cublas", "spgemm.cusparse", "spgemm.hash"} <= seen


# -- GPU: SpGEMM on the identity path ----------------------------------------------------------
def _sorted_change(M, how):
    """Change host CSR M in place keeping every row sorted and duplicate-free (cupyx caches
    canonical form); return the (array name, position, value) to apply to its GPU twin."""
    ind, ptr = M.indices, M.indptr
    if how == "data":
        M.data[M.nnz // 2] = 7.0
        return "data", M.nnz // 2, 7.0
    if how == "indices":                 # lower one column index into a gap before it in its row
        for r in range(M.shape[0]):
            for p in range(ptr[r], ptr[r + 1]):
                low = ind[p - 1] if p > ptr[r] else -1
                if ind[p] - 1 > low:
                    ind[p] -= 1
                    return "indices", p, int(ind[p])
    if how == "indptr":                  # move one row boundary, keeping both rows sorted
        for r in range(M.shape[0] - 1):
            a, b, c = ptr[r], ptr[r + 1], ptr[r + 2]
            if a == b < c:                   # row r empty: row r + 1's entries become row r's
                ptr[r + 1] = c
                return "indptr", r + 1, int(c)
            if b > a and (c == b or ind[b - 1] < ind[b]):   # row r's last entry starts row r + 1
                ptr[r + 1] -= 1
                return "indptr", r + 1, int(ptr[r + 1])
    raise AssertionError(f"no sorted in-place change of {how} found")


def _with_empty_rows(M, every=7):
    """M with rows 0, every, 2 * every, ... emptied (so _sorted_change always finds a boundary to move)."""
    keep = np.ones(M.shape[0])
    keep[::every] = 0.0
    M = (sp.diags(keep) @ M).tocsr()
    M.eliminate_zeros()
    M.sort_indices()
    return M


@pytest.fixture
def gpu_spgemm(request, cp, monkeypatch):
    """Force a SpGEMM kernel: a copy of cuSPARSE's (with its products limit) or of the hash kernel."""
    from matplan.dispatch import identity
    from matplan.kernels.spgemm import gpu as spgemm
    from matplan.kernels.spgemm import vendor
    base = vendor.CusparseSpGEMM if request.param == "cusparse" else spgemm.HashSpGEMM

    class _Pick(base):
        name = "spgemm.zz_" + request.param

        def cost(self, f, params, device):
            return Cost(0.0, 1e-9, "test kernel: always chosen")

    monkeypatch.setitem(vendor.VENDOR_LIMITS, _Pick.name, vendor.VENDOR_LIMITS["spgemm.cusparse"])
    identity.product_limit.cache_clear()
    with registered(_Pick()) as kernel:
        yield kernel.name
    identity.product_limit.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("gpu_spgemm", ["cusparse", "hash"], indirect=True)
@pytest.mark.parametrize("change", ["A data", "A indices", "A indptr", "B data", "B indices", "B indptr", "none"])
def test_gpu_spgemm_identity_path_after_in_place_change(cp, rng, gpu_spgemm, change, full_path):
    """Both SpGEMM kernels read A and B at run time: hits skip the fingerprint, and an in-place
    change of either operand gives the new product (poisoned pool: unwritten output shows)."""
    cache = matplan.get_plan_cache(cp.cuda.runtime.getDevice())
    cache.clear()
    A, B = _with_empty_rows(random_csr(rng, 400, 300, 0.02)), _with_empty_rows(random_csr(rng, 300, 350, 0.02))
    dA, dB = _gpu_csr(cp, A), _gpu_csr(cp, B)
    for _ in range(3):
        _poison_pool(cp, 1 << 22)
        C = matplan.matmul(dA, dB)
        np.testing.assert_allclose(C.get().toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-12)
    entry, = cache._entries.values()
    assert entry.bound.plan.kernel == gpu_spgemm and entry.reference is None
    assert entry.pins[0] is dA and entry.pins[4] is dB
    assert (cache.misses, cache.hits) == (1, 2) and full_path["fingerprint"].calls == 1
    if change != "none":
        which, how = change.split(" ")
        host, dev = (A, dA) if which == "A" else (B, dB)
        name, pos, value = _sorted_change(host, how)
        getattr(dev, name)[pos] = value
    for _ in range(2):
        _poison_pool(cp, 1 << 22)
        C = matplan.matmul(dA, dB)
        np.testing.assert_allclose(C.get().toarray(), A.toarray() @ B.toarray(), rtol=1e-12, atol=1e-12)
    assert (cache.misses, cache.hits) == (1, 4) and full_path["fingerprint"].calls == 1
    cache.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("index", [np.int32, np.int64])
def test_gpu_products_kernel(cp, rng, index):
    """matplan_products against NumPy: exact at the limit, one below it, out-of-range indices, empty A."""
    import types
    from matplan.dispatch import identity
    dev = cp.cuda.runtime.getDevice()
    for m, k, n, density in ((1, 1, 1, 1.0), (300, 200, 250, 0.05), (20_000, 3_000, 500, 0.01)):
        A, B = random_csr(rng, m, k, density), random_csr(rng, k, n, density)
        products = int(np.diff(B.indptr)[A.indices].sum())
        dA = types.SimpleNamespace(indices=cp.asarray(A.indices.astype(index)))
        dB = types.SimpleNamespace(indices=cp.asarray(B.indices), indptr=cp.asarray(B.indptr.astype(index)),
                                   shape=B.shape)
        if A.nnz * B.nnz > products:          # else the free bound answers without the kernel
            assert identity.within_product_limit(products, dA, dB, dev)
            assert not identity.within_product_limit(products - 1, dA, dB, dev)
            dA.indices[A.nnz // 2] = k        # one index outside B's rows
            assert not identity.within_product_limit(A.nnz * B.nnz - 1, dA, dB, dev)
    empty = types.SimpleNamespace(indices=cp.zeros(0, dtype=index))
    assert identity.within_product_limit(0, empty, dB, dev)


@pytest.mark.gpu
def test_gpu_spgemm_products_limit_replans(cp, rng, monkeypatch, full_path):
    """cuSPARSE planned at its products limit: every hit counts the products on the GPU, and an
    in-place change past the limit takes the full path and re-plans (the hash kernel), never
    returning what cuSPARSE computed past its limit (it runs behind the count, its result dropped)."""
    from matplan.dispatch import identity
    from matplan.kernels.spgemm import gpu as spgemm
    from matplan.kernels.spgemm import vendor
    cache = matplan.get_plan_cache(cp.cuda.runtime.getDevice())
    cache.clear()
    A, B = random_csr(rng, 500, 400, 0.02), random_csr(rng, 400, 300, 0.02)
    products = int(np.diff(B.indptr)[A.indices].sum())
    monkeypatch.setitem(vendor.VENDOR_LIMITS["spgemm.cusparse"], "max_products", products)
    # which kernel wins so small a product is the cost model's call: hash is made 10 ms dearer so
    # that cuSPARSE is planned first, and the row-row merge 20 ms dearer so that hash is the kernel
    # taken past the limit
    from matplan.kernels.spgemm import merge as spgemm_merge
    monkeypatch.setattr(spgemm, "HASH_FIXED_S", {path: s + 0.01 for path, s in spgemm.HASH_FIXED_S.items()})
    monkeypatch.setattr(spgemm_merge, "FIXED_S", spgemm_merge.FIXED_S + 0.02)
    identity.product_limit.cache_clear()
    counted = _Counter(identity.start_product_check)
    from matplan.dispatch import auto
    monkeypatch.setattr(auto, "start_product_check", counted)
    try:
        dA, dB = _gpu_csr(cp, A), _gpu_csr(cp, B)
        for _ in range(3):
            C = matplan.matmul(dA, dB)
            np.testing.assert_allclose(C.get().toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-12)
        assert [e.bound.plan.kernel for e in cache._entries.values()] == ["spgemm.cusparse"]
        assert counted.calls == 2 and full_path["fingerprint"].calls == 1
        longest = int(np.argmax(np.diff(B.indptr)))
        A.indices[:] = longest
        dA.indices[...] = longest            # every product now meets B's longest row: past the limit
        C = matplan.matmul(dA, dB)
        np.testing.assert_allclose(C.get().toarray(), A.toarray() @ B.toarray(), rtol=1e-12, atol=1e-9)
        assert full_path["fingerprint"].calls == 2 and cache.misses == 2
        assert list(cache)[0][1].plan.kernel == "spgemm.hash"
    finally:
        identity.product_limit.cache_clear()
        cache.clear()
