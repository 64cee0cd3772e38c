"""The egress floor (compiler/tree_floor.egress_floor), the tree floor of the allreduce
trees (tree_floor.packing_floor) and the candidates auto skips by them (pipeline.skip_floor):
lower bounds on the simulated time of the treepack and treepack-rsag candidates at every
chunk size tried, the egress floor exact on one link, and skipping a candidate changes no
compiled plan."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import hcc
from hcc.compiler import chunk_floor, pipeline, tree_floor
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
    """A sample by file name, or a program's text."""
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
