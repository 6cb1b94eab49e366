"""The runner: one long-lived Dask actor per worker that runs a steady call's blocks of that worker
in one message, without the scheduler.

A steady product on resident operands needs nothing Dask's scheduler offers: the operands are
already on known workers and nothing new has to be placed. The client therefore sends each worker's
runner one message (``Worker.actor_execute`` over a direct connection) naming the blocks it holds
(Dask keys of resident blocks in ``worker.data``, or tokens of blocks a runner made earlier); the
runner finds them in its worker's memory, runs the same block functions as the tasks
(:func:`~matplan.distributed.block_tasks.spgemm_block`, :func:`~matplan.distributed.block_tasks.spmm_block`),
keeps the output blocks in its own registry under tokens and returns only the records. An operand
missing from the worker is the answer "missing", never an exception: the client then runs the call
through tasks. Client side: :mod:`matplan.distributed.fastpath`.

Methods that only read the registry (``fetch``, ``release``, ``has``) are coroutines: they run on
the worker's event loop, so a runner busy computing (its one actor thread) still answers its peers
assembling a distributed X, and two runners fetching from each other cannot deadlock.
"""
from __future__ import annotations

import asyncio
import threading
import time

from distributed import get_worker
from distributed.utils import sync

from .block_tasks import gather_operand, spgemm_block, spmm_block
from .worker import Block, Operand, block_info


class HeldBlockLost(RuntimeError):
    """A block held by a runner is not there (its worker was replaced, or it was released)."""


def _kind(ref) -> str:
    return ref[0]


def _key(key):
    """A Dask key as the worker stores it: a tuple key arrives as a list (messages are msgpack)."""
    return tuple(_key(k) for k in key) if isinstance(key, list) else key


class Runner:
    """What one worker runs for the fast path, and the output blocks it holds (``held``: token -> Block).

    A reference to a block is ``("data", key)`` (a Dask future's value in this worker's memory) or
    ``("held", token)`` (a block this runner made)."""

    def __init__(self):
        self.worker = get_worker()
        self.address = self.worker.address
        self.held = {}
        self.pinned = {}   # Dask key -> replicated Operand, kept until the client releases it
        self._lock = threading.Lock()

    # -- finding operands --------------------------------------------------------------------
    def _lookup(self, ref, kind=Block):
        """The object ``ref`` names on this worker, or None where it is not here (or not a ``kind``).

        A replicated operand met here is pinned: Dask's active memory manager drops the copies of
        a broadcast key that no task waits for, and the next call would find it gone."""
        if _kind(ref) == "held":
            with self._lock:
                obj = self.held.get(ref[1])
        else:
            key = _key(ref[1])
            try:
                obj = self.worker.data[key]
            except KeyError:
                obj = self.pinned.get(key)
            if isinstance(obj, Operand):
                with self._lock:
                    self.pinned[key] = obj
        return obj if isinstance(obj, kind) else None

    def _find(self, refs, kind=Block):
        """(objects, missing refs) for ``refs`` on this worker."""
        found = [self._lookup(r, kind) for r in refs]
        return found, [r for r, obj in zip(refs, found) if obj is None]

    def _keep(self, token: str, blocks) -> None:
        with self._lock:
            for b in blocks:
                self.held[f"{token}-{b.index}"] = b

    # -- products (the actor's thread) ---------------------------------------------------------
    def spgemm(self, token: str, items, b_ref, on: str, measure, spill_bytes) -> dict:
        """C's blocks for ``items`` [(index, r0, r1, ref of A's block)] with the replicated B named
        ``b_ref``: planned where their resident block has no plan for B yet, run, checked by row
        sums (a failed check raises BlockCheckError and nothing is kept). Returns {"records"} or
        {"missing"}."""
        (B,), missing = self._find([b_ref], Operand)
        blocks, more = self._find([it[3] for it in items])
        if missing or more:
            return dict(missing=missing + more, worker=self.address)
        out = [spgemm_block(i, r0, r1, a, B, on, measure, spill_bytes)
               for (i, r0, r1, _), a in zip(items, blocks)]
        for b in out:
            b.meta["path"] = "runner"
        self._keep(token, out)
        return dict(records=[block_info(b) for b in out])

    def spmm(self, token: str, items, x_spec, on: str, reuse: int, measure, keep: bool) -> dict:
        """Y's blocks for ``items`` [ref of A's block] with the bound plan each keeps. ``x_spec``:
        ("value", X) sent with the call, ("ref", ref) a replicated X here, or ("parts", token,
        [(worker, runner key, ref)]) a distributed X assembled here from its row blocks (those of
        other workers fetched from their runners). ``keep``: Y's blocks stay in the registry and
        the records come back; otherwise (Y on the host, record) per block. Returns {"records"} /
        {"results"}, or {"missing"}."""
        blocks, missing = self._find(items)
        if missing:
            return dict(missing=missing, worker=self.address)
        t = time.perf_counter()
        X, missing = self._operand(x_spec, on)
        if missing:
            return dict(missing=missing, worker=self.address)
        operand_s = time.perf_counter() - t
        out = [spmm_block(a, X, on, reuse, measure, keep) for a in blocks]
        for n, o in enumerate(out):
            meta = o.meta if keep else o[1]
            meta.update(path="runner", operand_s=operand_s if n == 0 else 0.0)
        if not keep:
            return dict(results=out)
        self._keep(token, out)
        return dict(records=[block_info(b) for b in out])

    def _operand(self, spec, on):
        """(X as an Operand where this worker computes, missing refs)."""
        if spec[0] == "value":
            return Operand(spec[1]), []
        if spec[0] == "ref":
            (X,), missing = self._find([spec[1]], Operand)
            return X, missing
        _, token, parts = spec
        got, missing = [None] * len(parts), []
        remote = {}
        for n, (w, runner, ref) in enumerate(parts):
            if w == self.address:
                got[n] = self._lookup(ref)
                if got[n] is None:
                    missing.append(ref)
            else:
                remote.setdefault((w, runner), []).append(n)
        if remote and not missing:
            fetched = sync(self.worker.loop, self._fetch_all, remote, parts)
            for n, b in fetched.items():
                got[n] = b
                if b is None:
                    missing.append(parts[n][2])
        if missing:
            return None, missing
        return gather_operand(on, token, *got), []

    async def _fetch_all(self, remote, parts) -> dict:
        """{part: Block or None} fetched from the runners of other workers (None: not there, or unreachable)."""
        async def one(w, runner, ns):
            try:
                reply = await self.worker.rpc(w).actor_execute(actor=runner, function="fetch",
                                                               args=[[parts[n][2] for n in ns]], kwargs={})
            except Exception:   # the peer is gone or has no runner: the part is missing
                return dict.fromkeys(ns)
            got = reply.get("result") if reply.get("status") == "OK" else None
            return dict(zip(ns, got)) if got is not None else dict.fromkeys(ns)
        out = {}
        for d in await asyncio.gather(*(one(w, r, ns) for (w, r), ns in remote.items())):
            out.update(d)
        return out

    # -- reading and freeing (the worker's event loop, or the actor's thread for apply) ----------
    async def fetch(self, refs) -> list:
        """The blocks ``refs`` name (None where not here), sent as host data."""
        return [self._lookup(r) for r in refs]

    async def has(self, tokens) -> list:
        with self._lock:
            return [t in self.held for t in tokens]

    async def release(self, tokens) -> int:
        """Forget the held blocks ``tokens`` (unknown ones are ignored); returns how many went."""
        with self._lock:
            return sum(self.held.pop(t, None) is not None for t in tokens)

    async def pin(self, keys) -> int:
        """Pin the replicated operands ``keys`` found in this worker's memory; returns how many."""
        return sum(self._lookup(("data", k), Operand) is not None for k in keys)

    async def unpin(self, keys) -> int:
        """Let go of the replicated operands ``keys`` (their client released them)."""
        with self._lock:
            return sum(self.pinned.pop(_key(k), None) is not None for k in keys)

    def apply(self, tokens, fn) -> list:
        """``fn(block)`` for each held block (a block's rows to the host, its location, its plans);
        HeldBlockLost where one is not here."""
        with self._lock:
            blocks = [self.held.get(t) for t in tokens]
        for t, b in zip(tokens, blocks):
            if b is None:
                raise HeldBlockLost(f"held block {t} is not on {self.address}")
        return [fn(b) for b in blocks]

    def info(self) -> dict:
        with self._lock:
            return dict(worker=self.address, held=len(self.held), pinned=len(self.pinned),
                        nbytes=sum(b.nbytes for b in self.held.values()))


def held_block(runner: str, token: str) -> Block:
    """A task's view of block ``token`` held by this worker's runner (the same object, no copy): how
    a runner's output becomes a Dask future for the task path; HeldBlockLost where it is not here."""
    actor = get_worker().state.actors.get(runner)
    block = None if actor is None else actor.held.get(token)
    if block is None:
        raise HeldBlockLost(f"held block {token} is not on {get_worker().address}")
    return block
