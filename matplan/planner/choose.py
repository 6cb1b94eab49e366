"""plan(A, B): statistics -> candidate kernels -> predicted costs -> Plan."""
from __future__ import annotations

import dataclasses

from .. import __version__
from ..kernels import kernels_for
from ..models import spgemm as spgemm_model, spmv as spmv_model
from ..core import device as device_mod
from ..models import learned
from ..core.validation import normalize, normalize_transpose
from . import measure as measure_mod
from ..core import features as stats
from ..core.types import Candidate
from .plan import Plan, timer

#: Candidates predicted within this fraction of the best are a tie; ties go to the
#: first in (kernel name, params) order, so near-equal predictions never flip plans.
TIE_MARGIN = 0.03


def _param_key(params: dict) -> tuple:
    """Order of a kernel's parameter sets in ties: by name, numbers by value (W=8 before W=16,
    which the JSON text put after it), other values by their text."""
    return tuple((name, (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value)))
                 for name, value in sorted(params.items()))


def plan(A, B, *, reuse: int = 1, deterministic: bool = False, device: str | None = None,
         kernels=None, per_call=None, measure="auto") -> Plan:
    """Plan C = A @ B.

    reuse: how many times the caller will apply the plan to the same A; format
        conversion cost is divided by it.
    deterministic: admit only kernels whose output is bitwise reproducible.
    device: a known GPU name ('H100', 'K40c', ...) to plan for instead of the one in use.
    kernels: restrict the candidates to these kernel names (for experiments and tests).
    per_call: a function (kernel, features, device) -> (seconds, reason) of what each
        application pays on top of the kernel, added to its run cost and named in its why
        (``matplan.matmul`` charges the bit-for-bit check of A that a hit on a format copied
        from A needs, see ``dispatch.identity.hit_check``).
    measure: "auto" (default) times the candidates predicted within 30% of the best on (A, B)
        and chooses by the timings, those whose timing costs at most a fifth of the plan's
        predicted work (GPU only; :mod:`matplan.planner.measure`); "always" / True all such
        finalists; "never" / False keeps the models' choice.
    """
    return _plan(lambda: normalize(A, B), reuse, deterministic, device, kernels, per_call, measure)


def plan_transpose(A, *, reuse: int = 1, deterministic: bool = False, device: str | None = None,
                   kernels=None, measure="auto") -> Plan:
    """Plan A.T as a CSR matrix (SpTRANS): ``plan.run(A)`` returns it, rows sorted by column.

    The candidates are matplan's three SpTRANS methods (sptrans.transpose: segmented sort, radix,
    segmented merge), cuSPARSE's csr2csc through CuPy (``A.T.tocsr()``) and SciPy on the host;
    the choice follows A's longest column (the segmented sort's per-row sorts) and its columns'
    count (the radix method's passes). The arguments are :func:`plan`'s.
    """
    return _plan(lambda: normalize_transpose(A), reuse, deterministic, device, kernels, None, measure)


def _plan(problem_of, reuse, deterministic, device, kernels, per_call, measure) -> Plan:
    """plan() and plan_transpose(): the arguments checked, the problem validated (``problem_of()``),
    statistics, scores, measurement, the Plan."""
    if isinstance(reuse, bool) or not isinstance(reuse, int) or reuse < 1:
        raise ValueError(f"reuse: expected a positive integer (applications of the plan to the same A), got {reuse!r}")
    mode = measure_mod.check_mode(measure)
    t0 = timer()
    problem = problem_of()
    dev = device_mod.current(device)
    feats = stats.compute(problem, dev)
    scored, rejected = score_candidates(feats, dev, reuse, deterministic, kernels, per_call)
    if not scored:
        raise RuntimeError(f"no kernel can run {problem.op} on the {problem.backend} for these inputs: "
                           + "; ".join(f"{c.kernel}: {c.why}" for c in rejected))
    best, note = pick(scored), None
    chosen = measure_mod.to_measure(mode, problem.backend, device is not None, measure_mod.finalists(scored), reuse)
    if chosen:
        measured, note = measure_mod.measure(problem, chosen, reuse, _per_call_s(per_call, feats, dev))
        scored = measured + [c for c in scored if all(c is not m for m in chosen)]
        best = scored[0]
    reasons = explain(feats, best, scored, reuse, deterministic) + ([note] if note else [])
    ordered = tuple([best] + [c for c in scored if c is not best] + rejected)
    return Plan(op=problem.op, kernel=best.kernel, params=best.params, features=feats,
                candidates=ordered, reasons=tuple(reasons), reuse=reuse, deterministic=deterministic,
                device=dev.name if problem.backend == "gpu" else "host (NumPy/SciPy)",
                backend=problem.backend, planning_s=timer() - t0, version=__version__)


def score_candidates(feats, dev, reuse, deterministic, only=None, per_call=None):
    """Predicted cost of every admissible (kernel, params); rejected ones with their reason.

    Costs come from the learned model for the device class when one is installed
    (``source='learned'``, its name and validation error in ``why``), else from
    the kernels' analytic models; ``per_call`` (see ``plan``) adds to their run cost.
    """
    scored, rejected, pending, extras = [], [], [], {}
    for kernel in kernels_for(feats.op, feats.backend):
        if only is not None and kernel.name not in only:
            continue
        reason = None
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
    # The learned model for this device class, where one is installed, replaces the analytic costs.
    for (name, params, _), (cost, source) in zip(pending, learned.rescore(feats, dev, pending)):
        extra_s, extra_why = extras.get(name, (0.0, ""))
        if extra_s:
            cost = dataclasses.replace(cost, run_s=cost.run_s + extra_s,
                                       why=f"{cost.why}; +{extra_s * 1e6:.0f} us per call: {extra_why}")
        scored.append(Candidate(name, params, cost.prepare_s, cost.run_s, cost.total(reuse), source, cost.why))
    scored.sort(key=lambda c: (c.total_s, c.kernel, _param_key(c.params)))
    return scored, rejected


def _per_call_s(per_call, feats, dev):
    """kernel name -> the seconds ``per_call`` adds to each of its applications (0 without it)."""
    if per_call is None:
        return lambda name: 0.0
    from ..kernels import get
    return lambda name: per_call(get(name), feats, dev)[0]


def pick(scored):
    """The cheapest candidate, ties (within TIE_MARGIN) broken by name for stable plans."""
    limit = scored[0].total_s * (1 + TIE_MARGIN)
    tied = [c for c in scored if c.total_s <= limit]
    return min(tied, key=lambda c: (c.kernel, _param_key(c.params)))


def explain(f, best, scored, reuse, deterministic):
    reasons = [_describe(f), *_rules(f), f"{best.label()}: {best.why}" if best.why else best.label()]
    others = [c for c in scored if c is not best]
    if others:
        nxt = others[0]
        reasons.append(f"next best {nxt.label()} is {_how(nxt)} {nxt.total_s / best.total_s:.2f}x "
                       f"the chosen cost ({nxt.total_s * 1e3:.4f} vs {best.total_s * 1e3:.4f} ms)")
    vendor = [c for c in scored if c.kernel.endswith((".cusparse", ".cublas")) and c is not best]
    if vendor:
        reasons.append(f"vendor path {vendor[0].label()} {_how(vendor[0])} {vendor[0].total_s / best.total_s:.2f}x "
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
    if f.op in ("spmv", "spmm") and f.nnz:
        sort = spmv_model.ellr_should_sort(f.warp_len_before, f.warp_len_after)
        return [f"ELL-R rule: warp length ratio {f.warp_ratio:.3f} "
                f"{'<=' if sort else '>'} {spmv_model.ELLR_SORT_RATIO} -> rows {'are' if sort else 'are not'} "
                "worth sorting by length"]
    if f.op == "sptrans" and f.nnz:
        from ..kernels.sptrans import gpu as sptrans
        passes, bits = sptrans.radix_passes(f.n)
        short = f.col_max <= sptrans.BINS[0]
        return [f"SpTRANS rule: the longest column has {f.col_max:,} entries "
                f"{'<=' if short else '>'} {sptrans.BINS[0]} -> the segmented sort "
                + ("sorts every row of A.T by a thread" if short else "sorts long rows of A.T by warps, "
                   "blocks or merge rounds")
                + f"; the radix method takes {passes} pass(es) of {bits} bits for {f.n:,} columns"]
    if f.op == "spgemm" and f.products:
        balanced = spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
        return [f"RBSparse rule: var/mean of nnz_RowCt {f.rowct_var_over_mean:.2f} "
                f"{'<=' if balanced else '>'} {spgemm_model.RBS_BALANCED_RATIO} -> "
                f"{'balanced: one hash-table size' if balanced else 'unbalanced: rows grouped by nnz_RowCt/pi'}"]
    return []


def _describe(f) -> str:
    if f.op == "sptrans":
        return (f"A.T of A {f.m}x{f.n} with {f.nnz:,} nonzeros: rows mean {f.row_mean:.2f} max {f.row_max}; "
                f"columns mean {f.nnz / f.n if f.n else 0.0:.2f} max {f.col_max:,}")
    if f.op in ("spmv", "spmm", "spgemm"):
        s = (f"A has {f.nnz:,} nonzeros, rows mean {f.row_mean:.2f} std {f.row_std:.2f} "
             f"min {f.row_min} max {f.row_max}, {f.empty_rows:,} empty; T=round(mu+sigma)={f.T}; "
             f"avg warp length {f.warp_len_before:.2f} -> {f.warp_len_after:.2f} sorted "
             f"(ratio {f.warp_ratio:.3f})")
        if f.op == "spgemm":
            s += (f"; {f.products:,} products, nnz_RowCt mean {f.rowct_mean:.1f} max {f.rowct_max}, "
                  f"var/mean {f.rowct_var_over_mean:.2f}, RBSparse groups {list(f.rbs_groups)}")
        return s
    return (f"dense A {f.m}x{f.n} ({f.layout}-ordered), B has k={f.k} columns; "
            f"t2threshold={f.t2threshold:.1f} so the product is "
            f"{'memory' if f.k <= f.t2threshold else 'compute'}-bound")
