"""The timed lowering's fast paths (compiler/schedule.py): the native list schedules
(compiler/_simcore.c's ``wfq`` and, over switches, ``exact``) against their Python reference
loops, message for message; the exact replay that lets lower.lower_priced drop a losing
timed schedule before writing it out (schedule.Outrun); and that the choice it returns is
still the faster of the two orders. No timing."""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from hcc.compiler import schedule, treepack
from hcc.compiler.builder import _Lowering
from hcc.compiler.cost import CostModel, simulate
from hcc.compiler.frontend import load_program
from hcc.compiler.lower import _root_spans, assemble, lower, lower_priced
from hcc.compiler.schedule import PORT_WINDOW, lower_timed
from hcc.compiler.trees import TreeShape
from hcc.ir.topology import Link, Topology

from test_schedule_efficiency import random_graph, spec
from test_timed_split import _fragment

KINDS = ("broadcast", "reduce", "allgather", "reduce_scatter", "allreduce")


def _packing(kind: str, topo, ranks):
    if kind in ("allgather", "reduce_scatter"):
        return treepack.pack_allgather(topo, ranks, reverse=kind == "reduce_scatter")
    return treepack.pack_broadcast(topo, ranks, ranks[0], reverse=kind == "reduce")


def _timed(kind: str, topo, chunk_elems: int, ranks=None, window: int = PORT_WINDOW, op: str | None = None):
    """(plan, lowering) of the timed lowering of ``kind`` over its packing on ``topo``
    (among ``ranks``, default every node)."""
    ranks = topo.nodes if ranks is None else tuple(ranks)
    s = spec(kind, ranks, 4 << 20, 0 if kind in ("broadcast", "reduce") else -1)
    if op is not None:
        s = dataclasses.replace(s, op=op)
    shapes = [TreeShape.of(t, ranks, i) for i, t in enumerate(_packing(kind, topo, ranks).trees)]
    L = _Lowering(s, chunk_elems)
    if kind in ("allgather", "reduce_scatter"):
        spans = _root_spans(L, shapes)
    else:
        spans = schedule.split_by_rate(0, L.E, [sh.rate for sh in shapes])
    got = lower_timed(L, shapes, spans, False, topo, 1e-6, window)
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
    plain_wins = 0
    for chunk in (256 << 10, 1 << 20):
        times = [simulate(lower(s, topo, trees, chunk, schedule=o, model=model), model=model).time
                 for o in ("fifo", "timed")]
        plan, sim = lower_priced(s, topo, trees, chunk, model=model)
        assert sim.time == min(times)
        assert simulate(plan, model=model).time == sim.time
        plain_wins += times[0] < times[1]
    # the random graph's allgather replays its schedule exactly (one hop per message), so the
    # timed plan is compared before it is written and dropped where the plain order wins
    # (at 256 KiB); elsewhere both are written and simulated
    if (net, kind) == ("random", "allgather"):
        assert len(outrun) == plain_wins >= 1
    else:
        assert not outrun


# -- the exact (switch) schedule: compiler/_simcore.c's ``exact`` against _schedule_exact_py --
SAMPLES = Path(__file__).resolve().parent.parent / "samples"
EXACT_FIELDS = ("pred", "start", "end", "pop", "gate_by", "first_in", "makespan", "ungated")


def _sample_topology(sample: str, name: str) -> Topology:
    return load_program(str(SAMPLES / f"{sample}.hcl")).topologies[name]


def random_switched(seed: int, n: int = 7) -> Topology:
    """Ranks on 1-3 switches (random uplink and downlink capacities and latencies, the
    switches chained), a few direct links between ranks: some ranks reach the others only
    through switches, so the timed lowering schedules exactly."""
    rng = random.Random(seed)
    v = tuple(f"r{i}" for i in range(n))
    sw = tuple(f"s{i}" for i in range(rng.randint(1, 3)))
    links = []
    for i, r in enumerate(v):
        s = sw[i % len(sw)]
        links += [Link(r, s, rng.choice((1, 2, 4)) * 1e9, rng.choice((0.0, 1e-6))),
                  Link(s, r, rng.choice((1, 2, 4)) * 1e9, rng.choice((0.0, 1e-6)))]
    for a, b in zip(sw, sw[1:]):
        links += [Link(a, b, 8e9, 2e-6), Link(b, a, 8e9, 2e-6)]
    for _ in range(rng.randint(0, 2)):
        a, b = rng.sample(range(n - 1), 2)  # the last rank keeps only its switch
        links += [Link(v[a], v[b], 2e9, 1e-6), Link(v[b], v[a], 2e9, 1e-6)]
    return Topology(f"rsw{seed}", v, sw, tuple(links))


def _compare_exact(monkeypatch, runs: list) -> None:
    """Make every exact schedule run both loops, also at other windows and with ``wide``
    flipped (the same messages), and record whether the two agreed on everything."""
    def snap(T, order):
        return (order,) + tuple(getattr(T, f) for f in EXACT_FIELDS)

    def both(self, window, wide):
        self.lists()
        for w, wd in ((window, wide), (window, not wide), (2, wide), (7, not wide)):
            fast = snap(self, self._schedule_exact_native(w, wd))
            ref = snap(self, self._schedule_exact_py(w, wd))
            runs.append((self.L.spec.kind, w, wd, len(self.gate_by), fast == ref))
        return self._schedule_exact_py(window, wide)

    monkeypatch.setattr(schedule._Timed, "schedule_exact", both)


CLUSTER_RANKS = ("h0.gpu0", "h0.gpu1", "h0.gpu2", "h1.gpu0", "h1.gpu1", "h2.gpu3")
FATTREE_RANKS = ("rack0.n0", "rack0.n1", "rack0.n2", "rack1.n0", "rack1.n5", "rack2.n3", "rack7.n15")


@pytest.mark.skipif(schedule._exact is None, reason="the native core is not built")
@pytest.mark.parametrize("kind,op", [(k, None) for k in KINDS] + [("allreduce", "avg")])
@pytest.mark.parametrize("net", ["cluster", "fattree", "random"])
def test_native_exact_schedule_is_the_reference_loop(monkeypatch, kind, op, net):
    # cluster.hcl: NVSwitch, NICs and a ToR; fattree.hcl: leaves and spines; both among a few
    # ranks of several hosts or racks. The random graphs mix switches and direct links.
    runs: list = []
    _compare_exact(monkeypatch, runs)
    if net == "random":
        for seed in (1, 2, 3):
            _timed(kind, random_switched(seed), (64 << 10) // 4, op=op)
    else:
        topo = _sample_topology("cluster", "cluster") if net == "cluster" else _sample_topology("fattree", "fattree")
        ranks = CLUSTER_RANKS if net == "cluster" else FATTREE_RANKS
        _timed(kind, topo, (32 << 10) // 4, ranks=ranks, op=op)
    assert runs and all(r[-1] for r in runs), [r for r in runs if not r[-1]]
    # the comparison covered starts gated by a completion (the loop's hardest path), not only
    # starts at time 0
    assert any(gated for _, _, _, gated, _ in runs), runs


@pytest.mark.skipif(schedule._exact is None, reason="the native core is not built")
@pytest.mark.parametrize("bad", [None, "link", "rank", "dependent", "port", "lengths", "window"])
def test_native_exact_schedule_checks_its_indices(bad):
    # two messages r0 -> r1 (up, over link 0) then r1 -> r2 (down, over link 1); each case
    # breaks one index or length the loop would read, and the call must refuse it
    import numpy as np

    def i64(*v):
        return np.array(v, np.int64)

    port, path_ptr, path_links = i64(0, 1), i64(0, 1, 2), i64(0, 1)
    dep_ptr, dep_idx, remaining = i64(0, 1, 1), i64(1), i64(0, 1)
    src, dst, rep, upz = i64(0, 1), i64(1, 2), i64(0, -1), i64(-1, -1)
    prank, wsize = i64(0, 1), i64(4, 4)
    if bad == "link":
        path_links = i64(0, 5)
    elif bad == "rank":
        dst = i64(1, 3)
    elif bad == "dependent":
        dep_idx = i64(2)
    elif bad == "port":
        prank = i64(0, 2)
    elif bad == "lengths":
        path_ptr = i64(0, 1)
    lat, cap = np.full(2, 1e-6), np.full(2, 1e9)
    if bad == "window":  # a third link, sent from rank 0 but no message starts on it: its window still counts
        prank, wsize, lat, cap = i64(0, 1, 0), i64(4, 4, -5), np.full(3, 1e-6), np.full(3, 1e9)
    f = np.zeros(2, np.float64)
    order, pred, pop, gate_z, first_in = (np.empty(2, np.int64) for _ in range(5))
    start, end, gate_side = np.zeros(2), np.zeros(2), np.zeros(2, np.int8)

    def run():
        return schedule._exact(port, path_ptr, path_links, f + 8.0, f, np.array([0, 1], np.int8), dep_ptr, dep_idx,
                               remaining, src, dst, rep, upz, np.zeros(2, np.int8), prank, wsize, lat, cap,
                               1e-6, 3, order, pred, start, end, pop, gate_z, gate_side, first_in)

    if bad is None:
        done, makespan, _ = run()
        assert done == 2 and order.tolist() == [0, 1] and makespan == end[1] > end[0] > 0
        return
    with pytest.raises(ValueError, match="exact: "):
        run()


def _rounds(monkeypatch, topo, kind: str, chunk: int, rival) -> list[float]:
    """The makespans of the timed lowering's rebalancing rounds over ``kind``'s packing on
    ``topo`` (``rival``: lower_jobs' rival, a callable, or None)."""
    ranks = topo.nodes
    s = spec(kind, ranks, 16 << 20, 0 if kind == "broadcast" else -1)
    trees = _packing(kind, topo, ranks).trees
    seen: list[float] = []
    real = schedule._Timed.schedule

    def record(self, *args, **kw):
        order = real(self, *args, **kw)
        seen.append(self.makespan)
        return order

    monkeypatch.setattr(schedule._Timed, "schedule", record)
    try:
        lower(s, topo, trees, chunk, schedule="timed", model=CostModel(), rival=rival, rival_ops=1 << 40)
    except schedule.Outrun:
        pass
    monkeypatch.undo()
    return seen


def _fruitless(seen: list[float]) -> int | None:
    """The index of the first round that found nothing faster than the rounds before it."""
    for i in range(1, len(seen)):
        if seen[i] >= min(seen[:i]) * (1 - 1e-9):
            return i
    return None


def test_a_schedule_behind_the_other_order_stops_rebalancing_at_its_first_fruitless_round(monkeypatch):
    # REBALANCE_STALL: without a rival the rounds go on past a round that found nothing
    # faster (up to REBALANCE_STALL of them in a row); with the other order ahead of every
    # schedule (a rival of time 0) they stop at the first such round, and the timed plan is
    # dropped unwritten
    went_on = 0
    for seed in (1, 2, 3, 5):
        topo = random_graph(7, seed, latency=1e-6)
        for chunk in (256 << 10, 1 << 20):
            free = _rounds(monkeypatch, topo, "allgather", chunk, None)
            behind = _rounds(monkeypatch, topo, "allgather", chunk, lambda: 0.0)
            stop = _fruitless(behind)
            if stop is not None:
                assert len(behind) == stop + 1
            assert behind == free[:len(behind)]  # the same rounds up to the stop
            went_on += len(free) > len(behind)
    assert went_on >= 1
