"""Every sample program loads, and each describes the machine its comment says it does.
Expected structure (DGX-1 adjacency, host counts, capacities) is written out here from the
hardware description, independently of the sample files."""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest

from hcc.compiler.frontend import load_program
from hcc.ir.plan import DTYPE_SIZES

SAMPLES = Path(__file__).resolve().parent.parent / "samples"

NAMES = ["dgx1", "dgx1_fragmented", "nvswitch", "cluster", "hetero", "fattree", "demo", "fattree1024", "dgx1x64"]

# DGX-1 V100 hybrid cube-mesh: NVLink count per GPU pair
DGX1_NVLINKS = {
    **{p: 2 for p in [(0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7)]},
    **{p: 1 for p in [(0, 2), (0, 3), (1, 2), (1, 5), (3, 7), (4, 6), (4, 7), (5, 6)]},
}
NVLINK = 25e9


def capacities(topo) -> dict[tuple[str, str], float]:
    cap: dict[tuple[str, str], float] = defaultdict(float)
    for l in topo.links:
        cap[(l.src, l.dst)] += l.capacity
    return dict(cap)


def check_dgx1(topo):
    cap = capacities(topo)
    gpu_arcs = {k: v for k, v in cap.items() if k[0].startswith("gpu") and k[1].startswith("gpu")}
    expected = {}
    for (a, b), k in DGX1_NVLINKS.items():
        expected[(f"gpu{a}", f"gpu{b}")] = k * NVLINK
        expected[(f"gpu{b}", f"gpu{a}")] = k * NVLINK
    assert gpu_arcs == expected
    for g in range(8):  # every V100 has 6 NVLinks
        assert sum(v for (s, _), v in gpu_arcs.items() if s == f"gpu{g}") == 6 * NVLINK


@pytest.mark.parametrize("name", NAMES)
def test_sample_loads(name):
    p = load_program(SAMPLES / f"{name}.hcl")
    assert p.collectives and p.topologies
    for c in p.collectives:
        assert c.size_bytes % DTYPE_SIZES[c.dtype] == 0 and len(c.ranks) >= 2


def test_every_sample_is_listed():
    assert sorted(f.stem for f in SAMPLES.glob("*.hcl")) == sorted(NAMES)


def test_dgx1():
    p = load_program(SAMPLES / "dgx1.hcl")
    t = p.topologies["dgx1"]
    assert t.nodes == tuple(f"gpu{i}" for i in range(8)) and t.switches == ("pcie0", "pcie1")
    check_dgx1(t)
    check_dgx1(p.topologies["dgx1_nvlink"])
    assert not p.topologies["dgx1_nvlink"].switches
    cap = capacities(t)
    for g in range(8):
        sw = "pcie0" if g < 4 else "pcie1"
        assert cap[(f"gpu{g}", sw)] == cap[(sw, f"gpu{g}")] == 12e9
    assert cap[("pcie0", "pcie1")] == cap[("pcie1", "pcie0")] == 10e9
    kinds = {c.name: c for c in p.collectives}
    for kind in ["broadcast", "allreduce", "allgather", "reduce_scatter", "reduce", "gather",
                 "scatter", "alltoall"]:
        assert kinds[kind].kind == kind and kinds[kind].dtype == "float32"
        assert kinds[kind].ranks == t.nodes
    assert kinds["broadcast"].size_bytes == 500 * 10**6 and kinds["broadcast"].root == 0
    assert kinds["allreduce"].size_bytes == 100 * 10**6
    assert kinds["allgather"].size_bytes == 64 * 10**6


def test_dgx1_fragmented_allocations():
    p = load_program(SAMPLES / "dgx1_fragmented.hcl")
    check_dgx1(p.topologies["dgx1"])
    allocs = {c.ranks for c in p.collectives}
    for gpus in ([0, 1, 3, 6], [2, 3, 6, 7], [0, 4, 5, 6, 7]):
        assert tuple(f"gpu{i}" for i in gpus) in allocs
    assert all(len(c.ranks) < 8 for c in p.collectives)


def test_nvswitch():
    t = load_program(SAMPLES / "nvswitch.hcl").topologies["nvswitch"]
    assert len(t.nodes) == 8 and t.switches == ("nvs",)
    assert capacities(t) == {**{(g, "nvs"): 150e9 for g in t.nodes}, **{("nvs", g): 150e9 for g in t.nodes}}


def test_cluster():
    p = load_program(SAMPLES / "cluster.hcl")
    t = p.topologies["cluster"]
    assert len(t.nodes) == 32 and Counter(t.host_of(v) for v in t.nodes) == {f"h{i}": 8 for i in range(4)}
    nics = [s for s in t.switches if ".nic" in s]
    assert len(nics) == 32 and "tor" in t.switches and sum(".nvs" in s for s in t.switches) == 4
    cap = capacities(t)
    assert all(cap[(n, "tor")] == cap[("tor", n)] == 12.5e9 for n in nics)
    assert all(cap[(g, g.split(".")[0] + ".nvs")] == 150e9 for g in t.nodes)
    assert p.collective("allgather").ranks == t.nodes


def test_hetero_has_one_link_ten_times_slower():
    p = load_program(SAMPLES / "hetero.hcl")
    for t in p.topologies.values():
        assert 4 <= len(t.nodes) <= 8
        cap = capacities(t)
        fast = max(cap.values())
        slow = {k for k, v in cap.items() if v < fast}
        assert len(slow) == 2 and all(cap[k] * 10 == fast for k in slow)  # one pair, both ways


def test_fattree():
    t = load_program(SAMPLES / "fattree.hcl").topologies["fattree"]
    assert len(t.nodes) >= 128
    leaves = [s for s in t.switches if s.endswith(".leaf")]
    spines = [s for s in t.switches if s.startswith("spine")]
    assert len(leaves) == 8 and len(spines) == 8
    cap = capacities(t)
    for leaf in leaves:
        down = [v for v in t.nodes if t.host_of(v) == t.host_of(leaf)]
        assert len(down) == 16
        up = sum(cap[(leaf, s)] for s in spines)
        assert up == sum(cap[(v, leaf)] for v in down)  # full bisection: uplinks = downlinks


def test_demo_is_small():
    p = load_program(SAMPLES / "demo.hcl")
    assert any(c.kind == "allreduce" for c in p.collectives)
    for c in p.collectives:
        assert len(c.ranks) == 4 and c.size_bytes <= 16 * 2**20
