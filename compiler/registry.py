"""hcc.compiler.registry — every schedule the compiler can price, one :class:`Algorithm` each.

Terms
- algorithm: a named way to run a collective (a *candidate* of the pipeline's ``lower`` pass):
  which kinds it has a form for, when ``algorithm = auto`` may offer it (``eligible``), the
  packing it needs (``pack``, computed once per compile and kept on the unit under its
  ``role``), how it lowers at a chunk size (``lower``), and the rate its packing sustains
  (``pack_rate``, ``steady_rate``: the figures). :data:`REGISTRY` lists them in the order auto
  offers them; the pipeline (compiler/pipeline.py) only loops over it.
- baseline: an NCCL-like algorithm (compiler/baselines.py, channels.py). Baselines are lowered
  for every tree kind whatever ``algorithm`` says (the figures report them) and searched over
  every chunk size; on a tie ``select`` prefers the compiler's own schedule.
- treepack family: the compiler's packings (``algorithm = treepack`` chooses among them).
- sole kinds: kinds an algorithm is the only form of, whatever ``algorithm`` says: alltoall
  is always ``direct``, neighbor_average always ``relax``.

To add an algorithm: write its plan builder (a module of its own), add one :class:`Algorithm`
to :data:`REGISTRY`; forcing it from a program also needs its name in frontend.NAMED_FORMS
and docs/language.md.

The names (``Plan.algorithm`` tells which ran):

    relax            the compressed / decentralized lowering (lower_relax.py): allreduce when
                     ``compress != none``; neighbor_average always
    treepack-rings   allreduce as a ring allreduce on each directed Hamiltonian ring of an LP
                     packing (ringpack.py), up to ringpack.RINGS_MAX_RANKS ranks
    treepack-hier    allreduce over the two sides of the narrowest rank cut (hier.py), priced
                     where that cut nearly binds the allreduce floor (:data:`HIER_CUT_SHARE`)
    treepack-levels  allgather, reduce_scatter and allreduce in two levels over the hosts or
                     racks the topology groups its ranks into (levels.py): rings inside each
                     group, host- or rack-sized ranges across the fabric in parallel lanes
    treepack         the trees of the packing (treepack.py; lower.lower_priced), for broadcast
                     and reduce the fastest of its forms (packing_choice.py), lane trees
                     over hosts whose ranks each reach the fabric among them (rank_lanes.py)
    treepack-dbt     broadcast and reduce over topology-aware double binary trees
                     (bcast_trees.py): host-grouped, routes spread over the spines, one
                     pair of host-level trees per port where hosts have several
    treepack-wide    broadcast and reduce over one tree per port of multi-port hosts, each
                     host sending to up to one child per port (bcast_wide.py): shallower
                     than treepack-dbt's binary pairs
    treepack-ringfill allgather, reduce_scatter and allreduce over NCCL's ring channels and,
                     at once, trees packed into the capacity the rings leave (ringfill.py):
                     DGX-1's six NVLink rings plus trees over its idle PCIe switches
    rounds           broadcast and reduce in paced rounds over one switch, one block sent and
                     one received per rank and round (rounds.py): about log2(n) rounds of
                     fill where a chain takes n - 2; forced only (auto does not offer it)
    replay           reduce as the fastest broadcast over the transposed links run backwards
                     in time (replay.py), reduce-scatter as the fastest allgather the same
                     way, up to replay.REPLAY_MAX_RANKS ranks, not over one switch unless named
    treepack-rsag    allreduce as reduce-scatter + allgather over the allgather packing
    treepack-bidir   allreduce as reduce-then-broadcast over trees packed to load their links
                     both ways (bidir.py, Blink's allreduce), up to bidir.BIDIR_MAX_RANKS ranks
    treepack-split   allreduce reducing over in-trees and broadcasting over out-trees packed
                     together by one LP (splitpack.py), up to splitpack.SPLIT_MAX_RANKS ranks
    ring             the single ring (baselines.py)
    rings            NCCL's multi-channel rings (channels.py)
    tree             the double binary tree (baselines.py; a ring for kinds NCCL runs on rings)
    rd               recursive doubling / Bruck (baselines.py), allgather and reduce_scatter
    direct           every rank to every rank in one hop (baselines.py; lower.py for alltoall)
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ..grammar.errors import HccError
from ..ir.errors import VerifyError
from ..ir.plan import Plan
from . import baselines
from .bcast_trees import dbt_plan, dbt_trees, trees_rate
from .bcast_wide import host_depth, wide_plan, wide_trees
from .bidir import BIDIR_MAX_RANKS, bidir_packing, bidir_plan
from .channels import ring_channels_memo, ring_priced, rings_priced
from .chunks import best_time
from .hier import hier_plan, two_level_cut
from .levels import LEVEL_KINDS, levels_forms, levels_priced
from .lower_relax import relax_plan
from .packing_choice import faster_allgather_packing, faster_broadcast_packing
from .program import CollectiveSpec
from .ringfill import RINGFILL_MAX_RANKS, ringfill_builder, ringfill_packing
from .replay import REPLAY_MAX_RANKS, replayed_reduce
from .ringpack import RINGS_MAX_RANKS, ring_packing, rings_plan
from .rounds import ROUNDS_KINDS, ROUNDS_MAX_RANKS, one_switch, rounds_plan
from .splitpack import SPLIT_MAX_RANKS, pack_split, split_priced

__all__ = ["Algorithm", "BASELINES", "REGISTRY", "algorithm", "candidates_for"]

Builder = Callable[[int], Any]  # chunk bytes -> Plan, or (Plan, Simulation) when it prices itself

TREE_KINDS = frozenset({"broadcast", "reduce", "gather", "scatter", "allgather", "reduce_scatter", "allreduce"})
# direct (every rank to every rank in one message each) puts n(n-1) messages per chunk on a
# topology; past 16 ranks it never won on the samples (32-rank cluster: 30 ms against 9 ms for
# the trees) and its chunk search alone took 10 s, so auto skips it there (forcing it works)
DIRECT_AUTO_MAX_RANKS = 16
# treepack-hier is priced when the narrowest rank cut nearly binds the allreduce floor
# (M / cut >= 0.95 x floor): the exchange helps where a cut is the bottleneck (two hosts: M / cut
# is the floor), and elsewhere only costs a chunk search that loses (DGX-1's 8 GPUs: the cut is
# one GPU's 100 GB/s against a floor of M / 85.7 GB/s, and its chains run at one link's rate)
HIER_CUT_SHARE = 0.95
# the chunk search of the treepack-bidir/-hier/-rings candidates stops at size / 256 (256 KiB
# for 64 MiB): on the netem-scaled DGX-1 fragment (20 MB/s links, where 1 us per message is
# nothing) the bidirectional trees went on to 8 KiB for 1.5% (2.2765 -> 2.2422 s) at 10 s of
# search; at real NVLink rates the best chunks are 0.5-2 MiB
NEW_FORMS_MAX_CHUNKS = 256


def _always(spec: CollectiveSpec) -> bool:
    return True


def _none(u, packing) -> float:
    return 0.0


@dataclass(frozen=True)
class Algorithm:
    """One candidate schedule. ``eligible(spec)``: auto may offer it (``kinds`` is checked
    first). ``pack(unit)``: its packing, or None when it has no form here (stored under
    ``role``; algorithms without a packing have none). ``lower(unit, spec, packing)``: the
    builder of its plan at a chunk size, or None when it cannot run. ``pack_rate(unit,
    packing)``: the packing's rate in the bound's units (0: none); ``steady_rate``: the
    schedule's steady-state rate for the figures, None for the simulated algbw."""

    name: str
    kinds: frozenset[str]
    lower: Callable[[Any, CollectiveSpec, Any], Builder | None]
    eligible: Callable[[CollectiveSpec], bool] = _always
    role: str = ""
    pack: Callable[[Any], Any] | None = None
    pack_rate: Callable[[Any, Any], float] = _none
    steady_rate: Callable[[Any, Any], float | None] | None = None
    baseline: bool = False
    treepack: bool = False
    sole_kinds: frozenset[str] = frozenset()
    max_chunks: int = 0  # the chunk search stops at size / max_chunks (0: every size)
    # every message of its plan at chunk size s carries at most s bytes, so auto may skip the
    # sizes whose chunk floor cannot beat the best plan so far (chunk_floor.py)
    chunked: bool = False
    # auto offers it (False: only where the program names it)
    auto: bool = True
    # its trees are packed again at each chunk size, so its time is not smooth in the size:
    # the plan selected is also priced at pipeline.REFINE_FINE of its chunk
    repacked: bool = False

    def offered(self, spec: CollectiveSpec) -> bool:
        """``algorithm = auto`` may offer it for ``spec``."""
        return self.auto and spec.kind in self.kinds and self.eligible(spec)


# -- the treepack family -------------------------------------------------------------------------
def _root(spec: CollectiveSpec) -> str:
    return spec.ranks[spec.root] if spec.root >= 0 else spec.ranks[0]


def _pack_trees(u):
    """The packing of ``treepack``: out-trees from the root (broadcast, scatter), in-trees to it
    (reduce, gather), an allgather packing (its reverse for reduce_scatter), and for allreduce
    Blink's trees from rank 0, reduced up and broadcast down the same trees (they must exist in
    both directions; every link in the samples is full duplex)."""
    from . import treepack

    spec, topo, ranks = u.spec, u.topology, u.spec.ranks
    kind = spec.kind
    if kind in ("broadcast", "reduce"):
        # the deep or a depth-capped packing, whichever schedules fastest (packing_choice.py)
        return faster_broadcast_packing(u, _root(spec), reverse=kind == "reduce")
    if kind == "scatter":
        return treepack.pack_broadcast(topo, ranks, _root(spec))
    if kind == "gather":
        return treepack.pack_broadcast(topo, ranks, _root(spec), reverse=True)
    if kind in ("allgather", "reduce_scatter"):
        # the shallow or the deep packing, whichever schedules faster (packing_choice.py)
        return faster_allgather_packing(u, reverse=kind == "reduce_scatter", algorithm="treepack")
    return treepack.pack_broadcast(topo, ranks, ranks[0])


def _pack_dbt(u):
    """The double binary trees of bcast_trees.py (in-trees for reduce), None under 3 ranks."""
    return dbt_trees(u.topology, u.spec.ranks, u.spec.root, inward=u.spec.kind == "reduce")


def _dbt_rate(u, trees) -> float:
    """The double binary trees' rate at their shares (bcast_trees.trees_rate)."""
    return trees_rate(u.topology, trees, inward=u.spec.kind == "reduce") if trees else 0.0


def _pack_wide(u):
    """The lane trees of bcast_wide.py (in-trees for reduce), None where lanes do not apply:
    with the NVSwitch hosts' leaf trees as stars or not (wide_trees ``stars``), whichever
    the chunk search prices faster (ties keep the least-loaded trees)."""
    inward = u.spec.kind == "reduce"
    plain = wide_trees(u.topology, u.spec.ranks, u.spec.root, inward=inward)
    if plain is None:
        return None
    ways = [plain, wide_trees(u.topology, u.spec.ranks, u.spec.root, inward=inward, stars=True)]
    hosts = len({u.topology.host_of(r) for r in u.spec.ranks})
    chains = 3 <= hosts <= host_depth(u.topology, plain) + 2  # chains one host level deeper at most
    if chains:
        ways += [wide_trees(u.topology, u.spec.ranks, u.spec.root, inward=inward, stars=s, chains=True)
                 for s in (False, True)]
    if not inward:  # the paced lanes (bcast_wide._paced) over stars from each port's rank
        ways.append(wide_trees(u.topology, u.spec.ranks, u.spec.root, stars=True, chains=chains, root_stars=True))
    ways = [w for i, w in enumerate(ways) if w is not None and w not in ways[:i]]
    if len(ways) == 1:
        return plain
    return min(ways, key=lambda trees: best_time(
        u.spec, lambda c: wide_plan(u.spec, u.topology, trees, c, model=u.model), model=u.model))


def _pack_rsag(u):
    return faster_allgather_packing(u, reverse=False, algorithm="treepack-rsag")


def _lower_trees(name: str):
    def build(u, spec, p) -> Builder | None:
        if p is None:
            return None
        from .lower import NARROW_KINDS, lower_priced, narrow_tree_factors

        # the timed schedule keeps each tree at its packed share of every link (lower.py,
        # "timed lowering"): DGX-1 allgather 0.63 -> 0.80 of the bound at 1 GB; the plain
        # order is kept where it simulates faster (lower_priced), broadcast and reduce are
        # priced in the narrow-link form too, reduce and reduce-scatter with halved last chunks
        narrow = narrow_tree_factors(spec, u.topology, p.trees) if spec.kind in NARROW_KINDS else None
        return lambda c: lower_priced(spec, u.topology, p.trees, c, algorithm=name, model=u.model, narrow=narrow,
                                      halves=True)

    return build


def _link_factor(trees, both: bool, caps: dict[tuple[str, str], float]) -> float:
    """min over arcs of capacity / load when the trees carry their rates (``both``: every
    tree edge loaded in each direction, as reduce-then-broadcast does), orientation of a
    reversed packing taken either way; at most 1. Each distinct path's arcs are numbered
    once and the loads summed by numpy in the same order as one sum per arc would (the
    1024-rank fat tree's 1472 trees x 1023 edges took 5 s as a dict sum per hop)."""
    import numpy as np

    ids: dict[tuple[str, str], int] = {}
    paths: dict[tuple, tuple[list[int], list[int]]] = {}
    fwd: list[int] = []
    rev: list[int] = []
    weight: list[float] = []
    for t in trees:
        for edge in t.edges:
            path = tuple(edge[2]) if len(edge) > 2 else (edge[0], edge[1])
            got = paths.get(path)
            if got is None:
                hops = list(zip(path, path[1:]))
                got = paths[path] = ([ids.setdefault(a, len(ids)) for a in hops],
                                     [ids.setdefault((b, a), len(ids)) for a, b in hops])
            if both:
                fwd += got[0] + got[1]
                weight += [t.rate] * (2 * len(got[0]))
            else:
                fwd += got[0]
                rev += got[1]
                weight += [t.rate] * len(got[0])
    cap = np.array([caps.get(a, 0.0) for a in ids], dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    best = 0.0
    for seq in ((fwd,) if both else (fwd, rev)):
        idx = np.asarray(seq, dtype=np.int64)
        load = np.bincount(idx, weights=w, minlength=len(ids))
        seen = np.bincount(idx, minlength=len(ids)) > 0
        l, c = load[seen], cap[seen]
        pos = l > 0
        factors = np.where(pos, c / np.where(pos, l, 1.0), 1.0)
        best = max(best, float(factors.min()) if factors.size else 1.0)
    return min(1.0, best)


def _trees_rate(u, p) -> float:
    """A tree packing's rate at its LP rates, cut to what the links carry (trees of an
    allreduce are loaded both ways)."""
    if p is None or not p.trees:
        return 0.0
    if u.spec.kind in ("gather", "scatter"):
        return u.bound_rate_Bps * p.rate / p.bound if getattr(p, "bound", 0) else 0.0
    caps: dict[tuple[str, str], float] = {}
    for l in u.topology.restricted(tuple(u.spec.ranks)).links:
        caps[(l.src, l.dst)] = caps.get((l.src, l.dst), 0.0) + l.capacity
    f = _link_factor(p.trees, u.spec.kind == "allreduce", caps)
    return sum(t.rate for t in p.trees) * f


def _trees_steady(u, p) -> float | None:
    """The bound rate scaled by the packing's own rate/bound ratio."""
    if p is not None and getattr(p, "bound", 0) and u.bound_rate_Bps != float("inf"):
        return u.bound_rate_Bps * min(1.0, p.rate / p.bound)
    return None


def _capped(rate: Callable[[Any, Any], float]):
    """The steady rate of a packing whose rate is an allreduce rate already: at most the bound."""
    def steady(u, p) -> float | None:
        return None if p is None else min(u.bound_rate_Bps, rate(u, p))

    return steady


def _allreduce_upto(most: int, least: int = 2):
    def ok(spec: CollectiveSpec) -> bool:
        return least <= len(spec.ranks) <= most

    return ok


def _packed(pack: Callable[[Any, tuple[str, ...]], Any]):
    """An Algorithm's ``pack``: ``pack(topology, ranks)``, an empty packing as none."""
    return lambda u: pack(u.topology, u.spec.ranks) or None


def _over(plan: Callable[..., Plan], *, model: bool = False):
    """An Algorithm's ``lower`` for ``plan(spec, topology, packing, chunk)`` (``model``: the
    unit's cost model too); no builder without a packing."""
    def build(u, spec, p) -> Builder | None:
        if p is None:
            return None
        kw = {"model": u.model} if model else {}
        return lambda c: plan(spec, u.topology, p, c, **kw)

    return build


def _bidir_rate(u, trees) -> float:
    """The trees' total rate: an allreduce rate already (bytes/s of buffer)."""
    return sum(t.rate for t in trees) if trees else 0.0


def _split_rate(u, p) -> float:
    """The out-trees' total rate: an allreduce rate already (bytes/s of buffer)."""
    return p.rate if p is not None else 0.0


def _rings_rate(u, rings) -> float:
    """A ring allreduce moves 2(n-1)/n bytes over each ring per byte of buffer."""
    n = len(u.spec.ranks)
    return sum(r for _, r in rings) * n / (2 * (n - 1)) if rings and n > 1 else 0.0


def _pack_hier(u):
    """The narrowest rank cut, where it nearly binds the allreduce floor (HIER_CUT_SHARE)."""
    from .bounds import allreduce_floor  # ortools' max-flow: loaded when a compile packs

    cut = two_level_cut(u.topology, u.spec.ranks)
    floor = allreduce_floor(u.topology, u.spec.ranks, 1.0)
    if cut is not None and cut[0] and cut[1] and 1.0 / cut[2] >= HIER_CUT_SHARE * floor:
        return cut
    return None


def _lower_hier(u, spec, cut) -> Builder | None:
    if cut is None:
        return None
    return lambda c: hier_plan(spec, u.topology, c, model=u.model)


def _roots_per_byte(u) -> float:
    """The bound's rate (size / time) per per-root rate (each rank's block / time): n, and
    n / 2 for an allreduce, which moves each block twice."""
    return len(u.spec.ranks) / (2 if u.spec.kind == "allreduce" else 1)


def _pack_ringfill(u):
    """The ring channels and the trees packed into what they leave (ringfill.py), or None;
    where auto or treepack chooses, only where they pack near the bound."""
    forced = u.spec.algorithm == "treepack-ringfill"
    bound = 0.0 if forced else u.bound_rate_Bps / _roots_per_byte(u)
    return ringfill_packing(u.spec, u.topology, u.model, bound_rate=bound)


def _lower_ringfill(u, spec, fill) -> Builder | None:
    return None if fill is None else ringfill_builder(spec, u.topology, fill, u.model)


def _ringfill_rate(u, fill) -> float:
    """The chains' and the fill trees' per-root rates in the bound's units."""
    return 0.0 if fill is None else fill.rate * _roots_per_byte(u)


def _pack_levels(u):
    """The two-level layouts (levels.py), None where the ranks form no groups."""
    return levels_forms(u.topology, u.spec.ranks)


# -- the baselines and the other lowerings -------------------------------------------------------
def _plain(plan: Callable[[CollectiveSpec, Any, int], Plan]):
    """The builder of a plan function ``plan(spec, topology, chunk)`` that needs no packing."""
    def build(u, spec, _) -> Builder:
        return lambda c: plan(spec, u.topology, c)

    return build


def _lower_replay(u, spec, _) -> Builder | None:
    """replay.replayed_reduce: the reduce's broadcast (the reduce-scatter's allgather)
    compiled and replayed backwards, one plan at every chunk size asked (the source's own
    compile chose its chunk)."""
    if (spec.kind not in ("reduce", "reduce_scatter") or not 2 <= len(spec.ranks) <= REPLAY_MAX_RANKS
            or spec.compress != "none"):
        return None
    if spec.algorithm != "replay" and one_switch(u.topology, spec.ranks):
        # over one switch the trees reduced in place already run the broadcast backwards (the
        # model prices the two within 2 %), and on the local runtime's star the replay ran
        # slower (docs/design.md "A reduce as its broadcast backwards")
        return None
    try:
        # a reduce-scatter replays only the compiler's own allgathers: the baselines' (NCCL's
        # rings) run backwards are the baselines' own reduce-scatters, priced already
        any_source = spec.kind != "reduce_scatter"
        got = replayed_reduce(u.program, spec, u.topology, u.model, u.compile_other,
                              lambda plan: any_source or plan.algorithm not in BASELINES)
    except VerifyError:
        raise  # a wrong broadcast plan is a bug to report, not a form to skip
    except HccError:  # the broadcast does not compile here (a limit): no replayed form
        return None
    return None if got is None else (lambda c: got)


def _lower_rounds(u, spec, _) -> Builder | None:
    """rounds.rounds_plan where every rank has one port into one switch (its rounds are
    contention-free only there)."""
    if len(spec.ranks) > ROUNDS_MAX_RANKS or not one_switch(u.topology, spec.ranks):
        return None
    return lambda c: rounds_plan(spec, u.topology, c)


def _lower_channels(u, spec, channels) -> Builder | None:
    if channels is None or len(channels) < 2:
        return None  # one channel is the single ring, priced as ``ring`` already
    # op columns, not op objects, for the largest ring allreduces (channels.rings_priced)
    return lambda c: rings_priced(spec, u.topology, channels, c, u.model)


def _compressed(spec: CollectiveSpec) -> bool:
    return spec.compress != "none"  # compression only when the user allowed it


REGISTRY: tuple[Algorithm, ...] = (
    Algorithm("relax", frozenset({"allreduce"}), _plain(relax_plan), eligible=_compressed,
              sole_kinds=frozenset({"neighbor_average"})),
    # the rings and the two-level exchange first: their searches are short (a ring plan has
    # few messages per chunk size) and, when they win, the costlier tree searches after them
    # stop early against them (Lower: DGX-1 at netem scale, bidir's search 15 s -> <1 s)
    Algorithm("treepack-rings", frozenset({"allreduce"}), _over(rings_plan),
              eligible=_allreduce_upto(RINGS_MAX_RANKS, 3), role="rings", pack=_packed(ring_packing),
              pack_rate=_rings_rate, steady_rate=_capped(_rings_rate), treepack=True,
              max_chunks=NEW_FORMS_MAX_CHUNKS, chunked=True),
    Algorithm("treepack-hier", frozenset({"allreduce"}), _lower_hier,
              eligible=_allreduce_upto(BIDIR_MAX_RANKS), role="hier", pack=_pack_hier, treepack=True,
              max_chunks=NEW_FORMS_MAX_CHUNKS),
    # before the tree packings: at 512-1024 ranks it has ~20x fewer messages than they do and,
    # where it wins, their chunk searches stop early against it
    Algorithm("treepack-levels", LEVEL_KINDS, _over(levels_priced, model=True), role="levels", pack=_pack_levels,
              treepack=True, chunked=True),
    # before the tree packings: where the rings nearly fill the links its plan is close to
    # the bound, and their chunk searches stop early against it
    Algorithm("treepack-ringfill", frozenset({"allgather", "reduce_scatter", "allreduce"}), _lower_ringfill,
              eligible=_allreduce_upto(RINGFILL_MAX_RANKS, 3), role="ringfill", pack=_pack_ringfill,
              pack_rate=_ringfill_rate, treepack=True),
    Algorithm("treepack", TREE_KINDS, _lower_trees("treepack"), role="trees", pack=_pack_trees,
              pack_rate=_trees_rate, steady_rate=_trees_steady, treepack=True, chunked=True),
    Algorithm("treepack-dbt", frozenset({"broadcast", "reduce"}), _over(dbt_plan, model=True), role="dbt",
              pack=_pack_dbt, pack_rate=_dbt_rate, treepack=True, chunked=True),
    Algorithm("treepack-wide", frozenset({"broadcast", "reduce"}), _over(wide_plan, model=True), role="wide",
              pack=_pack_wide, pack_rate=_dbt_rate, treepack=True, chunked=True),
    # the reduce as the fastest broadcast run backwards (replay.py): after the broadcast forms,
    # whose reversals in place (reduce up the same trees) it is priced against
    Algorithm("replay", frozenset({"reduce", "reduce_scatter"}), _lower_replay),
    # forced only (docs/design.md "Rounds over one switch"): on the local runtime's star it
    # ran no faster than the trees or the ring, where the model predicts it ahead
    Algorithm("rounds", ROUNDS_KINDS, _lower_rounds, auto=False, chunked=True),
    Algorithm("treepack-rsag", frozenset({"allreduce"}), _lower_trees("treepack-rsag"), role="rsag",
              pack=_pack_rsag, pack_rate=_trees_rate, steady_rate=_trees_steady, treepack=True,
              chunked=True),
    Algorithm("treepack-bidir", frozenset({"allreduce"}), _over(bidir_plan, model=True),
              eligible=_allreduce_upto(BIDIR_MAX_RANKS), role="bidir", pack=_packed(bidir_packing),
              pack_rate=_bidir_rate, steady_rate=_capped(_bidir_rate), treepack=True,
              max_chunks=NEW_FORMS_MAX_CHUNKS, chunked=True),
    Algorithm("treepack-split", frozenset({"allreduce"}), _over(split_priced, model=True),
              eligible=_allreduce_upto(SPLIT_MAX_RANKS), role="split", pack=_packed(pack_split),
              pack_rate=_split_rate, steady_rate=_capped(_split_rate), treepack=True, chunked=True,
              repacked=True),
    # the largest ring allreduces priced from op columns (channels.ring_priced)
    Algorithm("ring", TREE_KINDS, lambda u, spec, _: lambda c: ring_priced(spec, u.topology, c, u.model),
              baseline=True),
    Algorithm("rings", TREE_KINDS, _lower_channels, role="channels", pack=_packed(ring_channels_memo),
              baseline=True),
    # the double binary tree where NCCL runs trees (baselines.dbtree_plan falls back to the
    # ring for the other kinds)
    Algorithm("tree", frozenset({"broadcast", "reduce", "allreduce"}), _plain(baselines.dbtree_plan),
              baseline=True),
    Algorithm("rd", frozenset({"allgather", "reduce_scatter"}), _plain(baselines.rd_plan), baseline=True),
    Algorithm("direct", TREE_KINDS, _plain(baselines.direct_plan),
              eligible=lambda spec: len(spec.ranks) <= DIRECT_AUTO_MAX_RANKS,
              sole_kinds=frozenset({"alltoall"}), chunked=True),
)
BY_NAME: dict[str, Algorithm] = {a.name: a for a in REGISTRY}
BASELINES: tuple[str, ...] = tuple(a.name for a in REGISTRY if a.baseline)


def algorithm(name: str) -> Algorithm:
    """The registered algorithm called ``name`` (KeyError: none)."""
    return BY_NAME[name]


def candidates_for(spec: CollectiveSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(eligible, lowered)``: the candidates ``select`` may choose from, and every candidate
    to lower (the eligible ones plus the baselines the figures report). A kind with a sole
    algorithm (alltoall: direct, neighbor_average: relax) has only that one, whatever
    ``algorithm`` says (the plan's ``algorithm`` field tells what ran); ``algorithm = auto``
    offers every algorithm that applies, ``treepack`` the treepack family among them, any
    other name that algorithm alone."""
    for a in REGISTRY:
        if spec.kind in a.sole_kinds:
            return (a.name,), (a.name,)
    auto = [a for a in REGISTRY if a.offered(spec)]
    if spec.algorithm == "auto":
        eligible = tuple(a.name for a in auto)
    elif spec.algorithm == "treepack":
        eligible = tuple(a.name for a in auto if a.treepack)
    else:
        eligible = (spec.algorithm,)
    baselines = tuple(a.name for a in auto if a.baseline and a.name not in eligible)
    return eligible, eligible + baselines


def builder(name: str, u) -> Builder | None:
    """The plan builder of algorithm ``name`` on unit ``u`` (None: no form here). The exact
    forms of a compressed allreduce stay exact: compressing on every tree hop would quantize
    an element once per hop, where the relaxation lowering bounds it to twice."""
    a = BY_NAME[name]
    spec = u.spec
    if a.name != "relax" and spec.kind == "allreduce" and spec.compress != "none":
        spec = replace(spec, compress="none")
    return a.lower(u, spec, u.packing(a.role) if a.role else None)


def packings(u, want: tuple[str, ...]) -> tuple[tuple[str, object], ...]:
    """``(role, packing)`` of every algorithm in ``want`` that has one here (two ranks at least)."""
    if len(u.spec.ranks) < 2:
        return ()
    out = []
    for a in REGISTRY:
        if a.name in want and a.pack is not None:
            p = a.pack(u)
            if p is not None:
                out.append((a.role, p))
    return tuple(out)


def pack_rate(u, name: str) -> float:
    """The rate of ``name``'s packing in bound_rate_Bps's units (size / time), 0 if none."""
    a = BY_NAME[name]
    return a.pack_rate(u, u.packing(a.role)) if a.role else 0.0


def steady_rate(u, name: str, plan: Plan, predicted: float) -> float:
    """The schedule's steady-state rate in the bound's units (size / time): from the packing
    where the algorithm has one (:attr:`Algorithm.steady_rate`), else the algorithmic bandwidth
    of the simulated plan."""
    a = BY_NAME.get(name)
    if a is not None and a.steady_rate is not None and a.role:
        r = a.steady_rate(u, u.packing(a.role))
        if r is not None:
            return r
    return u.spec.size_bytes / predicted if predicted > 0 else 0.0
