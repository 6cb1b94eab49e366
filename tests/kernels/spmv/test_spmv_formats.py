"""SpMV formats built with NumPy on the host: layouts, and NumPy emulations of each kernel's arithmetic.

The GPU kernels read exactly these arrays (built with CuPy there); the emulations
follow spmv.cu's loops (ELL-R thread per row, BRCP segmented warp sums and the
fixed-order reduction of rows spanning blocks, BRC per block-row adds, the merge
path's tiles, per-thread items, carries and fix-up) and must
match SciPy.
"""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import messy_csr, random_csr
from matplan.kernels import get
from matplan.kernels.spmv import formats as fmt
from matplan.models import spmv as spmv_model, traffic
from matplan.core import device
from matplan.planner import plan
from matplan.core import features as stats
from matplan.core.validation import normalize

H = fmt.H


def emulate_ellr(e, m, X):
    """y[perm[r]] = sum_{c < rl[r]} vals[c*m + r] * X[cols[c*m + r]]."""
    Y = np.zeros((m, X.shape[1]))
    for r in range(m):
        idx = np.arange(int(e["rl"][r])) * e["stride"] + r
        out = int(e["perm"][r]) if e["perm"] is not None else r
        Y[out] = e["vals"][idx] @ X[e["cols"][idx]] if idx.size else 0.0
    return Y


def block_row_sums(b, X):
    """Per block row: the sum over its width of vals * X[cols] (padding col -1 skipped)."""
    sums = np.zeros((b["nblocks"] * H, X.shape[1]))
    bp = b["block_ptr"]
    for blk in range(b["nblocks"]):
        width = (int(bp[blk + 1]) - int(bp[blk])) // H
        for lane in range(H):
            idx = int(bp[blk]) + np.arange(width) * H + lane
            c = b["cols"][idx]
            keep = c >= 0
            sums[blk * H + lane] = b["vals"][idx][keep] @ X[c[keep]] if keep.any() else 0.0
    return sums


def emulate_brcp(b, m, X):
    """Segmented sums per block (heads from row_seg_len), stores/partials by dest, then fixup."""
    sums = block_row_sums(b, X)
    Y = np.full((m, X.shape[1]), np.nan)
    partials = np.full((b["partials"], X.shape[1]), np.nan)
    seg = b["row_seg_len"]
    for s in np.flatnonzero(seg > 0):
        total = sums[s:s + seg[s]].sum(axis=0)
        d = int(b["dest"][s + seg[s] - 1])
        if d >= 0:
            Y[d] = total
        elif d <= -2:
            partials[-d - 2] = total
    fp = b["fix_ptr"]
    for t, row in enumerate(b["fix_rows"]):
        Y[int(row)] = partials[int(fp[t]):int(fp[t + 1])].sum(axis=0)
    return Y


def emulate_brc(b, m, X):
    sums = block_row_sums(b, X)
    Y = np.zeros((m, X.shape[1]))
    for s, row in enumerate(b["row_perm"]):
        if row >= 0:
            Y[int(row)] += sums[s]
    return Y


def matrices(rng):
    yield "messy", messy_csr(rng, 70, 40)
    yield "random", random_csr(rng, 100, 80, 0.05)
    yield "empty", sp.csr_matrix((5, 7))
    yield "0x0", sp.csr_matrix((0, 0))
    yield "1x1", sp.csr_matrix(np.array([[2.5]]))
    L = np.minimum(rng.zipf(1.6, 300), 300)
    L[7] = 5000                                     # one row longer than 64*T: cut by the long rule
    indptr = np.concatenate([[0], np.cumsum(L)])
    yield "powerlaw", sp.csr_matrix((rng.random(indptr[-1]) - 0.5, rng.integers(0, 400, indptr[-1]),
                                     indptr), shape=(300, 400))


def _X(rng, A, k):
    return rng.standard_normal((A.shape[1], k))


@pytest.mark.parametrize("sort", [False, True])
def test_ellr_layout_and_emulation(rng, sort):
    for name, A in matrices(rng):
        e = fmt.ellr(A.indptr, A.indices, A.data, sort)
        m = A.shape[0]
        L = np.diff(A.indptr)
        assert e["total"] == m * (L.max() if m else 0), name
        if sort:
            assert sorted(e["perm"].tolist()) == list(range(m)), name
            assert np.all(np.diff(e["rl"]) <= 0), name            # longest first
            assert np.array_equal(e["rl"], L[e["perm"]]), name
        else:
            assert e["perm"] is None and np.array_equal(e["rl"], L), name
        assert (e["cols"] >= 0).sum() == A.nnz, name            # every entry placed once
        for k in (1, 3):
            X = _X(rng, A, k)
            np.testing.assert_allclose(emulate_ellr(e, m, X), A @ X, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("long_factor", fmt.LONG_FACTORS)
def test_brcp_layout_and_emulation(rng, long_factor):
    for name, A in matrices(rng):
        m = A.shape[0]
        L = np.diff(A.indptr)
        T = spmv_model.brcp_T(L.mean(), L.std()) if m else 1
        b = fmt.brcp(A.indptr, A.indices, A.data, T, long_factor)
        bp = b["block_ptr"]
        assert bp[0] == 0 and np.all(np.diff(bp) % H == 0) and bp[-1] == b["total"], name
        assert (b["cols"] >= 0).sum() == A.nnz and np.count_nonzero(b["vals"]) == np.count_nonzero(A.data), name
        # row-major filling: a row's pieces are consecutive block rows, rows in descending length
        rp = b["row_perm"][:b["pieces"]]
        firsts = rp[np.r_[True, rp[1:] != rp[:-1]]] if rp.size else rp
        assert len(firsts) == len(set(firsts.tolist())) == m, name     # empty rows: one width-0 piece
        assert np.all(np.diff(L[firsts]) <= 0), name
        # rowSegLen: heads at block starts and row changes, lengths tile each block
        seg = b["row_seg_len"]
        assert np.all(seg[::H] > 0) and seg.sum() == b["nblocks"] * H, name
        # the width rule: pieces of a long row are ceil(L/f) wide, others at most T
        for r in np.flatnonzero(L):
            w = -(-L[r] // long_factor) if L[r] > long_factor * T else min(L[r], T)
            assert (rp == r).sum() == -(-L[r] // w), (name, r)
        assert np.all(b["fix_ptr"][1:] - b["fix_ptr"][:-1] >= 2), name   # only rows spanning blocks
        for k in (1, 2):
            X = _X(rng, A, k)
            np.testing.assert_allclose(emulate_brcp(b, m, X), A @ X, rtol=1e-12, atol=1e-12, err_msg=name)
            np.testing.assert_allclose(emulate_brc(b, m, X), A @ X, rtol=1e-12, atol=1e-12, err_msg=name)


def test_brcp_spanning_rows_use_partials(rng):
    """A row spread over three or more blocks is reduced from partials, never stored directly."""
    L = np.array([4000] + [3] * 200)
    indptr = np.concatenate([[0], np.cumsum(L)])
    A = sp.csr_matrix((rng.random(indptr[-1]), rng.integers(0, 50, indptr[-1]), indptr), shape=(len(L), 50))
    b = fmt.brcp(A.indptr, A.indices, A.data, T=3, long_factor=2048)
    blocks_of_row0 = np.unique(np.flatnonzero(b["row_perm"] == 0) // H)
    assert len(blocks_of_row0) >= 3
    assert not np.any(b["dest"] == 0) and b["fix_rows"][0] == 0
    assert b["fix_ptr"][1] - b["fix_ptr"][0] == len(blocks_of_row0)


@pytest.mark.parametrize("ipt", [1, 3, *fmt.MERGE_IPT])
def test_merge_path_split_and_emulation(rng, ipt):
    for name, A in matrices(rng):
        m = A.shape[0]
        mp = fmt.merge_path(A.indptr, ipt)
        tr, tile = mp["tile_row"], mp["tile"]
        assert tr[0] == 0 and tr[-1] == m and np.all(np.diff(tr) >= 0), name
        # each tile boundary is a valid merge-path point: row ends before it, nonzeros before it
        for t, r in enumerate(tr):
            d = min(t * tile, m + A.nnz)
            nz = d - r
            assert 0 <= nz <= A.nnz and (r == 0 or A.indptr[r] <= nz) and (r == m or nz <= A.indptr[r + 1]), (name, t)
        assert np.all(np.diff(mp["fix_rows"]) > 0) and np.all(mp["fix_hi"] > mp["fix_lo"]), name
        for k in (1, 2):
            X = _X(rng, A, k)
            np.testing.assert_allclose(fmt.merge_emulate(A.indptr, A.indices, A.data, X, ipt), A @ X,
                                       rtol=1e-12, atol=1e-12, err_msg=f"{name} ipt={ipt}")


def test_merge_path_long_row_carries_over_many_tiles(rng):
    """A row of 5000 nonzeros crosses many tiles: one fix-up record naming all its tiles."""
    L = np.array([2] * 100 + [5000] + [1] * 100)
    indptr = np.concatenate([[0], np.cumsum(L)])
    mp = fmt.merge_path(indptr, 2)
    (i,) = np.flatnonzero(mp["fix_rows"] == 100)
    assert mp["fix_hi"][i] - mp["fix_lo"][i] >= 5000 // mp["tile"] - 1


def test_int64_indices_kept():
    A = sp.random(30, 20, density=0.2, format="csr", random_state=1)
    A.indices, A.indptr = A.indices.astype(np.int64), A.indptr.astype(np.int64)
    assert fmt.brcp(A.indptr, A.indices, A.data, 3)["cols"].dtype == np.int64
    assert fmt.ellr(A.indptr, A.indices, A.data, True)["cols"].dtype == np.int64


def test_vector_width_rule():
    assert [fmt.vector_width(x) for x in (0.5, 2, 3, 7, 9, 17, 100)] == [2, 2, 4, 8, 16, 32, 32]


def test_spmm_group_shape_rule():
    """Column lanes cover k (32-lane chunks past 32); slots fill the rest of a warp at most."""
    assert [fmt.spmm_columns(k) for k in (1, 2, 4, 5, 8, 9, 16, 17, 32, 64, 100)] == \
        [4, 4, 4, 8, 8, 16, 16, 32, 32, 32, 32]
    assert [fmt.spmm_slots(8, k) for k in (2, 7, 16, 64)] == [8, 4, 2, 1]
    assert all(fmt.spmm_columns(k) * fmt.spmm_slots(s, k) <= 32 for k in range(1, 70) for s in fmt.SPMM_SLOTS)


def test_spmm_kernel_reads_a_once_per_column_chunk(rng):
    """The CSR SpMM cost streams A once per 32-column chunk where CSR vector streams it k times."""
    A = random_csr(rng, 100_000, 100_000, 2e-4)       # 2M nonzeros: bytes, not launches, decide
    f = _features(A, 16)
    dev = device.known("H100")
    spmm, vector = get("spmv.csr_spmm"), get("spmv.csr_vector")
    assert spmm.ops == ("spmm",)
    cands = list(spmm.candidates(f, dev))
    assert cands and all(fmt.spmm_columns(16) * c["S"] <= 32 for c in cands)
    best = min(spmm.cost(f, c, dev).run_s for c in cands)
    assert best < min(vector.cost(f, c, dev).run_s for c in vector.candidates(f, dev))
    assert "A read 1x for k=16" in spmm.cost(f, cands[0], dev).why


def _features(A, k=1):
    B = np.ones(A.shape[1]) if k == 1 else np.ones((A.shape[1], k))
    p = normalize(A, B)
    return stats.compute(p, device.known("H100"))


def test_ellr_rule_and_padding_rejection(rng):
    L = np.r_[np.full(31, 1), 40, np.full(32, 2)]
    L = np.tile(L, 20)
    indptr = np.concatenate([[0], np.cumsum(L)])
    A = sp.csr_matrix((rng.random(indptr[-1]), rng.integers(0, 64, indptr[-1]), indptr), shape=(len(L), 64))
    f = _features(A)
    ellr = get("spmv.ellr")
    (params,) = ellr.candidates(f, device.known("H100"))
    assert params["sorted"] == spmv_model.ellr_should_sort(f.warp_len_before, f.warp_len_after)
    why = ellr.cost(f, params, device.known("H100")).why
    assert f"{f.warp_len_before:.2f} -> {f.warp_len_after:.2f}" in why and str(spmv_model.ELLR_SORT_RATIO) in why
    # a matrix with one dense row among many short ones: ELL-R refuses with the figures
    L2 = np.r_[np.full(5000, 1), 5000]
    indptr = np.concatenate([[0], np.cumsum(L2)])
    A2 = sp.csr_matrix((np.ones(indptr[-1]), rng.integers(0, 5000, indptr[-1]), indptr), shape=(5001, 5000))
    reason = ellr.supports(_features(A2))
    assert reason and "slots" in reason and "5000" in reason


def test_costs_positive_and_explained(rng):
    A = random_csr(rng, 2000, 2000, 0.01)
    for k in (1, 8):
        f = _features(A, k)
        for name in ("spmv.csr_scalar", "spmv.csr_vector", "spmv.ellr", "spmv.brc", "spmv.brcp",
                     "spmv.csr_merge", "spmv.csr_spmm"):
            kern = get(name)
            for params in kern.candidates(f, device.known("H100")):
                c = kern.cost(f, params, device.known("H100"))
                assert c.run_s > 0 and c.prepare_s >= 0 and c.why, (name, params)


def test_cusparse_spmm_cost_charges_random_gathers_past_l2(rng):
    """cupyx's SpMM gathers a column-major B: random columns with B past L2 cost more than a band."""
    n, k = 1 << 20, 16
    cols = rng.integers(0, n, 8 * n)
    rows = np.repeat(np.arange(n), 8)
    random_cols = sp.csr_matrix((np.ones(8 * n), (rows, cols)), shape=(n, n))
    banded = sp.csr_matrix((np.ones(8 * n), (rows, np.clip(rows + (cols % 8), 0, n - 1))), shape=(n, n))
    dev = device.known("H100")
    fr, fb = _features(random_cols, k), _features(banded, k)
    assert fr.col_spread > 0.3 and fb.col_spread < 1e-3
    cr, cb = spmv_model.cusparse(fr, dev), spmv_model.cusparse(fb, dev)   # cupyx's call, the baseline
    assert cr.run_s > 2 * cb.run_s and "gathers past L2" in cr.why
    small = _features(random_cols[: n // 64, : n // 64].tocsr(), k)   # B fits in L2: few misses
    assert traffic.column_major_gathers_missed(small, dev.l2_bytes) < 0.05 * small.nnz * k
    assert traffic.column_major_gathers_missed(_features(random_cols, 1), dev.l2_bytes) == 0.0


def test_deterministic_plan_never_picks_brc_or_cusparse(rng):
    A = random_csr(rng, 500, 500, 0.02)
    p = plan(A, np.ones(500), deterministic=True, device="H100")
    for c in p.candidates:
        if c.kernel in ("spmv.brc", "spmv.cusparse"):
            assert c.source == "rejected"


def test_split_chunks_cover_exactly_the_long_rows():
    from matplan.kernels.spmv import formats as fmt
    lengths = np.array([0, 3, 129, 128, fmt.SPLIT_CHUNK, fmt.SPLIT_CHUNK + 1, 0, 5 * fmt.SPLIT_CHUNK])
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    sc = fmt.split_chunks(indptr, 128)
    assert sc["fix_rows"].tolist() == [2, 4, 5, 7]
    assert sc["nchunks"] == 1 + 1 + 2 + 5
    for row, lo, hi in zip(sc["fix_rows"], sc["fix_lo"], sc["fix_hi"]):
        spans = list(zip(sc["chunk_lo"][lo:hi], sc["chunk_hi"][lo:hi]))
        assert spans[0][0] == indptr[row] and spans[-1][1] == indptr[row + 1]
        assert all(b == c for (_, b), (c, _) in zip(spans, spans[1:]))          # consecutive
        assert all(0 < b - a <= fmt.SPLIT_CHUNK for a, b in spans)
    none = fmt.split_chunks(np.array([0, 2, 4]), 128)
    assert none["nchunks"] == 0 and none["fix_rows"].size == 0 and none["chunk_lo"].size == 0


def test_launcher_checks_its_signature_and_argument_count():
    """_cuda.Launcher (packed driver launches): unknown signature letters and a wrong number of
    arguments are errors before anything reaches the driver (no GPU needed)."""
    import types
    from matplan.kernels import _cuda
    fake = types.SimpleNamespace(ptr=0)
    with pytest.raises(ValueError, match="unknown letters"):
        _cuda.Launcher(fake, "pz")
    launch = _cuda.Launcher(fake, "piq")
    with pytest.raises(TypeError, match="3 arguments, got 2"):
        launch((1,), (32,), (None, 1))
    assert [name for name, _ in launch._struct._fields_] == ["a0", "a1", "a2"]
    # one struct.pack_into lays the arguments out as the C structure would (padding included)
    mixed = _cuda.Launcher(fake, "ipidqfQ")
    params, _, _ = mixed._buffers()
    values = (-3, 0xDEAD0000BEEF, np.int32(7), np.float64(2.5), -(2 ** 40), np.float32(1.5), np.uintp(9))
    mixed._pack(params, 0, *values)
    ref = mixed._struct.from_buffer_copy(params.raw)
    assert (ref.a0, ref.a1, ref.a2, ref.a3, ref.a4, ref.a5, ref.a6) == (-3, 0xDEAD0000BEEF, 7, 2.5, -(2 ** 40), 1.5, 9)
    assert _cuda.index_letter(np.int32) == "i" and _cuda.index_letter(np.int64) == "q"


def test_launcher_signatures_read_from_the_kernel_declarations():
    """_cuda.signature reads a kernel's parameter letters from its .cu declaration (spgemm and the
    async TSM2 launch by it); it agrees with the signatures written by hand for other kernels, and
    a kernel not declared once or a type without a letter is an error, not a guess. (The launch
    paths of spmv, sptrans and tsm2 now read theirs the same way; the letters below are the ones
    they wrote by hand before.)"""
    from matplan.kernels import _cuda
    assert _cuda.signature("spgemm/hash_shared.cu", "numeric_shared") == "ppppppppiiipqppipip"   # skip: guesses
    assert _cuda.signature("spgemm/hash_esc.cu", "numeric_esc") == "ppppppppipqpppip"
    assert _cuda.signature("spgemm/hash_analysis.cu", "classify_rows") == "pppiqpiqiiippp"
    assert _cuda.signature("tsgemm/tsm2.cu", "tsm2_split_sum") == "piqipqq"            # tsm2.py's
    assert _cuda.signature("tsgemm/tsm2.cu", "tsm2_colmajor") == "pqpqpqqiiiiqpqqp"      # tsm2.py's
    assert _cuda.signature("tsgemm/tsm2_async.cu", "tsm2_rowmajor_async") == "pqpqpqqiiii"
    assert _cuda.signature("spmv/spmv.cu", "csr_split", I="q") == "qipppppqqpppppppp"  # spmv.py's, int64
    assert _cuda.signature("sptrans/radix.cu", "spt_radix_pass") == "pippppqpiiipppppppppip"  # sptrans.py's, only_if last
    with pytest.raises(ValueError, match="declared 0 times"):
        _cuda.signature("spgemm/hash_shared.cu", "no_such_kernel")
    with pytest.raises(ValueError, match="type 'I' has no letter"):
        _cuda.signature("spmv/spmv.cu", "csr_split")


def test_result_shape_names_b_when_it_does_not_fit():
    assert fmt.result_shape((5, 3), np.float64, np.ones(3)) == (5,)
    assert fmt.result_shape((5, 3), np.float64, np.ones((3, 4))) == (5, 4)
    for bad in (np.ones(4), np.ones((4, 2)), np.ones((3, 2, 1))):
        with pytest.raises(ValueError, match=r"^B: expected shape \(3,\) or \(3, k\)"):
            fmt.result_shape((5, 3), np.float64, bad)
    with pytest.raises(TypeError, match="^B: dtype float32 does not match A's float64"):
        fmt.result_shape((5, 3), np.dtype(np.float64), np.ones(3, np.float32))
