"""Schedules against the packing (issue 17, item 1): structural checks of predicted time
against the packing rate on small graphs, with the project's own cost model. No timing.

- On switchless graphs with free messages (no latency, no per-message cost) the timed
  schedule of an optimal packing approaches the cut bound as chunks shrink: what is left
  is pipeline fill, which a few dozen chunks per tree make small.
- With the default model (1 us per message), the timed schedule beats the plain chunk-major
  order wherever several trees share links, and never loses more than a hair where one tree
  per link leaves nothing to order.
- ``bounds.latency_aware_bound`` is a lower bound of chunk-pipelined trees: a chain
  broadcast never beats it at any chunk size, and the best chunk size comes within a few
  percent of it (the chain is the proportionate flow shop the bound is derived from).
"""
from __future__ import annotations

import random

import pytest

from hcc.compiler import treepack
from hcc.compiler.bounds import broadcast_rate_bound, latency_aware_bound, time_bound
from hcc.compiler.cost import CostModel, simulate
from hcc.compiler.lower import lower
from hcc.compiler.program import CollectiveSpec
from hcc.ir.topology import Link, Topology

FREE = CostModel(per_message_s=0.0)


def spec(kind: str, ranks, size: int, root: int = -1) -> CollectiveSpec:
    op = "sum" if kind in ("reduce", "reduce_scatter", "allreduce") else None
    return CollectiveSpec(name="c", kind=kind, topology="t", ranks=tuple(ranks), root=root,
                          size_bytes=size, dtype="float32", op=op)


def random_graph(n: int, seed: int, latency: float = 0.0) -> Topology:
    """A connected heterogeneous graph: a ring (so every rank is reachable) plus random
    chords, capacities 1-8 GB/s, each direction drawn on its own."""
    rng = random.Random(seed)
    v = tuple(f"r{i}" for i in range(n))
    pairs = {(i, (i + 1) % n) for i in range(n)}
    for _ in range(n):
        a, b = rng.sample(range(n), 2)
        pairs.add((a, b))
    links = []
    for a, b in pairs:
        links.append(Link(v[a], v[b], rng.choice((1, 2, 4, 8)) * 1e9, latency))
        links.append(Link(v[b], v[a], rng.choice((1, 2, 4, 8)) * 1e9, latency))
    return Topology(f"rand{seed}", v, (), tuple(links))


def dgx1_nvlink(latency: float = 1e-6) -> Topology:
    two = [(0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7)]
    one = [(0, 2), (0, 3), (1, 2), (1, 5), (3, 7), (4, 6), (4, 7), (5, 6)]
    g = tuple(f"gpu{i}" for i in range(8))
    links = []
    for pairs, cap in ((two, 50e9), (one, 25e9)):
        for a, b in pairs:
            links += [Link(g[a], g[b], cap, latency), Link(g[b], g[a], cap, latency)]
    return Topology("dgx1_nvlink", g, (), tuple(links))


def efficiency(plan, bound_s: float, model: CostModel) -> float:
    return bound_s / simulate(plan, model=model).time


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["allgather", "reduce_scatter"])
def test_free_messages_reach_the_cut_on_random_graphs(seed, kind):
    """Fluid limit: 64 chunks per tree, no per-message cost: the timed schedule runs every
    tree at its packed rate, so only the fill of a few chunks is lost."""
    n = 5
    topo = random_graph(n, seed)
    ranks = topo.nodes
    size = n * 4 * 64 * 1024
    p = treepack.pack_allgather(topo, ranks, reverse=kind == "reduce_scatter")
    assert p.rate == pytest.approx(p.bound, rel=1e-6)
    bound = time_bound(kind, topo, ranks, -1, size)
    smallest_span = min(t.rate for t in p.trees) / sum(t.rate for t in p.trees if t.root == p.trees[0].root)
    chunk = max(4, int(size / n * min(smallest_span, 1.0) / 64) // 4 * 4)
    timed = lower(spec(kind, ranks, size), topo, p.trees, chunk, schedule="timed", model=FREE)
    timed.verify()
    assert efficiency(timed, bound, FREE) >= 0.9


@pytest.mark.parametrize("kind", ["allgather", "reduce_scatter", "allreduce"])
def test_timed_beats_chunk_major_order_where_trees_share_links(kind):
    """DGX-1's NVLinks, 14+ trees up to 7 deep rooted at every rank sharing every link, 1 us
    per message: the chunk-major order lets each root's sends flood its links ahead of what it
    forwards (0.65 of the bound), the timed schedule keeps every tree at its share (0.89).
    The packing's shallow phase (2 levels here) leaves little to order: the plain order
    reaches 0.95 over those trees and the timed one 0.93, and lower.lower_priced keeps the
    faster (test_lower_priced_keeps_the_faster_order)."""
    topo = dgx1_nvlink()
    ranks = topo.nodes
    size = 256 << 20
    p = treepack.pack_allgather(topo, ranks, reverse=kind == "reduce_scatter", shallow=False)
    model = CostModel()
    bound = time_bound(kind, topo, ranks, -1, size)
    effs = {}
    for sched in ("fifo", "timed"):
        best = 0.0
        for chunk in (1 << 20, 2 << 20):
            plan = lower(spec(kind, ranks, size), topo, p.trees, chunk, schedule=sched, model=model,
                         algorithm="treepack-rsag" if kind == "allreduce" else "treepack")
            best = max(best, efficiency(plan, bound, model))
        effs[sched] = best
    assert effs["timed"] >= effs["fifo"] + 0.05, effs
    assert effs["timed"] >= 0.8, effs


def test_one_tree_per_link_has_nothing_to_order():
    """A broadcast over edge-disjoint trees: the timed schedule is the plain pipeline."""
    topo = dgx1_nvlink()
    ranks = topo.nodes
    size = 64 << 20
    p = treepack.pack_broadcast(topo, ranks, ranks[0])
    bound = size / broadcast_rate_bound(topo, ranks, ranks[0])
    model = CostModel()
    t = {s: efficiency(lower(spec("broadcast", ranks, size, 0), topo, p.trees, 1 << 20, schedule=s,
                             model=model), bound, model) for s in ("fifo", "timed")}
    assert t["timed"] >= t["fifo"] - 0.01, t


def test_latency_aware_bound_holds_and_is_tight_on_a_chain():
    """A broadcast down one chain of 6 ranks (5 hops, 10 GB/s, 1 us latency, 1 us per
    message): the simulated time never beats latency_aware_bound, whatever the chunk, and
    the best chunk comes within 3% of it."""
    n, cap, lat = 6, 10e9, 1e-6
    v = tuple(f"c{i}" for i in range(n))
    links = []
    for a, b in zip(v, v[1:]):
        links += [Link(a, b, cap, lat), Link(b, a, cap, lat)]
    topo = Topology("chain", v, (), tuple(links))
    tree = treepack.PackedTree(v[0], tuple((a, b, (a, b)) for a, b in zip(v, v[1:])), cap)
    size = 64 << 20
    model = CostModel()
    cut = size / cap + lat
    bound = latency_aware_bound(cut, n - 1, lat + model.per_message_s)
    times = []
    for chunk in (64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20):
        plan = lower(spec("broadcast", v, size, 0), topo, [tree], chunk, schedule="timed", model=model)
        times.append(simulate(plan, model=model).time)
    assert min(times) >= bound * (1 - 1e-9)
    assert min(times) <= bound * 1.03


def test_lower_priced_keeps_the_faster_order():
    """Over the shallow allgather packing of DGX-1's NVLinks the plain order wins (0.95 against
    0.93 for the timed one, the better of 1 and 2 MiB chunks); the pipeline's lowering returns
    the faster of the two, with its simulation."""
    from hcc.compiler.lower import lower_priced

    topo = dgx1_nvlink()
    ranks = topo.nodes
    s = spec("allgather", ranks, 256 << 20)
    p = treepack.pack_allgather(topo, ranks)
    model = CostModel()
    times = [simulate(lower(s, topo, p.trees, 1 << 20, schedule=o, model=model), model=model).time
             for o in ("fifo", "timed")]
    plan, sim = lower_priced(s, topo, p.trees, 1 << 20, model=model)
    assert sim.time == pytest.approx(min(times), rel=1e-12)
    assert simulate(plan, model=model).time == pytest.approx(sim.time, rel=1e-12)


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
def test_lower_priced_keeps_the_narrow_form_where_it_is_faster(kind):
    """lower.NARROW_KINDS: on DGX-1's gpu[0,3,4,5,7] with its PCIe switches, the broadcast
    (reduce) trees from gpu0 cross 12 GB/s PCIe routes as well as NVLinks; the narrow form
    cuts each tree's chunks at its narrowest link over the widest, verifies, and
    lower_priced given the trees' narrow_tree_factors keeps the fastest of the plain order,
    the timed one and the narrow one; without them, or with lower.NARROWING off, the faster
    of the first two."""
    from hcc.compiler.lower import NARROW_KINDS, NARROWING, lower_priced, narrow_tree_factors
    from hcc.compiler.treepack import pack_broadcast
    from hcc.ir.verify import verify

    from test_timed_split import _fragment

    assert kind in NARROW_KINDS
    topo = _fragment()
    ranks = topo.nodes
    s = spec(kind, ranks, 256 << 20, root=0)
    trees = pack_broadcast(topo, ranks, "gpu0", reverse=kind == "reduce").trees
    model = CostModel()
    chunk = 4 << 20  # where the narrow form is the fastest of the three, for both kinds
    factors = narrow_tree_factors(s, topo, trees)
    assert factors is not None and len(factors) == len(trees) and 0 < min(factors) < max(factors) == 1.0
    narrow = lower(s, topo, trees, chunk, schedule="timed", model=model, narrow=factors)
    verify(narrow)
    times = [simulate(lower(s, topo, trees, chunk, schedule=o, model=model), model=model).time
             for o in ("fifo", "timed")]
    t_narrow = simulate(narrow, model=model).time
    assert t_narrow < min(times)
    plan, sim = lower_priced(s, topo, trees, chunk, model=model, narrow=factors)
    assert sim.time == pytest.approx(t_narrow, rel=1e-12)
    assert simulate(plan, model=model).time == pytest.approx(sim.time, rel=1e-12)
    token = NARROWING.set(False)
    try:
        _, off = lower_priced(s, topo, trees, chunk, model=model, narrow=factors)
    finally:
        NARROWING.reset(token)
    assert off.time == pytest.approx(min(times), rel=1e-12)
    assert lower_priced(s, topo, trees, chunk, model=model)[1].time == pytest.approx(min(times), rel=1e-12)


def test_lower_priced_keeps_the_reduces_last_chunk_in_halves_where_it_is_faster():
    """lower.HALVES_KINDS: DGX-1's gpu[0,2,4,6] reduce-scatter over its packed in-trees, each
    tree's last chunk in two halves: the plan verifies, computes what numpy computes, every
    message holds between half a chunk and a chunk, and the last piece of each tree's share is
    half a chunk; at 4 MiB chunks it is the fastest form, at 1 MiB the even chunks are, and
    lower_priced(halves=True) returns the fastest of the plain order, the even timed and the
    halved plans at both (without it, the faster of the first two)."""
    import hcc
    from hcc.compiler.lower import HALVES_KINDS, lower_priced
    from hcc.compiler.pipeline import resolve
    from hcc.ir.plan import Send
    from hcc.ir.verify import verify

    from test_drain_tree import SRC
    from test_lower import check_numeric

    prog = hcc.load(SRC.split("\ncollective")[0] + "\ncollective rs = reduce_scatter on dgx1 "
                    "{ size = 1 GiB ranks = gpu[0,2,4,6] }\n")
    s = resolve(prog, "rs")
    assert s.kind in HALVES_KINDS
    topo = prog.topology_of(s)
    trees = treepack.pack_allgather(topo, s.ranks, reverse=True).trees
    small = CollectiveSpec(name="c", kind=s.kind, topology=s.topology, ranks=s.ranks, root=-1,
                           size_bytes=96 << 10, dtype="float64", op="sum")
    tiny = lower(small, topo, trees, 4 << 10, schedule="timed", halves="last")
    verify(tiny)
    check_numeric(tiny, seed=7)
    wins = {}
    for chunk in (1 << 20, 4 << 20):
        halved = lower(s, topo, trees, chunk, schedule="timed", halves="last")
        verify(halved)
        sizes = [op.src.count for prog_ in halved.programs for op in prog_ if isinstance(op, Send)]
        ce = chunk // 4
        assert all(ce // 2 <= n <= ce for n in sizes) and sizes.count(ce // 2) > 0
        t_plain, t_even, t_halved = (simulate(p).time for p in (
            lower(s, topo, trees, chunk), lower(s, topo, trees, chunk, schedule="timed"), halved))
        wins[chunk] = t_halved < t_even
        _, sim = lower_priced(s, topo, trees, chunk, halves=True)
        assert sim.time == pytest.approx(min(t_plain, t_even, t_halved), rel=1e-12)
        assert lower_priced(s, topo, trees, chunk)[1].time == pytest.approx(min(t_plain, t_even), rel=1e-12)
    assert wins == {1 << 20: False, 4 << 20: True}


def test_last_chunk_in_halves_shortens_the_drain(monkeypatch):
    """schedule.TAIL_HALVES: DGX-1's NVLink allgather at 256 MiB over the shallow packing
    (trees rooted at every rank sharing every link): with each share's last chunk sent as
    two halves, the best of 1, 2 and 4 MiB chunks goes from 0.927 to 0.936 of the bound
    (the last chunks, held up behind other trees' chunks, then cross the levels left in half
    a chunk time each). Every message stays between half a chunk and a chunk, so the
    plan's latency-aware bound still holds; the plan verifies; reduce-scatter's in-trees
    keep even chunks (the same plan either way)."""
    from hcc.compiler import schedule

    topo = dgx1_nvlink()
    ranks = topo.nodes
    size = 256 << 20
    model = CostModel()
    effs, plans = {}, {}
    for kind in ("allgather", "reduce_scatter"):
        p = treepack.pack_allgather(topo, ranks, reverse=kind == "reduce_scatter")
        bound = time_bound(kind, topo, ranks, -1, size)
        for halves in (False, True):
            monkeypatch.setattr(schedule, "TAIL_HALVES", halves)
            best = 0.0
            for chunk in (1 << 20, 2 << 20, 4 << 20):
                plan = lower(spec(kind, ranks, size), topo, p.trees, chunk, schedule="timed", model=model)
                plans[kind, halves, chunk] = plan
                best = max(best, efficiency(plan, bound, model))
            effs[kind, halves] = best
    assert effs["allgather", True] >= effs["allgather", False] + 0.005, effs
    assert effs["reduce_scatter", True] == effs["reduce_scatter", False], effs
    chunk = 2 << 20
    plan = plans["allgather", True, chunk]
    plan.verify()
    sent = {op.src.count * 4 for prog in plan.programs for op in prog if type(op).__name__ == "Send"}
    assert min(sent) >= chunk // 2 and max(sent) <= chunk and chunk // 2 in sent
