"""Hand-made plans built directly with the IR types: they isolate the executor and the
transports from the compiler (a pipelined chain broadcast and a ring allreduce)."""
from __future__ import annotations

import threading
import time

from hcc.ir.plan import ChunkRef, Copy, Plan, Recv, RecvReduce, Scale, Send, Tree, block_range, DTYPE_SIZES
from hcc.backends.rendezvous import free_port  # noqa: F401  (the tests import it from here)
from hcc.ir.topology import Link, Topology


def _topo(n: int) -> Topology:
    names = tuple(f"r{i}" for i in range(n))
    links = tuple(Link(names[i], names[(i + 1) % n], 1e9) for i in range(n)) + tuple(
        Link(names[(i + 1) % n], names[i], 1e9) for i in range(n))
    return Topology("ring", names, (), links)


def _chunks(lo: int, hi: int, c: int):
    out, s = [], lo
    while s < hi:
        out.append((s, min(hi, s + c)))
        s = min(hi, s + c)
    return out


def chain_broadcast(n: int, elems: int, chunk_elems: int, dtype: str = "float32", depth_order=None) -> Plan:
    """Root 0 → 1 → … → n-1, chunk by chunk; each rank forwards a chunk as soon as it has it."""
    order = list(depth_order or range(n))
    chunks = _chunks(0, elems, chunk_elems)
    programs = []
    parent = [-1] * n
    for pos, r in enumerate(order):
        ops = []
        prev = order[pos - 1] if pos > 0 else -1
        nxt = order[pos + 1] if pos + 1 < n else -1
        if pos > 0:
            parent[r] = prev
        for c, (lo, hi) in enumerate(chunks):
            ref = ChunkRef("out", lo, hi - lo)
            if pos == 0:
                ops.append(Copy(ChunkRef("in", lo, hi - lo), ref))
                if nxt >= 0:
                    ops.append(Send(nxt, c, ChunkRef("in", lo, hi - lo), tree=0, chunk=c))
            else:
                ops.append(Recv(prev, c, ref, tree=0, chunk=c))
                if nxt >= 0:
                    ops.append(Send(nxt, c, ref, deps=(len(ops) - 1,), tree=0, chunk=c))
        programs.append((r, tuple(ops)))
    programs = tuple(p for _, p in sorted(programs))
    tree = Tree(0, order[0], tuple(parent), 1e9, (0, elems))
    return Plan(name="chain", kind="broadcast", ranks=tuple(f"r{i}" for i in range(n)), root=order[0],
                size_bytes=elems * DTYPE_SIZES[dtype], dtype=dtype, op=None, algorithm="chain",
                chunk_bytes=chunk_elems * DTYPE_SIZES[dtype], trees=(tree,), programs=programs,
                tmp_elems=(0,) * n, topology=_topo(n))


def ring_allreduce(n: int, elems: int, dtype: str = "float32", op: str = "sum") -> Plan:
    """Reduce-scatter then allgather around the ring r → r+1 (n-1 steps each)."""
    blocks = [block_range(elems, n, i) for i in range(n)]
    programs = []
    for r in range(n):
        ops = [Copy(ChunkRef("in", 0, elems), ChunkRef("out", 0, elems))]
        last_write = {b: 0 for b in range(n)}  # block -> op index that last wrote it
        sends = []
        nxt, prv = (r + 1) % n, (r - 1) % n
        for s in range(n - 1):
            b_out, b_in = (r - s) % n, (r - s - 1) % n
            lo, hi = blocks[b_out]
            ops.append(Send(nxt, s, ChunkRef("out", lo, hi - lo), deps=(last_write[b_out],), chunk=s))
            sends.append(len(ops) - 1)
            lo, hi = blocks[b_in]
            ops.append(RecvReduce(prv, s, ChunkRef("out", lo, hi - lo), deps=(0,), chunk=s))
            last_write[b_in] = len(ops) - 1
        ag_recvs = []
        for s in range(n - 1):
            b_out, b_in = (r + 1 - s) % n, (r - s) % n
            lo, hi = blocks[b_out]
            deps = (last_write[b_out],)
            if op == "avg" and s == 0:
                ops.append(Scale(ChunkRef("out", lo, hi - lo), n, deps=deps))
                last_write[b_out] = len(ops) - 1
                deps = (len(ops) - 1,)
            ops.append(Send(nxt, n + s, ChunkRef("out", lo, hi - lo), deps=deps, chunk=s))
            sends.append(len(ops) - 1)
            lo, hi = blocks[b_in]
            ops.append(Recv(prv, n + s, ChunkRef("out", lo, hi - lo), deps=tuple(sends[: n - 1]), chunk=s))
            last_write[b_in] = len(ops) - 1
            ag_recvs.append(len(ops) - 1)
        programs.append(tuple(ops))
    return Plan(name="ring", kind="allreduce", ranks=tuple(f"r{i}" for i in range(n)), root=-1,
                size_bytes=elems * DTYPE_SIZES[dtype], dtype=dtype, op=op, algorithm="ring",
                chunk_bytes=0, trees=(), programs=tuple(programs), tmp_elems=(0,) * n, topology=_topo(n))


def threaded(plan, inputs, outs_given=None, timeout=10.0, linger=0.0, **kw):
    """Run every rank of ``plan`` as a thread over real loopback sockets; returns (outputs,
    errors). ``outs_given``: per-rank output buffers; ``linger``: seconds a rank keeps its
    connections open after its part is done."""
    from hcc.backends import sockets
    from hcc.backends.runtime import run

    port = free_port()
    outs, errs = [None] * plan.n, [None] * plan.n

    def body(r):
        try:
            with sockets.connect(r, plan.n, f"127.0.0.1:{port}", token="test-token", timeout=timeout) as c:
                out = None if outs_given is None else outs_given[r]
                outs[r] = run(plan, c, inputs[r], out=out, timeout=timeout, **kw)
                time.sleep(linger)
        except Exception as e:  # collected and asserted by the caller
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r,)) for r in range(plan.n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout * 3)
    assert not any(t.is_alive() for t in ts), "a rank hung"
    return outs, errs
