"""SpGEMM and SpTRANS on the GPU: RBSparse hash (spgemm.hash) vs cuSPARSE through CuPy, same run.
The row-row segmented merge (spgemm.merge, deterministic) is run and timed too up to MERGE_PRODUCTS
products (``merge_ms``, ``merge_status``; it takes part in the oracle).

C = A·A (A·Aᵀ for rectangular A) in float64 over the corpus's 'spgemm' size set, R-MAT scales
17-18 and the real matrices (``.data/matrices`` or ``../shared/matrices``). Times are CUDA-event
wall times of whole calls (analysis, symbolic, allocation, numeric), median of 20 timed runs
after 3 warm-ups (5 after 1 past 5e7 products, 1 past 5e8). Every product timed is checked against
SciPy first (``_checks.check_product``: per-row counts and so nnz against A·B's structure,
columns and values of 64 sampled rows and the longest, every row's sum): ours (``correct``,
``check``), cuSPARSE (``vendor_correct``, ``vendor_check``), the merge (``merge_correct``) and
plan.run's own output (``planner_correct``, ``planner_check``); ``check`` says the first mismatch.
Each is checked against SciPy, not against another kernel: an nnz that differs is that kernel's
failure to explain. ``vendor_status`` records where cuSPARSE raised, returned a wrong result, or
was not run because the problem is past its known limits (VENDOR_LIMITS).

Two cuSPARSE figures, side by side. ``vendor_ms`` is the one-shot call a CuPy user makes,
cupyx's ``A @ B`` (``cusparseSpGEMM_*``: work estimation, compute, C allocated, copy, every call);
``speedup_vs_vendor`` is against it. ``vendor_reuse_ms`` is cuSPARSE's SpGEMM with reuse as a C++
user with a fixed pattern runs it (``kernels/spgemm/cusparse_reuse.py``): C's structure made once
(``vendor_reuse_setup_ms``, the faster of two setups where one takes under a second), then the
median of compute-only calls (``cusparseSpGEMMreuse_compute`` into the kept C, values only), timed
in turn with the others after the same warm-up; its output checked against SciPy as the others
(``vendor_reuse_correct``, ``vendor_reuse_check``; ``vendor_reuse_status`` says where it was not
run: past VENDOR_LIMITS, out of memory, as reuse keeps its buffers beside C, or unavailable).
``speedup_vs_vendor_reuse`` = vendor_reuse_ms / ms, our repeated call (a guess replay where
``ms_kind`` says so, which still computes C's structure) against reuse's values-only call;
``vendor_reuse_speedup_vs_vendor`` = vendor_ms / vendor_reuse_ms. Each ratio only where both
figures are checked correct; ``geomean_speedup_vs_vendor_reuse`` in the summary likewise.
``values_replay_ms`` is our values-only replay (``spgemm(values=True)``, what a plan's repeated
``run`` takes; kernels/spgemm/values.py): after the pair's second call has kept each entry of C's
products (``values_setup_ms``, ``values_kept_bytes``), the median of calls that recompute C's
values only (structure checked on the GPU, C's indptr and indices copied into a new matrix),
timed in turn with the others and checked against SciPy as they are (``values_correct``,
``values_check``; ``values_status`` says where the memory rule or the operands refused it).
``speedup_values_vs_vendor_reuse`` = vendor_reuse_ms / values_replay_ms and
``values_speedup_vs_ms`` = ms / values_replay_ms, each only where both figures are checked correct,
as are the summary's geomeans; ``planner_ms_kind`` says "values replay" where plan.run took it.
A product whose C fits no single GPU CSR (past 2^31 - 1 nonzeros or free memory; wordnet A·Aᵀ
has 8.8e9) is streamed with ``spgemm_panels`` and each panel checked by row sums
(``output``/``panels`` in the JSON). SpTRANS: ``sptrans.transpose`` (the full transpose, no plan:
``sptrans_ms``) and a plan's repeated ``plan.run(A)``, which replays its recorded launches and A's
pattern (``sptrans_plan_replay_ms``), vs CuPy's ``A.T.tocsr()``, values compared too
(``benchmarks/sptrans.py`` compares them in more detail).
``ms`` times repeated calls of the same operands, so a one-pass product after its first call
replays its kept analysis (spgemm's "Guessed analyses"): ``ms_kind`` says "guess replay" there,
"full product" elsewhere. ``full_ms`` is the full product, every call waiting for its own analysis
as a first call does (``unguessed_ms``, ``guess=False``, where ``ms`` is a replay; ``ms`` itself
elsewhere), and ``full_geomean_speedup_vs_vendor`` is the geomean with it.
``planner_ms`` is the user's call ``plan.run(A, B)`` (validation and the chosen kernel); for a
panelled product, the panels' time. Ours, cuSPARSE and plan.run are each checked once, then timed
in turn, call by call (a host's speed drifted by 20-40% within a run on H100 hosts).

    PYTHONPATH=. python3 benchmarks/spgemm.py [--out benchmarks/results] [--budget-s 200] [--only NAME ...]

Output: ``results/spgemm-<device>.json`` (``spgemm-subset-`` with --only), then ``results/SUMMARY.md``
regenerated.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp
from _checks import SpgemmReference, check_product
from _common import RESULTS, geomean, write_result  # this folder is on sys.path when run as a script
from summarize import write_summary
from matplan.core.timing import cuda_medians_alternating_s


def peak(cp, fn):
    from matplan.core.memtrack import peak_memory
    cp.get_default_memory_pool().free_all_blocks()
    with peak_memory() as mem:
        out = fn()
        cp.cuda.Device().synchronize()
    del out
    return int(mem.peak)


def matrices(budget_s, t0, only=None):
    from matplan import corpus
    wanted = (lambda name: True) if not only else (lambda name: name in only)
    for family in ("poisson3d", "rmat", "uniform", "skewed", "block_dense", "banded"):
        if wanted(f"{family}-spgemm"):
            yield f"{family}-spgemm", corpus.load(family, "spgemm")
    for scale in (17, 18):
        if wanted(f"rmat-scale{scale}"):
            yield f"rmat-scale{scale}", corpus.rmat(scale=scale, edge_factor=16, seed=0)
    folder = ".data/matrices" if os.path.isdir(".data/matrices") else None
    for name, A in corpus.real_matrices(folder):
        if not wanted(name):
            continue
        if time.time() - t0 > budget_s:
            print(f"# budget spent: skipping {name}", flush=True)
            continue
        yield name, A


def panelled(cp, hs, A, B, ref):
    """C = A @ B streamed by ``spgemm_panels`` (each panel checked against SciPy, then freed): one
    timed pass, start to last panel, the symbolic pass and every panel's numeric pass included."""
    info, nnz_c, ok, why = {}, 0, True, None
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    cp.cuda.Device().synchronize()
    start.record()
    for r0, r1, P in hs.spgemm_panels(A, B, info=info):
        nnz_c += int(P.nnz)
        good, reason = check_product(P, ref, row0=r0)
        if ok and not good:
            ok, why = False, f"panel rows {r0}-{r1}: {reason}"
        del P
    stop.record()
    stop.synchronize()
    ms = cp.cuda.get_elapsed_time(start, stop)
    return dict(ms=ms, nnz_c=nnz_c, output="row panels (spgemm_panels)", panels=info.get("panels"),
                panel_why=info.get("panel_why"), correct=ok,
                check=why or f"ok: each panel ({ref.counts_note or 'per-row counts'}, sampled rows, row sums)",
                status="ok", ms_kind="full product", full_ms=ms,
                gflops=2 * info.get("products", 0) / (ms * 1e6), note="ms includes the check of each panel")


def vendor_reuse(cp, A, B, ref):
    """(fields, PreparedSpGEMMReuse or None) of cuSPARSE's SpGEMM with reuse on canonical A and B:
    the setup timed (the faster of two where one takes under a second: the first in a process may
    load cuSPARSE's kernels), one compute checked against SciPy. None where it cannot be timed
    (the fields say why: unavailable, out of memory, an error)."""
    from matplan.kernels.spgemm import cusparse_reuse, vendor
    why = cusparse_reuse.unavailable()
    if why:
        return dict(vendor_reuse_ms=None, vendor_reuse_status=f"not run: {why}"), None
    prepared, setups = None, []
    try:
        Ac, Bc = vendor.canonical(A), vendor.canonical(B)
        while len(setups) < 2 and (not setups or setups[0] < 1.0):
            if prepared is not None:
                prepared.close()
                prepared = None
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            prepared = cusparse_reuse.PreparedSpGEMMReuse(Ac, Bc)
            cp.cuda.Device().synchronize()
            setups.append(time.perf_counter() - t)
        C = prepared.compute().copy()   # a copy: cupyx's checks may sort C in place, computes keep cuSPARSE's order
        ok, why = check_product(C, ref)
        del C
        fields = dict(vendor_reuse_status="ok" if ok else f"wrong: {why}", vendor_reuse_correct=ok,
                      vendor_reuse_check=why, vendor_reuse_nnz_c=prepared.nnz, vendor_reuse_setup_ms=min(setups) * 1e3,
                      vendor_reuse_kept_bytes=prepared.kept_bytes, vendor_reuse_buffer_bytes=prepared.buffer_bytes)
        return fields, prepared
    except MemoryError as e:        # reuse keeps buffers 4 and 5 beside C: more than the one-shot call
        status = f"out of memory: {type(e).__name__}: {str(e)[:160]}"
    except Exception as e:          # recorded, not hidden
        status = f"{type(e).__name__}: {str(e)[:200]}"
    if prepared is not None:
        prepared.close()
    cp.get_default_memory_pool().free_all_blocks()
    return dict(vendor_reuse_ms=None, vendor_reuse_status=status), None


def reuse_ratios(row) -> dict:
    """``speedup_vs_vendor_reuse`` (reuse's compute over our repeated call) and
    ``vendor_reuse_speedup_vs_vendor`` (the one-shot call over reuse's compute), each only where
    both of its figures are checked correct."""
    out = {}
    reuse_ok = row.get("vendor_reuse_ms") and row.get("vendor_reuse_correct")
    if reuse_ok and row.get("ms") and row.get("correct"):
        out["speedup_vs_vendor_reuse"] = row["vendor_reuse_ms"] / row["ms"]
    if reuse_ok and row.get("vendor_ms") and row.get("vendor_correct"):
        out["vendor_reuse_speedup_vs_vendor"] = row["vendor_ms"] / row["vendor_reuse_ms"]
    return out


def reuse_summary(rows) -> dict:
    """The summary's reuse fields: geomeans over the rows whose two figures are checked correct,
    how many, and where reuse was not timed or was wrong."""
    vs_ours = [r["speedup_vs_vendor_reuse"] for r in rows if r.get("speedup_vs_vendor_reuse")]
    gains = [r["vendor_reuse_speedup_vs_vendor"] for r in rows if r.get("vendor_reuse_speedup_vs_vendor")]
    return dict(geomean_speedup_vs_vendor_reuse=geomean(vs_ours), matrices_compared_vendor_reuse=len(vs_ours),
                geomean_vendor_reuse_speedup_vs_vendor=geomean(gains),
                vendor_reuse_not_ok=[f"{r['matrix']}: {r['vendor_reuse_status']}" for r in rows
                                     if r.get("vendor_reuse_status", "ok") != "ok"])


def values_replay(cp, hs, A, B, ref):
    """(fields, timed call or None) of our values-only replay (``spgemm(values=True)``): the
    pair's first call notes it, the second sets the replay up (``values_setup_ms``, the setup's own
    host time with its GPU work waited for; ``values_kept_bytes``), the third replays and is checked
    against SciPy as the others. None where the memory rule or the operands refused the setup
    (``values_status`` says why)."""
    from matplan.kernels.spgemm import guesses, values
    try:
        for _ in range(2):
            info = {}
            hs.spgemm(A, B, values=True, info=info)
        kept = guesses.values_kept(A, B)
        if not isinstance(kept, values.ValuesReplay):
            return dict(values_replay_ms=None, values_status=str(info.get("values_replay") or kept)), None
        info2 = {}
        C = hs.spgemm(A, B, values=True, info=info2)
        if info2.get("values_replay") is not True:
            return dict(values_replay_ms=None, values_status=f"not replayed: {info2.get('values_replay')}"), None
        ok, why = check_product(C, ref)
        del C
        return dict(values_status="ok" if ok else f"wrong: {why}", values_correct=ok, values_check=why,
                    values_setup_ms=info.get("values_setup_ms", kept.setup_ms), values_kept_bytes=kept.kept_bytes,
                    values_lanes=kept.lanes), lambda: hs.spgemm(A, B, values=True)
    except Exception as e:   # recorded, not hidden
        return dict(values_replay_ms=None, values_status=f"{type(e).__name__}: {str(e)[:200]}"), None


def values_ratios(row) -> dict:
    """``speedup_values_vs_vendor_reuse`` (reuse's compute over our values replay) and
    ``values_speedup_vs_ms`` (our repeated call over it), each only where both are checked correct."""
    out = {}
    if not (row.get("values_replay_ms") and row.get("values_correct")):
        return out
    if row.get("vendor_reuse_ms") and row.get("vendor_reuse_correct"):
        out["speedup_values_vs_vendor_reuse"] = row["vendor_reuse_ms"] / row["values_replay_ms"]
    if row.get("ms") and row.get("correct"):
        out["values_speedup_vs_ms"] = row["ms"] / row["values_replay_ms"]
    return out


def values_summary(rows) -> dict:
    """The summary's values-replay fields: geomeans over rows whose two figures are checked correct."""
    vs_reuse = [r["speedup_values_vs_vendor_reuse"] for r in rows if r.get("speedup_values_vs_vendor_reuse")]
    return dict(geomean_speedup_values_vs_vendor_reuse=geomean(vs_reuse), matrices_compared_values=len(vs_reuse),
                geomean_values_speedup_vs_ms=geomean([r["values_speedup_vs_ms"] for r in rows
                                                      if r.get("values_speedup_vs_ms")]),
                values_not_ok=[f"{r['matrix']}: {r['values_status']}" for r in rows
                               if r.get("values_status", "ok") != "ok"])


#: The row-row merge is run up to this many products (it holds ~28 bytes a product).
MERGE_PRODUCTS = 300_000_000
#: Each kernel's timing in a row.
KERNEL_KEYS = {"spgemm.hash": "ms", "spgemm.cusparse": "vendor_ms", "spgemm.merge": "merge_ms"}


def run_one(cp, name, A_host):
    import cupyx.scipy.sparse as csp
    from matplan.kernels import spgemm as hs
    from matplan.kernels.spgemm import merge as spgemm_merge
    from matplan.kernels.sptrans import gpu as sptrans
    from matplan.models.spgemm import VENDOR_LIMITS
    from matplan.planner import plan as make_plan

    A_host = sp.csr_matrix(A_host, dtype=np.float64)
    square = A_host.shape[0] == A_host.shape[1]
    B_host = A_host if square else A_host.T.tocsr()
    A = csp.csr_matrix(A_host)
    B = A if square else csp.csr_matrix(B_host)
    products = int(np.diff(B_host.indptr)[A_host.indices].sum())
    # calls of about a millisecond vary by 20-30% between processes on an H100 (dragon and metis):
    # many repeats after a longer warm-up for them
    reps, warm = (1, 1) if products > 5e8 else (5, 1) if products > 5e7 else (20, 3)
    row = dict(matrix=name, product="A*A" if square else "A*At", m=A_host.shape[0], n=A_host.shape[1],
               nnz=int(A_host.nnz), products=products, kernel="spgemm.hash")
    t = time.perf_counter()
    ref = SpgemmReference(A_host, B_host)
    row["reference_s"] = time.perf_counter() - t

    # ours, cuSPARSE and the planner's call: each run and checked once here, then timed in turn
    fns = {}
    info = {}
    try:
        C = hs.spgemm(A, B, info=info)
        ok, why = check_product(C, ref)
        row.update(nnz_c=int(C.nnz), correct=ok, check=why,
                   status="ok", balanced=info.get("balanced"), numeric_tables=info.get("numeric_tables"),
                   global_rows_numeric=info.get("global_rows_numeric"),
                   global_rows_symbolic=info.get("global_rows_symbolic"), host_ms=info.get("host_ms"),
                   one_pass=info.get("one_pass"), esc_rows=info.get("esc_rows"))
        del C
        row["peak_mem_bytes"] = peak(cp, lambda: hs.spgemm(A, B))
        if info.get("one_pass"):   # later calls replay the kept analysis: a replay's output is checked too
            C = hs.spgemm(A, B)
            ok2, why2 = check_product(C, ref)
            del C
            if ok and not ok2:
                row.update(correct=False, check=f"guess replay: {why2}")
        fns["ms"] = lambda: hs.spgemm(A, B)
        if info.get("one_pass"):   # ms: repeated calls (guessed where kept); unguessed_ms: none guessed
            fns["unguessed_ms"] = lambda: hs.spgemm(A, B, guess=False)
    except (OverflowError, MemoryError) as e:  # C fits no single GPU CSR: stream it in row panels
        cp.get_default_memory_pool().free_all_blocks()
        row.update(single_output_status=f"{type(e).__name__}: {str(e)[:160]}")
        try:
            row.update(panelled(cp, hs, A, B, ref))
        except Exception as e2:
            row.update(ms=None, status=f"{type(e2).__name__}: {e2}")
    except Exception as e:  # recorded, not hidden
        row.update(ms=None, status=f"{type(e).__name__}: {e}")
    cp.get_default_memory_pool().free_all_blocks()

    # vendor
    limit = VENDOR_LIMITS["spgemm.cusparse"]["max_products"]
    if products > limit:
        row.update(vendor_ms=None, vendor_status=f"not run: {products:,} products > known limit {limit:,}")
    else:
        try:
            Cv = A @ B
            ok, why = check_product(Cv, ref)
            row.update(vendor_status="ok" if ok else f"wrong: {why}", vendor_correct=ok, vendor_check=why,
                       vendor_nnz_c=int(Cv.nnz))
            del Cv
            row["vendor_peak_mem_bytes"] = peak(cp, lambda: A @ B)
            fns["vendor_ms"] = lambda: A @ B
        except Exception as e:
            row.update(vendor_ms=None, vendor_status=f"{type(e).__name__}: {str(e)[:200]}")
    cp.get_default_memory_pool().free_all_blocks()

    # the row-row segmented merge (sorts every product: past MERGE_PRODUCTS it is not run)
    if products > MERGE_PRODUCTS:
        row["merge_status"] = f"not run: {products:,} products > {MERGE_PRODUCTS:,}"
    else:
        try:
            Cm = spgemm_merge.spgemm_merge(A, B)
            ok, why = check_product(Cm, ref)
            row.update(merge_status="ok" if ok else f"wrong: {why}", merge_correct=ok, merge_check=why)
            del Cm
            fns["merge_ms"] = lambda: spgemm_merge.spgemm_merge(A, B)
        except Exception as e:
            row.update(merge_ms=None, merge_status=f"{type(e).__name__}: {str(e)[:200]}")
    cp.get_default_memory_pool().free_all_blocks()

    # planner and oracle
    try:
        t = time.perf_counter()
        p = make_plan(A, B)
        row["planning_s"] = time.perf_counter() - t
        row["planner_kernel"] = p.kernel
        row["planner_why"] = list(p.reasons)
        ran = KERNEL_KEYS.get(p.kernel)
        if ran in fns:       # the user's call: plan.run validates, then runs the kernel; its output checked too
            Cp = p.run(A, B)
            row["planner_correct"], row["planner_check"] = check_product(Cp, ref)
            del Cp
            fns["planner_ms"] = lambda: p.run(A, B)
    except Exception as e:
        row["planner_kernel"], row["planner_ms"] = f"error: {e}", None
    # our values-only replay (kept by spgemm's guesses: plan.run's calls above may have set it up)
    if row.get("status") == "ok" and "output" not in row:
        fields, fn = values_replay(cp, hs, A, B, ref)
        row.update(fields)
        if fn is not None:
            fns["values_replay_ms"] = fn
    # cuSPARSE with reuse, set up last so its kept buffers do not crowd the calls above
    reuse = None
    if products > limit:
        row.update(vendor_reuse_ms=None, vendor_reuse_status=f"not run: {products:,} products > known limit {limit:,}")
    else:
        fields, reuse = vendor_reuse(cp, A, B, ref)
        row.update(fields)
        if reuse is not None:
            fns["vendor_reuse_ms"] = reuse.compute
    if fns:                  # in turn, so that a drift of the host's speed falls on each alike
        try:
            times = cuda_medians_alternating_s(fns, reps, warm)
        except MemoryError as e:    # reuse's buffers beside the others' calls: time them without it
            if reuse is None:
                raise
            fns.pop("vendor_reuse_ms")
            reuse.close()
            reuse = None
            cp.get_default_memory_pool().free_all_blocks()
            row.update(vendor_reuse_ms=None,
                       vendor_reuse_status=f"out of memory when timed beside the others: {str(e)[:160]}")
            times = cuda_medians_alternating_s(fns, reps, warm)
        row.update({key: s * 1e3 for key, s in times.items()})
    if reuse is not None:
        reuse.close()
    cp.get_default_memory_pool().free_all_blocks()
    if row.get("status") == "ok" and row.get("ms"):
        row["gflops"] = 2 * products / (row["ms"] * 1e6)
    if "planner_ms" not in row and not str(row.get("planner_kernel", "")).startswith("error"):
        # not run apart (a panelled product): the chosen kernel's own figure and check
        key = KERNEL_KEYS.get(row["planner_kernel"], "")
        row["planner_ms"] = row.get(key)
        row["planner_correct"] = row.get({"ms": "correct", "vendor_ms": "vendor_correct",
                                          "merge_ms": "merge_correct"}.get(key, ""))
    if row.get("ms") is not None and "ms_kind" not in row:   # one-pass: repeated calls replay the guess
        row["ms_kind"] = "guess replay" if "unguessed_ms" in row else "full product"
        row["full_ms"] = row.get("unguessed_ms", row["ms"])
    if row.get("planner_kernel") == "spgemm.hash" and row.get("ms_kind"):
        from matplan.kernels.spgemm import guesses, values
        # plan.run passes values=True: its repeated runs replay values where the pair keeps a replay
        replayed = isinstance(guesses.values_kept(A, B), values.ValuesReplay)
        row["planner_ms_kind"] = "values replay" if replayed else row["ms_kind"]
    if "values_replay_ms" in row and row.get("values_correct"):
        from matplan.kernels.spgemm import guesses, values
        if not isinstance(guesses.values_kept(A, B), values.ValuesReplay):   # refuted or evicted while timed
            row.update(values_correct=False, values_status="the replay was dropped while timed")
    hs.forget_guesses()   # the pair's kept replay and guesses go with it
    if row.get("ms") and row.get("vendor_ms") and row.get("correct") and row.get("vendor_correct"):
        row["speedup_vs_vendor"] = row["vendor_ms"] / row["ms"]
    row.update(reuse_ratios(row))
    row.update(values_ratios(row))
    timings = {k: v for k, v in (("spgemm.hash", row.get("ms") if row.get("correct") else None),
                                 ("spgemm.cusparse", row.get("vendor_ms") if row.get("vendor_status") == "ok" else None),
                                 ("spgemm.merge", row.get("merge_ms") if row.get("merge_status") == "ok" else None))
               if v is not None}
    if timings:
        row["oracle_kernel"] = min(timings, key=timings.get)
        row["oracle_ms"] = timings[row["oracle_kernel"]]

    # SpTRANS: sptrans.transpose (method "auto", no plan: the full transpose) and a plan's repeated
    # runs (planner.plan_transpose(A).run(A): graph and pattern replays) vs cupyx (cuSPARSE csr2csc);
    # benchmarks/sptrans.py has more
    try:
        from matplan import planner
        p = planner.plan_transpose(A)
        Tv = A.T.tocsr()
        Tv.sort_indices()
        same = True
        for T in (sptrans.transpose(A), p.run(A), p.run(A)):   # the plan's first call, then its recorded one
            same &= bool(T.nnz == Tv.nnz and cp.array_equal(T.indptr, Tv.indptr)
                         and cp.array_equal(T.indices, Tv.indices) and cp.array_equal(T.data, Tv.data))
        del T, Tv
        t = cuda_medians_alternating_s({"ours": lambda: sptrans.transpose(A), "plan": lambda: p.run(A),
                                        "vendor": lambda: A.T.tocsr()}, 5, 1)
        row.update(sptrans_kernel="sptrans.transpose[auto]", sptrans_ms=t["ours"] * 1e3,
                   sptrans_vendor_ms=t["vendor"] * 1e3, sptrans_speedup=t["vendor"] / t["ours"],
                   sptrans_plan_kernel=p.candidates[0].label(), sptrans_plan_replay_ms=t["plan"] * 1e3,
                   sptrans_plan_replay_speedup=t["vendor"] / t["plan"], sptrans_same_as_vendor=same)
    except Exception as e:
        row["sptrans_status"] = f"{type(e).__name__}: {e}"
    cp.get_default_memory_pool().free_all_blocks()
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--budget-s", type=float, default=200.0,
                    help="stop adding real matrices after this many seconds")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these matrices (names as in the output)")
    args = ap.parse_args(argv)
    from matplan.core.xp import cupy_module
    cp = cupy_module()
    if cp is None:
        sys.exit("benchmarks/spgemm.py needs CuPy and an NVIDIA GPU")
    from matplan.core import device as device_mod
    dev = device_mod.current()
    t0 = time.time()
    rows = []
    for name, A in matrices(args.budget_s, t0, args.only):
        r = run_one(cp, name, A)
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("planner_why",)}, default=str), flush=True)
    ok = [r for r in rows if r.get("speedup_vs_vendor")]    # ours and cuSPARSE both checked correct
    sp_ok = [r for r in rows if r.get("sptrans_speedup") and r.get("sptrans_same_as_vendor")]
    summary = dict(
        geomean_speedup_vs_vendor=geomean([r["speedup_vs_vendor"] for r in ok]),
        matrices_compared=len(ok),
        planner_slower_than_vendor=[r["matrix"] for r in rows if r.get("planner_ms") and r.get("vendor_ms")
                                    and r.get("planner_correct") and r.get("vendor_correct")
                                    and r["planner_ms"] > r["vendor_ms"]],
        wrong=[f"{r['matrix']} {who}: {r.get(key)}" for r in rows for who, flag, key in (
            ("ours", "correct", "check"), ("cuSPARSE", "vendor_correct", "vendor_check"),
            ("cuSPARSE reuse", "vendor_reuse_correct", "vendor_reuse_check"),
            ("values replay", "values_correct", "values_check"),
            ("merge", "merge_correct", "merge_check"), ("plan.run", "planner_correct", "planner_check"))
            if r.get(flag) is False],
        sptrans_geomean_speedup=geomean([r["sptrans_speedup"] for r in sp_ok]),
        sptrans_plan_replay_geomean_speedup=geomean([r["sptrans_plan_replay_speedup"] for r in sp_ok]),
        merge_geomean_speedup_vs_vendor=geomean([r["vendor_ms"] / r["merge_ms"] for r in ok
                                                 if r.get("merge_ms") and r.get("merge_correct")]),
        full_geomean_speedup_vs_vendor=geomean([r["vendor_ms"] / r["full_ms"] for r in ok]),
        merge_geomean_vs_hash=geomean([r["ms"] / r["merge_ms"] for r in rows if r.get("merge_ms") and r.get("ms")
                                       and r.get("merge_correct") and r.get("correct")]),
        **reuse_summary(rows),
        **values_summary(rows),
    )
    doc = dict(copy_bandwidth=dev.mem_bandwidth, dtype="float64", summary=summary, results=rows,
               wall_s=time.time() - t0)
    path = write_result(args.out, "spgemm-subset" if args.only else "spgemm", dev.name, doc)
    print("summary", json.dumps(summary), "->", path, "and", write_summary(args.out), flush=True)


if __name__ == "__main__":
    main()
