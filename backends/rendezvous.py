"""hcc.backends.rendezvous — a tiny authenticated key-value store for meeting peers.

Rank 0 (or a launcher) starts a :class:`StoreServer` on ``127.0.0.1``; every rank connects a
:class:`StoreClient`, publishes its listening address under ``addr/<rank>``, and reads the
others'. Launchers also use it for barriers between iterations (:meth:`StoreClient.barrier`).

Wire format
- Authentication first, both ways (HMAC-SHA256 with the shared token, compared with
  ``hmac.compare_digest``): the server sends a 32-byte nonce ``ns``; the client answers with
  its nonce ``nc`` and ``HMAC(token, "hcc-store-client" ‖ ns ‖ nc)``; the server checks it and
  answers ``HMAC(token, "hcc-store-server" ‖ nc ‖ ns)``, which the client checks. A peer that
  does not know the token learns nothing and gets nothing.
- Then requests and replies are JSON objects, each prefixed by a 4-byte big-endian length,
  at most :data:`MAX_MESSAGE` bytes (a longer prefix closes the connection before any
  allocation). Never pickle.
- Requests: ``{"op": "set", "key", "value"}``, ``{"op": "get", "key", "timeout"}`` (waits until
  the key exists), ``{"op": "add", "key", "amount"}`` (integer counter, returns the new value),
  ``{"op": "wait", "key", "value", "timeout"}`` (waits until the counter is ≥ value),
  ``{"op": "add", "key", "amount", "wait", "timeout"}`` (adds, then waits until the counter is
  ≥ ``wait``: a barrier's arrival in one round trip), ``{"op": "peek", "key"}`` (the value or
  null, at once). ``{"op": "add", "key", "amount", "then": {"prefix", "cap", "limit",
  "value"}}`` adds, and when the new count ``i`` is ≤ ``limit`` also sets ``<prefix>/<i mod cap>``
  to ``{"i": i, "e": value}`` in the same step (reply ``"set": true``): the agreement log's
  append in one request, so a writer killed between reserving a position and filling it can
  no longer leave a hole every reader waits on (backends/agreement.py).
  ``{"op": "set", "key", "value", "if_absent": true}`` sets only when the key is absent and
  replies with the value the key holds afterwards (whoever was first): a value every client
  must agree on, fixed in one round trip (the agreement log's ring size).
  ``{"op": "own", "key", "value"}`` (``value`` an integer, a rank): when this connection ends
  without a ``{"op": "bye", "key"}`` first (the process holding it died: the kernel closes its
  sockets), the store appends ``value`` to the list at ``key`` — a job without a launcher
  learns its dead ranks there as it would from the launcher (``<group>/dead``).
  :meth:`StoreClient.close` says ``bye``.
  Replies: ``{"ok": true, "value": …}`` or ``{"ok": false, "error": "…"}``.
- A request that waits is parked; the thread whose ``set``/``add`` makes it ready sends the
  reply of every parked request at once, before its own (measured: :class:`StoreServer`).
- Every request field is type- and range-checked before use (:func:`check_request`): ``key`` a
  string of at most :data:`MAX_KEY` characters, ``timeout`` a finite number ≥ 0 (at most an
  hour), ``amount``/``wait``/``value`` integers of at most 2^53 in size; a bad field gets an
  ``{"ok": false}`` reply naming it, never a traceback or a spinning thread. The handshake has
  one deadline as a whole (:data:`HANDSHAKE_S`), not one per ``recv``, and at most
  :data:`MAX_PENDING` connections may be in it at once: a new one beyond that takes the place
  of the oldest if it has been waiting :data:`PENDING_GRACE_S`, else it is closed before the
  server's nonce, which a client reads as "busy" and retries until its own deadline (a client
  with the wrong token is answered by a closed connection *after* the nonce, and told so).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import socket
import struct
import threading
import time
from typing import Callable

from .base import RuntimeFault

__all__ = ["StoreServer", "StoreClient", "spawn_store", "DetachedStore", "RendezvousError", "AuthenticationError", "parse_address", "free_port"]

MAX_MESSAGE = 64 * 1024  # an address record is ~40 bytes; 64 KiB bounds any request
MAX_KEYS = 100_000
# 64 MiB of values in all: a 1024-rank job's addresses and barrier counters take ~100 KB; a
# client filling MAX_KEYS keys with MAX_MESSAGE-byte values would otherwise hold 6.5 GB
MAX_STORE_BYTES = 64 << 20
MAX_KEY = 256  # "hcc/adaptive/ev/s/2"-like keys are ~30 characters
MAX_WAIT_S = 3600.0  # the longest a request may be parked
MAX_INT = 1 << 53  # counters and amounts: exact in a JSON number of any reader
# The handshake is 3 messages of 32-64 bytes: 10 s for all of it is ~1000x a loopback round
# trip under load, and bounds what a client that sends a byte a second can hold.
HANDSHAKE_S = 10.0
# Connections in the handshake at once: a job opens one per rank at startup, and a handshake
# takes ~1 ms, so 256 covers the joining burst of a 1024-rank job with room; a client refused
# for it retries. A slot is taken from a connection only after it has had 2 s (a real client
# under load answers in well under that), so a flood cannot evict the job's own ranks.
MAX_PENDING = 256
PENDING_GRACE_S = 2.0
NONCE = 32
_LEN = struct.Struct("!I")


class RendezvousError(RuntimeFault):
    """The store could not be reached, refused a request, or timed out."""


class AuthenticationError(RendezvousError):
    """A peer failed the HMAC challenge: the tokens differ (or it is not an hcc peer)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the kernel has just found free on ``host`` (for a rendezvous address; another
    process may take it before it is bound again, which the store's bind then reports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_address(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise RendezvousError(f"rendezvous address {addr!r} is not HOST:PORT")
    return host or "127.0.0.1", int(port)


def _mac(token: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(token, label + b"".join(parts), hashlib.sha256).digest()


_WAITALL = getattr(socket, "MSG_WAITALL", 0)


def recv_into_exact(sock: socket.socket, view: memoryview, closed: str = "connection closed") -> None:
    """Fill all of ``view`` (bytes) from ``sock``; ConnectionError(``closed``) on EOF first.

    ``MSG_WAITALL``: on a blocking socket the kernel keeps copying as segments arrive and
    returns once ``view`` is full (or on EOF, an error or a signal: the loop goes on), instead
    of returning to Python, and taking the GIL, for every batch of segments. A socket with a
    timeout is non-blocking underneath and gets what is there, as before."""
    got, n = 0, view.nbytes
    while got < n:
        k = sock.recv_into(view[got:], n - got, _WAITALL)
        if k == 0:
            raise ConnectionError(closed)
        got += k


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def recv_exact_by(sock: socket.socket, n: int, deadline: float) -> bytes:
    """``n`` bytes from ``sock`` before ``time.monotonic()`` reaches ``deadline``: the socket's
    timeout is set to what is left before every ``recv``, so a peer that trickles one byte at a
    time cannot stretch the wait past the deadline. ``socket.timeout`` when it passes."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"handshake not done within its deadline ({got} of {n} bytes)")
        sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed")
        got += k
    return bytes(buf)


def _is_int(v) -> bool:
    return type(v) is int and -MAX_INT <= v <= MAX_INT


def check_request(req: dict) -> str:
    """What is wrong with a store request ("" when nothing): every field the op reads has the
    type and range it needs. Booleans are not numbers here (JSON ``true`` is Python ``1``)."""
    op = req.get("op")
    if op not in ("set", "get", "add", "wait", "peek", "own", "bye"):
        return f"unknown op {str(op)[:40]!r} (set | get | add | wait | peek | own | bye)"
    key = req.get("key")
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY:
        return f"field 'key' must be a string of 1 to {MAX_KEY} characters"
    t = req.get("timeout", 0)
    if t is not None and not (type(t) in (int, float) and math.isfinite(t) and t >= 0):
        return f"field 'timeout' must be a finite number of seconds ≥ 0, got {json.dumps(t)[:40]}"
    if op == "add":
        if not _is_int(req.get("amount", 1)):
            return f"field 'amount' must be an integer of at most 2^53, got {json.dumps(req.get('amount'))[:40]}"
        if req.get("wait") is not None and not _is_int(req["wait"]):
            return f"field 'wait' must be an integer of at most 2^53, got {json.dumps(req['wait'])[:40]}"
        then = req.get("then")
        if then is not None:
            if req.get("wait") is not None:
                return "fields 'then' and 'wait' exclude each other"
            if not isinstance(then, dict):
                return "field 'then' must be an object {prefix, cap, limit, value}"
            pre = then.get("prefix")
            if not isinstance(pre, str) or not 0 < len(pre) <= MAX_KEY - 17:
                return f"field 'then.prefix' must be a string of 1 to {MAX_KEY - 17} characters"
            if not (_is_int(then.get("cap")) and 0 < then["cap"] <= 1 << 20):
                return "field 'then.cap' must be an integer from 1 to 2^20"
            if not _is_int(then.get("limit")):
                return "field 'then.limit' must be an integer of at most 2^53"
    if op == "set" and req.get("if_absent") not in (None, True, False):
        return "field 'if_absent' must be true or false"
    if op == "own" and not _is_int(req.get("value")):
        return f"field 'value' must be an integer of at most 2^53, got {json.dumps(req.get('value'))[:40]}"
    if op == "wait" and not _is_int(req.get("value", 0)):
        return f"field 'value' must be an integer of at most 2^53, got {json.dumps(req.get('value'))[:40]}"
    return ""


def _send_msg(sock: socket.socket, obj) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise RendezvousError(f"store message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_msg(sock: socket.socket):
    (n,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    if n > MAX_MESSAGE:
        raise RendezvousError(f"store message of {n} bytes exceeds the {MAX_MESSAGE}-byte bound")
    try:
        obj = json.loads(recv_exact(sock, n))
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested 30000 deep
        raise RendezvousError("store message is not a JSON object") from None
    if not isinstance(obj, dict):
        raise RendezvousError("store message is not a JSON object")
    return obj


def _drop(conn: socket.socket) -> None:
    """End a connection from another thread: its serving thread's recv returns at once."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def admit_pending(pending: dict, conn: socket.socket, cap: int) -> bool:
    """Admit ``conn`` to ``pending`` (the connections in their handshake, oldest first, each
    with its arrival time; call with the owner's lock held): at most ``cap`` at once; past
    it the oldest is dropped if it has had :data:`PENDING_GRACE_S`, else ``conn`` is closed
    (it retries) and False returned."""
    now = time.monotonic()
    if len(pending) >= cap:
        old, since = next(iter(pending.items()))
        if now - since < PENDING_GRACE_S:  # all recent: refuse this one
            conn.close()
            return False
        del pending[old]  # the oldest has had its chance
        _drop(old)
    pending[conn] = now
    return True


def accept_loop(listener: socket.socket, closing: Callable[[], bool], lock, pending: dict, cap: int,
                serve: Callable[[socket.socket], None], name: str,
                admitted: Callable[[socket.socket], None] | None = None) -> None:
    """Accept connections on ``listener`` until ``closing()`` or the listener closes: each is
    admitted to ``pending`` under ``lock`` (:func:`admit_pending`, at most ``cap`` in their
    handshake; ``admitted(conn)`` is then called under the lock) and served by ``serve(conn)``
    in a daemon thread named ``name``."""
    while not closing():
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with lock:
            if not admit_pending(pending, conn, cap):
                continue
            if admitted is not None:
                admitted(conn)
        threading.Thread(target=serve, args=(conn,), name=name, daemon=True).start()


class _Parked:
    """A waiting request: its connection, what it waits for, and whether it was answered."""

    __slots__ = ("conn", "op", "want", "done")

    def __init__(self, conn: socket.socket, op: str, want: int):
        self.conn, self.op, self.want, self.done = conn, op, want, False


class StoreServer:
    """The store, served by a daemon thread per client; ``close()`` stops accepting.

    Waiting requests are answered by the thread that makes them ready (:class:`_Parked`), all
    in one pass, not each by its own serving thread once it wakes up and wins the GIL of the
    process holding the store. Measured with 4 ranks meeting at a barrier 30 times (each
    sleeping 20 ms between, rank 0 holding the store; medians): ranks let go 0.44-0.53 ms after
    the last arrival and 0.11-0.13 ms apart, against 0.47-0.60 ms and 0.18-0.20 ms when each
    waiter answered itself and an arrival took two round trips (add, then wait). Between the
    iterations of a 64 MiB allreduce the ranks still start 3.8-4.3 ms apart: the ones let go
    first start copying into their sockets at once, on both cores, and the last one must win
    a core to wake up."""

    def __init__(self, token: str | bytes, host: str = "127.0.0.1", port: int = 0, *,
                 sock: socket.socket | None = None):
        self.token = token.encode() if isinstance(token, str) else token
        self._data: dict[str, object] = {}
        self._parked: dict[str, list[_Parked]] = {}
        self._cond = threading.Condition()
        # sock: a listening socket made elsewhere (spawn_store's child gets its parent's)
        self._sock = sock if sock is not None else socket.create_server((host, port), backlog=256)
        if sock is not None:
            host = sock.getsockname()[0]
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._closed = False
        self._clients: set[socket.socket] = set()
        self._pending: dict[socket.socket, float] = {}  # in the handshake, oldest first: since
        self._bytes = 0  # the JSON size of the values held (MAX_STORE_BYTES)
        self._sizes: dict[str, int] = {}
        self.joined = 0  # connections that passed the handshake, ever
        self._owned: dict[socket.socket, tuple[str, int]] = {}  # "own": what its abrupt end appends
        self._said_bye: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept_loop, name="hcc-store", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        accept_loop(self._sock, lambda: self._closed, self._cond, self._pending, MAX_PENDING, self._serve,
                    "hcc-store-client", admitted=self._clients.add)

    def _serve(self, conn: socket.socket) -> None:
        try:
            deadline = time.monotonic() + HANDSHAKE_S
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(HANDSHAKE_S)
            ns = os.urandom(NONCE)
            conn.sendall(ns)
            reply = recv_exact_by(conn, NONCE + 32, deadline)
            nc, mac = reply[:NONCE], reply[NONCE:]
            if not hmac.compare_digest(mac, _mac(self.token, b"hcc-store-client", ns, nc)):
                return
            with self._cond:
                if self._pending.pop(conn, False) is False:
                    return  # dropped for a newer connection while it was authenticating
                self.joined += 1
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            conn.sendall(_mac(self.token, b"hcc-store-server", nc, ns))
            conn.settimeout(None)
            while True:
                req = _recv_msg(conn)
                rep = self._handle(req, conn)
                if rep is not None:  # None: a parked request, answered by the thread that readied it
                    _send_msg(conn, rep)
        except (OSError, ConnectionError, RendezvousError, ValueError):
            return
        finally:
            with self._cond:
                self._pending.pop(conn, None)
                self._clients.discard(conn)
                owned = self._owned.pop(conn, None)
                if owned is not None and conn not in self._said_bye and not self._closed:
                    key, value = owned  # its process died: append it to the list at key
                    cur = self._data.get(key)
                    cur = list(cur) if isinstance(cur, list) else []
                    if value not in cur and (key in self._data or len(self._data) < MAX_KEYS):
                        cur.append(value)
                        self._data[key] = cur
                        self._release(key)
                self._said_bye.discard(conn)
            conn.close()

    def _ready(self, key: str, op: str, want: int) -> bool:
        if key not in self._data:
            return False
        return op == "get" or (isinstance(self._data[key], int) and self._data[key] >= want)

    def _release(self, key: str) -> None:
        """Answer every parked request on ``key`` that is ready now (under ``_cond``). Each
        connection has at most one request outstanding and its client is reading for this very
        reply, so a send of these few bytes does not block."""
        parked = self._parked.get(key)
        if not parked:
            return
        keep = []
        for p in parked:
            if self._ready(key, p.op, p.want):
                p.done = True
                try:
                    _send_msg(p.conn, {"ok": True, "value": self._data[key]})
                except OSError:
                    pass  # the client went away; its serving thread sees the socket closed
            else:
                keep.append(p)
        if keep:
            self._parked[key] = keep
        else:
            del self._parked[key]
        self._cond.notify_all()

    def _handle(self, req: dict, conn: socket.socket) -> dict | None:
        bad = check_request(req)
        if bad:
            return {"ok": False, "error": bad}
        op, key = req["op"], req["key"]
        timeout = min(float(req.get("timeout") or 0), MAX_WAIT_S)
        with self._cond:
            if op == "set":
                value = req.get("value")
                if req.get("if_absent") and key in self._data:
                    return {"ok": True, "value": self._data[key]}
                size = len(json.dumps(value, separators=(",", ":")))
                if key not in self._data and len(self._data) >= MAX_KEYS:
                    return {"ok": False, "error": f"store full ({MAX_KEYS} keys)"}
                if self._bytes - self._sizes.get(key, 0) + size > MAX_STORE_BYTES:
                    return {"ok": False, "error": f"store full ({MAX_STORE_BYTES} bytes of values)"}
                self._bytes += size - self._sizes.get(key, 0)
                self._sizes[key] = size
                self._data[key] = value
                self._release(key)
                return {"ok": True, "value": value} if req.get("if_absent") else {"ok": True}
            if op == "add":
                cur = self._data.get(key, 0)
                if type(cur) is not int:
                    return {"ok": False, "error": f"{key} is not a counter"}
                if key not in self._data and len(self._data) >= MAX_KEYS:
                    return {"ok": False, "error": f"store full ({MAX_KEYS} keys)"}
                new = cur + req.get("amount", 1)
                if not _is_int(new):
                    return {"ok": False, "error": f"counter {key} would pass 2^53"}
                then = req.get("then")
                if then is not None and new <= then["limit"]:
                    slot = f"{then['prefix']}/{new % then['cap']}"
                    rec = {"i": new, "e": then.get("value")}
                    size = len(json.dumps(rec, separators=(",", ":")))
                    if slot not in self._data and len(self._data) >= MAX_KEYS - 1:
                        return {"ok": False, "error": f"store full ({MAX_KEYS} keys)"}
                    if self._bytes - self._sizes.get(slot, 0) + size > MAX_STORE_BYTES:
                        return {"ok": False, "error": f"store full ({MAX_STORE_BYTES} bytes of values)"}
                    self._data[key] = new
                    self._release(key)
                    self._bytes += size - self._sizes.get(slot, 0)
                    self._sizes[slot] = size
                    self._data[slot] = rec
                    self._release(slot)
                    return {"ok": True, "value": new, "set": True}
                self._data[key] = new
                self._release(key)
                if req.get("wait") is None:
                    return {"ok": True, "value": self._data[key]}
                op = "wait"  # and wait for the counter to reach req["wait"], as a wait would
                want = int(req["wait"])
            elif op == "own":
                self._owned[conn] = (key, int(req["value"]))
                return {"ok": True}
            elif op == "bye":
                self._said_bye.add(conn)
                return {"ok": True}
            elif op == "peek":  # the value, or null when absent; never waits
                return {"ok": True, "value": self._data.get(key)}
            else:  # get or wait (check_request admits no other op)
                want = req.get("value", 0) if op == "wait" else 0
            if self._ready(key, op, want):
                return {"ok": True, "value": self._data[key]}
            parked = _Parked(conn, op, want)
            self._parked.setdefault(key, []).append(parked)
            deadline = time.monotonic() + timeout
            while not parked.done:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    rest = [p for p in self._parked.get(key, []) if p is not parked]
                    if rest:
                        self._parked[key] = rest
                    else:
                        self._parked.pop(key, None)
                    return {"ok": False, "error": "timeout"}
                self._cond.wait(left)
            return None

    def put(self, key: str, value) -> None:
        """Set ``key`` from the serving process itself (a launcher reporting a dead rank)."""
        with self._cond:
            self._data[key] = value
            self._release(key)

    def connected(self) -> int:
        """Connections open now (in the handshake or past it)."""
        with self._cond:
            return len(self._clients)

    def value(self, key: str, default=None):
        """The value of ``key`` as the serving process sees it."""
        with self._cond:
            return self._data.get(key, default)

    def close(self) -> None:
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        try:
            self._sock.close()
        except OSError:
            pass
        with self._cond:
            clients = list(self._clients)
        for c in clients:
            _drop(c)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StoreClient:
    """A connection to a :class:`StoreServer`; every call is bounded by ``timeout``."""

    def __init__(self, address: str, token: str | bytes, timeout: float = 30.0):
        self.address, self.timeout = address, timeout
        token = token.encode() if isinstance(token, str) else token
        host, port = parse_address(address)
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while True:  # the store may not be listening yet, or be busy: retry until the deadline
            try:
                self._sock = socket.create_connection((host, port), timeout=min(5.0, timeout))
                self._sock.settimeout(timeout)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hs_deadline = time.monotonic() + max(timeout, HANDSHAKE_S)
                ns = recv_exact_by(self._sock, NONCE, hs_deadline)  # closed before it: busy
                break
            except (OSError, ConnectionError) as e:
                last = e
                if getattr(self, "_sock", None) is not None:
                    self._sock.close()
                if time.monotonic() >= deadline:
                    raise RendezvousError(f"cannot reach the rendezvous store at {address} within "
                                          f"{timeout:g} s ({last})") from None
                time.sleep(0.05)
        try:
            nc = os.urandom(NONCE)
            self._sock.sendall(nc + _mac(token, b"hcc-store-client", ns, nc))
            mac = recv_exact_by(self._sock, 32, hs_deadline)
        except (OSError, ConnectionError):
            self._sock.close()
            raise AuthenticationError(
                f"the rendezvous store at {address} refused the connection: HMAC challenge failed "
                "(wrong token?)") from None
        if not hmac.compare_digest(mac, _mac(token, b"hcc-store-server", nc, ns)):
            self._sock.close()
            raise AuthenticationError(f"the rendezvous store at {address} failed the HMAC challenge (wrong token?)")
        self._lock = threading.Lock()

    def _call(self, req: dict, wait: float = 0.0):
        return self._call_full(req, wait).get("value")

    def _call_full(self, req: dict, wait: float = 0.0) -> dict:
        with self._lock:
            try:
                self._sock.settimeout(wait + self.timeout)
                _send_msg(self._sock, req)
                rep = _recv_msg(self._sock)
            except (OSError, ConnectionError) as e:
                raise RendezvousError(f"rendezvous store {self.address}: {e}") from None
        if not rep.get("ok"):
            raise RendezvousError(f"rendezvous store {self.address}: {req.get('op')} {req.get('key')!r}: "
                                  f"{rep.get('error')}")
        return rep

    def set(self, key: str, value) -> None:
        self._call({"op": "set", "key": key, "value": value})

    def set_default(self, key: str, value):
        """Set ``key`` to ``value`` unless it is set; returns what it holds now (one request)."""
        return self._call({"op": "set", "key": key, "value": value, "if_absent": True})

    def get(self, key: str, timeout: float | None = None):
        t = self.timeout if timeout is None else timeout
        return self._call({"op": "get", "key": key, "timeout": t}, wait=t)

    def peek(self, key: str):
        """The value of ``key``, or None when it is not set (never waits)."""
        return self._call({"op": "peek", "key": key})

    def add(self, key: str, amount: int = 1) -> int:
        return self._call({"op": "add", "key": key, "amount": amount})

    def add_then_set(self, key: str, prefix: str, cap: int, limit: int, value) -> tuple[int, bool]:
        """Add 1 to counter ``key``; when the new count ``i`` ≤ ``limit``, set
        ``<prefix>/<i mod cap>`` to ``{"i": i, "e": value}`` in the same step. Returns ``(i, set)``."""
        req = {"op": "add", "key": key, "amount": 1,
               "then": {"prefix": prefix, "cap": int(cap), "limit": int(limit), "value": value}}
        rep = self._call_full(req)
        return int(rep["value"]), bool(rep.get("set"))

    def wait(self, key: str, value: int, timeout: float | None = None) -> int:
        t = self.timeout if timeout is None else timeout
        return self._call({"op": "wait", "key": key, "value": value, "timeout": t}, wait=t)

    def arrive(self, key: str, value: int, timeout: float | None = None) -> int:
        """Add 1 to counter ``key`` and wait until it is ≥ ``value``, in one round trip (a
        barrier's arrival). On a timeout the 1 stays added: wait again with :meth:`wait`."""
        t = self.timeout if timeout is None else timeout
        return self._call({"op": "add", "key": key, "amount": 1, "wait": value, "timeout": t}, wait=t)

    def barrier(self, name: str, world: int, timeout: float | None = None) -> None:
        """Return once ``world`` clients have entered barrier ``name``."""
        self.arrive(f"barrier/{name}", world, timeout)

    def own(self, key: str, value: int) -> None:
        """Have the store append ``value`` to the list at ``key`` if this connection ends
        without :meth:`close` (its process died)."""
        self._call({"op": "own", "key": key, "value": int(value)})

    def close(self) -> None:
        """Say ``bye`` (best effort, no reply awaited) and close: a connection that ends this
        way is not reported by :meth:`own`."""
        try:
            if getattr(self, "_lock", None) is not None and self._lock.acquire(timeout=1.0):
                try:
                    self._sock.settimeout(1.0)
                    _send_msg(self._sock, {"op": "bye", "key": "-"})
                finally:
                    self._lock.release()
        except (OSError, RendezvousError):
            pass
        try:
            self._sock.close()
        except OSError:
            pass


# --------------------------------------------------------------------------- a store that outlives rank 0
# How long a detached store stays up once every rank has connected and the last connection
# closed: the job is over (a rank holds its connection for the communicator's life). Short,
# so the next job on the same fixed port finds it free; a rank 0 that binds meanwhile
# retries for up to BIND_RETRY_S.
LINGER_S = 0.5
BIND_RETRY_S = 3.0


class DetachedStore:
    """Handle of a store served by a process of its own (:func:`spawn_store`). ``close()``
    only reaps the short-lived launcher process: the store itself ends when the job's
    connections do."""

    def __init__(self, address: str, proc):
        self.address, self._proc = address, proc

    def close(self) -> None:
        try:
            self._proc.wait(timeout=5.0)
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def spawn_store(token: str | bytes, host: str, port: int, world: int, timeout: float) -> DetachedStore:
    """Serve a store at ``host:port`` from a separate process that outlives the caller, so the
    death of the rank that started it (rank 0 of a job without a launcher) does not take the
    survivors' rendezvous and agreement log with it.

    The caller binds and listens (a taken port fails here, at once, after retrying
    :data:`BIND_RETRY_S` for a previous job's store to end), so clients can connect before the
    child runs: the kernel queues them. The child gets the listening socket and the token (on
    its standard input, never its command line), detaches (a second fork: no zombie, no
    process group shared with the caller) and serves until the job is over: every one of
    ``world`` ranks connected at some point and no connection is open for :data:`LINGER_S`,
    or no connection is open for ``timeout`` seconds (a job that never formed)."""
    import subprocess
    import sys

    tok = token.encode() if isinstance(token, str) else bytes(token)
    deadline = time.monotonic() + BIND_RETRY_S
    while True:
        try:
            sock = socket.create_server((host, port), backlog=256)
            break
        except OSError as e:
            if e.errno != 98 or time.monotonic() >= deadline:  # EADDRINUSE: a previous job's store
                raise RendezvousError(f"cannot serve the rendezvous store at {host}:{port}: {e}") from None
            time.sleep(0.05)
    try:
        address = f"{host}:{sock.getsockname()[1]}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "hcc.backends.rendezvous", "--fd", str(sock.fileno()), "--world", str(int(world)),
             "--idle", repr(float(timeout))],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(sock.fileno(),), start_new_session=True)
        proc.stdin.write(tok.hex().encode() + b"\n")
        proc.stdin.close()
    finally:
        sock.close()  # the child holds its own copy
    return DetachedStore(address, proc)


def _serve_detached(fd: int, world: int, idle: float) -> int:
    """The body of :func:`spawn_store`'s child."""
    import sys

    token = bytes.fromhex(sys.stdin.readline().strip())
    if os.fork() > 0:  # the caller reaps this process at once; the server runs in the grandchild
        os._exit(0)
    sock = socket.socket(fileno=fd)
    server = StoreServer(token, sock=sock)
    quiet_since = time.monotonic()
    while True:
        time.sleep(0.05)
        now = time.monotonic()
        if server.connected():
            quiet_since = now
            continue
        if now - quiet_since >= (LINGER_S if server.joined >= world else idle):
            server.close()
            os._exit(0)


if __name__ == "__main__":
    import argparse

    _ap = argparse.ArgumentParser(prog="python -m hcc.backends.rendezvous",
                                  description="serve a rendezvous store on an inherited socket (spawn_store)")
    _ap.add_argument("--fd", type=int, required=True, help="the listening socket's file descriptor")
    _ap.add_argument("--world", type=int, required=True, help="ranks of the job")
    _ap.add_argument("--idle", type=float, required=True, help="seconds without a connection before giving up")
    _a = _ap.parse_args()
    raise SystemExit(_serve_detached(_a.fd, _a.world, _a.idle))
