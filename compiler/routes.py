"""hcc.compiler.routes — rank-to-rank routes, the ring order and the simple trees over them.

Terms
- route: the topology vertices from one rank to another, through switches only where such a
  path exists (ranks do not forward at the link level), else the shortest path through other
  ranks too, so a schedule exists on any connected topology (:class:`Routes`).
- ring order: a cyclic order of the ranks in which each rank sends to the next. NCCL builds
  its rings along NVLink where it can; :func:`ring_order` searches a Hamiltonian cycle over
  direct rank-to-rank links (widest first), then over paths through switches, and falls back
  to rank order.
- chain: a path tree along an order, out of its first rank (:func:`chain_out`) or into it
  (:func:`chain_in`, data flowing along the order); star: the root joined to every rank in one
  route (:func:`star`).
- lowest-set-bit binary tree (:func:`btree_parents`, Sanders et al. 2009): position ``p > 0``
  has parent ``(p ^ b) | (b << 1)`` (``b`` its lowest set bit; ``p ^ b`` when that is out of
  range) so the odd positions are leaves; :func:`btree_pair` gives it and its complement (the
  positions mirrored for even n, shifted by one for odd n), so most interior ranks of one tree
  are leaves of the other: NCCL's double binary tree.

Every tree here is a :class:`hcc.compiler.trees.PackedTree` with rank-name endpoints.
"""
from __future__ import annotations

import functools
from collections import deque
from typing import Iterator, Sequence

from ..ir.errors import PlanError
from ..ir.topology import Topology
from .trees import PackedTree

__all__ = ["Routes", "shortest_preds", "btree_pair", "btree_parents", "chain_in", "chain_out", "pieces", "ring_order",
           "rotate", "routes", "star", "tree_of"]

# Hamiltonian search budget: 200k extensions is ~0.2 s in CPython and finds DGX-1's NVLink
# ring (8 ranks) in a few dozen; past it we fall back to the order found so far / rank order.
_SEARCH_BUDGET = 200_000


def shortest_preds(out, switches, u: str, through_ranks: bool = False) -> dict[str, list[str]]:
    """Breadth-first from ``u`` over the adjacency ``out`` (vertex -> its out-neighbours):
    every reached vertex's predecessors on its shortest paths from ``u``, first found first.
    Unless ``through_ranks``, only ``u`` and switches forward (a rank ends a path: ranks do
    not forward at the link level)."""
    preds: dict[str, list[str]] = {u: []}
    hops = {u: 0}
    q = deque([u])
    while q:
        x = q.popleft()
        if x != u and x not in switches and not through_ranks:
            continue
        for y in out.get(x, ()):
            if y not in hops:
                hops[y] = hops[x] + 1
                preds[y] = [x]
                q.append(y)
            elif hops[y] == hops[x] + 1:
                preds[y].append(x)
    return preds


class Routes:
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
        self._preds: dict[tuple[str, bool], dict[str, list[str]]] = {}

    def _bfs(self, u: str, through_ranks: bool) -> dict[str, tuple[str, ...]]:
        key = (u, through_ranks)
        if key not in self._paths:
            preds = shortest_preds(self.out, self.switches, u, through_ranks)
            paths = {}
            for v in preds:
                if v != u and v not in self.switches:
                    p, x = [v], v
                    while preds[x]:
                        x = preds[x][0]
                        p.append(x)
                    paths[v] = tuple(reversed(p))
            self._paths[key] = paths
            self._preds[key] = preds
        return self._paths[key]

    def shortest_routes(self, u: int, v: int, limit: int = 32) -> tuple[tuple[str, ...], ...]:
        """Up to ``limit`` of the shortest routes from rank ``u`` to rank ``v`` through
        switches only (a direct link is the one shortest route), :meth:`path`'s first;
        empty where there is none."""
        a, b = self.ranks[u], self.ranks[v]
        if b not in self._bfs(a, False):
            return ()
        preds = self._preds[(a, False)]
        routes = [(b,)]
        while routes[0][0] != a:  # extend every partial route back by one hop, all at once
            routes = [(x,) + r for r in routes for x in preds[r[0]]][:limit]
        return tuple(routes)

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
def _routes_cached(topo: Topology, ranks: tuple[str, ...]) -> Routes:
    return Routes(topo, ranks)


def routes(topo: Topology, ranks: Sequence[str]) -> Routes:
    """The :class:`Routes` of ``(topo, ranks)``, shared by every plan the chunk search builds
    for one collective: its paths are the same at every chunk size, and on the 1024-rank fat
    tree each BFS costs 4 ms, 80 of a broadcast's 107 s when every plan rebuilt them."""
    try:
        return _routes_cached(topo, tuple(ranks))
    except TypeError:  # an unhashable Topology (lists for tuples): no sharing
        return Routes(topo, ranks)


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
    net = routes(topo, ranks)
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


def tree_of(net: Routes, root: int, edges: Sequence[tuple[int, int]], rate: float = 1.0,
            inward: bool = False) -> PackedTree:
    """``edges`` as (parent, child) rank pairs; paths parent..child (ir/plan.py ``Tree``).
    For an in-tree (``inward``) data goes child -> parent, so the path is that route reversed."""
    r = net.ranks
    out = []
    for p, c in edges:
        path = tuple(reversed(net.path(c, p))) if inward else net.path(p, c)
        out.append((r[p], r[c], path))
    return PackedTree(r[root], tuple(out), rate)


def chain_out(net: Routes, order: Sequence[int]) -> PackedTree:
    """order[0] -> order[1] -> ...: data flows along the order."""
    return tree_of(net, order[0], list(zip(order, order[1:])))


def chain_in(net: Routes, order: Sequence[int]) -> PackedTree:
    """A chain into order[0] whose data flows order[1] -> order[2] -> ... -> order[-1] ->
    order[0], i.e. along the ring direction."""
    root = order[0]
    rest = list(order[1:])
    edges = [(b, a) for a, b in zip(rest, rest[1:])]  # parent of rest[k] is rest[k+1]
    if rest:
        edges.append((root, rest[-1]))
    return tree_of(net, root, edges, inward=True)


def star(net: Routes, root: int, inward: bool = False) -> PackedTree:
    return tree_of(net, root, [(root, c) for c in range(len(net.ranks)) if c != root], inward=inward)


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


def btree_pair(order: Sequence[int]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Edges (parent, child) of the two complementary trees over ``order`` (ranks)."""
    m = len(order)
    par = btree_parents(m)
    t1 = [(order[par[p]], order[p]) for p in range(1, m)]
    mirror = (lambda p: m - 1 - p) if m % 2 == 0 else (lambda p: (p + 1) % m)
    t2 = [(order[mirror(par[p])], order[mirror(p)]) for p in range(1, m)]
    return t1, t2


def rotate(order: list[int], first: int) -> list[int]:
    i = order.index(first)
    return order[i:] + order[:i]


def pieces(lo: int, hi: int, ce: int) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` as consecutive runs of at most ``ce`` elements."""
    a = lo
    while a < hi:
        yield a, min(hi, a + ce)
        a += ce
