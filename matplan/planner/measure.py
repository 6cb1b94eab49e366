"""The planner's measurement: the one autotuner of every timing taken at plan time.

The pattern is Triton's autotuner: the cost models prune, timings choose, and timings are cached
by a key of what was timed (:mod:`.measure_cache`: kernel, config, problem, device, a digest of
the kernel's sources, library versions), in memory and on disk, so a later plan in any process
skips them. Candidates are timed on the caller's own (A, B): each prepared once, a first call
(which compiles; the GPU then warmed up for WARM_UP_S, as before the first timing of a plan),
``WARMUP`` untimed calls, then ``ROUNDS`` rounds of up to ``CALLS`` calls queued back to back
between two CUDA events (fewer for calls past ROUND_S / CALLS), median of the rounds
(:func:`matplan.core.timing.queued_s`): the throughput a reuse-heavy caller gets (single calls of
a 20-us kernel vary by 10% with the host's jitter). Two kinds of candidates are timed:

* finalists: the candidates predicted within ``MARGIN`` of the best, as the models' costs are 15%
  off the device's times at the median (on an H100 the model put CSR scalar 3% ahead of ELL-R on
  banded-large float64, which ran 17% faster). ``measure="auto"`` times them when the plan does
  enough work for it to pay (at most ``BUDGET`` of reuse x the predicted cost per application)
  and a run is predicted to take at least ``MIN_RUN_S``; a finalist whose conversion does not fit
  the budget is left out (the model's best is always in). Their timings are kept by a digest of
  the planner's features. A finalist whose kernel offers ``search_space(features, device)`` but
  keeps no shape bucket (cuSPARSE's SpMV/SpMM: algorithm and B order) has its configs searched,
  where the budget still holds with every config counted (the finalists' own timings come
  first): each config screened by ``SCREEN_CALLS`` calls, the ``SCREEN_KEEP`` fastest then timed
  in full and the fastest of those kept (successive halving: eight full timings of a 0.16-ms SpMM
  did not fit the budget at reuse 1000, and cuSPARSE's best config ran 1.8x its default on
  ice40 k = 16); a lone such finalist is measured for its search alone.
* every candidate of a kernel whose timings are kept by a shape bucket (the kernel's optional
  ``measure_key(features)``: TSM2 and cuBLAS for tall-and-skinny products), on every plan for the
  GPU in use whatever the reuse: the timing is paid once per bucket and machine. A kernel that
  also offers ``search_space(features, device)`` (TSM2: block sizes, t3 multiples, the row
  kernel's depth, the cp.async and 3xTF32 kernels) has each of its configs timed and its fastest
  kept; a config that fails to compile or launch is left out with a RuntimeWarning.

A timing kept by a bucket is used for another problem of the bucket as measured / predicted
times the model's prediction for it. The chosen candidate is the fastest measured (run +
predicted prepare / reuse). Plans of near-equal candidates may differ between processes (by less
than the measurement noise); ``measure="never"`` keeps the model's deterministic choice and times
nothing. A kernel may list the files its timings depend on in ``sources`` (see
:func:`.measure_cache.source_digest`).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
import warnings

from ..core.timing import queued_s, warm_up
from ..core.types import Candidate
from ..core.xp import cupy_module
from ..kernels import _cuda, get
from .measure_cache import Config, Entry, Key, cache, canonical, now, source_digest, versions

#: Candidates predicted within this fraction of the best are finalists (the H100 model's run
#: error is x1.15 at the median, x1.7 at the 90th percentile; at 0.15 ice40 float32 kept CSR
#: vector W=32, predicted 21% behind csr_split and measured 2x faster back to back, out) ...
MARGIN = 0.3
#: ... at most this many, cheapest first.
MAX_FINALISTS = 4
#: measure="auto" measures when the finalists' timing is predicted to cost at most this fraction
#: of the plan's predicted work (reuse x the best predicted cost per application).
BUDGET = 0.2
WARMUP, CALLS, ROUNDS = 2, 10, 3
#: A round of queued calls lasts about this long at least (fewer than CALLS calls past it): a
#: TSM2 call on a 4-8 GiB A takes over a millisecond, and a bucket has some 35 configs to time.
ROUND_S = 2e-3
#: GPU seconds of back-to-back calls before a timing that follows a first call this slow (a
#: compile: the clocks drop while the GPU idles) or that opens a plan's timings. A cold machine's
#: first TSM2 search once kept a variant at 0.68 of the copy bandwidth where the runs before and
#: after took one at 0.93-0.95.
WARM_UP_S = 0.02
COLD_CALL_S = 0.05
#: measure="auto" leaves plans whose best predicted run is shorter than this to the model: such a
#: call's time is the host's as much as the GPU's (~10 us of CuPy launch, ~15 us of run path), so
#: the timings rank the host's jitter (H100: on block_dense-large float32 the measurement took CSR
#: vector W=32 over W=16, 0.0177 against 0.0139 ms back to back).
MIN_RUN_S = 30e-6
#: Host time of one timed call beyond the kernel (event records, synchronisation, Python).
CALL_OVERHEAD_S = 40e-6
#: A search without a shape bucket screens each config by this many calls (one round after one
#: warm-up call) and times the SCREEN_KEEP fastest in full.
SCREEN_CALLS, SCREEN_KEEP = 3, 2
MODES = ("auto", "always", "never")


def check_mode(measure) -> str:
    """The measure mode, or ValueError naming the accepted ones (True/False mean always/never)."""
    if measure is True:
        return "always"
    if measure is False:
        return "never"
    if measure not in MODES:
        raise ValueError(f"measure: expected one of {MODES} (or True/False), got {measure!r}")
    return measure


def finalists(scored) -> list:
    """The candidates predicted within MARGIN of the cheapest, at most MAX_FINALISTS."""
    limit = scored[0].total_s * (1 + MARGIN)
    return [c for c in scored if c.total_s <= limit][:MAX_FINALISTS]


def predicted_cost_s(finals, configs=lambda c: 1) -> float:
    """Predicted seconds to measure ``finals``: each prepared once and run WARMUP + CALLS x ROUNDS
    times; a finalist whose kernel's ``configs(c)`` configs are searched has each screened (1 +
    SCREEN_CALLS calls) and its SCREEN_KEEP fastest timed in full."""
    def cost(c, calls):
        return c.prepare_s + calls * (c.run_s + CALL_OVERHEAD_S)
    full, total = WARMUP + CALLS * ROUNDS, 0.0
    for c in finals:
        n = configs(c)
        total += cost(c, full) if n == 1 else n * cost(c, 1 + SCREEN_CALLS) + min(n, SCREEN_KEEP) * cost(c, full)
    return total


def to_measure(mode: str, backend: str, planning_elsewhere: bool, finals, reuse: int,
               configs=lambda c: 1) -> list:
    """The finalists to measure (none: keep the model's choice). Never for one config to time (one
    finalist, not searched) or a plan for another device than the one in use (measure="always"
    raises there). "always": all of them; "auto": on the GPU only, for runs predicted past
    MIN_RUN_S, the model's best and each next finalist whose measurement (one config each) keeps
    the total within BUDGET of the plan's predicted work; a lone finalist whose configs are
    searched (``configs(c)``: how many configs timing ``c`` takes) is measured where its whole
    search fits. Which searches run is :func:`to_search`'s."""
    if mode == "never" or sum(configs(c) for c in finals) < 2:
        return []
    if planning_elsewhere:
        if mode == "always":
            raise ValueError("measure='always' times the candidates on the device in use; it cannot "
                             "be combined with device=<another GPU>")
        return []
    if mode == "always":
        return list(finals)
    if backend != "gpu" or finals[0].run_s < MIN_RUN_S:
        return []
    budget = BUDGET * reuse * finals[0].total_s
    chosen = [finals[0]]
    for c in finals[1:]:
        if predicted_cost_s(chosen + [c]) <= budget:
            chosen.append(c)
    if len(chosen) > 1 and predicted_cost_s(chosen) <= budget:
        return chosen
    lone = finals[:1]
    return lone if configs(lone[0]) > 1 and predicted_cost_s(lone, configs) <= budget else []


def to_search(mode: str, chosen, reuse: int, configs=lambda c: 1) -> list:
    """Of the finalists :func:`to_measure` chose, those whose every config is timed (``configs(c)``
    of them) rather than ``c`` alone: all of them for "always"; for "auto", in order, each whose
    search keeps the whole measurement within BUDGET (the finalists themselves come first)."""
    searchable = [c for c in chosen if configs(c) > 1]
    if mode == "always" or not searchable:
        return searchable
    budget = BUDGET * reuse * chosen[0].total_s
    out = []
    for c in searchable:
        if predicted_cost_s(chosen, lambda x: configs(x) if any(x is y for y in out + [c]) else 1) <= budget:
            out.append(c)
    return out


def room_for_search(mode: str, chosen, reuse: int, configs=lambda c: 1) -> tuple:
    """(finalists, searched) for ``mode``: :func:`to_search`'s, except that for "auto", where a
    searchable finalist's search does not fit beside every chosen finalist, the unsearched ones
    predicted farthest behind (never the model's best) give way, last first, until every search
    fits. A searched kernel's configs differ by more than the model's finalists are predicted to
    (cuSPARSE's SpMM algorithms by up to 1.8x, finalists within MARGIN)."""
    search = to_search(mode, chosen, reuse, configs)
    searchable = [c for c in chosen if configs(c) > 1]
    if mode != "auto" or len(search) == len(searchable):
        return chosen, search
    kept = list(chosen)
    for c in reversed(chosen[1:]):
        if configs(c) > 1:
            continue
        kept = [x for x in kept if x is not c]
        got = to_search(mode, kept, reuse, configs)
        if len(got) == len(searchable):
            return kept, got
    return chosen, search


def refine(problem, feats, dev, scored, mode: str, reuse: int, planning_elsewhere: bool,
           extra_s=lambda name: 0.0) -> tuple:
    """(candidates, cheapest first, measured ones before the rest; one sentence for the plan's
    reasons, None when nothing was measured). What is measured: the finalists :func:`to_measure`
    takes, and on the GPU in use every candidate whose kernel keeps its timings by a shape bucket
    (its search space for a kernel that has one). ``extra_s(kernel name)`` is the per-call cost the
    plan adds to the kernel's (``per_call``). Never times anything for ``mode == "never"``."""
    if mode == "never":
        return scored, None
    count = functools.partial(_searched, feats=feats, dev=dev)
    general = to_measure(mode, problem.backend, planning_elsewhere, finalists(scored), reuse, count)
    general, search = room_for_search(mode, general, reuse, count)
    by_bucket = []
    if problem.backend == "gpu" and not planning_elsewhere:
        by_bucket = [c for c in scored if _bucket(get(c.kernel), feats) is not None
                     and all(c is not g for g in general)]
    pairs = [(c, _configs(c, feats, dev, reuse, extra_s, any(c is x for x in search))) for c in general]
    pairs += [(c, _configs(c, feats, dev, reuse, extra_s)) for c in by_bucket]
    unready = sum(skipped for _, (_, skipped) in pairs)
    # a kernel none of whose configs is compiled for this GPU is not timed: it stays predicted
    chosen = [c for c, (group, _) in pairs if group]
    groups = [group for _, (group, _) in pairs if group]
    if sum(len(g) for g in groups) < 2 and not (unready and groups):
        return scored, None
    # with configs left out, even one candidate is timed: measured ones rank before the predicted
    measured, note = measure(problem, feats, dev, groups, reuse, extra_s,
                             sum(1 for c in chosen if any(c is g for g in general)))
    if unready:
        note += (f" {unready} config(s) not timed: not compiled for this GPU yet (NVRTC would take "
                 f"seconds each; `matplan warmup --tsgemm MxNxK` compiles them)")
    rest = [c for c in scored if all(c is not m for m in chosen)]
    return measured + rest, note


def measure(problem, feats, dev, groups, reuse: int, extra_s=lambda name: 0.0, finals: int = 0,
            used: list | None = None) -> tuple:
    """(measured Candidates, cheapest first; one sentence for the plan's reasons) of ``groups``:
    lists of one kernel's candidates (a searched kernel's configs, or one candidate), each
    measured (from the cache, or timed here) and its fastest kept. ``finals``: how many groups are
    finalists of the models' costs (for the sentence); ``used``, a list, gets every cache entry
    the measurement read or made. A candidate alone in its group that fails raises (it would fail
    in ``plan.run`` too); a config of a searched kernel that fails is left out with a
    RuntimeWarning, RuntimeError when all of them fail."""
    t0 = time.perf_counter()
    store, session = cache(), _Session(problem, dev, used)
    out, fresh = [], []
    for group in groups:
        results, whole = [], group
        if len(group) > SCREEN_KEEP and _bucket(get(group[0].kernel), feats) is None:
            screened = session.group(group, feats, dev, reuse, extra_s, store, fresh, screen=True)
            ok = sorted(((c, r) for c, r in zip(group, screened) if isinstance(r, Candidate)),
                        key=lambda pair: pair[1].total_s)
            results = [r for r in screened if not isinstance(r, Candidate)]
            group = [c for c, _ in ok[:SCREEN_KEEP]]
        results += session.group(group, feats, dev, reuse, extra_s, store, fresh) if group else []
        out.append(_fastest(whole, results, screened=len(whole) if group is not whole else 0))
    store.put(fresh)
    out.sort(key=lambda c: c.total_s)
    kinds = [f"{finals} of the candidates predicted within {MARGIN:.0%} of the best" if finals else "",
             "every candidate kept by a shape bucket" if len(groups) > finals else ""]
    note = (f"measured {' and '.join(k for k in kinds if k)} ({time.perf_counter() - t0:.4f} s, "
            f"{len(fresh)} timed, {session.cached} from the measurement cache): "
            + ", ".join(f"{c.label()} {c.total_s * 1e3:.4f} ms" for c in out))
    return out, note


def tune(kernel, problem, feats, dev, used: list | None = None) -> list | None:
    """[the params the planner would run] of ``kernel`` for this problem, by the measurement: its
    search space (else its candidates) measured, from the cache or timed now (the entries go to
    ``used``). None where the kernel keeps no timings by a shape bucket or the problem is not on
    the GPU in use (the tuning database times such kernels' candidates itself)."""
    if problem.backend != "gpu" or cupy_module() is None or _bucket(kernel, feats) is None:
        return None
    space = getattr(kernel, "search_space", None)
    params = list(space(feats, dev)) if space is not None else list(kernel.candidates(feats, dev))
    _cuda.precompile([m for p in params for m in kernel.modules(feats, p)])   # over every core, not at each first run
    group = [_candidate(kernel, p, feats, dev, 1) for p in params]
    measured, _ = measure(problem, feats, dev, [group], 1, used=used)
    return [dict(measured[0].params)]


# --- one measurement ----------------------------------------------------------------------------
def _bucket(kernel, feats):
    """The kernel's shape bucket for these features (``measure_key``), None if it keeps none."""
    key_of = getattr(kernel, "measure_key", None)
    return None if key_of is None else key_of(feats)


def _candidate(kernel, params, feats, dev, reuse, extra_s: float = 0.0) -> Candidate:
    """The analytic candidate of ``params``, with the plan's per-call cost (as the planner's scores)."""
    cost = kernel.cost(feats, params, dev)
    run_s = cost.run_s + extra_s
    return Candidate(kernel.name, dict(params), cost.prepare_s, run_s, run_s + cost.prepare_s / max(reuse, 1),
                     "analytic", cost.why)


def _searched(c, *, feats, dev) -> int:
    """How many configs timing finalist ``c`` takes: its kernel's search space where the kernel
    has one and keeps no bucket (a bucketed kernel is timed whatever the budget), else 1."""
    kernel = get(c.kernel)
    space = getattr(kernel, "search_space", None)
    if space is None or _bucket(kernel, feats) is not None:
        return 1
    return max(1, len(space(feats, dev)))


def _configs(c, feats, dev, reuse, extra_s, search: bool = True) -> tuple:
    """(the candidates timed for ``c``, how many configs were left out): its kernel's search
    space where it has one and keeps its timings by a bucket, or keeps none and ``search`` is set
    (its timings then kept by the features), else ``c`` alone; a kernel with a
    ``ready(features, params)`` test keeps only the configs timing them compiles nothing for
    (planning never compiles what it may not run)."""
    kernel = get(c.kernel)
    space = getattr(kernel, "search_space", None)
    if space is None or (not search and _bucket(kernel, feats) is None):
        return [c], 0
    params = list(space(feats, dev)) or [c.params]
    ready = getattr(kernel, "ready", None)
    kept = [p for p in params if ready(feats, p)] if ready is not None else params
    extra = extra_s(c.kernel)
    return [_candidate(kernel, p, feats, dev, reuse, extra) for p in kept], len(params) - len(kept)


class _Session:
    """One measurement's state: the problem, the cache's key parts and how many hits."""

    def __init__(self, problem, dev, used=None):
        self.problem, self.gpu, self.used = problem, problem.backend == "gpu", used
        self.versions = versions(problem.backend)
        self.device = dev.name if self.gpu else "host"
        self.cached, self.warm, self.sources = 0, False, {}

    def group(self, group, feats, dev, reuse, extra_s, store, fresh, screen: bool = False) -> list:
        """Each candidate of ``group`` measured (:meth:`candidate`), or (candidate, error) where
        a config of a searched group fails; a lone candidate's failure raises."""
        results = []
        for c in group:
            try:
                results.append(self.candidate(c, feats, dev, reuse, extra_s, store, fresh, screen))
            except Exception as exc:  # noqa: BLE001  one config's failure is recorded, not fatal
                if len(group) == 1:
                    raise RuntimeError(f"measuring candidate {c.label()} on these inputs failed: "
                                       f"{type(exc).__name__}: {exc}") from exc
                results.append((c, f"{type(exc).__name__}: {exc}"))
        return results

    def key(self, kernel, params, feats, screen: bool = False) -> Key:
        bucket = _bucket(kernel, feats)
        problem = ["bucket", list(bucket)] if bucket is not None else ["features", _digest(feats)]
        if screen:
            problem.append("screen")
        if kernel.name not in self.sources:
            self.sources[kernel.name] = source_digest(kernel)
        return Key(Config.of(kernel.name, params), canonical(problem), self.device,
                   self.sources[kernel.name], self.versions)

    def candidate(self, c, feats, dev, reuse, extra_s, store, fresh, screen: bool = False):
        """``c`` measured: from the cache, else timed now (appended to ``fresh``); ``screen``: by
        SCREEN_CALLS calls, kept in the cache apart from full timings."""
        kernel = get(c.kernel)
        extra = extra_s(c.kernel)
        # an analytic candidate is the kernel's cost plus the per-call cost; others are re-costed
        predicted = c.run_s - extra if c.source == "analytic" else kernel.cost(feats, c.params, dev).run_s
        key = self.key(kernel, c.params, feats, screen)
        entry = store.get(key)
        if entry is None:
            entry = Entry(key, self.time(kernel, c.params, screen), predicted, now())
            fresh.append(entry)
            how = (f"here (screened by {SCREEN_CALLS} calls" if screen else
                   f"here ({CALLS} calls back to back at most, median of {ROUNDS} rounds")
        else:
            self.cached += 1
            how = "(from the measurement cache"
        if self.used is not None:
            self.used.append(entry)
        ratio = entry.ratio
        run_s = entry.seconds if ratio is None or entry.predicted_s == predicted else predicted * ratio
        if run_s != entry.seconds:
            how += f", measured/model {ratio:.2f} of its shape bucket"
        run_s += extra
        return dataclasses.replace(
            c, run_s=run_s, total_s=run_s + c.prepare_s / max(reuse, 1), source="measured",
            why=f"{c.why}; measured {run_s * 1e3:.4f} ms a run {how}; {c.source} model {c.run_s * 1e3:.4f})")

    def time(self, kernel, params, screen: bool = False) -> float:
        """Seconds per call of ``kernel`` on the problem (see the module docstring); ``screen``:
        one round of SCREEN_CALLS calls after one."""
        A, B = self.problem.A, self.problem.B
        prepared = kernel.prepare(A, dict(params))
        try:
            def call():
                return kernel.run(prepared, B)
            t = time.perf_counter()
            call()
            self.sync()
            if self.gpu and (not self.warm or time.perf_counter() - t > COLD_CALL_S):
                warm_up(call, WARM_UP_S)
                self.warm = True
            if screen:
                return queued_s(call, SCREEN_CALLS, 1, 1, gpu=self.gpu)
            return queued_s(call, CALLS, ROUNDS, WARMUP, gpu=self.gpu, round_s=ROUND_S)
        finally:
            del prepared

    def sync(self) -> None:
        if self.gpu:
            cupy_module().cuda.Device().synchronize()


def _fastest(group, results, screened: int = 0) -> Candidate:
    """The fastest measured candidate of a kernel's group; a searched kernel's why names the
    search (``screened``: how many configs a screen ranked first), and its failed configs are
    warned about."""
    ok = [r for r in results if isinstance(r, Candidate)]
    failed = [r for r in results if not isinstance(r, Candidate)]
    if failed:
        first, err = failed[0]
        msg = (f"{first.kernel}: {len(failed)} of {len(group)} configs failed to compile or launch "
               f"(first {first.label()}: {err})")
        if not ok:
            raise RuntimeError(msg)
        warnings.warn(msg + "; they are never chosen", RuntimeWarning, stacklevel=4)
    best = min(ok, key=lambda c: (c.total_s, c.label()))
    if len(group) == 1:
        return best
    others = sorted((c for c in ok if c is not best), key=lambda c: c.total_s)
    nxt = f"; next {others[0].label()} {others[0].run_s * 1e3:.4f} ms" if others else ""
    search = f"fastest of {len(ok)} configs measured" + (f" in full of {screened} screened" if screened else "")
    return dataclasses.replace(best, why=f"{best.why}; {search}{nxt}")


def _digest(feats) -> str:
    """A digest of the planner's features: the key of a timing on the caller's own problem."""
    return hashlib.sha256(canonical(feats.to_dict()).encode()).hexdigest()[:16]


__all__ = ["MARGIN", "MAX_FINALISTS", "BUDGET", "MODES", "WARM_UP_S", "check_mode", "finalists", "to_measure",
           "to_search", "room_for_search", "refine", "measure", "tune"]
