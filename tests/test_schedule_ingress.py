"""The timed lowering over switches replays its schedule exactly (compiler/schedule.py,
EXACT_GATE): every message after time 0 waits for an op of its sender or receiver that the
schedule ended at the message's start, messages ready at one instant are scheduled in the
order the simulator pops them, so cost.simulate's time of the plan equals the schedule's own
makespan. Plans stay correct (verify, numeric run). Without a switch no receive waits for
another. No timing."""
from __future__ import annotations

import pytest

from hcc.compiler.builder import _Lowering
from hcc.compiler.cost import simulate
from hcc.compiler.lower import _root_spans, assemble, lower
from hcc.compiler.schedule import PORT_WINDOW, lower_timed
from hcc.compiler.builder import split_by_rate
from hcc.compiler.trees import TreeShape
from hcc.compiler.treepack import PackedTree as PT
from hcc.ir.plan import Recv, RecvReduce
from hcc.ir.topology import Link, Topology
from hcc.ir.verify import verify

from test_lower import check_numeric, mesh, spec, switched, trees_for

RECVS = (Recv, RecvReduce)


def waiting_recvs(plan) -> int:
    """Receives whose deps name another receive of the same rank (each an earlier op)."""
    count = 0
    for prog in plan.programs:
        for i, op in enumerate(prog):
            if isinstance(op, RECVS):
                on = [d for d in op.deps if isinstance(prog[d], RECVS)]
                assert all(d < i for d in on)
                count += bool(on)
    return count


def timed(s, topo, trees, chunk_bytes: int):
    """(plan, the schedule's own makespan) of the timed lowering."""
    L = _Lowering(s, chunk_bytes // 8)
    shapes = [TreeShape.of(t, s.ranks, i) for i, t in enumerate(trees)]
    per_root = s.kind == "allreduce" and {sh.root for sh in shapes} == set(range(len(s.ranks)))
    if s.kind in ("allgather", "reduce_scatter") or per_root:
        spans = _root_spans(L, shapes)
    else:
        spans = split_by_rate(0, L.E, [sh.rate for sh in shapes])
    got = lower_timed(L, shapes, spans, per_root, topo, 1e-6, PORT_WINDOW)
    assert got is not None
    plan = assemble(s, topo, L.B, tuple(sh.to_tree(i, got[i]) for i, sh in enumerate(shapes)), "treepack", L.ce)
    return plan, L.timed_makespan


def mixed(n: int) -> tuple[Topology, set]:
    """switched(n) plus a 4 GB/s link each way between g0 and g1: two ranks with a direct
    link, the others reached only through the switch."""
    topo = switched(n)
    a, b = topo.vertices[0], topo.vertices[1]
    links = topo.links + (Link(a, b, 4e9, 2e-6), Link(b, a, 4e9, 2e-6))
    return Topology("mixed", topo.vertices, topo.switches, links), {a, b}


def routed(t: PT, direct: set) -> PT:
    """Tree ``t`` with its edges through the switch, but for those between ``direct`` ranks."""
    return PT(t.root, tuple((a, b, (a, b) if {a, b} <= direct else (a, "sw", b)) for a, b, _ in t.edges), t.rate)


@pytest.mark.parametrize("kind,op", [("broadcast", None), ("reduce", "sum"), ("allgather", None),
                                     ("reduce_scatter", "sum"), ("allreduce", "sum"), ("allreduce", "avg")])
@pytest.mark.parametrize("n,net", [(3, "switched"), (5, "switched"), (4, "mixed")])
def test_plans_over_a_switch_replay_their_schedule(kind, op, n, net):
    s = spec(kind, n, 240, op=op)
    if net == "mixed":
        topo, direct = mixed(n)
    else:
        topo, direct = switched(n), set()
    trees = [routed(t, direct) for t in trees_for(kind, n, s.root)]
    plan, makespan = timed(s, topo, trees, chunk_bytes=10 * 8)
    verify(plan)
    check_numeric(plan, seed=3)
    assert simulate(plan).time == pytest.approx(makespan, rel=1e-9)


@pytest.mark.parametrize("kind", ["reduce", "allgather", "reduce_scatter", "allreduce", "broadcast"])
def test_without_a_switch_no_receive_waits(kind):
    n = 4
    s = spec(kind, n, 240)
    plan = lower(s, mesh(n), trees_for(kind, n, s.root), chunk_bytes=10 * 8, schedule="timed")
    plan.verify()
    check_numeric(plan, seed=3)
    assert waiting_recvs(plan) == 0
