"""Print the rows and summary of the newest tsgemm-*.json in a folder (for device runs):

    python3 benchmarks/_tsgemm_table.py FOLDER
"""
import json, sys, glob
p = sorted(glob.glob(sys.argv[1] + "/tsgemm-*.json"))[-1]
d = json.load(open(p))
print("n k dt lay t1 t2 t3 ms cub frac cubf fracQ cubfQ pred cubpred pick")
for r in d["rows"]:
    print(r["n"], r["k"], r["dtype"][5:], r["layout"], r["t1"], r["t2"], r["t3"], f'{r["ms"]:.3f} {r["vendor_ms"]:.3f} {r["frac_of_copy_bw"]:.2f} {r["vendor_frac_of_copy_bw"]:.2f} {r["frac_of_copy_bw_b2b"]:.2f} {r["vendor_frac_of_copy_bw_b2b"]:.2f} {r["model_predicted_ms"]:.3f} {r["vendor_predicted_ms"]:.3f}', r["planner_kernel"][:6], "" if r["max_rel_err"] < (1e-4 if r["dtype"] == "float32" else 1e-12) else "ERR")
for k, v in d["summary"].items():
    print(k, {a: (round(b, 3) if isinstance(b, float) else b) for a, b in v.items() if a != "frac_copy_bw_by_k"})
