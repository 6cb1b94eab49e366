"""Seeded synthetic matrices, one function per structure family.

Each sparse generator returns a ``scipy.sparse.csr_matrix`` of float64 with
sorted, duplicate-free column indices and int32 indices (int64 only when nnz
or a dimension exceeds 2**31 - 1). Random families draw everything from
``numpy.random.default_rng(seed)``, so a seed gives the same matrix on every
machine; their values have magnitude in [0.5, 1.5) (never zero, never all
ones), signed where a sign is natural (general matrices) and positive for
graphs (edge weights). Stencil matrices carry the real stencil weights.
All work is vectorised: a 5-10M-nonzero matrix builds in 0.1-1.5 s on two cores.
"""
from __future__ import annotations

import itertools

import numpy as np

from ._common import (CHUNK, check_int, csr_pattern_from_keys, make_csr, make_rng, masked_rows,
                      random_values, sampled_rows)

# --------------------------------------------------------------------------- stencils

#: Stencil weights by (dimension, points): {offset: weight}. Dirichlet boundary
#: (neighbours outside the grid are dropped, the diagonal stays), so every
#: matrix is symmetric positive definite and interior rows sum to zero.
#: 9-point: the compact fourth-order ("Mehrstellen") Laplacian scaled by 6h^2;
#: 27-point: the HPCG stencil (26 on the diagonal, -1 for every neighbour).
_STENCILS = {
    (2, 5): {(0, 0): 4.0, (-1, 0): -1.0, (1, 0): -1.0, (0, -1): -1.0, (0, 1): -1.0},
    (2, 9): {o: (20.0 if o == (0, 0) else -4.0 if 0 in o else -1.0)
             for o in itertools.product((-1, 0, 1), repeat=2)},
    (3, 7): {o: (6.0 if o == (0, 0, 0) else -1.0)
             for o in itertools.product((-1, 0, 1), repeat=3) if sum(map(abs, o)) <= 1},
    (3, 27): {o: (26.0 if o == (0, 0, 0) else -1.0)
              for o in itertools.product((-1, 0, 1), repeat=3)},
}


def _stencil_matrix(n: int, dim: int, points: int):
    """Matrix of a ``points``-point stencil on an n^dim grid, C-order numbering."""
    stencil = _STENCILS[(dim, points)]
    offsets = np.array(list(stencil), dtype=np.int64)           # (P, dim)
    weights = np.array(list(stencil.values()))
    strides = n ** np.arange(dim - 1, -1, -1, dtype=np.int64)   # C order
    delta = offsets @ strides
    order = np.argsort(delta)                                   # columns ascend within a row
    offsets, weights, delta = offsets[order], weights[order], delta[order]
    N = n ** dim
    point = np.arange(N, dtype=np.int64)
    mask = np.ones((N, len(delta)), dtype=bool)
    for d in range(dim):                                        # loop over dimensions only
        coord = (point // strides[d]) % n
        shifted = coord[:, None] + offsets[None, :, d]
        mask &= (shifted >= 0) & (shifted < n)
    cols = point[:, None] + delta[None, :]
    indptr, indices = masked_rows(cols, mask)
    data = np.broadcast_to(weights, mask.shape)[mask]
    return make_csr(indptr, indices, data, (N, N))


def poisson2d(n: int, points: int = 5):
    """2-D Poisson matrix on an n x n grid (n^2 rows): 5-point or 9-point stencil."""
    n = check_int("n", n, 1)
    if points not in (5, 9):
        raise ValueError(f"points must be 5 or 9 for poisson2d, got {points!r}")
    return _stencil_matrix(n, 2, points)


def poisson3d(n: int, points: int = 7):
    """3-D Poisson matrix on an n x n x n grid (n^3 rows): 7-point or 27-point stencil."""
    n = check_int("n", n, 1)
    if points not in (7, 27):
        raise ValueError(f"points must be 7 or 27 for poisson3d, got {points!r}")
    return _stencil_matrix(n, 3, points)


# --------------------------------------------------------------------------- random families

def rmat(scale: int, edge_factor: int = 16, a: float = 0.57, b: float = 0.19, c: float = 0.19,
         seed=0, permute: bool = True):
    """R-MAT (Kronecker) power-law graph, Graph500 parameters: 2^scale vertices.

    ``edge_factor * 2^scale`` directed edges are drawn, each by ``scale``
    quadrant choices with probabilities (a, b, c, 1-a-b-c); duplicate edges
    are merged (so nnz is somewhat below the number drawn) and self-loops
    kept. With ``permute`` the vertex labels are shuffled, as Graph500 does,
    so the hubs are not all in the first rows. Values: positive weights.
    Edges are drawn in chunks of ``CHUNK`` (all bit levels of a chunk, then the
    next chunk), so the matrix of a seed is fixed by that constant.
    """
    scale = check_int("scale", scale, 1)
    edge_factor = check_int("edge_factor", edge_factor, 1)
    if scale > 31:
        raise ValueError(f"scale must be <= 31, got {scale}")
    for name, p in (("a", a), ("b", b), ("c", c)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    if a + b + c > 1:
        raise ValueError(f"a + b + c must be <= 1 (d = 1 - a - b - c), got {a + b + c}")
    rng = make_rng(seed)
    N = 1 << scale
    E = edge_factor * N
    rows = np.empty(E, dtype=np.uint32)
    cols = np.empty(E, dtype=np.uint32)
    r = np.empty(min(E, CHUNK), dtype=np.float32)
    down, right, far = (np.empty(len(r), dtype=bool) for _ in range(3))
    ab, abc = a + b, a + b + c
    for s in range(0, E, CHUNK):                    # cache-sized chunks of edges, then bit levels
        rw, cl = rows[s:s + CHUNK], cols[s:s + CHUNK]
        k = len(rw)
        rw[:] = 0
        cl[:] = 0
        for _ in range(scale):
            rng.random(out=r[:k], dtype=np.float32)
            np.greater_equal(r[:k], ab, out=down[:k])       # quadrants c, d: lower half
            np.greater_equal(r[:k], a, out=right[:k])
            right[:k] ^= down[:k]                           # quadrant b
            np.greater_equal(r[:k], abc, out=far[:k])
            right[:k] |= far[:k]                            # quadrant d
            rw <<= 1
            rw |= down[:k]
            cl <<= 1
            cl |= right[:k]
    if permute:
        perm = rng.permutation(N)
        key = perm[rows] * N + perm[cols]           # key = row * N + col (int64)
    else:
        key = rows.astype(np.int64) * N + cols
    del rows, cols
    indptr, indices = csr_pattern_from_keys(key, (N, N))
    return make_csr(indptr, indices, random_values(rng, len(indices), signed=False), (N, N))


def uniform(m: int, n: int, nnz_per_row: int, seed=0):
    """Random m x n matrix with exactly ``nnz_per_row`` distinct random columns in every row."""
    m, n = check_int("m", m, 1), check_int("n", n, 1)
    nnz_per_row = check_int("nnz_per_row", nnz_per_row, 1)
    if nnz_per_row > n:
        raise ValueError(f"nnz_per_row ({nnz_per_row}) must be <= n ({n})")
    rng = make_rng(seed)
    indptr, indices = sampled_rows(np.full(m, nnz_per_row), n, rng)
    return make_csr(indptr, indices, random_values(rng, len(indices), signed=True), (m, n))


def skewed(m: int, n: int | None = None, seed=0, short_max: int = 4, n_long: int | None = None,
           long_min: int = 1000, long_max: int | None = None, locality: float = 0.5,
           window: int = 256):
    """Web-graph-like (webbase) matrix: most rows 1..short_max nonzeros, a few very long rows.

    Short rows draw their length uniformly from 1..short_max; a fraction
    ``locality`` of them take their columns from a window of 2*window+1
    columns around the diagonal (link locality of crawl-ordered pages), the
    rest anywhere. ``n_long`` rows (default ``max(1, m // 50000)``) are long:
    one has exactly ``long_max`` nonzeros (default ``m // 10``, at most n),
    the others a log-uniform length in [long_min, long_max]. Values: positive.
    """
    m = check_int("m", m, 1)
    n = m if n is None else check_int("n", n, 1)
    short_max = check_int("short_max", short_max, 1)
    n_long = max(1, m // 50000) if n_long is None else check_int("n_long", n_long, 0)
    long_max = min(n, max(1, m // 10)) if long_max is None else check_int("long_max", long_max, 1)
    long_min = check_int("long_min", long_min, 1)
    window = check_int("window", window, 0)
    if short_max > n:
        raise ValueError(f"short_max ({short_max}) must be <= n ({n})")
    if long_max > n:
        raise ValueError(f"long_max ({long_max}) must be <= n ({n})")
    if n_long > m:
        raise ValueError(f"n_long ({n_long}) must be <= m ({m})")
    if not 0 <= locality <= 1:
        raise ValueError(f"locality must be in [0, 1], got {locality!r}")
    long_min = min(long_min, long_max)
    rng = make_rng(seed)

    counts = rng.integers(1, short_max + 1, size=m, dtype=np.int64)
    span = np.full(m, n, dtype=np.int64)
    start = np.zeros(m, dtype=np.int64)
    width = min(n, 2 * window + 1)
    local = rng.random(m) < locality
    centre = np.arange(m, dtype=np.int64) * n // m
    span[local] = width
    start[local] = np.clip(centre[local] - window, 0, n - width)

    long_rows = rng.choice(m, size=n_long, replace=False)
    lengths = np.exp(rng.uniform(np.log(long_min), np.log(long_max), size=n_long))
    lengths = np.clip(np.rint(lengths).astype(np.int64), long_min, long_max)
    if n_long:
        lengths[0] = long_max
    counts[long_rows] = lengths
    span[long_rows] = n
    start[long_rows] = 0

    indptr, indices = sampled_rows(counts, n, rng, span=span, start=start)
    return make_csr(indptr, indices, random_values(rng, len(indices), signed=False), (m, n))


def block_dense(nblocks: int, block: int, seed=0, coupling: int | None = None,
                coupling_width: int | None = None):
    """Power-flow-like (TSOPF) matrix: dense diagonal blocks plus dense coupling bands.

    ``nblocks`` dense ``block x block`` diagonal blocks; block-row i is also
    coupled to ``coupling`` other block-columns (default min(2, nblocks-1),
    chosen at random), each through a dense band of ``coupling_width``
    columns (default block // 8, at least 1) at a random offset inside that
    block. Every row of a block-row has the same column set, like the
    repeated dense structures of TSOPF_RS. Values: random sign.
    """
    nblocks, block = check_int("nblocks", nblocks, 1), check_int("block", block, 1)
    coupling = min(2, nblocks - 1) if coupling is None else check_int("coupling", coupling, 0)
    cw = max(1, block // 8) if coupling_width is None else check_int("coupling_width",
                                                                   coupling_width, 1)
    if coupling > nblocks - 1:
        raise ValueError(f"coupling ({coupling}) must be <= nblocks - 1 ({nblocks - 1})")
    if cw > block:
        raise ValueError(f"coupling_width ({cw}) must be <= block ({block})")
    rng = make_rng(seed)
    N = nblocks * block
    # Coupled block-columns of each block-row: distinct, never the diagonal block.
    if coupling:
        other = sampled_rows(np.full(nblocks, coupling), nblocks - 1, rng)[1].reshape(nblocks, coupling)
    else:
        other = np.zeros((nblocks, 0), dtype=np.int64)
    other += other >= np.arange(nblocks)[:, None]
    band_start = other * block + rng.integers(0, block - cw + 1, size=other.shape)
    diag = np.arange(nblocks, dtype=np.int64)[:, None] * block + np.arange(block)
    bands = (band_start[:, :, None] + np.arange(cw)).reshape(nblocks, coupling * cw)
    colset = np.sort(np.concatenate([diag, bands], axis=1), axis=1)   # (nblocks, L), distinct
    L = colset.shape[1]
    indices = np.broadcast_to(colset[:, None, :], (nblocks, block, L)).reshape(-1)
    indptr = np.arange(N + 1, dtype=np.int64) * L
    return make_csr(indptr, indices, random_values(rng, len(indices), signed=True), (N, N))


def banded(n: int, bandwidth: int, seed=0, density: float = 1.0):
    """n x n band matrix: entries with |i - j| <= bandwidth.

    ``density`` < 1 keeps each off-diagonal band entry with that probability
    (the diagonal is always kept, so no row is empty). Values: random sign.
    """
    n = check_int("n", n, 1)
    bandwidth = check_int("bandwidth", bandwidth, 0)
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    rng = make_rng(seed)
    offsets = np.arange(-bandwidth, bandwidth + 1, dtype=np.int64)
    cols = np.arange(n, dtype=np.int64)[:, None] + offsets
    mask = (cols >= 0) & (cols < n)
    if density < 1:
        mask &= (rng.random(mask.shape) < density) | (offsets == 0)
    indptr, indices = masked_rows(cols, mask)
    return make_csr(indptr, indices, random_values(rng, len(indices), signed=True), (n, n))


# --------------------------------------------------------------------------- dense

def tall_skinny(n: int, k: int, dtype=np.float64, seed=0, layout: str = "C", m: int | None = None):
    """Dense operands of the tall-and-skinny product: A (m x n, m = n by default: the TSM2 paper's
    square A) and B (n x k).

    Values have magnitude in [0.5, 1.5) and a random sign, drawn directly in
    ``dtype`` (float32 or float64). ``layout`` 'C' gives row-major arrays,
    'F' column-major ones (the TSM2 paper's layout); no copy is made either way.
    """
    n, k = check_int("n", n, 1), check_int("k", k, 1)
    m = n if m is None else check_int("m", m, 1)
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    if layout not in ("C", "F"):
        raise ValueError(f"layout must be 'C' or 'F', got {layout!r}")
    rng = make_rng(seed)
    A = random_values(rng, m * n, signed=True, dtype=dtype).reshape((m, n), order=layout)
    B = random_values(rng, n * k, signed=True, dtype=dtype).reshape((n, k), order=layout)
    return A, B
