"""Which candidate: every admissible (kernel, params) scored by the cost models (the learned model
where one is installed for the device class), the cheapest picked with stable tie-breaking, and
the reasons a plan gives, the papers' rules among them."""
from __future__ import annotations

import operator

from ..core.features import PRODUCT_SAMPLES, measured, products_sampled
from ..core.types import Candidate
from ..kernels import kernels_for
from ..models import learned
from ..models import spgemm as spgemm_model, spmv as spmv_model, sptrans as sptrans_model

#: Candidates predicted within this fraction of the best are a tie; ties go to the
#: first in (kernel name, params) order, so near-equal predictions never flip plans.
TIE_MARGIN = 0.03


def _param_key(params: dict) -> tuple:
    """Order of a kernel's parameter sets in ties: by name, numbers by value (W=8 before W=16,
    which the JSON text put after it), other values by their text."""
    return tuple((name, (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value)))
                 for name, value in sorted(params.items()))


def score_candidates(feats, dev, reuse, deterministic, only=None, per_call=None):
    """Predicted cost of every admissible (kernel, params); rejected ones with their reason.

    Costs come from the learned model for the device class when one is installed
    (``source='learned'``, its name and validation error in ``why``), else from
    the kernels' analytic models; ``per_call`` (see ``plan``) adds to their run cost.
    """
    pending, rejected, extras = admissible(feats, dev, deterministic, only, per_call)
    # The learned model for this device class, where one is installed, replaces the analytic costs.
    per = max(reuse, 1)   # the prepare cost's share of an application, as Cost.total takes it
    costs = learned.rescored(feats, dev, pending)
    if extras:
        for j, ((name, _, _), (prepare_s, run_s, why, source)) in enumerate(zip(pending, costs)):
            extra_s, extra_why = extras.get(name, (0.0, ""))
            if extra_s:
                why = pending[j][2].why if why is None else why
                costs[j] = (prepare_s, run_s + extra_s, f"{why}; +{extra_s * 1e6:.0f} us per call: {extra_why}", source)
    scored = [Candidate(name, params, prepare_s, run_s, prepare_s / per + run_s, source,
                        cost.why if why is None else why)
              for (name, params, cost), (prepare_s, run_s, why, source) in zip(pending, costs)]
    return _ranked(scored), rejected


def admissible(feats, dev, deterministic, only=None, per_call=None) -> tuple:
    """([(kernel name, params, analytic Cost)] of every admissible candidate, [rejected
    Candidates with their reason], {kernel name: per_call's (seconds, why)})."""
    rejected, pending, extras = [], [], {}
    for kernel in kernels_for(feats.op, feats.backend):
        if only is not None and kernel.name not in only:
            continue
        if not kernel.available():
            reason = "not available in this process (CuPy/GPU missing)"
        elif deterministic and not kernel.deterministic:
            reason = "not bitwise reproducible (deterministic=True)"
        else:
            reason = kernel.supports(feats)
        if reason:
            rejected.append(Candidate(kernel.name, {}, 0.0, 0.0, float("inf"), "rejected", reason))
            continue
        if per_call is not None:
            extras[kernel.name] = per_call(kernel, feats, dev)
        for params in kernel.candidates(feats, dev):
            pending.append((kernel.name, dict(params), kernel.cost(feats, params, dev)))
    return pending, rejected, extras


_BY_COST = operator.attrgetter("total_s", "kernel")


def _ranked(scored) -> list:
    """``scored`` by (total_s, kernel, _param_key(params)): sorted by the first two, then the rare
    runs equal in both by their params (a stable sort: the same order, without a params key for
    every candidate of every plan)."""
    scored.sort(key=_BY_COST)
    if all(a.total_s != b.total_s or a.kernel != b.kernel for a, b in zip(scored, scored[1:])):
        return scored   # no run equal in both: the common case
    i = 0
    while i < len(scored) - 1:
        j = i + 1
        while j < len(scored) and scored[j].total_s == scored[i].total_s and scored[j].kernel == scored[i].kernel:
            j += 1
        if j - i > 1:
            scored[i:j] = sorted(scored[i:j], key=lambda c: _param_key(c.params))
        i = j
    return scored


def pick(scored):
    """The cheapest candidate, ties (within TIE_MARGIN) broken by name for stable plans."""
    limit = scored[0].total_s * (1 + TIE_MARGIN)
    tied = [c for c in scored if c.total_s <= limit]
    first = min([c.kernel for c in tied])   # by name, then params: a params key only where names tie
    same = [c for c in tied if c.kernel == first]
    return same[0] if len(same) == 1 else min(same, key=lambda c: _param_key(c.params))


def explain(f, best, scored, reuse, deterministic):
    label = best.label()
    reasons = [_describe(f), *_rules(f), f"{label}: {best.why}" if best.why else label]
    nxt = next((c for c in scored if c is not best), None)
    if nxt is not None:
        reasons.append(f"next best {nxt.label()} is {_how(nxt)} {nxt.total_s / best.total_s:.2f}x "
                       f"the chosen cost ({nxt.total_s * 1e3:.4f} vs {best.total_s * 1e3:.4f} ms)")
    vendor = next((c for c in scored if c.kernel.endswith((".cusparse", ".cublas")) and c is not best), None)
    if vendor is not None:
        reasons.append(f"vendor path {vendor.label()} {_how(vendor)} {vendor.total_s / best.total_s:.2f}x "
                       "the chosen cost")
    if reuse > 1 and best.prepare_s > 0:
        reasons.append(f"format conversion ({best.prepare_s * 1e3:.3f} ms) amortised over reuse={reuse}")
    if deterministic:
        reasons.append("deterministic=True: only bitwise-reproducible kernels were admitted")
    return reasons


def _how(c) -> str:
    return "measured" if c.source == "measured" else "predicted"


def _rules(f) -> list:
    """The papers' rules applied to these statistics, whichever kernel wins."""
    if f.op in ("spmv", "spmm") and f.nnz and measured(f.warp_ratio):
        sort = spmv_model.ellr_should_sort(f.warp_len_before, f.warp_len_after)
        return [f"ELL-R rule: warp length ratio {f.warp_ratio:.3f} "
                f"{'<=' if sort else '>'} {spmv_model.ELLR_SORT_RATIO} -> rows {'are' if sort else 'are not'} "
                "worth sorting by length"]
    if f.op == "sptrans" and f.nnz and measured(f.col_max):
        passes, bits = sptrans_model.radix_passes(f.n)
        short = f.col_max <= sptrans_model.BINS[0]
        return [f"SpTRANS rule: the longest column has {f.col_max:,} entries "
                f"{'<=' if short else '>'} {sptrans_model.BINS[0]} -> the segmented sort "
                + ("sorts every row of A.T by a thread" if short else "sorts long rows of A.T by warps, "
                   "blocks or merge rounds")
                + f"; the radix method takes {passes} pass(es) of {bits} bits for {f.n:,} columns"]
    if f.op == "spgemm" and f.products and measured(f.rowct_var_over_mean):
        balanced = spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
        return [f"RBSparse rule: var/mean of nnz_RowCt {f.rowct_var_over_mean:.2f} "
                f"{'<=' if balanced else '>'} {spgemm_model.RBS_BALANCED_RATIO} -> "
                f"{'balanced: one hash-table size' if balanced else 'unbalanced: rows grouped by nnz_RowCt/pi'}"]
    return []


def _describe(f) -> str:
    if f.op == "sptrans":
        return (f"A.T of A {f.m}x{f.n} with {f.nnz:,} nonzeros: rows mean {f.row_mean:.2f} max {f.row_max}; "
                f"columns mean {f.nnz / f.n if f.n else 0.0:.2f} "
                + (f"max {f.col_max:,}" if measured(f.col_max) else "(longest not measured: no candidate reads it)"))
    if f.op in ("spmv", "spmm", "spgemm"):
        s = (f"A has {f.nnz:,} nonzeros, rows mean {f.row_mean:.2f} std {f.row_std:.2f} "
             f"min {f.row_min} max {f.row_max}, {f.empty_rows:,} empty; T=round(mu+sigma)={f.T}; "
             + (f"avg warp length {f.warp_len_before:.2f} -> {f.warp_len_after:.2f} sorted "
                f"(ratio {f.warp_ratio:.3f})" if measured(f.warp_ratio) else
                "warp lengths and column spread not measured (no candidate reads them)"))
        if f.op == "spgemm" and measured(f.rowct_max):
            s += (f"; {f.products:,} products, nnz_RowCt mean {f.rowct_mean:.1f} max {f.rowct_max}, "
                  f"var/mean {f.rowct_var_over_mean:.2f}, RBSparse groups {list(f.rbs_groups)}")
        elif f.op == "spgemm":
            s += (f"; ~{f.products:,} products (from at most {PRODUCT_SAMPLES:,} of A's nonzeros)"
                  if products_sampled(f) else f"; {f.products:,} products")
            s += "; nnz_RowCt per row and the compression not measured (no candidate reads them)"
        return s
    return (f"dense A {f.m}x{f.n} ({f.layout}-ordered), B has k={f.k} columns; "
            f"t2threshold={f.t2threshold:.1f} so the product is "
            f"{'memory' if f.k <= f.t2threshold else 'compute'}-bound")
