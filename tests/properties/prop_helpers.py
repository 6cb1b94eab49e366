"""Strategies, the device fixture and the float64 comparison shared by the property-based tests.

Profiles (``HYPOTHESIS_PROFILE``, default ``ci``): ``ci`` runs a bounded, derandomized number of
examples per test so CI is reproducible; ``gpu`` and ``thorough`` run more. They are registered here
rather than in a ``tests/properties/conftest.py``: a second conftest module replaces the
``conftest`` that test modules of later folders import helpers from (``from conftest import ...``).

Data: hypothesis draws the shapes, the structure's traits (empty rows, one huge row, duplicate and
unsorted column indices, index dtype), dtypes, formats, layouts and where NaN / Inf go, plus a seed
for the bulk values (a seeded NumPy generator keeps large operands fast to draw). Values are never
zero, so ``0 * Inf`` (where BLAS and sparse kernels may legitimately differ) never arises, and at
most ~1e2 in size, so float32 never overflows where float64 does not: every NaN and Inf of a
result then sits where the float64 reference has it.
"""
import os

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st

from matplan.core.xp import cupy_module, cupyx_sparse

_COMMON = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=25, derandomize=True, **_COMMON)
settings.register_profile("gpu", max_examples=100, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=500, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

DTYPES = st.sampled_from([np.dtype(np.float32), np.dtype(np.float64)])
#: Elementwise tolerance of a result of this dtype, relative to (|A| @ |B|) in float64: sums of
#: at most a few hundred terms, each rounded once in the result's precision.
RTOL = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-11}
SPARSE_FORMATS = ("csr", "csc", "coo", "csr_array", "coo_array")
SPECIALS = ("none", "nan", "inf", "mixed")


# -- devices ------------------------------------------------------------------------------------

class Device:
    """Where a test's operands live: ``cpu`` (SciPy / NumPy) or ``gpu`` (CuPy / cupyx)."""

    def __init__(self, name, cp=None):
        self.name, self.cp = name, cp
        self.xp = np if cp is None else cp

    def dense(self, host, layout="C"):
        """``host`` on this device in ``layout``: C- or F-ordered, or a strided view (every other
        element of a buffer twice as long along the last axis)."""
        x = self.xp.asarray(np.ascontiguousarray(host))
        if layout == "F":
            return self.xp.asfortranarray(x)
        if layout == "strided":
            wide = self.xp.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype) if x.ndim else x
            wide[..., ::2] = x
            return wide[..., ::2]
        return x

    def sparse(self, host):
        """A host sparse matrix on this device, same format (a cupyx matrix for SciPy's arrays)."""
        if self.cp is None:
            return host
        csp, fmt = cupyx_sparse(), host.format
        as_matrix = {"csr": sp.csr_matrix, "csc": sp.csc_matrix, "coo": sp.coo_matrix}[fmt](host)   # entries kept
        M = {"csr": csp.csr_matrix, "csc": csp.csc_matrix, "coo": csp.coo_matrix}[fmt](as_matrix)
        if fmt == "csr" and host.indices.dtype == np.int64 and hasattr(csp.csr_matrix, "_from_parts"):
            M = csp.csr_matrix._from_parts(M.data, M.indices.astype(self.cp.int64),
                                           M.indptr.astype(self.cp.int64), M.shape)
        return M

    def empty(self, shape, dtype):
        """A NaN-poisoned output array: an element the product does not write stays NaN."""
        return self.xp.full(shape, np.nan, dtype=dtype)

    def host(self, x):
        return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else x


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)], scope="module")
def device(request):
    """Each property runs on the host and, marked ``gpu``, with CuPy / cupyx operands."""
    if request.param == "cpu":
        return Device("cpu")
    cp = cupy_module()
    if cp is None:
        pytest.skip("needs CuPy and an NVIDIA GPU")
    return Device("gpu", cp)


# -- values -------------------------------------------------------------------------------------

@st.composite
def specials(draw):
    """(kind, how many) of the special values to put into an operand."""
    kind = draw(st.sampled_from(SPECIALS))
    return kind, (0 if kind == "none" else draw(st.integers(1, 3)))


def values(rng, count, dtype, special=("none", 0)):
    """``count`` values of ``dtype``: |v| in [0.005, 150), both signs, never zero; then ``special``
    NaN / +-Inf at random positions."""
    v = (rng.random(count) + 0.5) * rng.choice([-1.0, 1.0], count) * 10.0 ** rng.integers(-2, 3, count)
    kind, n = special
    if kind != "none" and count:
        pool = {"nan": [np.nan], "inf": [np.inf, -np.inf], "mixed": [np.nan, np.inf, -np.inf]}[kind]
        where = rng.choice(count, size=min(n, count), replace=False)
        v[where] = rng.choice(pool, size=len(where))
    return v.astype(dtype)


# -- sparse structures --------------------------------------------------------------------------

@st.composite
def sparse_matrices(draw, m=None, n=None, max_dim=40):
    """A SciPy sparse matrix (or array) in one of SPARSE_FORMATS: empty rows, at times all of them;
    at times one huge row (up to 3 n entries, so with duplicates); duplicate and unsorted column
    indices; int32 or int64 indices; NaN / Inf among the values."""
    m = draw(st.integers(0, max_dim)) if m is None else m
    n = draw(st.integers(0, max_dim)) if n is None else n
    dtype = draw(DTYPES)
    index_dtype = draw(st.sampled_from([np.int32, np.int64]))
    fmt = draw(st.sampled_from(SPARSE_FORMATS))
    empty = draw(st.sampled_from([0.0, 0.3, 1.0]))
    longest = draw(st.integers(0, 6))
    huge = draw(st.booleans())
    duplicates, unsorted = draw(st.booleans()), draw(st.booleans())
    special = draw(specials())
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    lengths = rng.integers(0, longest + 1, m) if n else np.zeros(m, dtype=np.int64)
    if not duplicates:
        lengths = np.minimum(lengths, n)
    lengths[rng.random(m) < empty] = 0
    if huge and m and n:
        lengths[rng.integers(m)] = rng.integers(n, 3 * n + 1)
    cols = []
    for length in lengths:
        row = (rng.integers(0, n, length) if duplicates or length > n else rng.permutation(n)[:length])
        cols.append(row if unsorted else np.sort(row))
    indices = np.concatenate(cols).astype(index_dtype) if m else np.zeros(0, index_dtype)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(index_dtype)
    data = values(rng, len(indices), dtype, special)
    A = sp.csr_matrix((data, indices, indptr), shape=(m, n))
    A.indices, A.indptr = indices, indptr              # SciPy narrows int64 indices that fit
    A.has_sorted_indices = not unsorted and not duplicates
    return as_format(A, fmt, index_dtype)


def as_format(A, fmt, index_dtype):
    """CSR ``A`` in ``fmt`` (entries kept: duplicates stay duplicates), with ``index_dtype`` indices."""
    if fmt in ("csr", "csr_array"):
        M = A if fmt == "csr" else sp.csr_array(A)
    elif fmt == "csc":
        M = A.tocsc()
    else:
        M = A.tocoo() if fmt == "coo" else sp.coo_array(A.tocoo())
    if M.format == "coo":   # its row / col setters cast back to the old dtype
        M.coords = tuple(c.astype(index_dtype) for c in M.coords)
    else:
        M.indices, M.indptr = M.indices.astype(index_dtype), M.indptr.astype(index_dtype)
    return M


@st.composite
def dense_operands(draw, rows, ndim=None, k=None, max_k=8):
    """(host array, layout) of a dense B with ``rows`` rows: a vector or a 2-D matrix of ``k``
    columns (drawn up to ``max_k`` when None, 0 included), in C, F or strided layout, NaN / Inf at
    times."""
    ndim = draw(st.sampled_from([1, 2])) if ndim is None else ndim
    shape = (rows,) if ndim == 1 else (rows, draw(st.integers(0, max_k)) if k is None else k)
    dtype = draw(DTYPES)
    layout = draw(st.sampled_from(["C", "F", "strided"] if ndim == 2 else ["C", "strided"]))
    special = draw(specials())
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    return values(rng, int(np.prod(shape)), dtype, special).reshape(shape), layout


def traits(name, M):
    """Hypothesis events naming what an operand exercised (``--hypothesis-show-statistics``)."""
    event(f"{name}: {M.dtype}, {getattr(M, 'format', 'dense')}" + (f" {type(M).__name__}" if sp.issparse(M) else ""))
    values = M.data if sp.issparse(M) else M
    if min(M.shape, default=1) == 0 or values.size == 0:
        event(f"{name}: empty")
    if not np.isfinite(values).all():
        event(f"{name}: NaN or Inf")
    if sp.issparse(M):
        csr = sp.csr_matrix(M)
        event(f"{name}: {(M.indices if M.format != 'coo' else M.row).dtype} indices")
        lengths = np.diff(csr.indptr)
        if len(lengths) and lengths.max() > M.shape[1]:
            event(f"{name}: a row longer than n (duplicates)")
        if (lengths == 0).any():
            event(f"{name}: empty rows")


# -- the comparison -----------------------------------------------------------------------------

def dense_of(x):
    """A result as a float64 NumPy array (sparse results densified: duplicates summed)."""
    return (x.toarray() if sp.issparse(x) else np.asarray(x)).astype(np.float64)


def assert_close(got, ref, bound, dtype, what=""):
    """``got`` == ``ref`` (float64) elementwise: NaN and +-Inf at the same places, finite elements
    within RTOL[dtype] * ``bound`` (|A| @ |B| in float64)."""
    got = dense_of(got)
    assert got.shape == ref.shape, f"{what}shape {got.shape}, expected {ref.shape}"
    for name, test in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        differ = test(got) != test(ref)
        assert not differ.any(), (f"{what}{name} positions differ at {np.argwhere(differ)[:5].tolist()}: "
                                  f"got {got[differ][:5]}, expected {ref[differ][:5]}")
    finite = np.isfinite(ref)
    err = np.abs(got[finite] - ref[finite])
    tol = RTOL[np.dtype(dtype)] * bound[finite] + 1e-30
    assert (err <= tol).all(), f"{what}max error / tolerance {np.max(err / tol):.3g} (dtype {np.dtype(dtype)})"


def csr64(A):
    """Host sparse ``A`` as the float64 CSR matrix matplan reads it as: each entry cast as it is,
    then SciPy's ``tocsr`` (a COO's duplicates summed there, a CSC's kept). Not ``astype``, which
    sums duplicates first: SciPy's own products multiply each entry, so duplicates of opposite
    signs times an Inf give NaN, where their sum times it gives an Inf."""
    M = A.copy()
    M.data = A.data.astype(np.float64)
    return sp.csr_matrix(M.tocsr())


def abs_of(M):
    """|M| in float64: a host sparse M as :func:`csr64` (keeping its structure), or dense."""
    if sp.issparse(M):
        M = csr64(M)
        M.data = np.abs(M.data)
        return M
    return np.abs(np.asarray(M, dtype=np.float64))
