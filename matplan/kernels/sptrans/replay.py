"""SpTRANS plans replayed as CUDA graphs (:func:`runner`), and pattern replays (:class:`_Pattern`).

A plan's segsort or radix launches for an A (its arrays' addresses, shape and nnz) on a stream
are recorded at its second call and replayed from then on as one CUDA graph
(:class:`matplan.kernels._graph.Replay`), whose outputs are allocated after the previous launch: a
call's host path before the GPU starts is one graph launch instead of the Python launch path
(60-145 us of host time on an H100 host). The first call of a key takes the plan's general path,
so a plan applied once to each of many matrices pays no recording (0.4-1.3 ms).

Pattern replays: a graph keeps A's pattern as recorded and first checks A against it on the GPU
(``spt_same``); where it is the same, A.T is A's values gathered through the kept permutation
(``spt_finish``: about 20 bytes an entry moved instead of the method's passes) and the method's
launches between them do nothing (their ``only_if`` argument); where it differs, they run into
scratch arrays that ``spt_finish`` copies. A key whose pattern was found changed is recorded again
without a pattern.
"""
from __future__ import annotations

import threading

import numpy as np

from ...core.validation import check_transpose_call
from ...core.xp import cupy_module
from ...models.sptrans import BINS, RADIX_NNZ_LIMIT
from .. import _cuda, _graph
from ..spgemm.operands import csr_from_parts
from .compiled import BLOCK, _kernels
from .gpu import _transpose
from .launches import _check_bins, _int32_arrays, _result, _segmented

#: CUDA graphs a SpTrans runner (one per plan) keeps: one per A and stream it last ran on.
GRAPH_CACHE_SIZE = 2
#: A replayed graph first checks A's pattern against the one it was recorded with and, where it is
#: the same, writes A.T from the kept pattern and A's values (_Pattern); False: every replay runs
#: the method's launches.
PATTERN_REPLAYS = True


def runner(general, method: str):
    """``Plan.run``'s call for the segsort or radix method (module docstring); ``general(A, B,
    out)`` is the plan's path for a key's first call and for what is never replayed: the merge
    method, int64 or empty A, and hosts where the driver's graph API cannot be loaded (then
    ``general`` itself is returned). Each graph holds its call's scratch (about 16 bytes an entry
    for the segsort; the passes' buffers and look-back words for the radix method), its pattern
    (~12 bytes an entry) and the next call's output arrays; a runner keeps at most
    GRAPH_CACHE_SIZE graphs (``run.graphs``, a :class:`_graph.ReplayCache`)."""
    cp = cupy_module()
    if cp is None or method == "merge" or not _graph.available():
        return general
    graphs = _graph.ReplayCache("sptrans.graphs", GRAPH_CACHE_SIZE)
    seen, unstable, lock = set(), set(), threading.Lock()

    def replay(key, A):
        """The kept graph of ``key``, a new one at its second call, None at its first (which is
        remembered) or for no key (under ``lock``)."""
        if key is None:
            return None
        rep = graphs.get(key)
        if rep is not None and rep.pattern is not None and rep.pattern.changed():
            graphs.discard(key)                  # A's pattern changed since its graph's: a new one,
            unstable.add(key)                    # without pattern replays (it may change again)
            rep = None
        if rep is not None:
            return rep
        if key not in seen:
            if len(seen) >= 4 * GRAPH_CACHE_SIZE:
                seen.clear(), unstable.clear()
            seen.add(key)
            return None

        def record():
            pattern = _Pattern(A, method) if PATTERN_REPLAYS and key not in unstable else None
            rep = _graph.Replay(lambda: _replayed_transpose(A, method, pattern),
                                lambda T: (T.indptr, T.indices, T.data))
            rep.pattern = pattern   # its _Pattern, or None
            return rep
        return graphs.record(key, record)

    def run(A, B, out=None):
        check_transpose_call(B, out)
        key = _replay_key(cp, A, method)
        with lock:
            rep = replay(key, A)
            arrays = None if rep is None else rep.run(key[1])   # the current stream (the key's)
            if arrays is not None and rep.pattern is not None:
                rep.pattern.note(key[1])
        if arrays is None:
            return general(A, B, out)
        return _result(A, *arrays)
    run.graphs = graphs   # the kept Replays by key (:func:`_replay_key`), each with its .pattern: inspected by tests
    return run


class _Pattern:
    """A's pattern when its graph was recorded, for pattern replays: copies of A's indptr and
    indices, A.T's indptr and indices, and src (slot q of A.T holds entry src[q] of A: A's
    positions transposed as float64 values, exact below 2^53); ``flag`` is the graph's verdict word
    (spt_same: set where A's pattern differs), copied after each replay to pinned memory that the
    next call reads without waiting (``changed``) to record a graph of the new pattern."""

    def __init__(self, A, method):
        cp = cupy_module()
        ks = _kernels(cp)
        indptr_a, indices = _int32_arrays(A)
        nnz = int(indices.size)
        grid = (max(1, min(-(-nnz // BLOCK), 16 * ks.sms)),)
        values = cp.empty(nnz, dtype=cp.float64)   # (our kernels: CuPy's arange and astype compile on first use)
        ks.positions(grid, (BLOCK,), (values, nnz))
        positions = csr_from_parts(values, indices, indptr_a, A.shape, sorted_rows=False, canonical=None)
        T = _transpose(positions, False, None, method)
        src = cp.empty(nnz, dtype=cp.int32)
        ks.src(grid, (BLOCK,), (T.data, src, nnz))
        self.kept = (_cuda.duplicate(indptr_a), _cuda.duplicate(indices), T.indptr, T.indices, src)
        self.flag = cp.empty(1, dtype=cp.uint32)
        self.host = np.frombuffer(cp.cuda.alloc_pinned_memory(4), dtype=np.uint32)
        self.host[0] = 0

    def note(self, stream_ptr: int) -> None:
        """After a replay on ``stream_ptr``: its verdict to the pinned word, in stream order."""
        cp = cupy_module()
        cp.cuda.runtime.memcpyAsync(self.host.ctypes.data, self.flag.data.ptr, 4,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream_ptr)

    def changed(self) -> bool:
        """Whether a replay noted so far found A's pattern changed (possibly not the latest)."""
        return bool(self.host[0])

    @property
    def nbytes(self) -> int:
        """Device bytes kept (a graph holding it counts them: _graph.Replay.nbytes)."""
        return sum(a.nbytes for a in self.kept) + self.flag.nbytes


def _replayed_transpose(A, method, pattern):
    """The launches a runner's graph records for A: with ``pattern`` (_Pattern), spt_same's check,
    the method's launches into scratch arrays that run only where the check failed, and
    spt_finish, which writes A.T from the kept pattern and A's values, or from the scratch (the one
    launch naming A.T's arrays: a replay moves one node); without, :func:`_transpose`'s."""
    if pattern is None:
        return _transpose(A, False, None, method)
    cp = cupy_module()
    ks = _kernels(cp)
    ct = _cuda.ctype(A.dtype)
    m, n = A.shape
    indptr_a, indices = _int32_arrays(A)
    nnz = int(indices.size)
    kept_indptr, kept_indices, t_indptr, t_indices, src = pattern.kept
    full = (cp.empty(n + 1, dtype=cp.int32), cp.empty(nnz, dtype=cp.int32), cp.empty(nnz, dtype=A.dtype))
    _cuda.hold(pattern, *full)
    _cuda.zero(pattern.flag.data.ptr, 4)
    grid = max(1, min(-(-(max(nnz, m + 1, n + 1)) // BLOCK), 16 * ks.sms))
    ks.same((grid,), (BLOCK,), (indptr_a, indices, kept_indptr, kept_indices, m, nnz, pattern.flag))
    _segmented(cp, ks, ct, A, indptr_a, indices, False, None, _check_bins(BINS), method,
               only_if=pattern.flag.data.ptr, outs=full)
    outs = (cp.empty(n + 1, dtype=cp.int32), cp.empty(nnz, dtype=cp.int32), cp.empty(nnz, dtype=A.dtype))
    ks.finish[ct]((grid,), (BLOCK,), (pattern.flag, src, A.data, t_indptr, t_indices, *full, nnz, n, *outs))
    return _result(A, *outs)


def _replay_key(cp, A, method):
    """What a recorded SpTRANS call depends on: the device, the stream, A's arrays' addresses,
    shape, nnz and dtype (its contents are read at every launch); None where a call must not be
    replayed: int64 indices (converted to new arrays each call), an empty A (no launches), or
    too many nonzeros for the radix method (its error)."""
    nnz = int(A.indices.size)
    if (A.indices.dtype != np.int32 or A.indptr.dtype != np.int32 or nnz == 0 or 0 in A.shape
            or (method == "radix" and nnz >= RADIX_NNZ_LIMIT)):
        return None
    return (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr, A.data.data.ptr,
            A.indices.data.ptr, A.indptr.data.ptr, A.shape, nnz, A.dtype.char)
