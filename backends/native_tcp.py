"""hcc.backends.native_tcp — the sockets transport with its data plane in the native core.

    comm = hcc.backends.sockets.connect(...)        # every rank, no peer on this host
    native_tcp.switch(comm); native_tcp.dial(comm)  # collective (hcc/collectives.py does it)

The pure-Python :class:`~hcc.backends.sockets.SocketTransport` moves every frame in Python
threads and runs plans in the Python executor: on a loaded machine its ranks lose the cores
to other work under the GIL. Here the same connections, authenticated the same way (the
handshake stays in Python), are handed to ``backends/_native_tcp.c``: a reader and a writer
pthread per connection, and :meth:`NativeTcpTransport.native_run` runs a whole program
without the GIL — several at once from several threads (the communicator's lanes), each in
its tag space. The frames are the sockets transport's byte for byte.

Terms
- eligible: the extension is built, the native runner is on (``HCC_NATIVE`` not ``0``),
  ``HCC_NATIVE_TCP`` is not ``0``, the transport is not paced, no peer is on this host's
  shared-memory channels (those jobs keep backends/shm.py's core) and the world has at most
  :data:`MAX_WORLD` ranks (every pair of ranks is connected up front).
- switch / dial: every rank must switch before any rank dials (an accepted connection of an
  unswitched transport would get Python reader threads): :func:`switch` changes the class,
  then, after the job agreed that every rank switched, :func:`dial` connects every pair
  (the lower rank dials) and returns once all ``world - 1`` connections are up.
- fallback: the Python executor runs a program the core cannot (a compressed plan); the
  plain sockets transport runs everything where the job is not eligible.

Semantics kept from backends/sockets.py: plan id and exact length checked per frame, one plan
per tag space, early frames bounded before allocation, FAIL frames gossiped once per dead
rank, BYE on close, every wait with a deadline (:class:`CollectiveTimeout` naming the op),
a dead peer a :class:`RankFailed`/:class:`RootFailed` naming it.
"""
from __future__ import annotations

import os
import threading
import time
from typing import AbstractSet, Callable

from . import native
from .base import CollectiveTimeout, PeerFailed, RankFailed, Request, RootFailed, RuntimeFault
from .sockets import CLOSED, ProtocolError, SocketTransport

try:  # built by `pip install -e .` beside _native (whose kernels it uses)
    from . import _native_tcp
except ImportError:
    _native_tcp = None

__all__ = ["NativeTcpTransport", "eligible", "switch", "dial", "MAX_WORLD"]

# every pair of ranks is connected when the job starts (a run may post to any peer from C,
# with no Python to open a connection lazily): 64 ranks are 63 connections and 126 threads
MAX_WORLD = 64
_WAIT_SLICE = 0.5  # s: a Python-API wait looks at the transport's own failure list this often


def available() -> bool:
    return _native_tcp is not None and native.runner_enabled() and os.environ.get("HCC_NATIVE_TCP", "1") != "0"


def eligible(comm) -> bool:
    """This rank could run its TCP peers in the core (module docstring, "eligible")."""
    return (available() and isinstance(comm, SocketTransport) and not getattr(comm, "local_peers", None)
            and not comm.pace_Bps and comm.world <= MAX_WORLD and not comm._conns)


class _TcpReq(Request):
    """A transfer of the Python API (the run header, the Python executor's fallback). ``buf``
    keeps the memory alive; the engine holds it too until the request is released."""

    __slots__ = ("peer", "tag", "buf", "handle", "_eng", "_done")

    def __init__(self, eng, handle: int, peer: int, tag: int, buf: memoryview):
        self._eng, self.handle, self.peer, self.tag, self.buf = eng, handle, peer, tag, buf
        self._done = False

    @property
    def done(self) -> bool:
        if not self._done and self._eng.done(self.handle):
            self._done = True
            self._eng.release(self.handle)  # after this the handle may name another request
            self.buf = None
        return self._done


class NativeTcpTransport(SocketTransport):
    """A :class:`SocketTransport` whose connections the native core drives (module docstring)."""

    concurrent_runs = True  # native_run may be called from several threads at once
    wait_completed = None
    track_completions = None
    irecv_fold = None

    # -- connections: authenticated in Python, then handed to the core ------------------
    def _attach(self, conn, sock, session: bytes) -> None:
        conn.sock, conn.session = sock, session
        self._engine.add_peer(conn.peer, sock.detach(), session)
        with self._cond:
            self._cond.notify_all()

    def _get_conn(self, peer: int):
        conn = self._conns.get(peer)
        if conn is None:
            from .sockets import _Conn

            if not 0 <= peer < self.world or peer == self.rank:
                raise RuntimeFault(f"rank {self.rank}: no peer rank {peer} in a world of {self.world}")
            conn = self._conns[peer] = _Conn(peer)
            if self.rank < peer:
                # the base class's dial and handshake; _attach hands the socket to the core
                conn.writer = threading.Thread(target=self._dial, args=(conn,), daemon=True,
                                               name=f"hcc-dial{self.rank}-{peer}")
                conn.writer.start()
        return conn

    @property
    def max_message(self) -> int:
        return self._max_message

    @max_message.setter
    def max_message(self, n: int) -> None:
        self._max_message = int(n)
        eng = self.__dict__.get("_engine")
        if eng is not None:
            eng.set_max_message(self._max_message)

    # -- the Python API ---------------------------------------------------------------------
    def isend(self, peer: int, tag: int, data, plan: int | None = None) -> Request:
        view = self._bytes_view(data)
        pid = self._plan if plan is None else plan
        return _TcpReq(self._engine, self._engine.isend(peer, tag, pid, view), peer, tag, view)

    def irecv(self, peer: int, tag: int, buf, plan: int | None = None) -> Request:
        view = self._bytes_view(buf)
        if view.readonly:
            raise RuntimeFault(f"rank {self.rank}: receive buffer for tag {tag} is read-only")
        pid = self._plan if plan is None else plan
        return _TcpReq(self._engine, self._engine.irecv(peer, tag, pid, view), peer, tag, view)

    def _failure(self, status: int, peer: int, msg: str) -> Exception:
        if status == 3:
            return ProtocolError(f"rank {self.rank}: {msg}")
        if status == 4:
            return PeerFailed(self.rank, peer, CLOSED)
        return PeerFailed(self.rank, peer, msg)

    def _failure_for(self, peer: int) -> Exception | None:
        err = super()._failure_for(peer)  # what Python learnt (a failed dial, the launcher)
        if err is not None:
            return err
        status, named, msg = self._engine.failure(peer)
        return self._failure(status, named, msg) if status else None

    def wait_any(self, requests: list[Request], timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            done = [i for i, r in enumerate(requests) if r.done]
            if done:
                return done
            for r in requests:
                err = super()._failure_for(r.peer)
                if err is not None:
                    raise err
            left = deadline - time.monotonic()
            if left <= 0:
                raise CollectiveTimeout(self.rank, requests[0].peer if requests else -1, "no message arrived",
                                        timeout)
            _, (status, peer, msg) = self._engine.wait([r.handle for r in requests if not r._done],
                                                       min(left, _WAIT_SLICE))
            if status not in (0, 1):
                err = self._failure(status, peer, msg)
                if status == 4:
                    self._closed_early(err)
                raise err

    def wait_change(self, requests: list[Request], timeout: float, *,
                    ignore: AbstractSet[int] = frozenset(),
                    woken: Callable[[], bool] = lambda: False) -> list[int]:
        """Not offered: only the adaptive runtime waits this way, and it needs a store for its
        agreement log, which this transport (the communicator's) does not keep."""
        raise RuntimeFault(f"rank {self.rank}: the native TCP transport runs static plans only")

    def wake(self) -> None:
        self._engine.interrupt()
        super().wake()

    # -- failures -------------------------------------------------------------------------
    def failed(self) -> frozenset[int]:
        return super().failed() | frozenset(self._engine.dead())

    def _gossip(self, dead: int, how: str = "") -> None:
        # the core sends the FAIL frames (once per dead rank) on the connections it holds
        self._engine.set_failed(dead, how or self._dead.get(dead, "reported"))

    def announce_failure(self, reason: str = "") -> None:
        self._engine.set_failed(self.rank, "")
        if self.store is not None:
            try:
                k = self.store.add(f"{self.group}/ngaveup", 1)
                self.store.set(f"{self.group}/gaveup/{k}", self.rank)
            except RuntimeFault:
                pass

    # -- the runner -------------------------------------------------------------------------
    def native_run(self, ex, plan: int | None = None, tag_shift: int = 0) -> bool:
        """Run ``ex`` (a :class:`~hcc.backends.executor.RankExecution`) in the core without
        the GIL; False (the Python executor runs it) for a compressed plan. ``plan`` and
        ``tag_shift`` (ORed into every tag) are a communicator's run in its tag space; several
        runs may go at once. Raises what the executor would."""
        if ex.codec is not None:
            return False
        enc = native.encode(ex, self._ranks)
        pid = self._plan if plan is None else plan
        bufs = ex.bufs
        status, op, peer, msg = self._engine.run(
            enc.ops, enc.dep_ptr, enc.dep_idx, enc.missing, enc.first,
            native.buffer_arg(bufs.get("in")), bufs["out"], bufs.get("tmp"),
            enc.op, enc.dtype, pid, tag_shift, ex.plan.largest_message_bytes(), float(ex.timeout))
        if status == 0:
            return True
        where = ex.describe(op) if op >= 0 else "no outstanding transfer"
        if status == 1:
            raise CollectiveTimeout(self.rank, peer, where, ex.timeout)
        if status == 3:
            raise ProtocolError(f"rank {self.rank}: {msg}")
        how = msg if status in (2, 6) else CLOSED
        if status == 4:
            self._closed_early(PeerFailed(self.rank, peer, CLOSED))
        root = ex.plan.root
        cls = RootFailed if (peer == root and root >= 0) else RankFailed
        raise cls(peer, by=self.rank, detail=f"while waiting on {where}; {how}")

    def native_stats(self) -> dict:
        """The core's counters (``messages`` moved, ``runs`` finished, ``held`` early frames)."""
        return self._engine.stats()

    def close(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._engine.close(min(self.timeout, 5.0))
        self._close_endpoints()


def switch(comm: SocketTransport) -> NativeTcpTransport:
    """Make ``comm`` (eligible, no connection yet) a :class:`NativeTcpTransport`; every rank of
    the job must switch before any rank calls :func:`dial`."""
    if not eligible(comm):
        raise RuntimeFault(f"rank {comm.rank}: this transport cannot run over the native TCP core")
    mm = comm.__dict__.pop("max_message")
    comm._engine = _native_tcp.Engine(comm.rank, comm.world, mm)
    comm.__class__ = NativeTcpTransport
    comm._max_message = mm
    comm._ranks = {p: p for p in range(comm.world) if p != comm.rank}
    return comm


def dial(comm: NativeTcpTransport, timeout: float) -> None:
    """Connect every pair of ranks (the lower dials); returns once all are up. Raises the
    first failure (a refused dial, a failed authentication), or :class:`CollectiveTimeout`."""
    with comm._lock:
        for p in range(comm.rank + 1, comm.world):
            comm._get_conn(p)
    deadline = time.monotonic() + timeout
    want = comm.world - 1
    while comm._engine.connected() < want:
        for p in range(comm.world):
            if p != comm.rank:
                err = SocketTransport._failure_for(comm, p)
                if err is not None:
                    raise err
        left = deadline - time.monotonic()
        if left <= 0:
            missing = [p for p in range(comm.world) if p != comm.rank and p not in comm._conns
                       or (p in comm._conns and comm._conns[p].sock is None)]
            raise CollectiveTimeout(comm.rank, missing[0] if missing else -1, "connecting every pair of ranks",
                                    timeout)
        with comm._cond:
            comm._cond.wait(min(left, 0.05))
