"""CPU tests of SpGEMM row panels: panel_bounds (NumPy), the panel-count prediction in the cost
explanation, host memory and argument checks (no GPU needed)."""
import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

import matplan.kernels.spgemm as hs
from matplan.kernels.spgemm import kernel, panels
from matplan.core import device as device_mod
from matplan.core import features as stats
from matplan.core.validation import normalize

INT32_MAX = 2 ** 31 - 1


def _indptr(row_nnz):
    return np.concatenate([[0], np.cumsum(np.asarray(row_nnz, dtype=np.int64))])


def _check_bounds(indptr, bounds, max_nnz, max_bytes=None, itemsize=8):
    """Panels cover the rows exactly once, respect both limits and are maximal (greedy)."""
    m = indptr.size - 1
    assert bounds[0] == 0 and bounds[-1] == m and np.all(np.diff(bounds) > 0)
    assert bounds.dtype == np.int64
    nnz = indptr[bounds[1:]] - indptr[bounds[:-1]]
    rows = np.diff(bounds)
    assert nnz.sum() == indptr[-1]
    assert np.all(nnz <= max_nnz)
    if max_bytes is not None:
        assert np.all(panels.panel_bytes(nnz, rows, itemsize) <= max_bytes)
    for r0, r1 in zip(bounds[:-2], bounds[1:-1]):     # one more row would break a limit
        more = indptr[r1 + 1] - indptr[r0]
        over_nnz = more > max_nnz
        over_bytes = max_bytes is not None and panels.panel_bytes(more, r1 + 1 - r0, itemsize) > max_bytes
        assert over_nnz or over_bytes, f"panel [{r0}, {r1}) could take row {r1}"


@pytest.mark.parametrize("max_nnz", [1, 7, 50, 333, 10 ** 9])
def test_bounds_nnz_limit(max_nnz):
    rng = np.random.default_rng(max_nnz)
    row_nnz = rng.integers(0, 8, 1000)
    row_nnz[rng.random(1000) < 0.3] = 0                  # empty rows, some in runs
    row_nnz[100:140] = 0
    row_nnz[rng.random(1000) < 0.01] = 1 if max_nnz == 1 else 0
    if max_nnz == 1:
        row_nnz = np.minimum(row_nnz, 1)
    indptr = _indptr(row_nnz)
    bounds = panels.panel_bounds(indptr, max_nnz)
    _check_bounds(indptr, bounds, max_nnz)
    if max_nnz >= indptr[-1]:
        assert list(bounds) == [0, 1000]


@pytest.mark.parametrize("itemsize", [4, 8])
def test_bounds_byte_limit(itemsize):
    rng = np.random.default_rng(itemsize)
    row_nnz = rng.integers(0, 40, 2000)
    row_nnz[500:900] = 0
    indptr = _indptr(row_nnz)
    max_bytes = 20 * panels.panel_bytes(40, 1, itemsize)
    bounds = panels.panel_bounds(indptr, INT32_MAX, max_bytes, itemsize)
    _check_bounds(indptr, bounds, INT32_MAX, max_bytes, itemsize)
    both = panels.panel_bounds(indptr, 300, max_bytes, itemsize)   # both limits at once
    _check_bounds(indptr, both, 300, max_bytes, itemsize)
    assert len(both) >= len(bounds)


def test_byte_limit_cuts_a_run_of_empty_rows():
    """Empty rows cost PANEL_ROW_BYTES each: a long empty run is split, boundaries land inside it."""
    row_nnz = np.zeros(100, dtype=np.int64)
    row_nnz[0] = row_nnz[99] = 5
    indptr = _indptr(row_nnz)
    max_bytes = 10 * panels.PANEL_ROW_BYTES + panels.panel_bytes(5, 0, 8)
    bounds = panels.panel_bounds(indptr, INT32_MAX, max_bytes, 8)
    _check_bounds(indptr, bounds, INT32_MAX, max_bytes)
    inside = [b for b in bounds[1:-1] if row_nnz[b - 1] == 0 and row_nnz[b] == 0]
    assert inside, "some boundary falls strictly inside the run of empty rows"
    all_empty = panels.panel_bounds(np.zeros(51, np.int64), 10, 10 * panels.PANEL_ROW_BYTES)
    assert list(all_empty) == [0, 10, 20, 30, 40, 50]
    assert list(panels.panel_bounds(np.zeros(51, np.int64), 10)) == [0, 50]   # no byte limit: one panel


def test_bounds_are_exact_on_a_hand_example():
    indptr = _indptr([3, 0, 4, 2, 0, 0, 5, 1])
    # 3+0 (row 2 would make 7) | 4 (4+2 > 5) | 2+0+0 (then 5 more) | 5 | 1
    assert list(panels.panel_bounds(indptr, 5)) == [0, 2, 3, 6, 7, 8]
    assert list(panels.panel_bounds(indptr, 6)) == [0, 2, 6, 8]           # 3+0 | 4+2+0+0 | 5+1


def test_single_row_past_the_limit_names_it():
    indptr = _indptr([1, 2, 9, 1])
    with pytest.raises(ValueError, match=r"row 2 of C alone has 9 nonzeros.*limit of 5 nonzeros"):
        panels.panel_bounds(indptr, 5)
    with pytest.raises(ValueError, match=r"row 2 .* bytes"):
        panels.panel_bounds(indptr, 100, panels.panel_bytes(5, 1, 8))


def test_bounds_edge_cases_and_bad_arguments():
    assert list(panels.panel_bounds(np.zeros(1, np.int64), 5)) == [0]          # no rows: no panel
    assert list(panels.panel_bounds(_indptr([5]), 5)) == [0, 1]                 # exactly at the limit
    assert list(panels.panel_bounds(_indptr([5]), np.int64(5))) == [0, 1]       # NumPy integers too
    for bad in (0, -3, True, 2.5, 5.0):
        with pytest.raises(ValueError, match="max_nnz"):
            panels.panel_bounds(_indptr([1]), bad)
    with pytest.raises(ValueError, match="max_bytes"):
        panels.panel_bounds(_indptr([1]), 5, 0)
    for bad in ([1, 2], [0, 3, 2], [[0, 1]]):
        with pytest.raises(ValueError, match="indptr"):
            panels.panel_bounds(np.array(bad), 5)


def test_int32_split_of_a_wordnet_sized_output():
    """117,659 rows, 8.76e9 nonzeros (wordnet A·Aᵀ): every panel < 2^31, as few as int32 allows."""
    rng = np.random.default_rng(0)
    row_nnz = rng.integers(0, 2 * 74_420, 117_659).astype(np.int64)
    indptr = _indptr(row_nnz)
    assert indptr[-1] > 4 * INT32_MAX
    bounds = panels.panel_bounds(indptr, INT32_MAX)
    _check_bounds(indptr, bounds, INT32_MAX)
    assert len(bounds) - 1 == -(-indptr[-1] // INT32_MAX)   # rows are small: no panel wasted


def test_predict_panels():
    assert panels.predict_panels(1e6, 1000, 8, 80e9) == (1, "")
    n, why = panels.predict_panels(14_404_683_313 / np.pi, 117_659, 8, None)   # wordnet, memory unknown
    assert n == 3 and "2^31 - 1" in why and "spgemm_panels" in why and "out='host'" in why
    n, why = panels.predict_panels(14_404_683_313 / np.pi, 117_659, 8, 78e9)
    assert n == 3 and "of free device memory" not in why    # 55 GB < 90% of 78 GB: int32 alone
    n, why = panels.predict_panels(1.9e9, 1000, 8, 10e9)                       # fits int32, not memory
    assert n == -(-int(panels.panel_bytes(1.9e9, 1001, 8)) // int(panels.PANEL_MEM_FRACTION * 10e9))
    assert "2^31" not in why.split("->")[0] and "10.0 GB of free device memory" in why


def test_cost_explains_panels_when_products_predict_them():
    h100 = device_mod.known("H100")
    A = sp.random(300, 300, density=0.01, format="csr", random_state=0) + sp.eye(300)
    f = stats.compute(normalize(A.tocsr(), A.tocsr()), h100)
    c = kernel.HashSpGEMM().cost(f, {"sort": True}, h100)
    assert "row panels" not in c.why
    big = dataclasses.replace(f, products=14_404_683_313, m=117_659, k=117_659, compression=0.0)  # wordnet A·Aᵀ
    c = kernel.HashSpGEMM().cost(big, {"sort": True}, h100)
    assert "about 3 row panels" in c.why and "int32 indptr" in c.why and "products / pi" in c.why
    # its sampled compression (1.42; exact 1.645): C of ~10^10 nonzeros, 5 panels
    c = kernel.HashSpGEMM().cost(dataclasses.replace(big, compression=1.42), {"sort": True}, h100)
    assert "about 5 row panels" in c.why and "products / 1.42, the sampled compression" in c.why


def test_host_available_bytes_is_plausible():
    avail = panels.host_available_bytes()
    assert 0 < avail <= 1 << 50


def test_argument_checks_before_any_gpu_work():
    A = sp.eye(3, format="csr")
    with pytest.raises(ValueError, match="out"):
        hs.spgemm(A, A, out="disk")
    with pytest.raises(ValueError, match="max_panel_nnz"):
        hs.spgemm(A, A, out="host", max_panel_nnz=0)
    with pytest.raises(ValueError, match="max_panel_nnz.*2\\^31"):
        hs.spgemm(A, A, out="host", max_panel_nnz=2 ** 31)
    with pytest.raises(ValueError, match="max_panel_bytes"):
        hs.spgemm(A, A, out="host", max_panel_bytes=-1)
    with pytest.raises(ValueError, match="only with out='host'"):
        hs.spgemm(A, A, max_panel_nnz=10)
    with pytest.raises(ValueError, match="max_panel_nnz"):
        hs.spgemm_panels(A, A, max_panel_nnz=1.5)
