"""Compiling and launching the hash SpGEMM kernels: which .cu holds each kernel, the compiled
launchers (a bounded cache: ``matplan.cache_info()``), the device's limits, side streams, zeroed
scratch, the one-launch scans and the device-memory queries."""
from __future__ import annotations

import functools

import numpy as np

from ...core.cache import BoundedCache
from ...core.xp import cupy_module
from .. import _cuda
import matplan.kernels.spgemm.rules as rules

#: a null device pointer argument (kernels take it for an absent array)
NULL_PTR = _NULL = np.uintp(0)
#: Each .cu of the hash kernels and the instantiations its module is compiled with (kernels
#: declared extern "C" need none; hash_analysis.cu names words_differ so that its list is not empty).
SOURCES = {
    "spgemm/hash_analysis.cu": ("words_differ",),
    "spgemm/canonical.cu": ("csr_canonical<int>", "csr_canonical<long long>"),
    "spgemm/hash_shared.cu": (tuple(f"numeric_shared<{t}, {w}>" for t in ("float", "double")
                                    for w in rules.GROUP_WIDTHS)
                              + tuple(f"symbolic_shared<{w}>" for w in rules.GROUP_WIDTHS)),
    "spgemm/hash_esc.cu": tuple(f"numeric_esc<{t}, {w}, {p}>" for t in ("float", "double")
                                for w, p in ((8, 2), (8, 4), (16, 4), (32, 4), (32, 8), (32, 16))),
    "spgemm/hash_global.cu": ("numeric_global_acc<float>", "numeric_global_acc<double>",
                              "numeric_global_out<float>", "numeric_global_out<double>",
                              "numeric_global_seg<float>", "numeric_global_seg<double>"),
    "spgemm/hash_compact.cu": ("compact_rows<float>", "compact_rows<double>", "compact_ranges<float>",
                               "compact_ranges<double>", "compact_entries<float>", "compact_entries<double>"),
    "spgemm/values_replay.cu": tuple(f"values_replay<{t}, {o}, {w}>" for t in ("float", "double")
                                     for o in ("int", "long long") for w in rules.VALUES_LANES),
}
#: The .cu of each kernel by its name (without template arguments).
_SOURCE_OF = {"scan_products": "spgemm/hash_analysis.cu", "scan_rows": "spgemm/hash_analysis.cu",
              "classify_rows": "spgemm/hash_analysis.cu", "bucket_rows": "spgemm/hash_analysis.cu",
              "symbolic_global": "spgemm/hash_global.cu", "global_segment_counts": "spgemm/hash_global.cu",
              **dict.fromkeys(("values_count", "values_place", "values_sort_short", "values_sort_long",
                               "values_differ"), "spgemm/values_replay.cu"),
              **{name.split("<")[0]: cu for cu, names in SOURCES.items() for name in names}}
#: Extra NVRTC options for every hash_*.cu, e.g. ("-DSUBWARP_MIN_BLOCKS=6",)
#: (benchmarks/spgemm_phases.py --define: compile-time variants in one run).
NVRTC_DEFINES: tuple = ()
#: Fraction of the device's total memory under which an output or a batch of slabs is not checked
#: against the driver's free memory (a query costs ~5-15 us of host time; CuPy's own
#: OutOfMemoryError remains if the pool cannot serve them).
SMALL_OUTPUT_FRACTION = 1 / 16

_STREAMS: dict = {}
#: (kernel, device, NVRTC_DEFINES) -> (cuda Function, packed Launcher); entries are cheap to
#: rebuild (the compiled modules stay memoised in _cuda), the bound only keeps the map finite.
_LAUNCHERS = BoundedCache("spgemm.launchers", 256)


def _compiled(kernel_name: str, device_id: int):
    """(cuda Function, packed Launcher) of a kernel for a device, memoised under the kernel's name:
    the launch path skips _cuda.function's argument normalisation, and the Launcher's signature is
    read from the kernel's declaration in its .cu (_cuda.signature)."""
    key = (kernel_name, device_id, NVRTC_DEFINES)
    got = _LAUNCHERS.get_fast(key)   # on every launch: no lock
    if got is None:
        cu = _SOURCE_OF[kernel_name.split("<")[0]]
        fn = _cuda.compiled(cu, kernel_name, SOURCES[cu], options=NVRTC_DEFINES)
        got = (fn, _cuda.packed(fn, cu, kernel_name))
        _LAUNCHERS.put(key, got)
    return got


def _launch(kernel_name, grid, block, args, smem=0):
    """Launch through the driver with packed parameters (_cuda.Launcher): CuPy's launch took 11-16 us
    of host time for kernels of this many parameters, a packed one ~5 (SpMV), and a
    call launches six to a dozen of them."""
    fn, launch = _compiled(kernel_name, _device_id())
    if smem > 32 * 1024:  # past the 48 KB default once static shared memory is added: opt in
        _cuda.allow_dynamic_smem(fn, smem)
    launch(grid if isinstance(grid, tuple) else (grid,), (block,), args, shared_mem=smem)


def _device_id() -> int:
    """The current device's id (the runtime's call; ``cuda.Device()`` builds an object first)."""
    return cupy_module().cuda.runtime.getDevice()


@functools.lru_cache(maxsize=None)
def _device_limits(device_id: int) -> tuple:
    """(opt-in shared memory per block, SM count) of a device, read once."""
    return (_cuda.device_attribute("MaxSharedMemoryPerBlockOptin", device_id),
            _cuda.device_attribute("MultiProcessorCount", device_id))


def _streams(n):
    cp = cupy_module()
    dev = _device_id()
    have = _STREAMS.setdefault(dev, [])
    while len(have) < n:
        have.append(cp.cuda.Stream(non_blocking=True))
    return have[:n]


class _Fork:
    """Launch work on side streams that start after, and are joined back into, the current stream.

    ``counts``: rows per launch slot; with at most one non-empty slot everything stays on the
    current stream (no events: ~20-40 us of host time a call)."""

    def __init__(self, counts):
        cp = cupy_module()
        self.main = cp.cuda.get_current_stream()
        self.solo = np.count_nonzero(counts) <= 1
        self.start = None if self.solo else self.main.record()
        self.streams = None if self.solo else _streams(len(counts))
        self.used = []

    def stream(self, i):
        if self.solo:
            return self.main
        s = self.streams[i]
        if s not in self.used:
            s.wait_event(self.start)
            self.used.append(s)
        return s

    def join(self):
        for s in self.used:
            self.main.wait_event(s.record())


#: Values a block of the scan kernels takes (block_scan.cuh: SCAN_ITEMS per thread, 256 threads).
SCAN_TILE = 8 * 256


def _scan_words(n: int) -> int:
    """Look-back status words (uint64) a scan of n values needs."""
    return max(1, -(-n // SCAN_TILE)) + 1


class _Zeros:
    """One zeroed uint64 allocation that a call's counters are carved from, as device addresses
    (launch arguments, _cuda.read_at): each zeroed allocation costs host time (_cuda.zeroed), and
    each CuPy slice ~2 us more."""

    def __init__(self, words):
        self.buf = _cuda.zeroed(int(sum(words)), np.uint64)
        self.at = self.buf.data.ptr

    def take(self, n: int) -> int:
        """The address of the next ``n`` zeroed words."""
        at = self.at
        self.at += 8 * n
        return at


def _scan(kernel: str, n: int, args, status=None):
    """Launch scan_products or scan_rows (block_scan.cuh scan_i64: one launch, out[0] = 0, out[1:] the
    inclusive scan of n values) with ``args`` and a zeroed look-back ``status`` (_scan_words(n))."""
    if status is None:
        status = _cuda.zeroed(_scan_words(n), np.uint64)
    _launch(kernel, _scan_words(n) - 1, 256, args + (status,))


def _product_offsets(A, B, status=None):
    """csum (int64, nnz(A)+1): exclusive scan of nnz(B[j,:]) over A's nonzeros, the work index of
    every product (csum at A's row ends gives nnz_RowCt, core.features.products_per_row)."""
    nnz = A.indices.size
    csum = cupy_module().empty(nnz + 1, dtype=np.int64)
    _scan("scan_products", nnz, (A.indices, np.int64(nnz), B.indptr, csum), status)
    return csum


def _free_device_bytes() -> int:
    """Bytes the current device can still hand out: the driver's free memory plus CuPy's pool cache."""
    cp = cupy_module()
    return int(cp.cuda.runtime.memGetInfo()[0] + cp.get_default_memory_pool().free_bytes())


def _device_total_bytes() -> int:
    return _total_bytes(_device_id())


@functools.lru_cache(maxsize=None)
def _total_bytes(device_id: int) -> int:
    return int(cupy_module().cuda.runtime.memGetInfo()[1])

