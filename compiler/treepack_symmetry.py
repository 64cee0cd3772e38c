"""hcc.compiler.treepack_symmetry — allgather packing over hosts that are translates of one
another (32 racks of a fat tree, 64 DGX-1s).

The cyclic group of host translations maps the topology onto itself. The allgather master
is invariant under it, so averaging an optimal packing over the group gives a symmetric one
of the same rate: the symmetric master (one column = a tree rooted in the first host plus its
translates at one weight, one row per orbit of links) has the full master's optimum, and
prices one root per host slot per round instead of one per rank.

The same holds for any group of automorphisms of the rank graph in which no element but the
identity fixes a rank (:func:`_rank_symmetry`, small switchless graphs: one MI250 node's
xGMI mesh has 4, with four rank orbits of 4 GCDs): a column is a tree rooted
at a rank of ``slots`` (one per rank orbit) with its images under every element, and
treepack_shallow.py's depth-bounded phase runs on the same master.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.topology import Topology
from . import progress
from .switches import Indexed
from .treepack_master import (_EPS, _MAX_ROUNDS, _bare_trees, _Col, _depth, _Master, _Pricer, _root_tree, _round_end,
                             _shallowest)

# allgather packs of more than this many ranks whose hosts are translates of one another
# solve the host-symmetric master (:func:`_colgen_symmetric`): one root per host slot is
# priced per round, 8 on 64 DGX-1s instead of 512 (the plain master took 77 s per round
# there); the samples up to the 128-rank fat tree keep the plain master and their trees
_SYMMETRY_MIN_RANKS = 129



@dataclass(frozen=True)
class _Symmetry:
    """The cyclic group of host translations: ``sigma`` maps vertex ``h_i.x`` to ``h_{i+1}.x``
    (hosts in order of first appearance, the last back to the first) and fixes vertices
    outside hosts. Only built when it is an automorphism of the indexed graph (every link
    maps to a link of the same capacity) that maps ranks to ranks."""

    vperm: tuple[tuple[int, ...], ...]  # per power k: vertex index -> vertex index
    rperm: tuple[tuple[int, ...], ...]  # per power k: rank position -> rank position
    lperm: tuple[tuple[int, ...], ...]  # per power k: link index -> link index
    slots: tuple[int, ...]  # rank positions of the first host: one root per orbit
    orbit: tuple[int, ...]  # link index -> link orbit (a row of the symmetric master)
    weight: tuple[int, ...]  # per orbit: H / |orbit|


def _host_symmetry(topo: Topology, ranks: tuple[str, ...], ix: Indexed) -> _Symmetry | None:
    """The host translations of :func:`switches.host_translation` in ``ix``'s indices."""
    from .switches import host_translation

    found = host_translation(topo, ranks)
    if found is None:
        return None
    names, H = found
    index = {v: i for i, v in enumerate(ix.vertices)}
    sigma = [index[names[v]] for v in ix.vertices]
    link_of = ix.link_of()
    pi = [link_of[(sigma[a], sigma[b])] for a, b, _ in ix.links]
    vperm, lperm = [tuple(range(len(sigma)))], [tuple(range(len(pi)))]
    for _ in range(H - 1):
        vperm.append(tuple(sigma[v] for v in vperm[-1]))
        lperm.append(tuple(pi[l] for l in lperm[-1]))
    rpos = {v: j for j, v in enumerate(ix.ranks)}
    rperm = tuple(tuple(rpos[vp[r]] for r in ix.ranks) for vp in vperm)
    orbit = [-1] * len(pi)
    sizes = []
    for li in range(len(pi)):
        if orbit[li] >= 0:
            continue
        k, size = li, 0
        while orbit[k] < 0:
            orbit[k] = len(sizes)
            size += 1
            k = pi[k]
        sizes.append(size)
    host_of = dict(topo.hosts)
    slots = tuple(j for j, v in enumerate(ranks) if host_of[v] == host_of[ranks[0]])
    return _Symmetry(tuple(vperm), rperm, tuple(lperm), slots, tuple(orbit), tuple(H // s for s in sizes))


# a switchless allgather pack of at most _SHALLOW_PHASE_MAX_RANKS ranks (treepack.py) whose rank
# graph has between 2 and _RANK_GROUP_MAX automorphisms, each moving every rank, solves the
# symmetric master over them (:func:`_rank_symmetry`): one MI250 node's xGMI mesh has 4 (16
# ranks, 4 root orbits), so both phases price 4 roots per round instead of 16. A larger group
# is not enumerated (a switch's ports or a full mesh have factorially many)
_RANK_GROUP_MAX = 64


def _rank_symmetry(ix: Indexed) -> _Symmetry | None:
    """The automorphisms of ``ix``'s graph (vertex maps keeping every arc's capacity and
    mapping ranks to ranks) when there are 2 to _RANK_GROUP_MAX of them and none but the
    identity fixes a rank, as a :class:`_Symmetry` (element 0 the identity; slots the least
    rank position of each rank orbit); else None. Without a fixed rank every tree's
    images have distinct roots, so a column of the symmetric master gives each root of an
    orbit one tree, as host translations do."""
    import networkx as nx
    from networkx.algorithms.isomorphism import DiGraphMatcher

    rank_set = set(ix.ranks)
    g = nx.DiGraph()
    for v in range(len(ix.vertices)):
        g.add_node(v, kind=(ix.is_switch[v], v in rank_set))
    for a, b, c in ix.links:
        g.add_edge(a, b, capacity=c)
    matcher = DiGraphMatcher(g, g, node_match=lambda x, y: x["kind"] == y["kind"],
                             edge_match=lambda x, y: x["capacity"] == y["capacity"])
    maps = []
    for m in matcher.isomorphisms_iter():
        maps.append(m)
        if len(maps) > _RANK_GROUP_MAX:
            return None
    if len(maps) < 2:
        return None
    nv = len(ix.vertices)
    ident = tuple(range(nv))
    vperm = sorted((tuple(m[v] for v in range(nv)) for m in maps), key=lambda p: p != ident)
    rpos = {v: j for j, v in enumerate(ix.ranks)}
    rperm = tuple(tuple(rpos[vp[r]] for r in ix.ranks) for vp in vperm)
    if any(rp[j] == j for rp in rperm[1:] for j in range(len(rp))):
        return None
    link_of = ix.link_of()
    lperm = tuple(tuple(link_of[(vp[a], vp[b])] for a, b, _ in ix.links) for vp in vperm)
    orbit = [-1] * len(ix.links)
    sizes: list[int] = []
    for li in range(len(ix.links)):
        if orbit[li] < 0:
            members = {lp[li] for lp in lperm}
            for k in members:
                orbit[k] = len(sizes)
            sizes.append(len(members))
    slots = tuple(sorted(min(rp[j] for rp in rperm) for j in range(len(ix.ranks))
                         if min(rp[j] for rp in rperm) == j))
    G = len(vperm)
    return _Symmetry(tuple(vperm), rperm, lperm, slots, tuple(orbit), tuple(G // s for s in sizes))


def _orbit_usage(col: _Col, sym: _Symmetry) -> tuple[tuple[int, float], ...]:
    """``col``'s row coefficients in the symmetric master: per link orbit L, (|G| / |L|) x the
    tree's uses of L's links (the load each link of L gets from the tree and its images)."""
    use: dict[int, float] = {}
    for li, m in col.usage:
        o = sym.orbit[li]
        use[o] = use.get(o, 0.0) + m * sym.weight[o]
    return tuple(sorted(use.items()))


def _orbit_caps(capn: np.ndarray, sym: _Symmetry) -> np.ndarray:
    """The capacity of each link orbit's row (every link of an orbit has the same)."""
    orbit = np.array(sym.orbit)
    rep = np.zeros(len(sym.weight), dtype=int)
    rep[orbit[::-1]] = np.arange(len(orbit))[::-1]  # first link of each orbit
    return capn[rep]


def _translate(col: _Col, sym: _Symmetry, k: int) -> _Col:
    """The tree ``col`` moved k hosts on."""
    if k == 0:
        return col
    from operator import itemgetter

    rp, vp, lp = sym.rperm[k], sym.vperm[k], sym.lperm[k]
    n = len(col.parent)
    par, paths = [-1] * n, [()] * n
    for v, p in enumerate(col.parent):
        par[rp[v]] = -1 if p == -1 else rp[p]
        if p != -1:
            paths[rp[v]] = itemgetter(*col.paths[v])(vp)
    return _Col(rp[col.root], tuple(par), tuple(paths), tuple(sorted((lp[li], m) for li, m in col.usage)))


def _colgen_symmetric(ix: Indexed, pricer: _Pricer, sym: _Symmetry, deadline: float, bound: float,
                      seeds: list[_Col], max_rounds: int = 0, shallowest: bool = True):
    """Column generation of the allgather packing restricted to host-symmetric packings: a
    column is a tree T rooted at a rank of the first host together with its H translates,
    all at one weight. The LP is invariant under the translations, so averaging any optimal
    packing over them gives a symmetric one of the same rate: this master has the same
    optimum as the full one (and is proved optimal the same ways: no column prices below
    z, or the cut bound is met). Translated columns load translated links equally, so the
    link rows of one orbit are the same constraint and the master keeps one per orbit: row
    L of T's column is (H / |L|) x T's uses of L's links. Pricing is the ordinary tree
    pricing under the link costs y(e) = (H / |L(e)|) x the dual of e's orbit, for one root
    per host slot: 8 minimum arborescences per round on 64 DGX-1s instead of 512.

    Returns (weights, columns, objective, scale, stop) like :func:`_colgen`; the columns are
    the representatives (expand with :func:`_translate`). ``shallowest``: end with
    treepack_master._shallowest (the least depth-weighted packing of the rate found), for
    callers that run no depth-bounded phase after it."""
    orbit, weight = np.array(sym.orbit), np.array(sym.weight, dtype=float)
    scale = float(pricer.cap.max())
    master = _Master(_orbit_caps(pricer.cap, sym) / scale, list(sym.slots))
    trees: list[_Col] = []

    def add(col: _Col) -> bool:
        if master.add(_Col(col.root, col.parent, col.paths, _orbit_usage(col, sym))):
            trees.append(col)
            return True
        return False

    for col in seeds:
        if col.root in sym.slots:
            add(col)
    for col in _bare_trees(ix, pricer, sym.slots, trees, pricer.cap / scale):
        add(col)
    stop = "round limit"
    limit = max_rounds or _MAX_ROUNDS
    for k in range(limit):
        progress.report("pack", f"symmetric pricing round ({len(sym.vperm)} hosts)", k + 1, limit)
        master.solve()
        if master.objective() * scale >= bound * (1.0 - 1e-9):
            stop = ""
            break
        ybar, z = master.duals()
        y = ybar[orbit] * weight[orbit]
        w, route = pricer.matrix(y)
        added = False
        for r in sym.slots:
            col = _root_tree(ix, pricer, w, route, r)
            if sum(m * y[li] for li, m in col.usage) < z[r] * (1.0 - _EPS) and add(col):
                added = True
        end = _round_end(added, deadline)
        if end is not None:
            stop = end
            break
    master.solve()
    if shallowest:
        _shallowest(master, [_depth(c) for c in trees], master.objective())
    # x after the second phase: every root's weights sum to at least it (its root row)
    return master.weights(), trees, master.objective(), scale, stop
