"""hcc.compiler.replay — a reduce as its broadcast run backwards in time, and a reduce-scatter
as its allgather (candidate ``replay``, compiler/registry.py).

A reduce moves the same bytes over the same links as a broadcast from the same root, the
other way: reverse every transfer of a broadcast plan (the rank that received a range sends
its partial sum of that range back to the rank it came from, which adds it into its own) and
it is a reduce. Reversing the transfers is not yet reversing the schedule: every partial sum
a leaf holds is ready at time 0 and, queued ahead on its links, holds back the sums interior
ranks forward. The model's links are alike both ways, so the broadcast's *simulated* schedule
replayed backwards is a reduce that takes about the broadcast's time: here the messages go
in the reversed order of the broadcast's, each rank's sends paced (:data:`PACINGS`), and a
rank sends a range once it has added every partial sum of it that comes in.

Terms
- source: the broadcast plan ``hcc compile`` gives for the same ranks, root, size and dtype
  (``algorithm = auto``: whichever broadcast form is fastest, tree packing, lane trees,
  rings) over the *transposed* topology (every link turned round, :meth:`Topology.transposed`), so
  that each reversed message crosses, the other way, a link of the capacity it was priced
  at (the random graphs' two directions differ).
- reversible: every message of the source lands in ``out`` (a relay may forward a range
  only once it holds it) and its only other ops are copies; the reduce accumulates in
  ``out`` (a non-root's ``out`` is scratch, ir/plan.py), each rank copying its ``in`` there
  piece by piece as messages first touch it.

A reduce-scatter is an allgather's transfers reversed the same way: the rank that received
a range sends its partial sum of it back; the sums gather in ``tmp`` (a reduce-scatter's
``out`` is its own block), and each rank copies its block out once every sum of it is in.
Only the compiler's own allgathers are replayed (registry.py): NCCL's rings run backwards are
the rings' reduce-scatter, priced already. One MI250 node at 1 GiB: the tree packing's
allgather 0.933 of the bound, its in-trees' reduce-scatter 0.900, the replay 0.933.

The source's trees stay the plan's trees: a message up a tree edge takes the edge's path
reversed (compiler/cost.py). Up to :data:`REPLAY_MAX_RANKS` ranks: the candidate compiles the
broadcast first, which at 512-1024 ranks would double the reduce's compile.
"""
from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Any, Callable

from ..ir.plan import DTYPE_SIZES, ChunkRef, Copy, Plan, Recv, Scale, Send, block_range
from ..ir.topology import Topology
from .builder import ProgramBuilder, Spans, plan_op
from .lower import NARROW_KINDS, NARROW_SKIPPED, NARROWING, assemble

__all__ = ["REPLAY_MAX_RANKS", "REPLAY_NARROW_MAX_RANKS", "replayed_reduce", "reversed_broadcast"]

REPLAY_MAX_RANKS = 64
# the pacings priced, (per_tree, window, gate): one message in flight per rank pair replays
# a broadcast whose every pair has one path exactly (a random graph: the reduce takes the
# broadcast's time to the last digit), but where two trees join a pair over different paths
# (DGX-1's NVLink and PCIe relays) it serializes them (DGX-1 256 MiB: 1.78x the broadcast's
# time, 1.03x paced per tree); a message on a two-hop switch path ends a hop after the link
# it left from is free again, and a second in flight fills it (2 x A100: 1.05x with 2 per
# pair against 1.19x with 1). The time gate instead holds each send until the op of its rank
# that, reversed, ends last before the send should start (DGX-1 1.000x, 4 x A100's rings
# 1.007x against 1.019x at best paced; 2 x A100's lane trees 1.43x). No one is fastest
# everywhere
# a reduce of up to this many ranks replays its broadcast compiled both without and with the
# narrow-link form (lower.NARROW_KINDS); past it, without: on two and four A100 servers and one
# and two MI250 nodes the second broadcast changed no plan and cost up to 1.4x the reduce's
# compile (two MI250 nodes at 1 GiB: 31 -> 74 CPU s)
REPLAY_NARROW_MAX_RANKS = 8
PACINGS = ((False, 1, False), (False, 2, False), (True, 1, False), (True, 2, False), (False, 0, True))


def _messages(plan: Plan, in_base: Callable[[int], int] = lambda r: 0
              ) -> list[tuple[int, int, int, int, int, int, int]] | None:
    """The source's messages ``(src, dst, a, b, tree, receive op, send op)`` (``out[a:b)``
    lands at ``dst``; the ops' indices in ``dst``'s and ``src``'s programs), or None where it
    is not reversible. ``in_base(r)``: where rank ``r``'s ``in`` starts in ``out`` (an
    allgather's own block; 0 for a broadcast)."""
    sends: dict[tuple[int, int, int], tuple[int, Send]] = {}
    recvs: dict[tuple[int, int, int], tuple[int, Recv]] = {}
    for r, prog in enumerate(plan.programs):
        for i, op in enumerate(prog):
            t = type(op)
            if t is Send:
                sends[(r, op.peer, op.tag)] = (i, op)
            elif t is Recv:
                recvs[(op.peer, r, op.tag)] = (i, op)
            elif t is not Copy:
                return None
    out = []
    for key, (i, rv) in recvs.items():
        got = sends.get(key)
        if got is None:
            return None
        sd = got[1]
        d, s = rv.dst, sd.src
        at = s.offset + (in_base(key[0]) if s.buf == "in" else 0)
        if d.buf != "out" or s.buf not in ("in", "out") or (at, s.count) != (d.offset, d.count):
            return None
        out.append((key[0], key[1], d.offset, d.offset + d.count, sd.tree, i, got[0]))
    return out


def reversed_broadcast(spec: Any, topo: Topology, source: Plan, model, *, per_tree: bool = False,
                       window: int = 1, gate: bool = False) -> Plan | None:
    """The reduce ``spec`` as ``source`` (a broadcast of its ranks, root and size) replayed
    backwards (module docstring); None where the source is not reversible or its replay would
    send a range before adding a partial sum of it. Pacing: each send waits for the send
    ``window`` before it from the same rank to the same peer (``per_tree``: over the same
    tree; 0: none), and with ``gate`` for the op of its rank whose reversal ends last before
    the send's reversed start (see :data:`PACINGS`).

    A reduce-scatter ``spec`` replays an allgather ``source`` the same way: the partial sums
    gather in ``tmp`` (its ``out`` is one block), and each rank copies its own block from
    there to ``out`` once every partial sum of it is added."""
    from .cost import completion_times

    n = len(spec.ranks)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    scatter = spec.kind == "reduce_scatter"
    acc = "tmp" if scatter else "out"  # where the partial sums gather
    msgs = _messages(source, (lambda r: block_range(E, n, r)[0]) if scatter else (lambda r: 0))
    got = None if msgs is None else completion_times(source, model)
    if got is None:
        return None
    done, base = got
    end = [float(done[base[d] + i]) for _, d, _, _, _, i, _ in msgs]
    progs = source.programs

    def posted(r: int, i: int) -> float:
        return max((float(done[base[r] + x]) for x in progs[r][i].deps), default=0.0)

    # when each message was ready (both ends posted) in the broadcast, and per rank its
    # messages by that time: the time gate below
    ready = [max(posted(s_, j), posted(d, i)) for s_, d, _, _, _, i, j in msgs]
    at_rank: list[list[tuple[float, int]]] = [[] for _ in range(len(progs))]
    for k, (s_, d, *_) in enumerate(msgs):
        at_rank[s_].append((ready[k], k))
        at_rank[d].append((ready[k], k))
    for lst in at_rank:
        lst.sort()
    keys = [[t for t, _ in lst] for lst in at_rank]
    rsend: dict[int, int] = {}  # message -> its reversed Send (at its broadcast receiver)
    rrecv: dict[int, int] = {}  # message -> its reversed RecvReduce (at its broadcast sender)
    B = ProgramBuilder(n)
    # each rank's ``in`` copied to ``out`` piece by piece (the pieces: the ranges between every
    # message boundary at the rank), each piece just before the first message over it: one
    # copy of the whole buffer first held every rank's first send back by a memcpy of it (a
    # 4-rank 64 MiB reduce over shared memory: 43 ms against 23-29 ms for the tree packing)
    cuts: list[set[int]] = [{0, E} for _ in range(n)]
    for src, dst, a, b, *_ in msgs:
        cuts[src] |= {a, b}
        cuts[dst] |= {a, b}
    if scatter:
        for r in range(n):
            cuts[r] |= set(block_range(E, n, r))
    pieces = [sorted(c) for c in cuts]
    copied: list[dict[int, int]] = [{} for _ in range(n)]  # per rank, piece start -> its Copy

    def init(r: int, a: int, b: int) -> tuple[int, ...]:
        """The copies of rank ``r``'s pieces in ``[a, b)``, made now where not yet made."""
        ps = pieces[r]
        i = bisect.bisect_right(ps, a) - 1
        out = []
        while i + 1 < len(ps) and ps[i] < b:
            lo, hi = ps[i], ps[i + 1]
            op = copied[r].get(lo)
            if op is None:
                op = copied[r][lo] = B.add(r, Copy(ChunkRef("in", lo, hi - lo), ChunkRef(acc, lo, hi - lo)))
            out.append(op)
            i += 1
        return tuple(out)

    added = Spans(n)  # per rank, its RecvReduces by range
    sent = Spans(n)  # per rank, its sends by range
    last: dict[tuple, list[int]] = {}  # per pacing key, its sends in order
    # latest-ending first: a relay's forward ends after its receive, so every partial sum a
    # send carries is added (emitted) before it
    for k in sorted(range(len(msgs)), key=lambda k: (-end[k], -k)):
        src, dst, a, b, tree, *_ = msgs[k]  # the broadcast's src -> dst; the reduce's dst -> src
        ref = ChunkRef(acc, a, b - a)
        if sent.over(src, a, b):  # src would add into a range it has sent already
            return None
        hist = last.setdefault((dst, src, tree) if per_tree else (dst, src), [])
        pace = hist[-window] if window and len(hist) >= window else None
        sdeps = init(dst, a, b) + added.over(dst, a, b) + ((pace,) if pace is not None else ())
        if gate:
            # not before the reversed op of ``dst`` that ends last before this send should
            # start: the one whose broadcast message was ready first once this one had ended
            lst, ks = at_rank[dst], keys[dst]
            j = bisect.bisect_left(ks, end[k])
            while j < len(lst):
                o = lst[j][1]
                g = rsend.get(o) if msgs[o][1] == dst else rrecv.get(o)
                if g is not None and o != k:
                    sdeps += (g,)
                    break
                j += 1
        sd, rv = B.message(dst, src, ref, ref, send_deps=tuple(sorted(set(sdeps))), recv_deps=init(src, a, b),
                           reduce=True, tree=tree)
        hist.append(sd)
        rsend[k], rrecv[k] = sd, rv
        sent.add(dst, a, b, sd)
        added.add(src, a, b, rv)
    avg = plan_op(spec.kind, spec.op) == "avg" and n > 1
    if scatter:
        for r in range(n):  # each rank's own block, every partial sum of it added
            lo, hi = block_range(E, n, r)
            got = B.add(r, Copy(ChunkRef("tmp", lo, hi - lo), ChunkRef("out", 0, hi - lo),
                                tuple(sorted({*init(r, lo, hi), *added.over(r, lo, hi)}))))
            if avg:
                B.add(r, Scale(ChunkRef("out", 0, hi - lo), n, (got,)))
    else:
        root = spec.root
        whole = init(root, 0, E)  # the root's pieces no message touches: copied at the end
        if avg:
            B.add(root, Scale(ChunkRef("out", 0, E), n, tuple(sorted({*whole, *added.over(root, 0, E)}))))
    ce = max(1, source.chunk_bytes // DTYPE_SIZES[spec.dtype])
    return assemble(spec, topo, B, source.trees, "replay", ce)


def replayed_reduce(program: Any, spec: Any, topo: Topology, model,
                    compile_plan: Callable[[Any, str], Plan],
                    source_ok: Callable[[Plan], bool] = lambda plan: True) -> tuple[Plan, Any] | None:
    """``(plan, simulation)``: the reduce ``spec`` of ``program`` as the broadcast ``hcc
    compile`` gives for its ranks, root, size and dtype over the transposed topology, replayed
    backwards at the fastest of :data:`PACINGS`, that broadcast compiled without its
    narrow-link form and, up to :data:`REPLAY_NARROW_MAX_RANKS` ranks, with it (the faster
    replay kept); None where that broadcast is not reversible. A reduce-scatter ``spec``
    replays the allgather of its ranks, size and dtype the same way. ``compile_plan(program, name)``: the compiler's plan of a collective (the
    pipeline's, handed in: this module is below it); None also where ``source_ok`` rejects
    the source plan."""
    from .cost import simulate

    kind = "allgather" if spec.kind == "reduce_scatter" else "broadcast"
    # named apart, so the progress lines of its compile say whose they are
    source = replace(spec, name=f"{spec.name}'s {kind}", kind=kind, op=None, algorithm="auto",
                     compress="none")
    topologies = dict(program.topologies)
    topologies[spec.topology] = program.topology_of(spec).transposed()
    prog = replace(program, topologies=topologies, collectives=(source,))
    best = None
    # the broadcast compiled without its narrow-link form (lower.NARROW_KINDS; reversed, the
    # form can lose: DGX-1's reduce at 256 MiB 0.853 -> 0.841) and as hcc compile compiles it
    # (the 7-GPU fragment 0-6's reduce to gpu4 at 256 MiB: 0.894 -> 0.903, its narrow-link
    # broadcast replayed exactly). Either replaying in its own time is no reason to skip the
    # other: the other broadcast may be the faster one, or replay faster than its own time
    # (the second compile only where the first would have priced the form somewhere: else the
    # two are one compile)
    both = kind in NARROW_KINDS and len(spec.ranks) <= REPLAY_NARROW_MAX_RANKS
    skipped: list[int] = []
    for narrowing in (False, True) if both else (False,):
        if narrowing and not skipped:
            break
        token, noted = NARROWING.set(narrowing), NARROW_SKIPPED.set(skipped)
        try:
            source_plan = compile_plan(prog, source.name)
        finally:
            NARROW_SKIPPED.reset(noted)
            NARROWING.reset(token)
        if not source_ok(source_plan):
            return best
        for per_tree, window, gate in PACINGS:
            plan = reversed_broadcast(spec, topo, source_plan, model, per_tree=per_tree, window=window, gate=gate)
            if plan is None:
                return best
            sim = simulate(plan, model=model)
            if best is None or sim.time < best[1].time:
                best = (plan, sim)
            if sim.time <= source_plan.figures.predicted_s * (1 + 1e-9):
                # it replays the source's own time: the other pacings are not priced (one MI250
                # node's reduce-scatter at 1 GiB: the first pacing, compile 1.7 -> 1.1 CPU s)
                break
    return best
