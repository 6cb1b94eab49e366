"""GPU tests of the values-only replay (kernels/spgemm/values.py, guesses' values replays): the
kept product lists against a NumPy reference, replays against SciPy in float64 on fresh random
inputs (the pool poisoned with NaN before each call), messy operands, changed values and
structures, the memory rule and plans' runs."""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import int64_indices, messy_csr, random_csr
import matplan.kernels.spgemm as spgemm
from matplan.kernels.spgemm import guesses, rules, values
from spgemm_gpu_helpers import _dev

pytestmark = pytest.mark.gpu


@pytest.fixture
def hs(cp):
    spgemm.forget_guesses()
    yield spgemm
    spgemm.forget_guesses()


def _poison(cp):
    junk = cp.full(1 << 24, np.nan)
    del junk


def _host(M):
    """A SciPy CSR of the GPU matrix's arrays as they are, in float64."""
    return sp.csr_matrix((M.data.get().astype(np.float64), M.indices.get(), M.indptr.get()), shape=M.shape)


def _check(C, A, B, rtol):
    """C (GPU) equals A @ B in float64 within rtol of |A| @ |B|; every entry written and finite."""
    Ah, Bh = _host(A), _host(B)
    got = C.get() if hasattr(C, "get") else C
    assert np.all(np.isfinite(got.data)), "unwritten (NaN-poisoned) entries"
    ref, bound = (Ah @ Bh).toarray(), (abs(Ah) @ abs(Bh)).toarray()
    err = np.abs(got.toarray() - ref)
    assert (err <= rtol * bound + 1e-300).all()


def _reference_lists(A, B, C):
    """(off, keys) of the setup computed on the host: every product's entry of C, in product order."""
    Ap, Aj, Bp, Bj = (x.get() for x in (A.indptr, A.indices, B.indptr, B.indices))
    Cp, Cj = C.indptr.get(), C.indices.get()
    lists = [[] for _ in range(C.nnz)]
    for i in range(A.shape[0]):
        row = {int(c): Cp[i] + t for t, c in enumerate(Cj[Cp[i]:Cp[i + 1]])}
        for a in range(Ap[i], Ap[i + 1]):
            for b in range(Bp[Aj[a]], Bp[Aj[a] + 1]):
                lists[row[int(Bj[b])]].append((a << 32) | b)
    off = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
    keys = np.array([k for x in lists for k in x], dtype=np.uint64)
    return off, keys


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_setup_lists_and_replay(cp, hs, rng, dtype, rtol):
    """The kept lists equal the host's (product order within each entry of C); a replay after the
    values change is right, twice bitwise the same, and C's arrays are new each run."""
    A = _dev(cp, random_csr(rng, 400, 300, 0.03), dtype)
    B = _dev(cp, random_csr(rng, 300, 250, 0.04), dtype)
    C = hs.spgemm(A, B)
    r = values.ValuesReplay(A, B, C)
    off, keys = _reference_lists(A, B, C)
    np.testing.assert_array_equal(r.off.get(), off)
    np.testing.assert_array_equal(r.keys.get(), keys)
    assert r.kept_bytes == rules.values_kept_bytes(r.products, C.nnz, A.shape[0], A.indptr.size + A.indices.size
                                                   + B.indptr.size + B.indices.size)
    A.data[:] = cp.asarray(rng.standard_normal(A.nnz).astype(dtype))
    B.data *= -3
    _poison(cp)
    C1 = r.run(A, B)
    _check(C1, A, B, rtol)
    _poison(cp)
    C2 = r.run(A, B)
    assert cp.array_equal(C1.data, C2.data) and cp.array_equal(C1.indices, C.indices)
    assert cp.array_equal(C1.indptr, C.indptr) and C1.has_canonical_format
    assert len({int(M.data.data.ptr) for M in (C, C1, C2)}) == 3
    assert len({int(M.indices.data.ptr) for M in (C, C1, C2)}) == 3


@pytest.mark.parametrize("lanes", [1, 4, 32])
@pytest.mark.parametrize("wide", [False, True])
def test_lanes_and_wide_offsets(cp, hs, rng, monkeypatch, lanes, wide):
    """Every lane count an entry and int64 offsets (forced) give the same C as SciPy."""
    monkeypatch.setattr(rules, "values_lanes", lambda products, nnz_c: lanes)
    if wide:
        monkeypatch.setattr(rules, "values_offset_bytes", lambda products: 8)
    A = _dev(cp, random_csr(rng, 300, 200, 0.2))   # ~8 products an entry of C
    B = _dev(cp, random_csr(rng, 200, 250, 0.2))
    C = hs.spgemm(A, B)
    r = values.ValuesReplay(A, B, C)
    assert r.lanes == lanes and r.off.dtype == (np.int64 if wide else np.int32)
    A.data *= 0.5
    _poison(cp)
    _check(r.run(A, B), A, B, 1e-12)


def test_messy_operands(cp, hs, rng):
    """Empty rows, a very long row, duplicate and unsorted indices in A and B: summed like SciPy,
    as spgemm sums them; the setup's C is spgemm's own (explicit zeros kept)."""
    A = _dev(cp, messy_csr(rng, 300, 200))
    B = _dev(cp, messy_csr(rng, 200, 150))
    C = hs.spgemm(A, B)
    r = values.ValuesReplay(A, B, C)
    _poison(cp)
    C1 = r.run(A, B)
    _check(C1, A, B, 1e-12)
    np.testing.assert_allclose(C1.data.get(), C.data.get(), rtol=1e-12, atol=1e-12)
    A.data[:] = cp.asarray(rng.standard_normal(A.nnz))
    _poison(cp)
    _check(r.run(A, B), A, B, 1e-12)


def test_long_entries_sorted_by_blocks(cp, hs, rng, monkeypatch):
    """Entries of more products than VALUES_SHORT_SEGMENT take values_sort_long (a dense row of A
    over dense columns of B): lists still in product order; past VALUES_MAX_SEGMENT the setup is
    refused with the reason."""
    n = 400   # ~290 products an entry of C: more than a block's tile of 256 keys
    A = _dev(cp, sp.random(40, n, density=0.9, format="csr", random_state=1) + sp.eye(40, n, format="csr"))
    B = _dev(cp, sp.random(n, 30, density=0.8, format="csr", random_state=2))
    C = hs.spgemm(A, B)
    r = values.ValuesReplay(A, B, C)
    assert int((r.off[1:] - r.off[:-1]).max()) > max(rules.VALUES_SHORT_SEGMENT, 256)
    off, keys = _reference_lists(A, B, C)
    np.testing.assert_array_equal(r.keys.get(), keys)
    _check(r.run(A, B), A, B, 1e-12)
    monkeypatch.setattr(rules, "VALUES_MAX_SEGMENT", 100)
    with pytest.raises(values.ValuesRefused, match="VALUES_MAX_SEGMENT"):
        values.ValuesReplay(A, B, C)


def test_empty_operands(cp, hs):
    import cupyx.scipy.sparse as csp
    for A, B in ((csp.csr_matrix((50, 40)), csp.csr_matrix((40, 30))),
                 (csp.csr_matrix((0, 40)), _dev(cp, sp.random(40, 30, density=0.1, format="csr", random_state=3))),
                 (_dev(cp, sp.random(20, 40, density=0.1, format="csr", random_state=4)), csp.csr_matrix((40, 30)))):
        C = hs.spgemm(A, B)
        r = values.ValuesReplay(A, B, C)
        C1 = r.run(A, B)
        assert C1.shape == C.shape and C1.nnz == C.nnz == 0


def test_structure_changed_is_detected(cp, hs, rng):
    """indices or indptr rewritten in place (same sizes): run raises _Misguess, never a wrong C."""
    from matplan.kernels.spgemm import analysis
    A = _dev(cp, random_csr(rng, 200, 200, 0.05))
    B = _dev(cp, random_csr(rng, 200, 150, 0.05))
    r = values.ValuesReplay(A, B, hs.spgemm(A, B))
    B.indices[-1] = (int(B.indices[-1]) + 1) % 150
    with pytest.raises(analysis._Misguess):
        r.run(A, B)
    B.indices[-1] = (int(B.indices[-1]) - 1) % 150
    r.run(A, B)
    A.indptr[1] += 1
    with pytest.raises(analysis._Misguess):
        r.run(A, B)


def test_c_not_the_product_is_refused(cp, hs, rng):
    """A C missing one of A @ B's entries, or holding one no product reaches, is refused."""
    Ah = random_csr(rng, 100, 80, 0.1).tolil()
    Ah.rows[0], Ah.data[0] = [], []   # row 0 of C empty
    A = _dev(cp, sp.csr_matrix(Ah))
    B = _dev(cp, random_csr(rng, 80, 60, 0.1))
    C = hs.spgemm(A, B)
    with pytest.raises(values.ValuesRefused, match="missing"):
        values.ValuesReplay(A, B, _drop_one(cp, C))
    extra = _dev(cp, sp.csr_matrix(([1.0], ([0], [0])), shape=C.shape))
    with pytest.raises(values.ValuesRefused, match="no product"):
        values.ValuesReplay(A, B, _dev(cp, _host(C) + _host(extra)))


def _drop_one(cp, C):
    """C less one stored entry (a pattern missing one of A @ B's columns)."""
    import cupyx.scipy.sparse as csp
    H = sp.csr_matrix((C.data.get(), C.indices.get(), C.indptr.get()), shape=C.shape).tolil()
    i = int(np.flatnonzero(np.diff(C.indptr.get()))[0])
    H.rows[i], H.data[i] = H.rows[i][1:], H.data[i][1:]
    return csp.csr_matrix(sp.csr_matrix(H))


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_spgemm_calls_set_up_then_replay(cp, hs, rng, dtype, rtol):
    """spgemm(values=True): the first call notes the pair, the second computes C and sets the
    replay up, later calls replay values; values changed in place are read; every result right."""
    A = _dev(cp, random_csr(rng, 2000, 1500, 0.003), dtype)
    B = _dev(cp, random_csr(rng, 1500, 1200, 0.004), dtype)
    for i in range(5):
        if i == 3:
            A.data *= -1.5
            B.data[:] = cp.asarray(rng.standard_normal(B.nnz).astype(dtype))
        _poison(cp)
        info = {}
        C = hs.spgemm(A, B, values=True, info=info)
        _check(C, A, B, rtol)
        assert info["values_replay"] is (i >= 2)
        assert ("values_setup_ms" in info) is (i == 1)
    assert isinstance(guesses.values_kept(A, B), values.ValuesReplay)
    assert hs.spgemm(A, B, info=info) is not None and info["values_replay"] is False   # values=False
    hs.spgemm(A, B, values=True, guess=False, info=info)
    assert info["values_replay"] is False


def test_spgemm_structure_changed_recomputes(cp, hs, rng):
    A = _dev(cp, random_csr(rng, 1000, 800, 0.005))
    B = _dev(cp, random_csr(rng, 800, 600, 0.006))
    for _ in range(3):
        hs.spgemm(A, B, values=True)
    A.indices[:] = cp.asarray(rng.integers(0, 800, A.nnz).astype(np.int32))   # unsorted, maybe duplicates
    info = {}
    _poison(cp)
    C = hs.spgemm(A, B, values=True, info=info)
    assert str(info["values_replay"]).startswith("refuted")
    _check(C, A, B, 1e-12)
    for i in range(3):   # noted again, set up again, replayed
        _poison(cp)
        C = hs.spgemm(A, B, values=True, info=info)
        _check(C, A, B, 1e-12)
    assert info["values_replay"] is True


def test_memory_rule_keeps_the_guess(cp, hs, rng, monkeypatch):
    """A cap below the replay's bytes: the setup is refused (the reason in info), not retried,
    and the calls keep the guess replay."""
    monkeypatch.setattr(rules, "VALUES_MAX_BYTES", 1024)
    A = _dev(cp, random_csr(rng, 1500, 1500, 0.003))
    for i in range(4):
        _poison(cp)
        info = {}
        C = hs.spgemm(A, A, values=True, info=info)
        _check(C, A, A, 1e-12)
        if i >= 1:
            assert str(info["values_replay"]).startswith("not kept") and "VALUES_MAX_BYTES" in info["values_replay"]
        if i >= 1 and info.get("one_pass"):
            assert info["guessed"]
    assert isinstance(guesses.values_kept(A, A), str)


def test_int64_indices_fall_back(cp, hs, rng):
    """Operands with int64 indices keep no replay (their call converts them anew): every call is
    a full product, right."""
    A = int64_indices(cp, _dev(cp, random_csr(rng, 500, 500, 0.01)))
    with pytest.raises(values.ValuesRefused, match="int32"):
        values.ValuesReplay(A, A, hs.spgemm(A, A))
    for _ in range(3):
        info = {}
        _check(hs.spgemm(A, A, values=True, info=info), A, A, 1e-12)
        assert info["values_replay"] is False


def test_out_rewrites_values(cp, hs, rng):
    A = _dev(cp, random_csr(rng, 300, 300, 0.02))
    C = hs.spgemm(A, A)
    r = values.ValuesReplay(A, A, C)
    A.data *= 2
    ptr = C.data.data.ptr
    assert r.run(A, A, out=C) is C and C.data.data.ptr == ptr
    _check(C, A, A, 1e-12)
    with pytest.raises(ValueError, match="out"):
        r.run(A, A, out=C[:10].tocsr())


def test_plan_runs_replay_values(cp, hs, rng):
    """A plan's repeated runs on the same operands take the values replay; values changed in place
    are read."""
    from matplan.planner import plan as make_plan
    A = _dev(cp, random_csr(rng, 1500, 1500, 0.003))
    B = _dev(cp, random_csr(rng, 1500, 1000, 0.003))
    p = make_plan(A, B, measure="never")
    if p.kernel != "spgemm.hash":
        pytest.skip(f"the planner took {p.kernel}")
    for i in range(4):
        if i == 3:
            B.data *= 4
        _poison(cp)
        _check(p.run(A, B), A, B, 1e-12)
    assert isinstance(guesses.values_kept(A, B), values.ValuesReplay)
