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
readable reference) and :meth:`Indexed.closure_matrix` (Floyd-Warshall over the switches and
min-plus products in numpy), which the packer uses; tests check they agree.

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


def _minplus(x, y):
    """(min,+) matrix product, one row at a time (bounded memory)."""
    import numpy as np

    return np.stack([(x[i][:, None] + y).min(axis=0) for i in range(x.shape[0])]) if x.shape[0] else (
        np.zeros((0, y.shape[1])))


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

        Switch-to-switch distances come from Floyd-Warshall over the switches alone (with a
        next-hop table), then d = min(direct rank links, A (min,+) D (min,+) B) where A holds
        rank -> switch links and B switch -> rank links. O(S^3 + n^2 S) in numpy: 256 ranks
        and 24 switches take milliseconds where 256 Dijkstras in Python take about a second.
        """
        import numpy as np

        inf = np.inf
        n = len(self.ranks)
        sw = [v for v in range(len(self.vertices)) if self.is_switch[v]]
        spos = {v: k for k, v in enumerate(sw)}
        rpos = {v: j for j, v in enumerate(self.ranks)}
        m = len(sw)
        direct = np.full((n, n), inf)
        a = np.full((n, m), inf)
        b = np.full((m, n), inf)
        dsw = np.full((m, m), inf)
        cost = np.asarray(cost, dtype=float)
        for li, (u, v, _) in enumerate(self.links):
            c = cost[li]
            if u in rpos and v in rpos:
                direct[rpos[u], rpos[v]] = min(direct[rpos[u], rpos[v]], c)
            elif u in rpos and v in spos:
                a[rpos[u], spos[v]] = min(a[rpos[u], spos[v]], c)
            elif u in spos and v in rpos:
                b[spos[u], rpos[v]] = min(b[spos[u], rpos[v]], c)
            elif u in spos and v in spos:
                dsw[spos[u], spos[v]] = min(dsw[spos[u], spos[v]], c)
        nxt = np.where(np.isfinite(dsw), np.arange(m)[None, :], -1)
        if m:
            np.fill_diagonal(dsw, 0.0)
            np.fill_diagonal(nxt, np.arange(m))
        for k in range(m):
            via = dsw[:, k:k + 1] + dsw[k:k + 1, :]
            better = via < dsw
            dsw = np.where(better, via, dsw)
            nxt = np.where(better, nxt[:, k:k + 1], nxt)
        if m:
            ad = (a[:, :, None] + dsw[None, :, :]).min(axis=1) if n * m * m <= 4_000_000 else _minplus(a, dsw)
            via_sw = _minplus(ad, b)
        else:
            via_sw = np.full((n, n), inf)
        d = np.minimum(direct, via_sw)
        np.fill_diagonal(d, inf)

        def route(i: int, j: int) -> tuple[int, ...] | None:
            if not np.isfinite(d[i, j]):
                return None
            u, v = self.ranks[i], self.ranks[j]
            if direct[i, j] <= via_sw[i, j]:
                return (u, v)
            tot = a[i, :, None] + dsw + b[None, :, j]
            s, t = divmod(int(np.argmin(tot)), m)
            path = [u, sw[s]]
            while s != t:
                s = int(nxt[s, t])
                path.append(sw[s])
            path.append(v)
            return tuple(path)

        return d, route

    def link_of(self) -> dict[tuple[int, int], int]:
        return {(a, b): i for i, (a, b, _) in enumerate(self.links)}
