"""Tree packing (compiler/treepack.py): rates against the cut bounds, tree structure, link
loads, few trees on DGX-1, switches, and the large instances of issue 2."""
from __future__ import annotations

import math
import random

import networkx as nx
import numpy as np
import pytest

from hcc.compiler import bounds, treepack
from hcc.compiler.treepack import PackError, min_arborescence, pack_allgather, pack_broadcast

from test_bounds import G, cluster, dgx1, fat_tree, nx_broadcast, random_topology, ring, star, two_hosts


def check_packing(topo, ranks, packing, reverse: bool = False) -> dict:
    """Every tree a rank-level arborescence spanning ``ranks`` from its root, every edge
    routed over existing links through switches only, and every link loaded within its
    capacity (1e-9 relative). Returns the per-link load."""
    g = topo.restricted(tuple(ranks)).graph()
    switches = set(topo.switches)
    load: dict[tuple[str, str], float] = {}
    for t in packing.trees:
        assert t.root in ranks
        parent = {}
        for p, c, path in t.edges:
            assert c not in parent and c != t.root, "each non-root rank has exactly one parent"
            parent[c] = p
            assert path[0] == p and path[-1] == c
            assert all(v in switches for v in path[1:-1]), "inner vertices are switches"
            arcs = list(zip(path, path[1:]))
            if reverse:  # data flows child -> parent: the original arcs are the reversed path
                arcs = [(b, a) for a, b in arcs]
            for a, b in arcs:
                assert g.has_edge(a, b), f"{a}->{b} is not a link"
                load[(a, b)] = load.get((a, b), 0.0) + t.rate
        assert set(parent) == set(ranks) - {t.root}, "spans every rank"
        for v in parent:  # reaches the root: no cycle
            seen, u = set(), v
            while u != t.root:
                assert u not in seen
                seen.add(u)
                u = parent[u]
    for (a, b), x in load.items():
        assert x <= g[a][b]["capacity"] * (1 + 1e-9), f"{a}->{b} overloaded"
    return load


def per_root_rate(packing) -> dict[str, float]:
    got: dict[str, float] = {}
    for t in packing.trees:
        got[t.root] = got.get(t.root, 0.0) + t.rate
    return got


# ------------------------------------------------------------------- min-cost arborescence


@pytest.mark.parametrize("seed", range(8))
def test_min_arborescence_matches_networkx(seed):
    rnd = random.Random(seed)
    n = rnd.randint(2, 12)
    cost = [[rnd.choice([math.inf, rnd.randint(0, 20)]) if i != j else 0 for j in range(n)] for i in range(n)]
    for i in range(n):  # a path keeps every vertex reachable from 0
        if i + 1 < n:
            cost[i][i + 1] = rnd.randint(0, 20)
    par = min_arborescence(cost, 0)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for i in range(n):
        for j in range(1, n):
            if i != j and math.isfinite(cost[i][j]):
                g.add_edge(i, j, weight=cost[i][j])
    ref = nx.minimum_spanning_arborescence(g, attr="weight")
    ours = sum(cost[p][v] for v, p in enumerate(par) if p != -1)
    assert par[0] == -1 and sum(1 for p in par if p == -1) == 1
    assert ours == pytest.approx(ref.size(weight="weight"))


def test_min_arborescence_unreachable_is_none():
    assert min_arborescence([[0, math.inf], [1, 0]], 0) is None


# ---------------------------------------------------------------- broadcast / reduce rates

ENDPOINT_ONLY = {
    "dgx1": (dgx1(), dgx1().nodes),
    "dgx1_frag": (dgx1(), ("gpu0", "gpu1", "gpu2", "gpu5")),
    "ring7": (ring(7), ring(7).nodes),
    "uniring5": (ring(5, bidir=False), ring(5, bidir=False).nodes),
    "rand4": (random_topology(4, 6), random_topology(4, 6).nodes),
    "rand5": (random_topology(5, 8), random_topology(5, 8).nodes),
    "rand6": (random_topology(6, 5), random_topology(6, 5).nodes),
}


@pytest.mark.parametrize("name", sorted(ENDPOINT_ONLY))
def test_broadcast_and_reduce_reach_edmonds_bound(name):
    topo, ranks = ENDPOINT_ONLY[name]
    for root in ranks[:3]:
        for reverse in (False, True):
            p = pack_broadcast(topo, ranks, root, reverse=reverse, few_trees=False)
            want = nx_broadcast(topo, ranks, root, reverse=reverse)  # independent max-flow
            assert p.lp_rate == pytest.approx(want, rel=1e-6)
            assert p.rate == pytest.approx(want, rel=1e-6)
            assert abs(p.gap) < 1e-6
            check_packing(topo, ranks, p, reverse)


@pytest.mark.parametrize("name", sorted(ENDPOINT_ONLY))
def test_allgather_and_reduce_scatter_reach_forestcoll_bound(name):
    topo, ranks = ENDPOINT_ONLY[name]
    for reverse in (False, True):
        p = pack_allgather(topo, ranks, reverse=reverse, few_trees=False)
        assert p.rate == pytest.approx(bounds.allgather_rate_bound(topo, ranks, reverse=reverse), rel=1e-6)
        assert set(p.roots) == set(ranks)
        for r, x in per_root_rate(p).items():
            assert x == pytest.approx(p.rate, rel=1e-9), f"root {r} gets its share"
        check_packing(topo, ranks, p, reverse)


def test_dgx1_broadcast_150_gbps_with_exactly_four_trees():
    topo = dgx1()
    pack_broadcast(topo, topo.nodes, "gpu1")  # warm the imports before timing
    # the default 1 s CP-SAT budget proves 4 optimal in about 0.07 s on an idle machine; the
    # test gives it room for a loaded one (speed is test_dgx1_every_collective_packs_fast's)
    p = pack_broadcast(topo, topo.nodes, "gpu0", few_trees_time=10.0)
    assert p.rate == pytest.approx(150 * G, rel=1e-9)
    assert len(p.trees) == 4, p.method
    assert p.lp_trees > 4  # the LP's own columns are not few: CP-SAT built its own trees
    assert "cpsat(optimal" in p.method
    check_packing(topo, topo.nodes, p)


def test_dgx1_every_collective_packs_at_the_bound():
    # speed is measured in benchmarks/compile_bench.py; here: every root's packing is optimal,
    # reached by the solver's own stopping rules, never by the wall-clock safety net
    topo = dgx1()
    treepack.clear_cache()
    packs = [pack_broadcast(topo, topo.nodes, root, reverse=rev) for root in topo.nodes for rev in (False, True)]
    packs += [pack_allgather(topo, topo.nodes, reverse=rev) for rev in (False, True)]
    for p in packs:
        assert p.gap < 1e-6 and "safety net" not in p.method, p.method


def test_allgather_few_trees_keep_the_exact_rate():
    # ring of 5 with 10/20 GB/s directions: the LP uses 10 trees; CP-SAT, with the quantum
    # derived from the exact cut-bound fraction, proves 7 enough at the same per-root rate
    topo = ring(5)
    for reverse in (False, True):
        p = pack_allgather(topo, topo.nodes, reverse=reverse, few_trees_time=10.0)
        assert "cpsat(optimal" in p.method
        assert len(p.trees) < p.lp_trees
        assert p.rate == pytest.approx(bounds.allgather_rate_bound(topo, topo.nodes, reverse=reverse), rel=1e-9)
        for x in per_root_rate(p).values():
            assert x == pytest.approx(p.rate, rel=1e-9)
        check_packing(topo, topo.nodes, p, reverse)


def test_few_trees_with_tolerance_keeps_the_rate_promise():
    topo = dgx1()
    for tol in (0.0, 0.2):
        p = pack_broadcast(topo, topo.nodes, "gpu3", tolerance=tol)
        assert p.rate >= (1 - tol) * p.lp_rate * (1 - 1e-9)
        assert len(p.trees) <= p.lp_trees
        check_packing(topo, topo.nodes, p)


def test_wall_clock_safety_net_is_reported_and_still_packs():
    topo = dgx1()
    p = pack_broadcast(topo, topo.nodes, "gpu0", time_limit=1e-6)
    assert "safety net" in p.method
    check_packing(topo, topo.nodes, p)


def test_round_limit_is_a_count_not_a_clock(monkeypatch):
    """Column generation stops after _MAX_ROUNDS pricing rounds, whatever the clock says:
    a 1-round limit gives the same (feasible, sub-optimal) packing every time."""
    import hcc.compiler.treepack as tp
    import hcc.compiler.treepack_master as tm

    monkeypatch.setattr(tm, "_MAX_ROUNDS", 1)
    topo = dgx1()
    got = []
    for _ in range(2):
        tp.clear_cache()
        p = tp.pack_broadcast(topo, topo.nodes, "gpu0", few_trees=False)
        check_packing(topo, topo.nodes, p)
        got.append((p.method, p.rate, p.trees))
    tp.clear_cache()
    assert got[0][0] == "colgen(round limit)"
    assert got[0] == got[1]
    assert got[0][1] < p.bound * (1 - 1e-6)  # one round cannot reach DGX-1's 160 GB/s


def test_few_trees_is_deterministic_across_calls():
    """CP-SAT runs on a deterministic budget with one worker: repeated solves agree."""
    import hcc.compiler.treepack as tp

    topo = dgx1()
    runs = []
    for _ in range(2):
        tp.clear_cache()
        p = tp.pack_broadcast(topo, topo.nodes, "gpu0")
        runs.append((p.method, len(p.trees), tuple(sorted(t.edges for t in p.trees))))
    tp.clear_cache()
    assert runs[0] == runs[1]
    assert "cpsat" in runs[0][0]


# ------------------------------------------------------------------------------ switches


def test_nvswitch_reaches_bounds():
    topo = star(8, 150 * G, 150 * G)
    p = pack_broadcast(topo, topo.nodes, "g0")
    assert p.rate == pytest.approx(150 * G, rel=1e-6)
    check_packing(topo, topo.nodes, p)
    q = pack_allgather(topo, topo.nodes)
    assert q.rate == pytest.approx(150 * G / 7, rel=1e-6)
    check_packing(topo, topo.nodes, q)


def test_two_hosts_with_tor_reports_zero_gap():
    topo = two_hosts()
    for reverse in (False, True):
        p = pack_allgather(topo, topo.nodes, reverse=reverse)
        assert p.gap == pytest.approx(0.0, abs=1e-6)
        check_packing(topo, topo.nodes, p, reverse)
        b = pack_broadcast(topo, topo.nodes, "h1.gpu2", reverse=reverse)
        assert b.gap == pytest.approx(0.0, abs=1e-6)
        check_packing(topo, topo.nodes, b, reverse)


def test_asymmetric_switch_gap_is_reported_honestly():
    # uplinks 10, downlinks 30 GB/s: not Eulerian. Whatever the packing, its rate never
    # beats the bound and the reported gap is exactly 1 - rate/bound.
    topo = star(5, up=10 * G, down=30 * G)
    for p in (pack_broadcast(topo, topo.nodes, "g0"), pack_allgather(topo, topo.nodes)):
        assert p.rate <= p.bound * (1 + 1e-9)
        assert p.gap == pytest.approx(1 - p.rate / p.bound)
        check_packing(topo, topo.nodes, p)


def test_cluster_32_ranks_allgather_at_the_bound():
    topo = cluster(4)
    p = pack_allgather(topo, topo.nodes)
    assert p.rate == pytest.approx(bounds.allgather_rate_bound(topo, topo.nodes), rel=1e-6)
    assert p.gap < 1e-6
    check_packing(topo, topo.nodes, p)
    assert "safety net" not in p.method  # speed: benchmarks/compile_bench.py


@pytest.mark.parametrize("n", [128, 256])
def test_fat_tree_packs_at_the_bound(n):
    topo = fat_tree(n, per_leaf=16, spines=8)
    b = pack_broadcast(topo, topo.nodes, "r3")
    assert b.rate == pytest.approx(25 * G, rel=1e-6)
    check_packing(topo, topo.nodes, b)
    a = pack_allgather(topo, topo.nodes, reverse=True)
    assert a.rate == pytest.approx(25 * G / (n - 1), rel=1e-6)
    assert "safety net" not in a.method


def test_unreachable_rank_is_a_clear_error():
    topo = dgx1()
    with pytest.raises(PackError, match="gpu6"):
        pack_broadcast(topo, ("gpu0", "gpu1", "gpu3", "gpu6"), "gpu0")
    with pytest.raises(PackError, match="not one of the ranks"):
        pack_broadcast(topo, ("gpu0", "gpu1"), "gpu5")


def test_single_rank_is_trivial():
    topo = dgx1()
    p = pack_broadcast(topo, ("gpu2",), "gpu2")
    assert p.trees[0].edges == () and p.method == "trivial"


def test_quanta_are_gcd_fractions():
    q = treepack._quanta(np.array([50e9, 25e9, 75e9]))
    assert [float(x) for x in q] == [25e9, 12.5e9, 6.25e9]
    assert treepack._quanta(np.array([1.5, 2.0])) == []


@pytest.mark.parametrize("make", [cluster, two_hosts, lambda: fat_tree(32, 8, 2)]
                         + [lambda s=s: random_topology(s, 6, switch=True) for s in range(6)])
def test_vectorised_closure_matches_dijkstra(make):
    """switches.Indexed.closure_matrix (Bellman-Ford over every rank at once) against the per-rank
    Dijkstra closure, and every route it returns costs exactly its distance."""
    from hcc.compiler.switches import Indexed

    topo = make()
    ix = Indexed.build(topo, topo.nodes)
    rnd = random.Random(7)
    y = [rnd.random() for _ in ix.links]
    d_ref, _ = ix.closure(y)
    d, route = ix.closure_matrix(y)
    link = ix.link_of()
    n = len(ix.ranks)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            assert d[i, j] == pytest.approx(d_ref[i][j], rel=1e-12)
            path = route(i, j)
            if path is None:
                assert math.isinf(d_ref[i][j])
                continue
            assert path[0] == ix.ranks[i] and path[-1] == ix.ranks[j]
            assert all(ix.is_switch[v] for v in path[1:-1])
            assert sum(y[link[(a, b)]] for a, b in zip(path, path[1:])) == pytest.approx(d[i, j], rel=1e-12)


def test_packings_are_memoised_values():
    topo = ring(4)
    a = pack_broadcast(topo, topo.nodes, "r1")
    assert pack_broadcast(topo, list(topo.nodes), "r1") is a
    assert pack_broadcast(topo, topo.nodes, "r1", reverse=True) is not a
    treepack.clear_cache()
    b = pack_broadcast(topo, topo.nodes, "r1")
    assert b is not a and b.rate == pytest.approx(a.rate)


def test_few_trees_are_deterministic_under_a_work_budget():
    # the allgather search stops on its deterministic budget (not proven optimal), yet two
    # runs give the same trees: golden compile summaries compare tree counts
    # (shallow=False: the CP-SAT search over the first phase's trees; with the depth-bounded
    # phase, DGX-1's 2-level trees stay as the LP gives them, test_treepack_shallow.py)
    topo = dgx1()
    treepack.clear_cache()
    a = pack_allgather(topo, topo.nodes, shallow=False)
    treepack.clear_cache()
    b = pack_allgather(topo, topo.nodes, shallow=False)
    assert a.trees == b.trees and a.method == b.method
    assert len(a.trees) < a.lp_trees, a.method  # 13 vs 31 when measured
    check_packing(topo, topo.nodes, a)
