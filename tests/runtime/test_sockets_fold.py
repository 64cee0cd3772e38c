"""SocketTransport.irecv_fold, the fused receive-and-reduce: pieces in order and bounded, a
message that arrived early (whole or half), a failing fold, and the executor using it for a
plan's RecvReduce with results equal to numpy's."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_executor_plans import ring_allreduce  # noqa: E402
from test_sockets import _fake_rank0  # noqa: E402

import hcc  # noqa: E402
from hcc.backends import executor, runtime, sockets  # noqa: E402
from hcc.ir.plan import RecvReduce  # noqa: E402
from hcc.backends.launch import run_cases_local  # noqa: E402
from hcc.backends.reference import check, expected, make_inputs  # noqa: E402
from hcc.backends.rendezvous import StoreServer  # noqa: E402

pytestmark = pytest.mark.slow


class _Recorder:
    """A fold that keeps a copy of every piece it is given, and the thread that gave it."""

    def __init__(self):
        self.pieces: list[tuple[int, bytes]] = []
        self.threads: set[str] = set()

    def __call__(self, offset: int, piece: memoryview) -> None:
        self.pieces.append((offset, bytes(piece)))
        self.threads.add(threading.current_thread().name)

    def joined(self) -> bytes:
        out, at = b"", 0
        for off, data in self.pieces:
            assert off == at, (off, at)  # consecutive, from 0
            out += data
            at += len(data)
        return out


def _frame(session: bytes, tag: int, payload: bytes) -> bytes:
    return sockets.FRAME.pack(sockets.MAGIC, sockets.DATA, session, 0, tag, len(payload)) + payload


def test_posted_fold_gets_consecutive_bounded_pieces_in_the_reader():
    payload = np.random.default_rng(1).integers(0, 256, 3 * sockets.FOLD_PIECE + 1000, dtype=np.uint8).tobytes()
    with StoreServer("tok") as server:
        comm, sock, session = _fake_rank0(server)
        try:
            rec = _Recorder()
            req = comm.irecv_fold(0, 4, len(payload), rec)
            sock.sendall(_frame(session, 4, payload))
            assert comm.wait_any([req], 5) == [0]
            assert rec.joined() == payload
            assert len(rec.pieces) == 4 and max(len(p) for _, p in rec.pieces) == sockets.FOLD_PIECE
            assert all(t.startswith("hcc-r") for t in rec.threads), rec.threads  # the reader folds
        finally:
            sock.close()
            comm.close()


def test_fold_of_a_message_that_arrived_before_the_receive():
    whole, half = bytes(range(256)) * 40, bytes(range(200, 0, -1)) * 50
    with StoreServer("tok") as server:
        comm, sock, session = _fake_rank0(server)
        try:
            sock.sendall(_frame(session, 1, whole))
            # the second message is cut in two: its receive is posted between the halves
            frame2 = _frame(session, 2, half)
            sock.sendall(frame2[:sockets.FRAME.size + 3000])
            time.sleep(0.3)  # both frames are held by now, the second one incomplete
            early, late = _Recorder(), _Recorder()
            r1 = comm.irecv_fold(0, 1, len(whole), early)
            assert r1.done and early.joined() == whole  # folded at once, by the caller
            assert early.threads == {threading.current_thread().name}
            r2 = comm.irecv_fold(0, 2, len(half), late)
            assert not r2.done
            sock.sendall(frame2[sockets.FRAME.size + 3000:])
            assert comm.wait_any([r2], 5) == [0]
            assert late.joined() == half and len(late.pieces) == 1
        finally:
            sock.close()
            comm.close()


def test_a_failing_fold_is_reported_not_swallowed():
    def bad(offset, piece):
        raise ValueError("boom")

    with StoreServer("tok") as server:
        comm, sock, session = _fake_rank0(server)
        try:
            req = comm.irecv_fold(0, 9, 64, bad)
            sock.sendall(_frame(session, 9, bytes(64)))
            with pytest.raises(sockets.ProtocolError, match="folding message tag 9 failed: ValueError: boom"):
                comm.wait_any([req], 5)
        finally:
            sock.close()
            comm.close()


def _run_two_counting_folds(plan):
    """Run a 2-rank plan in two threads over sockets; (outputs, irecv_fold calls per rank)."""
    ins = make_inputs(plan, 5)
    server = StoreServer("tok")
    outs, errs, folds = [None, None], [None, None], [0, 0]

    def body(r):
        try:
            # shm off: this tests the TCP reader's fold (local ranks otherwise share memory)
            with sockets.connect(r, 2, server.address, "tok", timeout=10, serve_store=False, shm="off") as c:
                inner = c.irecv_fold

                def counting(peer, tag, nbytes, fold):
                    folds[r] += 1
                    return inner(peer, tag, nbytes, fold)

                c.irecv_fold = counting
                outs[r] = runtime.run(plan, c, ins[r], timeout=10)
                c.barrier("done", 10)
        except Exception as e:  # collected for the assertions
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    server.close()
    assert errs == [None, None]
    check(plan, outs, expected(plan, ins))
    return folds


@pytest.mark.parametrize("dtype,op,elems", [("float32", "sum", 3 * (sockets.FOLD_PIECE // 4) + 7),
                                            ("bfloat16", "avg", 100_003), ("int32", "max", 5)])
def test_executor_folds_recv_reduce_and_matches_numpy(dtype, op, elems):
    _every_recv_reduce_folds(ring_allreduce(2, elems, dtype, op))


def _every_recv_reduce_folds(plan) -> None:
    """Run ``plan`` on 2 ranks: every RecvReduce of each rank was folded, and there were some."""
    folds = _run_two_counting_folds(plan)
    assert folds == [sum(isinstance(o, RecvReduce) for o in prog) for prog in plan.programs] and all(folds)


def _star_allreduce(n: int, settings: str):
    """Compile allreduce ``a`` (``settings``, newline-separated) on ranks r0..r{n-1} around
    one switch, every link 2 GB/s, 100 us."""
    return hcc.compile(f"topology t {{ node r[0..{n - 1}]\n switch s\n r[0..{n - 1}] <-> s : 2 GB/s, 100 us }}\n"
                       f"collective a = allreduce on t {{ {settings} }}\n", "a")


def test_fold_with_the_fused_copy_of_a_compiled_ring():
    # the compiler starts a ring's reduce-scatter with Copy(in -> out) + RecvReduce(out): the
    # executor fuses them, so the fold computes out = in (op) received, piece by piece
    plan = _star_allreduce(2, "size = 3 MiB\n dtype = float32\n op = prod\n algorithm = ring\n"
                              " chunk = 512 KiB\n adaptive = off")
    bufs = {k: np.zeros(v, np.float32) for k, v in plan.buffer_elems(0).items()}
    assert executor.RankExecution(plan, SimpleNamespace(rank=0), plan.programs[0], bufs, 1.0).fused
    _every_recv_reduce_folds(plan)


def test_concurrent_folds_into_one_block_do_not_race():
    # a direct allreduce posts n-1 RecvReduces into each rank's own block at once; their folds
    # run in n-1 reader threads and must serialise (executor's reduce_lock) or sums get lost
    plan = _star_allreduce(4, "size = 4 MiB\n dtype = float32\n algorithm = direct\n adaptive = off")
    rr = [o for o in plan.programs[0] if isinstance(o, RecvReduce)]
    assert len(rr) == 3 and len({(o.dst.offset, o.dst.count) for o in rr}) == 1  # one block, 3 folds
    ins = make_inputs(plan, 11)
    res = run_cases_local("sockets", [(plan, ins)], iters=2, timeout=30)[0]
    check(plan, res.outputs, expected(plan, ins))
