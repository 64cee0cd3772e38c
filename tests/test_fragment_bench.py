"""benchmarks/fragment_bench.py compiles one DGX-1 allocation per symmetry class: its symmetry
group and classes are checked against networkx's own isomorphism search of the machine's
link graph (switches included), and the classes against every allocation of 4-7 GPUs."""
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
    got = fb.allocations(src)
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
