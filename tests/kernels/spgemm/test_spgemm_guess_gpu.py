"""GPU tests of spgemm's guessed analyses (guesses._GUESSES): a repeated one-pass call goes on
from the analysis it read last time, checked on the GPU; its first guessed call records its
launches as a CUDA graph, later ones replay it. Every result is compared with SciPy in float64,
the pool poisoned before the call so an unwritten entry shows."""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import messy_csr, random_csr
import matplan.kernels.spgemm as spgemm
from matplan.kernels import get as get_kernel
from matplan.kernels.spgemm import global_rows as glob_rows, guesses, rules
from spgemm_gpu_helpers import _dev

pytestmark = pytest.mark.gpu


@pytest.fixture
def hs(cp):
    spgemm.forget_guesses()
    yield spgemm
    spgemm.forget_guesses()


def _call(cp, hs, A, B, **kw):
    """spgemm(A, B) after poisoning the pool; (C on the host, info)."""
    junk = cp.full(1 << 24, np.nan)
    del junk
    info = {}
    C = hs.spgemm(A, B, info=info, **kw)
    return C.get(), info


def _check(C, A, B, rtol):
    ref = (A.get() @ B.get()).toarray()
    assert np.all(np.isfinite(C.data))
    np.testing.assert_allclose(C.toarray(), ref, rtol=rtol, atol=rtol)
    assert C.has_sorted_indices


def _fixed_rows(rng, m, n, per_row, dtype=np.float64):
    """m x n CSR, exactly per_row distinct sorted columns a row, values never zero."""
    cols = np.sort(np.stack([rng.choice(n, per_row, replace=False) for _ in range(m)]), axis=1)
    data = (rng.random(m * per_row) + 0.5) * rng.choice([-1.0, 1.0], m * per_row)
    return sp.csr_matrix((data.astype(dtype), cols.ravel().astype(np.int32),
                          np.arange(0, m * per_row + 1, per_row, dtype=np.int32)), shape=(m, n))


def _graphs(hs):
    return sum(e.recorded is not None for e in guesses._GUESSES.values())


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-4)])
def test_calls_guessed_recorded_and_replayed(cp, hs, rng, monkeypatch, dtype, rtol, direct):
    """First call unguessed, second records the one-pass graph; with DIRECT_GUESSES the third
    records the direct graph (C written at the offsets the second gave), later ones replay it.
    Every earlier result is kept and checked again after the last (each replay writes new arrays)."""
    from matplan.kernels import _graph
    monkeypatch.setattr(guesses, "DIRECT_GUESSES", direct)
    A = _dev(cp, random_csr(rng, 3000, 2000, 0.002), dtype)
    B = _dev(cp, random_csr(rng, 2000, 1500, 0.003), dtype)
    results = []
    for i in range(6):
        junk = cp.full(1 << 24, np.nan)
        del junk
        info = {}
        results.append(hs.spgemm(A, B, info=info))
        assert info["one_pass"] and info["guessed"] is (i > 0) and info["direct"] is (direct and i > 1)
    assert _graphs(hs) == (1 if _graph.available() else 0)
    for C in results:
        _check(C.get(), A, B, rtol)
    for part in ("indptr", "indices", "data"):
        assert len({int(getattr(C, part).data.ptr) for C in results}) == len(results)


@pytest.mark.parametrize("grouping", ["balanced", "grouped"])
def test_replays_of_grouped_rows(cp, hs, rng, grouping):
    """Rows of several numeric_esc classes (grouped: a launch a class) replayed alike."""
    lengths = rng.integers(0, 12, 2500)
    lengths[::7] = 0
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    indices = rng.integers(0, 2500, indptr[-1]).astype(np.int32)
    A = _dev(cp, sp.csr_matrix(((rng.random(indptr[-1]) + 0.5), indices, indptr), shape=(2500, 2500)))
    for _ in range(4):
        C, info = _call(cp, hs, A, A, grouping=grouping)
        _check(C, A, A, 1e-12)
    assert info["guessed"] and len(info["esc_rows"]) >= (2 if grouping == "grouped" else 1)


def test_messy_operands_guessed(cp, hs, rng):
    """Empty rows, duplicate and unsorted indices: the guessed call sums them like the first."""
    A = _dev(cp, messy_csr(rng, 400, 300))
    B = _dev(cp, random_csr(rng, 300, 200, 0.01))
    C1, info1 = _call(cp, hs, A, B)
    assert info1["one_pass"]   # its long row on the global path
    C2, info2 = _call(cp, hs, A, B)
    assert info2["guessed"]
    _check(C2, A, B, 1e-12)
    np.testing.assert_array_equal(C1.indptr, C2.indptr)


def test_values_changed_in_place_still_guessed(cp, hs, rng):
    A = _dev(cp, random_csr(rng, 2000, 2000, 0.003))
    _call(cp, hs, A, A)
    A.data *= -2.5
    C, info = _call(cp, hs, A, A)
    assert info["guessed"]
    _check(C, A, A, 1e-12)


@pytest.mark.parametrize("recorded", [False, True])
def test_pattern_changed_in_place_refutes_the_guess(cp, hs, rng, recorded):
    """A's columns rewritten in place (same arrays, same nnz) over B rows of other lengths: the
    GPU refutes the guess (before or after its graph was recorded), the call reruns unguessed and
    is right; the next call guesses again."""
    m, n = 2000, 1000
    A_host = _fixed_rows(rng, m, n, 4)
    lengths = np.where(np.arange(n) < n // 2, 2, 9)   # B rows of 2 or 9 entries
    Bp = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    Bj = np.concatenate([np.sort(rng.choice(800, L, replace=False)) for L in lengths]).astype(np.int32)
    B = _dev(cp, sp.csr_matrix((rng.random(Bp[-1]) + 0.5, Bj, Bp), shape=(n, 800)))
    A = _dev(cp, A_host)
    _call(cp, hs, A, B)
    if recorded:
        _call(cp, hs, A, B)
        _call(cp, hs, A, B)
    A.indices[:] = cp.asarray(np.sort(rng.integers(n // 2, n, (m, 4)), axis=1).ravel().astype(np.int32))
    C, info = _call(cp, hs, A, B)
    assert info["guessed"] is False
    _check(C, A, B, 1e-12)
    C, info = _call(cp, hs, A, B)
    assert info["guessed"] is True
    _check(C, A, B, 1e-12)


def test_same_analysis_other_pattern_is_right(cp, hs, rng):
    """A's columns rewritten in place over B rows all of one length: the analysis (products per
    row) is the same, so the guess stands, and the result is the new A's (the kernels read A)."""
    A = _dev(cp, _fixed_rows(rng, 1500, 900, 5))
    B = _dev(cp, _fixed_rows(rng, 900, 700, 6))
    _call(cp, hs, A, B)
    A.indices[:] = cp.asarray(_fixed_rows(rng, 1500, 900, 5).indices)
    C, info = _call(cp, hs, A, B)
    assert info["guessed"]
    _check(C, A, B, 1e-12)


@pytest.mark.parametrize("global_rows", ["slabs", "segments"])
def test_tables_and_global_rows_guessed_then_refuted(cp, hs, rng, monkeypatch, global_rows):
    """Rows of shared tables (esc=False) and a few long rows on the global path (slabs or column
    segments) take the guessed path and its graph; A's columns then rewritten in place onto B's
    long rows (products per row up 20-fold: the kept tables and buffer would overflow) are refused
    on the GPU before any numeric kernel writes, and the rerun is right."""
    monkeypatch.setattr(glob_rows, "GLOBAL_SEG_MIN_BLOCKS_PER_SM", 0.0 if global_rows == "segments" else float("inf"))
    m, n, k = 3000, 2000, 3000   # a long row's bound min(products, k): past 48 KB tables
    lengths = np.where(np.arange(n) < n // 2, 2, 40)   # B rows of 2 or 40 entries
    Bp = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    Bj = np.concatenate([np.sort(rng.choice(k, L, replace=False)) for L in lengths]).astype(np.int32)
    B = _dev(cp, sp.csr_matrix((rng.random(Bp[-1]) + 0.5, Bj, Bp), shape=(n, k)))
    A_host = _fixed_rows(rng, m, n // 2, 6).tolil()   # columns among B's short rows: 12 products a row
    A_host.resize((m, n))
    for r in (9, 700, 2999):
        A_host[r, :] = rng.random(n) + 0.5             # long rows: 42,000 products, the global path
    A_host = A_host.tocsr()
    A = _dev(cp, A_host)
    for guessed in (False, True, True):
        C, info = _call(cp, hs, A, B, smem_limit=48 * 1024, esc=False)
        assert info["one_pass"] and info["guessed"] is guessed
        assert info["global_rows_numeric"] >= 3 and info["numeric_tables"]
        assert ("global_segments" in info) == (global_rows == "segments")
        _check(C, A, B, 1e-12)
    short = np.flatnonzero(np.diff(A_host.indptr) == 6)
    cols = A.indices.get()
    for r in short:                                    # onto B's long rows: 240 products a row
        cols[A_host.indptr[r]:A_host.indptr[r + 1]] += n // 2
    A.indices[:] = cp.asarray(cols)
    C, info = _call(cp, hs, A, B, smem_limit=48 * 1024, esc=False)
    assert info["guessed"] is False
    _check(C, A, B, 1e-12)


def test_guesses_and_graphs_are_bounded(cp, hs, rng, monkeypatch):
    from matplan.kernels import _graph
    monkeypatch.setattr(guesses, "GUESS_CACHE_SIZE", 2)
    monkeypatch.setattr(guesses, "GUESS_GRAPHS", 1)
    pairs = [(_dev(cp, random_csr(rng, 800, 600, 0.004)), _dev(cp, random_csr(rng, 600, 500, 0.004)))
             for _ in range(3)]
    for A, B in pairs:
        for _ in range(3):   # unguessed, guessed (then direct: no graph until the next), direct
            C, info = _call(cp, hs, A, B)
        assert info["guessed"] and info["direct"]
        _check(C, A, B, 1e-12)
        assert _graphs(hs) == (1 if _graph.available() else 0)
    assert len(guesses._GUESSES) == 2
    _, info = _call(cp, hs, *pairs[0])   # the oldest was dropped
    assert info["guessed"] is False
    C, info = _call(cp, hs, *pairs[2])
    assert info["guessed"] is True
    _check(C, *pairs[2], 1e-12)


def test_other_stream_other_entry(cp, hs, rng):
    """A graph replays on the stream it was recorded on: another stream keeps its own."""
    A = _dev(cp, random_csr(rng, 1500, 1500, 0.004))
    for _ in range(2):
        _call(cp, hs, A, A)
    with cp.cuda.Stream(non_blocking=True) as stream:
        for guessed in (False, True, True):
            C, info = _call(cp, hs, A, A)
            assert info["guessed"] is guessed
        stream.synchronize()
    _check(C, A, A, 1e-12)
    assert len(guesses._GUESSES) == 2


def test_settings_changed_since_refute_the_guess(cp, hs, rng, monkeypatch):
    """A guess kept under other numeric_esc classes is not used (a different analysis), and the
    call is right."""
    A = _dev(cp, random_csr(rng, 2000, 2000, 0.003))
    _call(cp, hs, A, A)
    try:
        monkeypatch.setattr(rules, "ESC_CLASSES", rules.ESC_CLASSES[:3])
        monkeypatch.setattr(rules, "ESC_CAPS", rules.ESC_CAPS[:3])
        rules.esc_caps.cache_clear()
        C, info = _call(cp, hs, A, A)
        assert info["guessed"] is False
        _check(C, A, A, 1e-12)
    finally:
        monkeypatch.undo()
        rules.esc_caps.cache_clear()


def _disjoint_rows(rng, n, k_per_row):
    """n x (n k_per_row) CSR, row j holding columns [j k_per_row, (j + 1) k_per_row): products
    of distinct rows never share a column, so C's row lengths are fixed by A's row lengths."""
    cols = np.arange(n * k_per_row, dtype=np.int32)
    return sp.csr_matrix(((rng.random(n * k_per_row) + 0.5), cols,
                          np.arange(0, n * k_per_row + 1, k_per_row, dtype=np.int32)), shape=(n, n * k_per_row))


def test_direct_rows_of_other_lengths_refute_the_guess(cp, hs, rng):
    """Once direct, A's columns rewritten in place with the same products a row (the analysis
    words equal) but other overlaps (C's row lengths change): the rows' length check refutes the
    guess before they write, the rerun is right, and the pair goes direct again later."""
    A = _dev(cp, _fixed_rows(rng, 1500, 900, 5))
    B = _dev(cp, _fixed_rows(rng, 900, 700, 6))
    for _ in range(3):
        _call(cp, hs, A, B)
    cols = np.stack([np.sort(rng.choice(4, 5, replace=True)) for _ in range(1500)]).ravel()  # 5 of 4 columns: overlaps
    A.indices[:] = cp.asarray(cols.astype(np.int32))
    C, info = _call(cp, hs, A, B)
    assert info["guessed"] is False
    _check(C, A, B, 1e-12)
    for _ in range(3):
        C, info = _call(cp, hs, A, B)
    assert info["direct"]
    _check(C, A, B, 1e-12)


def test_direct_same_lengths_other_columns_is_right(cp, hs, rng):
    """Once direct, A's columns rewritten in place to other distinct columns over B rows of
    disjoint columns: products and C's row lengths are unchanged, so the guess stands, and the
    rows written at the kept offsets are the new A's."""
    n = 800
    B = _dev(cp, _disjoint_rows(rng, n, 3))
    A = _dev(cp, _fixed_rows(rng, 2000, n, 4))
    for _ in range(3):
        _call(cp, hs, A, B)
    A.indices[:] = cp.asarray(_fixed_rows(rng, 2000, n, 4).indices)
    A.data *= -1.5
    C, info = _call(cp, hs, A, B)
    assert info["guessed"] and info["direct"]
    _check(C, A, B, 1e-12)


def test_direct_with_empty_rows_moving(cp, hs, rng):
    """Rows of no products are not launched (grouped): a product row and an empty row trading
    places keep the analysis words but not C's offsets; the row that gained products has a kept
    length of 0 and refutes the guess (no unwritten stretch of C can pass)."""
    n = 600
    B = _dev(cp, _disjoint_rows(rng, n, 2))
    lengths = np.tile([0, 3, 1, 0, 2], 200)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    cols = np.concatenate([np.sort(rng.choice(n, L, replace=False)) for L in lengths]).astype(np.int32)
    A = _dev(cp, sp.csr_matrix((rng.random(indptr[-1]) + 0.5, cols, indptr), shape=(1000, n)))
    for _ in range(3):
        C, info = _call(cp, hs, A, B, grouping="grouped")
    assert info["direct"]
    swapped = np.tile([3, 0, 1, 0, 2], 200)            # rows 0 and 1 of each five trade lengths
    A.indptr[:] = cp.asarray(np.concatenate([[0], np.cumsum(swapped)]).astype(np.int32))
    C, info = _call(cp, hs, A, B, grouping="grouped")
    assert info["guessed"] is False
    _check(C, A, B, 1e-12)


def test_forget_guesses(cp, hs, rng):
    A = _dev(cp, random_csr(rng, 1000, 1000, 0.004))
    _call(cp, hs, A, A)
    hs.forget_guesses()
    _, info = _call(cp, hs, A, A)
    assert info["guessed"] is False


def test_tuning_calls_time_guessed_replays_and_first_calls(cp, hs, rng):
    """spgemm.hash's tuning calls (Kernel.tuning_calls): "run" goes on from the guessed analysis
    and never replays values only (what its cost prices), "first" guesses and keeps nothing (a
    first call); every result equals SciPy's."""
    kernel = get_kernel("spgemm.hash")
    A = _dev(cp, random_csr(rng, 3000, 2000, 0.002), np.float64)
    B = _dev(cp, random_csr(rng, 2000, 1500, 0.003), np.float64)
    calls = kernel.tuning_calls(kernel.prepare(A, {"sort": True}), B)
    assert set(calls) == {"run", "first"}
    _check(calls["first"]().get(), A, B, 1e-12)
    assert not list(guesses._GUESSES.values())            # a first call keeps nothing
    for _ in range(4):
        _check(calls["run"]().get(), A, B, 1e-12)
        _check(calls["first"]().get(), A, B, 1e-12)
    assert len(list(guesses._GUESSES.values())) == 1      # the runs went on from one kept analysis
    assert not list(guesses._VALUES.values())             # and never set up a values-only replay
