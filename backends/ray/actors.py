"""hcc.backends.ray.actors — the Ray actors: a rank (:class:`RankActorImpl`: a mailbox in its event
loop, the runtime in a worker thread), a stand-alone mailbox, and a named group's coordinator.

Terms
- step: one iteration of one rank, one actor call; the driver's round trip between steps is
  the barrier. A step's error travels back as a record (:func:`pack_error`), since hcc's
  errors do not rebuild from their ``args``.
- die_at: fault injection for tests and benchmarks — the rank SIGKILLs itself after its
  ``die_at``-th data chunk (adaptive runs, through the runtime's ``progress`` hook) or at its
  ``die_at + 1``-th send (static runs, through backends/testing.py's ``KillSwitch``).
"""
from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from typing import Any

import numpy as np

from ..base import RuntimeFault, Transport
from .transport import SOCKETS_GROUP, MailboxCore, RayTransport, import_ray, is_actor_death
from .watched import WatchedTransport, sockets_transport

__all__ = ["RankActorImpl", "remote_class", "pack_error", "unpack_error", "cause_of"]

class RankActorImpl(MailboxCore):
    """One rank: a mailbox in the event loop, the executor in a worker thread. One call of
    ``step`` is one iteration; the driver's round trip between iterations is the barrier."""

    def __init__(self):
        self._mb_init()
        self._comms: dict[str, Transport] = {}  # session -> its transport (either data path)

    async def step(self, plan, rank: int, handles: list, session: str, it: int, x, *,
                   last: bool, timeout: float, step: int, data: str,
                   rendezvous: str | None, token: str | None, die_at: int | None = None,
                   delay: float = 0.0, options: dict | None = None) -> tuple | dict:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                None, self._step_sync, plan, rank, handles, session, it, x, last, timeout,
                step, data, rendezvous, token, die_at, delay, options or {})
        except Exception as e:  # hcc's errors do not pickle by their args; send a record
            return pack_error(e)

    def _step_sync(self, plan, rank, handles, session, it, x, last, timeout, step, data,
                   rendezvous, token, die_at, delay, options):
        from ..adaptive import close_session
        from ..runtime import engine, run as execute

        t_enter, wall_enter = time.perf_counter(), time.time()
        comm = self._comms.get(session)
        if comm is None:
            if data == "sockets":
                inner = sockets_transport(rank, plan.n, rendezvous, token, timeout)
                comm = WatchedTransport(inner, handles, session)
            else:  # the driver's store holds only the agreement log here
                comm = RayTransport(rank, plan.n, handles, session, store=rendezvous,
                                    token=token, group=SOCKETS_GROUP, timeout=timeout)
            self._comms[session] = comm
        options = dict(options)
        runner = comm
        if die_at is not None:  # fault injection (tests, benchmarks): backends/testing.py
            from ..testing import KillSwitch, kill_after_chunks

            if engine(plan, comm, options) == "adaptive":
                options["progress"] = kill_after_chunks(die_at)  # at the die_at-th data chunk
            else:
                runner = KillSwitch(comm, after_sends=die_at)  # at its (die_at + 1)-th send
        ok = False
        try:
            if delay > 0:
                time.sleep(delay)  # a late arrival (tests, benchmarks)
            if die_at is not None and die_at <= 0:
                os.kill(os.getpid(), signal.SIGKILL)
            out = execute(plan, runner, x, timeout=timeout, step=step, **options)
            elapsed = time.perf_counter() - t_enter
            wall_exit = time.time()
            ok = True
        finally:
            if last or not ok:
                self._comms.pop(session, None)
                close_session(comm)
                comm.close()
        info = None
        if hasattr(out, "contributors"):  # an AdaptiveResult: what the survivors agreed on
            info = {k: getattr(out, k) for k in
                    ("contributors", "missing", "late", "dead", "generation", "stats")}
        return (np.asarray(out) if last else None), (elapsed, wall_enter, wall_exit), info

    async def pid(self) -> int:
        return os.getpid()


class _MailboxImpl(MailboxCore):
    """A stand-alone mailbox: the one a user's actor gets from :func:`init_group`."""

    def __init__(self):
        self._mb_init()


class _GroupImpl:
    """The named coordinator actor of :func:`init_group`: collects every rank's mailbox handle
    and hands the full list back once all ``world`` ranks joined, with the address and token
    of the rendezvous store it serves, which holds the group's agreement log (outside every
    member, so any member may die). It watches every member's mailbox and appends
    ``dead(r)`` to the log as soon as Ray reports member r's death."""

    def __init__(self, world: int, session: str):
        from ..rendezvous import StoreServer

        self.world, self.session = world, session
        self.handles: list = [None] * world
        self.joined = asyncio.Event()
        self.token = secrets.token_hex(16)
        self.server = StoreServer(self.token, "127.0.0.1", 0)
        self._log = None
        self._watchers: list = []

    async def join(self, rank: int, boxed_handle: list) -> dict:
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside 0..{self.world - 1}")
        self.handles[rank] = boxed_handle[0]
        if all(h is not None for h in self.handles):
            self.joined.set()
        await self.joined.wait()
        if not self._watchers:
            self._watchers = [asyncio.ensure_future(self._watch(r)) for r in range(self.world)]
        return {"handles": list(self.handles), "store": self.server.address,
                "token": self.token}

    async def _watch(self, r: int) -> None:
        try:
            await self.handles[r].watch.remote(self.session)
        except Exception as e:
            if not is_actor_death(e):
                raise
            from ..agreement import EventLog, log_group

            if self._log is None:
                self._log = EventLog(self.server.address, self.token, log_group(SOCKETS_GROUP), world=self.world)
            self._log.report_dead(r)

    async def size(self) -> int:
        return self.world


_actor_classes: dict[str, Any] = {}


def remote_class(name: str):
    """The Ray actor classes, made on first use (Ray imported lazily)."""
    if not _actor_classes:
        ray = import_ray()
        _actor_classes["rank"] = ray.remote(RankActorImpl)
        _actor_classes["mailbox"] = ray.remote(_MailboxImpl)
        _actor_classes["group"] = ray.remote(_GroupImpl)
    return _actor_classes[name]


def pack_error(e: BaseException) -> dict:
    """A picklable record of an exception raised in an actor (hcc's errors take several
    constructor arguments, so Ray cannot rebuild them from ``args``)."""
    fields = {k: v for k, v in vars(e).items() if isinstance(v, (int, float, str, type(None)))}
    return {"hcc_error": True, "module": type(e).__module__, "cls": type(e).__qualname__,
            "message": str(e), "fields": fields}


def unpack_error(rec: dict) -> BaseException:
    import importlib

    cls = None
    if rec["module"].startswith(("hcc.", "ray.")):
        try:
            cls = getattr(importlib.import_module(rec["module"]), rec["cls"], None)
        except ImportError:
            cls = None
    if not (isinstance(cls, type) and issubclass(cls, RuntimeFault)):
        return RuntimeFault(f"{rec['cls']}: {rec['message']}")
    err = cls.__new__(cls)
    Exception.__init__(err, rec["message"])
    err.__dict__.update(rec["fields"])
    return err


def cause_of(e: BaseException) -> BaseException:
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e
