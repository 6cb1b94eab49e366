"""Work units of a tuning run: one problem each (a corpus matrix or a matrix file, the op, k and
dtype), named by a key the database records, and the lists of them ``matplan tune`` runs."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from .. import corpus
from ..core.validation import TSGEMM_MAX_K, TSGEMM_MIN_ASPECT
from ..corpus._common import make_rng, random_values
from ..corpus.io import MATRIX_SUFFIXES, read_matrix
from ..corpus.io import matrix_name as _file_matrix_name

#: Default dense-B widths for SpMM, and k for the tall-and-skinny products.
SPMM_KS = (4, 16)
TSGEMM_KS = (1, 2, 4, 8, 16, 32)
#: Sizes whose matrices are also squared (SpGEMM); 'large' is too big for A @ A on most GPUs.
SPGEMM_SIZES = ("small", "medium", "spgemm")
#: Ops of a sparse matrix of each size ('spgemm' holds matrices chosen for A @ A only).
DEFAULT_OPS = ("spmv", "spmm", "spgemm", "tsgemm")


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    """One problem to tune: which matrix, which op, k and dtype. Cheap to pickle; built by the worker."""
    origin: str                  # "corpus" or "file"
    matrix: str                  # "poisson3d-small", or the file's stem
    family: str                  # leave-family-out evaluation groups by this
    op: str
    k: int
    dtype: str
    size: str = ""               # corpus size name
    path: str = ""               # file path
    seed: int = 0
    layout: str = "C"            # dense operands' memory order (tall-and-skinny products)

    @property
    def key(self) -> str:
        where = (f"corpus:{self.family}:{self.size}:{self.seed}" if self.origin == "corpus"
                 else f"file:{self.path}:{self.seed}")
        return f"{where}|{self.op}|k={self.k}|{self.dtype}" + ("" if self.layout == "C" else f"|{self.layout}")

    @classmethod
    def from_key(cls, key: str, family: str = "", matrix: str = "") -> "WorkUnit":
        """The unit whose :attr:`key` is ``key`` (``family``/``matrix`` as recorded beside it)."""
        try:
            where, op, k, dtype, *rest = key.split("|")
            origin, spec = where.split(":", 1)
            spec, seed = spec.rsplit(":", 1)
            unit = dict(op=op, k=int(k.removeprefix("k=")), dtype=dtype, seed=int(seed),
                        layout=rest[0] if rest else "C")
            fam, size = spec.split(":", 1) if origin == "corpus" else (None, None)
        except ValueError as e:
            raise ValueError(f"source: {key!r} is not a work unit key "
                             "('corpus:FAMILY:SIZE:SEED|OP|k=K|DTYPE' or 'file:PATH:SEED|...')") from e
        if origin == "corpus":
            return cls("corpus", matrix or f"{fam}-{size}", fam, size=size, **unit)
        if origin == "file":
            name = matrix or matrix_name(Path(spec))
            return cls("file", name, family or name, path=spec, **unit)
        raise ValueError(f"source: {key!r} starts with neither 'corpus:' nor 'file:'")

    def build(self):
        """Host operands (A, B) of the problem."""
        dtype = np.dtype(self.dtype)
        if self.origin == "corpus" and self.family in corpus.DENSE_FAMILIES:
            shape = corpus.SIZES[self.size][self.family]
            return corpus.tall_skinny(shape["n"], self.k, dtype, seed=self.seed, layout=self.layout,
                                      m=shape.get("m"))
        if self.origin == "corpus":
            A = corpus.load(self.family, self.size, seed=self.seed)
        elif self.origin == "file":
            A = read_matrix(self.path, self.seed)
        else:
            raise ValueError(f"origin: expected 'corpus' or 'file', got {self.origin!r}")
        A = A.astype(dtype)
        if self.op == "spgemm":
            return A, (A if A.shape[0] == A.shape[1] else A.T.tocsr())
        rng = make_rng(self.seed + 1)
        count = A.shape[1] * (1 if self.op == "spmv" else self.k)
        B = random_values(rng, count, signed=True, dtype=dtype)
        return A, (B if self.op == "spmv" else B.reshape(A.shape[1], self.k))


def _sparse_ops(size, ops):
    if size == "spgemm":
        return [op for op in ops if op == "spgemm"]
    return [op for op in ops if op in ("spmv", "spmm") or (op == "spgemm" and size in SPGEMM_SIZES)]


def _sparse_units(origin, matrix, family, ops, spmm_ks, dtypes, seed, size="", path=""):
    for dtype in dtypes:
        for op in ops:
            for k in ((1,) if op == "spmv" else spmm_ks if op == "spmm" else (0,)):
                yield WorkUnit(origin, matrix, family, op, k, dtype, size=size, path=path, seed=seed)


def corpus_units(sizes=("small",), families=None, ops=DEFAULT_OPS, spmm_ks=SPMM_KS,
                 tsgemm_ks=TSGEMM_KS, dtypes=("float64", "float32"), seed=0,
                 tsgemm_layouts=("C", "F")) -> list:
    """Work units of the built-in corpus: every family of every size, for every op, k and dtype
    (and for the tall-and-skinny products, both memory orders)."""
    units = []
    for size in sizes:
        if size not in corpus.SIZES:
            raise ValueError(f"sizes: {size!r} is not a corpus size; expected some of {sorted(corpus.SIZES)}")
        fams = [f for f in corpus.SIZES[size] if families is None or f in families]
        for fam in fams:
            if fam in corpus.DENSE_FAMILIES:
                if "tsgemm" not in ops:
                    continue
                n = corpus.SIZES[size][fam]["n"]
                ks = [k for k in tsgemm_ks if k <= TSGEMM_MAX_K and n >= TSGEMM_MIN_ASPECT * k]
                units += [WorkUnit("corpus", f"{fam}-{size}", fam, "tsgemm", k, dt,
                                   size=size, seed=seed, layout=lay)
                          for dt in dtypes for k in ks for lay in tsgemm_layouts]
            else:
                units += _sparse_units("corpus", f"{fam}-{size}", fam, _sparse_ops(size, ops), spmm_ks,
                                       dtypes, seed, size=size)
    if families is not None:
        unknown = set(families) - set(corpus.FAMILIES)
        if unknown:
            raise ValueError(f"families: unknown {sorted(unknown)}; expected some of {sorted(corpus.FAMILIES)}")
    # two sizes may name the same matrix (same generator arguments): tune it once
    seen, unique = set(), []
    for u in units:
        ident = (u.family, tuple(sorted(corpus.SIZES[u.size][u.family].items())), u.seed, u.op, u.k,
                 u.dtype, u.layout)
        if ident not in seen:
            seen.add(ident)
            unique.append(u)
    return unique


def matrix_name(path: Path) -> str:
    """A matrix file's name without its suffix (one of MATRIX_SUFFIXES): its tuning family."""
    return _file_matrix_name(path) or path.stem


def file_units(paths, ops=("spmv", "spmm", "spgemm"), spmm_ks=SPMM_KS, dtypes=("float64", "float32"),
               seed=0) -> list:
    """Work units of matrix files (.mtx, .mtx.gz, .npz): files, or folders of them. Each file is its own family."""
    files = []
    for p in ([paths] if isinstance(paths, (str, Path)) else paths):
        p = Path(p)
        if p.is_dir():
            files += sorted(q for q in p.iterdir() if q.is_file() and q.name.endswith(MATRIX_SUFFIXES))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"matrix files: no file or folder at {p}")
    units = []
    for f in files:
        name = matrix_name(f)
        ops_here = [op for op in ops if op in ("spmv", "spmm", "spgemm")]
        units += _sparse_units("file", name, name, ops_here, spmm_ks, dtypes, seed, path=str(f.resolve()))
    return units


__all__ = ["WorkUnit", "corpus_units", "file_units", "matrix_name", "SPMM_KS", "TSGEMM_KS", "SPGEMM_SIZES",
           "DEFAULT_OPS"]
