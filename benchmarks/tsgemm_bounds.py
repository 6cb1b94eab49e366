"""How far can TSM2 get against cuBLAS? Bounds from a benchmarks/tsgemm.py JSON.

For every (n, k, dtype, layout) the bound assumes TSM2 moves A, B and C once at exactly the copy
bandwidth measured in that run; against cuBLAS's measured time that is the best speedup any
memory-bound kernel can show there. Printed per dtype and layout: the measured geomean speedup,
the bound's geomean, and the bound with k = 32 held at cuBLAS parity (at k = 32 float32 is
compute-bound on an H100: 32 FMAs per 4-byte element need ~72% of the FP32 peak to keep up).

    python3 benchmarks/tsgemm_bounds.py benchmarks/results/tsgemm-<device>.json
"""
from __future__ import annotations

import collections
import json
import math
import sys

import numpy as np


def geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def bounds(report: dict) -> dict:
    bw = report["copy_bandwidth"]
    groups = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in report["rows"]:
        item = np.dtype(r["dtype"]).itemsize
        ideal_ms = (r["n"] * r["n"] + 2 * r["n"] * r["k"]) * item / bw * 1e3
        for key in ((r["dtype"], r["layout"]), (r["dtype"], r["layout"], r["n"])):
            g = groups[key]
            g["measured"].append(r["vendor_ms"] / r["ms"])
            g["bound"].append(r["vendor_ms"] / ideal_ms)
            g["bound_k32_parity"].append(r["vendor_ms"] / ideal_ms if r["k"] <= 16 else 1.0)
    return {"/".join(map(str, key)): {name: geomean(v) for name, v in g.items()} for key, g in groups.items()}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    with open(argv[0]) as f:
        report = json.load(f)
    print(f"# {argv[0]}: geomean speedup over cuBLAS, measured and bounds (copy bandwidth "
          f"{report['copy_bandwidth'] / 1e9:.0f} GB/s)")
    print(f"{'case':<22} {'measured':>9} {'bound':>7} {'bound, k=32 at parity':>22}")
    for key, v in sorted(bounds(report).items(), key=lambda kv: (kv[0].count("/"), kv[0])):
        print(f"{key:<22} {v['measured']:9.3f} {v['bound']:7.3f} {v['bound_k32_parity']:22.3f}")


if __name__ == "__main__":
    main()
