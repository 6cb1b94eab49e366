"""``spgemm(A, B)``: C = A @ B by the hash kernels, through the path the product takes: a guessed
replay (guesses.py), the one-pass path (one_pass.py), the two passes (symbolic.py, numeric.py) or
row panels (panels.py). The package docstring describes the steps."""
from __future__ import annotations

import time

import numpy as np

from ...core.xp import cupyx_sparse
import matplan.kernels.spgemm.analysis as analysis
import matplan.kernels.spgemm.guesses as guesses
import matplan.kernels.spgemm.numeric as numeric
import matplan.kernels.spgemm.one_pass as one_pass
import matplan.kernels.spgemm.panels as panels
import matplan.kernels.spgemm.rules as rules
import matplan.kernels.spgemm.runtime as runtime
import matplan.kernels.spgemm.symbolic as symbolic


def spgemm(A, B, *, sort: bool = True, smem_limit: int | None = None, drop_zeros: bool = False,
           grouping: str = "auto", out: str = "device", max_panel_nnz: int | None = None,
           max_panel_bytes: int | None = None, passes: str = "auto", esc: bool = True,
           guess: bool = True, values: bool = False, info: dict | None = None):
    """C = A @ B with the RBSparse hash kernels (the output forms: see panels.py).

    sort: write each row sorted by column (SciPy's canonical order); False skips the sort.
    smem_limit: shared-memory bytes per block the tables may use (default: the device's opt-in max).
    drop_zeros: remove entries that cancelled to exactly zero (SciPy's storage).
    grouping: 'auto' (the balanced rule decides), 'balanced' (one table size) or 'grouped'.
    out: 'device' (one cupyx CSR; OverflowError / MemoryError naming the alternatives when C does
        not fit int32 or device memory) or 'host' (a SciPy CSR assembled panel by panel).
    max_panel_nnz, max_panel_bytes: with out='host', cap each panel below the defaults (2^31 - 1
        nonzeros; panels.PANEL_MEM_FRACTION of free device memory), e.g. to force many panels in tests.
    passes: "auto" (the one-pass path, one_pass.py, where rules.one_pass_table or one_pass_long
        allow; out='device' only) or "two" (always the symbolic pass, then the numeric pass).
    esc: in the one-pass path, rows of at most rules.ESC_CAPS[-1] products take the sort-based
        numeric_esc (deterministic sums) where B's columns allow (rules.esc_max_columns); False keeps
        them in hash tables.
    guess: a one-pass call of operands met before goes on from their last analysis, checked on
        the GPU (guesses.py); False waits for this call's own and keeps
        none.
    values: with ``guess``, out='device', sort and not drop_zeros, a pair's calls after its
        second replay C's values only while A's and B's structure is unchanged (values.py; set up
        on the second call where rules.values_refusal allows; plans' runs pass True); False: the
        guess replay only.
    info: a dict to fill with what was done (groups, global rows, nnz, products, panels, one_pass,
        guessed, direct, values_replay: True, False or why not; values_setup_ms and
        values_kept_bytes on the call that set it up).
    """
    if passes not in ("auto", "two"):
        raise ValueError(f"passes: expected 'auto' or 'two', got {passes!r}")
    for name, flag in (("esc", esc), ("guess", guess), ("values", values)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name}: expected True or False, got {flag!r}")
    if out not in ("device", "host"):
        raise ValueError(f"out: expected 'device' or 'host', got {out!r} (spgemm_panels streams panels)")
    max_panel_nnz = panels._positive_limit("max_panel_nnz", max_panel_nnz, rules.INT32_MAX)
    max_panel_bytes = panels._positive_limit("max_panel_bytes", max_panel_bytes)
    if out == "device" and (max_panel_nnz is not None or max_panel_bytes is not None):
        raise ValueError("max_panel_nnz / max_panel_bytes: only with out='host' or spgemm_panels "
                         "(out='device' returns C in one piece)")
    info = info if info is not None else {}
    info["guessed"] = info["direct"] = info["values_replay"] = False
    guessing = guess and out == "device" and passes == "auto"
    key = guesses._guess_key(A, B, sort, smem_limit, grouping, esc) if guessing else None
    vkey = guesses._values_key(key) if values and not drop_zeros else None   # key: None unless guessing
    C = guesses._values_replayed(vkey, A, B, info)
    if C is not None:
        return C
    C = _computed(A, B, key, sort, smem_limit, grouping, esc, drop_zeros, out, passes, max_panel_nnz,
                  max_panel_bytes, info)
    if vkey is not None:
        guesses._values_after(vkey, A, B, C, info, key)
    return C


def _computed(A, B, key, sort, smem_limit, grouping, esc, drop_zeros, out, passes, max_panel_nnz, max_panel_bytes,
              info):
    """spgemm's C by its paths: the guess kept under ``key``, else the one pass, the host panels or
    the two passes."""
    kept = guesses._kept(key)
    if kept is not None:
        try:
            return guesses._guessed(A, B, kept, (sort, smem_limit, grouping, esc), info, drop_zeros)
        except analysis._Misguess:   # the operands' analysis changed: forget it, run the call unguessed
            guesses._drop(key)
    s = symbolic._symbolic(A, B, sort, smem_limit, grouping, info, passes if out == "device" else "two", esc)
    m, k = s.shape
    if s.one_pass is not None:
        t0 = time.perf_counter()
        C = one_pass._one_pass(s, *s.one_pass)
        s.host_ms["one_pass"] = (time.perf_counter() - t0) * 1e3
        panels._finish_info(s)
        info.update(panels=1)
        if drop_zeros:
            C.eliminate_zeros()
        if key is not None:
            guesses._remember(key, s.words)
        return C
    if out == "host":
        return panels._to_host(s, max_panel_nnz, max_panel_bytes, drop_zeros)
    if s.empty:
        csp = cupyx_sparse()
        return csp.csr_matrix((m, k), dtype=s.dtype)
    need = int(panels.panel_bytes(s.nnz_c, m + 1, s.dtype.itemsize))
    # the driver's free memory costs ~5 us a query: asked only when C could come near it
    near = need > runtime.SMALL_OUTPUT_FRACTION * runtime._device_total_bytes()
    free = runtime._free_device_bytes() if near else None
    alternatives = ("spgemm(A, B, out='host') assembles a SciPy CSR with int64 indptr in host memory; "
                    "spgemm_panels(A, B) yields row panels one at a time")
    if s.nnz_c > rules.INT32_MAX:
        raise OverflowError(f"spgemm: C would have {s.nnz_c:,} nonzeros, more than 2^31 - 1, which a "
                            f"cupyx CSR with int32 indptr cannot hold; {alternatives}")
    if free is not None and need > panels.OUTPUT_MEM_FRACTION * free:
        raise MemoryError(f"spgemm: C ({s.nnz_c:,} nonzeros) needs {need:,} bytes of device memory, more "
                          f"than {panels.OUTPUT_MEM_FRACTION:.0%} of the {free:,} bytes free; {alternatives}")
    info.update(panels=1)
    C = numeric._numeric(s, 0, m, 0, s.nnz_c)
    panels._finish_info(s)
    if drop_zeros:
        C.eliminate_zeros()
    return C

