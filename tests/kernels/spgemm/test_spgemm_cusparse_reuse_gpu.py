"""cuSPARSE SpGEMM with reuse (``PreparedSpGEMMReuse``) against SciPy in float64 on fresh random
inputs: float32 and float64, empty rows, one very long row, empty operands and a structurally empty
product, int32 and int64 indices, values changed in place or replaced, the current stream, and
its refusals and cleanup.

C's values are poisoned with NaN before every compute, so a value the compute fails to write
shows; C's structure (made once at setup) is compared with A·B's entry by entry."""
import gc
import types

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import messy_csr, random_csr
from matplan.kernels.spgemm import cusparse_reuse as reuse

pytestmark = pytest.mark.gpu
#: Tolerance of a value, times |A||B| at the entry (float32: cuSPARSE's summation order is its own).
TOL = {np.float64: 1e-12, np.float32: 1e-5}


def to_gpu(cp, A, dtype=np.float64, index=np.int32, canonical=True):
    """SciPy CSR ``A`` on the GPU with exactly these dtypes (a plain namespace keeps int64 indices),
    its rows sorted and duplicates summed (cuSPARSE's SpGEMM needs it) unless ``canonical`` is False."""
    A = sp.csr_matrix(A, copy=True)
    if canonical:
        A.sum_duplicates()
        A.sort_indices()
    return types.SimpleNamespace(indptr=cp.asarray(A.indptr.astype(index)), indices=cp.asarray(A.indices.astype(index)),
                                 data=cp.asarray(A.data.astype(dtype)), shape=A.shape)


def without_rows(A, rows):
    """CSR ``A`` with the ``rows`` (a slice) emptied, its dtype kept."""
    keep = np.ones(A.shape[0])
    keep[rows] = 0
    out = sp.csr_matrix(sp.diags(keep) @ A, dtype=A.dtype)
    out.eliminate_zeros()
    return out


def _pattern(M):
    M = sp.csr_matrix(M)
    return sp.csr_matrix((np.ones(M.nnz), M.indices.copy(), M.indptr.copy()), shape=M.shape)


def check(C, A, B, dtype, what=""):
    """C (on the GPU) holds exactly A·B's structure, each entry once, every value written (no NaN)
    and within TOL x |A||B| of SciPy's float64 product of the same (host) A and B."""
    A64, B64 = sp.csr_matrix(A, dtype=np.float64, copy=True), sp.csr_matrix(B, dtype=np.float64, copy=True)
    m, n = A64.shape[0], B64.shape[1]
    assert tuple(C.shape) == (m, n), what
    indptr, indices = C.indptr.get().astype(np.int64), C.indices.get().astype(np.int64)
    data = C.data.get().astype(np.float64)
    assert len(indptr) == m + 1 and indptr[0] == 0, what
    assert indptr[-1] == len(indices) == len(data) == C.nnz, what
    assert not np.isnan(data).any(), f"{what}: {int(np.isnan(data).sum())} values unwritten (NaN-poisoned)"
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(indptr))
    keys = rows * n + indices
    assert np.unique(keys).size == keys.size, f"{what}: an entry stored twice"
    P = (_pattern(A64) @ _pattern(B64)).tocoo()
    want = P.row.astype(np.int64) * n + P.col
    assert np.array_equal(np.sort(keys), np.sort(want)), f"{what}: C's structure differs from A·B's"
    if not len(data):
        return
    ref = (A64 @ B64).tocsr()
    scale = (abs(A64) @ abs(B64)).tocsr()
    got_ref = np.asarray(ref[rows, indices]).ravel()
    got_scale = np.asarray(scale[rows, indices]).ravel()
    err = np.abs(data - got_ref)
    bad = np.flatnonzero(err > TOL[dtype] * got_scale)
    assert not len(bad), f"{what}: {len(bad)} values off, worst relative error {np.max(err / got_scale):.3g}"


def poisoned_compute(cp, prepared, **values):
    prepared.C.data.fill(np.nan)
    C = prepared.compute(**values)
    cp.cuda.get_current_stream().synchronize()
    return C


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_scipy(cp, rng, dtype):
    A = without_rows(random_csr(rng, 400, 300, 0.02, dtype), slice(None, None, 7))   # empty rows
    B = random_csr(rng, 300, 350, 0.03, dtype)
    prepared = reuse.PreparedSpGEMMReuse(to_gpu(cp, A, dtype), to_gpu(cp, B, dtype))
    assert prepared.calls_cusparse and prepared.nnz == prepared.C.nnz > 0
    assert prepared.C.dtype == dtype and prepared.C.indices.dtype == np.int32
    assert "libcusparse" in prepared.cusparse_path
    assert set(prepared.buffer_bytes) == {f"buffer{i}" for i in range(1, 6)}
    assert prepared.kept_bytes >= prepared.buffer_bytes["buffer4"] + prepared.buffer_bytes["buffer5"]
    indices_ptr = prepared.C.indices.data.ptr
    for call in range(2):                            # the same C, recomputed
        C = poisoned_compute(cp, prepared)
        assert C is prepared.C and C.indices.data.ptr == indices_ptr
        check(C, A, B, dtype, f"{np.dtype(dtype).name} call {call}")
    prepared.close()


def test_empty_rows_and_one_very_long_row(cp, rng):
    A = sp.lil_matrix(without_rows(random_csr(rng, 300, 400, 0.01), slice(100, 200)))   # a block of empty rows
    A[7, :] = rng.random(400) + 0.5                  # a row of A over every column
    A = sp.csr_matrix(A)
    B = sp.lil_matrix(random_csr(rng, 400, 3000, 0.005))
    B[11, :] = rng.random(3000) - 1.5                # a row of B over every column: C's rows through it are long
    B = sp.csr_matrix(B)
    with reuse.PreparedSpGEMMReuse(to_gpu(cp, A), to_gpu(cp, B)) as prepared:
        check(poisoned_compute(cp, prepared), A, B, np.float64, "long rows")
        assert int(np.diff(prepared.C.indptr.get())[7]) == 3000


@pytest.mark.parametrize("shapes", [((40, 30), (30, 20)), ((0, 30), (30, 20)), ((40, 30), (30, 0)),
                                    ((40, 0), (0, 20))])
def test_empty_operands_never_call_cusparse(cp, rng, monkeypatch, shapes):
    (m, k), (_, n) = shapes

    def no_setup(*args, **kwargs):
        raise AssertionError("cuSPARSE's setup was called for an empty product")
    monkeypatch.setattr(reuse.PreparedSpGEMMReuse, "_setup", no_setup)
    A = sp.csr_matrix((m, k))                        # no entries
    B = random_csr(rng, k, n, 0.3) if k and n else sp.csr_matrix((k, n))
    for left, right in ((A, B), (B.T.tocsr(), A.T.tocsr())):
        prepared = reuse.PreparedSpGEMMReuse(to_gpu(cp, left), to_gpu(cp, right))
        assert not prepared.calls_cusparse and prepared.nnz == 0 and prepared.kept_bytes == 0
        C = prepared.compute()
        check(C, left, right, np.float64, f"empty {left.shape} @ {right.shape}")
        assert (C.indptr.get() == 0).all()


def test_structurally_empty_product_of_nonempty_operands(cp, rng):
    A = sp.csr_matrix(sp.hstack([random_csr(rng, 50, 10, 0.5), sp.csr_matrix((50, 30))]))   # columns 0-9 only
    B = sp.csr_matrix(sp.vstack([sp.csr_matrix((10, 60)), random_csr(rng, 30, 60, 0.3)]))   # rows 0-9 empty
    assert A.nnz and B.nnz and (A @ B).nnz == 0
    prepared = reuse.PreparedSpGEMMReuse(to_gpu(cp, A), to_gpu(cp, B))
    assert prepared.nnz == 0 and not prepared.calls_cusparse      # stopped after cuSPARSE's count
    check(prepared.compute(), A, B, np.float64, "structurally empty")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_int64_indices_work_or_are_refused_clearly(cp, rng, dtype):
    A, B = random_csr(rng, 200, 150, 0.04, dtype), random_csr(rng, 150, 180, 0.04, dtype)
    try:
        prepared = reuse.PreparedSpGEMMReuse(to_gpu(cp, A, dtype, np.int64), to_gpu(cp, B, dtype, np.int64))
    except reuse.CusparseReuseError as exc:          # this cuSPARSE does not take them: it must say so
        assert "int64" in str(exc) and "cusparseSpGEMMreuse_" in str(exc)
        return
    assert prepared.C.indices.dtype == np.int64 and prepared.C.indptr.dtype == np.int64
    check(poisoned_compute(cp, prepared), A, B, dtype, "int64 indices")


def test_recompute_after_values_change(cp, rng):
    A, B = random_csr(rng, 300, 250, 0.03), random_csr(rng, 250, 280, 0.03)
    Ad, Bd = to_gpu(cp, A), to_gpu(cp, B)
    prepared = reuse.PreparedSpGEMMReuse(Ad, Bd)
    check(poisoned_compute(cp, prepared), A, B, np.float64, "first values")
    structure = prepared.C.indices.get().copy()
    # A's values changed in place (same pattern): the next compute reads them
    A2 = A.copy()
    A2.data = (rng.random(A.nnz) + 0.5) * rng.choice([-1.0, 1.0], A.nnz)
    Ad.data[...] = cp.asarray(A2.data)
    check(poisoned_compute(cp, prepared), A2, B, np.float64, "A changed in place")
    # B's values replaced by a new array, kept for later calls
    B2 = B.copy()
    B2.data = rng.standard_normal(B.nnz) * 3
    new_b = cp.asarray(B2.data)
    check(poisoned_compute(cp, prepared, b_data=new_b), A2, B2, np.float64, "B's values replaced")
    Bd.data.fill(np.nan)                             # the old array is no longer read
    check(poisoned_compute(cp, prepared), A2, B2, np.float64, "after the replacement")
    assert (prepared.C.indices.get() == structure).all()


def test_runs_on_the_current_stream(cp, rng):
    A, B = random_csr(rng, 500, 400, 0.02), random_csr(rng, 400, 300, 0.02)
    Ad = to_gpu(cp, A)
    prepared = reuse.PreparedSpGEMMReuse(Ad, to_gpu(cp, B))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        A2 = A.copy()
        A2.data = A.data * -2.0
        Ad.data[...] = cp.asarray(A2.data)           # queued on this stream, before the compute
        prepared.C.data.fill(np.nan)
        prepared.compute()
        stream.synchronize()
    check(prepared.C, A2, B, np.float64, "side stream")


def test_refusals_name_the_argument(cp, rng):
    A, B = random_csr(rng, 60, 50, 0.1), random_csr(rng, 50, 40, 0.1)
    messy = messy_csr(rng, 60, 50)                   # duplicates and unsorted rows
    with pytest.raises(ValueError, match=r"^A: not canonical .*sum_duplicates"):
        reuse.PreparedSpGEMMReuse(to_gpu(cp, messy, canonical=False), to_gpu(cp, B))
    host = types.SimpleNamespace(data=B.data, indices=B.indices, indptr=B.indptr, shape=B.shape)
    with pytest.raises(TypeError, match=r"^B\.data: expected a CuPy array"):
        reuse.PreparedSpGEMMReuse(to_gpu(cp, A), host)
    prepared = reuse.PreparedSpGEMMReuse(to_gpu(cp, A), to_gpu(cp, B))
    with pytest.raises(TypeError, match=r"^a_data: expected a CuPy array"):
        prepared.compute(a_data=A.data)
    with pytest.raises(ValueError, match=r"^a_data: expected a contiguous float64 array of shape"):
        prepared.compute(a_data=cp.zeros(A.nnz + 1))
    with pytest.raises(ValueError, match=r"^b_data: expected a contiguous float64 array"):
        prepared.compute(b_data=cp.zeros(B.nnz, dtype=np.float32))
    check(poisoned_compute(cp, prepared), A, B, np.float64, "after refusals")


def test_close_and_collection_free_it(cp, rng):
    A, B = random_csr(rng, 80, 60, 0.1), random_csr(rng, 60, 70, 0.1)
    prepared = reuse.PreparedSpGEMMReuse(to_gpu(cp, A), to_gpu(cp, B))
    C = poisoned_compute(cp, prepared)
    prepared.close()
    assert prepared.kept_bytes == 0 and not prepared._finalizer.alive
    with pytest.raises(RuntimeError, match="closed"):
        prepared.compute()
    prepared.close()                                 # twice is fine
    check(C, A, B, np.float64, "C outlives close")   # the result stays the caller's
    finalizer = reuse.PreparedSpGEMMReuse(to_gpu(cp, A), to_gpu(cp, B))._finalizer
    gc.collect()
    assert not finalizer.alive                       # descriptors destroyed when collected
