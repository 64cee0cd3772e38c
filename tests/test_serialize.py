"""The plan file (ir/serialize.py, docs/plan-format.md): exact round trips, a stable digest,
compact ops, and a clear PlanError for every kind of bad file."""
from __future__ import annotations

import dataclasses
import json
from collections import namedtuple

import pytest

from hcc.compiler.baselines import dbtree_plan, ring_plan
from hcc.compiler.lower_relax import relax_plan
from hcc.compiler.lower import lower
from hcc.compiler.program import CollectiveSpec
from hcc.ir.errors import PlanError, VerifyError
from hcc.ir.plan import ChunkRef, Copy, Figures, Plan, Recv, RecvReduce, Scale, Send
from hcc.ir.serialize import digest, dumps, load, loads, save, summary
from hcc.ir.topology import Link, Topology

PT = namedtuple("PT", "root edges rate")


def names(n):
    return tuple(f"g{i}" for i in range(n))


def topo(n):
    v = names(n)
    return Topology("mesh", v, ("sw",), tuple(Link(a, b, 2.5e10, 1e-6) for a in v for b in v if a != b)
                    + (Link("g0", "sw", 1e9),), hosts=(("g0", "h0"),))


def spec(kind, n=4, elems=40, op=None, root=-1, **kw):
    return CollectiveSpec("grads", kind, "mesh", names(n), root, elems * 4, "float32", op, **kw)


def tree_plan(kind="allreduce", op="avg"):
    n = 4
    v = names(n)
    trees = [PT("g0", (("g0", "g1", ("g0", "g1")), ("g1", "g2", ("g1", "g2")), ("g0", "g3", ("g0", "g3"))), 2.0),
             PT("g0", tuple(("g0", c, ("g0", c)) for c in v[1:]), 1.0)]
    plan = lower(spec(kind, op=op, root=0 if kind in ("broadcast", "reduce") else -1,
                      adaptive=True, on_failure="continue"), topo(n), trees, 24)
    figs = Figures(rate_Bps=3e10, bound_rate_Bps=3.1e10, predicted_s=1.5e-6, bound_s=1.3e-6,
                   efficiency=1.3 / 1.5, ring_predicted_s=2e-6, tree_predicted_s=2.5e-6,
                   compile_s=0.0123, wire_bytes=480, algbw_Bps=1e8, busbw_Bps=1.5e8)
    return dataclasses.replace(plan, figures=figs)


def plans():
    yield tree_plan()
    yield tree_plan("broadcast", None)
    yield ring_plan(spec("allgather"), topo(4), 16)
    yield dbtree_plan(spec("reduce_scatter", op="max"), topo(4), 16)
    yield ring_plan(spec("allreduce", op="sum"), topo(4), 16)
    # shift_one's pairing changes every step: the plan carries steps 0 and 1 (period n/2)
    yield relax_plan(spec("neighbor_average", op="avg", peers="shift_one"), topo(4), 16)


@pytest.mark.parametrize("plan", list(plans()), ids=lambda p: f"{p.kind}-{p.algorithm}")
def test_round_trip_is_exact(plan, tmp_path):
    plan.verify()
    again = loads(dumps(plan), "x.json")
    assert again == plan  # frozen-dataclass equality: every field, op and float
    path = tmp_path / "plan.json"
    save(plan, path)
    assert load(path) == plan
    assert plan.to_json() == dumps(plan) and Plan.load(path) == plan
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary left behind
    assert digest(again) == digest(plan)


def test_roundtrip_copy_and_scale_encode():
    n = 2
    progs = (
        (Copy(ChunkRef("in", 0, 4), ChunkRef("out", 0, 4)),
         RecvReduce(1, 0, ChunkRef("out", 0, 4), (0,)),
         Scale(ChunkRef("out", 0, 4), 2, (1,)),
         Send(1, 0, ChunkRef("out", 0, 4), (2,)),
         Copy(ChunkRef("out", 0, 4), ChunkRef("out", 0, 4), (3,), roundtrip=True)),
        (Send(0, 0, ChunkRef("in", 0, 4)),
         Recv(0, 0, ChunkRef("out", 0, 4), (0,))),
    )
    plan = Plan("c", "allreduce", names(n), -1, 16, "float32", "avg", "hand", 16, (), progs,
                (0, 0), topo(n), compress="int8")
    plan.verify()
    text = dumps(plan)
    assert loads(text) == plan
    ops = json.loads(text)["programs"][0]
    assert ops[0] == [3, 0, 0, 1, 0, 4]  # copy in[0:4] -> out[0:4], no deps
    assert ops[1] == [2, 1, 0, 1, 0, 4, -1, -1, 0]  # recv_reduce from 1, tag 0, out, dep 0
    assert ops[2] == [5, 1, 0, 4, 2, 1]  # scale out[0:4] by 1/2 after op 1
    assert ops[4][0] == 6  # copy_roundtrip


def test_digest_is_stable_and_ignores_figures():
    plan = tree_plan()
    d = digest(plan)
    assert len(d) == 16 and int(d, 16) >= 0
    assert digest(tree_plan()) == d  # rebuilding the same plan gives the same id
    assert digest(dataclasses.replace(plan, figures=Figures(compile_s=9.0))) == d
    progs = list(plan.programs)
    progs[0] = progs[0][:-1] + (dataclasses.replace(progs[0][-1], deps=()),)
    assert digest(dataclasses.replace(plan, programs=tuple(progs))) != d
    assert plan.digest() == d


def test_summary_keys():
    s = summary(tree_plan())
    assert set(s) >= {"name", "kind", "ranks", "size_bytes", "algorithm", "trees", "chunk_bytes",
                      "rate_Bps", "bound_rate_Bps", "predicted_s", "bound_s", "efficiency",
                      "ring_predicted_s", "compile_s", "wire_bytes", "algbw_Bps", "busbw_Bps",
                      "dtype", "op", "compress"}
    assert (s["ranks"], s["trees"], s["kind"], s["op"]) == (4, 2, "allreduce", "avg")
    assert s["efficiency"] == pytest.approx(1.3 / 1.5)
    json.dumps(s)  # plain JSON values


def test_ops_are_compact():
    n = 32
    v = names(n)
    t = Topology("m", v, links=tuple(Link(a, b, 1e9) for a in v for b in v if a != b))
    trees = [PT(v[j], tuple((v[j], v[c], (v[j], v[c])) for c in range(n) if c != j), 1.0)
             for j in range(n)]
    plan = lower(CollectiveSpec("ag", "allgather", "m", v, -1, 4 * n * 40, "float32"), t, trees, 16)
    ops = sum(len(p) for p in plan.programs)
    assert ops > 15_000
    text = dumps(plan)
    assert len(text) / ops < 40  # bytes per op: a 100k-op plan stays ~4 MB


def write(tmp_path, obj_or_text, name="plan.json"):
    p = tmp_path / name
    p.write_text(obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text))
    return p


def bad(tmp_path, obj_or_text, *fragments):
    p = write(tmp_path, obj_or_text)
    with pytest.raises(PlanError) as e:
        load(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: error: "), msg
    for f in fragments:
        assert f in msg, msg
    return e.value


def good_dict():
    return json.loads(dumps(tree_plan()))


def test_other_version(tmp_path):
    d = good_dict()
    d["version"] = 7
    bad(tmp_path, d, "plan format version 7 is not supported (this hcc reads version 1)")
    d["version"] = "1"
    bad(tmp_path, d, 'plan format version "1" is not supported')


def test_other_format(tmp_path):
    d = good_dict()
    d["format"] = "msccl"
    bad(tmp_path, d, "not an hcc plan file (format \"msccl\", expected 'hcc-plan')")
    bad(tmp_path, [1, 2], "top level is not a JSON object")


def test_truncated_and_not_json(tmp_path):
    text = dumps(tree_plan())
    bad(tmp_path, text[: len(text) // 2], "not a valid plan file", "truncated")
    bad(tmp_path, "", "not a valid plan file")
    p = tmp_path / "bin.json"
    p.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PlanError, match="not UTF-8"):
        load(p)
    with pytest.raises(PlanError, match="cannot read the plan file"):
        load(tmp_path / "missing.json")


def test_malformed_fields(tmp_path):
    d = good_dict()
    del d["programs"]
    bad(tmp_path, d, "plan file has no field 'programs'")
    d = good_dict()
    d["root"] = True
    bad(tmp_path, d, "field 'root' must be an integer")
    d = good_dict()
    d["trees"][0]["span"] = [0]
    bad(tmp_path, d, "field 'trees[0].span' must be [lo, hi]")
    d = good_dict()
    d["figures"]["predicted_s"] = "fast"
    bad(tmp_path, d, "field 'figures.predicted_s' must be a number")
    d = good_dict()
    d["topology"] = {"name": "x"}
    bad(tmp_path, d, "plan file has no field 'topology.nodes'")
    d = good_dict()
    d["programs"][1][0] = [9, 1, 2]
    bad(tmp_path, d, "programs[1][0]: unknown opcode 9")
    d = good_dict()
    d["programs"][1][0] = [0, 1, 2]
    bad(tmp_path, d, "programs[1][0]: a send needs 8 fields before its deps, got 3")
    d = good_dict()
    d["programs"][1][0] = [0, 1, 2, 3.5]
    bad(tmp_path, d, "programs[1][0]: an op must be a non-empty list of integers")
    d = good_dict()
    d["programs"][1][0][3] = 7
    bad(tmp_path, d, "buffer code 7 is not 0 (in), 1 (out) or 2 (tmp)")


def test_a_plan_that_fails_verification_is_rejected_on_load(tmp_path):
    d = good_dict()
    d["programs"][2] = []  # rank 2 drops every op: what its parent sends it is never received
    e = bad(tmp_path, d, "has no matching recv on rank 2")
    assert isinstance(e, VerifyError) and e.rank >= 0 and e.source.endswith("plan.json")


def test_optional_fields_default(tmp_path):
    d = good_dict()
    for k in ("figures", "compress", "on_failure", "adaptive", "peers"):
        del d[k]
    d["unknown_future_field"] = 1
    plan = load(write(tmp_path, d))
    assert (plan.compress, plan.on_failure, plan.adaptive, plan.figures) == ("none", "abort", False, Figures())


def test_figures_read_as_plan_attributes():
    from pathlib import Path

    import hcc

    demo = Path(__file__).resolve().parent.parent / "samples" / "demo.hcl"
    plan = hcc.compile(hcc.load(demo), "broadcast")
    for name in ("rate_Bps", "bound_rate_Bps", "predicted_s", "bound_s", "efficiency",
                 "ring_predicted_s", "compile_s", "algbw_Bps", "busbw_Bps", "wire_bytes"):
        assert getattr(plan, name) == getattr(plan.figures, name)
    assert 0 < plan.efficiency <= 1 and plan.bound_s <= plan.predicted_s
    with pytest.raises(AttributeError):
        plan.no_such_figure


@pytest.mark.parametrize("plan", list(plans())[:3], ids=lambda p: f"{p.kind}-{p.algorithm}")
def test_pickle_leaves_the_process_caches_behind(plan):
    """A plan pickles (Ray ships plans to actors) without what a process memoized on it, and
    the runtime's own state (schedules, bound MPI runs) is never on the plan at all: it is
    kept beside it (backends/state.py) and goes when the plan goes."""
    import gc
    import pickle

    from hcc.backends.executor import schedule
    from hcc.backends.state import peek

    plan.digest()
    plan.buffer_elems(0)
    sched = schedule(plan, 0, plan.programs[0], 2)
    assert peek(plan).schedules[0, 2] is sched  # kept beside the plan ...
    assert schedule(plan, 0, plan.programs[0], 2) is sched
    assert not [k for k in vars(plan) if k.startswith("_") and k not in ("_digest", "_buffer_elems",
                                                                          "_largest_message")]
    back = pickle.loads(pickle.dumps(plan))
    assert back == plan and dumps(back) == dumps(plan)
    assert not [k for k in vars(back) if k.startswith("_")]
    assert back.digest() == plan.digest()
    assert peek(back) is None  # ... and not carried along
    copy = pickle.loads(pickle.dumps(plan))
    schedule(copy, 0, copy.programs[0], 2)
    import hcc.backends.state as state

    held = len(state._STATES)
    del copy
    gc.collect()
    assert len(state._STATES) == held - 1  # the state went with its plan

# ---- numbers held to the language's limits on load (issue 21) --------------------------------

def test_topology_numbers_are_validated_on_load(tmp_path):
    """A negative latency made simulate/viz/run loop forever (routing cycles on negative arcs),
    a zero capacity raised ZeroDivisionError, a NaN loaded and failed later: each is refused
    when the file is read, naming the field."""
    for value, fragment in ((-1e-6, "latency -1e-06 is outside 0 .. 3600 s"),
                            (4000.0, "latency 4000.0 is outside 0 .. 3600 s")):
        d = good_dict()
        d["topology"]["links"][0][3] = value
        bad(tmp_path, d, "field 'topology.links[0]' " + fragment)
    for value, fragment in ((0, "capacity 0 is outside 1 .. 10^18 B/s"),
                            (-5.0, "capacity -5.0 is outside"), (1e19, "capacity 1e+19 is outside"),
                            (True, "capacity true is outside")):
        d = good_dict()
        d["topology"]["links"][0][2] = value
        bad(tmp_path, d, "field 'topology.links[0]' " + fragment)
    d = good_dict()
    d["topology"]["links"][0][1] = "nowhere"
    bad(tmp_path, d, "names vertex 'nowhere', which the topology does not declare")
    d = good_dict()
    d["topology"]["links"][0][1] = d["topology"]["links"][0][0]
    bad(tmp_path, d, "is a link from 'g0' to itself")
    d = good_dict()
    d["topology"]["nodes"].append("g1")
    bad(tmp_path, d, "vertex 'g1' is declared twice")
    d = good_dict()
    d["ranks"][0] = "sw"
    bad(tmp_path, d, "field 'ranks' names 'sw', which is not a node")
    d = good_dict()
    d["size_bytes"] = 1 << 60
    bad(tmp_path, d, "field 'size_bytes' is 1152921504606846976; a size is 0 .. 2^50 B")
    d = good_dict()
    d["trees"][0]["rate"] = -1.0
    bad(tmp_path, d, "field 'trees[0].rate' is -1.0")


def test_nan_infinity_and_huge_numbers_are_refused_by_the_reader(tmp_path):
    text = dumps(tree_plan())
    cap = json.dumps(good_dict()["topology"]["links"][0][2])
    assert text.count(cap) >= 1
    for token, fragment in (("NaN", "NaN is not a number a plan may hold"),
                            ("Infinity", "Infinity is not a number a plan may hold"),
                            ("-Infinity", "-Infinity is not a number a plan may hold"),
                            ("1e400", "number 1e400 is not finite as a float"),
                            ("1" + "0" * 5000, "(5001 digits) is too large: a plan's integers have at most 19")):
        bad(tmp_path, text.replace(cap, token, 1), fragment)


def test_a_4301_digit_integer_anywhere_is_a_plan_error_not_a_crash(tmp_path):
    d = good_dict()
    text = json.dumps(d).replace('"tmp_elems": [', '"tmp_elems": [' + "9" * 4301 + ",", 1)
    bad(tmp_path, text, "too large")


def test_load_refuses_a_non_path_with_a_typed_error():
    from hcc.grammar.errors import HccError

    for arg in (None, 3, ["plan.json"]):
        with pytest.raises(TypeError) as e:
            load(arg)
        assert isinstance(e.value, HccError) and "expected a path" in str(e.value)
        with pytest.raises(HccError):
            Plan.load(arg)


def test_save_refuses_a_non_path_with_a_typed_error(tmp_path):
    from hcc.ir.errors import ArgumentTypeError

    plan = tree_plan()
    for arg in (None, 3):
        with pytest.raises(ArgumentTypeError, match="expected a path"):
            save(plan, arg)
    assert list(tmp_path.iterdir()) == []
