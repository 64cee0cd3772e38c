"""benchmarks/fragment_bench.py compiles one DGX-1 allocation per symmetry class: its symmetry
group and classes are checked against networkx's own isomorphism search of the machine's
link graph (switches included), and the classes against every allocation of 4-7 GPUs and,
for broadcast and reduce, every (allocation, root) pair."""
from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest

nx = pytest.importorskip("networkx")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def fb():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # fragment_bench imports auto_bench and schedule_bench
    import fragment_bench

    return fragment_bench


def _graph(src: str):
    import hcc

    topo = hcc.load(src).topologies["dgx1"]
    g = nx.DiGraph()
    for v in topo.nodes:
        g.add_node(v, kind="rank")
    for v in topo.switches:
        g.add_node(v, kind="switch")
    for link in topo.links:
        g.add_edge(link.src, link.dst, cap=link.capacity, lat=link.latency)
    return g, sorted(topo.nodes)


def test_the_symmetries_are_the_machines_automorphisms(fb):
    src = fb.dgx1_source()
    g, gpus = _graph(src)
    matcher = nx.algorithms.isomorphism.DiGraphMatcher(
        g, g, node_match=lambda a, b: a["kind"] == b["kind"],
        edge_match=lambda a, b: (a["cap"], a["lat"]) == (b["cap"], b["lat"]))
    theirs = {tuple(gpus.index(m[v]) for v in gpus) for m in matcher.isomorphisms_iter()}
    names, ours = fb.symmetries(src)
    assert names == gpus
    assert set(ours) == theirs and len(ours) == len(theirs) > 1


def test_one_allocation_per_class_and_every_allocation_counted(fb):
    src = fb.dgx1_source()
    names, perms = fb.symmetries(src)
    got = [(ranks, n) for ranks, root, n in fb.allocations(src)]
    assert all(root is None for _, root, _ in fb.allocations(src))
    assert sum(n for _, n in got) == sum(math.comb(8, k) for k in range(4, 8))  # 162
    # the orbits of the GPU sets under the group, found here by a closure of each set
    seen, orbits = set(), []
    for k in range(4, 8):
        for sub in itertools.combinations(range(8), k):
            if sub in seen:
                continue
            orbit = {tuple(sorted(p[i] for i in sub)) for p in perms}
            seen |= orbit
            orbits.append(orbit)
    assert sorted((tuple(names[i] for i in min(o)), len(o)) for o in orbits) == sorted(got)
    # members of one class induce the same machine: isomorphic link graphs, switches included
    g, _ = _graph(src)
    for orbit in orbits:
        first, *rest = sorted(orbit)
        keep = lambda sub: g.subgraph([names[i] for i in sub] + [v for v, d in g.nodes(data=True)
                                                                  if d["kind"] == "switch"])
        for other in rest[:3]:
            assert nx.is_isomorphic(keep(first), keep(other),
                                    node_match=lambda a, b: a["kind"] == b["kind"],
                                    edge_match=lambda a, b: (a["cap"], a["lat"]) == (b["cap"], b["lat"]))


def test_one_pair_per_class_of_allocation_and_root(fb):
    # broadcast and reduce take every root: the classes of (allocation, root) pairs, each
    # pair's class the orbit of the pair under the group, and the roots of one class give
    # the same rooted machine (an isomorphism of the induced graphs that maps root to root)
    src = fb.dgx1_source()
    names, perms = fb.symmetries(src)
    got = fb.allocations(src, rooted=True)
    assert sum(n for *_, n in got) == sum(k * math.comb(8, k) for k in range(4, 8))  # 784
    orbits = {}
    for k in range(4, 8):
        for sub in itertools.combinations(range(8), k):
            for r in sub:
                orbit = frozenset((tuple(sorted(p[i] for i in sub)), p[r]) for p in perms)
                orbits[orbit] = min(orbit)
    want = sorted((tuple(names[i] for i in sub), names[r], len(o)) for o, (sub, r) in orbits.items())
    assert sorted(got) == want
    g, _ = _graph(src)
    switches = [v for v, d in g.nodes(data=True) if d["kind"] == "switch"]
    for o in list(orbits)[::7]:
        (s1, r1), *rest = sorted(o)
        for s2, r2 in rest[:2]:
            a = g.subgraph([names[i] for i in s1] + switches).copy()
            b = g.subgraph([names[i] for i in s2] + switches).copy()
            a.nodes[names[r1]]["kind"] = b.nodes[names[r2]]["kind"] = "root"
            assert nx.is_isomorphic(a, b, node_match=lambda x, y: x["kind"] == y["kind"],
                                    edge_match=lambda x, y: (x["cap"], x["lat"]) == (y["cap"], y["lat"]))
