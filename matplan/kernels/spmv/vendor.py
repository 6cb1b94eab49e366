"""cuSPARSE SpMV/SpMM prepared once (``spmv.cusparse``), a candidate like any other.

``prepare`` makes A's cuSPARSE descriptor on A's own arrays; each B layout's dense descriptors
and workspace are made on its first run and reused (:mod:`.cusparse_prepared`), and the result is
written straight into ``out``. What cannot take that path runs cupyx's ``A @ B``, with the reason
in ``prepared.meta["fallback"]``. :func:`cupyx_matmul` is that cupyx call, kept as the baseline
a CuPy user pays (the benchmarks' ``cupyx_ms``); it is not a planner candidate.
"""
from __future__ import annotations

import weakref

from ...core.cache import BoundedCache
from ...models import spmv as spmv_model
from ..base import KeepsA, Prepared
from ..registry import register
from .cusparse_prepared import PreparedCsr, check_alg, cupyx_matmul  # noqa: F401  (cupyx_matmul re-exported)

#: ``Plan.run``'s prepared calls, one per live A (and algorithm): a plan's repeated call reuses A's
#: descriptors and workspaces instead of making them per call. An entry leaves when its A is collected.
_KEPT = BoundedCache("spmv.cusparse prepared", maxsize=16)


def _drop(key, ref) -> None:
    """A was collected: forget its prepared call (unless the key was taken by a newer A since)."""
    entry = _KEPT.peek(key)
    if entry is not None and entry[0] is ref:
        _KEPT.pop(key)


class CusparseSpMV(KeepsA):
    name = "spmv.cusparse"
    ops = ("spmv", "spmm")
    backend = "gpu"
    vendor = True
    reads_a_at_run = True   # the descriptor points at A's own arrays: in-place changes are read
    deterministic = False   # cuSPARSE's default SpMV algorithm does not promise run-to-run reproducibility

    def cost(self, f, params, device):
        return spmv_model.cusparse_prepared(f, device)

    def prepare(self, A, params):
        call = PreparedCsr(A, check_alg(params))
        return Prepared(self.name, dict(params), {"A": A}, tuple(A.shape), call.dtype,
                        meta={"cusparse": call, "fallback": call.fallback})

    def run(self, prepared, B, out=None):
        A, call = prepared.arrays["A"], prepared.meta["cusparse"]
        if not call.same_arrays(A):    # A's data, indices or indptr was reassigned: describe the new ones
            call = prepared.meta["cusparse"] = PreparedCsr(A, call.alg)
            prepared.meta["fallback"] = call.fallback
        return call.run(A, B, out)

    def runner(self, params):
        """``Plan.run``'s call: the prepared call of this A, kept while A lives (``_KEPT``), so a
        repeated call makes no descriptor and sizes no workspace."""
        alg = check_alg(params)

        def run(A, B, out=None):
            key = (id(A), alg)
            entry = _KEPT.get_fast(key)
            if entry is not None and entry[0]() is A and entry[1].same_arrays(A):
                return entry[1].run(A, B, out)
            call = PreparedCsr(A, alg)
            try:
                ref = weakref.ref(A, lambda r, key=key: _drop(key, r))
            except TypeError:          # A takes no weak reference: prepared per call
                return call.run(A, B, out)
            _KEPT.put(key, (ref, call))
            return call.run(A, B, out)
        return run


register(CusparseSpMV())
