"""The compiler at scale (issue 6, "past one machine"): host symmetry in bounds and packing,
the vectorised closure's routes, the bounded simulation digest, and the two large samples.
Expected figures are computed another way (brute force over vertex subsets, the plain
unsymmetric computations, Dijkstra)."""
from __future__ import annotations

from pathlib import Path

import pytest

from hcc.compiler import bounds, cost, treepack
from hcc.compiler.switches import Indexed, host_translation
from hcc.ir.topology import Topology

from test_bounds import G, brute_allgather_time, duplex, fat_tree, two_hosts
from test_treepack import check_packing, per_root_rate

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def hosted(hosts: int, per: int, *, odd_link: bool = False) -> Topology:
    """``hosts`` x (``per`` GPUs on a host switch at unequal speeds, one NIC per host to a
    ToR). ``odd_link`` makes one host's NIC slower, which breaks the host symmetry."""
    nodes, sw, pairs, member = [], ["tor"], [], []
    for h in range(hosts):
        sw += [f"h{h}.sw"]
        member.append((f"h{h}.sw", f"h{h}"))
        for g in range(per):
            v = f"h{h}.g{g}"
            nodes.append(v)
            member.append((v, f"h{h}"))
            pairs.append((v, f"h{h}.sw", (g + 2) * G))
        pairs.append((f"h{h}.sw", "tor", (3 if odd_link and h == 1 else 4) * G))
    return Topology("hosted", tuple(nodes), tuple(sw), duplex(pairs), tuple(member))


def test_host_translation_is_an_automorphism():
    topo = hosted(3, 2)
    sigma, H = host_translation(topo, topo.nodes)
    assert H == 3 and sigma["h0.g1"] == "h1.g1" and sigma["h2.sw"] == "h0.sw" and sigma["tor"] == "tor"
    caps = {(l.src, l.dst): l.capacity for l in topo.links}
    assert {(sigma[a], sigma[b]): c for (a, b), c in caps.items()} == caps
    assert host_translation(hosted(3, 2, odd_link=True), hosted(3, 2).nodes) is None
    # a collective on part of the hosts' ranks: ranks must map onto ranks
    assert host_translation(topo, ("h0.g0", "h1.g0", "h2.g1")) is None
    assert host_translation(topo, ("h0.g0", "h1.g0", "h2.g0"))[1] == 3


@pytest.mark.parametrize("make,reverse", [(lambda: hosted(3, 2), False), (lambda: hosted(3, 2), True),
                                          (two_hosts, False), (lambda: hosted(2, 3), True)])
def test_symmetric_allgather_bound_matches_brute_force(make, reverse):
    """One sink per host orbit (bounds._allgather_parametric) against every vertex subset,
    and against the parametric flow over every sink."""
    topo = make()
    ranks = topo.nodes
    assert host_translation(topo, ranks) is not None
    bounds._allgather_parametric.cache_clear()
    size = 60 * 10**6
    got = (bounds.reduce_scatter_time_bound if reverse else bounds.allgather_time_bound)(topo, ranks, size)
    assert got == pytest.approx(brute_allgather_time(topo, ranks, size, reverse), rel=1e-12)
    net = bounds._Net(topo, ranks, reverse=reverse)
    every_sink = float(net.parametric_rate(list(net.rank_idx))) / net.scale
    assert bounds.allgather_rate_bound(topo, ranks, reverse=reverse) == pytest.approx(every_sink, rel=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_symmetric_packing_reaches_the_plain_optimum(monkeypatch, reverse):
    """The host-symmetric master (one root per host slot, translated trees) packs the same
    rate as the plain master, every root at that rate, within every link's capacity."""
    topo = hosted(4, 3)
    ranks = topo.nodes
    treepack.clear_cache()
    plain = treepack.pack_allgather(topo, ranks, reverse=reverse, few_trees=False)
    monkeypatch.setattr(treepack, "_SYMMETRY_MIN_RANKS", 2)
    treepack.clear_cache()
    sym = treepack.pack_allgather(topo, ranks, reverse=reverse, few_trees=False)
    treepack.clear_cache()
    assert sym.method.startswith("colgen-symmetric x4") and not plain.method.startswith("colgen-symmetric")
    # 1e-8: the second (least depth) phase keeps the rate to 1e-9 of the first's
    assert sym.rate == pytest.approx(plain.rate, rel=1e-8)
    assert sym.rate == pytest.approx(sym.bound, rel=1e-8)  # duplex links: Eulerian, the cut bound
    check_packing(topo, ranks, sym, reverse=reverse)
    assert all(r == pytest.approx(sym.rate, rel=1e-9) for r in per_root_rate(sym).values())
    assert set(per_root_rate(sym)) == set(ranks)


def test_closure_routes_prefer_fewest_hops():
    """At equal cost the vectorised closure takes the fewest hops, like the Dijkstra one."""
    topo = fat_tree(32, 8, 2)
    ix = Indexed.build(topo, topo.nodes)
    y = [1.0] * len(ix.links)
    d_ref, p_ref = ix.closure(y)
    d, route = ix.closure_matrix(y)
    for i in range(0, 32, 5):
        for j in range(32):
            if i != j:
                assert d[i, j] == d_ref[i][j]
                assert len(route(i, j)) == len(p_ref[i][j])


def test_simulation_digest_is_bounded():
    from hcc.compiler.baselines import ring_plan
    from hcc.compiler.program import CollectiveSpec

    topo = fat_tree(32, 8, 2)
    spec = CollectiveSpec("ar", "allreduce", topo.name, topo.nodes, -1, 32 * 4096, op="sum")
    sim = cost.simulate(ring_plan(spec, topo, 4096))
    dg = sim.digest(limit=5)
    assert dg.truncated and len(dg.ranks) == 5 and len(dg.links) == 5
    assert [t for _, t in dg.ranks] == sorted(sim.rank_finish, reverse=True)[:5]
    assert dict(dg.finish_quantiles)["max"] == sim.time == dg.time
    assert dict(dg.finish_quantiles)["min"] == min(sim.rank_finish)
    assert sum(k for _, k in dg.utilisation) == len(sim.links) == dg.n_links
    assert sum(k for _, k, _, _ in dg.by_capacity) == len(sim.links)
    assert list(dg.links) == list(sim.links[:5])
    small = sim.digest(limit=100)
    assert not small.truncated and len(small.ranks) == 32 and small.links == sim.links


@pytest.mark.parametrize("name,n,switches,hosts", [("fattree1024", 1024, 48, 32), ("dgx1x64", 512, 513, 64)])
def test_large_samples_are_host_symmetric(name, n, switches, hosts):
    import hcc

    program = hcc.load(str(SAMPLES / f"{name}.hcl"))
    topo = program.topologies[name]
    assert len(topo.nodes) == n and len(topo.switches) == switches
    found = host_translation(topo, topo.nodes)
    assert found is not None and found[1] == hosts
    assert {c.kind for c in program.collectives} == {"allreduce", "allgather", "broadcast"}


def test_fattree1024_allgather_bound_is_one_link_over_the_others():
    """Full bisection: the narrowest ratio is a single rank's 100 Gbit/s link against the
    1023 other ranks' data; no set does worse (a rack: 32 links down, 16 x 25 GB/s up)."""
    import hcc

    topo = hcc.load(str(SAMPLES / "fattree1024.hcl")).topologies["fattree1024"]
    x = bounds.allgather_rate_bound(topo, topo.nodes)
    assert x == pytest.approx(12.5e9 / 1023, rel=1e-12)


def test_symmetric_packing_prefers_shallow_trees(monkeypatch):
    """On a full-bisection fat tree the ring chains (31 levels) and the binary-tree seeds
    (5 levels) both reach the cut bound; the second phase keeps the shallow ones."""
    import hcc

    src = """
topology ft {
    host rack[0..7] {
        node n[0..3]
        switch leaf
        n[0..3] <-> leaf : 100 Gbit/s, 1 us
    }
    switch spine[0..1]
    rack[0..7].leaf <-> spine[0..1] : 200 Gbit/s, 2 us
}
"""
    topo = hcc.load(src).topologies["ft"]
    monkeypatch.setattr(treepack, "_SYMMETRY_MIN_RANKS", 2)
    treepack.clear_cache()
    p = treepack.pack_allgather(topo, topo.nodes, few_trees=False)
    treepack.clear_cache()
    assert p.method.startswith("colgen-symmetric x8") and p.rate == pytest.approx(p.bound, rel=1e-8)
    check_packing(topo, topo.nodes, p)

    def depth(tree) -> int:
        par = {c: a for a, c, _ in tree.edges}
        level = lambda v: 0 if v == tree.root else 1 + level(par[v])  # noqa: E731
        return max(level(v) for v in par)

    assert max(depth(t) for t in p.trees) <= 6 < 31


def test_large_broadcast_stops_after_its_round_budget(monkeypatch):
    """Past _LARGE_BROADCAST_RANKS the broadcast packing stops after a fixed count of
    pricing rounds: a valid packing below its bound, whose method and gap say so; without
    the budget the same pack goes on to a higher rate."""
    from test_bounds import cluster

    topo = cluster(2)
    monkeypatch.setattr(treepack, "_LARGE_BROADCAST_ROUNDS", 1)
    monkeypatch.setattr(treepack, "_LARGE_BROADCAST_RANKS", 2)
    treepack.clear_cache()
    short = treepack.pack_broadcast(topo, topo.nodes, topo.nodes[0], few_trees=False)
    monkeypatch.setattr(treepack, "_LARGE_BROADCAST_RANKS", 128)
    treepack.clear_cache()
    full = treepack.pack_broadcast(topo, topo.nodes, topo.nodes[0], few_trees=False)
    treepack.clear_cache()
    check_packing(topo, topo.nodes, short)
    assert "round limit" in short.method and short.gap > 0.1
    assert short.rate < full.rate <= full.bound * (1 + 1e-9)


# -- progress of long compiles (compiler/progress.py) ------------------------------------------
class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_is_silent_for_short_compiles_then_plain_lines():
    import io

    from hcc.compiler.progress import StderrProgress

    out, clock = io.StringIO(), _Clock()
    p = StderrProgress(out, delay=2.0, plain_every=2.0, clock=clock)
    assert not p.tty  # a StringIO is not a terminal: plain lines
    clock.t = 1.0
    p("ag", "pack", "pricing round", 3, 500)
    assert out.getvalue() == ""  # under 2 s: nothing
    clock.t = 2.5
    p("ag", "pack", "pricing round", 4, 500)
    p("ag", "pack", "pricing round", 5, 500)  # same stage within 2 s: not repeated
    clock.t = 2.6
    p("ag", "lower", "ring", 1, 6)  # a new stage is always shown
    clock.t = 5.0
    p("ag", "lower", "treepack at 1048576 B chunks", None, None)
    assert out.getvalue().splitlines() == [
        "[   2.5 s] ag: pack: pricing round 4/500",
        "[   2.6 s] ag: lower: ring 1/6",
        "[   5.0 s] ag: lower: treepack at 1048576 B chunks",
    ]
    p.close()  # nothing to clear on plain output


def test_progress_on_a_terminal_rewrites_one_line():
    import io

    from hcc.compiler.progress import StderrProgress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out, clock = Tty(), _Clock()
    p = StderrProgress(out, delay=0.0, clock=clock)
    p("", "pack", "pricing round", 1, 9)
    clock.t = 1.0
    p("", "lower", "", None, None)
    p.close()
    text = out.getvalue()
    assert "\n" not in text and text.count("\r") == 4  # two updates, then blank and return
    assert text.endswith("\r")  # cleared: what follows starts on a clean line


def test_compile_reports_every_stage_of_every_collective():
    import hcc
    from hcc.compiler.pipeline import compile_unit
    from hcc.compiler.progress import listening

    prog = hcc.load(SAMPLES / "demo.hcl")
    seen = []
    with listening(lambda *a: seen.append(a)):
        for c in prog.collectives[:2]:
            compile_unit(prog, c.name)
    for c in prog.collectives[:2]:
        stages = [s for name, s, *_ in seen if name == c.name]
        assert {"bounds", "pack", "lower", "select", "figures", "verify"} <= set(stages)
        assert stages.index("pack") < stages.index("lower") < stages.index("verify")
    # the chunk search names each candidate and size; verification its phases, in order
    steps = [step for name, s, step, *_ in seen if s == "lower" and step]
    assert any(" at " in step and step.endswith(" B chunks") for step in steps)
    # (the native pass, ir/verify_native.py, does phases 2-5 at once: it reports phase 2 and
    # is done; the Python checks report each phase)
    first = prog.collectives[0].name
    phases = [(d, t) for name, s, step, d, t in seen if s == "verify" and step and name == first]
    assert phases[:2] == [(1, 5), (2, 5)] and {t for _, t in phases} == {5}
    assert [d for d, _ in phases] == sorted(d for d, _ in phases)


def test_compile_table_streams_rows_before_the_explanations():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "hcc", "compile", str(SAMPLES / "demo.hcl")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    import hcc

    names = [c.name for c in hcc.load(SAMPLES / "demo.hcl").collectives]
    rows = [ln.split()[0] for ln in lines[2:2 + len(names)]]
    assert rows == names and lines[2 + len(names)].startswith("cost model:")
    # every row has as many cells as the header (fixed column widths, one line each)
    assert all(len(ln.split()) >= len(lines[0].split()) for ln in lines[2:2 + len(names)])


def test_large_candidates_drop_their_programs_but_the_winners_are_kept(monkeypatch):
    # with every plan "large", each candidate keeps only its figures except the fastest so far,
    # whose programs stay until a faster one replaces it: the compile must give the very same
    # plan as with all kept, without lowering any candidate twice
    import hcc
    from hcc.compiler import pipeline, progress

    prog = hcc.load(SAMPLES / "demo.hcl")
    for c in prog.collectives[:2]:
        whole = pipeline.compile_unit(prog, c.name)
        monkeypatch.setattr(pipeline, "KEEP_PROGRAMS_OPS", 0)
        built = []
        with progress.listening(lambda _c, stage, step, *_: stage == "lower" and " at " in step and built.append(step)):
            lean = pipeline.compile_unit(prog, c.name)
        assert len(built) == len(set(built))  # no candidate lowered twice at one chunk size
        # the selected plan too large to hold as well: it alone is lowered a second time
        monkeypatch.setattr(pipeline, "KEEP_SELECTED_OPS", 0)
        again = []
        with progress.listening(lambda _c, stage, step, *_: stage == "lower" and again.append(step)):
            leaner = pipeline.compile_unit(prog, c.name)
        monkeypatch.undo()
        assert sum(s.endswith("again, the plan selected") for s in again) == 1
        assert leaner.plan.digest() == whole.plan.digest() and leaner.plan.programs == whole.plan.programs
        assert lean.plan.digest() == whole.plan.digest()
        assert lean.plan.programs == whole.plan.programs
        losers = [k for k in lean.candidates if k.algorithm != lean.chosen.algorithm]
        assert losers and all(not any(k.choice.plan.programs) for k in losers)
        assert [k.predicted_s for k in lean.candidates] == [k.predicted_s for k in whole.candidates]
