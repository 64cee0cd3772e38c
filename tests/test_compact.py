"""The simulator's native loop over flat arrays (compiler/compact.py, compiler/_simcore.c)
against the reference Python loop (cost._simulate_py): the same Simulation, bit for bit, on
every candidate plan the compiler lowers for the small samples (trees, rings, recursive
doubling, direct, allreduce forms), under the default model and one that charges local ops;
and every malformed plan still reported in the reference's words."""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from hcc.compiler import compact, cost
from hcc.compiler.cost import CostModel
from hcc.compiler.pipeline import compile_unit
from hcc.compiler.frontend import load_program
from hcc.ir.errors import PlanError
from hcc.ir.plan import ChunkRef, Copy, Recv, RecvReduce, Send

from conftest import sample_unit
from test_cost import chain_broadcast, duplex, mkplan
from hcc.ir.topology import Topology

SAMPLES = Path(__file__).resolve().parent.parent / "samples"

pytestmark = pytest.mark.skipif(not compact.available(), reason="the native simulator is not built")

MODELS = (cost.DEFAULT_MODEL, CostModel(per_message_s=3e-6, reduce_Bps=5e9, copy_Bps=2e10))


def candidate_plans(sample: str):
    program = load_program(str(SAMPLES / sample))
    for c in program.collectives:
        if c.kind == "neighbor_average":
            continue
        u = sample_unit(Path(sample).stem, c.name)
        for cand in u.candidates:
            if any(cand.choice.plan.programs):
                yield f"{c.name}/{cand.algorithm}", cand.choice.plan
        yield f"{c.name}/chosen", u.plan


@pytest.mark.parametrize("sample", ["demo.hcl", "dgx1_fragmented.hcl", "hetero.hcl"])
def test_native_loop_matches_the_reference(sample):
    seen = 0
    for name, plan in candidate_plans(sample):
        for model in MODELS:
            ref = cost._simulate_py(plan, False, model)
            got = cost._simulate_native(plan, model)
            assert got == ref, (name, model)
            seen += 1
    assert seen >= 6


@pytest.mark.parametrize("compress", ["fp16", "int8"])
def test_compressed_wire_bytes_match(compress):
    topo = Topology("c", ("a", "b", "c"), links=duplex("a", "b", 2e9, 1e-6) + duplex("b", "c", 1e9, 2e-6))
    plan = replace(chain_broadcast(topo, "abc", 4096, 8), compress=compress)
    for model in MODELS:
        assert cost._simulate_native(plan, model) == cost._simulate_py(plan, False, model)


def test_random_dags_with_reductions_and_local_ops():
    """Random programs: sends in both directions over a triangle, receive-reductions, local
    copies, random extra dependencies on earlier ops; ties in ready time are frequent (zero
    latency links), so the FIFO and heap orders must agree exactly."""
    rng = random.Random(7)
    topo = Topology("tri", ("a", "b", "c"),
                    links=duplex("a", "b", 1e9) + duplex("b", "c", 3e9, 1e-6) + duplex("a", "c", 2e9))
    for trial in range(30):
        progs = [[], [], []]
        tags: dict[tuple[int, int], int] = {}
        for k in range(rng.randint(5, 40)):
            a, b = rng.sample(range(3), 2)
            tag = tags.get((a, b), 0)
            tags[(a, b)] = tag + 1
            cnt = rng.choice((64, 256, 1000))
            sdeps = tuple(sorted(rng.sample(range(len(progs[a])), min(len(progs[a]), rng.randint(0, 2)))))
            rdeps = tuple(sorted(rng.sample(range(len(progs[b])), min(len(progs[b]), rng.randint(0, 2)))))
            progs[a].append(Send(b, tag, ChunkRef("in", 0, cnt), sdeps))
            cls = RecvReduce if rng.random() < 0.3 else Recv
            progs[b].append(cls(a, tag, ChunkRef("out", 0, cnt), rdeps))
            if rng.random() < 0.3:
                r = rng.randrange(3)
                deps = (len(progs[r]) - 1,) if progs[r] else ()
                progs[r].append(Copy(ChunkRef("in", 0, cnt), ChunkRef("tmp", 0, cnt), deps))
        plan = mkplan(topo, "abc", progs, 4000)
        for model in MODELS:
            try:
                ref = cost._simulate_py(plan, False, model)
            except PlanError as e:  # a random plan may deadlock: the same error either way
                with pytest.raises(PlanError, match="deadlock"):
                    cost.simulate(plan, model=model)
                assert "deadlock" in str(e)
                continue
            assert cost._simulate_native(plan, model) == ref, trial


def test_malformed_plans_keep_the_reference_errors():
    topo = Topology("p", ("a", "b"), links=duplex("a", "b", 1e9))
    send, recv = Send(1, 0, ChunkRef("in", 0, 10)), Recv(0, 0, ChunkRef("out", 0, 10))
    cases = [
        ([[send], []], "no matching receive"),
        ([[], [recv]], "no matching send"),
        ([[send], [Recv(0, 0, ChunkRef("out", 0, 5))]], "send of 10 elements but receive of 5"),
        ([[send, Send(1, 0, ChunkRef("in", 0, 10))], [recv, recv]], "two sends"),
        ([[Send(1, 0, ChunkRef("in", 0, 10), deps=(1,)), Recv(1, 0, ChunkRef("out", 0, 10))],
          [Send(0, 0, ChunkRef("in", 0, 10), deps=(1,)), Recv(0, 0, ChunkRef("out", 0, 10))]], "dependency"),
        ([[Recv(1, 0, ChunkRef("out", 0, 10)), Send(1, 0, ChunkRef("in", 0, 10), deps=(0,))],
          [Recv(0, 0, ChunkRef("out", 0, 10)), Send(0, 0, ChunkRef("in", 0, 10), deps=(0,))]], "deadlock"),
    ]
    for progs, msg in cases:
        plan = mkplan(topo, "ab", progs, 40)
        with pytest.raises(PlanError, match=msg):
            cost.simulate(plan)
        with pytest.raises(compact.Unsupported):
            cost._simulate_native(plan, cost.DEFAULT_MODEL)


@pytest.mark.parametrize("sample,name", [("dgx1.hcl", "allgather"), ("hetero.hcl", None)])
def test_compile_chooses_the_same_plan_as_the_reference_simulator(monkeypatch, sample, name):
    """A whole compile (every candidate, every chunk size priced) on the native loop and on the
    reference loop: the same algorithm, chunk size, programs and figures."""
    program = load_program(str(SAMPLES / sample))
    names = [name] if name else [c.name for c in program.collectives if c.kind != "neighbor_average"][:2]
    for n in names:
        fast = sample_unit(Path(sample).stem, n).plan  # the native loop's (test_golden's too)
        monkeypatch.setattr(compact, "_simcore", None)
        slow = compile_unit(program, n).plan
        monkeypatch.undo()
        assert (fast.algorithm, fast.chunk_bytes) == (slow.algorithm, slow.chunk_bytes)
        assert fast.digest() == slow.digest()
        assert replace(fast.figures, compile_s=0.0) == replace(slow.figures, compile_s=0.0)
