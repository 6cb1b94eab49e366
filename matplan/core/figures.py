"""What the GPU statistics kernel hands the planner, and the hook through which it is provided.

The kernel (``matplan.kernels.statistics``, prebuilt like the others) measures a problem's GPU
CSR operands in one launch with one copy back: the structure check's findings
(:class:`CsrFlags`, read by ``validation.check_csr``) and the raw figures (:class:`KernelFigures`)
that ``features.compute`` finishes into the same numbers as its NumPy formulas. Core cannot
import kernels, so the kernels' module registers its launcher here on import (:func:`use_kernel`;
the planner package imports it);
without one, GPU operands are measured by the general paths (a host copy of small operands'
index arrays, CuPy for larger ones).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from .xp import is_gpu_array

#: Ops whose A is a CSR operand the kernel measures.
SPARSE_OPS = ("spmv", "spmm", "spgemm", "sptrans")


class CsrFlags(NamedTuple):
    """The structure check of one CSR operand: indptr[0] != 0, indptr[-1] != len(indices),
    indptr falls somewhere, a column index outside [0, n) (as unsigned); indptr's first and last
    entries, for the messages."""
    first: bool
    last: bool
    falls: bool
    cols: bool
    ptr0: int
    ptrm: int


@dataclasses.dataclass(frozen=True)
class KernelFigures:
    """The kernel's figures of one problem. Integers are exact; ``*_ss`` and ``spread_sum`` are
    NumPy's pairwise sums (numpy's ``add.reduce`` of the same float64 values, bit for bit) of the
    squared deviations from the mean (nnz / m, products / m) and of the column-spread samples.
    Figures of an op the launch was not for keep their defaults."""
    a: CsrFlags
    b: CsrFlags | None = None          # SpGEMM's B
    row_min: int = 0
    row_max: int = 0
    empty_rows: int = 0
    warp_before: int = 0               # sum of each group of WARP rows' longest row (zeros pad the last)
    warp_after: int | None = 0         # ... the rows sorted by length; None: not counted (too many long rows)
    row_ss: float = 0.0
    spread_sum: float = 0.0
    col_max: int = 0                   # SpTRANS: entries of the longest column
    products: int = 0                  # SpGEMM: sum of nnz_RowCt, its extremes and pairwise sum
    rowct_min: int = 0
    rowct_max: int = 0
    rowct_ss: float = 0.0
    rbs_groups: tuple = ()
    drawn: tuple = ()                  # the COMPRESSION_SAMPLES rows drawn, their products, and the
    drawn_products: tuple = ()         # distinct columns among the products examined (at each row's
    distinct: tuple = ()               # first draw; later draws of a row hold 0)
    examined: tuple = ()
    compression_ok: bool = True        # False: B's columns do not fit the kernel's hash sets


_KERNEL: list = []
_UNSET = object()


def use_kernel(launcher) -> None:
    """Install the kernel's launcher, ``launcher(op, A, B) -> KernelFigures | None`` (op "check",
    "sptrans", "spmv", "spmm" or "spgemm"; None where it does not take the operands); None
    uninstalls it."""
    _KERNEL[:] = [] if launcher is None else [launcher]


def kernel_figures(op: str, A, B=None) -> KernelFigures | None:
    """``op``'s figures of GPU CSR ``A`` (and B) from the installed kernel; None for host operands,
    without a kernel, or where it does not take them."""
    if not _KERNEL or not is_gpu_array(A):
        return None
    return _KERNEL[0](op, A, B)


def problem_figures(problem) -> KernelFigures | None:
    """:func:`kernel_figures` of a validated Problem, measured once per problem: its structure
    check and its statistics share one launch and one copy."""
    got = problem.__dict__.get("_kernel_figures", _UNSET)
    if got is _UNSET:
        got = None
        if problem.backend == "gpu" and problem.op in SPARSE_OPS:
            got = kernel_figures(problem.op, problem.A, problem.B)
        object.__setattr__(problem, "_kernel_figures", got)   # a cache, not a field (as Plan's run cache)
    return got


__all__ = ["CsrFlags", "KernelFigures", "use_kernel", "kernel_figures", "problem_figures", "SPARSE_OPS"]
