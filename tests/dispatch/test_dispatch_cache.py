"""matplan.matmul and its plan cache: hits and misses, what the key covers, bounds, reuse and
re-planning, threads (CPU; GPU tests marked gpu)."""
import threading

import numpy as np
import pytest
import scipy.sparse as sp

import matplan
from matplan import planner
from matplan.dispatch import cache as cache_mod
from matplan.dispatch import fingerprint as fp_mod
from matplan.kernels import get
from conftest import messy_csr, random_csr
from dispatch_helpers import (fresh_cache, entries, check, registered, host_format, prepcost_kernel,  # noqa: F401 (fixtures)
                              _stats, _gpu_csr)


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


@pytest.mark.parametrize("bad, why", [(-1, ""), (True, "(a bool)"), (np.int64(-1), ""), (np.bool_(False), "(a bool)"),
                                      (2.0, ""), ("4", "")])
def test_plan_cache_sizes_refused_by_name(bad, why):
    """Issue 40 item 4: one rule (core.validation.check_int) for the plan cache's integers."""
    cache = matplan.get_plan_cache()
    with pytest.raises(ValueError, match=r"size: expected a non-negative integer number of entries") as err:
        cache.set_size(bad)
    assert why in str(err.value)
    if not (isinstance(bad, (int, np.integer)) and not isinstance(bad, (bool, np.bool_)) and bad == -1):
        with pytest.raises(ValueError, match=r"memsize: expected a byte count >= 0, or -1 for unbounded"):
            cache.set_memsize(bad)
    with pytest.raises(ValueError, match=r"device: expected 'cpu' or a CUDA device id \(int >= 0\)"):
        matplan.get_plan_cache(bad)


def test_plan_cache_takes_numpy_integers(fresh_cache):
    """NumPy integers for size, memsize and the device id, kept as Python ints; device
    np.int64(0) is the same cache as 0."""
    cache = matplan.get_plan_cache()
    old = (cache.get_size(), cache.get_memsize())
    try:
        cache.set_size(np.int64(3))
        cache.set_memsize(np.int32(-1))
        assert (cache.get_size(), cache.get_memsize()) == (3, -1)
        assert type(cache.get_size()) is int and type(cache.get_memsize()) is int
        cache.set_memsize(np.uint64(1 << 20))
        assert cache.get_memsize() == 1 << 20 and type(cache.get_memsize()) is int
    finally:
        cache.set_size(old[0])
        cache.set_memsize(old[1])
    assert matplan.get_plan_cache(np.int64(0)) is matplan.get_plan_cache(0)
    assert matplan.get_plan_cache(np.str_("cpu")) is matplan.get_plan_cache("cpu")


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



def test_plan_cache_is_listed_by_cache_info(rng, fresh_cache):
    """The entries live in a core.cache.BoundedCache: matplan.cache_info() reports them."""
    A = random_csr(rng, 30, 30, 0.2)
    matplan.matmul(A, rng.standard_normal(30))
    matplan.matmul(A, rng.standard_normal(30))
    info = matplan.cache_info()[fresh_cache._entries.name]
    assert info.name.startswith("dispatch.plans[cpu]")
    assert (info.hits, info.misses, info.entries, info.nbytes) == (1, 1, 1, fresh_cache.get_curr_memsize())

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


# -- GPU ---------------------------------------------------------------------------------------
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
