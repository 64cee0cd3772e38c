"""The depth-bounded second phase of tree packing (compiler/treepack_shallow.py): the bounded
pricer against brute force, packings that keep the cut bound (an independent networkx cut
enumeration) with every tree as shallow as the method claims, and fewer, shallower trees on
DGX-1 and two A100 servers than the first phase alone."""
from __future__ import annotations

import itertools
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

import hcc
from hcc.compiler import bounds, treepack
from hcc.compiler.treepack import pack_allgather
from hcc.compiler.treepack_master import min_arborescence
from hcc.compiler.treepack_shallow import bounded_parents, eccentricity

from test_bounds import SIZE, brute_allgather_time, dgx1, random_topology, ring, star, two_hosts
from test_treepack import check_packing, per_root_rate

ROOT = Path(__file__).resolve().parent.parent
INF = math.inf


def levels(par: list[int], root: int) -> int:
    """Deepest level of the parent list ``par`` (asserts it is an arborescence from root)."""
    assert par[root] == -1 and sum(1 for p in par if p == -1) == 1
    deepest = 0
    for v in range(len(par)):
        d, u = 0, v
        while u != root:
            u = par[u]
            d += 1
            assert d <= len(par), "a cycle"
        deepest = max(deepest, d)
    return deepest


def cost(w, par) -> float:
    return sum(w[p][v] for v, p in enumerate(par) if p != -1)


def brute_bounded(w, root: int, depth: int) -> float | None:
    """Least cost of an arborescence of at most ``depth`` levels, by enumerating every
    parent list (n <= 6: at most 6^5 lists)."""
    n = len(w)
    others = [v for v in range(n) if v != root]
    best = None
    for choice in itertools.product(range(n), repeat=len(others)):
        par = [-1] * n
        for v, p in zip(others, choice):
            par[v] = p
        if any(p == v or not math.isfinite(w[p][v]) for v, p in zip(others, choice)):
            continue
        try:
            d = levels(par, root)
        except AssertionError:
            continue
        if d <= depth:
            c = cost(w, par)
            best = c if best is None else min(best, c)
    return best


def random_matrix(seed: int):
    rnd = random.Random(seed)
    n = rnd.randint(2, 6)
    w = [[INF if i == j or rnd.random() < 0.35 else float(rnd.randint(1, 9)) for j in range(n)] for i in range(n)]
    for i in range(n - 1):  # a path from 0 keeps every vertex reachable
        w[i][i + 1] = float(rnd.randint(1, 9))
    return np.array(w)


@pytest.mark.parametrize("seed", range(40))
def test_bounded_parents_against_brute_force(seed):
    w = random_matrix(seed)
    n = len(w)
    ecc = eccentricity(w, 0)
    free = min_arborescence(w, 0)
    for depth in range(1, n):
        par = bounded_parents(w, 0, depth)
        best = brute_bounded(w.tolist(), 0, depth)
        if depth < ecc:  # no arborescence is that shallow
            assert par is None and best is None
            continue
        assert best is not None and par is not None, "a breadth-first tree always fits"
        assert levels(par, 0) <= depth
        assert cost(w, par) >= best - 1e-9
        if levels(free, 0) <= depth:  # the minimum arborescence fits: the answer is exact
            assert cost(w, par) == pytest.approx(best)


def shallow_claim(method: str) -> int | None:
    m = re.search(r"shallow\(depth (\d+)\)", method)
    return int(m.group(1)) if m else None


def depth_of(packing) -> int:
    deepest = 0
    for t in packing.trees:
        level = {t.root: 0}
        for p, c, _ in t.edges:  # parents first
            level[c] = level[p] + 1
        deepest = max(deepest, max(level.values()))
    return deepest


SMALL = {
    "dgx1_nvlink": (dgx1(), dgx1().nodes),
    "ring6": (ring(6), ring(6).nodes),
    "star6": (star(6), star(6).nodes),
    "two_hosts": (two_hosts(), two_hosts().nodes),
    "rand1": (random_topology(1, 6), random_topology(1, 6).nodes),
    "rand4": (random_topology(4, 6), random_topology(4, 6).nodes),
    "rand2_switch": (random_topology(2, 6, switch=True), random_topology(2, 6, switch=True).nodes),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_shallow_packing_keeps_the_cut_bound_and_its_depth_claim(name):
    topo, ranks = SMALL[name]
    for reverse in (False, True):
        treepack.clear_cache()
        p = pack_allgather(topo, ranks, reverse=reverse)
        deep = pack_allgather(topo, ranks, reverse=reverse, shallow=False)
        # the per-root rate the cut bound allows, from networkx's cut enumeration
        want = SIZE / len(ranks) / brute_allgather_time(topo, ranks, SIZE, reverse=reverse)
        assert deep.rate <= want * (1 + 1e-9)
        # the second phase holds the rate to GLOP's tolerance (1e-9 relative per row, a few
        # 1e-9 after every link is brought within its capacity)
        assert p.rate == pytest.approx(deep.rate, rel=1e-7), "the second phase keeps the LP rate"
        if not topo.switches:
            assert p.rate == pytest.approx(want, rel=1e-7)
        for x in per_root_rate(p).values():
            assert x == pytest.approx(p.rate, rel=1e-9)
        check_packing(topo, ranks, p, reverse)
        claim = shallow_claim(p.method)
        assert depth_of(p) <= depth_of(deep)
        if claim is not None:
            assert depth_of(p) <= claim < depth_of(deep)


def sample_topology(path: Path, name: str):
    program = hcc.load(path)
    return next(t for t in program.topologies if t.name == name)


def a100_servers(nodes: int):
    """A100 servers as ForestColl models them (compile_bench's a100x2, a100x4)."""
    lines = [f"topology a100x{nodes} {{", f"  host node[0..{nodes - 1}] {{", "    node gpu[0..7]",
             "    switch nvs, nic[0..7]", "    gpu[0..7] <-> nvs : 300 GB/s, 1 us"]
    lines += [f"    gpu{i} <-> nic{i} : 25 GB/s, 2 us" for i in range(8)]
    lines += ["  }", "  switch ib0, ib1"]
    lines += [f"  node{a}.nic{i} <-> ib{i % 2} : 25 GB/s, 2 us" for a in range(nodes) for i in range(8)]
    lines += ["}", f"collective ag = allgather on a100x{nodes} {{ size = 1 GB }}"]
    program = hcc.load("\n".join(lines))
    spec = program.collectives[0]
    return program.topology_of(spec), spec.ranks


def test_dgx1_allgather_trees_are_two_levels_deep():
    # DGX-1 with its PCIe switches: every GPU reaches every other over NVLink or PCIe in
    # one rank hop, so two levels suffice; the first phase's trees were 7-deep chains
    program = hcc.load(ROOT / "samples" / "dgx1.hcl")
    spec = next(c for c in program.collectives if c.kind == "allgather")
    topo, ranks = program.topology_of(spec), spec.ranks
    treepack.clear_cache()
    deep = pack_allgather(topo, ranks, shallow=False)
    p = pack_allgather(topo, ranks)
    assert p.gap < 1e-6 and p.rate == pytest.approx(deep.rate, rel=1e-7)
    assert depth_of(deep) >= 5
    assert depth_of(p) <= 2 and shallow_claim(p.method) == 2
    assert len(p.trees) <= len(deep.trees)
    check_packing(topo, ranks, p)


@pytest.mark.parametrize("nodes", [2, 4])
def test_a100_servers_allgather_shallower_trees(nodes):
    # a GPU reaches its server over the NVSwitch and any other GPU over its NIC and an IB
    # switch: two levels. Four servers: the first phase's 93 trees (17 deep) become about 53;
    # two servers keep about as many trees as before (59-60), 2 levels instead of 8
    topo, ranks = a100_servers(nodes)
    treepack.clear_cache()
    deep = pack_allgather(topo, ranks, shallow=False)
    p = pack_allgather(topo, ranks)
    assert p.gap < 1e-6 and p.rate == pytest.approx(deep.rate, rel=1e-7)
    assert depth_of(p) <= 2 < depth_of(deep)
    if nodes == 4:
        assert len(p.trees) <= 0.75 * len(deep.trees)
    check_packing(topo, ranks, p)


def test_shallow_phase_is_deterministic():
    topo, ranks = SMALL["rand1"]
    treepack.clear_cache()
    a = pack_allgather(topo, ranks)
    treepack.clear_cache()
    b = pack_allgather(topo, ranks)
    assert a.trees == b.trees and a.method == b.method


def mi250_node():
    """One MI250 node as compile_bench writes it (ForestColl's xGMI adjacency)."""
    import importlib.util
    import sys

    bench = ROOT / "benchmarks"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))  # compile_bench imports its bench_util
    spec = importlib.util.spec_from_file_location("compile_bench_under_test", bench / "compile_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    program = hcc.load(mod.mi250_source(1) + "\ncollective ag = allgather on mi250x1 { size = 1 GB }")
    c = program.collectives[0]
    return program.topology_of(c), c.ranks


def test_mi250_allgather_packs_symmetric_trees_at_the_bound():
    # the xGMI mesh has 4 automorphisms, none fixing a GCD (networkx's matcher over the
    # undirected capacities finds them here, independently of the compiler's digraph): the
    # pack prices one root per orbit, and every tree's images under them are in the packing
    # at the same rate
    import networkx as nx
    from networkx.algorithms.isomorphism import GraphMatcher

    topo, ranks = mi250_node()
    g = nx.Graph()
    for l in topo.links:
        g.add_edge(l.src, l.dst, capacity=l.capacity)
    autos = list(GraphMatcher(g, g, edge_match=lambda a, b: a["capacity"] == b["capacity"]).isomorphisms_iter())
    assert len(autos) == 4
    for reverse in (False, True):
        treepack.clear_cache()
        p = pack_allgather(topo, ranks, reverse=reverse)
        deep = pack_allgather(topo, ranks, reverse=reverse, shallow=False)  # the plain master
        assert "colgen-symmetric x4" in p.method and "symmetric" not in deep.method
        assert p.rate == pytest.approx(deep.rate, rel=1e-7)
        assert p.rate == pytest.approx(bounds.allgather_rate_bound(topo, ranks, reverse=reverse), rel=1e-7)
        for x in per_root_rate(p).values():
            assert x == pytest.approx(p.rate, rel=1e-9)
        check_packing(topo, ranks, p, reverse)
        claim = shallow_claim(p.method)
        assert claim is not None and depth_of(p) <= claim < depth_of(deep)
        have = {(t.root, frozenset(e[:2] for e in t.edges)): t.rate for t in p.trees}
        assert len(have) == len(p.trees)
        for s in autos:
            for (root, edges), rate in have.items():
                image = (s[root], frozenset((s[a], s[b]) for a, b in edges))
                assert have.get(image) == pytest.approx(rate, rel=1e-9)
