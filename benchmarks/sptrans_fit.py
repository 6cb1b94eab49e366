"""Fit SpTRANS's cost models (matplan/models/sptrans.py FIRST_CALL_COSTS, REPLAY_COSTS,
LONG_COLUMN_BYTES, CUSPARSE_TRANSPOSE_COSTS) to ``benchmarks/sptrans.py`` JSONs: a fixed time plus
bytes an entry of A (the radix method: an entry a pass) plus bytes a column of A, at the copy
bandwidth measured in that run, by model and dtype, relative least squares (each call weighs by
its own time; a column term that comes out negative is dropped and the rest refitted).

* First calls (``FIRST_CALL_COSTS``): ``transpose(A, method=...)``, nothing replayed (``*_ms``);
  the segsort on the matrices whose longest column holds at most SHORT_COLUMNS entries, its
  long-column term the median, over the others, of what the fit leaves per entry and doubling of
  the longest column past sptrans.BINS[0].
* Replays (``REPLAY_COSTS``): a plan's later runs on the same A (``segsort_graph_ms`` and
  ``radix_graph_ms``: the graph's pattern replay, the same for both methods), pooled.
* cuSPARSE: CuPy's ``A.T.tocsr()`` (``vendor_ms``).

    python3 benchmarks/sptrans_fit.py benchmarks/results/sptrans-<device>.json [more runs of one machine ...]

Several JSONs are fitted together, each row at its own run's copy bandwidth.
"""
from __future__ import annotations

import json
import math
import sys

import numpy as np

SHORT_COLUMNS = 64
#: model -> the JSON fields of its times
FIELDS = {"segsort": ("segsort_ms",), "radix": ("radix_ms",), "merge": ("merge_ms",),
          "replay": ("segsort_graph_ms", "radix_graph_ms"), "cusparse": ("vendor_ms",)}


def fit(rows, field, times=lambda r: 1):
    """(fixed seconds, bytes an entry, bytes a column, measured / model of each row) of
    t = fixed + (nnz * times(r) * b + n * c) / bw (bw: the row's run's copy bandwidth, ``_bw``;
    times: the radix method's passes, else 1)."""
    t = np.array([r[field] * 1e-3 for r in rows])
    x = np.array([r["nnz"] * times(r) / r["_bw"] for r in rows])
    y = np.array([r["n"] / r["_bw"] for r in rows])
    for cols in ((np.ones_like(x), x, y), (np.ones_like(x), x)):
        coef, *_ = np.linalg.lstsq(np.stack(cols, 1) / t[:, None], np.ones(len(rows)), rcond=None)
        if len(coef) == 2 or coef[2] >= 0:
            break
    fixed, per_entry, per_col = (*coef, 0.0)[:3]
    return fixed, per_entry, per_col, t / (fixed + x * per_entry + y * per_col)


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
        for model, fields in FIELDS.items():
            use = [dict(r, _t=r[f]) for r in rows for f in fields if r.get(f) and r.get(f[:-2] + "correct", True)]
            if model == "segsort":
                long_ = [r for r in use if r["max_col_nnz"] > SHORT_COLUMNS]
                use = [r for r in use if r["max_col_nnz"] <= SHORT_COLUMNS]
            if len(use) < 3:
                print(f"{dtype} {model:<9} not fitted: {len(use)} timing(s) of {fields}")
                continue
            passes = (lambda r: radix_passes(r["n"])[0]) if model == "radix" else (lambda r: 1)
            fixed, per_entry, per_col, ratio = fit(use, "_t", passes)
            print(f"{dtype} {model:<9} ({fixed:.3e}, {per_entry:.1f}, {per_col:.1f})"
                  f"{'  bytes an entry a pass' if model == 'radix' else ''}  measured/model {ratio.min():.2f}-"
                  f"{ratio.max():.2f} over {len(use)}")
            if model == "segsort" and long_:
                extra = [(r["_t"] * 1e-3 - fixed - (r["nnz"] * per_entry + r["n"] * per_col) / r["_bw"]) * r["_bw"]
                         / (r["nnz"] * math.log2(r["max_col_nnz"] / BINS[0])) for r in long_]
                print(f"{dtype} segsort long-column bytes an entry a doubling: median {np.median(extra):.1f} "
                      f"({min(extra):.1f}-{max(extra):.1f} over {len(long_)})")


if __name__ == "__main__":
    main(sys.argv[1:])
