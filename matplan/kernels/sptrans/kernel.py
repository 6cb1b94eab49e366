"""The planner's SpTRANS kernel: :func:`transpose` with the method as its parameter, costed by
:mod:`matplan.models.sptrans` and run by a plan through CUDA graph replays (:mod:`.replay`)."""
from __future__ import annotations

import math

from ...core.types import Cost
from ...core.validation import check_transpose_call
from ...models.sptrans import (BINS, FIRST_CALL_COSTS, LONG_COLUMN_BYTES, RADIX_NNZ_LIMIT, REPLAY_COSTS,
                               radix_passes)
from ..base import KeepsA
from ..registry import register
from .compiled import INT32_MAX
from .gpu import transpose
from .replay import runner as replay_runner


class SpTrans(KeepsA):
    """The planner's SpTRANS (:func:`matplan.planner.plan_transpose`): :func:`transpose` with the
    method as its parameter, chosen from A's longest column and its columns' count instead of
    method="auto"'s rule from the shape alone."""
    name = "sptrans.transpose"
    ops = ("sptrans",)
    backend = "gpu"
    deterministic = True    # no arithmetic; every row of A.T in A's order
    reads_a_at_run = True

    def supports(self, f):
        if max(f.m, f.n, f.nnz) > INT32_MAX:
            return f"A {f.m}x{f.n} with {f.nnz:,} nonzeros: sptrans needs rows, columns and nonzeros below 2^31 - 1"
        return None

    def candidates(self, f, device):
        for method in ("segsort", "radix", "merge"):
            if method != "radix" or f.nnz < RADIX_NNZ_LIMIT:
                yield {"method": method}

    def cost(self, f, params, device):
        """A first call (``transpose(A, method=...)``), fitted, and what a plan's later runs on the
        same A cost (pattern replays: ``runner``): run_s the replay, prepare_s the first call's
        excess, so the planner weighs first against later calls by ``reuse``. The merge method is
        never replayed: every run a first call."""
        method = params["method"]
        bw = device.mem_bandwidth
        fixed, per_entry, per_col = FIRST_CALL_COSTS[method][f.dtype]
        passes, bits = radix_passes(f.n)
        first = fixed + (f.nnz * per_entry * (passes if method == "radix" else 1) + f.n * per_col) / bw
        if method == "segsort":
            doublings = max(0.0, math.log2(max(f.col_max, 1) / BINS[0]))
            first += f.nnz * LONG_COLUMN_BYTES * doublings / bw
            why = (f"segmented sort: scatter, then every row of A.T sorted by its length (longest "
                   f"{f.col_max:,}" + (f", {doublings:.1f} doublings past {BINS[0]} at "
                                       f"{LONG_COLUMN_BYTES:.0f} B an entry each" if doublings else "") + ")")
        elif method == "radix":
            why = f"radix: {passes} stable counting pass(es) of {bits} bits over {f.n:,} columns"
        else:
            why = "segmented merge: merge-path tiles, tree rounds across them"
        why += (f"; first call {per_entry:.0f} B an entry{' a pass' if method == 'radix' else ''} and "
                f"{per_col:.0f} B a column at the copy bandwidth + {fixed * 1e6:.0f} us (fitted on an H100)")
        if method == "merge":
            return Cost(0.0, first, why)
        rf, rb, rc = REPLAY_COSTS[f.dtype]
        replay = min(first, rf + (f.nnz * rb + f.n * rc) / bw)
        return Cost(first - replay, replay, f"{why}; later runs on the same A replay the pattern: "
                                            f"{replay * 1e6:.0f} us against {first * 1e6:.0f} us first")

    def run(self, prepared, B, out=None):
        check_transpose_call(B, out)
        return transpose(prepared.arrays["A"], method=prepared.params["method"])

    def runner(self, params):
        """``Plan.run``'s call: the segsort's or radix method's launches replayed as a CUDA graph
        from an A's second call, with pattern replays (:func:`.replay.runner`); the merge method
        and what cannot be replayed take :meth:`run` on every call."""
        return replay_runner(super().runner(params), params["method"])


register(SpTrans())
