"""The prepared cuSPARSE SpMV/SpMM without a GPU: its arguments, the reasons it falls back to
cupyx's call, descriptors destroyed when collected, and the kernel's registration."""
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
    assert list(k.candidates(None, None)) == [{}]     # one candidate: cuSPARSE's default algorithm


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
