"""hcc.compiler.hier — allreduce over the two sides of the narrowest cut between the ranks.

Terms
- narrowest rank cut: the vertex set S holding some but not all ranks with the least capacity
  leaving it (bounds.narrowest_rank_cut, the same max-flows the allreduce floor uses): on two
  hosts joined by one slow link, the link.
- side, leader, chain: the ranks on each side of the cut; per side the rank with the widest
  route across the cut leads, and the side's ranks form a chain from it (:func:`_chain`).
- cross message: one range of the buffer the two leaders exchange across the cut, both ways
  at once (:data:`_HIER_LAYOUTS`).
- :func:`hier_plan` is the candidate ``treepack-hier`` of compiler/registry.py.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..ir.errors import PlanError
from ..ir.plan import DTYPE_SIZES, ChunkRef, Copy, Plan, Reduce, Scale, Tree
from ..ir.topology import Topology
from .lower import ProgramBuilder, assemble, chunk_elems, plan_op
from .routes import Routes, pieces, routes

__all__ = ["hier_plan", "two_level_cut"]

# cross-cut message layouts the hierarchical plan tries per chunk size: (middle messages, the
# sizes of the messages ramping up at the start and down at the end, as fractions of the
# buffer). A message across a cut link holds it for its latency plus its bytes
# (compiler/cost.py), so a 200 us link wants few messages, while the first ones should be small
# (the first waits for its side's reduction) and so should the last (its side's broadcast waits
# for it): on twohost8 (64 MiB) 3 messages of 1/16, 7/8, 1/16 of the buffer give 7.5 ms
# against 7.8 ms for two halves
_HIER_LAYOUTS = ((1, ()), (2, ()), (4, ()), (8, ()), (16, ()),
                 (1, (1 / 64,)), (1, (1 / 32,)), (1, (1 / 16,)), (1, (1 / 10,)), (1, (1 / 8,)),
                 (2, (1 / 16,)), (1, (1 / 64, 1 / 8)), (1, (1 / 128, 1 / 32, 1 / 8)))
# a ramp message is cut into at least this many chunks for its side's chain, so its reduction
# and broadcast pipeline over the chain's hops (a 4-rank chain fills in 3 chunk times)
_HIER_RAMP_CHUNKS = 8


def two_level_cut(topo: Topology, ranks: Sequence[str]) -> tuple[tuple[int, ...], tuple[int, ...], float] | None:
    """The narrowest cut between the ranks as ``(positions of the ranks on its greatest source
    side, the others, its capacity in bytes/s)`` (bounds.narrowest_rank_cut); None for one
    rank."""
    from .bounds import narrowest_rank_cut

    ranks = tuple(ranks)
    if len(ranks) < 2:
        return None
    value, _, side = narrowest_rank_cut(topo, ranks)
    inside = set(side)
    a = tuple(i for i, r in enumerate(ranks) if r in inside)
    b = tuple(i for i, r in enumerate(ranks) if r not in inside)
    return a, b, value


def _widest(net: Routes, u: int, v: int) -> float:
    path = net.path(u, v)
    return min(net.out[x][y] for x, y in zip(path, path[1:]))


def _chain(net: Routes, leader: int, group: Sequence[int]) -> list[int]:
    """The group's ranks as a chain from its leader, greedily extended by the widest, then
    shortest, route from the chain's end (each rank's links then carry the buffer once)."""
    chain, left = [leader], [r for r in group if r != leader]
    while left:
        end = chain[-1]
        nxt = min(left, key=lambda r: (-_widest(net, end, r), len(net.path(end, r)), r))
        chain.append(nxt)
        left.remove(nxt)
    return chain


def _layout(elems: int, middle: int, ramp: Sequence[float]) -> list[tuple[int, int]]:
    """``[0, elems)`` as consecutive cross messages: ``ramp`` (fractions of ``elems``) first,
    ``middle`` messages splitting the rest evenly, then ``ramp`` reversed; empty ones dropped.

    >>> _layout(100, 1, (0.1,))
    [(0, 10), (10, 90), (90, 100)]
    >>> _layout(10, 2, ())
    [(0, 5), (5, 10)]
    """
    edge = [max(1, int(elems * f)) for f in ramp]
    if 2 * sum(edge) >= elems:
        edge = []
    rest = elems - 2 * sum(edge)
    sizes = edge + [(k + 1) * rest // middle - k * rest // middle for k in range(middle)] + edge[::-1]
    out, a = [], 0
    for size in sizes:
        if size > 0:
            out.append((a, a + size))
            a += size
    return out


def _hier_lower(spec: Any, topo: Topology, net: Routes, chains: tuple[list[int], list[int]],
                ce: int, layout: list[tuple[int, int]], rate: float) -> Plan:
    """The two-level plan (see :func:`hier_plan`) with cross messages ``layout`` (element
    ranges) and chain chunks of ``ce`` elements, fewer in a message too small for
    :data:`_HIER_RAMP_CHUNKS` of them."""
    n = len(spec.ranks)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    B = ProgramBuilder(n)
    avg = plan_op(spec.kind, spec.op) == "avg"
    # the chain chunks of each cross message, numbered in buffer order
    chunks: list[tuple[int, int]] = []
    runs: list[tuple[int, int]] = []  # cross message -> its chunks [q0, q1)
    for a, b in layout:
        c = max(1, min(ce, -(-(b - a) // _HIER_RAMP_CHUNKS)))
        q0 = len(chunks)
        chunks += list(pieces(a, b, c))
        runs.append((q0, len(chunks)))
    leaders = (chains[0][0], chains[1][0])
    sendup: dict[tuple[int, int], int] = {}  # (rank, chunk) -> its Send up the chain
    reduced: dict[tuple[int, int], int] = {}  # (leader, chunk) -> op completing its side's partial
    for q, (a, b) in enumerate(chunks):
        inref, outref = ChunkRef("in", a, b - a), ChunkRef("out", a, b - a)
        for chain in chains:
            below: tuple[ChunkRef, tuple[int, ...]] | None = None
            for i in range(len(chain) - 1, -1, -1):  # the chain's far end first
                r = chain[i]
                if below is None:
                    if i == 0:
                        reduced[(r, q)] = B.add(r, Copy(inref, outref))
                        break
                    below = (inref, ())  # the far end sends its input as is
                    sender = r
                    continue
                copy = B.add(r, Copy(inref, outref))
                s, rr = B.message(sender, r, below[0], outref, send_deps=below[1], recv_deps=(copy,),
                                  reduce=True, tree=0, chunk=q)
                sendup[(sender, q)] = s
                if i == 0:
                    reduced[(r, q)] = rr
                below, sender = (outref, (rr,)), r
    final: dict[tuple[int, int], int] = {}  # (leader, message) -> op completing the total there
    for j, (q0, q1) in enumerate(runs):
        a, b = chunks[q0][0], chunks[q1 - 1][1]
        ref, scratch = ChunkRef("out", a, b - a), ChunkRef("tmp", a, b - a)
        sent, got = {}, {}
        for x, y in (leaders, leaders[::-1]):
            sent[x], got[y] = B.message(x, y, ref, scratch,
                                        send_deps=tuple(reduced[(x, q)] for q in range(q0, q1)),
                                        tree=0, chunk=j)
        for x in leaders:
            # the partial in ``out`` was sent whole before the other side's is added in
            op = B.add(x, Reduce(scratch, ref, (got[x], sent[x])))
            final[(x, j)] = B.add(x, Scale(ref, n, (op,))) if avg else op
    for j, (q0, q1) in enumerate(runs):
        for chain in chains:
            for q in range(q0, q1):
                a, b = chunks[q]
                outref = ChunkRef("out", a, b - a)
                have = (final[(chain[0], j)],)
                for up, down in zip(chain, chain[1:]):
                    wd = (sendup[(down, q)],) if (down, q) in sendup else ()
                    _, rv = B.message(up, down, outref, outref, send_deps=have, recv_deps=wd,
                                      tree=0, chunk=q)
                    have = (rv,)
    parent = [-1] * n
    paths: list[tuple[str, ...]] = [()] * n
    for chain in chains:
        for up, down in zip(chain, chain[1:]):
            parent[down], paths[down] = up, net.path(up, down)
    parent[leaders[1]], paths[leaders[1]] = leaders[0], net.path(leaders[0], leaders[1])
    tree = Tree(0, leaders[0], tuple(parent), rate, (0, E), tuple(paths))
    return assemble(spec, topo, B, (tree,), "treepack-hier", ce)


def hier_plan(spec: Any, topo: Topology, chunk_bytes: int, *, model=None) -> Plan:
    """Allreduce over the two sides of the narrowest cut between the ranks (two hosts joined
    by one slow link): each side reduces along a chain into its leader in chunks of
    ``chunk_bytes``; the two leaders exchange their whole partial results across the cut at
    once, both directions together (each direction carries M bytes, the cut bound M / c, and
    neither waits for the other: a tree rooted on one side would send its broadcast only
    after its reduction crossed); each adds the other's partial and broadcasts down its chain.
    The cross messages are ranges of the buffer (:data:`_HIER_LAYOUTS`, the best predicted
    kept): few, since each holds the cut link for its latency, with small first and last ones.
    ``plan.trees`` holds one tree (the two chains joined at the leaders, rooted at the first)
    for the adaptive runtime; the exchange itself runs both ways over its leader edge."""
    from .cost import DEFAULT_MODEL, simulate

    n = len(spec.ranks)
    cut = two_level_cut(topo, spec.ranks)
    if spec.kind != "allreduce" or cut is None or not cut[0] or not cut[1]:
        raise PlanError(f"no two-level form for {spec.kind} {spec.name!r} on {n} rank(s)")
    side_a, side_b, value = cut
    net = routes(topo, spec.ranks)
    la, lb = max(((a, b) for a in side_a for b in side_b),
                 key=lambda ab: (min(_widest(net, *ab), _widest(net, ab[1], ab[0])),
                                 -len(net.path(*ab)), -ab[0], -ab[1]))
    chains = (_chain(net, la, side_a), _chain(net, lb, side_b))
    ce = chunk_elems(chunk_bytes, spec.dtype)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    best = None
    tried = set()
    for middle, ramp in _HIER_LAYOUTS:
        layout = _layout(E, middle, ramp)
        if tuple(layout) in tried:
            continue
        tried.add(tuple(layout))
        plan = _hier_lower(spec, topo, net, chains, ce, layout, value)
        t = simulate(plan, model=model or DEFAULT_MODEL).time
        if best is None or t < best[0]:
            best = (t, plan, layout)
    return best[1]
