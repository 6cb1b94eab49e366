"""Fit SpTRANS's whole-call cost models (matplan/models/sptrans.py METHOD_COSTS, LONG_COLUMN_BYTES,
CUSPARSE_TRANSPOSE_COSTS) to a ``benchmarks/sptrans.py`` JSON: a fixed time plus bytes an
entry of A (the radix method: an entry a pass) at the copy bandwidth measured in that run, by
method and dtype, relative least squares
(each call weighs by its own time). The segsort and radix methods are fitted on their plan runs
(``*_graph_ms``: the launches replayed as a CUDA graph, what ``plan.run`` pays), the segsort on
the matrices whose longest column holds at most SHORT_COLUMNS entries; its long-column term is the
median, over the others, of what the fit leaves per entry and doubling of the longest column past
sptrans.BINS[0]. The merge method is fitted on ``transpose(A, method="merge")`` (not replayed) and
cuSPARSE on CuPy's ``A.T.tocsr()``.

    python3 benchmarks/sptrans_fit.py benchmarks/results/sptrans-<device>.json [more runs of one machine ...]

Several JSONs are fitted together, each row at its own run's copy bandwidth.
"""
from __future__ import annotations

import json
import math
import sys

import numpy as np

SHORT_COLUMNS = 64
#: model -> the JSON field of its time
FIELDS = {"segsort": "segsort_graph_ms", "radix": "radix_graph_ms", "merge": "merge_ms", "cusparse": "vendor_ms"}


def fit(rows, field, times=lambda r: 1):
    """(fixed seconds, bytes an entry, measured / model of each row) of
    t = fixed + nnz * times(r) * b / bw (bw: the row's run's copy bandwidth, ``_bw``; times: the
    radix method's passes, else 1)."""
    t = np.array([r[field] * 1e-3 for r in rows])
    x = np.array([r["nnz"] * times(r) / r["_bw"] for r in rows])
    (fixed, per_entry), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1) / t[:, None],
                                             np.ones(len(rows)), rcond=None)
    return fixed, per_entry, t / (fixed + x * per_entry)


def main(paths):
    from matplan.models.sptrans import BINS, radix_passes
    results = []
    for path in paths:
        doc = json.load(open(path))
        bw = doc["copy_bandwidth_gbs"] * 1e9
        device = doc.get("device", doc.get("gpu"))
        print(f"# {path}: {device}, commit {doc['commit']}, copy bandwidth {bw / 1e9:.0f} GB/s")
        results += [dict(r, _bw=bw) for r in doc["results"]]
    for dtype in ("float64", "float32"):
        rows = [r for r in results if r["dtype"] == dtype]
        for model, field in FIELDS.items():
            use = [r for r in rows if r.get(field)]
            if model == "segsort":
                long_ = [r for r in use if r["max_col_nnz"] > SHORT_COLUMNS]
                use = [r for r in use if r["max_col_nnz"] <= SHORT_COLUMNS]
            if len(use) < 2:
                print(f"{dtype} {model:<9} not fitted: {len(use)} timing(s) of {field}")
                continue
            passes = (lambda r: radix_passes(r["n"])[0]) if model == "radix" else (lambda r: 1)
            fixed, per_entry, ratio = fit(use, field, passes)
            print(f"{dtype} {model:<9} ({fixed:.3e}, {per_entry:.1f}{' a pass' if model == 'radix' else ''})  "
                  f"measured/model {ratio.min():.2f}-{ratio.max():.2f} over {len(use)}")
            if model == "segsort" and long_:
                extra = [(r[field] * 1e-3 - fixed - r["nnz"] * per_entry / r["_bw"]) * r["_bw"]
                         / (r["nnz"] * math.log2(r["max_col_nnz"] / BINS[0])) for r in long_]
                print(f"{dtype} segsort long-column bytes an entry a doubling: median {np.median(extra):.1f} "
                      f"({min(extra):.1f}-{max(extra):.1f} over {len(long_)})")


if __name__ == "__main__":
    main(sys.argv[1:])
