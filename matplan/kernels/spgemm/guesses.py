"""Guessed analyses (``guess=True``, the default, on the one-pass path): a call waits twice for
the GPU, for the analysis (which sizes the upper-bound buffer and picks the launches) and for C's
nnz, and the GPU idles while the host waits, decides and launches. A one-pass call keeps its
analysis words under its operands (the device, the stream, the arrays' addresses, shapes, nnz,
dtypes and the options: at most GUESS_CACHE_SIZE pairs). The pair's next call decides from them
without waiting and records its launches up to the scan of C's row counts as a CUDA graph
(GUESS_GRAPHS pairs keep one), which later calls replay: their host path before the GPU starts is
one graph launch (H100: single calls 1.12-1.43x faster). ``words_differ`` compares the guessed
words with the call's own analysis on the GPU; every numeric kernel does nothing where they
differ, and the flag comes back with C's nnz: a refuted guess (A's or B's pattern changed in
place) is dropped and the call rerun unguessed. Equal words make the same decisions, so the result
is the operands' as they are now. Where every row took numeric_esc, a verified guessed call also
keeps C's row offsets and nnz, and the pair's later calls go direct (DIRECT_GUESSES): a graph in
which numeric_esc writes each row straight into C at its kept offset, no upper-bound buffer, no
scan and no compaction; a row of another length than kept writes nothing and refutes the guess
(one read at the call's end). ``guess=False`` opts out; ``forget_guesses()`` drops them all.

With ``spgemm(values=True)`` (plans' runs) a pair goes further once its structure has been seen
twice: the values-only replay (values.py) recomputes C's values from kept product lists, its
structure checked on the GPU every call (_values_key, _values_replayed, _values_after).

A graph keeps its call's scratch (the upper-bound buffer: products x 12 bytes in float64, the
product offsets, the row classes, the global path's slabs) and the next call's C indptr.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ...core.cache import BoundedCache
from ...core.xp import cupy_module, cupyx_sparse
from .. import _cuda, _graph
import matplan.kernels.spgemm.analysis as analysis
import matplan.kernels.spgemm.one_pass as one_pass
import matplan.kernels.spgemm.operands as operands
import matplan.kernels.spgemm.runtime as runtime
import matplan.kernels.spgemm.symbolic as symbolic
import matplan.kernels.spgemm.values as values

#: Operand pairs whose analysis is kept, and of those, the most recent that keep a graph.
GUESS_CACHE_SIZE, GUESS_GRAPHS = 8, 2
#: A pair whose rows all take numeric_esc keeps C's offsets from a verified guessed call; its later
#: calls write C straight at them (no upper-bound buffer, scan or compaction), numeric_esc checking
#: each row's length against its kept one (_direct_finish). False: the one-pass graph only.
DIRECT_GUESSES = True
#: Kept analyses by _guess_key, oldest first (lookups do not reorder: the oldest kept is dropped
#: first); bounded by GUESS_CACHE_SIZE when a call keeps one. _GUESS_LOCK guards the graphs' count.
_GUESSES = BoundedCache("spgemm.guesses", GUESS_CACHE_SIZE)
_GUESS_LOCK = threading.Lock()


class _Guess:
    """An operand pair's kept analysis: its words on the host and (from its first guessed call) the
    device; once recorded (``recorded``: the Replay, the recorded call's _Symbolic and _Launched, its
    ``info``) the graph of its launches; ``direct``: (C's offsets (int64), its indptr, nnz) once a call of numeric_esc's
    rows only has given them (_direct_finish). ``lock`` is held from a call's launches to its
    last read of the graph's scratch (two threads on one stream would overwrite it between them)."""

    def __init__(self, words):
        self.words, self.dev, self.recorded, self.direct = words, None, None, None
        self.lock = threading.Lock()


def _guess_key(A, B, sort, smem_limit, grouping, esc):
    """The key of C = A @ B's guessed analysis: device, stream, the operands' array addresses,
    shapes, nnz and dtypes, and the options that shape the launches; None for operands that are
    not cupyx CSR matrices with int32 indices (the call's checks then refuse or convert them)."""
    csp = cupyx_sparse()
    if csp is None or not (csp.isspmatrix_csr(A) and csp.isspmatrix_csr(B)):
        return None
    if any(M.indices.dtype != np.int32 or M.indptr.dtype != np.int32 for M in (A, B)):
        return None
    # with cupyx's sortedness flag (read, never checked: the global path's segments rely on it)
    parts = tuple((M.data.data.ptr, M.indices.data.ptr, M.indptr.data.ptr, M.shape, M.nnz, M.dtype.str,
                   getattr(M, "_has_sorted_indices", None)) for M in (A, B))
    return (runtime._device_id(), cupy_module().cuda.get_current_stream().ptr, parts, bool(sort), smem_limit,
            grouping, bool(esc))


def _kept(key):
    """The analysis kept for _guess_key ``key`` (None: none, or key None); the lookup leaves the
    order, oldest kept first, as it is."""
    return _GUESSES.peek(key) if key is not None else None


def _remember(key, words) -> None:
    """Keep a one-pass call's analysis ``words`` for _guess_key ``key`` (the oldest past
    GUESS_CACHE_SIZE dropped; the bound is read now: tests and benchmarks change it)."""
    entry = _Guess(words)
    with _GUESS_LOCK:
        _GUESSES.maxsize = GUESS_CACHE_SIZE
        _GUESSES.put(key, entry)


def _drop(key) -> None:
    """Forget ``key``'s analysis (its call refuted it)."""
    with _GUESS_LOCK:
        _GUESSES.discard(key)


def _guessed(A, B, g: _Guess, options: tuple, info: dict, drop_zeros: bool):
    """C = A @ B from a kept analysis ``g``: the launches recorded as a graph (a pair's first
    guessed call, and its first direct one) or replayed (later ones), or issued where the driver's
    graph API cannot be loaded; then the guess's verdict (analysis._Misguess when refuted) and C:
    compacted from the upper-bound buffer (one_pass._one_pass_finish) or, direct, written in place (_direct_finish)."""
    t0 = time.perf_counter()
    with g.lock:
        C = _guessed_locked(A, B, g, options, info)
    info.update(panels=1, guessed=True, host_ms={"guessed": round((time.perf_counter() - t0) * 1e3, 4)})
    if drop_zeros:
        C.eliminate_zeros()
    return C


def _guessed_locked(A, B, g: _Guess, options: tuple, info: dict):
    sort, smem_limit, grouping, esc = options
    cp = cupy_module()
    stream = cp.cuda.get_current_stream().ptr
    direct = g.direct
    if g.dev is None:
        g.dev = cp.asarray(g.words)   # words_differ's; a recorded graph names its address

    def launch():
        out = () if direct is None else (cp.empty(direct[2], dtype=np.int32), cp.empty(direct[2], dtype=A.dtype))
        s = symbolic._symbolic(A, B, sort, smem_limit, grouping, info, "auto", esc, (g.words, g.dev))
        return (s, one_pass._one_pass_launch(s, *s.one_pass, direct=None if direct is None else (direct[0], *out)),
                out)

    # the graph's outputs, a new set each replay: C's indptr (one pass) or C's columns and values
    # (direct)
    outputs = (lambda r: (r[0].counts[2],)) if direct is None else (lambda r: r[2])
    if g.recorded is not None:
        rep, s, op, known = g.recorded
        info.update(known)
        arrays = rep.run(stream)
    elif _graph.available():
        done = []
        rep = _graph.Replay(lambda: done.append(launch()) or done[0], outputs)
        s, op, _ = done[0]
        with _GUESS_LOCK:   # the graphs' scratch is large: only the most recent pairs keep one
            recorded = [e for e in _GUESSES.values() if e.recorded is not None]
            for e in recorded[:max(0, len(recorded) - GUESS_GRAPHS + 1)]:
                e.recorded = None
            g.recorded = (rep, s, op, dict(info))
        arrays = rep.run(stream)
    else:
        done = launch()
        s, op, arrays = done[0], done[1], outputs(done)
    info["direct"] = direct is not None
    if direct is not None:
        return _direct_finish(s, op, arrays, direct, info)
    C = one_pass._one_pass_finish(s, op, arrays[0], info)
    if DIRECT_GUESSES and not op.tables and not op.n_glob:   # numeric_esc's rows only: C's offsets kept
        g.direct = (_cuda.duplicate(s.counts[1]), _cuda.duplicate(C.indptr), C.nnz)
        g.recorded = None   # the next call records the direct graph (and frees this one's buffer)
    return C


def _direct_finish(s: analysis._Symbolic, op: one_pass._Launched, arrays, direct: tuple, info: dict):
    """A direct guessed call after its launches: C's indptr copied from the kept one, the verdict
    from the GPU (words_differ's, or a row of another length than kept: analysis._Misguess), C."""
    Cj, Cx = arrays
    indptr = _cuda.duplicate(direct[1])
    if int(_cuda.read_at(s.skip, 1, np.uint64)[0]):
        raise analysis._Misguess()
    one_pass._one_pass_info(info, s, op, direct[2])
    return operands.csr_from_parts(Cx, Cj, indptr, s.shape, sorted_rows=s.sort, canonical=s.sort or None)


def forget_guesses() -> None:
    """Drop every kept analysis and values replay: each operand pair's next call waits for its own
    (benchmarks time first calls so)."""
    with _GUESS_LOCK:
        _GUESSES.clear()
        _VALUES.clear()
        _SEEN.clear()


# ----------------------------------------------------------------------------- values-only replays
#: Pairs that keep a values-only replay (values.py; ``spgemm(values=True)``, which plans' runs
#: pass): the first call of a pair notes its structure key (_SEEN), the next computes C as before
#: and sets the replay up from it where rules.values_refusal allows, and later calls replay values
#: only while A's and B's indptr and indices are unchanged (checked on the GPU every call; a change
#: drops the replay and the call computes C in full). A refused setup is remembered (its reason in
#: info) and not retried until forget_guesses(). Off (no replay, no setup) while GUESS_CACHE_SIZE
#: or VALUES_CACHE_SIZE is 0. Each kept pair holds rules.values_kept_bytes of device memory.
VALUES_CACHE_SIZE = 2
_VALUES = BoundedCache("spgemm.values", VALUES_CACHE_SIZE)
_SEEN = BoundedCache("spgemm.values_seen", 16)


def _values_key(guess_key):
    """The key of a pair's values replay, from its _guess_key without the data arrays' addresses
    and the sortedness flag (a replay reads the values of the call's operands, wherever they are);
    None where none is kept: no guess key (operands _guess_key refuses), replays off, or unsorted
    rows asked for (a replay's C is sorted)."""
    if guess_key is None or not (VALUES_CACHE_SIZE > 0 and GUESS_CACHE_SIZE > 0):
        return None
    device, stream, parts, sort, smem_limit, grouping, esc = guess_key
    if not sort:
        return None
    # each part: (data, indices, indptr, shape, nnz, dtype, sorted flag): the structure's five
    return ("values", device, stream, tuple(p[1:6] for p in parts), smem_limit, grouping, esc)


def _values_replayed(key, A, B, info: dict):
    """C from the pair's kept values replay, or None: none kept, its setup refused (the reason in
    info["values_replay"]), or A's or B's structure changed since (the replay dropped; the caller
    computes C in full)."""
    if key is None:
        return None
    kept = _VALUES.peek(key)
    if kept is None:
        refused = _SEEN.peek(key)
        if isinstance(refused, str):
            info["values_replay"] = f"not kept: {refused}"
        return None
    t0 = time.perf_counter()
    try:
        C = kept.run(A, B, info=info)
    except analysis._Misguess:
        with _GUESS_LOCK:
            _VALUES.discard(key)
        info["values_replay"] = "refuted: A's or B's structure changed since the setup; C computed in full"
        return None
    info.update(panels=1, host_ms={"values_replay": round((time.perf_counter() - t0) * 1e3, 4)})
    return C


def _values_after(key, A, B, C, info: dict, guess_key=None) -> None:
    """After C = A @ B was computed: note the pair's first call (_SEEN); on the next set its
    values replay up from C where rules.values_refusal allows (else _SEEN keeps the reason, and
    later calls do not retry) and drop its guess's graph and scratch, which the replay makes idle."""
    if key is None or key in _VALUES:
        return
    seen = _SEEN.peek(key)
    if seen is None:
        with _GUESS_LOCK:
            _SEEN.put(key, True)
        return
    if isinstance(seen, str):
        return
    try:
        replay = values.ValuesReplay(A, B, C)
    except values.ValuesRefused as e:
        replay = str(e)
    except MemoryError as e:   # CuPy's pool could not serve the setup: keep the guess replay
        replay = f"out of memory in the setup: {str(e)[:160]}"
    with _GUESS_LOCK:
        if isinstance(replay, str):
            _SEEN.put(key, replay)
            info["values_replay"] = f"not kept: {replay}"
            return
        _VALUES.maxsize = VALUES_CACHE_SIZE
        _VALUES.put(key, replay)
        _SEEN.discard(key)
        g = _GUESSES.peek(guess_key) if guess_key is not None else None
        if g is not None:
            g.recorded = None
    info.update(values_setup_ms=round(replay.setup_ms, 4), values_kept_bytes=replay.kept_bytes)


def values_kept(A, B, *, sort: bool = True, smem_limit=None, grouping: str = "auto", esc: bool = True):
    """The pair's kept ValuesReplay (a plan's run with these options: spgemm's defaults), the
    reason its setup was refused (str), or None."""
    key = _values_key(_guess_key(A, B, sort, smem_limit, grouping, esc))
    if key is None:
        return None
    kept = _VALUES.peek(key)
    return kept if kept is not None else (_SEEN.peek(key) if isinstance(_SEEN.peek(key), str) else None)

