"""The timed lowering's fast paths (compiler/schedule.py): the native list schedule
(compiler/_simcore.c's ``wfq``) against the Python reference loop, message for message; the
exact replay that lets lower.lower_priced drop a losing timed schedule before writing it out
(schedule.Outrun); and that the choice it returns is still the faster of the two orders. No
timing."""
from __future__ import annotations

import pytest

from hcc.compiler import schedule, treepack
from hcc.compiler.builder import _Lowering
from hcc.compiler.cost import CostModel, simulate
from hcc.compiler.lower import _root_spans, assemble, lower, lower_priced
from hcc.compiler.schedule import PORT_WINDOW, lower_timed
from hcc.compiler.trees import TreeShape

from test_schedule_efficiency import random_graph, spec
from test_timed_split import _fragment

KINDS = ("broadcast", "reduce", "allgather", "reduce_scatter", "allreduce")


def _packing(kind: str, topo, ranks):
    if kind in ("allgather", "reduce_scatter"):
        return treepack.pack_allgather(topo, ranks, reverse=kind == "reduce_scatter")
    return treepack.pack_broadcast(topo, ranks, ranks[0], reverse=kind == "reduce")


def _timed(kind: str, topo, chunk_elems: int):
    """(plan, lowering) of the timed lowering of ``kind`` over its packing on ``topo``."""
    ranks = topo.nodes
    s = spec(kind, ranks, 4 << 20, 0 if kind in ("broadcast", "reduce") else -1)
    shapes = [TreeShape.of(t, ranks, i) for i, t in enumerate(_packing(kind, topo, ranks).trees)]
    L = _Lowering(s, chunk_elems)
    if kind in ("allgather", "reduce_scatter"):
        spans = _root_spans(L, shapes)
    else:
        spans = schedule.split_by_rate(0, L.E, [sh.rate for sh in shapes])
    got = lower_timed(L, shapes, spans, False, topo, 1e-6, PORT_WINDOW)
    assert got is not None
    plan = assemble(s, topo, L.B, tuple(sh.to_tree(i, got[i]) for i, sh in enumerate(shapes)), "treepack", L.ce)
    return plan, L


@pytest.mark.skipif(schedule._wfq is None, reason="the native core is not built")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("net", ["random", "fragment"])
def test_native_schedule_is_the_reference_loop(monkeypatch, kind, net):
    # the random graph has direct links only (a window of 1, no gates); DGX-1's fragment has
    # PCIe switches beside NVLinks (windows of 4, sends gated on their rank's completions)
    topo = random_graph(6, 3, latency=1e-6) if net == "random" else _fragment()
    native = schedule._Timed._schedule_native
    runs = []

    def both(self, port_rank, wsize, gate, gated):
        order = native(self, port_rank, wsize, gate, gated)
        fast = (order, self.pred, self.start, self.end, self.makespan)
        self.lists()
        ref = self._schedule_py(port_rank, wsize, gate, gated)
        runs.append(fast == (ref, self.pred, self.start, self.end, self.makespan))
        return ref

    monkeypatch.setattr(schedule._Timed, "_schedule_native", both)
    _timed(kind, topo, (256 << 10) // 4)
    assert runs and all(runs)


@pytest.mark.parametrize("kind", ["allgather", "broadcast", "allreduce"])
@pytest.mark.parametrize("seed", [1, 2])
def test_direct_link_schedules_replay_exactly(kind, seed):
    # what lets lower_priced compare a timed schedule with the plain order before writing it:
    # one hop per message over its sender's own link, so the plan simulates to the makespan
    topo = random_graph(6, seed, latency=1e-6)
    plan, L = _timed(kind, topo, (128 << 10) // 4)
    assert simulate(plan).time == pytest.approx(L.timed_makespan, rel=1e-12)


@pytest.mark.parametrize("net", ["random", "fragment"])
@pytest.mark.parametrize("kind", ["allgather", "broadcast"])
def test_lower_priced_returns_the_faster_order(monkeypatch, net, kind):
    # against both orders lowered and simulated in full; on the random graph the plain
    # allgather wins at both sizes and the timed plan is dropped unwritten (Outrun)
    topo = random_graph(7, 5, latency=1e-6) if net == "random" else _fragment()
    ranks = topo.nodes
    s = spec(kind, ranks, 16 << 20, 0 if kind == "broadcast" else -1)
    trees = _packing(kind, topo, ranks).trees
    model = CostModel()
    outrun = []
    real = schedule.Outrun

    class Seen(real):
        def __init__(self, *args):
            outrun.append(args)
            super().__init__(*args)

    monkeypatch.setattr(schedule, "Outrun", Seen)
    for chunk in (256 << 10, 1 << 20):
        times = [simulate(lower(s, topo, trees, chunk, schedule=o, model=model), model=model).time
                 for o in ("fifo", "timed")]
        plan, sim = lower_priced(s, topo, trees, chunk, model=model)
        assert sim.time == min(times)
        assert simulate(plan, model=model).time == sim.time
    assert len(outrun) == (2 if (net, kind) == ("random", "allgather") else 0)
