"""hcc.compiler.bounds — lower bounds on the time of every collective, computed from cuts.

Terms
- A collective of kind K runs on ``topo.restricted(ranks)``: its ranks R (N = |R|) and every
  switch; c(e) is a link's capacity in bytes/s. M is ``size_bytes``, the per-rank output
  buffer as nccl-tests counts it (for reduce_scatter the full input, as in ir.plan).
- For a vertex set S, B⁺(S) is the capacity of the links leaving S and B⁻(S) of those entering.
- *rate bound* (bytes/s) and *time bound* (seconds): no schedule whatsoever, with any
  pipelining and any routing through switches, can beat them. Latency is not included; these
  are bandwidth bounds, the ``M / rate`` term of the cost model.

Results implemented
- Broadcast / reduce (Edmonds 1973, "Edge-disjoint branchings"; Blink, MLSys 2020): the best
  rate from root r is R* = min over ranks v != r of maxflow(r, v); time >= M / R*. Reduce uses
  the reversed graph. On a graph without switches Edmonds' theorem makes R* achievable by a
  fractional packing of spanning arborescences (compiler/treepack.py reaches it).
- Allgather / reduce-scatter (ForestColl, Zhao et al. 2024): every rank's M/N bytes must reach
  every other rank, so for every S containing some but not all ranks, |S ∩ R|·M/N bytes leave S:
  time >= (M/N) · max_S |S ∩ R| / B⁺(S). Equivalently the per-root rate x* = min_S B⁺(S)/|S ∩ R|.
  It is computed *exactly* as ForestColl does, by max-flow: add a source s with an arc s -> r of
  capacity x to every rank; x is feasible iff for every rank v, maxflow(s, v) >= (N-1)·x (arc
  s -> v left out). A min cut that violates it is a set S with B⁺(S)/|S ∩ R| < x; we lower x to
  that ratio and repeat (Newton's method on a concave piecewise-linear function: finitely many
  steps, each exact in integer arithmetic). Reduce-scatter is the same on the reversed graph.
  Allreduce = reduce-scatter + allgather, bound 2x the allgather bound (design.md).
- Gather / scatter: every non-root rank's M/N bytes must reach the root, so for every S without
  the root, time >= (M/N)·|S ∩ R| / B⁺(S) (S = V minus the root gives (N-1)/N·M through the
  root's in-cut). Exact by the same parametric max-flow with the root as the only sink; scatter
  on the reversed graph.
- Alltoall: rank i sends block j (M/N bytes) to rank j, so for every S, |S ∩ R|·|R \\ S|·M/N bytes
  must cross from S to its complement: time >= max_S |S ∩ R|·|R \\ S|·(M/N) / B⁺(S) (a
  bisection-style cut bound). Exact enumeration of every vertex subset when the restricted
  topology has at most 16 vertices; above that the maximum over a family of rank subsets A
  (singletons, their complements, hosts, the ranks behind each switch, rank-order halves and
  prefixes of hosts), each priced by the exact min cut separating A from R \\ A with switches
  free. Every S gives a valid bound, so the family's maximum is still a valid (weaker) bound.
- neighbor_average: every rank receives M bytes from each of its distinct peers and sends M to
  each: time >= max over ranks v of max(p·M / B⁻({v}), p·M / B⁺({v})), p the peer count
  (ring: 2 for N > 2, 1 for N = 2; shift_one: 1; all: N-1).

Max-flows run on compiler/maxflow.py's integer network (exact for whole bytes/s).

>>> from hcc.ir.topology import Topology, Link
>>> t = Topology("pair", ("a", "b"), links=(Link("a", "b", 10.0), Link("b", "a", 10.0)))
>>> broadcast_rate_bound(t, ("a", "b"), "a")
10.0
>>> allgather_time_bound(t, ("a", "b"), 20)
1.0
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from ..ir.topology import Link, Topology
from .maxflow import FlowNet as _Net

__all__ = [
    "broadcast_rate_bound",
    "reduce_rate_bound",
    "allgather_rate_bound",
    "allgather_rate_exact",
    "allgather_time_bound",
    "reduce_scatter_time_bound",
    "allreduce_time_bound",
    "alltoall_time_bound",
    "gather_time_bound",
    "scatter_time_bound",
    "neighbor_average_time_bound",
    "time_bound",
    "peer_count",
    "merged_arcs",
    "effective_capacity",
    "Cut",
    "binding_cut",
]

# the allreduce floor's groups: a least cut per group up to this many groups (2 max-flows each)
_GROUP_FLOWS = 128
# ... and every partition of the ranks up to this many ranks (:func:`_partition_cuts`: 2^n - 2
# max-flows per direction and a dynamic program over 3^n pairs of subsets; 8 ranks, one DGX-1,
# well under 0.1 s)
_PARTITION_MAX_RANKS = 8
# ... and past that, up to this many ranks, a local search over partitions from the hosts' and
# link classes' (:func:`_partition_search`), pricing at most this many distinct groups per
# direction (a count, so the bound depends on the input only; 2 MI250 nodes, 32 ranks: 733)
_PARTITION_SEARCH_RANKS = 64
_PARTITION_SEARCH_GROUPS = 4096
# exhaustive alltoall cut enumeration up to 2^16 = 65536 subsets (about 0.1 s with numpy)
_ALLTOALL_EXACT_VERTICES = 16


def _memoised(maxsize: int):
    """functools.lru_cache for a function of a Topology and hashable arguments, with its
    ``cache_clear``; called with an unhashable Topology (lists for tuples) it computes and
    does not memoise."""
    def wrap(fn):
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def call(*args):
            try:
                return cached(*args)
            except TypeError:
                return fn(*args)

        call.cache_clear = cached.cache_clear
        return call

    return wrap


def _rate(net: _Net, value) -> float:
    return float(value) / net.scale


def broadcast_rate_bound(topo: Topology, ranks, root: str) -> float:
    """Edmonds: R* = min over ranks v != root of maxflow(root, v), in bytes/s."""
    net = _Net(topo, tuple(ranks))
    r = net.index[root]
    others = [v for v in net.rank_idx if v != r]
    if not others:
        return math.inf
    return _rate(net, min(net.maxflow(r, v) for v in others))


def min_rank_cut_rate(topo: Topology, ranks) -> float:
    """min over vertex sets S holding some but not all ranks of B⁺(S), in bytes/s: the
    narrowest cut between ranks. Any cut separates rank 0 from some rank v, one way or the
    other, so it is min over v of min(maxflow(r0, v), maxflow(v, r0)) — 2(n-1) max-flows."""
    ranks = tuple(ranks)
    if len(ranks) < 2:
        return math.inf
    return _narrowest(topo, ranks)[0]


@_memoised(maxsize=8)
def _narrowest(topo: Topology, ranks: tuple[str, ...]) -> tuple[float, tuple[str, ...], tuple[str, ...]]:
    """:func:`narrowest_rank_cut`, memoised."""
    net = _Net(topo, ranks)
    r0, *others = net.rank_idx
    best = None
    for v in others:
        for a, b in ((r0, v), (v, r0)):
            value, side, sink = net.min_cut_sides(a, b)
            if best is None or value < best[0]:
                best = (value, side, sink)
    value, side, sink = best
    most = set(range(len(net.vertices))) - sink
    return (_rate(net, value), tuple(net.vertices[i] for i in sorted(side)),
            tuple(net.vertices[i] for i in sorted(most)))


def narrowest_rank_cut(topo: Topology, ranks) -> tuple[float, tuple[str, ...], tuple[str, ...]]:
    """The narrowest cut between ranks (:func:`min_rank_cut_rate`) with its sides: ``(capacity
    in bytes/s, the vertex names of the least source side, those of the greatest)``, both of
    a minimum cut of the first pair (rank 0 to v, or v to rank 0, in rank order) that reaches
    the minimum. The plan's explanation names the least side; the two-level allreduce
    (hier.py) splits the ranks by the greatest, so a rank joined to both sides by equally
    narrow links stays with the source.

    Memoised (2(n-1) max-flows: seconds at 1024 ranks): the allreduce floor, the ring
    channels' limit, the two-level allreduce and the explanation share one computation."""
    ranks = tuple(ranks)
    if len(ranks) < 2:
        raise ValueError("a rank cut needs at least two ranks")
    return _narrowest(topo, ranks)


def reduce_rate_bound(topo: Topology, ranks, root: str) -> float:
    """Edmonds on the reversed graph: min over ranks v != root of maxflow(v, root)."""
    net = _Net(topo, tuple(ranks), reverse=True)
    r = net.index[root]
    others = [v for v in net.rank_idx if v != r]
    if not others:
        return math.inf
    return _rate(net, min(net.maxflow(r, v) for v in others))


@_memoised(maxsize=16)
def _allgather_parametric(topo: Topology, ranks: tuple[str, ...], reverse: bool
                          ) -> tuple[Fraction, float, tuple[str, ...]]:
    """(x* in the net's scaled units, the net's scale, the vertex names of a set S attaining
    it), memoised: the bounds pass, the allgather packing and the plan's explanation of one
    compile ask for the same x* (1 024 max-flows per Newton step on the 1024-rank fat tree)."""
    from .switches import host_translation

    net = _Net(topo, ranks, reverse=reverse)
    sinks = list(net.rank_idx)
    found = host_translation(topo, ranks)
    if found is not None:
        # translating hosts is an automorphism of the graph that fixes the set of ranks, so
        # it maps every source arc s -> r (r != v) onto those of the translated sink:
        # maxflow_x(s, v) is the same for v and its translates, and one sink per orbit
        # decides the same x* (the first host's ranks: 8 max-flows per step, not 512)
        host_of = dict(topo.hosts)
        sinks = [net.index[v] for v in ranks if host_of[v] == host_of[ranks[0]]]
    x, side = net.parametric_cut(sinks)
    return x, net.scale, tuple(net.vertices[i] for i in sorted(side))


def _allgather_x(topo: Topology, ranks: tuple[str, ...], reverse: bool) -> tuple[Fraction, float]:
    x, scale, _ = _allgather_parametric(topo, ranks, reverse)
    return x, scale


def allgather_rate_bound(topo: Topology, ranks, *, reverse: bool = False) -> float:
    """ForestColl's per-root rate x* = min_S B⁺(S)/|S ∩ R| (bytes/s each root can spread)."""
    ranks = tuple(ranks)
    if len(ranks) < 2:
        return math.inf
    x, scale = _allgather_x(topo, ranks, reverse)
    return float(x) / scale


def allgather_rate_exact(topo: Topology, ranks, *, reverse: bool = False) -> Fraction | None:
    """x* as an exact fraction of bytes/s when every capacity is whole bytes/s, else None
    (treepack derives its rate quantum from it)."""
    ranks = tuple(ranks)
    if len(ranks) < 2:
        return None
    x, scale = _allgather_x(topo, ranks, reverse)
    return x if scale == 1.0 else None


def _per_root_time(size_bytes: float, n: int, x: float) -> float:
    if n < 2:
        return 0.0
    if x <= 0:
        return math.inf
    return (size_bytes / n) / x


def allgather_time_bound(topo: Topology, ranks, size_bytes: float) -> float:
    """(M/N)·max_S |S ∩ R| / B⁺(S), S containing some but not all ranks (ForestColl)."""
    ranks = tuple(ranks)
    return _per_root_time(size_bytes, len(ranks), allgather_rate_bound(topo, ranks))


def reduce_scatter_time_bound(topo: Topology, ranks, size_bytes: float) -> float:
    """The allgather bound on the reversed graph: (M/N)·max_S |S ∩ R| / B⁻(S)."""
    ranks = tuple(ranks)
    return _per_root_time(size_bytes, len(ranks), allgather_rate_bound(topo, ranks, reverse=True))


def allreduce_time_bound(topo: Topology, ranks, size_bytes: float) -> float:
    """Twice the allgather bound (reduce-scatter + allgather, design.md)."""
    return 2.0 * allgather_time_bound(topo, ranks, size_bytes)


def allreduce_floor(topo: Topology, ranks: tuple[str, ...], size: float) -> float:
    """A lower bound on any allreduce that holds for every schedule, reduce-then-broadcast
    trees included: every rank must receive and send ``M`` bytes of information (its result
    depends on all inputs, its input on all results), and every element needs at least
    ``2(n-1)`` one-way rank-to-rank messages (directed gossip needs ``2n - 2`` calls), each
    leaving a rank over one of its links. So ``t >= max(max_v M / min(B-(v), B+(v)),
    2(n-1) M / sum of the capacity leaving the ranks, M / min_S B+(S))``; the last term
    because the ranks on either side of any cut S need the other side's M bytes of partial
    reduction (two hosts joined by one slow link: the slow link carries at least M); and the
    same gossip count over groups of ranks (:func:`_group_cuts`: 2(k-1) M over the links into,
    or out of, k groups — every partition up to 8 ranks, else hosts, the components of the
    faster links and, up to 64 ranks, a local search from them).

    design.md's "twice the allgather bound" is the bound of reduce-scatter + allgather
    schedules; Blink's reduce+broadcast trees can beat it (3 ranks with a 2 GB/s rank and two
    3 GB/s ranks: 2 x AG = 2.0 ms for 3 MB, trees take 1.76 ms in the cost model, this floor
    is 1.5 ms), so the pipeline (compiler/pipeline.py) uses ``min(2 x AG, floor)``: a true
    lower bound that equals 2 x AG wherever 2 x AG is provably one.

    >>> from hcc.ir.topology import Link
    >>> tri = Topology("t", ("a", "b", "c"), links=tuple(Link(x, y, 1e9) for x in "abc" for y in "abc" if x != y))
    >>> allreduce_floor(tri, ("a", "b", "c"), 3e6)   # 4 x 3 MB over 6 GB/s
    0.002
    """
    sub = topo.restricted(ranks)
    rs = set(ranks)
    n = len(ranks)
    cin = {v: 0.0 for v in ranks}
    cout = {v: 0.0 for v in ranks}
    for l in sub.links:
        if l.src in rs:
            cout[l.src] += l.capacity
        if l.dst in rs:
            cin[l.dst] += l.capacity
    per_vertex = max(size / min(cin[v], cout[v]) for v in ranks)
    total = 2 * (n - 1) * size / sum(cout.values())
    cut = size / min_rank_cut_rate(topo, ranks)
    groups = max((c.time(size) for c in _group_cuts(topo, tuple(ranks))), default=0.0)
    return max(per_vertex, total, cut, groups)


def floor_groups(topo: Topology, ranks: tuple[str, ...]) -> list[tuple[str, tuple[frozenset[str], ...]]]:
    """Partitions of the ranks into k >= 2 groups, each group with a vertex set of its own
    (disjoint, holding its ranks and no other group's), named: ``("hosts", sets)`` — a set per
    host, its ranks with the switches of the same host, a rank without a host alone — and
    ``("links >= c", sets)`` for every link capacity c — the components the links of at least
    c join, either way (switches with them). :func:`allreduce_floor`'s group term prices each."""
    sub = topo.restricted(ranks)
    rank_set = set(ranks)
    found: dict[frozenset, tuple[str, tuple[frozenset[str], ...]]] = {}

    def add(name: str, sets) -> None:
        sets = tuple(s for s in sets if s & rank_set)
        if len(sets) >= 2:
            found.setdefault(frozenset(sets), (name, tuple(sorted(sets, key=sorted))))

    host = dict(sub.hosts)
    if any(host.get(r) for r in ranks):
        by_host: dict[str, set[str]] = {}
        for v in sub.vertices:
            if host.get(v):
                by_host.setdefault(host[v], set()).add(v)
        add("hosts", [frozenset(s) for s in by_host.values()] +
            [frozenset((r,)) for r in ranks if not host.get(r)])
    for c in sorted({l.capacity for l in sub.links}):
        parent = {v: v for v in sub.vertices}

        def find(v: str) -> str:
            while parent[v] != v:
                parent[v] = parent[parent[v]]
                v = parent[v]
            return v

        for l in sub.links:
            if l.capacity >= c:
                parent[find(l.src)] = find(l.dst)
        comps: dict[str, set[str]] = {}
        for v in sub.vertices:
            comps.setdefault(find(v), set()).add(v)
        add(f"links >= {c / 1e9:g} GB/s", [frozenset(s) for s in comps.values()])
    return list(found.values())


@_memoised(maxsize=8)
def _group_cuts(topo: Topology, ranks: tuple[str, ...]) -> tuple[Cut, ...]:
    """The allreduce floor's group term, per partition of :func:`floor_groups` and direction,
    and up to _PARTITION_MAX_RANKS ranks the partition of every one that binds most
    (:func:`_partition_cuts`), past that up to _PARTITION_SEARCH_RANKS the one a local search
    from those partitions and from every rank alone stops at (:func:`_partition_search`).

    Only ranks add; switches forward. Contract each group to one vertex that knows what any of
    its ranks knows: an allreduce becomes one-way gossip among k vertices (every group ends
    knowing every input), which takes at least ``2(k-1)`` calls (Harary and Schwenk). So each
    element crosses between groups at least 2(k-1) times, each crossing a message from a rank
    of one group to a rank of another, entering (leaving) some vertex set T_g that holds the
    destination's (source's) ranks and no other group's. With the T_g inside the groups'
    disjoint sets, their links carry at least ``2(k-1) M`` together: ``t >= 2(k-1) M /
    sum_g B-(T_g)``, and the same with ``B+``. T_g is the least such cut inside the group's
    set (a max-flow each, up to :data:`_GROUP_FLOWS` groups; the whole set above). Hosts on a
    fabric give twice the allgather bound here, which the rank-level terms miss (a rank's
    NVLinks count there)."""
    net = _Net(topo, ranks)
    everything = set(range(len(net.vertices)))
    n = len(ranks)
    named = floor_groups(topo, ranks)
    if 2 < n <= _PARTITION_MAX_RANKS:
        out = list(_partition_cuts(net))
    elif n <= _PARTITION_SEARCH_RANKS:
        pos = {r: i for i, r in enumerate(ranks)}
        starts = [[sum(1 << pos[r] for r in s if r in pos) for s in sets] for _, sets in named]
        out = list(_partition_search(net, [[1 << i for i in range(n)]] + starts))
    else:
        out = []
    for name, sets in named:
        for direction in ("in", "out"):
            sides = []
            for s in sets:
                group = {net.index[v] for v in s}
                own = {net.index[r] for r in ranks if r in s}
                sides.append(group if len(sets) > _GROUP_FLOWS else _group_side(net, own, everything - group,
                                                                                   direction)[1])
            out.append(_partition_cut(net, sides, direction, f"({name})"))
    return tuple(out)


def _group_side(net: _Net, own: set[int], rest: set[int], direction: str) -> tuple[int, set[int]]:
    """The least cut (scaled capacity) between the vertices ``own`` and ``rest`` and its side
    holding ``own``: the links into it (``direction`` "in") or out of it ("out")."""
    if direction == "in":
        cap, side = net_min_cut_side(net, rest, own)
        return cap, set(range(len(net.vertices))) - side
    return net_min_cut_side(net, own, rest)


def _crossing(net: _Net, t: set[int], direction: str) -> list[tuple[int, int]]:
    """The arcs entering the vertex set ``t`` (``direction`` "in") or leaving it ("out")."""
    if direction == "in":
        return [(a, b) for a, b, _ in net.arcs if b in t and a not in t]
    return [(a, b) for a, b, _ in net.arcs if a in t and b not in t]


def _partition_cuts(net: _Net) -> tuple[Cut, ...]:
    """The group term over every partition of the ranks into k >= 2 groups, per direction: the
    partition of most ``2(k-1) / sum_g B(T_g)``, where T_g is the least cut between the group's
    ranks and the other ranks, switches on either side (the other ranks' vertices are all that
    T_g must miss: an element a group receives enters T_g over some link whatever the other
    groups' sets, so the T_g need not be disjoint, and a link entering two of them counts in
    each). The hosts and link classes of :func:`floor_groups` are a few of these partitions,
    with T_g inside each group's own vertices; on DGX-1 allocations the partitions they miss
    bind: gpu[0..5]'s four GPUs under one PCIe switch as one group and the other two alone,
    71.0 GB/s against the 77.2 GB/s of every rank's links, which the split packing reaches
    (69.9 GB/s two levels deep), where the floor had left it at 0.905."""
    n = len(net.ranks)
    full = (1 << n) - 1
    out = []
    for direction in ("in", "out"):
        cap = [0] * (full + 1)
        side: list[set[int]] = [set()] * (full + 1)
        for mask in range(1, full):
            own = {net.rank_idx[i] for i in range(n) if mask >> i & 1}
            rest = {net.rank_idx[i] for i in range(n) if not mask >> i & 1}
            cap[mask], side[mask] = _group_side(net, own, rest, direction)
        # least[k][S]: the least sum of cap over partitions of S into k groups (the group
        # holding S's lowest rank first), with that first group
        least = [dict() for _ in range(n + 1)]
        first: list[dict[int, int]] = [dict() for _ in range(n + 1)]
        for mask in range(1, full):
            least[1][mask], first[1][mask] = cap[mask], mask
        for k in range(2, n + 1):
            for mask in range(1, full + 1):
                low = mask & -mask
                rest_bits = mask ^ low
                sub = rest_bits
                best = None
                while True:  # every group g of mask holding its lowest rank, g != mask
                    g = sub | low
                    if g != mask:
                        tail = least[k - 1].get(mask ^ g)
                        if tail is not None and (best is None or cap[g] + tail < best[0]):
                            best = (cap[g] + tail, g)
                    if sub == 0:
                        break
                    sub = (sub - 1) & rest_bits
                if best is not None:
                    least[k][mask], first[k][mask] = best
        k = max((k for k in range(2, n + 1) if least[k].get(full)), key=lambda k: (k - 1) / least[k][full],
                default=None)
        if k is None:
            continue
        groups, mask = [], full
        for j in range(k, 0, -1):
            g = first[j][mask]
            groups.append(g)
            mask ^= g
        out.append(_partition_cut(net, [side[g] for g in groups], direction, _mask_names(net, groups)))
    return tuple(out)


def _partition_cut(net: _Net, sides: Sequence[set[int]], direction: str, label: str) -> Cut:
    """The group term's Cut for a partition whose groups' vertex sets are ``sides``: the links
    entering (``direction`` "in") or leaving each set, a link entering two sets counted in
    both; ``label`` names the groups in its text."""
    k = len(sides)
    inside: set[int] = set()
    crossing: list[tuple[int, int]] = []
    for t in sides:
        inside |= t
        crossing += sorted(_crossing(net, t, direction))
    capacity = {(a, b): c for a, b, c in net.arcs}
    way = "entering" if direction == "in" else "leaving"
    return Cut("allreduce-groups", tuple(sorted(net.vertices[i] for i in inside)),
               tuple((net.vertices[a], net.vertices[b]) for a, b in crossing),
               sum(capacity[x] for x in crossing) / net.scale, len(net.ranks), 2.0 * (k - 1), direction,
               f"every element crosses between the {k} groups {label} 2(k-1) = {2 * (k - 1)} "
               f"times, each over a link {way} a group")


def _mask_names(net: _Net, groups: Sequence[int]) -> str:
    """Groups of ranks given as bit masks, as "a+b | c"."""
    return " | ".join("+".join(net.ranks[i] for i in range(len(net.ranks)) if g >> i & 1) for g in groups)


def _partition_search(net: _Net, starts: Sequence[Sequence[int]]) -> tuple[Cut, ...]:
    """The group term of :func:`_partition_cuts` where every partition is too many: per
    direction, from the best of ``starts`` (partitions as rank bit masks; those of fewer than
    two groups are skipped), steepest ascent of ``(k-1) / sum_g B(T_g)`` over the partitions
    one move away — a rank to another group or alone, two groups merged — until no move
    gains or _PARTITION_SEARCH_GROUPS groups have been priced. Every partition is a valid
    term, so the one it stops at is a bound however far from the best it is. One MI250 node:
    its six GCD pairs and one group of four (175.0 GB/s of allreduce, where its hosts' and
    link classes' partitions gave 178.6); on random graphs of up to 8 ranks the floor with this
    term in place of :func:`_partition_cuts` was the same on all of 300
    (tests/test_allreduce_groups.py checks a sample)."""
    n = len(net.ranks)
    out = []
    for direction in ("in", "out"):
        priced: dict[int, tuple[int, set[int]]] = {}

        def cap(g: int) -> int:
            if g not in priced:
                own = {net.rank_idx[i] for i in range(n) if g >> i & 1}
                rest = {net.rank_idx[i] for i in range(n) if not g >> i & 1}
                priced[g] = _group_side(net, own, rest, direction)
            return priced[g][0]

        def worth(groups: list[int]) -> float:
            total = sum(cap(g) for g in groups)
            return (len(groups) - 1) / total if total > 0 else math.inf

        tried = [list(p) for p in starts if len([g for g in p if g]) >= 2]
        if not tried:
            continue
        best = max(([g for g in p if g] for p in tried), key=worth)
        value = worth(best)
        while len(priced) < _PARTITION_SEARCH_GROUPS and value < math.inf:
            step = None
            k = len(best)
            for gi, g in enumerate(best):
                for i in range(n):
                    bit = 1 << i
                    if not g & bit:
                        continue
                    for hi in range(k + 1):  # k: alone
                        if hi == gi or (hi == k and g == bit):
                            continue
                        if len(priced) >= _PARTITION_SEARCH_GROUPS:
                            break
                        moved = [h | bit if j == hi else h ^ bit if j == gi else h for j, h in enumerate(best)]
                        moved = [h for h in moved if h] + ([bit] if hi == k else [])
                        if len(moved) >= 2 and (v := worth(moved)) > value * (1 + 1e-12):
                            step, value = moved, v
            for a in range(k):
                for b in range(a + 1, k):
                    merged = [h for j, h in enumerate(best) if j not in (a, b)] + [best[a] | best[b]]
                    if len(merged) >= 2 and (v := worth(merged)) > value * (1 + 1e-12):
                        step, value = merged, v
            if step is None:
                break
            best = step
        if value < math.inf:
            out.append(_partition_cut(net, [priced[g][1] for g in best], direction, _mask_names(net, best)))
    return tuple(out)


def _rooted_gather_time(topo, ranks, root, size_bytes, reverse) -> float:
    ranks = tuple(ranks)
    if len(ranks) < 2:
        return 0.0
    net = _Net(topo, ranks, reverse=reverse)
    x = _rate(net, net.parametric_rate([net.index[root]]))
    return _per_root_time(size_bytes, len(ranks), x)


def gather_time_bound(topo: Topology, ranks, root: str, size_bytes: float) -> float:
    """(M/N)·max over S without the root of |S ∩ R| / B⁺(S)."""
    return _rooted_gather_time(topo, ranks, root, size_bytes, reverse=False)


def scatter_time_bound(topo: Topology, ranks, root: str, size_bytes: float) -> float:
    """(M/N)·max over S without the root of |S ∩ R| / B⁻(S) (gather on the reversed graph)."""
    return _rooted_gather_time(topo, ranks, root, size_bytes, reverse=True)


def _alltoall_exact(net: _Net) -> tuple[float, int]:
    """max over all vertex subsets S of k(N-k)/B⁺(S) (k = |S ∩ R|), by enumeration."""
    nv = len(net.vertices)
    masks = np.arange(1 << nv, dtype=np.int64)
    cut = np.zeros(1 << nv, dtype=np.float64)
    for a, b, c in net.arcs:
        cut += c * (((masks >> a) & 1) & (1 - ((masks >> b) & 1)))
    k = np.zeros(1 << nv, dtype=np.int64)
    for r in net.rank_idx:
        k += (masks >> r) & 1
    n = len(net.ranks)
    demand = (k * (n - k)).astype(np.float64)
    ok = demand > 0
    with np.errstate(divide="ignore"):
        ratio = np.where(ok, demand / np.where(cut > 0, cut, 1.0), 0.0)
    if np.any(ok & (cut <= 0)):
        return math.inf, 0
    i = int(np.argmax(ratio))
    return float(ratio[i]), i


def _alltoall_families(net: _Net, topo: Topology) -> list[frozenset[int]]:
    rank_set = frozenset(net.rank_idx)
    fams: set[frozenset[int]] = set()
    for r in net.rank_idx:
        fams.add(frozenset({r}))
        fams.add(rank_set - {r})
    order = list(net.rank_idx)
    fams.add(frozenset(order[: len(order) // 2]))
    hosts: dict[str, list[int]] = {}
    for v in net.ranks:
        h = topo.host_of(v)
        if h:
            hosts.setdefault(h, []).append(net.index[v])
    acc: set[int] = set()
    for h in sorted(hosts):
        fams.add(frozenset(hosts[h]))
        acc |= set(hosts[h])
        fams.add(frozenset(acc))
    # the ranks one hop behind each switch (NVSwitch, leaf switch) and their complement
    succ: dict[int, set[int]] = {}
    for a, b, _ in net.arcs:
        succ.setdefault(a, set()).add(b)
    switch_idx = [i for i, v in enumerate(net.vertices) if i not in rank_set]
    for w in switch_idx:
        near = frozenset(succ.get(w, set()) & rank_set)
        fams.add(near)
        fams.add(rank_set - near)
    return [f for f in fams if 0 < len(f) < len(rank_set)]


def alltoall_time_bound(topo: Topology, ranks, size_bytes: float) -> float:
    """max_S |S ∩ R|·|R \\ S|·(M/N) / B⁺(S): exact up to 16 vertices, a family above.

    See the module docstring for the family; each member is priced by its exact min cut, so
    the figure is always a valid lower bound on alltoall time.
    """
    ranks = tuple(ranks)
    n = len(ranks)
    if n < 2:
        return 0.0
    net = _Net(topo, ranks)
    if len(net.vertices) <= _ALLTOALL_EXACT_VERTICES:
        best, _ = _alltoall_exact(net)
    else:
        best = 0.0
        rank_set = set(net.rank_idx)
        for a in _alltoall_families(net, topo):
            k = len(a)
            cut = net.min_cut_between(set(a), rank_set - set(a))
            if cut <= 0:
                return math.inf
            best = max(best, k * (n - k) / cut)
    return best * net.scale * (size_bytes / n) if math.isfinite(best) else math.inf


def peer_count(peers: str, n: int) -> int:
    """Distinct peers of a rank for neighbor_average (BAGUA): ring 2 (1 if N = 2), shift_one 1,
    all N-1."""
    if n < 2:
        return 0
    if peers == "ring":
        return 1 if n == 2 else 2
    if peers == "shift_one":
        return 1
    if peers == "all":
        return n - 1
    raise ValueError(f"unknown peers {peers!r}: expected ring, shift_one or all")


def neighbor_average_time_bound(topo: Topology, ranks, size_bytes: float, peers: str = "ring") -> float:
    """max over ranks v of p·M / min(B⁻({v}), B⁺({v})): each rank receives and sends M per peer."""
    ranks = tuple(ranks)
    p = peer_count(peers, len(ranks))
    if p == 0:
        return 0.0
    net = _Net(topo, ranks)
    worst = 0.0
    for r in net.rank_idx:
        cap = min(net.in_cap[r], net.out_cap[r]) / net.scale
        if cap <= 0:
            return math.inf
        worst = max(worst, p * size_bytes / cap)
    return worst


def _root_name(kind: str, ranks: tuple[str, ...], root) -> str | None:
    """The root as a vertex name: ``root`` a name, a rank index (-1: none) or None; a rooted
    kind without one is rooted at the first rank."""
    if isinstance(root, int) and not isinstance(root, bool):
        root = ranks[root] if root >= 0 else None
    if kind in ("broadcast", "reduce", "gather", "scatter") and root is None:
        root = ranks[0]
    return root


def time_bound(kind: str, topo: Topology, ranks, root, size_bytes: float, *, peers: str = "ring") -> float:
    """Bandwidth lower bound in seconds for one collective of any kind of ir.plan.KINDS.

    ``root`` is a vertex name (or a rank index, or None for unrooted kinds).
    """
    ranks = tuple(ranks)
    root = _root_name(kind, ranks, root)
    if len(ranks) < 2:
        return 0.0
    if kind == "broadcast":
        return size_bytes / broadcast_rate_bound(topo, ranks, root)
    if kind == "reduce":
        return size_bytes / reduce_rate_bound(topo, ranks, root)
    if kind == "allgather":
        return allgather_time_bound(topo, ranks, size_bytes)
    if kind == "reduce_scatter":
        return reduce_scatter_time_bound(topo, ranks, size_bytes)
    if kind == "allreduce":
        return allreduce_time_bound(topo, ranks, size_bytes)
    if kind == "gather":
        return gather_time_bound(topo, ranks, root, size_bytes)
    if kind == "scatter":
        return scatter_time_bound(topo, ranks, root, size_bytes)
    if kind == "alltoall":
        return alltoall_time_bound(topo, ranks, size_bytes)
    if kind == "neighbor_average":
        return neighbor_average_time_bound(topo, ranks, size_bytes, peers)
    raise ValueError(f"unknown collective kind {kind!r}")


# -- the cut that sets the bound (the plan's explanation) ------------------------------------------
@dataclass(frozen=True)
class Cut:
    """The vertex set whose links set a collective's bound, in the topology's own names.

    ``vertices`` is S and ``links`` the arcs the bound's bytes must cross: those leaving S
    (``direction = "out"``) or entering it (``"in"``: reduce, reduce_scatter and scatter,
    whose bounds are taken on the reversed graph). ``capacity_Bps`` is their total capacity,
    ``ranks_inside`` = |S ∩ R|, and ``factor`` the bytes that must cross per byte of M, so the
    bound is ``time(M) = factor x M / capacity_Bps`` (broadcast: 1; allgather: |S ∩ R|/N;
    allreduce: twice that, or a term of :func:`allreduce_floor`).
    ``what`` says it in words. For ``kind = "all-ranks"`` (allreduce's total-traffic term)
    S is every rank and the links are all links leaving a rank: not one cut, but the
    2(n-1)·M bytes that must leave ranks somewhere."""

    kind: str
    vertices: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    capacity_Bps: float
    ranks_inside: int
    factor: float
    direction: str
    what: str

    def time(self, size_bytes: float) -> float:
        if self.capacity_Bps <= 0:
            return math.inf
        return self.factor * size_bytes / self.capacity_Bps


def _cut_of(net: _Net, side, kind: str, factor: float, what: str, reverse: bool) -> Cut:
    """The :class:`Cut` of vertex-index set ``side`` in ``net`` (for a reversed net, the
    arcs leaving ``side`` in the net are those entering it in the topology)."""
    inside = set(side)
    arcs = sorted({(net.vertices[a], net.vertices[b]) for a, b, _ in net.arcs if a in inside and b not in inside})
    cap = net.out_of(inside) / net.scale
    if reverse:
        arcs = sorted((v, u) for u, v in arcs)
    k = sum(1 for r in net.rank_idx if r in inside)
    return Cut(kind, tuple(sorted(net.vertices[i] for i in inside)), tuple(arcs), cap, k, factor,
               "in" if reverse else "out", what)


def _rooted_cut(topo, ranks, root, reverse: bool, kind: str) -> Cut:
    net = _Net(topo, ranks, reverse=reverse)
    r = net.index[root]
    best = None
    for v in net.rank_idx:
        if v != r:
            value, side = net.min_cut(r, v)
            if best is None or value < best[0]:
                best = (value, side, v)
    value, side, v = best
    dst = net.vertices[v]
    what = (f"{root} -> {dst}: every byte must leave the root's side" if not reverse else
            f"{dst} -> {root}: every byte must enter the root's side")
    return _cut_of(net, side, kind, 1.0, what, reverse)


def _allgather_cut(topo, ranks, reverse: bool, kind: str, factor_scale: float = 1.0) -> Cut:
    n = len(ranks)
    x, scale, names = _allgather_parametric(topo, ranks, reverse)
    net = _Net(topo, ranks, reverse=reverse)
    side = {net.index[v] for v in names}
    k = sum(1 for r in net.rank_idx if r in side)
    if reverse:
        what = f"the {k} ranks in S must receive {k}/{n} of M, partially reduced, from outside"
    else:
        what = f"the {k} ranks in S must send their {k}/{n} of M out"
    if factor_scale != 1.0:
        what += " (twice: reduce-scatter then allgather)"
    return _cut_of(net, side, kind, factor_scale * k / n, what, reverse)


def _gather_cut(topo, ranks, root, reverse: bool, kind: str) -> Cut:
    n = len(ranks)
    net = _Net(topo, ranks, reverse=reverse)
    x, side = net.parametric_cut([net.index[root]])
    k = sum(1 for r in net.rank_idx if r in side)
    what = (f"the {k} ranks in S hold {k}/{n} of M for the root" if not reverse else
            f"the {k} ranks in S need {k}/{n} of M from the root")
    return _cut_of(net, side, kind, k / n, what, reverse)


def _alltoall_cut(topo, ranks) -> Cut:
    n = len(ranks)
    net = _Net(topo, ranks)
    if len(net.vertices) <= _ALLTOALL_EXACT_VERTICES:
        _, mask = _alltoall_exact(net)
        side = {i for i in range(len(net.vertices)) if (mask >> i) & 1}
    else:
        best, side = -1.0, set()
        rank_set = set(net.rank_idx)
        for a in _alltoall_families(net, topo):
            k = len(a)
            value, s = net_min_cut_side(net, set(a), rank_set - set(a))
            ratio = k * (n - k) / value if value > 0 else math.inf
            if ratio > best:
                best, side = ratio, s
    k = sum(1 for r in net.rank_idx if r in side)
    return _cut_of(net, side, "alltoall", k * (n - k) / n,
                   f"the {k} ranks in S send 1/{n} of M to each of the {n - k} outside", False)


def net_min_cut_side(net: _Net, side: set[int], other: set[int]) -> tuple[int, set[int]]:
    """:meth:`_Net.min_cut_between` with the source side (vertex indices) of the cut."""
    f = net.solved_cut_between(side, other)
    return f.optimal_flow(), set(f.get_source_side_min_cut()) - {len(net.vertices)}


def _vertex_cut(topo, ranks, factor: float, kind: str, what_fmt: str) -> Cut:
    """The rank v of least min(B⁻({v}), B⁺({v})), cut as {v} (out) or as {v} entered (in)."""
    net = _Net(topo, ranks)
    best = None
    for r in net.rank_idx:
        for cap, rev in ((net.out_cap[r], False), (net.in_cap[r], True)):
            if best is None or cap < best[0]:
                best = (cap, r, rev)
    _, r, rev = best
    inside = net.vertices[r]
    if rev:
        arcs = sorted((net.vertices[a], inside) for a, b, _ in net.arcs if b == r and a != r)
    else:
        arcs = sorted((inside, net.vertices[b]) for a, b, _ in net.arcs if a == r and b != r)
    cap = (net.in_cap[r] if rev else net.out_cap[r]) / net.scale
    return Cut(kind, (inside,), tuple(arcs), cap, 1, factor, "in" if rev else "out",
               what_fmt.format(v=inside, way="receive" if rev else "send"))


def allreduce_cuts(topo, ranks) -> list[Cut]:
    """The candidate cuts of an allreduce: twice the allgather cut, and the terms of
    allreduce_floor (per rank, all ranks' total, the narrowest rank cut, the groups')."""
    n = len(ranks)
    out = [_allgather_cut(topo, ranks, False, "allreduce", 2.0)]
    out.append(_vertex_cut(topo, ranks, 1.0, "allreduce-rank",
                           "{v} must {way} M (its result needs every input, its input every result)"))
    net = _Net(topo, ranks)
    rank_set = set(net.rank_idx)
    arcs = sorted((net.vertices[a], net.vertices[b]) for a, b, _ in net.arcs if a in rank_set)
    total = sum(net.out_cap[r] for r in net.rank_idx) / net.scale
    out.append(Cut("all-ranks", tuple(sorted(ranks)), tuple(arcs), total, n, 2.0 * (n - 1), "out",
                   f"every element needs 2(n-1) = {2 * (n - 1)} rank-to-rank messages, each leaving a rank"))
    _, names, _ = _narrowest(topo, tuple(ranks))
    out.append(_cut_of(net, {net.index[v] for v in names}, "allreduce-cut", 1.0,
                       "each side needs the other side's M bytes of partial reduction", False))
    groups = _group_cuts(topo, tuple(ranks))
    if groups:
        out.append(max(groups, key=lambda c: c.time(1.0)))
    return out


def binding_cut(kind: str, topo: Topology, ranks, root, size_bytes: float, *, peers: str = "ring") -> Cut | None:
    """The :class:`Cut` whose ``time(size_bytes)`` is the bandwidth bound of the collective:
    :func:`time_bound`, and for allreduce the pipeline's ``min(2 x allgather, floor)``
    (:func:`allreduce_floor`). None for fewer than 2 ranks.

    >>> from hcc.ir.topology import Link
    >>> t = Topology("pair", ("a", "b"), links=(Link("a", "b", 10.0), Link("b", "a", 10.0)))
    >>> c = binding_cut("broadcast", t, ("a", "b"), "a", 20)
    >>> c.vertices, c.links, c.time(20)
    (('a',), (('a', 'b'),), 2.0)
    """
    ranks = tuple(ranks)
    root = _root_name(kind, ranks, root)
    if len(ranks) < 2:
        return None
    if kind == "broadcast":
        return _rooted_cut(topo, ranks, root, False, kind)
    if kind == "reduce":
        return _rooted_cut(topo, ranks, root, True, kind)
    if kind == "allgather":
        return _allgather_cut(topo, ranks, False, kind)
    if kind == "reduce_scatter":
        return _allgather_cut(topo, ranks, True, kind)
    if kind == "gather":
        return _gather_cut(topo, ranks, root, False, kind)
    if kind == "scatter":
        return _gather_cut(topo, ranks, root, True, kind)
    if kind == "alltoall":
        return _alltoall_cut(topo, ranks)
    if kind == "neighbor_average":
        p = peer_count(peers, len(ranks))
        return _vertex_cut(topo, ranks, float(p), kind, "{v} must {way} M to each of its " + f"{p} peer(s)")
    if kind == "allreduce":
        ag, *floor_terms = allreduce_cuts(topo, ranks)
        floor = max(floor_terms, key=lambda c: c.time(size_bytes))
        return ag if ag.time(size_bytes) <= floor.time(size_bytes) else floor
    raise ValueError(f"unknown collective kind {kind!r}")


def latency_aware_bound(cut_s: float, depth: int, per_hop_s: float, capacity_ratio: float = 1.0) -> float:
    """A lower bound on the α-β time of pipelining a tree's share in fixed-size chunks down
    a tree ``depth`` rank hops deep whose links carry no other tree (an edge-disjoint
    broadcast or reduce packing: DGX-1's four NVLink chains), each relay forwarding a chunk
    once it holds all of it (hcc's lowering; NCCL's pipelines too), when its share over its
    rate is ``cut_s`` (the cut time, while the shares follow the packing's rates; a schedule
    that moves data between trees changes each tree's term). Where trees share links, one tree's fill hides behind the others'
    traffic and this is no bound (8 chains over one NVSwitch, one per root, reach 0.997 of
    the allgather cut with 7 hops each). Arithmetic, for chunks of ``s`` bytes:

    - per-message cost: the tree's tight link, capacity ``c_t``, is busy for its bytes and
      ``per_hop_s`` (``a``: latency + per-message cost) per message: ``cut_s x (1 + a c_t / s)``;
    - pipeline fill: the last chunk still crosses ``d - 1`` hops after its first, each at
      least ``s / c_max + a`` (a proportionate flow shop: ``d - 1`` times the largest chunk,
      whatever the order);
    - ``t(s) = cut_s + cut_s a c_t / s + (d - 1)(s / c_max + a)`` is least at
      ``s* = sqrt(cut_s a c_t c_max / (d - 1))``, where it is
      ``cut_s + 2 sqrt(cut_s a (d - 1) c_t / c_max) + (d - 1) a``.

    ``capacity_ratio`` is ``c_t / c_max`` over the tree's links; 1 when they have one
    capacity. Trees of depth 1 (a star, a direct exchange) pay no fill. Not a bound for
    schedules that re-chunk at relays or that do not pipeline over trees. It prices given
    trees; :func:`latency_bound` bounds every fixed-chunk pipeline of the collective.

    >>> round(latency_aware_bound(6.25e-3, 7, 2e-6) * 1e3, 4)   # 6.25 + 2 sqrt(6.25e-3 x 2e-6 x 6) + 6 x 2e-6
    6.8097
    >>> latency_aware_bound(1e-3, 1, 2e-6)
    0.001
    """
    if depth <= 1 or cut_s <= 0 or per_hop_s <= 0:
        return cut_s
    k = depth - 1
    return cut_s + 2.0 * math.sqrt(cut_s * per_hop_s * k * max(0.0, capacity_ratio)) + k * per_hop_s


def merged_arcs(topo: Topology) -> dict[tuple[str, str], tuple[float, float]]:
    """Each arc's ``(capacity, latency)`` as compiler/cost.py's simulator sees it: parallel
    declarations of one arc merged, capacities added, the largest latency."""
    arcs: dict[tuple[str, str], tuple[float, float]] = {}
    for l in topo.links:
        c0, a0 = arcs.get((l.src, l.dst), (0.0, 0.0))
        arcs[(l.src, l.dst)] = (c0 + l.capacity, max(a0, l.latency))
    return arcs


def effective_capacity(capacity: float, message_cost_s: float, message_bytes: float) -> float:
    """The most bytes per second an arc moves in messages of at most ``message_bytes`` when each
    message holds it for ``message_cost_s`` besides its bytes (:func:`message_bound`'s ``c'``)."""
    return capacity * message_bytes / (message_bytes + capacity * message_cost_s)


def message_bound(kind: str, topo: Topology, ranks, root, size_bytes: float, message_bytes: float,
                  per_message_s: float, *, peers: str = "ring") -> float:
    """A lower bound, under compiler/cost.py's α-β rules, on the time of *every* plan of the
    collective whose messages carry at most ``message_bytes`` wire bytes each (hcc's plans at a
    chunk size ``s`` carry at most ``s``); at least the bandwidth bound :func:`binding_cut`
    gives. Arithmetic:

    - the binding cut's arcs (capacity ``C`` in total) must carry ``B = factor x M`` bytes
      (the cut bound ``B / C``);
    - in the cost model a message of ``b <= s`` bytes holds each arc ``e`` of its path for
      ``α(e) + per_message_s + b / c(e) >= b (1 / c(e) + a(e) / s)``, ``a(e) = α(e) +
      per_message_s`` (parallel declarations merged as the simulator merges them: capacities
      added, the largest latency), and an arc's reservations never overlap and end by ``T``;
    - so ``T c(e) >= B(e) (1 + c(e) a(e) / s)`` on every arc: in ``T`` an arc carries at most
      ``T c'(e)`` bytes, ``c'(e) = c(e) s / (s + c(e) a(e))`` its *effective capacity* at
      messages of ``s`` bytes;
    - every cut bound counts only the bytes that cross each arc against its capacity, so it
      holds with ``c'`` in place of ``c``: the bound is the binding cut's time in the network
      of effective capacities (at least ``(B / C)(1 + min_e c(e) a(e) / s)`` over the first
      network's binding cut, and tighter where the cut mixes fast and slow arcs: on two A100
      servers, whose GPUs receive over a 300 GB/s NVSwitch port and a 25 GB/s NIC, 2 us per
      message costs the port 600 kB of every message, the NIC 50 kB).

    It says what the chunk size costs whatever the schedule: DGX-1 broadcast at 1 MiB chunks
    (NVLink, 25 GB/s x 2 us = 50 kB per message) is at least 4.8 % over its cut. It has no
    pipeline-fill term: the cost model lets a message cut through ranks to any rank (a
    route is any path), so a hop distance binds no plan of the model; the fill of
    chunk-pipelined trees is :func:`latency_aware_bound`'s. ``inf`` for a plan of zero-size
    messages; the cut bound alone when ``message_bytes`` is 0 or the kind has no cut.

    >>> from hcc.ir.topology import Link
    >>> t = Topology("pair", ("a", "b"), links=(Link("a", "b", 1e9, 1e-6), Link("b", "a", 1e9, 1e-6)))
    >>> message_bound("broadcast", t, ("a", "b"), "a", 1e6, 1e5, 1e-6)   # 1 ms x (1 + 1e9 x 2e-6 / 1e5)
    0.00102
    """
    cut = binding_cut(kind, topo, tuple(ranks), root, size_bytes, peers=peers)
    if cut is None:
        return 0.0
    base = cut.time(size_bytes)
    if not message_bytes or message_bytes <= 0 or not cut.links or not math.isfinite(base):
        return base
    arcs = merged_arcs(topo.restricted(tuple(ranks)))
    k = min(arcs[e][0] * (arcs[e][1] + per_message_s) for e in set(cut.links) if e in arcs)
    s = float(message_bytes)
    eff = Topology(topo.name, topo.nodes, topo.switches, tuple(
        Link(u, v, effective_capacity(c, a + per_message_s, s), a) for (u, v), (c, a) in merged_arcs(topo).items()),
        topo.hosts)
    tight = binding_cut(kind, eff, tuple(ranks), root, size_bytes, peers=peers)
    return max(base * (1.0 + k / message_bytes), tight.time(size_bytes) if tight is not None else 0.0)


# -- the fixed-chunk pipeline bound (latency-aware) -------------------------------------------------
# hcc's lowerings cut each share into chunks "all of nearly one size" (schedule._even_chunks,
# lower._chunks): with two or more chunks per share every message of a plan at chunk s carries
# between s / 2 and s bytes. The printed latency-aware bound is over that class.
EVEN_CHUNK_RATIO = 0.5

# spacing of the chunk sizes the bound is minimised over (2^(1/16): 4.4 %); between two of
# them the bound is taken at the interval's worst ends, so it stays a bound for every s
_GRID_STEP = 2.0 ** (1.0 / 16.0)


def spread_hops(links: int, degree: int, need: int) -> int:
    """The least ``j`` with ``g_j >= need``, ``g_0 = links``, ``g_j = (1 + degree) g_(j-1) + links``:
    how many message times one byte needs to reach ``need`` ranks beyond a cut it crosses over
    ``links`` arcs when no rank sends on more than ``degree`` arcs at once
    (:func:`pipeline_cut_time`'s argument). 0 when ``need <= links`` or there is no arc.

    >>> spread_hops(1, 1, 7), spread_hops(4, 4, 7), spread_hops(8, 2, 8), spread_hops(1, 0, 3)
    (2, 1, 0, 2)
    """
    if links <= 0 or need <= links:
        return 0
    g, j = links, 0
    while g < need:
        g = (1 + degree) * g + links
        j += 1
    return j


@dataclass(frozen=True)
class PipelineCut:
    """One cut as :func:`pipeline_cut_time` prices it. ``bytes``: what must cross its arcs
    (``factor x M``); ``caps``/``costs``: each arc's capacity and per-message hold ``α +
    per_message_s``; ``hops``: :func:`spread_hops` for the ranks beyond it (0 where the kind has
    no such tail); ``hop_caps``/``hop_costs``: every arc whose hold bounds one message time of
    that tail (the cut's arcs and the outgoing arcs of the ranks beyond it, incoming for the
    reversed kinds)."""

    cut: Cut
    bytes: float
    caps: tuple[float, ...]
    costs: tuple[float, ...]
    hops: int
    hop_caps: tuple[float, ...]
    hop_costs: tuple[float, ...]
    links_out: int  # arcs of the cut (the spread's first fan-out)
    degree: int  # the most arcs a rank beyond the cut sends on (receives on, reversed)
    beyond: int  # ranks beyond the cut that need every byte

    def rate_time(self, s: float) -> float:
        """The cut's time at messages of at most ``s`` bytes (its arcs at effective capacity)."""
        cap = sum(effective_capacity(c, k, s) for c, k in zip(self.caps, self.costs))
        return self.bytes / cap if cap > 0 else math.inf

    def hop_time(self, s_lo: float) -> float:
        """The least time one message of at least ``s_lo`` bytes holds its first counted arc."""
        return min((k + s_lo / c for c, k in zip(self.hop_caps, self.hop_costs)), default=0.0)

    def time(self, s_hi: float, s_lo: float) -> float:
        return self.rate_time(s_hi) + (self.hops * self.hop_time(s_lo) if self.hops else 0.0)


# kinds whose cut bound moves bytes from inside S to every rank outside (forward) or gathers
# every outside rank's contribution into S (reversed): the ones with a spreading tail
_SPREAD_KINDS = {"broadcast": False, "allgather": False, "reduce": True, "reduce_scatter": True}


def pipeline_cuts(kind: str, topo: Topology, ranks, root, size_bytes: float, per_message_s: float,
                  cut: Cut | None = None) -> list[PipelineCut]:
    """The cuts :func:`latency_bound` prices: the binding cut (``cut``, else computed) and for
    broadcast / reduce the root's own arcs out / in."""
    ranks = tuple(ranks)
    if cut is None:
        cut = binding_cut(kind, topo, ranks, root, size_bytes)
    if cut is None:
        return []
    sub = topo.restricted(ranks)
    arcs = merged_arcs(sub)
    rank_set = set(ranks)
    reverse = _SPREAD_KINDS.get(kind)
    cuts = [cut]
    rname = _root_name(kind, ranks, root) if kind in ("broadcast", "reduce") else None
    if rname is not None:
        if kind == "broadcast":
            links = tuple(sorted(a for a in arcs if a[0] == rname))
        else:
            links = tuple(sorted(a for a in arcs if a[1] == rname))
        cap = sum(arcs[a][0] for a in links)
        if links and (set(links) != set(cut.links)):
            cuts.append(Cut(kind, (rname,), links, cap, 1, 1.0, "in" if reverse else "out",
                            f"the root's own links ({'out' if not reverse else 'in'})"))
    side = 1 if reverse else 0  # the rank end of the arcs a rank sends on (receives on, reversed)
    out = []
    for c in cuts:
        try:
            cc = [arcs[a] for a in c.links]
        except KeyError:
            continue
        outside = rank_set - set(c.vertices)
        # only ranks beyond the cut relay the last byte (gather contributions, reversed) before
        # it reaches them all: their arcs and the cut's bound the spread
        own = [a for a in arcs if a[side] in outside] if reverse is not None else []
        count: dict[str, int] = {}
        for a in own:
            count[a[side]] = count.get(a[side], 0) + 1
        degree = max(count.values(), default=0)
        hops = spread_hops(len(c.links), degree, len(outside)) if reverse is not None and c.kind == kind else 0
        h = sorted(set(own) | set(c.links))
        out.append(PipelineCut(c, c.factor * size_bytes, tuple(x for x, _ in cc),
                               tuple(a + per_message_s for _, a in cc), hops,
                               tuple(arcs[a][0] for a in h), tuple(arcs[a][1] + per_message_s for a in h),
                               len(c.links), degree, len(outside)))
    return out


def pipeline_cut_time(cuts: list[PipelineCut], s_hi: float, s_lo: float) -> float:
    """A lower bound, under compiler/cost.py's rules, on the time of every plan whose messages
    each carry between ``s_lo`` and ``s_hi`` wire bytes and whose ranks send only data they
    hold (a verified plan), for each of ``cuts`` (:func:`pipeline_cuts`); the largest.

    Per cut (arcs E, capacities c, per-message holds a = α + per-message cost):

    - *rate*: a message of ``b <= s_hi`` bytes holds an arc for ``a + b / c >= b / c'``,
      ``c' = c s_hi / (s_hi + c a)``, and an arc's holds never overlap: by the time ``ε`` the
      last byte crosses the cut for the first time, the cut has carried every byte that must
      cross: ``ε >= F / Σ_E c'`` (the message bound on that cut);
    - *tail* (broadcast, allgather): at ``ε`` no rank beyond the cut holds that byte (every
      message delivering it crosses a cut arc, and a message ends no earlier than any of its
      arcs' holds). From then on each cut arc can end one hold per message time ``τ`` and each
      holder beyond, on each of its at most ``Δ`` outgoing arcs, one more (a hold lasts at
      least ``τ = min (a + s_lo / c)`` over the cut's arcs and those arcs): ``j``
      message times reach at most ``g_j = (1 + Δ) g_(j-1) + K`` ranks beyond, ``g_0 = K``
      (``K`` cut arcs). ``N`` ranks beyond need ``h = spread_hops(K, Δ, N)`` message times:
      ``T >= ε + h τ``;
    - reduce and reduce-scatter are the mirror: contributions from the ``N`` ranks beyond
      first reach S only through cut arcs, a rank beyond's set of contributions not yet in S
      grows only by messages from ranks beyond, at most ``Δ`` incoming per message time, and
      the last byte's final crossing starts at least ``h τ`` after time 0 while every byte's
      final crossing starts no earlier:
      ``T >= h τ + F / Σ_E c'``.

    Small messages shrink ``τ``: a schedule free to shrink its last chunks pays almost no tail,
    so this binds only fixed-chunk pipelines (``s_lo`` close to ``s_hi``)."""
    return max((c.time(s_hi, s_lo) for c in cuts), default=0.0)


@dataclass(frozen=True)
class LatencyBound:
    """:func:`latency_bound`'s result: ``time_s``, and the arithmetic at the chunk size ``chunk_bytes``
    where it is least: the binding cut's ``rate_s`` (its arcs at effective capacity), ``hops``
    message times of ``hop_s`` each for the last byte to reach the ``beyond`` ranks past the
    cut's ``links_out`` arcs (at most ``degree`` arcs per rank), ``cut`` the one that binds."""

    time_s: float
    chunk_bytes: float
    rate_s: float
    hops: int
    hop_s: float
    links_out: int
    degree: int
    beyond: int
    cut: Cut | None


def latency_bound(kind: str, topo: Topology, ranks, root, size_bytes: float, per_message_s: float, *,
                  cut: Cut | None = None, itemsize: int = 1,
                  ratio: float = EVEN_CHUNK_RATIO) -> LatencyBound | None:
    """The least time of a *fixed-chunk pipeline*: any plan whose messages, for some chunk size s,
    all carry between ``ratio x s`` and ``s`` bytes (hcc's plans: :data:`EVEN_CHUNK_RATIO`): the
    minimum over s of :func:`pipeline_cut_time`. Minimised over a grid of s spaced by
    :data:`_GRID_STEP`; between neighbours ``s_i < s < s_(i+1)`` it takes the rate at
    ``s_(i+1)`` and the tail at ``s_i``, and above ``size_bytes`` (no message is larger) the
    rate at ``size_bytes``, so it is a bound for every s. None without a cut.

    >>> from hcc.ir.topology import Link
    >>> t = Topology("star", ("a", "b", "c", "d"), ("x",), tuple(
    ...     Link(u, v, 1e9, 1e-6) for r in "abcd" for u, v in ((r, "x"), ("x", r))))
    >>> lb = latency_bound("broadcast", t, ("a", "b", "c", "d"), "a", 1e8, 1e-6)
    >>> lb.hops, round(lb.time_s / 0.1, 3)   # 1 message time after the root's last byte
    (1, 1.006)
    """
    cuts = pipeline_cuts(kind, topo, ranks, root, size_bytes, per_message_s, cut=cut)
    if not cuts or not size_bytes > 0:
        return None
    top = float(size_bytes)
    grid = [float(max(1, itemsize))]
    while grid[-1] * _GRID_STEP < top:
        grid.append(grid[-1] * _GRID_STEP)
    grid.append(top)
    caps = [np.array(c.caps) for c in cuts]
    costs = [np.array(c.costs) for c in cuts]
    hs = np.array(grid)

    def rate(i: int) -> np.ndarray:  # cut i's rate time at every grid size
        c, k = caps[i][None, :], costs[i][None, :]
        eff = (c * hs[:, None] / (hs[:, None] + c * k)).sum(axis=1)
        return np.where(eff > 0, cuts[i].bytes / np.maximum(eff, 1e-300), np.inf)

    def tail(i: int, lo: np.ndarray) -> np.ndarray:
        if not cuts[i].hops:
            return np.zeros_like(lo)
        c, k = np.array(cuts[i].hop_caps)[None, :], np.array(cuts[i].hop_costs)[None, :]
        return cuts[i].hops * (k + ratio * lo[:, None] / c).min(axis=1)

    # cell j covers s in [grid[j-1], grid[j]] (cell 0: below the first size; the last: above
    # the buffer); its value is a lower bound of every s inside it
    lo_ends = np.concatenate(([0.0], hs))
    hi_ends = np.concatenate((hs, [top]))
    hi_idx = np.concatenate((np.arange(len(hs)), [len(hs) - 1]))
    per_cut = []
    for i in range(len(cuts)):
        r = rate(i)[hi_idx]
        per_cut.append((r, tail(i, lo_ends)))
    totals = np.max([r + t for r, t in per_cut], axis=0)
    j = int(np.argmin(totals))
    i = int(np.argmax([r[j] + t[j] for r, t in per_cut]))
    pc = cuts[i]
    return LatencyBound(float(totals[j]), float(hi_ends[j]), float(per_cut[i][0][j]), pc.hops,
                        float(pc.hop_time(ratio * lo_ends[j])) if pc.hops else 0.0, pc.links_out,
                        pc.degree, pc.beyond, pc.cut)
