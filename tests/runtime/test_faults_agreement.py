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


def _close(*groups) -> None:
    """Close every tail and log of ``groups`` (the tests' finally clauses)."""
    for group in groups:
        for x in group:
            x.close()


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
            _close(tails, logs)


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


def test_the_ring_reuses_its_slots_every_tail_sees_every_event_and_a_dead_reader_is_skipped():
    from hcc.backends.agreement import capacity

    world, cap = 3, 8  # a ring far smaller than the 120 events below
    with StoreServer("tok") as srv:
        logs = [EventLog(srv.address, "tok", "job", world=world, capacity=cap) for _ in range(world)]
        tails = [Tail(log, "tok", rank=r) for r, log in enumerate(logs)]
        try:
            def writer(w):
                for k in range(60):
                    logs[w].append({"t": "x", "w": w, "k": k})

            threads = [threading.Thread(target=writer, args=(w,)) for w in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(20)
            assert _wait_for(lambda: all(t.length == 120 for t in tails), 10.0)
            orders = [t.snapshot() for t in tails]
            assert all(o == orders[0] for o in orders), "tails disagree on the order"
            for w in (0, 1):  # each writer's events in its own order
                assert [e["k"] for e in orders[0] if e["w"] == w] == list(range(60))
            assert logs[0].capacity == cap
            keys = [k for k in srv._data if k.startswith("job/ev/")]
            assert len(keys) <= cap + 3 * world + 5, sorted(keys)
            assert capacity(world) == 32 and capacity(8) == 64

            # rank 2's reader stops advancing (published position frozen): a writer that must
            # reuse a slot it has not read waits for it — until rank 2 is reported dead
            tails[2].close()
            logs[2].publish(2, 120)
            done = threading.Event()

            def late_writer():
                for k in range(cap + 2):
                    logs[0].append({"t": "y", "k": k})
                done.set()

            t = threading.Thread(target=late_writer)
            t.start()
            assert not done.wait(0.6), "a writer overwrote a slot a live reader had not read"
            logs[1].report_dead(2)
            assert done.wait(5.0), "a dead reader still held the writer back"
            t.join(5)
            assert _wait_for(lambda: all(t.length == 120 + cap + 3 for t in tails[:2]), 10.0)
            assert tails[0].snapshot() == tails[1].snapshot()
            assert tails[0].dead() == [2]
        finally:
            _close(tails, logs)


def test_a_writer_that_dies_right_after_its_first_store_request_leaves_no_hole():
    """Issue 21: an append was two requests (reserve a position, then fill its slot); a writer
    SIGKILLed between them left a hole that every reader waited on until its deadline, then
    reported the live store as lost ("get '.../ev/s/2': timeout"). The append is now one
    request while the slot is known free: cut the writer's connection after its first
    request of an append and the event is still there for every reader."""
    from hcc.backends.base import RuntimeFault
    from hcc.backends.rendezvous import RendezvousError

    with StoreServer("tok") as srv:
        first = EventLog(srv.address, "tok", "job", timeout=2.0, world=2)
        first.append({"t": "arr", "run": 0, "rank": 0})  # the room limit is known from here on
        victim = EventLog(srv.address, "tok", "job", timeout=2.0, world=2)
        victim.append({"t": "arr", "run": 0, "rank": 1})
        calls = [0]
        real_full = getattr(victim.client, "_call_full", None)
        real_call = victim.client._call

        def dies_after_one_request(req, wait=0.0):
            calls[0] += 1
            if calls[0] > 1:
                raise RendezvousError("the writer's process is gone")
            return real_full(req, wait) if real_full is not None else {"value": real_call(req, wait)}

        # every request of the client goes through here, whichever method makes it
        victim.client._call_full = dies_after_one_request
        victim.client._call = lambda req, wait=0.0: dies_after_one_request(req, wait).get("value")
        try:
            victim.append({"t": "done", "run": 0, "rank": 1, "gen": 0})
        except (RuntimeFault, RendezvousError):
            pass
        reader = EventLog(srv.address, "tok", "job", timeout=2.0)
        n = reader.length()
        assert n == 3
        assert reader.read(3) == {"t": "done", "run": 0, "rank": 1, "gen": 0}
        for log in (first, victim, reader):
            log.close()
