"""The timed broadcast's drain tree (compiler/schedule.py DRAIN_TREE): one more tree, built
from the schedule, carrying a small share at the lowest priority where ports idle while the
packed trees drain; kept only where the schedule gets faster."""
from __future__ import annotations

import hcc
from hcc.compiler import schedule, treepack
from hcc.compiler.cost import simulate
from hcc.compiler.lower import lower
from hcc.compiler.pipeline import resolve

from pathlib import Path

from test_lower import check_numeric

SRC = (Path(__file__).resolve().parent.parent / "samples" / "dgx1.hcl").read_text().split("\ncollective")[0] + """
collective frag = broadcast on dgx1 { size = 64 MiB ranks = gpu[0,1,2,4,5,6] root = gpu0 }
"""


def _plan(monkeypatch, drain: bool):
    monkeypatch.setattr(schedule, "DRAIN_TREE", drain)
    schedule._memo.clear()
    prog = hcc.load(SRC)
    spec = resolve(prog, "frag")
    topo = prog.topology_of(spec)
    packing = treepack.pack_broadcast(topo, spec.ranks, spec.ranks[spec.root])
    plan = lower(spec, topo, packing.trees, 512 * 1024, schedule="timed")
    return plan, len(packing.trees)


def test_drain_tree_speeds_up_the_dgx1_fragment_broadcast(monkeypatch):
    plain, packed = _plan(monkeypatch, False)
    drained, _ = _plan(monkeypatch, True)
    assert len(plain.trees) == packed and len(drained.trees) == packed + 1
    drained.verify()
    check_numeric(drained, seed=3)
    t_plain, t_drained = simulate(plain).time, simulate(drained).time
    assert t_drained < t_plain * (1 - schedule.DRAIN_GAIN)
    # a small share, over a tree spanning every rank from the root
    extra = drained.trees[-1]
    lo, hi = extra.span
    assert 0 < hi - lo < 0.05 * (drained.size_bytes // 4)
    assert extra.root == drained.root and sum(p == -1 for p in extra.parent) == 1


def test_drain_tree_is_dropped_where_it_does_not_help(monkeypatch):
    """A drain tree whose schedule is not DRAIN_GAIN faster is not kept: with an impossible
    gain asked, the plan has the packing's trees only."""
    monkeypatch.setattr(schedule, "DRAIN_GAIN", 0.5)
    plan, packed = _plan(monkeypatch, True)
    assert len(plan.trees) == packed
