"""What every benchmark script records beside its figures."""
from __future__ import annotations

import os
import subprocess


def git_commit() -> str:
    """The tree's commit: $MATPLAN_COMMIT (the device's copy of the tree has no .git), else git's."""
    if os.environ.get("MATPLAN_COMMIT"):
        return os.environ["MATPLAN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        return "unknown"
