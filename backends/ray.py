"""hcc.backends.ray — the ``ray`` backend: Ray actors for placement, rendezvous and failure
detection; plan data over Ray's object store or over the sockets transport.

Terms
- *rank actor*: one Ray actor per rank (:class:`ActorGroup` makes them); it runs the executor
  for its rank in a worker thread while its asyncio loop serves its *mailbox*.
- *mailbox*: the async actor methods ``put``/``take``/``watch``/``close_session`` (the
  :class:`_MailboxCore` mixin) through which the object-store transport delivers messages: the
  sender ``ray.put``s the bytes and posts ``[ref]`` to the receiver's mailbox; the receiver's
  pending ``take`` returns the boxed ref, whose object it copies into the destination slice.
  Rank actors are their own mailboxes; a user's actors (:func:`init_group`) get a small
  mailbox actor each.
- *session*: one :meth:`ActorGroup.run` call on the sockets path (all its iterations share
  one sockets transport and one agreement session); one iteration on the object-store path.
  Tags repeat between iterations, so an object-store message is keyed ``(session, src, tag,
  seq)``, ``seq`` counting the messages of that ``(src, tag)``.
- *data path*: ``"objects"`` (the object store, :class:`RayTransport`) or ``"sockets"``
  (``hcc.backends.sockets.connect`` between the actors, authenticated by a per-run token and
  watched by Ray for deaths). docs/backends.md gives the measurements that chose the default.
- *coordinator*: the driver's side of a sockets-path call (:class:`_Coordinator`): it serves
  the rendezvous store, and in it the agreement log of backends/agreement.py, outside every
  rank, so the death of any rank (rank 0 included) is survivable.

Failure detection is Ray's: every transport holds, per peer, a pending ``watch`` call on the
peer's mailbox. When a peer actor dies, Ray fails that call with ``ActorDiedError`` and the
transport raises :class:`~hcc.backends.base.PeerFailed` from ``wait_any`` at once — survivors do
not wait for their deadline. The driver (:meth:`ActorGroup.run`) sees the dead actor's own call
fail the same way (measured: 8–10 ms after the SIGKILL on this machine) and raises
:class:`~hcc.backends.base.RankFailed` naming it.

Surviving deaths (``on_failure = continue``, sockets path): the rank actors run the adaptive
runtime (backends/adaptive/), which needs a transport that declares ``agreement`` — the
watched sockets transport hands on the driver's store. Agreement on who died: the driver
appends ``dead(r)`` to the log as soon as Ray fails rank r's step (``EventLog.report_dead``,
which keeps one event per death however many reporters); each rank also reports the deaths its
own transport sees (an EOF on a connection: microseconds after a SIGKILL; or a watch Ray
failed). Every survivor folds the same log, so all repair the same trees; the driver returns
``None`` for the dead ranks and the survivors' outputs with ``contributors``/``missing``. A
rank that died before it published its address gets a refusing one from the driver, so the
others' ``connect`` does not wait for it.

Loopback only: Ray binds its servers to the node address, and resolves ``127.0.0.1`` to the
machine's external address unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (ray_constants
``ENABLE_RAY_CLUSTER``) — measured with ``ss -ltn``: without it the GCS, raylet and workers
listened on ``*`` and the agents on eth0; with it, only on 127.0.0.1. :func:`local_cluster`
sets it before Ray is imported.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .rendezvous import free_port
from .base import (
    CollectiveTimeout,
    PeerFailed,
    RankFailed,
    Request,
    RootFailed,
    RuntimeFault,
    Transport,
    register,
)
from .base import Capabilities

__all__ = [
    "ActorGroup", "RayTransport", "available", "destroy_group", "init_group", "local_cluster",
    "run", "run_local",
]

_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# ray.wait slices inside wait_any: deaths are noticed through the watch refs inside the same
# ray.wait, so the slice only bounds how late a deadline is noticed (0.25 s on a 60 s deadline).
_SLICE_S = 0.25
# RayTransport.wait_change polls the adaptive executor's wake-up condition this often: a log
# event (a death, an arrival) reaches a waiting rank at most 20 ms late, against ~1-5 ms per
# object-store message here.
_CHANGE_SLICE_S = 0.02
# The driver grants every run this much beyond the per-wait deadline before it gives up on
# actors that neither answer nor die (actor start-up on this 2-core machine: ~1 s each).
_DRIVER_GRACE_S = 30.0
# How long a transport error waits for Ray to confirm a peer's death before it is reported as
# itself: in test_ray's fault tests the whole failed run ended 0.5-1.4 s after the SIGKILL.
_DEATH_GRACE_S = 2.0
DATA_PATHS = ("objects", "sockets")
# The sockets transport's group (sockets.connect's default): its rendezvous keys and, through
# agreement.log_group, the agreement log's keys live under it in the driver's store.
_SOCKETS_GROUP = "hcc"
# Closed session ids a mailbox remembers (one per iteration; a few hundred bytes in all).
_ENDED_KEPT = 4096


def _ray():
    for k, v in _LOOPBACK_ENV.items():
        os.environ.setdefault(k, v)
    import ray

    return ray


def available() -> bool:
    """True when Ray imports."""
    try:
        _ray()
    except Exception:  # an absent or broken Ray install: the backend is simply unavailable
        return False
    return True


@contextmanager
def local_cluster(num_cpus: int | None = None, **init_kw):
    """A local Ray cluster on loopback for the body, unless Ray is already initialised (then the
    existing one is used and left running). Shuts down only what it started."""
    ray = _ray()
    started = False
    if not ray.is_initialized():
        ray.init(
            address="local",  # a new cluster even when another one runs on this machine
            num_cpus=num_cpus or max(2, os.cpu_count() or 2),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=init_kw.pop("log_to_driver", False),
            configure_logging=init_kw.pop("configure_logging", False),
            **init_kw,
        )
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


# --------------------------------------------------------------------------- the mailbox

class _MailboxCore:
    """Async mailbox methods shared by rank actors and stand-alone mailbox actors. Runs in the
    actor's event loop only, so its dicts need no lock."""

    def _mb_init(self) -> None:
        self._slots: dict[tuple, list] = {}
        self._waiting: dict[tuple, asyncio.Future] = {}
        self._closed: dict[str, asyncio.Event] = {}
        # Sessions already closed, so a peer's watch that arrives late (a broadcast leaf may
        # finish before another leaf has started) returns at once instead of pending forever.
        self._ended: OrderedDict[str, None] = OrderedDict()

    def _event(self, session: str) -> asyncio.Event:
        ev = self._closed.get(session)
        if ev is None:
            ev = self._closed[session] = asyncio.Event()
        return ev

    async def put(self, session: str, src: int, tag: int, seq: int, boxed: list) -> bool:
        if session in self._ended:
            return True  # a message nobody will take (a repair dropped its receive): let it go
        key = (session, src, tag, seq)
        fut = self._waiting.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(boxed)
        else:
            self._slots[key] = boxed
        return True

    async def take(self, session: str, src: int, tag: int, seq: int) -> list:
        key = (session, src, tag, seq)
        if key in self._slots:
            return self._slots.pop(key)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[key] = fut
        return await fut

    async def watch(self, session: str) -> bool:
        """Returns when this rank closes ``session``; fails with ActorDiedError if it dies."""
        if session not in self._ended:
            await self._event(session).wait()
        return True

    async def close_session(self, session: str) -> int:
        self._event(session).set()
        stale = [k for k in self._slots if k[0] == session]
        for k in stale:
            del self._slots[k]
        for k in [k for k in self._waiting if k[0] == session]:
            fut = self._waiting.pop(k)
            if not fut.done():
                fut.cancel()
        self._closed.pop(session, None)
        self._ended[session] = None
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)
        return len(stale)

    async def ping(self) -> int:
        return os.getpid()


# --------------------------------------------------------------------------- the transport

def _reap_watch(transport, ref) -> None:
    """A peer's watch task has ended: the peer's actor died (raise PeerFailed and remember it)
    or the watch ended normally. ``transport`` has ``_ray_mod``, ``_watch`` (ref -> peer),
    ``_dead`` and ``rank`` — both Ray transports below."""
    peer = transport._watch.pop(ref)
    try:
        transport._ray_mod.get(ref)
    except Exception as e:
        if _is_actor_death(e):
            transport._dead.add(peer)
            raise PeerFailed(transport.rank, peer, "Ray reports its actor died") from None
        raise


class RayRequest(Request):
    __slots__ = ("ref", "peer", "tag", "what", "buf", "keep", "done", "nbytes")

    def __init__(self, ref, peer: int, tag: int, what: str, buf: memoryview, keep=None):
        self.ref, self.peer, self.tag, self.what, self.buf, self.keep = ref, peer, tag, what, buf, keep
        self.nbytes = buf.nbytes
        self.done = False

    def describe(self) -> str:
        return f"{self.what} tag {self.tag}, {self.nbytes} B"


def _bytes_view(view) -> memoryview:
    mv = view if isinstance(view, memoryview) else memoryview(view)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def _is_actor_death(e: BaseException) -> bool:
    ray = _ray()
    return isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError))


@register
class RayTransport(Transport):
    """Plan messages over Ray's object store, between the mailboxes of one session.

    ``mailboxes[r]`` is rank r's mailbox handle (an actor with the :class:`_MailboxCore`
    methods). A send completes when the receiver's mailbox holds the message (the bytes were
    copied into the object store by ``ray.put``, so the source range is free at once); a
    receive completes when the bytes are in the destination slice."""

    name = "ray"
    # actors enter a collective when their tasks reach it; the agreement log needs the
    # coordinator's store, which a transport made with ``store`` has (set in __init__)
    capabilities = Capabilities(arrival_order=True)

    def __init__(self, rank: int, world: int, mailboxes: Sequence[Any], session: str, *,
                 store: str | None = None, token: str | bytes | None = None, group: str = "hcc",
                 timeout: float = 30.0):
        self._ray_mod = _ray()
        if len(mailboxes) != world or not 0 <= rank < world:
            raise ValueError(f"hcc ray: rank {rank} of {world} with {len(mailboxes)} mailboxes")
        self.rank, self.world, self.session = rank, world, session
        # ``store``: the address of a coordinator's rendezvous store (the driver's, or the
        # group actor's) holding the agreement log; with it the adaptive runtime can run over
        # this transport (it declares ``agreement``)
        self.store = self.token = None
        self.group, self.timeout = group, timeout
        if store is not None:
            from .rendezvous import StoreClient

            self.token = token.encode() if isinstance(token, str) else token
            self.store = StoreClient(store, self.token, min(timeout, 30.0))
            self.capabilities = Capabilities(arrival_order=True, agreement=True)
        self._mb = list(mailboxes)
        self._watch = {mailboxes[p].watch.remote(session): p for p in range(world) if p != rank}
        self._dead: set[int] = set()
        # The k-th send to (peer, tag) matches the peer's k-th receive from (rank, tag): MPI's
        # non-overtaking order, whatever order Ray delivers the mailbox calls in.
        self._send_seq: dict[tuple[int, int], int] = {}
        self._recv_seq: dict[tuple[int, int], int] = {}

    @staticmethod
    def _next(counter: dict, key: tuple[int, int]) -> int:
        seq = counter.get(key, 0)
        counter[key] = seq + 1
        return seq

    @classmethod
    def available(cls) -> bool:
        return available()

    def failed(self) -> frozenset[int]:
        return frozenset(self._dead)

    def isend(self, peer: int, tag: int, data: memoryview) -> RayRequest:
        ray = self._ray_mod
        mv = _bytes_view(data)
        obj = ray.put(np.frombuffer(mv, dtype=np.uint8))  # the one copy, into the store
        seq = self._next(self._send_seq, (peer, tag))
        ack = self._mb[peer].put.remote(self.session, self.rank, tag, seq, [obj])
        return RayRequest(ack, peer, tag, "send", mv, keep=obj)

    def irecv(self, peer: int, tag: int, buf: memoryview) -> RayRequest:
        mv = _bytes_view(buf)
        seq = self._next(self._recv_seq, (peer, tag))
        ref = self._mb[self.rank].take.remote(self.session, peer, tag, seq)
        return RayRequest(ref, peer, tag, "recv", mv)

    def _finish(self, r: RayRequest) -> None:
        ray = self._ray_mod
        try:
            got = ray.get(r.ref)
            if r.what == "recv":
                arr = ray.get(got[0])
                if arr.nbytes != r.nbytes:
                    raise RuntimeFault(
                        f"rank {self.rank}: message from rank {r.peer} tag {r.tag} has "
                        f"{arr.nbytes} B, expected {r.nbytes} B")
                r.buf[:] = memoryview(arr).cast("B")
                r.keep = None
        except Exception as e:
            if _is_actor_death(e):
                self._dead.add(r.peer)
                raise PeerFailed(self.rank, r.peer, f"Ray: {type(e).__name__}") from None
            raise
        r.done = True

    def _check_watch(self, ref) -> None:
        _reap_watch(self, ref)

    def _ready(self, refs: list, wait_s: float) -> list:
        """Every ref of ``refs`` that is ready, once at least one is (waiting up to ``wait_s``
        for the first); [] after ``wait_s``."""
        ray = self._ray_mod
        got, _ = ray.wait(refs, num_returns=1, timeout=wait_s, fetch_local=False)
        if not got:
            return []
        return ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)[0]

    def wait_any(self, requests: Sequence[RayRequest], timeout: float) -> list[int]:
        ready = [i for i, r in enumerate(requests) if r.done]
        if ready or not requests:
            return ready
        if self._dead:
            peer = min(self._dead)
            raise PeerFailed(self.rank, peer, "Ray reports its actor died")
        deadline = time.monotonic() + timeout
        index = {r.ref: i for i, r in enumerate(requests)}
        while True:
            refs = list(index) + list(self._watch)
            left = deadline - time.monotonic()
            if left <= 0:
                oldest = requests[0]
                raise CollectiveTimeout(self.rank, oldest.peer, oldest.describe(), timeout)
            got = self._ready(refs, min(left, _SLICE_S))
            if not got:
                continue
            done = []
            for ref in got:
                if ref in self._watch:
                    self._check_watch(ref)
                else:
                    i = index[ref]
                    self._finish(requests[i])
                    done.append(i)
            if done:
                return sorted(done)

    def wait_change(self, requests, timeout, *, ignore=frozenset(), woken=lambda: False):
        """Indices of completed ``requests``; ``[]`` on a death not in ``ignore``, when
        ``woken()``, or after ``timeout``; never raises for a dead peer. A thread blocked in
        ``ray.wait`` cannot be woken, so ``woken()`` is polled between slices of
        _CHANGE_SLICE_S."""
        end = time.monotonic() + timeout
        ignore = frozenset(ignore)
        for _ in range(int(timeout / _CHANGE_SLICE_S) + 2):
            done = [i for i, r in enumerate(requests) if r.done]
            if done:
                return done
            left = end - time.monotonic()
            if woken() or (self._dead - ignore) or left <= 0:
                return []
            index = {r.ref: i for i, r in enumerate(requests)
                     if r.peer not in ignore and r.peer not in self._dead}
            refs = list(index) + list(self._watch)
            if not refs:
                time.sleep(min(left, _CHANGE_SLICE_S))
                continue
            got = self._ready(refs, min(left, _CHANGE_SLICE_S))
            if not got:
                continue
            done = []
            for ref in got:
                try:
                    if ref in self._watch:
                        _reap_watch(self, ref)
                    else:
                        self._finish(requests[index[ref]])
                        done.append(index[ref])
                except PeerFailed:
                    pass  # recorded in self._dead: the caller sees it in failed()
            if done:
                return sorted(done)
        return [i for i, r in enumerate(requests) if r.done]

    def close(self) -> None:
        """Ends this rank's part of the session: peers' watches on it return normally."""
        try:
            self._mb[self.rank].close_session.remote(self.session)
        except Exception:  # the mailbox is gone with its actor: nothing left to close
            pass
        if self.store is not None:
            self.store.close()


class _WatchedTransport(Transport):
    """Another transport (sockets) plus Ray's death notices: ``wait_any`` polls the inner
    transport in short slices and raises PeerFailed as soon as Ray fails a peer's watch.

    It lives for one :meth:`ActorGroup.run` call (all its iterations), so the adaptive
    runtime (backends/adaptive/) keeps one agreement session per call. It reports itself
    as ``name = "ray"`` (the backend; ``data`` says which path carries the bytes) and hands on
    the inner transport's ``store``, ``token``, ``group`` and ``timeout``: the store is the
    driver's (:meth:`ActorGroup.run` serves it), which hosts the agreement log."""

    name = "ray"
    data = "sockets"

    def __init__(self, inner: Transport, mailboxes: Sequence[Any], session: str):
        self._ray_mod = _ray()
        self.inner = inner
        # Ray's actors arrive when their tasks do; the store the inner transport carries is
        # the driver's, with the agreement log
        self.capabilities = Capabilities(arrival_order=True, agreement=inner.capabilities.agreement)
        self.rank, self.world, self.session = inner.rank, inner.world, session
        for attr in ("store", "token", "group", "timeout"):
            setattr(self, attr, getattr(inner, attr, None))
        self._mb = list(mailboxes)
        self._watch = {mailboxes[p].watch.remote(session): p for p in range(self.world)
                       if p != self.rank}
        self._dead: set[int] = set()
        self._next_reap = 0.0  # wait_change looks at the watches at most every _SLICE_S
        # the optional inner feature the executor looks for: the fused receive-and-reduce
        # (SocketTransport.irecv_fold)
        if getattr(inner, "irecv_fold", None) is not None:
            self.irecv_fold = inner.irecv_fold

    def bind_plan(self, plan_id: int, max_message: int) -> None:
        self.inner.bind_plan(plan_id, max_message)  # the sockets frames carry the plan id

    def isend(self, peer, tag, data):
        try:
            return self.inner.isend(peer, tag, data)
        except RuntimeFault as e:
            raise self._explain(e) from None

    def irecv(self, peer, tag, buf):
        try:
            return self.inner.irecv(peer, tag, buf)
        except RuntimeFault as e:
            raise self._explain(e) from None

    def failed(self) -> frozenset[int]:
        return frozenset(self._dead) | self.inner.failed()

    def _deaths(self, wait: float = 0.0) -> None:
        """Raise PeerFailed if Ray has failed a peer's watch (waiting up to ``wait`` s)."""
        ray = self._ray_mod
        deadline = time.monotonic() + wait
        while self._watch:
            got, _ = ray.wait(list(self._watch), num_returns=len(self._watch),
                              timeout=max(0.0, min(deadline - time.monotonic(), _SLICE_S)),
                              fetch_local=False)
            for ref in got:
                _reap_watch(self, ref)
            if time.monotonic() >= deadline:
                return

    def _note_deaths(self) -> None:
        """Like :meth:`_deaths` without waiting or raising: the deaths go to ``failed()``."""
        for _ in range(self.world):  # each round reaps at least one watch
            try:
                self._deaths()
                return
            except PeerFailed:
                continue

    def _explain(self, err: RuntimeFault) -> RuntimeFault:
        """A transport error that a peer's death can cause (a reset connection, a handshake
        cut short — the sockets transport reads the latter as a failed HMAC challenge) becomes
        PeerFailed when Ray confirms a death within _DEATH_GRACE_S."""
        if isinstance(err, (CollectiveTimeout, PeerFailed)):
            return err
        try:
            self._deaths(_DEATH_GRACE_S)
        except PeerFailed as dead:
            return PeerFailed(self.rank, dead.peer,
                              f"Ray reports its actor died; the transport said: {err}")
        return err

    def wait_any(self, requests, timeout):
        deadline = time.monotonic() + timeout
        while True:
            self._deaths()
            left = deadline - time.monotonic()
            try:
                return self.inner.wait_any(requests, max(min(left, _SLICE_S), 1e-3))
            except CollectiveTimeout:
                if time.monotonic() >= deadline:
                    peer = getattr(requests[0], "peer", -1) if requests else -1
                    raise CollectiveTimeout(self.rank, peer, "no progress", timeout) from None
            except RuntimeFault as e:
                raise self._explain(e) from None

    def wait_change(self, requests, timeout, *, ignore=frozenset(), woken=lambda: False):
        """The inner transport's ``wait_change`` in slices of _SLICE_S, between which Ray's
        death notices are reaped into ``failed()``; returns ``[]`` on a death not in
        ``ignore`` (Ray's or the inner transport's), when ``woken()``, or after ``timeout``."""
        end = time.monotonic() + timeout
        ignore = frozenset(ignore)

        def ray_changed() -> bool:
            # called by the inner transport with its lock held: must not call inner.failed()
            return bool(self._dead - ignore) or woken()

        for _ in range(int(timeout / _SLICE_S) + 2):
            now = time.monotonic()
            if now >= self._next_reap:  # a ray.wait per call would tax every chunk's wait
                self._next_reap = now + _SLICE_S
                self._note_deaths()
            done = [i for i, r in enumerate(requests) if r.done]
            if done:
                return done
            left = end - time.monotonic()
            if ray_changed() or (self.inner.failed() - ignore) or left <= 0:
                return []
            done = self.inner.wait_change(requests, min(left, _SLICE_S), ignore=ignore,
                                          woken=ray_changed)
            if done:
                return done
        return [i for i, r in enumerate(requests) if r.done]

    def wake(self) -> None:
        self.inner.wake()

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            try:
                self._mb[self.rank].close_session.remote(self.session)
            except Exception:  # the mailbox is gone with its actor
                pass


def _sockets_transport(rank: int, world: int, rendezvous: str, token: str, timeout: float):
    from . import sockets

    # the driver serves the store (ActorGroup.run): no rank hosts it, so any rank may die
    return sockets.connect(rank, world, rendezvous=rendezvous, token=token,
                           timeout=min(timeout, 60.0), serve_store=False)


# --------------------------------------------------------------------------- rank actors

class _RankActorImpl(_MailboxCore):
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
            return _pack_error(e)

    def _step_sync(self, plan, rank, handles, session, it, x, last, timeout, step, data,
                   rendezvous, token, die_at, delay, options):
        from .adaptive import close_session
        from .runtime import engine, run as execute

        t_enter, wall_enter = time.perf_counter(), time.time()
        comm = self._comms.get(session)
        if comm is None:
            if data == "sockets":
                inner = _sockets_transport(rank, plan.n, rendezvous, token, timeout)
                comm = _WatchedTransport(inner, handles, session)
            else:  # the driver's store holds only the agreement log here
                comm = RayTransport(rank, plan.n, handles, session, store=rendezvous,
                                    token=token, group=_SOCKETS_GROUP, timeout=timeout)
            self._comms[session] = comm
        options = dict(options)
        runner = comm
        if die_at is not None:  # fault injection (tests, benchmarks): backends/testing.py
            from .testing import KillSwitch, kill_after_chunks

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


class _MailboxImpl(_MailboxCore):
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
        from .rendezvous import StoreServer

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
            if not _is_actor_death(e):
                raise
            from .agreement import EventLog, log_group

            if self._log is None:
                self._log = EventLog(self.server.address, self.token, log_group(_SOCKETS_GROUP), world=self.world)
            self._log.report_dead(r)

    async def size(self) -> int:
        return self.world


_actor_classes: dict[str, Any] = {}


def _remote(name: str):
    """The Ray actor classes, made on first use (Ray imported lazily)."""
    if not _actor_classes:
        ray = _ray()
        _actor_classes["rank"] = ray.remote(_RankActorImpl)
        _actor_classes["mailbox"] = ray.remote(_MailboxImpl)
        _actor_classes["group"] = ray.remote(_GroupImpl)
    return _actor_classes[name]


def _pack_error(e: BaseException) -> dict:
    """A picklable record of an exception raised in an actor (hcc's errors take several
    constructor arguments, so Ray cannot rebuild them from ``args``)."""
    fields = {k: v for k, v in vars(e).items() if isinstance(v, (int, float, str, type(None)))}
    return {"hcc_error": True, "module": type(e).__module__, "cls": type(e).__qualname__,
            "message": str(e), "fields": fields}


def _unpack_error(rec: dict) -> BaseException:
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


def _cause(e: BaseException) -> BaseException:
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


@dataclass(frozen=True)
class RunReport:
    """What one :meth:`ActorGroup.run` call saw besides the outputs: ``dead``, the ranks whose
    actors Ray reported dead during the call (in the order the driver learnt it);
    ``seconds``, per timed iteration, each rank's time from the start of its step (its start
    delay included) to its return; ``spans``, per timed iteration, each rank's step start and
    return as ``time.time()`` of this machine (one clock for every actor); ``info``, per rank, what the adaptive executor's survivors
    agreed on in the last iteration (``contributors``, ``missing``, ``late``, ``dead``,
    ``generation``, ``stats``), empty for plans the static executor ran; ``first_by_ray``,
    the deaths whose ``dead`` event the driver appended to the agreement log before any rank
    did (Ray's notice beat every survivor's own transport)."""

    dead: tuple[int, ...]
    seconds: tuple[dict, ...]
    info: dict
    first_by_ray: tuple[int, ...] = ()
    spans: tuple[dict, ...] = ()


class ActorGroup:
    """``world`` rank actors on the current Ray cluster, reusable across runs (actor start-up
    dominates short runs: ~1 s per actor here). A plan of ``n <= world`` ranks runs on actors
    ``0..n-1``. An actor that dies stays dead (``dead``; later runs of plans with
    ``on_failure = continue`` run without it) until :meth:`respawn` replaces it."""

    def __init__(self, world: int, *, num_cpus: float = 0):
        ray = _ray()
        if not ray.is_initialized():
            raise RuntimeFault("hcc ray: no Ray cluster; call ray.init() or use local_cluster()")
        self.world = world
        self._num_cpus = num_cpus
        self.actors = [self._spawn() for _ in range(world)]
        self.pids = ray.get([a.pid.remote() for a in self.actors], timeout=120)
        self.dead: set[int] = set()
        self.last: RunReport | None = None

    def _spawn(self):
        # num_cpus=0: ranks mostly wait on the network; a 4-rank group must fit a 2-core
        # machine's cluster. max_concurrency: the mailbox serves one coroutine per pending
        # receive (a plan posts every first-chunk receive at once).
        return _remote("rank").options(num_cpus=self._num_cpus, max_concurrency=10000).remote()

    def respawn(self) -> list[int]:
        """Replace every dead actor by a new one (same rank); returns the ranks replaced."""
        ray = _ray()
        ranks = sorted(self.dead)
        for r in ranks:
            try:
                ray.kill(self.actors[r])
            except Exception:  # already gone
                pass
            self.actors[r] = self._spawn()
        if ranks:
            pids = ray.get([self.actors[r].pid.remote() for r in ranks], timeout=120)
            for r, pid in zip(ranks, pids):
                self.pids[r] = pid
        self.dead.clear()
        return ranks

    def kill(self) -> None:
        ray = _ray()
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # already dead: nothing to end
                pass
        self.actors = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    def run(self, plan, inputs: Sequence[np.ndarray] | None = None, *, iters: int = 1,
            warmup: int = 0, timeout: float = 60.0, step: int = 0, data: str = "sockets",
            die: tuple[int, int] | None = None, delays: Sequence[float] | None = None,
            options: dict | None = None) -> tuple[list, list[float]]:
        """Run ``plan`` once per iteration on the first ``plan.n`` actors. Returns every rank's
        output and the per-iteration times (slowest rank, seconds); :attr:`last` holds the
        :class:`RunReport`.

        ``on_failure = continue`` (data over sockets, where the adaptive executor runs): ranks
        whose actor died get ``None``; the survivors' outputs are
        :class:`~hcc.backends.adaptive.AdaptiveResult` arrays that carry ``contributors`` and
        ``missing``. Otherwise a death raises :class:`RankFailed`/:class:`RootFailed` (with
        every rank's own error in ``.errors`` and the dead ranks in ``.dead``).

        ``die = (rank, k)``: that rank SIGKILLs its own process (``pids[rank]``) in the first
        timed iteration — adaptive runs after its k-th data chunk sent or received, static
        runs at its (k+1)-th send; ``k = 0``: as it enters. ``delays[r]``: seconds rank r
        waits before it enters each iteration (late arrivals). ``options``: keyword options of
        every rank's ``hcc.run`` (e.g. ``quorum``, ``chunk_bytes`` of the adaptive runtime)."""
        ray = _ray()
        n = plan.n
        if n > self.world:
            raise ValueError(f"hcc ray: plan needs {n} ranks, the group has {self.world}")
        if data not in DATA_PATHS:
            raise ValueError(f"hcc ray: data path {data!r} is not one of {DATA_PATHS}")
        if inputs is not None and len(inputs) != n:
            raise ValueError(f"hcc ray: {len(inputs)} inputs for a plan of {n} ranks")
        if delays is not None and len(delays) != n:
            raise ValueError(f"hcc ray: {len(delays)} delays for a plan of {n} ranks")
        continuing = plan.on_failure == "continue"
        gone = sorted(r for r in self.dead if r < n)
        if gone and not continuing:
            cls = RootFailed if gone[0] == plan.root else RankFailed
            raise cls(gone[0], detail="its actor died in an earlier run; ActorGroup.respawn() "
                      "replaces it")
        actors = self.actors[:n]
        session = uuid.uuid4().hex
        with _Coordinator(gone, n) as coord:
            plan_ref = ray.put(plan)
            # Non-roots of broadcast and scatter own no input (the executor uses zeros): not
            # shipping theirs saves (n-1) x size of object store, 3.3 GiB for dgx1's broadcast.
            ignored = {r for r in range(n)
                       if plan.kind in ("broadcast", "scatter") and r != plan.root}
            xs = [None if inputs is None or r in ignored
                  else ray.put(np.ascontiguousarray(inputs[r])) for r in range(n)]
            seconds: list[dict] = []
            spans: list[dict] = []
            died: list[int] = []
            outs: list = [None] * n
            info: dict = {}
            total = warmup + iters
            for it in range(total):
                refs = {}
                for r, a in enumerate(actors):
                    if r in self.dead:
                        continue
                    refs[a.step.remote(
                        plan_ref, r, actors, session, it, xs[r], last=it == total - 1,
                        timeout=timeout, step=step, data=data, rendezvous=coord.address,
                        token=coord.token,
                        die_at=die[1] if die and die[0] == r and it == warmup else None,
                        delay=float(delays[r]) if delays is not None else 0.0,
                        options=options)] = r
                res, dead = self._collect(refs, timeout + _DRIVER_GRACE_S, plan, coord,
                                          continuing)
                died += dead
                if it >= warmup:
                    seconds.append({r: t[0] for r, (_, t, _) in res.items()})
                    spans.append({r: t[1:] for r, (_, t, _) in res.items()})
                if it == total - 1:
                    outs = [_result(*res[r][::2]) if r in res else None for r in range(n)]
                    info = {r: res[r][2] for r in res if res[r][2] is not None}
        self.last = RunReport(tuple(died), tuple(seconds), info, tuple(coord.first),
                              tuple(spans))
        return outs, [max(s.values()) for s in seconds]

    def _collect(self, refs: dict, budget: float, plan, coord: "_Coordinator",
                 continuing: bool) -> tuple[dict, list[int]]:
        """Every returning rank's result of one round, and the ranks that died in it (in the
        order Ray told the driver; each is appended to the agreement log at once, so the
        survivors repair without waiting for their transports to notice). Raises the round's
        failure: a survivor's error, or any death unless ``continuing``."""
        ray = _ray()
        deadline = time.monotonic() + budget
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        dead: list[int] = []
        pending = list(refs)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                late = sorted(refs[p] for p in pending)
                for p in pending:
                    try:
                        ray.cancel(p)  # actor tasks cannot be force-cancelled; the group's
                    except Exception:  # kill() on exit ends the actors themselves
                        pass
                raise RuntimeFault(f"hcc ray: ranks {late} did not finish within {budget:g} s; "
                                   "their actors are killed with the group")
            got, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in got:
                r = refs[ref]
                try:
                    res = ray.get(ref)
                except Exception as e:
                    if _is_actor_death(e):
                        dead.append(r)
                        self.dead.add(r)
                        coord.report_dead(r)
                    errors[r] = _cause(e)
                    continue
                if isinstance(res, dict) and res.get("hcc_error"):
                    errors[r] = _unpack_error(res)
                else:
                    results[r] = res
        if any(r not in dead for r in errors) or (dead and not continuing):
            raise _failure(plan, set(dead), errors)
        return results, dead


def _result(out, info):
    """A rank's output as the driver returns it: with the adaptive run's agreement attached."""
    if out is None or info is None:
        return out
    from .adaptive import AdaptiveResult

    res = out.view(AdaptiveResult)
    for k, v in info.items():
        setattr(res, k, v)
    return res


class _Coordinator:
    """The driver's side of one :meth:`ActorGroup.run`: a rendezvous store (so no rank hosts
    it and any rank, rank 0 included, may die) holding the sockets path's addresses and the
    agreement log (backends/agreement.py), to which the driver appends every death Ray
    reports (on the object-store path the store holds only the log).

    Ranks known dead before the call get an address that refuses connections (a port bound
    and closed here), so the others' dials fail at once, and a ``dead`` event in the log."""

    def __init__(self, gone: Sequence[int], world: int):
        self.gone, self.world = list(gone), world  # world: the plan's ranks (sizes the log ring)
        self.address = self.token = None
        self._server = self._log = None
        self.first: list[int] = []  # deaths this driver appended before any rank did

    def __enter__(self):
        from .agreement import EventLog, log_group
        from .rendezvous import StoreServer

        self.token = secrets.token_hex(16)
        self._server = StoreServer(self.token, "127.0.0.1", 0)
        self.address = self._server.address
        try:
            self._log = EventLog(self.address, self.token, log_group(_SOCKETS_GROUP), timeout=30.0, world=self.world)
            for d in self.gone:
                self.report_dead(d)
            self.first.clear()  # those were known before the call, not noticed in it
        except BaseException:
            self.__exit__()
            raise
        return self

    def report_dead(self, rank: int) -> None:
        """Append ``dead(rank)`` unless a rank's transport already did (agreement.py dedups)
        and, if the rank died before it published its address, publish a refusing one so
        that the others' ``connect`` does not wait for it until its deadline."""
        if self._server is None:
            return
        key = f"{_SOCKETS_GROUP}/addr/{rank}"
        if self._server.value(key) is None:
            self._server.put(key, f"127.0.0.1:{free_port()}")
        if self._log.report_dead(rank):
            self.first.append(rank)

    def __exit__(self, *exc):
        for x in (self._log, self._server):
            if x is not None:
                x.close()
        self._log = self._server = None


def _failure(plan, dead: set[int], errors: dict[int, BaseException]) -> RuntimeFault:
    survivors = {r: e for r, e in errors.items() if r not in dead}
    lines = "; ".join(str(e) if str(e).startswith("rank ") else f"rank {r}: {e}"
                      for r, e in sorted(survivors.items()))
    if dead:
        who = min(dead)
        cls = RootFailed if plan.root >= 0 and who == plan.root else RankFailed
        err = cls(who, detail=f"Ray reports its actor died; survivors: {lines or 'none failed'}")
    else:
        first = survivors[min(survivors)]
        if isinstance(first, RuntimeFault):
            err = first
        else:
            err = RuntimeFault(f"hcc ray: {lines}")
    err.errors = dict(sorted(errors.items()))  # every rank's own error, for callers and tests
    err.dead = sorted(dead)
    return err


def run(plan, inputs: Sequence[np.ndarray] | None = None, *, timeout: float = 60.0,
        step: int = 0, data: str = "sockets", die: tuple[int, int] | None = None,
        delays: Sequence[float] | None = None) -> list:
    """From a driver: run ``plan`` once over ``plan.n`` rank actors it creates (on the current
    Ray cluster, or a local one it starts and shuts down), and return every rank's output
    (``None`` for a rank whose actor died in a plan with ``on_failure = continue``; the
    survivors' outputs carry ``contributors`` and ``missing``). ``die``, ``delays``: as in
    :meth:`ActorGroup.run`."""
    with local_cluster(num_cpus=max(2, plan.n)):
        with ActorGroup(plan.n) as g:
            outs, _ = g.run(plan, inputs, timeout=timeout, step=step, data=data, die=die,
                            delays=delays)
            return outs


def run_local(plan, inputs: Sequence[np.ndarray], *, iters: int = 1, warmup: int = 0,
              timeout: float = 60.0, **kw):
    """The ``hcc run --backend ray`` entry: a local cluster, one actor per rank, ``warmup +
    iters`` runs; shuts down what it started. Returns a RunResult whose ``detail`` says which
    ranks died (``dead``) and, for adaptive runs, what the survivors agreed (``contributors``,
    ``missing`` per rank). Keywords: ``data``, ``step``, ``die``, ``delays`` (see
    :meth:`ActorGroup.run`)."""
    from .launch import RunResult

    data = kw.get("data", "sockets")
    with local_cluster(num_cpus=max(2, plan.n)) as ray:
        with ActorGroup(plan.n) as g:
            outs, times = g.run(plan, inputs, iters=iters, warmup=warmup, timeout=timeout,
                                step=kw.get("step", 0), data=data, die=kw.get("die"),
                                delays=kw.get("delays"))
            report = g.last
        node = ray.util.get_node_ip_address()
    detail = {"data": data, "actors": plan.n, "node": node, "dead": list(report.dead)}
    if report.info:
        detail["contributors"] = {r: list(i["contributors"]) for r, i in report.info.items()}
        detail["missing"] = {r: list(i["missing"]) for r, i in report.info.items()}
    return RunResult(outputs=outs, times=times, backend="ray", detail=detail)


# --------------------------------------------------------------------------- user actors

_groups: dict[str, tuple[Any, Any, Any]] = {}  # name -> (mailbox, group actor, comm)


def init_group(world: int, rank: int, group_name: str = "default", *,
               timeout: float = 120.0) -> "GroupComm":
    """Inside one of the user's actors (Ray's collective convention: every member calls it
    with the same ``world`` and ``group_name`` and its own integer ``rank``): returns a
    :class:`RayTransport` for ``hcc.run(plan, comm, array)``. Blocks until all members joined.

    Each member gets a small mailbox actor owned by it (it dies with the member, which is how
    the others learn of the death); the named actor ``hcc-group:<group_name>`` is the
    rendezvous and the coordinator: it serves the store of the group's agreement log and
    appends the deaths Ray reports (see :class:`GroupComm`)."""
    ray = _ray()
    if not 0 <= rank < world:
        raise ValueError(f"hcc ray: rank {rank} outside 0..{world - 1}")
    mailbox = _remote("mailbox").options(num_cpus=0, max_concurrency=10000).remote()
    # detached: a named actor is otherwise owned by the member that happened to create it
    # and dies with it, taking the group's agreement log along; destroy_group ends it
    group = _remote("group").options(name=f"hcc-group:{group_name}", get_if_exists=True,
                                     lifetime="detached", num_cpus=0,
                                     max_concurrency=10000).remote(
                                         world, f"hcc-group:{group_name}")
    size = ray.get(group.size.remote(), timeout=timeout)
    if size != world:
        raise ValueError(f"hcc ray: group {group_name!r} has world {size}, not {world}")
    joined = ray.get(group.join.remote(rank, [mailbox]), timeout=timeout)
    comm = GroupComm(rank, world, joined["handles"], group_name, store=joined["store"],
                     token=joined["token"])
    _groups[group_name] = (mailbox, group, comm)
    return comm


class GroupComm(RayTransport):
    """A :class:`RayTransport` bound to a named group for the group's lifetime: call
    ``hcc.run(plan, comm, array)`` as often as needed (messages match in order, per peer and tag,
    as in MPI). Plans with ``on_failure = continue`` run on the adaptive executor over the
    group actor's agreement log and survive members' deaths; after any other failed call the
    group is unusable: destroy it and create a new one."""

    def __init__(self, rank: int, world: int, handles, group_name: str, *,
                 store: str | None = None, token: str | None = None):
        super().__init__(rank, world, handles, f"hcc-group:{group_name}", store=store,
                         token=token, group=_SOCKETS_GROUP)
        self.group_name = group_name

    def close(self) -> None:
        """Nothing per call: the group's session ends in :func:`destroy_group`."""


def destroy_group(group_name: str = "default") -> None:
    """Free this member's mailbox and its handle on the group (Ray's ``destroy_collective_group``)."""
    ray = _ray()
    member = _groups.pop(group_name, None)
    if member is not None:
        mailbox, group, comm = member
        from .adaptive import close_session

        close_session(comm)  # its log tail, if a plan ran adaptively
        if comm.store is not None:
            comm.store.close()
        try:
            ray.get(mailbox.close_session.remote(f"hcc-group:{group_name}"), timeout=10)
        except Exception:  # already gone with its actor
            pass
        for actor in (mailbox, group):  # the group actor too, so the name can be used again
            try:
                ray.kill(actor)
            except Exception:  # already gone
                pass
