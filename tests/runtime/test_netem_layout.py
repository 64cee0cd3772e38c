"""What ``hcc netem up`` would build, checked without root: :func:`netem.layout` is pure."""
from __future__ import annotations

import itertools

import pytest

from hcc import netem
from hcc.cli import main
from hcc.ir.topology import Link, Topology

GB = 1e9


def ring(n: int, slow: tuple[int, int] | None = None) -> Topology:
    links = []
    for i in range(n):
        j = (i + 1) % n
        c = 1 * GB if slow and {i, j} == set(slow) else 10 * GB
        links += [Link(f"g{i}", f"g{j}", c, 2e-6), Link(f"g{j}", f"g{i}", c, 2e-6)]
    return Topology("ring", nodes=tuple(f"g{i}" for i in range(n)), links=tuple(links))


def walk(n: netem.Netem, src: str, dst: str) -> list[str]:
    """Follow next hops from ``src`` to ``dst`` the way the kernel would."""
    by_addr = {a: v for v, a in n.addresses}
    nxt = {(r.ns, r.dst): by_addr[r.via] for r in n.routes}
    ns = dict(n.namespaces)
    path = [src]
    while path[-1] != dst:
        path.append(nxt[(ns[path[-1]], n.address(dst))])
        assert len(path) <= len(n.namespaces) + 1, f"routing loop {path}"
    return path


def test_layout_namespaces_addresses_and_scaled_links():
    topo = Topology(
        "mix", nodes=("a", "b", "c"), switches=("s",),
        links=(Link("a", "s", 4 * GB), Link("s", "a", 4 * GB), Link("b", "s", 2 * GB),
               Link("s", "b", 2 * GB), Link("c", "s", 1 * GB), Link("s", "c", 1 * GB),
               Link("a", "b", 3 * GB), Link("a", "b", 1 * GB)),  # two declarations add up; b -> a undeclared
    )
    n = netem.layout(topo, "mix", scale=0.001)
    assert [ns for _, ns in n.namespaces] == ["hcc-mix-a", "hcc-mix-b", "hcc-mix-c", "hcc-mix-s"]
    assert len({a for _, a in n.addresses}) == 4
    assert n.topology.nodes == topo.nodes and n.topology.switches == ("s",)
    rates = {(e.vertex, e.peer): e.rate_Bps for e in n.ends}
    assert rates[("a", "s")] == pytest.approx(4e6) and rates[("s", "c")] == pytest.approx(1e6)
    assert rates[("a", "b")] == pytest.approx(4e6)  # 3 + 1 GB/s, scaled
    assert rates[("b", "a")] == 0.0  # undeclared direction: unshaped, for ACKs
    assert len(n.kinds) == 4 and set(n.kinds) == {"veth"}
    # device names are unique within each namespace and fit IFNAMSIZ (15)
    for ns, group in itertools.groupby(sorted(n.ends, key=lambda e: e.ns), key=lambda e: e.ns):
        devs = [e.dev for e in group]
        assert len(devs) == len(set(devs)) and all(len(d) <= 15 for d in devs)
    # every vertex reaches every node; b -> a avoids the undeclared reverse of a -> b
    for src, dst in itertools.product([v for v, _ in n.namespaces], topo.nodes):
        if src != dst:
            assert walk(n, src, dst)[-1] == dst
    assert walk(n, "b", "a") == ["b", "s", "a"]
    assert walk(n, "a", "b") == ["a", "b"]


def test_routing_modes():
    slow4 = ring(4, slow=(0, 3))
    assert walk(netem.layout(slow4, "r4", routing="hops"), "g0", "g3") == ["g0", "g3"]  # a cable
    # the cost model's metric, 2 us + 1 MiB / c per arc: 3 x 105 us round beats 1050 us direct
    assert walk(netem.layout(slow4, "r4"), "g0", "g3") == ["g0", "g1", "g2", "g3"]
    n = netem.layout(slow4, "r4", routing="bandwidth")
    # 1/1 GB/s direct costs more than 3 hops at 1/10 GB/s: go round (OSPF-style cost)
    assert walk(n, "g0", "g3") == ["g0", "g1", "g2", "g3"]
    assert walk(n, "g0", "g1") == ["g0", "g1"]
    # on 16 ranks the way round is 15 hops x 0.1 = 1.5 > 1.0: take the slow link
    n16 = netem.layout(ring(16, slow=(0, 15)), "r16", routing="bandwidth")
    assert walk(n16, "g0", "g15") == ["g0", "g15"]
    # equal hop counts: the wider path wins the tie (g0 -> g2 via g1 at 10 GB/s, not via g3)
    assert walk(netem.layout(slow4, "r4", routing="hops"), "g0", "g2") == ["g0", "g1", "g2"]
    assert walk(netem.layout(slow4, "r4", routing="hops"), "g3", "g1") == ["g3", "g2", "g1"]
    with pytest.raises(netem.NetemError, match="routing 'ospf'"):
        netem.layout(slow4, "r4", routing="ospf")


def test_delay_modes():
    topo = Topology(
        "d", nodes=("a", "b", "c"),
        links=(Link("a", "b", GB, 0.003), Link("b", "a", GB, 0.003),
               Link("b", "c", GB, 1e-6), Link("c", "b", GB, 1e-6)),
    )
    line = netem.layout(topo, "d", delay_mode="delay-line")
    assert line.kinds == ("tun", "veth")  # 1 us is below the delay line's resolution
    assert [e.delay_s for e in line.ends] == [0.003, 0.003, 0.0, 0.0]
    kern = netem.layout(topo, "d", delay_mode="netem")
    assert kern.kinds == ("veth", "veth") and kern.ends[2].delay_s == 1e-6
    assert all(e.delay_s == 0 for e in netem.layout(topo, "d", delay_mode="none").ends)
    assert any("netem delay 3000us" in l for l in netem._shape_lines(kern.ends[0], True))


def test_wrap_address_and_state_round_trip():
    n = netem.layout(ring(3), "w")
    assert n.wrap(1, ["echo", "hi"])[-4:] == ["exec", "hcc-w-g1", "echo", "hi"]
    assert n.address("g2") == n.address(2) == "10.77.0.3"
    assert netem.Netem.from_dict(n.to_dict()) == n
    with pytest.raises(netem.NetemError, match="rank 7 out of range"):
        n.address(7)
    with pytest.raises(netem.NetemError, match="no vertex 'gpu9'"):
        n.wrap("gpu9", ["true"])


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "x" * 40])
def test_bad_names_are_refused(bad):
    with pytest.raises(netem.NetemError, match="bad name"):
        netem.layout(ring(2), bad)


def test_not_root_is_a_clear_exit_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(netem.os, "geteuid", lambda: 1000)
    monkeypatch.setenv("HCC_NETEM_STATE_DIR", str(tmp_path))
    assert main(["netem", "up", "whatever.hcl"]) == 2
    assert "needs root" in capsys.readouterr().err
    assert main(["netem", "status"]) == 2


TRI_HCL = """
topology tri {
    node a, b, c
    a <-> b : 40 MB/s, 300 us
    b <-> c : 40 MB/s
    a <-> c : 40 MB/s
}
collective ar = allreduce on tri {
    size = 4 MB
}
"""


def test_run_netem_compiles_against_the_emulated_topology(tmp_path, monkeypatch):
    # `hcc run --netem` must predict the links that exist: the scaled capacities (40 MB/s at
    # scale 0.5 are 20 MB/s) and, on delay-line links, the latency plus the relay's measured
    # cost per crossing. A state file as `up` writes it is all it reads (no root needed).
    from dataclasses import replace

    import hcc
    from hcc.compiler.pipeline import compile_unit
    from hcc.runner import RUN_MODELS, load_plans

    src = tmp_path / "tri.hcl"
    src.write_text(TRI_HCL)
    monkeypatch.setenv("HCC_NETEM_STATE_DIR", str(tmp_path / "state"))
    netem.state_dir().mkdir()
    topo = hcc.load(str(src)).topologies["tri"]
    n = replace(netem.layout(topo, "tri", scale=0.5, delay_mode="delay-line"), relay_extra_s=1e-4)
    netem.state_path("tri").write_text(__import__("json").dumps(n.to_dict()))
    model = n.model_topology()
    lat = {(l.src, l.dst): l.latency for l in model.links}
    assert lat[("a", "b")] == pytest.approx(400e-6) and lat[("b", "c")] == 0.0  # only delayed arcs
    assert {l.capacity for l in model.links} == {20e6}

    (plan,) = load_plans(str(src), netem=True)
    program = hcc.load(str(src))
    # compiled with the sockets runtime's cost model, as `hcc run` (sockets) does
    want = compile_unit(replace(program, topologies={"tri": model}), "ar", model=RUN_MODELS["sockets"]).plan
    unscaled = compile_unit(program, "ar", model=RUN_MODELS["sockets"]).plan
    assert plan.figures.predicted_s == pytest.approx(want.figures.predicted_s)
    assert plan.chunk_bytes == want.chunk_bytes
    assert plan.figures.bound_s == pytest.approx(want.figures.bound_s)
    # half the capacity: the bandwidth terms (4 MB over 20 instead of 40 MB/s) double
    assert plan.figures.bound_s > 1.8 * unscaled.figures.bound_s
    assert plan.topology == model

    # a compiled plan.json cannot be recompiled: it is re-priced on the emulated links
    path = tmp_path / "ar.json"
    unscaled.save(str(path))
    (repriced,) = load_plans(str(path), netem=True)
    assert repriced.programs == unscaled.programs and repriced.topology == model
    assert repriced.figures.predicted_s > 1.8 * unscaled.figures.predicted_s
    assert repriced.figures.bound_s == pytest.approx(plan.figures.bound_s, rel=0.05)


def test_run_netem_without_a_matching_emulation_says_so(tmp_path, monkeypatch):
    from hcc.backends.base import RuntimeFault
    from hcc.runner import load_plans

    src = tmp_path / "tri.hcl"
    src.write_text(TRI_HCL)
    monkeypatch.setenv("HCC_NETEM_STATE_DIR", str(tmp_path))
    netem.state_path("other").write_text(__import__("json").dumps(netem.layout(ring(3), "other").to_dict()))
    with pytest.raises(RuntimeFault, match="no emulation is up with the vertices a, b, c .*up: other"):
        load_plans(str(src), netem=True)


def test_model_topology_drops_the_arcs_no_route_uses():
    # routed like the cost model, slow4's g0 and g3 reach each other over the three fast
    # links: the slow link carries nothing, so a plan must not be priced as if it did
    slow4 = ring(4, slow=(0, 3))
    cost = netem.layout(slow4, "m", routing="cost")
    assert ("g0", "g3") not in cost.live_arcs() and ("g0", "g1") in cost.live_arcs()
    arcs = {(l.src, l.dst) for l in cost.model_topology().links}
    assert arcs == {(l.src, l.dst) for l in slow4.links} - {("g0", "g3"), ("g3", "g0")}
    # routed by hops the slow link is a cable both neighbours use: nothing is dropped
    assert netem.layout(slow4, "m", routing="hops").model_topology() == slow4
    assert netem.layout(ring(4), "m").model_topology() == ring(4)


@pytest.mark.parametrize("key", ["b", "c"])
def test_run_netem_predicts_what_the_bench_prints(key, tmp_path, monkeypatch):
    # `hcc run --netem` on the .hcl a user writes for a bench case (slow4, twohost4 at 64 MiB)
    # compiles the same plan as benchmarks/netem_bench.py and predicts the same time: one
    # compile function (hcc.runner.compile_on) and one per-message cost (RUN_MODELS)
    import sys
    from dataclasses import replace
    from pathlib import Path

    import hcc
    from hcc.compiler.cost import simulate
    from hcc.runner import RUN_MODELS, load_plans

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import netem_bench

    case = netem_bench.make_case(key, 4)
    size = 64 << 20
    monkeypatch.setenv("HCC_NETEM_STATE_DIR", str(tmp_path / "state"))
    netem.state_dir().mkdir()
    emu = netem.scaled(case.topology, case.scale).restricted(case.ranks)
    n = netem.layout(case.topology.restricted(case.ranks), case.name, scale=case.scale, routing=case.routing,
                     delay_mode="delay-line")
    n = replace(n, relay_extra_s=1e-4 if key == "c" else 0.0)  # as `up` measures it on twohost
    netem.state_path(case.name).write_text(__import__("json").dumps(n.to_dict()))
    model = n.model_topology()

    src = tmp_path / "case.hcl"  # the user's file: the declared (unscaled) topology
    src.write_text(netem_bench.program_source(case.topology, case.ranks, "allreduce", size, "treepack"))
    (plan,) = load_plans(str(src), netem=True)
    bench = netem_bench.compile_case(model, case.ranks, "allreduce", size, "treepack", RUN_MODELS["sockets"])
    assert hcc.load(str(src)).collectives[0].size_bytes == size and emu.nodes == model.nodes
    assert plan.chunk_bytes == bench.chunk_bytes and plan.algorithm == bench.algorithm
    assert plan.figures.predicted_s == pytest.approx(bench.figures.predicted_s, rel=1e-9)
    assert simulate(bench, model=RUN_MODELS["sockets"]).time == pytest.approx(plan.figures.predicted_s, rel=1e-9)
