"""hcc.backends.sockets — the TCP transport (backend name ``sockets``), authenticated, zero copy.

    with hcc.backends.sockets.connect(rank, world, rendezvous="127.0.0.1:29500", token=tok) as comm:
        out = hcc.run(plan, comm, array)

Terms
- rendezvous: a :class:`~hcc.backends.rendezvous.StoreServer` (unless a launcher already
  runs one, rank 0 starts it in a process of its own that outlives rank 0) where every rank publishes the address of its listening socket
  (``127.0.0.1``, ephemeral port) under ``<group>/addr/<rank>``; :func:`connect` returns once
  every rank has read every address, so the store is no longer needed for data.
- connection: one TCP connection per unordered pair of ranks that exchange a message, opened
  lazily on first use by the lower rank (the higher rank accepts), ``TCP_NODELAY``.
- handshake: before any data, both ends of a connection prove they hold the job's token
  (backends/handshake.py: HMAC-SHA256 challenges both ways, and a session id per connection);
  a peer with another token is refused before it can send a byte of data.
- frame: a fixed header :data:`FRAME` ``(magic "HCCF", kind, session, plan, tag, length)``
  followed by ``length`` bytes. Kinds: DATA (a message), FAIL (``tag`` names a rank the sender
  saw die; sent on to every other connection once, so every rank learns the dead rank's name
  even when it never talked to it), BYE (clean close). ``plan`` is the 32-bit id of the plan
  the message belongs to (:meth:`~hcc.ir.plan.Plan.wire_id`, set by the runtime through
  :meth:`bind_plan`; 0 outside a plan). A receiver checks the magic, the session id and the
  kind; a DATA frame whose receive is posted must carry that receive's plan id (otherwise the
  ranks run different plans) and have exactly the posted length; an early one must not exceed
  the largest message of its plan when it is the plan being run, else ``max_message`` — a
  violation is a :class:`ProtocolError` before anything is allocated. Never pickle.
- tag space: bits 24-30 of a tag whose bit 31 is clear (:data:`SPACE_SHIFT`), where a communicator that runs several
  plans at once puts each run (hcc/collectives.py: the call's sequence number); 0 for a plan
  run alone. Within one nonzero space every rank must run one plan: a frame whose space holds
  a posted receive of another plan, or a receive posted in a space that holds an early frame
  of another plan, is a :class:`ProtocolError` at once (the ranks issued different calls in
  the same order position), not only when the two happen to use the same tag.
- receive path: a reader thread per connection ``recv_into``'s each frame straight into the
  posted destination memoryview (the numpy buffer); a frame that arrives before its receive is
  posted goes to a holding buffer of exactly its length, taken from the process's
  :data:`~hcc.backends.kernels.STAGING` pool (one copy when the receive is posted).
  ``irecv_fold`` (the optional fused primitive the executor uses for RecvReduce) posts a
  receive without a destination: the reader receives the frame :data:`FOLD_PIECE` bytes at a
  time into a per-connection scratch and calls the caller's fold on each piece while it is
  hot in cache; the transport only moves bytes, the fold (the executor's) reduces them.
- send path: when the connection's writer thread is idle and its queue empty, ``isend``
  writes the frame at once from the caller's thread with one non-blocking
  ``sendmsg([header, data], MSG_DONTWAIT)`` (zero copy; the request is complete on return when
  the socket buffer took it all); otherwise, or for what the socket buffer did not take, the
  writer thread ``sendmsg``/``sendall``'s it, in queue order. Why inline: each hand-off to the
  writer is a thread wake-up that must then win the GIL on a machine whose cores are already
  busy with the other ranks. Measured (benchmarks/runtime_bench.py, 4 ranks, median of 3
  back-to-back reps, one run before and one after, minutes apart): broadcast 16/64 MiB went
  from 0.67/0.70x gloo to 1.11/1.09x, allreduce from 0.78/1.16x to 1.01/1.27x; single reps
  on this shared machine spread by ±30%, so read these as "about gloo", not as a margin.
  Sends on different connections still proceed in parallel.
- failure: EOF or reset without BYE marks the peer dead (:class:`PeerFailed` at once in any
  ``wait_any`` that depends on it); a BYE fails the requests on that peer only once nothing of
  ours is in flight to it (the peer may finish, and close, before our writer has marked the
  send of its last frame done); every wait has a deadline (:class:`CollectiveTimeout`).

Socket buffers are left to the kernel's autotuning (see ``handshake._tune`` for the measurement).

One module of ~900 lines on purpose: the reader and writer threads, the waits and the failure
handling of :class:`SocketTransport` share one lock, one condition and the per-peer queues;
what stands apart is apart (the handshake: handshake.py; the rendezvous store: rendezvous.py).
"""
from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import threading
import time
from collections import deque
from typing import AbstractSet, Any, Callable

import numpy as np

from .base import (Capabilities, CollectiveTimeout, PeerFailed, RankFailed, Request, RuntimeFault, Transport,
                   register)
# the handshake is backends/handshake.py; its names stay importable from here
from .handshake import HELLO, NONCE, WELCOME, accept_handshake, dial_handshake  # noqa: F401
from .kernels import STAGING
from .rendezvous import (
    MAX_PENDING,
    AuthenticationError,
    RendezvousError,
    StoreClient,
    StoreServer,
    accept_loop,
    parse_address,
    recv_into_exact,
)

__all__ = ["SocketTransport", "connect", "run_local", "ProtocolError", "AuthenticationError", "FRAME",
           "accept_handshake", "dial_handshake"]

FRAME = struct.Struct("!4sB3x8sIIQ")  # magic, kind, pad, session id, plan id, tag, length: 32 bytes
MAGIC = b"HCCF"
DATA, FAIL, BYE = 0, 1, 2
CLOSED = "it closed the connection"  # a peer's clean close (BYE) with a request of ours outstanding
DEFAULT_MAX_MESSAGE = 256 << 20  # an unsolicited frame may hold at most 256 MiB
STORE_POLL = 0.5  # s between looks at the launcher's list of dead ranks while a wait is idle


class ProtocolError(RuntimeFault):
    """A peer sent a frame this rank did not expect (bad magic/session/kind/length)."""


SPACE_SHIFT = 24  # a tag's bits 24-30 name its tag space (module docstring); 0: no space


def _space(tag: int) -> int:
    # bit 31 set: the adaptive runtime's own tag layout (backends/adaptive/flows.py), no space
    return 0 if tag >> 31 else (tag >> SPACE_SHIFT) & 0x7F


def _space_clash(index: dict, tag: int, plan: int) -> tuple[int, int] | None:
    """``(space, other plan)`` when ``index`` (space -> plan -> count) holds a plan other than
    ``plan`` in ``tag``'s nonzero tag space."""
    space = _space(tag)
    if space:
        for other, count in index.get(space, {}).items():
            if count > 0 and other != plan:
                return space, other
    return None


def _bump(index: dict, tag: int, plan: int, by: int) -> None:
    space = _space(tag)
    if space:
        per = index.setdefault(space, {})
        left = per.get(plan, 0) + by
        if left > 0:
            per[plan] = left
        else:
            per.pop(plan, None)


class _Req(Request):
    __slots__ = ("done", "peer", "tag", "buf", "is_send", "sent", "fold", "nbytes", "plan", "on_done")

    def __init__(self, peer: int, tag: int, buf: memoryview | None, is_send: bool, plan: int,
                 fold: Callable[[int, memoryview], None] | None = None, nbytes: int = -1):
        self.done = False
        self.peer, self.tag, self.buf, self.is_send, self.plan = peer, tag, buf, is_send, plan
        self.sent = 0  # bytes of the frame (header + data) already written by an inline send
        self.fold = fold  # irecv_fold: the callback that consumes the message piece by piece
        self.nbytes = buf.nbytes if buf is not None else nbytes
        # called (with the transport's lock held; it must not block) once the request is
        # complete: the native runner of a mixed job learns of its TCP transfers this way
        self.on_done: Callable[[], None] | None = None


# irecv_fold's piece: the reader receives a folded message this many bytes at a time into a
# per-connection scratch and hands each piece to the fold while it is still in the core's L2
# (2 MiB here; 256 KiB leaves room for the destination and the other operand's lines).
FOLD_PIECE = 256 << 10


def _deliver(req: _Req, data: memoryview) -> None:
    """Give a whole message that was held (it arrived before its receive) to ``req``."""
    if req.fold is None:
        req.buf[:] = data
    else:
        req.fold(0, data)


_U8 = np.dtype(np.uint8)


class _Held:
    """A frame that arrived before its receive was posted."""

    __slots__ = ("data", "complete", "waiter", "plan")

    def __init__(self, nbytes: int, plan: int):
        self.data = STAGING.take(nbytes, _U8)  # pooled: no page faults per early frame
        self.plan = plan
        self.complete = False
        self.waiter: _Req | None = None


class _Conn:
    def __init__(self, peer: int):
        self.peer = peer
        self.sock: socket.socket | None = None
        self.session = b""
        self.queue: deque = deque()
        self.cv = threading.Condition()
        self.writer: threading.Thread | None = None
        self.reader: threading.Thread | None = None
        self.bye_received = False
        self.busy = False  # the writer thread is writing a frame (guarded by cv)
        self.scratch: memoryview | None = None  # irecv_fold's piece buffer (reader thread only)


@register
class SocketTransport(Transport):
    """TCP transport between the ranks of one job (see the module docstring)."""

    name = "sockets"
    # independent processes enter a collective at different times; connect() gives every
    # transport the job's rendezvous store, which hosts the adaptive runtime's agreement log
    capabilities = Capabilities(arrival_order=True, agreement=True)

    def __init__(self, rank: int, world: int, token: bytes, addresses: dict[int, tuple[str, int]],
                 listener: socket.socket, timeout: float = 30.0, max_message: int = DEFAULT_MAX_MESSAGE,
                 store: StoreClient | None = None, server: StoreServer | None = None, group: str = "hcc",
                 pace_Bps: float = 0.0):
        self.rank, self.world, self.token = rank, world, token
        self.pace_Bps = pace_Bps  # > 0: emulate links of this many bytes/s per connection
        self.addresses, self.timeout, self.max_message = addresses, timeout, max_message
        # the plan being run (bind_plan): its id goes on every data frame we send, and an early
        # frame carrying it is bounded by its largest message; 0 = no plan (raw isend/irecv)
        self._plan, self._plan_max = 0, max_message
        self.store, self._server, self.group = store, server, group
        if store is None:  # made without a store: nothing to keep an agreement log on
            self.capabilities = Capabilities(arrival_order=True)
        self._listener = listener
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._conns: dict[int, _Conn] = {}
        self._pending: dict[socket.socket, float] = {}  # in the handshake, oldest first: since
        self._posted: dict[tuple[int, int], deque] = {}
        self._held: dict[tuple[int, int], deque] = {}
        # per tag space: plan -> receives posted and waiting / early frames not yet taken
        self._space_posted: dict[int, dict[int, int]] = {}
        self._space_held: dict[int, dict[int, int]] = {}
        self._dead: dict[int, str] = {}  # rank -> how we learnt it died
        self._aborted: dict[int, int] = {}  # peer -> the dead rank it reported (it stops too)
        self._errors: dict[int, RuntimeFault] = {}  # peer -> protocol/authentication error
        self._forwarded: set[int] = set()
        self._closing = False
        self._launched = False  # set by the launcher's workers: the store lists dead ranks
        self._gaveup_seen = 0  # entries of the store's list of ranks that gave up already read
        self._outstanding: dict[int, int] = {}  # peer -> requests not yet complete
        self._track = False
        self._completed: deque = deque()
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"hcc-accept-{rank}", daemon=True)
        self._accept_thread.start()

    # -- connections --------------------------------------------------------------------
    def _accept_loop(self) -> None:
        # at most max(MAX_PENDING, world) in the handshake (a job's own burst is world - 1):
        # past it the oldest goes if it has had PENDING_GRACE_S, else the newcomer does
        accept_loop(self._listener, lambda: self._closing, self._lock, self._pending, max(MAX_PENDING, self.world),
                    self._accept_one, f"hcc-handshake-{self.rank}")

    def _accept_one(self, sock: socket.socket) -> None:
        try:
            peer, session = accept_handshake(sock, self.token, self.rank, self.world, min(self.timeout, 10.0))
        except (OSError, ConnectionError, RuntimeFault, struct.error):
            with self._lock:
                self._pending.pop(sock, None)
            sock.close()  # an unauthenticated connection gets nothing, and costs us nothing
            return
        with self._lock:
            if self._pending.pop(sock, False) is False:  # dropped for a newer one meanwhile
                sock.close()
                return
            conn = self._get_conn(peer)
            if conn.sock is not None:  # a second connection claiming the same rank: refuse it
                sock.close()
                return
            conn.sock = sock
        self._attach(conn, sock, session)

    def _get_conn(self, peer: int) -> _Conn:
        """The connection object for ``peer`` (created on first use; call with the lock held)."""
        conn = self._conns.get(peer)
        if conn is None:
            if not 0 <= peer < self.world or peer == self.rank:
                raise RuntimeFault(f"rank {self.rank}: no peer rank {peer} in a world of {self.world}")
            conn = self._conns[peer] = _Conn(peer)
            # a connection opened after deaths were gossiped carries them first (else this
            # rank's BYE, when it gives up, would be the first sign of trouble the peer sees)
            conn.queue.extend(("fail", d) for d in sorted(self._forwarded) if d != peer)
            if self.rank < peer:  # the lower rank dials, from the writer thread
                conn.writer = threading.Thread(target=self._writer, args=(conn, True), daemon=True,
                                               name=f"hcc-w{self.rank}-{peer}")
                conn.writer.start()
        return conn

    def _attach(self, conn: _Conn, sock: socket.socket, session: bytes) -> None:
        conn.sock, conn.session = sock, session
        conn.reader = threading.Thread(target=self._reader, args=(conn,), daemon=True,
                                       name=f"hcc-r{self.rank}-{conn.peer}")
        conn.reader.start()
        if conn.writer is None:
            conn.writer = threading.Thread(target=self._writer, args=(conn, False), daemon=True,
                                           name=f"hcc-w{self.rank}-{conn.peer}")
            conn.writer.start()
        with conn.cv:
            conn.cv.notify_all()

    def _mark_dead(self, peer: int, how: str) -> None:
        with self._cond:
            if self._closing or peer in self._dead:
                return
        # the FAIL frames are queued before any waiter can see the death: a waiter that gives
        # up on it closes, and its BYE must not overtake them
        self._gossip(peer, how)
        with self._cond:
            if peer not in self._dead:
                self._dead[peer] = how
            self._cond.notify_all()

    def _gossip(self, dead: int, how: str = "") -> None:
        """Tell every other connected peer that ``dead`` died (once per dead rank; ``how``:
        what this rank knows of it)."""
        with self._lock:
            if dead in self._forwarded or self._closing:
                return
            self._forwarded.add(dead)
            conns = [c for p, c in self._conns.items() if p != dead]
        for c in conns:
            with c.cv:
                # ahead of queued data, but never inside a frame: an inline send in isend may
                # have written the head of the first queued message already (req.sent > 0)
                head = c.queue[0] if c.queue else None
                at = 1 if isinstance(head, _Req) and head.sent > 0 else 0
                c.queue.insert(at, ("fail", dead))
                c.cv.notify()

    def _dial(self, conn: _Conn) -> bool:
        """Dial ``conn``'s peer, authenticate and attach the connection; False when that failed
        (recorded: an authentication error, or the peer marked dead)."""
        peer = conn.peer
        try:
            sock, session = dial_handshake(self.addresses[peer], self.token, self.rank, peer,
                                           self.world, min(self.timeout, 30.0))
        except AuthenticationError as e:
            with self._cond:
                self._errors[peer] = e
                self._cond.notify_all()
            return False
        except OSError as e:
            self._mark_dead(peer, f"connection refused: {e.strerror or e}")
            return False
        self._attach(conn, sock, session)
        return True

    # -- writer ---------------------------------------------------------------------------
    def _writer(self, conn: _Conn, dial: bool) -> None:
        peer = conn.peer
        if dial and not self._dial(conn):
            return
        sock = conn.sock
        link_free = time.monotonic()
        while True:
            with conn.cv:
                conn.busy = False
                while not conn.queue:
                    conn.cv.wait()
                item = conn.queue.popleft()
                conn.busy = True
            try:
                if item is None:
                    sock.sendall(FRAME.pack(MAGIC, BYE, conn.session, 0, 0, 0))
                    sock.shutdown(socket.SHUT_WR)
                    return
                if isinstance(item, tuple):  # ("fail", dead rank)
                    sock.sendall(FRAME.pack(MAGIC, FAIL, conn.session, 0, item[1], 0))
                    continue
                req: _Req = item
                data = req.buf
                if self.pace_Bps:
                    # link emulation: the frame occupies this connection for nbytes/pace
                    # seconds and arrives at the end of it (sleeping, so no CPU is used)
                    link_free = max(link_free, time.monotonic()) + data.nbytes / self.pace_Bps
                    time.sleep(max(0.0, link_free - time.monotonic()))
                header = FRAME.pack(MAGIC, DATA, conn.session, req.plan, req.tag, data.nbytes)
                off = req.sent  # > 0: an inline send in isend wrote the first bytes already
                if off < len(header):
                    off += sock.sendmsg([header[off:], data])
                if off < len(header):
                    sock.sendall(header[off:])
                    off = len(header)
                if off - len(header) < data.nbytes:
                    sock.sendall(data[off - len(header):])
            except OSError as e:
                if not self._closing:
                    self._mark_dead(peer, f"send failed: {e.strerror or e}")
                return
            if not isinstance(item, tuple):
                with self._cond:
                    self._done(req)
                    if not conn.queue:
                        conn.busy = False  # see _failure_for: nothing of ours is in flight
                    self._cond.notify_all()

    # -- reader ---------------------------------------------------------------------------
    def _protocol_error(self, conn: _Conn, msg: str) -> None:
        with self._cond:
            self._errors[conn.peer] = ProtocolError(f"rank {self.rank}: from rank {conn.peer}: {msg}")
            self._cond.notify_all()
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _reader(self, conn: _Conn) -> None:
        sock, peer = conn.sock, conn.peer
        hbuf = bytearray(FRAME.size)
        hview = memoryview(hbuf)
        try:
            while True:
                got = 0
                while got < FRAME.size:
                    k = sock.recv_into(hview[got:], FRAME.size - got)
                    if k == 0:
                        raise ConnectionError("connection closed" if got == 0 else "connection closed mid-header")
                    got += k
                magic, kind, session, plan, tag, length = FRAME.unpack(hbuf)
                if magic != MAGIC or session != conn.session:
                    return self._protocol_error(conn, "bad frame header (magic or session id)")
                if kind == BYE:
                    conn.bye_received = True
                    with self._cond:
                        self._cond.notify_all()
                    return
                if kind == FAIL:
                    if not 0 <= tag < self.world:
                        return self._protocol_error(conn, f"a FAIL frame names rank {tag}, outside a world "
                                                          f"of {self.world}")
                    how = (f"reported by rank {peer}" if tag != peer else
                           "it gave up and announced it (its input was refused, or its run failed)")
                    self._gossip(tag, how)  # passed on before a waiter here can give up on it
                    with self._cond:
                        if tag not in self._dead and tag != self.rank:
                            self._dead[tag] = how
                        self._aborted[peer] = tag
                        self._cond.notify_all()
                    continue
                if kind != DATA:
                    return self._protocol_error(conn, f"unknown frame kind {kind}")
                key = (peer, tag)
                req = held = None
                bad = ""
                with self._lock:
                    q = self._posted.get(key)
                    if q:
                        req = q[0]
                        if req.plan != plan:
                            bad = (f"message tag {tag} belongs to plan {plan:08x}, the posted receive "
                                   f"to plan {req.plan:08x}: the ranks are running different plans")
                        elif req.nbytes != length:
                            bad = f"message tag {tag} has {length} bytes, the posted receive expects {req.nbytes}"
                        else:
                            q.popleft()
                            _bump(self._space_posted, tag, plan, -1)
                    elif clash := _space_clash(self._space_posted, tag, plan):
                        bad = (f"message tag {tag} belongs to plan {plan:08x}, this rank runs plan "
                               f"{clash[1]:08x} in its tag space {clash[0]}: the ranks are running different "
                               "plans as one call")
                    elif length > (bound := self._plan_max if plan == self._plan else self.max_message):
                        # checked before anything is allocated
                        bad = (f"frame length {length} exceeds the bound of {bound} bytes"
                               + (f" (the largest message of plan {plan:08x})" if plan == self._plan else ""))
                    else:
                        held = _Held(length, plan)
                        self._held.setdefault(key, deque()).append(held)
                        _bump(self._space_held, tag, plan, 1)
                if bad:
                    return self._protocol_error(conn, bad)
                if req is not None and req.fold is not None:
                    if not self._recv_folded(conn, req, length):
                        return
                else:
                    target = req.buf if req is not None else memoryview(held.data)
                    recv_into_exact(sock, target[:length], "connection closed mid-message")
                waiter = None
                with self._cond:
                    if req is not None:
                        self._done(req)
                        self._cond.notify_all()
                    else:
                        held.complete = True
                        waiter = held.waiter
                        if waiter is not None:
                            self._held[key].remove(held)
                if waiter is not None:  # its receive was posted while the frame was arriving
                    try:
                        _deliver(waiter, memoryview(held.data))
                    except Exception as e:  # a failing fold is this rank's bug, not the peer's
                        return self._fold_error(conn, waiter, e)
                    STAGING.give(held.data)
                    with self._cond:
                        self._done(waiter)
                        self._cond.notify_all()
        except (OSError, ConnectionError) as e:
            if not self._closing and not conn.bye_received:
                self._mark_dead(peer, f"connection lost: {e}")

    def _recv_folded(self, conn: _Conn, req: _Req, length: int) -> bool:
        """Receive a message for :meth:`irecv_fold` piece by piece into the connection's
        scratch, folding each piece as it lands; False after a fold error (reported)."""
        if conn.scratch is None:
            conn.scratch = memoryview(np.empty(FOLD_PIECE, dtype=np.uint8))
        scratch, sock = conn.scratch, conn.sock
        off = 0
        while off < length:
            want = min(FOLD_PIECE, length - off)
            recv_into_exact(sock, scratch[:want], "connection closed mid-message")
            try:
                req.fold(off, scratch[:want])
            except Exception as e:
                self._fold_error(conn, req, e)
                return False
            off += want
        return True

    def _fold_error(self, conn: _Conn, req: _Req, e: Exception) -> None:
        self._protocol_error(conn, f"folding message tag {req.tag} failed: {type(e).__name__}: {e}")

    # -- Transport ------------------------------------------------------------------------
    @staticmethod
    def _bytes_view(buf) -> memoryview:
        view = buf if isinstance(buf, memoryview) else memoryview(buf)
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")

    def isend(self, peer: int, tag: int, data: memoryview, plan: int | None = None) -> Request:
        """Queue a frame for the connection's writer — or, when the writer is idle and its
        queue empty, write it at once from this thread with ``MSG_DONTWAIT`` (what the socket
        buffer takes; the writer finishes the rest). The inline path saves two thread
        hand-offs per message: a 16 MiB chain broadcast in 256 KiB chunks sends 64 frames
        per hop, and each hand-off is a wake-up of a thread that must then win the GIL."""
        # plan: the id to stamp instead of the bound one (a communicator that runs several
        # plans at once, each in its own tag space: hcc/collectives.py)
        req = _Req(peer, tag, self._bytes_view(data), True, self._plan if plan is None else plan)
        with self._lock:
            conn = self._get_conn(peer)
            self._outstanding[peer] = self._outstanding.get(peer, 0) + 1
        finished = False
        with conn.cv:
            if (not conn.queue and not conn.busy and conn.session and not self.pace_Bps
                    and not self._closing):
                header = FRAME.pack(MAGIC, DATA, conn.session, req.plan, tag, req.buf.nbytes)
                try:
                    req.sent = conn.sock.sendmsg([header, req.buf], (), socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    req.sent = 0
                except OSError:
                    req.sent = 0  # the writer meets the same error and reports the peer dead
                finished = req.sent == len(header) + req.buf.nbytes
            if not finished:
                conn.queue.append(req)
                conn.cv.notify()
        if finished:
            with self._cond:
                self._done(req)
                self._cond.notify_all()
        return req

    def irecv(self, peer: int, tag: int, buf: memoryview, plan: int | None = None) -> Request:
        buf = self._bytes_view(buf)
        if buf.readonly:
            raise RuntimeFault(f"rank {self.rank}: receive buffer for tag {tag} is read-only")
        return self._post_recv(_Req(peer, tag, buf, False, self._plan if plan is None else plan))

    def irecv_fold(self, peer: int, tag: int, nbytes: int, fold: Callable[[int, memoryview], None],
                   plan: int | None = None) -> Request:
        """Receive a message of ``nbytes`` bytes without a destination buffer: the connection's
        reader thread calls ``fold(offset, piece)`` for consecutive pieces of it (at most
        :data:`FOLD_PIECE` bytes, byte offsets from 0; ``piece`` is valid only during the
        call) while the piece is hot in cache; the request completes after the last piece.
        A message that arrived before this call is folded at once, whole, by the caller.

        This is the optional fused primitive the executor uses for a plan's ``RecvReduce``
        (``fold`` reduces the piece into the destination slice): the transport never knows
        what the fold computes. Why: a 64 MiB 4-rank ring allreduce otherwise lands each
        16 MiB block in a staging buffer and reduces it only once all of it arrived — the
        reduction cannot overlap the transfer, and it reads the staging back from memory."""
        if nbytes < 0:
            raise RuntimeFault(f"rank {self.rank}: negative message size {nbytes} for tag {tag}")
        return self._post_recv(_Req(peer, tag, None, False, self._plan if plan is None else plan, fold, nbytes))

    def _post_recv(self, req: _Req) -> Request:
        peer, tag = req.peer, req.tag
        key = (peer, tag)
        ready = None
        with self._lock:
            self._get_conn(peer)
            if clash := _space_clash(self._space_held, tag, req.plan):
                raise ProtocolError(
                    f"rank {self.rank}: a receive of plan {req.plan:08x} (tag {tag}) is posted in tag space "
                    f"{clash[0]}, where a peer already sent a message of plan {clash[1]:08x}: the ranks are "
                    "running different plans as one call")
            for held in self._held.get(key, ()):
                if held.waiter is None:
                    if held.plan != req.plan:
                        raise ProtocolError(
                            f"rank {self.rank}: rank {peer} sent tag {tag} of plan {held.plan:08x}, this "
                            f"rank receives it for plan {req.plan:08x}: the ranks are running different plans")
                    if held.data.nbytes != req.nbytes:
                        raise ProtocolError(
                            f"rank {self.rank}: rank {peer} sent {held.data.nbytes} bytes with tag {tag}, "
                            f"the receive expects {req.nbytes}")
                    self._outstanding[peer] = self._outstanding.get(peer, 0) + 1
                    _bump(self._space_held, tag, held.plan, -1)
                    if held.complete:
                        self._held[key].remove(held)
                        ready = held
                    else:
                        held.waiter = req
                    break
            else:
                self._outstanding[peer] = self._outstanding.get(peer, 0) + 1
                self._posted.setdefault(key, deque()).append(req)
                _bump(self._space_posted, tag, req.plan, 1)
        if ready is not None:  # copied or folded outside the lock: the readers keep going
            _deliver(req, memoryview(ready.data))
            STAGING.give(ready.data)
            with self._cond:
                self._done(req)
        return req

    def _done(self, req: _Req) -> None:
        """Mark ``req`` complete (call with the lock held)."""
        req.done = True
        self._outstanding[req.peer] -= 1
        if self._track:
            self._completed.append(req)
        if req.on_done is not None:
            req.on_done()

    def bind_plan(self, plan_id: int, max_message: int) -> None:
        """Stamp ``plan_id`` on the data frames of the requests posted from now on and check it
        on arrival (see :meth:`Transport.bind_plan`); an early frame of this plan must not
        exceed ``max_message`` (nor the transport's own bound), one of another plan (a peer
        already in its next run) the transport's bound."""
        if not 0 <= plan_id < 1 << 32:
            raise RuntimeFault(f"rank {self.rank}: plan id {plan_id} is not a 32-bit id")
        with self._lock:
            self._plan, self._plan_max = plan_id, min(int(max_message), self.max_message)

    def track_completions(self, on: bool) -> None:
        """Record completed requests for :meth:`wait_completed` (the executor's fast path)."""
        with self._lock:
            self._track = on
            self._completed.clear()

    def wait_completed(self, timeout: float) -> list[Request]:
        """The requests completed since the last call (at least one), in completion order.

        Same errors and deadline as :meth:`wait_any`, but O(completed) instead of a scan of
        every outstanding request: a 64 MiB broadcast in 256 KiB chunks keeps ~256 receives
        outstanding, and rescanning them at every completion costs O(P²) Python steps."""
        deadline = time.monotonic() + timeout
        try:
            with self._cond:
                while True:
                    if self._completed:
                        done = list(self._completed)
                        self._completed.clear()
                        return done
                    busy = [p for p, k in self._outstanding.items() if k > 0]
                    for p in busy:
                        err = self._failure_for(p)
                        if err is not None:
                            raise err
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise CollectiveTimeout(self.rank, busy[0] if busy else -1, "no message arrived", timeout)
                    self._nap(left)
        except PeerFailed as e:
            self._closed_early(e)
            raise

    def _closed_early(self, err: PeerFailed) -> None:
        """After a wait failed on ``err`` (outside the lock): a peer that closed its connection
        with a request of ours outstanding is dead for the rest of this communicator's life,
        and every other peer is told (a FAIL frame), as for a peer whose connection broke.
        Else this rank's own close, when it gives up, would be the first sign of trouble its
        peers see, and they would name this rank instead of the one that failed."""
        if err.peer != self.rank and err.peer not in self._dead and err.detail == CLOSED:
            self._mark_dead(err.peer, CLOSED)

    def _failure_for(self, peer: int) -> Exception | None:
        if peer in self._errors:
            return self._errors[peer]
        if peer in self._dead:
            return PeerFailed(self.rank, peer, self._dead[peer])
        if peer in self._aborted:
            dead = self._aborted[peer]
            return PeerFailed(self.rank, dead, f"reported by rank {peer}")
        conn = self._conns.get(peer)
        if conn is not None and conn.bye_received and not conn.busy and not conn.queue:
            # a peer that got our last frame may finish and say BYE before our writer thread
            # has marked that send done: only a close with nothing of ours in flight fails
            return PeerFailed(self.rank, peer, CLOSED)
        return None

    def _await(self, requests: list[Request], timeout: float, check: Callable[[], list[int] | None],
               expired: Callable[[], list[int]]) -> list[int]:
        """Under the condition: the indices of the completed ``requests`` as soon as there are
        any; else what ``check()`` returns (looked at every turn; None: keep waiting; it may
        raise), or ``expired()`` once ``timeout`` seconds have passed."""
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                done = [i for i, r in enumerate(requests) if r.done]
                if done:
                    return done
                stop = check()
                if stop is not None:
                    return stop
                left = end - time.monotonic()
                if left <= 0:
                    return expired()
                self._nap(left)

    def wait_any(self, requests: list[Request], timeout: float) -> list[int]:
        def failed() -> None:
            if self._errors or self._dead or self._aborted or any(c.bye_received for c in self._conns.values()):
                for r in requests:
                    err = self._failure_for(r.peer)
                    if err is not None:
                        raise err

        def expired() -> list[int]:
            peer = requests[0].peer if requests else -1
            raise CollectiveTimeout(self.rank, peer, "no message arrived", timeout)

        try:
            return self._await(requests, timeout, failed, expired)
        except PeerFailed as e:
            self._closed_early(e)
            raise

    def _nap(self, left: float) -> None:
        """Wait on the (held) condition for at most ``left`` seconds; when nothing woke it, ask
        the launcher's store who died (the condition is released meanwhile)."""
        if not self._cond.wait(min(left, STORE_POLL)) and self._launched:
            self._cond.release()
            try:
                self._poll_launcher()
            finally:
                self._cond.acquire()

    def _poll_launcher(self) -> None:
        """Ask the launcher's store which ranks it saw die (a rank that died before any
        connection to us existed cannot be seen by a reader thread), and which ranks gave up
        (:meth:`announce_failure`)."""
        try:
            dead = self.store.peek(f"{self.group}/dead") or []
            n = self.store.peek(f"{self.group}/ngaveup") or 0
            gave = [self.store.peek(f"{self.group}/gaveup/{k}") for k in range(self._gaveup_seen + 1, n + 1)]
        except RuntimeFault:
            self._launched = False  # the store is gone: rely on connections and deadlines
            return
        self._gaveup_seen = max(self._gaveup_seen, n if isinstance(n, int) else 0)
        for r in dead:
            if isinstance(r, int) and r != self.rank:
                self._mark_dead(r, "its process died (reported by the launcher)")
        for r in gave:
            if isinstance(r, int) and 0 <= r < self.world and r != self.rank:
                self._mark_dead(r, "it gave up and announced it in the store (its input was refused, or its run failed)")

    def announce_failure(self, reason: str = "") -> None:
        """This rank will not take part in the run it was given (its array was refused before
        any byte moved): tell every peer now instead of leaving them to their deadline — a
        FAIL frame naming this rank on every connection (dialling the higher ranks it has
        none to yet; the others pass it on), and, in the store, the list of ranks that gave up,
        which launched ranks read with the launcher's list of the dead. Peers then treat this
        rank as dead for the rest of the communicator's life."""
        with self._lock:
            if self._closing:
                return
            for p in range(self.rank + 1, self.world):
                if p not in self._dead:
                    self._get_conn(p)
        self._gossip(self.rank)
        if self.store is not None:
            try:
                k = self.store.add(f"{self.group}/ngaveup", 1)
                self.store.set(f"{self.group}/gaveup/{k}", self.rank)
            except RuntimeFault:
                pass  # the frames still go

    def failed(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._dead)

    def wait_change(self, requests: list[Request], timeout: float, *,
                    ignore: AbstractSet[int] = frozenset(),
                    woken: Callable[[], bool] = lambda: False) -> list[int]:
        return self._await(requests, timeout, lambda: [] if woken() or (set(self._dead) - set(ignore)) else None,
                           lambda: [])

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def barrier(self, name: str, timeout: float | None = None) -> None:
        """All ranks of this job meet at ``name`` (through the rendezvous store)."""
        if self.store is None:
            raise RendezvousError(f"rank {self.rank}: no rendezvous store to hold a barrier")
        key = f"barrier/{self.group}/{name}"
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        first = True
        while True:
            # wait in 0.2 s slices so a peer's death (seen by a reader thread) ends the barrier
            # at once instead of after the whole deadline. The launcher's list of dead ranks is
            # read only once a slice passed: before the first wait it is one more store round
            # trip for the last rank to arrive, which every timed region after a barrier pays
            # (the others are released by its arrival and start that much earlier)
            if self._launched and not first:
                self._poll_launcher()
            with self._lock:
                dead = next(iter(self._dead.items()), None)
            if dead is not None:
                raise RankFailed(dead[0], by=self.rank, detail=f"at barrier {name!r}; {dead[1]}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise CollectiveTimeout(self.rank, -1, f"barrier {name!r}", limit)
            try:
                if first:  # add this rank and wait in one round trip; a timeout keeps the add
                    first = False
                    self.store.arrive(key, self.world, min(0.2, left))
                else:
                    self.store.wait(key, self.world, min(0.2, left))
                return
            except RendezvousError as e:
                if "timeout" not in str(e):
                    raise

    def close(self) -> None:
        with self._lock:
            if self._closing:
                return
            conns = list(self._conns.values())
        for c in conns:  # BYE after every queued send, then half-close
            with c.cv:
                c.queue.append(None)
                c.cv.notify()
        deadline = time.monotonic() + min(self.timeout, 5.0)
        for c in conns:
            if c.writer is not None and c.writer.is_alive():
                c.writer.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._closing = True
        for c in conns:  # wait (bounded) for the peer's BYE so no byte in flight is reset
            if c.reader is not None and c.reader.is_alive():
                c.reader.join(max(0.0, deadline - time.monotonic()))
            if c.sock is not None:
                c.sock.close()
        self._close_endpoints()

    def _close_endpoints(self) -> None:
        """Close what is not a connection: the listener, the store client, the store server."""
        try:
            self._listener.close()
        except OSError:
            pass
        if self.store is not None:
            self.store.close()
        if self._server is not None:
            self._server.close()


def connect(rank: int, world: int, rendezvous: str = "127.0.0.1:29500", token: str | bytes | None = None,
            timeout: float = 30.0, *, serve_store: bool | None = None, host: str = "127.0.0.1",
            group: str = "hcc", max_message: int = DEFAULT_MAX_MESSAGE, pace_Bps: float = 0.0,
            shm: str | None = None) -> SocketTransport:
    """Join a sockets job as ``rank`` of ``world``; returns a :class:`SocketTransport`.

    ``token``: the shared secret (default: the ``HCC_TOKEN`` environment variable). Rank 0
    serves the rendezvous store at ``rendezvous`` unless ``serve_store=False`` (a launcher
    runs it) — from a process of its own that outlives rank 0 (rendezvous.spawn_store); with
    the default, every rank also has the store list it in ``<group>/dead`` should its process
    die, as a launcher would. ``host``: the address this rank listens on. Blocks until every rank has joined
    (at most ``timeout`` seconds). ``pace_Bps > 0`` paces every connection to that many
    bytes/s (an emulated link, for measurements that must not be CPU-bound; 0 = full speed).
    ``shm``: shared-memory channels to the ranks on this host (backends/shm.py): ``auto``
    (default, or the ``HCC_SHM`` environment variable), ``on`` or ``off``; paced links keep TCP."""
    if token is None:
        token = os.environ.get("HCC_TOKEN")
    if not token:
        raise AuthenticationError("connect: a token is required (argument or HCC_TOKEN)")
    tok = token.encode() if isinstance(token, str) else bytes(token)
    if not 0 <= rank < world:
        raise RuntimeFault(f"connect: rank {rank} outside a world of {world}")
    # no launcher: rank 0 starts the store, and each rank has the store note its death
    # (StoreClient.own) in the list a launcher would keep, ``<group>/dead``
    launcherless = serve_store is None
    if serve_store is None:
        serve_store = rank == 0
    server = None
    if serve_store:
        # in a process of its own that outlives this one: rank 0's death must not take the
        # survivors' store (their rendezvous and agreement log) with it (rendezvous.spawn_store)
        from .rendezvous import spawn_store

        h, p = parse_address(rendezvous)
        server = spawn_store(tok, h, p, world, timeout)
    listener = None
    store = None
    try:
        store = StoreClient(rendezvous, tok, timeout)
        if launcherless:
            store.own(f"{group}/dead", rank)
        listener = socket.create_server((host, 0), backlog=max(16, world))
        lh, lp = listener.getsockname()[:2]
        store.set(f"{group}/addr/{rank}", f"{lh}:{lp}")
        addresses, gone = _join(store, group, rank, world, timeout)
        store.add(f"{group}/joined", 1)
    except BaseException:
        for x in (listener, store, server):
            if x is not None:
                x.close()
        raise
    comm = SocketTransport(rank, world, tok, addresses, listener, timeout, max_message, store, server, group,
                           pace_Bps)
    comm._launched = launcherless or comm._launched  # the store lists the dead: ask it
    for p in sorted(gone):  # the group forms without them; the runtime decides what that means
        comm._launched = True
        comm._mark_dead(p, "its process died before it joined (reported by the launcher)")
    if pace_Bps:  # emulated links are a property of the TCP path
        return comm
    from .shm import enable

    try:
        return enable(comm, shm, timeout)
    except BaseException:
        comm.close()
        raise


# A joining rank reads the addresses in slices this long, and between them the launcher's list
# of dead ranks: a rank SIGKILLed before it published its address is then known dead within
# one slice instead of holding every other rank for the whole join timeout.
JOIN_SLICE_S = 0.2
# The address a rank that died before it joined gets: a dial to it is refused at once (port 0
# is never listening), which the writer reports as the death it is.
_NOWHERE = ("127.0.0.1", 0)


def _join(store, group: str, rank: int, world: int, timeout: float) -> tuple[dict, set]:
    """Every other rank's address, and the ranks the launcher reported dead before they
    published one (``<group>/dead``, which ``launch`` writes as it reaps a killed child).
    Raises :class:`RendezvousError` when a rank neither joins nor is reported dead by the
    deadline."""
    from .rendezvous import RendezvousError

    addresses: dict = {}
    gone: set = set()
    end = time.monotonic() + timeout
    for p in range(world):
        while p != rank and p not in addresses and p not in gone:
            left = end - time.monotonic()
            if left <= 0:
                raise RendezvousError(f"rank {rank}: rank {p} did not join within {timeout:g} s")
            try:
                addresses[p] = parse_address(store.get(f"{group}/addr/{p}", min(JOIN_SLICE_S, left)))
            except RendezvousError as e:
                if "timeout" not in str(e):
                    raise
                dead = store.peek(f"{group}/dead") or []
                gone.update(d for d in dead if isinstance(d, int) and 0 <= d < world and d != rank
                            and d not in addresses)
    for p in gone:
        addresses[p] = _NOWHERE
    return addresses, gone


def run_local(plan, inputs, *, iters: int = 1, warmup: int = 0, timeout: float = 60.0, **kw):
    """Run ``plan`` on ``plan.n`` local processes over sockets (see backends/launch.py)."""
    from .launch import run_cases_local

    return run_cases_local("sockets", [(plan, inputs)], iters=iters, warmup=warmup, timeout=timeout, **kw)[0]


def _worker_main(argv: list[str] | None = None) -> int:
    """``python -m hcc.backends.sockets --job DIR --rank R``: one rank of a launched job."""
    from .launch import worker_run

    ap = argparse.ArgumentParser(prog="python -m hcc.backends.sockets")
    ap.add_argument("--job", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--max-message", type=int, default=DEFAULT_MAX_MESSAGE)
    ap.add_argument("--pace", type=float, default=0.0, help="emulated link bytes/s per connection")
    a = ap.parse_args(argv)

    def make_comm() -> Any:
        comm = connect(a.rank, a.world, a.store, os.environ.get("HCC_TOKEN"), a.timeout, serve_store=False,
                       host=a.host, max_message=a.max_message, pace_Bps=a.pace)
        comm._launched = True
        return comm

    return worker_run(a.job, a.rank, make_comm)


if __name__ == "__main__":
    sys.exit(_worker_main())
