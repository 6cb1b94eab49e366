"""The identity fast path of matplan.matmul on the host: in-place changes, SpGEMM operands and their
products limit, assume_unchanged (GPU twins in test_dispatch_identity_gpu.py)."""
import numpy as np
import pytest
import scipy.sparse as sp

import matplan
from matplan.dispatch import cache as cache_mod
from matplan.core.types import Cost
from matplan.kernels import Kernel, Prepared, get
from conftest import random_csr
from dispatch_helpers import (fresh_cache, poisson2d, entries, check, registered,  # noqa: F401 (fixtures)
                              _CopyingKernel, host_format, _stats, _cg_iterations,
                              _Counter, full_path)


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
