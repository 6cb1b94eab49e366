"""Output forms and row panels. After the symbolic pass C's exact row offsets (int64) are known, so
its rows can be cut into contiguous panels (``panel_bounds``, pure NumPy) that each hold fewer than
2^31 nonzeros (a cupyx CSR has int32 indptr) and fit a device-memory budget; the numeric pass then
runs per panel, on that panel's rows only, writing the panel's own CSR (offsets from 0). The
symbolic pass is not repeated.

* ``spgemm(A, B)`` (out='device', the default): one cupyx CSR on the GPU. When C has more than
  2^31 - 1 nonzeros (OverflowError) or needs more than OUTPUT_MEM_FRACTION of the free device
  memory (MemoryError) it refuses before the numeric pass, naming the two forms below.
* ``spgemm(A, B, out='host')``: a SciPy CSR in host memory (int64 indices and indptr past 2^31 - 1
  nonzeros), filled panel by panel (each copied down and freed). Refused (MemoryError naming the
  size) when it would take more than HOST_MEM_FRACTION of the host's available memory.
* ``spgemm_panels(A, B)``: an iterator of ``(row_start, row_stop, panel)``, each panel a cupyx CSR
  of C[row_start:row_stop], built when reached: streams a C that fits nowhere whole.

Panels are at most 2^31 - 1 nonzeros and PANEL_MEM_FRACTION of the free device memory measured
after the symbolic pass; ``max_panel_nnz`` / ``max_panel_bytes`` set smaller limits (tests use
them to force many panels). The planner's explanation of ``spgemm.hash`` names the predicted
panel count when products / pi passes either limit (predict_panels).
"""
from __future__ import annotations

import math
import os

import numpy as np
import scipy.sparse as sp

from ...core.validation import check_int
from ...core.xp import cupyx_sparse
import matplan.kernels.spgemm.analysis as analysis
import matplan.kernels.spgemm.numeric as numeric
import matplan.kernels.spgemm.rules as rules
import matplan.kernels.spgemm.runtime as runtime
import matplan.kernels.spgemm.symbolic as symbolic

#: Bytes of a panel per nonzero of C beyond its value: the int32 column index.
PANEL_INDEX_BYTES = 4
#: Device bytes a panel needs per row: its int32 indptr, the int64 offsets it is cut from, and the
#: row grouping of the numeric pass (table index, order, bucket keys).
PANEL_ROW_BYTES = 32
#: Fraction of the free device memory (after the symbolic pass) one panel may take when C is split
#: (out='host', spgemm_panels): a generator's caller may still hold the previous panel while the
#: next is built, and the global-memory path takes its slabs from what is left.
PANEL_MEM_FRACTION = 0.3
#: Fraction of the free device memory the single output of spgemm(out='device') may take; outputs
#: below runtime.SMALL_OUTPUT_FRACTION of the device's total memory skip the check (CuPy's own
#: OutOfMemoryError remains if the pool cannot serve them).
OUTPUT_MEM_FRACTION = 0.9
#: Fraction of the host's available memory (MemAvailable) an out='host' result may take.
HOST_MEM_FRACTION = 0.8


def panel_bytes(nnz, rows, itemsize: int):
    """Device bytes of a panel of ``rows`` rows and ``nnz`` nonzeros of C (output and row workspace)."""
    return nnz * (PANEL_INDEX_BYTES + itemsize) + rows * PANEL_ROW_BYTES


def panel_bounds(indptr, max_nnz: int, max_bytes: int | None = None, itemsize: int = 8) -> np.ndarray:
    """Row boundaries [0, b1, ..., m] of contiguous panels of C, given C's int64 ``indptr``.

    Greedy from the top: each panel takes as many rows as fit both limits, nnz <= ``max_nnz`` and
    panel_bytes(nnz, rows, itemsize) <= ``max_bytes`` (None: no byte limit), so the panels are as
    few as these limits allow. Empty rows cost PANEL_ROW_BYTES each (a byte limit can cut a run of
    empty rows). A single row past a limit raises ValueError naming the row. NumPy only.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    if indptr.ndim != 1 or indptr.size < 1 or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
        raise ValueError("indptr: expected a 1-D non-decreasing array starting at 0 (C's row offsets)")
    max_nnz = check_int(max_nnz, "max_nnz", "a positive number of nonzeros")
    if max_bytes is not None and (isinstance(max_bytes, bool) or int(max_bytes) < 1):
        raise ValueError(f"max_bytes: expected a positive number of bytes, got {max_bytes!r}")
    m = indptr.size - 1
    cost = panel_bytes(indptr, np.arange(m + 1, dtype=np.int64), itemsize)  # cumulative, increasing
    bounds = [0]
    while bounds[-1] < m:
        r = bounds[-1]
        stop = int(np.searchsorted(indptr, indptr[r] + max_nnz, side="right")) - 1
        if max_bytes is not None:
            stop = min(stop, int(np.searchsorted(cost, cost[r] + int(max_bytes), side="right")) - 1)
        if stop <= r:
            nnz = int(indptr[r + 1] - indptr[r])
            raise ValueError(f"row {r} of C alone has {nnz:,} nonzeros ({int(panel_bytes(nnz, 1, itemsize)):,} "
                             f"bytes as a panel), past the panel limit of {max_nnz:,} nonzeros"
                             + (f" / {int(max_bytes):,} bytes" if max_bytes is not None else ""))
        bounds.append(min(stop, m))
    return np.asarray(bounds, dtype=np.int64)


def host_available_bytes() -> int:
    """Memory the host can still give: MemAvailable from /proc/meminfo, else free pages (os.sysconf)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _positive_limit(name, value, upper=None):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{name}: {value:,} is past {upper:,} (2^31 - 1: a panel is a cupyx CSR "
                         f"with int32 indptr)")
    return int(value)


def _panels(s: analysis._Symbolic, max_panel_nnz, max_panel_bytes):
    """(bounds, host indptr) of the panels C is cut into, the reason in ``info``; one transfer of C's
    indptr."""
    m = s.shape[0]
    free = runtime._free_device_bytes()
    budget = int(free * PANEL_MEM_FRACTION) if max_panel_bytes is None else max_panel_bytes
    limit = rules.INT32_MAX if max_panel_nnz is None else max_panel_nnz
    indptr = s.Cp.get() if s.Cp is not None else np.zeros(m + 1, dtype=np.int64)
    bounds = panel_bounds(indptr, limit, budget, s.dtype.itemsize)
    why = (f"{len(bounds) - 1} panel(s): each at most {limit:,} nonzeros"
           + (" (int32 indptr)" if max_panel_nnz is None else " (max_panel_nnz)")
           + f" and {budget:,} bytes"
           + (f" ({PANEL_MEM_FRACTION:.0%} of {free:,} free device bytes)" if max_panel_bytes is None
              else " (max_panel_bytes)"))
    s.info.update(panels=len(bounds) - 1, panel_why=why, panel_nnz_limit=limit, panel_byte_budget=budget,
                  panel_bounds=bounds.tolist() if len(bounds) <= 4097 else None)
    return bounds, indptr


def _finish_info(s: analysis._Symbolic):
    s.info["host_ms"] = {ph: round(v, 4) for ph, v in s.host_ms.items()}


def spgemm_panels(A, B, *, sort: bool = True, smem_limit: int | None = None, drop_zeros: bool = False,
                  grouping: str = "auto", max_panel_nnz: int | None = None,
                  max_panel_bytes: int | None = None, info: dict | None = None):
    """C = A @ B as contiguous row panels: an iterator of (row_start, row_stop, cupyx CSR panel).

    The analysis and symbolic passes run now (errors raise here, and ``info`` already holds
    'panels' and 'panel_bounds'); each panel's numeric pass runs when the iterator reaches it.
    A panel is C[row_start:row_stop] as a (row_stop - row_start) x k cupyx CSR with int32 indptr.
    Panels hold at most ``max_panel_nnz`` (default 2^31 - 1) nonzeros and ``max_panel_bytes``
    (default PANEL_MEM_FRACTION of free device memory). Drop each panel before taking the next
    to keep one on the device at a time. Options as in :func:`matplan.kernels.spgemm.spgemm`.
    """
    max_panel_nnz = _positive_limit("max_panel_nnz", max_panel_nnz, rules.INT32_MAX)
    max_panel_bytes = _positive_limit("max_panel_bytes", max_panel_bytes)
    info = info if info is not None else {}
    s = symbolic._symbolic(A, B, sort, smem_limit, grouping, info)
    bounds, indptr = _panels(s, max_panel_nnz, max_panel_bytes)
    return _iter_panels(s, bounds, indptr, drop_zeros)


def _iter_panels(s: analysis._Symbolic, bounds, indptr, drop_zeros):
    csp = cupyx_sparse()
    k = s.shape[1]
    for r0, r1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if s.empty:
            P = csp.csr_matrix((r1 - r0, k), dtype=s.dtype)
        else:
            P = numeric._numeric(s, r0, r1, int(indptr[r0]), int(indptr[r1]))
            _finish_info(s)
            if drop_zeros:
                P.eliminate_zeros()
        yield r0, r1, P
        del P


def _to_host(s: analysis._Symbolic, max_panel_nnz, max_panel_bytes, drop_zeros):
    """out='host': a SciPy CSR (int64 indices past 2^31 - 1 nonzeros) filled panel by panel."""
    m, k = s.shape
    bounds, indptr = _panels(s, max_panel_nnz, max_panel_bytes)
    idx_dtype = np.int64 if s.nnz_c > rules.INT32_MAX else np.int32
    isz = np.dtype(idx_dtype).itemsize
    need = s.nnz_c * (isz + s.dtype.itemsize) + (m + 1) * isz
    avail = host_available_bytes()
    if need > HOST_MEM_FRACTION * avail:
        raise MemoryError(f"spgemm(out='host'): C has {s.nnz_c:,} nonzeros, {need:,} bytes as a SciPy CSR "
                          f"({np.dtype(idx_dtype)} indices, {s.dtype} values), more than "
                          f"{HOST_MEM_FRACTION:.0%} of the {avail:,} bytes of host memory available; "
                          f"spgemm_panels(A, B) streams the row panels instead")
    data = np.empty(s.nnz_c, dtype=s.dtype)
    indices = np.empty(s.nnz_c, dtype=idx_dtype)
    for r0, r1, P in _iter_panels(s, bounds, indptr, drop_zeros=False):
        c0, c1 = int(indptr[r0]), int(indptr[r1])
        if c1 > c0:
            P.data.get(out=data[c0:c1])
            indices[c0:c1] = P.indices.get()
        del P
    C = sp.csr_matrix((data, indices, indptr.astype(idx_dtype, copy=False)), shape=(m, k), copy=False)
    if s.sort:
        C.has_canonical_format = True
    if drop_zeros:
        C.eliminate_zeros()
    return C


def predict_panels(est_nnz: float, m: int, itemsize: int, free_bytes: int | None) -> tuple:
    """(panels, why) for a C of about ``est_nnz`` nonzeros and ``m`` rows: (1, '') when it fits one
    int32 CSR in OUTPUT_MEM_FRACTION of ``free_bytes`` (None: device memory not known, int32 only);
    else about how many panels spgemm_panels / out='host' cut it into, and why."""
    nbytes = float(panel_bytes(est_nnz, m + 1, itemsize))
    reasons = []
    if est_nnz > rules.INT32_MAX:
        reasons.append("more than 2^31 - 1 nonzeros (a cupyx CSR has int32 indptr)")
    if free_bytes is not None and nbytes > OUTPUT_MEM_FRACTION * free_bytes:
        reasons.append(f"more than {OUTPUT_MEM_FRACTION:.0%} of the {free_bytes / 1e9:.1f} GB of free "
                       "device memory")
    if not reasons:
        return 1, ""
    n = math.ceil(est_nnz / rules.INT32_MAX)
    if free_bytes:
        n = max(n, math.ceil(nbytes / (PANEL_MEM_FRACTION * free_bytes)))
    return n, (f"C predicted at ~{est_nnz:,.0f} nonzeros, {nbytes / 1e9:.1f} GB: "
               f"{' and '.join(reasons)} -> about {n} row panels (each < 2^31 nonzeros"
               + (f", <= {PANEL_MEM_FRACTION:.0%} of free memory" if free_bytes else "")
               + "); spgemm() refuses one piece: use out='host' or spgemm_panels()")

