"""The statistics kernel's host side, on a CPU: its figures finished into the features give the
NumPy formulas' numbers bit for bit, the Python mirrors of its device algorithms agree with those
formulas, its constants match the .cu, and the planner's wiring (one measurement shared by the
structure check and the statistics) works with a stand-in launcher. The kernel itself:
test_statistics_gpu.py."""
import dataclasses
import re

import numpy as np
import pytest
import scipy.sparse as sp

from matplan.core import compression as C, device as device_mod, features as F, figures, validation
from matplan.kernels import _cuda, statistics as S
from stats_reference import (drawn_rows, examine_row, matrices, mirror_drawn, mirror_examine, mirror_pairwise,
                             mirror_products, mirror_warp_after, partner, products, reference_figures)


@pytest.mark.parametrize("name", list(matrices()))
def test_finished_figures_equal_the_general_formulas(name):
    A = matrices()[name]
    want = F.sparse_features(A)
    assert F.from_figures("spmv", reference_figures("spmv", A), A) == want
    B = partner(A)
    assert F.from_figures("spgemm", reference_figures("spgemm", A, B), A, B) == {**want, **F.spgemm_features(A, B)}
    assert F.from_figures("sptrans", reference_figures("sptrans", A), A) == F.transpose_features(A)


def test_long_row_fallbacks_use_the_general_formulas():
    """Too many long rows to rank (warp_after None) and B's columns past the hash sets."""
    A = matrices()["skewed, unsorted, duplicates"]
    figs = dataclasses.replace(reference_figures("spgemm", A, A), warp_after=None, compression_ok=False)
    assert F.from_figures("spgemm", figs, A, A) == {**F.sparse_features(A), **F.spgemm_features(A, A)}


def test_malformed_figures_go_to_the_general_formulas():
    A = sp.csr_matrix(np.ones((4, 4)))
    figs = dataclasses.replace(reference_figures("spmv", A), row_min=-1)
    assert F.from_figures("spmv", figs, A) is None


def test_drawn_rows_in_any_order_give_the_same_compression():
    """The drawn rows rise (quantiles of a running sum); rows drawn in another order (figures a
    caller vouched for) take numpy.unique's path to the same estimate. The kernel fills in a row's
    first draw only, so here every draw of a row carries its figures."""
    A = matrices()["skewed, unsorted, duplicates"]
    figs = reference_figures("spgemm", A, A)
    assert len(set(figs.drawn)) < len(figs.drawn)   # some rows drawn more than once
    names = ("distinct", "examined", "drawn_products")
    first = {row: i for i, row in reversed(list(enumerate(figs.drawn)))}
    filled = dataclasses.replace(figs, **{name: tuple(getattr(figs, name)[first[row]] for row in figs.drawn)
                                          for name in names})
    order = np.random.default_rng(3).permutation(len(figs.drawn)).tolist()
    mixed = dataclasses.replace(filled, **{name: tuple(getattr(filled, name)[i] for i in order)
                                           for name in ("drawn",) + names})
    assert list(mixed.drawn) != sorted(mixed.drawn)
    want = C.sampled_compression(A, A, F.products_per_row(A, A))
    assert C.drawn_compression(figs, A.shape[1]) == want
    assert C.drawn_compression(mixed, A.shape[1]) == want


@pytest.mark.parametrize("seed", range(40))
def test_drawn_compression_in_python_is_numpys(seed):
    """Rising drawn rows examined whole (the common case) take a Python path: the same float as
    numpy.unique + compression_of, bit for bit, for random draws, repeats and counts."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.integers(0, rng.integers(1, 200), S.DRAWS))
    p = rng.integers(1, 10 ** rng.integers(1, 12), S.DRAWS)[np.searchsorted(np.unique(rows), rows)]
    d = np.minimum(p, rng.integers(1, 10 ** 6, S.DRAWS))
    q = p + rng.integers(0, 3, S.DRAWS)
    figs = figures.KernelFigures(a=figures.CsrFlags(False, False, False, False, 0, 1), products=int(p.sum()),
                                 drawn=tuple(rows.tolist()), drawn_products=tuple(p.tolist()),
                                 distinct=tuple(d.tolist()), examined=tuple(q.tolist()))
    _, first, draws = np.unique(rows, return_index=True, return_counts=True)
    want = C.compression_of(d[first], q[first], p[first], draws.astype(np.int64), 10 ** 7)
    assert C.drawn_compression(figs, 10 ** 7) == want


@pytest.mark.parametrize("n", range(0, 129))
def test_leaf_sum_is_numpys(n):
    v = np.random.default_rng(n).standard_normal(n) * 10.0 ** np.random.default_rng(n + 1).integers(-8, 8, n)
    assert C.leaf_sum(v.tolist()) + 0.0 == v.sum() + 0.0


@pytest.mark.parametrize("n", list(range(1, 140)) + [255, 256, 257, 1000, 4097, 65_536, 100_003])
def test_pairwise_mirror_is_numpys_sum(n):
    x = np.random.default_rng(n).random(n) * 10.0 ** np.random.default_rng(n + 1).integers(-6, 6, n)
    want = float(np.add.reduce(x))
    assert mirror_pairwise(x) == want
    assert mirror_pairwise(x, order_seed=n) == want   # leaves finishing in any order


@pytest.mark.parametrize("hist_size", [1, 8, 64, 1 << 16])
def test_warp_after_mirror_is_the_sorted_sum(hist_size):
    rng = np.random.default_rng(hist_size)
    for lengths in (rng.integers(0, 100, 1000), rng.zipf(1.5, 3000).clip(0, 10 ** 6), np.zeros(33, np.int64),
                    np.array([5]), np.array([10 ** 6] * 70 + [3] * 100)):
        padded = np.concatenate([lengths, np.zeros((-len(lengths)) % 32, np.int64)])
        want = int(np.sort(padded)[::-1].reshape(-1, 32).max(axis=1).sum())
        assert mirror_warp_after(lengths, hist_size, seed=hist_size) == want


@pytest.mark.parametrize("name", ["empty rows", "one long row", "skewed, unsorted, duplicates",
                                  "random 65537 in 6000 rows"])
def test_products_mirror(name):
    A = matrices()[name]
    B = partner(A)
    want = products(A, B)
    assert np.array_equal(mirror_products(A, B, tile=256, seed=1), want)
    assert np.array_equal(mirror_products(A, B, tile=64, seed=2), want)


@pytest.mark.parametrize("grid", [1, 3, 7, 100])
def test_drawn_rows_mirror(grid):
    rng = np.random.default_rng(grid)
    for rowct in (rng.integers(0, 50, 5000), rng.zipf(1.3, 3000).clip(0, 10 ** 7), np.array([0, 0, 9, 0]),
                  np.array([1] + [0] * 500)):
        if rowct.sum():
            assert np.array_equal(mirror_drawn(rowct.astype(np.int64), grid), drawn_rows(rowct))


def test_examined_products_mirror(monkeypatch):
    """Subsampled rows (products past the cap) and the hard cap, in chunks of 8 entries."""
    monkeypatch.setattr(C, "COMPRESSION_ROW_CAP", 16)
    A = matrices()["skewed, unsorted, duplicates"]
    rowct = products(A, A)
    for row in np.argsort(rowct)[-20:]:
        assert mirror_examine(A, A, int(row), int(rowct[row]), block=8) == examine_row(A, A, int(row), int(rowct[row]))


def test_constants_match_the_kernel_source():
    text = _cuda.source(S.SOURCE)
    defs = {}
    for name, value in re.findall(r"^#define (\w+) (.+?)(?:\s*//.*)?$", text, re.M):
        try:
            defs[name] = eval(value.replace("LL", ""), {}, dict(defs))
        except (NameError, SyntaxError):
            pass
    assert (defs["ST_BLOCK"], defs["ST_HIST"], defs["ST_LONG_CAP"], defs["ST_BIAS"]) == (S.BLOCK, S.HIST, S.LONG_CAP,
                                                                                        S.BIAS)
    assert (defs["ST_SAMPLES"], defs["ST_DRAWS"], defs["ST_ROW_CAP"]) == (F.SPREAD_SAMPLES, C.COMPRESSION_SAMPLES,
                                                                         C.COMPRESSION_ROW_CAP)
    assert (defs["ST_CHECK"], defs["ST_ROWS"], defs["ST_TRANS"], defs["ST_GEMM"]) == (S.CHECK, S.ROWS, S.TRANS, S.GEMM)
    assert defs["ST_PI"] == F.RBS_COMPRESSION and defs["ST_WORDS"] == S.WORDS
    for name in ("O_FLAGS_A", "O_PTRM_A", "O_FLAGS_B", "O_MIN", "O_WARP_AFTER", "O_LONG", "O_ROW_SS", "O_SPREAD",
                 "O_COL_MAX", "O_PRODUCTS", "O_RCT_SS", "O_RBS", "O_DRAWN", "O_DRAWN_P", "O_DISTINCT", "O_EXAMINED"):
        assert defs[name] == getattr(S, name), name
    assert _cuda.signature(S.SOURCE, "csr_statistics") == "ppqqqiippqqiiiq" + "p" * len(S._POINTERS)


def test_decode_reads_each_word():
    raw = np.zeros(S.WORDS, dtype=np.int64)
    raw[S.O_FLAGS_A], raw[S.O_PTR0_A], raw[S.O_PTRM_A] = 5, 2, 9
    raw[S.O_FLAGS_B], raw[S.O_PTRM_B] = 10, 4
    raw[S.O_MIN], raw[S.O_MAX] = S.BIAS - 3, S.BIAS + 17
    raw[S.O_EMPTY], raw[S.O_WARP_BEFORE], raw[S.O_WARP_AFTER], raw[S.O_COL_MAX] = 4, 40, 35, 6
    raw[S.O_ROW_SS:S.O_SPREAD + 1] = np.array([1.5, 0.25]).view(np.int64)
    raw[S.O_PRODUCTS], raw[S.O_RCT_MIN], raw[S.O_RCT_MAX] = 99, S.BIAS, S.BIAS + 50
    raw[S.O_RBS:S.O_RBS + 6] = np.arange(6)
    raw[S.O_DRAWN:S.O_DRAWN + S.DRAWS] = np.arange(S.DRAWS) // 2
    raw[S.O_EXAMINED] = 77
    f = S.decode(raw, S.MODES["spgemm"] | S.TRANS, b_cols=10)
    assert f.a == figures.CsrFlags(True, False, True, False, 2, 9)
    assert f.b == figures.CsrFlags(False, True, False, True, 0, 4)
    assert (f.row_min, f.row_max, f.empty_rows, f.warp_before, f.warp_after, f.col_max) == (3, 17, 4, 40, 35, 6)
    assert (f.row_ss, f.spread_sum, f.products, f.rowct_min, f.rowct_max) == (1.5, 0.25, 99, 0, 50)
    assert f.rbs_groups == tuple(range(6)) and f.drawn[:4] == (0, 0, 1, 1) and f.examined[0] == 77
    raw[S.O_LONG] = S.LONG_CAP + 1   # too many long rows listed: the host sorts
    assert S.decode(raw, S.MODES["spmv"]).warp_after is None
    assert not S.decode(raw, S.MODES["spgemm"], b_cols=S.MAX_HASHED_COLS + 1).compression_ok


def test_layout_puts_zeroed_regions_first_without_overlap():
    for op, mode in S.MODES.items():
        cleared, regions, words = S.layout(mode, 1000, 700, 33, S.table_size(700, 5000))
        spans = sorted((off, off + size) for off, size in regions.values() if size)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and spans[-1][1] == words
        assert regions["out"] == (0, S.WORDS) and cleared == sum(
            regions[r][1] for r in ("out", "hist", "cnt_row", "cnt_spread", "cnt_rct", "rowct", "colcnt"))
    assert S.layout(S.MODES["spgemm"], 10, 10, 4, 64)[1]["tables"][1] == S.DRAWS * 64 // 2


def test_table_size_holds_twice_the_distinct_columns():
    for cols, nnz in ((5, 100), (10 ** 6, 10), (10 ** 9, 10 ** 9), (300, 1)):
        t = S.table_size(cols, nnz)
        assert t & (t - 1) == 0 and t >= max(64, 2 * min(2 * S.ROW_CAP, cols, nnz))


def _fake_gpu(monkeypatch):
    """Host operands treated as GPU ones, measured by a stand-in launcher (the NumPy reference);
    returns the launcher's calls."""
    calls = []

    def launcher(op, A, B):
        calls.append(op)
        return reference_figures(op, A, B)
    monkeypatch.setattr(figures, "_KERNEL", [launcher])
    monkeypatch.setattr(figures, "is_gpu_array", lambda x: True)
    return calls


@pytest.mark.parametrize("op", ["spmv", "spgemm", "sptrans"])
def test_planner_wiring_shares_one_measurement(monkeypatch, op):
    A = matrices()["skewed, unsorted, duplicates"]
    host = validation.normalize_transpose(A) if op == "sptrans" else validation.normalize(A, A if op == "spgemm"
                                                                                         else np.ones(A.shape[1]))
    dev = device_mod.current("H100")
    want = F.compute(host, dev)
    calls = _fake_gpu(monkeypatch)
    problem = dataclasses.replace(host, backend="gpu")
    validation.check_structure(problem)
    got = F.compute(problem, dev)
    assert calls == [op] and got == dataclasses.replace(want, backend="gpu")


def test_structure_errors_from_the_kernels_flags(monkeypatch):
    A = sp.csr_matrix(np.eye(4))
    bad = {"indptr[0] is 1": lambda M: setattr(M, "indptr", M.indptr + 1),
           "indptr decreases": lambda M: M.indptr.__setitem__(2, 0),
           "a column index is negative": lambda M: M.indices.__setitem__(1, 9)}
    for message, spoil in bad.items():
        M = A.copy()
        spoil(M)
        with pytest.raises(ValueError, match=re.escape(message)):
            validation.check_csr(M, "A")   # NumPy's check
        with pytest.raises(ValueError, match=re.escape(message)):
            validation.check_csr(M, "A", flags=reference_figures("check", M).a)
    calls = _fake_gpu(monkeypatch)
    validation.check_csr(A, "A", host=None)   # a GPU operand alone: the kernel's check
    assert calls == ["check"]
