"""The on-disk format of a distributed CSR result: one ``.npz`` per block and a JSON index.

    <dir>/block-00000.npz ...   each block's rows of C, written by ``scipy.sparse.save_npz``
                                 (uncompressed; arrays ``indptr``, ``indices``, ``data``, ``shape``,
                                 ``format`` = "csr"), read back without pickle
    <dir>/index.json             {"format": "matplan-distributed-csr", "version": 1,
                                  "shape": [m, n], "dtype": "float64", "nnz": total,
                                  "bounds": [0, r1, ..., m],
                                  "blocks": [{"file", "rows": [r0, r1], "nnz", "sha256",
                                              "kernel", "reasons", "worker", "check_worst"}, ...]}

Blocks are written first and the index last (through a temporary name), so a folder with an
index is complete; loading checks every block's SHA-256, shape and nnz against it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

FORMAT = "matplan-distributed-csr"
VERSION = 1
INDEX = "index.json"
#: Fields of a block's record kept in the index besides its file, rows, nnz and digest.
BLOCK_FIELDS = ("kernel", "reasons", "worker", "check_worst")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def block_file(i: int) -> str:
    return f"block-{i:05d}.npz"


def write_block(folder: Path, i: int, C) -> dict:
    """Write block i (a SciPy CSR matrix); returns its file's record."""
    path = folder / block_file(i)
    sp.save_npz(path, sp.csr_matrix(C), compressed=False)
    return dict(file=path.name, nnz=int(C.nnz), sha256=_sha256(path))


def write_index(folder: Path, shape, dtype, bounds, records) -> Path:
    doc = dict(format=FORMAT, version=VERSION, shape=[int(x) for x in shape], dtype=np.dtype(dtype).name,
               nnz=sum(r["nnz"] for r in records), bounds=[int(b) for b in bounds], blocks=records)
    tmp = folder / (INDEX + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, folder / INDEX)
    return folder / INDEX


def read_index(folder) -> dict:
    """The index of a saved result, checked for its format and consistency (a ValueError naming what is wrong)."""
    folder = Path(folder)
    path = folder / INDEX
    if not path.is_file():
        raise FileNotFoundError(f"dir: {folder} holds no {INDEX} (not a saved DistributedCSR, or its save "
                                "did not finish)")
    doc = json.loads(path.read_text())
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"{path}: format {doc.get('format')!r} version {doc.get('version')!r}, "
                         f"expected {FORMAT!r} version {VERSION}")
    bounds, blocks = doc["bounds"], doc["blocks"]
    if len(bounds) != len(blocks) + 1 or bounds[0] != 0 or bounds[-1] != doc["shape"][0] or \
            any(b > c for b, c in zip(bounds, bounds[1:])):
        raise ValueError(f"{path}: bounds {bounds[:8]} do not cut {doc['shape'][0]} rows into {len(blocks)} blocks")
    return doc


def read_block(folder, doc: dict, i: int):
    """Block i of a saved result as a SciPy CSR matrix, its digest, shape and nnz checked."""
    rec = doc["blocks"][i]
    path = Path(folder) / rec["file"]
    if _sha256(path) != rec["sha256"]:
        raise ValueError(f"{path}: SHA-256 differs from the index (the file changed after it was saved)")
    C = sp.load_npz(path).tocsr()
    r0, r1 = doc["bounds"][i], doc["bounds"][i + 1]
    if C.shape != (r1 - r0, doc["shape"][1]) or C.nnz != rec["nnz"] or C.dtype != np.dtype(doc["dtype"]):
        raise ValueError(f"{path}: a {C.shape} {C.dtype} block of {C.nnz} nonzeros, the index says "
                         f"{(r1 - r0, doc['shape'][1])} {doc['dtype']} with {rec['nnz']}")
    return C
