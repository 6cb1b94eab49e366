"""Print the rows and summary of a tsgemm.py result, compactly (for device runs):

    python3 benchmarks/_tsgemm_table.py benchmarks/results/tsgemm-<device>.json
"""
import json
import sys

doc = json.load(open(sys.argv[1]))
print("n k dt lay t1 t2 t3 ms cub frac cubf fracQ cubfQ pred cubpred pick")
for r in doc["rows"]:
    figures = " ".join(f"{r[key]:.3f}" if key.endswith("ms") else f"{r[key]:.2f}" for key in (
        "ms", "vendor_ms", "frac_of_copy_bw", "vendor_frac_of_copy_bw", "frac_of_copy_bw_b2b",
        "vendor_frac_of_copy_bw_b2b", "model_predicted_ms", "vendor_predicted_ms"))
    ok = r["max_rel_err"] < (1e-4 if r["dtype"] == "float32" else 1e-12)
    print(r["n"], r["k"], r["dtype"][5:], r["layout"], r["t1"], r["t2"], r["t3"], figures, r["planner_kernel"][:6],
          "" if ok else "ERR")
for key, value in doc["summary"].items():
    print(key, {a: (round(b, 3) if isinstance(b, float) else b) for a, b in value.items() if a != "frac_copy_bw_by_k"})
