"""The reduce as its broadcast replayed backwards (compiler/replay.py, candidate ``replay``):
the plans verify and compute what numpy computes for every root and op; where every rank
pair has one path, the reduce takes exactly the simulated time of the broadcast it replays
(over the transposed topology, whose two directions differ here); a broadcast it cannot
reverse gives no plan; auto keeps it only where it is the fastest candidate. No timing."""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

import hcc
from hcc.compiler.cost import DEFAULT_MODEL, simulate
from hcc.compiler.pipeline import compile_unit
from hcc.compiler.replay import reversed_broadcast
from hcc.ir.plan import ChunkRef, Recv, Scale
from hcc.ir.verify import verify

from test_lower import check_numeric


def lopsided(n: int = 5, seed: int = 3) -> str:
    """A ring plus chords, each direction of a pair its own capacity (1-8 GB/s) and latency."""
    rng = random.Random(seed)
    pairs = {tuple(sorted((i, (i + 1) % n))) for i in range(n)}
    while len(pairs) < 2 * n - 2:
        a, b = rng.sample(range(n), 2)
        pairs.add(tuple(sorted((a, b))))
    out = ["topology t {", f"  node r[0..{n - 1}]"]
    for a, b in sorted(pairs):
        for x, y in ((a, b), (b, a)):
            out.append(f"  r{x} -> r{y} : {rng.choice((1, 2, 4, 8))} GB/s, {rng.randint(1, 5)} us")
    return "\n".join(out + ["}"]) + "\n"


def program(body: str, src: str | None = None):
    return hcc.load((src or lopsided()) + "collective c = reduce on t { " + body + " }\n"
                    + "collective b = broadcast on t { " + body.split("op =")[0] + " }\n")


def source_broadcast(prog, name: str = "b"):
    """The plan of ``prog``'s ``name`` (its broadcast ``b`` by default, or its allgather ``a``)
    over the transposed topology: what replay compiles and runs backwards."""
    tops = dict(prog.topologies)
    tops["t"] = prog.topologies["t"].transposed()
    return compile_unit(replace(prog, topologies=tops), name).plan


@pytest.mark.parametrize("root", [0, 3])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_replayed_reduce_verifies_and_computes(root, op):
    prog = program(f"size = 4008 B  dtype = float64  root = r{root}  chunk = 800 B  op = {op}")
    spec = prog.collective("c")
    b = source_broadcast(prog)
    from hcc.compiler.replay import PACINGS

    for per_tree, window, gate in PACINGS:
        plan = reversed_broadcast(spec, prog.topology_of(spec), b, DEFAULT_MODEL, per_tree=per_tree,
                                  window=window, gate=gate)
        assert plan is not None and plan.kind == "reduce" and plan.root == root
        verify(plan)
        check_numeric(plan, seed=root + window)


def test_one_path_per_pair_replays_the_broadcast_time_exactly():
    """Paced one message per pair (the time gate alone: within 2 %)."""
    for seed in range(3):
        prog = program("size = 64 MiB  root = r1  op = sum", lopsided(6, seed))
        spec = prog.collective("c")
        b = source_broadcast(prog)
        plan = reversed_broadcast(spec, prog.topology_of(spec), b, DEFAULT_MODEL)
        assert simulate(plan).time == pytest.approx(simulate(b).time, rel=1e-9)
        assert simulate(plan).messages == simulate(b).messages
        gated = reversed_broadcast(spec, prog.topology_of(spec), b, DEFAULT_MODEL, window=0, gate=True)
        assert simulate(b).time <= simulate(gated).time * (1 + 1e-9) <= 1.02 * simulate(b).time


def test_a_broadcast_it_cannot_reverse_gives_no_plan():
    prog = program("size = 4008 B  dtype = float64  root = r0  chunk = 800 B  op = sum")
    spec = prog.collective("c")
    b = source_broadcast(prog)
    topo = prog.topology_of(spec)
    assert reversed_broadcast(spec, topo, b, DEFAULT_MODEL) is not None
    r = next(r for r, p in enumerate(b.programs) if any(type(op) is Recv for op in p))
    # an op other than a message or a copy (a scaling): not reversible
    progs = list(b.programs)
    progs[r] = progs[r] + (Scale(ChunkRef("out", 0, 1), 2),)
    assert reversed_broadcast(spec, topo, replace(b, programs=tuple(progs)), DEFAULT_MODEL) is None
    # a message that lands outside ``out``
    progs = list(b.programs)
    i = next(i for i, op in enumerate(progs[r]) if type(op) is Recv)
    progs[r] = progs[r][:i] + (replace(progs[r][i], dst=replace(progs[r][i].dst, buf="tmp")),) + progs[r][i + 1:]
    assert reversed_broadcast(spec, topo, replace(b, programs=tuple(progs)), DEFAULT_MODEL) is None


def test_auto_keeps_the_fastest_candidate_and_replay_is_one():
    prog = program("size = 64 MiB  root = r2  op = sum", lopsided(6, 1))
    u = compile_unit(prog, "c")
    times = {c.algorithm: c.predicted_s for c in u.candidates}
    assert "replay" in times
    assert u.plan.figures.predicted_s == pytest.approx(min(times.values()))
    # never under the bound: the reduce's cut over the original links
    assert u.plan.figures.predicted_s >= u.plan.figures.bound_s


def test_over_one_switch_only_where_named():
    """Over one switch (the local runtime's star) auto does not offer it; named, it runs."""
    from hcc.plan_cache import star_topology

    src = star_topology(4, shm=True) + "collective c = reduce on hcc_star { size = 16 MiB op = sum ALG }\n"
    u = compile_unit(hcc.load(src.replace("ALG", "")), "c")
    assert u.candidate("replay") is None
    plan = compile_unit(hcc.load(src.replace("ALG", "algorithm = replay")), "c").plan
    assert plan.algorithm == "replay"
    verify(plan)


def test_a_broadcast_that_does_not_compile_leaves_the_other_forms(monkeypatch):
    """The broadcast's compile failing (a limit) drops the replayed form, not the reduce; a
    broadcast plan the verifier refuses is reported."""
    from hcc.compiler import pipeline
    from hcc.ir.errors import VerifyError

    prog = program("size = 64 MiB  root = r2  op = sum", lopsided(6, 1))

    def refuse(self, program, name):
        raise pipeline.CompileError(f"{name}: no algorithm could be lowered")

    monkeypatch.setattr(pipeline.Unit, "compile_other", refuse)
    u = compile_unit(prog, "c")
    assert u.candidate("replay") is None and u.plan.kind == "reduce"

    def wrong(self, program, name):
        raise VerifyError("rank 0: out[0:4) never written")

    monkeypatch.setattr(pipeline.Unit, "compile_other", wrong)
    with pytest.raises(VerifyError):
        compile_unit(prog, "c")


def scatter_program(body: str, src: str | None = None):
    return hcc.load((src or lopsided()) + "collective c = reduce_scatter on t { " + body + " }\n"
                    + "collective a = allgather on t { " + body.split("op =")[0] + " }\n")


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_replayed_reduce_scatter_verifies_and_computes(op):
    """A reduce-scatter as its allgather backwards: partial sums gather in tmp, each rank's own
    block lands in its out; every pacing verifies and computes what numpy computes."""
    prog = scatter_program(f"size = 4000 B  dtype = float64  chunk = 160 B  op = {op}  algorithm = treepack")
    spec = prog.collective("c")
    a = source_broadcast(prog, "a")
    from hcc.compiler.replay import PACINGS

    for per_tree, window, gate in PACINGS:
        plan = reversed_broadcast(spec, prog.topology_of(spec), a, DEFAULT_MODEL, per_tree=per_tree,
                                  window=window, gate=gate)
        assert plan is not None and plan.kind == "reduce_scatter"
        verify(plan)
        check_numeric(plan, seed=window)


def test_one_path_per_pair_replays_the_allgather_time_exactly():
    for seed in range(2):
        prog = scatter_program("size = 64 MiB  op = sum  algorithm = treepack", lopsided(6, seed))
        spec = prog.collective("c")
        a = source_broadcast(prog, "a")
        plan = reversed_broadcast(spec, prog.topology_of(spec), a, DEFAULT_MODEL)
        assert simulate(plan).time == pytest.approx(simulate(a).time, rel=1e-9)
        assert simulate(plan).messages == simulate(a).messages


def test_auto_offers_the_reduce_scatter_replay_of_its_own_allgathers_only():
    """auto prices the replay where the allgather it compiles is one of the compiler's own
    schedules and keeps the fastest (here the replayed tree packing, 6.41 ms against 6.76
    for the in-trees); where that allgather is NCCL's rings (the demo) there is no replay:
    its reverse is the rings' own reduce-scatter, priced already."""
    prog = scatter_program("size = 64 MiB  op = sum", lopsided(6, 3))
    u = compile_unit(prog, "c")
    assert source_broadcast(prog, "a").algorithm == "treepack"
    times = {c.algorithm: c.predicted_s for c in u.candidates}
    assert u.plan.algorithm == "replay" and times["replay"] < times["treepack"]
    assert u.plan.figures.predicted_s == pytest.approx(min(times.values()))
    assert u.plan.figures.predicted_s >= u.plan.figures.bound_s
    demo = hcc.load(Path(__file__).resolve().parent.parent / "samples" / "demo.hcl")
    assert compile_unit(demo, "allgather").plan.algorithm == "rings"
    assert compile_unit(demo, "reduce_scatter").candidate("replay") is None


def test_the_broadcasts_narrow_link_form_is_replayed_where_it_replays_exactly():
    """The 7-GPU DGX-1 fragment 0-6's reduce to gpu4 at 256 MiB: its broadcast compiled as
    ``hcc compile`` compiles it (lower.NARROWING, the narrow-link form priced) replays in that
    broadcast's own time; compiled without the form, no pacing replays it in its own time and
    the best is slower. replayed_reduce replays both and keeps the faster, and the reduce
    ``hcc compile`` gives runs in its broadcast's time."""
    from hcc.compiler.lower import NARROWING
    from hcc.compiler.replay import PACINGS, replayed_reduce

    dgx = (Path(__file__).resolve().parents[1] / "samples" / "dgx1.hcl").read_text().split("\ncollective")[0]
    prog = hcc.load(dgx + "\ncollective c = reduce on dgx1 { size = 256 MiB  ranks = gpu[0..6]  root = gpu4"
                          "  op = sum }\ncollective b = broadcast on dgx1 { size = 256 MiB  ranks = gpu[0..6]"
                          "  root = gpu4 }\n")
    spec = prog.collective("c")
    topo = prog.topology_of(spec)
    tops = dict(prog.topologies)
    tops["dgx1"] = topo.transposed()
    turned = replace(prog, topologies=tops)
    best = {}
    for narrowing in (True, False):
        token = NARROWING.set(narrowing)
        try:
            b = compile_unit(turned, "b").plan
        finally:
            NARROWING.reset(token)
        best[narrowing] = (simulate(b).time, min(
            simulate(reversed_broadcast(spec, topo, b, DEFAULT_MODEL, per_tree=p, window=w, gate=g)).time
            for p, w, g in PACINGS))
    assert best[True][1] == pytest.approx(best[True][0], rel=1e-9)  # exact: the broadcast's own time
    assert best[False][1] > best[False][0] * (1 + 1e-9) and best[False][1] > best[True][1] * 1.002
    calls = []
    got = replayed_reduce(prog, spec, topo, DEFAULT_MODEL, lambda p, name: calls.append(name) or compile_unit(p, name).plan)
    assert got is not None and got[1].time == pytest.approx(best[True][1], rel=1e-9) and len(calls) == 2
    verify(got[0])
    plan = compile_unit(prog, "c").plan
    assert plan.algorithm == "replay" and plan.figures.predicted_s == pytest.approx(best[True][1], rel=1e-9)


def test_one_broadcast_compile_where_no_tree_has_a_narrower_link():
    """Every link of one capacity: the narrow-link form is never priced, so the broadcast with
    it would be the same compile, and replayed_reduce compiles it once; with capacities that
    differ it compiles both."""
    from hcc.compiler.replay import replayed_reduce

    ring = "topology t {\n  node r[0..4]\n" + "".join(
        f"  r{i} <-> r{(i + 1) % 5} : 4 GB/s, 1 us\n" for i in range(5)) + "  r0 <-> r2 : 4 GB/s, 1 us\n}\n"
    for src, want in ((ring, 1), (lopsided(6, 1), 2)):
        prog = program("size = 64 MiB  root = r1  op = sum", src)
        spec = prog.collective("c")
        calls = []
        got = replayed_reduce(prog, spec, prog.topology_of(spec), DEFAULT_MODEL,
                              lambda p, name: calls.append(name) or compile_unit(p, name).plan)
        assert got is not None and len(calls) == want
        verify(got[0])
