"""SpGEMM on the GPU: the RBSparse hash kernels (SEEDS section 1, ``spgemm.hash``) with their
one-pass, guessed and panel paths, the row-row segmented merge (``spgemm.merge``) and cuSPARSE
(``spgemm.cusparse``). Their cost models are in :mod:`matplan.models.spgemm`.

``spgemm(A, B)`` computes C = A @ B for cupyx CSR A (m x n) and B (n x k), float32 or float64, in
five steps:

1. analysis (GPU): ``csum``, the exclusive scan of nnz(B[j,:]) over A's nonzeros (int64), gives
   nnz_RowCt per row (the paper's row computation density) and a work index for every product;
   one launch (``classify_rows``) finds every row's table and the totals, one host transfer
   brings back the group sizes and the moments the balanced rule needs, ``bucket_rows`` groups;
2. symbolic pass: a shared-memory hash of column keys per row counts its distinct columns; the
   table is sized from nnz_RowCt (an upper bound, so it cannot overflow) where it fits, else the
   largest table is tried and a row that fills it goes to the global-memory path (a bitmap of
   B's columns, in shared memory where it fits, several blocks a row), as do rows whose paper
   estimate alpha = nnz_RowCt / pi already exceeds it;
3. exclusive scan of the exact row counts -> C's indptr, the numeric table of every row (one
   launch, one host transfer: total nnz, groups) and the allocation of C;
4. numeric pass grouped by the exact nnz of each row (the paper groups by its estimate alpha; the
   symbolic pass gives the true count, so a numeric table never overflows): keys by atomicCAS,
   values by atomicAdd, then the row is sorted by column in shared memory (by rank up to 256
   slots; above, by a bitmap of B's columns where it fits beside the table, else bitonic;
   ``sort=False`` skips it) and written out; rows larger than every shared table (or than 3/4 of
   the largest: NUMERIC_LAST_TABLE_LOAD) use the global path: by column segments summed in shared
   memory (numeric_global_seg, a block a segment of a row) for at most GLOBAL_SEG_MAX_SEGMENTS
   segments a row that fill the GPU, else dense slabs of B.shape[1] columns in global memory, in
   batches of the slabs half the L2 holds when they are many;
5. the groups' launches go to separate streams, joined to the caller's stream by events.

Short-row products skip steps 2-3 (the one-pass path), repeated calls on the same operands replay
their launches as a CUDA graph (guessed analyses), and a C too large for one cupyx CSR comes in
row panels or in host memory.

Semantics: duplicated and unsorted input indices are summed like SciPy. Products that cancel to
an exact zero stay stored as explicit zeros (C's pattern is the symbolic product's, as cuSPARSE
gives); SciPy's ``A @ B`` drops them. ``drop_zeros=True`` removes them to match SciPy's storage.
Product counts of any size are fine (int64 offsets). A and B are read with int32 indices: int64
index arrays that fit are copied to int32; a matrix with nnz or a dimension past 2^31 - 1 is
refused (ValueError naming it).

Modules, in the order a call meets them (names with a leading underscore are the package's own,
shared between its modules). A module reads its siblings' names qualified (``rules.MIN_TPR``,
imported as ``import matplan.kernels.spgemm.rules as rules``): a test or benchmark that sets a
constant on the module defining it reaches every reader.

* ``product``: ``spgemm()``, which picks the path;
* ``operands``: the operands' checks, int32 indices, a cupyx CSR built without a host sync;
* ``rules``: pure host-side rules (table ladder, launch shapes, row classes, the one-pass and
  lifted-table rules, the xp reference of the classification);
* ``runtime``: compiling and launching the kernels, streams, zeroed scratch, scans, memory queries;
* ``analysis``: the rows classified and grouped on the GPU (step 1), ``_Symbolic``;
* ``symbolic``: steps 1-3; ``numeric``: step 4 and the numeric kernels' launches;
* ``global_rows``: the global-memory path of long rows;
* ``one_pass``: the one-pass path; ``guesses``: guessed analyses, their graphs and the values
  replays kept; ``values``: the values-only replay of an unchanged pattern (``ValuesReplay``);
* ``panels``: row panels, ``out='host'``, ``spgemm_panels()``;
* ``kernel``: the ``spgemm.hash`` Kernel (candidates, cost, run); ``merge``: ``spgemm.merge``;
  ``vendor``: ``spgemm.cusparse``; ``transpose``: the sort-based SpTRANS baseline;
  ``cusparse_reuse``: cuSPARSE's SpGEMM with reuse prepared once (a benchmark baseline, not a
  candidate; not imported here).

Device code: ``hash_analysis.cu`` (scans, classify_rows, bucket_rows), ``hash_shared.cu`` (the
shared-memory tables), ``hash_esc.cu`` (numeric_esc), ``hash_global.cu`` (the global path),
``hash_compact.cu`` (the one-pass copy into C), ``values_replay.cu`` (the values-only replay), with ``hash_common.cuh``, ``hash_table.cuh``,
``block_scan.cuh`` and ``bitmaps.cuh``; ``spgemm_merge.cu`` for the merge.
"""
from . import kernel, merge, vendor  # noqa: F401  registers the kernels
from .guesses import forget_guesses
from .kernel import HashSpGEMM, SparseProduct, describe_groups, hash_path
from .merge import MergeSpGEMM, spgemm_merge
from .operands import check_csr, csr_from_parts, int32_operand
from .panels import host_available_bytes, panel_bounds, panel_bytes, predict_panels, spgemm_panels
from .product import spgemm
from .transpose import transpose_sort
from .vendor import CusparseSpGEMM

__all__ = ["spgemm", "spgemm_panels", "forget_guesses", "spgemm_merge", "transpose_sort", "HashSpGEMM",
           "MergeSpGEMM", "CusparseSpGEMM", "SparseProduct", "check_csr", "csr_from_parts", "int32_operand",
           "describe_groups", "hash_path", "panel_bounds", "panel_bytes", "predict_panels",
           "host_available_bytes"]
