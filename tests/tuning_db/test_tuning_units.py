"""Work units of a tuning run (corpus and files, their keys) and the reference a timed candidate
is checked against."""
import numpy as np
import scipy.sparse as sp
import pytest

from matplan.tuning_db import reference as reference_mod
from matplan.tuning_db import units as units_mod
from conftest import random_csr


def test_max_error_dense_and_sparse(rng):
    A = random_csr(rng, 40, 30, 0.2)
    x = rng.random(30) - 0.5
    ref, bound = reference_mod.reference(A, x)
    assert reference_mod.max_error(A @ x, ref, bound) < 1e-15
    y = A @ x
    y[3] = np.nan
    assert reference_mod.max_error(y, ref, bound) == np.inf
    assert reference_mod.max_error(y[:-1], ref, bound) == np.inf
    B = random_csr(rng, 30, 20, 0.2)
    ref, bound = reference_mod.reference(A, B)
    C = (A @ B).tocsr()
    assert reference_mod.max_error(C, ref, bound) < 1e-15
    extra = C.tolil()
    i, j = np.argwhere(bound.toarray() == 0)[0]
    extra[i, j] = 1e-3                                      # an entry where the product has none
    assert reference_mod.max_error(extra.tocsr(), ref, bound) == np.inf
    C2 = C.copy()
    C2.data[0] *= 1.01
    assert reference_mod.max_error(C2, ref, bound) > 1e-4
    C2.data[0] = np.nan
    assert reference_mod.max_error(C2, ref, bound) == np.inf
    P = abs(A)                                              # non-negative operands: the scale is the product
    ref, bound = reference_mod.reference(P, P.T.tocsr())
    assert bound is ref
    assert reference_mod.max_error((P @ P.T).astype(np.float32), ref, bound) < 1e-6


def test_units_cover_families_ops_and_dtypes():
    units = units_mod.corpus_units(["small"], families=["rmat", "tall_skinny"], dtypes=("float64", "float32"))
    keys = [u.key for u in units]
    assert len(keys) == len(set(keys))
    assert {u.op for u in units} == {"spmv", "spmm", "spgemm", "tsgemm"}
    assert {u.dtype for u in units} == {"float64", "float32"}
    # tsgemm k respects the tall-and-skinny aspect rule for n=256 (k <= 16)
    assert {u.k for u in units if u.op == "tsgemm"} == {1, 2, 4, 8, 16}
    assert {u.layout for u in units if u.op == "tsgemm"} == {"C", "F"}
    A, B = next(u for u in units if u.op == "tsgemm" and u.layout == "F").build()
    assert A.flags.f_contiguous and not A.flags.c_contiguous
    rect = units_mod.corpus_units(["small"], families=["rect_skinny"], dtypes=("float32",), tsgemm_ks=(4, 256))
    assert {(u.matrix, u.family, u.k) for u in rect} == {("rect_skinny-small", "rect_skinny", 4)}
    A, B = rect[0].build()
    assert A.shape == (1024, 2048) and B.shape == (2048, 4) and A.dtype == np.float32
    both = units_mod.corpus_units(["medium", "spgemm"], families=["rmat"], ops=("spgemm",), dtypes=("float64",))
    from matplan import corpus
    same = corpus.SIZES["medium"]["rmat"] == corpus.SIZES["spgemm"]["rmat"]
    assert len(both) == (1 if same else 2)                  # the same matrix is tuned once
    with pytest.raises(ValueError, match="not a corpus size"):
        units_mod.corpus_units(["huge"])
    A, B = next(u for u in units if u.op == "spmm" and u.dtype == "float32").build()
    assert A.dtype == B.dtype == np.float32 and B.shape == (A.shape[1], 4) and np.all(B != 0)


def test_unit_keys_parse_back(tmp_path):
    units = units_mod.corpus_units(["small"], families=["rmat", "tall_skinny"], tsgemm_ks=(4,))
    units += units_mod.file_units([_mtx(tmp_path)], ops=("spmm",), spmm_ks=(4,))
    for u in units:
        assert units_mod.WorkUnit.from_key(u.key, family=u.family, matrix=u.matrix) == u
    with pytest.raises(ValueError, match="source: 'nonsense' is not a work unit key"):
        units_mod.WorkUnit.from_key("nonsense")


def _mtx(tmp_path):
    from matplan.corpus import write_mtx
    return write_mtx(tmp_path / "m.mtx", sp.random(50, 50, density=0.1, format="csr", random_state=0))
