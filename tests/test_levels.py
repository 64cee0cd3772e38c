"""The two-level schedule (compiler/levels.py, candidate ``treepack-levels``): the grouping
of ranks by host or rack against the hosts the source declares and a networkx min cut; the
plans of allgather, reduce_scatter and allreduce verify and compute what numpy computes, in
every lane form; a compiled plan never beats its bound, and auto takes it where it is the
fastest candidate. No timing."""
from __future__ import annotations

from dataclasses import replace

import networkx as nx
import pytest

import hcc
from hcc.compiler.cost import simulate
from hcc.compiler.levels import levels_plan, plan_levels, rank_groups
from hcc.ir.verify import verify

from test_lower import check_numeric

# hosts of 4 GPUs on an NVSwitch, two GPUs per NIC switch, every NIC on one fabric switch:
# the hosts' NICs bind (split lanes, one per NIC)
NICS = """
topology t {
    host h[0..2] {
        node g[0..3]
        switch sw
        switch nic[0..1]
        g[0..3] <-> sw : 50 GB/s, 1 us
        g[0..1] <-> nic0 : 10 GB/s, 2 us
        g[2..3] <-> nic1 : 10 GB/s, 2 us
    }
    switch fabric
    h[0..2].nic[0..1] <-> fabric : 10 GB/s, 2 us
}
"""
# racks of 3 nodes on a leaf, every leaf on both spines at 3 x 10 / 2 GB/s: full bisection,
# each node's own link binds (full lanes); 4 racks
RACKS = """
topology t {
    host r[0..3] { node n[0..2]  switch leaf  n[0..2] <-> leaf : 10 GB/s, 1 us }
    switch spine[0..1]
    r[0..3].leaf <-> spine[0..1] : 15 GB/s, 1 us
}
"""
# 2 nodes of 4 GCDs in an xGMI ring, each GCD on one global switch (ForestColl's MI250 shape)
MESH = """
topology t {
    host m[0..1] {
        node d[0..3]
        d0 <-> d1 : 50 GB/s, 1 us    d1 <-> d2 : 50 GB/s, 1 us
        d2 <-> d3 : 50 GB/s, 1 us    d3 <-> d0 : 50 GB/s, 1 us
    }
    switch ib
    m[0..1].d[0..3] <-> ib : 16 GB/s, 1 us
}
"""
ONE_SWITCH = """
topology t {
    node g[0..5]
    switch sw
    g[0..5] <-> sw : 10 GB/s, 1 us
}
"""
UNEVEN = """
topology t {
    host a { node g[0..2]  switch s  g[0..2] <-> s : 10 GB/s, 1 us }
    host b { node g[0..1]  switch s  g[0..1] <-> s : 10 GB/s, 1 us }
    switch core
    a.s <-> core : 10 GB/s, 1 us
    b.s <-> core : 10 GB/s, 1 us
}
"""


def load(topology: str, body: str, kind: str = "allgather", extra: str = ""):
    prog = hcc.load(topology + f"collective c = {kind} on t {{ {body} {extra} }}\n")
    spec = prog.collective("c")
    return spec, prog.topology_of(spec)


def netx(topo) -> nx.DiGraph:
    g = nx.DiGraph()
    for l in topo.links:
        if g.has_edge(l.src, l.dst):
            g[l.src][l.dst]["capacity"] += l.capacity
        else:
            g.add_edge(l.src, l.dst, capacity=l.capacity)
    return g


def min_cut_into(topo, inside: list[str], outside: list[str]) -> float:
    """networkx max flow from every rank outside the group to every rank inside it."""
    g = netx(topo)
    for r in outside:
        g.add_edge("S*", r, capacity=float("inf"))
    for r in inside:
        g.add_edge(r, "T*", capacity=float("inf"))
    return nx.maximum_flow_value(g, "S*", "T*")


@pytest.mark.parametrize("src,cut", [(NICS, 2 * 10e9), (RACKS, 2 * 15e9), (MESH, 4 * 16e9)])
def test_groups_are_the_declared_hosts_behind_their_cut(src, cut):
    spec, topo = load(src, "size = 1 MiB")
    groups = rank_groups(topo, spec.ranks)
    hosts: dict[str, list[int]] = {}
    for i, r in enumerate(spec.ranks):
        hosts.setdefault(r.split(".")[0], []).append(i)
    assert groups == tuple(tuple(v) for v in hosts.values())
    for g in groups:
        inside = [spec.ranks[i] for i in g]
        outside = [r for r in spec.ranks if r not in inside]
        # the host's uplinks, whatever the fabric behind them
        assert min_cut_into(topo, inside, outside) == pytest.approx(cut)


@pytest.mark.parametrize("src", [ONE_SWITCH, UNEVEN])
def test_no_groups_no_form(src):
    spec, topo = load(src, "size = 1 MiB")
    assert rank_groups(topo, spec.ranks) is None
    assert plan_levels(topo, spec.ranks) is None


def test_ranks_not_numbered_host_by_host_decline():
    spec, topo = load(RACKS, "size = 1 MiB")
    mixed = tuple(spec.ranks[i] for i in (0, 3, 1, 4, 2, 5, 6, 7, 8, 9, 10, 11))
    assert rank_groups(topo, mixed) is not None
    assert plan_levels(topo, mixed) is None


def test_lane_forms():
    spec, topo = load(NICS, "size = 1 MiB")
    lay = plan_levels(topo, spec.ranks)
    assert not lay.full and lay.star and len(lay.lanes) == 2  # one lane per NIC
    # the two lane ranks leave their host through different NICs
    assert {lay.trees[l * 3].paths[lay.groups[1][i]][1] for l, i in enumerate(lay.lanes)} == {"h0.nic0", "h0.nic1"}
    spec, topo = load(RACKS, "size = 1 MiB")
    lay = plan_levels(topo, spec.ranks)
    assert lay.full and not lay.star and lay.lanes == (0, 1, 2)
    # the lane routes out of a leaf spread evenly over the spines
    used: dict[tuple[str, str], int] = {}
    for t in lay.trees:
        for p in t.paths:
            for arc in zip(p, p[1:]):
                used[arc] = used.get(arc, 0) + 1
    ups = [c for (x, y), c in used.items() if x == "r0.leaf" and y.startswith("spine")]
    assert len(ups) == 2 and max(ups) - min(ups) <= 1


@pytest.mark.parametrize("src", [NICS, RACKS, MESH])
@pytest.mark.parametrize("star", [None, True, False])
def test_plans_verify_and_compute(src, star):
    for kind, op in (("allgather", None), ("reduce_scatter", "sum"), ("allreduce", "sum"),
                     ("allreduce", "avg")):
        # a size that divides by neither the ranks nor the chunks; a lane share in several
        # chunks, then in one (smaller chunks only slow the numeric run: ~2 s per 1000 ops)
        spec, topo = load(src, "size = 8008 B  dtype = float64", kind, f"op = {op}" if op else "")
        lay = plan_levels(topo, spec.ranks, star=star)
        for chunk in (800, 4000):
            plan = levels_plan(spec, topo, lay, chunk)
            verify(plan)
            check_numeric(plan, seed=chunk)
            assert max(op.src.count for prog in plan.programs for op in prog
                       if type(op).__name__ == "Send") * 8 <= chunk


def test_reduce_scatter_replays_its_allgather_backwards():
    """levels_plan's ``replay``: the reduce-scatter (and the allreduce's) emitted in the
    reversed order of the simulated allgather's receives verifies and computes what numpy
    computes, and, the model's links being the same both ways, takes about the allgather's
    time (exactly it where each tree edge is one link; within 6 % over switch paths), not
    the unreplayed reduce-scatter's (the packed MESH form: 0.633 against 0.597 ms)."""
    from hcc.compiler.cost import DEFAULT_MODEL
    from hcc.compiler.levels import allgather_ends, levels_forms

    for src in (NICS, RACKS, MESH):
        spec, topo = load(src, "size = 8008 B  dtype = float64", "allgather")
        for lay in levels_forms(topo, spec.ranks):
            for kind, op in (("reduce_scatter", "sum"), ("allreduce", "avg")):
                spec, topo = load(src, "size = 8008 B  dtype = float64", kind, f"op = {op}")
                ends = allgather_ends(spec, topo, lay, 800, DEFAULT_MODEL)
                plan = levels_plan(spec, topo, lay, 800, replay=ends)
                verify(plan)
                check_numeric(plan, seed=len(ends))
            ag, _ = load(src, "size = 64 MiB", "allgather")
            rs, _ = load(src, "size = 64 MiB", "reduce_scatter", "op = sum")
            ends = allgather_ends(rs, topo, lay, 1 << 20, DEFAULT_MODEL)
            t_ag = simulate(levels_plan(ag, topo, lay, 1 << 20)).time
            assert max(ends) == pytest.approx(t_ag)  # the ends are that allgather's
            t_rs = simulate(levels_plan(rs, topo, lay, 1 << 20, replay=ends)).time
            assert t_rs <= 1.06 * t_ag
            if lay.inner:
                assert t_rs == pytest.approx(t_ag, rel=1e-3)
                assert simulate(levels_plan(rs, topo, lay, 1 << 20)).time > 1.05 * t_rs


def test_compiled_plan_never_beats_its_bound_and_auto_takes_it():
    from hcc.compiler.pipeline import compile_unit
    from hcc.compiler.registry import BASELINES, candidates_for

    src = NICS + ("collective ag = allgather on t { size = 64 MiB }\n"
                  "collective ar = allreduce on t { size = 64 MiB  algorithm = treepack }\n")
    prog = hcc.load(src)
    for name in ("ag", "ar"):
        u = compile_unit(prog, name)
        lv = u.candidate("treepack-levels")
        assert lv is not None
        # the simulated time of every lane form, not only the chosen one, stays above the bound
        spec = prog.collective(name)
        for star in (True, False):
            plan = levels_plan(spec, prog.topology_of(spec), plan_levels(prog.topology_of(spec), spec.ranks, star=star),
                               lv.choice.chunk_bytes)
            assert simulate(plan).time >= u.plan.figures.bound_s
        assert lv.predicted_s >= u.plan.figures.bound_s
        assert 0 < u.plan.efficiency <= 1
        # auto (ag) and the treepack family (ar) take it where it is the fastest they offer
        offered = [c for c in u.candidates if c.algorithm in candidates_for(spec)[0]]
        assert u.plan.algorithm == min(offered, key=lambda c: c.predicted_s).algorithm
        if name == "ag":  # the hosts' NICs bind: it beats every NCCL-like baseline
            assert all(lv.predicted_s < c.predicted_s for c in u.candidates if c.algorithm in BASELINES)


def test_packed_form_over_each_groups_own_trees():
    """Every member its own exit (MESH: each GCD on the switch): each lane carries its rank's
    block, and each group forwards its bundles over its own allgather packing; the plans
    verify, compute what numpy computes, and never beat a networkx bound."""
    from hcc.compiler.levels import levels_forms, plan_packed

    spec, topo = load(MESH, "size = 8008 B  dtype = float64")
    lay = plan_packed(topo, spec.ranks)
    assert lay is not None and lay.star and len(lay.lanes) == len(lay.ring) == 4
    lanes = len(lay.lanes) * len(lay.groups)
    for g, grp in enumerate(lay.groups):
        for i, ts in enumerate(lay.inner[g]):
            for t in ts:
                tree = lay.trees[t]
                # a tree of group g rooted at its member i, spanning exactly the group
                assert t >= lanes and tree.root == grp[i]
                assert {r for r, p in enumerate(tree.parent) if p >= 0} == set(grp) - {grp[i]}
                assert all(p in grp for p in tree.parent if p >= 0)
        # every member's trees carry the same rate (the group's allgather packing)
        rates = [sum(lay.trees[t].rate for t in ts) for ts in lay.inner[g]]
        assert max(rates) == pytest.approx(min(rates))
    assert [f.inner_scale for f in levels_forms(topo, spec.ranks) if f.inner] == [1]
    # in-group messages of two lane chunks and of one (ranges overlapping the lane chunks unevenly)
    for (kind, op), (chunk, k) in zip((("allgather", None), ("reduce_scatter", "sum"), ("allreduce", "avg"),
                                       ("allreduce", "sum")), ((800, 2), (4000, 1), (800, 2), (4000, 1))):
        spec, topo = load(MESH, "size = 8008 B  dtype = float64", kind, f"op = {op}" if op else "")
        plan = levels_plan(spec, topo, replace(lay, inner_scale=k), chunk)
        verify(plan)
        check_numeric(plan, seed=chunk)
    # simulated at 64 MiB, never under what networkx allows: a group takes in the other
    # group's half of the buffer through its cut, twice for the allreduce
    n = len(spec.ranks)
    for kind, factor in (("allgather", 1), ("reduce_scatter", 1), ("allreduce", 2)):
        spec, topo = load(MESH, "size = 64 MiB", kind, "op = sum" if kind != "allgather" else "")
        inside = [spec.ranks[r] for r in lay.groups[0]]
        outside = [r for r in spec.ranks if r not in inside]
        floor = factor * spec.size_bytes * len(outside) / n / min_cut_into(topo, inside, outside)
        for k in (1, 2):
            assert simulate(levels_plan(spec, topo, replace(lay, inner_scale=k), 1 << 20)).time >= floor


def test_packed_form_declines_where_a_group_cannot_pack():
    """A host whose own links reach its ranks one way only has no in-group trees: no packed
    form (the ring forms decide for themselves), and no error."""
    from hcc.compiler.levels import levels_forms, plan_packed

    oneway = """
topology t {
    host m[0..1] {
        node d[0..2]
        d0 -> d1 : 50 GB/s, 1 us
        d1 -> d2 : 50 GB/s, 1 us
    }
    switch ib
    m[0..1].d[0..2] <-> ib : 16 GB/s, 1 us
}
"""
    spec, topo = load(oneway, "size = 1 MiB")
    assert plan_packed(topo, spec.ranks) is None
    assert all(not f.inner for f in levels_forms(topo, spec.ranks) or ())


def test_a_two_level_plan_reports_the_rate_its_link_loads_allow():
    """treepack-levels has no single packing: its pack_rate is the size over the longest time
    a link needs for the plan's bytes. On three hosts of two GPUs, a 10 GB/s NIC each, every
    host takes 4/6 of M through 20 GB/s of NICs, and the plan moves exactly that: 30 GB/s of
    allgather (twice that time for allreduce: 15 GB/s), the cut bound's rate."""
    from hcc.compiler.cost import simulate
    from hcc.compiler.frontend import load_program
    from hcc.compiler.pipeline import compile_one, load_rate
    from test_errors import LEVELS_TOPO

    for kind, want in (("allgather", 30e9), ("allreduce", 15e9)):
        src = LEVELS_TOPO + f"collective c = {kind} on t {{\n    size = 6 MiB\n    algorithm = treepack_levels\n}}\n"
        plan = compile_one(load_program(src))
        f = plan.figures
        assert f.pack_rate_Bps == pytest.approx(load_rate(plan.size_bytes, simulate(plan)), rel=1e-12)
        assert f.bound_rate_Bps == pytest.approx(want, rel=1e-9)
        assert f.pack_rate_Bps == pytest.approx(want, rel=1e-9)
        assert plan.size_bytes / f.pack_rate_Bps <= f.predicted_s


# hosts of 4 GPUs on an NVSwitch, each GPU behind its own NIC on one fabric switch (A100-like):
# every member its own exit, every group's own trees stars
SWITCHED = """
topology t {
    host h[0..1] {
        node g[0..3]
        switch nvs
        switch nic[0..3]
        g[0..3] <-> nvs : 300 GB/s, 1 us
        g0 <-> nic0 : 25 GB/s, 1 us    g1 <-> nic1 : 25 GB/s, 1 us
        g2 <-> nic2 : 25 GB/s, 1 us    g3 <-> nic3 : 25 GB/s, 1 us
    }
    switch fabric
    h[0..1].nic[0..3] <-> fabric : 25 GB/s, 1 us
}
"""


def test_star_groups_pace_each_ranks_in_group_sends_together():
    """Where every group's own trees are stars (an NVSwitch), the packed allgather holds each
    rank's in-group send until its send STAR_RANK_WINDOW before it (over any peer and tree)
    has gone, and the reduce-scatter's replay may pace so too; the plans verify and compute
    what numpy computes, and at 64 MiB the allgather so paced simulates faster than paced per
    peer and tree (every rank's sends of a chunk, ready at once, otherwise reached a port in
    the order the ranks posted them)."""
    from hcc.compiler.cost import DEFAULT_MODEL
    from hcc.compiler.levels import STAR_RANK_WINDOW, allgather_ends, plan_packed
    from hcc.ir.plan import Send

    spec, topo = load(SWITCHED, "size = 8008 B  dtype = float64")
    lay = plan_packed(topo, spec.ranks)
    assert lay is not None and lay.stars
    mspec, mtopo = load(MESH, "size = 8008 B")
    assert not plan_packed(mtopo, mspec.ranks).stars  # the xGMI ring's trees are not
    lanes = len(lay.lanes) * len(lay.groups)
    plan = levels_plan(spec, topo, lay, 800)
    verify(plan)
    check_numeric(plan, seed=5)
    for prog in plan.programs:
        mine = [i for i, op in enumerate(prog) if type(op) is Send and op.tree >= lanes]
        assert len(mine) > STAR_RANK_WINDOW
        for j in range(STAR_RANK_WINDOW, len(mine)):
            assert mine[j - STAR_RANK_WINDOW] in prog[mine[j]].deps
    for kind, op in (("reduce_scatter", "sum"), ("allreduce", "avg")):
        spec, topo = load(SWITCHED, "size = 8008 B  dtype = float64", kind, f"op = {op}")
        ends = allgather_ends(spec, topo, lay, 800, DEFAULT_MODEL)
        plan = levels_plan(spec, topo, lay, 800, replay=ends, per_rank=True)
        verify(plan)
        check_numeric(plan, seed=len(ends))
    spec, topo = load(SWITCHED, "size = 64 MiB")
    assert simulate(levels_plan(spec, topo, lay, 1 << 20)).time < simulate(
        levels_plan(spec, topo, replace(lay, stars=False), 1 << 20)).time


def test_an_allreduce_may_reduce_over_one_layout_and_gather_over_another():
    """levels_plan's ``ag_layout``: the packed form's reduce-scatter (replayed, paced per rank
    or not) followed by another form's allgather over that form's own trees (numbered after
    the first's); every receive of the allgather waits for the rank's reduce-scatter send of
    its range. The plans verify, compute what numpy computes, and at 64 MiB never beat twice
    the networkx floor of a group's share."""
    from hcc.compiler.cost import DEFAULT_MODEL
    from hcc.compiler.levels import allgather_ends, levels_forms

    spec, topo = load(SWITCHED, "size = 8008 B  dtype = float64")
    forms = levels_forms(topo, spec.ranks)
    packed = next(f for f in forms if f.inner)
    others = [f for f in forms if not f.inner]
    assert others
    for op in ("sum", "avg"):
        spec, topo = load(SWITCHED, "size = 8008 B  dtype = float64", "allreduce", f"op = {op}")
        ends = allgather_ends(spec, topo, packed, 800, DEFAULT_MODEL)
        for other in others:
            for per_rank in (False, True):
                plan = levels_plan(spec, topo, packed, 800, replay=ends, per_rank=per_rank, ag_layout=other)
                verify(plan)
                check_numeric(plan, seed=int(per_rank) + 7)
                assert len(plan.trees) == len(packed.trees) + len(other.trees)
                assert [t.index for t in plan.trees] == list(range(len(plan.trees)))
    spec, topo = load(SWITCHED, "size = 64 MiB", "allreduce", "op = sum")
    inside = [spec.ranks[r] for r in packed.groups[0]]
    outside = [r for r in spec.ranks if r not in inside]
    floor = 2 * spec.size_bytes * len(outside) / len(spec.ranks) / min_cut_into(topo, inside, outside)
    ends = allgather_ends(spec, topo, packed, 1 << 20, DEFAULT_MODEL)
    for other in others:
        assert simulate(levels_plan(spec, topo, packed, 1 << 20, replay=ends, per_rank=True,
                                    ag_layout=other)).time >= floor


def test_packed_groups_forward_the_lanes_blocks_in_the_order_the_lanes_bring_them():
    """Three groups: after its own block, a rank forwards the blocks its lane brings piece by
    piece across the groups they come from (every group's first piece, then every group's
    second), the order the lanes deliver them, not block by block; the plan verifies and
    computes what numpy computes."""
    from hcc.compiler.levels import _packed_transfers, plan_packed
    from hcc.ir.plan import block_range

    src = SWITCHED.replace("h[0..1]", "h[0..2]")
    spec, topo = load(src, "size = 24024 B  dtype = float64")
    lay = plan_packed(topo, spec.ranks)
    n, E, ce = len(spec.ranks), 24024 // 8, 50  # blocks of 250 elements: 5 pieces each
    moves, _, _ = _packed_transfers(lay, E, n, ce)
    lanes = len(lay.lanes) * len(lay.groups)
    group_of = {r: g for g, grp in enumerate(lay.groups) for r in grp}
    for r in range(n):
        seq = []  # (the block's group distance, its piece index) of r's in-group forwards
        for src_, _, a, _, t in moves:
            if src_ != r or t < lanes:
                continue
            owner = next(o for o in range(n) if block_range(E, n, o)[0] <= a < block_range(E, n, o)[1])
            if group_of[owner] == group_of[r]:
                continue  # the group's own blocks go first
            seq.append((a - block_range(E, n, owner)[0]) // ce)
        assert len(seq) > 2 and seq == sorted(seq)  # piece by piece, whichever group
    plan = levels_plan(spec, topo, lay, ce * 8)
    verify(plan)
    check_numeric(plan, seed=11)


# two A100-like servers: 8 GPUs on an NVSwitch, each behind its own 25 GB/s NIC
SWITCHED8 = SWITCHED.replace("g[0..3]", "g[0..7]").replace("nic[0..3]", "nic[0..7]").replace(
    "g2 <-> nic2 : 25 GB/s, 1 us    g3 <-> nic3 : 25 GB/s, 1 us",
    "g2 <-> nic2 : 25 GB/s, 1 us    g3 <-> nic3 : 25 GB/s, 1 us\n"
    "        g4 <-> nic4 : 25 GB/s, 1 us    g5 <-> nic5 : 25 GB/s, 1 us\n"
    "        g6 <-> nic6 : 25 GB/s, 1 us    g7 <-> nic7 : 25 GB/s, 1 us")


def test_star_groups_send_own_blocks_whole_and_the_lanes_last_chunk_in_halves(monkeypatch):
    """Over star groups the packed allgather sends each rank's own block to its first peer
    chunk by chunk and to every other peer in one message (OWN_WHOLE: a rank's first two
    sends go to one port), its lanes send a block's last chunk as two halves, and the group
    forwards a lane's block in pieces inside the lane's (LANE_TAIL_HALVES); the reversed
    order (a reduce-scatter's) moves the same ranges. On two 8-GPU servers at 256 MiB and
    8 MiB chunks the allgather reaches 0.90 of the networkx bound (a GPU's in-cut, a host's
    in-cut), and without either rule it does not."""
    from hcc.compiler import levels
    from hcc.compiler.levels import _packed_transfers, plan_packed
    from hcc.ir.plan import block_range

    spec, topo = load(SWITCHED8, "size = 256 MiB")
    lay = plan_packed(topo, spec.ranks)
    assert lay is not None and lay.stars
    n, E, ce = len(spec.ranks), 4000, 100  # blocks of 250 elements
    moves, _, _ = _packed_transfers(lay, E, n, ce)
    lanes = len(lay.lanes) * len(lay.groups)
    lane_ends = {b for s, d, a, b, t in moves if t < lanes}
    for r in range(n):
        lo, hi = block_range(E, n, r)
        lane = [(a, b) for s, d, a, b, t in moves if s == r and t < lanes]
        assert [b - a for a, b in lane] == [75, 75, 50, 50]  # the last chunk of 100 in halves
        own = [(d, a, b) for s, d, a, b, t in moves if s == r and t >= lanes and lo <= a < hi]
        first = own[0][0]
        assert own[1][0] == first  # the two sends in flight at the start: one port
        assert [(a, b) for d, a, b in own if d == first] == [(lo, lo + 100), (lo + 100, lo + 200), (lo + 200, hi)]
        peers = [d for d, *_ in own if d != first]
        assert len(peers) == len(set(peers)) == 6 and all((a, b) == (lo, hi) for d, a, b in own if d != first)
        fwd = [b for s, d, a, b, t in moves if s == r and t >= lanes and not lo <= a < hi]
        assert fwd and set(fwd) <= lane_ends  # no forward waits for the lane's next piece
    back, _, _ = _packed_transfers(lay, E, n, ce, backward=True)
    assert sorted(back) == sorted(moves)
    inside, outside = [spec.ranks[r] for r in lay.groups[0]], [spec.ranks[r] for r in lay.groups[1]]
    bound = max(spec.size_bytes * (n - 1) / n / min_cut_into(topo, spec.ranks[:1], spec.ranks[1:]),
                spec.size_bytes / 2 / min_cut_into(topo, inside, outside))
    eff = {}
    for halves, whole in ((True, True), (False, True), (True, False)):
        monkeypatch.setattr(levels, "LANE_TAIL_HALVES", halves)
        monkeypatch.setattr(levels, "OWN_WHOLE", whole)
        eff[halves, whole] = bound / simulate(levels_plan(spec, topo, lay, 8 << 20)).time
    assert eff[True, True] >= 0.90 > max(eff[False, True], eff[True, False])


def test_the_refinement_prices_only_the_variants_close_at_the_chunk_it_refines(monkeypatch):
    """levels_priced inside the chunk search's refinement (chunks.refining): of the variants
    it priced at the chunk refined around, only those within REFINE_VARIANTS of the fastest
    there are priced at the sizes around it, and outside the refinement all of them again."""
    from hcc.compiler import levels
    from hcc.compiler.chunks import refining
    from hcc.compiler.levels import levels_forms, levels_priced

    spec, topo = load(SWITCHED, "size = 64 MiB", "allreduce", "op = sum")
    forms = levels_forms(topo, spec.ranks)
    built = []
    real = levels.levels_plan

    def counting(*args, **kw):
        built.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(levels, "levels_plan", counting)
    around, near = 1 << 20, 3 << 18
    levels_priced(spec, topo, forms, around)
    full = len(built)
    times = levels._priced[next(k for k in reversed(levels._priced) if k[-1] == around)][1]
    ratios = sorted(t / min(times.values()) for t in times.values())
    assert full == len(times) >= 3 and ratios[-1] > 1.0
    # a factor between the fastest variants and the slowest, so that some are left out
    monkeypatch.setattr(levels, "REFINE_VARIANTS", (ratios[len(ratios) // 2] + ratios[-1]) / 2)
    close = sum(r <= levels.REFINE_VARIANTS for r in ratios)
    assert 1 <= close < full
    built.clear()
    with refining(around):
        plan, sim = levels_priced(spec, topo, forms, near)
    assert len(built) == close
    built.clear()
    again, sim_all = levels_priced(spec, topo, forms, near)
    assert len(built) == full
    assert sim.time >= sim_all.time  # a subset of the same variants
