"""Fixtures and checks the hash SpGEMM's GPU tests share (test_spgemm_gpu.py,
test_spgemm_onepass_gpu.py, test_spgemm_panels_gpu.py)."""
import numpy as np
import pytest
import scipy.sparse as sp

import matplan.kernels.spgemm as spgemm
from matplan.kernels.spgemm import global_rows, guesses


@pytest.fixture
def hs(cp, monkeypatch):
    """The spgemm package, the memory pool poisoned and guessed analyses off."""
    # poison the memory pool so entries the kernels fail to write show up as NaN / garbage
    junk = cp.full(1 << 26, np.nan)
    del junk
    # no guessed analyses: these tests change the module's settings between calls of the same
    # operands, which a kept analysis would not see (test_spgemm_guess_gpu.py tests the guesses)
    spgemm.forget_guesses()
    monkeypatch.setattr(guesses, "GUESS_CACHE_SIZE", 0)
    return spgemm


@pytest.fixture(params=["slabs", "segments", "segments-walk"])
def global_path(request, hs, monkeypatch):
    """The global path a test takes: numeric by column segments in shared memory (forced however
    few rows there are), symbolic by bitmaps in shared memory; or numeric by dense slabs and
    symbolic by bitmaps in global memory (segments and shared bitmaps off). Segments read only
    their part of each sorted B row (rows of at least 32 A nonzeros and 32 products a nonzero a
    segment), or ("segments-walk") walk all of a row's products. The other rows take symbolic tables whatever their size
    (test_symbolic_bitmap_rows has the bitmaps for them)."""
    segments = request.param.startswith("segments")
    monkeypatch.setattr(global_rows, "GLOBAL_SEG_B_ROWS", request.param == "segments")
    monkeypatch.setattr(global_rows, "SYMBOLIC_GLOBAL_SHARED", segments)
    monkeypatch.setattr(global_rows, "SYMBOLIC_BITMAP_RATIO", float("inf"))   # symbolic tables, which overflow
    monkeypatch.setattr(global_rows, "GLOBAL_SEG_MIN_BLOCKS_PER_SM", 0.0 if segments else float("inf"))
    monkeypatch.setattr(global_rows, "GLOBAL_SEG_MAX_SEGMENTS", 1 << 30)   # many segments a row: the look-back's chains
    return request.param


def _check_global_path(info, global_path, b_sorted=None):
    """The global rows went the fixture's way (segments: over B's rows where ``b_sorted``, by the
    walk where it is False; None: either)."""
    assert info["global_rows_numeric"] > 0
    assert ("global_segments" in info) == global_path.startswith("segments")
    if global_path == "segments-walk" or (global_path == "segments" and b_sorted is False):
        assert info["global_segment_walk"] == "products"
    elif global_path == "segments" and b_sorted:
        assert info["global_segment_walk"] == "B rows"


def _dev(cp, M, dtype=np.float64):
    """M on the GPU as it is: duplicates and order kept (SciPy's astype would sum duplicates)."""
    import cupyx.scipy.sparse as csp
    M = sp.csr_matrix(M)
    return csp.csr_matrix((cp.asarray(M.data.astype(dtype)), cp.asarray(M.indices), cp.asarray(M.indptr)),
                          shape=M.shape)


def _check_canonical(C):
    """Every row's columns strictly increasing, all in range, values finite."""
    assert np.all(np.isfinite(C.data))
    assert C.indices.size == 0 or (C.indices.min() >= 0 and C.indices.max() < C.shape[1])
    d = np.diff(C.indices.astype(np.int64))
    row_start = np.zeros(C.indices.size, bool)
    row_start[C.indptr[1:-1][C.indptr[1:-1] < C.indices.size]] = True
    assert np.all((d > 0) | row_start[1:])


def _check(cp, hs, A, B, dtype=np.float64, sort=True, **kw):
    """C from the GPU == SciPy's float64 product; C's pattern is the symbolic product's. Unless
    the caller names ``passes`` or another output form, both paths run: passes='two' (its C and
    info are returned) and the default 'auto' (the one-pass path where the rows' bounds allow)."""
    info = {}
    both = "passes" not in kw and kw.get("out", "device") == "device"
    C = _check_one(cp, hs, A, B, dtype, sort, info, **(dict(kw, passes="two") if both else kw))
    if both:
        auto = {}
        _check_one(cp, hs, A, B, dtype, sort, auto, **kw)
        assert auto["nnz_c"] == info["nnz_c"]
    return C, info


def _check_one(cp, hs, A, B, dtype, sort, info, **kw):
    C = hs.spgemm(_dev(cp, A, dtype), _dev(cp, B, dtype), sort=sort, info=info, **kw).get()
    A64, B64 = sp.csr_matrix(A, dtype=np.float64), sp.csr_matrix(B, dtype=np.float64)
    ref = (A64 @ B64).tocsr()
    ref.sum_duplicates()
    assert C.shape == ref.shape and C.dtype == np.dtype(dtype)
    if sort:
        _check_canonical(C)
    pattern = (abs(A64).astype(bool).astype(np.float64) @ abs(B64).astype(bool).astype(np.float64))
    assert C.nnz == pattern.nnz, "C must store exactly the symbolic product's pattern"
    scale = (abs(A64) @ abs(B64)).max() if ref.nnz else 1.0
    tol = (1e-5 if np.dtype(dtype) == np.float32 else 1e-12) * max(scale, 1.0)
    Cs = sp.csr_matrix(C, dtype=np.float64)
    Cs.sum_duplicates()
    assert Cs.nnz == C.nnz, "no duplicate columns in a row"
    diff = (Cs - ref)
    assert diff.nnz == 0 or abs(diff.data).max() <= tol
    return C


def _rows_csr(rows, n, rng):
    """CSR of the given column lists as they are (duplicates and order kept), values never zero."""
    indices = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows])
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    data = (rng.random(indices.size) + 0.5) * rng.choice([-1.0, 1.0], indices.size)
    return sp.csr_matrix((data, indices, indptr), shape=(len(rows), n))
