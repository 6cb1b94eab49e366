"""Matrix corpus for tests, tuning and benchmarks: seeded generators, named sizes, real matrices.

>>> from matplan import corpus
>>> A = corpus.load("poisson3d", "small")             # 4096 x 4096, 7-point stencil
>>> for name, A in corpus.iter_corpus("small"): ...   # every sparse family

Size sets (``SIZES``): 'small' is tiny (<= 50k nonzeros, built in
milliseconds) for CPU tests and the demo; 'medium' is 0.6-1M nonzeros;
'large' is 5-10M nonzeros per sparse family (the SpMV benchmark size);
'spgemm' keeps A·A affordable (3-D Poisson 64^3, R-MAT scale 16, ...;
products = sum over rows of nnz_RowCt, the multiply-adds of A·A).
"""
from __future__ import annotations

import inspect
from types import MappingProxyType

from .generators import (banded, block_dense, poisson2d, poisson3d, rmat, skewed, tall_skinny,
                         uniform)
from .io import (load_npz_matrix, matrices_dir, matrix_index, read_mtx, real_matrices,
                 write_mtx)

#: name -> generator
FAMILIES = MappingProxyType({
    "poisson2d": poisson2d,
    "poisson3d": poisson3d,
    "rmat": rmat,
    "uniform": uniform,
    "skewed": skewed,
    "block_dense": block_dense,
    "banded": banded,
    "tall_skinny": tall_skinny,
    "rect_skinny": tall_skinny,
    "tall_narrow": tall_skinny,
})
#: Families that return the dense pair (A, B) of a tall-and-skinny product: tall_skinny's A is
#: square (the TSM2 paper's), rect_skinny's is wide (small) or tall (medium, large), tall_narrow's is
#: very tall with few columns (points x features times a few centroids or a projection: K-means-like).
DENSE_FAMILIES = ("tall_skinny", "rect_skinny", "tall_narrow")
#: Families that return one CSR matrix.
SPARSE_FAMILIES = tuple(f for f in FAMILIES if f not in DENSE_FAMILIES)


def _frozen(sizes):
    return MappingProxyType({size: MappingProxyType({f: MappingProxyType(kw) for f, kw in fams.items()})
                             for size, fams in sizes.items()})


#: size -> family -> keyword arguments of the generator (seed excluded).
SIZES = _frozen({
    "small": {                                                      # nnz (seed 0)
        "poisson2d": dict(n=64, points=5),                          # 20,224
        "poisson3d": dict(n=16, points=7),                          # 27,136
        "rmat": dict(scale=11, edge_factor=16),                     # 25,622
        "uniform": dict(m=4000, n=3000, nnz_per_row=8),             # 32,000
        "skewed": dict(m=10000),                                    # 26,029, longest row 1,000
        "block_dense": dict(nblocks=8, block=32),                   # 10,240
        "banded": dict(n=5000, bandwidth=3),                        # 34,988
        "tall_skinny": dict(n=256, k=4),
        "rect_skinny": dict(m=1024, n=2048, k=4),
        "tall_narrow": dict(m=8192, n=256, k=4),
    },
    "medium": {
        "poisson2d": dict(n=400, points=5),                         # 798,400
        "poisson3d": dict(n=48, points=7),                          # 760,320
        "rmat": dict(scale=16, edge_factor=16),                     # 954,993
        "uniform": dict(m=100_000, n=100_000, nnz_per_row=8),       # 800,000
        "skewed": dict(m=300_000),                                  # 820,435, longest row 30,000
        "block_dense": dict(nblocks=32, block=128),                 # 655,360
        "banded": dict(n=100_000, bandwidth=4),                     # 899,980
        "tall_skinny": dict(n=4096, k=8),
        "rect_skinny": dict(m=65536, n=1024, k=8),
        "tall_narrow": dict(m=131072, n=512, k=8),
    },
    "large": {
        "poisson2d": dict(n=1024, points=5),                        # 5,238,784
        "poisson3d": dict(n=100, points=7),                         # 6,940,000
        "rmat": dict(scale=19, edge_factor=16),                     # 7,967,279
        "uniform": dict(m=1_000_000, n=1_000_000, nnz_per_row=8),   # 8,000,000
        "skewed": dict(m=2_000_000),                                # 6,756,449, longest row 200,000
        "block_dense": dict(nblocks=48, block=300),                 # 5,385,600
        "banded": dict(n=500_000, bandwidth=5),                     # 5,499,970
        "tall_skinny": dict(n=16384, k=16),                         # A is 2 GiB in float64
        "rect_skinny": dict(m=131072, n=2048, k=16),                # A is 2 GiB in float64
        "tall_narrow": dict(m=1 << 20, n=256, k=16),                 # A is 2 GiB in float64
    },
    "spgemm": {                                                     # nnz; products; nnz(A·A)
        "poisson3d": dict(n=64, points=7),                          # 1.81M; 12.5M; 6.4M
        "rmat": dict(scale=16, edge_factor=16),                     # 0.95M; 400M; 164M
        "uniform": dict(m=200_000, n=200_000, nnz_per_row=8),       # 1.60M; 12.8M; 12.8M
        "skewed": dict(m=500_000),                                  # 1.40M; 4.0M; 3.9M
        "block_dense": dict(nblocks=48, block=150),                 # 1.34M; 249M; 3.7M
        "banded": dict(n=200_000, bandwidth=8),                     # 3.40M; 57.8M; 6.6M
    },
})


def _takes_seed(generator) -> bool:
    return "seed" in inspect.signature(generator).parameters


def load(family: str, size: str = "small", seed=0):
    """The matrix (or dense pair, for the DENSE_FAMILIES) of ``family`` at the named ``size``.

    ``seed`` goes to the random families; stencil families have no randomness.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {family!r}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if family not in SIZES[size]:
        raise ValueError(f"size {size!r} has no {family!r} entry; it has {sorted(SIZES[size])}")
    kwargs = dict(SIZES[size][family])
    generator = FAMILIES[family]
    if _takes_seed(generator):
        kwargs["seed"] = seed
    return generator(**kwargs)


def iter_corpus(size: str, families=None, seed=0):
    """Yield ``(name, matrix)`` for each family of ``size``, built one at a time.

    ``families`` defaults to the sparse families the size lists; the name is
    ``"<family>-<size>"``.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if families is None:
        families = [f for f in SIZES[size] if f in SPARSE_FAMILIES]
    elif isinstance(families, str):
        families = [families]
    for family in families:
        yield f"{family}-{size}", load(family, size, seed)


__all__ = [
    "FAMILIES", "SPARSE_FAMILIES", "DENSE_FAMILIES", "SIZES", "load", "iter_corpus",
    "poisson2d", "poisson3d", "rmat", "uniform", "skewed", "block_dense", "banded", "tall_skinny",
    "read_mtx", "write_mtx", "load_npz_matrix", "real_matrices", "matrices_dir", "matrix_index",
]
