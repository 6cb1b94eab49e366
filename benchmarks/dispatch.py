"""Dispatch overhead of matplan.matmul: a plan-cache hit on top of the kernel, and a cold plan's cost.

    PYTHONPATH=. python3 benchmarks/dispatch.py [--quick] [--host-only] [--out benchmarks/results]

Runs the GPU cases when CuPy sees a GPU, and a few host (SciPy/NumPy) cases
always. Per case, every figure is the median of per-call wall-clock times with
the device synchronised after each call (what a caller sees; matmul
synchronises anyway, since the fingerprint comes back to the host):

  kernel    the chosen kernel alone: Kernel.run(prepared A, B) of the cached entry
  hit       matplan.matmul(A, B, reuse=R) on a cache hit
  overhead  hit - kernel: the median of per-pair differences, kernel and hit timed alternately
            call by call (so drift in the kernel's time cancels)
  target    issue 42's bound on the overhead: <= 5 us for SpMV/SpMM, <= 10 us for SpGEMM
  norm      validating (A, B) (matplan.validation.normalize; part of the overhead on the full
            path only: the identity fast path skips it)
  key       finding and confirming the entry on the path the hit takes (part of the overhead):
              alias    identity key + lookup; the format is A's own arrays, nothing is read
                       (SpGEMM: both A and B are read by the kernel at run time)
              products alias + the SpGEMM products count before cuSPARSE (its products limit;
                       skipped when nnz(A) * nnz(B) is within it), one launch + 16-byte read back
              compare  identity key + lookup + bitwise comparison of A with the entry's copy
                       (GPU: the fused kernel and its 8-byte flag read back)
              trusted  identity key + lookup on a copied format, with matmul(assume_unchanged=True):
                       the caller promises A is not written in place, nothing is compared
              full     the fingerprint, plus on the host the bitwise comparison with the copy
            and the rate it reads bytes at ("-" when it reads none)
  path      which of the three the hit takes
  fp us     the full path's fingerprint (+ host comparison), what a hit cost before the identity
            path and still costs for a new object
  plan x    planner.plan(A, B): statistics + choice, as a multiple of the kernel's time
  prep x    the chosen format's conversion (plan.prepare) / kernel time
  miss x    a whole miss (fingerprint, plan, private copy, prepare, run) / kernel time

Plan cost (the second table): ``planner.plan(A, B, measure="never")`` (``plan_transpose`` for
SpTRANS), statistics + validation + choice with no timing, per op (spmv, spmm k=8, spgemm A @ A,
sptrans, tsgemm with k=8) on operands of about 100k, 1M and 10M nonzeros (entries of the dense A
for tsgemm; 10M only without --quick, and on the host only 100k (and 1M without --quick), where
the kernels are slow): the median in ms, as a multiple of the chosen kernel's run (prepared once,
then run alone), and the target beside it (<= 0.5 ms up to 100k nonzeros, <= 2 ms up to 10M).
``stats ms`` is the part of it that validation, the structure check and the statistics take
(a new Problem each call, so nothing measured is reused).

    --plan-only [--plan-sizes 100000,1000000] [--plan-ops spmv,spgemm] [--plan-profile FILE]

times the plan costs alone and writes ``dispatch-plan-<device>.json`` (no summary); with
--plan-profile, each row's plans are profiled too (cProfile, the functions of most own time into
FILE). --trust-stale-models plans with the shipped learned model even where its recorded sources
differ from the tree's (a working tree before its models are re-stamped), so that the model's
walk is in the figure as it will be after the re-stamp.

R (the reuse matmul is told) is fixed so that no adaptive re-plan lands inside
the timing loops. Repeats: 200 per figure, fewer (at least 15) where the kernel
takes long enough that 200 would pass about 0.4 s. The kernel is also timed with CUDA events over back-to-back
launches (its device time, no per-call synchronisation) for reference.

Output: the tables on stdout and their rows in ``results/dispatch-<device>.json`` (``dispatch-quick-``
with --quick; ``-cpu`` with --host-only): the hits under "gpu" and "host", the plan costs under
"plan_never" ({"gpu": [...], "host": [...]}), then ``results/SUMMARY.md`` regenerated.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import traceback

import numpy as np

import matplan
from matplan import corpus, planner
from matplan.core.xp import cupy_module
from matplan.dispatch import fingerprint as fp_mod
from matplan.dispatch import identity
from matplan.dispatch.cache import nbytes_of
from matplan.kernels import get
from matplan.core import device as device_mod, features, validation
from matplan.core.validation import normalize
from _common import RESULTS, cuda_device_name, queued_s, write_result  # benchmarks/ is on sys.path as a script
from summarize import write_summary

REUSE = 1000
#: Issue 42's bounds: a cache hit's overhead over the kernel (us), a plan's cost (ms) by nonzeros.
HIT_TARGET_US = {"spmv": 5.0, "spmm": 5.0, "spgemm": 10.0}
PLAN_TARGET_MS = ((100_000, 0.5), (10_000_000, 2.0))


def per_call(fn, sync, repeats, warmup=3):
    for _ in range(warmup):
        fn()
        sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def paired(fa, fb, sync, repeats, warmup=3):
    """(median of fa, median of fb, median of fb - fa per pair), fa and fb timed alternately."""
    for _ in range(warmup):
        fa()
        sync()
        fb()
        sync()
    ta, tb = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fa()
        sync()
        t1 = time.perf_counter()
        fb()
        sync()
        tb.append(time.perf_counter() - t1)
        ta.append(t1 - t0)
    return statistics.median(ta), statistics.median(tb), statistics.median(b - a for a, b in zip(ta, tb))


def event_time(cp, fn, repeats=100):
    """Mean device time per call of back-to-back launches (CUDA events)."""
    return queued_s(cp, fn, repeats, 1)


def measure(name, A, B, device, sync, cp=None, trust=False):
    cache = matplan.get_plan_cache(device)
    cache.clear()
    C = matplan.matmul(A, B, reuse=REUSE, assume_unchanged=trust)   # the miss that fills the cache
    _check(C, A, B)
    (fp, bound), = list(cache)
    run = get(bound.plan.kernel).run
    repeats = int(min(200, max(15, 0.4 / per_call(lambda: run(bound.prepared, B), sync, 3, warmup=1))))
    kernel, hit, overhead = paired(lambda: run(bound.prepared, B),
                                   lambda: matplan.matmul(A, B, reuse=REUSE, assume_unchanged=trust), sync, repeats)
    norm = per_call(lambda: normalize(A, B), sync, repeats)
    problem = normalize(A, B)
    if fp.backend == "cpu":
        reference = problem.A.copy()
        full_key = per_call(lambda: fp_mod.same_content(problem.A, reference)
                            and fp_mod.fingerprint(problem, False), sync, repeats)
    else:
        full_key = per_call(lambda: fp_mod.fingerprint(problem, False), sync, repeats)
    path, key, key_bytes = _identity_check(A, B, cache, sync, repeats, trust)
    if path == "full":
        key, key_bytes = full_key, nbytes_of(A) + (nbytes_of(B) if fp.op == "spgemm" else 0)
    assert cache.misses == 1 and cache.replans == 0, "an unexpected miss or re-plan in the timing loops"
    plan_s = per_call(lambda: planner.plan(A, B, reuse=REUSE), sync, 5, warmup=1)
    prep_s = per_call(lambda: bound.plan.prepare(A), sync, 5, warmup=1)

    def miss():
        cache.clear()
        matplan.matmul(A, B, reuse=REUSE, assume_unchanged=trust)
    miss_s = per_call(miss, sync, 5, warmup=1)
    dev_s = event_time(cp, lambda: run(bound.prepared, B)) if cp is not None else float("nan")
    us = 1e6
    rate = f"{key_bytes / key / 1e9:7.1f}" if key_bytes else f"{'-':>7}"
    print(f"{name:<30} {bound.plan.kernel:<16} {fp.nnz:>11,} {kernel * us:9.1f} {dev_s * us:9.1f} "
          f"{hit * us:9.1f} {overhead * us:9.1f} {HIT_TARGET_US.get(fp.op, '-'):>6} {norm * us:7.1f} {key * us:9.1f} {rate} "
          f"{plan_s / kernel:8.1f} {prep_s / kernel:7.1f} {miss_s / kernel:8.1f} {path:>8} {full_key * us:9.1f}",
          flush=True)
    cache.clear()
    finite = lambda x: None if x != x else x  # noqa: E731  (NaN is not JSON)
    return dict(case=name, op=fp.op, target_us=HIT_TARGET_US.get(fp.op), kernel=bound.plan.kernel, nnz=int(fp.nnz), kernel_us=kernel * us,
                device_us=finite(dev_s * us), hit_us=hit * us, overhead_us=overhead * us, norm_us=norm * us, key_us=finite(key * us),
                key_gbs=key_bytes / key / 1e9 if key_bytes else None, plan_x=plan_s / kernel, prep_x=prep_s / kernel,
                miss_x=miss_s / kernel, path=path, fp_us=full_key * us)


def _identity_check(A, B, cache, sync, repeats, trust):
    """(path, seconds, bytes read) of what a hit on the identity path does before the kernel."""
    found = identity.identity_key(A, B, False)
    entry = cache.find(found[1]) if found is not None else None
    if entry is None:
        return "full", float("nan"), 0
    trusted = trust and entry.pins is not None
    limit = identity.product_limit(entry.kernel.name)
    if limit is not None and not trusted and A.indices.shape[0] * B.indices.shape[0] > limit:
        def count():
            device, key = identity.identity_key(A, B, False)
            cache.find(key)
            assert identity.within_product_limit(limit, A, B, device)
        return "products", per_call(count, sync, repeats), A.indices.nbytes
    if entry.reference is None or trusted:
        return ("alias" if entry.reference is None else "trusted",
                per_call(lambda: cache.find(identity.identity_key(A, B, False)[1]), sync, repeats), 0)
    if found[0] == "cpu":
        def check():
            return fp_mod.same_content(A, cache.find(identity.identity_key(A, B, False)[1]).reference)
    else:
        def check():
            device, key = identity.identity_key(A, B, False)
            assert identity.start_compare(A, cache.find(key).reference, device).same()
    return "compare", per_call(check, sync, repeats), 2 * nbytes_of(A)


def _check(C, A, B):
    """Spot-check C against SciPy/NumPy in float64 on the host."""
    host = lambda x: x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else x  # noqa: E731
    Ch, Ah, Bh = host(C), host(A), host(B)
    ref = Ah @ Bh
    if hasattr(ref, "toarray"):
        ref, Ch = ref.toarray(), Ch.toarray()
    scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
    if not np.allclose(Ch, ref, rtol=1e-9, atol=1e-9 * scale):
        raise AssertionError("matmul result differs from SciPy/NumPy")


HEADER = (f"{'case':<30} {'kernel':<16} {'nnz(A)':>11} {'kern us':>9} {'dev us':>9} {'hit us':>9} "
          f"{'ovh us':>9} {'target':>6} {'norm us':>7} {'key us':>9} {'key GB/s':>7} {'plan x':>8} {'prep x':>7} {'miss x':>8} "
          f"{'path':>8} {'fp us':>9}")


def gpu_cases(quick):
    rows = [1_000, 10_000, 100_000, 1_000_000] + ([] if quick else [2_000_000])
    for m in rows:
        yield f"spmv uniform m={m:,} 8/row", ("uniform", dict(m=m, n=m, nnz_per_row=8)), "vec", False
    for m in [1_000_000] + ([] if quick else [2_000_000]):   # ELL-R: a copied format, compared by default
        yield f"spmv m={m:,} assume_unchanged", ("uniform", dict(m=m, n=m, nnz_per_row=8)), "vec", True
    yield "spmv poisson3d 64^3", ("poisson3d", dict(n=64)), "vec", False
    yield "spmm uniform m=100,000 k=8", ("uniform", dict(m=100_000, n=100_000, nnz_per_row=8)), 8, False
    yield "spgemm poisson3d 16^3 A@A", ("poisson3d", dict(n=16)), "self", False
    yield "spgemm poisson3d 32^3 A@A", ("poisson3d", dict(n=32)), "self", False
    yield "spgemm 32^3 assume_unchanged", ("poisson3d", dict(n=32)), "self", True
    yield "tsgemm dense 4096 k=8", ("tall_skinny", dict(n=4096, k=8)), "dense", False


def host_cases(quick):
    rows = [1_000, 100_000] + ([] if quick else [1_000_000])
    for m in rows:
        yield f"host spmv uniform m={m:,}", ("uniform", dict(m=m, n=m, nnz_per_row=8)), "vec", False
    yield "host spgemm poisson3d 16^3", ("poisson3d", dict(n=16)), "self", False
    yield "host tsgemm dense 1024 k=8", ("tall_skinny", dict(n=1024, k=8)), "dense", False


def operands(spec, kind, xp, to_dev):
    family, kw = spec
    rng = np.random.default_rng(1)
    if kind == "dense":
        A, B = corpus.FAMILIES[family](**kw)
        return xp.asarray(A), xp.asarray(B)
    A = corpus.FAMILIES[family](**kw)
    dA = to_dev(A)
    if kind == "self":
        return dA, to_dev(A)
    shape = (A.shape[1],) if kind == "vec" else (A.shape[1], kind)
    return dA, xp.asarray(rng.standard_normal(shape))


def plan_target_ms(nnz: int):
    """Issue 42's bound on a plan without measurement for ``nnz`` nonzeros (None past 10M)."""
    return next((ms for limit, ms in PLAN_TARGET_MS if nnz <= limit * 1.05), None)


def plan_sizes(gpu: bool, quick: bool, only=None) -> list:
    if only:
        return list(only)
    if gpu:
        return [100_000, 1_000_000] + ([] if quick else [10_000_000])
    return [100_000] + ([] if quick else [1_000_000])


def plan_operands(op, nnz, xp, to_dev):
    """(A, B) of about ``nnz`` nonzeros for ``op`` (B None for sptrans): uniform 10 per row, square;
    for tsgemm a dense A of about nnz entries (m x n, m = 10 n) and B n x 8."""
    rng = np.random.default_rng(2)
    if op == "tsgemm":
        n = max(16, int(round((nnz / 10) ** 0.5)))
        return xp.asarray(rng.standard_normal((10 * n, n))), xp.asarray(rng.standard_normal((n, 8)))
    m = max(16, nnz // 10)
    A = corpus.FAMILIES["uniform"](m=m, n=m, nnz_per_row=10)
    dA = to_dev(A)
    B = {"spmv": lambda: xp.asarray(rng.standard_normal(m)), "spmm": lambda: xp.asarray(rng.standard_normal((m, 8))),
         "spgemm": lambda: to_dev(A), "sptrans": lambda: None}[op]()
    return dA, B


PLAN_OPS = ("spmv", "spmm", "spgemm", "sptrans", "tsgemm")


def plan_cost(op, nnz, xp, to_dev, sync, device, profile=None):
    """One row of the plan-cost table: planner.plan(..., measure="never") against the kernel it picks,
    and the part of it validation, the structure check and the statistics take. ``profile``: a list
    the row's cProfile text is appended to."""
    A, B = plan_operands(op, nnz, xp, to_dev)
    entries = int(A.indices.shape[0]) if hasattr(A, "indices") else int(A.size)
    make = ((lambda: planner.plan_transpose(A, reuse=REUSE, measure="never")) if op == "sptrans" else
            (lambda: planner.plan(A, B, reuse=REUSE, measure="never")))
    plan = make()
    bound = plan.bind(A)
    apply = (lambda: bound()) if op == "sptrans" else (lambda: bound(B))
    big = entries >= 5_000_000
    kernel_s = per_call(apply, sync, 5 if big else 20, warmup=2)
    plan_s = per_call(make, sync, 15 if big else 200, warmup=3 if big else 20)   # host-bound: many runs
    dev = device_mod.current()
    # as much as the plan measured (host plans skip what their one kernel does not read)
    detail = not any(v == features.NOT_MEASURED for v in (plan.features.warp_ratio, plan.features.col_max))

    def stats():   # what plan() does before scoring, on a new Problem (its figures are not reused)
        problem = normalize_transpose(A) if op == "sptrans" else normalize(A, B)
        validation.check_structure(problem)
        return features.compute(problem, dev, detail=detail)
    stats_s = per_call(stats, sync, 15 if big else 200, warmup=3 if big else 20)
    if profile is not None:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5 if big else 20):
            make()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        profile.append(f"=== {op} {entries:,} ({device}): {plan_s * 1e3:.3f} ms a plan\n{text.getvalue()}")
    target = plan_target_ms(entries)
    us = 1e6
    ok = "-" if target is None else "yes" if plan_s * 1e3 <= target else "no"
    print(f"{op:<8} {entries:>11,} {plan.kernel:<22} {plan_s * 1e3:9.3f} {stats_s * 1e3:9.3f} {kernel_s * us:10.1f} "
          f"{plan_s / kernel_s:8.1f} {'-' if target is None else target:>9} {ok:>4}", flush=True)
    return dict(op=op, nnz=entries, kernel=plan.kernel, plan_ms=plan_s * 1e3, stats_ms=stats_s * 1e3,
                kernel_us=kernel_s * us, plan_x=plan_s / kernel_s, target_ms=target, device=device)


def normalize_transpose(A):
    return validation.normalize_transpose(A)


PLAN_HEADER = (f"{'op':<8} {'nnz(A)':>11} {'kernel':<22} {'plan ms':>9} {'stats ms':>9} {'kern us':>10} "
               f"{'plan x':>8} {'target ms':>9} {'met':>4}")


def plan_costs(gpu, quick, xp, to_dev, sync, device, sizes=None, ops=PLAN_OPS, profile=None) -> list:
    print(f"\nplan(A, B, measure='never') ({'GPU operands' if gpu else 'host operands'}): medians; "
          "targets <= 0.5 ms up to 100k nonzeros, <= 2 ms up to 10M")
    print(PLAN_HEADER)
    rows = []
    for nnz in plan_sizes(gpu, quick, sizes):
        for op in ops:
            try:
                rows.append(plan_cost(op, nnz, xp, to_dev, sync, device, profile))
            except Exception as exc:
                rows.append(dict(op=op, nnz=nnz, error=f"{type(exc).__name__}: {str(exc)[:200]}"))
                print(f"{op} {nnz:,}: FAILED\n{traceback.format_exc()}", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer, smaller cases")
    ap.add_argument("--host-only", action="store_true", help="skip the GPU cases")
    ap.add_argument("--out", default=str(RESULTS), help="folder of the JSON result")
    ap.add_argument("--plan-only", action="store_true", help="the plan costs alone (dispatch-plan-<device>.json)")
    ap.add_argument("--plan-sizes", type=_ints, default=None,
                    help="nonzeros of the plan-cost operands, e.g. 100000,1000000")
    ap.add_argument("--plan-ops", type=lambda s: tuple(s.split(",")), default=PLAN_OPS,
                    help=f"ops of the plan-cost table (default {','.join(PLAN_OPS)})")
    ap.add_argument("--plan-profile", default=None, metavar="FILE", help="profile each plan-cost row into FILE")
    ap.add_argument("--trust-stale-models", action="store_true",
                    help="plan with the shipped learned model even where its recorded sources differ")
    args = ap.parse_args(argv)
    if args.trust_stale_models:
        from matplan.models import learned_fingerprint
        learned_fingerprint.mismatch = lambda recorded, now=None: None
    if args.plan_only:
        return plan_main(args)
    cp = None if args.host_only else cupy_module()
    print(f"matplan {matplan.__version__}, NumPy {np.__version__}; REUSE={REUSE}; medians of per-call "
          "synchronised wall-clock times")
    rows = {"gpu": [], "host": []}
    plans = {"gpu": [], "host": []}
    device_name = "cpu"
    if cp is not None:
        import cupyx.scipy.sparse as csp
        dev = cp.cuda.runtime.getDevice()
        device_name = cuda_device_name(cp)
        print(f"\nGPU {dev}: {device_name}, CuPy {cp.__version__}")
        print(HEADER)
        sync = cp.cuda.get_current_stream().synchronize
        for label, spec, kind, trust in gpu_cases(args.quick):
            try:
                A, B = operands(spec, kind, cp, csp.csr_matrix)
                rows["gpu"].append(measure(label, A, B, dev, sync, cp, trust=trust))
            except Exception as exc:
                rows["gpu"].append(dict(case=label, error=f"{type(exc).__name__}: {str(exc)[:200]}"))
                print(f"{label}: FAILED\n{traceback.format_exc()}", flush=True)
        plans["gpu"] = plan_costs(True, args.quick, cp, csp.csr_matrix, sync, device_name)
    print(f"\nhost: {os.cpu_count()} CPUs; full path key = digest of {fp_mod.SAMPLE} sampled items per array + "
          "bitwise comparison with the entry's copy (SpGEMM: B's structure in full, BLAKE2b)")
    print(HEADER)
    for label, spec, kind, trust in host_cases(args.quick):
        try:
            A, B = operands(spec, kind, np, lambda A: A)
            rows["host"].append(measure(label, A, B, "cpu", lambda: None))
        except Exception as exc:
            rows["host"].append(dict(case=label, error=f"{type(exc).__name__}: {str(exc)[:200]}"))
            print(f"{label}: FAILED\n{traceback.format_exc()}", flush=True)
    plans["host"] = plan_costs(False, args.quick, np, lambda A: A, lambda: None, "cpu")
    path = write_result(args.out, "dispatch" + ("-quick" if args.quick else ""), device_name,
                        dict(matplan=matplan.__version__, reuse=REUSE, host_cpus=os.cpu_count(), **rows,
                             plan_never=plans))
    print(f"\nwrote {path} and {write_summary(args.out)}")
    return 1 if any("error" in r for table in (rows, plans) for side in table.values() for r in side) else 0


def _ints(text: str) -> tuple:
    return tuple(int(float(v)) for v in text.split(","))


def plan_main(args) -> int:
    """--plan-only: the plan-cost tables (GPU operands where CuPy sees a GPU, host operands unless
    the GPU ran), their rows in ``dispatch-plan-<device>.json`` and, with --plan-profile, the profiles."""
    cp = None if args.host_only else cupy_module()
    profile = [] if args.plan_profile else None
    plans, device_name = {"gpu": [], "host": []}, "cpu"
    print(f"matplan {matplan.__version__}, NumPy {np.__version__}; REUSE={REUSE}")
    if cp is not None:
        import cupyx.scipy.sparse as csp
        device_name = cuda_device_name(cp)
        plans["gpu"] = plan_costs(True, False, cp, csp.csr_matrix, cp.cuda.get_current_stream().synchronize,
                                  device_name, args.plan_sizes, args.plan_ops, profile)
    else:
        plans["host"] = plan_costs(False, False, np, lambda A: A, lambda: None, "cpu", args.plan_sizes,
                                   args.plan_ops, profile)
    if profile is not None:
        os.makedirs(os.path.dirname(os.path.abspath(args.plan_profile)), exist_ok=True)
        with open(args.plan_profile, "w") as fh:
            fh.write("\n".join(profile))
    path = write_result(args.out, "dispatch-plan", device_name,
                        dict(matplan=matplan.__version__, reuse=REUSE, host_cpus=os.cpu_count(), plan_never=plans))
    print(f"\nwrote {path}")
    return 1 if any("error" in r for side in plans.values() for r in side) else 0


if __name__ == "__main__":
    sys.exit(main())
