"""hcc.compiler.packing_choice — of a packing's shallow and deep forms, the faster schedule.

Terms
- *deep packing*: pack_allgather's first phase alone (``shallow=False``): the LP optimum over
  any trees, which on a switch or a ring comes out as long chains.
- *shallow packing*: the same rate over depth-bounded trees (treepack_shallow.py, the default
  up to treepack._SHALLOW_PHASE_MAX_RANKS ranks; its ``method`` says "shallow(depth D)").
- *one-uplink rank*: a rank whose every link goes to one switch (samples/nvswitch.hcl's GPUs;
  not DGX-1's, which have NVLinks beside their PCIe switch, nor an A100's, with an NVSwitch
  port and a NIC).
- *star through a switch*: a tree in which a one-uplink rank has two children or more: every
  copy it sends goes out, one after the other, on its one link.

Why: the two packings have the same rate, but not the same schedule. Over direct links and
ranks with several links the shallow trees fill the pipeline sooner (DGX-1, A100, MI250:
+0.02 to +0.11 of the bound). On one switch they are 1-level stars: each root puts all 7
copies of a chunk on its one uplink, where a 7-deep chain sent one and the next rank
forwarded it (samples/nvswitch.hcl allgather at 1 GB: 0.890 of the bound over the stars,
0.997 over the chains). So where the shallow packing has a star through a switch, both are
lowered as the candidate lowers them (lower.lower_priced, with a chunk search) and the
faster is kept. Elsewhere the shallow packing is kept without pricing: pricing both
everywhere a route crosses a switch doubled the allgather compile CPU on two A100 servers
(2.0-2.5 s -> 4.0-4.4 s, where ForestColl takes 12.3 s) and added 0.7 s on DGX-1, for no
change of plan at 1 GB on either.

Broadcast and reduce (:func:`faster_broadcast_packing`, up to BROADCAST_CHOICE_MAX_RANKS
ranks): the LP's trees at the cut rate are as deep as its vertex solution makes them (DGX-1:
chains 7 deep, one MI250 node 14), and CP-SAT's fewest trees, built from the LP's edges, as
deep as they come out. So the same rate is looked for within depth caps
(treepack.pack_broadcast's ``depth``): the depth-bounded phase's own depth D and one level
less, CP-SAT's fewest trees within each over the phase's columns; then, a level at a time
below the shallowest found, caps probed alone (the depth-bounded pricer's columns at that
depth, at whatever rate it reaches, and CP-SAT's fewest trees within the cap at the full
rate over their edges), until a cap has none or CAPPED_FORMS caps were tried. Shallower is
not always faster (a rank with more children sends more copies in a row, and the trees a
cap leaves may share links unevenly: the phase's own packing, kept unpriced, lost on
dgx1:03457, 0.965 -> 0.945 at 256 MiB), and CP-SAT's trees depend on the columns it starts
from (DGX-1 fragment 1-7 at depth 4: 0.897 of the bound from the phase's, 0.881 from the
probe's), so every packing found is lowered as the candidate lowers it and the fastest is
kept. DGX-1's broadcast at 256 MiB / 1 GiB: 0.843 / 0.916 of the bound over the 7-deep
trees, 0.866 / 0.926 over 4-deep ones; one MI250 node's from GCD 0: 0.705 / 0.826 over
14-deep trees, 0.754 / 0.862 over 10-deep ones.

Lanes (broadcast and reduce, up to LANES_MAX_RANKS ranks, :func:`_lanes`): where the ranks
sit on hosts of one size and each has its own route onto the fabric (two MI250 nodes), the
lane trees of compiler/rank_lanes.py are one more form, priced beside the others (past
BROADCAST_CHOICE_MAX_RANKS ranks, beside the deep packing alone). Two MI250 nodes' broadcast
from GCD 0 at 64 MiB / 256 MiB / 1 GiB: 0.473 / 0.638 / 0.766 of the bound over the packing's
63 trees, 0.535 / 0.729 / 0.873 over 53 lane trees.

Twins (allgather and reduce-scatter, up to TWIN_MAX_RANKS ranks). In-trees over a topology
are out-trees over its links turned round (:meth:`Topology.transposed`), recorded alike
(each edge's path parent .. child), so an allgather packing can be solved either way: as
out-trees over the links, or as in-trees over the links turned round. The LP's optimum is
degenerate and GLOP's vertex, and CP-SAT's few trees over its columns, depend on the order
the links are indexed in, so the two *twins* are different trees at the same rate; both are
lowered as the candidate lowers them and the faster is kept. samples/hetero.hcl's mesh
allgather at 64 MiB / 256 MiB / 1 GiB: 0.950 / 0.974 / 0.987 of the bound -> 0.994 / 0.995
/ 0.995 over the twin (its reduce-scatter keeps its own in-trees, whose twin is slower, and
``replay`` of the faster allgather wins there). The same pair for broadcast (a reduce already
has one: its own in-trees and ``replay``'s broadcast over the transposed links) changed no
plan on DGX-1, three of its fragments, one MI250 node, the hetero graphs or the random ones.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .chunks import best_time

__all__ = ["BROADCAST_CHOICE_MAX_RANKS", "faster_allgather_packing", "faster_broadcast_packing", "one_uplink_ranks",
           "stars_through_switch"]

# broadcast and reduce packings are chosen by price up to this many ranks (CP-SAT's few-trees
# search, which the depth caps steer, runs up to treepack_few._FEW_MAX_RANKS = 16); past it
# the LP's trees are kept without pricing others
BROADCAST_CHOICE_MAX_RANKS = 16
# CP-SAT's deterministic seconds for each depth-capped few-trees search (the deep packing's
# keeps treepack's 0.5): DGX-1's capped trees were found at 0.25 as at 0.5 (the same plans on
# DGX-1, its fragment 1-7, one MI250 node and a random 6-rank graph), not at 0.1; the
# searches were most of the broadcast's compile (2.7 of 4.2 CPU s at 64 MiB for two)
CAPPED_BUDGET_S = 0.25
# depth caps tried, at most (one MI250 node: the phase's 12 and 11, probes at 10 and 9, 9 has
# none; DGX-1: 5, 4, a probe at 3 that has none)
CAPPED_FORMS = 5

# up to this many ranks an allgather (reduce-scatter) packing is also solved as in-trees
# (out-trees) over the links turned round, and the faster kept (module docstring, "Twins"):
# each costs a packing and two chunk searches, which at 16 ranks (one MI250 node's allgather,
# 0.14 CPU s) would triple the compile
TWIN_MAX_RANKS = 8

# broadcast and reduce price rank_lanes.py's lane trees beside the others up to this many
# ranks (replay.REPLAY_MAX_RANKS's reach): two MI250 nodes, 32 ranks, 53 lane trees
LANES_MAX_RANKS = 64

# chunk sizes the choice tries past the first slower one (chunks.choose_chunk's patience): the
# timed tree plans are not unimodal in the chunk size while a tree share holds 1-3 chunks
# (pipeline.Lower gives them the same second chance)
_PATIENCE = 2


def one_uplink_ranks(topo: Any, ranks: tuple[str, ...]) -> frozenset[str]:
    """The ranks of ``ranks`` whose every link (either way) goes to one and the same switch."""
    ends: dict[str, set[str]] = {r: set() for r in ranks}
    for link in topo.restricted(ranks).links:
        for a, b in ((link.src, link.dst), (link.dst, link.src)):
            if a in ends:
                ends[a].add(b)
    return frozenset(r for r, e in ends.items() if len(e) == 1 and next(iter(e)) not in ends)


def stars_through_switch(packing: Any, topo: Any, ranks: tuple[str, ...]) -> bool:
    """Some tree of ``packing`` (over ``ranks``) gives a one-uplink rank
    (:func:`one_uplink_ranks`) two children or more."""
    lone = one_uplink_ranks(topo, ranks)
    for t in packing.trees:
        kids: dict[str, int] = {}
        for parent, _, _ in t.edges:
            if parent in lone:
                kids[parent] = kids.get(parent, 0) + 1
                if kids[parent] >= 2:
                    return True
    return False


def _priced(u: Any, packing: Any, algorithm: str) -> float:
    """The predicted time of ``algorithm``'s schedule over ``packing``'s trees at the best
    chunk size (the spec's own when it fixes one)."""
    from .lower import lower_priced

    spec = u.spec
    if spec.kind == "allreduce" and spec.compress != "none":  # as registry.builder lowers it
        spec = replace(spec, compress="none")
    return best_time(spec, lambda c: lower_priced(spec, u.topology, packing.trees, c, algorithm=algorithm,
                                                  model=u.model), model=u.model, patience=_PATIENCE)


def faster_allgather_packing(u: Any, *, reverse: bool, algorithm: str) -> Any:
    """The allgather packing (in-trees with ``reverse``) of unit ``u`` whose schedule under
    ``algorithm``'s lowering is predicted faster: up to TWIN_MAX_RANKS ranks the faster of the
    shallow one and its twin (module docstring); then that one unless it differs from the deep
    one, has a star through a switch (:func:`stars_through_switch`), and simulates slower than
    the deep one (ties keep it). A twin or the deep packing, when kept, says so in its
    ``method``."""
    from . import treepack

    topo, ranks = u.topology, u.spec.ranks
    shallow = treepack.pack_allgather(topo, ranks, reverse=reverse)
    t_shallow = None  # its predicted time, once priced
    if len(ranks) <= TWIN_MAX_RANKS:
        # the same LP indexed the other way round (module docstring, "Twins")
        twin = treepack.pack_allgather(topo.transposed(), ranks, reverse=not reverse)
        if {t.edges for t in twin.trees} != {t.edges for t in shallow.trees}:
            t_twin, t_shallow = _priced(u, twin, algorithm), _priced(u, shallow, algorithm)
            if t_twin < t_shallow:
                shallow = replace(twin, method=f"{twin.method}, over the links turned round (faster)")
                t_shallow = t_twin
    if "shallow(" not in shallow.method or not stars_through_switch(shallow, topo, ranks):
        return shallow
    deep = treepack.pack_allgather(topo, ranks, reverse=reverse, shallow=False)
    if t_shallow is None:
        t_shallow = _priced(u, shallow, algorithm)
    if _priced(u, deep, algorithm) < t_shallow:
        return replace(deep, method=f"{deep.method} (faster than {shallow.method})")
    return shallow


def faster_broadcast_packing(u: Any, root: str, *, reverse: bool, algorithm: str = "treepack") -> Any:
    """The broadcast packing from ``root`` (in-trees to it with ``reverse``: a reduce's) of
    unit ``u`` whose schedule under ``algorithm``'s lowering is predicted fastest, of the
    deep one, those within depth caps below it (up to BROADCAST_CHOICE_MAX_RANKS ranks, where
    the deep one has two trees or more) and the lane trees (module docstring): the deep one
    where there is no other; ties keep the one found first. Another packing kept says so in
    its ``method``."""
    from . import treepack

    topo, ranks = u.topology, u.spec.ranks
    deep = treepack.pack_broadcast(topo, ranks, root, reverse=reverse)
    forms = [deep]
    if len(ranks) <= BROADCAST_CHOICE_MAX_RANKS and len(deep.trees) >= 2:
        forms += _capped_forms(topo, ranks, root, reverse, deep)
    lanes = _lanes(topo, ranks, root, reverse, deep) if len(ranks) <= LANES_MAX_RANKS else None
    if lanes is not None:
        forms.append(lanes)
    if len(forms) == 1:
        return deep
    seen, timed = set(), []
    for p in forms:
        key = tuple(sorted((t.edges, round(t.rate)) for t in p.trees))
        if key in seen:
            continue
        seen.add(key)
        timed.append((_priced(u, p, algorithm), len(timed), p))
    best = min(timed, key=lambda x: (x[0], x[1]))[2]
    if best is deep:
        return deep
    return replace(best, method=f"{best.method} (faster than {deep.method})")


def _capped_forms(topo: Any, ranks, root: str, reverse: bool, deep: Any) -> list:
    """The depth-capped packings below ``deep`` (module docstring), shallowest last."""
    from . import treepack

    def capped(cap: int, probe: bool = False):
        return treepack.pack_broadcast(topo, ranks, root, reverse=reverse, depth=cap, probe=probe,
                                       few_trees_time=CAPPED_BUDGET_S)

    forms = []
    shallow = capped(-1)
    if shallow is not None:
        forms.append(shallow)
        lower = capped(tree_depth_of(shallow) - 1)
        if lower is not None:
            forms.append(lower)
    cap = min(tree_depth_of(p) for p in forms + [deep]) - 1
    while cap >= 1 and len(forms) < CAPPED_FORMS:
        got = capped(cap, probe=True)
        if got is None:
            break
        forms.append(got)
        cap = tree_depth_of(got) - 1
    return forms


def _lanes(topo: Any, ranks, root: str, reverse: bool, deep: Any) -> Any:
    """rank_lanes.py's lane trees as a Packing beside ``deep`` (in-trees: the out-trees of
    the transposed topology), or None where lanes do not apply."""
    import time

    from .rank_lanes import host_groups, rank_lane_trees
    from .treepack import Packing

    t0 = time.perf_counter()
    trees = rank_lane_trees(topo.transposed() if reverse else topo, ranks, root, deep.bound)
    if not trees:
        return None
    hosts = host_groups(topo, ranks, root)
    rate = sum(t.rate for t in trees)
    gap = 1.0 - rate / deep.bound if deep.bound > 0 else 0.0
    return Packing((root,), tuple(trees), rate, deep.bound, rate, gap, time.perf_counter() - t0,
                   f"rank lanes ({len(hosts[0])} lanes over {len(hosts)} hosts)", len(trees))


def tree_depth_of(packing: Any) -> int:
    """The deepest of ``packing``'s trees (:func:`tree_depth`)."""
    return max(tree_depth(t) for t in packing.trees)


def tree_depth(tree: Any) -> int:
    """Levels of a PackedTree below its root (a route through switches is one level)."""
    from .trees import tree_levels

    return max(tree_levels(tree).values())
