"""The client's side of the runner path: a steady call on resident operands in one message per
worker, past the scheduler.

A task call costs several scheduler round trips (submit, the records' tasks, waiting, gathering:
~25 ms); one call of a Dask actor's method over a direct connection to its worker costs about
one. Each worker gets one :class:`~matplan.distributed.runner.Runner` per client, made on first
use and kept (:func:`runners`). :func:`run_calls` sends every worker its blocks at once and sorts
the answers: records, an operand "missing" or a runner unreachable (the caller then runs the call
through tasks, after freeing what the other runners kept), or a block's own error (raised).

Outputs stay in the runners' registries; the client refers to each by :class:`Held` (worker,
runner, token) inside a :class:`~matplan.distributed.blockset.BlockSet`, and frees them with
:func:`release_held` (on ``release()``, or when the object is garbage collected).
"""
from __future__ import annotations

import asyncio
import dataclasses
import uuid

from distributed import wait
from distributed.protocol import to_serialize

from .checks import BlockCheckError
from .runner import HeldBlockLost, Runner
from .tasks import DistributedProductError

#: How a call runs: "auto" (the runner path where every precondition holds, else tasks) or "tasks".
PATHS = ("auto", "tasks")
#: Seconds to wait for a new runner to start on its worker before the call runs through tasks.
RUNNER_START_S = 30.0
#: Where a client keeps its runners (an attribute of the client: they live as long as it does).
_ATTR = "_matplan_runners"


def check_path(path) -> str:
    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    return path


@dataclasses.dataclass(frozen=True)
class Held:
    """A block held by the runner ``runner`` (an actor key) on ``worker`` under ``token``."""
    worker: str
    runner: str
    token: str


class Fallback(Exception):
    """The runner path cannot run this call (an operand not where it was, a worker gone): use tasks."""


def call_token(what: str) -> str:
    return f"matplan-{what}-{uuid.uuid4().hex[:12]}"


def _rpc(client, worker):
    """A handler caller on ``worker``: a direct connection, or through the scheduler where the
    client was made with ``direct_to_workers=False`` (workers it cannot reach)."""
    if client.direct_to_workers is not False:
        return client.rpc(worker).actor_execute

    async def proxied(**msg):
        return await client.scheduler.proxy(worker=worker, msg=dict(msg, op="actor_execute"))
    return proxied


def alive(client, worker: str, runner: str) -> bool:
    """Whether ``runner`` is ``worker``'s runner as far as the client knows: its actor's future is
    still finished (it errs within milliseconds of the scheduler seeing the worker die). Asked
    before any message, since connecting to a dead worker waits for Dask's connect timeout."""
    f = getattr(client, _ATTR, {}).get(worker)
    return f is not None and f.key == runner and f.status == "finished"


def runners(client, workers) -> dict:
    """{worker: runner key} for ``workers``, each runner started on first use and kept on the
    client; Fallback where one cannot start (a worker not in the cluster, or not in time)."""
    cache = client.__dict__.setdefault(_ATTR, {})
    for w in [w for w, f in cache.items() if f.status != "finished"]:   # lost with its worker
        forget(client, w)
    todo = [w for w in dict.fromkeys(workers) if w not in cache]
    if todo:
        known = set(client.scheduler_info().get("workers", {}))
        gone = [w for w in todo if w not in known]
        if gone:
            raise Fallback(f"worker {gone[0]} is not in the cluster")
        started = {w: client.submit(Runner, actor=True, workers=[w], pure=False, key=call_token("runner"))
                   for w in todo}
        try:
            wait(list(started.values()), timeout=RUNNER_START_S)
        except TimeoutError:   # a worker busy for that long: this call runs through tasks
            pass
        for w, f in started.items():
            if f.status == "finished":
                cache[w] = f
            else:
                f.cancel()
        late = [w for w in todo if w not in cache]
        if late:
            raise Fallback(f"no runner started on {late[0]} within {RUNNER_START_S:g} s")
    return {w: cache[w].key for w in workers}


def forget(client, worker) -> None:
    """Drop ``worker``'s runner (unreachable): the next call starts another where the worker still is."""
    f = client.__dict__.get(_ATTR, {}).pop(worker, None)
    if f is not None:
        f.release()


#: Values that travel in a message as they are (msgpack); anything else is pickled (``to_serialize``).
_PLAIN = (str, int, float, bool, type(None))


def _plain(a) -> bool:
    if isinstance(a, (list, tuple)):
        return all(_plain(x) for x in a)
    return isinstance(a, _PLAIN)


def wire(a):
    """``a`` as a runner call's argument: plain values (strings, numbers, lists of them: the
    blocks' references) go as msgpack, which is cheaper than pickling each (tuples arrive as
    lists); arrays and objects are pickled."""
    return a if _plain(a) else to_serialize(a)


def call_all(client, calls) -> list:
    """Run ``(worker, runner, method, args)`` calls at once; per call ("ok", result), ("lost",
    exception: the worker or its runner unreachable) or ("error", exception raised by the method)."""
    async def one(worker, runner, method, args):
        if not alive(client, worker, runner):
            return "lost", HeldBlockLost(f"no runner {runner} on {worker} (the worker left, or it was replaced)")
        try:
            reply = await _rpc(client, worker)(actor=runner, function=method,
                                               args=[wire(a) for a in args], kwargs={})
        except Exception as e:   # a closed comm, a refused connection, no such actor: unreachable
            return "lost", e
        if reply.get("status") == "OK":
            return "ok", reply["result"]
        return "error", reply.get("exception")

    async def every():
        return await asyncio.gather(*(one(*c) for c in calls))
    return client.sync(every)


def run_calls(client, per_worker: dict, what: str, keys: dict | None = None) -> dict:
    """{worker: (runner key, result)} of ``per_worker`` {worker: (method, args, tokens it keeps)}
    on the runners (``keys``: their keys where the caller has them).

    Raises Fallback (after freeing whatever the runners kept for this call) where an operand was
    missing or a runner unreachable; a method's own error (a block failing its check, bad input) is
    raised as it is, after the same freeing."""
    keys = keys or runners(client, per_worker)
    order = list(per_worker)
    outcomes = call_all(client, [(w, keys[w], per_worker[w][0], per_worker[w][1]) for w in order])
    out, why, error = {}, None, None
    for w, (status, value) in zip(order, outcomes):
        if status == "lost":
            forget(client, w)
            why = why or f"the runner on {w} could not be reached ({type(value).__name__}: {value})"
        elif status == "error":   # as the tasks say it: a check failure as it is, anything else wrapped
            if error is None:
                error = value if isinstance(value, BlockCheckError) else DistributedProductError(
                    f"{what}: a block failed on {w}: {type(value).__name__}: {value}")
                error.__cause__ = None if error is value else value
        elif "missing" in value:
            why = why or f"{value['missing'][0][1]} is not on {w}"
        else:
            out[w] = value
    if why is not None or error is not None:
        release_held(client, [Held(w, keys[w], t) for w in out for t in per_worker[w][2]])
        if error is not None:
            raise error
        raise Fallback(f"{what}: {why}")
    return {w: (keys[w], v) for w, v in out.items()}


def _send_later(client, method: str, groups: dict) -> None:
    """Call ``method(values)`` on runners {(worker, runner key): values} without waiting for the
    answers (safe from a finalizer in any thread); a worker that is gone is skipped."""
    if not groups or client is None or client.status != "running":
        return

    async def go():
        for (w, r), values in groups.items():
            if not alive(client, w, r):
                continue
            try:
                await _rpc(client, w)(actor=r, function=method, args=[values], kwargs={})
            except Exception:   # the worker or its runner is gone, and what it held with it
                pass
    try:
        client.loop.add_callback(go)
    except RuntimeError:   # the client's loop has closed
        pass


def release_held(client, handles) -> None:
    """Free held blocks on their runners, without waiting."""
    groups = {}
    for h in handles or ():
        if isinstance(h, Held):
            groups.setdefault((h.worker, h.runner), []).append(h.token)
    _send_later(client, "release", groups)


def start_runners(client) -> None:
    """Start a runner on every worker of ``client`` that has none (a pin right after a broadcast
    then waits for no start); a worker where one cannot start is left to :func:`pin`."""
    try:
        runners(client, list(client.scheduler_info().get("workers", {})))
    except Fallback:
        pass


def pin(client, key) -> list:
    """Have every worker's runner pin replicated operand ``key`` now, before Dask's memory manager
    drops the broadcast copies; returns the workers whose runner answered that its copy was not
    there (dropped already: a new broadcast helps; an unreachable runner is not named, since it
    would not). A worker without a runner that cannot start one is skipped (its first runner call
    finds the operand missing and that call runs through tasks)."""
    try:
        keys = runners(client, list(client.scheduler_info().get("workers", {})))
    except Fallback:
        return []
    order = list(keys)
    outcomes = call_all(client, [(w, keys[w], "pin", ([key],)) for w in order])
    return [w for w, (status, found) in zip(order, outcomes) if status == "ok" and not found]


def unpin(client, keys) -> None:
    """Let every runner of ``client`` go of the replicated operands ``keys``, without waiting."""
    cache = getattr(client, _ATTR, {}) if client is not None else {}
    if keys:
        _send_later(client, "unpin", {(w, f.key): list(keys) for w, f in cache.items()})


def apply_held(client, held: dict, fn) -> dict:
    """{i: fn(block)} for held blocks {i: Held}, one call per runner, the runners at once;
    {i: HeldBlockLost} where a block (or its runner) is not there any more."""
    groups = {}
    for i, h in held.items():
        groups.setdefault((h.worker, h.runner), []).append(i)
    calls = [(w, r, "apply", ([held[i].token for i in idx], fn)) for (w, r), idx in groups.items()]
    out = {}
    for ((w, _), idx), (status, value) in zip(groups.items(), call_all(client, calls)):
        if status == "ok":
            out.update(zip(idx, value))
            continue
        if status == "lost":
            forget(client, w)
        elif not isinstance(value, HeldBlockLost):
            raise value
        out.update((i, HeldBlockLost(f"held block {held[i].token} is not on {w}")) for i in idx)
    return out
