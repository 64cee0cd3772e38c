"""The executor on hand-made plans (no compiler involved), ranks as threads over real
loopback sockets: results against numpy, pipelining structure, input checks before any byte
moves, deadlines, compressed plans."""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_executor_plans import chain_broadcast, ring_allreduce, threaded  # noqa: E402

from hcc.backends.base import CollectiveTimeout, RankFailed, Transport  # noqa: E402
from hcc.backends.executor import InputMismatch, UnknownOption  # noqa: E402
from hcc.backends.runtime import run  # noqa: E402
from hcc.backends.reference import check, expected, make_inputs  # noqa: E402
from hcc.ir.plan import Send  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("n,elems,chunk", [(2, 1, 1), (4, 1001, 100), (3, 5000, 4999)])
def test_chain_broadcast(n, elems, chunk):
    plan = chain_broadcast(n, elems, chunk, depth_order=list(reversed(range(n))))
    ins = make_inputs(plan, 1)
    outs, errs = threaded(plan, ins)
    assert errs == [None] * n
    check(plan, outs, expected(plan, ins))


@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float64", "max"), ("int32", "prod"),
                                      ("bfloat16", "avg"), ("float16", "min"), ("int8", "sum")])
@pytest.mark.parametrize("n,elems", [(2, 1), (3, 1001), (4, 7)])
def test_ring_allreduce(dtype, op, n, elems):
    plan = ring_allreduce(n, elems, dtype, op)
    ins = make_inputs(plan, 5)
    outs, errs = threaded(plan, ins)
    assert errs == [None] * n
    check(plan, outs, expected(plan, ins))


class NoBytes(Transport):
    """A transport that fails the test if the executor tries to move a byte."""

    name = "nobytes"

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def isend(self, peer, tag, data):
        raise AssertionError("a byte moved")

    irecv = isend

    def wait_any(self, requests, timeout):
        raise AssertionError("waited")


def test_wrong_input_is_rejected_before_any_byte_moves():
    plan = ring_allreduce(2, 10, "float32")
    comm = NoBytes(0, 2)
    with pytest.raises(InputMismatch, match="dtype float64 does not match the plan's float32"):
        run(plan, comm, np.zeros(10))
    with pytest.raises(InputMismatch, match="9 elements .* the plan needs 10"):
        run(plan, comm, np.zeros(9, np.float32))
    with pytest.raises(InputMismatch, match="C-contiguous"):
        run(plan, comm, np.zeros(20, np.float32)[::2])
    with pytest.raises(InputMismatch, match="output: 3 elements"):
        run(plan, comm, np.zeros(10, np.float32), out=np.zeros(3, np.float32))
    with pytest.raises(ValueError):  # InputMismatch is a ValueError too
        run(plan, NoBytes(0, 3), np.zeros(10, np.float32))
    with pytest.raises(UnknownOption, match="quorum"):
        run(plan, comm, np.zeros(10, np.float32), quorum=1)


def test_any_shape_and_buffer_protocol_inputs():
    plan = ring_allreduce(2, 12, "float32")
    ins = [np.arange(12, dtype=np.float32).reshape(3, 4), memoryview(np.ones(12, np.float32))]
    outs, errs = threaded(plan, ins)
    assert errs == [None, None]
    assert outs[0].shape == (3, 4)  # same shape as the input when the sizes agree
    assert np.array_equal(outs[1].reshape(-1), np.arange(12, dtype=np.float32) + 1)


def test_timeout_names_rank_peer_and_chunk():
    plan = chain_broadcast(2, 8, 4)
    # rank 0 "forgets" its second send: rank 1 must time out naming rank 0 and chunk 1
    p0 = tuple(op for op in plan.programs[0] if not (isinstance(op, Send) and op.chunk == 1))
    broken = dataclasses.replace(plan, programs=(p0, plan.programs[1]))
    t0 = time.monotonic()
    outs, errs = threaded(broken, make_inputs(plan, 0), timeout=1.0, linger=2.0)
    assert time.monotonic() - t0 < 8
    assert isinstance(errs[1], CollectiveTimeout)
    assert "rank 1: timed out after 1 s waiting on rank 0" in str(errs[1])
    assert "tree 0 chunk 1" in str(errs[1])
    # when rank 0 leaves instead of lingering, rank 1 learns it at once (no deadline wait)
    t0 = time.monotonic()
    outs, errs = threaded(broken, make_inputs(plan, 0), timeout=20.0)
    assert time.monotonic() - t0 < 5
    assert isinstance(errs[1], RankFailed)
    assert "rank 0 failed" in str(errs[1]) and "tree 0 chunk 1" in str(errs[1])


def test_pipelining_forwards_before_the_buffer_is_complete():
    """Rank 1 of a chain must send chunk 0 on before chunk 1 arrives: with a transport that
    withholds chunk 1 until chunk 0 has been forwarded, an unpipelined executor deadlocks."""

    class Gate(Transport):
        name = "gate"

        def __init__(self):
            self.rank, self.world, self.log = 1, 3, []

        def isend(self, peer, tag, data):
            self.log.append(("send", tag))
            r = type("R", (), {"done": True})()
            return r

        def irecv(self, peer, tag, buf):
            self.log.append(("recv", tag))
            r = type("R", (), {"done": False, "tag": tag})()
            return r

        def wait_any(self, requests, timeout):
            sent = {t for k, t in self.log if k == "send"}
            for i, r in enumerate(requests):
                if getattr(r, "tag", None) is not None and (r.tag == 0 or r.tag - 1 in sent):
                    r.done = True
            done = [i for i, r in enumerate(requests) if r.done]
            if not done:
                raise CollectiveTimeout(1, 0, "gate", timeout)
            return done

    plan = chain_broadcast(3, 40, 10)
    g = Gate()
    run(plan, g, None, timeout=1.0)
    sends = [t for k, t in g.log if k == "send"]
    assert sends == [0, 1, 2, 3]
    # every receive was posted up front, before the first forward
    assert [k for k, _ in g.log[:4]] == ["recv"] * 4


def test_compressed_plan_uses_the_codec():
    pytest.importorskip("hcc.backends.codecs")
    plan = dataclasses.replace(ring_allreduce(3, 3000, "float32", "sum"), compress="fp16")
    ins = make_inputs(plan, 2)
    outs, errs = threaded(plan, ins)
    assert errs == [None] * 3
    want = expected(plan, ins)[0]
    err = max(float(np.abs(o - want).max()) for o in outs)
    assert 0 < err < 0.05  # lossy (fp16 on the wire), but close
