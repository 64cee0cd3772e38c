"""hcc.compiler.baselines — the NCCL-like schedules hcc's plans are measured against.

Every baseline is lowered to the same plan IR and priced by the same cost model
(compiler/cost.py) at its own best chunk size, so "hcc vs NCCL-like" compares schedules, not
models. By candidate name (compiler/registry.py):

- ``ring`` — the single ring (NCCL, Patarasuk & Yuan 2009) along routes.ring_order. Ring
  allreduce: the buffer is cut into n segments; n-1 reduce-scatter steps leave position i
  holding the reduced segment i+1, then n-1 allgather steps circulate the reduced segments.
  Each segment is cut into the same number of chunks and every chunk runs its own 2(n-1)
  steps, so chunks pipeline: exactly 2·(n-1)·n·chunks sends. The other kinds are chains along
  the ring order, lowered by compiler/lower.py: broadcast/scatter a chain from the root,
  reduce/gather a chain into the root, allgather/reduce_scatter one chain per rank (the
  n-1-step ring algorithms).
- ``rings`` — NCCL's multi-channel rings (compiler/channels.py).
- ``tree`` — NCCL 2.4's double binary tree for broadcast, reduce and allreduce: the two
  complementary lowest-set-bit trees of routes.btree_pair over the ring order, each carrying
  half the data. Broadcast and reduce route each edge over the least loaded of the equal
  shortest routes (a fat tree's spines, as ECMP spreads them) and post each edge's receives
  two chunks ahead (compiler/bcast_trees.py).
- ``rd`` — the logarithmic allgather and reduce-scatter: recursive doubling for a power-of-two
  rank count (at step s rank r exchanges its aligned group of 2^s blocks with rank r XOR 2^s:
  log2(n) messages per rank and chunk), Bruck's dissemination otherwise (at step s rank r
  sends its blocks r .. r + min(2^s, n - 2^s) - 1 (mod n) to rank r - 2^s: ceil(log2 n) steps,
  at most two contiguous ranges each). Reduce-scatter is the same pattern reversed in time
  (recursive halving): every block's allgather dissemination is a tree, and reversing a
  tree's messages reduces over it. NCCL 2.23's PAT is this family for one rank per node.
- ``direct`` — every rank exchanges with every rank in one hop (stars); not NCCL's, but the
  simplest schedule, priced by ``auto`` on small collectives.

Kinds without a form fall back and say so in ``Plan.algorithm``: the double binary tree of
allgather, reduce_scatter, gather and scatter is the ring ("ring"); alltoall and
neighbor_average are always "direct" (lower.py) and the relaxation (lower_relax.py).

The best NCCL-like baseline of a plan is the fastest predicted of ring, rings, tree and rd
(pipeline.py).

*Fixed loads*: each of these schedules (:data:`FIXED_LOADS`) puts the same bytes on every
link at every chunk size (its orders, routes and the split of the buffer among its trees or
channels do not depend on the chunk; only the cutting into messages of at most a chunk
does), so one lowering's simulated link bytes give a lower bound at every other chunk size
(:func:`load_floor`); pipeline.Lower stops a chunk search where it shows that no smaller
chunk can be faster.
"""
from __future__ import annotations

import bisect
from typing import Any, Sequence

from ..ir.errors import PlanError
from ..ir.plan import DTYPE_SIZES, ChunkRef, Copy, Plan, Scale, block_range
from ..ir.topology import Topology
from .bcast_trees import lower_dbt, spread_trees
from .lower import ProgramBuilder, assemble, chunk_elems, lower, plan_op
from .routes import btree_pair, chain_in, chain_out, pieces, ring_order, rotate, routes, star, tree_of

__all__ = ["FIXED_LOADS", "dbtree_plan", "direct_plan", "load_floor", "rd_plan", "rd_steps",
           "ring_allreduce_ops", "ring_plan"]

# the candidates whose link bytes do not depend on the chunk size (module docstring): the
# single ring and the ring channels (fixed orders; each root's block or each segment split
# among the channels by rate), the double binary tree (spread_trees' routes, half the data
# each), recursive doubling / Bruck (fixed steps), direct (stars); every message of each
# carries at most one chunk
FIXED_LOADS = frozenset({"ring", "rings", "tree", "rd", "direct"})


def load_floor(sim: Any, topo: Topology, per_message_s: float, itemsize: int):
    """``T(s)``: a lower bound on the simulated time of a :data:`FIXED_LOADS` plan at chunk
    size ``s``, from ``sim``, the simulation of the same schedule at any chunk size (its link
    bytes ``B(e)`` are the same at every size). compiler/cost.py holds link ``e`` for
    ``k(e) + b / c(e)`` per message of ``b`` bytes (``k(e)`` its latency plus the per-message
    cost) and never for two messages at once, within the plan's time; a message carries at
    most ``m = s`` rounded down to whole elements, so ``e`` holds at least ``ceil(B(e) / m)``
    messages: ``T(s) >= max_e B(e) / c(e) + ceil(B(e) / m) k(e)``. It never falls as ``s``
    shrinks.

    >>> from types import SimpleNamespace as NS
    >>> from hcc.ir.topology import Link
    >>> t = Topology("pair", ("a", "b"), links=(Link("a", "b", 1e9, 1e-6),))
    >>> sim = NS(links=(NS(src="a", dst="b", bytes=4000, capacity=1e9),))
    >>> floor = load_floor(sim, t, 1e-6, 4)
    >>> [round(floor(s) * 1e6, 3) for s in (4000, 1000, 999)]   # 4 us of bytes, 1, 4 or 5 messages
    [6.0, 12.0, 14.0]
    """
    import numpy as np

    from .bounds import merged_arcs

    arcs = merged_arcs(topo)
    load = np.array([l.bytes for l in sim.links], dtype=float)
    cap = np.array([l.capacity for l in sim.links], dtype=float)
    # a link the topology does not declare (none should be) is charged no latency: still a floor
    k = np.array([arcs.get((l.src, l.dst), (0.0, 0.0))[1] + per_message_s for l in sim.links], dtype=float)
    busy = load / cap if len(load) else load

    def floor(s: int) -> float:
        if not len(load):
            return 0.0
        m = max(1, int(s) // itemsize) * itemsize
        # less a hair for the rounding of the simulator's sums (the bound itself is exact)
        return float((busy + np.ceil(load / m) * k).max()) * (1 - 1e-9)

    return floor

# -- the single ring and the double binary tree --------------------------------------------------
def _ring_allreduce(spec: Any, topo: Topology, order: list[int], ce: int) -> Plan:
    n = len(order)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    B = ProgramBuilder(n)
    if n == 1:
        for q, (a, b) in enumerate(pieces(0, E, ce)):
            B.add(0, Copy(ChunkRef("in", a, b - a), ChunkRef("out", a, b - a)))
        return assemble(spec, topo, B, (), "ring", ce)
    ring_allreduce_ops(B, order, 0, E, ce, plan_op(spec.kind, spec.op) == "avg")
    return assemble(spec, topo, B, (), "ring", ce)


def ring_allreduce_ops(B: ProgramBuilder, order: Sequence[int], lo: int, hi: int, ce: int,
                        avg: bool, hop_tree=None) -> None:
    """The ring allreduce of elements ``[lo, hi)`` along ``order``, added to ``B``.
    ``hop_tree(i)``: the plan tree whose route the hop from position ``i`` takes (its
    messages' ``tree``; None: -1, the cost model's cheapest route)."""
    n = len(order)
    hop_trees = [hop_tree(i) if hop_tree else -1 for i in range(n)]
    segs = [(lo + a, lo + b) for a, b in (block_range(hi - lo, n, k) for k in range(n))]
    longest = max(sb - sa for sa, sb in segs)
    C = max(1, -(-longest // ce))  # same chunk count for every segment: ceil(longest / ce)
    for q in range(C):
        piece = []
        for sa, sb in segs:
            a, b = sa + q * (sb - sa) // C, sa + (q + 1) * (sb - sa) // C
            piece.append((a, b))
        # one ChunkRef per segment and buffer, shared by every op that names it: a 1024-rank
        # ring allreduce names each about 6 000 times (3 million refs, ~0.5 GB, otherwise)
        inref = [ChunkRef("in", a, b - a) for a, b in piece]
        outref = [ChunkRef("out", a, b - a) for a, b in piece]
        # per position i: index of the op that last wrote / sent segment k of this piece
        copy = [[None] * n for _ in range(n)]
        rr = [[None] * n for _ in range(n)]
        rs_send = [[None] * n for _ in range(n)]  # [i][seg]
        for i in range(n):
            for k in range(n):
                a, b = piece[k]
                if k != i and b > a:  # segment i is sent from `in` at step 0, never reduced into
                    copy[i][k] = B.add(order[i], Copy(inref[k], outref[k]))
        for s in range(n - 1):  # reduce-scatter
            for i in range(n):
                k = (i - s) % n
                a, b = piece[k]
                if b <= a:
                    continue
                j = (i + 1) % n
                src = inref[k] if s == 0 else outref[k]
                sd = () if s == 0 else (rr[i][k],)
                rs_send[i][k], rr[j][k] = B.message(
                    order[i], order[j], src, outref[k], send_deps=sd,
                    recv_deps=(copy[j][k],), reduce=True, tree=hop_trees[i], chunk=q)
        final = [None] * n
        for i in range(n):
            k = (i + 1) % n
            a, b = piece[k]
            if b > a:
                final[i] = rr[i][k]
                if avg:
                    final[i] = B.add(order[i], Scale(outref[k], n, (final[i],)))
        have = list(final)  # op at position i that produced the segment it sends next
        for s in range(n - 1):  # allgather
            got = [None] * n
            for i in range(n):
                k = (i + 1 - s) % n
                a, b = piece[k]
                if b <= a:
                    continue
                j = (i + 1) % n
                # position j overwrites segment k, which it sent during reduce-scatter
                wd = (rs_send[j][k],) if rs_send[j][k] is not None else ()
                _, got[j] = B.message(order[i], order[j], outref[k], outref[k], send_deps=(have[i],),
                                      recv_deps=wd, tree=hop_trees[i], chunk=q)
            have = got


def ring_plan(spec: Any, topo: Topology, chunk_bytes: int) -> Plan:
    """NCCL-style ring schedule of ``spec`` (see the module docstring)."""
    kind, n = spec.kind, len(spec.ranks)
    ce = chunk_elems(chunk_bytes, spec.dtype)
    if kind in ("alltoall", "neighbor_average"):
        return lower(spec, topo, (), chunk_bytes, algorithm="direct")
    order = ring_order(topo, spec.ranks)
    if kind == "allreduce":
        return _ring_allreduce(spec, topo, order, ce)
    net = routes(topo, spec.ranks)
    if kind in ("broadcast", "scatter"):
        trees = [chain_out(net, rotate(order, spec.root))]
    elif kind in ("reduce", "gather"):
        trees = [chain_in(net, rotate(order, spec.root))]
    elif kind == "allgather":
        trees = [chain_out(net, rotate(order, j)) for j in range(n)]
    elif kind == "reduce_scatter":
        trees = [chain_in(net, rotate(order, j)) for j in range(n)]
    else:
        raise PlanError(f"no ring form for collective kind {kind!r}")
    return lower(spec, topo, trees, chunk_bytes, algorithm="ring")


def dbtree_plan(spec: Any, topo: Topology, chunk_bytes: int) -> Plan:
    """NCCL-style double binary tree for allreduce, broadcast and reduce (two complementary
    trees, half the data each); other kinds fall back to :func:`ring_plan`."""
    kind, n = spec.kind, len(spec.ranks)
    if kind not in ("allreduce", "broadcast", "reduce"):
        return ring_plan(spec, topo, chunk_bytes)
    order = ring_order(topo, spec.ranks)
    if kind == "allreduce":
        net = routes(topo, spec.ranks)
        e1, e2 = btree_pair(order)
        trees = [tree_of(net, order[0], e1), tree_of(net, order[n - 1] if n % 2 == 0 else order[1 % n], e2)]
        if n <= 2:
            trees = trees[:1]  # both trees would be the same single edge
        return lower(spec, topo, trees, chunk_bytes, algorithm="tree")
    others = rotate(order, spec.root)[1:]
    e1, e2 = btree_pair(others) if others else ([], [])
    if others:
        # the root feeds (or is fed by) each tree's top: position 0 of each arrangement
        top2 = others[n - 2] if (n - 1) % 2 == 0 else others[1 % (n - 1)]
        e1 = [(spec.root, others[0])] + e1
        e2 = [(spec.root, top2)] + e2
    # NCCL's trees as its runtime runs them on a fabric of many equal routes: each edge on
    # its own least-loaded route (ECMP; the one breadth-first route put every cross-rack edge
    # of the 1024-rank fat tree on one spine: 65.7 ms, 0.33 of the bound) and each edge's
    # receives posted two chunks ahead (bcast_trees.lower_dbt)
    pair = [e1, e2] if n > 2 else [e1]  # two ranks: both trees would be the same single edge
    return lower_dbt(spec, topo, spread_trees(topo, spec.ranks, spec.root, pair, kind == "reduce"),
                     chunk_bytes, algorithm="tree")


# -- direct ----------------------------------------------------------------------------------------
def _direct_allreduce(spec: Any, topo: Topology, ce: int) -> Plan:
    """Reduce-scatter then allgather, each rank talking to every rank in one hop: rank j
    reduces block j of everyone's input, then sends the result to everyone."""
    n = len(spec.ranks)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    B = ProgramBuilder(n)
    avg = plan_op(spec.kind, spec.op) == "avg"
    jobs = [list(pieces(*block_range(E, n, j), ce)) for j in range(n)]
    for q in range(max((len(x) for x in jobs), default=0)):
        for j in range(n):
            if q >= len(jobs[j]):
                continue
            a, b = jobs[j][q]
            ref_in, ref_out = ChunkRef("in", a, b - a), ChunkRef("out", a, b - a)
            copy = B.add(j, Copy(ref_in, ref_out))
            last = tuple(B.message((j + d) % n, j, ref_in, ref_out, recv_deps=(copy,),
                                   reduce=True, chunk=q)[1] for d in range(1, n)) or (copy,)
            if avg and n > 1:
                last = (B.add(j, Scale(ref_out, n, last)),)
            for d in range(1, n):
                B.message(j, (j + d) % n, ref_out, ref_out, send_deps=last, chunk=q)
    return assemble(spec, topo, B, (), "direct", ce)


def direct_plan(spec: Any, topo: Topology, chunk_bytes: int) -> Plan:
    """Every rank to every rank in one hop: stars from/to the root for rooted kinds, a star
    per rank for allgather/reduce_scatter, reduce-scatter + allgather for allreduce."""
    kind, n = spec.kind, len(spec.ranks)
    if kind == "allreduce":
        return _direct_allreduce(spec, topo, chunk_elems(chunk_bytes, spec.dtype))
    if kind in ("alltoall", "neighbor_average"):
        return lower(spec, topo, (), chunk_bytes, algorithm="direct")
    net = routes(topo, spec.ranks)
    if kind in ("broadcast", "scatter"):
        trees = [star(net, spec.root)]
    elif kind in ("reduce", "gather"):
        trees = [star(net, spec.root, inward=True)]
    elif kind == "allgather":
        trees = [star(net, j) for j in range(n)]
    elif kind == "reduce_scatter":
        trees = [star(net, j, inward=True) for j in range(n)]
    else:
        raise PlanError(f"no direct form for collective kind {kind!r}")
    return lower(spec, topo, trees, chunk_bytes, algorithm="direct")


# -- recursive doubling / Bruck ---------------------------------------------------------------------
def rd_steps(n: int) -> list[list[tuple[int, int, tuple[tuple[int, int], ...]]]]:
    """The allgather pattern: per step, (src, dst, block runs) with runs ``(b0, b1)`` of block
    indices (``b1`` exclusive, no wrap): recursive doubling for a power of two, Bruck
    otherwise (module docstring).

    >>> rd_steps(4)[1]
    [(0, 2, ((0, 2),)), (1, 3, ((0, 2),)), (2, 0, ((2, 4),)), (3, 1, ((2, 4),))]
    >>> len(rd_steps(6)), rd_steps(6)[2][0]
    (3, (0, 2, ((0, 2),)))
    """
    steps = []
    if n < 2:
        return steps
    if n & (n - 1) == 0:
        d = 1
        while d < n:
            steps.append([(r, r ^ d, ((r & ~(d - 1), (r & ~(d - 1)) + d),)) for r in range(n)])
            d *= 2
        return steps
    d = 1
    while d < n:
        cnt = min(d, n - d)
        step = []
        for r in range(n):
            lo, hi = r, r + cnt
            runs = ((lo, hi),) if hi <= n else ((lo, n), (0, hi - n))
            step.append((r, (r - d) % n, runs))
        steps.append(step)
        d *= 2
    return steps


class _Latest:
    """The op that last wrote each element range of one buffer of one rank (non-overlapping
    segments, sorted), so a reader depends on exactly the writes it reads."""

    def __init__(self):
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.op: list[int] = []

    def readers_deps(self, a: int, b: int) -> tuple[int, ...]:
        i = max(0, bisect.bisect_right(self.lo, a) - 1)
        out = set()
        while i < len(self.lo) and self.lo[i] < b:
            if self.hi[i] > a:
                out.add(self.op[i])
            i += 1
        return tuple(sorted(out))

    def write(self, a: int, b: int, op: int) -> None:
        i = max(0, bisect.bisect_right(self.lo, a) - 1)
        keep_lo, keep_hi, keep_op = [], [], []
        j = i
        while j < len(self.lo) and self.lo[j] < b:
            if self.hi[j] > a:
                if self.lo[j] < a:
                    keep_lo.append(self.lo[j]); keep_hi.append(a); keep_op.append(self.op[j])
                if self.hi[j] > b:
                    keep_lo.append(b); keep_hi.append(self.hi[j]); keep_op.append(self.op[j])
            else:
                keep_lo.append(self.lo[j]); keep_hi.append(self.hi[j]); keep_op.append(self.op[j])
            j += 1
        new = sorted(zip(keep_lo + [a], keep_hi + [b], keep_op + [op]))
        self.lo[i:j] = [x for x, _, _ in new]
        self.hi[i:j] = [y for _, y, _ in new]
        self.op[i:j] = [o for _, _, o in new]


def rd_plan(spec: Any, topo: Topology, chunk_bytes: int) -> Plan:
    """Recursive doubling / Bruck allgather, or its time reversal for reduce_scatter (module
    docstring). Each step's ranges are cut into chunks of ``chunk_bytes``; a chunk waits only
    for the earlier messages that wrote the elements it sends, so steps pipeline."""
    kind, n = spec.kind, len(spec.ranks)
    if kind not in ("allgather", "reduce_scatter"):
        raise PlanError(f"no recursive-doubling form for collective kind {kind!r}")
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    ce = chunk_elems(chunk_bytes, spec.dtype)
    blocks = [block_range(E, n, j) for j in range(n)]
    B = ProgramBuilder(n)
    steps = rd_steps(n)

    def elems(run):
        return blocks[run[0]][0], blocks[run[1] - 1][1]

    if kind == "allgather":
        out = [_Latest() for _ in range(n)]
        for r in range(n):
            lo, hi = blocks[r]
            if hi > lo:
                out[r].write(lo, hi, B.add(r, Copy(ChunkRef("in", 0, hi - lo), ChunkRef("out", lo, hi - lo))))
        for s, step in enumerate(steps):
            for src, dst, runs in step:
                for run in runs:
                    for a, b in pieces(*elems(run), ce):
                        ref = ChunkRef("out", a, b - a)
                        _, rv = B.message(src, dst, ref, ref, send_deps=out[src].readers_deps(a, b), chunk=s)
                        out[dst].write(a, b, rv)
        return assemble(spec, topo, B, (), "rd", ce)

    # reduce_scatter: the allgather's messages reversed, last step first. Rank r accumulates
    # partials in tmp (absolute offsets; its own block too, so no message is cut in two) and
    # copies its own block to out at the end.
    mine = [_Latest() for _ in range(n)]  # per rank: the writes to tmp
    touched: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for step in steps:
        for src, dst, runs in step:
            for run in runs:  # reversed: dst sends these blocks' partials to src, src adds them
                touched[src].append(run)
                touched[dst].append(run)
    for r in range(n):
        # one copy in -> tmp per maximal run of blocks this rank sends or receives
        marks = sorted({b for b0, b1 in touched[r] for b in range(b0, b1)} | {r})
        run_start = None
        for k, b in enumerate(marks):
            if run_start is None:
                run_start = b
            if k + 1 == len(marks) or marks[k + 1] != b + 1:
                a0, a1 = blocks[run_start][0], blocks[b][1]
                if a1 > a0:
                    mine[r].write(a0, a1, B.add(r, Copy(ChunkRef("in", a0, a1 - a0), ChunkRef("tmp", a0, a1 - a0))))
                run_start = None
    for s in range(len(steps) - 1, -1, -1):
        for recv_rank, send_rank, runs in steps[s]:
            for run in runs:
                for a, b in pieces(*elems(run), ce):
                    ref = ChunkRef("tmp", a, b - a)
                    _, rv = B.message(send_rank, recv_rank, ref, ref,
                                      send_deps=mine[send_rank].readers_deps(a, b),
                                      recv_deps=mine[recv_rank].readers_deps(a, b), reduce=True, chunk=s)
                    mine[recv_rank].write(a, b, rv)
    avg = plan_op(kind, spec.op) == "avg"
    for r in range(n):
        lo, hi = blocks[r]
        if hi > lo:
            out = ChunkRef("out", 0, hi - lo)
            last = B.add(r, Copy(ChunkRef("tmp", lo, hi - lo), out, mine[r].readers_deps(lo, hi)))
            if avg:
                B.add(r, Scale(out, n, (last,)))
    return assemble(spec, topo, B, (), "rd", ce)
