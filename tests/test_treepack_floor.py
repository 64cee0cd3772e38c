"""The tree floor (compiler/tree_floor.py): a lower bound on the simulated time of the
treepack candidate at every chunk size tried, at least the cut's chunk floor up to the LP's
rounding, and pruning by it changes no compiled plan."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import hcc
from hcc.compiler import chunk_floor, tree_floor
from hcc.compiler.pipeline import compile_unit
from hcc.ir.topology import Link, Topology

from test_candidate_floor import _unpruned  # the compile with no size pruned, no candidate skipped

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
# small samples, one of each kind the floor covers (forward and reversed trees, one group and
# a group per root)
CASES = [("demo", "broadcast"), ("dgx1_fragmented", "alloc_157_reduce"), ("nvswitch", "reduce_scatter"),
         ("dgx1", "allgather")]


@pytest.mark.parametrize("sample,name", CASES)
def test_tree_floor_bounds_every_tried_chunk_and_pruning_keeps_the_plan(monkeypatch, sample, name):
    program = hcc.load(SAMPLES / f"{sample}.hcl")
    full = _unpruned(monkeypatch, program, name)
    floor = tree_floor.packing_floor(full, "treepack")
    cut = chunk_floor.plan_floor(full)
    assert floor is not None
    cand = full.candidate("treepack")
    assert cand is not None and cand.choice.tried
    for chunk, t in cand.choice.tried:
        assert floor(chunk) <= t * (1 + 1e-12), (chunk, floor(chunk), t)
        if cut is not None:  # the trees cross the cut: their floor is at least the cut's
            assert floor(chunk) >= cut(chunk) * (1 - 1e-6), chunk
    pruned = compile_unit(program, name)
    assert pruned.plan.digest() == full.plan.digest()
    assert replace(pruned.plan.figures, compile_s=0.0) == replace(full.plan.figures, compile_s=0.0)


def test_tree_floor_by_hand_on_two_paths():
    """Ranks a and b, a direct link (1 GB/s) and a path through switch r (2 GB/s per hop); a
    broadcast from a over the two one-edge trees. With shares f and 1 - f of M bytes at
    chunks of s and per-message cost k, link a->b is busy f M p, p = 1/c1 + k/s, and each
    hop of the switch path (1 - f) M q, q = 1/c2 + k/s; the best split equalises them,
    f = q / (p + q), and the floor is M p q / (p + q)."""
    from hcc.compiler.trees import PackedTree

    links = []
    for x, y, c in (("a", "b", 1e9), ("a", "r", 2e9), ("r", "b", 2e9)):
        links += [Link(x, y, c, 0.0), Link(y, x, c, 0.0)]
    topo = Topology("t", ("a", "b"), switches=("r",), links=tuple(links))
    t1 = PackedTree("a", (("a", "b", ("a", "b")),), 1e9)
    t2 = PackedTree("a", (("a", "b", ("a", "r", "b")),), 2e9)
    M, k = 1 << 20, 1e-6
    floor = tree_floor.tree_floor((t1, t2), topo, "broadcast", ("a", "b"), M, 4, k)
    for s in (M, 1 << 16, 4096):
        p, q = 1 / 1e9 + k / s, 1 / 2e9 + k / s
        assert floor(s) == pytest.approx(M * p * q / (p + q), rel=1e-9)
    # reversed (a reduce to a): the same hops walked backwards, the same floor
    back = tree_floor.tree_floor((t1, t2), topo, "reduce", ("a", "b"), M, 4, k)
    assert back(1 << 16) == pytest.approx(floor(1 << 16), rel=1e-9)
    # allreduce (reduce up, broadcast down the same trees): each share once each way, on
    # opposite arcs, so each arc as loaded as in the broadcast: the same floor
    both = tree_floor.tree_floor((t1, t2), topo, "allreduce", ("a", "b"), M, 4, k)
    assert both(1 << 16) == pytest.approx(floor(1 << 16), rel=1e-9)
    # a kind whose plans move other bytes has no tree floor
    assert tree_floor.tree_floor((t1, t2), topo, "alltoall", ("a", "b"), M, 4, k) is None
