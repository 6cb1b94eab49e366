"""SpTRANS cost model: the rules that choose among the segmented sort, the radix method and the
segmented merge (:mod:`matplan.kernels.sptrans`), and the fitted constants of each method and of
the cuSPARSE candidate (csr2csc).

The constants are fitted by benchmarks/sptrans_fit.py on runs of benchmarks/sptrans.py on an H100:
a fixed time plus bytes an entry and a column of A at the copy bandwidth, for a first call and for
a plan's later (replayed) runs on the same A.
"""
from __future__ import annotations

# --- the segmented sort -------------------------------------------------------
#: Default length bins of the segmented sort: (short_max, warp_max, cap). A row of A.T of at most
#: short_max entries is sorted by a thread, up to warp_max by a warp, up to cap by a block, longer
#: ones in chunks of cap merged by rounds. They must stay within the kernels' limits
#: (kernels/sptrans/compiled.py SHORT_LIMIT, WARP_LIMIT, BLOCK_LIMIT).
BINS = (32, 512, 4096)

# --- the radix method ---------------------------------------------------------
#: Digit bits at most (segmented.cuh RDX_BINS = 2^8; columns below 2^31, so at most 4 passes).
RADIX_BITS = 8
#: The radix method needs fewer nonzeros than this: its look-back words are 32 bits (count << 2 | flag).
RADIX_NNZ_LIMIT = 2**30
#: method="auto" takes the radix method past this mean column length (nnz / n) even when it needs
#: three or four passes. H100, radix vs segsort alone as a multiple of CuPy's speed, float64:
#: rmat-scale17 (mean 14.8) 1.01 / 0.54, ice40 (22) 1.02 / 0.68; banded (17, no long column) 1.06
#: / 1.68 is the case this rule gets wrong (the planner, which knows the longest column, does not).
RADIX_MEAN_COLUMN = 14
#: ... and for wide matrices (n >= RADIX_WIDE m: short columns on average, but a doc-term matrix's
#: common terms are columns of tens of thousands of entries, which the shape does not show and the
#: segsort sorts by merge rounds). H100 GPU time, segsort / radix, float64, 47k x 755k with 1.8M
#: nonzeros: doc-term (Zipf columns, longest 33,070) 616 / 173 us, uniform 196 / 191; wordnet's
#: transpose (54k x 118k) 156 / 148.
RADIX_WIDE = 2


def radix_passes(n: int) -> tuple:
    """(passes, digit bits) of the radix method for n columns: as few passes of at most RADIX_BITS
    bits as cover column n - 1, the bits spread evenly over them."""
    bits = max(1, (int(n) - 1).bit_length())
    passes = -(-bits // RADIX_BITS)
    return passes, -(-bits // passes)


def auto_method(m: int, n: int, nnz: int) -> str:
    """method="auto"'s choice from the shape alone (no host synchronisation): "radix" when its
    passes are at most two (n <= 2^16), the mean column is long (nnz / n >= RADIX_MEAN_COLUMN),
    where the segsort's per-column sorts dominate, or A is wide (n >= RADIX_WIDE m), where long
    columns cannot be ruled out; else "segsort", whose work on short columns is less than three
    radix passes. nnz >= RADIX_NNZ_LIMIT: "segsort".

    The segsort's cost grows with long columns (bitonic sorts, merge rounds), the radix method's
    with log2(n) (its passes). H100, GPU time queued, float64, segsort / radix: Poisson 104 / 149
    us, world_highways 112 / 172, banded 145 / 237, rmat-scale17 401 / 187, wordnet 726 / 124,
    gene_go 536 / 139."""
    if nnz >= RADIX_NNZ_LIMIT:
        return "segsort"
    if radix_passes(n)[0] <= 2 or nnz >= RADIX_MEAN_COLUMN * n or n >= RADIX_WIDE * m:
        return "radix"
    return "segsort"


# --- fitted costs -----------------------------------------------------------------
#: First calls (``transpose(A, method=...)``, what a plan's first run on an A pays), by method and
#: dtype: (fixed seconds, bytes an entry of A (the radix method: an entry a pass), bytes a column
#: of A) at the copy bandwidth, relative least squares (benchmarks/sptrans_fit.py): the segsort on
#: the matrices whose longest column holds at most 64 entries, the others on all.
FIRST_CALL_COSTS = {"segsort": {"float64": (98.8e-6, 57.5, 135.8), "float32": (96.5e-6, 50.1, 115.6)},
                    "radix": {"float64": (71.3e-6, 57.1, 99.0), "float32": (69.4e-6, 49.8, 123.5)},
                    "merge": {"float64": (101.9e-6, 424.3, 209.5), "float32": (97.6e-6, 419.8, 186.2)}}
#: ... and the segmented sort's long rows of A.T (warp, block and merge sorts): bytes an entry of A
#: per doubling of the longest column past BINS[0], the median over the matrices whose longest
#: column holds more than 64 entries.
LONG_COLUMN_BYTES = 63.0
#: A plan's later runs on the same A (pattern replays of the segsort's or the radix method's graph:
#: A's pattern checked, its values gathered), by dtype: (fixed seconds, bytes an entry, bytes a
#: column) at the copy bandwidth.
REPLAY_COSTS = {"float64": (32.8e-6, 39.6, 38.1), "float32": (38.6e-6, 27.3, 26.0)}

#: cuSPARSE's csr2csc through CuPy (``A.T.tocsr()``), every call: (fixed seconds, bytes an entry of
#: A, bytes a column) at the copy bandwidth, by dtype.
CUSPARSE_TRANSPOSE_COSTS = {"float64": (101.0e-6, 185.4, 141.1), "float32": (111.8e-6, 164.3, 116.4)}
