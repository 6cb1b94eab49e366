"""Compare two runs of one benchmark (before / after a change, same machine): every timing a row
carries (``ms`` and ``*_ms``), after / before, matched by the row's identity.

    python3 benchmarks/compare.py before.json after.json [--worse 1.05]

Prints one line per timing field (geomean and worst ratio over the matched rows), then each row
and field worse than ``--worse``; exits 1 when one is. Rows whose ``correct`` flag is false in
either run are left out.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

#: Fields that name a row, by benchmark; the first present are used.
IDENTITY = ("matrix", "product", "n", "k", "dtype", "layout")


def rows_of(doc) -> list:
    return doc.get("results") or doc.get("rows") or []


def key_of(row) -> tuple:
    return tuple((f, row[f]) for f in IDENTITY if f in row)


def timings(row) -> dict:
    return {f: v for f, v in row.items()
            if (f == "ms" or f.endswith("_ms")) and isinstance(v, (int, float)) and not isinstance(v, bool)
            and v > 0 and "planning" not in f and "first" not in f and "record" not in f}


def correct(row) -> bool:
    return all(row.get(f, True) is not False for f in ("correct", "planner_correct", "correct_rowsums", "vendor_correct", "plan_replay_correct"))


def compare(before: dict, after: dict, worse: float):
    old = {key_of(r): r for r in rows_of(before) if correct(r)}
    pairs = [(k, old[key_of(r)], r) for r in rows_of(after) if correct(r) for k in [key_of(r)] if k in old]
    fields: dict = {}
    flagged = []
    for key, b, a in pairs:
        tb, ta = timings(b), timings(a)
        for f in sorted(set(tb) & set(ta)):
            ratio = ta[f] / tb[f]
            fields.setdefault(f, []).append(ratio)
            if ratio > worse:
                flagged.append((key, f, tb[f], ta[f], ratio))
    return pairs, fields, flagged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--worse", type=float, default=1.05, help="flag after / before above this")
    args = ap.parse_args(argv)
    with open(args.before) as fb, open(args.after) as fa:
        pairs, fields, flagged = compare(json.load(fb), json.load(fa), args.worse)
    print(f"{len(pairs)} rows matched")
    print(f"{'field':32s} {'rows':>5s} {'geomean after/before':>21s} {'best':>7s} {'worst':>7s}")
    for f, r in sorted(fields.items()):
        g = math.exp(sum(math.log(x) for x in r) / len(r))
        print(f"{f:32s} {len(r):5d} {g:21.3f} {min(r):7.3f} {max(r):7.3f}")
    for key, f, tb, ta, ratio in flagged:
        name = " ".join(f"{k}={v}" for k, v in key)
        print(f"worse: {name} {f}: {tb:.4f} -> {ta:.4f} ms ({ratio:.3f})")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
