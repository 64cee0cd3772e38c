"""The numpy reference: each kind's result computed by hand on tiny inputs, and check()
rejecting a wrong element with its rank and index."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hcc.backends.kernels import to_float32
from hcc.backends.reference import ResultMismatch, check, expected, make_inputs
from hcc.ir.errors import PlanError
from hcc.ir.plan import neighbor_peers
from hcc.ir.plan import Plan
from hcc.ir.topology import Topology


def plan_of(kind, n=3, elems=6, dtype="int32", op=None, root=-1, peers=None) -> Plan:
    size = {"int32": 4, "float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "uint8": 1, "int8": 1}[dtype]
    return Plan(name="t", kind=kind, ranks=tuple(f"v{i}" for i in range(n)), root=root, size_bytes=elems * size,
                dtype=dtype, op=op, algorithm="test", chunk_bytes=size, trees=(), programs=((),) * n,
                tmp_elems=(0,) * n, topology=Topology("t", tuple(f"v{i}" for i in range(n))), peers=peers)


def test_inputs_have_layout_shapes_and_are_reproducible():
    p = plan_of("allgather", n=3, elems=10)
    a, b = make_inputs(p, 7), make_inputs(p, 7)
    assert [x.size for x in a] == [3, 3, 4]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(make_inputs(p, 8)[0], a[0])


def test_hand_computed_results():
    ins = [np.array([1, 2, 3, 4, 5, 6], np.int32) * (r + 1) for r in range(3)]
    ar = expected(plan_of("allreduce", op="sum"), ins)
    assert all(x.tolist() == [6, 12, 18, 24, 30, 36] for x in ar)
    red = expected(plan_of("reduce", op="max", root=1), ins)
    assert red[0] is None and red[2] is None and red[1].tolist() == [3, 6, 9, 12, 15, 18]
    rs = expected(plan_of("reduce_scatter", op="min"), ins)
    assert [x.tolist() for x in rs] == [[1, 2], [3, 4], [5, 6]]
    bc = expected(plan_of("broadcast", root=2), ins)
    assert all(x.tolist() == ins[2].tolist() for x in bc)
    sc = expected(plan_of("scatter", root=1), ins)
    assert [x.tolist() for x in sc] == [[2, 4], [6, 8], [10, 12]]
    a2a = expected(plan_of("alltoall"), ins)
    # rank 0 gets block 0 of every rank: [1,2], [2,4], [3,6]
    assert a2a[0].tolist() == [1, 2, 2, 4, 3, 6]
    blocks = [np.array([r, r], np.int32) for r in range(3)]
    ag = expected(plan_of("allgather"), blocks)
    assert all(x.tolist() == [0, 0, 1, 1, 2, 2] for x in ag)
    ga = expected(plan_of("gather", root=0), blocks)
    assert ga[0].tolist() == [0, 0, 1, 1, 2, 2] and ga[1] is None


def test_average_and_neighbor_average():
    ins = [np.full(4, r * 3.0, np.float32) for r in range(4)]
    av = expected(plan_of("allreduce", n=4, elems=4, dtype="float32", op="avg"), ins)
    assert av[0].tolist() == [4.5] * 4
    ring = expected(plan_of("neighbor_average", n=4, elems=4, dtype="float32", op="avg", peers="ring"), ins)
    assert ring[0].tolist() == [(0 + 9 + 3) / 3] * 4
    assert neighbor_peers("ring", 2, 0) == (1,)
    assert neighbor_peers("all", 4, 0) == (1, 2, 3)
    # shift_one pairs are mutual at every step
    for step in range(5):
        for r in range(6):
            (p,) = neighbor_peers("shift_one", 6, r, step)
            assert neighbor_peers("shift_one", 6, p, step) == (r,)
    with pytest.raises(PlanError, match="even rank count"):
        neighbor_peers("shift_one", 5, 0)


def test_check_names_rank_and_first_bad_index():
    p = plan_of("allreduce", n=2, elems=5, dtype="float32", op="sum")
    ins = make_inputs(p, 1)
    want = expected(p, ins)
    outs = [w.copy() for w in want]
    check(p, outs, want)
    outs[1][3] += 0.5
    with pytest.raises(ResultMismatch, match=r"rank 1: wrong result at element 3"):
        check(p, outs, want)


def test_float_tolerance_accepts_rounding_but_not_a_missing_contribution():
    p = plan_of("allreduce", n=4, elems=1000, dtype="bfloat16", op="avg")
    ins = make_inputs(p, 2)
    want = expected(p, ins)
    # sum in a different order in float32, then divide: rounding only
    acc = sum(to_float32(x, "bfloat16") for x in reversed(ins)) / 4
    from hcc.backends.kernels import from_float32
    check(p, [from_float32(acc, "bfloat16")] * 4, want)
    missing = sum(to_float32(x, "bfloat16") for x in ins[1:]) / 4
    with pytest.raises(ResultMismatch):
        check(p, [from_float32(missing, "bfloat16")] * 4, want)


def test_integer_products_do_not_overflow():
    p = plan_of("allreduce", n=8, elems=64, dtype="int32", op="prod")
    ins = make_inputs(p, 0)
    assert all(set(np.unique(x)) <= {-2, -1, 1, 2} for x in ins)
    assert np.abs(expected(p, ins)[0]).max() <= 2 ** 8
