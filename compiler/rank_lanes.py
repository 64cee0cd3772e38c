"""hcc.compiler.rank_lanes — broadcast (and reduce) lanes over hosts whose ranks each have a link
of their own onto the fabric (an MI250 node's GCDs, each with its NIC on the InfiniBand
switch), as one more packing of ``treepack`` (packing_choice.faster_broadcast_packing).

Terms
- host: the ranks :meth:`Topology.host_of` names alike; the hosts must be two or more, of P
  ranks each, and a rank's *position* is its place among its host's ranks in the collective's
  order.
- lane t (t < P): the ranks at position t of every host, chained from the root's host through
  the others in name order, each hop one route through switches outside every host (the
  fabric: no host-internal switch, so an A100 server's NICs behind its own switches are not
  lanes here; compiler/bcast_wide.py lays those out).
- lane tree: one spanning tree per lane piece: over the root's host one of its own broadcast
  trees from the root (treepack over the host's links alone), then the lane's fabric hops,
  then over every other host one of its allgather trees from the lane's rank there (the
  shallow allgather packing of the host's links alone), each lane carrying 1/P of the rate.

Why. Broadcasting from one MI250 GCD to two nodes, every byte must cross the sixteen 16 GB/s
NICs of the root's node (256 GB/s, the cut), so each NIC carries 1/16 of the buffer, and the
other node's GCDs receive 15/16 of it over their xGMI mesh from each other. The tree packing
over all 32 GCDs reaches that rate with 63 trees 9-25 levels deep through both meshes and
both NIC layers, and schedules at 0.638 / 0.766 of the bound at 256 MiB / 1 GiB. Lane trees
at the same rate cross the fabric once each, right after the root's host has brought the
lane's gateway its data: each lane takes the root-host trees in which its gateway is
shallowest (a greedy transport of the lanes' shares onto the trees' weights).

Rate: the trees are within every link's capacity at R = min(the broadcast bound, the root's
host's broadcast rate, P x each other host's allgather rate per root, P x each fabric link's
capacity over the lanes that cross it), the bound wherever the fabric cut binds (both MI250
nodes). In-trees for reduce are the
out-trees of the transposed topology (:meth:`Topology.transposed`).
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

from ..ir.topology import Topology
from .trees import PackedTree, tree_levels

__all__ = ["host_groups", "rank_lane_trees"]


def host_groups(topo: Topology, ranks: Sequence[str], root: str) -> list[list[str]] | None:
    """The ranks by host, the root's host first and the others by name, each in the
    collective's order; None unless every rank is on a host and there are two or more hosts
    of one size."""
    by: dict[str, list[str]] = {}
    for r in ranks:
        h = topo.host_of(r)
        if not h:
            return None
        by.setdefault(h, []).append(r)
    if len(by) < 2 or len({len(v) for v in by.values()}) != 1:
        return None
    first = topo.host_of(root)
    return [by[first]] + [by[h] for h in sorted(by) if h != first]


def _fabric_route(out: dict, fabric: set, src: str, dst: str) -> tuple[str, ...] | None:
    """The fewest-hop route ``src`` -> fabric switches -> ``dst``, or None."""
    prev: dict[str, str | None] = {src: None}
    q = deque([src])
    while q:
        x = q.popleft()
        for y in out.get(x, ()):
            if y in prev or (y != dst and y not in fabric):
                continue
            prev[y] = x
            if y == dst:
                path = [y]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return tuple(reversed(path))
            q.append(y)
    return None


def _inside(topo: Topology, group: Sequence[str]) -> Topology:
    """One host alone: its ranks, its own switches and the links among them."""
    host = topo.host_of(group[0])
    keep = set(group) | {s for s in topo.switches if topo.host_of(s) == host}
    return Topology(topo.name, tuple(r for r in group), tuple(s for s in topo.switches if s in keep),
                    tuple(l for l in topo.links if l.src in keep and l.dst in keep),
                    tuple((v, h) for v, h in topo.hosts if v in keep))


def _transport(rows: Sequence[float], cols: Sequence[float], cost) -> list[tuple[int, int, float]]:
    """A greedy transport of ``rows``' amounts onto ``cols``' (equal totals): the cheapest
    (row, col) pairs first, by ``cost(row, col)``; ``[(row, col, amount)]``."""
    left_r, left_c = list(rows), list(cols)
    out = []
    for _, i, j in sorted((cost(i, j), i, j) for i in range(len(rows)) for j in range(len(cols))):
        x = min(left_r[i], left_c[j])
        if x > 1e-12:
            out.append((i, j, x))
            left_r[i] -= x
            left_c[j] -= x
    return out


def _weighted(trees: Sequence[PackedTree]) -> list[tuple[PackedTree, float]]:
    total = sum(t.rate for t in trees)
    return [(t, t.rate / total) for t in trees]


def rank_lane_trees(topo: Topology, ranks: Sequence[str], root: str, bound: float) -> list[PackedTree] | None:
    """The lane trees (module docstring) from ``root``, their rates summing to R (at most
    ``bound``, the broadcast bound); None where the ranks are not on two or more hosts of one
    size, a lane rank has no route over the fabric to the next, or a host's own links do not
    join its ranks."""
    from . import treepack
    from .treepack_master import PackError

    hosts = host_groups(topo, ranks, root)
    if hosts is None:
        return None
    g = topo.restricted(tuple(ranks)).graph()
    out = {u: list(g.successors(u)) for u in g.nodes}
    cap = {(u, v): d["capacity"] for u, v, d in g.edges(data=True)}
    fabric = {s for s in topo.switches if not topo.host_of(s)}
    P = len(hosts[0])
    routes = []  # per lane, its fabric hops host to host
    for t in range(P):
        hops = []
        for a, b in zip(hosts, hosts[1:]):
            path = _fabric_route(out, fabric, a[t], b[t])
            if path is None:
                return None
            hops.append(path)
        routes.append(hops)
    try:
        first = treepack.pack_broadcast(_inside(topo, hosts[0]), tuple(hosts[0]), root)
        spread = [treepack.pack_allgather(_inside(topo, h), tuple(h)) for h in hosts[1:]]
    except PackError:
        return None
    # the rate every part carries: R / P per lane over every hop (a fabric link its lanes'
    # shares together), R over the root's host, R / P per root over the other hosts
    lanes_on: dict[tuple[str, str], int] = {}
    for hops in routes:
        for path in hops:
            for arc in zip(path, path[1:]):
                lanes_on[arc] = lanes_on.get(arc, 0) + 1
    rate = min(bound, first.rate, *(P * p.rate for p in spread), *(P * cap[a] / k for a, k in lanes_on.items()))
    if not rate > 0:
        return None
    per_root = [{} for _ in spread]
    for mine, p in zip(per_root, spread):
        for tr in p.trees:
            mine.setdefault(tr.root, []).append(tr)
    firsts = _weighted(first.trees)
    levels = [tree_levels(t) for t, _ in firsts]
    pieces = _transport([1.0 / P] * P, [w for _, w in firsts], lambda t, i: levels[i][hosts[0][t]])
    out_trees = []
    for t in range(P):
        # lane t's pieces of the root's host trees (weights summing to 1), each then split
        # over the next host's trees from the lane's rank there, and so on
        parts = [(list(firsts[i][0].edges), x * P) for lane, i, x in pieces if lane == t]
        for (path, h), mine in zip(zip(routes[t], hosts[1:]), per_root):
            below = _weighted(mine[h[t]])
            hop = (path[0], path[-1], path)
            split = _transport([w for _, w in parts], [w for _, w in below], lambda a, b: 0)
            parts = [(parts[a][0] + [hop] + list(below[b][0].edges), y) for a, b, y in split]
        out_trees += [PackedTree(root=root, edges=tuple(e), rate=rate / P * w) for e, w in parts]
    return out_trees
