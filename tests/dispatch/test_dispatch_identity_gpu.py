"""The identity fast path on the GPU: in-place changes, the fused comparison and products kernels,
SpGEMM operands and cuSPARSE's products limit (all marked gpu)."""
import types

import numpy as np
import pytest
import scipy.sparse as sp

import matplan
from matplan import planner
from matplan.core.types import Cost
from matplan.kernels import get
from conftest import random_csr
from dispatch_helpers import fresh_cache, registered, _Counter, full_path, _gpu_csr  # noqa: F401 (fixtures)


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


# -- SpGEMM ----------------------------------------------------------------------------------------
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
    from matplan.kernels.spgemm import kernel as spgemm
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
    from matplan.models import spgemm as spgemm_model
    from matplan.kernels.spgemm import vendor
    cache = matplan.get_plan_cache(cp.cuda.runtime.getDevice())
    cache.clear()
    A, B = random_csr(rng, 500, 400, 0.02), random_csr(rng, 400, 300, 0.02)
    products = int(np.diff(B.indptr)[A.indices].sum())
    monkeypatch.setitem(vendor.VENDOR_LIMITS["spgemm.cusparse"], "max_products", products)
    # which kernel wins so small a product is the cost model's call: hash is made 10 ms dearer so
    # that cuSPARSE is planned first, and the row-row merge 20 ms dearer so that hash is the kernel
    # taken past the limit
    monkeypatch.setattr(spgemm_model, "HASH_FIXED_S", {path: s + 0.01 for path, s in spgemm_model.HASH_FIXED_S.items()})
    monkeypatch.setattr(spgemm_model, "MERGE_FIXED_S", spgemm_model.MERGE_FIXED_S + 0.02)
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
