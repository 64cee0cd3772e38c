"""hcc.backends.ray.watched — the sockets data path under Ray: another transport plus Ray's
death notices (:class:`WatchedTransport`).

Terms
- inner transport: a sockets transport between the rank actors (authenticated by a per-run
  token, its rendezvous store served by the driver); it carries every byte.
- death notice: Ray failing a peer's ``watch`` call (the peer's actor died); it turns a
  transport error a death can cause into :class:`~hcc.backends.base.PeerFailed`.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from ..base import Capabilities, CollectiveTimeout, PeerFailed, RuntimeFault, Transport
from .transport import SLICE_S, import_ray, reap_watch

__all__ = ["WatchedTransport", "sockets_transport"]

_DEATH_GRACE_S = 2.0


class WatchedTransport(Transport):
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
        self._ray_mod = import_ray()
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
        self._next_reap = 0.0  # wait_change looks at the watches at most every SLICE_S
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
                              timeout=max(0.0, min(deadline - time.monotonic(), SLICE_S)),
                              fetch_local=False)
            for ref in got:
                reap_watch(self, ref)
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
                return self.inner.wait_any(requests, max(min(left, SLICE_S), 1e-3))
            except CollectiveTimeout:
                if time.monotonic() >= deadline:
                    peer = getattr(requests[0], "peer", -1) if requests else -1
                    raise CollectiveTimeout(self.rank, peer, "no progress", timeout) from None
            except RuntimeFault as e:
                raise self._explain(e) from None

    def wait_change(self, requests, timeout, *, ignore=frozenset(), woken=lambda: False):
        """The inner transport's ``wait_change`` in slices of SLICE_S, between which Ray's
        death notices are reaped into ``failed()``; returns ``[]`` on a death not in
        ``ignore`` (Ray's or the inner transport's), when ``woken()``, or after ``timeout``."""
        end = time.monotonic() + timeout
        ignore = frozenset(ignore)

        def ray_changed() -> bool:
            # called by the inner transport with its lock held: must not call inner.failed()
            return bool(self._dead - ignore) or woken()

        for _ in range(int(timeout / SLICE_S) + 2):
            now = time.monotonic()
            if now >= self._next_reap:  # a ray.wait per call would tax every chunk's wait
                self._next_reap = now + SLICE_S
                self._note_deaths()
            done = [i for i, r in enumerate(requests) if r.done]
            if done:
                return done
            left = end - time.monotonic()
            if ray_changed() or (self.inner.failed() - ignore) or left <= 0:
                return []
            done = self.inner.wait_change(requests, min(left, SLICE_S), ignore=ignore,
                                          woken=ray_changed)
            if done:
                return done
        return [i for i, r in enumerate(requests) if r.done]

    def wake(self) -> None:
        self.inner.wake()

    def announce_failure(self, reason: str = "") -> None:
        """This rank's input was refused: the inner transport tells its peers (sockets: a
        FAIL frame), and the mailbox ends the session so every peer's watch says so too."""
        from .transport import give_up

        tell = getattr(self.inner, "announce_failure", None)
        if tell is not None:
            try:
                tell(reason)
            except Exception:
                pass
        give_up(self)

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            try:
                self._mb[self.rank].close_session.remote(self.session)
            except Exception:  # the mailbox is gone with its actor
                pass


def sockets_transport(rank: int, world: int, rendezvous: str, token: str, timeout: float):
    from .. import sockets

    # the driver serves the store (ActorGroup.run): no rank hosts it, so any rank may die
    return sockets.connect(rank, world, rendezvous=rendezvous, token=token,
                           timeout=min(timeout, 60.0), serve_store=False)
