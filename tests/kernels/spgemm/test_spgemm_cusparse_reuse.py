"""cuSPARSE SpGEMM reuse, the paths that need no GPU: operand checks naming the operand, finding
the libcusparse CuPy loaded, the reuse symbols missing, cuSPARSE's statuses as errors, and the
clear refusal where CuPy or a GPU is missing."""
import ctypes
import types

import numpy as np
import pytest
import scipy.sparse as sp

from matplan.core.xp import cupy_module
from matplan.kernels.spgemm import cusparse_reuse as reuse


def _csr(m, n, dtype=np.float64, index=np.int32, seed=0):
    A = sp.random(m, n, density=0.2, format="csr", random_state=seed, dtype=np.float64).astype(dtype)
    A.indices, A.indptr = A.indices.astype(index), A.indptr.astype(index)
    return A


def test_operand_checks_name_the_operand():
    A, B = _csr(6, 5), _csr(5, 4)
    assert reuse.check_operands(A, B) == ("float64", "int32")
    assert reuse.check_operands(_csr(6, 5, np.float32, np.int64), _csr(5, 4, np.float32, np.int64)) == \
        ("float32", "int64")
    half = types.SimpleNamespace(data=A.data.astype(np.float16), indices=A.indices, indptr=A.indptr, shape=A.shape)
    with pytest.raises(TypeError, match=r"^A: values of float16; .*float32 or float64"):
        reuse.check_operands(half, B)
    with pytest.raises(TypeError, match=r"^B: values of complex128"):
        reuse.check_operands(A, _csr(5, 4, np.complex128))
    with pytest.raises(TypeError, match=r"^B: indptr of int16 with indices of int16"):
        reuse.check_operands(A, _csr(5, 4, index=np.int16))
    mixed = _csr(5, 4)
    mixed.indptr = mixed.indptr.astype(np.int64)
    with pytest.raises(TypeError, match=r"^B: indptr of int64 with indices of int32; expected int32 or int64 for both"):
        reuse.check_operands(A, mixed)
    with pytest.raises(TypeError, match=r"^A and B: A has float64 values and int32 indices, B float32"):
        reuse.check_operands(A, _csr(5, 4, np.float32))
    with pytest.raises(TypeError, match=r"^A and B: .*int32 indices, B float64 and int64"):
        reuse.check_operands(A, _csr(5, 4, index=np.int64))
    with pytest.raises(ValueError, match=r"^A and B do not conform: A is 6x5, B has 4 rows"):
        reuse.check_operands(A, _csr(4, 4))
    with pytest.raises(TypeError, match=r"^A: expected a CSR matrix .*got ndarray"):
        reuse.check_operands(np.ones((6, 5)), B)
    with pytest.raises(ValueError, match=r"^B: expected a 2-D matrix"):
        reuse.check_operands(A, types.SimpleNamespace(data=B.data, indices=B.indices, indptr=B.indptr, shape=(5,)))


def test_bad_operands_raise_before_any_gpu_is_needed():
    with pytest.raises(TypeError, match=r"^A: values of int64"):
        reuse.PreparedSpGEMMReuse(_csr(6, 5).astype(np.int64), _csr(5, 4))


@pytest.mark.skipif(cupy_module() is not None, reason="CuPy with a GPU is present")
def test_without_cupy_it_refuses_and_says_why():
    assert reuse.unavailable() == "no CuPy with a GPU"
    with pytest.raises(reuse.ReuseUnavailable, match=r"SpGEMM reuse cannot run here: no CuPy with a GPU"):
        reuse.PreparedSpGEMMReuse(_csr(6, 5), _csr(5, 4))


def test_the_loaded_libcusparse_is_found_in_the_maps():
    maps = "\n".join([
        "7f00-7f10 r-xp 00000000 08:01 11 /opt/site-packages/nvidia/cu13/lib/libcusparse.so.12",
        "7f10-7f20 r--p 00010000 08:01 11 /opt/site-packages/nvidia/cu13/lib/libcusparse.so.12",
        "7f20-7f30 r-xp 00000000 08:01 12 /opt/cusparselt/lib/libcusparseLt.so.0",
        "7f30-7f40 r-xp 00000000 08:01 13 /usr/local/cuda/lib64/libcusparse.so.12.5.9.5",
        "7f40-7f50 r-xp 00000000 08:01 14 /usr/lib/libcusparse_static_helper.so",
        "7f50-7f60 rw-p 00000000 00:00 0 ",
        "7f60-7f70 r-xp 00000000 08:01 15 /tmp/with space/libcusparse.so",
        "7f70-7f80 r-xp 00000000 08:01 16 /gone/libcusparse.so.11 (deleted)",
    ])
    assert reuse.cusparse_paths(maps) == ["/opt/site-packages/nvidia/cu13/lib/libcusparse.so.12",
                                          "/usr/local/cuda/lib64/libcusparse.so.12.5.9.5",
                                          "/tmp/with space/libcusparse.so"]
    assert reuse.cusparse_paths("") == []


def test_a_library_without_the_reuse_symbols_is_named_as_such():
    class Empty:                           # none of the four (the process itself may hold CuPy's cuSPARSE)
        pass
    why = reuse.declare(Empty())
    assert why.startswith("lacks ") and all(name in why for name in reuse.SIGNATURES)

    class Partial:                         # a library with two of the four
        cusparseSpGEMMreuse_nnz = ctypes.CDLL(None).abs
        cusparseSpGEMMreuse_copy = ctypes.CDLL(None).labs
    assert reuse.declare(Partial()) == "lacks cusparseSpGEMMreuse_workEstimation, cusparseSpGEMMreuse_compute"
    assert Partial.cusparseSpGEMMreuse_nnz.restype is ctypes.c_int
    assert len(Partial.cusparseSpGEMMreuse_nnz.argtypes) == 14


def test_signatures_follow_cusparse_h():
    sig = reuse.SIGNATURES
    size_p = ctypes.POINTER(ctypes.c_size_t)
    # handle, opA, opB, matA, matB, matC, alg, descr, then (size_t*, void*) per buffer
    assert sig["cusparseSpGEMMreuse_workEstimation"][8:] == (size_p, ctypes.c_void_p)
    assert sig["cusparseSpGEMMreuse_copy"] == sig["cusparseSpGEMMreuse_workEstimation"]
    assert sig["cusparseSpGEMMreuse_nnz"][8:] == (size_p, ctypes.c_void_p) * 3
    # compute: alpha and beta (host pointers) around the operands, computeType before alg, no buffer
    assert sig["cusparseSpGEMMreuse_compute"] == (ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


def test_statuses_become_clear_errors():
    oom = reuse.status_error("cusparseSpGEMMreuse_nnz", 11)
    assert isinstance(oom, MemoryError) and isinstance(oom, reuse.ReuseOutOfMemory)
    assert "cusparseSpGEMMreuse_nnz returned 11 (CUSPARSE_STATUS_INSUFFICIENT_RESOURCES)" in str(oom)
    assert isinstance(reuse.status_error("cusparseSpGEMMreuse_copy", 2), reuse.ReuseOutOfMemory)
    refused = reuse.status_error("cusparseSpGEMMreuse_workEstimation", 10, index="int64")
    assert isinstance(refused, reuse.CusparseReuseError) and refused.status == 10
    assert "refuses int64 indices" in str(refused) and "use int32 indices" in str(refused)
    maybe = reuse.status_error("cusparseSpGEMMreuse_nnz", 7, index="int64")
    assert "may not take" in str(maybe) and "use int32 indices" in str(maybe)
    other = reuse.status_error("cusparseSpGEMMreuse_compute", 3, index="int32")
    assert "CUSPARSE_STATUS_INVALID_VALUE" in str(other) and "int64" not in str(other)
    assert "unknown status" in str(reuse.status_error("cusparseSpGEMMreuse_compute", 99))

    class CupyLib:                         # CuPy's error class names the status where present
        class CuSparseError(RuntimeError):
            def __init__(self, status):
                super().__init__(f"NAME_{status}: message")
    assert "(NAME_7: message)" in str(reuse.status_error("cusparseSpGEMMreuse_nnz", 7, cupy_lib=CupyLib))
