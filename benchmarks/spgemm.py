"""SpGEMM and SpTRANS on the GPU: RBSparse hash (spgemm.hash) vs cuSPARSE through CuPy, same run.
The row-row segmented merge (spgemm.merge, deterministic) is run and timed too up to MERGE_PRODUCTS
products (``merge_ms``, ``merge_status``; it takes part in the oracle).

C = A·A (A·Aᵀ for rectangular A) in float64 over the corpus's 'spgemm' size set, R-MAT scales
17-18 and the real matrices (``.data/matrices`` or ``../shared/matrices``). Times are CUDA-event
wall times of whole calls (analysis, symbolic, allocation, numeric), median of 20 timed runs
after 3 warm-ups (5 after 1 past 5e7 products, 1 past 5e8). Correctness of every result: row sums against SciPy's A @ (B @ 1) and, where
cuSPARSE succeeded, the same nnz. ``vendor_status`` records where cuSPARSE raised, returned a
wrong result, or was not run because the problem is past its known limits (VENDOR_LIMITS).
A product whose C fits no single GPU CSR (past 2^31 - 1 nonzeros or free memory; wordnet A·Aᵀ
has 8.8e9) is streamed with ``spgemm_panels`` and each panel checked by row sums
(``output``/``panels`` in the JSON). SpTRANS: ``sptrans.transpose`` (no plan: ``sptrans_ms``) and
a plan's repeated ``plan.run(A)`` (graph and pattern replays: ``sptrans_plan_ms``) vs CuPy's
``A.T.tocsr()``, values compared too (``benchmarks/sptrans.py`` compares them in more detail).
``ms`` times repeated calls of the same operands, so a one-pass product after its first call
goes on from its kept analysis (spgemm's "Guessed analyses"); ``unguessed_ms`` times the same
call with ``guess=False`` (every call waits for its own analysis, as a first call does), and
``unguessed_geomean_speedup_vs_vendor`` is the geomean with it.
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


def panelled(cp, hs, A, B, ref_rows, scale):
    """C = A @ B streamed by ``spgemm_panels`` (each panel checked by row sums, then freed): one
    timed pass, start to last panel, the symbolic pass and every panel's numeric pass included."""
    info, nnz_c, ok = {}, 0, True
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    cp.cuda.Device().synchronize()
    start.record()
    for r0, r1, P in hs.spgemm_panels(A, B, info=info):
        nnz_c += int(P.nnz)
        got = cp.asnumpy(P.sum(axis=1)).ravel()
        ok &= bool(np.all(np.abs(got - ref_rows[r0:r1]) <= 1e-10 * np.maximum(scale[r0:r1], 1)))
        del P
    stop.record()
    stop.synchronize()
    ms = cp.cuda.get_elapsed_time(start, stop)
    return dict(ms=ms, nnz_c=nnz_c, output="row panels (spgemm_panels)", panels=info.get("panels"),
                panel_why=info.get("panel_why"), correct_rowsums=ok, status="ok",
                gflops=2 * info.get("products", 0) / (ms * 1e6), note="ms includes the row-sum check of each panel")


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
    ref_rows = A_host @ (B_host @ np.ones(B_host.shape[1]))
    scale = abs(A_host) @ (abs(B_host) @ np.ones(B_host.shape[1]))

    def rowsum_ok(C):
        got = C.sum(axis=1).ravel()
        got = got.get() if hasattr(got, "get") else np.asarray(got)
        return bool(np.all(np.abs(np.asarray(got).ravel() - ref_rows) <= 1e-10 * np.maximum(scale, 1)))

    # ours, cuSPARSE and the planner's call: each run and checked once here, then timed in turn
    fns = {}
    info = {}
    try:
        C = hs.spgemm(A, B, info=info)
        row.update(nnz_c=int(C.nnz), correct_rowsums=rowsum_ok(C),
                   status="ok", balanced=info.get("balanced"), numeric_tables=info.get("numeric_tables"),
                   global_rows_numeric=info.get("global_rows_numeric"),
                   global_rows_symbolic=info.get("global_rows_symbolic"), host_ms=info.get("host_ms"),
                   one_pass=info.get("one_pass"), esc_rows=info.get("esc_rows"))
        nnz_ours = int(C.nnz)
        del C
        row["peak_mem_bytes"] = peak(cp, lambda: hs.spgemm(A, B))
        fns["ms"] = lambda: hs.spgemm(A, B)
        if info.get("one_pass"):   # ms: repeated calls (guessed where kept); unguessed_ms: none guessed
            fns["unguessed_ms"] = lambda: hs.spgemm(A, B, guess=False)
    except (OverflowError, MemoryError) as e:  # C fits no single GPU CSR: stream it in row panels
        cp.get_default_memory_pool().free_all_blocks()
        row.update(single_output_status=f"{type(e).__name__}: {str(e)[:160]}")
        nnz_ours = None
        try:
            row.update(panelled(cp, hs, A, B, ref_rows, scale))
        except Exception as e2:
            row.update(ms=None, status=f"{type(e2).__name__}: {e2}")
    except Exception as e:  # recorded, not hidden
        row.update(ms=None, status=f"{type(e).__name__}: {e}")
        nnz_ours = None
    cp.get_default_memory_pool().free_all_blocks()

    # vendor
    limit = VENDOR_LIMITS["spgemm.cusparse"]["max_products"]
    if products > limit:
        row.update(vendor_ms=None, vendor_status=f"not run: {products:,} products > known limit {limit:,}")
    else:
        try:
            Cv = A @ B
            status = "ok"
            if nnz_ours is not None and Cv.nnz != nnz_ours:
                status = f"wrong nnz: {Cv.nnz:,} vs {nnz_ours:,}"
            if not rowsum_ok(Cv):
                status = "wrong row sums" + ("" if status == "ok" else "; " + status)
            row.update(vendor_status=status, vendor_nnz_c=int(Cv.nnz))
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
            status = "ok" if rowsum_ok(Cm) else "wrong row sums"
            if nnz_ours is not None and Cm.nnz != nnz_ours:
                status += f"; nnz {Cm.nnz:,} vs hash {nnz_ours:,}"
            row["merge_status"] = status
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
        if ran in fns:       # the user's call: plan.run validates, then runs the kernel
            fns["planner_ms"] = lambda: p.run(A, B)
    except Exception as e:
        row["planner_kernel"], row["planner_ms"] = f"error: {e}", None
    if fns:                  # in turn, so that a drift of the host's speed falls on each alike
        row.update({key: s * 1e3 for key, s in cuda_medians_alternating_s(fns, reps, warm).items()})
        cp.get_default_memory_pool().free_all_blocks()
    if row.get("status") == "ok" and row.get("ms"):
        row["gflops"] = 2 * products / (row["ms"] * 1e6)
    if "planner_ms" not in row and not str(row.get("planner_kernel", "")).startswith("error"):
        row["planner_ms"] = row.get(KERNEL_KEYS.get(row["planner_kernel"], ""))
    if row.get("ms") and row.get("vendor_ms") and row["vendor_status"] == "ok":
        row["speedup_vs_vendor"] = row["vendor_ms"] / row["ms"]
    timings = {k: v for k, v in (("spgemm.hash", row.get("ms") if row.get("status") == "ok" else None),
                                 ("spgemm.cusparse", row.get("vendor_ms") if row.get("vendor_status") == "ok" else None),
                                 ("spgemm.merge", row.get("merge_ms") if row.get("merge_status") == "ok" else None))
               if v is not None}
    if timings:
        row["oracle_kernel"] = min(timings, key=timings.get)
        row["oracle_ms"] = timings[row["oracle_kernel"]]

    # SpTRANS: sptrans.transpose (method "auto", no plan) and a plan's repeated runs (planner.
    # plan_transpose(A).run(A): graph and pattern replays) vs cupyx (cuSPARSE csr2csc);
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
                   sptrans_plan_kernel=p.candidates[0].label(), sptrans_plan_ms=t["plan"] * 1e3,
                   sptrans_plan_speedup=t["vendor"] / t["plan"], sptrans_same_as_vendor=same)
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
    ok = [r for r in rows if r.get("speedup_vs_vendor")]
    sp_ok = [r for r in rows if r.get("sptrans_speedup")]
    summary = dict(
        geomean_speedup_vs_vendor=geomean([r["speedup_vs_vendor"] for r in ok]),
        matrices_compared=len(ok),
        planner_slower_than_vendor=[r["matrix"] for r in rows if r.get("planner_ms") and r.get("vendor_ms")
                                    and r.get("vendor_status") == "ok" and r["planner_ms"] > r["vendor_ms"]],
        sptrans_geomean_speedup=geomean([r["sptrans_speedup"] for r in sp_ok]),
        sptrans_plan_geomean_speedup=geomean([r["sptrans_plan_speedup"] for r in sp_ok]),
        merge_geomean_speedup_vs_vendor=geomean([r["vendor_ms"] / r["merge_ms"] for r in ok if r.get("merge_ms")]),
        unguessed_geomean_speedup_vs_vendor=geomean([r["vendor_ms"] / r.get("unguessed_ms", r["ms"]) for r in ok]),
        merge_geomean_vs_hash=geomean([r["ms"] / r["merge_ms"] for r in rows if r.get("merge_ms") and r.get("ms")]),
    )
    doc = dict(copy_bandwidth=dev.mem_bandwidth, dtype="float64", summary=summary, results=rows,
               wall_s=time.time() - t0)
    path = write_result(args.out, "spgemm-subset" if args.only else "spgemm", dev.name, doc)
    print("summary", json.dumps(summary), "->", path, "and", write_summary(args.out), flush=True)


if __name__ == "__main__":
    main()
