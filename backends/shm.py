"""hcc.backends.shm — shared-memory channels between the ranks of one host, inside the sockets
backend, chosen per peer.

    comm = hcc.backends.sockets.connect(rank, world, rendezvous, token=tok)   # shm="auto"

Terms
- host: ranks share one when they have the same kernel boot id and network namespace
  (``/proc/sys/kernel/random/boot_id``, the inode of ``/proc/self/ns/net``): the same memory,
  and the abstract unix socket namespace the setup uses. Ranks in different namespaces on
  one machine (``hcc netem``'s emulated hosts) are different hosts and keep TCP.
- per-peer choice: after :func:`~hcc.backends.sockets.connect` every rank publishes its host
  and the name of an abstract unix socket in the rendezvous store; peers on the same host
  exchange data through shared memory, the others over the sockets transport's TCP
  connections, so one job can mix both. ``shm="off"`` (or ``HCC_SHM=off``) keeps TCP for
  every peer; ``"on"`` requires the channels (an error when the native core is not built).
- setup: for each pair of local ranks the lower dials the higher's abstract unix socket
  (nothing in any filesystem), both authenticate with the sockets backend's HMAC challenge
  over the shared token (:func:`~hcc.backends.sockets.dial_handshake` /
  :func:`~hcc.backends.sockets.accept_handshake`), then pass each other, with SCM_RIGHTS, a
  memfd (the rank's segment: its bell and one ring per local peer) and an eventfd (its
  wake-up). No segment has a name: it lives exactly as long as some process of the job maps
  it, so nothing outlives the job, SIGKILL included.
- liveness: the unix connection stays open. A peer's death closes it (EOF at once, noticed
  by a rank blocked on the channels without any timed polling); a clean close first sets
  the ``closed`` flag in its bell and sends one byte. A dead peer a wait depends on is a
  :class:`~hcc.backends.base.PeerFailed` (the executor's ``RankFailed``), as an EOF on TCP.
  A rank that learns of a death writes the dead rank into its bell (the channels' FAIL
  frame): a rank waiting on a peer that stopped because of it names the rank that died.

The data path, the wake-ups and the program runner are the native core's
(``backends/_native.c``); this module sets the channels up and adapts them to the
:class:`~hcc.backends.base.Transport` interface, so the pure-Python executor and the adaptive
runtime run over them unchanged. ``RankExecution.execute`` hands the program to
:meth:`ShmSocketTransport.native_run`: the core runs it without the GIL, and in a mixed job
hands its transfers to peers on other hosts to the TCP connections (posted from the core's
thread with the GIL taken back briefly; their completions wake the core through its
eventfd, a received piece to reduce is reduced by the core under its lock).

Ring geometry: one ring per ordered pair of ``HCC_SHM_SLOTS`` (default 8) times
``HCC_SHM_SLOT_KIB`` KiB (default 256) of pieces packed back to back; a message moves in
pieces of at most ``HCC_SHM_SLOT_KIB``: a piece is reduced from the ring while it is in the
receiver's L2 (1 MiB per core here), and the ring keeps the sender several pieces — or
hundreds of small messages — ahead. Every rank of a job must use the same geometry.
"""
from __future__ import annotations

import os
import secrets
import socket
import struct
import threading
import time
from typing import AbstractSet, Callable

from .base import CollectiveTimeout, PeerFailed, RankFailed, Request, RootFailed, RuntimeFault
from .rendezvous import AuthenticationError, recv_exact
from .sockets import CLOSED, ProtocolError, SocketTransport, accept_handshake, dial_handshake
from . import native

__all__ = ["ShmSocketTransport", "ShmBoard", "enable", "host_id", "ShmUnavailable", "DEFAULT_SLOTS", "DEFAULT_SLOT_KIB"]

DEFAULT_SLOTS = 8
DEFAULT_SLOT_KIB = 256
# bounded spin before a rank sleeps on its eventfd: 100 pauses. A pause measured 30-230 ns on
# this machine's EPYC cores, so 2000 of them burnt up to ~0.4 ms a wait: the runner's CPU per
# message of a 4-rank allreduce in 16 KiB chunks was 12-14 us, most of it spinning while the
# peer waited for the core (4 ranks on 2 cores). A wake-up through the eventfd costs a few us.
DEFAULT_SPIN = 100
_INFO = struct.Struct("!4sIIIQI")  # magic, rank, nslots, slot_bytes, segment bytes, ring index
_INFO_MAGIC = b"HCCM"
_SLICE = 0.002  # s: a wait over both channels and TCP alternates in slices this long


class ShmUnavailable(RuntimeFault):
    """``shm="on"`` but the native core is not built."""


def host_id() -> str:
    """This process's host as the channels see it: boot id and network namespace, and the
    ``HCC_SHM_HOST`` label when set (ranks with different labels never share memory: a way
    to split one machine's ranks into groups, as a job spread over hosts would be)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        net = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return ""  # no /proc: never local to anyone
    label = os.environ.get("HCC_SHM_HOST", "")
    return f"{boot}:{net}" + (f":{label}" if label else "")


def _geometry() -> tuple[int, int, int]:
    slots = int(os.environ.get("HCC_SHM_SLOTS", DEFAULT_SLOTS))
    slot_kib = int(os.environ.get("HCC_SHM_SLOT_KIB", DEFAULT_SLOT_KIB))
    spin = int(os.environ.get("HCC_SHM_SPIN", DEFAULT_SPIN))
    if not 2 <= slots <= 1024 or not 1 <= slot_kib <= 65536 or not 0 <= spin <= 10_000_000:
        raise RuntimeFault(f"HCC_SHM_SLOTS={slots} / HCC_SHM_SLOT_KIB={slot_kib} / HCC_SHM_SPIN={spin} "
                           "out of range (2..1024, 1..65536, 0..10^7)")
    return slots, slot_kib << 10, spin


def enable(comm: SocketTransport, mode: str | None = None, timeout: float | None = None) -> SocketTransport:
    """Give ``comm`` shared-memory channels to the ranks on its host (collective: every rank
    of the job calls it once, right after connecting). ``mode``: ``auto`` (default, from
    ``HCC_SHM``), ``on`` or ``off``. Returns ``comm``, whose class becomes
    :class:`ShmSocketTransport` when it has a local peer."""
    mode = (mode or os.environ.get("HCC_SHM") or "auto").lower()
    if mode not in ("auto", "on", "off"):
        raise RuntimeFault(f"shm must be auto, on or off, not {mode!r}")
    if mode == "off":
        return comm
    if not native.available():
        if mode == "on":
            raise ShmUnavailable("shm=on, but the native core is not built (pip install -e . builds it)")
        return comm  # every rank decides the same way: the extension is the same package
    timeout = comm.timeout if timeout is None else timeout
    rank, world, group, store = comm.rank, comm.world, comm.group, comm.store
    hid = host_id()
    name = f"hcc-shm-{secrets.token_hex(12)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind("\0" + name)  # abstract: no file, gone with the socket
        listener.listen(max(16, world))
        if " " in hid:
            raise RuntimeFault(f"HCC_SHM_HOST must not contain spaces: {hid!r}")
        store.set(f"{group}/shm/{rank}", f"{hid} {name}" if hid else "- -")
        infos = {p: store.get(f"{group}/shm/{p}", timeout) for p in range(world) if p != rank}
        local = sorted(p for p, v in infos.items() if hid and str(v).split(" ")[0] == hid)
        if not local:
            return comm
        setup = _connect_local(comm, listener, local, {p: str(infos[p]).split(" ")[1] for p in local}, timeout)
    finally:
        listener.close()
    comm.__class__ = ShmSocketTransport
    comm._shm_start(setup, local)
    return comm


def _connect_local(comm: SocketTransport, listener: socket.socket, local: list[int], names: dict[int, str],
                   timeout: float) -> list[tuple]:
    """Authenticated unix connections to every local peer and their segments; returns the
    engine's peer tuples (the fds in them are owned by the caller until the engine dups them)."""
    rank, world, token = comm.rank, comm.world, comm.token
    slots, slot_bytes, spin = _geometry()
    stride = native._native.ring_bytes(slots, slot_bytes)
    seg_size = native._native.BELL_BYTES + len(local) * stride
    ring_of = {p: i for i, p in enumerate(local)}  # our ring to p, in our segment
    seg = os.memfd_create(f"hcc-shm-r{rank}", os.MFD_CLOEXEC)
    os.ftruncate(seg, seg_size)  # sparse: only the pages the rings touch are ever allocated
    os.pwrite(seg, struct.pack("=Q", native._native.SEG_MAGIC), 0)  # before any peer maps it
    evfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    deadline = time.monotonic() + timeout
    got: dict[int, tuple] = {}  # peer -> (sock, peer seg fd, peer size, peer evfd, our ring index in it)
    errors: list[BaseException] = []

    def exchange(sock: socket.socket, peer: int) -> None:
        me = _INFO.pack(_INFO_MAGIC, rank, slots, slot_bytes, seg_size, ring_of[peer])
        socket.send_fds(sock, [me], [seg, evfd])
        msg, fds, _flags, _addr = socket.recv_fds(sock, _INFO.size, 2)
        if len(msg) != _INFO.size or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise ProtocolError(f"rank {rank}: rank {peer} sent a malformed segment message")
        magic, prank, pslots, pslot_bytes, psize, pring = _INFO.unpack(msg)
        if magic != _INFO_MAGIC or prank != peer or (pslots, pslot_bytes) != (slots, slot_bytes) \
                or psize > (1 << 40) or pring >= len(local):
            for fd in fds:
                os.close(fd)
            raise ProtocolError(f"rank {rank}: rank {peer}'s shared-memory channel does not match ours "
                                f"({pslots}x{pslot_bytes} B slots against {slots}x{slot_bytes}; "
                                "set HCC_SHM_SLOTS / HCC_SHM_SLOT_KIB alike on every rank)")
        if os.fstat(fds[0]).st_size < psize:
            for fd in fds:
                os.close(fd)
            raise ProtocolError(f"rank {rank}: rank {peer}'s segment is smaller than it says")
        got[peer] = (sock, fds[0], psize, fds[1], pring)

    lower = [p for p in local if p < rank]

    def accept_all() -> None:
        listener.settimeout(0.2)
        while len([p for p in lower if p in got]) < len(lower) and time.monotonic() < deadline:
            try:
                sock, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError as e:
                errors.append(e)
                return
            try:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                peer, _session = accept_handshake(sock, token, rank, world, max(0.1, deadline - time.monotonic()))
                if peer not in lower or peer in got:
                    raise AuthenticationError(f"rank {rank}: unexpected local peer {peer}")
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                exchange(sock, peer)
                sock.settimeout(None)
            except (OSError, ConnectionError, RuntimeFault, struct.error):
                sock.close()  # an unauthenticated connection gets nothing

    acceptor = threading.Thread(target=accept_all, name=f"hcc-shm-accept-{rank}", daemon=True)
    acceptor.start()
    try:
        for p in local:
            if p < rank:
                continue
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                for attempt in range(200):  # the peer binds before publishing: one try suffices, bounded anyway
                    try:
                        sock.connect("\0" + names[p])
                        break
                    except (ConnectionRefusedError, FileNotFoundError):
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.01)
                dial_handshake(None, token, rank, p, world, max(0.1, deadline - time.monotonic()), sock=sock)
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                exchange(sock, p)
                sock.settimeout(None)
            except BaseException:
                sock.close()
                raise
        acceptor.join(max(0.0, deadline - time.monotonic()))
        if errors:
            raise errors[0]
        missing = [p for p in local if p not in got]
        if missing:
            raise CollectiveTimeout(rank, missing[0], "shared-memory channel setup", timeout)
        return [(p, got[p][1], got[p][2], got[p][3], got[p][0], ring_of[p], got[p][4]) for p in local], seg, \
            seg_size, evfd, (slots, slot_bytes, spin)
    except BaseException:
        for v in got.values():
            v[0].close()
            os.close(v[1])
            os.close(v[3])
        os.close(seg)
        os.close(evfd)
        raise


class _ShmReq(Request):
    """A transfer on a shared-memory channel. ``buf`` keeps the caller's memory alive, and the
    transport keeps this request (``live``) until the core is done with it, even when the
    caller drops it (the adaptive runtime abandons transfers): the core writes into ``buf``
    until then."""

    __slots__ = ("peer", "tag", "buf", "handle", "_eng", "_done", "_live")

    def __init__(self, eng, handle: int, peer: int, tag: int, buf: memoryview, live: dict):
        self._eng, self.handle, self.peer, self.tag, self.buf = eng, handle, peer, tag, buf
        self._done = False
        self._live = live
        live[handle] = self

    @property
    def done(self) -> bool:
        if not self._done and self._eng.done(self.handle):
            self._finish()
        return self._done

    def _finish(self) -> None:
        self._done = True
        self._live.pop(self.handle, None)
        self._eng.release(self.handle)  # after this the handle may name another request
        self.buf = None


_SWEEP = 256  # live requests beyond which a post first forgets the completed ones


class ShmBoard:
    """``BOARD_SLOTS`` (64) counters in the shared memory of the host's lowest-numbered rank,
    which every local rank maps (the native core's board): ``add`` (atomic, returns the new
    value, wakes the local peers unless told not to), ``set``, and ``wait`` until a value is reached. What the
    adaptive runtime's fast path agrees on when a job has one host
    (backends/adaptive/fast.py); a counter is zero until first added to."""

    __slots__ = ("_engine", "_transport")
    slots = native._native.BOARD_SLOTS if native.available() else 0

    def __init__(self, engine, transport: "ShmSocketTransport | None" = None):
        self._engine, self._transport = engine, transport

    def add(self, slot: int, amount: int, wake: bool = True) -> int:
        """Add atomically; returns the new value. ``wake``: wake the local peers (only an add
        some waiter waits for needs to)."""
        return self._engine.board_add(slot, amount, wake)

    def set(self, slot: int, value: int) -> None:
        self._engine.board_set(slot, value)

    def wait(self, slot: int, at_least: int, timeout: float) -> int | None:
        """The slot's value once it is ≥ ``at_least``; None after ``timeout`` seconds."""
        value, reached = self._engine.board_wait(slot, at_least, timeout)
        return value if reached else None

    def run_gated(self, ex, slot: int, target: int, timeout: float) -> bool | None:
        """Run ``ex`` (a :class:`~hcc.backends.executor.RankExecution` of this transport) in
        the native core once the slot reaches ``target``, waiting for that inside the core:
        True when it ran (the slot held exactly one ``target``), False when nothing ran (any
        other value, or ``timeout`` seconds without one), None when the core cannot run it
        (the caller waits with :meth:`wait` instead). The adaptive fast path's wait for its
        static decision (backends/adaptive/fast.py)."""
        t = self._transport
        if t is None or ex.native_run is None or getattr(ex.native_run, "__self__", None) is not t:
            return None
        return t.native_run(ex, gate=(slot, target, timeout))


class ShmSocketTransport(SocketTransport):
    """The sockets transport with shared-memory channels to the ranks on its host (see the
    module docstring). Made by :func:`enable`; the backend is still ``sockets``."""

    # the executor's sockets-only fast paths see TCP completions only: off here (the executor
    # then waits through wait_any, which covers both kinds of peer)
    wait_completed = None
    track_completions = None
    irecv_fold = None

    def _shm_start(self, setup, local: list[int]) -> None:
        peers, seg, seg_size, evfd, (slots, slot_bytes, spin) = setup
        try:
            self._engine = native._native.Engine(self.rank, seg, seg_size, evfd, slots, slot_bytes, spin,
                                                 self.max_message,
                                                 [(p[0], p[1], p[2], p[3], p[4].fileno(), p[5], p[6]) for p in peers])
        finally:  # the engine holds its own duplicates
            for p in peers:
                os.close(p[1])
                os.close(p[3])
                p[4].close()
            os.close(seg)
            os.close(evfd)
        self._local = {p: i for i, p in enumerate(local)}
        self._reported: set[int] = set()
        self._live_reqs: dict[int, _ShmReq] = {}  # handle -> request the core may still touch
        self._sweep_at = _SWEEP

    # -- what the channels carry ------------------------------------------------------
    @property
    def local_peers(self) -> frozenset[int]:
        """The ranks this rank reaches through shared memory."""
        return frozenset(self._local)

    def isend(self, peer: int, tag: int, data, plan: int | None = None) -> Request:
        # plan: the id to stamp instead of the bound one (as SocketTransport.isend)
        idx = self._local.get(peer)
        if idx is None:
            return super().isend(peer, tag, data, plan=plan)
        view = self._bytes_view(data)
        self._sweep()
        pid = self._plan if plan is None else plan
        return _ShmReq(self._engine, self._engine.isend(idx, tag, pid, view), peer, tag, view, self._live_reqs)

    def irecv(self, peer: int, tag: int, buf, plan: int | None = None) -> Request:
        idx = self._local.get(peer)
        if idx is None:
            return super().irecv(peer, tag, buf, plan=plan)
        view = self._bytes_view(buf)
        if view.readonly:
            raise RuntimeFault(f"rank {self.rank}: irecv into a read-only buffer (tag {tag})")
        self._sweep()
        pid = self._plan if plan is None else plan
        return _ShmReq(self._engine, self._engine.irecv(idx, tag, pid, view), peer, tag, view, self._live_reqs)

    def _sweep(self) -> None:
        live = self._live_reqs
        if len(live) > self._sweep_at:  # amortised: the next sweep waits for twice as many
            for r in list(live.values()):
                if r._eng.done(r.handle):
                    r._finish()
            self._sweep_at = max(_SWEEP, 2 * len(live))

    # -- failures -----------------------------------------------------------------------
    def _shm_failure(self, status: int, peer: int, message: str, timeout: float, detail: str) -> Exception:
        if status == 1:
            return CollectiveTimeout(self.rank, peer, detail, timeout)
        if status == 3:
            return ProtocolError(f"rank {self.rank}: {message}")
        if status == 2:
            self._report_dead(peer)
            return PeerFailed(self.rank, peer, "its process died (shared-memory channel closed)")
        if status == 6:
            self._mark_dead(peer, message)
            return PeerFailed(self.rank, peer, message)
        return self._closed(peer)

    def _closed(self, peer: int) -> PeerFailed:
        """``peer`` closed its channel with a transfer of ours outstanding. A rank that gives
        up rings its bell naming the rank it saw fail, then closes: that rank is the one to
        name (a reader that took the close for the failure named the messenger). Else the
        closed peer failed, and every other peer is told (:meth:`_closed_early`)."""
        self._engine.poll()
        dead = self._engine.reported().get(peer)
        if dead is not None and 0 <= dead < self.world and dead != self.rank:
            self._mark_dead(dead, f"reported by rank {peer}")
            return PeerFailed(self.rank, dead, f"reported by rank {peer}")
        err = PeerFailed(self.rank, peer, CLOSED)
        self._closed_early(err)
        return err

    def _report_dead(self, peer: int) -> None:
        """Tell the sockets side (which gossips it to the ranks over TCP) that ``peer`` died."""
        if peer not in self._reported:
            self._reported.add(peer)
            self._mark_dead(peer, "its process died (shared-memory channel closed)")

    def failed(self) -> frozenset[int]:
        self._engine.poll()
        for r, s in self._engine.dead().items():
            if s == 1:
                self._report_dead(r)
        for p, dead in self._engine.reported().items():
            if 0 <= dead < self.world and dead != self.rank:
                self._mark_dead(dead, f"reported by rank {p}")
        return super().failed()

    def _gossip(self, dead: int, how: str = "") -> None:
        # the TCP peers get a FAIL frame (SocketTransport); the local ones read our bell
        super()._gossip(dead, how)
        self._engine.set_failed(dead)
        self._engine.kick()  # a runner with TCP transfers outstanding asks check() now

    # -- waiting --------------------------------------------------------------------------
    def wait_any(self, requests: list[Request], timeout: float) -> list[int]:
        shm = [r for r in requests if isinstance(r, _ShmReq)]
        if not shm:
            return super().wait_any(requests, timeout)
        mixed = len(shm) != len(requests)
        deadline = time.monotonic() + timeout
        while True:
            done = [i for i, r in enumerate(requests) if r.done]
            if done:
                return done
            left = deadline - time.monotonic()
            if left <= 0:
                raise CollectiveTimeout(self.rank, requests[0].peer, "no message arrived", timeout)
            live = [r.handle for r in shm if not r._done]
            _, status, peer, msg = self._engine.wait(live, min(left, _SLICE) if mixed else left)
            if status not in (0, 1, 5):
                raise self._shm_failure(status, peer, msg, timeout, "no message arrived")
            if mixed:
                tcp = [r for r in requests if not isinstance(r, _ShmReq)]
                try:
                    super().wait_any(tcp, 1e-4)
                except CollectiveTimeout:
                    pass

    def wait_change(self, requests: list[Request], timeout: float, *,
                    ignore: AbstractSet[int] = frozenset(),
                    woken: Callable[[], bool] = lambda: False) -> list[int]:
        end = time.monotonic() + timeout
        while True:
            done = [i for i, r in enumerate(requests) if r.done]
            if done:
                return done
            if woken() or (self.failed() - set(ignore)):
                return []
            left = end - time.monotonic()
            if left <= 0:
                return []
            shm = [r.handle for r in requests if isinstance(r, _ShmReq) and not r._done and r.peer not in ignore]
            tcp = [r for r in requests if not isinstance(r, _ShmReq)]
            if shm:
                _, status, _, _ = self._engine.wait(shm, min(left, _SLICE) if tcp else min(left, 0.25))
                if status not in (0, 1, 5) and not tcp:
                    # a peer of these requests failed or reported a death: the adaptive runtime
                    # decides what to do about it (failed()); the core's wait would return at
                    # once again, so this wait sleeps in slices instead
                    time.sleep(min(max(left, 0.0), _SLICE))
            if tcp or not shm:
                super().wait_change(tcp, min(left, _SLICE) if shm else min(left, 0.25), ignore=ignore,
                                    woken=woken)

    def wake(self) -> None:
        self._engine.interrupt()
        super().wake()

    # -- the native core ----------------------------------------------------------------
    def native_run(self, ex, plan: int | None = None, tag_shift: int = 0,
                   gate: tuple[int, int, float] | None = None) -> bool | None:
        """Run ``ex`` (a :class:`~hcc.backends.executor.RankExecution`) in the native core;
        False (nothing ran: the Python executor runs it) when the runner is off or the plan is
        compressed. Transfers to peers on other hosts are posted on the TCP connections when
        the core reaches them (:meth:`_external`); the core runs the rest. Raises what the
        executor would: :class:`CollectiveTimeout` naming the op, :class:`RankFailed` /
        :class:`RootFailed` for a dead peer. ``plan`` and
        ``tag_shift`` (ORed into every transfer's tag) are a communicator's run in its own
        tag space (hcc/collectives.py); the core runs one program at a time. ``gate``:
        ``(board slot, target, seconds)``, start only once the host's board slot holds exactly
        one ``target`` (:meth:`ShmBoard.run_gated`); False when it did not (nothing ran), None
        when the core cannot run ``ex`` at all."""
        if ex.codec is not None or not native.runner_enabled():
            return None if gate is not None else False
        enc = native.encode(ex, self._local)
        ops = enc.ops
        if tag_shift:
            ops = ops.copy()
            ops[ops[:, 0] <= native.K_RECV_REDUCE, 2] |= tag_shift
        pid = self._plan if plan is None else plan
        post, check = self._external(ex, pid, tag_shift) if enc.external else (None, None)
        bufs = ex.bufs
        status, op, peer, msg = self._engine.run(
            ops, enc.dep_ptr, enc.dep_idx, enc.missing, enc.first,
            native.buffer_arg(bufs.get("in")), bufs["out"], bufs.get("tmp"),
            enc.op, enc.dtype, pid, float(ex.timeout), post, check,
            *((int(gate[0]), int(gate[1]), float(gate[2])) if gate is not None else ()))
        if status == 0:
            return True
        if status == 9:  # the gate stayed shut: nothing was posted
            return False
        if status == 7:  # a TCP peer failed (check() below): what the Python executor raises
            k, err = msg
            if not isinstance(err, PeerFailed):
                raise err
            cls = RootFailed if (err.peer == ex.plan.root and ex.plan.root >= 0) else RankFailed
            detail = f"while waiting on {ex.describe(k)}" + (f"; {err.detail}" if err.detail else "")
            raise cls(err.peer, by=self.rank, detail=detail)
        where = ex.describe(op) if op >= 0 else "no outstanding transfer"
        if status == 1:
            raise CollectiveTimeout(self.rank, peer, where, ex.timeout)
        if status == 3:
            raise ProtocolError(f"rank {self.rank}: {msg}")
        if status == 2:
            self._report_dead(peer)
        elif status == 6:
            self._mark_dead(peer, msg)
        else:
            closed = self._closed(peer)
            peer, msg = closed.peer, closed.detail
        how = {2: "its process died (shared-memory channel closed)"}.get(status, msg)
        plan = ex.plan
        cls = RootFailed if (peer == plan.root and plan.root >= 0) else RankFailed
        raise cls(peer, by=self.rank, detail=f"while waiting on {where}; {how}")

    def _external(self, ex, pid: int, tag_shift: int):
        """The core's callbacks for a program with peers over TCP: ``post(gen, k)`` posts op k
        on the sockets transport (a RecvReduce folds each received piece into its destination
        through the core, under the core's lock: the core reduces into the same blocks from
        the channels), whose completion hook tells the core (``ext_done``); ``check()`` names
        a failed TCP peer of an outstanding transfer, as ``(k, error)``."""
        eng, program, kinds = self._engine, ex.program, ex.kinds
        from .executor import RECV, SEND

        reqs: dict[int, Request] = {}

        def post(gen: int, k: int) -> None:
            op, kind = program[k], kinds[k]
            tag = op.tag | tag_shift
            if kind == SEND:
                req = SocketTransport.isend(self, op.peer, tag, memoryview(ex.view(op.src)).cast("B"), plan=pid)
            elif kind == RECV:
                req = SocketTransport.irecv(self, op.peer, tag, memoryview(ex.view(op.dst)).cast("B"), plan=pid)
            else:
                fold = eng.fold
                req = SocketTransport.irecv_fold(self, op.peer, tag, ex.view(op.dst).nbytes,
                                                 lambda off, piece: fold(gen, k, off, piece), plan=pid)
            reqs[k] = req
            req.on_done = lambda: eng.ext_done(gen, k)
            if req.done:  # completed before the hook was set (a second ext_done is ignored)
                eng.ext_done(gen, k)

        def check():
            for k, r in reqs.items():
                if not r.done:
                    err = self._failure_for(r.peer)
                    if err is not None:
                        return k, err
            return None

        return post, check

    def board(self) -> "ShmBoard | None":
        """The host's shared counters (:class:`ShmBoard`) when every rank of the job is on
        this host (else None: the ranks on other hosts do not map them)."""
        return ShmBoard(self._engine, self) if len(self._local) == self.world - 1 else None

    def native_stats(self) -> dict:
        """The core's counters (``messages``: data messages moved so far; ``held``)."""
        return self._engine.stats()

    def close(self) -> None:
        eng = getattr(self, "_engine", None)
        if eng is not None:
            eng.close()
        super().close()
