"""cuSPARSE SpMV/SpMM prepared once (``spmv.cusparse``), a candidate like any other.

``prepare`` makes A's cuSPARSE descriptor on A's own arrays; each B layout's dense descriptors
and workspace are made on its first run and reused (:mod:`.cusparse_prepared`), and the result is
written into ``out``. Its configs are cuSPARSE's algorithm (``alg``) and, for SpMM, the order of
B and C (``order``: "row", or "col" with B and C converted in kept buffers). The planner's model
offers the default ({}: cuSPARSE's default algorithm, row-major); its measurement times every
config of :meth:`CusparseSpMV.search_space` and keeps the fastest. What cannot take the prepared
path runs cupyx's ``A @ B``, with the reason in ``prepared.meta["fallback"]``.
:func:`cupyx_matmul` is that cupyx call, kept as the baseline a CuPy user pays (the benchmarks'
``cupyx_ms``); it is not a planner candidate.
"""
from __future__ import annotations

import weakref

from ...core.cache import BoundedCache
from ...models import spmv as spmv_model
from ..base import KeepsA, Prepared
from ..registry import register
from .cusparse_prepared import PreparedCsr, check_params, configs
from .cusparse_prepared import cupyx_matmul  # noqa: F401  (re-exported: the benchmarks' cupyx call)

#: ``Plan.run``'s prepared calls, one per live A and config: a plan's repeated call reuses A's
#: descriptors and workspaces instead of making them per call. An entry leaves when its A is collected.
_KEPT = BoundedCache("spmv.cusparse prepared", maxsize=16)


def _drop(key, ref) -> None:
    """A was collected: forget its prepared call (unless the key was taken by a newer A since)."""
    entry = _KEPT.peek(key)
    if entry is not None and entry[0] is ref:
        _KEPT.pop(key)


#: SpMM column-major configs are searched only below this k: their copies of B and C grow with k
#: (no column-major config was the fastest at k = 16 on any of the H100 benchmark's 24 rows).
SEARCH_COL_MAJOR_BELOW_K = 16


class CusparseSpMV(KeepsA):
    name = "spmv.cusparse"
    ops = ("spmv", "spmm")
    backend = "gpu"
    vendor = True
    reads_a_at_run = True   # the descriptor points at A's own arrays: in-place changes are read
    deterministic = False   # cuSPARSE's default SpMV algorithm does not promise run-to-run reproducibility

    def candidates(self, f, device):
        """The model's config: cuSPARSE's default algorithm, SpMM row-major ({}); the model does
        not tell the algorithms apart, so the planner's measurement widens it to :meth:`search_space`."""
        yield {}

    def search_space(self, f, device):
        """The configs the planner's measurement times: the SpMV algorithms, or each SpMM order with
        each algorithm (``cusparse_prepared.configs``; the benchmarks' vendor figure times all of
        them), column-major ones only below SEARCH_COL_MAJOR_BELOW_K columns of B."""
        if f.op == "spmv":
            return configs("spmv")
        every = configs("spmm", f.dtype, f.index_dtype or None)
        return every if f.k < SEARCH_COL_MAJOR_BELOW_K else [p for p in every if p.get("order") != "col"]

    def cost(self, f, params, device):
        _, order = check_params(params)
        return spmv_model.cusparse_prepared(f, device, order if f.op == "spmm" else "row")

    def prepare(self, A, params):
        alg, order = check_params(params)
        call = PreparedCsr(A, alg, order)
        return Prepared(self.name, dict(params), {"A": A}, tuple(A.shape), call.dtype,
                        meta={"cusparse": call, "fallback": call.fallback})

    def run(self, prepared, B, out=None):
        A, call = prepared.arrays["A"], prepared.meta["cusparse"]
        if not call.same_arrays(A):    # A's data, indices or indptr was reassigned: describe the new ones
            call = prepared.meta["cusparse"] = PreparedCsr(A, call.alg, call.order)
            prepared.meta["fallback"] = call.fallback
        return call.run(A, B, out)

    def runner(self, params):
        """``Plan.run``'s call: the prepared call of this A and config, kept while A lives
        (``_KEPT``), so a repeated call makes no descriptor and sizes no workspace."""
        alg, order = check_params(params)

        def run(A, B, out=None):
            key = (id(A), alg, order)
            entry = _KEPT.get_fast(key)
            if entry is not None and entry[0]() is A and entry[1].same_arrays(A):
                return entry[1].run(A, B, out)
            call = PreparedCsr(A, alg, order)
            try:
                ref = weakref.ref(A, lambda r, key=key: _drop(key, r))
            except TypeError:          # A takes no weak reference: prepared per call
                return call.run(A, B, out)
            _KEPT.put(key, (ref, call))
            return call.run(A, B, out)
        return run


register(CusparseSpMV())
