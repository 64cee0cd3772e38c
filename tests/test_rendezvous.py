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
