"""The prepared cuSPARSE SpMV/SpMM without a GPU: its arguments and configs (algorithm, SpMM
order), the search space the planner and the benchmark time, the reasons it falls back to cupyx's
call, descriptors destroyed when collected, the kernel's registration and costs."""
import gc
import types

import numpy as np
import pytest

from matplan.kernels import get
from matplan.kernels.spmv import cusparse_prepared as cpr
from matplan.kernels.spmv import vendor


def csr(dtype=np.float64, indptr=np.int32, indices=np.int32):
    return types.SimpleNamespace(data=np.ones(3, dtype), indices=np.array([0, 2, 1], indices),
                                 indptr=np.array([0, 2, 3], indptr), shape=(2, 3))


def test_alg_names():
    assert cpr.check_alg({}) == "default"
    assert cpr.check_alg({"alg": "csr_alg2"}) == "csr_alg2"
    with pytest.raises(ValueError, match=r"params\['alg'\]: expected one of .*'csr_alg3'.*got 'fast'"):
        cpr.check_alg({"alg": "fast"})
    assert cpr.SPMV_ALGS["default"] == cpr.SPMM_ALGS["default"] == 0


@pytest.mark.parametrize("A,reason", [
    (csr(np.float16), "values of float16 (the prepared call takes float32 and float64)"),
    (csr(np.complex128), "values of complex128"),
    (csr(indptr=np.int64), "indptr of int64 with indices of int32 (the prepared call takes int32 or int64 for both)"),
    (csr(indptr=np.int16, indices=np.int16), "indptr of int16 with indices of int16"),
    (types.SimpleNamespace(data=np.ones(1), shape=(1, 1)), "A is not a CSR matrix (data, indices, indptr)"),
    (csr(), "A's data is not a CuPy array"),          # the types are right; the arrays are on the host
    (csr(indptr=np.int64, indices=np.int64), "A's data is not a CuPy array"),
])
def test_why_the_prepared_call_cannot_take_a(A, reason):
    assert reason in cpr.unsupported(A)


def test_without_a_gpu_prepare_records_the_fallback():
    if cpr.bindings()[0] is not None:
        pytest.skip("CuPy's cuSPARSE is here")
    p = get("spmv.cusparse").prepare(csr(), {})
    assert p.meta["fallback"] == "no CuPy with a GPU" and p.meta["cusparse"].fallback == p.meta["fallback"]
    assert p.arrays == {"A": p.arrays["A"]} and p.shape == (2, 3) and p.dtype == np.float64
    assert p.meta["cusparse"].buffer_size_calls == 0
    with pytest.raises(ValueError, match="params"):
        get("spmv.cusparse").prepare(csr(), {"alg": "nope"})


def test_kernel_flags():
    k = get("spmv.cusparse")
    assert isinstance(k, vendor.CusparseSpMV) and k.vendor and k.backend == "gpu"
    assert k.reads_a_at_run and set(k.ops) == {"spmv", "spmm"} and not k.deterministic
    assert list(k.candidates(None, None)) == [{}]     # the model's one: default algorithm, row-major
    assert not hasattr(k, "measure_key")              # timed on the caller's matrix, never by a shape bucket


def test_params_checked_with_their_name():
    assert cpr.check_params({}) == ("default", "row")
    assert cpr.check_params({"alg": "csr_alg3", "order": "col"}) == ("csr_alg3", "col")
    with pytest.raises(ValueError, match=r"params\['order'\]: expected one of \['col', 'row'\], got 'F'"):
        cpr.check_params({"order": "F"})
    with pytest.raises(ValueError, match=r"params\['alg'\]: expected one of"):
        cpr.check_params({"alg": "csr_alg9", "order": "row"})
    with pytest.raises(ValueError, match=r"params: unknown \['W'\]; spmv.cusparse takes 'alg' and 'order'"):
        cpr.check_params({"W": 4})
    with pytest.raises(TypeError, match="params: expected a dict"):
        cpr.check_params([("alg", "default")])
    for bad in ({"order": "C"}, {"alg": "fast"}, {"sorted": True}):
        with pytest.raises(ValueError, match="params"):
            get("spmv.cusparse").prepare(csr(), bad)


def test_configs_leave_defaults_out_and_cover_every_order_and_algorithm():
    assert cpr.config() == {} and cpr.config("default", "col") == {"order": "col"}
    assert cpr.config("csr_alg2", "row") == {"alg": "csr_alg2"}
    assert cpr.configs("spmv") == [{}, {"alg": "csr_alg2"}]
    spmm = cpr.configs("spmm", "float64", "int32")
    want = {(alg, order) for alg in cpr.SPMM_ALGS for order in cpr.ORDERS}
    assert len(spmm) == len(want) == 8 and {cpr.check_params(p) for p in spmm} == want
    assert all(p == cpr.config(*cpr.check_params(p)) for p in spmm)          # one spelling each
    assert spmm[0] == {} and {"order": "col"} in spmm
    with pytest.raises(ValueError, match="op: expected 'spmv' or 'spmm', got 'spgemm'"):
        cpr.configs("spgemm")


def test_a_refused_combination_leaves_the_configs_of_its_dtypes(monkeypatch):
    """cuSPARSE refusing a named algorithm raises (GPU tests) and is recorded: later searches for
    the same value and index types skip it, others keep it."""
    monkeypatch.setattr(cpr, "REFUSED", {("float32", "int64", "col", "csr_alg2")})
    assert {"alg": "csr_alg2", "order": "col"} not in cpr.configs("spmm", np.float32, np.int64)
    assert {"alg": "csr_alg2", "order": "col"} in cpr.configs("spmm", np.float64, np.int64)
    assert len(cpr.configs("spmm", np.float32, np.int64)) == 7


def _features(op, k, **kw):
    from matplan.core.features import Features
    base = dict(dtype="float64", backend="gpu", m=200_000, n=150_000, nnz=2_000_000, index_dtype="int32")
    return Features(op=op, k=k, **{**base, **kw})


def test_search_space_is_the_ops_configs_and_holds_the_candidate():
    from matplan.core import device
    k, dev = get("spmv.cusparse"), device.known("H100")
    for op, kk in (("spmv", 1), ("spmm", 4), ("spmm", 1)):
        f = _features(op, kk)
        space = k.search_space(f, dev)
        assert space == cpr.configs(op, "float64", "int32")
        assert all(c in space for c in k.candidates(f, dev))
        assert all(k.cost(f, p, dev).run_s > 0 for p in space)
    assert k.search_space(_features("spmm", 4, index_dtype=""), dev) == cpr.configs("spmm")


def test_search_space_leaves_column_major_out_from_k_16():
    """Column-major SpMM pays B's and C's copies, which grow with k: searched only below k = 16."""
    from matplan.core import device
    from matplan.kernels.spmv.vendor import SEARCH_COL_MAJOR_BELOW_K
    k, dev = get("spmv.cusparse"), device.known("H100")
    every = cpr.configs("spmm", "float64", "int32")
    assert any(p.get("order") == "col" for p in every)
    for kk in (SEARCH_COL_MAJOR_BELOW_K, 64):
        space = k.search_space(_features("spmm", kk), dev)
        assert space == [p for p in every if p.get("order") != "col"] and {} in space
    assert k.search_space(_features("spmm", SEARCH_COL_MAJOR_BELOW_K - 1), dev) == every


class FakeLib:
    def __init__(self, fail=False):
        self.destroyed, self.fail = [], fail

    def destroySpMat(self, handle):
        self.destroyed.append(("SpMat", handle))
        if self.fail:
            raise RuntimeError("CUSPARSE_STATUS_NOT_INITIALIZED")

    def destroyDnVec(self, handle):
        self.destroyed.append(("DnVec", handle))


def test_descriptors_destroyed_once_when_collected():
    lib = FakeLib()
    d = cpr._Owned(lib, "SpMat", 7)
    v = cpr._Owned(lib, "DnVec", 8)
    v.close()
    v.close()
    assert lib.destroyed == [("DnVec", 8)]
    del d, v
    gc.collect()
    assert lib.destroyed == [("DnVec", 8), ("SpMat", 7)]


def test_a_failing_destroy_is_dropped():
    lib = FakeLib(fail=True)
    d = cpr._Owned(lib, "SpMat", 9)
    del d
    gc.collect()
    assert lib.destroyed == [("SpMat", 9)]


def test_kept_call_dropped_with_its_matrix():
    ref = types.SimpleNamespace()
    vendor._KEPT.put(("k", "default"), (ref, "call"))
    vendor._drop(("k", "default"), object())          # another A's reference: kept
    assert vendor._KEPT.peek(("k", "default")) == (ref, "call")
    vendor._drop(("k", "default"), ref)
    assert vendor._KEPT.peek(("k", "default")) is None


def test_cost_is_the_prepared_calls():
    """The planner costs the prepared call: no per-call descriptors, SpMM on row-major B (each
    nonzero reads its row of B) instead of cupyx's gathers from a column-major copy."""
    from matplan.core import device
    from matplan.core.features import Features
    from matplan.models import spmv as spmv_model, traffic
    dev = device.known("H100")
    f = Features(op="spmm", dtype="float64", backend="gpu", m=524_288, n=524_288, k=16, nnz=7_967_279,
                 index_dtype="int32", col_spread=0.33)
    c = get("spmv.cusparse").cost(f, {}, dev)
    nbytes = traffic.csr_bytes(f) + (f.nnz + f.m) * 16 * 8
    assert c.run_s == pytest.approx(nbytes / (dev.mem_bandwidth * spmv_model.CUSPARSE_PREPARED_SPMM_EFFICIENCY)
                                    + spmv_model.CUSPARSE_PREPARED_OVERHEAD_S)
    assert c.prepare_s == 0 and "row-major" in c.why
    assert c.run_s < spmv_model.cusparse(f, dev).run_s          # cupyx's call costs more
    v = Features(op="spmv", dtype="float64", backend="gpu", m=1_000_000, n=1_000_000, k=1, nnz=6_940_000,
                 index_dtype="int32")
    cv = get("spmv.cusparse").cost(v, {}, dev)
    assert cv.run_s == pytest.approx(traffic.csr_spmm_bytes(v) / (dev.mem_bandwidth
                                                                  * spmv_model.CUSPARSE_PREPARED_SPMV_EFFICIENCY)
                                     + spmv_model.CUSPARSE_PREPARED_OVERHEAD_S)
    assert cv.run_s < spmv_model.cusparse(v, dev).run_s


def test_column_major_costs_the_row_major_call_and_its_two_copies():
    """order="col": B copied to column-major and C back, 2 k (n + m) itemsize bytes at the copy
    bandwidth and a launch each; the algorithms are not modelled apart; SpMV has no order."""
    from matplan.core import device
    from matplan.models import spmv as spmv_model
    dev, kern = device.known("H100"), get("spmv.cusparse")
    for dtype, itemsize in (("float64", 8), ("float32", 4)):
        f = _features("spmm", 16, dtype=dtype)
        row, col = kern.cost(f, {}, dev), kern.cost(f, {"order": "col"}, dev)
        copies = 2 * 16 * (f.n + f.m) * itemsize / dev.mem_bandwidth + 2 * spmv_model.LAUNCH_S
        assert col.run_s == pytest.approx(row.run_s + copies) and col.prepare_s == 0
        assert "column-major" in col.why and "row-major" in row.why
        assert kern.cost(f, {"alg": "csr_alg3"}, dev) == row
        assert kern.cost(f, {"alg": "csr_alg1", "order": "col"}, dev) == col
    v = _features("spmv", 1)
    assert kern.cost(v, {"order": "col"}, dev) == kern.cost(v, {}, dev)
    with pytest.raises(ValueError, match="order: expected 'row' or 'col'"):
        spmv_model.cusparse_prepared(f, dev, "F")


# --- the prepared call's plumbing on NumPy stand-ins for CuPy and cuSPARSE --------------------
# The stand-in cuSPARSE computes with SciPy on the arrays its descriptors point at, after checking
# that each dense descriptor's order and leading dimension describe that array's real layout: the
# orders, kept buffers and copies of PreparedCsr are checked here without a GPU (the GPU tests
# run the real library).
_MEM = {}


class _Ptr:
    def __init__(self, arr):
        self.ptr = arr.__array_interface__["data"][0]


class _FakeArray(np.ndarray):
    @property
    def data(self):            # CuPy's .data.ptr; the stand-in library finds the array by it
        p = _Ptr(self)
        _MEM[p.ptr] = self
        return p


def _fake(a):
    return np.asarray(a).view(_FakeArray)


class _FakeCuPy(types.ModuleType):
    ndarray, int8 = _FakeArray, np.int8

    def __init__(self):
        super().__init__("fakecupy")
        self.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=7),
                                          device=types.SimpleNamespace(get_cusparse_handle=lambda: 1))

    @staticmethod
    def empty(shape, dtype=np.float64, order="C"):
        return np.empty(shape, dtype, order=order).view(_FakeArray)

    @staticmethod
    def ascontiguousarray(a):
        return np.ascontiguousarray(a).view(_FakeArray)


class _FakeCusparse:
    class CuSparseError(RuntimeError):
        pass

    def __init__(self, refuse=()):
        self.h, self.refuse, self.calls = {}, set(refuse), []

    def _new(self, **d):
        self.h[len(self.h) + 1] = d
        return len(self.h)

    def createCsr(self, m, n, nnz, p, i, v, pt, it, base, vt):
        return self._new(kind="csr", shape=(m, n), ptrs=(p, i, v))

    def createDnVec(self, size, ptr, vt):
        return self._new(kind="vec", size=size, ptr=ptr)

    def createDnMat(self, rows, cols, ld, ptr, vt, order):
        return self._new(kind="mat", rows=rows, cols=cols, ld=ld, ptr=ptr, order=order)

    def dnVecSetValues(self, h, ptr):
        self.h[h]["ptr"] = ptr

    dnMatSetValues = dnVecSetValues

    def destroySpMat(self, h):
        pass

    destroyDnVec = destroyDnMat = destroySpMat

    def spMV_bufferSize(self, *args):
        return 16

    def spMM_bufferSize(self, handle, opa, opb, alpha, A, B, beta, C, vt, alg):
        if (self.h[B]["order"], alg) in self.refuse:
            raise self.CuSparseError("CUSPARSE_STATUS_NOT_SUPPORTED")
        return 16

    def _dense(self, h):
        d = self.h[h]
        arr = _MEM[d["ptr"]]
        if d["kind"] == "vec":
            assert arr.shape == (d["size"],)
            return arr
        assert arr.shape == (d["rows"], d["cols"]), (arr.shape, d)
        if d["order"] == cpr.ORDER_ROW:
            assert arr.flags.c_contiguous and d["ld"] == d["cols"], d
        else:
            assert arr.flags.f_contiguous and d["ld"] == d["rows"], d
        return arr

    def _csr(self, h):
        import scipy.sparse as sp
        d = self.h[h]
        p, i, v = (np.asarray(_MEM[x]) for x in d["ptrs"])
        return sp.csr_matrix((v, i, p), shape=d["shape"])

    def spMV(self, handle, op, alpha, A, x, beta, y, vt, alg, buf):
        self._dense(y)[...] = self._csr(A) @ np.asarray(self._dense(x))
        self.calls.append(("spmv", alg))

    def spMM(self, handle, opa, opb, alpha, A, B, beta, C, vt, alg, buf):
        self._dense(C)[...] = self._csr(A) @ np.asarray(self._dense(B))
        self.calls.append((self.h[B]["order"], alg))


@pytest.fixture
def fake(monkeypatch):
    """PreparedCsr on the stand-ins: (the stand-in library, a CSR maker on stand-in arrays)."""
    import scipy.sparse as sp
    lib = _FakeCusparse()
    monkeypatch.setattr(cpr, "cupy_module", _FakeCuPy)
    monkeypatch.setattr(cpr, "bindings", lambda: (lib, None))
    monkeypatch.setattr(cpr, "REFUSED", set())

    def make(rng, m=60, n=40, density=0.1, dtype=np.float64):
        A = sp.random(m, n, density=density, format="csr", random_state=rng, dtype=np.float64).astype(dtype)
        return A, types.SimpleNamespace(data=_fake(A.data), indices=_fake(A.indices), indptr=_fake(A.indptr),
                                        shape=A.shape)
    return lib, make


@pytest.mark.parametrize("alg,order", [(a, o) for o in cpr.ORDERS for a in cpr.SPMM_ALGS])
def test_orders_route_b_and_c_through_kept_buffers_only_where_needed(fake, alg, order):
    lib, make = fake
    rng = np.random.default_rng(5)
    A, Af = make(rng)
    call = cpr.PreparedCsr(Af, alg, order)
    want = "C" if order == "row" else "F"
    for k in (1, 5):
        for b_order in "CF":
            for c_order in "CF":
                X = rng.standard_normal((40, k))
                B = _fake(np.asarray(X, order=b_order))
                out = _fake(np.full((60, k), np.nan, order=c_order))
                assert call.run(Af, B, out) is out
                np.testing.assert_allclose(np.asarray(out), A @ X, rtol=1e-12, atol=1e-12)
                assert lib.calls[-1] == (cpr.ORDERS[order][0], cpr.SPMM_ALGS[alg])
                layout = call._layouts[(k, cpr.ORDERS[order][0], 7)]
                if k > 1 and b_order != want:
                    assert layout.b_buf is not None and layout.b_buf.flags[f"{want}_CONTIGUOUS"]
                if k > 1 and c_order != want:
                    assert layout.c_buf is not None and layout.c_buf.flags[f"{want}_CONTIGUOUS"]
    assert call.buffer_size_calls == 2                    # one per k: the orders of B and out reuse it
    if order == "row":                                     # C-ordered operands never need a buffer
        call2 = cpr.PreparedCsr(Af, alg, order)
        call2.run(Af, _fake(np.ones((40, 3))), _fake(np.empty((60, 3))))
        (layout,) = call2._layouts.values()
        assert layout.b_buf is None and layout.c_buf is None


def test_kept_buffers_are_reused_and_results_stay_right(fake):
    lib, make = fake
    rng = np.random.default_rng(6)
    A, Af = make(rng)
    call = cpr.PreparedCsr(Af, "default", "col")
    X = rng.standard_normal((40, 4))
    call.run(Af, _fake(X), _fake(np.empty((60, 4))))
    (layout,) = call._layouts.values()
    bufs = layout.b_buf, layout.c_buf
    for _ in range(3):
        X = rng.standard_normal((40, 4))
        out = _fake(np.full((60, 4), np.nan))
        call.run(Af, _fake(X), out)
        np.testing.assert_allclose(np.asarray(out), A @ X, rtol=1e-12, atol=1e-12)
        assert layout.b_buf is bufs[0] and layout.c_buf is bufs[1]
    assert call.buffer_size_calls == 1


def test_vectors_and_empty_products(fake):
    lib, make = fake
    rng = np.random.default_rng(7)
    A, Af = make(rng)
    for alg in cpr.SPMV_ALGS:
        call = cpr.PreparedCsr(Af, alg, "col")           # the order does not apply to a vector
        x = rng.standard_normal(40)
        y = call.run(Af, _fake(x))
        np.testing.assert_allclose(np.asarray(y), A @ x, rtol=1e-12, atol=1e-12)
        assert lib.calls[-1] == ("spmv", cpr.SPMV_ALGS[alg])
    with pytest.raises(ValueError, match=r"params\['alg'\]: 'csr_alg3' is not a cuSPARSE SpMV algorithm"):
        cpr.PreparedCsr(Af, "csr_alg3").run(Af, _fake(np.ones(40)))
    with pytest.raises(ValueError, match=r"^out: expected shape \(60, 2\)"):
        cpr.PreparedCsr(Af).run(Af, _fake(np.ones((40, 2))), _fake(np.empty((60, 3))))
    with pytest.raises(ValueError, match="^out: expected dtype float64"):
        cpr.PreparedCsr(Af).run(Af, _fake(np.ones((40, 2))), _fake(np.empty((60, 2), np.float32)))
    with pytest.raises(ValueError, match="^out: expected a C-contiguous or F-contiguous array"):
        cpr.PreparedCsr(Af).run(Af, _fake(np.ones((40, 2))), _fake(np.empty((60, 4)))[:, ::2])
    _, empty = make(rng, density=0.0)
    out = _fake(np.full((60, 3), np.nan, order="F"))
    assert cpr.PreparedCsr(empty, "csr_alg2", "col").run(empty, _fake(np.ones((40, 3))), out) is out
    assert not np.asarray(out).any()


def test_a_refused_named_config_raises_and_a_refused_default_runs_cupyx(fake, monkeypatch):
    lib, make = fake
    lib.refuse = {(cpr.ORDER_COL, cpr.SPMM_ALGS["csr_alg2"]), (cpr.ORDER_ROW, 0)}
    rng = np.random.default_rng(8)
    A, Af = make(rng, dtype=np.float32)
    with pytest.raises(RuntimeError, match=r"spmv.cusparse params \{'alg': 'csr_alg2', 'order': 'col'\}: "
                                           r"cuSPARSE refused B of 3 columns, column-major with alg 'csr_alg2'"):
        cpr.PreparedCsr(Af, "csr_alg2", "col").run(Af, _fake(np.ones((40, 3), np.float32)))
    assert cpr.REFUSED == {("float32", "int32", "col", "csr_alg2")}
    assert {"alg": "csr_alg2", "order": "col"} not in cpr.configs("spmm", np.float32, np.int32)
    assert {"alg": "csr_alg2", "order": "col"} in cpr.configs("spmm", np.float64, np.int32)
    ran = []
    monkeypatch.setattr(cpr, "cupyx_matmul", lambda A_, B, out: ran.append(1) or out)
    call = cpr.PreparedCsr(Af)
    out = _fake(np.empty((60, 3), np.float32))
    assert call.run(Af, _fake(np.ones((40, 3), np.float32)), out) is out and ran == [1]
    (reason,) = call.layout_fallbacks.values()
    assert reason.startswith("cuSPARSE refused B of 3 columns, row-major with alg 'default': CuSparseError")
