"""SpTRANS cost model: the rules that choose among the segmented sort, the radix method and the
segmented merge (:mod:`matplan.kernels.sptrans`), and the fitted constants of each method and of
the cuSPARSE candidate (csr2csc).

The constants are fitted by benchmarks/sptrans_fit.py on runs of benchmarks/sptrans.py on an H100
(14 matrices a run): a fixed time plus bytes an entry of A at the copy bandwidth.
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


def radix_passes(n: int) -> tuple:
    """(passes, digit bits) of the radix method for n columns: as few passes of at most RADIX_BITS
    bits as cover column n - 1, the bits spread evenly over them."""
    bits = max(1, (int(n) - 1).bit_length())
    passes = -(-bits // RADIX_BITS)
    return passes, -(-bits // passes)


def auto_method(n: int, nnz: int) -> str:
    """method="auto"'s choice from the shape alone (no host synchronisation): "radix" when its
    passes are at most two (n <= 2^16) or the mean column is long (nnz / n >= RADIX_MEAN_COLUMN),
    where the segsort's per-column sorts dominate; else "segsort", whose work on short columns is
    less than three radix passes. nnz >= RADIX_NNZ_LIMIT: "segsort".

    The segsort's cost grows with long columns (bitonic sorts, merge rounds), the radix method's
    with log2(n) (its passes). H100, GPU time queued, float64, segsort / radix: Poisson 104 / 149
    us, world_highways 112 / 172, banded 145 / 237, rmat-scale17 401 / 187, wordnet 726 / 124,
    gene_go 536 / 139."""
    if nnz >= RADIX_NNZ_LIMIT:
        return "segsort"
    return "radix" if radix_passes(n)[0] <= 2 or nnz >= RADIX_MEAN_COLUMN * n else "segsort"


# --- fitted costs of a plan's run ----------------------------------------------
#: By method and dtype: (fixed seconds, bytes an entry of A at the copy bandwidth; the radix
#: method: bytes an entry a pass), relative least squares over two runs. The segsort and radix
#: methods are fitted on plan runs (the launches replayed as a CUDA graph): the segsort on the
#: matrices whose longest column holds at most 64 entries (measured / model 0.84-1.46), the radix
#: method on all (0.82-1.27; a fee an entry, not a pass, left 0.75-1.41); the merge on
#: transpose(A, method="merge") calls (0.79-1.77).
METHOD_COSTS = {"segsort": {"float64": (76.1e-6, 66.3), "float32": (74.2e-6, 57.6)},
                "radix": {"float64": (55.7e-6, 54.1), "float32": (54.6e-6, 46.7)},
                "merge": {"float64": (117.4e-6, 424.1), "float32": (110.9e-6, 420.9)}}
#: ... and the segmented sort's long rows of A.T (warp, block and merge sorts): bytes an entry of A
#: per doubling of the longest column past BINS[0], the median over the seven matrices whose
#: longest column holds 600-59,512 entries (48 B; 35-125 over those seven).
LONG_COLUMN_BYTES = 48.0

#: cuSPARSE's csr2csc through CuPy (``A.T.tocsr()``): (fixed seconds, bytes an entry of A at the
#: copy bandwidth) by dtype, relative least squares over two runs (measured / model 0.87-1.16).
CUSPARSE_TRANSPOSE_COSTS = {"float64": (135.4e-6, 177.5), "float32": (126.4e-6, 183.7)}
