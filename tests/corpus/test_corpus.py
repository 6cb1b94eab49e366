"""Corpus: generated families (structure, canonical CSR, seeds), size registry, file loaders."""
import json

import numpy as np
import pytest
import scipy.io as sio
import scipy.sparse as sp

from matplan import corpus
from matplan.corpus import io as cio

SEEDED = [f for f in corpus.SPARSE_FAMILIES if corpus._takes_seed(corpus.FAMILIES[f])]


def expected_shape(family, kw):
    return {
        "poisson2d": lambda: (kw["n"] ** 2,) * 2,
        "poisson3d": lambda: (kw["n"] ** 3,) * 2,
        "rmat": lambda: (2 ** kw["scale"],) * 2,
        "uniform": lambda: (kw["m"], kw["n"]),
        "skewed": lambda: (kw["m"], kw.get("n", kw["m"])),
        "block_dense": lambda: (kw["nblocks"] * kw["block"],) * 2,
        "banded": lambda: (kw["n"],) * 2,
    }[family]()


def assert_canonical(A):
    """Float64 CSR, int32 indices, columns strictly increasing inside every row, in range."""
    assert isinstance(A, sp.csr_matrix)
    assert A.dtype == np.float64
    assert A.indices.dtype == np.int32 and A.indptr.dtype == np.int32
    ip = A.indptr.astype(np.int64)
    assert ip[0] == 0 and ip[-1] == A.nnz == len(A.indices) and np.all(np.diff(ip) >= 0)
    idx = A.indices.astype(np.int64)
    rows = np.repeat(np.arange(A.shape[0]), np.diff(ip))
    same_row = rows[1:] == rows[:-1]
    assert np.all(idx[1:][same_row] > idx[:-1][same_row]), "unsorted or duplicated columns"
    assert idx.min() >= 0 and idx.max() < A.shape[1]


def same_matrix(A, B):
    return (A.shape == B.shape and np.array_equal(A.indptr, B.indptr)
            and np.array_equal(A.indices, B.indices) and np.array_equal(A.data, B.data))


# --------------------------------------------------------------------------- every family

@pytest.mark.parametrize("family", corpus.SPARSE_FAMILIES)
def test_small_family_is_canonical_and_nonzero(family):
    A = corpus.load(family, "small")
    assert A.shape == expected_shape(family, corpus.SIZES["small"][family])
    assert 0 < A.nnz <= 50_000
    assert_canonical(A)
    assert np.all(np.isfinite(A.data)) and np.all(A.data != 0)
    assert len(np.unique(A.data)) > 1, "values must not be all equal"


@pytest.mark.parametrize("family", SEEDED)
def test_seeded_families_reproduce(family):
    A = corpus.load(family, "small", seed=0)
    assert same_matrix(A, corpus.load(family, "small", seed=0))
    B = corpus.load(family, "small", seed=1)
    assert not same_matrix(A, B)
    # random values: magnitudes in [0.5, 1.5]
    assert np.all(np.abs(A.data) >= 0.5) and np.all(np.abs(A.data) <= 1.5)


def test_iter_corpus_yields_every_sparse_family():
    names = [name for name, A in corpus.iter_corpus("small")]
    assert names == [f"{f}-small" for f in corpus.SPARSE_FAMILIES]
    (name, (A, B)), = corpus.iter_corpus("small", families="tall_skinny")
    assert name == "tall_skinny-small" and A.shape == (256, 256) and B.shape == (256, 4)
    for family, size, shape in (("rect_skinny", "small", (1024, 2048)), ("rect_skinny", "medium", (65536, 1024)),
                                ("tall_narrow", "small", (8192, 256)), ("tall_narrow", "medium", (131072, 512))):
        A, B = corpus.load(family, size)
        assert A.shape == shape and B.shape[0] == shape[1]
    assert set(corpus.DENSE_FAMILIES) | set(corpus.SPARSE_FAMILIES) == set(corpus.FAMILIES)


def test_registry_errors_name_the_argument():
    with pytest.raises(ValueError, match="family"):
        corpus.load("nope")
    with pytest.raises(ValueError, match="size"):
        corpus.load("rmat", "huge")
    with pytest.raises(ValueError, match="tall_skinny"):
        corpus.load("tall_skinny", "spgemm")
    with pytest.raises(TypeError):
        corpus.SIZES["small"]["rmat"]["scale"] = 30     # the registry is read-only


def test_large_sizes_reach_five_million_nonzeros():
    """Families whose nnz follows from the arguments (no build needed)."""
    L = corpus.SIZES["large"]
    n = L["poisson2d"]["n"]
    assert 5 * n * n - 4 * n >= 5_000_000
    n = L["poisson3d"]["n"]
    assert 7 * n ** 3 - 6 * n ** 2 >= 5_000_000
    assert L["uniform"]["m"] * L["uniform"]["nnz_per_row"] >= 5_000_000
    b = L["block_dense"]
    assert b["nblocks"] * b["block"] * (b["block"] + 2 * (b["block"] // 8)) >= 5_000_000
    n, w = L["banded"]["n"], L["banded"]["bandwidth"]
    assert n * (2 * w + 1) - w * (w + 1) >= 5_000_000
    assert 16 * 2 ** L["rmat"]["scale"] >= 5_000_000 / 0.9     # duplicates take < 10%


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="points"):
        corpus.poisson2d(8, points=7)
    with pytest.raises(ValueError, match="points"):
        corpus.poisson3d(8, points=9)
    with pytest.raises(ValueError, match="nnz_per_row"):
        corpus.uniform(10, 5, 6)
    with pytest.raises(TypeError, match="n must be an integer"):
        corpus.banded(10.5, 2)
    with pytest.raises(ValueError, match="a \\+ b \\+ c"):
        corpus.rmat(5, a=0.6, b=0.3, c=0.3)
    with pytest.raises(ValueError, match="seed"):
        corpus.uniform(10, 10, 2, seed=None)
    with pytest.raises(ValueError, match="coupling"):
        corpus.block_dense(3, 4, coupling=3)
    with pytest.raises(ValueError, match="layout"):
        corpus.tall_skinny(8, 2, layout="X")


# --------------------------------------------------------------------------- structure

@pytest.mark.parametrize("dim,points,diag", [(2, 5, 4.0), (2, 9, 20.0), (3, 7, 6.0), (3, 27, 26.0)])
def test_poisson_stencil_structure(dim, points, diag):
    n = 6
    A = (corpus.poisson2d if dim == 2 else corpus.poisson3d)(n, points=points)
    assert A.shape == (n ** dim,) * 2
    assert_canonical(A)
    assert (A - A.T).nnz == 0, "must be symmetric"
    rl = np.diff(A.indptr)
    centre = np.ravel_multi_index((n // 2,) * dim, (n,) * dim)
    assert rl[centre] == points                       # interior row: the full stencil
    assert A[centre, centre] == diag
    assert A[centre].sum() == pytest.approx(0.0)      # interior rows sum to zero
    corner_count = 2 ** dim if points in (9, 27) else dim + 1   # itself + neighbours inside
    assert rl[0] == corner_count
    assert np.all(A.sum(axis=1) >= -1e-12)            # boundary rows: diagonally dominant
    assert np.linalg.eigvalsh(A.toarray()).min() > 0  # Dirichlet: positive definite


def test_poisson3d_7pt_counts():
    n = 10
    A = corpus.poisson3d(n)
    assert A.nnz == 7 * n ** 3 - 6 * n ** 2
    assert np.sum(np.diff(A.indptr) == 7) == (n - 2) ** 3


def test_rmat_is_power_law_like():
    A = corpus.load("rmat", "small")
    rl = np.diff(A.indptr)
    assert rl.max() >= 20 * rl.mean()
    E = 16 * 2 ** corpus.SIZES["small"]["rmat"]["scale"]
    assert 0.5 * E < A.nnz <= E                      # duplicates merged, not many
    assert np.all(A.data >= 0.5)                     # graph weights are positive
    U = corpus.rmat(10, seed=3, permute=False)       # unpermuted: hub is vertex 0
    assert np.argmax(np.diff(U.indptr)) == 0


def test_skewed_has_few_very_long_rows():
    A = corpus.load("skewed", "small")
    rl = np.diff(A.indptr)
    assert rl.min() >= 1
    assert rl.max() >= 100 * np.median(rl)
    assert rl.max() == A.shape[0] // 10               # one row of m/10 nonzeros
    assert np.mean(rl <= 4) > 0.99                    # most rows have 1-4 nonzeros


def test_uniform_exact_row_counts_and_full_rows():
    A = corpus.uniform(300, 200, 7, seed=5)
    assert np.all(np.diff(A.indptr) == 7)
    assert np.sum(np.bincount(A.indices, minlength=200) > 0) > 190   # columns spread out
    F = corpus.uniform(20, 16, 16, seed=5)                               # rows completely full
    assert_canonical(F)
    assert np.array_equal(F.indices, np.tile(np.arange(16), 20))


def test_block_dense_structure():
    nblocks, block = 6, 16
    A = corpus.block_dense(nblocks, block, seed=2)
    cw = block // 8
    assert np.all(np.diff(A.indptr) == block + 2 * cw)
    D = A.toarray()
    for i in range(nblocks):                         # diagonal blocks are fully dense
        s = slice(i * block, (i + 1) * block)
        assert np.all(D[s, s] != 0)
    assert not np.all(corpus.block_dense(1, 8).toarray() == 0)   # one block, no coupling


def test_banded_structure():
    n, w = 50, 3
    A = corpus.banded(n, w, seed=1)
    r, c = A.nonzero()
    assert np.all(np.abs(r - c) <= w)
    assert A.nnz == n * (2 * w + 1) - w * (w + 1)
    S = corpus.banded(n, w, seed=1, density=0.3)
    assert np.all(S.diagonal() != 0) and S.nnz < A.nnz


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["C", "F"])
def test_tall_skinny(dtype, layout):
    A, B = corpus.tall_skinny(64, 4, dtype=dtype, seed=1, layout=layout)
    assert A.shape == (64, 64) and B.shape == (64, 4)
    assert A.dtype == dtype and B.dtype == dtype
    assert A.flags[f"{layout}_CONTIGUOUS"] and B.flags[f"{layout}_CONTIGUOUS"]
    assert np.all(np.abs(A) >= 0.5) and np.all(np.abs(A) <= 1.5)
    assert (A < 0).any() and (A > 0).any()
    A2, B2 = corpus.tall_skinny(64, 4, dtype=dtype, seed=1, layout=layout)
    assert np.array_equal(A, A2) and np.array_equal(B, B2)
    A3, B3 = corpus.tall_skinny(64, 4, dtype=dtype, seed=1, layout=layout, m=64)   # m = n: the same draw
    assert np.array_equal(A, A3) and np.array_equal(B, B3)
    R, S = corpus.tall_skinny(64, 4, dtype=dtype, seed=1, layout=layout, m=96)
    assert R.shape == (96, 64) and S.shape == (64, 4) and R.flags[f"{layout}_CONTIGUOUS"]
    with pytest.raises(ValueError, match="m"):
        corpus.tall_skinny(64, 4, m=0)


# --------------------------------------------------------------------------- Matrix Market

def test_mtx_roundtrip(tmp_path):
    A = corpus.load("uniform", "small")
    path = cio.write_mtx(tmp_path / "a.mtx", A)
    assert path == tmp_path / "a.mtx" and path.is_file()           # no suffix appended
    B = corpus.read_mtx(path)
    assert_canonical(B)
    assert same_matrix(A, B)                                        # exact values
    D = np.array([[1.5, 0.0], [0.0, -2.25]])
    corpus.write_mtx(tmp_path / "dense", D)
    assert np.array_equal(corpus.read_mtx(tmp_path / "dense").toarray(), D)


def test_mtx_pattern_gets_seeded_values(tmp_path):
    P = sp.random(30, 20, density=0.2, format="coo", random_state=0)
    sio.mmwrite(str(tmp_path / "p.mtx"), P, field="pattern")
    A = corpus.read_mtx(tmp_path / "p.mtx", seed=4)
    assert A.nnz == P.nnz and np.all((A.data >= 0.5) & (A.data < 1.5))
    assert same_matrix(A, corpus.read_mtx(tmp_path / "p.mtx", seed=4))


def test_mtx_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.mtx"):
        corpus.read_mtx(tmp_path / "missing.mtx")
    bad = tmp_path / "bad.mtx"
    bad.write_text("this is not a matrix\n1 2 3\n")
    with pytest.raises(ValueError, match="bad.mtx"):
        corpus.read_mtx(bad)
    with pytest.raises(FileNotFoundError, match="nodir"):
        corpus.write_mtx(tmp_path / "nodir" / "a.mtx", sp.eye(3, format="csr"))


# --------------------------------------------------------------------------- .npz format

def write_npz(path, shape, indptr, indices, data=None):
    arrays = dict(shape=np.array(shape, dtype=np.int64), indptr=np.array(indptr, dtype=np.int32),
                  indices=np.array(indices, dtype=np.int32))
    if data is not None:
        arrays["data"] = np.array(data, dtype=np.float64)
    np.savez(path, **arrays)
    return path


def test_npz_loader(tmp_path):
    # row 0 unsorted, row 1 empty, row 2 with a duplicate (summed)
    p = write_npz(tmp_path / "w.npz", (3, 4), [0, 2, 2, 5], [3, 1, 0, 2, 2], [1.0, 2.0, 3.0, 4.0, 5.0])
    A = corpus.load_npz_matrix(p)
    assert_canonical(A)
    expected = np.array([[0, 2, 0, 1], [0, 0, 0, 0], [3, 0, 9, 0]], dtype=float)
    assert np.array_equal(A.toarray(), expected)

    q = write_npz(tmp_path / "pat.npz", (2, 3), [0, 2, 3], [0, 2, 1])
    P = corpus.load_npz_matrix(q, seed=7)
    assert_canonical(P)
    assert np.array_equal(P.indices, [0, 2, 1])
    assert np.all((P.data >= 0.5) & (P.data < 1.5))
    assert same_matrix(P, corpus.load_npz_matrix(q, seed=7))
    assert not same_matrix(P, corpus.load_npz_matrix(q, seed=8))


def test_npz_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.npz"):
        corpus.load_npz_matrix(tmp_path / "absent.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ValueError, match="junk.npz"):
        corpus.load_npz_matrix(junk)
    nokeys = tmp_path / "nokeys.npz"
    np.savez(nokeys, shape=np.array([2, 2]))
    with pytest.raises(ValueError, match="nokeys.npz.*indices"):
        corpus.load_npz_matrix(nokeys)
    badptr = write_npz(tmp_path / "badptr.npz", (2, 2), [0, 3, 1], [0, 1, 0])
    with pytest.raises(ValueError, match="badptr.npz.*indptr"):
        corpus.load_npz_matrix(badptr)
    badcol = write_npz(tmp_path / "badcol.npz", (2, 2), [0, 1, 2], [0, 5])
    with pytest.raises(ValueError, match="badcol.npz.*column"):
        corpus.load_npz_matrix(badcol)


# --------------------------------------------------------------------------- real matrices

def test_real_matrices_folder_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv(cio.MATRICES_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        list(corpus.real_matrices(tmp_path / "nowhere"))
    monkeypatch.setenv(cio.MATRICES_ENV, str(tmp_path / "nowhere_env"))
    with pytest.raises(FileNotFoundError, match="MATPLAN_MATRICES"):
        corpus.matrices_dir()
    monkeypatch.delenv(cio.MATRICES_ENV)
    # no argument, no variable, no ../shared/matrices: nothing, not an error
    monkeypatch.setattr(cio, "_REPO_ROOT", tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    assert corpus.matrices_dir() is None
    assert list(corpus.real_matrices()) == []
    # a folder with one npz and one mtx, found through the variable
    d = tmp_path / "mats"
    d.mkdir()
    write_npz(d / "tiny.npz", (2, 2), [0, 1, 2], [1, 0], [2.0, 3.0])
    corpus.write_mtx(d / "eye.mtx", sp.eye(3, format="csr"))
    (d / "notes.txt").write_text("ignored")
    monkeypatch.setenv(cio.MATRICES_ENV, str(d))
    got = dict(corpus.real_matrices())
    assert sorted(got) == ["eye", "tiny"]
    assert np.array_equal(got["tiny"].toarray(), [[0, 2], [3, 0]])


def _shared_matrices():
    try:
        return cio.matrices_dir()
    except FileNotFoundError:
        return None


@pytest.mark.skipif(_shared_matrices() is None or not (_shared_matrices() / "index.json").is_file(),
                    reason="shared real matrices folder not present")
def test_real_matrices_match_index():
    d = _shared_matrices()
    index = {e["name"]: e for e in json.loads((d / "index.json").read_text())}
    assert len(index) == 6
    seen = {}
    for name, A in corpus.real_matrices(d):
        assert_canonical(A)
        seen[name] = A
        assert A.shape == tuple(index[name]["shape"]), name
        assert A.nnz == index[name]["nnz"], name
        assert np.diff(A.indptr).max() == index[name]["row_max"], name
    assert sorted(seen) == sorted(index)
    assert corpus.matrix_index(d) and len(corpus.matrix_index(d)) == 6
