"""The verifier (ir/verify.py): deliberately broken plans are each rejected with the right
message and location; correct plans (including ones with commuting reductions) pass; a
256-rank allgather of ~130k ops verifies; the per-range fast path agrees with the interval
map on real plans and on broken ones."""
from __future__ import annotations

import dataclasses
from collections import namedtuple

import pytest

from hcc.compiler.lower import lower
from hcc.compiler.program import CollectiveSpec
from hcc.ir.errors import PlanError, VerifyError
from hcc.ir.plan import ChunkRef, Copy, Plan, Recv, RecvReduce, Reduce, Scale, Send
from hcc.ir.topology import Link, Topology
from hcc.ir.verify import verify

PT = namedtuple("PT", "root edges rate")


def names(n):
    return tuple(f"g{i}" for i in range(n))


def mesh(n):
    v = names(n)
    return Topology("mesh", v, links=tuple(Link(a, b, 1e9) for a in v for b in v if a != b))


def make(kind, programs, *, elems=4, op=None, root=-1, tmp=None, peers=None) -> Plan:
    n = len(programs)
    return Plan(name="p", kind=kind, ranks=names(n), root=root, size_bytes=elems * 4,
                dtype="float32", op=op, algorithm="hand", chunk_bytes=16, trees=(),
                programs=tuple(tuple(p) for p in programs),
                tmp_elems=tuple(tmp or [0] * n), topology=mesh(n), peers=peers)


def R(buf, off, cnt):
    return ChunkRef(buf, off, cnt)


def reduce2(extra0=(), extra1=(), op="sum"):
    """A correct 2-rank reduce to rank 0 over 4 elements, with room for extra ops."""
    p0 = [Copy(R("in", 0, 4), R("out", 0, 4)), RecvReduce(1, 0, R("out", 0, 4), (0,)), *extra0]
    p1 = [Send(0, 0, R("in", 0, 4)), *extra1]
    return make("reduce", [p0, p1], op=op, root=0)


def rejects(plan, *fragments, rank=None, op=None):
    with pytest.raises(VerifyError) as e:
        verify(plan)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, msg
    if rank is not None:
        assert e.value.rank == rank, msg
    if op is not None:
        assert e.value.op == op, msg
    assert isinstance(e.value, PlanError)
    return msg


def test_a_correct_hand_plan_passes():
    verify(reduce2())
    verify(reduce2(extra0=[Scale(R("out", 0, 4), 2, (1,))], op="avg"))


def test_dropped_send():
    plan = make("reduce", [[Copy(R("in", 0, 4), R("out", 0, 4)),
                            RecvReduce(1, 0, R("out", 0, 4), (0,))], []], op="sum", root=0)
    rejects(plan, "rank 0 op 1", "has no matching send on rank 1", rank=0, op=1)


def test_dropped_recv():
    plan = make("reduce", [[Copy(R("in", 0, 4), R("out", 0, 4))], [Send(0, 0, R("in", 0, 4))]],
                op="sum", root=0)
    rejects(plan, "rank 1 op 0 (send in[0:4] to rank 0 tag 0) has no matching recv on rank 0",
            rank=1, op=0)


def test_count_mismatch():
    plan = make("reduce", [[Copy(R("in", 0, 4), R("out", 0, 4)),
                            RecvReduce(1, 0, R("out", 0, 2), (0,))],
                           [Send(0, 0, R("in", 0, 4))]], op="sum", root=0)
    rejects(plan, "sends 4 elements", "expects 2")


def test_double_counted_reduction():
    plan = reduce2(extra0=[RecvReduce(1, 1, R("out", 0, 4), (1,))],
                   extra1=[Send(0, 1, R("in", 0, 4))])
    rejects(plan, "counts rank 1's input twice (double-counted reduction)", rank=0, op=2)
    local = reduce2(extra0=[Reduce(R("in", 0, 4), R("out", 0, 4), (1,))])
    rejects(local, "counts rank 0's input twice")


def test_dependency_cycle_is_a_deadlock():
    # each rank waits for the other's message before sending its own
    p0 = [Recv(1, 0, R("out", 0, 4)), Send(1, 0, R("in", 0, 4), (0,))]
    p1 = [Recv(0, 0, R("out", 0, 4)), Send(0, 0, R("in", 0, 4), (0,))]
    rejects(make("allreduce", [p0, p1], op="sum"), "dependency cycle, the plan can deadlock")


def test_rendezvous_deadlock_is_caught():
    # both ranks send, then receive only after their own send completed: fine with buffered
    # sends, a deadlock when MPI's Isend completes only once the receive is posted
    p0 = [Send(1, 0, R("in", 0, 4)), Recv(1, 0, R("out", 0, 4), (0,))]
    p1 = [Send(0, 0, R("in", 0, 4)), Recv(0, 0, R("out", 0, 4), (0,))]
    rejects(make("alltoall", [p0, p1], elems=4), "dependency cycle")


def test_dep_on_a_later_op():
    plan = reduce2()
    p0 = list(plan.programs[0])
    p0[0] = Copy(R("in", 0, 4), R("out", 0, 4), (1,))
    rejects(dataclasses.replace(plan, programs=(tuple(p0), plan.programs[1])),
            "depends on op 1, which is not an earlier op of rank 0", rank=0, op=0)


def test_race_between_a_write_and_a_send():
    p0 = [Copy(R("in", 0, 4), R("out", 0, 4)), Send(1, 0, R("out", 0, 4))]  # send not after copy
    p1 = [Recv(0, 0, R("out", 0, 4))]
    rejects(make("broadcast", [p0, p1], root=0), "data race on rank 0", "op 0 (copy", rank=0, op=1)


def test_race_between_reduction_and_plain_write():
    plan = reduce2(extra0=[Copy(R("in", 0, 4), R("out", 0, 4))])  # overwrites without deps
    rejects(plan, "data race on rank 0", rank=0, op=2)


def test_concurrent_reductions_commute_but_readers_must_wait_for_all():
    p0 = [Copy(R("in", 0, 4), R("out", 0, 4)),
          RecvReduce(1, 0, R("out", 0, 4), (0,)), RecvReduce(2, 0, R("out", 0, 4), (0,))]
    p1 = [Send(0, 0, R("in", 0, 4))]
    p2 = [Send(0, 0, R("in", 0, 4))]
    verify(make("reduce", [p0, p1, p2], op="sum", root=0))
    # a Scale after only one of the two reductions races with the other
    bad = p0 + [Scale(R("out", 0, 4), 3, (1,))]
    rejects(make("reduce", [bad, p1, p2], op="avg", root=0), "data race", "op 2")


def test_out_of_range_chunkref():
    plan = reduce2()
    p1 = [Send(0, 0, R("in", 2, 4))]
    rejects(dataclasses.replace(plan, programs=(plan.programs[0], tuple(p1))),
            "in[2:6] is outside buffer in of rank 1 (4 elements)", rank=1, op=0)
    rejects(dataclasses.replace(plan, programs=(plan.programs[0], (Send(0, 0, R("tmp", 0, 1)),))),
            "outside buffer tmp")
    rejects(dataclasses.replace(plan, programs=(plan.programs[0], (Send(0, 0, R("in", 0, 0)),))),
            "outside buffer")


def test_missing_block():
    n = 3
    trees = [PT(f"g{j}", tuple((f"g{j}", f"g{c}", ()) for c in range(n) if c != j), 1.0)
             for j in range(n)]
    s = CollectiveSpec("p", "allgather", "mesh", names(n), -1, 4 * 9, "float32")
    plan = lower(s, mesh(n), trees, 64)
    verify(plan)
    # drop rank 0's Copy of its own block into out: out block 0 of rank 0 is never written
    p0 = tuple(op for op in plan.programs[0] if not isinstance(op, Copy))
    fixed = tuple(_reindex(p0, plan.programs[0]))
    rejects(dataclasses.replace(plan, programs=(fixed,) + plan.programs[1:]),
            "rank 0 (g0) ends with out[0:3] = never written, but allgather requires rank 0's in[0:3]",
            rank=0)


def _reindex(kept, original):
    """Ops of ``kept`` (a subsequence of ``original``) with deps renumbered (dropped deps vanish)."""
    pos = {}
    j = 0
    for i, op in enumerate(original):
        if j < len(kept) and op is kept[j]:
            pos[i] = j
            j += 1
    for op in kept:
        yield dataclasses.replace(op, deps=tuple(pos[d] for d in op.deps if d in pos))


def test_wrong_data_is_named():
    # broadcast where rank 1 receives rank 0's data shifted by one element
    p0 = [Copy(R("in", 0, 4), R("out", 0, 4)), Send(1, 0, R("in", 0, 3)), Send(1, 1, R("in", 0, 1))]
    p1 = [Recv(0, 0, R("out", 1, 3)), Recv(0, 1, R("out", 0, 1))]
    rejects(make("broadcast", [p0, p1], root=0),
            "rank 1 (g1) ends with out[1:4] = rank 0's in[0:3], but broadcast requires "
            "rank 0's in[1:4]", rank=1)


def test_writing_in_is_rejected():
    plan = reduce2(extra0=[Copy(R("out", 0, 4), R("in", 0, 4), (1,))])
    rejects(plan, "writes the input buffer 'in', which is read-only", rank=0, op=2)


def test_reading_unwritten_tmp():
    p0 = [Send(1, 0, R("tmp", 0, 4))]
    p1 = [Recv(0, 0, R("out", 0, 4))]
    rejects(make("broadcast", [p0, p1], root=0, tmp=[4, 0]),
            "reads tmp[0:4] of rank 0 before anything was written there", rank=0, op=0)


def test_avg_needs_scale_by_contributors():
    rejects(reduce2(op="avg"), "requires the reduction of 2 inputs (ranks 0, 1) / 2")
    rejects(reduce2(extra0=[Scale(R("out", 0, 4), 3, (1,))], op="avg"), "/ 3", "/ 2")
    rejects(reduce2(extra0=[Scale(R("out", 0, 4), 2, (1,)), Scale(R("out", 0, 4), 2, (2,))],
                    op="avg"), "a second time")


def test_tags():
    bad = reduce2(extra0=[RecvReduce(1, 0, R("out", 0, 4), (1,))],
                  extra1=[Send(0, 0, R("in", 0, 4))])
    rejects(bad, "reuses tag 0 between ranks 1 -> 0")
    big = make("broadcast", [[Copy(R("in", 0, 4), R("out", 0, 4)), Send(1, 2**24, R("in", 0, 4))],
                             [Recv(0, 2**24, R("out", 0, 4))]], root=0)
    rejects(big, "tag 16777216 outside [0, 2**24)")
    rejects(make("broadcast", [[Copy(R("in", 0, 4), R("out", 0, 4)), Send(0, 0, R("in", 0, 4))],
                               [Recv(0, 0, R("out", 0, 4))]], root=0), "is not another rank")


def test_header_checks():
    ok = reduce2()
    rejects(dataclasses.replace(ok, kind="fold"), "unknown collective kind")
    rejects(dataclasses.replace(ok, root=5), "needs a root in 0..1")
    rejects(dataclasses.replace(ok, op=None), "needs a reduction op")
    rejects(dataclasses.replace(ok, tmp_elems=(0,)), "2 ranks but 2 programs and 1 tmp lengths")
    rejects(dataclasses.replace(ok, size_bytes=15), "not a whole number of float32 elements")


def test_neighbor_average_checks_the_peer_set():
    n = 4
    plan = lower(CollectiveSpec("p", "neighbor_average", "mesh", names(n), -1, 16, "float32",
                                peers="ring"), mesh(n), [], 16)
    verify(plan)
    rejects(dataclasses.replace(plan, peers="all"), "requires the mean of its own input")


def _lowered(kind, n=5, elems=40, chunk=16):
    """A real plan of ``kind`` on a 5-rank mesh: stars rooted at every rank (or rank 0)."""
    v = names(n)
    roots = range(n) if kind in ("allgather", "reduce_scatter", "allreduce") else [0]
    trees = [PT(v[j], tuple((v[j], v[c], ()) for c in range(n) if c != j), 1.0) for j in roots]
    op = "sum" if kind in ("reduce", "allreduce", "reduce_scatter") else None
    s = CollectiveSpec("p", kind, "mesh", v, 0 if kind in ("broadcast", "reduce", "gather", "scatter") else -1,
                       4 * elems, "float32", op=op)
    return lower(s, mesh(n), trees, chunk)


KINDS = ("broadcast", "reduce", "allreduce", "allgather", "reduce_scatter", "gather", "scatter")


def _both_ways(monkeypatch, plan):
    """The verdict on ``plan`` with the per-range fast path (laminar buffers) and with the
    interval map forced everywhere: the two must agree, message for message."""
    import hcc.ir.verify as V

    def outcome():
        try:
            verify(plan)
            return "ok"
        except VerifyError as e:
            return str(e)

    fast = outcome()
    with monkeypatch.context() as m:
        m.setattr(V, "_laminar", lambda ranges: False)
        slow = outcome()
    assert fast == slow
    return fast


@pytest.mark.parametrize("kind", KINDS)
def test_fast_path_agrees_with_the_interval_map(monkeypatch, kind):
    plan = _lowered(kind)
    assert _both_ways(monkeypatch, plan) == "ok"
    # break it three ways; each must be rejected the same way by both paths
    progs = [list(p) for p in plan.programs]
    hit = next(((r, i) for r, p in enumerate(progs) for i, op in enumerate(p) if op.deps), None)
    if hit is not None:  # a dropped dependency (broadcast's stars have none)
        r, i = hit
        progs[r][i] = dataclasses.replace(progs[r][i], deps=())
        assert _both_ways(monkeypatch, dataclasses.replace(plan, programs=tuple(map(tuple, progs)))) != "ok"
    progs = [list(p) for p in plan.programs]
    r, i = next((r, i) for r, p in enumerate(progs) for i, op in enumerate(p) if isinstance(op, Send))
    src = progs[r][i].src
    moved = R(src.buf, src.offset - 1 if src.offset else src.offset + 1, src.count)
    progs[r][i] = dataclasses.replace(progs[r][i], src=moved)  # wrong data on the wire
    assert _both_ways(monkeypatch, dataclasses.replace(plan, programs=tuple(map(tuple, progs)))) != "ok"
    progs = [list(p) for p in plan.programs]
    r, i = next((r, i) for r, p in enumerate(progs) for i, op in enumerate(p) if isinstance(op, (Recv, RecvReduce)))
    progs[r][i] = dataclasses.replace(progs[r][i], peer=(progs[r][i].peer + 1) % 5)  # a misrouted message
    assert _both_ways(monkeypatch, dataclasses.replace(plan, programs=tuple(map(tuple, progs)))) != "ok"


def test_overlapping_ranges_use_the_interval_map():
    # rank 1 names out[0:4], out[4:8] and out[2:6]: not laminar, so its buffer is an interval
    # map; sending out[2:6] back is fine after both receives, a race without the deps
    def plan(deps):
        p0 = [Copy(R("in", 0, 8), R("out", 0, 8)), Send(1, 0, R("in", 0, 4)), Send(1, 1, R("in", 4, 4)),
              Recv(1, 2, R("tmp", 0, 4))]
        p1 = [Recv(0, 0, R("out", 0, 4)), Recv(0, 1, R("out", 4, 4)), Send(0, 2, R("out", 2, 4), deps)]
        return make("broadcast", [p0, p1], elems=8, root=0, tmp=[4, 0])

    import hcc.ir.verify as V

    assert not V._laminar({(0, 4), (4, 8), (2, 6)})
    verify(plan((0, 1)))
    rejects(plan((0,)), "data race on rank 1", "op 1 (recv out[4:8]", rank=1, op=2)


def test_reduction_masks_count_each_input_once():
    # terms at two shifts in one value: rank 1's in[0:2] lands in out[2:4] of rank 0 (shift -2)
    # and is then reduced with its own copy at shift 0 -- distinct terms, not a double count
    import hcc.ir.verify as V

    a = (((0, 0b011),), 1)
    b = (((-2, 0b010),), 1)
    both, why = V._union(a, b)
    assert why == "" and both == (((-2, 0b010), (0, 0b011)), 1)
    assert V._union(both, (((0, 0b100),), 1)) == ((((-2, 0b010), (0, 0b111)), 1), "")
    assert "rank 1's input twice" in V._union(both, (((-2, 0b110),), 1))[1]
    assert V._show(both, 0, 4) == "the reduction of 3 inputs (ranks 0, 1, at differing offsets)"
    assert V._bits(1 << 1000 | 5) == [0, 2, 1000]


def test_slots_report_gaps_as_never_written():
    import hcc.ir.verify as V

    s = V._Slots(10)
    s.assign(2, 4, [(2, 4, "x")])
    s.assign(6, 8, [(6, 7, "y"), (7, 8, "z")])
    assert s.runs(0, 10) == [(0, 2, None), (2, 4, "x"), (4, 6, None), (6, 7, "y"), (7, 8, "z"), (8, 10, None)]
    assert s.runs(3, 7) == [(3, 4, "x"), (4, 6, None), (6, 7, "y")]
    assert s.pieces(6, 8) == [(6, 7, "y"), (7, 8, "z")]


def test_verify_checks_a_256_rank_allgather():
    n = 256
    v = names(n)
    topo = Topology("star", v, ("sw",), tuple(Link(a, "sw", 1e9) for a in v) +
                    tuple(Link("sw", a, 1e9) for a in v))

    def binary(root):
        order = [(root + i) % n for i in range(n)]
        return PT(v[root], tuple((v[order[(i - 1) // 2]], v[order[i]], ()) for i in range(1, n)), 1.0)

    s = CollectiveSpec("p", "allgather", "star", v, -1, 4 * n * 16, "float32")
    plan = lower(s, topo, [binary(j) for j in range(n)], 1 << 20)
    # one send and one recv per rank pair, plus each root's copy of its own block
    assert sum(len(p) for p in plan.programs) == 2 * n * (n - 1) + n
    verify(plan)  # speed is measured in benchmarks/scale_bench.py, not asserted here
