"""Reading and writing matrices: Matrix Market files and the shared ``.npz`` real matrices.

Every loader returns a float64 CSR matrix with sorted, duplicate-free
indices and int32 indices where they fit. Pattern-only files (no values) get
seeded random values in [0.5, 1.5), like the generated corpus, so products
are never computed on all-ones data by accident. A missing or unreadable file
raises an error that names the path.
"""
from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import scipy.io as sio
import scipy.sparse as sp

from ._common import make_csr, make_rng, random_values

#: Environment variable naming the folder of real matrices (overrides the search).
MATRICES_ENV = "MATPLAN_MATRICES"
_REPO_ROOT = Path(__file__).resolve().parents[2]
#: Suffixes of the matrix files read here.
MATRIX_SUFFIXES = (".npz", ".mtx", ".mtx.gz")


def _existing_file(path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what}: no file at {p}")
    return p


def _canonical(A: sp.spmatrix) -> sp.csr_matrix:
    """Float64 CSR, sorted and duplicate-free (duplicates summed), narrowest index type."""
    A = sp.csr_matrix(A, dtype=np.float64)
    A.sum_duplicates()                       # also sorts the indices
    return make_csr(A.indptr, A.indices, A.data, A.shape)


def read_mtx(path, seed=0) -> sp.csr_matrix:
    """Matrix Market file (``.mtx`` or ``.mtx.gz``) as float64 CSR.

    Symmetric files are expanded by SciPy; pattern files get values drawn from
    ``default_rng(seed)`` in [0.5, 1.5); complex files are refused.
    """
    p = _existing_file(path, "read_mtx")
    try:
        field = sio.mminfo(str(p))[4]
        M = sio.mmread(str(p))
    except Exception as e:  # SciPy raises ValueError, OSError, RuntimeError, ... on bad input
        raise ValueError(f"read_mtx: {p} is not a readable Matrix Market file: {e}") from e
    if field == "complex" or np.iscomplexobj(M.data if sp.issparse(M) else M):
        raise ValueError(f"read_mtx: {p} holds a complex matrix; only real matrices are supported")
    A = _canonical(M)
    if field == "pattern":
        A.data = random_values(make_rng(seed), A.nnz, signed=False)
    return A


def read_matrix(path, seed=0) -> sp.csr_matrix:
    """A matrix file by its suffix: ``.npz`` (the shared format or ``scipy.sparse.save_npz``'s) or
    Matrix Market (``.mtx``, ``.mtx.gz``); float64 CSR either way."""
    p = _existing_file(path, "read_matrix")
    return load_npz_matrix(p, seed) if p.suffix == ".npz" else read_mtx(p, seed)


def write_mtx(path, A) -> Path:
    """Write a sparse matrix or dense 2-D array to ``path`` exactly (no suffix added).

    Values are written with full round-trip precision; the file is 'general'
    (no symmetry detection, which would cost a transpose of a large matrix).
    """
    if not (sp.issparse(A) or (isinstance(A, np.ndarray) and A.ndim == 2)):
        raise TypeError(f"write_mtx: A must be a SciPy sparse matrix or a 2-D NumPy array, "
                        f"got {type(A).__name__}")
    p = Path(path)
    if not p.parent.is_dir():
        raise FileNotFoundError(f"write_mtx: folder {p.parent} does not exist (writing {p})")
    with open(p, "wb") as f:
        sio.mmwrite(f, A, symmetry="general")
    return p


def load_npz_matrix(path, seed=0) -> sp.csr_matrix:
    """A matrix in the shared ``.npz`` format (``shape``, ``indptr``, ``indices``, optional ``data``).

    Without ``data`` the matrix is a pattern and gets values from
    ``default_rng(seed)`` in [0.5, 1.5). Stored entries are kept as they are,
    explicit zeros included (world_highways has zero-length roads), so nnz
    matches the file; unsorted or duplicated indices are canonicalised.
    """
    p = _existing_file(path, "load_npz_matrix")
    try:
        with np.load(p, allow_pickle=False) as z:
            if "format" in z.files and z["format"].item() not in (b"csr", "csr"):
                return _canonical(sp.load_npz(p))        # scipy.sparse.save_npz of another format
            missing = {"shape", "indptr", "indices"} - set(z.files)
            if missing:
                raise ValueError(f"missing arrays {sorted(missing)} (has {sorted(z.files)})")
            shape = tuple(int(s) for s in z["shape"])
            indptr, indices = z["indptr"], z["indices"]
            data = z["data"] if "data" in z.files else None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"load_npz_matrix: {p} is not a readable .npz matrix: {e}") from e
    _check_csr_arrays(p, shape, indptr, indices, data)
    if data is None:
        data = random_values(make_rng(seed), len(indices), signed=False)
    A = sp.csr_matrix((np.asarray(data, dtype=np.float64), indices, indptr), shape=shape)
    if not A.has_canonical_format:
        A.sum_duplicates()
    return make_csr(A.indptr, A.indices, A.data, A.shape)


def _check_csr_arrays(p, shape, indptr, indices, data):
    def bad(msg):
        return ValueError(f"load_npz_matrix: {p}: {msg}")
    if len(shape) != 2 or min(shape) < 0:
        raise bad(f"shape must be two non-negative sizes, got {shape}")
    if indptr.ndim != 1 or len(indptr) != shape[0] + 1:
        raise bad(f"indptr has length {len(indptr)}, expected rows + 1 = {shape[0] + 1}")
    if indptr[0] != 0 or indptr[-1] != len(indices) or np.any(np.diff(indptr) < 0):
        raise bad("indptr must start at 0, never decrease and end at len(indices)")
    if len(indices) and (indices.min() < 0 or indices.max() >= shape[1]):
        raise bad(f"column indices must lie in [0, {shape[1]})")
    if data is not None and data.shape != indices.shape:
        raise bad(f"data has shape {data.shape}, indices {indices.shape}")


def matrices_dir(dir=None) -> Path | None:
    """The folder of real matrices, or None when there is none.

    Order: the ``dir`` argument, then ``$MATPLAN_MATRICES``: either, when
    given, must exist (FileNotFoundError otherwise, since a typo should not
    silently skip every real matrix). Then ``../shared/matrices`` next to the
    repository and next to the current directory; absent -> None.
    """
    for given, what in ((dir, "dir"), (os.environ.get(MATRICES_ENV) or None, MATRICES_ENV)):
        if given is not None:
            p = Path(given)
            if not p.is_dir():
                raise FileNotFoundError(f"real matrices folder {p} (from {what}) does not exist")
            return p
    for p in (_REPO_ROOT.parent / "shared" / "matrices", Path.cwd().parent / "shared" / "matrices"):
        if p.is_dir():
            return p
    return None


def matrix_index(dir=None) -> list[dict]:
    """The folder's ``index.json`` entries (name, shape, nnz, row statistics); [] when absent."""
    d = matrices_dir(dir)
    if d is None or not (d / "index.json").is_file():
        return []
    try:
        return json.loads((d / "index.json").read_text())
    except ValueError as e:
        raise ValueError(f"{d / 'index.json'} is not valid JSON: {e}") from e


def matrix_name(p: Path) -> str | None:
    """A matrix file's name without its suffix (one of MATRIX_SUFFIXES), None for other files."""
    for suffix in MATRIX_SUFFIXES:
        if p.name.endswith(suffix):
            return p.name[: -len(suffix)]
    return None


def real_matrices(dir=None, seed=0):
    """Yield ``(name, csr)`` for every matrix file (.npz, .mtx, .mtx.gz) of the real-matrix folder.

    Files are read one at a time, in name order. Yields nothing when no folder
    is found (see :func:`matrices_dir`). Pattern matrices get values from
    ``default_rng(seed)``.
    """
    d = matrices_dir(dir)
    if d is None:
        return
    for p in sorted(d.iterdir()):
        name = matrix_name(p)
        if name is None or not p.is_file():
            continue
        yield name, read_matrix(p, seed)
