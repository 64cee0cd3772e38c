"""hcc.backends.ray.transport — plan messages over Ray's object store: the mailbox actors'
methods and :class:`RayTransport`.

Terms
- mailbox: the async actor methods ``put``/``take``/``watch``/``close_session``
  (:class:`MailboxCore`) through which a sender's ``ray.put`` bytes reach the receiver:
  the sender posts ``[ref]`` to the receiver's mailbox, the receiver's pending ``take`` returns it.
- session: the key that separates one run's messages (or one group's) from another's; a
  message is keyed ``(session, src, tag, seq)``, ``seq`` counting that ``(src, tag)``.
- watch: a pending ``watch`` call on each peer's mailbox; Ray fails it when the peer's actor
  dies, which is how a transport learns of a death at once (:func:`reap_watch`).

Ray is imported on first use (:func:`import_ray`; ``pip install 'hcc[ray]'``), on loopback only
(see the package docstring).
"""
from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Sequence

import numpy as np

from ..base import (BackendUnavailable, Capabilities, CollectiveTimeout, MessageRequest, PeerFailed, RuntimeFault,
                    Transport, register)

__all__ = ["RayTransport", "RayRequest", "MailboxCore", "available", "import_ray", "local_cluster", "DATA_PATHS",
           "SOCKETS_GROUP"]

_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
SLICE_S = 0.25
_CHANGE_SLICE_S = 0.02
DATA_PATHS = ("objects", "sockets")
SOCKETS_GROUP = "hcc"
_ENDED_KEPT = 4096
# What a peer's watch returns when that peer gave up its session (a refused input)
GAVE_UP = "gave up"


def import_ray():
    """The ``ray`` module, imported on first use, on loopback (the package docstring); raises
    :class:`~hcc.backends.base.BackendUnavailable` naming ``hcc[ray]`` when Ray is missing."""
    for k, v in _LOOPBACK_ENV.items():
        os.environ.setdefault(k, v)
    try:
        import ray
    except ImportError as e:
        raise BackendUnavailable("ray", "ray", "ray", e) from None
    return ray


def available() -> bool:
    """True when Ray imports."""
    try:
        import_ray()
    except Exception:  # an absent or broken Ray install: the backend is simply unavailable
        return False
    return True


@contextmanager
def local_cluster(num_cpus: int | None = None, **init_kw):
    """A local Ray cluster on loopback for the body, unless Ray is already initialised (then the
    existing one is used and left running). Shuts down only what it started."""
    ray = import_ray()
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

class MailboxCore:
    """Async mailbox methods shared by rank actors and stand-alone mailbox actors. Runs in the
    actor's event loop only, so its dicts need no lock."""

    def _mb_init(self) -> None:
        self._slots: dict[tuple, list] = {}
        self._waiting: dict[tuple, asyncio.Future] = {}
        self._closed: dict[str, asyncio.Event] = {}
        # Sessions already closed, so a peer's watch that arrives late (a broadcast leaf may
        # finish before another leaf has started) returns at once instead of pending forever.
        self._ended: OrderedDict[str, None] = OrderedDict()
        # Sessions this rank gave up (its own input was refused): peers' watches on it end
        # with GAVE_UP instead of True, which they read as this rank's failure
        self._gave_up: OrderedDict[str, None] = OrderedDict()

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

    async def watch(self, session: str) -> bool | str:
        """Returns when this rank closes ``session`` (True, or :data:`GAVE_UP` when it gave
        up); fails with ActorDiedError if it dies."""
        if session not in self._ended:
            await self._event(session).wait()
        return GAVE_UP if session in self._gave_up else True

    async def give_up(self, session: str) -> int:
        """This rank will not take part in ``session``: end it, so every peer's watch returns
        :data:`GAVE_UP` at once (RayTransport.announce_failure)."""
        self._gave_up[session] = None
        while len(self._gave_up) > _ENDED_KEPT:
            self._gave_up.popitem(last=False)
        return await self.close_session(session)

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

def reap_watch(transport, ref) -> None:
    """A peer's watch task has ended: the peer's actor died (raise PeerFailed and remember it)
    or the watch ended normally. ``transport`` has ``_ray_mod``, ``_watch`` (ref -> peer),
    ``_dead`` and ``rank`` — both Ray transports below."""
    peer = transport._watch.pop(ref)
    try:
        ended = transport._ray_mod.get(ref)
    except Exception as e:
        if is_actor_death(e):
            transport._dead.add(peer)
            raise PeerFailed(transport.rank, peer, "Ray reports its actor died") from None
        raise
    if ended == GAVE_UP:
        transport._dead.add(peer)
        raise PeerFailed(transport.rank, peer, "it stopped: its own input was refused (announced through Ray)")


def give_up(transport) -> None:
    """Announce that ``transport``'s rank gives up its session (its input was refused before
    any byte moved): its mailbox ends the session so every peer's watch returns
    :data:`GAVE_UP` now instead of their deadline passing. Waits (at most 5 s) for the
    mailbox to have done it; best effort."""
    try:
        transport._ray_mod.get(transport._mb[transport.rank].give_up.remote(transport.session), timeout=5.0)
    except Exception:  # the caller's error is the one to raise
        pass


class RayRequest(MessageRequest):
    """One message: ``ref`` is the mailbox call's (the receiver's ack for a send, the boxed
    object ref for a receive); ``keep`` holds a sent object until it is acknowledged."""

    __slots__ = ("ref", "keep")

    def __init__(self, ref, peer: int, tag: int, what: str, buf: memoryview, keep=None):
        super().__init__(peer, tag, what, buf)
        self.ref, self.keep = ref, keep


def _bytes_view(view) -> memoryview:
    mv = view if isinstance(view, memoryview) else memoryview(view)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def is_actor_death(e: BaseException) -> bool:
    ray = import_ray()
    return isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError))


@register
class RayTransport(Transport):
    """Plan messages over Ray's object store, between the mailboxes of one session.

    ``mailboxes[r]`` is rank r's mailbox handle (an actor with the :class:`MailboxCore`
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
        self._ray_mod = import_ray()
        if len(mailboxes) != world or not 0 <= rank < world:
            raise ValueError(f"hcc ray: rank {rank} of {world} with {len(mailboxes)} mailboxes")
        self.rank, self.world, self.session = rank, world, session
        # ``store``: the address of a coordinator's rendezvous store (the driver's, or the
        # group actor's) holding the agreement log; with it the adaptive runtime can run over
        # this transport (it declares ``agreement``)
        self.store = self.token = None
        self.group, self.timeout = group, timeout
        if store is not None:
            from ..rendezvous import StoreClient

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
            if is_actor_death(e):
                self._dead.add(r.peer)
                raise PeerFailed(self.rank, r.peer, f"Ray: {type(e).__name__}") from None
            raise
        r.done = True

    def _check_watch(self, ref) -> None:
        reap_watch(self, ref)

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
            got = self._ready(refs, min(left, SLICE_S))
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
                        reap_watch(self, ref)
                    else:
                        self._finish(requests[index[ref]])
                        done.append(index[ref])
                except PeerFailed:
                    pass  # recorded in self._dead: the caller sees it in failed()
            if done:
                return sorted(done)
        return [i for i, r in enumerate(requests) if r.done]

    def announce_failure(self, reason: str = "") -> None:
        """This rank's input was refused: every peer learns it now (:func:`give_up`)."""
        give_up(self)

    def close(self) -> None:
        """Ends this rank's part of the session: peers' watches on it return normally."""
        try:
            self._mb[self.rank].close_session.remote(self.session)
        except Exception:  # the mailbox is gone with its actor: nothing left to close
            pass
        if self.store is not None:
            self.store.close()
