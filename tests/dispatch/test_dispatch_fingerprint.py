"""Plan-cache fingerprints: host digests of a sample, chunked hashing, and fingerprint.cu against
its NumPy twin (GPU tests marked gpu)."""
import numpy as np
import pytest

from matplan import corpus
from matplan.dispatch import fingerprint as fp_mod
from conftest import int64_indices, random_csr
from dispatch_helpers import fresh_cache, _gpu_csr  # noqa: F401 (fixtures)


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
