"""The front end means what language.md says: ranges, cliques, stars, multiplicity, units,
hosts and qualified names, defaults. Expected values are computed here from the language's
definitions, not read back from the implementation."""
from __future__ import annotations

import dataclasses
import doctest
import itertools
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hcc
from hcc.compiler import frontend, units
from hcc.compiler.frontend import load_program
from hcc.grammar import parser as parser_module
from hcc.ir.topology import Link

from conftest import CLUSTER


def topo(body: str, name: str = "t"):
    return load_program(f"topology {name} {{\n{body}\n}}\n").topologies[name]


def arcs(t) -> Counter:
    return Counter((l.src, l.dst) for l in t.links)


# ---- ranges, cliques, stars ----------------------------------------------------------------

def test_ranges_and_lists_expand_in_order():
    t = topo("node gpu[0..3], nic0, nic1\nnode x[0,3,5..6]\nswitch s[1..2]")
    assert t.nodes == ("gpu0", "gpu1", "gpu2", "gpu3", "nic0", "nic1", "x0", "x3", "x5", "x6")
    assert t.switches == ("s1", "s2")


@pytest.mark.parametrize("arrow", ["->", "<->"])
def test_clique_of_one_range_has_each_ordered_pair_once(arrow):
    n = 5
    t = topo(f"node a[0..{n - 1}]\na[0..{n - 1}] {arrow} a[0..{n - 1}] : 1 GB/s")
    expected = Counter((f"a{i}", f"a{j}") for i in range(n) for j in range(n) if i != j)
    assert arcs(t) == expected and len(t.links) == n * (n - 1)


def test_range_against_range_is_every_pair():
    t = topo("node a[0..2], b[0..1]\na[0..2] -> b[0..1] : 1 GB/s")
    assert arcs(t) == Counter(itertools.product([f"a{i}" for i in range(3)], ["b0", "b1"]))
    t = topo("node a[0..2], b[0..1]\na[0..2] <-> b[0..1] : 1 GB/s")
    assert len(t.links) == 12 and max(arcs(t).values()) == 1


def test_overlapping_ranges_link_each_unordered_pair_once():
    t = topo("node a[0..3]\na[0..2] <-> a[1..3] : 1 GB/s")
    pairs = {frozenset((f"a{i}", f"a{j}")) for i in range(3) for j in range(1, 4) if i != j}
    expected = Counter(p for pair in pairs for p in itertools.permutations(sorted(pair)))
    assert arcs(t) == expected and len(pairs) == 6


def test_star():
    t = topo("node gpu[0..3]\nswitch pcie0\ngpu[0..3] <-> pcie0 : 12 GB/s, 5 us")
    assert len(t.links) == 8
    assert all(l.capacity == 12e9 and l.latency == pytest.approx(5e-6) for l in t.links)
    assert {l.src for l in t.links if l.dst == "pcie0"} == {f"gpu{i}" for i in range(4)}


def test_full_duplex_and_one_way():
    t = topo("node a, b, c\na <-> b : 10 GB/s\nb -> c : 5 GB/s")
    assert arcs(t) == Counter({("a", "b"): 1, ("b", "a"): 1, ("b", "c"): 1})


def test_multiplicity_multiplies_capacity_and_parallel_declarations_add():
    t = topo("node a, b\nclass nv = 25 GB/s, 1 us\na <-> b : nv x2\na -> b : nv")
    ab = [l for l in t.links if (l.src, l.dst) == ("a", "b")]
    assert sorted(l.capacity for l in ab) == [25e9, 50e9]
    g = t.graph()
    assert g["a"]["b"]["capacity"] == 75e9 and g["b"]["a"]["capacity"] == 50e9


def test_class_latency_default_and_override():
    t = topo("node a, b, c\nclass nv = 25 GB/s\nclass pc = 12 GB/s, 2 us\n"
             "a -> b : nv\nb -> c : pc\nc -> a : pc, 7 ms")
    lat = {(l.src, l.dst): l.latency for l in t.links}
    assert lat == {("a", "b"): 0.0, ("b", "c"): pytest.approx(2e-6), ("c", "a"): pytest.approx(7e-3)}


def test_links_may_name_later_declarations():
    t = topo("a -> b : fast\nnode a, b\nclass fast = 1 GB/s")
    assert t.links == (Link("a", "b", 1e9, 0.0),)


# ---- units -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("1024 B", 1024), ("1 KB", 1000), ("1 KiB", 1024), ("256 MB", 256 * 1000**2),
        ("64MiB", 64 * 1024**2), ("2 GB", 2 * 1000**3), ("1 GiB", 1024**3), ("1 TB", 1000**4),
        ("1 TiB", 1024**4), ("1.5 KB", 1500), ("0.5 KiB", 512),
    ],
)
def test_size_units(text, nbytes):
    p = load_program("topology t { node a, b  a <-> b : 1 GB/s }\n"
                     f"collective c = allreduce on t {{ size = {text}  dtype = uint8 }}")
    assert p.collectives[0].size_bytes == nbytes


@pytest.mark.parametrize(
    "text, bps",
    [
        ("1 B/s", 1), ("1 KB/s", 1e3), ("1 MB/s", 1e6), ("25 GB/s", 25e9), ("12.5 GB/s", 12.5e9),
        ("8 Kbit/s", 1e3), ("8 Mbit/s", 1e6), ("100 Gbit/s", 12.5e9), ("100 Gbps", 12.5e9),
        ("80 Mbps", 1e7), ("1 MiB/s", 1024**2),
    ],
)
def test_bandwidth_units(text, bps):
    t = topo(f"node a, b\na -> b : {text}")
    assert t.links[0].capacity == pytest.approx(bps, rel=1e-15)


def test_bits_and_bytes_differ_by_eight():
    t = topo("node a, b\na -> b : 1 Gbit/s\nb -> a : 1 GB/s")
    assert t.links[1].capacity == 8 * t.links[0].capacity


@pytest.mark.parametrize("text, seconds", [("3 ns", 3e-9), ("5 us", 5e-6), ("2 ms", 2e-3), ("1 s", 1.0)])
def test_time_units(text, seconds):
    t = topo(f"node a, b\na -> b : 1 GB/s, {text}")
    assert t.links[0].latency == pytest.approx(seconds, rel=1e-15)


def test_units_family_of():
    assert [units.family_of(u) for u in ("MiB", "Gbps", "us", "parsec")] == ["size", "bandwidth", "time", None]


# ---- hosts (conftest.CLUSTER) ------------------------------------------------------------

def test_hosts_qualify_names_and_keep_host_major_order():
    t = load_program(CLUSTER).topologies["cluster"]
    assert t.nodes == tuple(f"h{h}.gpu{g}" for h in range(4) for g in range(8))
    assert t.switches == ("h0.nvs", "h1.nvs", "h2.nvs", "h3.nvs", "tor")
    assert t.host_of("h2.gpu5") == "h2" and t.host_of("h3.nvs") == "h3" and t.host_of("tor") == ""
    # inside a host, gpu[0..7] <-> nvs links that host's GPUs to that host's switch only
    expected = Counter()
    for h in range(4):
        for g in range(8):
            expected[(f"h{h}.gpu{g}", f"h{h}.nvs")] += 1
            expected[(f"h{h}.nvs", f"h{h}.gpu{g}")] += 1
        expected[(f"h{h}.nvs", "tor")] += 1
        expected[("tor", f"h{h}.nvs")] += 1
    assert arcs(t) == expected


def test_qualified_ranks_and_root():
    p = load_program(CLUSTER + "collective b = broadcast on cluster {\n"
                     "  ranks = h[0..1].gpu[0..1], h3.gpu7\n  root = h1.gpu0\n  size = 1 MB\n}\n")
    c = p.collectives[0]
    assert c.ranks == ("h0.gpu0", "h0.gpu1", "h1.gpu0", "h1.gpu1", "h3.gpu7")
    assert c.root == 2


def test_host_link_may_name_a_top_level_vertex():
    t = topo("switch tor\nhost h[0..1] {\n node g\n g <-> tor : 1 GB/s\n}")
    assert arcs(t) == Counter({("h0.g", "tor"): 1, ("tor", "h0.g"): 1, ("h1.g", "tor"): 1, ("tor", "h1.g"): 1})


# ---- collectives and their defaults ------------------------------------------------------

BASE = """\
topology t {
    node gpu[0..3]
    switch sw
    gpu[0..3] <-> sw : 10 GB/s
}
"""


def spec(body: str, kind: str = "allreduce"):
    return load_program(BASE + f"collective c = {kind} on t {{\n{body}\n}}\n").collectives[0]


def test_defaults_of_a_reducing_kind():
    c = spec("size = 1 MB")
    assert c.ranks == ("gpu0", "gpu1", "gpu2", "gpu3")  # every node, never the switch
    assert (c.root, c.op, c.dtype, c.algorithm, c.chunk_bytes) == (-1, "sum", "float32", "auto", None)
    assert (c.compress, c.on_failure, c.adaptive, c.peers) == ("none", "abort", None, None)
    assert c.topology == "t" and c.size_bytes == 10**6 and c.span.line == 6


@pytest.mark.parametrize("kind", ["broadcast", "reduce", "gather", "scatter"])
def test_rooted_default_root_is_the_first_rank(kind):
    c = spec("ranks = gpu[2,0,1]\nsize = 1 MB", kind)
    assert c.ranks == ("gpu2", "gpu0", "gpu1") and c.root == 0
    assert c.op == ("sum" if kind == "reduce" else None)


def test_root_is_stored_as_an_index():
    assert spec("ranks = gpu[3,1,2]\nroot = gpu2\nsize = 1 MB", "broadcast").root == 2


def test_neighbor_average_defaults():
    c = spec("size = 1 MB", "neighbor_average")
    assert (c.peers, c.op, c.root) == ("ring", None, -1)
    assert spec("size = 1 MB\npeers = shift_one", "neighbor_average").peers == "shift_one"


def test_every_key():
    c = spec("ranks = gpu[0..3]\nsize = 64 MiB\ndtype = float16\nop = avg\nalgorithm = ring\n"
             "chunk = 1 MiB\ncompress = int8\non_failure = continue\nadaptive = off")
    assert (c.size_bytes, c.dtype, c.op, c.algorithm) == (64 * 2**20, "float16", "avg", "ring")
    assert (c.chunk_bytes, c.compress, c.on_failure, c.adaptive) == (2**20, "int8", "continue", False)
    assert spec("size = 1 MB\nadaptive = on").adaptive is True


@pytest.mark.parametrize("kind", list(hcc.ir.plan.KINDS))
def test_every_kind_loads(kind):
    c = spec("size = 1 MB", kind)
    assert c.kind == kind and c.size_bytes == 10**6


def test_alltoall_size_multiple_of_ranks_times_dtype():
    assert spec("size = 64 B", "alltoall").size_bytes == 64  # 4 ranks x 4 B = 16 B divides it


def test_program_lists_collectives_in_order_and_every_topology():
    p = load_program(BASE + "topology u { node a, b  a <-> b : 1 GB/s }\n"
                     "collective z = broadcast on t { size = 1 MB }\n"
                     "collective a = allgather on u { size = 1 MB }\n")
    assert [c.name for c in p.collectives] == ["z", "a"] and set(p.topologies) == {"t", "u"}
    assert p.collective("a").topology == "u" and p.topology_of(p.collective("z")).name == "t"
    assert p.path == "<string>"


def test_load_from_path_str_and_pathlike(tmp_path):
    f = tmp_path / "p.hcl"
    f.write_text(BASE)
    assert load_program(f).path == str(f)
    assert load_program(str(f)).topologies["t"].nodes == ("gpu0", "gpu1", "gpu2", "gpu3")
    assert hcc.load(str(f)).path == str(f)


def test_whitespace_and_comments_do_not_change_meaning():
    compact = BASE + "collective c = reduce on t { ranks = gpu[0..2] root = gpu1 size = 4 KB }"
    airy = BASE + "# a reduction\ncollective c =\n  reduce on t\n{\n  ranks = gpu0,gpu1 , gpu2 # three\n" \
        "\n  root=gpu1\n  size=4KB\n}\n"
    a, b = (dataclasses.replace(load_program(s).collectives[0], span=None) for s in (compact, airy))
    assert a == b


def test_doctests_of_the_front_end():
    for m in (frontend, units, parser_module):
        assert doctest.testmod(m).failed == 0


# ---- property: a random topology written out in HCL loads back to itself -------------------

UNIT_BYTES = {"B/s": 1, "KB/s": 10**3, "MB/s": 10**6, "GB/s": 10**9, "Gbit/s": 10**9 / 8, "Mbps": 10**6 / 8}
UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
SEPARATORS = [" ", "\n", "\t", "  # note\n", "\n\n"]


@st.composite
def programs(draw):
    n = draw(st.integers(2, 6))
    sw = draw(st.integers(0, 2))
    names = [f"v{i}" for i in range(n)] + [f"s{i}" for i in range(sw)]
    stmts, expected = [], []
    for _ in range(draw(st.integers(1, 10))):
        a, b = draw(st.sampled_from(list(itertools.permutations(names, 2))))
        arrow = draw(st.sampled_from(["->", "<->"]))
        value = draw(st.integers(1, 999))
        unit = draw(st.sampled_from(sorted(UNIT_BYTES)))
        mult = draw(st.integers(1, 3))
        lat = draw(st.one_of(st.none(), st.tuples(st.integers(0, 99), st.sampled_from(sorted(UNIT_SECONDS)))))
        text = f"{a} {arrow} {b} : {value} {unit}" + (f" x{mult}" if mult > 1 else "")
        if lat is not None:
            text += f", {lat[0]} {lat[1]}"
        stmts.append(text)
        cap = value * UNIT_BYTES[unit] * mult
        sec = 0.0 if lat is None else lat[0] * UNIT_SECONDS[lat[1]]
        expected.append((a, b, cap, sec))
        if arrow == "<->":
            expected.append((b, a, cap, sec))
    sep = lambda: draw(st.sampled_from(SEPARATORS))  # noqa: E731
    decls = [f"node {', '.join(names[:n])}"] + ([f"switch {', '.join(names[n:])}"] if sw else [])
    src = "topology r {" + sep() + sep().join(decls + stmts) + sep() + "}\n"
    return src, names[:n], names[n:], expected


@settings(max_examples=60, deadline=None)
@given(programs())
def test_random_topologies_load_to_what_they_say(prog):
    src, nodes, switches, expected = prog
    t = load_program(src).topologies["r"]
    assert t.nodes == tuple(nodes) and t.switches == tuple(switches)
    assert len(t.links) == len(expected)
    for link, (a, b, cap, sec) in zip(t.links, expected):
        assert (link.src, link.dst) == (a, b)
        assert link.capacity == pytest.approx(cap, rel=1e-12)
        assert link.latency == pytest.approx(sec, rel=1e-12, abs=1e-18)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=2, max_size=8, unique=True), st.data())
def test_random_rank_lists_keep_their_order(indices, data):
    order = data.draw(st.permutations(indices))
    src = ("topology r {\n node g[0..40]\n switch s\n g[0..40] <-> s : 1 GB/s\n}\n"
           f"collective c = gather on r {{\n ranks = {', '.join(f'g{i}' for i in order)}\n"
           f" root = g{order[-1]}\n size = 1 KB\n}}\n")
    c = load_program(src).collectives[0]
    assert c.ranks == tuple(f"g{i}" for i in order) and c.root == len(order) - 1


def test_samples_dir_fixture_points_at_samples(samples_dir: Path):
    assert (samples_dir / "demo.hcl").is_file()
