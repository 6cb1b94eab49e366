"""CUDA graphs of recorded launch paths, replayed with their outputs moved to fresh allocations.

A plan that makes the same launches on the same arrays call after call (SpTRANS: a zeroing and
four to six kernels, whose Python launch path of 60-145 us of host time on an H100 host delays a
single call) records them once (:func:`matplan.kernels._cuda.recording`), builds a CUDA graph of
them through the driver (:class:`KernelGraph`) and from then on launches the graph: one driver
call before the GPU starts. A graph bakes in every argument, the outputs' addresses too, so
:class:`Replay` hands each launch's outputs to its caller and then points the graph at fresh
allocations for the next launch (``cuGraphExecKernelNodeSetParams`` changes only later launches
of the graph): the allocations and updates overlap the GPU's work instead of preceding it.

A :class:`ReplayCache` keeps replays by key within a bound, reported by ``matplan.cache_info()``.

The driver is reached through ctypes (CuPy wraps stream capture, not node updates). Every pointer
parameter of a recorded launch must point inside a live allocation (none one past its end): a
move rebases the parameters that fall inside a moved output (:func:`rebased`).
"""
from __future__ import annotations

import ctypes
import functools

from ..core.cache import BoundedCache
from ..core.xp import cupy_module
from . import _cuda


class _KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS (v2) of cuda.h."""
    _fields_ = [("func", ctypes.c_void_p), ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint),
                ("grid_z", ctypes.c_uint), ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint),
                ("block_z", ctypes.c_uint), ("shared_mem", ctypes.c_uint), ("kernel_params", ctypes.c_void_p),
                ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class _MemsetNodeParams(ctypes.Structure):
    """CUDA_MEMSET_NODE_PARAMS of cuda.h."""
    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("element_size", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


_P = ctypes.c_void_p
#: Driver entry points used here: (symbol, argument types).
_API = {"create": ("cuGraphCreate", (ctypes.POINTER(_P), ctypes.c_uint)),
        "add_kernel": ("cuGraphAddKernelNode_v2", (ctypes.POINTER(_P), _P, ctypes.POINTER(_P), ctypes.c_size_t,
                                                   ctypes.POINTER(_KernelNodeParams))),
        "add_memset": ("cuGraphAddMemsetNode", (ctypes.POINTER(_P), _P, ctypes.POINTER(_P), ctypes.c_size_t,
                                                ctypes.POINTER(_MemsetNodeParams), _P)),
        "instantiate": ("cuGraphInstantiateWithFlags", (ctypes.POINTER(_P), _P, ctypes.c_ulonglong)),
        "set_kernel": ("cuGraphExecKernelNodeSetParams_v2", (_P, _P, ctypes.POINTER(_KernelNodeParams))),
        "launch": ("cuGraphLaunch", (_P, _P)),
        "exec_destroy": ("cuGraphExecDestroy", (_P,)),
        "destroy": ("cuGraphDestroy", (_P,)),
        "current_context": ("cuCtxGetCurrent", (ctypes.POINTER(_P),))}


@functools.lru_cache(maxsize=None)
def driver():
    """The driver functions of :data:`_API` by their keys, or None where libcuda cannot be loaded
    or lacks one of them (graphs are then not used: :func:`available`)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fns = {}
        for key, (symbol, argtypes) in _API.items():
            fn = getattr(lib, symbol)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
            fns[key] = fn
        return fns
    except (OSError, AttributeError):
        return None


def available() -> bool:
    """Whether CUDA graphs can be built here (CuPy and the driver's graph API)."""
    return cupy_module() is not None and driver() is not None


def _check(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"CUDA driver: {what} failed with CUresult {status}")


def rebased(values, pointers, moves):
    """``values`` (a launch's parameters, pointers as integer addresses) with each pointer at
    ``pointers`` (parameter indices) that lies inside a moved range ``[old, old + nbytes)`` of
    ``moves`` ((old, nbytes, new) triples) moved by ``new - old``; None when none moves."""
    out = None
    for i in pointers:
        v = values[i]
        for old, nbytes, new in moves:
            if old <= v < old + nbytes:
                if out is None:
                    out = list(values)
                out[i] = v - old + new
                break
    return out


class _Node:
    """A kernel node: its recorded launch, and its parameters in a buffer of its own (the driver
    copies them when a node is added or set, so a move repacks them in place)."""

    def __init__(self, node, launcher, grid, block, smem, values):
        self.node, self.launcher, self.buffers = node, launcher, launcher.buffers()
        self.params = _KernelNodeParams(launcher.ptr, *grid, *block, smem, self.buffers[1], None, None, None)
        self.ref = ctypes.byref(self.params)
        self.pack(values)

    def pack(self, values) -> None:
        self.launcher.pack(values, self.buffers)
        self.values = values


class KernelGraph:
    """An instantiated CUDA graph of a recording's launches and zeroings, in recorded order (each
    node depends on the one before: the recording was one stream's work), holding the
    recording's held allocations (:func:`_cuda.hold`) while it lives."""

    def __init__(self, log):
        api = driver()
        if api is None:
            raise RuntimeError("CUDA graphs: the driver library (libcuda.so.1) or its graph API is missing")
        self._api = api
        self._graph, self._exec = _P(), _P()
        _check(api["create"](ctypes.byref(self._graph), 0), "cuGraphCreate")
        self.held = [rec[1] for rec in log if rec[0] == "hold"]
        self.kernels = []   # _Node of each launch
        ctx = _P()
        _check(api["current_context"](ctypes.byref(ctx)), "cuCtxGetCurrent")
        prev = None
        for rec in log:
            if rec[0] == "hold":
                continue
            node = _P()
            deps, ndeps = (ctypes.byref(prev), 1) if prev is not None else (None, 0)
            if rec[0] == "zero":
                _, ptr, nbytes = rec
                if nbytes % 4:
                    raise ValueError(f"zeroing of {nbytes} bytes: graphs zero 4-byte words")
                p = _MemsetNodeParams(dst=ptr, pitch=0, value=0, element_size=4, width=nbytes // 4, height=1)
                _check(api["add_memset"](ctypes.byref(node), self._graph, deps, ndeps, ctypes.byref(p), ctx),
                       "cuGraphAddMemsetNode")
            else:
                k = _Node(node, *rec[1:])
                _check(api["add_kernel"](ctypes.byref(node), self._graph, deps, ndeps, k.ref), "cuGraphAddKernelNode")
                self.kernels.append(k)
            prev = node
        _check(api["instantiate"](ctypes.byref(self._exec), self._graph, 0), "cuGraphInstantiate")

    def launch(self, stream_ptr: int) -> None:
        """Launch the graph on a stream (its launches run in order after the stream's earlier work)."""
        _check(self._api["launch"](self._exec, stream_ptr), "cuGraphLaunch")

    def move(self, moves) -> None:
        """Point later launches' kernel parameters inside ``moves``' old ranges at the new ones
        (:func:`rebased`); launches already made are not affected."""
        for k in self.kernels:
            new = rebased(k.values, k.launcher.pointers, moves)
            if new is not None:
                k.pack(new)
                _check(self._api["set_kernel"](self._exec, k.node, k.ref), "cuGraphExecKernelNodeSetParams")

    def __del__(self):
        api = getattr(self, "_api", None)
        if api is None:
            return
        if self._exec:
            api["exec_destroy"](self._exec)
        if self._graph:
            api["destroy"](self._graph)


class Replay:
    """``call()``'s launches recorded once and replayed as a :class:`KernelGraph`; ``outputs(result)``
    names the arrays the call allocated for its result, which each replay writes anew.

    ``run(stream)`` launches the graph on the current stream and returns the arrays it writes; it
    then allocates the next launch's arrays (spares) and moves the graph onto them. The first run
    writes and returns the arrays the recorded call allocated."""

    def __init__(self, call, outputs):
        with _cuda.recording() as log:
            result = call()
        self.arrays = tuple(outputs(result))
        self.graph = KernelGraph(log)

    def run(self, stream_ptr: int):
        """Launch on the stream ``stream_ptr`` (the current one: spares are allocated on it)."""
        cp = cupy_module()
        arrays = self.arrays
        self.graph.launch(stream_ptr)
        spares = tuple(cp.empty(a.shape, dtype=a.dtype) for a in arrays)
        self.graph.move([(a.data.ptr, a.nbytes, s.data.ptr) for a, s in zip(arrays, spares)])
        self.arrays = spares
        return arrays

    @property
    def nbytes(self) -> int:
        """Device bytes the replay holds: its graph's scratch and the next launch's outputs."""
        return sum(getattr(h, "nbytes", 0) for h in self.graph.held) + sum(a.nbytes for a in self.arrays)


class ReplayCache(BoundedCache):
    """Replays by key, at most ``maxsize``, least recently used dropped first; reported by
    ``matplan.cache_info()`` with the device bytes each holds (:attr:`Replay.nbytes`). Read like a
    dict too (``cache[key]``, iteration over the keys) without counting a lookup, for inspection."""

    def __init__(self, name: str, maxsize: int):
        super().__init__(name, maxsize, sizeof=lambda rep: getattr(rep, "nbytes", 0))

    def record(self, key, build):
        """Keep ``build()``'s replay under ``key`` and return it. Room is made first, so a dropped
        replay's memory is freed before the new one's is allocated; callers serialise this with
        their lookups of ``key``."""
        self.put(key, None)   # drops the least recently used replay past maxsize
        try:
            rep = build()
        except BaseException:
            self.discard(key)
            raise
        self.put(key, rep)
        return rep

    def __getitem__(self, key):
        rep = self.peek(key)
        if rep is None:
            raise KeyError(key)
        return rep

    def __iter__(self):
        return iter([key for key, _ in self.items()])


__all__ = ["KernelGraph", "Replay", "ReplayCache", "available", "rebased"]
