"""hcc.compiler.switches — rank-level views of a topology whose paths cross switches.

Terms
- *switch*: a forwarding-only vertex (NVSwitch, PCIe switch, NIC, ToR); it never owns data
  and, in the model of ForestColl (Zhao et al. 2024), never replicates it: a rank-level edge
  ``u -> v`` of a tree is carried by one path ``u, w1, ..., wk, v`` whose inner vertices are
  switches, and every link on it carries that edge's whole rate.
- *closure* (the rank graph): for every ordered pair of ranks, the cheapest such path under
  a per-link cost. A packed tree over the closure is a rank-level arborescence whose edges are
  routed through switches; its load on a link is (rate) x (number of its edges routed there).

Why a closure and not edge splitting. ForestColl removes each switch by *edge splitting*
(Lovász 1976, Mader 1978; Bang-Jensen et al. 1995 for digraphs): pairs of arcs ``u -> w -> v``
become ``u -> v`` while every rank-to-rank cut keeps its value on Eulerian graphs, so a
rank-only packing (Edmonds 1973) then reaches the cut bound. Every split arc ``u -> v``
stands for the path ``u, w, v``: a packing of the split graph *is* a packing of rank trees
routed through switches. Column generation over the closure searches that same space directly:
pricing a tree under link costs y is a minimum-cost arborescence on the closure with weights
d_y(u, v) = cheapest switch-only path (the best routing of each edge is independent of the
others), so the LP optimum is at least the split graph's — equal to the cut bound on Eulerian
topologies — without choosing the splits. On non-Eulerian graphs the gap to the cut bound is
measured and reported (treepack.Packing.gap).

Two implementations of the closure: :meth:`Indexed.closure` (Dijkstra from every rank, the
readable reference) and :meth:`Indexed.closure_matrix` (Bellman-Ford from every rank at once in
numpy), which the packer uses; tests check they agree.

>>> from hcc.ir.topology import Topology, Link
>>> star = Topology("star", ("a", "b", "c"), ("sw",),
...     tuple(Link(x, y, 1.0) for p in ("a", "b", "c") for x, y in ((p, "sw"), ("sw", p))))
>>> ix = Indexed.build(star, ("a", "b", "c"))
>>> cost, paths = ix.closure([1.0] * len(ix.links))
>>> [ix.vertices[i] for i in paths[ix.rank_pos["a"]][ix.rank_pos["c"]]]
['a', 'sw', 'c']
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from ..ir.topology import Topology

__all__ = ["Indexed"]


@dataclass(frozen=True)
class Indexed:
    """The restricted topology of one collective in index form.

    ``links[i] = (a, b, capacity)`` over vertex indices, parallel declarations merged;
    ``reverse=True`` flips every link (reduce-like collectives pack in-trees as out-trees of
    the reversed graph). ``ranks[j]`` is the vertex index of rank j.
    """

    vertices: tuple[str, ...]
    is_switch: tuple[bool, ...]
    ranks: tuple[int, ...]
    links: tuple[tuple[int, int, float], ...]
    out: tuple[tuple[tuple[int, int], ...], ...]  # out[a] = ((b, link index), ...)
    reverse: bool = False

    @staticmethod
    def build(topo: Topology, ranks: tuple[str, ...], reverse: bool = False) -> "Indexed":
        g = topo.restricted(tuple(ranks)).graph()
        missing = [r for r in ranks if r not in g]
        if missing:
            raise ValueError(f"ranks not in topology {topo.name!r}: {missing}")
        vertices = tuple(g.nodes)
        index = {v: i for i, v in enumerate(vertices)}
        links = []
        for u, v, d in g.edges(data=True):
            if d["capacity"] <= 0:
                continue
            a, b = (index[v], index[u]) if reverse else (index[u], index[v])
            links.append((a, b, float(d["capacity"])))
        out: list[list[tuple[int, int]]] = [[] for _ in vertices]
        for i, (a, b, _) in enumerate(links):
            out[a].append((b, i))
        return Indexed(
            vertices=vertices,
            is_switch=tuple(bool(g.nodes[v]["switch"]) for v in vertices),
            ranks=tuple(index[r] for r in ranks),
            links=tuple(links),
            out=tuple(tuple(o) for o in out),
            reverse=reverse,
        )

    @property
    def rank_pos(self) -> dict[str, int]:
        return {self.vertices[v]: j for j, v in enumerate(self.ranks)}

    @property
    def has_switches(self) -> bool:
        return any(self.is_switch)

    def closure(self, cost) -> tuple[list[list[float]], list[list[tuple[int, ...] | None]]]:
        """Cheapest switch-only path between every ordered pair of ranks under link ``cost``.

        Returns ``(d, paths)`` indexed by rank position: ``d[i][j]`` (inf when none) and
        ``paths[i][j]`` as vertex indices ``rank i .. rank j``. Ties prefer fewer hops, so
        zero-cost links never lengthen a route.
        """
        n = len(self.ranks)
        d = [[math.inf] * n for _ in range(n)]
        paths: list[list[tuple[int, ...] | None]] = [[None] * n for _ in range(n)]
        for i, src in enumerate(self.ranks):
            best = {src: (0.0, 0)}
            pred = {src: -1}
            heap = [(0.0, 0, src)]
            while heap:
                c, h, a = heapq.heappop(heap)
                if best.get(a, (math.inf, 0)) < (c, h):
                    continue
                if a != src and not self.is_switch[a]:
                    continue  # a rank ends a route; it never forwards inside one edge
                for b, li in self.out[a]:
                    key = (c + cost[li], h + 1)
                    if key < best.get(b, (math.inf, 0)):
                        best[b] = key
                        pred[b] = a
                        heapq.heappush(heap, (key[0], key[1], b))
            for j, dst in enumerate(self.ranks):
                if j == i or dst not in best:
                    continue
                d[i][j] = best[dst][0]
                p, v = [dst], dst
                while pred[v] != -1:
                    v = pred[v]
                    p.append(v)
                paths[i][j] = tuple(reversed(p))
        return d, paths

    def closure_matrix(self, cost):
        """The closure as a dense matrix, vectorised: ``(d, route)`` with ``d`` an n x n numpy
        array over rank positions (inf = no route, diagonal inf) and ``route(i, j)`` the
        vertex path of a cheapest route. Same distances as :meth:`closure`.

        Bellman-Ford from every rank at once (Jacobi rounds over a V x n matrix): the first
        step takes each rank's own links; rounds then relax only switch-to-switch links, so
        ranks never forward inside a route, and round k holds the cheapest routes of at most
        k hops; a last step takes the links from switches into ranks. Rounds stop when
        nothing improves, after (longest cheapest route) hops: 4 on 64 DGX-1s, 2 on a fat
        tree at uniform costs. Per round O(n x switch-to-switch links) in numpy. It replaced Floyd-Warshall over the switches, O(S^3 + n^2 S):
        64 DGX-1s have 513 switches and took 3.7 s per closure, now 0.1 s.
        The round at which each distance last improved is its hop count, so a route walks
        back from its end over links whose tail is one hop nearer and whose cost adds up
        exactly: among equally cheap routes the one with fewest hops, as :meth:`closure`.
        """
        import numpy as np

        inf = np.inf
        n, nv = len(self.ranks), len(self.vertices)
        cost = np.asarray(cost, dtype=float)
        tails = np.fromiter((a for a, _, _ in self.links), dtype=np.int64, count=len(self.links))
        heads = np.fromiter((b for _, b, _ in self.links), dtype=np.int64, count=len(self.links))
        rpos = np.full(nv, -1, dtype=np.int64)
        rpos[list(self.ranks)] = np.arange(n)
        # vertex-major (nv x n): a round gathers whole rows, 5x faster than columns
        dist = np.full((nv, n), inf)
        hops = np.zeros((nv, n), dtype=np.int32)
        first = rpos[tails] >= 0
        np.minimum.at(dist, (heads[first], rpos[tails[first]]), cost[first])
        hops[np.isfinite(dist)] = 1
        is_sw = np.array(self.is_switch, dtype=bool)

        def sorted_links(mask):
            order = np.argsort(heads[mask], kind="stable")
            t, h, c = tails[mask][order], heads[mask][order], cost[mask][order]
            targets, starts = np.unique(h, return_index=True)
            return t, c[:, None], targets, starts

        # switches first, in rounds (ranks never forward, so no round needs them) ...
        t, c, targets, starts = sorted_links(is_sw[tails] & is_sw[heads])
        for k in range(2, nv + 2):  # at most nv hops: a cheapest route repeats no vertex
            if not len(t):
                break
            best = np.minimum.reduceat(dist[t] + c, starts, axis=0)
            old = dist[targets]
            better = best < old
            if not better.any():
                break
            dist[targets] = np.where(better, best, old)
            hops[targets] = np.where(better, k, hops[targets])
        # ... then the links from switches into ranks, once; a rank's hop count is one more
        # than the fewest-hop switch among those giving its distance
        t, c, targets, starts = sorted_links(is_sw[tails] & ~is_sw[heads])
        if len(t):
            cand = dist[t] + c
            best = np.minimum.reduceat(cand, starts, axis=0)
            widths = np.diff(np.append(starts, len(t)))
            tie = cand <= np.repeat(best, widths, axis=0)
            hbest = np.minimum.reduceat(np.where(tie, hops[t] + 1, nv + 2), starts, axis=0)
            old = dist[targets]
            better = best < old
            dist[targets] = np.where(better, best, old)
            hops[targets] = np.where(better, hbest, hops[targets])
        d = dist[list(self.ranks)].T.copy()
        np.fill_diagonal(d, inf)
        into: list[list[tuple[int, float]]] = [[] for _ in range(nv)]
        for li, (a, b, _) in enumerate(self.links):
            into[b].append((a, float(cost[li])))
        is_switch = self.is_switch

        def route(i: int, j: int) -> tuple[int, ...] | None:
            if not np.isfinite(d[i, j]):
                return None
            src, v = self.ranks[i], self.ranks[j]
            path = [v]
            row, hrow = dist[:, i], hops[:, i]
            while v != src and len(path) <= nv:
                want, h = row[v], hrow[v]
                pick, err = -1, inf
                for strict in (True, False):  # the hop test only breaks ties; rounding aside
                    for a, c in into[v]:
                        if a == src and (h == 1 or not strict):
                            e = abs(c - want)
                        elif is_switch[a] and (hrow[a] == h - 1 or not strict):
                            e = abs(row[a] + c - want)
                        else:
                            continue
                        if e < err:
                            pick, err = a, e
                    if pick >= 0:
                        break
                path.append(pick)
                v = pick
            return tuple(reversed(path))

        return d, route

    def link_of(self) -> dict[tuple[int, int], int]:
        return {(a, b): i for i, (a, b, _) in enumerate(self.links)}


def host_translation(topo: Topology, ranks: tuple[str, ...]) -> tuple[dict[str, str], int] | None:
    """``(sigma, H)``: the vertex map moving every host one on (``h_i.x -> h_{i+1}.x``, hosts
    in declaration order, the last back to the first; vertices outside hosts stay), when it
    is an automorphism of ``topo.restricted(ranks)`` — every link maps to a link of the same
    capacity, ranks map to ranks — and every rank is inside a host; else None. Its powers
    form a cyclic group of order H acting on the ranks, so any quantity the topology
    determines is the same for a rank and its translates (bounds.py checks one sink per
    orbit; treepack.py packs host-symmetric allgather trees).

    >>> from hcc.ir.topology import Link
    >>> t = Topology("two", ("h0.a", "h1.a"), ("sw",), tuple(Link(x, y, 1.0) for x, y in
    ...     (("h0.a", "sw"), ("sw", "h0.a"), ("h1.a", "sw"), ("sw", "h1.a"))),
    ...     hosts=(("h0.a", "h0"), ("h1.a", "h1")))
    >>> host_translation(t, ("h0.a", "h1.a"))
    ({'h0.a': 'h1.a', 'h1.a': 'h0.a', 'sw': 'sw'}, 2)
    """
    sub = topo.restricted(tuple(ranks))
    host_of = dict(sub.hosts)
    order: list[str] = []
    local: dict[tuple[str, str], str] = {}
    for v in sub.vertices:
        h = host_of.get(v, "")
        if not h:
            continue
        if not v.startswith(h + "."):
            return None
        if h not in order:
            order.append(h)
        local[(h, v[len(h) + 1:])] = v
    H = len(order)
    if H < 2 or any(not host_of.get(r, "") for r in ranks):
        return None
    names = {h: set() for h in order}
    for h, x in local:
        names[h].add(x)
    if any(names[h] != names[order[0]] for h in order):
        return None
    nxt = {h: order[(i + 1) % H] for i, h in enumerate(order)}
    sigma = {v: v for v in sub.vertices}
    for (h, x), v in local.items():
        sigma[v] = local[(nxt[h], x)]
    rank_set = set(ranks)
    if any(sigma[r] not in rank_set for r in ranks):
        return None
    cap: dict[tuple[str, str], float] = {}
    for l in sub.links:
        cap[(l.src, l.dst)] = cap.get((l.src, l.dst), 0.0) + l.capacity
    for (a, b), c in cap.items():
        if cap.get((sigma[a], sigma[b])) != c:
            return None
    return sigma, H
