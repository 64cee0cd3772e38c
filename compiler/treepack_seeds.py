"""hcc.compiler.treepack_seeds — the first columns of a tree pack.

Column generation (treepack_master.py) converges faster, and at many ranks only reaches its
bound at all, when its master starts from good trees. Three families, all routed over the
fewest-hop widest switch paths:
- *ring chains* (:func:`_ring_columns`): per root, the path along a depth-first order of the
  ranks, in both directions. On a full-bisection fat tree they are optimal already.
- *shallow trees* (:func:`_shallow_columns`): per root, a Prim-like greedy that charges
  loaded links and deep parents, 3-5 levels deep on the 32-rank cluster.
- *binary trees* (:func:`_btree_columns`): NCCL's double-binary-tree shape, log2(n) deep.
"""
from __future__ import annotations

import numpy as np

from .switches import Indexed
from .treepack_master import _Col, _Pricer

# packs of more than _SHALLOW_MIN_RANKS and at most _SHALLOW_MAX_RANKS ranks seed their LP
# with greedy shallow trees (an O(n^3) construction), the others with ring chains. Measured
# (efficiency with chains -> with shallow seeds): 32-rank cluster allgather 0.488 -> 0.541,
# broadcast 0.283 -> 0.318; but on DGX-1 (8 ranks, where the LP and CP-SAT reshape the trees
# anyway) reduce_scatter 0.439 -> 0.373, so small packs keep the chains
_SHALLOW_MIN_RANKS = 16
_SHALLOW_MAX_RANKS = 64
# the greedy charges a parent's depth like this many uses of the widest link (16: the
# 32-rank cluster's seeds are 3-5 deep and give 0.541; 4 gave 0.535 and 1 gave 0.527)
_DEPTH_COST = 16.0


def _seed_columns(ix: Indexed, pricer: _Pricer, roots: list[int]) -> list[_Col]:
    """The first columns of a pack: greedy shallow trees (:func:`_shallow_columns`) for
    ``_SHALLOW_MIN_RANKS < n <= _SHALLOW_MAX_RANKS`` ranks, ring chains otherwise."""
    if _SHALLOW_MIN_RANKS < pricer.n <= _SHALLOW_MAX_RANKS:
        return _shallow_columns(ix, pricer, roots)
    return _ring_columns(ix, pricer, roots)


def _shallow_columns(ix: Indexed, pricer: _Pricer, roots: list[int]) -> list[_Col]:
    """Per root, a greedy shallow tree (Prim-like): repeatedly attach the rank whose route
    from a rank already in the tree is cheapest, pricing a route at ``sum (uses + 1) / c(e)``
    over its links (uses by this tree and by the seeds of earlier roots, so later roots
    avoid loaded links: every root of an allgather carries the same rate) plus
    ``_DEPTH_COST / max c`` per level of its parent. On the 32-rank cluster a root reaches its
    host's ranks through the NVSwitch and other hosts through several NICs, 3-5 levels deep
    (its ring chains were 31). Routes are the fewest-hop widest ones; prices only grow, so a
    stale heap entry is re-priced when popped."""
    import heapq

    n = pricer.n
    cap = pricer.cap
    _, route = pricer.matrix(1.0 / (cap / cap.max()) + 1e-3)
    link_of = pricer.link_of
    hop: list[list[tuple[tuple[int, ...], tuple[int, ...]] | None]] = [[None] * n for _ in range(n)]
    for u in range(n):
        for v in range(n):
            if u != v:
                path = route(u, v)
                if path is not None:
                    hop[u][v] = (tuple(path), tuple(link_of[(a, b)] for a, b in zip(path, path[1:])))
    load = np.zeros(len(cap))
    depth_cost = _DEPTH_COST / float(cap.max())
    cols = []
    for r in roots:
        depth = {r: 0}
        par, tp = [-1] * n, [()] * n
        use: dict[int, int] = {}
        heap: list[tuple[float, int, float, int, int, int]] = []
        seq = 0

        def price(u: int, v: int) -> tuple[float, int, float]:
            k = sum((load[e] + 1.0) / cap[e] for e in hop[u][v][1])
            return (k + depth_cost * depth[u], depth[u], k)

        def offer(u: int) -> None:
            nonlocal seq
            for v in range(n):
                if v not in depth and hop[u][v] is not None:
                    heapq.heappush(heap, (*price(u, v), seq, v, u))
                    seq += 1

        offer(r)
        while heap and len(depth) < n:
            *k, _, v, u = heapq.heappop(heap)
            if v in depth:
                continue
            k2 = price(u, v)
            if k2 > tuple(k):  # its links were loaded since this offer
                heapq.heappush(heap, (*k2, seq, v, u))
                seq += 1
                continue
            path, links = hop[u][v]
            depth[v], par[v], tp[v] = depth[u] + 1, u, path
            for e in links:
                load[e] += 1.0
                use[e] = use.get(e, 0) + 1
            offer(v)
        if len(depth) == n:
            cols.append(_Col(r, tuple(par), tuple(tp), tuple(sorted(use.items()))))
    return cols


def _ring_order(ix: Indexed) -> list[int]:
    """Rank positions in depth-first order over the undirected topology (ranks that share a
    switch or host end up adjacent, so a ring over them crosses few uplinks)."""
    nbr: dict[int, set[int]] = {}
    for a, b, _ in ix.links:
        nbr.setdefault(a, set()).add(b)
        nbr.setdefault(b, set()).add(a)
    pos = {v: j for j, v in enumerate(ix.ranks)}
    order, seen, stack = [], set(), [ix.ranks[0]]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u in pos:
            order.append(pos[u])
        stack.extend(sorted(nbr.get(u, ()), key=lambda v: (-(v in pos), -v)))
    order += [j for j in range(len(ix.ranks)) if j not in set(order)]
    return order


def _ring_columns(ix: Indexed, pricer: _Pricer, roots: list[int] | None = None) -> list[_Col]:
    """Per root, the chain along the ring order in each direction, each hop routed by the
    fewest-hop, widest switch-only path. The chain rooted at order[s] is the ring minus the
    hop into order[s], so each ring hop is routed once: O(n) routes, not O(n^2)."""
    n = pricer.n
    want = set(range(n) if roots is None else roots)
    _, route = pricer.matrix(1.0 / (pricer.cap / pricer.cap.max()) + 1e-3)
    cols = []
    for order in (_ring_order(ix), list(reversed(_ring_order(ix)))):
        hops = [route(order[i], order[(i + 1) % n]) for i in range(n)]
        if any(h is None for h in hops):
            continue
        hop_use = []
        total: dict[int, int] = {}
        for h in hops:
            u: dict[int, int] = {}
            for x, y in zip(h, h[1:]):
                li = pricer.link_of[(x, y)]
                u[li] = u.get(li, 0) + 1
                total[li] = total.get(li, 0) + 1
            hop_use.append(u)
        parent_of = {order[(i + 1) % n]: (order[i], hops[i], hop_use[i]) for i in range(n)}
        for s_ in range(n):
            r = order[s_]
            if r not in want:
                continue
            par, tp = [-1] * n, [()] * n
            for v, (u, h, _) in parent_of.items():
                if v != r:
                    par[v], tp[v] = u, h
            use = dict(total)
            for li, k in parent_of[r][2].items():
                use[li] -= k
            cols.append(_Col(r, tuple(par), tuple(tp), tuple(sorted((li, k) for li, k in use.items() if k))))
    return cols


def _btree_columns(ix: Indexed, pricer: _Pricer, roots: list[int]) -> list[_Col]:
    """Per root, the "lowest set bit" binary tree (NCCL's double-binary-tree shape) over the
    ring order rotated to start at the root, in both directions: position p > 0 hangs from
    (p xor b) | (b << 1), b the lowest set bit of p (p xor b when that is past the end), so
    a parent's children sit near it in the order (same host or rack) and the depth is
    log2(n): 10 levels for 1024 ranks where a chain has 1023."""
    n = pricer.n
    _, route = pricer.matrix(1.0 / (pricer.cap / pricer.cap.max()) + 1e-3)
    up = [-1] * n
    for q in range(1, n):
        b = q & -q
        up[q] = (q ^ b) | (b << 1) if ((q ^ b) | (b << 1)) < n else q ^ b
    cols = []
    for order in (_ring_order(ix), list(reversed(_ring_order(ix)))):
        where = {v: i for i, v in enumerate(order)}
        for r in roots:
            s = where[r]
            rot = order[s:] + order[:s]
            par, tp, use = [-1] * n, [()] * n, {}
            for q in range(1, n):
                a, v = rot[up[q]], rot[q]
                path = route(a, v)
                if path is None:
                    break
                par[v], tp[v] = a, path
                for x, y in zip(path, path[1:]):
                    li = pricer.link_of[(x, y)]
                    use[li] = use.get(li, 0) + 1
            else:
                cols.append(_Col(r, tuple(par), tuple(tp), tuple(sorted(use.items()))))
    return cols
