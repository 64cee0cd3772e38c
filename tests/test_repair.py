"""Pure repair functions (backends/repair.py): re-attachment to the nearest live ancestor,
arrival-order heaps, and residual plans over the survivors (lowered here, in the test) that
ir/verify.py accepts."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hcc
from hcc.backends.repair import (
    RootLost,
    ancestors,
    arrival_parents,
    bfs_order,
    claim_count,
    relay_parents,
    repair_parents,
    repair_tree,
    share_by_load,
    subtree,
)
from hcc.ir.errors import PlanError
from hcc.ir.plan import DTYPE_SIZES, ROOTED_KINDS, Plan, Tree, block_range
from hcc.ir.verify import verify


def test_children_of_a_dead_rank_attach_to_its_parent_and_other_edges_stay():
    #        0
    #      1   4
    #     2 3    5
    parent = (-1, 0, 1, 1, 0, 4)
    rep = repair_parents(parent, 0, {1})
    assert rep == (-1, -1, 0, 0, 0, 4)  # the dead rank leaves the tree
    # every surviving edge whose parent lives is kept
    for c, p in enumerate(parent):
        if c != 1 and p not in (-1, 1):
            assert rep[c] == p


def test_a_dead_chain_is_skipped_to_the_nearest_live_ancestor():
    parent = (-1, 0, 1, 2, 3)  # a chain 0-1-2-3-4
    assert repair_parents(parent, 0, {2, 3}) == (-1, 0, -1, -1, 1)
    assert ancestors(parent, 4) == [3, 2, 1, 0]


def test_dead_root_raises_unless_promotion_is_allowed():
    parent = (-1, 0, 0, 1)
    with pytest.raises(RootLost):
        repair_parents(parent, 0, {0})
    rep = repair_parents(parent, 0, {0}, promote=True)
    # first orphan in breadth-first order (rank 1) is the new root; rank 2 attaches to it
    assert rep == (-1, -1, 1, 1)
    assert bfs_order(rep, 1) == [1, 2, 3]


def test_repair_tree_keeps_span_rate_and_the_paths_of_kept_edges():
    t = Tree(0, 0, (-1, 0, 1, 1), 2e9, (0, 100), ((), ("a", "b"), ("b", "c"), ("b", "d")))
    r = repair_tree(t, {1})
    assert r.parent == (-1, -1, 0, 0) and r.span == (0, 100) and r.rate == 2e9
    assert r.paths[2] == () and r.paths[0] == ()


def test_arrival_heap_puts_early_ranks_inside_and_late_ranks_at_the_leaves():
    order = (5, 2, 7, 0, 1, 3, 4, 6)  # root 5, then arrival order
    parent = arrival_parents(order, 8, fanout=2)
    assert parent[5] == -1
    assert parent[2] == 5 and parent[7] == 5
    assert parent[0] == 2 and parent[1] == 2 and parent[3] == 7 and parent[4] == 7
    assert parent[6] == 0
    interior = {p for p in parent if p >= 0}
    # the last half of the arrivals are leaves
    assert not interior & {1, 3, 4, 6}
    assert subtree(parent, 2) == frozenset({2, 0, 1, 6})


@st.composite
def trees_and_dead(draw):
    n = draw(st.integers(2, 12))
    parent = [-1] * n
    for c in range(1, n):
        parent[c] = draw(st.integers(0, c - 1))
    dead = draw(st.sets(st.integers(1, n - 1), max_size=n - 1))
    return tuple(parent), dead


@settings(max_examples=200, deadline=None)
@given(trees_and_dead())
def test_repair_spans_every_survivor_and_keeps_live_ancestry(td):
    parent, dead = td
    rep = repair_parents(parent, 0, dead)
    live = [r for r in range(len(parent)) if r not in dead]
    assert sorted(bfs_order(rep, 0)) == live
    for r in live:
        if r == 0:
            continue
        # the new parent is the nearest live ancestor in the old tree
        assert rep[r] == next(a for a in ancestors(parent, r) if a not in dead)


# -- residual plans: the repaired trees lowered over the survivors (test helper) --------------

def residual_plan(plan: Plan, dead: Iterable[int], chunk_bytes: int | None = None) -> Plan:
    """The collective over the survivors of ``plan``, lowered from its repaired trees by the
    compiler's own lowering: an ir Plan that ir/verify.py checks, which is how these tests show
    that a repair is still a correct schedule (the runtime never lowers; this lives here).

    Survivors are renumbered in rank order; the size per rank is unchanged for kinds whose
    buffers do not depend on the rank count (broadcast, reduce, allreduce) and rescaled by
    the block size for allgather and gather (each survivor keeps its own block). Raises
    :class:`RootLost` when a rooted collective's root is dead."""
    from hcc.compiler.lower import lower
    from hcc.compiler.trees import PackedTree

    dead = set(dead)
    survivors = [r for r in range(plan.n) if r not in dead]
    if not survivors:
        raise PlanError("no rank survives")
    new_index = {r: i for i, r in enumerate(survivors)}
    rooted = plan.kind in ROOTED_KINDS
    if rooted and plan.root in dead:
        raise RootLost(f"the root, rank {plan.root}, is dead")
    packed = []
    for t in plan.trees:
        if t.root in dead and (rooted or plan.kind in ("allgather",)):
            continue  # allgather: the dead rank's block is missing, its tree goes
        rt = repair_tree(t, dead, promote=not rooted)
        if rt.root < 0:
            continue
        edges = tuple((new_index[p], new_index[c], (plan.ranks[p], plan.ranks[c]))
                      for c, p in enumerate(rt.parent) if p >= 0)
        packed.append(PackedTree(new_index[rt.root], edges, t.rate))
    size = plan.size_bytes
    if plan.kind in ("allgather", "gather"):
        item = DTYPE_SIZES[plan.dtype]
        size = sum(block_range(plan.elems, plan.n, r)[1] - block_range(plan.elems, plan.n, r)[0]
                   for r in survivors) * item
        # lower() splits the survivors' buffer into equal blocks again; keep it exact only when
        # the blocks were equal (E divisible by n), which the callers check
    spec = SimpleNamespace(  # the fields of a collective lower() reads
        name=f"{plan.name}~residual", kind=plan.kind, ranks=tuple(plan.ranks[r] for r in survivors),
        root=new_index[plan.root] if rooted else -1, size_bytes=size, dtype=plan.dtype, op=plan.op,
        compress=plan.compress, on_failure=plan.on_failure, adaptive=plan.adaptive, peers=plan.peers)
    topo = plan.topology.restricted(spec.ranks)
    chunk = chunk_bytes if chunk_bytes is not None else max(plan.chunk_bytes, plan.itemsize)
    if not packed:
        raise PlanError(f"plan {plan.name!r} keeps no tree to repair (algorithm {plan.algorithm})")
    return lower(spec, topo, packed, chunk, algorithm=f"{plan.algorithm}+repair")


SRC = """
topology t { node g[0..5]
  g[0..5] <-> g[0..5] : 1 GB/s, 10 us }
collective b = broadcast on t { size = 6000 B  root = g2 on_failure = continue }
collective r = reduce on t { size = 6000 B  op = max on_failure = continue }
collective a = allreduce on t { size = 6000 B algorithm = tree on_failure = continue }
collective g = allgather on t { size = 6000 B on_failure = continue }
"""


@pytest.fixture(scope="module")
def plans():
    prog = hcc.load(SRC)
    return {c.name: hcc.compile(prog, c.name) for c in prog.collectives}


@pytest.mark.parametrize("name", ["b", "r", "a", "g"])
@pytest.mark.parametrize("dead", [{3}, {1, 4}, {0, 5}])
def test_residual_plans_over_the_survivors_verify(plans, name, dead):
    plan = plans[name]
    if plan.root in dead and plan.kind in ("broadcast", "reduce"):
        with pytest.raises(RootLost):
            residual_plan(plan, dead, chunk_bytes=400)
        return
    res = residual_plan(plan, dead, chunk_bytes=400)
    assert res.n == plan.n - len(dead)
    assert res.ranks == tuple(v for i, v in enumerate(plan.ranks) if i not in dead)
    verify(res)  # raises VerifyError if the repaired trees do not deliver the collective
    if plan.kind == "allgather":
        # the dead ranks' trees go: one tree per surviving owner
        assert {t.root for t in res.trees} == set(range(res.n))


def test_residual_plan_of_an_allreduce_whose_tree_root_died_promotes_a_child(plans):
    plan = plans["a"]
    roots = {t.root for t in plan.trees}
    dead = {min(roots)}
    res = residual_plan(plan, dead, chunk_bytes=400)
    verify(res)
    assert len(res.trees) == len(plan.trees)


def test_adaptive_defaults_on_for_sockets_and_ray_off_for_mpi_and_off_forces_static():
    """The runtime decides from what a transport declares (its capabilities), not its name."""
    from dataclasses import replace

    from hcc.backends.base import Capabilities
    from hcc.backends.mpi import MPIBackend
    from hcc.backends.ray import RayTransport
    from hcc.backends.runtime import adaptive_on, engine
    from hcc.backends.sockets import SocketTransport

    prog = hcc.load("""topology t { node g[0..2]
      g[0..2] <-> g[0..2] : 1 GB/s }
    collective a = allreduce on t { size = 4000 B  dtype = int32 }""")
    plan = hcc.compile(prog, "a")

    class Comm:  # what the runtime reads of a transport: its declared capabilities
        def __init__(self, caps, name="anything"):
            self.capabilities, self.name = caps, name

    sockets = Comm(SocketTransport.capabilities)
    ray = Comm(Capabilities(arrival_order=True, agreement=True))  # a RayTransport with a store
    mpi = Comm(MPIBackend.capabilities)
    assert SocketTransport.capabilities.agreement and not MPIBackend.capabilities.arrival_order
    assert RayTransport.capabilities.arrival_order and not RayTransport.capabilities.agreement

    def wants(p, c, options):
        return engine(p, c, options) == "adaptive"

    default, on, off = (replace(plan, adaptive=v) for v in (None, True, False))
    for comm, expect in ((sockets, True), (ray, True), (mpi, False)):
        assert adaptive_on(default, comm) is expect
        assert adaptive_on(on, comm) and not adaptive_on(off, comm)
    assert adaptive_on(off, sockets, option=True) and not adaptive_on(on, sockets, option=False)
    # a transport named "sockets" that declares nothing is treated as declaring nothing
    assert not adaptive_on(default, Comm(Capabilities(), name="sockets"))
    assert wants(default, sockets, {}) and not wants(off, sockets, {})
    assert not wants(default, mpi, {})  # MPI: the static executor
    assert not wants(on, Comm(Capabilities(arrival_order=True)), {})  # no store, no agreement log
    assert not wants(on, Comm(RayTransport.capabilities), {})  # a Ray transport made without a store
    # off still survives deaths when asked to (on_failure = continue uses the compiled trees)
    assert wants(replace(off, on_failure="continue"), sockets, {})
    assert wants(off, sockets, {"quorum": 2})
    # adaptive said and off: the flattened program; said and on: the adaptive runtime
    assert not wants(default, sockets, {"adaptive": False}) and wants(off, sockets, {"adaptive": True})
    # more ranks than the adaptive layout holds: the default stays static instead of failing
    from hcc.backends.adaptive import MAX_FLOWS

    big = type("Big", (), {"kind": "allgather", "compress": "none", "on_failure": "abort",
                           "adaptive": None, "n": MAX_FLOWS + 1})()
    assert not wants(big, sockets, {})
    big.n = MAX_FLOWS
    assert wants(big, sockets, {})


def _link_loads(trees, roots, sizes, uplink, arrived_at, live):
    """Seconds each live rank's link is busy after the last arrival: pieces it still had to
    push (bytes of the blocks it does not own / uplink, less the time since it arrived) plus
    one block per child it sends the block to — computed here from the trees themselves."""
    last = max(arrived_at[r] for r in live)
    load = {}
    for r in live:
        push = sum(s for i, s in enumerate(sizes) if roots[i] != r) / uplink[r]
        load[r] = max(0.0, push - (last - arrived_at[r]))
        load[r] += sum(sizes[i] * sum(1 for p in par if p == r) for i, par in enumerate(trees)) / uplink[r]
    return load


@settings(max_examples=60, deadline=None)
@given(n=st.integers(3, 9), data=st.data())
def test_relay_trees_span_the_live_ranks_and_never_raise_the_busiest_link(n, data):
    dead = set(data.draw(st.lists(st.integers(0, n - 1), max_size=n - 3, unique=True)))
    live = [r for r in range(n) if r not in dead]
    roots = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=n - 1))
    sizes = data.draw(st.lists(st.integers(1, 10**7), min_size=len(roots), max_size=len(roots)))
    uplink = data.draw(st.lists(st.floats(1e6, 1e9), min_size=n, max_size=n))
    arrived_at = {r: data.draw(st.floats(0, 10)) for r in live}
    trees = relay_parents(roots, sizes, uplink, arrived_at, live, n)
    stars = [tuple(-1 if (r == o or r in dead) else o for r in range(n)) for o in roots]
    full = [t if t is not None else s for t, s in zip(trees, stars)]
    for par, o in zip(full, roots):
        assert sorted(bfs_order(par, o)) == live  # spans exactly the live ranks from the owner
        assert all(par[r] == -1 for r in dead) and par[o] == -1
        assert all(par[par[r]] in (-1, o) or par[r] == o for r in live if r != o)  # depth <= 2
    before = _link_loads(stars, roots, sizes, uplink, arrived_at, live)
    after = _link_loads(full, roots, sizes, uplink, arrived_at, live)
    assert max(after.values()) <= max(before.values()) * (1 + 1e-9)


def test_a_late_owner_hands_copies_of_its_block_to_early_ranks():
    # the emulated 8-rank star (20 MB/s links, 64 MiB in 7 blocks): ranks arrive over 6 s,
    # owner 6 only 0.1 s before the last: its pieces (6 blocks, 2.9 s) are still going up.
    n, block = 8, (64 << 20) / 7
    at = {0: 0.0, 1: 0.5, 2: 1.0, 3: 2.5, 4: 4.0, 5: 5.0, 6: 5.9, 7: 6.0}
    roots, sizes, uplink = list(range(7)), [block] * 7, [20e6] * n
    trees = relay_parents(roots, sizes, uplink, at, list(range(n)), n)
    stars = [tuple(-1 if r == o else o for r in range(n)) for o in roots]
    full = [t if t is not None else s for t, s in zip(trees, stars)]
    assert trees[6] is not None and sum(1 for p in trees[6] if p == 6) < n - 1
    before = _link_loads(stars, roots, sizes, uplink, at, list(range(n)))
    after = _link_loads(full, roots, sizes, uplink, at, list(range(n)))
    # the star's busiest link is owner 6's: 2.8 s of pieces + 7 copies (3.4 s)
    assert max(before, key=before.get) == 6
    assert max(after.values()) < 0.85 * max(before.values())



def test_a_rank_still_pushing_pieces_of_shared_out_blocks_is_no_relay():
    # The seed-42 trace (docs/fault-tolerance.md, "Where the time after the last arrival
    # went"): rank 0 arrived 10 s before the others, but the blocks were shared out only at
    # the last arrival (``late_owned``), so none of its pieces could leave before then: it
    # still has 3 blocks (3 s) to push and must not relay owner 1's results. Without the
    # shared-out flags it looks idle (10 s since it arrived) and is made owner 1's relay.
    n, at = 4, {0: 0.0, 1: 10.0, 2: 10.0, 3: 10.0}
    roots, sizes, uplink = [1, 1, 2], [100.0] * 3, [100.0] * n
    blind = relay_parents(roots, sizes, uplink, at, list(range(n)), n)
    assert blind[0] is not None and 0 in [p for r, p in enumerate(blind[0]) if r != 0 and p != 1]
    assert relay_parents(roots, sizes, uplink, at, list(range(n)), n, [True] * 3) == [None] * 3
    # blocks owned before the last arrival (claimed) were pushed long ago: rank 0 relays again
    assert relay_parents(roots, sizes, uplink, at, list(range(n)), n, [False] * 3) == blind


@settings(max_examples=60, deadline=None)
@given(n=st.integers(3, 9), data=st.data())
def test_only_ranks_with_no_piece_left_to_push_relay(n, data):
    # every relay of every tree had pushed all its pieces by the last arrival — computed
    # here from the definition: pieces of blocks it does not own, all of them for a block
    # shared out at the last arrival, less what its link moved since it arrived for the
    # others — and the busiest link never gets busier
    live = list(range(n))
    roots = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=2 * n))
    sizes = data.draw(st.lists(st.integers(1, 10**7), min_size=len(roots), max_size=len(roots)))
    late = data.draw(st.lists(st.booleans(), min_size=len(roots), max_size=len(roots)))
    uplink = data.draw(st.lists(st.floats(1e6, 1e9), min_size=n, max_size=n))
    arrived_at = {r: data.draw(st.floats(0, 10)) for r in live}
    last = max(arrived_at.values())
    pieces = {}
    for r in live:
        early = sum(s for s, o, lt in zip(sizes, roots, late) if o != r and not lt) / uplink[r]
        after = sum(s for s, o, lt in zip(sizes, roots, late) if o != r and lt) / uplink[r]
        pieces[r] = max(0.0, early - (last - arrived_at[r])) + after
    trees = relay_parents(roots, sizes, uplink, arrived_at, live, n, late)
    for par, o in zip(trees, roots):
        if par is None:
            continue
        assert sorted(bfs_order(par, o)) == live
        relays = {p for r, p in enumerate(par) if r != o and p not in (-1, o)}
        assert relays and all(pieces[y] <= 0.0 for y in relays), (relays, pieces)

    def busiest(ts):
        copies = {r: sum(sizes[i] * sum(1 for p in par if p == r) for i, par in enumerate(ts)) / uplink[r]
                  for r in live}
        return max(pieces[r] + copies[r] for r in live)
    stars = [tuple(-1 if r == o else o for r in range(n)) for o in roots]
    full = [t if t is not None else st_ for t, st_ in zip(trees, stars)]
    assert busiest(full) <= busiest(stars) * (1 + 1e-9)


# --------------------------------------------------------------------------- star ownership
# (backends/adaptive/star.py maybe_claim / share_rest: who owns the star allreduce's sub-blocks)

def _loads(flows, owners, live, at, up, n, down=None):
    """Each live rank's modelled time after the last arrival for the current ``owners``,
    computed here from the definition (not from share_by_load), per direction of its link:
    out, the pieces owed to known owners less what its link moved since it arrived, plus
    n-1 copies of everything it owns, plus pieces of what it does not; in, the results of
    everything it does not own, plus n-1 pieces of each sub-block it got at the last arrival,
    plus, of each other rank's pieces still to push, the part for the sub-blocks it claimed
    (in proportion to their bytes). Returns ``(finish, out, in)``: finish = the slower
    direction, out / uplink against in / downlink."""
    down = up if down is None else down
    last = max(at[r] for r in live)
    known = {fid for fid, _, o in flows if o >= 0}
    size = {fid: s for fid, s, _ in flows}
    owed = {r: sum(size[f] for f in known if owners[f] != r) for r in live}
    rem = {r: max(0.0, owed[r] - up[r] * (last - at[r])) for r in live}
    out, into = {}, {}
    for r in live:
        mine = [f for f, o in owners.items() if o == r]
        after = sum(size[f] for f in size if f not in known and owners[f] != r)
        out[r] = rem[r] + after + (n - 1) * sum(size[f] for f in mine)
        claimed = sum(size[f] for f in mine if f in known)
        late = sum(rem[k] * claimed / owed[k] for k in live if k != r and owed[k] > 0)
        into[r] = (sum(size.values()) - sum(size[f] for f in mine)
                   + (n - 1) * sum(size[f] for f in mine if f not in known) + late)
    finish = {r: max(out[r] / up[r], into[r] / down[r]) for r in live}
    return finish, out, into


def test_a_late_arrival_claims_only_what_keeps_its_link_within_an_early_owners_load():
    # 8 ranks, 56 sub-blocks of 1 MB, cap 1.25 equal shares = 10 MB, so the budget of any
    # link after the last arrival is 7 x 10 = 70 MB (an early owner's results at the cap).
    # The second-to-last arrival, with 50 MB of pieces for the sub-blocks others claimed still
    # queued, may take two (50 + 14 <= 70; a third would make 71): its link then finishes no
    # later than an early owner's
    n, cap = 8, 10e6
    assert claim_count([1e6] * 6, owned=0, push=50e6, backlog=0, present=8, n=n, cap=cap) == 2
    # ... but if its link is half as fast as the fastest, the same bytes take twice as long:
    # 50 + 7 > 35, it claims nothing and ends like the last rank (pieces up, results down).
    # Before claims it owned a whole block: its link carried 1.86 hops after the last arrival
    assert claim_count([1e6] * 6, owned=0, push=50e6, backlog=0, present=8, n=n, cap=cap, speed=0.5) == 0
    assert claim_count([1e6] * 6, owned=0, push=20e6, backlog=0, present=8, n=n, cap=cap, speed=0.5) == 2
    # an early rank with its link idle takes two at once, and never more than the cap
    assert claim_count([1e6] * 20, owned=0, push=0, backlog=0, present=3, n=n, cap=cap) == 2
    assert claim_count([1e6] * 20, owned=9e6, push=0, backlog=0, present=3, n=n, cap=cap) == 1
    assert claim_count([1e6] * 20, owned=10e6, push=0, backlog=0, present=3, n=n, cap=cap) == 0
    # pacing: while a sub-block of pieces from the present ranks is still on its way in, no
    # second one is asked for
    assert claim_count([1e6] * 20, owned=2e6, push=0, backlog=2e6 + 1, present=3, n=n, cap=cap) == 0


def test_share_by_load_weighs_what_each_link_still_carries_after_the_last_arrival():
    # 4 ranks, 12 sub-blocks of 1 MB on 1 MB/s links. Ranks 0 and 1 arrived 20 s early and
    # claimed 3 each (their pieces left long ago); rank 2 arrived 0.1 s and rank 3 (the last)
    # 0 s before the end, each with 6 MB of pieces for the claimed sub-blocks still to push.
    # Early owners carry 3 copies of what they own (9 MB) + the free pieces (6 MB) = 15 MB,
    # the late ranks 6 + 6 = 12 MB: the late links have room, the free sub-blocks go there
    # first (owning one adds n-2 = 2 MB: 2, 3, 2, 3, then every link is at 16 MB)
    flows = [(i, 1e6, 0 if i < 3 else 1 if i < 6 else -1) for i in range(12)]
    at = {0: 0.0, 1: 0.0, 2: 19.9, 3: 20.0}
    got = share_by_load(flows, [0, 1, 2, 3], at, [1e6] * 4, 4)
    assert got == {6: 2, 7: 3, 8: 2, 9: 3, 10: 0, 11: 1}
    # the same arrivals, but rank 2's link is 4x slower in the plan: 11.9 MB there take
    # 47.6 s against 15-16 s elsewhere, so the second-to-last arrival owns nothing
    up = [1e6, 1e6, 0.25e6, 1e6]
    got = share_by_load(flows, [0, 1, 2, 3], at, up, 4)
    assert set(got) == set(range(6, 12)) and 2 not in got.values(), got
    owners = {fid: o for fid, _, o in flows} | got
    finish = _loads(flows, owners, [0, 1, 2, 3], at, up, 4)[0]
    assert max(finish[r] for r in (0, 1, 3)) < finish[2]


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9), st.data())
def test_share_by_load_gives_every_free_sub_block_to_a_live_rank_and_keeps_claims(n, data):
    k = data.draw(st.integers(1, 4 * (n - 1)))
    live = data.draw(st.permutations(range(n)))[: data.draw(st.integers(1, n))]
    flows = [(i, data.draw(st.integers(1, 10)) * 1000, data.draw(st.sampled_from([-1] + list(live))))
             for i in range(k)]
    at = {r: data.draw(st.floats(0, 10)) for r in live}
    up = [data.draw(st.sampled_from([1e3, 1e4, 1e5])) for _ in range(n)]
    down = [data.draw(st.sampled_from([1e3, 1e4, 1e5])) for _ in range(n)]
    got = share_by_load(flows, live, at, up, n, down)
    assert set(got) == {fid for fid, _, o in flows if o < 0}
    assert set(got.values()) <= set(live)
    # greedy by load: the owner of each free sub-block had, when it was given out, the least
    # finishing time after taking it (checked by replaying the definition)
    owners = {fid: o for fid, _, o in flows}
    for fid, s, o in flows:
        if o >= 0:
            continue
        _, out, into = _loads(flows, owners, live, at, up, n, down)

        def then(r):  # r's finishing time were it to own this sub-block
            return max((out[r] + (n - 2) * s) / up[r], (into[r] + (n - 2) * s) / down[r])
        best = min(then(r) for r in live)
        r = got[fid]
        assert then(r) <= best * (1 + 1e-9)
        owners[fid] = r


def test_share_by_load_weighs_the_incoming_side_of_each_link():
    # 4 ranks, 12 sub-blocks of 1 MB on 1 MB/s full-duplex links. Ranks 0 and 1 arrived at 0
    # and claimed 4 each; rank 2 arrived 8 s before the last (rank 3, at 20 s) and has pushed
    # all 8 MB of its pieces; rank 3 pushes its 8 MB after L. Out of each link after L:
    # 0 and 1: 3 x 4 copies + 4 free pieces = 16 MB; 2: 4 free pieces; 3: 8 + 4 = 12 MB.
    # Into each: 0 and 1: 8 MB of results + rank 3's 4 MB of pieces = 12 MB; 2 and 3: 12 MB
    # of results. Counting only what leaves, rank 2 looks idle and would take all 4 free
    # sub-blocks (out 4 -> 12 MB), but each one brings 3 pieces in for 1 result: its downlink
    # would carry 12 + 4 x 2 = 20 MB. Counting both directions, ranks 2 and 3 take two each
    # and no link carries more than the early owners' 16 MB.
    flows = [(i, 1e6, 0 if i < 4 else 1 if i < 8 else -1) for i in range(12)]
    at = {0: 0.0, 1: 0.0, 2: 12.0, 3: 20.0}
    live = [0, 1, 2, 3]
    got = share_by_load(flows, live, at, [1e6] * 4, 4)
    assert got == {8: 2, 9: 3, 10: 2, 11: 3}
    owners = {fid: o for fid, _, o in flows}
    finish, out, into = _loads(flows, owners | got, live, at, [1e6] * 4, 4)
    assert max(finish.values()) == pytest.approx(16.0)
    # the out-only greedy (the rule before) gives rank 2 everything: its downlink then
    # takes 20 s, 1.25x the early owners' 16 s
    old = dict.fromkeys(got, 2)
    finish_old, out_old, into_old = _loads(flows, owners | old, live, at, [1e6] * 4, 4)
    assert out_old[2] == pytest.approx(12e6) and finish_old[2] == pytest.approx(20.0)
    # a downlink the plan says is 4x slower keeps free sub-blocks away from that rank too
    got = share_by_load(flows, live, at, [1e6] * 4, 4, [1e6, 1e6, 0.25e6, 1e6])
    assert 2 not in got.values(), got


def test_a_claim_waits_while_absent_ranks_could_still_flood_the_incoming_side():
    # 8 ranks, 56 sub-blocks of 1 MB, cap 10 MB, budget 70 MB per direction. Four ranks are
    # present, this one owns 4 MB and has pushed everything. Out, one more would make
    # 7 x 5 = 35 MB. In, were the last rank to arrive now: each of the 4 absent ranks sends a
    # piece of every sub-block it owns (4 x 5 MB) and 51 MB of results come down = 71 MB >
    # 70: no claim. Counting only the outgoing side (no ``total``), it would take two.
    n, cap = 8, 10e6
    kw = dict(owned=4e6, push=0, backlog=0, present=4, n=n, cap=cap)
    assert claim_count([1e6] * 20, **kw) == 2
    assert claim_count([1e6] * 20, total=56e6, **kw) == 0
    # one arrival later (3 absent) the same claim fits: 3 x 5 + 51 = 66 MB <= 70; up to
    # 7 MB owned: 2 x 7 + 56 = 70
    kw.update(present=5)
    assert claim_count([1e6] * 20, total=56e6, **kw) == 2
    assert claim_count([1e6] * 20, total=56e6, **{**kw, "owned": 6e6}) == 1
    # pieces the present ranks still owe it count in too (backlog)
    assert claim_count([1e6] * 20, total=56e6, **{**kw, "owned": 6e6, "backlog": 0.5e6}) == 0
    # a downlink half as fast halves the incoming budget: 56 MB of results alone exceed 35
    assert claim_count([1e6] * 20, total=56e6, speed_in=0.5, **kw) == 0
