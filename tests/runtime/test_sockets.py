"""The sockets backend between real processes: run_local over many plans in one job, a rank
SIGKILLed mid-run, authentication, frame validation, messages that arrive before their
receive is posted."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import two_ranks  # noqa: E402
from test_executor_plans import chain_broadcast, ring_allreduce  # noqa: E402

import hcc  # noqa: E402
from hcc.backends import sockets  # noqa: E402
from hcc.backends.base import CollectiveTimeout, RuntimeFault  # noqa: E402
from hcc.backends.launch import RunFailed, run_cases_local  # noqa: E402
from hcc.backends.rendezvous import AuthenticationError, StoreClient, StoreServer  # noqa: E402
from hcc.backends.reference import check, expected, make_inputs  # noqa: E402

pytestmark = pytest.mark.slow


def test_run_local_many_plans_in_one_job():
    plans = [chain_broadcast(4, 1001, 100), ring_allreduce(4, 4097, "float32", "sum"),
             ring_allreduce(4, 5, "int32", "max"), ring_allreduce(4, 1 << 21, "bfloat16", "avg")]
    cases = [(p, make_inputs(p, 3)) for p in plans]
    results = run_cases_local("sockets", cases, iters=2, warmup=1, timeout=20)
    for (p, ins), res in zip(cases, results):
        assert res.backend == "sockets" and len(res.times) == 2 and all(t > 0 for t in res.times)
        check(p, res.outputs, expected(p, ins))


def test_run_local_single_plan_api():
    plan = chain_broadcast(3, 10, 3)
    ins = make_inputs(plan, 0)
    res = sockets.run_local(plan, ins, iters=1, timeout=20)
    check(plan, res.outputs, expected(plan, ins))


def test_killed_rank_makes_every_other_rank_fail_naming_it():
    # a 32 MiB chain broadcast, repeated: rank 2 is SIGKILLed while data flows
    plan = chain_broadcast(4, 8 << 20, 1 << 18)
    with pytest.raises(RunFailed) as ei:
        run_cases_local("sockets", [(plan, 0)], iters=200, timeout=10, kill_rank=(2, 0.3), save_outputs=False)
    errs = ei.value.errors
    assert set(errs) == {0, 1, 2, 3}, errs
    assert "signal 9" in errs[2]
    for r in (0, 1, 3):
        assert "rank 2 failed" in errs[r], errs[r]
        assert "timed out" not in errs[r]  # told of the death, not waiting out a deadline
    # every survivor ended within the per-wait deadline (10 s) of the kill; typically < 0.5 s
    assert ei.value.detail["kill_to_end_s"] < 10, ei.value.detail


def test_bad_token_is_refused_with_a_clear_error():
    with StoreServer("right-token") as server:
        with pytest.raises(AuthenticationError, match="HMAC challenge failed"):
            StoreClient(server.address, "wrong-token", timeout=5)
        # peer level: a listener refuses a dialer with another token before any data
        client = StoreClient(server.address, "right-token", timeout=5)
        client.set("hcc/addr/0", "127.0.0.1:1")
        comm = sockets.connect(1, 2, server.address, "right-token", timeout=5, serve_store=False, shm="off")
        try:
            host, port = client.get("hcc/addr/1").split(":")
            with pytest.raises(AuthenticationError, match="wrong token"):
                sockets.dial_handshake((host, int(port)), b"wrong-token", 0, 1, 2, 5)
        finally:
            comm.close()
            client.close()


def _fake_rank0(server):
    """Rank 1 (a real transport) and an authenticated raw socket acting as rank 0."""
    client = StoreClient(server.address, "tok", timeout=5)
    client.set("hcc/addr/0", "127.0.0.1:1")
    # shm off: the fake rank 0 speaks TCP frames only (it never publishes a shared-memory channel)
    comm = sockets.connect(1, 2, server.address, "tok", timeout=5, serve_store=False, max_message=1 << 20,
                           shm="off")
    host, port = client.get("hcc/addr/1").split(":")
    sock, session = sockets.dial_handshake((host, int(port)), b"tok", 0, 1, 2, 5)
    client.close()
    return comm, sock, session


def _data_frame(session: bytes, plan: int, tag: int, length: int, payload: int = 0) -> bytes:
    return sockets.FRAME.pack(sockets.MAGIC, sockets.DATA, session, plan, tag, length) + bytes(payload)


def _refused(frame, match: str, *, bind: tuple[int, int] | None = None, posted_tag: int = 3) -> None:
    """Rank 1 posts a 16-byte receive of ``posted_tag`` from a fake rank 0 that sends
    ``frame(session)``: rank 1's wait must raise a ProtocolError matching ``match``."""
    with StoreServer("tok") as server:
        comm, sock, session = _fake_rank0(server)
        try:
            if bind is not None:
                comm.bind_plan(*bind)
            req = comm.irecv(0, posted_tag, memoryview(bytearray(16)))
            sock.sendall(frame(session))
            with pytest.raises(sockets.ProtocolError, match=match):
                comm.wait_any([req], 5)
        finally:
            sock.close()
            comm.close()


def test_oversized_frame_is_a_protocol_error_without_allocation():
    # 1 TiB claimed for an unposted tag: must be refused, not allocated
    _refused(lambda ses: _data_frame(ses, 0, 5, 1 << 40), "exceeds the bound of 1048576 bytes", posted_tag=7)


def test_bad_header_and_wrong_length_are_protocol_errors():
    _refused(lambda ses: _data_frame(ses, 0, 3, 17, 17), "17 bytes, the posted receive expects 16")
    _refused(lambda ses: _data_frame(b"whatever", 0, 3, 16, 16), "session id")


def test_frames_carry_the_plan_id_and_another_plans_frame_is_refused():
    # bind_plan stamps the plan id on every data frame and checks it on arrival: a frame of
    # another plan for a posted receive (the ranks run different plans) is a ProtocolError
    # naming both ids; an early frame of the bound plan is bounded by its largest message
    with StoreServer("tok") as server:
        comm, sock, session = _fake_rank0(server)
        try:
            comm.bind_plan(0xABCD1234, 4096)
            out = comm.isend(0, 9, memoryview(bytes(8)))
            head = bytearray(sockets.FRAME.size)
            sock.settimeout(5)
            got = 0
            while got < len(head):
                got += sock.recv_into(memoryview(head)[got:])
            _, kind, _, plan, tag, length = sockets.FRAME.unpack(head)
            assert (kind, plan, tag, length) == (sockets.DATA, 0xABCD1234, 9, 8)
            comm.wait_any([out], 5)
        finally:
            sock.close()
            comm.close()
    bound = (0xABCD1234, 4096)
    _refused(lambda ses: _data_frame(ses, 0x0BAD0BAD, 3, 16, 16),
             "plan 0bad0bad.*plan abcd1234.*different plans", bind=bound)
    # an unposted tag of this plan, larger than the plan's largest message
    _refused(lambda ses: _data_frame(ses, 0xABCD1234, 5, 8192), "bound of 4096 bytes.*plan abcd1234",
             bind=bound, posted_tag=7)


def test_ranks_running_different_plans_fail_clearly_instead_of_mixing_data():
    # same shape, same tags, different schedules' ids: rank 1 must refuse rank 0's frames
    # rather than reduce them into its buffer as if they were its own plan's
    a = ring_allreduce(2, 1024, "float32", "sum")
    b = ring_allreduce(2, 1024, "float32", "max")
    assert a.wire_id() != b.wire_id()
    ins = make_inputs(a, 1)

    def run_a(c):
        return hcc.run(a, c, ins[0], timeout=5)

    def run_b(c):
        return hcc.run(b, c, ins[1], timeout=5)

    res, errs = two_ranks(run_a, run_b, timeout=5)
    assert any(isinstance(e, sockets.ProtocolError) and "different plans" in str(e) for e in errs), errs


def test_messages_that_arrive_before_their_receive_is_posted():
    data = [np.arange(1000, dtype=np.float64) * k for k in range(3)]

    def sender(c):
        reqs = [c.isend(1, k, memoryview(data[k])) for k in (2, 0, 1)]  # out of tag order
        left = set(range(3))
        while left:
            left -= set(i for i in c.wait_any(reqs, 5))
        c.barrier("sent")
        c.barrier("done")

    def receiver(c):
        c.barrier("sent")
        time.sleep(0.2)  # all three frames are held by now
        got = [np.zeros(1000) for _ in range(3)]
        reqs = [c.irecv(0, k, memoryview(got[k])) for k in range(3)]
        left = set(range(3))
        while left:
            left -= set(c.wait_any(reqs, 5))
        c.barrier("done")
        return got

    res, errs = two_ranks(sender, receiver)
    assert errs == [None, None]
    assert all(np.array_equal(a, b) for a, b in zip(res[1], data))


def test_wait_has_a_deadline():
    def idle(c):
        c.barrier("b", 10)
        time.sleep(1.5)

    def waiter(c):
        c.barrier("b", 10)
        req = c.irecv(0, 1, memoryview(bytearray(4)))
        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeout, match="rank 1: timed out after 0.5 s waiting on rank 0"):
            c.wait_any([req], 0.5)
        return time.monotonic() - t0

    res, errs = two_ranks(idle, waiter)
    assert errs == [None, None]
    assert 0.45 < res[1] < 1.5


def test_connect_rejects_bad_arguments():
    with pytest.raises(AuthenticationError, match="token is required"):
        sockets.connect(0, 2, "127.0.0.1:1", token="", timeout=1)
    with pytest.raises(RuntimeFault, match="outside a world of 2"):
        sockets.connect(2, 2, "127.0.0.1:1", token="x", timeout=1)


def test_failure_gossip_never_lands_inside_a_partly_written_frame():
    # an inline send (isend with an idle writer) may write the head of a frame and queue the
    # rest; the FAIL notice about a dead rank must then follow that frame, not cut into it
    # (a receiver would read a corrupt header and report a live peer dead)
    class Conn:
        def __init__(self, queue):
            self.cv = threading.Condition()
            self.queue = sockets.deque(queue)

    t = object.__new__(sockets.SocketTransport)
    t._lock, t._forwarded, t._closing = threading.Lock(), set(), False
    view = memoryview(bytearray(64))
    started, fresh, waiting = (sockets._Req(1, 7, view, True, 0) for _ in range(3))
    started.sent = 10
    t._conns = {1: Conn([started, waiting]), 2: Conn([fresh]), 3: Conn([]), 4: Conn([])}
    t._gossip(4)
    assert list(t._conns[1].queue) == [started, ("fail", 4), waiting]
    assert list(t._conns[2].queue) == [("fail", 4), fresh]  # nothing written yet: goes first
    assert list(t._conns[3].queue) == [("fail", 4)]
    assert list(t._conns[4].queue) == []  # the dead rank itself is not told
    t._gossip(4)  # once per dead rank
    assert len(t._conns[1].queue) == 3


@pytest.mark.parametrize("path", ["python", "native", "shm"])
def test_a_rank_that_gives_up_on_a_closed_peer_names_that_peer_to_the_others(path):
    """Rank 1 closes (a clean BYE) while rank 0 waits for its message; rank 0 gives up and
    closes too, while rank 2 waits for rank 0. Rank 2 must name rank 1, the rank that failed
    (rank 0 tells it before it closes: a FAIL frame over TCP, its bell over shared memory),
    not rank 0, whose close only followed. Over the Python sockets loop, the native TCP core
    and the shared-memory channels."""
    from conftest import ranks_in_threads

    from hcc.backends import native_tcp
    from hcc.backends.base import PeerFailed

    if path == "native" and not native_tcp.available():
        pytest.skip("the native TCP core is not built")

    def joined(c):
        if path == "native":
            c = native_tcp.switch(c)
        c.barrier("up", 10)
        if path == "native":
            native_tcp.dial(c, 5)
        return c

    def r0(c):
        c = joined(c)
        c.wait_any([c.isend(2, 1, memoryview(bytearray(4)))], 5)  # the connection to 2 is up
        with pytest.raises(PeerFailed) as e:
            c.wait_any([c.irecv(1, 1, memoryview(bytearray(4)))], 5)
        return e.value.peer

    def r1(c):
        c = joined(c)
        c.wait_any([c.isend(0, 2, memoryview(bytearray(4)))], 5)  # connected, then closes

    def r2(c):
        c = joined(c)
        c.wait_any([c.irecv(0, 1, memoryview(bytearray(4)))], 5)
        with pytest.raises(PeerFailed) as e:
            c.wait_any([c.irecv(0, 2, memoryview(bytearray(4)))], 5)
        return e.value.peer, str(e.value)

    res, errs = ranks_in_threads((r0, r1, r2), timeout=5, shm="on" if path == "shm" else "off")
    assert errs == [None, None, None], errs
    assert res[0] == 1
    assert res[2][0] == 1, res[2]


def test_a_death_is_queued_for_the_peers_before_any_waiter_can_see_it():
    # a waiter that sees the death gives up and closes: its BYE must find the FAIL frames
    # already queued ahead of it (else the peers blame the waiter that closed)
    class Conn:
        def __init__(self):
            self.cv = threading.Condition()
            self.queue = sockets.deque()

    t = object.__new__(sockets.SocketTransport)
    t._lock, t._forwarded, t._closing, t._dead = threading.Lock(), set(), False, {}
    t._cond, t.rank, t.world = threading.Condition(t._lock), 3, 4
    t._conns = {2: Conn()}
    seen = []
    gossip = t._gossip
    t._gossip = lambda dead, how="": (seen.append(dead in t._dead), gossip(dead, how))
    t._mark_dead(1, "connection lost")
    assert seen == [False] and t._dead == {1: "connection lost"}
    assert list(t._conns[2].queue) == [("fail", 1)]
    # a connection opened afterwards carries the deaths already gossiped, the peer's own excepted
    with t._lock:  # this rank is the highest: the peers dial it, no writer thread starts here
        c0, c1 = t._get_conn(0), t._get_conn(1)
    assert list(c0.queue) == [("fail", 1)] and list(c1.queue) == []


def test_a_connection_opened_after_a_death_tells_the_peer_who_died():
    """Rank 0 sees rank 1 close (its failure) before it has any connection to rank 2; it then
    sends rank 2 one message and closes. Rank 2, left waiting on rank 0, must name rank 1."""
    from conftest import ranks_in_threads

    from hcc.backends.base import PeerFailed

    def r0(c):
        c.barrier("up", 10)
        with pytest.raises(PeerFailed) as e:
            c.wait_any([c.irecv(1, 1, memoryview(bytearray(4)))], 5)
        try:
            c.wait_any([c.isend(2, 1, memoryview(bytearray(4)))], 5)  # the first frame to rank 2
        except PeerFailed as sent:
            # rank 2 may learn of the death from that frame and report it back before the
            # send's completion is seen: the report must name rank 1 too
            assert sent.peer == 1, sent
        return e.value.peer

    def r1(c):
        c.barrier("up", 10)
        c.wait_any([c.isend(0, 2, memoryview(bytearray(4)))], 5)  # connected, then closes

    def r2(c):
        c.barrier("up", 10)
        with pytest.raises(PeerFailed) as e:  # waiting on a message rank 0 never sends
            c.wait_any([c.irecv(0, 2, memoryview(bytearray(4)))], 5)
        return e.value.peer, str(e.value)

    res, errs = ranks_in_threads((r0, r1, r2), timeout=5, shm="off")
    assert errs == [None, None, None], errs
    assert res[0] == 1
    assert res[2][0] == 1, res[2]
