"""The timed lowering's receive gate (compiler/schedule.py, INGRESS_GATE): over a switch, a
message's Recv depends on the Recv of an earlier message into the same rank, so the plan
keeps the schedule's order on the receivers' links; without a switch, and in a broadcast,
no Recv waits for another. Plans stay correct (verify, numeric run). No timing."""
from __future__ import annotations

import pytest

from hcc.compiler.lower import lower
from hcc.ir.plan import Recv, RecvReduce

from test_lower import check_numeric, mesh, spec, switched, trees_for, via_switch

RECVS = (Recv, RecvReduce)


def gated_recvs(plan) -> int:
    """Receives whose deps name another receive of the same rank (each an earlier op)."""
    count = 0
    for prog in plan.programs:
        for i, op in enumerate(prog):
            if isinstance(op, RECVS):
                on = [d for d in op.deps if isinstance(prog[d], RECVS)]
                assert all(d < i for d in on)
                count += bool(on)
    return count


@pytest.mark.parametrize("kind", ["reduce", "allgather", "reduce_scatter", "allreduce", "broadcast"])
@pytest.mark.parametrize("net", ["switched", "mesh"])
def test_receives_wait_for_the_schedules_order_only_over_a_switch(kind, net):
    n, elems = 4, 240
    s = spec(kind, n, elems)
    trees = trees_for(kind, n, s.root)
    topo = switched(n) if net == "switched" else mesh(n)
    if net == "switched":
        trees = [via_switch(t) for t in trees]
    plan = lower(s, topo, trees, chunk_bytes=10 * 8, schedule="timed")
    plan.verify()
    check_numeric(plan, seed=3)
    got = gated_recvs(plan)
    if net == "switched" and kind != "broadcast":
        # 4 ranks, several chunks per tree: most receives follow another into the same rank
        assert got > sum(isinstance(op, RECVS) for p in plan.programs for op in p) // 2
    else:
        assert got == 0
