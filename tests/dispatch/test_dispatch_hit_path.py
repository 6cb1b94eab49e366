"""The plan-cache hit's shortcuts (matmul on the identity path): the most-recent entry tried
before hashing, the LRU order kept by hits that skip the reorder, no entry kept alive by
the shortcut after it leaves the cache, and an identity key that still covers every
attribute of A's arrays that can change in place."""
import gc
import weakref

import numpy as np
import pytest

import matplan
from matplan.dispatch import identity
from conftest import random_csr
from dispatch_helpers import fresh_cache, entries, check, registered, prepcost_kernel  # noqa: F401 (fixtures)


def test_lru_order_kept_when_hits_skip_the_reorder(rng, fresh_cache):
    """Hits on the most recent entry skip the reorder; a hit through the full path (another object
    of A's content) and one on an older entry still reorder, so the least recent is evicted."""
    fresh_cache.set_size(2)
    A1, A2, A3 = (random_csr(rng, 50, 50, d) for d in (0.05, 0.1, 0.15))
    x = rng.standard_normal(50)
    matplan.matmul(A1, x)
    matplan.matmul(A2, x)
    for _ in range(3):                          # A2 most recent: counted without a reorder
        check(matplan.matmul(A2, x), A2, x)
    check(matplan.matmul(A1.copy(), x), A1, x)  # the full path (fingerprint): A1 now most recent
    check(matplan.matmul(A2, x), A2, x)         # identity hit on the older entry: A2 most recent
    matplan.matmul(A3, x)                       # evicts A1
    assert [fp.nnz for fp, _ in entries(fresh_cache)] == [A3.nnz, A2.nnz]
    assert (fresh_cache.misses, fresh_cache.hits, fresh_cache.evictions) == (3, 5, 1)
    check(matplan.matmul(A2, x), A2, x)
    assert fresh_cache.hits == 6
    info = matplan.cache_info()[fresh_cache._entries.name]
    assert (info.hits, info.misses) == (6, 3)


def test_last_found_entry_not_kept_after_eviction(rng, fresh_cache):
    """The entry find() tries first is dropped with the entry: an evicted A is freed."""
    fresh_cache.set_size(1)
    A = random_csr(rng, 40, 40, 0.1)
    x = rng.standard_normal(40)
    matplan.matmul(A, x)
    matplan.matmul(A, x)                        # a hit: the entry is the one found last
    assert fresh_cache._last[0] is not None and fresh_cache._last[0].pins[0] is A
    gone = weakref.ref(A)
    del A
    gc.collect()
    assert gone() is not None                   # pinned by its entry
    other = random_csr(rng, 40, 40, 0.2)
    check(matplan.matmul(other.tocsc(), x), other, x)   # no identity key (normalize converts): evicts A's
    gc.collect()
    assert gone() is None and fresh_cache._last[0] is None
    for _ in range(2):                          # the full path registers other's key, then a hit
        check(matplan.matmul(other, x), other, x)
    assert fresh_cache._last[0].pins[0] is other
    fresh_cache.clear()
    assert fresh_cache._last[0] is None


def test_last_found_entry_checked_against_its_key(rng, fresh_cache):
    """An entry found last and then registered under another key is not found under its old one."""
    A = random_csr(rng, 40, 40, 0.1)
    x = rng.standard_normal(40)
    matplan.matmul(A, x)
    device, old = identity.identity_key(A, x, False)
    assert fresh_cache.find(old) is not None
    A.data = A.data.copy()                      # same content, a new array: another identity key
    check(matplan.matmul(A, x), A, x)           # the full path re-registers the entry under it
    assert fresh_cache.find(old) is None
    assert fresh_cache.find(identity.identity_key(A, x, False)[1]) is fresh_cache._last[0]


def test_identity_key_covers_in_place_changes_of_array_attributes(rng):
    """Shape and dtype set in place on the same array objects change the key."""
    A = random_csr(rng, 30, 30, 0.2)
    x = rng.standard_normal(30)
    key = identity.identity_key(A, x, False)
    A.indices.dtype = np.uint32                 # same buffer and itemsize, another dtype
    assert identity.identity_key(A, x, False) != key
    A.indices.dtype = np.int32
    assert identity.identity_key(A, x, False) == key
    A.data.shape = (A.nnz, 1)
    assert identity.identity_key(A, x, False) != key
    A.data.shape = (A.nnz,)
    D = rng.standard_normal((6, 4))
    y = rng.standard_normal(4)
    dense = identity.identity_key(D, y, False)
    D.shape = (4, 6)
    assert identity.identity_key(D, y, False) != dense
    B = random_csr(rng, 30, 20, 0.2)
    spgemm = identity.identity_key(A, B, False)
    B.indptr.dtype = np.uint32
    assert identity.identity_key(A, B, False) != spgemm
    B.indptr.dtype = np.int32
    B.data = B.data.astype(np.float32)          # dtypes differ: normalize upcasts, no identity key
    assert identity.identity_key(A, B, False) is None


def test_dense_a_reshaped_in_place_takes_the_full_path(rng, fresh_cache):
    """A dense A reshaped in place (same object, same buffer) is planned anew, never run as before."""
    D = rng.standard_normal((12, 12))
    y = rng.standard_normal(12)
    check(matplan.matmul(D, y), D, y)
    check(matplan.matmul(D, y), D, y)
    D.shape = (24, 6)
    z = rng.standard_normal(6)
    check(matplan.matmul(D, z), D, z)
    assert fresh_cache.misses == 2


def test_replan_updates_what_hits_read(rng, fresh_cache, prepcost_kernel):
    """A re-plan gives the entry a new plan, and hits read its reuse and kernel from then on."""
    A = random_csr(rng, 200, 200, 0.05)
    x = rng.standard_normal(200)
    check(matplan.matmul(A, x, reuse=1), A, x)
    (_, bound), = entries(fresh_cache)
    entry = fresh_cache.find(identity.identity_key(A, x, False)[1])
    assert entry.planned == 1 and entry.kernel.name == bound.plan.kernel
    check(matplan.matmul(A, x, reuse=10_000), A, x)
    (_, bound), = entries(fresh_cache)
    assert fresh_cache.replans == 1 and bound.plan.reuse == 10_000
    assert entry.planned == 10_000 and entry.kernel.name == bound.plan.kernel == prepcost_kernel.name
    assert entry.prepared is bound.prepared and entry.limit is None
    for _ in range(3):
        check(matplan.matmul(A, x, reuse=10_000), A, x)
    assert fresh_cache.replans == 1


@pytest.mark.parametrize("reuse", [None, 5])
def test_hit_arguments_fast_path_matches_the_checks(rng, fresh_cache, reuse):
    """The argument test of a hit accepts what check_args accepts (NumPy integers too)."""
    A = random_csr(rng, 30, 30, 0.2)
    x = rng.standard_normal(30)
    for r in (reuse, np.int64(5) if reuse else None):
        check(matplan.matmul(A, x, reuse=r, deterministic=False, assume_unchanged=None, check=True), A, x)
    for bad in (dict(reuse=True), dict(reuse=0), dict(deterministic=1), dict(assume_unchanged=0),
                dict(check=None)):
        with pytest.raises((TypeError, ValueError), match=next(iter(bad))):
            matplan.matmul(A, x, **bad)
