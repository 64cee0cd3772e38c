"""The α-β event-driven simulator (compiler/cost.py) on hand-built plans whose times follow
from the model's formulas: cut-through paths, FIFO link sharing, pipelining, deadlock."""
from __future__ import annotations

import time

import pytest

from hcc.compiler.chunks import chunk_candidates, choose_chunk
from hcc.compiler.cost import (
    CostModel,
    least_latency,
    simulate,
    wire_bytes_of,
)
from hcc.ir.errors import PlanError
from hcc.ir.plan import ChunkRef, Copy, Plan, Recv, RecvReduce, Send, Tree
from hcc.ir.topology import Link, Topology

NO_OVERHEAD = CostModel(per_message_s=0.0)


def duplex(a, b, cap, lat=0.0):
    return (Link(a, b, cap, lat), Link(b, a, cap, lat))


def mkplan(topo, ranks, programs, size_bytes, trees=(), compress="none", kind="broadcast"):
    return Plan("t", kind, tuple(ranks), 0, size_bytes, "float32", None, "direct", size_bytes,
                tuple(trees), tuple(tuple(p) for p in programs), (0,) * len(ranks), topo,
                compress=compress)


def chain_broadcast(topo, ranks, elems, chunks):
    """Rank 0 -> 1 -> ... -> n-1, the buffer split in ``chunks`` pieces forwarded at once."""
    n = len(ranks)
    step = elems // chunks
    progs = [[] for _ in range(n)]
    for c in range(chunks):
        ref = lambda buf: ChunkRef(buf, c * step, step)
        progs[0].append(Send(1, c, ref("in"), tree=0, chunk=c))
        for r in range(1, n):
            progs[r].append(Recv(r - 1, c, ref("out"), tree=0, chunk=c))
            if r + 1 < n:
                progs[r].append(Send(r + 1, c, ref("out"), deps=(len(progs[r]) - 1,), tree=0, chunk=c))
    return mkplan(topo, ranks, progs, elems * 4)


def test_single_message_is_alpha_plus_bytes_over_capacity():
    topo = Topology("p", ("a", "b"), links=duplex("a", "b", 2e9, 3e-6))
    plan = mkplan(topo, "ab", [[Send(1, 0, ChunkRef("in", 0, 1000))], [Recv(0, 0, ChunkRef("out", 0, 1000))]], 4000)
    sim = simulate(plan, model=CostModel(per_message_s=1e-6))
    assert sim.time == pytest.approx(3e-6 + 4000 / 2e9 + 1e-6)
    assert sim.messages == 1 and sim.wire_bytes == 4000
    assert sim.link("a", "b").busy_s == pytest.approx(3e-6 + 1e-6 + 4000 / 2e9)


def test_pipelined_chain_costs_one_chunk_per_level():
    # the classic pipeline: (k + d - 1) x (α + chunk time) for k chunks over d hops
    cap, lat, n, k, elems = 1e9, 2e-6, 5, 16, 1 << 16
    names = [f"g{i}" for i in range(n)]
    links = sum((duplex(names[i], names[i + 1], cap, lat) for i in range(n - 1)), ())
    topo = Topology("chain", tuple(names), links=links)
    plan = chain_broadcast(topo, names, elems, k)
    beta = elems * 4 / k / cap
    expected = (k + n - 2) * (lat + beta)
    assert simulate(plan, model=NO_OVERHEAD).time == pytest.approx(expected, rel=1e-9)
    # unpipelined would be (n-1) x whole-buffer time: pipelining must be far faster
    assert expected < 0.4 * (n - 1) * elems * 4 / cap


def test_fifo_link_sharing_serialises_concurrent_messages():
    topo = Topology("p", ("a", "b"), links=duplex("a", "b", 1e9))
    progs = [[Send(1, 0, ChunkRef("in", 0, 500)), Send(1, 1, ChunkRef("in", 500, 500))],
             [Recv(0, 0, ChunkRef("out", 0, 500)), Recv(0, 1, ChunkRef("out", 500, 500))]]
    sim = simulate(mkplan(topo, "ab", progs, 4000), model=NO_OVERHEAD)
    assert sim.time == pytest.approx(4000 / 1e9)  # two 2000 B messages back to back
    assert sim.link("a", "b").utilisation == pytest.approx(1.0)


def test_switch_path_is_cut_through_at_the_bottleneck():
    links = (Link("a", "s", 4e9, 1e-6), Link("s", "b", 1e9, 2e-6), Link("b", "s", 1e9), Link("s", "a", 4e9))
    topo = Topology("sw", ("a", "b"), ("s",), links)
    plan = mkplan(topo, "ab", [[Send(1, 0, ChunkRef("in", 0, 250))], [Recv(0, 0, ChunkRef("out", 0, 250))]], 1000)
    sim = simulate(plan, model=NO_OVERHEAD, detail=True)
    assert sim.time == pytest.approx(3e-6 + 1000 / 1e9)  # Σα + bytes / min capacity
    assert [e.link for e in sim.events] == [("a", "s"), ("s", "b")]
    # the fast link is reserved only for its own share of capacity-time
    assert sim.link("a", "s").busy_s == pytest.approx(1e-6 + 1000 / 4e9)


def test_tree_paths_are_followed_and_reversed():
    # a -> b direct is slow, a -> s -> b fast; the tree says go through s
    links = duplex("a", "b", 1e6) + duplex("a", "s", 1e9) + duplex("s", "b", 1e9)
    topo = Topology("p", ("a", "b"), ("s",), links)
    tree = Tree(0, 0, (-1, 0), 1e9, (0, 250), paths=((), ("a", "s", "b")))
    up = mkplan(topo, "ab", [[Recv(1, 0, ChunkRef("out", 0, 250), tree=0)], [Send(0, 0, ChunkRef("in", 0, 250), tree=0)]],
                1000, trees=(tree,))
    sim = simulate(up, model=NO_OVERHEAD, detail=True)
    assert [e.link for e in sim.events] == [("b", "s"), ("s", "a")]
    assert sim.time == pytest.approx(1000 / 1e9)


def test_untreed_messages_take_the_fastest_route():
    links = duplex("a", "b", 1e6) + duplex("a", "s", 1e9) + duplex("s", "b", 1e9)
    topo = Topology("p", ("a", "b"), ("s",), links)
    plan = mkplan(topo, "ab", [[Send(1, 0, ChunkRef("in", 0, 250))], [Recv(0, 0, ChunkRef("out", 0, 250))]], 1000)
    assert simulate(plan, model=NO_OVERHEAD).time == pytest.approx(1000 / 1e9)


def test_nodes_outside_the_ranks_do_not_forward():
    # the only fast route crosses c, which is not a rank of this collective
    links = duplex("a", "b", 1e6) + duplex("a", "c", 1e9) + duplex("c", "b", 1e9)
    topo = Topology("p", ("a", "b", "c"), (), links)
    plan = mkplan(topo, "ab", [[Send(1, 0, ChunkRef("in", 0, 250))], [Recv(0, 0, ChunkRef("out", 0, 250))]], 1000)
    assert simulate(plan, model=NO_OVERHEAD).time == pytest.approx(1000 / 1e6)


def test_compressed_wire_bytes():
    topo = Topology("p", ("a", "b"), links=duplex("a", "b", 1e9))
    progs = [[Send(1, 0, ChunkRef("in", 0, 1000))], [Recv(0, 0, ChunkRef("out", 0, 1000))]]
    for compress, wire in (("none", 4000), ("fp16", 2000), ("int8", 1008)):
        sim = simulate(mkplan(topo, "ab", progs, 4000, compress=compress), model=NO_OVERHEAD)
        assert sim.wire_bytes == wire == wire_bytes_of(1000, 4, compress)
        assert sim.time == pytest.approx(wire / 1e9)


def test_deps_delay_and_local_op_costs():
    topo = Topology("p", ("a", "b"), links=duplex("a", "b", 1e9))
    progs = [[Copy(ChunkRef("in", 0, 1000), ChunkRef("out", 0, 1000)),
              Send(1, 0, ChunkRef("out", 0, 1000), deps=(0,))],
             [Copy(ChunkRef("in", 0, 1000), ChunkRef("out", 0, 1000)),
              RecvReduce(0, 0, ChunkRef("out", 0, 1000), deps=(0,))]]
    model = CostModel(per_message_s=0.0, copy_Bps=4e9, reduce_Bps=2e9)
    sim = simulate(mkplan(topo, "ab", progs, 4000, kind="reduce"), model=model)
    assert sim.time == pytest.approx(4000 / 4e9 + 4000 / 1e9 + 4000 / 2e9)
    assert sim.rank_finish[0] == pytest.approx(4000 / 4e9 + 4000 / 1e9)


def test_deadlock_and_unmatched_messages_raise():
    topo = Topology("p", ("a", "b"), links=duplex("a", "b", 1e9))
    ref = ChunkRef("out", 0, 10)
    cyc = [[Recv(1, 0, ref), Send(1, 1, ref, deps=(0,))], [Recv(0, 1, ref), Send(0, 0, ref, deps=(0,))]]
    with pytest.raises(PlanError, match="deadlock"):
        simulate(mkplan(topo, "ab", cyc, 40))
    with pytest.raises(PlanError, match="no matching receive"):
        simulate(mkplan(topo, "ab", [[Send(1, 0, ref)], []], 40))
    with pytest.raises(PlanError, match="no matching send"):
        simulate(mkplan(topo, "ab", [[], [Recv(0, 0, ref)]], 40))


def test_choose_chunk_finds_the_pipelining_optimum():
    # chain of 4 with α = 5 us: time(k) = (k + 2) (α + o + M/(k c)) is convex in k;
    # compare the search with the exact argmin over the same candidates
    cap, lat, n, elems = 1e9, 5e-6, 4, 1 << 18
    names = [f"g{i}" for i in range(n)]
    topo = Topology("chain", tuple(names), links=sum((duplex(names[i], names[i + 1], cap, lat) for i in range(n - 1)), ()))
    model = CostModel(per_message_s=1e-6)
    cands = chunk_candidates(elems * 4, 4)

    def formula(chunk):
        k = elems * 4 // chunk
        return (k + n - 2) * (lat + 1e-6 + chunk / cap)

    choice = choose_chunk(lambda c: chain_broadcast(topo, names, elems, elems * 4 // c), cands, model=model)
    best = min(cands, key=formula)
    assert choice.chunk_bytes == best
    assert choice.simulation.time == pytest.approx(formula(best))
    assert len(choice.tried) < len(cands)  # stopped once the time rose twice


def test_least_latency_bound_holds():
    names = ["a", "b", "c"]
    topo = Topology("p", tuple(names), links=duplex("a", "b", 1e9, 2e-6) + duplex("b", "c", 1e9, 7e-6))
    plan = chain_broadcast(topo, names, 4096, 4)
    assert least_latency(plan) == 2e-6
    # bandwidth bound of a broadcast on a chain is M / 1e9; plus min α stays below the simulation
    assert simulate(plan).time >= 4096 * 4 / 1e9 + least_latency(plan)


def test_simulator_speed_many_messages():
    # 8 ranks, ring-like all-pairs traffic, ~ 10k messages: must stay well under a second
    n, chunks = 8, 180
    names = [f"g{i}" for i in range(n)]
    links = sum((duplex(names[i], names[j], 25e9, 1e-6) for i in range(n) for j in range(i + 1, n)), ())
    topo = Topology("clique", tuple(names), links=links)
    progs = [[] for _ in range(n)]
    for c in range(chunks):
        for i in range(n):
            j = (i + 1 + c % (n - 1)) % n
            progs[i].append(Send(j, c, ChunkRef("in", c, 1)))
            progs[j].append(Recv(i, c, ChunkRef("out", c, 1)))
    plan = mkplan(topo, names, progs, chunks * 4, kind="alltoall")
    t0 = time.perf_counter()
    sim = simulate(plan)
    assert sim.messages == n * chunks
    assert time.perf_counter() - t0 < 1.0


def test_search_gives_up_once_it_cannot_catch_the_incumbent():
    cap, lat, n, elems = 1e9, 5e-6, 4, 1 << 18
    names = [f"g{i}" for i in range(n)]
    topo = Topology("chain", tuple(names), links=sum((duplex(names[i], names[i + 1], cap, lat) for i in range(n - 1)), ()))
    cands = chunk_candidates(elems * 4, 4)
    build = lambda c: chain_broadcast(topo, names, elems, elems * 4 // c)
    full = choose_chunk(build, cands)
    cut = choose_chunk(build, cands, incumbent=full.simulation.time / 10)
    assert len(cut.tried) < len(full.tried)
    # an incumbent it can beat does not stop it
    assert choose_chunk(build, cands, incumbent=full.simulation.time * 1.01).chunk_bytes == full.chunk_bytes


def test_doctests_of_the_compiler_modules():
    import doctest

    import hcc.commands
    import hcc.compiler.bcast_wide
    import hcc.compiler.cost
    import hcc.compiler.pipeline

    for mod in (hcc.compiler.cost, hcc.compiler.pipeline, hcc.commands, hcc.compiler.bcast_wide):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


def test_extrapolate_fits_the_pipeline_curve_exactly():
    from hcc.compiler.chunks import _extrapolate

    def t(c):
        return 1e-3 + 2e-12 * c + 3e-3 / c

    tried = [(c, t(c)) for c in (1 << 22, 1 << 21, 1 << 20)]
    got = _extrapolate(tried, 1 << 19, ceiling=1 << 26)
    assert got == pytest.approx(t(1 << 19), rel=1e-9)
    # not where the curve is rough (fewer than SMOOTH_CHUNKS chunks per share) ...
    assert _extrapolate(tried, 1 << 19, ceiling=1 << 22) is None
    # ... nor from a concave fit
    flat = [(c, 1.0 - 1e-12 * c) for c in (1 << 22, 1 << 21, 1 << 20)]
    assert _extrapolate(flat, 1 << 19, ceiling=1 << 26) is None


LINE_SOURCE = """topology line {{
    node g[0..{last}]
    class hop = 1 GB/s, {lat_us} us
{links}
}}
collective b = broadcast on line {{
    size = {size} B
    dtype = float32
    algorithm = treepack    # one chain from the end of a line: the pipeline formula holds
}}
"""


def _line_program(n: int, lat_us: float, size: int):
    import hcc

    links = "\n".join(f"    g{i} <-> g{i + 1} : hop" for i in range(n - 1))
    return hcc.load(LINE_SOURCE.format(last=n - 1, lat_us=lat_us, links=links, size=size))


def searched_argmin(formula, size: int, itemsize: int = 4) -> int:
    """The chunk the compiler's search lands on where ``formula`` (chunk -> seconds, computed
    apart from the simulator) is the time: the argmin over the powers of two
    (chunks.chunk_candidates), then pipeline.REFINE's fractions around the best so far, for
    up to REFINE_ROUNDS rounds while one is faster."""
    from hcc.compiler.pipeline import REFINE, REFINE_ROUNDS

    tried = {c: formula(c) for c in chunk_candidates(size, itemsize)}
    best = min(tried, key=tried.get)
    for _ in range(REFINE_ROUNDS):
        around = best
        for f in REFINE:
            c = int(around * f) // itemsize * itemsize
            if 0 < c < size and c not in tried:
                tried[c] = formula(c)
                if tried[c] < tried[best] * (1 - 1e-9):
                    best = c
        if best == around:
            break
    return best


@pytest.mark.parametrize("per_message_us", [0.0, 1.0, 20.0, 200.0, 1000.0])
def test_compiled_chunk_minimises_the_pipeline_formula_of_the_model(per_message_us):
    # A broadcast from one end of a line is one chain whatever the algorithm: k chunks of c
    # bytes over d hops take (k + d - 1)(α + p + c / C) (the pipeline formula, independent
    # of the simulator). The compiler's choice must be the formula's argmin over its
    # candidates for the per-message cost p it was given, and its prediction the formula's.
    from hcc.compiler.pipeline import compile_unit

    n, lat, cap, size = 5, 2e-6, 1e9, 1 << 22
    model = CostModel(per_message_s=per_message_us * 1e-6)
    plan = compile_unit(_line_program(n, lat * 1e6, size), "b", model=model).plan

    def formula(chunk: int) -> float:  # k chunks of nearly one size, the largest c (test_cli._chain_time)
        k = -(-size // chunk)
        c = -(-(size // 4) // k) * 4
        return (k + n - 2) * (lat + model.per_message_s) + size / cap + (n - 2) * c / cap

    best = searched_argmin(formula, size)
    assert plan.chunk_bytes == best, (plan.chunk_bytes, best)
    assert plan.figures.predicted_s == pytest.approx(formula(best), rel=1e-9)
    assert formula(best) <= min(formula(c) for c in chunk_candidates(size, 4))
    assert simulate(plan, model=model).time == pytest.approx(plan.figures.predicted_s, rel=1e-12)


def test_a_costlier_message_gives_larger_chunks_and_a_longer_prediction():
    # the direction the model says: with p up, the formula's optimum k* = sqrt((d-1) M / (C (α+p)))
    # falls (larger chunks), and the best time rises; monotone over 0 .. 1 ms
    from hcc.compiler.pipeline import compile_unit

    program = _line_program(5, 2.0, 1 << 22)
    plans = [compile_unit(program, "b", model=CostModel(per_message_s=p * 1e-6)).plan for p in (0, 10, 100, 1000)]
    chunks = [p.chunk_bytes for p in plans]
    times = [p.figures.predicted_s for p in plans]
    assert chunks == sorted(chunks) and chunks[0] < chunks[-1], chunks
    assert times == sorted(times) and times[0] < times[-1], times


def test_public_compile_takes_the_model_and_defaults_to_the_compilers():
    # hcc.compile(..., model=) is the API twin of the CLI's cost flags: same plan as
    # compile_unit under that model, and no model means the compiler's default
    import hcc
    from hcc.compiler.cost import DEFAULT_MODEL
    from hcc.compiler.pipeline import compile_unit

    program = _line_program(5, 2.0, 1 << 22)
    costly = CostModel(per_message_s=5e-4)
    for model in (None, costly):
        via_api = hcc.compile(program, "b", model=model)
        direct = compile_unit(program, "b", model=model or DEFAULT_MODEL).plan
        assert via_api.chunk_bytes == direct.chunk_bytes
        assert via_api.figures.predicted_s == pytest.approx(direct.figures.predicted_s, rel=1e-12)
    assert hcc.compile(program, "b", model=costly).chunk_bytes > hcc.compile(program, "b").chunk_bytes
    assert hcc.compile_all(program, model=costly)["b"].chunk_bytes == hcc.compile(program, "b", model=costly).chunk_bytes


def test_model_with_takes_the_flags_units_and_refuses_nonsense():
    from hcc.compiler.cost import DEFAULT_MODEL, describe_model, model_with

    m = model_with(per_message_us=100, reduce_GBps=2.5)
    assert (m.per_message_s, m.reduce_Bps, m.copy_Bps) == (pytest.approx(1e-4), 2.5e9, DEFAULT_MODEL.copy_Bps)
    assert model_with(m, copy_GBps=4).per_message_s == m.per_message_s  # unset knobs keep the base
    assert describe_model(model_with(m, copy_GBps=4)) == "100 us per message, reduce 2.5 GB/s, copy 4 GB/s"
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            model_with(per_message_us=bad)


def test_local_op_rates_price_the_reductions_of_a_compiled_plan():
    # an allreduce's combine ops cost bytes / reduce rate: a finite rate can only lengthen
    # the prediction, and a slower rate more
    import hcc
    from hcc.compiler.pipeline import compile_unit

    src = ("topology tri {\n    node a, b, c\n"
           + "".join(f"    {x} <-> {y} : 1 GB/s\n" for x, y in ("ab", "bc", "ac"))
           + "}\ncollective ar = allreduce on tri { size = 4 MiB }\n")
    plan = compile_unit(hcc.load(src), "ar").plan
    free = simulate(plan).time
    fast = simulate(plan, model=CostModel(reduce_Bps=10e9)).time
    slow = simulate(plan, model=CostModel(reduce_Bps=1e9)).time
    assert free < fast < slow
