"""The values-only replay of C = A @ B for an unchanged sparsity pattern (values_replay.cu).

A guessed call (guesses.py) still builds C's structure every time: the analysis, the numeric
pass's sort or hash of every row and C's offsets. When only the values change between calls
(an iterative method re-forming A @ B with the same patterns), all of that repeats what the last
call found. :class:`ValuesReplay` keeps, from one product C = A @ B, the list of the products that
sum into each entry of C: for entry e, keys[off[e]:off[e + 1]], each key an A entry a and a B entry
b (``a << 32 | b``: 8 bytes a product), in product order. A replay is then two launches: the
operands' indptr and indices compared with copies kept at setup (values_differ, one flag), and
C.data[e] = sum of A.data[a] * B.data[b] over e's keys (values_replay, in the keys' order, with a
fixed lane count an entry: the sums are the same every call). A changed structure raises
analysis._Misguess before C is returned: the caller recomputes C in full, never a wrong C.

Setup on the GPU (four kernels and the scan of hash_analysis.cu): each product located (its A and
B entries from the products' offsets csum, its entry of C by a binary search of its column in C's
sorted row) and counted per entry; the counts' scan gives ``off``; each product written into its
entry's range in the order atomics give; each entry's keys sorted by rank (keys are distinct,
and their order is the products' order: A entry, then B entry). The setup checks that C has
exactly A @ B's pattern (every product's column in its row of C, every entry of C reached):
C must be the unfiltered product (``drop_zeros=False``), rows sorted, no duplicates.

Semantics match ``spgemm``: duplicate and unsorted indices of A and B are summed (each duplicate
is a product of its own), products that cancel stay explicit zeros. Operands need int32 indices
(``guesses`` keeps no replay for others: their call converts them anew each time).
"""
from __future__ import annotations

import time

import numpy as np

from ...core.xp import cupy_module, cupyx_sparse
from .. import _cuda
import matplan.kernels.spgemm.analysis as analysis
import matplan.kernels.spgemm.operands as operands
import matplan.kernels.spgemm.rules as rules
import matplan.kernels.spgemm.runtime as runtime

#: values_differ's blocks a compared array (a grid-stride loop over it), values_sort_long's grid.
DIFFER_BLOCKS = 256
SORT_LONG_BLOCKS = 1024


class ValuesRefused(ValueError):
    """A values replay cannot be set up for these operands (the reason in the message)."""


def _structure(A, B) -> tuple:
    """The int32 arrays a replay checks: A's indptr and indices, and B's unless they are A's."""
    same = A.indptr.data.ptr == B.indptr.data.ptr and A.indices.data.ptr == B.indices.data.ptr
    return (A.indptr, A.indices) if same else (A.indptr, A.indices, B.indptr, B.indices)


def _int32_csr(name: str, M) -> None:
    if M.indices.dtype != np.int32 or M.indptr.dtype != np.int32:
        raise ValuesRefused(f"{name}: the values replay reads int32 indices, got {M.indices.dtype} / "
                            f"{M.indptr.dtype} (spgemm converts such operands on every call; keep them int32)")


class ValuesReplay:
    """C = A @ B's products by entry of C, kept to recompute C's values for new values of A and B
    of the same structure (the module's docstring). ``ValuesReplay(A, B, C)`` sets up from C =
    spgemm(A, B) (or any C holding exactly A @ B's pattern, rows sorted); ``run(A, B)`` returns a
    new C of the kept structure (``out=``: C's values written into a matrix of it instead).
    ``kept_bytes`` is what stays allocated; ``setup_ms`` the host time of the setup (its GPU work
    waited for). Raises ValuesRefused where the rule (rules.values_refusal) or the operands do not
    allow it (``free_bytes``: the device's free memory, None to read it)."""

    def __init__(self, A, B, C, *, free_bytes=None, check_memory: bool = True):
        cp = cupy_module()
        t0 = time.perf_counter()
        operands.check_operands(A, B)
        _int32_csr("A", A)
        _int32_csr("B", B)
        csp = cupyx_sparse()
        m, k = A.shape[0], B.shape[1]
        if not csp.isspmatrix_csr(C) or C.shape != (m, k):
            raise ValuesRefused(f"C: expected a cupyx CSR of shape {(m, k)}, got {type(C).__name__} "
                                f"{getattr(C, 'shape', None)}")
        _int32_csr("C", C)
        self.shape, self.dtype, self.nnz_c = (m, k), np.dtype(A.dtype), int(C.nnz)
        self.operand_shapes = (A.shape, A.nnz, B.shape, B.nnz)
        structure = _structure(A, B)
        words = sum(int(a.size) for a in structure)
        csum = runtime._product_offsets(A, B)
        products = int(_cuda.read_at(csum.data.ptr + 8 * A.nnz, 1, np.int64)[0])
        self.products = products
        if check_memory:
            free = runtime._free_device_bytes() if free_bytes is None else free_bytes
            why = rules.values_refusal(products, self.nnz_c, m, words, free)
            if why:
                raise ValuesRefused(f"values replay not set up: {why}")
        nc = self.nnz_c
        # C's structure and the operands' are kept first: C may be the caller's and change later
        self.Cp, self.Cj = _cuda.duplicate(C.indptr), _cuda.duplicate(C.indices)
        flat = cp.empty(words, dtype=np.int32)
        self.kept_structure, at = [], 0
        for a in structure:
            part = flat[at:at + a.size]
            if a.size:
                cp.cuda.runtime.memcpyAsync(part.data.ptr, a.data.ptr, a.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                            cp.cuda.get_current_stream().ptr)
            self.kept_structure.append(part)
            at += a.size
        self._flat = flat
        self.lanes = rules.values_lanes(products, nc)
        wide = rules.values_offset_bytes(products) == 8
        self.keys = cp.empty(products, dtype=np.uint64)
        if nc == 0 or products == 0:
            if nc:   # products == 0 and entries in C: not A @ B's pattern
                raise ValuesRefused("C: has entries where A @ B has no products")
            self.off = cp.zeros(nc + 1, dtype=np.int64 if wide else np.int32)
        else:
            self.off = self._setup(A, B, csum, products, nc, wide)
        del csum
        cp.cuda.get_current_stream().synchronize()
        self.kept_bytes = int(sum(a.nbytes for a in (self.keys, self.off, self.Cp, self.Cj, self._flat)))
        self.setup_ms = (time.perf_counter() - t0) * 1e3

    def _setup(self, A, B, csum, products: int, nc: int, wide: bool):
        cp = cupy_module()
        m = self.shape[0]
        counters = _cuda.zeroed(4, np.uint64)   # bad, long entries, longest entry, empty entries
        cnt = _cuda.zeroed(nc, np.uint64)
        base = (A.indptr, A.indices, B.indptr, B.indices, csum, np.int64(A.nnz), np.int32(m), self.Cp, self.Cj,
                np.int64(products))
        grid = -(-products // 256)
        runtime._launch("values_count", grid, 256, base + (cnt, counters))
        if int(_cuda.read_at(counters.data.ptr, 1, np.uint64)[0]):
            raise ValuesRefused("C: a product's column is missing from its row of C (C is not A @ B's "
                                "pattern with sorted rows)")
        off64 = cp.empty(nc + 1, dtype=np.int64)
        off32 = None if wide else cp.empty(nc + 1, dtype=np.int32)
        runtime._scan("scan_rows", nc, (cnt, np.int64(nc), off64, off32 if off32 is not None else runtime._NULL))
        _cuda.zero(cnt.data.ptr, cnt.nbytes)   # the cursors of values_place
        unsorted = cp.empty(products, dtype=np.uint64)
        runtime._launch("values_place", grid, 256, base + (off64, cnt, unsorted))
        longs = cnt   # the cursors are spent: their words list the long entries
        runtime._launch("values_sort_short", -(-nc // 256), 256,
                        (off64, np.int64(nc), unsorted, self.keys, np.int32(rules.VALUES_SHORT_SEGMENT), longs,
                         counters.data.ptr + 8))
        _, n_long, longest, empty = (int(v) for v in _cuda.read_at(counters.data.ptr, 4, np.uint64))
        if empty:
            raise ValuesRefused(f"C: {empty:,} entries no product of A @ B reaches (C is not A @ B's pattern, "
                                "or a row has duplicate columns)")
        if longest > rules.VALUES_MAX_SEGMENT:
            raise ValuesRefused(f"an entry of C sums {longest:,} products, past rules.VALUES_MAX_SEGMENT = "
                                f"{rules.VALUES_MAX_SEGMENT:,} (its sort would be quadratic)")
        if n_long:
            runtime._launch("values_sort_long", min(n_long, SORT_LONG_BLOCKS), 256,
                            (off64, longs, np.int64(n_long), unsorted, self.keys), smem=256 * 8)
        return off64 if wide else off32

    def matches(self, A, B) -> bool:
        """Whether A and B have the shapes, nnz and dtype of the setup's (host only; run checks
        their structure on the GPU)."""
        return ((A.shape, A.nnz, B.shape, B.nnz) == self.operand_shapes and np.dtype(A.dtype) == self.dtype
                and np.dtype(B.dtype) == self.dtype)

    def run(self, A, B, out=None, info: dict | None = None):
        """C = A @ B for A and B of the setup's structure: a new cupyx CSR (or ``out``'s values
        rewritten: a CSR of the kept structure, e.g. an earlier run's). Raises analysis._Misguess
        when A's or B's indptr or indices differ from the setup's (checked on the GPU, one read)."""
        cp = cupy_module()
        if not self.matches(A, B):
            raise analysis._Misguess()
        structure = _structure(A, B)
        if len(structure) != len(self.kept_structure):
            raise analysis._Misguess()
        nc = self.nnz_c
        if out is not None:
            if not cupyx_sparse().isspmatrix_csr(out) or out.shape != self.shape or out.nnz != nc \
                    or np.dtype(out.dtype) != self.dtype:
                raise ValueError(f"out: expected a cupyx CSR of shape {self.shape}, {nc:,} nonzeros and dtype "
                                 f"{self.dtype}, got {type(out).__name__} {getattr(out, 'shape', None)}")
            Cx = out.data
        else:
            Cx = cp.empty(nc, dtype=self.dtype)
        flag = _cuda.zeroed(1, np.uint64)
        pairs = list(zip(structure, self.kept_structure))
        pairs += [pairs[0]] * (4 - len(pairs))   # the kernel takes four pairs: repeats cost a re-read
        args = tuple(x for a, b in pairs for x in (a, b, np.int64(a.size)))
        longest = max(a.size for a in structure)
        runtime._launch("values_differ", (max(1, min(DIFFER_BLOCKS, -(-longest // 1024))), 4), 256, args + (flag,))
        if nc:
            ct = _cuda.ctype(self.dtype)
            ot = "int" if self.off.dtype == np.int32 else "long long"
            runtime._launch(f"values_replay<{ct}, {ot}, {self.lanes}>", -(-nc * self.lanes // 256), 256,
                            (self.off, self.keys, A.data, B.data, Cx, np.int64(nc), flag))
        if out is None:
            Cp, Cj = _cuda.duplicate(self.Cp), _cuda.duplicate(self.Cj)
        if int(_cuda.read_at(flag.data.ptr, 1, np.uint64)[0]):
            raise analysis._Misguess()
        if info is not None:
            info.update(values_replay=True, nnz_c=nc, products=self.products, values_lanes=self.lanes,
                        values_kept_bytes=self.kept_bytes)
        if out is not None:
            return out
        return operands.csr_from_parts(Cx, Cj, Cp, self.shape, sorted_rows=True, canonical=True)
