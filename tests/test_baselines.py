"""The NCCL-like baselines (compiler/baselines.py, channels.py), checked structurally and
against brute force: ring channels are Hamiltonian, follow real links and never over-book one;
their count on known topologies (DGX-1's NVLinks: NCCL's six rings) and their best total
against an exhaustive packing of Hamiltonian cycles on small graphs; recursive doubling sends
log2(n) messages per rank, Bruck ceil(log2 n) steps; every baseline plan passes the symbolic verifier."""
from __future__ import annotations

import itertools
import math

import pytest

from hcc.compiler.baselines import rd_plan, rd_steps
from hcc.compiler.channels import ring_channels, rings_plan
from hcc.compiler.program import CollectiveSpec
from hcc.ir.plan import Send
from hcc.ir.topology import Link, Topology

GB = 1e9

DGX1_X2 = ["01", "04", "13", "23", "26", "45", "57", "67"]
DGX1_X1 = ["02", "03", "12", "15", "37", "46", "47", "56"]


def dgx1_nvlink() -> Topology:
    v = tuple(f"gpu{i}" for i in range(8))
    links = []
    for pairs, mult in ((DGX1_X2, 2), (DGX1_X1, 1)):
        for a, b in pairs:
            for _ in range(mult):
                links += [Link(f"gpu{a}", f"gpu{b}", 25 * GB, 1e-6), Link(f"gpu{b}", f"gpu{a}", 25 * GB, 1e-6)]
    return Topology("dgx1_nvlink", v, links=tuple(links))


def complete(n: int, cap: float = 1 * GB) -> Topology:
    v = tuple(f"n{i}" for i in range(n))
    return Topology(f"k{n}", v, links=tuple(Link(a, b, cap, 1e-6) for a in v for b in v if a != b))


def a100(nodes: int) -> Topology:
    """ForestColl's A100 servers: 8 GPUs on an NVSwitch (300 GB/s), GPU i's 25 GB/s NIC on
    IB switch i mod 2 (built here from its description, for the channel count)."""
    verts, sw, links, hosts = [], [], [], []
    for a in range(nodes):
        hosts += [(f"nvs{a}", f"node{a}")] + [(f"{x}{a}_{b}", f"node{a}") for x in ("g", "nic") for b in range(8)]
        sw.append(f"nvs{a}")
        for b in range(8):
            g, nic = f"g{a}_{b}", f"nic{a}_{b}"
            verts.append(g)
            sw.append(nic)
            links += [Link(g, f"nvs{a}", 300 * GB), Link(f"nvs{a}", g, 300 * GB),
                      Link(g, nic, 25 * GB), Link(nic, g, 25 * GB),
                      Link(nic, f"ib{b % 2}", 25 * GB), Link(f"ib{b % 2}", nic, 25 * GB)]
    sw += ["ib0", "ib1"]
    return Topology(f"a100x{nodes}", tuple(verts), switches=tuple(sw), links=tuple(links), hosts=tuple(hosts))


def spec(kind: str, topo: Topology, elems: int = 4096, root: int = 0, **kw) -> CollectiveSpec:
    rooted = kind in ("broadcast", "reduce", "gather", "scatter")
    op = "sum" if kind in ("reduce", "allreduce", "reduce_scatter") else None
    return CollectiveSpec("c", kind, topo.name, topo.nodes, root if rooted else -1, elems * 4, "float32",
                          kw.pop("op", op), **kw)


def check_channels(topo: Topology, chans) -> None:
    """Each channel is a Hamiltonian cycle whose hops follow links; no link carries more than
    its capacity summed over the channels crossing it."""
    n = len(topo.nodes)
    cap: dict = {}
    for l in topo.links:
        cap[(l.src, l.dst)] = cap.get((l.src, l.dst), 0.0) + l.capacity
    load: dict = {}
    for ch in chans:
        assert sorted(ch.order) == list(range(n))
        assert len(ch.paths) == n
        for i, path in enumerate(ch.paths):
            assert path[0] == topo.nodes[ch.order[i]] and path[-1] == topo.nodes[ch.order[(i + 1) % n]]
            assert all(x not in topo.nodes for x in path[1:-1])  # ranks do not forward
            for arc in zip(path, path[1:]):
                assert arc in cap
                load[arc] = load.get(arc, 0.0) + ch.rate
    for arc, used in load.items():
        assert used <= cap[arc] * (1 + 1e-9), (arc, used, cap[arc])


def ham_cycles(topo: Topology) -> list[tuple[tuple[str, str], ...]]:
    """Every directed Hamiltonian cycle over direct links, as arc tuples (brute force)."""
    v = topo.nodes
    arcs = {(l.src, l.dst) for l in topo.links}
    out = []
    for perm in itertools.permutations(v[1:]):
        cyc = (v[0],) + perm
        hops = tuple(zip(cyc, cyc[1:] + cyc[:1]))
        if all(h in arcs for h in hops):
            out.append(hops)
    return out


def best_packing_total(topo: Topology, divisors=range(1, 9)) -> float:
    """The most total rate any set of equal-rate rings can have, with the rates c / k the
    search tries (c the common link capacity): for each k, the most Hamiltonian cycles
    (repeats allowed) with every arc used at most k times, by exhaustive search; times c/k."""
    cycles = ham_cycles(topo)
    c = topo.links[0].capacity
    best = 0.0
    for k in divisors:
        most = 0
        use: dict = {}

        def dfs(start: int, count: int) -> None:
            nonlocal most
            most = max(most, count)
            for i in range(start, len(cycles)):
                if all(use.get(a, 0) < k for a in cycles[i]):
                    for a in cycles[i]:
                        use[a] = use.get(a, 0) + 1
                    dfs(i, count + 1)
                    for a in cycles[i]:
                        use[a] -= 1

        dfs(0, 0)
        best = max(best, most * c / k)
    return best


def test_dgx1_nvlinks_give_ncclls_six_rings():
    topo = dgx1_nvlink()
    chans = ring_channels(topo, topo.nodes)
    check_channels(topo, chans)
    # each GPU has six NVLink bricks per direction and every ring takes one out of every GPU:
    # six rings of one brick (25 GB/s) is the most, and what NCCL builds on DGX-1
    assert len(chans) == 6
    assert all(ch.rate == pytest.approx(25 * GB) for ch in chans)


@pytest.mark.parametrize("n", [3, 4, 5])
def test_ring_channels_reach_the_brute_force_optimum_on_complete_graphs(n):
    topo = complete(n)
    chans = ring_channels(topo, topo.nodes)
    check_channels(topo, chans)
    total = sum(ch.rate for ch in chans)
    assert total == pytest.approx(best_packing_total(topo, (1, 2)), rel=1e-9)
    # K4* has no decomposition into 3 Hamiltonian cycles (Bermond-Faber), so whole-link rings
    # give 2 GB/s; half-rate rings give all 3 GB/s a vertex can send
    if n == 4:
        assert total == pytest.approx(3 * GB)
        assert best_packing_total(topo, (1,)) == pytest.approx(2 * GB)


def test_dgx1_fragment_channels_against_brute_force():
    topo = dgx1_nvlink().restricted(("gpu0", "gpu1", "gpu2", "gpu3", "gpu5"))
    topo = Topology("frag", topo.nodes, links=topo.links)
    chans = ring_channels(topo, topo.nodes)
    check_channels(topo, chans)
    # brute force over rings of one brick, per multiplicity of the bricks
    cycles = ham_cycles(topo)
    cap: dict = {}
    for l in topo.links:
        cap[(l.src, l.dst)] = cap.get((l.src, l.dst), 0.0) + l.capacity
    most = 0
    for counts in itertools.product(range(3), repeat=len(cycles)):
        use: dict = {}
        for cyc, m in zip(cycles, counts):
            for a in cyc:
                use[a] = use.get(a, 0) + m
        if all(use[a] * 25 * GB <= cap[a] * (1 + 1e-9) for a in use):
            most = max(most, sum(counts))
    assert sum(ch.rate for ch in chans) >= most * 25 * GB * (1 - 1e-9)


@pytest.mark.parametrize("nodes", [2, 4])
def test_a100_servers_run_one_ring_per_nic_pair(nodes):
    topo = a100(nodes)
    chans = ring_channels(topo, topo.nodes)
    check_channels(topo, chans)
    # every ring leaves and enters every server at least once, over one NIC each way; 8 NICs
    # of 25 GB/s per server: at most 200 GB/s of rings, reached (8 rings, as NCCL's rails)
    assert sum(ch.rate for ch in chans) == pytest.approx(200 * GB)


def test_rates_no_ring_can_use_are_not_searched(monkeypatch):
    """channels._Search.connected_at: on two A100 servers no ring runs above a NIC's 25 GB/s
    (the servers connect only through NICs), so those rates are not searched; the channels
    are those of the search that tries every rate."""
    from hcc.compiler import channels as CH

    topo = a100(2)
    s = CH._Search(topo, topo.nodes)
    assert s.connected_at(25 * GB) and not s.connected_at(25.5 * GB)
    searched: list[float] = []
    pack = CH._Search.pack
    monkeypatch.setattr(CH._Search, "pack", lambda self, rate, *a: searched.append(rate) or pack(self, rate, *a))
    for t in (topo, dgx1_nvlink(), complete(5)):
        searched.clear()
        got = ring_channels(t, t.nodes)
        pruned = list(searched)
        with monkeypatch.context() as m:
            m.setattr(CH._Search, "connected_at", lambda self, rate: True)
            searched.clear()
            assert ring_channels(t, t.nodes) == got
        if t is topo:
            assert pruned == [25 * GB] and len(searched) > 1 and max(searched) > 25 * GB


def test_rings_plans_verify_for_every_kind():
    topo = dgx1_nvlink()
    chans = ring_channels(topo, topo.nodes)
    for kind in ("broadcast", "reduce", "allreduce", "allgather", "reduce_scatter", "gather", "scatter"):
        plan = rings_plan(spec(kind, topo, elems=8 * 6 * 64, root=3), topo, chans, 256)
        plan.verify()
        assert plan.algorithm == "rings"
        sends = [op for prog in plan.programs for op in prog if type(op) is Send]
        if kind == "allreduce":  # a ring allreduce per channel: 2(n-1) steps of n messages
            chunks = 2  # 3072 elements over 6 channels and 8 segments: 64 per segment, 64 per chunk
            assert len(sends) == 6 * 2 * 7 * 8 * (chunks // 2)
            # every message takes its channel's own hop
            for prog in plan.programs:
                for op in prog:
                    if type(op) is Send:
                        assert op.tree >= 0


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_recursive_doubling_sends_log2_n_messages_per_rank(n):
    topo = complete(n)
    for kind in ("allgather", "reduce_scatter"):
        plan = rd_plan(spec(kind, topo, elems=n * 64), topo, n * 64 * 4)  # one chunk
        plan.verify()
        for r, prog in enumerate(plan.programs):
            sends = [op for op in prog if type(op) is Send]
            assert len(sends) == int(math.log2(n))
            # rank r's partners are r XOR 2^s
            assert sorted(op.peer for op in sends) == sorted(r ^ (1 << s) for s in range(int(math.log2(n))))
            # (n-1)/n of the buffer leaves every rank
            assert sum(op.src.count for op in sends) == (n - 1) * 64


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12])
def test_bruck_takes_ceil_log2_steps_and_verifies(n):
    steps = rd_steps(n)
    assert len(steps) == math.ceil(math.log2(n))
    topo = complete(n)
    for kind in ("allgather", "reduce_scatter"):
        for chunk in (n * 40 * 4, 12):  # one chunk, and many uneven ones
            plan = rd_plan(spec(kind, topo, elems=n * 40 + 3), topo, chunk)
            plan.verify()
            if chunk > 1000:
                for prog in plan.programs:
                    sends = [op for op in prog if type(op) is Send]
                    assert len(sends) <= 2 * len(steps)


def test_rd_reduce_scatter_with_avg_and_max():
    topo = complete(6)
    for op in ("max", "avg", "prod"):
        rd_plan(spec("reduce_scatter", topo, elems=6 * 17, op=op), topo, 20).verify()


@pytest.mark.parametrize("sample", ["dgx1.hcl", "cluster.hcl"])
def test_ring_allreduce_columns_are_the_ops_columns(sample):
    """channels.ring_allreduce_columns and ring_columns build, with numpy, the very op
    columns ir/opscan.py reads from rings_plan's and ring_plan's op objects (every column, sum and avg, one and several pieces
    per segment), so the simulated plans are the same, figure for figure."""
    import dataclasses
    from pathlib import Path

    import numpy as np

    import hcc
    from hcc.compiler import channels as CH
    from hcc.compiler.cost import simulate, simulate_columns
    from hcc.ir.opscan import scan

    prog = hcc.load(Path(__file__).resolve().parent.parent / "samples" / sample)
    base = next(c for c in prog.collectives if c.kind == "allreduce")
    topo = prog.topology_of(base)
    chans = ring_channels(topo, base.ranks)
    assert len(chans) >= 2
    for op, chunk in (("sum", 1 << 30), ("avg", 1 << 30), ("sum", 1 << 15), ("avg", 3 << 14)):
        s = dataclasses.replace(base, op=op, size_bytes=(1 << 20) + 12)
        plan = rings_plan(s, topo, chans, chunk)
        want, got = scan(plan.programs), CH.ring_allreduce_columns(s, chans, chunk)
        for f in dataclasses.fields(want):
            assert np.array_equal(np.asarray(getattr(want, f.name)), np.asarray(getattr(got, f.name))), f.name
        empty = CH._rings_allreduce(s, topo, chans, chunk, ops=False)
        assert not any(empty.programs) and empty.trees == plan.trees
        assert simulate_columns(empty, got) == simulate(plan)
        # the single ring (baselines.ring_plan), its messages on the cheapest routes
        from hcc.compiler.baselines import ring_plan
        from hcc.compiler.routes import ring_order

        one = ring_plan(s, topo, chunk)
        want, got = scan(one.programs), CH.ring_columns(s, ring_order(topo, s.ranks), chunk)
        for f in dataclasses.fields(want):
            assert np.array_equal(np.asarray(getattr(want, f.name)), np.asarray(getattr(got, f.name))), f.name
        assert simulate_columns(dataclasses.replace(one, programs=tuple(() for _ in one.programs)), got) == simulate(one)


def test_columns_priced_rings_compile_to_the_same_plan(monkeypatch):
    """With every ring allreduce priced from columns (COLUMN_OPS 0), DGX-1's allreduce over
    NCCL's rings (which auto selects there too) compiles to the plan of the op-object compile: the selected
    rings are lowered again as op objects, with the same figures. (A plan without ops ends
    the chunk search at its first size, as chunks.MAX_SEARCH_OPS ends it on every plan above
    COLUMN_OPS; here the rings' first size is their best.)"""
    from dataclasses import replace
    from pathlib import Path

    import hcc
    from hcc.compiler import channels as CH
    from hcc.compiler.pipeline import compile_unit

    program = hcc.load(Path(__file__).resolve().parent.parent / "samples" / "dgx1.hcl")
    spec = next(c for c in program.collectives if c.kind == "allreduce")
    # forced (no tree packing to price); auto selects the same rings here
    program = replace(program, collectives=(replace(spec, algorithm="rings"),))
    name = spec.name
    want = compile_unit(program, name)
    assert want.plan.algorithm == "rings" and want.plan.chunk_bytes == want.candidate("rings").choice.tried[0][0]
    monkeypatch.setattr(CH, "COLUMN_OPS", 0)
    got = compile_unit(program, name)
    assert got.plan.digest() == want.plan.digest()
    assert replace(got.plan.figures, compile_s=0.0) == replace(want.plan.figures, compile_s=0.0)
