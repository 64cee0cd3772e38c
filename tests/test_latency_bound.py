"""bounds.latency_bound (the fixed-chunk pipeline bound, issue 17) against the cost model:

- never above the simulated time of any plan hcc lowers (treepack timed and chunk-major, the
  ring, NCCL's multi-channel rings, the double binary tree, recursive doubling), at every chunk
  size tried, on a small heterogeneous graph, a switch star and a DGX-1 fragment (the path,
  a second random graph and a two-host switch graph in tests/test_lower_message_bound.py):
  each plan against ``pipeline_cut_time`` at its own smallest and largest message, and
  against the printed bound whenever its messages lie in the bound's class;
- its hop count against an independent brute force: the fewest message times one chunk needs
  to reach every rank, over every spanning tree and send order (switch stars) or every
  spanning tree (graphs without switches), on at most 6 ranks;
- printed by ``hcc compile`` and ``--json`` with its arithmetic. No timing.
"""
from __future__ import annotations

import itertools
import json

import pytest

from hcc.compiler.baselines import dbtree_plan, rd_plan, ring_plan
from hcc.compiler.bounds import (EVEN_CHUNK_RATIO, binding_cut, latency_bound, pipeline_cut_time,
                                 pipeline_cuts, spread_hops)
from hcc.compiler.channels import ring_channels, rings_plan
from hcc.compiler.cost import CostModel, simulate
from hcc.compiler.lower import lower
from hcc.ir.plan import Send
from hcc.ir.topology import Link, Topology

from test_lower_message_bound import packed, path_graph
from test_schedule_efficiency import dgx1_nvlink, random_graph, spec

KINDS = ("broadcast", "reduce", "allgather", "reduce_scatter", "allreduce")


def star(n: int, cap: float = 20e9, lat: float = 1e-6) -> Topology:
    g = tuple(f"g{i}" for i in range(n))
    links = tuple(Link(a, b, cap, lat) for v in g for a, b in ((v, "sw"), ("sw", v)))
    return Topology(f"star{n}", g, ("sw",), links)


def dgx1_fragment() -> Topology:
    return dgx1_nvlink().restricted(("gpu0", "gpu3", "gpu4", "gpu5", "gpu7"))


# path4, rand5 and hosts2 are checked against the treepack and ring lowerings in
# tests/test_lower_message_bound.py; here the switch star and a DGX-1 fragment with every lowering
TOPOS = {"rand5": random_graph(5, 3, 2e-6), "star5": star(5), "dgx1frag": dgx1_fragment()}


def message_range(plan) -> tuple[int, int]:
    sizes = [op.src.count * plan.itemsize for prog in plan.programs for op in prog if isinstance(op, Send)]
    return min(sizes), max(sizes)


def plans(kind, topo, s, chunks):
    """Every lowering hcc prices for ``kind`` on ``topo``, at each chunk size."""
    trees, alg = packed(kind, topo)
    channels = ring_channels(topo, topo.nodes)
    for chunk in chunks:
        yield lower(s, topo, trees, chunk, algorithm=alg, schedule="timed")
        yield lower(s, topo, trees, chunk, algorithm=alg)
        yield ring_plan(s, topo, chunk)
        if channels:
            yield rings_plan(s, topo, channels, chunk)
        if kind in ("broadcast", "reduce", "allreduce"):
            yield dbtree_plan(s, topo, chunk)
        if kind in ("allgather", "reduce_scatter"):
            yield rd_plan(s, topo, chunk)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(TOPOS))
def test_no_plan_beats_the_pipeline_bound(kind, name):
    topo = TOPOS[name]
    ranks = topo.nodes
    size = 4 << 20
    s = spec(kind, ranks, size, root=0 if kind in ("broadcast", "reduce") else -1)
    root = ranks[0] if kind in ("broadcast", "reduce") else None
    cut = binding_cut(kind, topo, ranks, root, size)
    in_class = 0
    models = [(CostModel(per_message_s=pm), pipeline_cuts(kind, topo, ranks, root, size, pm),
               latency_bound(kind, topo, ranks, root, size, pm, itemsize=4)) for pm in (1e-6, 20e-6)]
    for plan in plans(kind, topo, s, (64 << 10, 512 << 10, 4 << 20)):
        lo, hi = message_range(plan)
        for model, cuts, lb in models:
            assert lb.time_s >= cut.time(size) * (1 - 1e-12)
            t = simulate(plan, model=model).time
            floor = pipeline_cut_time(cuts, hi, lo)
            assert cut.time(size) <= floor * (1 + 1e-12) and floor <= t * (1 + 1e-9), \
                (plan.algorithm, plan.chunk_bytes, model, floor, t)
            if lo >= EVEN_CHUNK_RATIO * hi:
                in_class += 1
                assert lb.time_s <= t * (1 + 1e-9), (plan.algorithm, plan.chunk_bytes, model, lb, t)
    assert in_class > 0  # the printed bound was checked against some plan of its class


def tree_rounds_single_port(n: int) -> int:
    """Fewest message times for one chunk from rank 0 to reach n - 1 others when every rank sends
    one message at a time (a switch port): brute force over every spanning tree (parent arrays)
    and, per tree, the best send order (children longest-subtree first, which an exchange
    argument shows optimal; checked here against every order)."""
    best = None
    for parents in itertools.product(range(n), repeat=n - 1):
        par = {v + 1: p for v, p in enumerate(parents)}
        if any(p == v for v, p in par.items()):
            continue
        ok = True
        for v in par:  # every rank reaches the root
            seen, w = set(), v
            while w != 0 and ok:
                if w in seen:
                    ok = False
                seen.add(w)
                w = par[w]
        if not ok:
            continue
        kids = {v: [c for c, p in par.items() if p == v] for v in range(n)}

        def finish(v: int) -> int:  # message times after v holds the chunk until its subtree does
            sub = [finish(c) for c in kids[v]]
            return min(max(i + 1 + f for i, f in enumerate(order)) for order in itertools.permutations(sub)) \
                if sub else 0

        r = finish(0)
        best = r if best is None else min(best, r)
    return best


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_hops_match_the_best_tree_on_a_switch(n):
    """A switch star: each rank sends on one arc. The root's last byte crosses its one arc (the
    cut) in the first message time, then spread_hops more reach everyone: exactly what the best
    spanning tree with the best send order needs."""
    topo = star(n)
    ranks = topo.nodes
    (pc, *_) = pipeline_cuts("broadcast", topo, ranks, ranks[0], 1 << 20, 1e-6)
    assert (pc.links_out, pc.degree, pc.beyond) == (1, 1, n - 1)
    assert 1 + pc.hops == tree_rounds_single_port(n)


def bfs_depth(topo: Topology, root: str) -> int:
    adj: dict = {}
    for l in topo.links:
        adj.setdefault(l.src, set()).add(l.dst)
    depth, frontier, seen = 0, {root}, {root}
    while len(seen) < len(topo.nodes):
        frontier = {w for v in frontier for w in adj.get(v, ()) if w not in seen}
        seen |= frontier
        depth += 1
    return depth


def tree_depth_brute(topo: Topology, root: str) -> int:
    """Least depth of a spanning arborescence from ``root`` over the graph's arcs, by brute force
    over parent choices (every rank sends on each of its arcs at once, so a tree's message
    times are its depth)."""
    nodes = [v for v in topo.nodes if v != root]
    arcs = {(l.src, l.dst) for l in topo.links}
    best = None
    for parents in itertools.product(topo.nodes, repeat=len(nodes)):
        par = dict(zip(nodes, parents))
        if any((p, v) not in arcs for v, p in par.items()):
            continue
        depth = 0
        for v in nodes:
            d, w = 0, v
            while w != root and d <= len(nodes):
                w, d = par[w], d + 1
            depth = max(depth, d)
        if depth <= len(nodes):
            best = depth if best is None else min(best, depth)
    return best


@pytest.mark.parametrize("name,topo", [("path4", path_graph(4)), ("rand5", random_graph(5, 3)),
                                       ("rand6", random_graph(6, 1)), ("dgx1frag", dgx1_fragment())])
def test_hops_never_exceed_the_shallowest_tree(name, topo):
    """Without switches a rank sends on all its arcs at once: one chunk reaches everyone in the
    depth of the shallowest spanning tree (brute force; equal to the BFS depth), and the bound's
    message times (the crossing plus its hops) never exceed it."""
    for root in topo.nodes[:3]:
        depth = tree_depth_brute(topo, root)
        assert depth == bfs_depth(topo, root)
        for pc in pipeline_cuts("broadcast", topo, topo.nodes, root, 1 << 20, 1e-6):
            assert 1 + pc.hops <= depth, (root, pc.cut.vertices, pc.hops, depth)


def test_spread_hops_counts_the_doubling():
    assert [spread_hops(1, 1, m) for m in (1, 2, 3, 4, 7, 8, 15, 16)] == [0, 1, 1, 2, 2, 3, 3, 4]
    assert spread_hops(4, 4, 7) == 1 and spread_hops(8, 8, 8) == 0 and spread_hops(0, 3, 5) == 0


def test_the_bound_on_a_switch_is_the_arithmetic_it_prints():
    """8 GPUs on one switch, 150 GB/s ports, 1 us links, 1 us per message: the root's port
    (the cut) at chunk s costs M (1/c + 2 us/s), then 2 message times of 2 us + (s/2)/c:
    least near s = sqrt(M c 2 us), 1.828 ms for 256 MB against the 1.707 ms cut."""
    topo = star(8, 150e9, 1e-6)
    M = 256e6
    lb = latency_bound("broadcast", topo, topo.nodes, "g0", M, 1e-6, itemsize=4)
    c, a = 150e9, 2e-6
    exact = min(M / c + M * a / s + 2 * (a + s / 2 / c) for s in (1e5 * 1.01 ** i for i in range(700)))
    assert lb.hops == 2 and abs(lb.time_s - exact) < 2e-3 * exact
    assert abs(lb.time_s - (lb.rate_s + lb.hops * lb.hop_s)) < 1e-12 + 1e-9 * lb.time_s


def test_compile_prints_the_latency_bound(tmp_path, capsys):
    from hcc.cli import main

    src = tmp_path / "p.hcl"
    src.write_text("topology t {\n node g[0..3]\n switch s\n g[0..3] <-> s : 50 GB/s, 1 us\n}\n"
                   "collective b = broadcast on t {\n root = g0\n size = 64 MB\n}\n"
                   "collective a = allgather on t {\n size = 64 MB\n}\n")
    assert main(["compile", str(src)]) == 0
    out = capsys.readouterr().out
    assert "lat bound" in out and "fixed-chunk pipelines" in out
    assert main(["compile", str(src), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for r in rows:
        lb = r["latency_bound"]
        assert r["bound_s"] <= r["latency_bound_s"] <= r["predicted_s"] * (1 + 1e-9)
        assert abs(r["efficiency_vs_latency_bound"] - r["latency_bound_s"] / r["predicted_s"]) < 1e-12
        assert lb["hops"] >= 0 and lb["chunk_bytes"] > 0
    b = next(r for r in rows if r["kind"] == "broadcast")
    assert b["latency_bound"]["hops"] == 1 and b["latency_bound_s"] > b["bound_s"]
