"""The cp.async row-major TSM2 prototype (matplan/kernels/tsm2_async.py) against NumPy float64
on fresh random data (GPU only; skipped without CuPy). Outputs are NaN-poisoned before each run
so unwritten elements show."""
import numpy as np
import pytest
from conftest import check_dense_product, nonzero_random as _random

from matplan.kernels.tsgemm import tsm2_async

pytestmark = pytest.mark.gpu

KS = (1, 2, 3, 8, 16, 33, 64)
DTYPES = (np.float32, np.float64)
#: Error allowed relative to (|A| @ |B|) (the magnitude of the sum), times a small factor.
RTOL = {np.float32: 1e-4, np.float64: 1e-12}


def _check(C, A_host, B_host, dtype):
    check_dense_product(C, A_host, B_host, RTOL[dtype])


def _run(cp, A, B, config=None):
    out = cp.full((A.shape[0], B.shape[1]), cp.nan, dtype=A.dtype)
    C = tsm2_async.matmul_rowmajor_async(A, B, out=out, config=config)
    assert C is out
    return C


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", KS)
def test_async_matches_numpy(cp, rng, dtype, k):
    """Default config: m != n, neither a multiple of the rows per block (64) or the tile (32/64
    columns); k = 33, 64: several passes over A, the last one partial."""
    m, n = 1531, 1036                   # n * itemsize % 16 == 0 (rows 16-byte aligned)
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    C = _run(cp, cp.asarray(A_h), cp.asarray(B_h))
    _check(C, A_h, B_h, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", (4, 8, 16, 32))
def test_async_presets_and_variants(cp, rng, dtype, k):
    """Every preset bucket plus knob variants (stages 2..5, wider tiles, one warp per block: the
    direct store without the cross-warp reduction, scalar B copies, no register cap, tiles whose
    swizzle mask is 0, 1 or 3)."""
    m, n = 517, 2052
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    A, B = cp.asarray(A_h), cp.asarray(B_h)
    base = tsm2_async.default_config(dtype, k)
    v = 16 // np.dtype(dtype).itemsize
    variants = [{}, {"stages": 2}, {"stages": 3}, {"stages": 5}, {"tj": 2 * base["tj"], "stages": 3},
                {"wr": 1, "wj": 1, "tj": 8 * v}, {"wj": 2, "tj": 4 * v}, {"bvec": 1}, {"minb": 1},
                # the stage's swizzle: none (3 chunks a row), row % 2 (6 chunks), row % 4 (tr = 4)
                {"wj": 1, "tj": 3 * v}, {"wj": 2, "tj": 6 * v}, {"tr": 4, "rr": 8}]
    for var in variants:
        C = _run(cp, A, B, dict(var))
        _check(C, A_h, B_h, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_async_row_padded_view_with_partial_chunk(cp, rng, dtype):
    """A a view of a wider array (lda > n, rows 16-byte aligned) whose n ends mid 16-byte chunk:
    the copy of the last chunk reads only the bytes left in the row (rest zero-filled)."""
    m, n, k = 700, 1001, 16
    base_h = _random(rng, (m, 1008), dtype)
    A_h = base_h[:, :n]
    B_h = _random(rng, (n, k), dtype)
    base = cp.asarray(base_h)
    A = base[:, :n]
    assert not A.flags.c_contiguous
    _check(_run(cp, A, cp.asarray(B_h)), A_h, B_h, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_async_small_and_edge_shapes(cp, rng, dtype):
    """Fewer rows than a block, a single row, n shorter than a tile, k = 1, strided output."""
    for m, n, k in ((1, 1024, 3), (5, 8, 1), (63, 40, 16), (65, 4, 32), (200, 4096, 5)):
        A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
        _check(_run(cp, cp.asarray(A_h), cp.asarray(B_h)), A_h, B_h, dtype)
    m, n, k = 300, 1024, 8
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    big = cp.full((m, 2 * k), cp.nan, dtype=dtype)
    out = big[:, ::2]
    C = tsm2_async.matmul_rowmajor_async(cp.asarray(A_h), cp.asarray(B_h), out=out)
    _check(C, A_h, B_h, dtype)
    assert cp.isnan(big[:, 1::2]).all(), "wrote outside the output view"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize("k", (8, 16, 20))
def test_async_whole_tiles_in_padded_views(cp, rng, dtype, col, k):
    """The whole-tile copy path (every band and tile inside A: m and n multiples of the block's
    rows and the tile's columns) and the general one (m, n one chunk short) on views whose leading
    dimension exceeds the rows (column-major) or columns (row-major), both layouts; at k = 20 the
    pass's B slice is partial (32 columns a pass: the general B path beside whole A tiles)."""
    cfg = tsm2_async.default_config(dtype, k, col)
    sh = tsm2_async.shape_of(cfg, np.dtype(dtype).itemsize, col)
    v = sh["vec"]
    for m, n in ((4 * sh["rows"], 6 * cfg["tj"]), (4 * sh["rows"] - v, 6 * cfg["tj"] - v)):
        pad = 2 * v                                       # leading dimension 16-byte aligned, > extent
        big_h = _random(rng, (m + pad, n) if col else (m, n + pad), dtype)
        A_h = big_h[:m, :] if col else big_h[:, :n]
        big = cp.asfortranarray(cp.asarray(big_h)) if col else cp.asarray(big_h)
        A = big[:m, :] if col else big[:, :n]
        assert not (A.flags.c_contiguous or A.flags.f_contiguous)
        B_h = _random(rng, (n, k), dtype)
        B = cp.asarray(B_h)
        C = cp.full((m, k), cp.nan, dtype=dtype)
        tsm2_async.AsyncLaunch(A, B, C, col=col)(A, B, C)
        _check(C, A_h, B_h, dtype)


def test_async_is_deterministic(cp, rng):
    A = cp.asarray(_random(rng, (2000, 3000), np.float32))
    B = cp.asarray(_random(rng, (3000, 16), np.float32))
    assert cp.array_equal(_run(cp, A, B), _run(cp, A, B))


def test_async_rejects_bad_inputs(cp, rng):
    A = cp.asarray(_random(rng, (300, 400), np.float32))
    B = cp.asarray(_random(rng, (400, 4), np.float32))
    f = tsm2_async.matmul_rowmajor_async
    with pytest.raises(ValueError, match="unit stride"):
        f(A[:, ::2], cp.ascontiguousarray(B[::2]))            # strided columns
    with pytest.raises(ValueError, match="unit stride"):
        f(cp.asfortranarray(A), B)                            # column-major
    with pytest.raises(ValueError, match="16-byte"):
        f(A[:, 1:], B[1:])                                    # data pointer 4 bytes past alignment
    A_odd = cp.asarray(_random(rng, (300, 401), np.float32))  # rows of 1604 bytes
    with pytest.raises(ValueError, match="16-byte"):
        f(A_odd, cp.asarray(_random(rng, (401, 4), np.float32)))
    with pytest.raises(ValueError, match="^B: dtype"):
        f(A, B.astype(np.float64))
    with pytest.raises(ValueError, match="^B: expected 400 rows"):
        f(A, B[:399])
    with pytest.raises(ValueError, match="^B: must be C-contiguous"):
        f(A, cp.asfortranarray(cp.asarray(_random(rng, (400, 4), np.float32))))
    with pytest.raises(ValueError, match="^A: dtype"):
        f(A.astype(np.int32), B)
    with pytest.raises(ValueError, match="^A: expected a CuPy array"):
        f(A.get(), B)
    with pytest.raises(ValueError, match="^B: expected a 2-D"):
        f(A, B[:, 0])
    with pytest.raises(ValueError, match="^out: expected shape"):
        f(A, B, out=cp.empty((300, 5), np.float32))
    with pytest.raises(ValueError, match="^config: cc"):
        f(A, B, config={"cc": 3})


def test_async_fallback_for_unaligned_rows(cp, rng):
    """fallback=True runs TSM2's register kernel (no planner) instead of refusing."""
    A_h, B_h = _random(rng, (300, 401), np.float64), _random(rng, (401, 4), np.float64)
    A = cp.asarray(A_h)[:, :]                       # rows of 3208 bytes: not 16-byte multiples
    with pytest.raises(ValueError, match="16-byte"):
        tsm2_async.matmul_rowmajor_async(A, cp.asarray(B_h))
    C = tsm2_async.matmul_rowmajor_async(A, cp.asarray(B_h), fallback=True)
    _check(C, A_h, B_h, np.float64)
