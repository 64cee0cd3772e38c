"""The adaptive runtime's static/adaptive decision (backends/adaptive/fast.py ``agree``) over a
real rendezvous store, with a rank killed between two of its counter operations: the others
still get a decision, and the right one, instead of waiting until their deadline.

A rank "killed" here performs the first of its counter operations and nothing after, which is
the state a SIGKILL between them leaves in the store (tests/runtime/test_join_deaths.py kills
real processes at random moments; this pins the two moments that matter)."""
from __future__ import annotations

import threading
import time

from hcc.backends.adaptive.fast import ADAPT, BACKUP, DECIDE, MARK, StoreCounters, agree
from hcc.backends.rendezvous import StoreClient, StoreServer

N = 4
TIMEOUT = 5.0  # a decision missing for this long is the failure under test
LATE = 1.0  # long enough that the test orders every arrival before the first late marker


def _counters(server, rank):
    return StoreCounters(StoreClient(server.address, "tok", timeout=10), "job", rank)


def _agree_in_threads(server, ranks, slot):
    """Run ``agree`` for ``ranks`` in threads; their answers (or errors) by rank."""
    got: dict[int, object] = {}

    def one(r):
        try:
            got[r] = agree(_counters(server, r), slot, N, r, "test run", TIMEOUT, late=LATE)
        except Exception as e:  # the failure this test looks for: a CollectiveTimeout
            got[r] = e

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    return got, threads


def _arrivals(server, slot):
    c = StoreClient(server.address, "tok", timeout=10)
    return lambda: (c.peek(f"job/fast/{slot}") or 0) % MARK


def _wait_for(cond, limit=5.0):
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, "the ranks did not reach the store"
        time.sleep(0.005)


def test_everyone_on_time_is_static_and_a_missing_rank_is_adaptive():
    with StoreServer("tok", "127.0.0.1", 0) as server:
        got, threads = _agree_in_threads(server, range(N), 0)
        for t in threads:
            t.join(TIMEOUT + 5)
        assert got == {r: "static" for r in range(N)}
        got, threads = _agree_in_threads(server, range(N - 1), 1)
        for t in threads:
            t.join(TIMEOUT + 5)
        assert got == {r: "adaptive" for r in range(N - 1)}


def test_the_last_arrival_killed_before_it_decides_leaves_a_static_decision():
    """The n-th arrival sees nobody late and would add the static decision, but dies first:
    the first late marker saw every arrival and adds the same decision."""
    with StoreServer("tok", "127.0.0.1", 0) as server:
        slot, victim = 5, 0
        others = [r for r in range(N) if r != victim]
        got, threads = _agree_in_threads(server, others, slot)
        _wait_for(lambda: _arrivals(server, slot)() == N - 1)
        v = _counters(server, victim).add(slot, 1)  # its arrival, and then it is gone
        assert v == N  # it was the last arrival, and nobody had declared the run late
        for t in threads:
            t.join(TIMEOUT + 5)
        assert got == {r: "static" for r in others}, got
        final = StoreClient(server.address, "tok", timeout=10).peek(f"job/fast/{slot}")
        assert final // DECIDE * DECIDE == BACKUP  # the first marker's flag, no adaptive count


def test_the_first_late_marker_killed_before_it_decides_leaves_an_adaptive_decision():
    """Rank 3 never arrives; rank 0 arrives, declares the run late and dies before adding the
    adaptive decision: the ranks that declare it late after it saw the arrival missing too."""
    with StoreServer("tok", "127.0.0.1", 0) as server:
        slot = 9
        c0 = _counters(server, 0)
        assert c0.add(slot, 1) == 1
        assert c0.add(slot, MARK) == MARK + 1  # the first marker, and then it is gone
        got, threads = _agree_in_threads(server, [1, 2], slot)
        for t in threads:
            t.join(TIMEOUT + 5)
        assert got == {1: "adaptive", 2: "adaptive"}, got
        final = StoreClient(server.address, "tok", timeout=10).peek(f"job/fast/{slot}")
        # one adaptive count per survivor that declared the run late (the second may have seen
        # the first's decision before its own wait ran out), no static flag
        assert 1 <= final // ADAPT <= 2 and final % ADAPT < DECIDE
