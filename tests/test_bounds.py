"""Bounds of compiler/bounds.py checked against independent computations.

Every expected figure is computed here another way: networkx max-flow for broadcast/reduce,
and brute force over every vertex subset (graphs of at most 10 vertices) with networkx cut
capacities for the allgather, reduce-scatter, gather, scatter and alltoall cut bounds.
The topology builders here are shared with test_treepack.py and test_pack_properties.py.
"""
from __future__ import annotations

import itertools
import math
import random

import networkx as nx
import pytest

from hcc.compiler import bounds
from hcc.ir.topology import Link, Topology

G = 10**9  # GB/s in bytes/s


# ---------------------------------------------------------------------------- builders


def duplex(pairs) -> tuple[Link, ...]:
    out = []
    for a, b, c in pairs:
        out += [Link(a, b, float(c)), Link(b, a, float(c))]
    return tuple(out)


def dgx1() -> Topology:
    """DGX-1 V100 NVLink mesh (issue 2): 2 NVLinks on 8 pairs, 1 on 8 pairs, 25 GB/s each."""
    two = [(0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7)]
    one = [(0, 2), (0, 3), (1, 2), (1, 5), (3, 7), (4, 6), (4, 7), (5, 6)]
    pairs = [(f"gpu{a}", f"gpu{b}", 50 * G) for a, b in two] + [(f"gpu{a}", f"gpu{b}", 25 * G) for a, b in one]
    return Topology("dgx1", tuple(f"gpu{i}" for i in range(8)), (), duplex(pairs))


def ring(n: int, cap: float = 10 * G, bidir: bool = True) -> Topology:
    nodes = tuple(f"r{i}" for i in range(n))
    links = []
    for i in range(n):
        links.append(Link(nodes[i], nodes[(i + 1) % n], cap))
        if bidir:
            links.append(Link(nodes[(i + 1) % n], nodes[i], cap * 2))
    return Topology(f"ring{n}", nodes, (), tuple(links))


def star(n: int, up: float = 12 * G, down: float = 12 * G) -> Topology:
    """n ranks on one switch (NVSwitch-like when up == down)."""
    nodes = tuple(f"g{i}" for i in range(n))
    links = []
    for v in nodes:
        links += [Link(v, "sw", up), Link("sw", v, down)]
    return Topology(f"star{n}", nodes, ("sw",), tuple(links))


def two_hosts() -> Topology:
    """2 hosts x (3 GPUs on a host switch), host switches joined through a ToR (9 vertices)."""
    nodes, pairs = [], []
    for h in range(2):
        for g in range(3):
            nodes.append(f"h{h}.gpu{g}")
            pairs.append((f"h{h}.gpu{g}", f"h{h}.sw", 100 * G))
        pairs.append((f"h{h}.sw", "tor", 25 * G))
    hosts = tuple((v, v.split(".")[0]) for v in nodes) + (("h0.sw", "h0"), ("h1.sw", "h1"))
    return Topology("two_hosts", tuple(nodes), ("h0.sw", "h1.sw", "tor"), duplex(pairs), hosts)


def cluster(hosts: int = 4) -> Topology:
    """hosts x (8 GPUs + NVSwitch + 8 NICs) with a ToR: 32 ranks for 4 hosts (issue 2)."""
    nodes, sw, pairs = [], ["tor"], []
    for h in range(hosts):
        sw.append(f"h{h}.nvs")
        for g in range(8):
            nodes.append(f"h{h}.gpu{g}")
            sw.append(f"h{h}.nic{g}")
            pairs += [(f"h{h}.gpu{g}", f"h{h}.nvs", 150 * G), (f"h{h}.gpu{g}", f"h{h}.nic{g}", 25 * G),
                      (f"h{h}.nic{g}", "tor", 25 * G)]
    return Topology("cluster", tuple(nodes), tuple(sw), duplex(pairs))


def fat_tree(n: int, per_leaf: int = 16, spines: int = 8) -> Topology:
    """2-level fat tree: ranks on leaf switches (25 GB/s), every leaf to every spine with
    full bisection (per_leaf x 25 GB/s spread over the spines)."""
    leaves = n // per_leaf
    nodes = tuple(f"r{i}" for i in range(n))
    sw = tuple(f"leaf{i}" for i in range(leaves)) + tuple(f"spine{s}" for s in range(spines))
    pairs = [(f"r{i}", f"leaf{i // per_leaf}", 25 * G) for i in range(n)]
    pairs += [(f"leaf{l}", f"spine{s}", 25 * G * per_leaf // spines) for l in range(leaves) for s in range(spines)]
    return Topology(f"fat{n}", nodes, sw, duplex(pairs))


def random_topology(seed: int, n_ranks: int, switch: bool = False) -> Topology:
    """A random strongly connected digraph with whole-GB/s capacities: a directed
    Hamiltonian cycle plus random extra arcs (and, optionally, a switch on a few ranks)."""
    rnd = random.Random(seed)
    nodes = tuple(f"v{i}" for i in range(n_ranks))
    order = list(nodes)
    rnd.shuffle(order)
    links = [Link(order[i], order[(i + 1) % n_ranks], float(rnd.randint(1, 9) * G)) for i in range(n_ranks)]
    for a, b in itertools.permutations(nodes, 2):
        if rnd.random() < 0.3:
            links.append(Link(a, b, float(rnd.randint(1, 9) * G)))
    switches: tuple[str, ...] = ()
    if switch:
        switches = ("sw",)
        for v in rnd.sample(nodes, min(3, n_ranks)):
            links += [Link(v, "sw", float(rnd.randint(1, 9) * G)), Link("sw", v, float(rnd.randint(1, 9) * G))]
    return Topology(f"rand{seed}", nodes, switches, tuple(links))


# ---------------------------------------------------------------------- independent figures


def nx_graph(topo: Topology, ranks, reverse: bool = False) -> nx.DiGraph:
    g = topo.restricted(tuple(ranks)).graph()
    return g.reverse(copy=True) if reverse else g


def nx_broadcast(topo, ranks, root, reverse=False) -> float:
    g = nx_graph(topo, ranks, reverse)
    return min(nx.maximum_flow_value(g, root, v, capacity="capacity") for v in ranks if v != root)


def cut_out(g: nx.DiGraph, s: set) -> float:
    """B+(S): capacity of the arcs leaving S (nx.cut_size counts both directions on a
    DiGraph, so the boundary is summed here)."""
    return sum(c for _, _, c in nx.edge_boundary(g, s, set(g) - s, data="capacity"))


def subsets(g: nx.DiGraph):
    vs = list(g.nodes)
    for k in range(1, len(vs)):
        for s in itertools.combinations(vs, k):
            yield set(s)


def brute_allgather_time(topo, ranks, size, reverse=False) -> float:
    g, n, best = nx_graph(topo, ranks, reverse), len(ranks), 0.0
    for s in subsets(g):
        k = len(s & set(ranks))
        if 0 < k < n:
            best = max(best, k / cut_out(g, s))
    return size / n * best


def brute_gather_time(topo, ranks, root, size, reverse=False) -> float:
    g, n, best = nx_graph(topo, ranks, reverse), len(ranks), 0.0
    for s in subsets(g):
        k = len(s & set(ranks))
        if root not in s and k > 0:
            best = max(best, k / cut_out(g, s))
    return size / n * best


def brute_alltoall_time(topo, ranks, size) -> float:
    g, n, best = nx_graph(topo, ranks), len(ranks), 0.0
    for s in subsets(g):
        k = len(s & set(ranks))
        if 0 < k < n:
            best = max(best, k * (n - k) / cut_out(g, s))
    return size / n * best


SMALL = {
    "dgx1": (dgx1(), tuple(f"gpu{i}" for i in range(8))),
    "dgx1_frag": (dgx1(), ("gpu0", "gpu1", "gpu2", "gpu5")),
    "ring5": (ring(5), tuple(f"r{i}" for i in range(5))),
    "uniring6": (ring(6, bidir=False), tuple(f"r{i}" for i in range(6))),
    "star6": (star(6), tuple(f"g{i}" for i in range(6))),
    "star_asym": (star(5, up=10 * G, down=30 * G), tuple(f"g{i}" for i in range(5))),
    "nvswitch8": (star(8, 150 * G, 150 * G), tuple(f"g{i}" for i in range(8))),
    "two_hosts": (two_hosts(), two_hosts().nodes),
    "rand1": (random_topology(1, 6), random_topology(1, 6).nodes),
    "rand2": (random_topology(2, 7, switch=True), random_topology(2, 7, switch=True).nodes),
    "rand3": (random_topology(3, 5, switch=True), random_topology(3, 5, switch=True).nodes),
}
SIZE = 96 * 10**6


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", sorted(SMALL))
def test_broadcast_and_reduce_bounds_match_networkx_maxflow(name):
    topo, ranks = SMALL[name]
    for root in ranks[:3]:
        assert close(bounds.broadcast_rate_bound(topo, ranks, root), nx_broadcast(topo, ranks, root))
        assert close(bounds.reduce_rate_bound(topo, ranks, root), nx_broadcast(topo, ranks, root, reverse=True))


def test_dgx1_broadcast_bound_is_six_nvlinks():
    # GPU 0 has 2+2+1+1 NVLinks of 25 GB/s; networkx agrees the min cut is there
    topo, ranks = SMALL["dgx1"]
    assert close(bounds.broadcast_rate_bound(topo, ranks, "gpu0"), 6 * 25 * G)
    assert close(nx_broadcast(topo, ranks, "gpu0"), 6 * 25 * G)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_allgather_and_reduce_scatter_match_brute_force(name):
    topo, ranks = SMALL[name]
    assert close(bounds.allgather_time_bound(topo, ranks, SIZE), brute_allgather_time(topo, ranks, SIZE))
    rs = brute_allgather_time(topo, ranks, SIZE, reverse=True)
    assert close(bounds.reduce_scatter_time_bound(topo, ranks, SIZE), rs)
    assert close(bounds.allreduce_time_bound(topo, ranks, SIZE), 2 * brute_allgather_time(topo, ranks, SIZE))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_gather_and_scatter_match_brute_force(name):
    topo, ranks = SMALL[name]
    for root in ranks[:2]:
        assert close(bounds.gather_time_bound(topo, ranks, root, SIZE), brute_gather_time(topo, ranks, root, SIZE))
        assert close(bounds.scatter_time_bound(topo, ranks, root, SIZE),
                     brute_gather_time(topo, ranks, root, SIZE, reverse=True))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_alltoall_matches_brute_force(name):
    topo, ranks = SMALL[name]
    assert close(bounds.alltoall_time_bound(topo, ranks, SIZE), brute_alltoall_time(topo, ranks, SIZE))


@pytest.mark.parametrize("name", ["dgx1", "two_hosts", "rand2", "star6"])
def test_alltoall_family_bound_is_valid_and_at_least_the_singletons(name, monkeypatch):
    """Above 16 vertices the alltoall bound maximises over a family: never above the true
    maximum, never below the best singleton/complement cut (which the family contains)."""
    topo, ranks = SMALL[name]
    exact = brute_alltoall_time(topo, ranks, SIZE)
    monkeypatch.setattr(bounds, "_ALLTOALL_EXACT_VERTICES", 0)
    fam = bounds.alltoall_time_bound(topo, ranks, SIZE)
    g, n = nx_graph(topo, ranks), len(ranks)
    single = 0.0
    for r in ranks:
        for a in ({r}, set(ranks) - {r}):
            others = set(ranks) - a
            h = g.copy()
            h.add_edges_from((("S", v) for v in a), capacity=math.inf)
            h.add_edges_from(((v, "T") for v in others), capacity=math.inf)
            cut = nx.minimum_cut_value(h, "S", "T", capacity="capacity")
            single = max(single, len(a) * (n - len(a)) / cut)
    assert fam <= exact * (1 + 1e-9)
    assert fam >= SIZE / n * single * (1 - 1e-9)


def test_restricted_ranks_do_not_forward():
    # fragmented DGX-1 {0,1,3,6}: GPU 6 only reaches {0,1,3} through GPUs 2, 4, 7, which the
    # collective may not use, so it must be cut off: networkx on the restricted graph agrees
    topo = dgx1()
    ranks = ("gpu0", "gpu1", "gpu3", "gpu6")
    assert bounds.broadcast_rate_bound(topo, ranks, "gpu0") == 0.0
    assert nx_broadcast(topo, ranks, "gpu0") == 0.0
    assert bounds.allgather_time_bound(topo, ranks, SIZE) == math.inf


@pytest.mark.parametrize("peers", ["ring", "shift_one", "all"])
def test_neighbor_average_bound(peers):
    topo, ranks = SMALL["rand1"]
    g = nx_graph(topo, ranks)
    p = {"ring": 2, "shift_one": 1, "all": len(ranks) - 1}[peers]
    want = max(p * SIZE / min(g.in_degree(v, weight="capacity"), g.out_degree(v, weight="capacity")) for v in ranks)
    got = bounds.time_bound("neighbor_average", topo, ranks, None, SIZE, peers=peers)
    assert close(got, want)
    with pytest.raises(ValueError):
        bounds.peer_count("nearest", 4)


def test_time_bound_dispatches_every_kind():
    from hcc.ir.plan import KINDS

    topo, ranks = SMALL["two_hosts"]
    root = ranks[1]
    want = {
        "broadcast": SIZE / nx_broadcast(topo, ranks, root),
        "reduce": SIZE / nx_broadcast(topo, ranks, root, reverse=True),
        "allgather": brute_allgather_time(topo, ranks, SIZE),
        "reduce_scatter": brute_allgather_time(topo, ranks, SIZE, reverse=True),
        "allreduce": 2 * brute_allgather_time(topo, ranks, SIZE),
        "gather": brute_gather_time(topo, ranks, root, SIZE),
        "scatter": brute_gather_time(topo, ranks, root, SIZE, reverse=True),
        "alltoall": brute_alltoall_time(topo, ranks, SIZE),
    }
    for kind in KINDS:
        got = bounds.time_bound(kind, topo, ranks, 1, SIZE)  # root by rank index
        assert got > 0
        if kind in want:
            assert close(got, want[kind]), kind
    with pytest.raises(ValueError):
        bounds.time_bound("allscatter", topo, ranks, None, SIZE)


def test_non_integral_capacities_are_scaled_accurately():
    topo = Topology("odd", ("a", "b", "c"), (), duplex([("a", "b", 1.3e9 / 7), ("b", "c", 2.9e9 / 3), ("a", "c", 0.5)]))
    ranks = topo.nodes
    assert close(bounds.broadcast_rate_bound(topo, ranks, "a"), nx_broadcast(topo, ranks, "a"), 1e-11)
    assert close(bounds.allgather_time_bound(topo, ranks, SIZE), brute_allgather_time(topo, ranks, SIZE), 1e-11)


def test_large_fat_tree_bound_is_the_rank_link():
    # full bisection: every rank's 25 GB/s link is the only bottleneck, so x* = 25 GB/s/(N-1)
    topo = fat_tree(128)
    x = bounds.allgather_rate_bound(topo, topo.nodes)
    assert close(x, 25 * G / 127)
    assert close(bounds.broadcast_rate_bound(topo, topo.nodes, "r5"), 25 * G)
