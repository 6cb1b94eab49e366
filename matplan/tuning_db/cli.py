"""The ``tune``, ``train``, ``report`` and ``db`` subcommands; matplan/cli.py calls :func:`add_subparsers`."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import corpus
from ..models import learned
from .dataset import DEFAULT_TIMING, TIMINGS
from .refresh import refresh_features
from .report import evaluate, format_report
from .store import TuningDB, TuningDBError, default_path
from .train import train
from .tune import Interrupted, tune
from .units import DEFAULT_OPS, SPMM_KS, TSGEMM_KS, corpus_units, file_units


#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports it.
INTERRUPTED_EXIT = 130


def _db_arg(p, creates: bool = False):
    where = "default $MATPLAN_TUNING_DB or ~/.cache/matplan/tuning.sqlite"
    p.add_argument("--db", help=f"tuning database file ({where}; "
                                + ("created if missing)" if creates else "must exist)"))


def _progress_arg(p):
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _fail(exc) -> SystemExit:
    return SystemExit(f"matplan: error: {exc}")


def _int_at_least(low: int, what: str):
    """argparse type: an integer >= ``low`` (argparse names the option in its error)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value
    parse.__name__ = what
    return parse


positive_int = _int_at_least(1, "a positive integer")
nonnegative_int = _int_at_least(0, "an integer >= 0")


def _csv(kind):
    """argparse type: a comma-separated list of ``kind``."""
    def parse(text):
        try:
            return [kind(x) for x in text.split(",") if x]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (in the list {text!r})") from None
    return parse


def cmd_tune(args) -> int:
    units = []
    if not args.no_corpus:
        units += corpus_units(args.size, families=args.family, ops=args.ops, spmm_ks=args.spmm_k,
                              tsgemm_ks=args.tsgemm_k, dtypes=args.dtype, seed=args.seed)
    paths = list(args.mtx or [])
    if args.real:
        d = corpus.matrices_dir()
        if d is None:
            raise SystemExit("matplan tune: --real given but no real-matrix folder was found "
                             f"(set ${corpus.io.MATRICES_ENV})")
        paths.append(d)
    if paths:
        units += file_units(paths, ops=args.ops, spmm_ks=args.spmm_k, dtypes=args.dtype, seed=args.seed)
    if not units:
        raise SystemExit("matplan tune: nothing to tune (no corpus sizes and no matrix files)")
    if args.list:
        for u in units:
            print(u.key)
        print(f"{len(units)} problems")
        return 0
    try:
        summary = tune(units, db=args.db, backend=args.backend, n_jobs=args.n_jobs, scheduler=args.scheduler,
                       repeats=args.repeats, warmup=args.warmup, budget_s=args.budget, kernels=args.kernels,
                       retry_failed=args.retry_failed, progress=not args.no_progress,
                       imports=args.imports or (), run=args.run)
    except Interrupted as e:
        print(f"matplan tune: interrupted after {e.summary.units} of {len(units)} problems; what was timed "
              f"is kept in {e.summary.db}: run the same command again to resume", file=sys.stderr)
        return INTERRUPTED_EXIT
    except (TuningDBError, RuntimeError) as e:
        raise _fail(e) from e
    print(summary)
    return 0


def _timing_arg(p):
    p.add_argument("--timing", choices=TIMINGS, default=DEFAULT_TIMING,
                   help="the recorded run time fitted: single calls in rounds over the candidates, or calls "
                        f"queued back to back (default {DEFAULT_TIMING})")


def cmd_train(args) -> int:
    out_dir = learned.PACKAGE_DIR if args.package else args.out_dir
    try:
        path, model = train(args.db, args.device_class, kind=args.kind, name=args.name, dir=out_dir, cv=args.cv,
                            model_params={"max_iter": args.max_iter, "per_op": args.per_op},
                            progress=not args.no_progress, timing=args.timing)
    except (TuningDBError, learned.ModelLoadError) as e:
        raise _fail(e) from e
    print(f"saved {path} (+ {path.with_suffix('.json').name})")
    print(model.describe())
    if not args.package:   # a model is loaded only from a path the user names
        print(f"plan with it: export {learned.MODEL_ENV}={path}")
    return 0


def cmd_report(args) -> int:
    try:
        rep = evaluate(args.db, args.device_class, reuses=args.reuse, out=args.out, plots=not args.no_plots,
                       model_params={"max_iter": args.max_iter, "per_op": args.per_op},
                       progress=not args.no_progress, against=args.against, timing=args.timing)
    except TuningDBError as e:
        raise _fail(e) from e
    print(json.dumps(rep, indent=1) if args.json else format_report(rep))
    return 0


def cmd_db(args) -> int:
    if args.action in ("export", "import") and not args.file:
        raise SystemExit(f"matplan db {args.action}: give the FILE to {args.action}")
    path = Path(args.db).expanduser() if args.db else default_path()
    created = args.action == "import" and not path.exists()
    try:
        with TuningDB(args.db, create=args.action == "import") as db:
            if args.action == "info":
                print(f"{db.path}: schema v{db.schema_version}, {db.counts()}, device classes {db.device_classes()}")
            elif args.action == "check":
                print(f"{db.path}: ok ({'; '.join(db.check())})")
            elif args.action == "export":
                print(f"exported {db.export(args.file)} to {args.file}")
            elif args.action == "import":
                print(f"merged {args.file} in one transaction: {db.merge(args.file)}")
            elif args.action == "refresh-features":
                counts = refresh_features(db, args.matrices, progress=not args.no_progress)
                print(f"{db.path}: features {counts}")
    except BaseException as e:
        if created:    # a failed import leaves no empty database behind
            for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                p.unlink(missing_ok=True)
        if isinstance(e, TuningDBError):
            raise _fail(e) from e
        raise
    return 0


def add_subparsers(sub) -> None:
    """Add tune, train, report and db to the ``matplan`` command's subparsers."""
    p = sub.add_parser("tune", help="time every registered candidate on a corpus and record it in the tuning database",
                       description="Resumable: candidates already recorded for this device and matplan version "
                                   "are skipped; after Ctrl-C (exit status 130) the same command resumes.")
    _db_arg(p, creates=True)
    p.add_argument("--size", nargs="+", default=["small"], choices=sorted(corpus.SIZES),
                   help="built-in corpus sizes (default small)")
    p.add_argument("--family", nargs="+", choices=sorted(corpus.FAMILIES), help="only these families")
    p.add_argument("--no-corpus", action="store_true", help="skip the built-in corpus (only --mtx/--real)")
    p.add_argument("--mtx", nargs="+", metavar="PATH", help=".mtx/.mtx.gz/.npz files or folders of them")
    p.add_argument("--real", action="store_true", help="also the shared real matrices ($MATPLAN_MATRICES)")
    p.add_argument("--ops", type=_csv(str), default=list(DEFAULT_OPS), help="comma-separated ops")
    p.add_argument("--spmm-k", type=_csv(positive_int), default=list(SPMM_KS), help="dense B widths for spmm")
    p.add_argument("--tsgemm-k", type=_csv(positive_int), default=list(TSGEMM_KS),
                   help="k of the tall-and-skinny products")
    p.add_argument("--dtype", type=_csv(str), default=["float64", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["cpu", "gpu"], help="default: gpu when CuPy sees one")
    p.add_argument("--n-jobs", type=positive_int, help="worker processes (default one per GPU; 1 on the host)")
    p.add_argument("--scheduler", help="Dask scheduler address, or 'local' to start a local cluster (one worker "
                   "per GPU with dask-cuda; --n-jobs CPU workers): one problem per worker (matplan[distributed])")
    p.add_argument("--repeats", type=positive_int, help="timed runs per candidate (default 20 GPU, 5 CPU)")
    p.add_argument("--warmup", type=nonnegative_int, help="untimed runs first (default 3 GPU, 1 CPU)")
    p.add_argument("--budget", type=float, default=2.0, help="seconds of timing per candidate before stopping early")
    p.add_argument("--kernels", type=_csv(str), help="only these kernel names")
    p.add_argument("--retry-failed", action="store_true", help="time again candidates recorded as failed")
    p.add_argument("--run", default="", metavar="LABEL",
                   help="label of this tuning run: candidates another run timed are timed again and kept "
                        "beside those (training pools them); default: the unlabelled run")
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                   help="a module that registers extra kernels (imported in every worker); repeatable")
    _progress_arg(p)
    p.add_argument("--list", action="store_true", help="print the problems and exit")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("train", help="fit the learned cost model of a device class from the tuning database")
    _db_arg(p)
    p.add_argument("--device-class", help="e.g. H100 (default: the only class in the database)")
    p.add_argument("--kind", choices=["combined", "learned"], default="combined",
                   help="combined: learn the correction to the analytic model (default); learned: features only")
    p.add_argument("--name", help="model name (default: the device class in lower case)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--out-dir", help="folder to save into (default: the user's model folder)")
    g.add_argument("--package", action="store_true", help="save into the package (matplan/models/data) to ship it")
    p.add_argument("--cv", type=nonnegative_int, default=5, help="validation folds (leave-family-out; 0 = none)")
    p.add_argument("--max-iter", type=positive_int, default=300, help="boosting iterations of each regressor")
    p.add_argument("--per-op", action="store_true", help="regressors of its own for each op with enough timings")
    _timing_arg(p)
    _progress_arg(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("report", help="leave-family-out evaluation of the analytic, learned and combined models")
    _db_arg(p)
    p.add_argument("--device-class")
    p.add_argument("--reuse", type=_csv(positive_int), default=[1, 100],
                   help="reuse counts to evaluate (default 1,100)")
    p.add_argument("--out", metavar="DIR", help="folder for the JSON and plots (default: the current folder; "
                                               "created if missing)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--max-iter", type=positive_int, default=300, help="boosting iterations of the fitted models")
    p.add_argument("--per-op", action="store_true", help="fit each op with enough timings on its own (train --per-op)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--against", metavar="DB", help="a second tuning database of the same problems: score the "
                                                   "picks on its timings too, beside the timings' own noise")
    _timing_arg(p)
    _progress_arg(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("db", help="the tuning database: info, check, export, import (pool timings), "
                                  "refresh-features (add statistics a newer matplan computes)")
    p.add_argument("action", choices=["info", "check", "export", "import", "refresh-features"])
    p.add_argument("file", nargs="?", help="export/import file (.jsonl, or .sqlite for an SQLite copy)")
    p.add_argument("--matrices", help="refresh-features: folder to find recorded matrix files by name "
                                      "(default $MATPLAN_MATRICES)")
    p.add_argument("--db", help="tuning database file (default $MATPLAN_TUNING_DB or "
                                "~/.cache/matplan/tuning.sqlite; must exist, except for import, which creates it)")
    _progress_arg(p)
    p.set_defaults(func=cmd_db)


__all__ = ["add_subparsers", "positive_int", "INTERRUPTED_EXIT"]
