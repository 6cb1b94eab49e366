"""SpTRANS's compiled kernels, per device, the constants the launches share with the .cu files, and
the segmented merge's cooperative launch (spgemm.merge launches its spt_sort too).

The device code is in five files: merge.cu (the segmented merge), count_scan.cu (column counts and
A.T's indptr: the first launches of the segsort and radix methods), segsort.cu, radix.cu and
replay.cu (pattern replays); common.cuh and segmented.cuh hold what they share.
"""
from __future__ import annotations

import numpy as np

from ...core.cache import BoundedCache
from .. import _cuda

#: Each source file and the kernels compiled from it (template instantiations by name).
SOURCES = {
    "sptrans/merge.cu": ("spt_place", "spt_sort<float>", "spt_sort<double>"),
    "sptrans/count_scan.cu": ("spt_count", "spt_scan"),
    "sptrans/segsort.cu": ("spt_scatter", "spt_sort_short<float>", "spt_sort_short<double>",
                           "spt_sort_big<float>", "spt_sort_big<double>", "spt_merge_long<float>",
                           "spt_merge_long<double>"),
    "sptrans/radix.cu": ("spt_digits", "spt_radix_pass<float>", "spt_radix_pass<double>", "spt_bounds"),
    "sptrans/replay.cu": ("spt_same", "spt_positions", "spt_src", "spt_finish<float>", "spt_finish<double>"),
}
#: The source file of each kernel (by its name without template arguments).
SOURCE_OF = {name.split("<")[0]: cu for cu, names in SOURCES.items() for name in names}

#: Must match SPT_BLOCK and SPT_ITEMS in common.cuh.
BLOCK, ITEMS = 256, 8
TILE = BLOCK * ITEMS
#: Phases of the segmented merge's two kernels (profiling runs one a launch): spt_place 0-2, spt_sort 3-4.
MERGE_PHASES = ("count", "scan", "scatter", "tile_sort", "cross_merge")
#: The segsort's launches, in order.
PHASES = ("count", "scan", "scatter", "sort_short", "sort_big", "merge_long")
#: The segsort's bins may go up to segmented.cuh's SEG_SHORT_STAGE / 32 (thread), SEG_WARP_KEYS
#: (warp) and SEG_BLOCK_KEYS (block).
SHORT_LIMIT, WARP_LIMIT, BLOCK_LIMIT = 32, 512, 4096
CNT_CHUNK, SCAN_TILE, SHORT_BLOCK, BIG_BLOCK, MERGE_BLOCK = 2048, BLOCK * ITEMS, 128, 256, 512
#: control words: merge: barrier, bad-index flag, longest column; segsort: bad, tile counter, medium,
#: long, huge; radix: bad, valid entries (SEG_N_LIVE)
_CTRL = 8
SEG_N_LIVE = 5   # control word of the valid entries (spt_digits' count, which the radix passes read)
#: keys a block of spt_radix_pass ranks (SPT_BLOCK x RDX_ITEMS)
RADIX_TILE = BLOCK * 8
INT32_MAX = int(np.iinfo(np.int32).max)


def _fn(name: str):
    """The compiled cuda Function of kernel ``name`` (``"k"`` or ``"k<float>"``), from its source file."""
    cu = SOURCE_OF[name.split("<")[0]]
    return _cuda.compiled(cu, name, SOURCES[cu])


class _Kernels:
    """The kernels of the current device: the segmented merge's two (with the most blocks each may
    have resident at once: a cooperative launch must not ask for more) and the segsort's six."""

    def __init__(self, cp):
        self.sms = sms = _cuda.device_attribute("MultiProcessorCount", cp.cuda.Device().id)
        # the compiled cuda Functions: the merge's launches take enable_cooperative_groups, and
        # the others skip RawKernel's wrapper (~2.4 us of host time a launch)
        def typed(name):
            return {ct: _fn(f"{name}<{ct}>") for ct in ("float", "double")}
        self.place, self.sort = _fn("spt_place"), typed("spt_sort")

        # the plain launches go through the driver with packed parameters (_cuda.Launcher: a
        # call's four to six launches were most of its ~170-200 us of host time through CuPy)
        # (signatures read from the kernels' declarations: _cuda.signature)
        def packed(name):
            return _cuda.packed(_fn(name), SOURCE_OF[name.split("<")[0]], name)

        def packed_typed(name):
            return {ct: _cuda.packed(f, SOURCE_OF[name], name) for ct, f in typed(name).items()}
        self.count, self.scan, self.scatter = packed("spt_count"), packed("spt_scan"), packed("spt_scatter")
        self.digits, self.bounds = packed("spt_digits"), packed("spt_bounds")   # the radix method's first and last
        self.same, self.finish = packed("spt_same"), packed_typed("spt_finish")   # pattern replays
        self.positions, self.src = packed("spt_positions"), packed("spt_src")
        self.sort_short, self.sort_big = packed_typed("spt_sort_short"), packed_typed("spt_sort_big")
        self.merge_long, self.radix_pass = packed_typed("spt_merge_long"), packed_typed("spt_radix_pass")
        self.place_cap = sms * _cuda.resident_blocks(self.place, BLOCK)
        self.sort_cap = {ct: sms * _cuda.resident_blocks(f, BLOCK) for ct, f in self.sort.items()}
        if self.place_cap < 1 or min(self.sort_cap.values()) < 1:
            raise RuntimeError(f"sptrans: no block of {BLOCK} threads fits on this GPU")


#: The compiled kernels by device (a few per process: one per GPU used).
_KERNELS = BoundedCache("sptrans.kernels", maxsize=64)


def _kernels(cp):
    dev = cp.cuda.runtime.getDevice()   # (cuda.Device() builds an object first: host time a call)
    k = _KERNELS.get(dev)
    if k is None:
        k = _Kernels(cp)
        _KERNELS.put(dev, k)
    return k


def _launch(kernel, mark):
    """Cooperative launch of (fn, grid, args, first phase, end phase): all its phases in one launch,
    or (profiling: ``mark`` given) one phase a launch, ``mark(name)`` after each."""
    fn, grid, args, lo, hi = kernel
    for a, b in ((lo, hi),) if mark is None else ((p, p + 1) for p in range(lo, hi)):
        fn((grid,), (BLOCK,), (*args, np.int32(a), np.int32(b)), enable_cooperative_groups=True)
        if mark is not None:
            mark(MERGE_PHASES[a])
