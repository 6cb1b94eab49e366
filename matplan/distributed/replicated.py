"""Operands sent once to every worker and kept there: ``replicate(B)`` for SpGEMM's B, or a dense
X for SpMM, reused by any number of products without being sent again.

A :class:`Replicated` is one ``client.scatter(..., broadcast=True)`` future of a worker-side
:class:`~matplan.distributed.worker.Operand` (the value, SpGEMM's row sums of B, a token). Dask's
active memory manager later drops the copies no task waits for; each worker's runner pins the copy
it uses (:mod:`matplan.distributed.runner`) until the operand is released or collected. Each
worker copies it to its GPU on first use and keeps the copy as long as the operand lives; plans
made for a resident block of A with it are kept on that block under its token. The client keeps
a reference to the host value (``keep_source``, the default: no copy of a SciPy/NumPy input) so
that an operand lost with every worker that held it is sent again; without it that is a clear
error. Also here: the checks every operand passes once, on the client.
"""
from __future__ import annotations

import weakref

import numpy as np
import scipy.sparse as sp

from ..core import validation
from ..core.validation import SUPPORTED_DTYPES
from ..core.xp import is_gpu_array, to_host
from .checks import RowSums
from .fastpath import pin, start_runners, unpin
from .tasks import DistributedProductError, Live, resolve_client
from .worker import Operand


def sparse_operand(M, name: str):
    """``M`` as a host SciPy CSR matrix of float32/float64, its structure checked; a clear error otherwise."""
    H = to_host(M)
    if not sp.issparse(H):
        raise TypeError(f"{name}: expected a sparse matrix (SciPy or cupyx), got {type(M).__name__}")
    H = H.tocsr()
    if np.dtype(H.dtype) not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: expected float32 or float64 values, got {H.dtype} (cast it with {name}.astype)")
    validation.check_csr(H, name)
    return H


def dense_operand(X, name: str, rows: int | None = None):
    """``X`` as a host NumPy array of float32/float64 of 1 or 2 dimensions (``rows`` of them where given)."""
    H = np.asarray(to_host(X))
    if H.ndim not in (1, 2) or (rows is not None and H.shape[0] != rows):
        want = "1 or 2 dimensions" if rows is None else f"shape ({rows},) or ({rows}, k)"
        raise ValueError(f"{name}: expected {want}, got {H.shape}")
    if np.dtype(H.dtype) not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: expected float32 or float64 values, got {H.dtype} (cast it with {name}.astype)")
    return H


#: Broadcasts of a replicated operand until every worker's runner pinned its copy (Dask's active
#: memory manager may drop copies between the broadcast and the pin); past them, a worker without
#: one runs its blocks through tasks.
PIN_ATTEMPTS = 3


class Replicated:
    """A sparse B (SpGEMM) or dense X (SpMM) on every worker of ``client``, sent once.

    ``shape``, ``dtype``, ``sparse``, ``nbytes`` (host bytes sent to each worker), ``gpu_input``
    (the caller gave a CuPy array); ``future()`` the live Dask future (sent again if every copy
    was lost and the source is kept); ``release()`` / a with-block frees it on the workers."""

    def __init__(self, M, *, client=None, keep_source: bool = True, name: str | None = None, pin_copies: bool = True):
        self.client = resolve_client(client)
        self.sparse = bool(sp.issparse(M) or (is_gpu_array(M) and hasattr(M, "indptr")))
        self.name = name or ("B" if self.sparse else "X")
        H = sparse_operand(M, self.name) if self.sparse else dense_operand(M, self.name)
        self.shape, self.dtype = tuple(H.shape), np.dtype(H.dtype)
        self.gpu_input = is_gpu_array(M)
        self.indptr = np.asarray(H.indptr) if self.sparse else None   # B's row lengths balance A's blocks
        self._operand = Operand(H, RowSums.of(H) if self.sparse else None)
        self.token = self._operand.token
        self.nbytes = self._operand.nbytes
        self._keys = []   # every key it was scattered under: runners that pinned it let go on release
        self._pin = pin_copies   # for the runners' calls; a call through tasks only has Dask move it where needed
        self._live = Live(self._scatter)
        self._live.get()
        self._finalizer = weakref.finalize(self, unpin, self.client, self._keys)
        self._finalizer.atexit = False
        if not keep_source:
            self._operand = None

    def _scatter(self):
        if self._operand is None:
            raise DistributedProductError(f"{self.name} (replicated with keep_source=False) was lost with every "
                                          "worker that held it; replicate it again")
        if self._pin:   # runners started first: the pin then follows the broadcast within milliseconds
            start_runners(self.client)
        for attempt in range(PIN_ATTEMPTS):
            f = self.client.scatter(self._operand, broadcast=True, hash=False)
            self._keys.append(f.key)
            # every scatter, a lost operand's new key too: else the memory manager drops its copies;
            # one it dropped before the pin is sent again (else the runners would miss it there)
            if not self._pin or not pin(self.client, f.key) or attempt == PIN_ATTEMPTS - 1:
                return f
            unpin(self.client, [self._keys.pop()])
            f.release()

    def future(self):
        """The operand's future on the workers (sent again where every copy was lost)."""
        if self._live is None:
            raise DistributedProductError(f"this replicated {self.name} was released")
        return self._live.get()

    @property
    def remade(self) -> int:
        """How many times the operand was sent again after being lost."""
        return 0 if self._live is None else self._live.remade

    def release(self) -> None:
        if self._live is not None:
            self._live.release()
            self._finalizer()
        self._live = self._operand = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._live is None else "on every worker"
        kind = "sparse" if self.sparse else "dense"
        return (f"<Replicated {kind} {self.name} {'x'.join(f'{d:,}' for d in self.shape)} {self.dtype} "
                f"({self.nbytes:,} bytes) {state}>")


def replicate(M, *, client=None, keep_source: bool = True) -> Replicated:
    """Send ``M`` (SpGEMM's sparse B, or SpMM's dense X) once to every worker and keep it there:
    pass the result to :func:`spgemm` / :func:`spmm` as often as you like. keep_source: keep a
    reference to M's host data on the client (a copy for a CuPy M) so a copy lost with every
    worker is sent again; False lets it go (a lost operand is then an error)."""
    return Replicated(M, client=client, keep_source=keep_source)
