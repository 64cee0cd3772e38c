"""Every plan explains itself (issue 17, item 3): the cut that sets its bound is checked against
independent computations (networkx max-flow for the rooted kinds, every vertex subset by brute
force for allgather-like kinds), the packing rate against the bound, and the breakdown of the
predicted time sums to it exactly."""
from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace

import networkx as nx
import pytest

from hcc.commands import explain
from hcc.compiler import bounds
from hcc.compiler.pipeline import compile_unit
from hcc.compiler.program import CollectiveSpec, Program
from hcc.ir.plan import Figures
from hcc.ir.serialize import loads, summary
from hcc.ir.topology import Link, Topology

GB = 1e9


def random_topology(seed: int) -> Topology:
    """3-5 ranks and 0-1 switch, random capacities in whole GB/s, strongly connected (a
    bidirectional ring of the ranks plus random extra arcs, some one-way)."""
    rng = random.Random(seed)
    n = rng.randint(3, 5)
    ranks = tuple(f"r{i}" for i in range(n))
    switches = ("sw",) if rng.random() < 0.5 else ()
    caps: dict = {}
    for i in range(n):
        a, b = ranks[i], ranks[(i + 1) % n]
        caps[(a, b)] = rng.randint(1, 9) * GB
        caps[(b, a)] = rng.randint(1, 9) * GB
    verts = ranks + switches
    for _ in range(rng.randint(1, 6)):
        a, b = rng.sample(verts, 2)
        caps[(a, b)] = caps.get((a, b), 0.0) + rng.randint(1, 9) * GB
    for s in switches:  # a switch is entered and left
        r = rng.choice(ranks)
        caps.setdefault((r, s), 5 * GB)
        caps.setdefault((s, rng.choice(ranks)), 5 * GB)
    links = tuple(Link(a, b, c, 1e-6) for (a, b), c in sorted(caps.items()))
    return Topology(f"rand{seed}", ranks, switches=switches, links=links)


def out_cap(topo: Topology, S: set) -> float:
    return sum(l.capacity for l in topo.links if l.src in S and l.dst not in S)


def in_cap(topo: Topology, S: set) -> float:
    return sum(l.capacity for l in topo.links if l.dst in S and l.src not in S)


def subsets(topo: Topology):
    verts = topo.vertices
    for k in range(1, len(verts)):
        for S in itertools.combinations(verts, k):
            yield set(S)


def nx_graph(topo: Topology) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(topo.vertices)
    for l in topo.links:
        c = g.edges[l.src, l.dst]["capacity"] if g.has_edge(l.src, l.dst) else 0.0
        g.add_edge(l.src, l.dst, capacity=c + l.capacity)
    return g


def check_named(topo: Topology, cut) -> None:
    """The named links are exactly those leaving (entering) the named set, with its capacity."""
    S = set(cut.vertices)
    if cut.direction == "out":
        want = sorted({(l.src, l.dst) for l in topo.links if l.src in S and l.dst not in S})
        cap = out_cap(topo, S)
    else:
        want = sorted({(l.src, l.dst) for l in topo.links if l.dst in S and l.src not in S})
        cap = in_cap(topo, S)
    assert list(cut.links) == want
    assert cut.capacity_Bps == pytest.approx(cap, rel=1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_rooted_cuts_are_networkx_min_cuts(seed):
    topo = random_topology(seed)
    g = nx_graph(topo)
    ranks = topo.nodes
    for root in ranks[:2]:
        for kind in ("broadcast", "reduce"):
            cut = bounds.binding_cut(kind, topo, ranks, root, 1e9)
            check_named(topo, cut)
            if kind == "broadcast":
                best = min(nx.maximum_flow_value(g, root, v) for v in ranks if v != root)
                assert root in cut.vertices
            else:
                best = min(nx.maximum_flow_value(g, v, root) for v in ranks if v != root)
                assert root in cut.vertices  # the links enter the root's side
            assert cut.capacity_Bps == pytest.approx(best, rel=1e-12)
            assert cut.time(1e9) == pytest.approx(bounds.time_bound(kind, topo, ranks, root, 1e9), rel=1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_allgather_like_cuts_are_the_brute_force_maximum(seed):
    topo = random_topology(seed)
    ranks = topo.nodes
    n = len(ranks)
    R = set(ranks)
    M = 1e9
    for kind in ("allgather", "reduce_scatter", "gather", "scatter", "alltoall"):
        root = ranks[0]
        cut = bounds.binding_cut(kind, topo, ranks, root, M)
        check_named(topo, cut)
        worst = 0.0
        for S in subsets(topo):
            k = len(S & R)
            if not 0 < k < n:
                continue
            if kind in ("gather", "scatter") and root in S:
                continue
            b = out_cap(topo, S) if kind in ("allgather", "gather", "alltoall") else in_cap(topo, S)
            need = k * (n - k) if kind == "alltoall" else k
            worst = max(worst, need * (M / n) / b)
        assert cut.time(M) == pytest.approx(worst, rel=1e-9), kind
        assert cut.time(M) == pytest.approx(bounds.time_bound(kind, topo, ranks, root, M), rel=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_allreduce_cut_is_the_pipelines_bound(seed):
    topo = random_topology(seed)
    ranks = topo.nodes
    M = 1e9
    cut = bounds.binding_cut("allreduce", topo, ranks, None, M)
    want = min(bounds.time_bound("allreduce", topo, ranks, None, M), bounds.allreduce_floor(topo, ranks, M))
    assert cut.time(M) == pytest.approx(want, rel=1e-9)
    if cut.kind != "all-ranks":
        check_named(topo, cut)


def program(topo: Topology, *specs: CollectiveSpec) -> Program:
    return Program("<test>", {topo.name: topo}, specs)


def spec(kind: str, topo: Topology, size: int = 1 << 22) -> CollectiveSpec:
    rooted = kind in ("broadcast", "reduce", "gather", "scatter")
    op = "sum" if kind in ("reduce", "allreduce", "reduce_scatter") else None
    return CollectiveSpec(kind, kind, topo.name, topo.nodes, 0 if rooted else -1, size, "float32", op)


def check_breakdown(plan) -> None:
    f = plan.figures
    parts = (f.bandwidth_bound_s, f.load_s, f.fill_s, f.message_s, f.contention_s)
    assert sum(parts) == pytest.approx(f.predicted_s, rel=1e-9)
    eps = 1e-9 * f.predicted_s
    assert f.load_s >= -eps and f.message_s >= -eps and f.contention_s >= -eps and f.fill_s >= -eps
    assert f.bandwidth_bound_s <= f.bound_s <= f.predicted_s * (1 + 1e-9)
    assert tuple(f.bottleneck_link) in {(l.src, l.dst) for l in plan.topology.links}
    if f.pack_rate_Bps:
        assert f.pack_rate_Bps <= f.bound_rate_Bps * (1 + 1e-9)
    check_breakdown_link(plan)
    check_latency_bound(plan)


def check_breakdown_link(plan):
    """The breakdown's link, recomputed from the plan's simulation: of the links whose bytes per
    capacity are within a millionth of the most, the one busy longest; its per-message and
    contention parts are its own."""
    from hcc.compiler.cost import simulate

    f = plan.figures
    links = simulate(plan).links
    if not links:
        return
    most = max(l.bytes / l.capacity for l in links)
    alike = [l for l in links if l.bytes / l.capacity >= most * (1 - 1e-6)]
    e = next(l for l in links if (l.src, l.dst) == tuple(f.bottleneck_link))
    assert e.busy_s == max(l.busy_s for l in alike) and e.bytes / e.capacity >= most * (1 - 1e-6)
    assert f.message_s == pytest.approx(e.busy_s - e.bytes / e.capacity, rel=1e-9, abs=1e-15)
    assert f.contention_s == pytest.approx(e.last_s - e.first_s - e.busy_s, rel=1e-9, abs=1e-15)


def check_latency_bound(plan) -> None:
    """The latency-aware bound sits between the cut bound and the prediction whenever the plan is a
    fixed-chunk pipeline (messages between half its largest and its largest), and its printed
    arithmetic adds up to it."""
    from hcc.ir.plan import Send

    f = plan.figures
    assert f.latency_bound_s >= f.bound_s
    if f.latency_bound_s > f.bound_s:
        assert f.latency_bound_s == pytest.approx(f.latency_rate_s + f.latency_hops * f.latency_hop_s, rel=1e-12)
    sizes = [op.src.count for prog in plan.programs for op in prog if type(op) is Send]
    if sizes and min(sizes) >= bounds.EVEN_CHUNK_RATIO * max(sizes):
        assert f.latency_bound_s <= f.predicted_s * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["broadcast", "reduce", "allgather", "reduce_scatter", "allreduce", "scatter"])
def test_breakdown_sums_to_the_prediction(seed, kind):
    topo = random_topology(seed)
    unit = compile_unit(program(topo, spec(kind, topo)))
    check_breakdown(unit.plan)
    f = unit.plan.figures
    assert f.cut_direction in ("out", "in")
    assert f.baseline in ("ring", "rings", "tree", "rd")
    assert f.baseline_predicted_s == min(c.predicted_s for c in unit.candidates
                                         if c.algorithm in ("ring", "rings", "tree", "rd"))


def dgx1_nvlink() -> Topology:
    v = tuple(f"gpu{i}" for i in range(8))
    links = []
    for pairs, mult in ((["01", "04", "13", "23", "26", "45", "57", "67"], 2),
                        (["02", "03", "12", "15", "37", "46", "47", "56"], 1)):
        for a, b in pairs:
            links += [Link(f"gpu{a}", f"gpu{b}", mult * 25 * GB, 1e-6), Link(f"gpu{b}", f"gpu{a}", mult * 25 * GB, 1e-6)]
    return Topology("dgx1_nvlink", v, links=tuple(links))


def test_dgx1_packings_reach_the_bound_and_name_gpu0s_links():
    topo = dgx1_nvlink()
    for kind in ("broadcast", "allgather"):
        s = replace(spec(kind, topo, 64 << 20), algorithm="treepack")
        plan = compile_unit(program(topo, s)).plan
        f = plan.figures
        check_breakdown(plan)
        # Edmonds / ForestColl: the packing reaches the cut bound on DGX-1's NVLinks
        assert f.pack_rate_Bps == pytest.approx(f.bound_rate_Bps, rel=1e-6)
        if kind == "broadcast":  # gpu0's six bricks (150 GB/s) bound the broadcast
            assert f.cut_vertices == ("gpu0",)
            assert sorted(f.cut_links) == [("gpu0", f"gpu{i}") for i in (1, 2, 3, 4)]
            assert f.cut_capacity_Bps == pytest.approx(150 * GB)
        text = explain(plan)
        assert "bound" in text and "bottleneck link" in text and "packing" in text


def test_breakdown_names_the_busiest_of_the_links_loaded_alike():
    """One MI250 node's allgather at 1 GiB over its packed trees loads 50 GB/s and 100 GB/s
    links to the cut rate alike; a 100 GB/s link carries twice the messages and is busy longest,
    so the breakdown is taken there: its loss is per-message cost, not the fill a 50 GB/s cut
    link (the most bytes per capacity, by a few elements) sits idle for."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import hcc
    from hcc.compiler.cost import simulate
    from hcc.compiler.pipeline import bottleneck
    from schedule_bench import mi250

    program = hcc.load(mi250(1) + "\ncollective c = allgather on mi250x1 { size = 1 GiB  algorithm = treepack }\n")
    plan = hcc.compile(program, "c")
    check_breakdown(plan)
    f = plan.figures
    caps = {(l.src, l.dst): l.capacity for l in plan.topology.links}
    assert caps[tuple(f.bottleneck_link)] == 100 * GB
    assert f.message_s > f.fill_s + f.contention_s
    top = bottleneck(simulate(plan))
    assert top.capacity == 50 * GB and (top.src, top.dst) != tuple(f.bottleneck_link)


def test_figures_round_trip_and_old_files_load():
    topo = dgx1_nvlink()
    plan = compile_unit(program(topo, spec("allgather", topo, 1 << 20))).plan
    back = loads(plan.to_json())
    assert back.figures == plan.figures
    d = json.loads(plan.to_json())
    new = {"baseline", "baseline_predicted_s", "rings_predicted_s", "ring_channels", "rd_predicted_s",
           "pack_rate_Bps", "cut_vertices", "cut_links", "cut_capacity_Bps", "cut_direction", "cut_note",
           "bandwidth_bound_s", "load_s", "fill_s", "message_s", "contention_s", "bottleneck_link"}
    for k in new:
        del d["figures"][k]
    old = loads(json.dumps(d))
    assert old.figures == replace(plan.figures, **{k: Figures.__dataclass_fields__[k].default for k in new})
    s = summary(plan)
    assert s["cut"]["links"] and s["breakdown"]["bottleneck_link"] and s["baseline"]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", ["broadcast", "reduce", "allgather", "reduce_scatter", "allreduce"])
def test_message_bound_sits_between_the_cut_bound_and_the_prediction(seed, kind):
    """The latency-aware figure (bounds.message_bound at the plan's largest message) is printed
    beside the cut bound: never below it, never above the predicted time, and recomputed here
    from the plan's own messages and the cut's links."""
    from hcc.ir.plan import Send

    topo = random_topology(seed)
    unit = compile_unit(program(topo, spec(kind, topo)))
    plan, f = unit.plan, unit.plan.figures
    assert f.bound_s <= f.message_bound_s <= f.predicted_s * (1 + 1e-9)
    largest = max(op.src.count for prog in plan.programs for op in prog if type(op) is Send) * plan.itemsize
    cap: dict = {}
    lat: dict = {}
    for l in topo.links:
        cap[(l.src, l.dst)] = cap.get((l.src, l.dst), 0.0) + l.capacity
        lat[(l.src, l.dst)] = max(lat.get((l.src, l.dst), 0.0), l.latency)
    k = min(cap[e] * (lat[e] + unit.model.per_message_s) for e in f.cut_links)
    # the cut's arcs all charged the cheapest arc's message cost: a floor of the bound, which
    # charges each arc its own (the binding cut over effective capacities c s / (s + c a))
    floor = max(f.bound_s, f.bandwidth_bound_s * (1 + k / largest))
    assert f.message_bound_s >= floor * (1 - 1e-9)
    if kind in ("broadcast", "reduce"):  # recomputed: min over ranks of a networkx max-flow
        import networkx as nx

        def rate(c_of) -> float:
            g = nx.DiGraph()
            for (a, b), c in cap.items():
                g.add_edge(*((b, a) if kind == "reduce" else (a, b)), capacity=c_of(c, lat[(a, b)]))
            root = topo.nodes[0]
            return min(nx.maximum_flow_value(g, root, v) for v in topo.nodes if v != root)

        a0 = unit.model.per_message_s
        eff = rate(lambda c, a: c * largest / (largest + c * (a + a0)))
        want = max(floor, f.bandwidth_bound_s * rate(lambda c, a: c) / eff)
        assert f.message_bound_s == pytest.approx(want, rel=1e-9)
    row = summary(plan)
    assert row["message_bound_s"] == f.message_bound_s


def test_compile_table_prints_the_message_bound_beside_the_bound(tmp_path, capsys):
    from hcc.cli import main

    src = tmp_path / "p.hcl"
    src.write_text("topology t {\n  node a, b\n  a <-> b : 10 GB/s, 2 us\n}\n"
                   "collective c = broadcast on t {\n  size = 64 MB\n  root = a\n}\n")
    assert main(["compile", str(src)]) == 0
    head, _, row = capsys.readouterr().out.splitlines()[:3]
    cols = head.split()
    assert cols[cols.index("bound") + 1] == "msg"
    assert main(["compile", str(src), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)[0]
    assert got["bound_s"] <= got["message_bound_s"] <= got["predicted_s"]
