"""The fingerprint of the kernel and cost-model sources a learned model was trained against.

A model's timings describe the kernels and analytic cost models of the matplan that took them
(the combined model learns the correction to those costs). So :func:`current` hashes, per file,
every source that decides a candidate's time or analytic cost:

* ``matplan/kernels/**``: the ``.cu`` / ``.cuh`` kernels and every ``.py`` (launch code, each
  kernel's ``cost()`` and ``candidates()``);
* ``matplan/models/*.py``: the analytic cost models, except the learned model's own modules
  (``learned*.py``), which read a model and change no time.

``matplan train`` records it in the model's metadata (``sources``); a planner that finds it
different from the installed sources warns once and plans with the analytic costs (and
measurement) instead. Line endings are normalised, so a checkout with CRLF hashes the same.

A change that leaves the kernels' times alone (a moved function, a comment) may keep the shipped
models, as a recorded decision: re-stamp them (:mod:`.learned_restamp`) and say why in CHANGELOG.md.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..core.cache import BoundedCache

#: The matplan package folder; paths in a fingerprint are relative to it.
ROOT = Path(__file__).resolve().parents[1]
#: Models shipped with the package.
PACKAGE_DIR = Path(__file__).resolve().parent / "data"
#: (folder under matplan/, file patterns, recursive)
SOURCES = (("kernels", ("*.cu", "*.cuh", "*.py"), True), ("models", ("*.py",), False))
#: Files of the learned model itself: not part of what it was trained against.
EXCLUDED = "models/learned*.py"
#: Changed files a stale-model message names at most.
NAMED = 6

_current = BoundedCache("source fingerprint", maxsize=1)


def source_files(root: Path = ROOT) -> list:
    """The fingerprinted files, as sorted paths relative to ``root`` (POSIX separators)."""
    found = set()
    for folder, patterns, recursive in SOURCES:
        base = root / folder
        for pattern in patterns:
            for p in (base.rglob(pattern) if recursive else base.glob(pattern)):
                rel = p.relative_to(root)
                if p.is_file() and "__pycache__" not in rel.parts and not rel.match(EXCLUDED):
                    found.add(rel.as_posix())
    return sorted(found)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes().replace(b"\r\n", b"\n")).hexdigest()


def compute(root: Path = ROOT) -> dict:
    """{"sha256": of every file's name and digest, "files": {path: digest}} of ``root``'s sources."""
    files = {rel: _digest(root / rel) for rel in source_files(root)}
    total = hashlib.sha256("".join(f"{rel}\0{d}\n" for rel, d in files.items()).encode())
    return {"sha256": total.hexdigest(), "files": files}


def current() -> dict:
    """The installed sources' fingerprint (computed once per process; :func:`clear` forgets it)."""
    now = _current.get(ROOT)
    if now is None:
        now = compute()
        _current.put(ROOT, now)
    return now


def clear() -> None:
    _current.clear()


def mismatch(recorded, now: dict | None = None) -> str | None:
    """None when ``recorded`` (a model's ``sources``) matches ``now`` (default :func:`current`),
    else which files differ, for a message."""
    now = current() if now is None else now
    if not isinstance(recorded, dict) or not isinstance(recorded.get("sha256"), str):
        return "it records no source fingerprint"
    if recorded["sha256"] == now["sha256"]:
        return None
    old = recorded.get("files") if isinstance(recorded.get("files"), dict) else {}
    new = now["files"]
    changed = sorted(p for p in set(old) | set(new) if old.get(p) != new.get(p))
    if not changed:
        return "its source fingerprint differs"
    more = f" and {len(changed) - NAMED} more" if len(changed) > NAMED else ""
    return f"sources changed since it was trained: {', '.join(changed[:NAMED])}{more}"


def metadata_path(path) -> Path:
    """A model's metadata file from its .npz, .json or extension-less path."""
    path = Path(path)
    return path.with_suffix(".json") if path.suffix in (".npz", ".json") else path.with_name(path.name + ".json")
