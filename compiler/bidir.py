"""hcc.compiler.bidir — allreduce over spanning trees used in both directions (Blink).

Terms
- bidirectional packing (:func:`bidir_packing`): spanning trees over the ranks for an
  allreduce that reduces up and broadcasts down each tree, packed so that a tree edge loads
  its route's links in *both* directions. Without switches that is undirected spanning-tree
  packing, whose optimum is min over rank partitions P of c(links across P) / (|P| - 1)
  (Nash-Williams 1961, Tutte 1961).
- closure: the complete rank graph whose edge u-v costs the cheapest route between them
  through switches only (:func:`_closure`); a tree is priced as its minimum spanning tree.
- centre: the rank of least eccentricity of a tree; each tree is rooted there.
- :func:`bidir_plan` lowers the trees (compiler/lower.py, ``per_root=False``): the candidate
  ``treepack-bidir`` of compiler/registry.py.

The master LP is compiler/treepack_master.py's, over columns whose usage counts each link
once per direction a tree edge crosses it.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from ..ir.plan import Plan
from ..ir.topology import Topology
from .lower import lower
from .trees import PackedTree

__all__ = ["BIDIR_MAX_RANKS", "MIN_SHARE", "bidir_packing", "bidir_plan", "solve_master"]

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
MIN_SHARE = 0.02


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


def solve_master(loads: list[dict[int, int]], capn: list[float]) -> tuple[list[float], list[float]]:
    """max sum w_i s.t. sum_i loads_i(e) w_i <= capn(e), solved by the tree-packing master LP
    (treepack_master.py, one root): ``(weights, link duals)``. Each load is a column's uses
    of each link index; the master is built cold per call, with GLOP's presolve (the rounds
    here are few: DGX-1 converges in 15)."""
    import numpy as np

    from .treepack_master import _Col, _Master

    master = _Master(np.asarray(capn, dtype=float), [0], presolve=True)
    for i, load in enumerate(loads):
        master.add(_Col(0, (i,), (), tuple(load.items())))  # (i,): every column is its own key
    master.solve()
    y, _ = master.duals()
    return master.weights(), [float(v) for v in y]


def bidir_packing(topo: Topology, ranks: Sequence[str]) -> tuple[PackedTree, ...] | None:
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
    it stops when no tree costs below 1. Trees under :data:`MIN_SHARE` of the rate are
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
        weights, duals = solve_master([c[1] for c in cols], capn)
        new = column(duals)
        if new is None or new[0] >= 1.0 - 1e-9 or new[1] in seen:
            break
        seen.add(new[1])
        cols.append(new[1:])
    weights, _ = solve_master([c[1] for c in cols], capn)
    total = sum(weights)
    keep = [i for i, w in enumerate(weights) if w > MIN_SHARE * total]
    if len(keep) < sum(1 for w in weights if w > 1e-12):
        cols = [cols[i] for i in keep]
        weights, _ = solve_master([c[1] for c in cols], capn)
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
        out.append(PackedTree(ranks[root], tuple(edges), w * cmax))
    return tuple(out) or None


# credit windows (chunks per tree, compiler/lower.py) the bidirectional plan tries per chunk
# size, best predicted kept: 0 (none) is best on rings and DGX-1's 4-GPU fragment, 8 on all of
# DGX-1 (1.24 -> 1.11 ms at 64 MiB), 4 on the 16-rank two-host cluster sample (efficiency 0.46
# -> 0.50); smaller ones stall the round trip (1: 3x slower)
_BIDIR_WINDOWS = (0, 4, 8)


def bidir_plan(spec: Any, topo: Topology, trees: Sequence[PackedTree], chunk_bytes: int,
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
