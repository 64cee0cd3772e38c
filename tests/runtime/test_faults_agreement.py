"""The agreement log (backends/agreement.py) over a real rendezvous store: one total order that
every reader sees, each death recorded once however many ranks report it."""
from __future__ import annotations

import threading
import time

import pytest

from hcc.backends.agreement import EventLog, Tail
from hcc.backends.rendezvous import StoreServer

pytestmark = pytest.mark.slow


def _wait_for(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.005)
    return pred()


def test_concurrent_death_reports_are_recorded_once_and_every_tail_sees_one_order():
    with StoreServer("tok") as srv:
        logs = [EventLog(srv.address, "tok", "job") for _ in range(4)]
        woken = [threading.Event() for _ in logs]
        tails = [Tail(log, "tok", wake=w.set) for log, w in zip(logs, woken)]
        try:
            barrier = threading.Barrier(4)
            firsts = []

            def reporter(i):
                barrier.wait()
                firsts.append(logs[i].report_dead(3))
                logs[i].append({"t": "arr", "run": 0, "rank": i})

            threads = [threading.Thread(target=reporter, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(5)
            assert sorted(firsts) == [False, False, False, True]
            assert _wait_for(lambda: all(len(t.snapshot()) == 5 for t in tails))
            orders = [t.snapshot() for t in tails]
            assert all(o == orders[0] for o in orders), "tails disagree on the order"
            assert [e["t"] for e in orders[0]].count("dead") == 1
            assert sorted(e["rank"] for e in orders[0] if e["t"] == "arr") == [0, 1, 2, 3]
            assert all(w.is_set() for w in woken)
        finally:
            for t in tails:
                t.close()
            for log in logs:
                log.close()


def test_a_tail_reports_a_lost_store_instead_of_hanging():
    srv = StoreServer("tok")
    log = EventLog(srv.address, "tok", "job")
    woken = threading.Event()
    tail = Tail(log, "tok", wake=woken.set)
    try:
        log.append({"t": "arr", "run": 0, "rank": 0})
        assert _wait_for(lambda: len(tail.snapshot()) == 1)
        woken.clear()
        srv.close()
        assert woken.wait(5.0), "the tail did not wake the executor when the store died"
        assert tail.error is not None
    finally:
        tail.close()
        log.close()
