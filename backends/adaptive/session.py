"""hcc.backends.adaptive.session — what outlives one adaptive run: the agreement log of a
communicator, the thread that tails it, and the run counter.

Terms
- session: per communicator, the :class:`~hcc.backends.agreement.EventLog` on the
  transport's rendezvous store, its :class:`~hcc.backends.agreement.Tail` and how many runs
  (and abort-mode runs) it has seen. Made on a communicator's first adaptive run, held in a
  weak table keyed by the communicator and closed with it (:func:`close_session`).
- greeting: before the first run that uses the adaptive schedule every pair of ranks
  exchanges one byte (the lower rank dials), so a death is an EOF somewhere.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..agreement import EventLog, Tail, log_group
from ..base import Transport
from .flows import HELLO_TAG, AdaptiveUnsupported

__all__ = ["Session", "session_of", "close_session", "transport_dead", "wait_for_change"]


class Session:
    """Per-communicator state that outlives one run: the log, its tail thread, the run count."""

    def __init__(self, comm: Transport):
        store = getattr(comm, "store", None)
        token = getattr(comm, "token", None)
        if not comm.capabilities.agreement or store is None or token is None:
            raise AdaptiveUnsupported(
                f"the adaptive runtime needs a transport with a rendezvous store (sockets), "
                f"not {getattr(comm, 'name', type(comm).__name__)!r}")
        # the communicator is held weakly (it keys _SESSIONS, a WeakKeyDictionary: a strong
        # reference here would keep it, and this session's thread and connections, forever);
        # when the communicator goes, the session closes with it
        self._comm = weakref.ref(comm)
        group = log_group(getattr(comm, "group", None) or "hcc")
        self.log = EventLog(store.address, token, group, timeout=min(getattr(comm, "timeout", 30.0), 30.0),
                            world=comm.world)
        # the tail reads as rank comm.rank: writers reuse a ring slot only once it has read it
        self.tail = Tail(self.log, token, wake=self.wake, rank=comm.rank)
        self.runs = 0
        self.abort_runs = 0
        self.reported: set[int] = set()
        self.greeted = False
        self._hello = np.zeros(1, dtype=np.uint8)
        self._finalizer = weakref.finalize(comm, Session.close, self)

    def greet(self, comm: Transport) -> None:
        """Connect every pair (the lower rank dials) so that any death is an EOF somewhere —
        once, before the first run that uses the adaptive schedule (a static fast-path run
        does not need it: the static executor reports the deaths of the peers it uses)."""
        if not self.greeted:
            self.greeted = True
            for p in range(comm.rank + 1, comm.world):
                comm.isend(p, HELLO_TAG, memoryview(self._hello))

    def wake(self) -> None:
        comm = self._comm()
        if comm is not None:
            comm.wake()

    def close(self) -> None:
        self.tail.close()
        self.log.close()


_SESSIONS: "weakref.WeakKeyDictionary[Any, Session]" = weakref.WeakKeyDictionary()


def session_of(comm: Transport) -> Session:
    s = _SESSIONS.get(comm)
    if s is None:
        s = _SESSIONS[comm] = Session(comm)
    return s


def close_session(comm: Transport) -> None:
    s = _SESSIONS.pop(comm, None)
    if s is not None:
        s.close()


def transport_dead(comm: Transport) -> set[int]:
    return set(comm.failed())


def wait_for_change(comm: Transport, session: Session, reqs: list, timeout: float, seen: int, known_dead: set) -> list[int]:
    """Indices of completed requests; [] when woken by a log event, a new death or ``timeout``
    (``Transport.wait_change``: unlike ``wait_any`` it does not raise for a dead peer)."""
    tail = session.tail
    return comm.wait_change(reqs, timeout, ignore=frozenset(known_dead),
                            woken=lambda: tail.length != seen or tail.error is not None)
