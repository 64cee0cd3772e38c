"""hcc.compiler.algorithms — the baselines and simple schedules, on the same plan IR.

Terms
- ring order: a cyclic order of the ranks in which each rank sends to the next. NCCL builds
  its rings along NVLink where it can; :func:`ring_order` searches a Hamiltonian cycle over
  direct rank-to-rank links (widest first), then over paths through switches, and falls back
  to rank order.
- ring allreduce (NCCL, Patarasuk & Yuan 2009): the buffer is cut into n segments; n-1
  reduce-scatter steps leave position i holding the reduced segment i+1, then n-1 allgather
  steps circulate the reduced segments. Each segment is cut into the same number of chunks
  and every chunk runs its own 2(n-1) steps, so chunks pipeline: exactly 2·(n-1)·n·chunks
  sends.
- ring forms of the other kinds are chains along the ring order, lowered by
  compiler/lower.py: broadcast/scatter a chain from the root, reduce/gather a chain into the
  root, allgather/reduce_scatter one chain per rank (the n-1-step ring algorithms).
- double binary tree (NCCL 2.4, Sanders et al. 2009): two binary trees over the ring order,
  each carrying half the data; tree 1 is the "lowest set bit" tree where position ``p > 0``
  has parent ``(p ^ b) | (b << 1)`` (``b`` its lowest set bit; ``p ^ b`` when that is out of
  range) so the odd positions are leaves; tree 2 mirrors the positions (even n) or shifts
  them by one (odd n), so most interior ranks of one tree are leaves of the other.
- direct: every rank exchanges with every rank in one hop (stars).

Kinds without a form fall back and say so in ``Plan.algorithm``: the double binary tree of
allgather, reduce_scatter, gather and scatter is the ring ("ring"); alltoall and
neighbor_average are always "direct".
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ..ir.errors import PlanError
from ..ir.plan import DTYPE_SIZES, ChunkRef, Copy, Plan, Scale, block_range
from ..ir.topology import Topology
from .lower import ProgramBuilder, assemble, chunk_elems, lower, plan_op

__all__ = [
    "SimpleTree",
    "btree_parents",
    "dbtree_plan",
    "direct_plan",
    "ring_order",
    "ring_plan",
]

# Hamiltonian search budget: 200k extensions is ~0.2 s in CPython and finds DGX-1's NVLink
# ring (8 ranks) in a few dozen; past it we fall back to the order found so far / rank order.
_SEARCH_BUDGET = 200_000


@dataclass(frozen=True)
class SimpleTree:
    """A PackedTree-shaped value built here (root, (parent, child, path) edges, rate)."""

    root: str
    edges: tuple[tuple[str, str, tuple[str, ...]], ...]
    rate: float = 1.0


class _Net:
    """The restricted topology as adjacency, with cached rank-to-rank paths."""

    def __init__(self, topo: Topology, ranks: Sequence[str]):
        self.ranks = tuple(ranks)
        sub = topo.restricted(self.ranks)
        self.switches = set(sub.switches)
        self.out: dict[str, dict[str, float]] = {v: {} for v in sub.vertices}
        for l in sub.links:
            if l.src == l.dst:
                continue
            self.out[l.src][l.dst] = self.out[l.src].get(l.dst, 0.0) + l.capacity
        self._paths: dict[tuple[str, bool], dict[str, tuple[str, ...]]] = {}

    def _bfs(self, u: str, through_ranks: bool) -> dict[str, tuple[str, ...]]:
        key = (u, through_ranks)
        if key not in self._paths:
            prev: dict[str, str | None] = {u: None}
            q = deque([u])
            while q:
                x = q.popleft()
                if x != u and x not in self.switches and not through_ranks:
                    continue  # a rank ends a path: ranks do not forward at the link level
                for y in self.out.get(x, ()):
                    if y not in prev:
                        prev[y] = x
                        q.append(y)
            paths = {}
            for v in prev:
                if v != u and v not in self.switches:
                    p, x = [], v
                    while x is not None:
                        p.append(x)
                        x = prev[x]
                    paths[v] = tuple(reversed(p))
            self._paths[key] = paths
        return self._paths[key]

    def path(self, u: int, v: int) -> tuple[str, ...]:
        """Vertices from rank ``u`` to rank ``v``: through switches only if possible, else
        the shortest path through other ranks too (a baseline must exist on any topology)."""
        a, b = self.ranks[u], self.ranks[v]
        p = self._bfs(a, False).get(b) or self._bfs(a, True).get(b)
        if p is None:
            raise PlanError(f"no path from {a} to {b} in the collective's topology")
        return p

    def switch_reach(self) -> tuple[list[set[int]], list[set[int]]]:
        """For each rank, the switch components it sends into / receives from (weakly
        connected components of the switch-only subgraph)."""
        comp: dict[str, int] = {}
        und: dict[str, set[str]] = {s: set() for s in self.switches}
        for x, nbrs in self.out.items():
            for y in nbrs:
                if x in self.switches and y in self.switches:
                    und[x].add(y)
                    und[y].add(x)
        for s in sorted(self.switches):
            if s in comp:
                continue
            comp[s] = len(comp)
            cid, stack = comp[s], [s]
            while stack:
                for y in und[stack.pop()]:
                    if y not in comp:
                        comp[y] = cid
                        stack.append(y)
        sends = [set() for _ in self.ranks]
        recvs = [set() for _ in self.ranks]
        idx = {v: i for i, v in enumerate(self.ranks)}
        for x, nbrs in self.out.items():
            for y in nbrs:
                if x in idx and y in comp:
                    sends[idx[x]].add(comp[y])
                if y in idx and x in comp:
                    recvs[idx[y]].add(comp[x])
        return sends, recvs


def ring_order(topo: Topology, ranks: Sequence[str]) -> list[int]:
    """A ring over ``ranks`` (indices, starting at 0) that follows topology links where
    possible: a Hamiltonian cycle over direct links, widest first, then allowing paths
    through switches, else rank order.

    >>> from hcc.ir.topology import Link
    >>> t = Topology("sq", ("a", "b", "c", "d"), links=tuple(Link(x, y, 1.0) for x, y in
    ...     ["ab", "ba", "bd", "db", "dc", "cd", "ca", "ac"]))
    >>> ring_order(t, ("a", "b", "c", "d"))
    [0, 1, 3, 2]
    """
    n = len(ranks)
    if n <= 2:
        return list(range(n))
    net = _Net(topo, ranks)
    idx = {v: i for i, v in enumerate(ranks)}
    direct: list[list[int]] = []
    for u, name in enumerate(ranks):
        nb = [(cap, idx[y]) for y, cap in net.out[name].items() if y in idx]
        nb.sort(key=lambda cv: (-cv[0], (cv[1] - u) % n))
        direct.append([v for _, v in nb])
    sends, recvs = net.switch_reach()

    def via(u: int, v: int) -> bool:
        return not sends[u].isdisjoint(recvs[v])

    def closes(u: int) -> bool:
        return 0 in direct[u] or via(u, 0)

    for allow_switch in (False, True):
        found = _hamiltonian(n, direct, via if allow_switch else None, closes if allow_switch
                             else (lambda u: 0 in direct[u]))
        if found:
            return found
    return list(range(n))


def _hamiltonian(n: int, direct: list[list[int]], via, closes) -> list[int] | None:
    """Depth-first search for a cycle through all ``n`` vertices from 0, bounded."""
    used = [False] * n
    used[0] = True
    path = [0]

    def candidates(u: int) -> Iterator[int]:
        seen = set()
        for v in direct[u]:
            seen.add(v)
            yield v
        if via is not None:
            for d in range(1, n):
                v = (u + d) % n
                if v not in seen and via(u, v):
                    yield v

    stack = [candidates(0)]
    budget = _SEARCH_BUDGET
    while stack and budget > 0:
        if len(path) == n:
            if closes(path[-1]):
                return path
            used[path.pop()] = False
            stack.pop()
            continue
        nxt = next((v for v in stack[-1] if not used[v]), None)
        budget -= 1
        if nxt is None:
            stack.pop()
            used[path.pop()] = False
            continue
        used[nxt] = True
        path.append(nxt)
        stack.append(candidates(nxt))
    return None


# -- tree builders ---------------------------------------------------------------------------------
def _tree(net: _Net, root: int, edges: Sequence[tuple[int, int]], rate: float = 1.0,
          inward: bool = False) -> SimpleTree:
    """``edges`` as (parent, child) rank pairs; paths parent..child (ir/plan.py ``Tree``).
    For an in-tree (``inward``) data goes child -> parent, so the path is that route reversed."""
    r = net.ranks
    out = []
    for p, c in edges:
        path = tuple(reversed(net.path(c, p))) if inward else net.path(p, c)
        out.append((r[p], r[c], path))
    return SimpleTree(r[root], tuple(out), rate)


def _chain_out(net: _Net, order: Sequence[int]) -> SimpleTree:
    """order[0] -> order[1] -> ...: data flows along the order."""
    return _tree(net, order[0], list(zip(order, order[1:])))


def _chain_in(net: _Net, order: Sequence[int]) -> SimpleTree:
    """A chain into order[0] whose data flows order[1] -> order[2] -> ... -> order[-1] ->
    order[0], i.e. along the ring direction."""
    root = order[0]
    rest = list(order[1:])
    edges = [(b, a) for a, b in zip(rest, rest[1:])]  # parent of rest[k] is rest[k+1]
    if rest:
        edges.append((root, rest[-1]))
    return _tree(net, root, edges, inward=True)


def _star(net: _Net, root: int, inward: bool = False) -> SimpleTree:
    return _tree(net, root, [(root, c) for c in range(len(net.ranks)) if c != root], inward=inward)


def btree_parents(m: int) -> list[int]:
    """Parents of positions ``0..m-1`` in the lowest-set-bit binary tree rooted at 0.

    >>> btree_parents(8)
    [-1, 2, 4, 2, 0, 6, 4, 6]
    """
    parent = [-1] * m
    for p in range(1, m):
        b = p & -p
        up = (p ^ b) | (b << 1)
        parent[p] = up if up < m else p ^ b
    return parent


def _btree_pair(order: Sequence[int]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Edges (parent, child) of the two complementary trees over ``order`` (ranks)."""
    m = len(order)
    par = btree_parents(m)
    t1 = [(order[par[p]], order[p]) for p in range(1, m)]
    mirror = (lambda p: m - 1 - p) if m % 2 == 0 else (lambda p: (p + 1) % m)
    t2 = [(order[mirror(par[p])], order[mirror(p)]) for p in range(1, m)]
    return t1, t2


def _rotate(order: list[int], first: int) -> list[int]:
    i = order.index(first)
    return order[i:] + order[:i]


# -- plans ----------------------------------------------------------------------------------------
def _ring_allreduce(spec: Any, topo: Topology, order: list[int], ce: int) -> Plan:
    n = len(order)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    B = ProgramBuilder(n)
    avg = plan_op(spec.kind, spec.op) == "avg"
    if n == 1:
        for q, (a, b) in enumerate(_pieces(0, E, ce)):
            B.add(0, Copy(ChunkRef("in", a, b - a), ChunkRef("out", a, b - a)))
        return assemble(spec, topo, B, (), "ring", ce)
    segs = [block_range(E, n, k) for k in range(n)]
    longest = max(hi - lo for lo, hi in segs)
    C = max(1, -(-longest // ce))  # same chunk count for every segment: ceil(longest / ce)
    for q in range(C):
        piece = []
        for lo, hi in segs:
            a, b = lo + q * (hi - lo) // C, lo + (q + 1) * (hi - lo) // C
            piece.append((a, b))
        # per position i: index of the op that last wrote / sent segment k of this piece
        copy = [[None] * n for _ in range(n)]
        rr = [[None] * n for _ in range(n)]
        rs_send = [[None] * n for _ in range(n)]  # [i][seg]
        for i in range(n):
            for k in range(n):
                a, b = piece[k]
                if k != i and b > a:  # segment i is sent from `in` at step 0, never reduced into
                    copy[i][k] = B.add(order[i], Copy(ChunkRef("in", a, b - a), ChunkRef("out", a, b - a)))
        for s in range(n - 1):  # reduce-scatter
            for i in range(n):
                k = (i - s) % n
                a, b = piece[k]
                if b <= a:
                    continue
                j = (i + 1) % n
                src = ChunkRef("in" if s == 0 else "out", a, b - a)
                sd = () if s == 0 else (rr[i][k],)
                rs_send[i][k], rr[j][k] = B.message(
                    order[i], order[j], src, ChunkRef("out", a, b - a), send_deps=sd,
                    recv_deps=(copy[j][k],), reduce=True, chunk=q)
        final = [None] * n
        for i in range(n):
            k = (i + 1) % n
            a, b = piece[k]
            if b > a:
                final[i] = rr[i][k]
                if avg:
                    final[i] = B.add(order[i], Scale(ChunkRef("out", a, b - a), n, (final[i],)))
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
                _, got[j] = B.message(order[i], order[j], ChunkRef("out", a, b - a),
                                      ChunkRef("out", a, b - a), send_deps=(have[i],),
                                      recv_deps=wd, chunk=q)
            have = got
    return assemble(spec, topo, B, (), "ring", ce)


def _pieces(lo: int, hi: int, ce: int) -> Iterator[tuple[int, int]]:
    a = lo
    while a < hi:
        yield a, min(hi, a + ce)
        a += ce


def ring_plan(spec: Any, topo: Topology, chunk_bytes: int) -> Plan:
    """NCCL-style ring schedule of ``spec`` (see the module docstring)."""
    kind, n = spec.kind, len(spec.ranks)
    ce = chunk_elems(chunk_bytes, spec.dtype)
    if kind in ("alltoall", "neighbor_average"):
        return lower(spec, topo, (), chunk_bytes, algorithm="direct")
    order = ring_order(topo, spec.ranks)
    if kind == "allreduce":
        return _ring_allreduce(spec, topo, order, ce)
    net = _Net(topo, spec.ranks)
    if kind in ("broadcast", "scatter"):
        trees = [_chain_out(net, _rotate(order, spec.root))]
    elif kind in ("reduce", "gather"):
        trees = [_chain_in(net, _rotate(order, spec.root))]
    elif kind == "allgather":
        trees = [_chain_out(net, _rotate(order, j)) for j in range(n)]
    elif kind == "reduce_scatter":
        trees = [_chain_in(net, _rotate(order, j)) for j in range(n)]
    else:
        raise PlanError(f"no ring form for collective kind {kind!r}")
    return lower(spec, topo, trees, chunk_bytes, algorithm="ring")


def dbtree_plan(spec: Any, topo: Topology, chunk_bytes: int) -> Plan:
    """NCCL-style double binary tree for allreduce, broadcast and reduce (two complementary
    trees, half the data each); other kinds fall back to :func:`ring_plan`."""
    kind, n = spec.kind, len(spec.ranks)
    if kind not in ("allreduce", "broadcast", "reduce"):
        return ring_plan(spec, topo, chunk_bytes)
    net = _Net(topo, spec.ranks)
    order = ring_order(topo, spec.ranks)
    if kind == "allreduce":
        e1, e2 = _btree_pair(order)
        roots = (order[0], order[n - 1] if n % 2 == 0 else order[1 % n])
        inward = False
    else:
        rot = _rotate(order, spec.root)
        others = rot[1:]
        e1, e2 = _btree_pair(others) if others else ([], [])
        if others:
            # the root feeds (or is fed by) each tree's top: position 0 of each arrangement
            top2 = others[n - 2] if (n - 1) % 2 == 0 else others[1 % (n - 1)]
            e1 = [(spec.root, others[0])] + e1
            e2 = [(spec.root, top2)] + e2
        roots = (spec.root, spec.root)
        inward = kind == "reduce"
    trees = [_tree(net, roots[0], e1, 1.0, inward), _tree(net, roots[1], e2, 1.0, inward)]
    if n <= 2:
        trees = trees[:1]  # both trees would be the same single edge
    return lower(spec, topo, trees, chunk_bytes, algorithm="tree")


def _direct_allreduce(spec: Any, topo: Topology, ce: int) -> Plan:
    """Reduce-scatter then allgather, each rank talking to every rank in one hop: rank j
    reduces block j of everyone's input, then sends the result to everyone."""
    n = len(spec.ranks)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    B = ProgramBuilder(n)
    avg = plan_op(spec.kind, spec.op) == "avg"
    jobs = [list(_pieces(*block_range(E, n, j), ce)) for j in range(n)]
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
    net = _Net(topo, spec.ranks)
    if kind in ("broadcast", "scatter"):
        trees = [_star(net, spec.root)]
    elif kind in ("reduce", "gather"):
        trees = [_star(net, spec.root, inward=True)]
    elif kind == "allgather":
        trees = [_star(net, j) for j in range(n)]
    elif kind == "reduce_scatter":
        trees = [_star(net, j, inward=True) for j in range(n)]
    else:
        raise PlanError(f"no direct form for collective kind {kind!r}")
    return lower(spec, topo, trees, chunk_bytes, algorithm="direct")
