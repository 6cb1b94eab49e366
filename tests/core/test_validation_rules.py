"""The rules every path of a plan shares (core.validation): integers, CSR structure, dtypes, out."""
import numpy as np
import pytest
import scipy.sparse as sp

from matplan.core import validation
from matplan.core.validation import check_csr, check_int, check_out

# -- integers (issue 40, item 4) --------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 100, np.int64(100), np.int32(7), np.uint8(3), np.intp(2)])
def test_check_int_takes_python_and_numpy_integers(value):
    got = check_int(value, "reuse", "a positive integer")
    assert got == int(value) and type(got) is int


@pytest.mark.parametrize("value", [0, -1, np.int64(0), True, np.bool_(True), 1.5, np.float64(2.0), "3", None])
def test_check_int_refuses_the_rest_naming_the_argument(value):
    with pytest.raises(ValueError, match=r"reuse: expected a positive integer, got") as err:
        check_int(value, "reuse", "a positive integer")
    if isinstance(value, (bool, np.bool_)):
        assert "(a bool)" in str(err.value)


# -- CSR structure (item 5) -------------------------------------------------------------------


def _full(index_dtype=np.int32):
    """3 x 4 CSR with every entry stored: 4 per row, indptr [0, 4, 8, 12]."""
    A = sp.csr_matrix(np.arange(1.0, 13.0).reshape(3, 4))
    A.indices, A.indptr = A.indices.astype(index_dtype), A.indptr.astype(index_dtype)
    return A


def _spoil(A, how):
    """A in place, malformed as ``how`` says (SciPy's constructor would refuse some of these)."""
    if how == "column too large":
        A.indices[5] = A.shape[1]
    elif how == "negative column":
        A.indices[0] = -1
    elif how == "indptr decreases":
        A.indptr[1] = 9                      # [0, 9, 8, 12]
    elif how == "indptr[0] not 0":
        A.indptr[0] = 1
    elif how == "indptr[-1] short":
        A.indptr[-1] = A.indices.shape[0] - 1
    elif how == "indptr[-1] past the end":
        A.indptr[-1] = A.indices.shape[0] + 1
    elif how == "indptr length":
        A.indptr = A.indptr[:-1]
    elif how == "data length":
        A.data = A.data[:-1]
    return A


SPOILS = {"column too large": "column index", "negative column": "column index",
          "indptr decreases": "indptr decreases", "indptr[0] not 0": r"indptr\[0\]",
          "indptr[-1] short": r"indptr\[-1\]", "indptr[-1] past the end": r"indptr\[-1\]",
          "indptr length": "indptr has", "data length": "data has"}


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("how", list(SPOILS))
def test_check_csr_names_each_malformation(how, index_dtype):
    A = _full(index_dtype)
    check_csr(A, "A")                          # well formed: passes
    with pytest.raises(ValueError, match=r"^B: .*" + SPOILS[how]):
        check_csr(_spoil(A, how), "B")


def test_check_csr_allows_duplicates_unsorted_and_empty(rng):
    from conftest import messy_csr
    check_csr(messy_csr(rng, 50, 20), "A")     # duplicates, unsorted, empty rows, one long row
    for shape in ((0, 0), (0, 5), (5, 0), (4, 6)):
        check_csr(sp.csr_matrix(shape), "A")
    A = sp.csr_matrix((np.ones(1), np.zeros(1, np.int32), np.array([0, 1], np.int32)), shape=(1, 0))
    with pytest.raises(ValueError, match="column index"):   # no columns: any index is out of range
        check_csr(A, "A")


def test_checked_once_skips_the_same_object_only(monkeypatch):
    calls = []
    real = validation.check_csr
    monkeypatch.setattr(validation, "check_csr", lambda M, name, *host: calls.append(name) or real(M, name, *host))
    seen = validation.CheckedOnce()
    A = _full()
    seen.ensure(A, "A")
    seen.ensure(A, "A")
    assert calls == ["A"]
    seen.ensure(A.copy(), "A")                 # another object
    A.indices = A.indices.copy()               # an array replaced: counts as new
    seen.ensure(A, "A")
    assert calls == ["A", "A", "A"]


@pytest.mark.gpu
@pytest.mark.parametrize("how", list(SPOILS))
def test_check_csr_on_the_gpu(cp, how):
    """The same checks on a cupyx CSR, computed on the GPU (one transfer of four flags)."""
    import cupyx.scipy.sparse as csp
    A = csp.csr_matrix(_full())
    check_csr(A, "A")
    if how in ("indptr length", "data length"):
        _spoil(A, how)
    else:                                     # spoil a host copy of the arrays, then move it back
        host = _spoil(_full(), how)
        A.indptr, A.indices = cp.asarray(host.indptr), cp.asarray(host.indices)
    with pytest.raises(ValueError, match=r"^A: .*" + SPOILS[how]):
        check_csr(A, "A")


# -- out (item 2) -----------------------------------------------------------------------------


class _Plan:
    """What check_out reads of a plan."""
    def __init__(self, op="spmv", backend="cpu", dtype="float64", m=6, k=1):
        from matplan.core.features import Features
        self.op, self.backend = op, backend
        self.features = Features(op=op, dtype=dtype, backend=backend, m=m, n=5, k=k)


def test_check_out_host():
    p, B, A = _Plan(), np.ones(5), _full()
    check_out(np.empty(6), p, (6,), B, A)
    check_out(np.empty(12)[::2], p, (6,), B, A)   # any writeable layout on the host
    with pytest.raises(TypeError, match=r"out: expected dtype float64 .* got int64"):
        check_out(np.empty(6, np.int64), p, (6,), B, A)
    with pytest.raises(TypeError, match=r"out: expected dtype float64 .* got float32"):
        check_out(np.empty(6, np.float32), p, (6,), B, A)
    with pytest.raises(ValueError, match=r"out: expected shape \(6,\)"):
        check_out(np.empty((6, 1)), p, (6,), B, A)
    with pytest.raises(TypeError, match="out: expected a NumPy array"):
        check_out([0.0] * 6, p, (6,), B, A)
    ro = np.empty(6)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: read-only"):
        check_out(ro, p, (6,), B, A)
    both = np.empty(6)
    with pytest.raises(ValueError, match="out: shares memory with B"):
        check_out(both, p, (6,), both[1:], A)
    check_out(both, p, (6,), np.empty(10)[::2], A)   # B elsewhere
    with pytest.raises(ValueError, match="out: shares memory with A"):
        check_out(A.data[:6], p, (6,), B, A)
    with pytest.raises(ValueError, match="out: shares memory with A"):   # a prepared format's arrays
        check_out(A.data[:6], p, (6,), B, {"parts": [A.indptr, {"v": A.data}]})
    for op in ("spgemm", "sptrans"):
        with pytest.raises(ValueError, match=f"out: not supported for {op}"):
            check_out(np.empty(6), _Plan(op=op), None, None, A)


@pytest.mark.gpu
def test_check_out_gpu(cp):
    """On the GPU: a CuPy out on B's device, C-contiguous for a sparse product, no overlap."""
    p = _Plan(backend="gpu", k=2)
    B, A = cp.ones((5, 2)), cp.ones((6, 5))
    check_out(cp.empty((6, 2)), p, (6, 2), B, A)
    with pytest.raises(TypeError, match="out: expected a CuPy array"):
        check_out(np.empty((6, 2)), p, (6, 2), B, A)
    with pytest.raises(ValueError, match="C-contiguous"):
        check_out(cp.empty((2, 6)).T, _Plan(op="spmm", backend="gpu", k=2), (6, 2), B, A)
    check_out(cp.empty((2, 6)).T, _Plan(op="gemm", backend="gpu", k=2), (6, 2), B, A)  # dense: kernels' rule
    big = cp.empty((6, 2))
    with pytest.raises(ValueError, match="out: shares memory with B"):
        check_out(big, p, (6, 2), big[1:], A)
    with pytest.raises(ValueError, match="out: shares memory with A"):
        check_out(A[:, :2], _Plan(op="gemm", backend="gpu", k=2), (6, 2), B, A)
    if cp.cuda.runtime.getDeviceCount() > 1:
        with cp.cuda.Device(1):
            other = cp.empty((6, 2))
        with pytest.raises(ValueError, match="out: on GPU 1"):
            check_out(other, p, (6, 2), B, A)


# -- dtypes (item 3) --------------------------------------------------------------------------


@pytest.mark.parametrize("plan_dtype,dt,other,ok", [
    ("float64", "float64", "float64", True), ("float64", "float32", "float64", True),
    ("float64", "float64", "float32", True), ("float64", "float32", "float32", False),
    ("float32", "float32", "float32", True), ("float32", "float64", "float32", False),
    ("float32", "float32", "float64", False),
])
def test_one_dtype_rule(plan_dtype, dt, other, ok):
    p = _Plan(dtype=plan_dtype)
    if ok:
        assert validation.dtype_for_plan(np.dtype(dt), "B", p, np.dtype(other)) == np.dtype(plan_dtype)
    else:
        with pytest.raises(ValueError, match=f"B: this plan is for {plan_dtype}, got {dt}"):
            validation.dtype_for_plan(np.dtype(dt), "B", p, np.dtype(other))
    # A alone (bind): it need only promote to the plan's dtype
    assert (np.promote_types(dt, plan_dtype) == plan_dtype) == _accepts(p, dt)


def _accepts(p, dt):
    try:
        validation.dtype_for_plan(np.dtype(dt), "A", p)
        return True
    except ValueError:
        return False
