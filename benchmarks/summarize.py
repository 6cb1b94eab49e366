"""Generate ``results/SUMMARY.md`` and its plots from the current result files.

    python3 benchmarks/summarize.py [RESULTS_DIR]

Every benchmark script calls ``write_summary`` at its end. Per op and matrix the summary gives
ours, the vendor, their ratio, the fraction of copy bandwidth and planner vs oracle, read from each
benchmark's own JSON fields ("n/a" where a file lacks one), with the device and commit of every
file. A ratio or geomean counts only results checked correct. The plots (one PNG a device) need
matplotlib (the ``plots`` extra); without it they are skipped with a note. Standard library only
otherwise, so it runs anywhere.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
#: Where the shipped learned models' metadata lives (their training-set hashes).
MODEL_DATA = Path(__file__).resolve().parent.parent / "matplan" / "models" / "data"
#: Relative error below which a TSGEMM result counts as correct (as tsgemm.py checks it).
TSGEMM_TOL = {"float32": 1e-4, "float64": 1e-12}
#: Which of spgemm.py's timings is each kernel's.
SPGEMM_KERNEL_KEYS = {"spgemm.hash": "ms", "spgemm.cusparse": "vendor_ms", "spgemm.merge": "merge_ms"}
#: Section order of the per-op tables.
OP_ORDER = ("spmv", "spmm", "spgemm", "sptrans", "tsgemm")


@dataclasses.dataclass
class Row:
    """One matrix and dtype of one benchmark, in the summary's terms."""
    matrix: str
    dtype: str
    ours_kernel: str | None = None
    ours_ms: float | None = None
    vendor_ms: float | None = None         # the vendor at its best as measured in the file
    cupy_ms: float | None = None           # a CuPy user's call, where measured apart from it
    frac_bw: float | None = None           # ours, single call, of the measured copy bandwidth
    frac_bw_b2b: float | None = None       # ours, calls queued back to back
    planner_kernel: str | None = None
    planner_ms: float | None = None
    planner_vs_oracle: float | None = None
    ours_ok: bool | None = None            # checked correct; None: not checked
    vendor_ok: bool | None = None
    planner_ok: bool | None = None
    extra: dict = dataclasses.field(default_factory=dict)   # op-specific columns: label -> (value, kind)

    @property
    def speedup(self):
        """vendor / ours, only where both were checked correct."""
        return _ratio(self.vendor_ms, self.ours_ms) if self.ours_ok and self.vendor_ok else None

    @property
    def planner_speedup(self):
        return _ratio(self.vendor_ms, self.planner_ms) if self.planner_ok and self.vendor_ok else None

    @property
    def planner_vs_cupy(self):
        return _ratio(self.cupy_ms, self.planner_ms) if self.planner_ok else None

    @property
    def checked(self) -> str:
        flags = {"ours": (self.ours_ok, self.ours_ms), "vendor": (self.vendor_ok, self.vendor_ms),
                 "planner": (self.planner_ok, self.planner_ms)}
        wrong = [who for who, (ok, _) in flags.items() if ok is False]
        unchecked = [who for who, (ok, ms) in flags.items() if ok is None and ms is not None]
        return ("WRONG: " + ", ".join(wrong) if wrong else
                "unchecked: " + ", ".join(unchecked) if unchecked else "yes")


@dataclasses.dataclass
class Table:
    """The rows of one result file, with what its vendor figures are."""
    op: str
    title: str
    short: str                             # label in the plots
    rows: list
    vendor_call: str
    cupy_call: str | None = None           # None: no CuPy call measured apart from the vendor's
    planner_label: str = "plan"
    notes: list = dataclasses.field(default_factory=list)
    order: tuple = ()


def _ratio(a, b):
    return a / b if a and b else None


def _geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


# --- one mapper a benchmark: its JSON fields -> a Table ---------------------------------------

def spmv_table(doc) -> Table:
    k, sizes = doc.get("k", 1), doc.get("sizes") or ["large"]
    rows = []
    for r in doc.get("results", []):
        cands = {c["kernel"]: c for c in r.get("candidates", [])}

        def ok(kernel):   # each candidate was checked against SciPy before it was timed
            if not cands:
                return r.get("all_correct")
            return None if kernel not in cands else bool(cands[kernel].get("correct"))
        path = r.get("vendor_path")
        extra = {"planning ms": (r.get("planning_ms"), "ms")}
        if path not in (None, "prepared"):      # the prepared cuSPARSE call fell back to cupyx
            extra["vendor ran"] = (path, "text")
        rows.append(Row(r["matrix"], r["dtype"], ours_kernel=r.get("kernel"), ours_ms=r.get("ms"),
                        vendor_ms=r.get("vendor_ms"),
                        cupy_ms=r.get("cupyx_ms") if r.get("cupyx_correct", True) else None,
                        frac_bw=r.get("frac_of_copy_bw"), frac_bw_b2b=r.get("frac_of_copy_bw_b2b"),
                        planner_kernel=r.get("planner_kernel"), planner_ms=r.get("planner_ms"),
                        planner_vs_oracle=r.get("planner_vs_oracle"), ours_ok=ok(r.get("kernel")),
                        vendor_ok=r["vendor_correct"] if "vendor_config" in r else ok("spmv.cusparse"),
                        planner_ok=ok(r.get("planner_kernel")), extra=extra))
    prepared = any(row.cupy_ms is not None for row in rows) or any("cupyx_ms" in r for r in doc.get("results", []))
    best = any("vendor_config" in r for r in doc.get("results", []))
    vendor = ("cuSPARSE prepared once (`spmv.cusparse`: A's descriptor, the dense descriptors and the "
              "workspace made once, the output preallocated: the kernel as a C++ user runs it)"
              + (", the fastest of its configurations checked correct (algorithm; SpMM: B and C row- or "
                 "column-major, copies timed; which in `vendor_config`)" if best else "") if prepared else
              "cupyx `A @ x` (cuSPARSE with CuPy's per-call descriptors and workspace; the prepared "
              "cuSPARSE call is not measured in this file)")
    size = "" if sizes == ["large"] else f" ({', '.join(sizes)} sizes)"
    notes = ["`ms`: one call between two CUDA events on a prepared format. Planner vs oracle: cost per "
             f"use at reuse {doc.get('reuse', 'n/a')} (run + prepare / reuse) over the best candidate's."]
    return Table("spmv" if k == 1 else "spmm", ("SpMV" if k == 1 else f"SpMM, k = {k}") + size,
                 ("SpMV" if k == 1 else f"SpMM k={k}") + ("" if not size else " " + " ".join(sizes)),
                 rows, vendor, ("cupyx `A @ x` (descriptors and workspace made per call"
                                + (", B copied to column-major" if k > 1 else "") + ", a new result)")
                 if prepared else None, notes=notes, order=(k, sizes))


def spgemm_table(doc) -> Table:
    rows = []
    dtype = doc.get("dtype", "float64")
    for r in doc.get("results", []):
        # ``correct``: checked against SciPy (_checks.check_product); older files: row sums alone
        ours_ok = r.get("status") == "ok" and bool(r.get("correct", r.get("correct_rowsums")))
        vendor_ok = r.get("vendor_correct", r.get("vendor_status") == "ok") if r.get("vendor_ms") is not None else None
        oks = {"spgemm.hash": ours_ok, "spgemm.cusparse": vendor_ok,
               "spgemm.merge": r.get("merge_correct", r.get("merge_status") == "ok")}
        planner = r.get("planner_kernel")
        times = {k: r[key] for k, key in SPGEMM_KERNEL_KEYS.items() if oks.get(k) and r.get(key)}
        full = r.get("full_ms", r.get("unguessed_ms", r.get("ms")))
        replay = r.get("ms_kind", "guess replay" if "unguessed_ms" in r else "full product") == "guess replay"
        wrong = [f"{who}: {r.get(key) or 'wrong'}" for who, ok, key in (
            ("ours", ours_ok if r.get("ms") is not None else None, "check"), ("vendor", vendor_ok, "vendor_check"),
            ("plan.run", r.get("planner_correct"), "planner_check")) if ok is False]
        rows.append(Row(r["matrix"], r.get("dtype", dtype),
                        ours_kernel=r.get("kernel", "spgemm.hash") + (" (guess replay)" if replay else ""),
                        ours_ms=r.get("ms"), vendor_ms=r.get("vendor_ms"), cupy_ms=r.get("cupyx_ms"),
                        planner_kernel=planner, planner_ms=r.get("planner_ms"),
                        planner_vs_oracle=_ratio(times.get(planner), min(times.values(), default=None)),
                        ours_ok=ours_ok if r.get("ms") is not None else None, vendor_ok=vendor_ok,
                        planner_ok=r.get("planner_correct", oks.get(planner)) if r.get("planner_ms") else None,
                        extra={"full product ms": (full, "ms"),
                               "full x vendor": (_ratio(r.get("vendor_ms"), full) if ours_ok and vendor_ok
                                                 else None, "x"),
                               "cuSPARSE reuse ms": (r.get("vendor_reuse_ms") if r.get("vendor_reuse_correct") else None, "ms"),
                               "x reuse": (r.get("speedup_vs_vendor_reuse"), "x"),
                               "products": (r.get("products"), "int"),
                               "why wrong": ("; ".join(wrong) if wrong else None, "text")}))
    reuse = any(row.cupy_ms is not None for row in rows)
    measured_reuse = any(r.get("vendor_reuse_ms") for r in doc.get("results", []))
    vendor = ("cuSPARSE SpGEMM with its analysis reused (`cusparseSpGEMMreuse`)" if reuse else
              "cupyx `A @ B` (cuSPARSE SpGEMM, a whole call)" + (
                  "; `cuSPARSE reuse ms` is cuSPARSE's values-only recomputation on a structure and "
                  "per-product buffers kept from a setup (`cusparseSpGEMMreuse_compute`, prepared once), "
                  "`x reuse` our repeated call's ratio to it" if measured_reuse else
                  "; its reuse is not measured in this file"))
    notes = ["`ms`: repeated calls of the same operands. Where ours reads `(guess replay)` those calls "
             "replay the analysis kept from the first call (a replay, not a full product); `full product "
             "ms` beside it is the whole product, `guess=False`, each call waiting for its own analysis "
             "as a first call does (elsewhere it equals `ms`), and `full x vendor` its ratio. `plan.run` "
             "replays the same way where it picks `spgemm.hash`. " + (
             "Checked against SciPy, each kernel on "
             "its own (ours, its guess replay, cuSPARSE, `plan.run`'s output): every row's count of "
             "entries against A·B's structure (so nnz; past 1.5e9 products on sampled rows only), the "
             "columns and values of 64 evenly spread rows and the longest, and every row's sum; an nnz "
             "that differs is that kernel's failure, whoever's it is. " if any("check" in r for r in doc.get("results", []))
             else "This file predates those checks: its rows were checked by row sums against SciPy and nnz "
             "against cuSPARSE only. ") + "No minimum traffic is defined, so "
             "no copy-bandwidth fraction. The vendor is not run past its known limits (n/a)."]
    return Table("spgemm", f"SpGEMM ({dtype}, C = A·A or A·Aᵀ)", "SpGEMM", rows, vendor,
                 "cupyx `A @ B`" if reuse else None, planner_label="plan.run", notes=notes)


def sptrans_table(doc) -> Table:
    rows = []
    for r in doc.get("results", []):
        vendor_ok = r.get("vendor_correct")
        method = re.search(r"method=(\w+)", str(r.get("planner_kernel")))
        replays = {m: r.get(f"{m}_graph_ms") for m in ("radix", "segsort") if r.get(f"{m}_graph_correct")}
        if vendor_ok and r.get("vendor_ms"):
            replays["cusparse"] = r["vendor_ms"]
        chosen = replays.get(method.group(1) if method else "cusparse")
        rows.append(Row(r["matrix"], r["dtype"], ours_kernel="transpose()", ours_ms=r.get("ms"),
                        vendor_ms=r.get("vendor_ms"), cupy_ms=r.get("cupyx_ms"), frac_bw=r.get("frac_of_copy_bw"),
                        planner_kernel=r.get("planner_kernel"), planner_ms=r.get("plan_replay_ms", r.get("planner_ms")),
                        planner_vs_oracle=_ratio(chosen, min(replays.values(), default=None)),
                        ours_ok=r.get("correct"), vendor_ok=vendor_ok,
                        planner_ok=r.get("plan_replay_correct", r.get("planner_correct")),
                        extra={"planning s": (r.get("planning_s"), "s")}))
    prepared = any(row.cupy_ms is not None for row in rows)
    vendor = ("cuSPARSE csr2csc with its buffer prepared once" if prepared else
              "CuPy `A.T.tocsr()` (cuSPARSE csr2csc, a whole call)")
    notes = ["`transpose()` (`ms`, `x vendor`): a full transpose, method chosen on the GPU, nothing "
             "replayed. `plan.run (replay)` (`plan_replay_ms`): a plan's repeated call, which replays its "
             "recorded launches (and A's pattern where it is unchanged): a replay, not a full transpose, "
             "reported beside it; the geomean `plan.run (replay)` is the replays'. Planner vs oracle: the chosen "
             "method's replay over the faster method's replay or cuSPARSE. Checked: indptr, indices and "
             "values equal to SciPy's."]
    return Table("sptrans", "SpTRANS (A.T as CSR)", "SpTRANS", rows, vendor,
                 "CuPy `A.T.tocsr()`" if prepared else None, planner_label="plan.run (replay)", notes=notes)


def tsgemm_table(doc) -> Table:
    rows = []
    for r in doc.get("rows", []):
        ok = r.get("max_rel_err") is not None and r["max_rel_err"] < TSGEMM_TOL.get(r["dtype"], 1e-12)
        planner = r.get("planner_kernel")
        chosen = r.get("ms") if planner == "tsgemm.tsm2" else r.get("vendor_ms")
        rows.append(Row(f"n={r['n']} k={r['k']} {r['layout']}", r["dtype"],
                        ours_kernel="tsgemm.tsm2" + (f" ({r['variant']})" if r.get("variant") else ""),
                        ours_ms=r.get("ms"), vendor_ms=r.get("vendor_ms"), cupy_ms=r.get("cupyx_ms"),
                        frac_bw=r.get("frac_of_copy_bw"), frac_bw_b2b=r.get("frac_of_copy_bw_b2b"),
                        planner_kernel=planner, planner_ms=r.get("planner_ms"),
                        planner_vs_oracle=_ratio(chosen, min(r.get("ms") or math.inf, r.get("vendor_ms") or math.inf)),
                        ours_ok=ok, vendor_ok=True,   # cuBLAS's result is the reference
                        planner_ok=r.get("planner_correct", ok if planner == "tsgemm.tsm2" else True)))
    notes = ["A is n x n (C: row-major, F: column-major), B is n x k. TSM2 is checked against cuBLAS's "
             "result, the reference (relative error under 1e-4 float32, 1e-12 float64); `plan.run` counts "
             "as its kernel's check. Planner vs oracle: the planner's kernel over the faster of TSM2 and "
             "cuBLAS, single calls."]
    return Table("tsgemm", "Tall-and-skinny GEMM", "TSGEMM", rows,
                 "`cupy.matmul` (cuBLAS GEMM; also what a CuPy user's call costs)", planner_label="plan.run",
                 notes=notes)


MAPPERS = {"spmv": spmv_table, "spgemm": spgemm_table, "sptrans": sptrans_table, "tsgemm": tsgemm_table}


# --- the document -----------------------------------------------------------------------------

def _fmt(x, kind="text"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if kind == "ms":
        return f"{x:.4g}" if x < 1e4 else f"{x:,.0f}"
    if kind in ("x", "frac"):
        return f"{x:.2f}"
    if kind == "us":
        return f"{x:,.1f}"
    if kind in ("s", "regret"):
        return f"{x:.3f}"
    if kind == "int":
        return f"{x:,}"
    return str(x).replace("|", "\\|")


def _md_table(columns, rows) -> list:
    """Markdown of ``rows`` under ``columns`` [(header, kind)]: each row a list of values."""
    out = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    return out + ["| " + " | ".join(_fmt(v, kind) for v, (_, kind) in zip(row, columns)) + " |" for row in rows]


def _commit(doc):
    """The commit a file records (read from git at run time), shortened, with what qualifies it:
    a modified tree, and the sources' digest where there was no git checkout."""
    def short(c):
        c = str(c or "n/a")
        return c[:10] if re.fullmatch(r"[0-9a-f]{7,40}", c) else c
    notes = (["tree modified"] if doc.get("tree_dirty") else []) + (
        [f"sources {doc['source_digest']}"] if doc.get("source_digest") and doc.get("commit_source") != "git" else [])
    return short(doc.get("commit")) + (f" ({'; '.join(notes)})" if notes else "")


def _origin(name, doc):
    bw = doc.get("copy_bandwidth_gbs")
    planned = doc.get("planner_bandwidth_gbs")
    copy = (f", copy bandwidth {bw:,.0f} GB/s measured" + (f" (the planner's: {planned:,.0f})" if planned else "")
            if isinstance(bw, (int, float)) else "")
    return f"`{name}`: {doc.get('device', 'n/a')}, commit {_commit(doc)}, {str(doc.get('date', 'n/a'))[:10]}{copy}"


def benchmark_of(name: str, doc: dict) -> str:
    """The benchmark a file holds: its ``benchmark`` field, else its name less the device."""
    return doc.get("benchmark") or name.rsplit("-", 1)[0]


def device_of(name: str, doc: dict) -> str:
    return doc.get("device_slug") or Path(name).stem.rsplit("-", 1)[-1]


def op_section(name, doc, table: Table) -> list:
    cupy = table.cupy_call is not None
    out = [f"## {table.title}", "", _origin(name, doc) + f". Vendor: {table.vendor_call}"
           + (f"; beside it, what a CuPy user's call costs: {table.cupy_call}." if cupy else "."), ""]
    for dtype in sorted({r.dtype for r in table.rows}):
        rs = [r for r in table.rows if r.dtype == dtype]
        parts = [f"ours {_fmt(_geomean([r.speedup for r in rs]), 'x')}x",
                 f"{table.planner_label} {_fmt(_geomean([r.planner_speedup for r in rs]), 'x')}x"]
        if cupy:
            over_cupy = _geomean([r.planner_vs_cupy for r in rs])
            parts.append(f"{table.planner_label} over the CuPy call {_fmt(over_cupy, 'x')}x")
        for key in dict.fromkeys(k for r in rs for k, (_, kind) in r.extra.items() if kind == "x"):
            parts.append(f"{key} {_fmt(_geomean([r.extra.get(key, (None,))[0] for r in rs]), 'x')}x")
        fracs = [r.frac_bw for r in rs if r.frac_bw is not None and r.ours_ok]
        pvo = [r.planner_vs_oracle for r in rs if r.planner_vs_oracle is not None and r.planner_ok]
        out.append(f"* {dtype}: geomean over the vendor " + ", ".join(parts)
                   + f"; copy-bandwidth fraction min {_fmt(min(fracs) if fracs else None, 'frac')}"
                   + f"; worst planner vs oracle {_fmt(max(pvo) if pvo else None, 'x')}"
                   + f" ({sum(1 for r in rs if r.speedup)} of {len(rs)} rows checked correct, ours and vendor)")
    out += [""] + table.notes + [""]
    extra = list(dict.fromkeys(k for r in table.rows for k in r.extra))
    b2b = any(r.frac_bw_b2b is not None for r in table.rows)
    columns = ([("matrix", "text"), ("dtype", "text"), ("ours", "text"), ("ms", "ms"), ("vendor ms", "ms"),
                ("x vendor", "x")] + ([("CuPy call ms", "ms")] if cupy else []) + [("copy bw", "frac")]
               + ([("copy bw b2b", "frac")] if b2b else [])
               + [(table.planner_label, "text"), ("ms", "ms"), ("x vendor", "x")]
               + ([("x CuPy call", "x")] if cupy else []) + [("vs oracle", "x")]
               + [(k, next(r.extra[k][1] for r in table.rows if k in r.extra)) for k in extra] + [("checked", "text")])
    lines = [[r.matrix, r.dtype, r.ours_kernel, r.ours_ms, r.vendor_ms, r.speedup] + ([r.cupy_ms] if cupy else [])
             + [r.frac_bw] + ([r.frac_bw_b2b] if b2b else [])
             + [r.planner_kernel, r.planner_ms, r.planner_speedup] + ([r.planner_vs_cupy] if cupy else [])
             + [r.planner_vs_oracle] + [r.extra.get(k, (None,))[0] for k in extra] + [r.checked]
             for r in table.rows]
    return out + _md_table(columns, lines) + [""]


def overhead_section(files) -> list:
    out = []
    for name, doc in files:
        kind = benchmark_of(name, doc).split("-")[0]
        if kind == "launch_overhead":
            out += [f"### Per-call cost of a small product ({_origin(name, doc)})", ""]
            out += _md_table([("call", "text"), ("us a call", "us")], list(doc.get("us_per_call", {}).items())) + [""]
        elif kind == "dispatch":
            rows = [r for side in ("gpu", "host") for r in doc.get(side, [])]
            out += [f"### `matplan.matmul` on a plan-cache hit ({_origin(name, doc)})", ""]
            out += _md_table([("case", "text"), ("kernel", "text"), ("kernel us", "us"), ("hit us", "us"),
                              ("overhead us", "us"), ("target us", "us"), ("path", "text"), ("plan / kernel", "x"),
                              ("error", "text")],
                             [[r.get("case"), r.get("kernel"), r.get("kernel_us"), r.get("hit_us"),
                               r.get("overhead_us"), r.get("target_us"), r.get("path"), r.get("plan_x"),
                               r.get("error")] for r in rows])
            out += [""]
            plans = [(side, r) for side in ("gpu", "host") for r in (doc.get("plan_never") or {}).get(side, [])]
            if plans:
                out += [f"### `plan(A, B, measure=\"never\")` ({_origin(name, doc)})", ""]
                out += _md_table([("op", "text"), ("nnz", "int"), ("operands", "text"), ("kernel", "text"),
                                  ("plan ms", "ms"), ("plan / kernel", "x"), ("target ms", "ms"), ("error", "text")],
                                 [[r.get("op"), r.get("nnz"), "GPU" if side == "gpu" else "host", r.get("kernel"),
                                   r.get("plan_ms"), r.get("plan_x"), r.get("target_ms"), r.get("error")]
                                  for side, r in plans]) + [""]
        elif kind == "spmv_bounds":
            out += [f"### SpMV bounds: flat kernels at the copy bandwidth ({_origin(name, doc)})", ""]
            out += _md_table([("matrix", "text"), ("dtype", "text"), ("stream us", "us"), ("gather us", "us"),
                              ("flat us", "us"), ("cupyx `A @ x` us", "us"), ("bound (of copy bw)", "frac"),
                              ("cupyx (of copy bw)", "frac")],
                             [[r.get("matrix"), r.get("dtype"), r.get("stream_us"), r.get("gather_us"),
                               r.get("flat_us"), r.get("vendor_us"), r.get("bound_frac"), r.get("vendor_frac")]
                              for r in doc.get("rows", [])]) + [""]
    return (["## Call overheads and bounds", ""] + out) if out else []


def first_use_section(files) -> list:
    """benchmarks/coldstart.py's files: each op's first plan + run in a fresh process and caches."""
    out = []
    for name, doc in files:
        if benchmark_of(name, doc).split("-")[0] != "coldstart":
            continue
        kind = "prebuilt kernels" if doc.get("prebuilt", True) else "no prebuilt kernels (NVRTC compiles them)"
        out += [f"### {kind} ({_origin(name, doc)}); `matplan demo` {_fmt(doc.get('demo_s'), 's')} s "
                f"({'ok' if doc.get('demo_ok') else 'FAILED'})", ""]
        out += _md_table([("op", "text"), ("import s", "s"), ("first plan + run s", "s"),
                          ("second plan + run ms", "ms"), ("kernel", "text"), ("NVRTC modules", "int"),
                          ("correct", "text")],
                         [[r.get("op"), r.get("import_s"), r.get("first_plan_run_s"),
                           1e3 * r["warm_plan_run_s"] if "warm_plan_run_s" in r else None, r.get("kernel"),
                           len(r.get("compiled", [])), r.get("correct")] for r in doc.get("rows", [])]) + [""]
    return (["## First use (fresh process, empty kernel caches)", ""] + out) if out else []


def learned_section(folder: Path) -> list:
    out = []
    for path in sorted(folder.glob("learned_report_*.json")):
        doc = json.loads(path.read_text())
        model = doc.get("installed_model") or {}
        out += [f"### {doc.get('device', path.stem)}: `{path.name}`", "",
                f"Leave-matrix-family-out over {_fmt(doc.get('problems_with_a_choice'), 'int')} problems and "
                f"{_fmt(doc.get('timings'), 'int')} timings; the installed model was fitted on exactly these "
                f"timings: {'yes' if model.get('same_timings') else 'no'}.", ""]
        out += _md_table([("reuse", "text"), ("model", "text"), ("geomean regret", "regret"),
                          ("worst regret", "regret"), ("top-1", "frac")],
                         [[reuse, kind, res.get("geomean_regret"), res.get("worst_regret"), res.get("top1_accuracy")]
                          for reuse, by_kind in doc.get("results", {}).items()
                          for kind, res in by_kind.items() if "geomean_regret" in res]) + [""]
    for path in sorted(folder.glob("training-*.jsonl")):
        slug = path.stem.split("-", 1)[1]
        meta = MODEL_DATA / f"{slug}.json"
        shipped = json.loads(meta.read_text()).get("training_set_hash") if meta.is_file() else None
        with open(path) as fh:
            records = sum(1 for _ in fh)
        out.append(f"* `{path.name}` ({path.stat().st_size / 1e6:.1f} MB, {records:,} records): the tuning "
                   f"data the shipped `{slug}` model was fitted on (training-set hash {str(shipped)[:16]}).")
    return (["## Learned cost model", ""] + out + [""]) if out else []


def load(folder: Path) -> list:
    """(file name, document) of every JSON result in ``folder`` (learned reports apart)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("learned_report_"):
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            doc = {"error": f"unreadable: {exc}"}
        out.append((path.name, doc if isinstance(doc, dict) else {"error": "not a JSON object"}))
    return out


def tables_of(files) -> list:
    """(file name, document, Table) of every file a mapper reads, in the summary's order."""
    script = {name: benchmark_of(name, doc).split("-")[0] for name, doc in files}   # "spmv-k16" -> spmv.py
    tables = [(name, doc, MAPPERS[script[name]](doc)) for name, doc in files if script[name] in MAPPERS]
    return sorted(tables, key=lambda t: (OP_ORDER.index(t[2].op), t[2].order, device_of(t[0], t[1])))


def build_summary(folder) -> tuple:
    """(markdown lines, tables) of SUMMARY.md for ``folder``, plots apart."""
    files = load(Path(folder))
    tables = tables_of(files)
    md = ["# Benchmark summary", "",
          "Generated by `benchmarks/summarize.py` from the result files beside it (each benchmark script "
          "regenerates it); do not edit by hand. Times are medians in milliseconds. `x vendor` is the "
          "vendor's time over ours (above 1: ours is faster); for SpMV and SpMM the vendor is cuSPARSE "
          "prepared once (`vendor_ms`), and `x CuPy call` compares with cupyx's `A @ x` as a CuPy user "
          "calls it (`cupyx_ms`). `copy bw` is the fraction of the "
          "device-to-device copy bandwidth, measured in the same run, that the op's minimum traffic "
          "reaches (single calls; `b2b`: calls queued back to back). `vs oracle` is the planner's "
          "choice over the best candidate timed (1.00: it chose the best). A ratio or geomean counts "
          "only results checked correct; `n/a`: the file does not have that figure. How it is "
          "measured: [docs/performance.md](../../docs/performance.md).", "", "## Files", ""]
    md += _md_table([("file", "text"), ("benchmark", "text"), ("device", "text"), ("commit", "text"), ("date", "text")],
                    [[f"`{n}`", benchmark_of(n, d), d.get("device", d.get("error", "n/a")), _commit(d),
                      str(d.get("date", "n/a"))[:10]] for n, d in files]) + [""]
    for name, doc, table in tables:
        md += op_section(name, doc, table)
    return md + first_use_section(files) + overhead_section(files) + learned_section(Path(folder)), tables


def plot(folder: Path, tables) -> tuple:
    """One PNG a device, ``summary-<device>.png``: ours and the planner over the vendor, and ours'
    fraction of copy bandwidth, per table. Returns (file names, a note where matplotlib is missing)."""
    try:
        import matplotlib   # optional (the ``plots`` extra): the summary is complete without it
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "Plots skipped: matplotlib is not installed (`pip install matplotlib`)."
    written = []
    for slug in sorted({device_of(n, d) for n, d, _ in tables}):
        mine = [t for n, d, t in tables if device_of(n, d) == slug]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        series = (("speedup", ax1, "o", "C0", "ours", 0.0), ("planner_speedup", ax1, "x", "C1", "planner", 0.2),
                  ("frac_bw", ax2, "o", "C0", "ours", 0.0))
        for i, t in enumerate(mine):
            for attr, ax, marker, color, label, dx in series:
                ys = [getattr(r, attr) for r in t.rows if getattr(r, attr) and (attr != "frac_bw" or r.ours_ok)]
                ax.scatter([i + dx] * len(ys), ys, marker=marker, s=18, alpha=0.6, color=color,
                           label=label if i == 0 and ax is ax1 else None)
        for ax, title in ((ax1, "vendor time / ours (log scale)"), (ax2, "fraction of copy bandwidth, ours")):
            ax.set_xticks(range(len(mine)), [t.short for t in mine], rotation=20, ha="right", fontsize=8)
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
        ax1.set_yscale("log")
        ax1.axhline(1, color="k", lw=0.8)
        ax1.legend(fontsize=8)
        fig.suptitle(f"matplan benchmarks on {slug} (checked-correct results only)", fontsize=11)
        fig.tight_layout()
        fig.savefig(folder / f"summary-{slug}.png", dpi=80)
        plt.close(fig)
        written.append(f"summary-{slug}.png")
    return written, None


def write_summary(folder=RESULTS) -> Path:
    """Regenerate ``SUMMARY.md`` and its plots in ``folder``; returns the summary's path."""
    folder = Path(folder)
    md, tables = build_summary(folder)
    for old in folder.glob("summary-*.png"):
        old.unlink()
    _, note = plot(folder, tables)
    md += ["## Plots", ""] + ([note, ""] if note else [])
    md += [f"![{p.name}]({p.name})" for p in sorted(folder.glob("*.png"))] + [""]
    path = folder / "SUMMARY.md"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(md))
    tmp.replace(path)
    return path


if __name__ == "__main__":
    print("wrote", write_summary(Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS))
