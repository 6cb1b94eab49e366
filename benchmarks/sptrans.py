"""SpTRANS on the GPU: sptrans.transpose (segsort, the default) vs CuPy's A.T.tocsr() (cuSPARSE
csr2csc), the segmented merge (sptrans.transpose(method="merge")), the radix and segsort methods
alone (the default, "auto", picks one of them on the GPU) and the sort-based transpose
(spgemm.transpose_sort), same run. ``speedup`` is CuPy's time / the default method's;
``radix_graph_ms`` / ``segsort_graph_ms`` are that method's plan runs (``SpTrans.runner``: launches
replayed as a CUDA graph). ``ms`` is the full transpose (nothing replayed). ``plan_replay_ms`` is a
plan's repeated ``plan_transpose(A).run(A)`` (the planner's method, from A's longest column, its
launches replayed as a CUDA graph after the plan's first run on A, and A's pattern where it is
unchanged): a replay, not a full transpose, reported beside it; ``plan_replay_speedup`` CuPy's time / that, ``graph_speedup`` the same method's time through
``transpose`` / that, ``planning_s`` the plan's own cost (paid once per plan), ``planner_first_ms``
/ ``planner_record_ms`` a plan's first run on A (through transpose) and second (its launches
recorded and their graph built, once per plan, A and stream; host wall times, GPU synchronised)
and ``planner_graph_bytes`` what the graph holds (scratch and the next outputs).

Matrices: the corpus families at >= 1M nonzeros (the 'spgemm' size set, R-MAT scales 17-18) and
the real matrices (``matplan.corpus.real_matrices``: $MATPLAN_MATRICES, ../shared/matrices, or
.data/matrices), float64 and float32. Times are CUDA-event wall times of whole calls (allocation
and launches included), median of ``--reps`` runs after warm-up. ``frac_of_copy_bw``: the bytes a
transpose must move (A's indptr, indices and values read; A.T's written) / time / the
device-to-device copy bandwidth measured in this run. Every result is checked against
SciPy's A.T (same indptr, indices and values).

    PYTHONPATH=. python3 benchmarks/sptrans.py [--reps 30] [--out benchmarks/results]

Output: ``results/sptrans-<device>.json``, then ``results/SUMMARY.md`` regenerated.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_device_name, geomean, timed, write_result  # noqa: E402
from summarize import write_summary  # noqa: E402


#: The wide matrices' shape and nonzeros: a reviewer's doc-term matrix measured at 0.49x CuPy
#: (47k documents by 755k terms, 1.8M nonzeros).
WIDE_SHAPE, WIDE_NNZ = (47_000, 755_000), 1_800_000


def doc_term(m: int, n: int, nnz: int, s: float = 1.0, seed=0) -> sp.csr_matrix:
    """A doc-term-like m x n matrix of about ``nnz`` distinct entries: each entry's row uniform,
    its column drawn from a Zipf law of exponent ``s`` over n terms (ids shuffled), so a few
    columns (common terms) hold tens of thousands of entries and most hold one or two."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, n + 1) ** s)
    cdf /= cdf[-1]
    term = rng.permutation(n)
    draws = int(nnz * 1.6)   # repeats of common terms in a row are merged below
    rows = rng.integers(0, m, draws, dtype=np.int64)
    cols = term[np.minimum(np.searchsorted(cdf, rng.random(draws)), n - 1)]
    keys = np.unique(rows * n + cols)
    if keys.size > nnz:
        keys = np.sort(rng.choice(keys, nnz, replace=False))
    vals = (rng.random(keys.size) + 0.5) * rng.choice([-1.0, 1.0], keys.size)
    return sp.csr_matrix((vals, (keys // n, keys % n)), shape=(m, n))


def matrices():
    from matplan import corpus
    for family in ("poisson3d", "rmat", "uniform", "skewed", "block_dense", "banded"):
        yield f"{family}-spgemm", lambda family=family: corpus.load(family, "spgemm")
    for scale in (17, 18):
        yield f"rmat-scale{scale}", lambda scale=scale: corpus.rmat(scale=scale, edge_factor=16, seed=0)
    # wide: many more columns than rows (n >> nnz / m), uniform and doc-term (Zipf) columns
    m, n = WIDE_SHAPE
    yield "wide-uniform", lambda: corpus.uniform(m, n, WIDE_NNZ // m, seed=0)
    yield "wide-doc-term", lambda: doc_term(m, n, WIDE_NNZ, seed=0)
    folder = None
    if corpus.matrices_dir() is None and os.path.isdir(".data/matrices"):
        folder = ".data/matrices"
    for name, A in corpus.real_matrices(folder):
        yield name, lambda A=A: A
        if A.shape[1] > A.shape[0]:
            continue
        if name.endswith("doc_term"):   # its transpose is wide: terms by documents
            yield f"{name}-T", lambda A=A: sp.csr_matrix(A.T)


def bench(cp, csp, name, A_host, dtype, reps, copy_bw):
    from matplan.kernels import sptrans
    from matplan.kernels.spgemm import transpose_sort
    A_host = sp.csr_matrix(A_host, dtype=dtype)
    m, n = A_host.shape
    A = csp.csr_matrix((cp.asarray(A_host.data), cp.asarray(A_host.indices.astype(np.int32)),
                        cp.asarray(A_host.indptr.astype(np.int32))), shape=A_host.shape)
    ref = A_host.T.tocsr()
    ref.sort_indices()
    item = np.dtype(dtype).itemsize
    nbytes = 4 * (m + 1) + (4 + item) * A_host.nnz + 4 * (n + 1) + (4 + item) * A_host.nnz
    row = dict(matrix=name, dtype=np.dtype(dtype).name, m=m, n=n, nnz=int(A_host.nnz),
               max_col_nnz=int(np.bincount(A_host.indices, minlength=n).max()) if A_host.nnz else 0,
               bytes_moved=nbytes)

    def same(T):
        T = T.get()
        return bool(np.array_equal(T.indptr, ref.indptr) and np.array_equal(T.indices, ref.indices)
                    and np.array_equal(T.data, ref.data))

    # the planner's choice (plan_transpose: from A's longest column and its columns' count) and
    # the user's call plan.run(A); planning (statistics on the GPU, a few host transfers) is paid
    # once per plan and reported apart
    import dataclasses
    from matplan.planner import plan_transpose
    t = time.perf_counter()
    plan = plan_transpose(A)
    row["planning_s"] = time.perf_counter() - t
    row["planner_kernel"] = plan.candidates[0].label()
    # a plan's second run on an A records its launches and builds their CUDA graph (SpTrans.runner),
    # once per plan, A and stream (the first takes transpose()): both timed on a copy of the plan
    # (no runner yet) after a warm-up call has loaded the kernels
    sptrans.transpose(A).indptr.get()
    first = dataclasses.replace(plan)
    for key in ("planner_first_ms", "planner_record_ms"):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        T = first.run(A)
        cp.cuda.Device().synchronize()
        row[key] = (time.perf_counter() - t) * 1e3
    graphs = getattr(first.__dict__["_fast"][-1], "graphs", {})
    row["planner_graph_bytes"] = sum(rep.nbytes for rep in graphs.values())
    del T, first, graphs
    replayed = {m: sptrans.SpTrans().runner({"method": m}) for m in ("radix", "segsort")}
    for key, fn in (("ms", lambda: sptrans.transpose(A)), ("vendor_ms", lambda: A.T.tocsr()),
                    ("plan_replay_ms", lambda: plan.run(A)),
                    ("radix_graph_ms", lambda: replayed["radix"](A, None)),
                    ("segsort_graph_ms", lambda: replayed["segsort"](A, None)),
                    ("merge_ms", lambda: sptrans.transpose(A, method="merge")),
                    ("radix_ms", lambda: sptrans.transpose(A, method="radix")),
                    ("segsort_ms", lambda: sptrans.transpose(A, method="segsort")),
                    ("sort_ms", lambda: transpose_sort(A))):
        try:
            row[key] = timed(cp, fn, reps, warmup=3)[0]
            row[key[:-2] + "correct"] = same(fn())
        except Exception as e:  # recorded, not hidden
            row[key] = None
            row[key[:-2] + "status"] = f"{type(e).__name__}: {str(e)[:200]}"
        cp.get_default_memory_pool().free_all_blocks()
    if row["ms"]:
        row["frac_of_copy_bw"] = nbytes / (row["ms"] * 1e-3) / copy_bw
        if row["vendor_ms"]:
            row["speedup"] = row["vendor_ms"] / row["ms"]
            row["vendor_frac_of_copy_bw"] = nbytes / (row["vendor_ms"] * 1e-3) / copy_bw
        if row["sort_ms"]:
            row["speedup_vs_sort"] = row["sort_ms"] / row["ms"]
        for meth in ("radix", "segsort", "plan_replay"):
            if row[f"{meth}_ms"] and row["vendor_ms"]:
                row[f"{meth}_speedup"] = row["vendor_ms"] / row[f"{meth}_ms"]
        method = plan.params.get("method")
        if row["plan_replay_ms"] and row.get(f"{method}_ms"):   # the same method's launches, replayed or not
            row["graph_speedup"] = row[f"{method}_ms"] / row["plan_replay_ms"]
        if row["merge_ms"]:
            row["speedup_vs_merge"] = row["merge_ms"] / row["ms"]
            if row["vendor_ms"]:
                row["merge_speedup"] = row["vendor_ms"] / row["merge_ms"]
    # host time of a call (the launch path; the GPU may still be working), median of 10, GPU idle first
    for key, fn in (("host_us", lambda: sptrans.transpose(A)), ("planner_host_us", lambda: plan.run(A))):
        ts = []
        for _ in range(11):
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            T = fn()
            ts.append((time.perf_counter() - t) * 1e6)
            del T
        cp.cuda.Device().synchronize()
        row[key] = float(np.median(ts[1:]))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args(argv)
    if args.reps < 20:
        sys.exit("--reps: at least 20 timed runs")
    from matplan.core.xp import cupy_module
    cp = cupy_module()
    if cp is None:
        sys.exit("benchmarks/sptrans.py needs CuPy and an NVIDIA GPU")
    import cupyx.scipy.sparse as csp
    from matplan.core import device as device_mod
    copy_bw = device_mod.measure_copy_bandwidth()
    gpu = cuda_device_name(cp)
    print(f"# {gpu}: device-to-device copy {copy_bw / 1e9:.0f} GB/s (read + write), CuPy {cp.__version__}",
          flush=True)
    print(f"{'matrix':<24} {'dtype':<7} {'nnz':>9} {'maxcol':>7} {'ms':>7} {'cuSP ms':>7} {'x cuSP':>6} "
          f"{'mrg ms':>7} {'rdx ms':>7} {'x rdx':>6} {'seg ms':>7} {'x seg':>6} {'sort ms':>7} {'bw':>5} {'host us':>7} "
          f"{'plan ms':>7} {'x plan':>6} {'x grph':>6} {'rec ms':>6} {'planner':<32} ok", flush=True)
    t0 = time.time()
    rows = []
    for name, load in matrices():
        A = load()
        for dtype in (np.float64, np.float32):
            r = bench(cp, csp, name, A, dtype, args.reps, copy_bw)
            rows.append(r)
            f = lambda v: float("nan") if v is None else v  # noqa: E731
            print(f"{name:<24} {r['dtype']:<7} {r['nnz']:>9,} {r['max_col_nnz']:>7,} {f(r['ms']):7.3f} "
                  f"{f(r['vendor_ms']):7.3f} {f(r.get('speedup')):6.2f} {f(r['merge_ms']):7.3f} {f(r['radix_ms']):7.3f} "
                  f"{f(r.get('radix_speedup')):6.2f} {f(r['segsort_ms']):7.3f} {f(r.get('segsort_speedup')):6.2f} "
                  f"{f(r['sort_ms']):7.3f} "
                  f"{f(r.get('frac_of_copy_bw')):5.2f} {r['host_us']:7.1f} {f(r.get('plan_replay_ms')):7.3f} "
                  f"{f(r.get('plan_replay_speedup')):6.2f} {f(r.get('graph_speedup')):6.2f} {r['planner_record_ms']:6.2f} "
                  f"{r['planner_kernel']:<32} {r.get('correct')}"
                  + ("" if r.get("correct") else f"  {r.get('status', 'WRONG')}")
                  + ("" if r.get("merge_correct") else f"  merge: {r.get('merge_status', 'WRONG')}")
                  + ("" if r.get("radix_correct") else f"  radix: {r.get('radix_status', 'WRONG')}"), flush=True)
        del A
    summary = {}
    for dt in ("float64", "float32"):
        rs = [r for r in rows if r["dtype"] == dt and r.get("speedup") and r.get("correct")]
        summary[dt] = dict(geomean_speedup_vs_vendor=geomean([r["speedup"] for r in rs]),
                           min_speedup=min((r["speedup"] for r in rs), default=None),
                           geomean_speedup_vs_sort=geomean([r["speedup_vs_sort"] for r in rs
                                                            if r.get("speedup_vs_sort")]),
                           geomean_speedup_vs_merge=geomean([r["speedup_vs_merge"] for r in rs
                                                             if r.get("speedup_vs_merge")]),
                           merge_geomean_speedup_vs_vendor=geomean([r["merge_speedup"] for r in rs
                                                                    if r.get("merge_speedup")]),
                           radix_geomean_speedup_vs_vendor=geomean([r["radix_speedup"] for r in rs
                                                                    if r.get("radix_speedup") and r.get("radix_correct")]),
                           segsort_geomean_speedup_vs_vendor=geomean([r["segsort_speedup"] for r in rs
                                                                      if r.get("segsort_speedup") and r.get("segsort_correct")]),
                           geomean_frac_of_copy_bw=geomean([r["frac_of_copy_bw"] for r in rs]),
                           plan_replay_geomean_speedup_vs_vendor=geomean([r["plan_replay_speedup"] for r in rs
                                                                          if r.get("plan_replay_speedup")
                                                                          and r.get("plan_replay_correct")]),
                           plan_replay_slower_than_vendor=[r["matrix"] for r in rs
                                                           if r.get("plan_replay_speedup", 0) < 1],
                           plan_replay_min_speedup=min((r["plan_replay_speedup"] for r in rs
                                                        if r.get("plan_replay_speedup")), default=None),
                           graph_geomean_speedup=geomean([r["graph_speedup"] for r in rs if r.get("graph_speedup")]),
                           planner_record_ms_max=max((r["planner_record_ms"] for r in rs), default=None),
                           planning_s_max=max((r["planning_s"] for r in rs), default=None),
                           matrices=len(rs))
    summary["all_correct"] = all(r.get("correct") and r.get("merge_correct") and r.get("radix_correct")
                                 and r.get("segsort_correct") and r.get("plan_replay_correct")
                                 and r.get("radix_graph_correct") and r.get("segsort_graph_correct") for r in rows)
    print("summary", json.dumps(summary, indent=1), flush=True)
    doc = dict(copy_bandwidth_gbs=copy_bw / 1e9, reps=args.reps, summary=summary, results=rows,
               wall_s=time.time() - t0)
    path = write_result(args.out, "sptrans", gpu, doc)
    print("wrote", path, "and", write_summary(args.out), flush=True)


if __name__ == "__main__":
    main()
