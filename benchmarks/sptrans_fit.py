"""Fit SpTRANS's whole-call cost models (sptrans.METHOD_COSTS, sptrans.LONG_COLUMN_BYTES,
vendor.CUSPARSE_TRANSPOSE_COSTS) to a ``benchmarks/sptrans.py`` JSON: a fixed time plus bytes an
entry of A at the copy bandwidth measured in that run, by method and dtype, relative least squares
(each call weighs by its own time). The segsort and radix methods are fitted on their plan runs
(``*_graph_ms``: the launches replayed as a CUDA graph, what ``plan.run`` pays), the segsort on
the matrices whose longest column holds at most SHORT_COLUMNS entries; its long-column term is the
median, over the others, of what the fit leaves per entry and doubling of the longest column past
sptrans.BINS[0]. The merge method is fitted on ``transpose(A, method="merge")`` (not replayed) and
cuSPARSE on CuPy's ``A.T.tocsr()``.

    python3 benchmarks/sptrans_fit.py benchmarks/results/sptrans-....json
"""
from __future__ import annotations

import json
import math
import sys

import numpy as np

SHORT_COLUMNS = 64
#: model -> the JSON field of its time
FIELDS = {"segsort": "segsort_graph_ms", "radix": "radix_graph_ms", "merge": "merge_ms", "cusparse": "vendor_ms"}


def fit(rows, field, bw):
    """(fixed seconds, bytes an entry, measured / model of each row) of t = fixed + nnz * b / bw."""
    t = np.array([r[field] * 1e-3 for r in rows])
    X = np.array([[1.0, r["nnz"] / bw] for r in rows]) / t[:, None]
    (fixed, per_entry), *_ = np.linalg.lstsq(X, np.ones(len(rows)), rcond=None)
    return fixed, per_entry, t / (fixed + np.array([r["nnz"] for r in rows]) * per_entry / bw)


def main(path):
    from matplan.kernels.sptrans import BINS
    doc = json.load(open(path))
    bw = doc["copy_bandwidth_gbs"] * 1e9
    print(f"# {path}: {doc['gpu']}, commit {doc['commit']}, copy bandwidth {bw / 1e9:.0f} GB/s")
    for dtype in ("float64", "float32"):
        rows = [r for r in doc["results"] if r["dtype"] == dtype]
        for model, field in FIELDS.items():
            use = [r for r in rows if r.get(field)]
            if model == "segsort":
                long_ = [r for r in use if r["max_col_nnz"] > SHORT_COLUMNS]
                use = [r for r in use if r["max_col_nnz"] <= SHORT_COLUMNS]
            if len(use) < 2:
                print(f"{dtype} {model:<9} not fitted: {len(use)} timing(s) of {field}")
                continue
            fixed, per_entry, ratio = fit(use, field, bw)
            print(f"{dtype} {model:<9} ({fixed:.3e}, {per_entry:.1f})  measured/model {ratio.min():.2f}-"
                  f"{ratio.max():.2f} over {len(use)}")
            if model == "segsort" and long_:
                extra = [(r[field] * 1e-3 - fixed - r["nnz"] * per_entry / bw) * bw
                         / (r["nnz"] * math.log2(r["max_col_nnz"] / BINS[0])) for r in long_]
                print(f"{dtype} segsort long-column bytes an entry a doubling: median {np.median(extra):.1f} "
                      f"({min(extra):.1f}-{max(extra):.1f} over {len(long_)})")


if __name__ == "__main__":
    main(sys.argv[1])
