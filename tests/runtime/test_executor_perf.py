"""The executor's and the sockets transport's fast paths, each against the plain result:
Copy fusion (``Copy(in → d)`` + ``RecvReduce(d)`` as one three-operand reduction), the staging
pool, inline sends (``MSG_DONTWAIT`` from the caller's thread, the writer finishing what the
socket buffer did not take) and early frames held in pooled memory."""
from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_executor_plans import _topo, free_port, threaded  # noqa: E402

import hcc  # noqa: E402
from hcc.backends import sockets  # noqa: E402
from hcc.backends.executor import RankExecution  # noqa: E402
from hcc.backends.kernels import STAGING, StagingPool, np_dtype  # noqa: E402
from hcc.backends.reference import check, expected, make_inputs  # noqa: E402
from hcc.ir.plan import (DTYPE_SIZES, ChunkRef, Copy, Plan, Recv, RecvReduce, Scale, Send,  # noqa: E402
                         block_range)

pytestmark = pytest.mark.slow


def fusable_allreduce(elems: int, dtype: str = "float32", op: str = "sum") -> Plan:
    """2-rank allreduce shaped like the compiler's ring: each rank copies its own block
    in → out, and that Copy's only dependent is the RecvReduce into the same block."""
    blocks = [block_range(elems, 2, i) for i in range(2)]
    programs = []
    for r in range(2):
        o = 1 - r
        (mlo, mhi), (olo, ohi) = blocks[r], blocks[o]
        mine, other = ChunkRef("out", mlo, mhi - mlo), ChunkRef("out", olo, ohi - olo)
        ops = [Copy(ChunkRef("in", mlo, mhi - mlo), mine),            # 0
               Send(o, 0, ChunkRef("in", olo, ohi - olo)),            # 1
               RecvReduce(o, 0, mine, deps=(0,))]                     # 2
        last = 2
        if op == "avg":
            ops.append(Scale(mine, 2, deps=(2,)))
            last = 3
        ops.append(Send(o, 1, mine, deps=(last,)))
        ops.append(Recv(o, 1, other, deps=(1,)))
        programs.append(tuple(ops))
    return Plan(name="fusable", kind="allreduce", ranks=("r0", "r1"), root=-1,
                size_bytes=elems * DTYPE_SIZES[dtype], dtype=dtype, op=op, algorithm="ring",
                chunk_bytes=0, trees=(), programs=tuple(programs), tmp_elems=(0, 0), topology=_topo(2))


class _Idle:
    rank, world, name = 0, 2, "idle"


def test_copy_fusion_is_detected_only_where_sound():
    plan = fusable_allreduce(10)
    dt = np_dtype(plan.dtype)
    ex = RankExecution(plan, _Idle(), plan.programs[0],
                       {"in": np.zeros(10, dt), "out": np.zeros(10, dt), "tmp": np.zeros(0, dt)}, 1.0)
    assert ex.fused == {2: plan.programs[0][0].src} and ex.skip_copy == {0}
    # in-place call (out is the input): "in" gets written, so nothing is fused
    buf = np.zeros(10, dt)
    ex = RankExecution(plan, _Idle(), plan.programs[0], {"in": buf, "out": buf, "tmp": np.zeros(0, dt)}, 1.0)
    assert ex.fused == {} and ex.skip_copy == set()
    # a Copy with a second dependent is kept (another op relies on it having run)
    p0 = plan.programs[0]
    two = p0[:4] + (Recv(1, 1, p0[4].dst, deps=(0, 1)),)
    ex = RankExecution(plan, _Idle(), two,
                       {"in": np.zeros(10, dt), "out": np.zeros(10, dt), "tmp": np.zeros(0, dt)}, 1.0)
    assert ex.fused == {}


@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float64", "max"), ("int32", "prod"),
                                      ("bfloat16", "avg"), ("float16", "min"), ("int8", "sum")])
@pytest.mark.parametrize("elems", [1, 1001, 3 << 19])  # 3<<19: 6 MiB, 3 MiB blocks: frames larger than the socket buffer
def test_fused_allreduce_matches_numpy(dtype, op, elems):
    plan = fusable_allreduce(elems, dtype, op)
    ins = make_inputs(plan, 3)
    outs, errs = threaded(plan, ins)
    assert errs == [None, None]
    check(plan, outs, expected(plan, ins))


@pytest.mark.parametrize("elems", [1001, 3 << 19])
def test_in_place_call_is_exact(elems):
    plan = fusable_allreduce(elems, "float32", "sum")
    ins = make_inputs(plan, 4)
    want = expected(plan, ins)
    bufs = [x.copy() for x in ins]
    outs, errs = threaded(plan, bufs, outs_given=bufs)
    assert errs == [None, None]
    check(plan, outs, want)
    assert all(o is b for o, b in zip(outs, bufs))


def test_staging_pool_reuses_by_size_and_keeps_at_most_its_limit():
    pool = StagingPool(limit=3000)
    a = pool.take(250, np.dtype(np.float32))  # 1000 bytes
    assert a.dtype == np.float32 and a.size == 250
    pool.give(a)
    b = pool.take(500, np.dtype(np.uint16))  # same 1000 bytes: the same memory back
    assert np.shares_memory(a, b) and b.dtype == np.uint16
    c = pool.take(1000, np.dtype(np.uint8))
    assert not np.shares_memory(b, c)  # b is out: a new array
    big = pool.take(1000, np.dtype(np.float32))  # 4000 bytes: over the limit, not kept
    for x in (b, c, big):
        pool.give(x)
    assert pool._kept == 2000
    assert not np.shares_memory(pool.take(1000, np.dtype(np.float32)), big)


def pair(timeout=10.0):
    """Two connected SocketTransports in this process (ranks 0 and 1)."""
    port = free_port()
    comms = [None, None]

    def body(r):
        # shm off: these tests measure the TCP path (local ranks otherwise share memory)
        comms[r] = sockets.connect(r, 2, f"127.0.0.1:{port}", token="perf-token", timeout=timeout, shm="off")

    ts = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    assert all(comms)
    return comms


def _wait(comm, reqs, timeout=10.0):
    end = time.monotonic() + timeout
    while not all(r.done for r in reqs):
        comm.wait_any(reqs, max(0.01, end - time.monotonic()))


def test_inline_sends_and_large_frames_finished_by_the_writer():
    a, b = pair()
    try:
        first = np.arange(4, dtype=np.uint8)
        r0 = a.isend(1, 0, memoryview(first))  # first use: the writer dials, then sends
        got0 = np.zeros(4, np.uint8)
        _wait(b, [b.irecv(0, 0, memoryview(got0))])
        _wait(a, [r0])
        small = np.arange(100, dtype=np.uint8)
        r1 = a.isend(1, 1, memoryview(small))
        assert r1.done  # connected, idle writer, room in the socket buffer: sent inline
        # 32 MiB exceeds any socket buffer: the inline send writes part, the writer the rest
        big = np.random.default_rng(1).integers(0, 255, 32 << 20, dtype=np.uint8)
        r2 = a.isend(1, 2, memoryview(big))
        r3 = a.isend(1, 3, memoryview(small[:7]))  # queued behind the big frame, in order
        got1, got2, got3 = np.zeros(100, np.uint8), np.zeros(32 << 20, np.uint8), np.zeros(7, np.uint8)
        rr = [b.irecv(0, 1, memoryview(got1)), b.irecv(0, 2, memoryview(got2)),
              b.irecv(0, 3, memoryview(got3))]
        _wait(b, rr)
        _wait(a, [r2, r3])
        assert np.array_equal(got0, first) and np.array_equal(got1, small)
        assert np.array_equal(got2, big) and np.array_equal(got3, small[:7])
    finally:
        a.close()
        b.close()


def test_early_frames_are_held_in_pooled_memory_and_delivered_exactly():
    a, b = pair()
    try:
        msgs = [np.full(1 << 20, i + 1, dtype=np.uint8) for i in range(3)]
        sends = [a.isend(1, 10 + i, memoryview(m)) for i, m in enumerate(msgs)]
        _wait(a, sends)
        end = time.monotonic() + 10
        while len(b._held) < 3 and time.monotonic() < end:  # all three arrive unposted
            time.sleep(0.01)
        kept = STAGING._kept
        got = [np.zeros(1 << 20, np.uint8) for _ in msgs]
        reqs = [b.irecv(0, 10 + i, memoryview(g)) for i, g in enumerate(got)]
        _wait(b, reqs)
        assert all(np.array_equal(g, m) for g, m in zip(got, msgs))
        assert STAGING._kept >= kept + 3 * (1 << 20) or STAGING._kept + (1 << 20) > STAGING.limit
    finally:
        a.close()
        b.close()



class _Staged:
    """A sockets transport without ``irecv_fold``: the staged receive path MPI and Ray's
    object store take, where whole chunks complete in the executor's thread."""

    def __init__(self, comm):
        self._comm = comm

    def __getattr__(self, name):
        if name == "irecv_fold":
            raise AttributeError(name)
        return getattr(self._comm, name)


def _direct_allreduce(n: int, elems: int, dtype: str, op: str) -> Plan:
    import hcc

    src = (f"topology t {{ node r[0..{n - 1}]\n switch s\n r[0..{n - 1}] <-> s : 8 GB/s, 100 us }}\n"
           f"collective a = allreduce on t {{ size = {elems * DTYPE_SIZES[dtype]} B\n dtype = {dtype}\n"
           f" op = {op}\n algorithm = direct\n adaptive = off }}\n")
    return hcc.compile(src, "a")


def test_a_copy_with_several_reductions_of_its_block_is_fused_only_on_the_staged_path():
    plan = _direct_allreduce(4, 4096, "float32", "sum")
    dt = np_dtype(plan.dtype)
    for r in range(plan.n):
        prog = plan.programs[r]
        copies = [k for k, o in enumerate(prog) if isinstance(o, Copy)]
        rrs = [k for k, o in enumerate(prog) if isinstance(o, RecvReduce)]
        assert len(copies) == 1 and len(rrs) == 3
        bufs = {k: np.zeros(v, dt) for k, v in plan.buffer_elems(r).items()}
        staged = RankExecution(plan, SimpleNamespace(rank=r), prog, bufs, 1.0)
        assert staged.skip_copy == {copies[0]}
        assert staged.fused == {k: prog[copies[0]].src for k in rrs}
        assert set(staged.fuse_group.values()) == {copies[0]}
        folding = RankExecution(plan, SimpleNamespace(rank=r, irecv_fold=lambda *a: None), prog, bufs, 1.0)
        assert folding.fused == {} and folding.skip_copy == frozenset()


@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float64", "max"), ("int32", "prod"),
                                      ("bfloat16", "avg"), ("float16", "min")])
def test_fused_direct_allreduce_on_the_staged_path_matches_numpy(dtype, op):
    # every one of the three RecvReduces may complete first; whichever does starts the
    # block from the input, the others reduce into it; two iterations: the second run must
    # start from the input again, not from the first run's result
    plan = _direct_allreduce(4, 3 * 4096 + 5, dtype, op)
    ins = make_inputs(plan, 21)
    want = expected(plan, ins)
    port = free_port()
    outs, errs = [None] * plan.n, [None] * plan.n

    def body(r):
        try:
            with sockets.connect(r, plan.n, f"127.0.0.1:{port}", token="staged", timeout=20.0, shm="off") as c:
                comm = _Staged(c)
                for _ in range(2):
                    outs[r] = hcc.run(plan, comm, ins[r], timeout=20.0)
        except Exception as e:  # asserted below
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r,)) for r in range(plan.n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts) and errs == [None] * plan.n
    check(plan, outs, want)

