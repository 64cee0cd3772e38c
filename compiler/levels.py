"""hcc.compiler.levels — two-level (hierarchical) allgather, reduce-scatter and allreduce over
groups of ranks behind one host or rack.

Terms
- group: the ranks one host or rack holds, found from the topology alone
  (:func:`rank_groups`): the connected parts left when the vertices farthest from every rank
  (the fabric's core switches: a fat tree's spines, the switch joining a cluster's NICs) are
  taken away. Every group's routes to the rest of the world leave through the links cut
  there. A two-level plan needs at least two groups of one size, at least two ranks each,
  whose ranks are numbered group by group.
- member index: a rank's place in its group (groups list their ranks in rank order), the
  same for every group; the *intra ring* is a ring order of the member indices (routes.py's
  ring over group 0, NVLink first).
- group range ``R_g``: the elements of ``out`` that group ``g``'s ranks own in an allgather,
  one contiguous range because the group's ranks are numbered consecutively.
- lane: a member index whose rank in every group carries a share of each group range to the
  same member of every other group, over routes spread across the fabric's parallel links
  (:func:`_switch_routes`). *Full* lanes (every member a lane, each carrying whole group
  ranges) fit where each rank's own link is what binds, as in a fat tree whose racks have
  full bisection; *split* lanes (one per distinct exit from the group, e.g. a NIC, each
  carrying ``1/L`` of every range) fit where the group's exits bind, as on DGX-1 hosts behind
  four NICs (:func:`plan_levels`).
- lane form: a *star* (the lane rank of each group sends its share straight to every other
  group's, no message waiting for another's forwarding, paced by :data:`LANE_WINDOW`) or a
  *ring of groups* ``0 -> 1 -> ... -> G-1 -> 0`` (each lane rank forwards what it received,
  which keeps the lanes in step). Neither wins everywhere: the star on 64 DGX-1s (allgather
  5.94 against 6.1 ms), the ring on the 1024-rank fat tree (23.0 against 25.9 ms) and on
  samples/cluster.hcl; the default is the star for split lanes and the ring for full ones,
  and up to :data:`BOTH_FORMS_MAX_RANKS` ranks both are priced (:func:`levels_priced`).
- transfer: ``(src, dst, a, b, tree)``: ``dst`` receives ``out[a:b)`` from ``src``, which holds
  it then; the allgather is a list of transfers in which every rank receives every element
  it does not own exactly once (:func:`_transfers`): the intra-group ring allgather (phase
  A), the lanes (phase B) and, for split lanes, each lane rank forwarding what it received to
  the rest of its group along the intra ring both ways (phase C). Reversed in time, the same
  transfers are a reduce-scatter (each element's tree walked leaves to root), and an
  allreduce is that reduce-scatter followed by the allgather (:func:`levels_plan`).

- packed form (:func:`plan_packed`): where every member of a group has an exit of its own
  (each A100 GPU's or MI250 GCD's NIC), the lanes carry each rank's own block straight to
  the same member of every other group, and inside each group every member forwards its
  *bundle* (its block and the ones its lane brought in) over the group's own allgather tree
  packing, not the intra ring: on an MI250 node the ring used one ring's worth of the xGMI
  mesh (2 x MI250 allgather 256 MB: 0.27 of the bound as a ring, 0.83 packed). Its
  reduce-scatter is the same transfers reversed, paced per rank, peer and tree
  (:data:`RS_PACKED_WINDOW`); its allreduce reduces chunks in the order its allgather sends
  them. Priced beside the ring forms up to :data:`BOTH_FORMS_MAX_RANKS` ranks.

Every message carries at most one chunk, so a plan has about ``n x (m + G x chunks per share)``
messages: few large ones, where a flat ring or tree packing over ``n`` ranks sends one per rank
block per chunk (BENCHMARKS.md, "What the schedules lose here").
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Sequence

from ..ir.errors import PlanError
from ..ir.plan import DTYPE_SIZES, ChunkRef, Copy, Plan, Scale, Tree, block_range
from ..ir.topology import Topology
from .builder import Spans, split_by_rate
from .lower import ProgramBuilder, assemble, chunk_elems, plan_op
from .routes import pieces, ring_order
from .schedule import _tail_halved

__all__ = ["Levels", "levels_forms", "levels_plan", "levels_priced", "plan_levels", "plan_packed", "rank_groups"]

LEVEL_KINDS = frozenset({"allgather", "reduce_scatter", "allreduce"})
# a lane rank's send waits for its receive this many lane messages earlier: every lane message
# is ready at once (a star), and the simulator's links serve what is ready in FIFO order, so
# without it the first sources' messages queued ahead of everyone's on every receiving link
# (DGX-1 x 64 allgather, 512 KiB: 9.1 ms against a bound of 5.5 ms; a ring of groups instead
# waits a whole path latency per step, 6.2 ms)
LANE_WINDOW = 2
# in the reduce-scatter, a rank's group-internal send waits for its own send this many before
# it: reversed, the far end of every chain has all its sends ready at once, and queued ahead
# on its links they held the partial sums the lanes wait for back (DGX-1 x 64 reduce-scatter
# at 1 MiB: first lane message at 1.5 ms, 7.25 ms in all; 5.84 ms with 4, 8.8 with 2)
RS_SEND_WINDOW = 4
# the packed form's lane window past two groups (4 x A100 allgather 256 MB at 2 MiB: 0.817
# with 1, 0.799 with 2, 0.751 with 3; allreduce 0.859 / 0.849); with two, LANE_WINDOW
# (2 x MI250 allgather: 0.820 with 2, 0.800 with 1)
PACKED_LANE_WINDOW = 1
# the packed form's allgather: each in-group send waits for the one before it to the same
# peer over the same tree from the same block (its own, or one a lane brought): the own
# blocks, ready at once, queued ahead of the lanes' blocks on each rank's port and left the
# lanes' last blocks to cross the group after everything else (2 x A100 allgather 256 MB at
# 4 MiB: 0.605 of the bound unpaced, 0.712 with 1 in flight, 0.682 with 2)
AG_PACKED_WINDOW = 1
# the packed form's reduce-scatter paces each rank's sends per peer and tree: the leaves of
# its trees hold every partial sum at once, and queued ahead on the links they held back the
# sums interior ranks forward (2 x MI250 reduce-scatter 256 MB: 0.50 of the bound unpaced,
# 0.69 with 1 in flight, 0.65 with 2; paced per rank pair instead, 0.19: a leaf then waited
# for an interior rank's sends)
RS_PACKED_WINDOW = 1
# the reduce-scatter that replays its allgather backwards (levels_plan's ``replay``): each
# rank's sends to one peer leave in the reversed order of the allgather's receives there, each
# waiting for the one this many before it, so partial sums ready early cannot queue ahead of
# the ones the reversed allgather sends first (2 x MI250 reduce-scatter 256 MB: 0.616 of the
# bound paced per tree, 0.819 replayed with 1, 0.816 with 2; 4 x A100 1 GB: 0.940 / 0.943)
REPLAY_WINDOW = 1
# where a group's own trees are stars (an NVSwitch: every member straight to every other),
# the packed allgather paces each rank's in-group sends all together, this many in flight: the
# sends of one chunk to every peer, ready at once, were served in the order the ranks posted
# them, and a port whose first sender came last idled (2 x A100 allgather 256 MB at 8 MiB:
# 0.718 of the bound paced per peer and tree, 0.866 per rank with 1, 0.872 with 2, 0.816
# with 3; on an MI250 node's deeper trees per rank: 0.652 against 0.819); its reduce-scatter's
# replay is priced paced so too (:func:`levels_priced`)
STAR_RANK_WINDOW = 2
# and in that replay the sends between groups (the lanes), per rank pair (4 x A100
# reduce-scatter 256 MB at 2 MiB: 0.898 of the bound with one in flight, 0.909 with two; the
# replay of other layouts keeps REPLAY_WINDOW)
STAR_PAIR_WINDOW = 2
# the packed form's in-group messages carry up to this many lane chunks; each is priced.
# One: a second scale gained little for a second lowering at every chunk size (2 x MI250
# allreduce 256 MB: 0.756 at 1 MiB x 2 against 0.743 at 2 MiB x 1; allgather 0.800 / 0.827)
PACKED_SCALES = (1,)
# where a group's trees are stars, the packed form's lanes send the last chunk of a block of
# two chunks or more as two halves (schedule._tail_halved), and a group forwards what a lane
# brings in pieces that end where the lane's do: the group's last forwards, which wait for the
# lane's last bytes, then carry half a chunk each, not a chunk (2 x A100 allgather 256 MB at
# 8 MiB: the NIC's second chunk in at 678 us, then seven 8 MiB forwards through each NVSwitch
# port, 210 us, where the port had idled since 632 us). With OWN_WHOLE, 2 x A100 allgather /
# reduce-scatter / allreduce at 256 MB 0.897 / 0.870 / 0.877 -> 0.921 / 0.904 / 0.912 of the
# bound, at 1 GB
# 0.963 / 0.946 / 0.946 -> 0.971 / 0.957 / 0.962. Over an MI250 node's deeper trees the halves
# traded 64 MB for the larger sizes (2 x MI250 allgather 0.690 / 0.819 / 0.858 -> 0.660 /
# 0.818 / 0.865 at 64 MB / 256 MB / 1 GB) and are not taken there
LANE_TAIL_HALVES = True
# where a group's trees are stars, each rank sends its own block to each peer in one message,
# except to the first peer, which takes it chunk by chunk: the two sends a rank has in flight
# at the start (STAR_RANK_WINDOW) go to one port. Sent chunk by chunk to every peer in turn,
# each port's first reservation went to a rank's second send, which waited for its first to
# leave the rank's own port, so every port but one idled a message time at the start and the
# sends collided after (2 x A100 allgather 256 MB: 0.872 -> 0.897 of the bound, 1 GB
# 0.936 -> 0.963; a rank's seven own-block messages, not fourteen)
OWN_WHOLE = True
# the packed form is priced at chunk sizes down to size / this: below, its messages (a
# group's 48 trees on an MI250 node, one message per tree edge per chunk) cost seconds per
# size and it lost to larger chunks at every size tried (2 x MI250 256 MB: 0.76 at 1 MiB,
# 0.83 at 2 MiB)
PACKED_MAX_CHUNKS = 256
# up to this many ranks the candidate lowers both lane forms (star and ring of groups) at each
# chunk size and keeps the faster: neither wins everywhere (samples/cluster.hcl allgather
# 256 MB: ring 0.911, star 0.859 of the bound; 64 DGX-1s: star 5.94 ms, ring 6.1), and past
# it a second form costs seconds per chunk size (the 512-rank allgather: 4-8 s each), so the
# larger collectives take the default (star for split lanes, ring for full ones)
BOTH_FORMS_MAX_RANKS = 128
# full lanes are taken when the group's cut into it carries at least this share of what its
# ranks' own links take in (the fat tree's racks: 16 x 25 GB/s up = 32 x 12.5 GB/s down, 1.0;
# a DGX-1 host: 4 x 12 GB/s against 8 x 162 GB/s, 0.04; split lanes there)
FULL_LANES_SHARE = 0.99


def _undirected(topo: Topology) -> dict[str, set[str]]:
    adj: dict[str, set[str]] = {v: set() for v in topo.vertices}
    for l in topo.links:
        if l.src != l.dst:
            adj[l.src].add(l.dst)
            adj[l.dst].add(l.src)
    return adj


def _components(adj: dict[str, set[str]], keep: set[str]) -> list[set[str]]:
    seen: set[str] = set()
    out = []
    for v in sorted(keep):
        if v in seen:
            continue
        comp, stack = {v}, [v]
        seen.add(v)
        while stack:
            for y in adj[stack.pop()]:
                if y in keep and y not in seen:
                    seen.add(y)
                    comp.add(y)
                    stack.append(y)
        out.append(comp)
    return out


def _group_parts(topo: Topology, ranks: Sequence[str]) -> tuple[tuple[tuple[int, ...], ...], tuple[set[str], ...]] | None:
    """The groups (rank positions) and each group's vertex set; see :func:`rank_groups`."""
    ranks = tuple(ranks)
    sub = topo.restricted(ranks)
    adj = _undirected(sub)
    dist = {r: 0 for r in ranks}
    q = deque(ranks)
    while q:
        x = q.popleft()
        for y in adj[x]:
            if y not in dist:
                dist[y] = dist[x] + 1
                q.append(y)
    pos = {r: i for i, r in enumerate(ranks)}
    for depth in range(max(dist.values(), default=0), 0, -1):
        keep = {v for v, d in dist.items() if d < depth}
        comps = [c for c in _components(adj, keep) if any(v in pos for v in c)]
        groups = [tuple(sorted(pos[v] for v in c if v in pos)) for c in comps]
        if len(groups) < 2:
            continue
        if len({len(g) for g in groups}) != 1 or len(groups[0]) < 2:
            return None  # uneven or single-rank groups: no two-level form
        order = sorted(range(len(groups)), key=lambda k: groups[k][0])
        return tuple(groups[k] for k in order), tuple(comps[k] for k in order)
    return None


def rank_groups(topo: Topology, ranks: Sequence[str]) -> tuple[tuple[int, ...], ...] | None:
    """The ranks (positions in ``ranks``) grouped by host or rack: the connected parts of the
    collective's topology without the vertices at hop distance ``D`` or more from every rank,
    for the largest ``D`` that leaves two parts or more (a fat tree's spines at ``D = 2``, a
    cluster's fabric switch at 3 behind PCIe switches and NICs), each holding ranks. None
    when no ``D`` splits the ranks, or the split's groups differ in size or hold one rank.
    Groups are listed by their first rank."""
    got = _group_parts(topo, ranks)
    return None if got is None else got[0]


@dataclass(frozen=True)
class Levels:
    """A two-level layout: ``groups`` (rank positions, contiguous, one size ``m``), the intra
    ring ``ring`` (member indices), the ``lanes`` (member indices), ``full`` lanes or split,
    and ``trees``: per lane ``l`` and group ``h`` the route tree ``l * G + h`` (the star from
    the lane's rank of group ``h`` to the lane's rank of every other group), whose paths the
    lane messages take; the packed form (:func:`plan_packed`) appends each group's own
    allgather trees after those lane trees (``inner`` holds their indices)."""

    groups: tuple[tuple[int, ...], ...]
    ring: tuple[int, ...]
    lanes: tuple[int, ...]
    full: bool
    star: bool
    trees: tuple[Tree, ...]
    # the packed in-group form (:func:`plan_packed`): per group, per member index, the indices
    # in ``trees`` of the group's own allgather trees rooted at that member; empty: the ring
    inner: tuple[tuple[tuple[int, ...], ...], ...] = ()
    # the packed form's in-group messages carry up to this many lane chunks
    inner_scale: int = 1
    # every in-group tree a star (:data:`STAR_RANK_WINDOW`)
    stars: bool = False


def _switch_routes(sub: Topology, ranks: tuple[str, ...], pairs: Sequence[tuple[int, int]]) -> list[tuple[str, ...]]:
    """One vertex path per rank pair, through switches only where the pair has such a path
    (else its direct link, else None), each a shortest one, chosen hop by hop to load the
    least loaded link (load: routes already placed over it / its capacity), so parallel lanes
    spread over a fat tree's spines instead of all taking the first."""
    cap: dict[tuple[str, str], float] = {}
    for l in sub.links:
        if l.src != l.dst:
            cap[(l.src, l.dst)] = cap.get((l.src, l.dst), 0.0) + l.capacity
    sw = set(sub.switches)
    fwd: dict[str, list[str]] = {}
    back: dict[str, list[str]] = {}
    for (x, y) in cap:
        fwd.setdefault(x, []).append(y)
        back.setdefault(y, []).append(x)
    for d in (fwd, back):
        for k in d:
            d[k].sort()
    load: dict[tuple[str, str], float] = {}

    def bfs(starts: list[str], nbrs: dict[str, list[str]]) -> dict[str, int]:
        dist = {s: 0 for s in starts}
        q = deque(starts)
        while q:
            x = q.popleft()
            for y in nbrs.get(x, ()):
                if y in sw and y not in dist:
                    dist[y] = dist[x] + 1
                    q.append(y)
        return dist

    out = []
    ahead: dict[str, dict[str, int]] = {}  # per source rank, its switches' hop counts
    behind: dict[str, dict[str, int]] = {}  # per target rank, hop counts to it
    for u, v in pairs:
        a, b = ranks[u], ranks[v]
        if (a, b) in cap:
            path: tuple[str, ...] | None = (a, b)
        else:
            src = [y for y in fwd.get(a, ()) if y in sw]
            dst = [x for x in back.get(b, ()) if x in sw]
            if a not in ahead:
                ahead[a] = bfs(src, fwd)
            if b not in behind:
                behind[b] = bfs(dst, back)
            df, db = ahead[a], behind[b]
            meet = [s for s in dst if s in df]
            if not meet:
                path = None
            else:
                path = _least_loaded(a, b, src, fwd, sw, df, db, cap, load, min(df[s] for s in meet))
        if path is not None:
            for arc in zip(path, path[1:]):
                load[arc] = load.get(arc, 0.0) + 1.0
        out.append(path)
    return out


def _least_loaded(a: str, b: str, src: list[str], fwd: dict[str, list[str]], sw: set[str],
                  df: dict[str, int], db: dict[str, int], cap: dict[tuple[str, str], float],
                  load: dict[tuple[str, str], float], total: int) -> tuple[str, ...]:
    """The shortest switch path from ``a`` to ``b`` (``total`` switch hops) whose most loaded
    link is least loaded (load / capacity), by layers of the shortest-path graph (layer ``k``:
    switches ``k`` hops from ``a``'s and ``total - k`` from ``b``'s); ties by vertex name.
    Least-loaded first hops alone left a fat tree's spine-to-leaf links uneven."""
    def w(x: str, y: str) -> float:
        return load.get((x, y), 0.0) / cap[(x, y)]

    layer: dict[str, tuple[float, str | None]] = {y: (w(a, y), None) for y in src if db.get(y, -1) == total}
    layers = [layer]
    for k in range(1, total + 1):
        nxt: dict[str, tuple[float, str | None]] = {}
        for x in sorted(layer):
            c = layer[x][0]
            for z in fwd.get(x, ()):
                if z in sw and df.get(z, -1) == k and db.get(z, -1) == total - k:
                    got = max(c, w(x, z))
                    if z not in nxt or got < nxt[z][0]:
                        nxt[z] = (got, x)
        layers.append(nxt)
        layer = nxt
    x: str | None = min((v for v in layer if (v, b) in cap), key=lambda v: (max(layer[v][0], w(v, b)), v))
    back = [b]
    for lay in reversed(layers):
        back.append(x)
        x = lay[x][1]
    back.append(a)
    return tuple(reversed(back))


def plan_levels(topo: Topology, ranks: Sequence[str], *, star: bool | None = None) -> Levels | None:
    """The two-level layout of ``ranks`` on ``topo`` (see the module docstring), or None where
    there is none: no grouping (:func:`rank_groups`), groups not numbered consecutively, or no
    route between two groups' ranks through switches."""
    ranks = tuple(ranks)
    got = _group_parts(topo, ranks)
    if got is None:
        return None
    groups, comps = got
    if any(g != tuple(range(g[0], g[0] + len(g))) for g in groups):
        return None  # a group's blocks of ``out`` would not be one range
    G, m = len(groups), len(groups[0])
    sub = topo.restricted(ranks)
    # each member's exit from group 0: the first arc of its route to its peer in group 1
    # leaving the group
    inside = comps[0]
    probe = _switch_routes(sub, ranks, [(groups[0][i], groups[1][i]) for i in range(m)])
    if any(p is None for p in probe):
        return None
    exits = [next(((x, y) for x, y in zip(p, p[1:]) if y not in inside), (p[-2], p[-1])) for p in probe]
    ring = tuple(ring_order(topo, [ranks[r] for r in groups[0]]))
    cut_in = sum(l.capacity for l in sub.links if l.dst in inside and l.src not in inside)
    mine = {ranks[r] for r in groups[0]}
    member_in = sum(l.capacity for l in sub.links if l.dst in mine and l.src != l.dst)
    full = cut_in >= FULL_LANES_SHARE * member_in
    if full:
        lanes = tuple(range(m))
    else:
        # one lane per distinct exit, spread evenly round the intra ring (phase C's chains
        # from lane ranks then share the ring's links evenly)
        L = len(set(exits))
        used: set[tuple[str, str]] = set()
        chosen: list[int] = []
        for k in range(L):
            ideal = k * m // L
            for d in range(m):
                hit = None
                for p in (ideal + d, ideal - d):
                    i = ring[p % m]
                    if i not in chosen and exits[i] not in used:
                        hit = i
                        break
                if hit is not None:
                    chosen.append(hit)
                    used.add(exits[hit])
                    break
        lanes = tuple(chosen)
    if star is None:
        star = not full
    n = len(ranks)
    if star:
        # the lane rank of group h to the same member of group h + s, for every s (s
        # outermost, so the balance spreads each round's messages over the fabric)
        hops = [(s, l, h) for s in range(1, G) for l in range(len(lanes)) for h in range(G)]
    else:
        hops = [(1, l, h) for l in range(len(lanes)) for h in range(G)]
    paths = _switch_routes(sub, ranks, [(groups[h][lanes[l]], groups[(h + s) % G][lanes[l]]) for s, l, h in hops])
    if any(p is None for p in paths):
        return None
    # tree l * G + h: the star from group h's lane rank (star), or the ring's hop out of it
    parent = {(l, h): [-1] * n for l in range(len(lanes)) for h in range(G)}
    tpaths: dict[tuple[int, int], list[tuple[str, ...]]] = {k: [()] * n for k in parent}
    for (s, l, h), path in zip(hops, paths):
        child = groups[(h + s) % G][lanes[l]]
        parent[(l, h)][child] = groups[h][lanes[l]]
        tpaths[(l, h)][child] = path
    trees = tuple(Tree(l * G + h, groups[h][i], tuple(parent[(l, h)]), 1.0, (0, 0), tuple(tpaths[(l, h)]))
                  for l, i in enumerate(lanes) for h in range(G))
    return Levels(groups, ring, lanes, full, star, trees)


def _transfers(L: Levels, E: int, n: int, ce: int) -> tuple[list[tuple[int, int, int, int, int]],
                                                            dict[int, list[int]], dict[int, list[int]]]:
    """The allgather as transfers ``(src, dst, a, b, tree)`` in emission order (module
    docstring): phase A, then phases B and C interleaved chunk by chunk; and per lane rank of
    a star, its lane sends and its lane receives (transfer indices, in order) for
    :func:`_gates`."""
    groups, ring, G = L.groups, L.ring, len(L.groups)
    m = len(ring)
    out: list[tuple[int, int, int, int, int]] = []
    right = m // 2  # a chain from ring position p reaches p+1..p+right, then p-1..p-(m-1-right)
    # phase A: per block, chains both ways round the intra ring from its owner, chunk by
    # chunk (both ways: a DGX-1 lane's share, its block and its ring neighbour's, is whole
    # after one hop instead of up to seven)
    blocks = [list(pieces(*block_range(E, n, r), ce)) for r in range(n)]
    most = max(len(b) for b in blocks)
    for q in range(most):
        for s in range(1, right + 1):
            for grp in groups:
                for p in range(m):
                    owner = grp[ring[p]]
                    if q < len(blocks[owner]):
                        a, b = blocks[owner][q]
                        if b > a:
                            out.append((grp[ring[(p + s - 1) % m]], grp[ring[(p + s) % m]], a, b, -1))
                            if s < m - right:
                                out.append((grp[ring[(p - s + 1) % m]], grp[ring[(p - s) % m]], a, b, -1))
    # phases B and C
    pos = {i: p for p, i in enumerate(ring)}
    ranges = [(block_range(E, n, g[0])[0], block_range(E, n, g[-1])[1]) for g in groups]
    nl = len(L.lanes)
    shares = [[r] * nl if L.full else split_by_rate(r[0], r[1], [1.0] * nl) for r in ranges]
    # a split lane carries the share holding its own rank's block where those differ per lane
    # (its first message then waits for the fewest phase A hops)
    mine = [min(nl - 1, (block_range(E, n, groups[0][i])[0] - ranges[0][0]) * nl
                // max(1, ranges[0][1] - ranges[0][0])) for i in L.lanes]
    if not L.full and len(set(mine)) == nl:
        shares = [[sh[mine[l]] for l in range(nl)] for sh in shares]
    chunks = [[list(pieces(a, b, ce)) for a, b in sh] for sh in shares]  # [group][lane] -> chunks
    most = max(len(c) for sh in chunks for c in sh)
    sent: dict[int, list[int]] = {}  # lane rank -> its lane sends, in order
    got: dict[int, list[int]] = {}  # lane rank -> its lane receives, in order
    for q in range(most):
        for s in range(G - 1):
            for l, i in enumerate(L.lanes):
                for h in range(G):
                    if q >= len(chunks[h][l]):
                        continue
                    a, b = chunks[h][l][q]
                    if b <= a:
                        continue
                    g0 = h if L.star else (h + s) % G
                    g1 = (h + s + 1) % G
                    src, dst = groups[g0][i], groups[g1][i]
                    sent.setdefault(src, []).append(len(out))
                    got.setdefault(dst, []).append(len(out))
                    out.append((src, dst, a, b, l * G + g0))
                    if not L.full:
                        grp, p = groups[g1], pos[i]
                        for k in range(1, right + 1):
                            out.append((grp[ring[(p + k - 1) % m]], grp[ring[(p + k) % m]], a, b, -1))
                        for k in range(1, m - right):
                            out.append((grp[ring[(p - k + 1) % m]], grp[ring[(p - k) % m]], a, b, -1))
    if not L.star:  # a ring needs no gates: each lane send waits for the receive it forwards
        sent, got = {}, {}
    return out, sent, got


def plan_packed(topo: Topology, ranks: Sequence[str], *, base: Levels | None = None) -> Levels | None:
    """The packed two-level layout: where every member of a group has an exit of its own
    (split lanes, one per member, as each A100 GPU's or MI250 GCD's NIC), each rank's lane
    carries its own block straight to the same member of every other group (a star), and
    inside each group every member forwards its *bundle* (its block and the blocks its lane
    received) over that group's own allgather tree packing (treepack.pack_allgather on the
    group's vertices): the NVSwitch star on an A100 host, the xGMI mesh's 48 trees on an
    MI250 node, where the ring of :func:`plan_levels` used one ring's links of the mesh
    (2 x MI250 allgather 256 MB: 0.27 of the bound). None where the layout is not split
    lanes on every member, or a group's own links do not connect its ranks both ways.
    ``base``: ``plan_levels(topo, ranks, star=True)`` where the caller has it already."""
    from .treepack import pack_allgather  # OR-Tools: loaded when a compile packs
    from .treepack_master import PackError

    ranks = tuple(ranks)
    if base is None:
        base = plan_levels(topo, ranks, star=True)
    if base is None or base.full or len(base.lanes) != len(base.ring):
        return None
    groups, comps = _group_parts(topo, ranks)  # type: ignore[misc]  # plan_levels found them
    n = len(ranks)
    trees = list(base.trees)
    inner = []
    for g, (grp, comp) in enumerate(zip(groups, comps)):
        names = tuple(ranks[r] for r in grp)
        sub = Topology(f"{topo.name}.group{g}", names, tuple(v for v in topo.switches if v in comp),
                       tuple(l for l in topo.links if l.src in comp and l.dst in comp and l.src != l.dst))
        try:
            pk = pack_allgather(sub, names)
        except PackError:  # a rank the group's own links do not reach: no in-group trees
            return None
        if not pk.trees or pk.rate <= 0:
            return None
        pos = {ranks[r]: r for r in grp}
        mine: list[list[int]] = [[] for _ in grp]
        for t in pk.trees:
            parent, paths = [-1] * n, [()] * n
            for a, b, path in t.edges:
                parent[pos[b]] = pos[a]
                paths[pos[b]] = tuple(path)
            root = pos[t.root]
            mine[grp.index(root)].append(len(trees))
            trees.append(Tree(len(trees), root, tuple(parent), t.rate, (0, 0), tuple(paths)))
        inner.append(tuple(tuple(x) for x in mine))
    stars = all(t.depth() <= 1 for t in trees[len(base.trees):])
    return replace(base, trees=tuple(trees), inner=tuple(inner), stars=stars)


def _bfs(tree: Tree) -> list[tuple[int, int]]:
    """``(parent, child)`` edges of ``tree``, parents before children."""
    out, q = [], deque([tree.root])
    n = len(tree.parent)
    while q:
        x = q.popleft()
        # children from the root's next rank on: every root of a switch group sending to
        # its peers in the same order sent them all to one peer's port at once
        for c in sorted(tree.children(x), key=lambda c: (c - tree.root) % n):
            out.append((x, c))
            q.append(c)
    return out


def _packed_transfers(L: Levels, E: int, n: int, ce: int, backward: bool = False
                      ) -> tuple[list[tuple[int, int, int, int, int]], dict[int, list[int]], dict[int, list[int]]]:
    """The packed layout's allgather as transfers (see :func:`_transfers`): the lanes (every
    rank's block to the same member of every other group, chunks of ``ce``), then each
    group's bundles over its trees, each member's own block first, then the blocks its lane
    brings in arrival order, in messages of up to ``ce x inner_scale`` elements (a message
    waits for every lane chunk it overlaps). ``backward``: every block's chunks last first,
    the order whose reversal, as an allreduce's reduce-scatter, completes the first chunks
    first, the ones its allgather sends first."""
    groups, G, m = L.groups, len(L.groups), len(L.ring)
    out: list[tuple[int, int, int, int, int]] = []
    sent: dict[int, list[int]] = {}
    got: dict[int, list[int]] = {}
    blocks = [block_range(E, n, r) for r in range(n)]
    halves = LANE_TAIL_HALVES and L.stars
    lane = [_tail_halved(*blocks[r], ce) if halves else list(pieces(*blocks[r], ce)) for r in range(n)]
    most = max(len(c) for c in lane)
    for q in (range(most - 1, -1, -1) if backward else range(most)):
        for s in range(1, G):
            for l, i in enumerate(L.lanes):
                for h in range(G):
                    src, dst = groups[h][i], groups[(h + s) % G][i]
                    if q < len(lane[src]):
                        a, b = lane[src][q]
                        sent.setdefault(src, []).append(len(out))
                        got.setdefault(dst, []).append(len(out))
                        out.append((src, dst, a, b, l * G + h))
    ci = ce * max(1, L.inner_scale)
    edges = {t: _bfs(L.trees[t]) for per in L.inner for ts in per for t in ts}
    # own blocks first, while the lanes run, then the lanes' blocks in the order they arrive;
    # reversed (reduce-scatter) the blocks bound for other groups are reduced first, so the
    # lanes start early (2 x MI250 reduce-scatter 256 MB, own and lanes' blocks interleaved:
    # the last lane messages left 0.5 ms after the group's reductions)
    stages: list[list[list[tuple[int, int, int]]]] = []  # per s: the jobs of the blocks s groups back
    for s in range(G):
        jobs: list[list[tuple[int, int, int]]] = []
        for g in range(G):
            for i in range(m):
                ts = L.inner[g][i]
                src = groups[(g - s) % G][i]
                a, b = blocks[src]
                # a lane's block in pieces that end where the lane's do (LANE_TAIL_HALVES)
                cuts = sorted({a, b} | {y for _, y in lane[src]}) if s and halves else [a, b]
                for t, (x, y) in zip(ts, split_by_rate(a, b, [L.trees[t].rate for t in ts])):
                    ends = [x] + [c for c in cuts if x < c < y] + [y]
                    jobs.append([(x0, x1, t) for lo, hi in zip(ends, ends[1:]) for x0, x1 in pieces(lo, hi, ci)])
        stages.append(jobs)
    # the lanes' blocks piece by piece across the groups they come from, as the lanes bring
    # them (piece q of every group's block, then q + 1): block by block, a rank's next
    # forward (star groups pace a rank's sends together) waited for its block's next piece,
    # which the lanes bring only after every other group's piece q (4 x A100 allgather 256 MB
    # at 4 MiB: each rank's NVSwitch port idle 338-691 us, 0.78 of the bound)
    for own, group in ((True, stages[:1]), (False, stages[1:])):
        jobs = [j for st in group for j in st]
        if own and L.stars and OWN_WHOLE:  # peer by peer, the first peer's chunk by chunk
            for j in (j for j in jobs if j):
                t, first = j[0][2], (j[::-1] if backward else j)
                for k, (p, c) in enumerate(edges[t]):
                    out.extend((p, c, x0, x1, t) for x0, x1, _ in (first if k == 0 else [(j[0][0], j[-1][1], t)]))
            continue
        most = max((len(j) for j in jobs), default=0)
        for q in (range(most - 1, -1, -1) if backward else range(most)):
            for j in jobs:
                if q < len(j):
                    x0, x1, t = j[q]
                    out.extend((p, c, x0, x1, t) for p, c in edges[t])
    return out, sent, got


def _gates(sent: dict[int, list[int]], got: dict[int, list[int]], window: int = LANE_WINDOW
           ) -> tuple[dict[int, int], set[int]]:
    """``({k: j}, the gating transfers)``: lane transfer ``k``'s send waits for the receive of
    lane transfer ``j`` at the same rank, ``window`` of its lane messages earlier."""
    gates: dict[int, int] = {}
    for r, ks in sent.items():
        rv = got.get(r, [])
        for j in range(window, min(len(ks), len(rv) + window)):
            k, g = ks[j], rv[j - window]
            if g < k:  # emitted before the send it gates
                gates[k] = g
    return gates, set(gates.values())


def levels_plan(spec: Any, topo: Topology, layout: Levels, chunk_bytes: int, *,
                replay: Sequence[float] | None = None, per_rank: bool = False,
                ag_layout: Levels | None = None) -> Plan:
    """The two-level plan of ``spec`` (allgather, reduce_scatter or allreduce) over
    ``layout`` with messages of at most ``chunk_bytes``: the allgather's transfers
    (:func:`_transfers`), their reversal for reduce_scatter (each rank adds what comes back
    along each element's tree into its own input, sends the sum to where the element came
    from, the owner keeps it), both for allreduce.

    ``replay``: per allgather transfer, when it ends in the simulated allgather
    (:func:`allgather_ends`); the reduce-scatter then runs that allgather backwards in time
    (:data:`REPLAY_WINDOW`), with ``per_rank`` each rank's in-group sends paced all together
    (:data:`STAR_RANK_WINDOW`) and its lane sends per peer (:data:`STAR_PAIR_WINDOW`).
    ``ag_layout``: an allreduce's allgather over that layout instead (its receives of a range
    after the rank's reduce-scatter send of it)."""
    return _levels_build(spec, topo, layout, chunk_bytes, replay, per_rank, ag_layout)[0]


def allgather_ends(spec: Any, topo: Topology, layout: Levels, chunk_bytes: int, model) -> list[float] | None:
    """Per transfer of ``layout``'s allgather of ``spec``'s size at ``chunk_bytes``, the
    simulated time its receive completes (None where the native simulator, the one that
    reports per-op times, is not built)."""
    from .cost import completion_times

    plan, recvs = _levels_build(replace(spec, kind="allgather", op=None), topo, layout, chunk_bytes, None)
    got = completion_times(plan, model)
    if got is None:
        return None
    done, base = got
    return [float(done[base[r] + i]) for r, i in recvs]


def _levels_build(spec: Any, topo: Topology, layout: Levels, chunk_bytes: int,
                  replay: Sequence[float] | None, per_rank: bool = False,
                  ag_layout: Levels | None = None) -> tuple[Plan, list[tuple[int, int]]]:
    """:func:`levels_plan`, and per allgather transfer its receive op ``(rank, index)``."""
    kind, n = spec.kind, len(spec.ranks)
    if kind not in LEVEL_KINDS:
        raise PlanError(f"no two-level form for {kind} {spec.name!r}")
    E = spec.size_bytes // DTYPE_SIZES[spec.dtype]
    ce = chunk_elems(chunk_bytes, spec.dtype)
    moves, sent, got = (_packed_transfers if layout.inner else _transfers)(layout, E, n, ce)
    lane_trees = len(layout.lanes) * len(layout.groups)  # tree indices past these: in-group trees
    # the reduce-scatter's transfers: the allgather's reversed; for a packed allreduce the
    # allgather's chunk order reversed first, so the chunks its allgather starts with are
    # reduced first (2 x A100 allreduce 256 MB: the first chunk's allgather waited for the
    # reduce-scatter's last chunk)
    rs_moves = (_packed_transfers(layout, E, n, ce, backward=True)[0] if layout.inner and kind == "allreduce"
                else moves)
    trees = layout.trees
    ag, off = layout, 0  # the allgather's layout (an allreduce's may differ: ``ag_layout``)
    ag_moves, ag_sent, ag_got = moves, sent, got
    if ag_layout is not None and ag_layout is not layout and kind == "allreduce":
        # its transfers over its own trees, numbered after the reduce-scatter's
        ag, off = ag_layout, len(layout.trees)
        ag_moves, ag_sent, ag_got = (_packed_transfers if ag.inner else _transfers)(ag, E, n, ce)
        ag_moves = [(x, y, a, b, t + off if t >= 0 else t) for x, y, a, b, t in ag_moves]
        trees = trees + tuple(replace(t, index=t.index + off) for t in ag.trees)
    ag_lanes = off + len(ag.lanes) * len(ag.groups)  # the allgather's tree indices past these: in-group
    B = ProgramBuilder(n)
    own = [block_range(E, n, r) for r in range(n)]
    held = Spans(n)  # allgather: the ops after which a rank holds a range of ``out``
    rs_send: list[int] = []  # allreduce: per transfer, the reduce-scatter's send over it
    rs_sent = Spans(n)  # allreduce over two layouts: per rank, its reduce-scatter sends by range
    if kind in ("reduce_scatter", "allreduce"):
        avg = plan_op(kind, spec.op) == "avg"

        # partial sums at their natural offsets: ``out`` for allreduce, ``tmp`` for
        # reduce_scatter (a lane's range spans its rank's own block and others), whose
        # owner copies its block to ``out`` at the end
        where = "out" if kind == "allreduce" else "tmp"

        def acc(r: int, a: int, b: int) -> ChunkRef:
            return ChunkRef(where, a, b - a)

        init = Spans(n)
        added = Spans(n)
        for r in range(n):
            lo, hi = own[r]
            if hi > lo:
                init.add(r, lo, hi, B.add(r, Copy(ChunkRef("in", lo, hi - lo), acc(r, lo, hi))))
        for src, dst, a, b, _ in rs_moves:
            init.add(dst, a, b, B.add(dst, Copy(ChunkRef("in", a, b - a), acc(dst, a, b))))
        sends = [0] * len(rs_moves)
        # no lane gates in the reduce-scatter: its lane sends wait for their group's partial
        # sums already (the allgather's window reversed: 8.7 against 7.3 ms on DGX-1 x 64);
        # the group's own sends are paced instead (RS_SEND_WINDOW)
        mine: dict[Any, list[int]] = {}  # per rank (packed: per rank, peer, tree), its group-internal sends
        window = RS_PACKED_WINDOW if layout.inner else RS_SEND_WINDOW
        order: Sequence[int] = range(len(rs_moves) - 1, -1, -1)
        if replay is not None:
            # the allgather backwards: latest-ending transfer first. Every transfer that
            # forwards what another brought ends after it, so the sums a send adds are
            # received (emitted) before it, as the spans below need
            if rs_moves is not moves:
                at = {mv: i for i, mv in enumerate(moves)}
                replay = [replay[at[mv]] for mv in rs_moves]
            order = sorted(order, key=lambda k: -replay[k])
        for k in order:
            src, dst, a, b, tree = rs_moves[k]
            inside = tree < 0 or tree >= lane_trees
            if replay is not None:  # every send paced, per rank pair (in-group: per rank)
                ranked = per_rank and inside
                own_sends = mine.setdefault((dst,) if ranked else (dst, src), [])
                w = STAR_RANK_WINDOW if ranked else STAR_PAIR_WINDOW if per_rank else REPLAY_WINDOW
                pace = (own_sends[-w],) if len(own_sends) >= w else ()
                inside = True
            else:
                own_sends = mine.setdefault((dst, src, tree) if layout.inner else dst, [])
                pace = (own_sends[-window],) if inside and len(own_sends) >= window else ()
            sends[k], rv = B.message(dst, src, acc(dst, a, b), acc(src, a, b),
                                     send_deps=init.over(dst, a, b) + added.over(dst, a, b) + pace,
                                     recv_deps=init.over(src, a, b), reduce=True, tree=tree)
            if inside:
                own_sends.append(sends[k])
            added.add(src, a, b, rv)
            rs_sent.add(dst, a, b, sends[k])
        for r in range(n):
            lo, hi = own[r]
            if hi <= lo:
                continue
            last = init.over(r, lo, hi) + added.over(r, lo, hi)
            if avg:
                last = (B.add(r, Scale(acc(r, lo, hi), n, tuple(sorted(set(last))))),)
            if kind == "reduce_scatter":
                last = (B.add(r, Copy(acc(r, lo, hi), ChunkRef("out", 0, hi - lo), tuple(sorted(set(last))))),)
            for op in set(last):
                held.add(r, lo, hi, op)
        if ag is not layout:
            rs_send = []  # the allgather's receives wait for the sends of their range instead
        elif rs_moves is moves:
            rs_send = sends
        else:  # the same transfers in another order
            by_move = dict(zip(rs_moves, sends))
            rs_send = [by_move[mv] for mv in moves]
    recvs: list[tuple[int, int]] = []
    if kind in ("allgather", "allreduce"):
        if kind == "allgather":
            for r in range(n):
                lo, hi = own[r]
                if hi > lo:
                    held.add(r, lo, hi, B.add(r, Copy(ChunkRef("in", 0, hi - lo), ChunkRef("out", lo, hi - lo))))
        gates, gating = _gates(ag_sent, ag_got, PACKED_LANE_WINDOW if ag.inner and len(ag.groups) > 2
                                 else LANE_WINDOW)
        ag_recv: dict[int, int] = {}  # gating transfers: the receive, at their dst
        starts = [lo for lo, _ in own]
        streams: dict[tuple[int, int, int, int], list[int]] = {}  # packed: per (src, dst, tree, block)
        for k, (src, dst, a, b, tree) in enumerate(ag_moves):
            ref = ChunkRef("out", a, b - a)
            # an allreduce's receive overwrites the range its reduce-scatter summed there: after
            # the rank's send of that sum (every rank sends each range it does not own)
            wd = (rs_send[k],) if rs_send else rs_sent.over(dst, a, b) if ag is not layout else ()
            gate = (ag_recv[gates[k]],) if k in gates else ()
            seq = None
            if ag.inner and tree >= ag_lanes:
                if ag.stars:
                    seq = streams.setdefault((src,), [])
                    w = STAR_RANK_WINDOW
                else:
                    seq = streams.setdefault((src, dst, tree, bisect.bisect_right(starts, a)), [])
                    w = AG_PACKED_WINDOW
                if len(seq) >= w:
                    gate += (seq[-w],)
            sd, rv = B.message(src, dst, ref, ref, send_deps=held.over(src, a, b) + gate, recv_deps=wd,
                               tree=tree)
            if seq is not None:
                seq.append(sd)
            recvs.append((dst, rv))
            held.add(dst, a, b, rv)
            if k in gating:
                ag_recv[k] = rv
    return assemble(spec, topo, B, trees, "treepack-levels", ce), recvs


def levels_forms(topo: Topology, ranks: Sequence[str]) -> tuple[Levels, ...] | None:
    """The lane forms the candidate prices (:data:`BOTH_FORMS_MAX_RANKS`): the default layout,
    and for smaller collectives the other lane form and the packed layout
    (:func:`plan_packed`) at each of :data:`PACKED_SCALES`; None where there is no layout."""
    first = plan_levels(topo, ranks)
    if first is None:
        return None
    if len(ranks) > BOTH_FORMS_MAX_RANKS:
        return (first,)
    other = plan_levels(topo, ranks, star=not first.star)
    forms = (first,) if other is None else (first, other)
    star = first if first.star else other  # plan_packed's base: the star form
    packed = None if star is None else plan_packed(topo, ranks, base=star)
    if packed is not None:
        forms += tuple(replace(packed, inner_scale=k) for k in PACKED_SCALES)
    return forms


# the chunk search's refinement (chunks.refining) prices, of the variants levels_priced
# priced at the chunk it refines around, those within this factor of the fastest there: 2 x
# MI250 allreduce at 256 MiB priced 9 variants at each of the refinement's sizes, half its
# compile (16.2 -> 11.8 CPU s, the same plan). With 1.02, as pipeline.REFINE_RIVALS refines
# algorithms, 4 A100 servers' allgather at 64 MiB lost 0.787 -> 0.785 of the bound: the
# packed form fastest at 1.5 MiB was 5.3 % behind at 1 MiB, where the search ended
REFINE_VARIANTS = 1.1
# levels_priced's variant times per (forms, collective, chunk), the newest last (at most
# _PRICED_MAX entries)
_priced: dict[tuple, tuple[Sequence[Levels], dict[tuple, float]]] = {}
_PRICED_MAX = 64


def levels_priced(spec: Any, topo: Topology, forms: Sequence[Levels], chunk_bytes: int, *, model=None):
    """``(plan, simulation)`` of the fastest of ``forms`` at ``chunk_bytes`` (the packed forms
    only down to ``size / PACKED_MAX_CHUNKS``). An allreduce whose star groups' packed form
    is one of them is also priced as that form's reduce-scatter followed by the allgather of
    the form whose simulated allgather is fastest (4 A100 servers at 256 MB: 0.909 of the
    bound, where either form alone reaches 0.892). Inside the chunk search's refinement
    around a chunk priced here already (chunks.refining), only the variants within
    :data:`REFINE_VARIANTS` of the fastest there are priced."""
    from .chunks import refined_around
    from .cost import DEFAULT_MODEL, simulate

    model = model or DEFAULT_MODEL
    # a variant: (form, replays its allgather backwards, paced per rank, the form the
    # allreduce gathers over or None), forms by their index in ``forms``
    usable = [j for j, lay in enumerate(forms)
              if not (lay.inner and chunk_bytes * PACKED_MAX_CHUNKS < spec.size_bytes and j > 0)]
    ident = (spec.name, spec.kind, spec.size_bytes, tuple(spec.ranks), spec.dtype, spec.op, model)
    around = refined_around()
    known = _priced.get(ident + (around,)) if around is not None else None
    variants: list[tuple] = []
    if known is not None and known[0] is forms and known[1]:
        least = min(known[1].values())
        variants = [k for k, t in known[1].items()
                    if t <= least * REFINE_VARIANTS and k[0] in usable and (k[3] is None or k[3] in usable)]
    ends: dict[int, list[float] | None] = {}
    if not variants:  # not refining, or none of the close variants applies at this size
        if spec.kind != "allgather" and len(spec.ranks) <= BOTH_FORMS_MAX_RANKS:
            ends = {j: allgather_ends(spec, topo, forms[j], chunk_bytes, model) for j in usable}
            ends = {j: e for j, e in ends.items() if e is not None}
        fastest = min(ends, key=lambda j: max(ends[j], default=0.0)) if ends else None
        for j in usable:
            variants.append((j, False, False, None))
            if j in ends:
                variants.append((j, True, False, None))
                if forms[j].stars:
                    variants.append((j, True, True, None))
                    if spec.kind == "allreduce" and fastest is not None and fastest != j:
                        variants += [(j, True, r, fastest) for r in (False, True)]
    times: dict[tuple, float] = {}
    best = None
    for key in variants:
        j, replays, per_rank, ag = key
        if replays and j not in ends:  # refining: the allgather ends of the forms it replays
            ends[j] = allgather_ends(spec, topo, forms[j], chunk_bytes, model)
        if replays and ends[j] is None:
            continue
        plan = levels_plan(spec, topo, forms[j], chunk_bytes, replay=ends[j] if replays else None,
                           per_rank=per_rank, ag_layout=None if ag is None else forms[ag])
        sim = simulate(plan, model=model)
        times[key] = sim.time
        if best is None or sim.time < best[1].time:
            best = (plan, sim)
    if best is None:  # every close variant's replay failed at this size: all of them
        _priced.pop(ident + (around,), None)
        return levels_priced(spec, topo, forms, chunk_bytes, model=model)
    _priced.pop(ident + (chunk_bytes,), None)
    _priced[ident + (chunk_bytes,)] = (forms, times)
    while len(_priced) > _PRICED_MAX:
        del _priced[next(iter(_priced))]
    return best
