"""The verifier's native checks 4-7 (ir/verify_native.py, ir/_verifycore.c) against its
Python checks (ir/verify.py): the native pass accepts the real plans of every kind (so it is
the path large plans take), and on plans with injected faults — dropped dependencies, wrong
data on the wire, misrouted messages, plain receives where reductions belong, a missing
scale, swapped ops — it never accepts what the Python checks reject."""
from __future__ import annotations

import dataclasses
import random

import pytest

from hcc.ir import verify as V
from hcc.ir import verify_native
from hcc.ir.errors import VerifyError
from hcc.ir.plan import ChunkRef, Copy, Recv, RecvReduce, Scale, Send
from hcc.ir.verify_scan import check_ops

from test_verify import KINDS, _lowered, make, R, reduce2
from test_levels import NICS, RACKS, load

pytestmark = pytest.mark.skipif(not verify_native.available(), reason="the native verifier is not built")


def native(plan) -> bool:
    sizes = [plan.buffer_elems(r) for r in range(plan.n)]
    ix = check_ops(plan, sizes)
    return ix is not None and verify_native.verify(plan, sizes, ix)


def python_ok(plan, monkeypatch) -> bool:
    with monkeypatch.context() as m:
        m.setattr(verify_native, "verify", lambda *a: False)
        try:
            V.verify(plan)
            return True
        except VerifyError:
            return False


@pytest.mark.parametrize("kind", KINDS + ("alltoall",))
def test_real_plans_pass_natively(kind, monkeypatch):
    plan = _lowered(kind, n=6, elems=60, chunk=16)
    assert python_ok(plan, monkeypatch)
    assert native(plan)


def test_avg_allreduce_with_its_scale_passes_natively(monkeypatch):
    plan = dataclasses.replace(_lowered("allreduce"), op="avg")
    assert not native(plan) and not python_ok(plan, monkeypatch)  # no Scale yet: wrong result
    def scaled(whole: bool):
        progs = [list(p) for p in plan.programs]
        for p in progs:
            every = tuple(range(len(p)))
            ranges = {(op.dst.offset, op.dst.count) for op in p if getattr(op, "dst", None) and op.dst.buf == "out"}
            for off, cnt in ([(0, plan.elems)] if whole else sorted(ranges)):
                p.append(Scale(ChunkRef("out", off, cnt), plan.n, every))
        return dataclasses.replace(plan, programs=tuple(map(tuple, progs)))

    assert python_ok(scaled(False), monkeypatch) and native(scaled(False))
    # one Scale over the chunks' union is right too: ranges that nest, each chunk's slots
    assert python_ok(scaled(True), monkeypatch) and native(scaled(True))


def _mutants(plan, rng: random.Random, count: int):
    """``count`` plans, each ``plan`` with one op changed."""
    ops = [(r, i) for r, p in enumerate(plan.programs) for i in range(len(p))]
    for _ in range(count):
        progs = [list(p) for p in plan.programs]
        r, i = rng.choice(ops)
        op = progs[r][i]
        how = rng.randrange(6)
        if how == 0 and op.deps:
            op = dataclasses.replace(op, deps=tuple(d for d in op.deps if d != rng.choice(op.deps)))
        elif how == 1 and isinstance(op, Send):
            s = op.src
            op = dataclasses.replace(op, src=ChunkRef(s.buf, max(0, s.offset + rng.choice((-1, 1))), s.count))
        elif how == 2 and isinstance(op, RecvReduce):
            op = Recv(op.peer, op.tag, op.dst, op.deps, op.tree, op.chunk)
        elif how == 3 and isinstance(op, Recv) and type(op) is Recv:
            op = RecvReduce(op.peer, op.tag, op.dst, op.deps, op.tree, op.chunk)
        elif how == 4 and i + 1 < len(progs[r]):
            # swap two neighbours, keeping every dependency on an earlier op
            a, b = progs[r][i], progs[r][i + 1]
            if i not in b.deps:
                fix = lambda o, m: dataclasses.replace(o, deps=tuple(m.get(d, d) for d in o.deps))
                swap = {i: i + 1, i + 1: i}
                progs = [[fix(o, swap) if k == r else o for o in p] for k, p in enumerate(progs)]
                progs[r][i], progs[r][i + 1] = progs[r][i + 1], progs[r][i]
                yield dataclasses.replace(plan, programs=tuple(map(tuple, progs)))
            continue
        elif how == 5 and hasattr(op, "dst"):
            d = op.dst
            op = dataclasses.replace(op, dst=ChunkRef(d.buf, max(0, d.offset - 1), d.count))
        else:
            continue
        progs[r][i] = op
        yield dataclasses.replace(plan, programs=tuple(map(tuple, progs)))


@pytest.mark.parametrize("kind", KINDS)
def test_injected_faults_never_pass_natively_alone(kind, monkeypatch):
    rng = random.Random(kind)
    plan = _lowered(kind, n=5, elems=40, chunk=16)
    rejected = 0
    for bad in _mutants(plan, rng, 150):
        try:
            ok = python_ok(bad, monkeypatch)
        except Exception:  # a mutant the earlier checks refuse outright (PlanError)
            continue
        got = native(bad)
        assert got == ok or (ok and not got), "the native pass accepted a plan the Python checks reject"
        rejected += not ok
        if ok:  # a harmless mutation: the native pass should still take it
            assert got
    assert rejected >= 10


def test_hand_faults_fall_back_and_are_named():
    # a double-counted reduction: the native pass declines, the Python checks name it
    plan = reduce2(extra1=[Send(0, 1, R("in", 0, 4))], extra0=[RecvReduce(1, 1, R("out", 0, 4), (1,))])
    assert not native(plan)
    with pytest.raises(VerifyError, match="twice"):
        V.verify(plan)
    # two shifts in one element: valid, not represented natively, accepted by Python
    p0 = [Recv(1, 0, R("out", 0, 2)), Recv(1, 1, R("out", 2, 2))]
    p1 = [Send(0, 0, R("in", 2, 2)), Send(0, 1, R("in", 0, 2))]
    swapped = make("broadcast", [p0, p1], elems=4, root=1)
    with pytest.raises(VerifyError):
        V.verify(swapped)
    assert not native(swapped)


def _levels(kind: str, src: str = NICS, chunk: int = 800):
    from hcc.compiler.levels import levels_plan, plan_levels

    spec, topo = load(src, "size = 8008 B  dtype = float64", kind, "op = sum" if kind != "allgather" else "")
    return levels_plan(spec, topo, plan_levels(topo, spec.ranks), chunk)


def _laminar(plan) -> bool:
    return all(V._laminar(rs) for p in plan.programs for rs in V._buffer_ranges(p).values())


@pytest.mark.parametrize("kind", ["allgather", "reduce_scatter", "allreduce"])
@pytest.mark.parametrize("src", [NICS, RACKS])
def test_two_level_plans_pass_natively(kind, src, monkeypatch):
    # compiler/levels.py's plans name ranges that overlap without nesting (a lane's share
    # across two ranks' blocks): the native pass takes them, slot by elementary range
    plan = _levels(kind, src)
    assert not _laminar(plan)
    assert python_ok(plan, monkeypatch) and native(plan)


@pytest.mark.parametrize("kind", ["allgather", "allreduce"])
def test_injected_faults_in_overlapping_ranges_never_pass_natively_alone(kind, monkeypatch):
    rng = random.Random("levels" + kind)
    plan = _levels(kind, chunk=4000)
    assert native(plan)  # the unmutated plan passes natively: a pass that refused everything fails here
    rejected = 0
    for bad in _mutants(plan, rng, 60):
        try:
            ok = python_ok(bad, monkeypatch)
        except Exception:
            continue
        got = native(bad)
        assert ok or not got, "the native pass accepted a plan the Python checks reject"
        rejected += not ok
    assert rejected >= 5


def test_overlapping_ranges_by_hand():
    # rank 0 sends out[0:4] and out[2:6]; rank 1 receives both into the same places: the two
    # receives overlap on [2:4] without nesting
    def bcast(ordered: bool):
        p0 = [Copy(R("in", 0, 6), R("out", 0, 6)), Send(1, 0, R("out", 0, 4), (0,)), Send(1, 1, R("out", 2, 4), (0,))]
        p1 = [Recv(0, 0, R("out", 0, 4)), Recv(0, 1, R("out", 2, 4), (0,) if ordered else ())]
        return make("broadcast", [p0, p1], elems=6, root=0)

    V.verify(bcast(True))
    assert native(bcast(True))
    with pytest.raises(VerifyError, match="data race on rank 1"):  # two writers of [2:4], unordered
        V.verify(bcast(False))
    assert not native(bcast(False))
    # two reductions into out[0:4] and out[2:6] of one input: [2:4] counts rank 1 twice
    p0 = [Copy(R("in", 0, 6), R("out", 0, 6)), RecvReduce(1, 0, R("out", 0, 4), (0,)),
          RecvReduce(1, 1, R("out", 2, 4), (0,))]
    p1 = [Send(0, 0, R("in", 0, 4)), Send(0, 1, R("in", 2, 4))]
    twice = make("reduce", [p0, p1], elems=6, op="sum", root=0)
    with pytest.raises(VerifyError, match="twice"):
        V.verify(twice)
    assert not native(twice)
    # the same reductions over [0:4] and [4:6] under a copy of [0:6]: nested, and right
    p0 = [Copy(R("in", 0, 6), R("out", 0, 6)), RecvReduce(1, 0, R("out", 0, 4), (0,)),
          RecvReduce(1, 1, R("out", 4, 2), (0,))]
    p1 = [Send(0, 0, R("in", 0, 4)), Send(0, 1, R("in", 4, 2))]
    nested = make("reduce", [p0, p1], elems=6, op="sum", root=0)
    V.verify(nested)
    assert native(nested)
    # a message over two blocks of different owners lands in one range of the receiver
    # (rank 1 forwards rank 0's block and its own in one send): two values, one per block
    p0 = [Copy(R("in", 0, 2), R("out", 0, 2)), Send(1, 0, R("out", 0, 2), (0,)), Recv(1, 1, R("out", 2, 4))]
    p1 = [Copy(R("in", 0, 2), R("out", 2, 2)), Recv(0, 0, R("out", 0, 2)),
          Send(0, 1, R("out", 2, 2), (0,)), Send(2, 2, R("out", 0, 4), (0, 1))]
    p2 = [Copy(R("in", 0, 2), R("out", 4, 2)), Recv(1, 2, R("out", 0, 4)),
          Send(0, 3, R("out", 4, 2), (0,)), Send(1, 4, R("out", 4, 2), (0,))]
    p0.append(Recv(2, 3, R("out", 4, 2)))
    p1.append(Recv(2, 4, R("out", 4, 2)))
    p0[2] = Recv(1, 1, R("out", 2, 2))
    ag = make("allgather", [p0, p1, p2], elems=6)
    V.verify(ag)
    assert native(ag)
