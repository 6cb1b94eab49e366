"""Check or re-stamp the source fingerprint of the shipped learned models (a recorded decision).

A shipped model whose ``sources`` fingerprint (:mod:`.learned_fingerprint`) differs from the
installed kernels and cost models is not used by the planner, and tests/models fails. The right
fix is a re-tune and retrain (``matplan tune``, ``matplan train --package``). Where a change
leaves the kernels' times alone (code moved between files, comments, a refactor of launch code),
the models may be kept instead: re-stamp them with the reason, and record the decision in
CHANGELOG.md::

    python -m matplan.models.learned_restamp --check
    python -m matplan.models.learned_restamp --restamp --reason "why the timings still hold"

The reason is kept in each model's metadata as ``sources.restamped``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import learned, learned_fingerprint
from .learned_fingerprint import PACKAGE_DIR, metadata_path


def shipped() -> list:
    """The metadata files of the models shipped in the package."""
    return sorted(PACKAGE_DIR.glob("*.json"))


def restamp(reason: str, paths=None) -> list:
    """Record the installed sources' fingerprint in the metadata of ``paths`` (default: every shipped
    model), with ``reason`` as ``sources.restamped``; returns the metadata files rewritten."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("reason: say why the models' timings still hold for the current sources")
    now = learned_fingerprint.compute()
    done = []
    for path in [metadata_path(p) for p in paths] if paths else shipped():
        meta = json.loads(path.read_text(encoding="utf-8"))
        meta["sources"] = dict(now, restamped=reason.strip())
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp, path)
        done.append(path)
    learned.clear_cache()   # the fingerprint, and the stamps of the shipped files: a plan sees the new ones at once
    return done


def check(paths=None) -> dict:
    """{metadata file: None if up to date, else what differs} of ``paths`` (default: the shipped models)."""
    now = learned_fingerprint.compute()
    return {path: learned_fingerprint.mismatch(json.loads(path.read_text(encoding="utf-8")).get("sources"), now)
            for path in ([metadata_path(p) for p in paths] if paths else shipped())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m matplan.models.learned_restamp",
                                description="Check or re-stamp the source fingerprint of the shipped learned models.")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="say which models are stale; exit 1 if any")
    g.add_argument("--restamp", action="store_true", help="record the installed sources in the models")
    p.add_argument("--reason", help="--restamp: why the timings still hold (kept in the metadata)")
    p.add_argument("models", nargs="*", type=Path, help="model files (default: the shipped models)")
    args = p.parse_args(argv)
    if args.restamp:
        if not args.reason:
            p.error("--restamp needs --reason (the decision; record it in CHANGELOG.md too)")
        for path in restamp(args.reason, args.models or None):
            print(f"re-stamped {path}")
        return 0
    result = check(args.models or None)
    for path, why in result.items():
        print(f"{path}: {why or 'up to date'}")
    return 1 if any(result.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
