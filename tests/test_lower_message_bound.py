"""bounds.message_bound against plans priced by the cost model: never above any plan's
simulated time at that plan's largest message (brute force over chunk sizes and lowerings;
the latency-aware bound checked on the same plans),
never below the cut bound, and met exactly by a pipeline over one link. No timing."""
from __future__ import annotations

import pytest

from hcc.compiler import treepack
from hcc.compiler.baselines import ring_plan
from hcc.compiler.bounds import (EVEN_CHUNK_RATIO, binding_cut, latency_bound, message_bound,
                                 pipeline_cut_time, pipeline_cuts)
from hcc.compiler.cost import CostModel, simulate
from hcc.compiler.lower import lower
from hcc.ir.plan import Send
from hcc.ir.topology import Link, Topology

from test_schedule_efficiency import random_graph, spec

KINDS = ("broadcast", "reduce", "allgather", "reduce_scatter", "allreduce")


def path_graph(n: int) -> Topology:
    v = tuple(f"p{i}" for i in range(n))
    links = []
    for i in range(n - 1):
        cap, lat = (4e9, 1e-6) if i % 2 else (2e9, 3e-6)
        links += [Link(v[i], v[i + 1], cap, lat), Link(v[i + 1], v[i], cap, lat)]
    return Topology(f"path{n}", v, (), tuple(links))


def two_hosts() -> Topology:
    """2 hosts x 2 GPUs: a 50 GB/s switch port per GPU inside a host, a 30 GB/s NIC per GPU to one
    shared switch: a rank's in-cut (3 blocks over 80 GB/s) binds, ahead of a host's (2 blocks over
    60 GB/s), and mixes a fast and a slow arc (an A100 server in miniature)."""
    links = []
    for h in range(2):
        for g in range(2):
            v = f"h{h}g{g}"
            for a, b in ((v, f"nvs{h}"), (f"nvs{h}", v)):
                links.append(Link(a, b, 50e9, 1e-6))
            for a, b in ((v, "ib"), ("ib", v)):
                links.append(Link(a, b, 30e9, 1e-6))
    return Topology("hosts2", ("h0g0", "h0g1", "h1g0", "h1g1"), ("nvs0", "nvs1", "ib"), tuple(links))


def largest_message(plan) -> int:
    return max(op.src.count for prog in plan.programs for op in prog if isinstance(op, Send)) * plan.itemsize


def packed(kind, topo):
    """The optimal packing's trees of ``kind`` on ``topo`` (rooted kinds from its first rank) and
    the treepack algorithm that lowers them."""
    ranks = topo.nodes
    if kind in ("broadcast", "reduce"):
        trees = treepack.pack_broadcast(topo, ranks, ranks[0], reverse=kind == "reduce").trees
    else:
        trees = treepack.pack_allgather(topo, ranks, reverse=kind == "reduce_scatter").trees
    return trees, "treepack-rsag" if kind == "allreduce" else "treepack"


def plans(kind, topo, s, chunk):
    trees, alg = packed(kind, topo)
    yield lower(s, topo, trees, chunk, algorithm=alg, schedule="timed")
    yield lower(s, topo, trees, chunk, algorithm=alg)
    yield ring_plan(s, topo, chunk)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("topo", [path_graph(4), random_graph(5, 3, 2e-6), two_hosts()],
                         ids=["path4", "rand5", "hosts2"])
def test_no_plan_beats_the_message_bound(kind, topo):
    ranks = topo.nodes
    size = 8 << 20
    s = spec(kind, ranks, size, root=0 if kind in ("broadcast", "reduce") else -1)
    root = ranks[0] if kind in ("broadcast", "reduce") else None
    cut = binding_cut(kind, topo, ranks, root, size).time(size)
    for pm in (0.0, 1e-6, 20e-6):
        model = CostModel(per_message_s=pm)
        # the latency-aware bound too (tests/test_latency_bound.py has the other lowerings):
        # at each plan's own smallest and largest message, and the printed one for its class
        cuts = pipeline_cuts(kind, topo, ranks, root, size, pm)
        lat = latency_bound(kind, topo, ranks, root, size, pm, itemsize=4).time_s
        for chunk in (64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20):
            for plan in plans(kind, topo, s, chunk):
                t = simulate(plan, model=model).time
                b = message_bound(kind, topo, ranks, root, size, largest_message(plan), pm)
                assert cut <= b <= t * (1 + 1e-9), (plan.algorithm, chunk, pm)
                sizes = [op.src.count * 4 for prog in plan.programs for op in prog if isinstance(op, Send)]
                assert pipeline_cut_time(cuts, max(sizes), min(sizes)) <= t * (1 + 1e-9), (plan.algorithm, chunk, pm)
                if min(sizes) >= EVEN_CHUNK_RATIO * max(sizes):
                    assert lat <= t * (1 + 1e-9), (plan.algorithm, chunk, pm)


def test_a_pipeline_over_one_link_meets_the_bound_exactly():
    topo = Topology("pair", ("a", "b"), links=(Link("a", "b", 5e9, 2e-6), Link("b", "a", 5e9, 2e-6)))
    size, chunk = 8 << 20, 1 << 20
    s = spec("broadcast", ("a", "b"), size, root=0)
    trees = treepack.pack_broadcast(topo, ("a", "b"), "a").trees
    plan = lower(s, topo, trees, chunk, schedule="timed")
    model = CostModel(per_message_s=1e-6)
    t = simulate(plan, model=model).time
    # 8 messages of 1 MiB, each holding the link 2 us + 1 us + 1 MiB / 5 GB/s, back to back
    assert t == pytest.approx(8 * (3e-6 + (1 << 20) / 5e9), rel=1e-12)
    assert message_bound("broadcast", topo, ("a", "b"), "a", size, chunk, 1e-6) == pytest.approx(t, rel=1e-12)


def test_larger_messages_lower_the_bound_toward_the_cut():
    topo = path_graph(3)
    ranks = topo.vertices
    cut = binding_cut("allgather", topo, ranks, None, 1 << 30).time(1 << 30)
    got = [message_bound("allgather", topo, ranks, None, 1 << 30, m, 1e-6) for m in (1 << 16, 1 << 20, 1 << 24)]
    assert got[0] > got[1] > got[2] > cut


def test_a_cut_of_fast_and_slow_arcs_pays_each_arc_its_own_message_cost():
    # a GPU of two_hosts receives over its 50 GB/s port and its 30 GB/s NIC: at 256 KiB messages
    # and 2 us per message (1 us latency + 1 us) the port carries 50e9 x m / (m + 1e5) B/s and the
    # NIC 30e9 x m / (m + 6e4), not both (1 + 6e4 / m) times less (the cheaper arc's charge)
    topo = two_hosts()
    ranks = topo.nodes
    size, m = 1 << 30, 1 << 18
    cut = binding_cut("allgather", topo, ranks, None, size)
    assert cut.time(size) == pytest.approx(size / 4 * 3 / 80e9, rel=1e-12)
    old = cut.time(size) * (1 + 30e9 * 2e-6 / m)
    eff = 50e9 * m / (m + 1e5) + 30e9 * m / (m + 6e4)
    got = message_bound("allgather", topo, ranks, None, size, m, 1e-6)
    assert got == pytest.approx(size / 4 * 3 / eff, rel=1e-9)
    assert got > old * 1.05
