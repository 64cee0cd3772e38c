"""Hypothesis properties of tree packing on random small strongly connected digraphs, with and
without a switch: the rate never beats its cut bound, every tree is a spanning arborescence
over the ranks using only existing links, per-link load stays within capacity, and without
switches the packing reaches the bound (Edmonds; ForestColl)."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hcc.compiler import bounds
from hcc.compiler.treepack import pack_allgather, pack_broadcast
from hcc.ir.topology import Link, Topology

from test_treepack import check_packing, per_root_rate

G = 10**9


@st.composite
def topologies(draw):
    n = draw(st.integers(2, 5))
    nodes = tuple(f"v{i}" for i in range(n))
    perm = draw(st.permutations(nodes))
    cap = st.integers(1, 8).map(lambda k: float(k * G))
    links = [Link(perm[i], perm[(i + 1) % n], draw(cap)) for i in range(n)]  # strongly connected
    for a in nodes:
        for b in nodes:
            if a != b and draw(st.booleans()) and draw(st.booleans()):
                links.append(Link(a, b, draw(cap)))
    switches: tuple[str, ...] = ()
    if draw(st.booleans()):
        switches = ("sw",)
        on = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=n, unique=True))
        for v in on:
            links += [Link(v, "sw", draw(cap)), Link("sw", v, draw(cap))]
    return Topology("prop", nodes, switches, tuple(links))


PROFILE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROFILE
@given(topologies(), st.data())
def test_broadcast_packing_never_beats_its_bound(topo, data):
    ranks = topo.nodes
    root = data.draw(st.sampled_from(ranks))
    reverse = data.draw(st.booleans())
    few = data.draw(st.booleans())
    p = pack_broadcast(topo, ranks, root, reverse=reverse, few_trees=few, time_limit=5.0)
    bound = (bounds.reduce_rate_bound if reverse else bounds.broadcast_rate_bound)(topo, ranks, root)
    assert p.bound == bound
    assert p.rate <= bound * (1 + 1e-9)
    assert p.lp_rate <= bound * (1 + 1e-9)
    if not topo.switches:
        assert p.lp_rate >= bound * (1 - 1e-6)
        if not few:
            assert p.rate >= bound * (1 - 1e-6)
    if few:
        assert p.rate >= p.lp_rate * (1 - 1e-9)  # tolerance 0: few trees keep the optimum
    check_packing(topo, ranks, p, reverse)


@PROFILE
@given(topologies(), st.booleans(), st.booleans())
def test_allgather_packing_never_beats_its_bound(topo, reverse, few):
    ranks = topo.nodes
    p = pack_allgather(topo, ranks, reverse=reverse, few_trees=few, time_limit=5.0)
    bound = bounds.allgather_rate_bound(topo, ranks, reverse=reverse)
    assert p.rate <= bound * (1 + 1e-9)
    if not topo.switches:
        assert p.lp_rate >= bound * (1 - 1e-6)
    assert p.rate >= p.lp_rate * (1 - 1e-9)  # few trees (tolerance 0) keep the LP's rate
    for x in per_root_rate(p).values():
        assert abs(x - p.rate) <= 1e-9 * p.rate
    check_packing(topo, ranks, p, reverse)
