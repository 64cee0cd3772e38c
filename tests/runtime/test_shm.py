"""The shared-memory channels between the ranks of one host (backends/shm.py): a SIGKILLed
local peer noticed at once through the channel, segments that have no name anywhere, the
HMAC challenge on the unix sockets, and one job mixing shared memory and TCP per peer."""
from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest

import hcc
from hcc.backends import native, shm, sockets
from hcc.backends.adaptive.fast import StoreCounters
from hcc.backends.adaptive.session import session_of
from hcc.backends.launch import RunFailed, run_cases_local
from hcc.backends.reference import check, expected, make_inputs
from hcc.backends.rendezvous import AuthenticationError, free_port

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not native.available(), reason="the native core is not built (pip install -e .)")]

SRC = """topology t {
    node r[0..3]
    switch s
    r[0..3] <-> s : 8 GB/s, 20 us
}
collective big = broadcast on t {
    size = 32 MiB
    dtype = float32
    chunk = 256 KiB
    adaptive = off
}
collective ar = allreduce on t {
    size = 1000004 B
    dtype = int32
    adaptive = off
}
collective arf = allreduce on t {
    size = 4 MiB
    dtype = float32
    chunk = 128 KiB
}
"""


@pytest.fixture(scope="module")
def plans():
    program = hcc.load(SRC)
    return {n: hcc.compile(program, n) for n in ("big", "ar", "arf")}


def test_a_killed_local_peer_is_noticed_through_the_channel(plans, monkeypatch):
    monkeypatch.setenv("HCC_SHM", "on")
    with pytest.raises(RunFailed) as ei:
        run_cases_local("sockets", [(plans["big"], 0)], iters=200, timeout=10, kill_rank=(2, 0.3),
                        save_outputs=False)
    errs = ei.value.errors
    assert set(errs) == {0, 1, 2, 3}, errs
    assert "signal 9" in errs[2]
    for r in (0, 1, 3):
        assert "rank 2 failed" in errs[r] or "rank 2" in errs[r], errs[r]
        assert "timed out" not in errs[r]
    assert ei.value.detail["kill_to_end_s"] < 10, ei.value.detail  # the per-wait deadline


_SUICIDE = """
import os, signal, sys
from hcc.backends import sockets
c = sockets.connect(0, 2, sys.argv[1], token="kill-test", timeout=20, serve_store=False, shm="on")
c.barrier("up")
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["wait_any", "runner"])
def test_a_sigkilled_peer_is_seen_at_once_by_a_rank_blocked_on_its_channel(how, monkeypatch):
    # rank 0 (a child process) SIGKILLs itself once connected; rank 1 (this process) is blocked
    # on a receive from it: the unix socket's EOF wakes it, long before its 10 s deadline
    import subprocess
    import sys
    import time

    from hcc.backends.base import PeerFailed, RankFailed
    from hcc.backends.rendezvous import StoreServer

    monkeypatch.setenv("HCC_NATIVE", "1")
    plan = hcc.compile(hcc.load("topology t {\n    node a, b\n    a <-> b : 8 GB/s, 20 us\n}\n"
                                "collective c = allreduce on t {\n    size = 1 MiB\n    dtype = int32\n"
                                "    adaptive = off\n}\n"), "c")
    with StoreServer("kill-test") as server:
        child = subprocess.Popen([sys.executable, "-c", _SUICIDE, server.address])
        try:
            comm = sockets.connect(1, 2, server.address, token="kill-test", timeout=20, serve_store=False, shm="on")
            try:
                assert comm.local_peers == {0}
                comm.barrier("up")
                t0 = time.monotonic()
                if how == "wait_any":
                    req = comm.irecv(0, 7, memoryview(bytearray(64)))
                    with pytest.raises(PeerFailed, match="shared-memory channel closed"):
                        comm.wait_any([req], 10)
                else:
                    with pytest.raises(RankFailed, match="rank 0 failed.*shared-memory channel closed"):
                        hcc.run(plan, comm, np.ones(plan.elems, np.int32), timeout=10)
                assert time.monotonic() - t0 < 5
                assert 0 in comm.failed()
            finally:
                comm.close()
        finally:
            child.wait(20)
        assert child.returncode == -9


def _job(n: int, fn, labels=None, timeout: float = 20.0, monkeypatch=None, shm_mode: str = "auto"):
    """``fn(rank, comm)`` on n ranks as threads of this process; ``labels[r]``: rank r's host
    label (as ``HCC_SHM_HOST`` gives one per process); ``shm_mode``: connect()'s ``shm``."""
    port = free_port()
    out, errs = [None] * n, []
    if labels is not None:
        who = threading.local()
        real = shm.host_id

        def host_id():
            os.environ.pop("HCC_SHM_HOST", None)
            return real() + ":" + labels[who.rank]

        monkeypatch.setattr(shm, "host_id", host_id)

    def body(r):
        try:
            if labels is not None:
                who.rank = r
            with sockets.connect(r, n, f"127.0.0.1:{port}", token="shm-test", timeout=timeout,
                                 shm=shm_mode) as c:
                out[r] = fn(r, c)
                c.barrier("done")
        except Exception as e:  # reported below
            errs.append((r, repr(e)))

    ts = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout * 3)
    assert not errs, errs
    return out


def test_one_job_mixes_shared_memory_and_tcp_per_peer(plans, monkeypatch):
    labels = ["a", "a", "b", "b"]  # two "hosts" of two ranks
    cases = [plans["ar"], plans["arf"], plans["big"]]
    ins = {p.name: make_inputs(p, 4) for p in cases}

    def fn(r, c):
        local = getattr(c, "local_peers", frozenset())
        outs = [hcc.run(p, c, ins[p.name][r]) for p in cases]
        # two hosts: no board; arf's fast path (adaptive by default) agreed on the store
        assert c.board() is None and isinstance(session_of(c).fast_counters, StoreCounters)
        return local, outs

    res = _job(4, fn, labels, monkeypatch=monkeypatch)
    assert [sorted(local) for local, _ in res] == [[1], [0], [3], [2]]
    for i, p in enumerate(cases):
        check(p, [outs[i] for _, outs in res], expected(p, ins[p.name]))


def test_segments_have_no_name_and_go_with_their_transport(plans):
    seen = {}

    def fn(r, c):
        if r == 0:
            with open("/proc/self/maps") as f:
                seen["maps"] = [ln for ln in f if "hcc-shm" in ln]
        return hcc.run(plans["ar"], c, make_inputs(plans["ar"], 1)[r])

    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    _job(4, fn)
    # while the job ran, every rank's segment was mapped from a memfd: no path, "(deleted)"
    assert seen["maps"] and all("/memfd:hcc-shm-r" in ln and "(deleted)" in ln for ln in seen["maps"])
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert not [f for f in after - before if "hcc" in f]
    import gc

    gc.collect()
    with open("/proc/self/maps") as f:  # closed and collected: nothing of them stays mapped
        assert not [ln for ln in f if "hcc-shm" in ln]
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    assert not [x for x in fds if "hcc-shm" in x]


def test_the_unix_socket_handshake_refuses_another_token():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    result = {}

    def listener():
        try:
            result["peer"] = sockets.accept_handshake(a, b"right", 1, 2, 5)
        except Exception as e:  # the refusal, asserted below
            result["err"] = e

    t = threading.Thread(target=listener)
    t.start()
    with pytest.raises(AuthenticationError):
        sockets.dial_handshake(None, b"wrong", 0, 1, 2, 5, sock=b)
    t.join(10)
    a.close()
    assert "peer" not in result and isinstance(result.get("err"), (AuthenticationError, ConnectionError, OSError))


def test_the_unix_socket_handshake_accepts_the_token():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    result = {}
    t = threading.Thread(target=lambda: result.update(peer=sockets.accept_handshake(a, b"tok", 1, 2, 5)))
    t.start()
    _, session = sockets.dial_handshake(None, b"tok", 0, 1, 2, 5, sock=b)
    t.join(10)
    assert result["peer"] == (0, session)
    a.close()
    b.close()


def test_adaptive_default_runs_over_the_channels(plans):
    # arf leaves adaptive to the backend's default (on for sockets): the fast path or the
    # adaptive schedule, either way over the channels, exact
    p = plans["arf"]
    ins = make_inputs(p, 2)

    def fn(r, c):
        assert isinstance(c, shm.ShmSocketTransport)
        outs = [np.array(hcc.run(p, c, ins[r])) for _ in range(3)][-1]
        # the whole job on one host: the fast path agrees on the host's shared board, and
        # the rendezvous store never holds its counters
        session = session_of(c)
        assert isinstance(session.fast_counters, shm.ShmBoard)
        assert all(c.store.peek(f"{session.log.prefix}/fast/{slot}") is None for slot in range(3))
        return outs

    check(p, _job(4, fn), expected(p, ins))


def test_the_board_adds_atomically_and_wakes_a_waiter():
    # ranks 1 and 2 add 1 to slot 5 a thousand times each at once while rank 0 waits for the
    # total: no update is lost (atomic adds), and the last add's wake-up ends rank 0's wait
    adds = 1000

    def fn(r, c):
        board = c.board()
        if r == 0:
            got = board.wait(5, 2 * adds, 20.0)
        else:
            for i in range(adds):
                board.add(5, 1, wake=i == adds - 1)
            got = board.wait(5, 2 * adds, 20.0)
        assert board.wait(7, 1, 0.01) is None  # never reached: None at its deadline
        return got

    assert _job(3, fn) == [2 * adds] * 3


def test_a_gated_run_starts_only_on_the_static_decision_and_leaves_nothing_posted(plans):
    # the fast path's gate (ShmBoard.run_gated): an adaptive decision (two targets) and a
    # decision that never comes both return False with nothing posted or moved; the run then
    # started by one target on the board is exact, so the shut gates left nothing behind
    from hcc.backends.executor import RankExecution

    p, target = plans["ar"], 1 << 32
    ins = make_inputs(p, 5)

    def fn(r, c):
        board = c.board()

        def execution():
            out = np.full(p.buffer_elems(r)["out"], -7, np.int32)
            return out, RankExecution(p, c, p.programs[r], {"in": ins[r], "out": out,
                                                            "tmp": np.empty(p.tmp_elems[r], np.int32)}, 20.0)

        if r == 0:
            board.set(9, 2 * target)
        c.barrier("set")
        out, ex = execution()
        assert board.run_gated(ex, 9, target, 20.0) is False and (out == -7).all()
        out, ex = execution()
        assert board.run_gated(ex, 10, target, 0.05) is False and (out == -7).all()
        c.barrier("shut")
        out, ex = execution()
        if r == 0:
            board.add(11, target)
            ex.execute()
        else:
            assert board.run_gated(ex, 11, target, 20.0) is True
        return out

    check(p, _job(4, fn), expected(p, ins))
