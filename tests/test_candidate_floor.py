"""The egress floor (compiler/tree_floor.egress_floor), the tree floor of the allreduce
trees (tree_floor.packing_floor) and the candidates auto skips by them (pipeline.skip_floor):
lower bounds on the simulated time of the treepack and treepack-rsag candidates at every
chunk size tried, the egress floor exact on one link, and skipping a candidate changes no
compiled plan. The load floor of the baselines (baselines.load_floor): their link bytes are
the same at every chunk size, the floor bounds every size's simulated time, and the chunk
sizes pipeline.Lower skips by it change no figure, plan or baseline."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import hcc
from hcc.compiler import baselines, chunk_floor, pipeline, registry, tree_floor
from hcc.compiler.cost import simulate
from hcc.compiler.pipeline import compile_unit

SAMPLES = Path(__file__).resolve().parent.parent / "samples"

# two racks of four nodes under two spines, the 1024-rank sample's links: a per-root
# reduce-scatter + allgather over a switch fabric, small enough to lower at every size
FATTREE8 = """
topology ft {
    class edr = 100 Gbit/s, 1 us
    class up  = 200 Gbit/s, 2 us
    host rack[0..1] {
        node n[0..3]
        switch leaf
        n[0..3] <-> leaf : edr
    }
    switch spine[0..1]
    rack[0..1].leaf <-> spine[0..1] : up
}
collective ar = allreduce on ft { size = 4 MiB }
collective ag = allgather on ft { size = 4 MiB }
"""


def _unpruned(monkeypatch, program, name):
    """The compile with no chunk size pruned and no candidate skipped."""
    with monkeypatch.context() as m:
        m.setattr(chunk_floor, "worth_lowering", lambda floor, chunks, incumbent: tuple(chunks))
        m.setattr(pipeline, "skip_floor", lambda floor, chunks, incumbent: None)
        return compile_unit(program, name)


def _program(source: str):
    """A sample by file name, compile_bench's one MI250 node (``mi250x1``), or a program's text."""
    if source == "mi250x1":
        import sys

        bench = SAMPLES.parent / "benchmarks"
        if str(bench) not in sys.path:
            sys.path.insert(0, str(bench))
        import compile_bench

        return hcc.load(compile_bench.with_collectives(compile_bench.mi250_source(1), "mi250x1", ("allgather",)))
    return hcc.load(SAMPLES / source) if source.endswith(".hcl") else hcc.load(source)


CASES = [("nvswitch.hcl", "allreduce", "treepack-rsag"), ("nvswitch.hcl", "reduce_scatter", "treepack"),
         ("demo.hcl", "broadcast", "treepack"), ("dgx1_fragmented.hcl", "alloc_157_reduce", "treepack"),
         ("hetero.hcl", "ring_allreduce", "treepack"), (FATTREE8, "ar", "treepack-rsag"), (FATTREE8, "ag", "treepack")]
IDS = ["nvswitch-ar", "nvswitch-rs", "demo-bcast", "dgx1-reduce", "hetero-ar", "ft8-ar", "ft8-ag"]


@pytest.mark.parametrize("source,name,alg", CASES, ids=IDS)
def test_egress_floor_bounds_every_tried_chunk(monkeypatch, source, name, alg):
    program = _program(source)
    full = _unpruned(monkeypatch, program, name)
    floor = tree_floor.egress_floor(full, alg)
    assert floor is not None
    cand = full.candidate(alg)
    assert cand is not None and len(cand.choice.tried) >= 2
    # the LP floor over the candidate's own trees (tree_floor.packing_floor offers it for
    # treepack alone; it holds for treepack-rsag's per-root trees too)
    spec = full.spec
    packing = full.packing("rsag" if alg == "treepack-rsag" else "trees")
    trees = tree_floor.tree_floor(packing.trees, full.topology, spec.kind, spec.ranks, spec.size_bytes, 4,
                                  full.model.per_message_s)
    assert trees is not None
    # what auto uses: for treepack-rsag, rsag_floor (even weights on the busiest links, every
    # size above the largest block priced at the block)
    own = tree_floor.packing_floor(full, alg)
    assert own is not None
    for chunk, t in cand.choice.tried:
        assert floor(chunk) <= t, (alg, chunk, floor(chunk), t)
        assert trees(chunk) <= t * (1 + 1e-12), (alg, chunk, trees(chunk), t)
        assert own(chunk) <= t * (1 + 1e-12), (alg, chunk, own(chunk), t)
    assert floor(1 << 40) > 0
    # pipeline.skip_floor reads the floors at the largest size only: none grows with the size
    sizes = [1 << k for k in range(12, 29, 2)]
    for f in (floor, trees, own, tree_floor.candidate_floor(chunk_floor.plan_floor(full), full, alg, 0.0)):
        values = [f(c) for c in sizes]
        assert all(a >= b * (1 - 1e-9) for a, b in zip(values, values[1:])), values


def test_egress_floor_is_exact_on_one_link(monkeypatch):
    """Two ranks, one 10 GB/s link of 3 us from a to b (the only link leaving a rank): a
    broadcast of M bytes in chunks of s is ceil(M / s) messages, each holding the link
    3 + 1 us plus its bytes, back to back."""
    program = hcc.load("""topology t { node a, b  a -> b : 10 GB/s, 3 us }
collective b = broadcast on t { root = a  size = 1 MiB }""")
    full = _unpruned(monkeypatch, program, "b")
    floor = tree_floor.egress_floor(full, "treepack")
    M = 1 << 20
    for chunk, t in full.candidate("treepack").choice.tried:
        by_hand = M / 10e9 + -(-M // chunk) * 4e-6
        assert floor(chunk) == pytest.approx(by_hand, rel=1e-9)
        assert t == pytest.approx(by_hand, rel=1e-9)  # the plan reaches it


def test_skipped_candidates_change_no_plan(monkeypatch):
    """On nvswitch's allgather recursive doubling is priced first and beats every size of the
    tree packing's floor: treepack is skipped, and the plan and its figures are those of the
    compile that lowers everything."""
    program = hcc.load(SAMPLES / "nvswitch.hcl")
    full = _unpruned(monkeypatch, program, "allgather")
    pruned = compile_unit(program, "allgather")
    assert "treepack" in pruned.skipped and pruned.candidate("treepack") is None
    chunks = [c for c, _ in full.candidate("treepack").choice.tried]
    floor = tree_floor.candidate_floor(chunk_floor.plan_floor(pruned), pruned, "treepack",
                                       pruned.chosen.predicted_s)
    assert all(floor(c) > pruned.chosen.predicted_s for c in chunks)
    assert min(t for _, t in full.candidate("treepack").choice.tried) > pruned.chosen.predicted_s
    assert pruned.plan.digest() == full.plan.digest()
    assert replace(pruned.plan.figures, compile_s=0.0) == replace(full.plan.figures, compile_s=0.0)


def test_no_egress_floor_where_it_does_not_hold():
    program = hcc.load("""topology t { node a, b, c  a <-> b : 10 GB/s, 1 us  b <-> c : 10 GB/s, 1 us }
collective ar = allreduce on t { size = 1 MiB  op = sum  compress = int8 }
collective ag = allgather on t { size = 1 MiB }""")
    from hcc.compiler.pipeline import Unit
    from hcc.compiler.pipeline import resolve

    for name, alg in (("ar", "treepack-rsag"), ("ag", "ring"), ("ag", "treepack-rsag")):
        spec = resolve(program, name)
        u = Unit(program=program, spec=spec, topology=program.topology_of(spec))
        assert tree_floor.egress_floor(u, alg) is None, (name, alg)


def test_rsag_floor_counts_the_hops_tree_floor_counts(monkeypatch):
    """rsag_floor sums hops per distinct path with numpy: the same (tree, link) hop counts as
    tree_floor's walk over every hop, and above the largest block every chunk size prices
    like the block (no message is larger)."""
    import numpy as np

    program = _program(FATTREE8)
    full = _unpruned(monkeypatch, program, "ar")
    spec = full.spec
    trees = full.packing("rsag").trees
    old = tree_floor.tree_floor(trees, full.topology, spec.kind, spec.ranks, spec.size_bytes, 4,
                                full.model.per_message_s)
    new = tree_floor.rsag_floor(trees, full.topology, spec.ranks, spec.size_bytes, 4, full.model.per_message_s)
    assert new.m.shape == old.m.shape and new.m.sum() == old.m.sum() > 0
    # the same columns in another order: match them by their capacity and tree counts
    key = lambda f: sorted(map(tuple, np.vstack([f.m, f.cap, f.cost]).T.tolist()))  # noqa: E731
    assert key(new) == key(old)
    block = spec.size_bytes // len(spec.ranks)
    assert new(block) == new(1 << 30) == new(spec.size_bytes)
    assert new(block // 2) >= new(block)


def _every_size(monkeypatch, program, name):
    """The compile whose fixed-load candidates search every chunk size (no load floor)."""
    with monkeypatch.context() as m:
        m.setattr(baselines, "FIXED_LOADS", frozenset())
        return compile_unit(program, name)


@pytest.mark.parametrize("source,name", [("demo.hcl", "allgather"), ("hetero.hcl", "mesh_allreduce"),
                                         ("hetero.hcl", "mesh_broadcast"), (FATTREE8, "ar")],
                         ids=["demo-ag", "hetero-ar", "hetero-bcast", "ft8-ar"])
def test_load_floor_bounds_every_chunk_of_the_fixed_load_candidates(monkeypatch, source, name):
    """Each fixed-load candidate lowered again at every size its full search tried: the same
    bytes on every link, and the floor from its first size at or below each size's time."""
    full = _every_size(monkeypatch, _program(source), name)
    seen = set()
    for alg in baselines.FIXED_LOADS:
        cand = full.candidate(alg)
        if cand is None:
            continue
        build = registry.builder(alg, full)
        loads, floor = None, None
        for chunk, t in cand.choice.tried:
            got = build(chunk)
            sim = got[1] if isinstance(got, tuple) else simulate(got, model=full.model)
            assert sim.time == t
            mine = {(l.src, l.dst): l.bytes for l in sim.links}
            if loads is None:
                loads = mine
                floor = baselines.load_floor(sim, full.topology, full.model.per_message_s, 4)
            assert mine == loads, (alg, chunk)
            assert floor(chunk) <= t, (alg, chunk, floor(chunk), t)
        seen.add(alg)
        sizes = [1 << k for k in range(12, 29)]
        values = [floor(c) for c in sizes]
        assert all(a >= b for a, b in zip(values, values[1:])), alg  # never falls as the chunk shrinks
    assert {"ring", "direct"} <= seen and seen & {"rings", "tree", "rd"}, seen


@pytest.mark.parametrize("source,name", [("mi250x1", "allgather"), ("nvswitch.hcl", "reduce_scatter"),
                                         ("demo.hcl", "allreduce"), ("hetero.hcl", "mesh_allreduce")],
                         ids=["mi250x1-ag", "nvswitch-rs", "demo-ar", "hetero-ar"])
def test_fixed_load_skips_change_no_figure(monkeypatch, source, name):
    """The chunk sizes the load floor skips change neither the plan, its figures (the best
    NCCL-like baseline among them), nor any baseline's chunk and time; and some are skipped."""
    program = _program(source)
    full = _every_size(monkeypatch, program, name)
    cut = compile_unit(program, name)
    assert cut.plan.digest() == full.plan.digest()
    assert replace(cut.plan.figures, compile_s=0.0) == replace(full.plan.figures, compile_s=0.0)
    fewer = 0
    for alg in registry.BASELINES:
        a, b = full.candidate(alg), cut.candidate(alg)
        assert (a is None) == (b is None), alg
        if a is None:
            continue
        assert (b.choice.chunk_bytes, b.predicted_s) == (a.choice.chunk_bytes, a.predicted_s), alg
        assert b.choice.plan.digest() == a.choice.plan.digest(), alg
        fewer += len(a.choice.tried) - len(b.choice.tried)
    assert fewer > 0
