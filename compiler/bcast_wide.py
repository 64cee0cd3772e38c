"""hcc.compiler.bcast_wide — broadcast and reduce over wide lane trees: one tree per port of a
multi-port host, each host interior with up to one child per port.

treepack-dbt (compiler/bcast_trees.py) gives each port of a host (a DGX-1's four NICs) a
complementary pair of binary trees over the hosts: the buffer's 1/P share crosses a port at
the cut's rate, but a binary interior sends each chunk twice through the same port, so a
chunk descends about two chunk times per host level, and 64 hosts are six levels deep: on
samples/dgx1x64.hcl the last chunk arrives 12 chunk times after the root sent it (0.785 of
the broadcast bound). This module keeps the lanes and the per-port shares and changes the
host-level shape (algorithm ``treepack-wide``, compiler/registry.py).

Terms
- port, lane, gateway: as bcast_trees.py (a *port* is a host's switch with a link out of the
  host; lane t is the t-th port of every host; its gateway the first rank behind it).
- slot: a (host, port) pair of a non-root host: one child edge of one tree leaves the host
  through that port. A tree carries 1/P of the buffer, so a port sends at most its cut share
  (1/P) when every slot is used once, which :func:`lane_layout` guarantees.
- lane tree t: enters every host through port t (so each port also receives 1/P); the root's
  host feeds its top through the root's port t. Its hosts are ordered interiors first, and the
  i-th host after the top hangs under the owner of the tree's (i-1)-th slot: a P-ary heap
  whose child edges leave an interior through different ports, in parallel. The slots of
  the H-1 non-root hosts are dealt to the P trees in runs of H-2 (each tree has H-2 edges
  below its top), so the trees' interiors are disjoint but for the hosts at a run's
  boundary, which split their ports between two trees. Where the fabric is several
  switches (*rails*: an A100 server's NIC i on InfiniBand switch i % 2), a port reaches only
  its rail's ports, and each tree takes its slots from the ports of its own rail.
- depth: host levels below the root's host: the top is level 1, and level k holds up to
  P^(k-1) hosts, so H hosts need the least D with 1 + P + ... + P^(D-1) >= H - 1; the
  layout takes that or one level more where a boundary host splits its ports (64 hosts,
  P = 4: 4 levels, against 6 binary levels of two chunk times each).
- relay route: a cross-host edge leaves from the rank where the tree's data enters the host
  (its gateway), through one or two of the host's direct links (NVLink) to a rank behind the
  edge's port, then that port's switch route: one message, cut-through, as NCCL's PXN sends
  through the GPU next to the NIC; the cost model prices it like any route through ranks
  (compiler/cost.py), each link at its share. Without it the chunk would first be stored at
  the rank behind the port and sent again: a whole NVLink chunk time more per level.

α-β arithmetic (64 DGX-1 hosts, 256 MiB, 1 us per message): every port carries S/4 = 64 MiB
through PCIe (12 GB/s, 2 us) and EDR (12.5 GB/s, 5 us), whose per-message holds are
c/12e9 + 3 us and c/12.5e9 + 6 us; the time is the busiest port link's hold over its N =
S/4/c chunks plus, per host level, one chunk over the route and its 19 us of latency (the
last port starts four levels after the root's): T(c) = max(S/4/12e9 + 3 us N, S/4/12.5e9 +
6 us N) + 4 (c/12e9 + 19 us), least at c = 880 KiB, 6.19 ms: 0.903 of the 5.59 ms bound.
The plan (896 KiB) simulates at 6.195 ms (0.903; reduce 6.205 ms, 0.901): the rest is the
spread inside the last host (reduce: the reduction inside the first; "In-host trees"). The binary pairs: 12 chunk times of fill, 0.83 at best, 0.785
as built. With each quarter leaving the root's host once and every host sending at most one
child edge per port, 63 hosts cannot be fewer than four levels deep (1 + 4 + 16 < 63), so
0.903 bounds this shape at any one chunk size. Chunk size: :func:`wide_chunk`.

In-host trees: every non-root host spreads (broadcast) or reduces (reduce: the same trees,
data child to parent) each tree's share over its own links, and the time that takes at
the hosts deepest in a tree is fill: a broadcast's last chunk spreads there after its four
levels, a reduce's first chunk, which every host starts at time 0, climbs four levels only
once they have reduced it. :func:`_in_trees` chooses a host's four in-host trees and the
NVLink hops of the relays out of it (into it, for reduce) together (CP-SAT, one solve per
kind of host: its links, gateways, slack and relay ports): a rank's data is ready one arc
time after its parent's (reduce: its children's), two on an arc two trees share (FIFO: one
waits for the other's chunk); the trees with the least slack (*slack*: host levels between
the host and the tree's deepest) finish first; no in-host tree takes a relay's NVLink (a
reduce's in-host streams run ahead of the relays, which then wait one in-host chunk on
that link at every level: 64 DGX-1s, 7.15 ms) nor do two relays share one. 64 DGX-1s: the
least-loaded trees (bcast_trees._host_tree) left 4-7-hop chains whose links two trees
shared, a reduce's leaves sending their first chunk after 122-142 us (6.27 ms); these send
it after 80 us (6.21 ms), and the broadcast's last host spreads its last chunk sooner
(6.214 -> 6.195 ms).

Chains (lane_layout's ``chains``, priced beside the heap for a few hosts, registry._pack_wide):
tree t runs through port t of hosts 1, 2, ... in turn. Every cross-host edge then leaves from
the rank behind its own port, with no relay through the host's switch, and with ``stars``
every non-root host spreads each tree as a star from its gateway. On 4 A100 servers (8 ports,
3 hosts past the root's) the heap is two host levels deep, but its relays crossed the gateways'
NVSwitch ports beside the stars' copies (one port 1.67 ms busy of 1.86); the chains are three
levels deep, 8 x 32 MiB lanes at 1 MiB chunks: 1.406 ms on each NIC (each message holds it
2 us of latency and per-message cost beside its bytes), 3 x 47 us of fill, a 38 us star in the last host and 38 us for the root to reach its 7 gateways,
1.63 ms simulated (0.826 of the bound; the heap 0.777).

Where relaying out of the root narrows its links (an NVSwitch host: :func:`wide_trees`), the
root's host stores each tree's data at the rank behind its port first: that rank is the
root's one child and spreads the tree over the host (:func:`_port_first`). Elsewhere the
in-host trees (bcast_trees._host_tree, least-loaded first) keep off the links the relays
take: a relay and a copy of the same chunk on one link queue one behind the other.

Paced lanes (broadcast from an NVSwitch host; registry._pack_wide prices them beside the
others): with :func:`wide_trees`' ``root_stars`` the rank behind each port spreads its lane
over the root's host as a star (the root's own lane: the least-loaded tree from the root),
and the other hosts spread theirs as stars from their gateways. Every rank of the root's host
but the root receives the whole buffer through its one switch port, and the root sends it
through its own, each message holding a port 2 us (latency and per-message cost) beside its
bytes: on two A100 servers at 1.25 MiB chunks either port is busy 1.31 ms of a 1.49 ms plan.
So the receives of an edge inside a host are posted one chunk ahead (lower_dbt
``inside_window``; two, as elsewhere, on a cross-host edge, whose three latencies would
leave a gap before each message), and a port's queue holds only the chunks its lanes need
next: the windowed plan over these trees 1.538 -> 1.494 ms (0.873 -> 0.899 of the bound).
The root reaches its eight lanes one after another, a chunk's hold on its port each, so the
last lane starts 45 us after the first and ends as late. :func:`_paced` lowers the trees
once more with each lane's share set from that plan's own completion times: its rate over
its first cross-host edge, from its start, so that the lanes end in the order they start,
half or one chunk's hold on the hosts' switch ports apart (:data:`PACED_STAGGER`: a lane's
last chunk then spreads through ports its neighbours have left; ended together, the eight
last chunks queued at every port of the last host), whichever simulates fastest. Two A100 servers at 256 MiB: 0.902 of the bound (the
timed schedule over the chains below each port: 0.893); four: 0.847 (0.826).
"""
from __future__ import annotations

from typing import Any, Sequence

from ..ir.plan import DTYPE_SIZES, Plan, Recv
from ..ir.topology import arc_tables
from .bcast_trees import (_host_order, _host_tree, _lanes, _ports, has_direct_links, host_vertices,
                          lower_dbt, trees_rate)
from .routes import Routes, routes
from .trees import PackedTree

# chunk sizes the α-β rule (wide_chunk) picks among: 64 KiB steps (a 512-rank plan's chunk
# search prices only a few powers of two, 512 KiB and 1 MiB, around its 880 KiB optimum)
CHUNK_STEP = 64 << 10

# up to this many ranks wide_plan also prices the lane trees under the timed schedule
# (lower.lower_priced: shares rebalanced by finish time, the last chunks in halves, a drain
# tree) and keeps the faster, and an NVSwitch root host feeds each lane's port rank first
# (:func:`_port_first`, which the windowed plan alone does not gain from: 4 x A100 broadcast
# 256 MiB 0.826 -> 0.747): 2 x A100 broadcast / reduce at 256 MiB 0.876 / 0.862 -> 0.893 /
# 0.903 of the bound. On 4 A100 servers (32 ranks) both together reached 0.829 / 0.848 from
# 0.826 / 0.812, for 3-4 x the compile (the reduce at 1 GiB 15 -> 37 CPU s), and are not taken
WIDE_TIMED_MAX_RANKS = 16

__all__ = ["CHUNK_STEP", "host_depth", "lane_layout", "wide_chunk", "wide_plan", "wide_trees"]


def lane_layout(hosts: int, ports: int, rails: Sequence[Sequence[int]] | None = None,
                chains: bool = False) -> list[list[tuple[int, int]]]:
    """Per lane tree, ``(parent host, port)`` of each host 1..hosts-1 in the tree's order
    (module docstring), the top's parent ``(0, t)``: a list of ``(host, (parent, port))``
    pairs, parents listed before their children. ``rails``: the port indices that reach
    each other (a fabric of several switches, as an A100 server's two InfiniBand rails):
    tree t takes its slots from the ports of t's rail only (default: one rail of all).
    ``chains``: tree t runs through every host's port t in turn, hosts 1, 2, ... (module
    docstring, "Chains").

    >>> [[(h, p) for h, p in t] for t in lane_layout(4, 2)]
    [[(1, (0, 0)), (2, (1, 0)), (3, (1, 1))], [(2, (0, 1)), (1, (2, 0)), (3, (2, 1))]]
    >>> [[p for _, p in t] for t in lane_layout(3, 2, [[0], [1]])]
    [[(0, 0), (1, 0)], [(0, 1), (1, 1)]]
    >>> lane_layout(4, 2, chains=True)[1]
    [(1, (0, 1)), (2, (1, 1)), (3, (2, 1))]
    """
    out: list[list[tuple[int, tuple[int, int]]]] = [[] for _ in range(ports)]
    m = hosts - 1
    if m < 1:
        return out
    if chains:
        return [[(h, (h - 1, t)) for h in range(1, hosts)] for t in range(ports)]
    per = m - 1
    for rail in rails if rails is not None else [list(range(ports))]:
        slots = [(h, k) for h in range(1, hosts) for k in rail]
        for i, t in enumerate(rail):
            run = slots[i * per:(i + 1) * per]
            count: dict[int, int] = {}
            for h, _ in run:
                count[h] = count.get(h, 0) + 1
            # the hosts with the most slots in this tree first: a boundary host with one
            # slot left as the top would give the tree one level more
            owners = sorted(count, key=lambda h: (-count[h], h))
            listing = [(h, k) for h in owners for hh, k in run if hh == h]
            order = owners + [h for h in range(1, hosts) if h not in count]
            out[t] = [(order[0], (0, t))] + [(order[j], listing[j - 1]) for j in range(1, len(order))]
    return out


def _rails(net: Routes, behind: Sequence[Sequence[Sequence[int]]]) -> list[list[int]]:
    """The port indices grouped by which reach each other through switches alone, read off
    two hosts (the last two: the root's may hold the root alone behind a port)."""
    a, b = behind[-2], behind[-1]
    rails: list[list[int]] = []
    for k in range(len(a)):
        for rail in rails:
            if net.shortest_routes(a[k][0], b[rail[0]][0]):
                rail.append(k)
                break
        else:
            rails.append([k])
    return rails


def _relay(net: Routes, src: int, port: str, behind: Sequence[int], dst: int, share: float, load: dict,
           inside: set, mine: dict) -> tuple[str, ...]:
    """The relay route (module docstring) from rank ``src`` to rank ``dst`` leaving through
    ``port`` (a switch), which ranks ``behind`` sit behind: a direct link, a route through
    the host's own switches, or two direct links through one rank, inside the host
    (``inside``), to one of them, then its shortest switch routes through ``port``; the
    least loaded by its busiest link with ``share`` added (then the next busiest, then fewer
    hops), after the fewest links inside the host that ``mine`` (arc -> count: this tree's
    routes out of this host so far) holds; ``load`` and ``mine`` are updated. In every host but
    the root's with direct GPU links, :func:`_joint_inner` later replaces the in-host head
    of the route picked here (its ``load`` moves with it)."""
    r = net.ranks
    heads: list[tuple[int, tuple[str, ...]]] = []  # (the rank it reaches, its vertices)
    for x in behind:
        a, b = r[src], r[x]
        if x == src:
            heads.append((x, (a,)))
            continue
        # a direct link, or the host's own switches (an NVSwitch), else through one rank
        heads += [(x, p) for p in net.shortest_routes(src, x) if all(v in inside for v in p)]
        if b not in net.out[a]:
            heads += [(x, (a, y, b)) for y in net.out[a] if y in inside and y not in net.switches
                      and b in net.out.get(y, ())]
    cands = []
    for x, head in heads:
        cands += [head + tail[1:] for tail in net.shortest_routes(x, dst) if port in tail]
    if not cands:
        raise ValueError("no relay route")

    def key(p):
        arcs = list(zip(p, p[1:]))
        hops = sorted(((load.get(a, 0.0) + share) / net.out[a[0]][a[1]] for a in arcs), reverse=True)
        # first, links inside the host that no other route of this tree out of it takes:
        # those routes carry the same chunk at the same instant, so on a shared link one
        # waits for the other's whole chunk, every level (64 DGX-1s: 117 us a level against
        # 96 where two relays shared one 25 GB/s NVLink); then links no route uses yet
        return (sum(mine.get(a, 0) for a in arcs), hops,
                sum(load.get(a, 0.0) / net.out[a[0]][a[1]] for a in arcs), len(p))

    best = min(cands, key=key)
    for arc in zip(best, best[1:]):
        load[arc] = load.get(arc, 0.0) + share
        if arc[0] in inside and arc[1] in inside:
            mine[arc] = mine.get(arc, 0) + 1
    return best


def wide_trees(topo, ranks: Sequence[str], root: int, inward: bool = False,
               stars: bool = False, chains: bool = False, root_stars: bool = False) -> list[PackedTree] | None:
    """The lane trees of ``treepack-wide`` (module docstring), each carrying 1/P of the data;
    None where lanes do not apply (bcast_trees._lanes: one host, hosts of different port
    counts, a port without a rank behind it), a host's ranks are not joined inside it, or a
    port has no relay route. ``inward``: in-trees for reduce, whose data runs each edge's
    path (parent to child, as every tree records it) backwards: the broadcast's routes over
    the same links the other way (None where a link has no way back).

    The root's rank is every tree's gateway, and a relay out of it does not deliver to the
    rank it passes through, which then needs a copy of its own: where that leaves the root's
    links narrower than the ports (an NVSwitch host: 7 relays and 8 trees' copies over one
    150 GB/s link, 80 of the 100 GB/s bound), the root's host sends each tree from the rank
    behind its port instead, stored there first, whichever sustains the higher rate.

    ``stars``: a host without direct links (an NVSwitch) that is a leaf of a tree, entered
    by no other tree's gateway, spreads that tree as a star from its gateway (the last chunk
    one switch hop from every rank, where the least-loaded trees are chains whose every hop
    queues behind the other trees' copies); the registry prices both ways
    (registry._pack_wide). None where every host but the root's has direct links (the stars
    would change nothing).

    ``chains``: the lane trees of lane_layout's ``chains`` (module docstring, "Chains").

    ``root_stars``: an NVSwitch root host feeds each lane's port rank first at any size,
    which spreads the lane as a star (:func:`_port_first`'s ``flat``; module docstring,
    "Paced lanes"); None where the root's host has direct links."""
    if len(ranks) < 3:
        return None
    net = routes(topo, ranks)
    groups = _host_order(topo, ranks, root)
    lanes = _lanes(net, topo, groups)
    if lanes is None or (stars and all(has_direct_links(net, g) for g in groups[1:])) \
            or (root_stars and has_direct_links(net, groups[0])):
        return None
    best = None
    solved: dict = {}  # _joint_inner's solves, shared by both ways of the root's host
    for relay_root in (True, False):
        if root_stars and relay_root:
            continue
        trees = _lane_trees(topo, ranks, root, inward, net, groups, lanes, relay_root, solved, stars, chains,
                            root_stars)
        if trees is None:
            continue
        rate = trees_rate(topo, trees, inward)
        if best is None or rate > best[0] * (1 + 1e-9):
            best = (rate, trees)
        if rate >= _ports_rate(topo, trees, inward) * (1 - 1e-9):
            break  # the ports bound it already
    return best[1] if best else None


def _ports_rate(topo, trees: Sequence[PackedTree], inward: bool) -> float:
    """:func:`bcast_trees.trees_rate` over the links between a host and the outside only."""
    host = dict(topo.hosts)
    return trees_rate(topo, trees, inward, only=lambda l: host.get(l.src) != host.get(l.dst))


def _lane_trees(topo, ranks, root: int, inward: bool, net: Routes, groups, lanes,
                relay_root: bool, solved: dict, stars: bool = False,
                chains: bool = False, root_stars: bool = False) -> list[PackedTree] | None:
    """:func:`wide_trees` with the root's host relaying (``relay_root``) or not."""
    r = net.ranks
    inside = host_vertices(topo, r, groups)
    ports = [_ports(net, topo, g) for g in groups]
    names = [[name for name, _ in x] for x in ports]
    behind = [[b for _, b in x] for x in ports]
    P = len(lanes[0])
    share = 1.0 / P
    load: dict = {}
    layouts = lane_layout(len(groups), P, _rails(net, behind), chains)
    gws = [[root] + [lanes[h][t] for h in range(1, len(groups))] for t in range(P)]
    kids: list[dict[int, list[tuple[int, tuple[str, ...]]]]] = [{} for _ in range(P)]
    mine: list[dict[int, dict]] = [{} for _ in range(P)]  # per tree, per host: its relays' links
    # every tree's cross-host routes first: they carry the fill; the trees inside the hosts
    # take what their links leave
    for t, layout in enumerate(layouts):
        gw = gws[t]
        for h, (par, k) in layout:
            # reduce runs the route backwards: the loads are the reversed arcs', which the
            # full-duplex links of every sample carry alike; the choice is the same
            src = gw[par] if relay_root or par else lanes[0][k]
            try:
                p = _relay(net, src, names[par][k], behind[par][k], gw[h], share, load, inside[par],
                           mine[t].setdefault(par, {}))
            except ValueError:
                return None
            kids[t].setdefault(src, []).append((gw[h], p))
    # every other host's trees: _joint_inner
    if not _joint_inner(net, topo, groups, inside, gws, layouts, mine, share, load, kids, solved, inward, stars):
        return None
    out = []
    for t in range(P):
        # the root's host: the root's rank is every tree's gateway: one child each leaves
        # its links to the routes out (64 DGX-1s: two children per tree put 4 x 12 GB/s on
        # each of its two 50 GB/s NVLinks, and the root's ports started 90-140 us late) and
        # away from the links every tree's relays take there, whose sends of one chunk are
        # all ready at one instant (an in-host copy queued there first held the root's
        # third port back 40 us)
        if (not relay_root and lanes[0][t] != root and (root_stars or len(ranks) <= WIDE_TIMED_MAX_RANKS)
                and not has_direct_links(net, groups[0])):
            inner = _port_first(net, inside[0], groups[0], root, lanes[0][t], share, load, flat=root_stars)
        else:
            inner = _host_tree(net, inside[0], groups[0], gws[t][0], share, load, top_kids=1,
                               avoid={a for m in mine for a in m.get(0, ())})
        if inner is None:
            return None
        for u, v, p in inner:
            kids[t].setdefault(u, []).append((v, p))
        edges, queue = [], [root]
        for x in queue:  # parents before children
            for v, p in kids[t].get(x, ()):
                if inward and any(a not in net.out.get(b, {}) for a, b in zip(p, p[1:])):
                    return None  # a one-way link: the reduce cannot run the route back
                edges.append((r[x], r[v], p))  # parent to child; reduce's data runs it back
                queue.append(v)
        if len(edges) != len(ranks) - 1:
            return None
        out.append(PackedTree(r[root], tuple(edges), share))
    return out


def _port_first(net: Routes, inside: set, group: Sequence[int], root: int, port: int, share: float,
                load: dict, flat: bool = False) -> list[tuple[int, int, tuple[str, ...]]] | None:
    """The root's host's part of the lane tree that leaves it from ``port``'s rank (not the
    root), the host without direct links (an NVSwitch): the root's one child is that rank,
    which spreads the tree to the rest (bcast_trees._host_tree, least-loaded first), so every
    port's first chunk is one switch hop from the root. The least-loaded tree from the root
    itself made all 8 trees of an A100 server one chain, whose port k started k hops late
    (2 x A100 broadcast 256 MiB, with WIDE_TIMED: 0.884 -> 0.893 of the bound, reduce 0.887
    -> 0.903; up to WIDE_TIMED_MAX_RANKS ranks). Edges parents first, each with its path;
    None where they do not connect."""
    way = next((p for p in net.shortest_routes(root, port) if all(x in inside for x in p)), None)
    rest = None if way is None else _host_tree(net, inside, [g for g in group if g != root], port, share, load,
                                               flat=flat)
    if rest is None:
        return None
    for arc in zip(way, way[1:]):
        load[arc] = load.get(arc, 0.0) + share
    return [(root, port, way)] + rest


def _levels(layout, hosts: int) -> list[int]:
    """Host level of every host in one lane tree (``lane_layout``'s form), the root's 0."""
    lv = [0] * hosts
    for h, (par, _) in layout:
        lv[h] = lv[par] + 1
    return lv


def _joint_inner(net: Routes, topo, groups, inside, gws, layouts, mine, share: float, load: dict,
                 kids, cache: dict, inward: bool, stars: bool = False) -> bool:
    """The in-host trees of every non-root host and the NVLink heads of the relays out of
    it (into it, for reduce: ``inward``) (module docstring, "In-host trees"): per host, :func:`_in_trees` over its direct links,
    the trees' slack from the lane ``layouts``, each relay's candidate heads from
    :func:`_heads`; solves shared by hosts alike (``cache``); hosts without direct links (an
    NVSwitch) take bcast_trees._host_tree's trees off their tree's relays (``mine``). Edges
    go to ``kids``, relays' new heads replace theirs there, and ``load`` follows."""
    r = net.ranks
    lat = arc_tables(topo)[1]
    H, P = len(groups), len(layouts)
    lv = [_levels(layouts[t], H) for t in range(P)]
    deep = [max(x) for x in lv]
    # one host level: a cross-host route's time for REF_CHUNK (its narrowest link and latencies)
    level = max((REF_CHUNK / min(net.out[a][b] for a, b in zip(p, p[1:]))
                 + sum(lat.get(arc, 0.0) for arc in zip(p, p[1:])) + 1e-6
                 for k in kids for es in k.values() for _, p in es), default=0.0)
    ports_of = [{name for name, _ in _ports(net, topo, g)} for g in groups]
    for h in range(1, H):
        g = groups[h]
        pos = {r[v]: i for i, v in enumerate(g)}
        # the relays whose in-host part is this host's: (tree, index in kids), the head's
        # ranks (gateway first) and, per candidate head, its ranks by position: the same
        # gateway to any rank of the host stepping onto the same first switch, in at most
        # two direct links (the heads _relay picks among)
        rel, cands = [], []
        for t in range(P):
            for i, (_, p) in enumerate(kids[t].get(gws[t][h], ())):
                j = 0
                while j + 1 < len(p) and p[j + 1] in pos:
                    j += 1
                heads = _heads(net, pos, p[0], p[j + 1])
                if tuple(p[:j + 1]) not in heads:
                    heads.append(tuple(p[:j + 1]))
                rel.append((t, i, j))
                cands.append(tuple(tuple(pos[v] for v in hd) for hd in heads))
        # _in_trees builds in-trees: a broadcast's out-tree is one over the links reversed
        links = tuple(sorted((pos[a], pos[b], net.out[a][b], lat.get((a, b), 0.0)) if inward else
                             (pos[b], pos[a], net.out[a][b], lat.get((a, b), 0.0))
                             for a in pos for b in net.out[a] if b in pos))
        # hosts alike in their links, gateways, slack and relays share one solve: the key
        # names ranks by their position in the host
        key = (links, tuple(g.index(gws[t][h]) for t in range(P)), tuple(deep[t] - lv[t][h] for t in range(P)),
               tuple(cands))
        if key not in cache:
            cache[key] = _in_trees(*key, level)
        sol = cache[key]
        if sol is None:  # no direct links: the least-loaded trees, off this tree's relays
            for t in range(P):
                # with ``stars``, a host spreads the tree as a star from its gateway where the
                # tree's relays out of it take none of its in-host links (a leaf host of the
                # tree, or a chain's, whose relays leave by the gateway's own port) and no
                # other tree enters by that gateway (wide_trees)
                flat = (stars and (all(par != h for _, (par, _) in layouts[t])
                                  or not any(b in net.switches and b not in ports_of[h]
                                             for _, b in mine[t].get(h, ())))
                        and sum(gws[x][h] == gws[t][h] for x in range(P)) == 1)
                inner = _host_tree(net, inside[h], g, gws[t][h], share, load, avoid=mine[t].get(h, {}), flat=flat)
                if inner is None:
                    return False
                for u, v, p in inner:
                    kids[t].setdefault(u, []).append((v, p))
            continue
        trees, picks = sol
        for (t, i, j), cs, c in zip(rel, cands, picks):
            child, p = kids[t][gws[t][h]][i]
            head = tuple(r[g[x]] for x in cs[c])
            for arc in zip(p[:j + 1], p[1:j + 1]):
                load[arc] -= share
            for arc in zip(head, head[1:]):
                load[arc] = load.get(arc, 0.0) + share
            kids[t][gws[t][h]][i] = (child, head + p[j + 1:])
        for t in range(P):
            for c, p in ((g[c], g[p]) for c, p in trees[t]):  # the edge parent -> child, as recorded
                load[(r[p], r[c])] = load.get((r[p], r[c]), 0.0) + share
                kids[t].setdefault(p, []).append((c, (r[p], r[c])))
    return True


def _heads(net: Routes, pos: dict, gw: str, switch: str) -> list[tuple[str, ...]]:
    """In-host heads of a relay from ``gw`` onto ``switch``: ranks of the host (``pos``)
    joined by direct links, at most two, ending at a rank with a link to ``switch``."""
    out = []
    for y in pos:
        if switch not in net.out[y]:
            continue
        if y == gw:
            out.append((gw,))
        elif y in net.out[gw]:
            out.append((gw, y))
        out += [(gw, z, y) for z in net.out[gw] if z in pos and z != y and y in net.out[z]]
    return sorted(out, key=lambda hd: (len(hd), hd))


# reference chunk for an arc's time in _in_trees (the chunks treepack-wide picks: 0.5-1 MiB)
REF_CHUNK = 1 << 20


def _in_trees(links, tops, slack, cands, level: float):
    """One host's in-host trees and relay heads (module docstring, "In-host trees"), its
    ranks named ``0..n-1`` (a broadcast's out-trees: in-trees over its links reversed): per tree, the (child, parent) arcs of an in-tree into
    ``tops[t]`` along the direct ``links`` ((src, dst, capacity, latency)), parents before
    children; per relay, the index of its head among its candidates (``cands``: rank
    sequences, the broadcast's direction). None where the host has no direct links. A
    rank's partial sum is complete one arc time (REF_CHUNK / capacity + latency + 1 us)
    after its children's, twice that on an arc two trees share; the objective, a weighted
    sum (``ub``: twice the arcs' summed times, in 0.1 us units): 8 P ub^2 per arc with a
    tree and a relay or two relays; 4 P ub per unit of the latest finish, a tree with
    ``slack[t]`` host levels of slack counted ``level`` seconds each earlier; 2 ub per arc
    two trees share; 1 per unit of every tree's finish. The weights lean to that order but
    do not enforce it: the latest finish spans up to ``ub`` (1 + the most slack) units, and
    more than 2 P shared arcs outweigh one unit of it."""
    from ortools.sat.python import cp_model

    if not links:
        return None
    group = sorted({a for a, *_ in links} | {b for _, b, *_ in links})
    arcs = [(a, b) for a, b, _, _ in links]
    q = 1e-7  # time unit: 0.1 us
    w = {(a, b): max(1, round((REF_CHUNK / c + l + 1e-6) / q)) for a, b, c, l in links}
    ub = 2 * sum(w.values())
    P = len(tops)
    m = cp_model.CpModel()
    x = {(t, a): m.NewBoolVar("") for t in range(P) for a in arcs if a[0] != tops[t]}
    C = {(t, v): m.NewIntVar(0, ub, "") for t in range(P) for v in group}
    # each relay's head: one candidate; its links in the data's direction (reversed)
    z = [[m.NewBoolVar("") for _ in cs] for cs in cands]
    for zs in z:
        m.AddExactlyOne(zs)
    on: dict = {a: [] for a in arcs}
    for cs, zs in zip(cands, z):
        for hd, zz in zip(cs, zs):
            for b, a in zip(hd, hd[1:]):
                on[(a, b)].append(zz)
    shared, with_relay, relays2 = [], [], []
    for a in arcs:
        uses = [x[t, a] for t in range(P) if (t, a) in x]
        sh, wr, rr = m.NewBoolVar(""), m.NewBoolVar(""), m.NewBoolVar("")
        m.Add(sum(uses) <= 1 + sh)  # two trees on it: each waits for the other's chunk
        m.Add(sum(on[a]) <= 1 + rr)  # two relays of one chunk, one behind the other
        for u in uses:  # a tree and a relay: the relay waits every chunk
            for zz in on[a]:
                m.AddBoolOr([u.Not(), zz.Not(), wr])
        shared.append(sh)
        with_relay.append(wr)
        relays2.append(rr)
        for t in range(P):
            if (t, a) in x:
                m.Add(C[t, a[1]] >= C[t, a[0]] + w[a] + w[a] * sh).OnlyEnforceIf(x[t, a])
    for t in range(P):
        for v in group:
            if v != tops[t]:
                m.AddExactlyOne(x[t, a] for a in arcs if a[0] == v)
    M = m.NewIntVar(-ub * max(slack), ub, "")
    lv = round(level / q)
    for t in range(P):  # a tree with k levels of slack may finish k levels later
        m.Add(M >= C[t, tops[t]] - slack[t] * lv)
    # weights, not a strict order: a tree-and-relay or two-relay arc 2 ub units of the latest
    # finish M; a unit of M 4 P ub (more than the trees' summed finishes, at most P ub, but
    # less than 2 P + 1 shared arcs); a shared arc 2 ub of the trees' summed finishes
    rest = sum(C[t, tops[t]] for t in range(P))
    big = 4 * P * ub
    m.Minimize((sum(with_relay) + sum(relays2)) * big * 2 * ub + M * big + rest + 2 * ub * sum(shared))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 1
    solver.parameters.max_deterministic_time = 2.0
    solver.parameters.cp_model_presolve = False
    st = solver.Solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    out = []
    for t in range(P):
        par = {a[0]: a[1] for a in arcs if (t, a) in x and solver.Value(x[t, a])}
        order, seen = [], {tops[t]}
        while len(seen) < len(group):  # parents before children
            for c, p in par.items():
                if p in seen and c not in seen:
                    seen.add(c)
                    order.append((c, p))
        out.append(order)
    return out, [next(c for c, zz in enumerate(zs) if solver.Value(zz)) for zs in z]


def host_depth(topo, trees: Sequence[PackedTree]) -> int:
    """The most cross-host edges on any root-to-rank path of ``trees`` (hosts from
    ``topo.hosts``; a rank outside every host is its own host)."""
    host = dict(topo.hosts)
    best = 0
    for t in trees:
        parent = {c: p for p, c, _ in t.edges}
        memo: dict[str, int] = {t.root: 0}

        def d(v: str) -> int:
            chain = []
            while v not in memo:
                chain.append(v)
                v = parent[v]
            for x in reversed(chain):
                p = parent[x]
                memo[x] = memo[p] + (host.get(x, x) != host.get(p, p))
            return memo[chain[0]] if chain else memo[v]

        best = max(best, max((d(c) for _, c, _ in t.edges), default=0))
    return best


def wide_chunk(spec: Any, topo, trees: Sequence[PackedTree], per_message_s: float,
               inside: bool = False) -> int:
    """The chunk, a multiple of :data:`CHUNK_STEP` (at least that, at most a tree's share),
    that minimises the α-β time of the lane trees (module docstring): a port's ``S`` bytes
    (a tree's share) held on the busiest link of the cross-host routes, ``S / c(e) + (S /
    chunk) (α(e) + per-message cost)``, plus ``D`` host levels (:func:`host_depth`) of one
    chunk over the narrowest link of a route and its latencies. 64 DGX-1s at 256 MiB: 880
    KiB, 0.903 of the bound at best (880 KiB -> 896 KiB; the simulation: 0.903).

    ``inside``: the busiest link over every link the trees load, in-host ones too, each with
    the bytes all trees put on it. A fast switch port's hold (2 us at 300 GB/s, 600 KB's
    worth) outweighs its bytes at the chunks the 25 GB/s NICs alone want: 4 A100 servers at
    896 KiB kept every NVSwitch port busier than the cut's links (0.722 of the bound; 1 MiB
    by this rule, 0.777); on 64 DGX-1s it asks 1.2 MiB, where 896 KiB simulates faster
    (:func:`wide_plan` prices both)."""
    caps, lats = arc_tables(topo)
    host = dict(topo.hosts)
    total = sum(t.rate for t in trees)
    S = max(t.rate for t in trees) / total * spec.size_bytes
    load: dict = {}  # arc -> bytes the trees put on it (the cross-host routes' only, unless inside)
    levels: set[tuple[float, float]] = set()  # (narrowest capacity, latency) of a route
    for t in trees:
        for p, c, path in t.edges:
            arcs = list(zip(path, path[1:]))
            cross = host.get(p, p) != host.get(c, c)
            if cross:
                levels.add((min(caps[a] for a in arcs), sum(lats[a] for a in arcs) + per_message_s))
            if cross or inside:
                for a in arcs:
                    load[a] = load.get(a, 0.0) + (t.rate / total * spec.size_bytes if inside else S)
    if not levels:
        return spec.size_bytes
    links = {(b, caps[a], lats[a] + per_message_s) for a, b in load.items()}
    D = host_depth(topo, trees)

    def time(chunk: float) -> float:
        busy = max(b / cap + b / chunk * hold for b, cap, hold in links)
        return busy + D * max(chunk / cap + lat for cap, lat in levels)

    top = max(CHUNK_STEP, int(S) // CHUNK_STEP * CHUNK_STEP)
    best = min(range(CHUNK_STEP, top + 1, CHUNK_STEP), key=time)
    return int(min(best, max(S, DTYPE_SIZES[spec.dtype])))


def wide_plan(spec: Any, topo, trees: Sequence[PackedTree], chunk_bytes: int, *, model=None) -> Plan:
    """``treepack-wide``'s plan: the lane trees lowered as treepack-dbt's (receives windowed,
    bcast_trees.lower_dbt) at ``chunk_bytes``, or, where the program does not set the chunk,
    at no more than :func:`wide_chunk`'s, by the cross-host routes' links alone or by every
    link the trees load (``inside``); also paced (:func:`_paced`) where a host's edges cross
    its switch, and up to :data:`WIDE_TIMED_MAX_RANKS` ranks under the timed schedule, at
    those sizes; whichever simulates fastest."""
    from .cost import DEFAULT_MODEL, simulate

    from .lower import lower_priced

    model = model or DEFAULT_MODEL
    if getattr(spec, "chunk_bytes", 0):
        caps = [chunk_bytes]
    else:
        caps = sorted({min(chunk_bytes, wide_chunk(spec, topo, trees, model.per_message_s, inside=x))
                       for x in (False, True)})
    plans = [lower_dbt(spec, topo, trees, c, algorithm="treepack-wide") for c in caps]
    paced = [x for c in caps for x in _paced(spec, topo, trees, c, model)]
    if len(spec.ranks) > WIDE_TIMED_MAX_RANKS:
        if len(plans) == 1 and not paced:
            return plans[0]
        return min([(p, simulate(p, model=model).time) for p in plans] + paced, key=lambda x: x[1])[0]
    priced = [(p, simulate(p, model=model).time) for p in plans] + paced
    priced += [(p, sim.time) for p, sim in (lower_priced(spec, topo, trees, c, algorithm="treepack-wide",
                                                         model=model) for c in caps)]
    return min(priced, key=lambda x: x[1])[0]


# paced lanes (module docstring): the lanes' shares set so that they end in the order they
# start, this many times one chunk's hold on the narrowest link inside the hosts apart,
# each one more plan (0, all together, was never the fastest on two or four A100 servers)
PACED_STAGGER = (0.5, 1.0)


def _paced(spec: Any, topo, trees: Sequence[PackedTree], chunk_bytes: int, model) -> list[tuple[Plan, float]]:
    """The lane trees with the receives of an in-host edge posted one chunk ahead (lower_dbt
    ``inside_window``) and, for a broadcast over wide_trees' ``root_stars``, lowered again
    with the lanes' shares set from that plan's completion times (module docstring, "Paced
    lanes"): ``(plan, simulated time)`` of each; none where no tree edge inside a host
    crosses a switch (an NVSwitch) or none leaves a host."""
    from .cost import completion_times, simulate

    host = dict(topo.hosts)
    caps, lats = arc_tables(topo)
    top = host.get(spec.ranks[spec.root])
    root = spec.ranks[spec.root]
    inner = [path for t in trees for p, c, path in t.edges if host.get(p) == host.get(c) and len(path) > 2]
    if not inner or not any(host.get(p) != host.get(c) for t in trees for p, c, _ in t.edges):
        return []
    plan = lower_dbt(spec, topo, trees, chunk_bytes, algorithm="treepack-wide", inside_window=1)
    out = [(plan, simulate(plan, model=model).time)]

    def starred(t: PackedTree) -> bool:  # wide_trees' ``root_stars``, or the root's own lane
        mine = [(p, c) for p, c, _ in t.edges if host.get(p) == top == host.get(c)]
        if any(p == root and host.get(c) != top for p, c, _ in t.edges):
            return True
        kids = [c for p, c in mine if p == root]
        return len(kids) == 1 and all(p in (root, kids[0]) for p, _ in mine)

    if spec.kind != "broadcast" or not all(starred(t) for t in trees):
        return out
    got = completion_times(plan, model)
    if got is None:
        return out
    done, base = got
    itemsize = DTYPE_SIZES[spec.dtype]
    # per tree: when each message of its first cross-host edges arrived, and its bytes
    seen: dict[int, list[tuple[float, int]]] = {}
    for r, prog in enumerate(plan.programs):
        if host.get(spec.ranks[r]) == top:
            continue
        for i, op in enumerate(prog):
            if isinstance(op, Recv) and op.tree >= 0 and host.get(spec.ranks[op.peer]) == top:
                seen.setdefault(op.tree, []).append((done[base[r] + i], op.dst.count * itemsize))
    if len(seen) != len(trees) or any(len(v) < 2 for v in seen.values()):
        return out
    # each tree's rate over its first edges (from its first message's arrival to its last's)
    # and its start; the shares that end them staggered in start order
    weight = [t.rate for t in trees]
    rate, start = [], []
    for j in range(len(trees)):
        arr = sorted(seen[j])
        rate.append(sum(b for _, b in arr[1:]) / max(arr[-1][0] - arr[0][0], 1e-12))
        start.append(arr[0][0])
    total = spec.size_bytes
    hold = max(chunk_bytes / caps[a] + lats[a] + model.per_message_s for p in inner for a in zip(p, p[1:]))
    order = {j: i for i, j in enumerate(sorted(range(len(trees)), key=lambda j: start[j]))}
    mid = (len(trees) - 1) / 2
    for frac in PACED_STAGGER:
        off = [frac * hold * (order[j] - mid) for j in range(len(trees))]
        end = (total + sum(r * (s - o) for r, s, o in zip(rate, start, off))) / sum(rate)
        share = [r * (end + o - s) for r, s, o in zip(rate, start, off)]
        if min(share) <= 0:  # a lane that would start after the others end: not this stagger
            continue
        scale = sum(weight) / sum(share)
        moved = [PackedTree(t.root, t.edges, x * scale) for t, x in zip(trees, share)]
        p = lower_dbt(spec, topo, moved, chunk_bytes, algorithm="treepack-wide", inside_window=1)
        out.append((p, simulate(p, model=model).time))
    return out
