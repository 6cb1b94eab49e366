"""SpTRANS on the GPU: CSR of A.T, rows sorted by column, stable and deterministic.

:func:`transpose` takes a cupyx CSR A (m x n, float32 or float64) and returns the cupyx CSR of
A.T (n x m) with no host synchronisation (the result is assembled with cupyx's ``_from_parts``,
which does not read the arrays back; cupyx's public ``csr_matrix((data, indices, indptr))`` waits
for the GPU in CuPy 14.2). Three methods, whose launches :mod:`.launches` describes:

``method="auto"`` (default): "radix" when it needs at most two passes (n <= 2^16), the mean
column holds at least RADIX_MEAN_COLUMN entries or A is wide (n >= RADIX_WIDE m), else "segsort"
(:func:`auto_method`, from the shape, so no host synchronisation). Deciding on the GPU instead
(both kernel sets launched, the unchosen one returning at once) cost more host time than it
saved: 0.94x CuPy's geomean against 1.07x for the radix method alone. Plans choose from A's longest column instead (:mod:`.kernel`).

``method="segsort"``: count, scan and scatter, then every row of A.T sorted by a thread, a warp,
a block or, past 4096 entries, chunks merged by rounds.

``method="radix"``: a stable LSD counting sort of A's entries by column in ceil(log2 n / 8)
passes after one pass over A's indices for the digit histograms; nothing sorted per row, and A.T's
indptr read off the sorted columns. nnz must be below 2^30 ("auto" takes the segsort past that).

``method="merge"``: the segmented merge of SEEDS section 3 in two cooperative launches; its cost
does not depend on the longest row of A.T.

Plans (``SpTrans.runner``) replay their launches as a CUDA graph from an A's second call, and the
graph first checks A's pattern against the one it was recorded with (:mod:`.replay`).

Keys order each row of A.T by row of A and then by position in A, so the transpose is stable and
deterministic: duplicated (i, j) entries of A stay separate entries of A.T, in A's order (SciPy's
``A.T.tocsr()`` keeps them too). The keys are unique (e is), so no sort needs to be stable. The
result has sorted indices; it is flagged canonical only when A is (known to be) canonical. Indices
must be int32 (int64 inputs are converted when every index, the shape and nnz fit below 2^31; else
OverflowError). Column indices out of [0, n) are skipped without a memory fault (the slots past
A.T's indptr[n] are then unspecified); ``check=True`` raises on them (one host transfer, after the
launches).
"""
from __future__ import annotations

import numpy as np

from ...core.xp import cupy_module, cupyx_sparse
from .. import _cuda
from ..spgemm.operands import check_csr
from ...models.sptrans import BINS, RADIX_NNZ_LIMIT, auto_method
from .compiled import BLOCK, ITEMS, MERGE_PHASES, PHASES, TILE, _kernels
from .launches import _check_bins, _int32_arrays, _merge, _segmented

METHODS = ("auto", "segsort", "radix", "merge")


def transpose(A, *, check: bool = False, method: str = "auto"):
    """CSR of A.T (cupyx), rows sorted by column; see the module docstring.

    check: verify A's column indices lie in [0, n) (waits for the GPU: one host transfer).
    method: "auto" (default: :func:`auto_method` picks "radix" or "segsort" from the shape),
        "segsort", "radix" or "merge" (the segmented merge); see the module docstring.
    """
    if method not in METHODS:
        raise ValueError(f"method: {method!r}; expected one of {METHODS}")
    return _transpose(A, check, None, method)


def _transpose(A, check, mark, method="auto", bins=BINS):
    """transpose(); ``mark`` (profiling only): None, or called with each phase's name after that
    phase is launched (the merge method then runs each phase in a launch of its own). ``bins``
    (segsort; tests force small ones to reach every sort path on small matrices): (short_max,
    warp_max, cap)."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("sptrans needs CuPy and an NVIDIA GPU")
    csp = cupyx_sparse()
    check_csr("A", A)
    m, n = A.shape
    dtype = np.dtype(A.dtype)
    indptr_a, indices = _int32_arrays(A)
    nnz = int(indices.size)
    if nnz == 0 or m == 0 or n == 0:
        return csp.csr_matrix((n, m), dtype=dtype)
    ks = _kernels(cp)
    ct = _cuda.ctype(dtype)
    if method == "radix" and nnz >= RADIX_NNZ_LIMIT:
        raise OverflowError(f"A: {nnz:,} nonzeros; method='radix' needs fewer than 2^30 (its look-back "
                            f"words), method='segsort' takes up to 2^31 - 1")
    if method == "auto":
        method = auto_method(m, n, nnz)
    if method != "merge":
        return _segmented(cp, ks, ct, A, indptr_a, indices, check, mark, _check_bins(bins), method)
    return _merge(cp, ks, ct, A, indptr_a, indices, check, mark)


__all__ = ["transpose", "BLOCK", "ITEMS", "TILE", "PHASES", "MERGE_PHASES", "BINS", "METHODS"]
