"""Broadcast and reduce over topology-aware double binary trees (compiler/bcast_trees.py,
algorithm ``treepack-dbt``) on samples/fattree.hcl, samples/cluster.hcl and small hosts of
direct links and two NICs: the plans verify and compute the right values (reference backend;
real executor threads over loopback sockets for one), are never predicted faster than the
broadcast bound (min over ranks of the root's max-flow, networkx), and have the structure
the module promises, each checked independently of how the module builds it: no rank has
children in both trees of a pair, every rank sends at most the buffer, cross-rack edges
spread over the spines as evenly as their count allows, and a multi-port host's ports each
carry 1/P of the buffer. No timing."""
from __future__ import annotations

import math
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from hcc.compiler.bcast_trees import chunk_for, dbt_pair, dbt_plan, dbt_trees, lower_dbt, trees_rate
from hcc.compiler.bcast_wide import host_depth, lane_layout, wide_chunk, wide_plan, wide_trees
from hcc.compiler.cost import simulate
from hcc.compiler.frontend import load_program
from hcc.compiler.pipeline import compile_one, resolve

from test_lower import check_numeric

sys.path.insert(0, str(Path(__file__).parent / "runtime"))
from test_executor_plans import threaded  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# 8 racks of 16 nodes under 8 spines
FATTREE = (ROOT / "samples" / "fattree.hcl").read_text()

# three hosts of four GPUs: a ring of direct links inside, two PCIe switches with a NIC each
MULTIPORT = """
topology mp {
    host h[0..2] {
        node g[0..3]
        switch p[0..1]
        switch nic[0..1]
        g0 <-> g1 : 50 GB/s, 1 us    g1 <-> g2 : 50 GB/s, 1 us
        g2 <-> g3 : 50 GB/s, 1 us    g3 <-> g0 : 50 GB/s, 1 us
        g[0..1] <-> p0 : 12 GB/s, 2 us    g[2..3] <-> p1 : 12 GB/s, 2 us
        p0 <-> nic0 : 12 GB/s, 2 us       p1 <-> nic1 : 12 GB/s, 2 us
    }
    switch fabric
    h[0..2].nic[0..1] <-> fabric : 100 Gbit/s, 5 us
}
collective b = broadcast on mp { root = h0.g1  size = 1 MiB }
collective r = reduce on mp { root = h2.g3  size = 1 MiB }
"""


CLUSTER = (ROOT / "samples" / "cluster.hcl").read_text() + """
collective b = broadcast on cluster { root = h1.gpu3  size = 1 MiB }
collective r = reduce on cluster { root = h0.gpu0  size = 1 MiB }
"""


def setup(text: str, name: str, elems: int = 3001, kind: str | None = None):
    """The collective ``name`` of ``text`` at ``elems`` float64 elements (``kind``: as that
    kind instead, summing)."""
    prog = load_program(text)
    spec = resolve(prog, name)
    spec = replace(spec, dtype="float64", size_bytes=elems * 8)
    if kind is not None and kind != spec.kind:
        spec = replace(spec, kind=kind, op="sum")
    return spec, prog.topology_of(spec)


def broadcast_bound(spec, topo, most: int = 12) -> float:
    """Seconds: the buffer over the least root-to-rank max-flow (reversed for reduce), over
    at most ``most`` ranks spread through the rank list (each flow alone bounds the time;
    the fat tree's 127 took a second)."""
    g = topo.graph()
    root = spec.ranks[spec.root]
    others = [v for v in spec.ranks if v != root]
    flows = []
    for v in others[:: max(1, len(others) // most)]:
        a, b = (v, root) if spec.kind == "reduce" else (root, v)
        flows.append(nx.maximum_flow_value(g, a, b, capacity="capacity"))
    return spec.size_bytes / min(flows)


@pytest.mark.parametrize("m", list(range(1, 40)) + [63, 64, 1023])
def test_pair_is_two_trees_with_disjoint_interiors(m):
    depth_cap = max(1, math.ceil(math.log2(m + 1))) + 1
    interiors = []
    for par in dbt_pair(m):
        tops = [q for q in range(m) if par[q] < 0]
        assert len(tops) == 1
        for q in range(m):  # every position reaches the top, within the depth cap
            d, x = 0, q
            while par[x] >= 0:
                x, d = par[x], d + 1
                assert d <= depth_cap
        kids = Counter(p for p in par if p >= 0)
        assert max(kids.values(), default=0) <= 2
        interiors.append(set(kids))
    assert not interiors[0] & interiors[1]


@pytest.mark.parametrize("text,name,kind", [(FATTREE, "broadcast", None), (FATTREE, "broadcast", "reduce"),
                                            (MULTIPORT, "b", None), (MULTIPORT, "r", None),
                                            (CLUSTER, "b", None), (CLUSTER, "r", None)])
def test_plans_verify_compute_and_respect_the_bound(text, name, kind):
    spec, topo = setup(text, name, kind=kind)
    trees = dbt_trees(topo, spec.ranks, spec.root, inward=spec.kind == "reduce")
    for chunk in (8 * 401, 8 * 3001):  # 8 chunks per tree share (the window gates), and one
        plan = lower_dbt(spec, topo, trees, chunk)
        plan.verify()  # symbolic execution: every rank's final buffer
        if len(spec.ranks) <= 16:  # the test executor: 0.4-6 s a plan on 32-128 ranks
            check_numeric(plan, seed=chunk)
        assert simulate(plan).time >= broadcast_bound(spec, topo) * (1 - 1e-9)
    assert 8 <= chunk_for(spec, topo, trees, 1e-6) <= spec.size_bytes
    # the trees at their shares sustain the broadcast bound's rate (the packing's rate)
    assert trees_rate(topo, trees, spec.kind == "reduce") == pytest.approx(
        spec.size_bytes / broadcast_bound(spec, topo), rel=1e-9)


def _sends(trees, kind):
    """Per rank: the buffer fraction it sends (its children's shares; in-trees: its own)."""
    out = Counter()
    for t in trees:
        for p, c, _ in t.edges:
            out[c if kind == "reduce" else p] += t.rate
    return out


def test_fat_tree_pair_structure_and_spread_routes():
    spec, topo = setup(FATTREE, "broadcast")
    trees = dbt_trees(topo, spec.ranks, spec.root)
    assert len(trees) == 2 and sum(t.rate for t in trees) == pytest.approx(1.0)
    interior = [{p for p, _, _ in t.edges} - {t.root} for t in trees]
    assert not interior[0] & interior[1]
    assert max(_sends(trees, "broadcast").values()) <= 1.0 + 1e-12
    host = dict(topo.hosts)
    spines = [s for s in topo.switches if s.startswith("spine")]
    up, down = Counter(), Counter()
    cross_out, cross_in = Counter(), Counter()
    for t in trees:
        for p, c, path in t.edges:
            if host[p] != host[c]:  # from the endpoints, not the module's routes
                cross_out[host[p]] += 1
                cross_in[host[c]] += 1
            for a, b in zip(path, path[1:]):
                if b in spines:
                    up[(a, b)] += 1
                if a in spines:
                    down[(a, b)] += 1
    assert sum(cross_out.values()) >= 4
    for h, k in cross_out.items():
        assert max(up[(f"{h}.leaf", s)] for s in spines) == math.ceil(k / len(spines))
    for h, k in cross_in.items():
        assert max(down[(s, f"{h}.leaf")] for s in spines) == math.ceil(k / len(spines))
    # every tree edge inside a rack stays under its leaf
    for t in trees:
        for p, c, path in t.edges:
            if host[p] == host[c]:
                assert len(path) == 3


@pytest.mark.parametrize("text,name,ports", [(MULTIPORT, "b", 2), (MULTIPORT, "r", 2), (CLUSTER, "b", 8),
                                             (CLUSTER, "r", 8)])
def test_multiport_hosts_split_the_buffer_over_their_ports(text, name, ports):
    """Direct links inside the host (MULTIPORT) or an NVSwitch (samples/cluster.hcl)."""
    spec, topo = setup(text, name)
    trees = dbt_trees(topo, spec.ranks, spec.root, inward=spec.kind == "reduce")
    assert len(trees) == 2 * ports and all(t.rate == pytest.approx(0.5 / ports) for t in trees)
    load = Counter()
    for t in trees:
        for p, c, path in t.edges:
            data = tuple(reversed(path)) if spec.kind == "reduce" else path
            for arc in zip(data, data[1:]):
                load[arc] += t.rate
    host = dict(topo.hosts)
    root_host = host[spec.ranks[spec.root]]
    # a host's ports: its switches with a link to a vertex outside it (from the topology)
    outward: dict[str, list[tuple[str, str]]] = {}
    for l in topo.links:
        if l.src in topo.switches and host.get(l.src) and host.get(l.dst) != host[l.src]:
            outward.setdefault(host[l.src], []).append((l.src, l.dst))
    assert len(outward) >= 3 and all(len(v) == ports for v in outward.values())
    for h, arcs in outward.items():
        for a, b in arcs:  # each port carries 1/P of the buffer each way at most
            assert load[(a, b)] <= 1 / ports + 1e-12
            assert load[(b, a)] <= 1 / ports + 1e-12
        # the buffer enters every other host once (broadcast), leaves it once (reduce)
        through = sum(load[arc if spec.kind == "reduce" else arc[::-1]] for arc in arcs)
        assert through == pytest.approx(0.0 if h == root_host else 1.0)
    # per lane: no gateway outside the root's host has cross-host children in both of its
    # lane's trees; the root's host's gateway feeds one host per tree
    for k in range(ports):
        crossing = [Counter(p for p, c, _ in t.edges if host[p] != host[c]) for t in trees[2 * k:2 * k + 2]]
        both = set(crossing[0]) & set(crossing[1])
        assert all(host[g] == root_host for g in both)
        assert all(crossing[0][g] == crossing[1][g] == 1 for g in both)


@pytest.mark.parametrize("name", ["b", "r"])
def test_plan_runs_over_real_sockets(name):
    """The windowed receives (each waits for the receive two chunks back) on the real
    executor: every rank a thread over loopback sockets, results against numpy."""
    spec, topo = setup(MULTIPORT, name, elems=1201)
    plan = lower_dbt(spec, topo, dbt_trees(topo, spec.ranks, spec.root, inward=spec.kind == "reduce"), 8 * 50)
    rng = np.random.default_rng(7)
    inputs = [rng.integers(-50, 50, plan.buffer_elems(r)["in"]).astype(np.float64) for r in range(plan.n)]
    outs, errs = threaded(plan, inputs)
    assert not any(errs), errs
    want = sum(inputs) if spec.kind == "reduce" else inputs[spec.root]
    ranks = [spec.root] if spec.kind == "reduce" else range(plan.n)
    for r in ranks:
        np.testing.assert_array_equal(outs[r], want)


# -- treepack-wide (compiler/bcast_wide.py) -------------------------------------------------------
def wide_text(hosts: int) -> str:
    """``hosts`` hosts of four GPUs, every pair joined by a 50 GB/s direct link, each GPU
    behind its own PCIe switch and 100 Gbit/s NIC on one fabric switch (a small DGX-like
    multi-NIC cluster)."""
    return f"""
topology wide {{
    host h[0..{hosts - 1}] {{
        node g[0..3]
        switch p[0..3]
        switch nic[0..3]
        g0 <-> g[1..3] : 50 GB/s, 1 us    g1 <-> g[2..3] : 50 GB/s, 1 us    g2 <-> g3 : 50 GB/s, 1 us
        g0 <-> p0 : 12 GB/s, 2 us    g1 <-> p1 : 12 GB/s, 2 us
        g2 <-> p2 : 12 GB/s, 2 us    g3 <-> p3 : 12 GB/s, 2 us
        p0 <-> nic0 : 12 GB/s, 2 us  p1 <-> nic1 : 12 GB/s, 2 us
        p2 <-> nic2 : 12 GB/s, 2 us  p3 <-> nic3 : 12 GB/s, 2 us
    }}
    switch fabric
    h[0..{hosts - 1}].nic[0..3] <-> fabric : 100 Gbit/s, 5 us
}}
collective b = broadcast on wide {{ root = h0.g1  size = 1 MiB }}
collective r = reduce on wide {{ root = h{hosts - 1}.g2  size = 1 MiB }}
"""


WIDE8, WIDE4 = wide_text(8), wide_text(4)

def rails_text(hosts: int, gpus: int, b_root: str, r_root: str, nic_us: int = 2) -> str:
    """``hosts`` A100-like hosts: ``gpus`` GPUs on an NVSwitch, one NIC each, the NICs on two
    rails (two fabric switches, NIC i on rail i % 2): a port reaches only the ports of its own
    rail. A broadcast ``b`` and a reduce ``r`` of 1 MiB at the roots given; ``nic_us``: the
    latency of each NIC link."""
    h, g = f"n[0..{hosts - 1}]", f"g[0..{gpus - 1}]"
    lines = ["topology rails {", f"    host {h} {{", f"        node {g}", f"        switch nvs, nic[0..{gpus - 1}]",
             f"        {g} <-> nvs : 300 GB/s, 1 us"]
    lines += [f"        g{i} <-> nic{i} : 25 GB/s, {nic_us} us" for i in range(gpus)]
    lines += ["    }", "    switch ib0, ib1"]
    lines += [f"    {h}.nic{i} <-> ib{i % 2} : 25 GB/s, {nic_us} us" for i in range(gpus)]
    lines += ["}", f"collective b = broadcast on rails {{ root = {b_root}  size = 1 MiB }}",
              f"collective r = reduce on rails {{ root = {r_root}  size = 1 MiB }}"]
    return "\n".join(lines) + "\n"


RAILS = rails_text(3, 4, "n1.g2", "n0.g0")


def _outward(topo) -> dict[str, list[tuple[str, str]]]:
    """Per host, its port arcs (a switch of the host to a vertex outside it), from the topology."""
    host = dict(topo.hosts)
    out: dict[str, list[tuple[str, str]]] = {}
    for l in topo.links:
        if l.src in topo.switches and host.get(l.src) and host.get(l.dst) != host[l.src]:
            out.setdefault(host[l.src], []).append((l.src, l.dst))
    return out


def _data_load(trees, kind) -> Counter:
    load = Counter()
    for t in trees:
        for p, c, path in t.edges:
            data = tuple(reversed(path)) if kind == "reduce" else path
            for arc in zip(data, data[1:]):
                load[arc] += t.rate
    return load


@pytest.mark.parametrize("hosts,ports,rails", [(h, p, None) for p in (2, 3, 4, 5) for h in (2, 3, 5, 8, 17, 64, 65)]
                         + [(h, 4, [[0, 2], [1, 3]]) for h in (2, 3, 9)] + [(6, 3, [[0], [1, 2]])])
def test_lane_layout_uses_each_port_once_and_stays_shallow(hosts, ports, rails):
    layout = lane_layout(hosts, ports, rails)
    rail_of = {k: i for i, r in enumerate(rails or [range(ports)]) for k in r}
    assert len(layout) == ports
    used = Counter()
    for t, tree in enumerate(layout):
        placed = {0}
        assert tree[0][1] == (0, t)  # the root's port t feeds tree t's top
        for h, (par, k) in tree:
            assert par in placed and h not in placed and 0 <= k < ports  # parents first
            assert rail_of[k] == rail_of[t]  # a port feeds only ports of its own rail
            placed.add(h)
            used[(par, k)] += 1
        assert placed == set(range(hosts))
        depth = {0: 0}
        for h, (par, _) in tree:
            depth[h] = depth[par] + 1
        # levels of P^(k-1) hosts, one more where a boundary host splits its ports
        fan = len((rails or [range(ports)])[rail_of[t]])  # a tree's ports per host
        need, total = 1, 1
        while total < hosts - 1:
            total += fan ** need
            need += 1
        assert max(depth.values()) <= need + 1
        if (hosts, ports, rails) == (64, 4, None):
            assert max(depth.values()) == 4  # 64 DGX-1s: four host levels, not six binary ones
    assert max(used.values()) == 1  # every (host, port) sends at most one share


@pytest.mark.parametrize("text,name,kind", [(WIDE8, "b", None), (WIDE8, "r", None), (WIDE4, "b", None),
                                            (WIDE4, "r", None), (MULTIPORT, "b", None), (MULTIPORT, "r", None),
                                            (CLUSTER, "b", None), (CLUSTER, "b", "reduce"), (RAILS, "b", None),
                                            (RAILS, "r", None)])
def test_wide_plans_verify_compute_and_respect_the_bound(text, name, kind):
    spec, topo = setup(text, name, kind=kind)
    trees = wide_trees(topo, spec.ranks, spec.root, inward=spec.kind == "reduce")
    bound = broadcast_bound(spec, topo)
    for chunk in (8 * 401, 8 * 3001):
        plan = wide_plan(spec, topo, trees, chunk)
        assert plan.algorithm == "treepack-wide"
        plan.verify()
        if len(spec.ranks) <= 16:
            check_numeric(plan, seed=chunk)
        assert simulate(plan).time >= bound * (1 - 1e-9)
    assert 8 <= wide_chunk(spec, topo, trees, 1e-6) <= spec.size_bytes
    assert trees_rate(topo, trees, spec.kind == "reduce") == pytest.approx(spec.size_bytes / bound, rel=1e-9)


@pytest.mark.parametrize("text,name", [(WIDE8, "b"), (WIDE8, "r"), (MULTIPORT, "b"), (CLUSTER, "b"), (RAILS, "b"),
                                       (RAILS, "r")])
def test_wide_ports_carry_their_share_and_hosts_are_few_levels_deep(text, name):
    spec, topo = setup(text, name)
    trees = wide_trees(topo, spec.ranks, spec.root, inward=spec.kind == "reduce")
    outward = _outward(topo)
    P, H = len(next(iter(outward.values()))), len(outward)
    assert len(trees) == P and all(t.rate == pytest.approx(1 / P) for t in trees)
    load = _data_load(trees, spec.kind)
    host = dict(topo.hosts)
    for h, arcs in outward.items():
        for a, b in arcs:  # each NIC carries at most its 1/P share out and in
            assert load[(a, b)] <= 1 / P + 1e-12
            assert load[(b, a)] <= 1 / P + 1e-12
    # host levels: cross-host edges on the way from the root, counted from the endpoints
    need, total = 1, 1
    while total < H - 1:
        total += P ** need
        need += 1
    for t in trees:
        parent = {c: p for p, c, _ in t.edges}
        for v in parent:
            d, x = 0, v
            while x in parent:
                d += host[x] != host[parent[x]]
                x = parent[x]
            assert d <= need + 1
        # one child per port: no rank's host sends two of this tree's cross-host edges out
        # of one port
        ports = Counter()
        for p, c, path in t.edges:
            data = tuple(reversed(path)) if spec.kind == "reduce" else path
            if host[p] != host[c]:
                ports[next(a for a in zip(data, data[1:]) if a in set(outward[host[data[0]]]))] += 1
        assert max(ports.values()) == 1


@pytest.mark.parametrize("hosts,ports", [(3, 4), (4, 8), (5, 2)])
def test_chain_layout_runs_each_tree_through_its_own_port_of_every_host(hosts, ports):
    layout = lane_layout(hosts, ports, chains=True)
    for t, tree in enumerate(layout):
        assert [h for h, _ in tree] == list(range(1, hosts))  # every host once, in turn
        assert all(k == t for _, (_, k) in tree)  # through port t only
        assert [par for _, (par, _) in tree] == list(range(hosts - 1))  # one chain


RAILS4 = rails_text(4, 8, "n0.g0", "n3.g5")


@pytest.mark.parametrize("name", ["b", "r"])
def test_chained_lanes_use_no_relays_and_spread_as_stars(name):
    """Four NVSwitch hosts of eight GPUs and NICs on two rails: with ``chains`` and ``stars``
    every cross-host edge runs from the GPU behind its NIC straight out (no NVSwitch hop: no
    relay), each (host, port) carries its 1/P share once each way, every non-root host
    spreads each tree as a star from the tree's gateway, and the plan verifies, computes the
    right values and respects the max-flow bound."""
    spec, topo = setup(RAILS4, name)
    inward = spec.kind == "reduce"
    trees = wide_trees(topo, spec.ranks, spec.root, inward=inward, stars=True, chains=True)
    host = dict(topo.hosts)
    root_host = host[spec.ranks[spec.root]]
    load = _data_load(trees, spec.kind)
    for h, arcs in _outward(topo).items():
        for a, b in arcs:
            assert load[(a, b)] <= 1 / 8 + 1e-12 and load[(b, a)] <= 1 / 8 + 1e-12
    for t in trees:
        gate = {host[c]: c for p, c, _ in t.edges if host[p] != host[c]}
        for p, c, path in t.edges:
            if host[p] != host[c]:
                assert path[1].endswith(".nic" + p.rsplit("g", 1)[1])  # the sender's own NIC
            elif host[p] != root_host:
                assert p == gate[host[p]] and len(path) == 3  # a star through the NVSwitch
    assert host_depth(topo, trees) == 3
    bound = broadcast_bound(spec, topo)
    assert trees_rate(topo, trees, inward) == pytest.approx(spec.size_bytes / bound, rel=1e-9)
    plan = wide_plan(spec, topo, trees, 8 * 401)
    plan.verify()
    check_numeric(plan, seed=3)
    assert simulate(plan).time >= bound * (1 - 1e-9)


@pytest.mark.parametrize("hosts", [4, 2])
def test_wide_plan_takes_the_faster_of_its_two_chunk_rules(hosts):
    """On four NVSwitch hosts the rule that counts every loaded link asks for larger chunks
    than the cross-host routes alone (the switch ports' 2 us per message); wide_plan lowers
    at each of the two, windowed (lower_dbt) and, up to WIDE_TIMED_MAX_RANKS ranks (two hosts
    of 8, not four), under the timed schedule (lower_priced), and keeps whichever simulates
    fastest."""
    from hcc.compiler.bcast_wide import WIDE_TIMED_MAX_RANKS
    from hcc.compiler.lower import lower_priced

    spec, topo = setup(rails_text(hosts, 8, "n0.g0", f"n{hosts - 1}.g5"), "b", elems=32 << 20)
    trees = wide_trees(topo, spec.ranks, spec.root, stars=True, chains=hosts > 2)
    cross, every = (wide_chunk(spec, topo, trees, 1e-6, inside=x) for x in (False, True))
    assert every > cross or hosts == 2  # two hosts: the rules agree
    plan = wide_plan(spec, topo, trees, spec.size_bytes)
    sizes = sorted({cross, every})
    times = [simulate(lower_dbt(spec, topo, trees, c, algorithm="treepack-wide")).time for c in sizes]
    if len(spec.ranks) <= WIDE_TIMED_MAX_RANKS:
        times += [lower_priced(spec, topo, trees, c, algorithm="treepack-wide")[1].time for c in sizes]
        sizes += sizes
    assert (len(times) > len({cross, every})) == (hosts == 2)
    assert plan.chunk_bytes == sizes[times.index(min(times))]
    assert simulate(plan).time == pytest.approx(min(times), rel=1e-12)


def test_nvswitch_root_host_feeds_each_port_first():
    """Where the root's host has no direct links (an NVSwitch) and sends each lane from the
    rank behind its port, that rank is the root's child in the lane's tree (one switch hop,
    not a chain of the host's ranks), and the lane spreads from it. Two 8-GPU A100-like
    servers at 256 MiB, as ``hcc compile`` plans them: the broadcast reaches 0.87 of the
    max-flow bound and the reduce 0.88 (the windowed plans over the least-loaded chain:
    0.856 and 0.842); the small plans verify and compute what numpy computes."""
    two = rails_text(2, 8, "n0.g0", "n0.g0")
    big = load_program(two.replace("size = 1 MiB", "size = 256 MiB"))
    for name in ("b", "r"):
        spec, topo = setup(two, name)
        inward = spec.kind == "reduce"
        trees = wide_trees(topo, spec.ranks, spec.root, inward=inward)
        host = dict(topo.hosts)
        root = spec.ranks[spec.root]
        for t in trees:
            out = [(p, c) for p, c, _ in t.edges if host[p] != host[c]]
            port = out[0][0]
            assert len(out) == 1 and host[port] == host[root]
            if port != root:  # the root's one child: the rank behind the lane's port
                assert [c for p, c, _ in t.edges if p == root] == [port]
        plan = wide_plan(spec, topo, trees, 8 * 401)
        plan.verify()
        check_numeric(plan, seed=5)
        compiled = compile_one(big, name)
        assert compiled.algorithm == "treepack-wide"
        eff = broadcast_bound(resolve(big, name), topo, most=15) / simulate(compiled).time
        assert eff >= (0.88 if inward else 0.87)


def test_wide_is_shallower_and_faster_than_the_binary_pairs():
    """On 8 four-NIC hosts at 64 MiB the lane trees are predicted faster than treepack-dbt's
    pairs (compiler/cost.py's simulation, not a clock)."""
    spec, topo = setup(WIDE8, "b", elems=8 << 20)
    wide = wide_trees(topo, spec.ranks, spec.root)
    dbt = dbt_trees(topo, spec.ranks, spec.root)
    assert host_depth(topo, wide) < host_depth(topo, dbt)
    assert simulate(wide_plan(spec, topo, wide, 1 << 20)).time < simulate(dbt_plan(spec, topo, dbt, 1 << 20)).time


def test_wide_declines_where_lanes_do_not_apply():
    """One port per host (the fat tree's nodes), or hosts with different port counts."""
    spec, topo = setup(FATTREE, "broadcast")
    assert wide_trees(topo, spec.ranks, spec.root) is None
    uneven = MULTIPORT.replace("host h[0..2] {", "host h[0..1] {", 1).replace(
        "switch fabric", """host h2 {
        node g[0..1]
        switch nic0
        g0 <-> g1 : 50 GB/s, 1 us
        g[0..1] <-> nic0 : 12 GB/s, 2 us
    }
    switch fabric""").replace("h[0..2].nic[0..1] <-> fabric : 100 Gbit/s, 5 us",
                              "h[0..1].nic[0..1] <-> fabric : 100 Gbit/s, 5 us\n    h2.nic0 <-> fabric : 100 Gbit/s, 5 us"
                              ).replace("h2.g3", "h2.g1")
    spec, topo = setup(uneven, "b")
    assert wide_trees(topo, spec.ranks, spec.root) is None


def dgx_text(hosts: int) -> str:
    """samples/dgx1x64.hcl cut to ``hosts`` DGX-1s, with a broadcast and a reduce at dgx1.gpu3."""
    text = (ROOT / "samples" / "dgx1x64.hcl").read_text().replace("[0..63]", f"[0..{hosts - 1}]")
    return (text[:text.index("\ncollective ") + 1] + "collective b = broadcast on dgx1x64 { root = dgx1.gpu3  size = 1 MiB }\n"
            "collective r = reduce on dgx1x64 { root = dgx1.gpu3  size = 1 MiB }\n")


@pytest.mark.parametrize("hosts,name", [(3, "b"), (3, "r"), (9, "r")])
def test_wide_in_host_trees_keep_off_the_relays(hosts, name):
    """Broadcast and reduce on DGX-1 hosts (NVLink cube-mesh, 4 NICs): at every host but the
    root's, no NVLink carries both an in-host tree edge and a relay (a cross-host edge's hop
    between its host's gateway and the GPU behind its NIC), no two relays share one, no
    NVLink carries more than two in-host trees, and the trees whose host is deepest in them
    are pairwise NVLink-disjoint (all read off the trees' paths, in the data's direction);
    the plan verifies, and on 3 hosts computes the right values."""
    spec, topo = setup(dgx_text(hosts), name, elems=3001)
    inward = spec.kind == "reduce"
    trees = wide_trees(topo, spec.ranks, spec.root, inward=inward)
    host = dict(topo.hosts)
    root_host = host[spec.ranks[spec.root]]
    ranks = set(spec.ranks)
    relay, inner = Counter(), Counter()
    per_tree: list[Counter] = []
    for t in trees:
        mine = Counter()
        for p, c, path in t.edges:
            data = tuple(reversed(path)) if inward else path
            arcs = [(a, b) for a, b in zip(data, data[1:]) if a in ranks and b in ranks and host[a] != root_host]
            (inner if host[p] == host[c] else relay).update(arcs)
            if host[p] == host[c]:
                mine.update(arcs)
        per_tree.append(mine)
    assert inner and not set(relay) & set(inner)
    assert max(relay.values(), default=1) == 1 and max(inner.values()) <= 2
    # a host's depth in each tree, counted from the cross-host edges
    depth = []
    for t in trees:
        par = {host[c]: host[p] for p, c, _ in t.edges if host[p] != host[c]}
        d = {}
        for h in par:
            k, x = 0, h
            while x in par:
                x, k = par[x], k + 1
            d[h] = k
        depth.append(d)
    for h in set(host.values()) - {root_host}:
        deepest = [i for i in range(len(trees)) if depth[i][h] == max(depth[i].values())]
        arcs = [{a for a in per_tree[i] if host[a[0]] == h} for i in deepest]
        for i in range(len(arcs)):
            for j in range(i):
                assert not arcs[i] & arcs[j], (h, deepest[i], deepest[j])
    plan = wide_plan(spec, topo, trees, 8 * 401)
    plan.verify()
    if hosts == 3:
        check_numeric(plan, seed=3)


# two A100-like hosts of eight GPUs
NVS8 = rails_text(2, 8, "n0.g0", "n0.g0")


@pytest.mark.parametrize("name", ["b", "r"])
def test_wide_stars_spread_a_leaf_nvswitch_host_in_one_hop(name):
    """With ``stars``, the host that is a leaf of every tree spreads each tree from its
    gateway in one NVSwitch hop (the least-loaded trees there are chains); the plans verify,
    compute the right values, keep the bound, and at 64 MiB the stars are predicted faster
    (compiler/cost.py's simulation: the last chunk is one hop from every rank, not seven)."""
    spec, topo = setup(NVS8, name, elems=3001)
    host = dict(topo.hosts)
    inward = spec.kind == "reduce"
    plain = wide_trees(topo, spec.ranks, spec.root, inward=inward)
    stars = wide_trees(topo, spec.ranks, spec.root, inward=inward, stars=True)
    assert len(stars) == 8
    for t in stars:
        inside = [(p, c) for p, c, _ in t.edges if host[p] == host[c] == "n1"]
        gateway = next(c for p, c, _ in t.edges if host[p] == "n0" and host[c] == "n1")
        assert len(inside) == 7 and {p for p, _ in inside} == {gateway}
    assert any(len({p for p, c, _ in t.edges if host[p] == host[c] == "n1"}) > 1 for t in plain)
    bound = broadcast_bound(spec, topo)
    for chunk in (8 * 401, 8 * 3001):
        plan = wide_plan(spec, topo, stars, chunk)
        plan.verify()
        check_numeric(plan, seed=chunk)
        assert simulate(plan).time >= bound * (1 - 1e-9)
    big, topo = setup(NVS8, name, elems=16 << 20)
    stars = wide_trees(topo, big.ranks, big.root, inward=inward, stars=True)
    plain = wide_trees(topo, big.ranks, big.root, inward=inward)
    assert (min(simulate(wide_plan(big, topo, stars, c)).time for c in (1 << 20, 1 << 21))
            < 0.97 * min(simulate(wide_plan(big, topo, plain, c)).time for c in (1 << 20, 1 << 21)))


def test_paced_lanes_spread_from_each_port_and_end_in_the_order_they_start():
    """Two A100-like servers (1 us per link), broadcast 256 MiB at 1.25 MiB chunks: with
    ``root_stars`` the rank behind each port is the root's one child in its lane and spreads
    the lane over the root's host as a star; the paced plans (bcast_wide._paced) post an
    in-host edge's receives one chunk ahead and a cross-host edge's two, and the windowed
    plan of the same trees (two everywhere) reaches under 0.88 of the networkx bound where
    the paced one reaches 0.895 at even shares and 0.90 with the shares set from its
    completion times, the lanes' shares falling in the order their first message crosses
    between the hosts. A reduce's in-host receives one chunk ahead speed it up as much.
    Small plans verify and compute what numpy computes."""
    from hcc.compiler.bcast_wide import _paced
    from hcc.compiler.cost import DEFAULT_MODEL, completion_times
    from hcc.ir.plan import Recv

    text = rails_text(2, 8, "n0.g0", "n0.g0", nic_us=1)
    spec, topo = setup(text, "b", elems=32 << 20)
    host = dict(topo.hosts)
    root = spec.ranks[spec.root]
    trees = wide_trees(topo, spec.ranks, spec.root, stars=True, root_stars=True)
    for t in trees:
        port = next(p for p, c, _ in t.edges if host[p] != host[c])
        mine = [(p, c) for p, c, _ in t.edges if host[p] == host[c] == host[root]]
        if port != root:
            assert [c for p, c in mine if p == root] == [port]
            assert {p for p, _ in mine} == {root, port} and len(mine) == 7
    bound = broadcast_bound(spec, topo, most=15)
    chunk = 1310720
    windowed = simulate(lower_dbt(spec, topo, trees, chunk, algorithm="treepack-wide")).time
    got = _paced(spec, topo, trees, chunk, DEFAULT_MODEL)
    even, *moved = got
    assert len(moved) >= 1
    for r, prog in enumerate(even[0].programs):  # each edge's receives gate the next one's
        last: dict = {}
        for i, op in enumerate(prog):
            if isinstance(op, Recv):
                edge = (op.tree, op.peer)
                seen = last.setdefault(edge, [])
                ahead = 1 if host[spec.ranks[op.peer]] == host[spec.ranks[r]] else 2
                if len(seen) >= ahead:
                    assert seen[-ahead] in op.deps
                seen.append(i)
    assert bound / windowed < 0.88 and bound / even[1] >= 0.895
    best = min(got, key=lambda x: x[1])
    assert best is not even and bound / best[1] >= 0.90
    done, base = completion_times(even[0])
    first = {}
    for r, prog in enumerate(even[0].programs):
        for i, op in enumerate(prog):
            if isinstance(op, Recv) and host[spec.ranks[r]] != host[spec.ranks[op.peer]] == host[root]:
                first[op.tree] = min(first.get(op.tree, math.inf), done[base[r] + i])
    order = sorted(first, key=first.get)
    shares = [best[0].trees[j].span[1] - best[0].trees[j].span[0] for j in order]
    assert shares == sorted(shares, reverse=True) and shares[0] > shares[-1]
    assert sum(shares) == spec.size_bytes // 8
    # the reduce over the same servers: one plan, its in-host receives one chunk ahead,
    # against two: 0.824 -> 0.879 of the bound
    red, topo = setup(text, "r", elems=32 << 20)
    trees = wide_trees(topo, red.ranks, red.root, inward=True, stars=True)
    ((plan, ahead),) = _paced(red, topo, trees, chunk, DEFAULT_MODEL)
    assert ahead < 0.95 * simulate(lower_dbt(red, topo, trees, chunk, algorithm="treepack-wide")).time
    for name in ("b", "r"):
        small, topo = setup(text, name, elems=3001)
        trees = wide_trees(topo, small.ranks, small.root, inward=name == "r", stars=True, root_stars=name == "b")
        for plan, _ in _paced(small, topo, trees, 8 * 401, DEFAULT_MODEL):
            plan.verify()
            check_numeric(plan, seed=7)
