"""Compiled kernels kept on disk: the prebuilt binaries shipped in the package and the ones NVRTC
built on this machine, looked up by source file, instantiation, options and GPU architecture.

A *unit* is one compiled module: a ``.cu`` (its text hashed with its headers and the options),
the template instantiations it holds with their lowered (mangled) names, one target (``sm_90``:
a cubin; ``compute_90``: PTX the driver compiles for newer GPUs) and the binary's file. The
package's units are listed in ``_bin/manifest.json`` (``matplan.kernels.prebuild`` writes them);
units compiled at run time go to the user cache folder, one JSON beside each binary. A unit
whose digest differs from today's source is never used.
"""
from __future__ import annotations

import functools
import hashlib
import json
import lzma
import os
import tempfile
import threading
import warnings
from pathlib import Path

from ..core.paths import user_folder

#: The package's prebuilt kernels.
PACKAGE_DIR = Path(__file__).resolve().parent / "_bin"
MANIFEST = "manifest.json"
#: Format of a unit's record; a record of another format is ignored.
FORMAT = 1
#: MATPLAN_PREBUILT=0 ignores the package's units (NVRTC compiles every kernel, as for a GPU no
#: prebuilt binary fits); MATPLAN_KERNEL_CACHE names the folder of units compiled here.
#: Targets the package ships: cubins for each architecture, PTX for those after the newest.
TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90", "compute_90")


def user_dir() -> Path:
    """Where units compiled on this machine go: $MATPLAN_KERNEL_CACHE, else the user cache folder."""
    explicit = os.environ.get("MATPLAN_KERNEL_CACHE")
    return Path(explicit) if explicit else user_folder("cache") / "kernels"


def digest(code: str, options) -> str:
    """The identity of a compiled module's input: the text NVRTC reads and its options."""
    return hashlib.sha256((code + "\0" + "\0".join(options)).encode()).hexdigest()[:32]


def targets_for(compute_capability: tuple) -> tuple:
    """Targets whose binaries run on a GPU of ``compute_capability`` (major, minor), best first:
    its own cubin, cubins of the same major and a lower minor (binary compatible), then PTX of
    an architecture at or below it (compiled by the driver on first load)."""
    major, minor = compute_capability
    cubins = [f"sm_{major}{m}" for m in range(minor, -1, -1)]
    ptx = [t for t in sorted((t for t in TARGETS if t.startswith("compute_")), reverse=True)
           if int(t.split("_")[1]) <= major * 10 + minor]
    return tuple(cubins + ptx)


class Store:
    """The units of the package folder and the user folder, indexed by (file, digest, target)."""

    def __init__(self, package_dir: Path = PACKAGE_DIR, cache_dir: Path | None = None):
        self.package_dir, self.cache_dir = Path(package_dir), cache_dir
        self._lock = threading.Lock()
        self._index: dict | None = None

    def _folder(self) -> Path:
        """The user folder, or, where it cannot be made, written, or others may write to it, a
        private one under the temporary folder (units there last as long as it does)."""
        folder = self.cache_dir if self.cache_dir is not None else user_dir()
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)   # private whatever the umask
            if os.name != "posix" or (os.access(folder, os.W_OK) and not folder.stat().st_mode & 0o022):
                return folder
            reason = "others may write to it" if os.access(folder, os.W_OK) else "it is not writable"
        except OSError as exc:
            reason = str(exc)
        private = Path(tempfile.gettempdir()) / f"matplan-kernels-{os.getuid()}"
        private.mkdir(mode=0o700, exist_ok=True)
        st = private.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o077:   # made by someone else: one of our own
            private = Path(tempfile.mkdtemp(prefix="matplan-kernels-"))
        if folder not in _WARNED:
            _WARNED.add(folder)
            warnings.warn(f"matplan: kernel cache {folder} not used ({reason}); compiled kernels go to "
                          f"{private}", RuntimeWarning, stacklevel=3)
        return private

    def _load(self) -> dict:
        index: dict = {}
        manifest = self.package_dir / MANIFEST
        records = []
        if manifest.is_file() and os.environ.get("MATPLAN_PREBUILT", "1") != "0":
            data = json.loads(manifest.read_text())
            if data.get("format") == FORMAT:
                records += [(self.package_dir, r) for r in data["units"]]
        folder = self._folder()   # binaries others could replace are never loaded (a private folder instead)
        if folder.is_dir():
            for path in sorted(folder.glob("*.json")):
                try:
                    record = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue   # a unit being written by another process, or damaged: compile again
                if record.get("format") == FORMAT:
                    records.append((folder, record))
        for folder, r in records:
            key = (r["file"], r["digest"], r["target"])
            index.setdefault(key, []).append((folder / r["binary"], r["names"]))
        return index

    def index(self) -> dict:
        with self._lock:
            if self._index is None:
                self._index = self._load()
            return self._index

    def find(self, filename: str, key_digest: str, names, targets) -> tuple | None:
        """(binary path, {name: lowered name}, target) of the first target's unit holding every
        one of ``names``, or None. A name without template arguments that a unit of the file
        does not list is an ``extern "C"`` kernel: its lowered name is itself."""
        index = self.index()
        for target in targets:
            for path, lowered in index.get((filename, key_digest, target), ()):
                if all(n in lowered or "<" not in n for n in names) and path.is_file():
                    return self._unpacked(path, key_digest), {n: lowered.get(n, n) for n in names}, target
        return None

    def _unpacked(self, path: Path, key_digest: str) -> Path:
        """A binary the driver can load: the package keeps them xz-compressed (a tenth of the
        size); the first use writes the plain file to the user folder."""
        if path.suffix != ".xz":
            return path
        folder = self._folder() / "prebuilt"
        plain = folder / f"{key_digest[:12]}-{path.stem}"
        if not plain.is_file():
            folder.mkdir(mode=0o700, exist_ok=True)
            _write_atomic(plain, lzma.decompress(path.read_bytes()))
        return plain

    def add(self, filename: str, key_digest: str, target: str, binary: bytes, lowered: dict) -> Path:
        """Keep a unit compiled on this machine in the user folder (atomic: a reader never sees a
        half-written unit) and index it."""
        folder = self._folder()
        stem = f"{Path(filename).stem}-{key_digest[:12]}-{target}-" + hashlib.sha256(
            "\0".join(sorted(lowered)).encode()).hexdigest()[:12]
        suffix = ".cubin" if target.startswith("sm_") else ".ptx"
        record = {"format": FORMAT, "file": filename, "digest": key_digest, "target": target,
                  "binary": stem + suffix, "names": lowered}
        for name, data in ((stem + suffix, binary), (stem + ".json", json.dumps(record).encode())):
            _write_atomic(folder / name, data)
        with self._lock:
            if self._index is not None:
                self._index.setdefault((filename, key_digest, target), []).append((folder / record["binary"], lowered))
        return folder / record["binary"]

    def forget(self) -> None:
        """Read the folders again on the next lookup (after another process added units)."""
        with self._lock:
            self._index = None


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: readers in other
    processes see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


#: Folders a warning was given for (once each).
_WARNED: set = set()


@functools.lru_cache(maxsize=None)
def default_store() -> Store:
    return Store()
