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

import functools
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ..ir.errors import PlanError
from ..ir.plan import DTYPE_SIZES, ChunkRef, Copy, Plan, Reduce, Scale, Tree, block_range
from ..ir.topology import Topology
from .lower import ProgramBuilder, assemble, chunk_elems, lower, plan_op, split_by_rate

__all__ = [
    "SimpleTree",
    "bidir_packing",
    "bidir_plan",
    "btree_parents",
    "dbtree_plan",
    "direct_plan",
    "hier_plan",
    "ring_order",
    "ring_plan",
    "two_level_cut",
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


@functools.lru_cache(maxsize=8)
def _net_cached(topo: Topology, ranks: tuple[str, ...]) -> _Net:
    return _Net(topo, ranks)


def _net(topo: Topology, ranks: Sequence[str]) -> _Net:
    """The :class:`_Net` of ``(topo, ranks)``, shared by every plan the chunk search builds
    for one collective: its paths are the same at every chunk size, and on the 1024-rank fat
    tree each BFS costs 4 ms, 80 of a broadcast's 107 s when every plan rebuilt them."""
    try:
        return _net_cached(topo, tuple(ranks))
    except TypeError:  # an unhashable Topology (lists for tuples): no sharing
        return _Net(topo, ranks)


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
    net = _net(topo, ranks)
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
    if n == 1:
        for q, (a, b) in enumerate(_pieces(0, E, ce)):
            B.add(0, Copy(ChunkRef("in", a, b - a), ChunkRef("out", a, b - a)))
        return assemble(spec, topo, B, (), "ring", ce)
    _ring_allreduce_ops(B, order, 0, E, ce, plan_op(spec.kind, spec.op) == "avg")
    return assemble(spec, topo, B, (), "ring", ce)


def _ring_allreduce_ops(B: ProgramBuilder, order: Sequence[int], lo: int, hi: int, ce: int,
                        avg: bool, hop_tree=None) -> None:
    """The ring allreduce of elements ``[lo, hi)`` along ``order``, added to ``B``.
    ``hop_tree(i)``: the plan tree whose route the hop from position ``i`` takes (its
    messages' ``tree``; None: -1, the cost model's cheapest route)."""
    n = len(order)
    tree_of = [hop_tree(i) if hop_tree else -1 for i in range(n)]
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
                    recv_deps=(copy[j][k],), reduce=True, tree=tree_of[i], chunk=q)
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
                                      recv_deps=wd, tree=tree_of[i], chunk=q)
            have = got


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
    net = _net(topo, spec.ranks)
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
    net = _net(topo, spec.ranks)
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
    net = _net(topo, spec.ranks)
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


# -- allreduce over trees used in both directions (Blink), and over a two-level hierarchy --------
# the undirected packing (and the two-level plan) are priced for collectives of at most this
# many ranks: column generation prices one minimum spanning tree per round (a Dijkstra per
# rank through switches), and the sizes measured are those of the samples and netem cases
# (2 to 16 ranks: the 16-rank two-host cluster packs 11 trees in under a second)
BIDIR_MAX_RANKS = 16
# pricing rounds of the undirected packing's column generation (a count, not a clock, so the
# result depends on the input only); DGX-1 (8 ranks) converges in 15, dgx1x4 in 6
_BIDIR_ROUNDS = 200
# LP trees below this share of the packing's rate are dropped and the LP re-solved over the
# rest: each tree costs a pipeline of its own (per-message costs), and on DGX-1 the trees under
# 2% carried 4% of the rate in 9 of 21 trees
_BIDIR_MIN_SHARE = 0.02


def _duplex(topo: Topology, ranks: Sequence[str]) -> tuple[Topology, dict[tuple[str, str], float]] | None:
    """The collective's sub-topology and its directed capacities (parallel links summed), or
    None when some link has no reverse: a tree used both ways needs both directions."""
    sub = topo.restricted(tuple(ranks))
    cap: dict[tuple[str, str], float] = {}
    for l in sub.links:
        if l.src != l.dst:
            cap[(l.src, l.dst)] = cap.get((l.src, l.dst), 0.0) + l.capacity
    if not cap or any((v, u) not in cap for u, v in cap):
        return None
    return sub, cap


def _closure(ranks: Sequence[str], switches: set[str], adj: dict[str, list[str]],
             hop_cost) -> tuple[list[list[float]], list[list[tuple[str, ...] | None]]]:
    """Cheapest rank-to-rank routes whose inner vertices are switches (ranks do not forward at
    the link level), under the undirected ``hop_cost(u, v)``: Dijkstra from every rank."""
    import heapq

    n = len(ranks)
    pos = {v: i for i, v in enumerate(ranks)}
    dist = [[math.inf] * n for _ in range(n)]
    paths: list[list[tuple[str, ...] | None]] = [[None] * n for _ in range(n)]
    for i, a in enumerate(ranks):
        best = {a: 0.0}
        prev: dict[str, str] = {}
        heap = [(0.0, a)]
        while heap:
            d, u = heapq.heappop(heap)
            if d > best[u]:
                continue
            if u != a and u not in switches:
                continue  # reached a rank: it ends the route
            for v in adj.get(u, ()):
                nd = d + hop_cost(u, v)
                if nd < best.get(v, math.inf):
                    best[v], prev[v] = nd, u
                    heapq.heappush(heap, (nd, v))
        for v, d in best.items():
            j = pos.get(v)
            if j is None or j == i:
                continue
            p, x = [v], v
            while x != a:
                x = prev[x]
                p.append(x)
            dist[i][j], paths[i][j] = d, tuple(reversed(p))
    return dist, paths


def _mst(dist: list[list[float]]) -> list[int] | None:
    """Prim's minimum spanning tree over the complete rank graph with costs ``dist``
    (symmetric); parent list rooted at 0, None when disconnected."""
    n = len(dist)
    parent = [-1] * n
    best = [math.inf] * n
    inside = [False] * n
    best[0] = 0.0
    for _ in range(n):
        u = min((v for v in range(n) if not inside[v]), key=lambda v: best[v])
        if best[u] == math.inf:
            return None
        inside[u] = True
        for v in range(n):
            if not inside[v] and dist[u][v] < best[v]:
                best[v], parent[v] = dist[u][v], u
    return parent


def _centre(parent: Sequence[int]) -> int:
    """The vertex of least eccentricity (in edges) of the tree given by ``parent``: rooting a
    reduce-then-broadcast there halves its pipeline depth against an end of a path."""
    n = len(parent)
    nbr: list[list[int]] = [[] for _ in range(n)]
    for c, p in enumerate(parent):
        if p >= 0:
            nbr[c].append(p)
            nbr[p].append(c)

    def ecc(s: int) -> int:
        seen, frontier, d = {s}, [s], -1
        while frontier:
            d += 1
            nxt = []
            for u in frontier:
                for v in nbr[u]:
                    if v not in seen:
                        seen.add(v)
                        nxt.append(v)
            frontier = nxt
        return d

    return min(range(n), key=lambda v: (ecc(v), v))


def _solve_master(loads: list[dict[int, int]], capn: list[float]) -> tuple[list[float], list[float]]:
    """GLOP on max sum w_T s.t. sum_T load_T(e) w_T <= capn(e): (weights, link duals)."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:
        raise PlanError("OR-Tools GLOP is not available")
    w = [solver.NumVar(0.0, solver.infinity(), f"w{i}") for i in range(len(loads))]
    rows = [solver.Constraint(-solver.infinity(), c) for c in capn]
    for i, load in enumerate(loads):
        for e, k in load.items():
            rows[e].SetCoefficient(w[i], float(k))
    obj = solver.Objective()
    for x in w:
        obj.SetCoefficient(x, 1.0)
    obj.SetMaximization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        raise PlanError("the undirected tree-packing LP did not solve")
    return [x.solution_value() for x in w], [max(0.0, r.dual_value()) for r in rows]


def bidir_packing(topo: Topology, ranks: Sequence[str]) -> tuple[SimpleTree, ...] | None:
    """Spanning trees over ``ranks`` for an allreduce that reduces up and broadcasts down each
    tree (Blink's allreduce), packed so that a tree edge loads its route's links in *both*
    directions: maximise sum w_T s.t. for every link e, sum_T w_T (uses of e + uses of its
    reverse by T's routes) <= c(e). Without switches that is undirected spanning-tree packing,
    whose optimum is min over rank partitions P of c(links across P) / (|P| - 1) (Nash-Williams
    1961, Tutte 1961): on DGX-1's 4-GPU fragment 225 / 3 = 75 GB/s, which is the allreduce
    floor 2(n-1)M / sum c itself, where the directed broadcast packing reduced and broadcast
    over the same links reaches 1.36 ms / 0.89 ms of it.

    Column generation as in compiler/treepack.py: GLOP solves the master LP, its link duals
    y price a new tree as a minimum spanning tree of the rank closure under hop cost
    y(u,v) + y(v,u) (Prim; exact without switches, a heuristic Steiner tree through them), and
    it stops when no tree costs below 1. Trees under :data:`_BIDIR_MIN_SHARE` of the rate are
    dropped and the LP re-solved over the rest. Each tree is rooted at its centre. Returns
    None when some link has no reverse or a rank is unreachable.

    >>> from hcc.ir.topology import Link
    >>> sq = Topology("sq", ("a", "b", "c", "d"), links=tuple(Link(x, y, 1.0) for x, y in
    ...     ["ab", "ba", "bc", "cb", "cd", "dc", "da", "ad"]))
    >>> round(sum(t.rate for t in bidir_packing(sq, ("a", "b", "c", "d"))), 6)   # 4 links / 3
    1.333333
    """
    ranks = tuple(ranks)
    n = len(ranks)
    got = _duplex(topo, ranks)
    if got is None or n < 2:
        return None
    sub, cap = got
    links = sorted(cap)
    index = {e: i for i, e in enumerate(links)}
    cmax = max(cap.values())
    capn = [cap[e] / cmax for e in links]
    switches = set(sub.switches)
    adj: dict[str, list[str]] = {}
    for u, v in links:
        adj.setdefault(u, []).append(v)

    def column(y: list[float]) -> tuple[float, tuple[int, ...], dict[int, int], tuple] | None:
        top = max(y) if y and max(y) > 0 else 1.0
        # 1e-9 of the dearest dual per hop: routes through zero-dual links take no detours
        dist, paths = _closure(ranks, switches, adj,
                               lambda u, v: y[index[(u, v)]] + y[index[(v, u)]] + 1e-9 * top)
        parent = _mst(dist)
        if parent is None:
            return None
        load: dict[int, int] = {}
        cost = 0.0
        for c, p in enumerate(parent):
            if p < 0:
                continue
            path = paths[p][c]
            for u, v in zip(path, path[1:]):
                for e in (index[(u, v)], index[(v, u)]):
                    load[e] = load.get(e, 0) + 1
                    cost += y[e]
        return cost, tuple(parent), load, tuple(paths[p][c] if p >= 0 else () for c, p in enumerate(parent))

    first = column([1.0 / c for c in capn])  # widest-first seed
    if first is None:
        return None
    cols = [first[1:]]
    seen = {first[1]}
    for _ in range(_BIDIR_ROUNDS):
        weights, duals = _solve_master([c[1] for c in cols], capn)
        new = column(duals)
        if new is None or new[0] >= 1.0 - 1e-9 or new[1] in seen:
            break
        seen.add(new[1])
        cols.append(new[1:])
    weights, _ = _solve_master([c[1] for c in cols], capn)
    total = sum(weights)
    keep = [i for i, w in enumerate(weights) if w > _BIDIR_MIN_SHARE * total]
    if len(keep) < sum(1 for w in weights if w > 1e-12):
        cols = [cols[i] for i in keep]
        weights, _ = _solve_master([c[1] for c in cols], capn)
    out = []
    for (parent, _, paths), w in zip(cols, weights):
        if w <= 1e-12:
            continue
        root = _centre(parent)
        # re-hang the tree from its centre: flip the parent pointers on the path root..old root
        par = list(parent)
        path_up = [root]
        while par[path_up[-1]] >= 0:
            path_up.append(par[path_up[-1]])
        old = {c: paths[c] for c in range(n) if parent[c] >= 0}
        route = dict(old)
        route.pop(root, None)
        for child, up in zip(path_up, path_up[1:]):
            route[up] = tuple(reversed(old[child]))
        new_par = list(par)
        new_par[root] = -1
        for child, up in zip(path_up, path_up[1:]):
            new_par[up] = child
        edges = []
        order, i = [root], 0
        kids: dict[int, list[int]] = {}
        for c, p in enumerate(new_par):
            if p >= 0:
                kids.setdefault(p, []).append(c)
        while i < len(order):
            for c in kids.get(order[i], ()):
                order.append(c)
                edges.append((ranks[order[i]], ranks[c], route[c]))
            i += 1
        out.append(SimpleTree(ranks[root], tuple(edges), w * cmax))
    return tuple(out) or None


# credit windows (chunks per tree, compiler/lower.py) the bidirectional plan tries per chunk
# size, best predicted kept: 0 (none) is best on rings and DGX-1's 4-GPU fragment, 8 on all of
# DGX-1 (1.24 -> 1.11 ms at 64 MiB), 4 on the 16-rank two-host cluster sample (efficiency 0.46
# -> 0.50); smaller ones stall the round trip (1: 3x slower)
_BIDIR_WINDOWS = (0, 4, 8)


def bidir_plan(spec: Any, topo: Topology, trees: Sequence[SimpleTree], chunk_bytes: int,
               proportional: bool = True, window: int | None = None, *, model=None) -> Plan:
    """Allreduce as reduce-then-broadcast over each of ``trees`` (:func:`bidir_packing`),
    every tree carrying a rate share of the whole buffer, pipelined chunk by chunk;
    ``chunk_bytes`` is the fastest tree's chunk, the others' scaled by rate (``proportional``).
    ``window``: the credit window of compiler/lower.py; None tries :data:`_BIDIR_WINDOWS` and
    keeps the plan the cost model (``model``) predicts fastest."""
    def build(w: int) -> Plan:
        return lower(spec, topo, trees, chunk_bytes, algorithm="treepack-bidir", per_root=False,
                     proportional=proportional, window=w)

    if window is not None:
        return build(window)
    from .cost import DEFAULT_MODEL, simulate

    best = None
    for w in _BIDIR_WINDOWS:
        plan = build(w)
        t = simulate(plan, model=model or DEFAULT_MODEL).time
        if best is None or t < best[0]:
            best = (t, plan)
    return best[1]


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
    """The narrowest cut between the ranks: ``(ranks on the source side, the others, its
    capacity)``, as min over ranks v of min(maxflow(r0, v), maxflow(v, r0)) (every cut that
    splits the ranks separates rank 0 from some rank; networkx max-flow). None for one rank."""
    import networkx as nx

    ranks = tuple(ranks)
    if len(ranks) < 2:
        return None
    g = topo.restricted(ranks).graph()
    best = None
    for v in ranks[1:]:
        for s, t in ((ranks[0], v), (v, ranks[0])):
            value, (side, _) = nx.minimum_cut(g, s, t, capacity="capacity")
            if best is None or value < best[0] - 1e-9 * value:
                best = (value, side)
    value, side = best
    a = tuple(i for i, r in enumerate(ranks) if r in side)
    b = tuple(i for i, r in enumerate(ranks) if r not in side)
    return a, b, value


def _widest(net: _Net, u: int, v: int) -> float:
    path = net.path(u, v)
    return min(net.out[x][y] for x, y in zip(path, path[1:]))


def _chain(net: _Net, leader: int, group: Sequence[int]) -> list[int]:
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


def _hier_lower(spec: Any, topo: Topology, net: _Net, chains: tuple[list[int], list[int]],
                ce: int, layout: list[tuple[int, int]], rate: float) -> Plan:
    """The two-level plan (see :func:`hier_plan`) with cross messages ``layout`` (element
    ranges) and chain chunks of ``ce`` elements, fewer in a message too small for
    :data:`_HIER_RAMP_CHUNKS` of them."""
    n = len(spec.ranks)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    B = ProgramBuilder(n)
    avg = plan_op(spec.kind, spec.op) == "avg"
    # the chain chunks of each cross message, numbered in buffer order
    pieces: list[tuple[int, int]] = []
    runs: list[tuple[int, int]] = []  # cross message -> its chunks [q0, q1)
    for a, b in layout:
        c = max(1, min(ce, -(-(b - a) // _HIER_RAMP_CHUNKS)))
        q0 = len(pieces)
        pieces += list(_pieces(a, b, c))
        runs.append((q0, len(pieces)))
    leaders = (chains[0][0], chains[1][0])
    sendup: dict[tuple[int, int], int] = {}  # (rank, chunk) -> its Send up the chain
    reduced: dict[tuple[int, int], int] = {}  # (leader, chunk) -> op completing its side's partial
    for q, (a, b) in enumerate(pieces):
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
        a, b = pieces[q0][0], pieces[q1 - 1][1]
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
                a, b = pieces[q]
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
    net = _net(topo, spec.ranks)
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


# -- allreduce over a packing of Hamiltonian rings --------------------------------------------
# directed Hamiltonian cycles are enumerated up to this many ranks and this many cycles: DGX-1's
# 8 GPUs have 1 344 over their NVLinks (found in ~40 ms), a complete graph of 8 has 5 040
RINGS_MAX_RANKS = 8
_RINGS_MAX_CYCLES = 6000


def ring_packing(topo: Topology, ranks: Sequence[str]) -> tuple[tuple[tuple[int, ...], float], ...] | None:
    """Directed Hamiltonian cycles over the ranks' direct links with rates, packed by an LP:
    maximise sum r_C s.t. sum_{C uses e} r_C <= c(e). A ring allreduce of a share ``r_C / sum r``
    of the buffer on each cycle takes ``2(n-1)/n x M / sum r``, and every cycle uses n links,
    so ``sum r <= sum c / n`` and the time is at least ``2(n-1) M / sum c``: the allreduce
    floor itself, reached when the links decompose into rings (DGX-1's 8 GPUs: six rings of
    25 GB/s, 150 GB/s, as NCCL builds them; 4 of its GPUs cannot, 100 of 112.5 GB/s).
    Cycles below :data:`_BIDIR_MIN_SHARE` of the rate are dropped and the LP re-solved.
    Returns ``((rank positions in ring order, rate), ...)``, or None (no Hamiltonian cycle over
    direct links, more than :data:`RINGS_MAX_RANKS` ranks, or too many cycles to list).

    >>> from hcc.ir.topology import Link
    >>> sq = Topology("sq", ("a", "b", "c", "d"), links=tuple(Link(x, y, 1.0) for x, y in
    ...     ["ab", "ba", "bc", "cb", "cd", "dc", "da", "ad"]))
    >>> sorted(r for r in ring_packing(sq, ("a", "b", "c", "d")))
    [((0, 1, 2, 3), 1.0), ((0, 3, 2, 1), 1.0)]
    """
    ranks = tuple(ranks)
    n = len(ranks)
    if not 3 <= n <= RINGS_MAX_RANKS:
        return None
    pos = {v: i for i, v in enumerate(ranks)}
    cap: dict[tuple[int, int], float] = {}
    for l in topo.restricted(ranks).links:
        if l.src in pos and l.dst in pos and l.src != l.dst:
            key = (pos[l.src], pos[l.dst])
            cap[key] = cap.get(key, 0.0) + l.capacity
    out: list[list[int]] = [[] for _ in range(n)]
    for a, b in sorted(cap):
        out[a].append(b)
    cycles: list[tuple[int, ...]] = []
    path, used = [0], [False] * n
    used[0] = True

    def extend() -> bool:  # False once the listing is too long
        u = path[-1]
        if len(path) == n:
            if 0 in out[u]:
                cycles.append(tuple(path))
            return len(cycles) <= _RINGS_MAX_CYCLES
        for v in out[u]:
            if not used[v]:
                used[v] = True
                path.append(v)
                ok = extend()
                path.pop()
                used[v] = False
                if not ok:
                    return False
        return True

    if not extend() or not cycles:
        return None
    links = sorted(cap)
    index = {e: i for i, e in enumerate(links)}
    cmax = max(cap.values())
    capn = [cap[e] / cmax for e in links]
    loads = [{index[(c[i], c[(i + 1) % n])]: 1 for i in range(n)} for c in cycles]
    weights, _ = _solve_master(loads, capn)
    total = sum(weights)
    keep = [i for i, w in enumerate(weights) if w > _BIDIR_MIN_SHARE * total]
    cycles = [cycles[i] for i in keep]
    weights, _ = _solve_master([loads[i] for i in keep], capn)
    return tuple((c, w * cmax) for c, w in zip(cycles, weights) if w > 1e-12) or None


def rings_plan(spec: Any, topo: Topology, rings: Sequence[tuple[Sequence[int], float]],
               chunk_bytes: int) -> Plan:
    """Allreduce as one NCCL-style ring allreduce per ring of :func:`ring_packing`, each on a
    share of the buffer proportional to its rate, chunks of ``chunk_bytes``."""
    n = len(spec.ranks)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    ce = chunk_elems(chunk_bytes, spec.dtype)
    B = ProgramBuilder(n)
    avg = plan_op(spec.kind, spec.op) == "avg"
    for (order, _), (lo, hi) in zip(rings, split_by_rate(0, E, [r for _, r in rings])):
        if hi > lo:
            _ring_allreduce_ops(B, list(order), lo, hi, ce, avg)
    return assemble(spec, topo, B, (), "treepack-rings", ce)
