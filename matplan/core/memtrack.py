"""Peak device memory of a block of code, counted through CuPy's allocator hooks.

Counts every allocation CuPy's memory pool hands out (cupyx's cuSPARSE
buffers included) while the block runs; ``peak`` is the largest amount held at
once above what was held when the block started.
"""
from __future__ import annotations

import contextlib

from .xp import cupy_module


@contextlib.contextmanager
def peak_memory():
    """``with peak_memory() as m: ...``; then ``m.peak`` is the peak extra bytes (GPU only)."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("peak_memory needs CuPy and a GPU")

    class _Peak(cp.cuda.MemoryHook):
        name = "matplan.peak_memory"

        def __init__(self):
            self.current = 0
            self.peak = 0

        def malloc_postprocess(self, **kw):
            self.current += kw["mem_size"]
            self.peak = max(self.peak, self.current)

        def free_postprocess(self, **kw):
            self.current -= kw["mem_size"]

    hook = _Peak()
    with hook:
        yield hook
