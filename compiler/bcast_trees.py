"""hcc.compiler.bcast_trees — topology-aware double binary trees for broadcast and reduce at scale.

The NCCL-like double binary tree (baselines.dbtree_plan) over a 1024-rank fat tree ran at
0.33 of the broadcast bound: its routes are one breadth-first path per rank pair, so every
cross-rack edge climbed to the same spine (seven 128 MiB tree edges on one 25 GB/s
leaf-spine link), and its chunk search stopped at 4 MiB, where the fill of the 11-level
trees alone is 7 ms of a 21.5 ms bound. This module builds the same family of trees with
the topology in view (algorithm ``treepack-dbt``, compiler/registry.py).

Terms
- complementary pair (:func:`dbt_pair`): two lowest-set-bit binary trees (routes.btree_parents)
  over the same positions, the second mirrored so that every position has children in at
  most one of them. Each carries half the data, so every rank sends at most the whole buffer
  (two children x half) and receives it once: the per-rank bound of a broadcast, with a fill
  of about two chunk times per level. (routes.btree_pair's shift for an odd count makes
  position 0 interior in both: 2 x the buffer out of one rank.)
- host order: the ranks grouped by host, hosts in order of their first rank, the root's host
  first: the trees' lower levels (positions that differ in the low bits) stay in one host.
- spread routes (:func:`spread`): each tree edge takes, among the shortest switch-only
  routes between its ranks, the one whose busiest link is least loaded so far (the ECMP a
  fat tree's spines give): one spine per cross-rack edge instead of one spine for all.
- lanes (hosts with several ports, e.g. a DGX-1 with four NICs): a *port* is a switch of a
  host with a link out of it; lane k is the k-th port of every host, its *gateway* the first
  rank of the host behind that port. Lane k carries 1/P of the data across hosts over a
  complementary pair of host-level trees between the lane's gateways, and inside each host
  the gateway forwards its share over a spanning tree chosen least-loaded first, of direct
  rank-to-rank links (NVLink) or, in a host without any, of routes through its own switches
  (an NVSwitch): every host's P ports each carry 1/P of the buffer in and out, which is the
  host cut's bound.

Lowering (:func:`lower_dbt`): chunks round-robin over the trees, as lower.lower's plain
order, with one addition: a rank posts the receive of a tree edge's chunk k only after that
edge's chunk k - :data:`WINDOW` arrived. Without it every receive is posted at time 0 and
the simulator (like a rendezvous runtime) orders a sender's ready messages by when their
receives were posted: the root then sent all of the first tree's chunks before the
second's, and the second tree started half a broadcast late (0.37 of the bound on a
16-rank two-rack fat tree at 4 MiB chunks, 0.81 with the window).

Chunk size (:func:`chunk_for`): at 1024 ranks the chunk search (compiler/chunks.py) stops
above 200 000 ops, at 2-4 MiB here, while the α-β optimum of these trees is about 0.5 MiB.
The builder therefore lowers at no more than that optimum, ``sqrt(S k c / F)`` for the
buffer's ``S`` bytes out of the busiest rank at ``k`` = α + per-message cost per message and
``F`` chunk times of fill (about three per level of the deeper tree), rounded down to a
multiple of 64 KiB; a chunk size the program sets is used as given.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any, Sequence

from ..ir.errors import PlanError
from ..ir.plan import DTYPE_SIZES, ChunkRef, Copy, Plan, Scale
from ..ir.topology import arc_tables
from .builder import ProgramBuilder, plan_op, split_by_rate
from .lower import assemble, chunk_elems
from .routes import Routes, btree_parents, routes
from .trees import PackedTree, TreeShape

__all__ = ["WINDOW", "chunk_for", "dbt_pair", "dbt_trees", "dbt_plan", "has_direct_links", "host_vertices",
           "lower_dbt", "spread", "spread_trees"]

# receives of one tree edge posted ahead of the data (module docstring): 2 keeps a sender of
# two children alternating between them without a gap; 1 left a gap of a message's latency
WINDOW = 2


def dbt_pair(m: int) -> tuple[list[int], list[int]]:
    """Parents (position -> position, -1 at the top) of two complementary binary trees over
    positions ``0..m-1``: no position has children in both (module docstring).

    >>> dbt_pair(4)
    ([-1, 2, 0, 2], [1, 3, 1, -1])
    >>> dbt_pair(5)
    ([4, 2, 4, 2, -1], [1, 3, 1, -1, 3])
    """
    p1 = _lift(btree_parents(m))
    even = m if m % 2 == 0 else m - 1  # the mirrored tree over an even count of positions
    sub = btree_parents(even)
    p2 = [-1] * m
    for q in range(even):  # position even-1-q of the mirror has q's parent, mirrored
        par = sub[q]
        p2[even - 1 - q] = -1 if par < 0 else even - 1 - par
    if even == m or m == 1:
        return p1, _lift(p2)
    # the last position (a leaf of tree 1, or its top's child) joins the mirror as a leaf:
    # under a position of one child in it after the lift, else under the mirror's top,
    # which has one child in an lsb tree over an even count (and none in tree 1)
    p2 = _lift(p2[:even]) + [-1]
    under = _one_child(p2[:even])
    p2[m - 1] = under if under is not None else p2.index(-1)
    return p1, p2


def _one_child(par: list[int]) -> int | None:
    """The shallowest position of ``par`` (a tree) with exactly one child (ties: the
    lowest), None if none."""
    kids: dict[int, int] = {}
    for p in par:
        if p >= 0:
            kids[p] = kids.get(p, 0) + 1
    depth: dict[int, int] = {}

    def d(q: int) -> int:
        if q not in depth:
            depth[q] = 0 if par[q] < 0 else d(par[q]) + 1
        return depth[q]

    single = [q for q, k in kids.items() if k == 1]
    return min(single, key=lambda q: (d(q), q)) if single else None


def _lift(par: list[int]) -> list[int]:
    """``par`` with a top of one child replaced by that child, the old top hung as a leaf
    under the shallowest other position of one child: one level less to fill (an lsb tree's
    top has one child; on 1023 positions 11 levels become 10), and no position gains a
    second tree to send in (the new parent already has a child in this tree)."""
    if len(par) < 3 or -1 not in par:
        return par
    top = par.index(-1)
    kids = [q for q, p in enumerate(par) if p == top]
    if len(kids) != 1:
        return par
    out = list(par)
    out[kids[0]] = -1
    out[top] = -1  # childless now, so never its own new parent
    under = _one_child(out)
    if under is None:
        return par
    out[top] = under
    return out


def spread(net: Routes, src: int, dst: int, share: float, load: dict) -> tuple[str, ...]:
    """The route from rank ``src`` to rank ``dst`` for ``share`` bytes (per byte of buffer):
    among the shortest switch-only routes (routes.Routes.shortest_routes; a direct link is
    the one shortest), the one whose busiest link, with ``share`` added, is least loaded
    relative to its capacity, then the next busiest (ties: the first found); ``load`` (arc
    -> bytes) is updated. No such route: routes.Routes.path (through other ranks)."""
    cands = net.shortest_routes(src, dst)
    if not cands:
        return net.path(src, dst)

    def worst(p):  # busiest link first, then the next: the rank's own links tie every route
        return sorted(((load.get(arc, 0.0) + share) / net.out[arc[0]][arc[1]] for arc in zip(p, p[1:])),
                      reverse=True)

    best = min(cands, key=worst)
    for arc in zip(best, best[1:]):
        load[arc] = load.get(arc, 0.0) + share
    return best


def _host_order(topo, ranks: Sequence[str], root: int) -> list[list[int]]:
    """Rank indices grouped by host (a rank outside any host is its own group), groups in
    order of their first rank, the root's group first with the root first in it."""
    groups: dict[str, list[int]] = {}
    hosts = dict(topo.hosts)
    for i, v in enumerate(ranks):
        groups.setdefault(hosts.get(v) or f"\0{v}", []).append(i)
    out = list(groups.values())
    k = next(i for i, g in enumerate(out) if root in g)
    first = out.pop(k)
    first.remove(root)
    return [[root] + first] + out


def _pair_edges(seq: Sequence[int], top: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(parent, child) edges of the complementary pair over ``seq``, both fed by ``top``."""
    p1, p2 = dbt_pair(len(seq))
    t1 = [(top, seq[q]) if p < 0 else (seq[p], seq[q]) for q, p in enumerate(p1)]
    t2 = [(top, seq[q]) if p < 0 else (seq[p], seq[q]) for q, p in enumerate(p2)]
    # parents before children: by depth in each tree
    return _by_depth(t1, top), _by_depth(t2, top)


def _by_depth(edges: list[tuple[int, int]], top: int) -> list[tuple[int, int]]:
    kids: dict[int, list[int]] = {}
    for p, c in edges:
        kids.setdefault(p, []).append(c)
    out, q = [], deque([top])
    while q:
        x = q.popleft()
        for c in kids.get(x, ()):
            out.append((x, c))
            q.append(c)
    if len(out) != len(edges):
        raise PlanError("double binary tree: edges do not form a tree")
    return out


def _ports(net: Routes, topo, group: Sequence[int]) -> list[tuple[str, list[int]]]:
    """A host's ports (switches of the host with a link out of it), by name, each with the
    ranks of ``group`` that reach it through the host's switches alone."""
    hosts = dict(topo.hosts)
    r = net.ranks
    host = hosts.get(r[group[0]])
    if not host:
        return []
    inside = {v for v, h in topo.hosts if h == host}
    ports = sorted(s for s in net.switches if s in inside and any(y not in inside for y in net.out.get(s, ())))
    out = []
    for p in ports:
        seen, q = {p}, deque([p])
        while q:
            x = q.popleft()
            for y in net.out.get(x, ()):
                if y in inside and y not in seen and (y in net.switches):
                    seen.add(y)
                    q.append(y)
        behind = [i for i in group if any(y in seen for y in net.out.get(r[i], ()))]
        out.append((p, behind))
    return out


def has_direct_links(net: Routes, group: Sequence[int]) -> bool:
    """Whether some rank of ``group`` (rank indices) has a link straight to another (NVLink),
    rather than reaching them only through switches (an NVSwitch)."""
    r = net.ranks
    return any(r[v] in net.out[r[u]] for u in group for v in group if u != v)


def _host_tree(net: Routes, inside: set, group: Sequence[int], top: int, share: float,
               load: dict, top_kids: int = 0, avoid=(), flat: bool = False) -> list[tuple[int, int, tuple[str, ...]]] | None:
    """A spanning tree of ``group`` (one host's ranks) from ``top``, grown least-loaded
    first (Prim over the busiest link's load / capacity with ``share`` added, then fewer
    hops). Its edges are direct rank-to-rank links where the host has any (NVLink: a route
    through a PCIe switch would load the links to the host's ports), else routes through
    the host's own switches (an NVSwitch; ``inside``: the host's vertices). None when they
    do not connect the group. ``top_kids``: at most that many children of ``top`` (0: any);
    ``avoid``: links taken only where no other will do (another route of the same data).
    ``flat``: through a host's switches, shallowest first (a star from ``top``): every hop
    through the switch is a message on two ports, and a chain queues each chunk behind the
    other trees' at every one. Edges parents first, each with its path."""
    r = net.ranks
    inset = set(group)
    direct = has_direct_links(net, group)
    depth = {top: 0}
    edges = []
    top_n = 0  # children of top so far

    def options(u: int, v: int):
        if direct:
            return [(r[u], r[v])] if r[v] in net.out[r[u]] else []
        return [p for p in net.shortest_routes(u, v) if all(x in inside for x in p)]

    while len(depth) < len(inset):
        best = None
        for u in depth:
            if top_kids and u == top and top_n >= top_kids:
                continue
            for v in group:
                if v in depth:
                    continue
                for p in options(u, v):
                    worst = max((load.get(arc, 0.0) + share) / net.out[arc[0]][arc[1]] for arc in zip(p, p[1:]))
                    miss = sum(1 for arc in zip(p, p[1:]) if arc in avoid)
                    key = (miss, depth[u], worst, u, v, p) if flat and not direct else (miss, worst, depth[u], u, v, p)
                    if best is None or key < best:
                        best = key
        if best is None:
            return None
        u, v, p = best[-3:]
        depth[v] = depth[u] + 1
        top_n += u == top
        for arc in zip(p, p[1:]):
            load[arc] = load.get(arc, 0.0) + share
        edges.append((u, v, p))
    return edges


def dbt_trees(topo, ranks: Sequence[str], root: int, inward: bool = False) -> list[PackedTree] | None:
    """The trees of ``treepack-dbt`` (module docstring): lanes where every host has the
    same number (>= 2) of ports with a rank behind each and direct links joining its ranks,
    else one complementary pair over the host order with spread routes. ``inward``: in-trees
    for reduce (data child -> parent; each edge's path is its data route reversed). None for
    fewer than 3 ranks."""
    n = len(ranks)
    if n < 3:
        return None
    net = routes(topo, ranks)
    groups = _host_order(topo, ranks, root)
    load: dict = {}
    path = _spreader(net, load, inward)
    lanes = _lanes(net, topo, groups)
    if lanes is not None:
        trees = _lane_trees(net, topo, groups, lanes, root, path, load)
        if trees is not None:
            return trees
        load.clear()
    seq = [i for g in groups for i in g][1:]
    return _spread_trees(ranks, root, _pair_edges(seq, root), path)


def spread_trees(topo, ranks: Sequence[str], root: int, edge_lists, inward: bool = False) -> list[PackedTree]:
    """One tree per list of (parent, child) rank-index edges, each carrying an equal share,
    every edge on a spread route (:func:`spread`; ``inward``: in-trees, as dbt_trees)."""
    return _spread_trees(ranks, root, edge_lists, _spreader(routes(topo, ranks), {}, inward))


def _spreader(net: Routes, load: dict, inward: bool):
    """``path(p, c, share)``: the route of the edge parent ``p`` -> child ``c`` carrying
    ``share``, spread over ``load`` (:func:`spread`; ``inward``: the route from ``c`` to
    ``p``, reversed, so every path runs parent to child)."""

    def path(p: int, c: int, share: float) -> tuple[str, ...]:
        if inward:
            return tuple(reversed(spread(net, c, p, share, load)))
        return spread(net, p, c, share, load)

    return path


def host_vertices(topo, ranks: Sequence[str], groups: Sequence[Sequence[int]]) -> list[set[str]]:
    """Per group of rank indices (one host's), the vertices of its host in ``topo.hosts``
    (its ranks and switches)."""
    host = dict(topo.hosts)
    return [{v for v, h in topo.hosts if h == host[ranks[g[0]]]} for g in groups]


def _spread_trees(ranks, root: int, edge_lists, path) -> list[PackedTree]:
    share = 1.0 / max(1, len(edge_lists))
    return [PackedTree(ranks[root], tuple((ranks[p], ranks[c], path(p, c, share)) for p, c in edges), share)
            for edges in edge_lists]


def _lane_trees(net: Routes, topo, groups: list[list[int]], lanes: list[list[int]], root: int,
                path, load: dict) -> list[PackedTree] | None:
    """Two trees per lane (module docstring), each carrying 1 / (2P) of the data: the root's
    host's tree from the root, then host by host down the lane's host-level tree, the edge
    into a host's gateway followed by that host's tree from it. None where a host's ranks
    are not joined inside it."""
    ranks = net.ranks
    inside = host_vertices(topo, ranks, groups)
    P = len(lanes[0])
    share = 1.0 / (2 * P)
    out = []
    for k in range(P):
        gws = [lanes[h][k] for h in range(len(groups))]
        inner = []
        for h, g in enumerate(groups):
            t = _host_tree(net, inside[h], g, root if h == 0 else gws[h], 2 * share, load)
            if t is None:
                return None
            inner.append(t)
        host_of = {gw: h for h, gw in enumerate(gws)}
        for edges in _pair_edges(gws[1:], gws[0]):
            es = [(ranks[p], ranks[c], pth) for p, c, pth in inner[0]]
            for p, c in edges:  # parents first: _pair_edges lists them by depth
                es.append((ranks[p], ranks[c], path(p, c, share)))
                es.extend((ranks[a], ranks[b], pth) for a, b, pth in inner[host_of[c]])
            out.append(PackedTree(ranks[root], tuple(es), share))
    return out


def _lanes(net: Routes, topo, groups: list[list[int]]) -> list[list[int]] | None:
    """Per host (group), the gateway rank of each lane, or None where lanes do not apply:
    one host, a host of one rank, hosts with different port counts, a port with no rank
    behind it, or fewer than 2 ports."""
    if len(groups) < 2 or any(len(g) < 2 for g in groups):
        return None
    out = []
    for g in groups:
        ports = _ports(net, topo, g)
        if len(ports) < 2 or any(not behind for _, behind in ports):
            return None
        out.append([behind[0] for _, behind in ports])
    if len({len(x) for x in out}) != 1:
        return None
    return out


def lower_dbt(spec: Any, topo, trees: Sequence[PackedTree], chunk_bytes: int,
              algorithm: str = "treepack-dbt", inside_window: int = 0) -> Plan:
    """Broadcast or reduce of ``spec`` over ``trees`` (out-trees, or in-trees for reduce),
    chunks round-robin over the trees, each tree edge's receives posted :data:`WINDOW`
    chunks ahead (module docstring); ``inside_window`` (0: the same) on the edges whose two
    ranks share a host (bcast_wide.wide_plan's paced lanes)."""
    kind = spec.kind
    if kind not in ("broadcast", "reduce"):
        raise PlanError(f"treepack-dbt has no form for {kind!r}")
    n = len(spec.ranks)
    ce = chunk_elems(chunk_bytes, spec.dtype)
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    shapes = [TreeShape.of(t, spec.ranks, i) for i, t in enumerate(trees)]
    for i, sh in enumerate(shapes):
        if sh.root != spec.root:
            raise PlanError(f"tree {i} is rooted at {spec.ranks[sh.root]}, not the {kind}'s root")
    spans = split_by_rate(0, E, [sh.rate for sh in shapes])
    B = ProgramBuilder(n)
    avg = plan_op(kind, spec.op) == "avg"
    # per tree, per rank: the receive ops of its edge to the parent (bcast) or of each
    # child's edge (reduce), chunk by chunk: the window's gates
    got: list[dict] = [dict() for _ in shapes]
    pieces = [[(a + q * ce, min(b, a + (q + 1) * ce)) for q in range(-(-(b - a) // ce))] for a, b in spans]
    host = dict(topo.hosts)
    names = spec.ranks

    def window(u: int, v: int) -> int:
        same = inside_window and host.get(names[u], names[u]) == host.get(names[v], names[v])
        return inside_window if same else WINDOW

    for k in range(max((len(p) for p in pieces), default=0)):
        for t, sh in enumerate(shapes):
            if k >= len(pieces[t]):
                continue
            a, b = pieces[t][k]
            out = ChunkRef("out", a, b - a)
            inref = ChunkRef("in", a, b - a)
            hist = got[t]
            if kind == "broadcast":
                B.add(sh.root, Copy(inref, out))
                have = {sh.root: ()}
                for r in sh.order:
                    for c in sh.children[r]:
                        prev = hist.setdefault(c, [])
                        w = window(r, c)
                        gate = (prev[k - w],) if k >= w else ()
                        _, rv = B.message(r, c, inref if r == sh.root else out, out, send_deps=have[r],
                                          recv_deps=gate, tree=t, chunk=k)
                        prev.append(rv)
                        have[c] = (rv,)
                continue
            ready: dict[int, tuple[ChunkRef, tuple[int, ...]]] = {}
            for r in reversed(sh.order):  # children before parents
                kids = sh.children[r]
                if not kids and r != sh.root:
                    ready[r] = (inref, ())
                    continue
                copy = B.add(r, Copy(inref, out))
                done = []
                for c in kids:
                    prev = hist.setdefault(c, [])
                    w = window(c, r)
                    gate = (copy, prev[k - w]) if k >= w else (copy,)
                    cref, cdeps = ready[c]
                    _, rr = B.message(c, r, cref, out, send_deps=cdeps, recv_deps=gate, reduce=True,
                                      tree=t, chunk=k)
                    prev.append(rr)
                    done.append(rr)
                ready[r] = (out, tuple(done) or (copy,))
            if avg and n > 1:
                B.add(sh.root, Scale(out, n, ready[sh.root][1]))
    return assemble(spec, topo, B, tuple(sh.to_tree(i, spans[i]) for i, sh in enumerate(shapes)),
                    algorithm, ce)


# the two trees' streams meet at every rank's link in, so a chunk crosses a level in about
# three chunk times rather than the two of its parent's sends: measured on the 1024-rank fat
# tree (23.78 ms at 448 KiB, 23.82 at 512, 24.07 at 640) and 64 DGX-1s (7.16 ms at 512 KiB,
# 7.67 at 1 MiB, 7.26 at 384)
FILL_PER_LEVEL = 1.5
# links within this factor of a route's narrowest set its per-message cost (chunk_for)
NARROW = 1.25


def chunk_for(spec: Any, topo, trees: Sequence[PackedTree], per_message_s: float) -> int:
    """The α-β optimal chunk of ``trees`` (module docstring) in bytes, a multiple of 64 KiB
    (at least that), at most the largest tree's share: ``sqrt(S k c / F)`` with ``S`` the
    busiest sender's bytes (its children's shares, relative to the capacity ``c`` of its
    slowest route), ``k`` the per-message cost (latency + per-message cost) of the narrowest
    links of its routes (:data:`NARROW`) and ``F`` the deepest tree's fill in chunk times, the children of every rank on its
    longest root-to-leaf path times :data:`FILL_PER_LEVEL`."""
    caps, lats = arc_tables(topo)
    sent: dict[str, float] = {}
    cost: dict[str, tuple[float, float]] = {}
    fill = 1
    for t in trees:
        kids: dict[str, list[str]] = {}
        for p, c, path in t.edges:
            src = c if spec.kind == "reduce" else p
            kids.setdefault(p, []).append(c)
            sent[src] = sent.get(src, 0.0) + t.rate * spec.size_bytes
            d = path[::-1] if spec.kind == "reduce" else path
            arcs = list(zip(d, d[1:]))
            c_min = min((caps.get(a, float("inf")) for a in arcs), default=float("inf"))
            # the per-message cost of the route's narrowest links (a fat tree's spine hops
            # are twice as wide and never busy; a DGX-1's EDR hop is as narrow as its PCIe)
            k = max((lats.get(a, 0.0) for a in arcs if caps.get(a, 0.0) <= NARROW * c_min), default=0.0) + per_message_s
            old = cost.get(src)
            cost[src] = (max(k, old[0]), min(c_min, old[1])) if old else (k, c_min)
        stack = [(t.root, kids.get(t.root, []).__len__())]
        while stack:
            v, f = stack.pop()
            fill = max(fill, f)
            for c in kids.get(v, ()):
                stack.append((c, f + len(kids.get(c, ()))))
    busiest = max(sent, key=lambda v: sent[v] / cost[v][1])
    S, (k, cap) = sent[busiest], cost[busiest]
    if not (cap < float("inf") and k > 0):
        return spec.size_bytes
    best = math.sqrt(S * k * cap / (fill * FILL_PER_LEVEL))
    top = max(t.rate for t in trees) / sum(t.rate for t in trees) * spec.size_bytes
    c = max(1, int(best) >> 16) << 16
    return int(min(c, max(top, DTYPE_SIZES[spec.dtype])))


def dbt_plan(spec: Any, topo, trees: Sequence[PackedTree], chunk_bytes: int, *, model=None) -> Plan:
    """``treepack-dbt``'s plan at ``chunk_bytes``, or at the trees' α-β optimal chunk where
    that is smaller and the program does not set the chunk (module docstring)."""
    from .cost import DEFAULT_MODEL

    if not getattr(spec, "chunk_bytes", 0):
        chunk_bytes = min(chunk_bytes, chunk_for(spec, topo, trees, (model or DEFAULT_MODEL).per_message_s))
    return lower_dbt(spec, topo, trees, chunk_bytes)


def trees_rate(topo, trees: Sequence[PackedTree], inward: bool = False, only=None) -> float:
    """Bytes/s of buffer the trees sustain when every tree carries its share (``rate``, a
    fraction of the buffer): the least over the links they cross of capacity / the shares
    crossing it (``inward``: data runs each path backwards; ``only``: over the links for
    which ``only(link)`` holds). The packing's rate of ``treepack-dbt``; the broadcast bound
    where no link carries more than its cut's share."""
    caps: dict[tuple[str, str], float] = {}
    for l in topo.links:
        if only is None or only(l):
            caps[(l.src, l.dst)] = caps.get((l.src, l.dst), 0.0) + l.capacity
    load: dict[tuple[str, str], float] = {}
    for t in trees:
        for _, _, path in t.edges:
            data = path[::-1] if inward else path
            for arc in zip(data, data[1:]):
                load[arc] = load.get(arc, 0.0) + t.rate
    return min((caps.get(a, 0.0) / x for a, x in load.items() if x > 0 and (only is None or a in caps)),
               default=0.0)
