"""The rendezvous store's waiting requests: answered by the request that readies them, all at
once, exactly once; a barrier's arrival in one round trip."""
from __future__ import annotations

import threading
import time

import pytest

from hcc.backends.rendezvous import RendezvousError, StoreClient, StoreServer


def _clients(server, n):
    return [StoreClient(server.address, "tok", timeout=5) for _ in range(n)]


def test_arrival_releases_every_parked_waiter():
    with StoreServer("tok") as server:
        clients = _clients(server, 4)
        got: dict[int, tuple[int, float]] = {}

        def waiter(i):
            got[i] = (clients[i].arrive("barrier/b", 4, timeout=5), time.monotonic())

        threads = [threading.Thread(target=waiter, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while clients[3].peek("barrier/b") != 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert clients[3].peek("barrier/b") == 3  # three arrived and are parked
        assert clients[3].arrive("barrier/b", 4, timeout=5) == 4
        last = time.monotonic()
        for t in threads:
            t.join(5)
        assert sorted(got) == [0, 1, 2] and all(v == 4 for v, _ in got.values()), got
        assert all(t - last < 1.0 for _, t in got.values())
        for c in clients:
            c.close()


def test_arrival_that_times_out_keeps_its_add():
    with StoreServer("tok") as server:
        a, b = _clients(server, 2)
        with pytest.raises(RendezvousError, match="timeout"):
            a.arrive("barrier/t", 2, timeout=0.1)
        assert b.peek("barrier/t") == 1
        assert b.arrive("barrier/t", 2, timeout=5) == 2  # ready at once: a's add counted
        assert a.wait("barrier/t", 2, timeout=5) == 2
        a.close()
        b.close()


def test_timed_out_waiter_gets_no_stale_reply():
    """A wait that timed out is unparked: when the key becomes ready later, nothing is sent
    on its connection, so the client's next request reads its own reply."""
    with StoreServer("tok") as server:
        a, b = _clients(server, 2)
        with pytest.raises(RendezvousError, match="timeout"):
            a.wait("k", 2, timeout=0.1)
        assert b.add("k", 2) == 2
        b.set("other", "x")
        assert a.peek("other") == "x"
        assert a.get("other", timeout=1) == "x"
        a.close()
        b.close()


def test_parked_get_released_by_set_and_by_put():
    with StoreServer("tok") as server:
        a, b, c = _clients(server, 3)
        got = {}
        ta = threading.Thread(target=lambda: got.__setitem__("a", a.get("addr/1", timeout=5)))
        tb = threading.Thread(target=lambda: got.__setitem__("b", b.get("dead", timeout=5)))
        ta.start()
        tb.start()
        time.sleep(0.1)
        c.set("addr/1", "127.0.0.1:9")
        server.put("dead", {"2": "killed"})
        ta.join(5)
        tb.join(5)
        assert got == {"a": "127.0.0.1:9", "b": {"2": "killed"}}
        for x in (a, b, c):
            x.close()


# ---- hostile requests and handshakes (issue 21) ----------------------------------------------

@pytest.fixture
def thread_errors(monkeypatch):
    """Exceptions that escape any thread (the store's serving threads print them as
    tracebacks into rank 0's log); a test asserts there are none."""
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


@pytest.mark.parametrize("req, field", [
    ({"op": "get", "key": "k", "timeout": "nan"}, "timeout"),
    ({"op": "get", "key": "k", "timeout": float("nan")}, "timeout"),
    ({"op": "get", "key": "k", "timeout": float("inf")}, "timeout"),
    ({"op": "get", "key": "k", "timeout": -1}, "timeout"),
    ({"op": "get", "key": "k", "timeout": True}, "timeout"),
    ({"op": "add", "key": "k", "amount": [1]}, "amount"),
    ({"op": "add", "key": "k", "amount": "1"}, "amount"),
    ({"op": "add", "key": "k", "amount": 1.5}, "amount"),
    ({"op": "add", "key": "k", "amount": 2**60}, "amount"),
    ({"op": "add", "key": "k", "amount": 1, "wait": {"a": 1}}, "wait"),
    ({"op": "wait", "key": "k", "value": None, "timeout": 1}, "value"),
    ({"op": "set", "key": ["k"], "value": 1}, "key"),
    ({"op": "set", "key": "", "value": 1}, "key"),
    ({"op": "set", "key": "k" * 300, "value": 1}, "key"),
    ({"op": ["get"], "key": "k"}, "unknown op"),
])
def test_every_request_field_is_checked(req, field, thread_errors):
    """``{"op":"get","timeout":"nan"}`` used to spin the serving thread at 100 % (a NaN
    deadline never passes) and ``"amount":[1]`` to print a thread traceback; every bad field
    now gets an error reply naming it, and the store keeps serving."""
    with StoreServer("tok") as server:
        c = StoreClient(server.address, "tok", timeout=5)
        with pytest.raises(RendezvousError) as e:
            c._call(req)
        assert field in str(e.value), e.value
        c.set("after", 1)  # the same connection still works
        assert c.peek("after") == 1
        c.close()
    assert not thread_errors, thread_errors


def test_a_counter_stays_exact(thread_errors):
    with StoreServer("tok") as server:
        c = StoreClient(server.address, "tok", timeout=5)
        assert c.add("n", 2**53 - 1) == 2**53 - 1
        with pytest.raises(RendezvousError, match="would pass 2\\^53"):
            c.add("n", 2)
        assert c.peek("n") == 2**53 - 1
        c.close()
    assert not thread_errors


def test_a_json_bomb_closes_only_its_connection(thread_errors):
    from hcc.backends import rendezvous as rz

    with StoreServer("tok") as server:
        c = StoreClient(server.address, "tok", timeout=5)
        data = b"[" * 30000 + b"]" * 30000  # within MAX_MESSAGE; deeper than json's recursion
        c._sock.sendall(rz._LEN.pack(len(data)) + data)
        c._sock.settimeout(5)
        assert c._sock.recv(1) == b""  # the store closed this connection ...
        other = StoreClient(server.address, "tok", timeout=5)
        other.set("k", 1)  # ... and serves the others
        assert other.get("k") == 1
        other.close()
        c.close()
    assert not thread_errors


def test_the_handshake_has_one_deadline_as_a_whole(monkeypatch):
    """A client trickling one byte every 0.2 s used to be allowed 10 s per byte (the timeout
    was per recv): 64 bytes, minutes. Now the whole handshake has one deadline."""
    import socket

    from hcc.backends import rendezvous as rz

    monkeypatch.setattr(rz, "HANDSHAKE_S", 0.5)
    with StoreServer("tok") as server:
        host, port = rz.parse_address(server.address)
        s = socket.create_connection((host, port), timeout=5)
        assert len(rz.recv_exact(s, rz.NONCE)) == rz.NONCE
        start = time.monotonic()
        closed = False
        for _ in range(64 + 32):  # the whole reply, a byte at a time, and more
            try:
                s.sendall(b"x")
            except OSError:
                closed = True
                break
            s.settimeout(0.2)
            try:
                if s.recv(1) == b"":
                    closed = True
                    break
            except socket.timeout:
                pass
        took = time.monotonic() - start
        s.close()
    assert closed and took < 5.0, took  # per-recv timeouts would have allowed 96 x 0.2 s = 19 s


def _nonce_or_eof(s) -> bytes:
    """What the store sent a raw connection: its nonce, or b"" when it closed it first."""
    s.settimeout(5)
    got = b""
    while len(got) < 32:
        k = s.recv(32 - len(got))
        if not k:
            break
        got += k
    return got


def test_unauthenticated_connections_are_capped(monkeypatch, thread_errors):
    """At most MAX_PENDING connections in the handshake. Past it, a new connection takes the
    oldest one's place once that has had PENDING_GRACE_S; before that the new one is closed
    before the nonce, which a real client reads as "busy" and retries."""
    import socket

    from hcc.backends import rendezvous as rz

    monkeypatch.setattr(rz, "MAX_PENDING", 4)
    monkeypatch.setattr(rz, "PENDING_GRACE_S", 0.0)  # every pending one is old enough to go
    with StoreServer("tok") as server:
        host, port = rz.parse_address(server.address)
        idle = []
        for _ in range(10):
            idle.append(socket.create_connection((host, port), timeout=5))
            assert len(_nonce_or_eof(idle[-1])) == rz.NONCE  # accepted: the nonce came
        dropped = sum(s.recv(1) == b"" for s in idle[:6])  # the six oldest were dropped
        assert dropped == 6 and len(server._pending) <= 4
        c = StoreClient(server.address, "tok", timeout=5)  # a real client still gets in
        c.set("k", 1)
        assert c.get("k") == 1
        c.close()
        for s in idle:
            s.close()

    monkeypatch.setattr(rz, "PENDING_GRACE_S", 3600.0)  # none is old enough: newcomers refused
    with StoreServer("tok") as server:
        host, port = rz.parse_address(server.address)
        idle = [socket.create_connection((host, port), timeout=5) for _ in range(4)]
        assert all(len(_nonce_or_eof(s)) == rz.NONCE for s in idle)
        late = socket.create_connection((host, port), timeout=5)
        assert _nonce_or_eof(late) == b""  # closed before any nonce: "busy"
        late.close()
        with pytest.raises(RendezvousError, match="cannot reach"):
            StoreClient(server.address, "tok", timeout=0.5)  # busy until its deadline
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("c", StoreClient(server.address, "tok", timeout=10)))
        t.start()
        time.sleep(0.3)
        for s in idle:  # the slots free up: the retrying client gets in
            s.close()
        t.join(15)
        got["c"].set("k", 2)
        assert got["c"].peek("k") == 2
        got["c"].close()
    assert not thread_errors
