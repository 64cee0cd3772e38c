"""The communicator's plans over TCP in the native core (backends/native_tcp.py,
backends/_native_tcp.c) against the Python transport and executor, and the core's frame checks.

Ranks are threads of this process (the core runs without the GIL, so they run at once), each
with its own :class:`~hcc.collectives.Communicator` over loopback TCP (``shm="off"``); the same
calls run once over the core and once with ``HCC_NATIVE_TCP=0`` (the Python path), and the
outputs must be bit-identical (integers exactly; the floats here are small integers, exact in
every order). The frame checks speak to one engine over a socketpair with frames packed as
backends/sockets.py packs them."""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from hcc.backends import native_tcp, sockets
from hcc.collectives import CallInfo, CollectiveError, Communicator

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not native_tcp.available(), reason="the native TCP core is not built")]


class _Store(dict):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def set(self, k, v):
        with self.lock:
            self[k] = v

    def get(self, k):  # noqa: A003 - the KeyStore protocol's name
        return self[k]

    def check(self, keys):
        return all(k in self for k in keys)


_CACHES: dict = {}  # one PlanCache per cache directory, shared by every thread-rank of the tests


def _job(world: int, fn, cache, timeout: float = 30.0):
    """``fn(rank, comm)`` on ``world`` thread-ranks; returns (results, errors, transport class
    names). The ranks share one plan cache (one process: every plan is compiled once)."""
    store = _Store()
    res, errs, kinds = [None] * world, [None] * world, [None] * world

    def body(r):
        try:
            c = Communicator.connect(r, world, store, shm="off", timeout=timeout, cache_dir=str(cache))
        except Exception as e:  # collected for the assertions
            errs[r] = e
            return
        kinds[r] = type(c.transport).__name__
        c.cache = _CACHES.setdefault(str(cache), c.cache)
        try:
            res[r] = fn(r, c)
        except Exception as e:
            errs[r] = e
        finally:
            c.close()

    ts = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(4 * timeout)
    assert not any(t.is_alive() for t in ts), "a rank hung"
    return res, errs, kinds


def _issue(c, kind, arr, op=None, root=-1):
    def body(comm, seqs):
        comm.run(seqs[0], kind, arr.size, arr.dtype.name if arr.dtype != np.uint16 else "bfloat16", arr, arr,
                 op=op, root=root)

    return c.submit(CallInfo(kind, arr.size, str(arr.dtype), op, root), body)


CALLS = [("allreduce", "int32", 1001, "sum"), ("allreduce", "int64", 7, "prod"),
         ("allreduce", "float32", (1 << 18) + 3, "sum"), ("allreduce", "bfloat16", 513, "avg"),
         ("broadcast", "int32", 777, None)]


def _calls(rank: int, c) -> list[np.ndarray]:
    """Every call of CALLS issued at once (async, several in flight), then waited for."""
    arrs, hs = [], []
    for i, (kind, dt, n, op) in enumerate(CALLS):
        v = ((np.arange(n) * 7 + rank * 5 + i) % 7 - 3).astype(np.int64)
        if dt == "bfloat16":  # small integers as bfloat16 bits
            a = (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            a = v.astype(dt)
        arrs.append(a)
        hs.append(_issue(c, kind, a, op, root=1 if kind == "broadcast" else -1))
    for h in reversed(hs):
        h.wait(60)
    return arrs


def test_native_tcp_runs_match_the_python_executor(tmp_path, monkeypatch):
    native, errs, kinds = _job(3, _calls, tmp_path / "cache")
    assert errs == [None] * 3, errs
    assert kinds == ["NativeTcpTransport"] * 3
    monkeypatch.setenv("HCC_NATIVE_TCP", "0")
    python, errs, kinds = _job(3, _calls, tmp_path / "cache")
    assert errs == [None] * 3, errs
    assert kinds == ["SocketTransport"] * 3
    for r in range(3):
        for (kind, dt, n, op), a, b in zip(CALLS, native[r], python[r]):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (r, kind, dt, op)
    # and both are right: numpy's answer for the integer calls
    ins = [[((np.arange(n) * 7 + q * 5 + i) % 7 - 3) for i, (_, _, n, _) in enumerate(CALLS)] for q in range(3)]
    assert np.array_equal(native[0][0], sum(x[0] for x in ins).astype(np.int32))
    assert np.array_equal(native[2][1], np.prod([x[1] for x in ins], axis=0).astype(np.int64))
    assert np.array_equal(native[1][2], sum(x[2] for x in ins).astype(np.float32))
    assert np.array_equal(native[0][4], ins[1][4].astype(np.int32))


def test_native_tcp_mismatched_order_and_a_closed_rank_fail_fast(tmp_path, monkeypatch):
    """Ranks 0, 1 all-reduce where rank 2 broadcasts: every rank fails within seconds (the plan
    ids on the wire), naming both calls. Then a job where rank 2 closes before its call: the
    others fail naming rank 2, well before their 30 s deadline (the failing ranks wait 2 s,
    not 5, for the others' description of the call: rank 2 never gives one)."""
    from hcc import collectives

    monkeypatch.setattr(collectives, "DIAG_WAIT_S", 2.0)
    def order(rank, c):
        a = np.arange(1000, dtype=np.float32)
        t0 = time.monotonic()
        h = _issue(c, "allreduce", a, "sum") if rank < 2 else _issue(c, "broadcast", a[:77].copy(), root=0)
        with pytest.raises(CollectiveError) as e:
            h.wait(60)
        return str(e.value), time.monotonic() - t0

    res, errs, kinds = _job(3, order, tmp_path / "cache")
    assert errs == [None] * 3 and kinds == ["NativeTcpTransport"] * 3, errs
    assert all(t < 20 for _, t in res), res
    # every rank names both calls. Which rank sees the other call's frame first ("the ranks
    # are running different plans") and which see only its connection close after it depends
    # on timing: on a loaded machine two ranks detect at once and each reports the other's
    # closed connection (1 run in 30 with two busy processes beside the job)
    assert all("ranks 0, 1 called allreduce" in m and "rank 2 called broadcast" in m for m, _ in res), res

    def closer(rank, c):
        if rank == 2:
            c.transport.close()
            return "closed", 0.0
        t0 = time.monotonic()
        with pytest.raises(CollectiveError) as e:
            _issue(c, "allreduce", np.ones(1001, dtype=np.int32), "sum").wait(60)
        return str(e.value), time.monotonic() - t0

    res, errs, _ = _job(3, closer, tmp_path / "cache")
    assert errs == [None] * 3, errs
    for m, t in res[:2]:
        assert "rank 2" in m and t < 20, (m, t)


# ------------------------------------------------------------------ the frame checks
SESSION = b"\x01\x02\x03\x04\x05\x06\x07\x08"


def _engine_pair(max_message: int = 1 << 20):
    from hcc.backends import _native_tcp

    a, b = socket.socketpair()
    eng = _native_tcp.Engine(0, 2, max_message)
    eng.add_peer(1, a.detach(), SESSION)
    return eng, b


def _frame(kind, plan, tag, length, session=SESSION):
    return sockets.FRAME.pack(sockets.MAGIC, kind, session, plan, tag, length)


def _status(eng, timeout: float = 5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = eng.failure(1)
        if st[0]:
            return st
        time.sleep(0.01)
    return eng.failure(1)


def test_frames_interoperate_with_the_python_transport_format():
    eng, peer = _engine_pair()
    try:
        got = np.zeros(5, dtype=np.int32)
        h = eng.irecv(1, 9, 0xABCD, memoryview(got).cast("B"))
        peer.sendall(_frame(sockets.DATA, 0xABCD, 9, 20) + np.arange(5, dtype=np.int32).tobytes())
        done, (status, _, _) = eng.wait([h], 5.0)
        assert done == [h] and status == 0 and got.tolist() == [0, 1, 2, 3, 4]
        s = eng.isend(1, 3, 7, b"hello")
        hdr = sockets.FRAME.unpack(peer.recv(sockets.FRAME.size, socket.MSG_WAITALL))
        assert hdr == (sockets.MAGIC, sockets.DATA, SESSION, 7, 3, 5)
        assert peer.recv(5, socket.MSG_WAITALL) == b"hello" and eng.wait([s], 5.0)[0] == [s]
        # a receive posted for another plan than the frame's: the ranks run different plans
        h = eng.irecv(1, 4, 1, memoryview(bytearray(8)))
        peer.sendall(_frame(sockets.DATA, 2, 4, 8) + bytes(8))
        status, _, msg = _status(eng)
        assert status == 3 and "different plans" in msg, msg
    finally:
        peer.close()
        eng.close(0.1)


@pytest.mark.parametrize("frame,says", [
    (_frame(sockets.DATA, 0, 5, 1 << 40), "exceeds the bound of 1048576 bytes"),
    (_frame(sockets.DATA, 0, 5, 4, session=b"x" * 8), "bad frame header"),
    (_frame(9, 0, 5, 0), "unknown frame kind 9"),
    (_frame(sockets.FAIL, 0, 77, 0), "outside a world of 2"),
], ids=["too long", "bad session", "unknown kind", "FAIL outside the world"])
def test_bad_frames_are_protocol_errors_before_any_allocation(frame, says):
    eng, peer = _engine_pair()
    try:
        peer.sendall(frame)
        status, rank, msg = _status(eng)
        assert status == 3 and rank == 1 and says in msg, msg
    finally:
        peer.close()
        eng.close(0.1)


def test_eof_without_bye_is_a_death_and_bye_a_close():
    eng, peer = _engine_pair()
    peer.close()
    status, rank, msg = _status(eng)
    assert (status, rank) == (2, 1) and "connection lost" in msg
    assert 1 in eng.dead()
    eng.close(0.1)
    eng, peer = _engine_pair()
    peer.sendall(_frame(sockets.BYE, 0, 0, 0))
    assert _status(eng)[0] == 4
    peer.close()
    eng.close(0.1)
