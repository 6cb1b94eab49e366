"""How far two tunes of the same problems agree: the timing method's noise, apart from any model.

    python benchmarks/tune_agreement.py FIRST.jsonl SECOND.jsonl [--field run_ms_queued]

Reads two `matplan db export` files (timings that are `ok` and matched the reference) and prints,
for the timings in both: the ratio second / first by the first's time (median of |log ratio|,
90th percentile, mean shift), the same with each problem's common shift taken out (what the
ranking of its candidates sees), and each tune's best candidate (prepare / reuse + run) scored on
the other at reuse 1 and 100: the regret a perfect model of one tune has on the other, the floor
below which `matplan report` cannot show a model's error. docs/tuning.md, "The timing method".
"""
from __future__ import annotations

import argparse
import collections
import json
import math

BINS = [(0, .02), (.02, .05), (.05, .2), (.2, 1), (1, math.inf)]   # milliseconds


def load(path) -> dict:
    """{(problem, kernel, params): timing record} of the ok, matched timings of an export."""
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "timing" and r["status"] == "ok" and r.get("matched"):
                out[(r["problem"], r["kernel"], r["params"])] = r
    return out


def _bin(ms: float) -> tuple:
    return next(b for b in BINS if b[0] <= ms < b[1])


def _label(b: tuple) -> str:
    return f"{b[0] * 1e3:.0f}-{b[1] * 1e3:.0f} us" if b[1] < math.inf else f">{b[0] * 1e3:.0f} us"


def _median(v: list) -> float:
    return sorted(v)[len(v) // 2]


def agreement(first: dict, second: dict, field: str = "run_ms_median") -> dict:
    """The statistics the module docstring names, as a dict (``print_report`` prints it)."""
    both = [k for k in first.keys() & second.keys() if first[k].get(field) and second[k].get(field)]
    logs = {k: math.log(second[k][field] / first[k][field]) for k in both}
    by_problem = collections.defaultdict(list)
    for k in both:
        by_problem[k[0]].append(k)
    raw, centred = collections.defaultdict(list), collections.defaultdict(list)
    for ks in by_problem.values():
        mu = sum(logs[k] for k in ks) / len(ks)
        for k in ks:
            b = _bin(first[k][field])
            raw[b].append(logs[k])
            if len(ks) > 1:
                centred[b].append(abs(logs[k] - mu))
    bins = {_label(b): dict(n=len(v), median=math.exp(_median([abs(x) for x in v])),
                            p90=math.exp(sorted(abs(x) for x in v)[int(.9 * len(v))]),
                            shift=math.exp(sum(v) / len(v)),
                            centred=math.exp(_median(centred[b])) if centred[b] else None)
            for b, v in sorted(raw.items())}
    picks = {}
    for reuse in (1, 100):
        def cost(t, k):
            return (t[k].get("prepare_ms") or 0.0) / reuse + t[k][field]
        scored = [(min(ks, key=lambda k: cost(first, k)), min(ks, key=lambda k: cost(second, k)), ks)
                  for ks in by_problem.values() if len(ks) > 1]
        on_second = [cost(second, a) / cost(second, b) for a, b, _ in scored]
        on_first = [cost(first, b) / cost(first, a) for a, b, _ in scored]
        picks[reuse] = dict(problems=len(scored), same_best=sum(a == b for a, b, _ in scored),
                            first_on_second=math.exp(sum(map(math.log, on_second)) / len(scored)),
                            second_on_first=math.exp(sum(map(math.log, on_first)) / len(scored)),
                            worst=max(on_second + on_first))
    return dict(field=field, timings=len(both), bins=bins, picks=picks)


def print_report(a: dict) -> None:
    print(f"{a['timings']} timings in both tunes ({a['field']}); second / first by the first's time:")
    for label, b in a["bins"].items():
        centred = f"{b['centred']:.3f}" if b["centred"] is not None else "-"
        print(f"  {label:>14}: n={b['n']:4d}  median {b['median']:.3f}  p90 {b['p90']:.3f}  "
              f"shift {b['shift']:.3f}  problem-centred median {centred}")
    for reuse, p in a["picks"].items():
        print(f"  reuse {reuse}: {p['problems']} problems, same best {p['same_best']}; a perfect model of one tune "
              f"scored on the other: {p['first_on_second']:.4f} / {p['second_on_first']:.4f} (worst {p['worst']:.2f})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--field", default="run_ms_median", choices=("run_ms_median", "run_ms_queued"))
    args = ap.parse_args(argv)
    print_report(agreement(load(args.first), load(args.second), args.field))


if __name__ == "__main__":
    main()
