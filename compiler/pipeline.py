"""hcc.compiler.pipeline — one collective from a checked Program to a verified Plan.

The compiler is a tuple of small frozen passes (style.md habit 3, xDSL's ``ModulePass``):
each has a ``name`` and ``apply(unit) -> unit`` over the frozen :class:`Unit` value, and
:func:`run_passes` calls a hook after every pass (for dumps and timing).

    bounds   the cut bound of the collective (compiler/bounds.py; for allreduce capped by
             :func:`allreduce_floor`, see there), plus the least latency a byte must cross
             (cost.least_latency) — still a lower bound of the cost model
    pack     spanning-tree packings (compiler/treepack.py): broadcast and scatter pack out-
             trees from the root; reduce and gather the same on the reversed graph; allgather
             out-trees from every rank, reduce_scatter their reverse; allreduce both the
             reduce+broadcast trees of rank 0 and the reduce-scatter+allgather trees, and
             (up to algorithms.BIDIR_MAX_RANKS ranks) trees packed for use in both
             directions (algorithms.bidir_packing), the narrowest rank cut
             (algorithms.two_level_cut) and rings (algorithms.ring_packing)
    lower    every candidate algorithm the spec allows, each lowered (compiler/lower.py,
             algorithms.py, lower_relax.py) at the chunk size that minimises the simulated
             time (cost.choose_chunk); the NCCL-like baselines (compiler/baselines.py: the
             single ring, multi-channel rings, double binary tree, recursive doubling) are
             always priced too, for the figures; ``direct`` is tried by auto up to 16 ranks
    select   ``algorithm = auto``: the fastest predicted candidate; otherwise the forced one
    figures  predicted time, bound, efficiency = bound_s / predicted_s, the best NCCL-like
             baseline, algbw, busbw (nccl-tests factors), wire bytes, and the explanation:
             the cut that sets the bound (bounds.binding_cut), the packing's rate, and the
             predicted time split into bound, load, fill, per-message cost and contention
             (:func:`breakdown`)
    verify   ir/verify.py symbolically executes the plan

Candidate names: ``treepack`` (trees of the packing), ``treepack-rsag`` (allreduce as
reduce-scatter + allgather over the allgather packing; reported as algorithm
``treepack-rsag``), ``treepack-bidir`` (allreduce as reduce-then-broadcast over trees packed
so that each loads its links both ways: Blink's allreduce, at the floor 2(n-1)M / sum c on
DGX-1 fragments and rings), ``treepack-hier`` (allreduce over the two sides of the narrowest
rank cut: reduce to a leader per side, the leaders exchange partials across the cut both ways
at once, broadcast back: the cut bound M / c on two hosts joined by one slow link),
``treepack-rings`` (allreduce as a ring allreduce on each of several directed Hamiltonian
rings packed by an LP, up to algorithms.RINGS_MAX_RANKS ranks: the floor on DGX-1 and rings),
``ring``, ``rings`` (NCCL's multi-channel rings), ``tree`` (double binary tree), ``rd``
(recursive doubling / Bruck, allgather and reduce_scatter), ``direct``, and ``relax`` (the compressed /
decentralized lowering, only when ``compress != none`` or for ``neighbor_average``).
``algorithm = treepack`` chooses among every ``treepack*`` candidate.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace
from typing import Callable

from ..grammar.diagnostics import Source, SourceError, Span
from ..grammar.errors import HccError
from ..ir.plan import DTYPE_SIZES, Figures, Plan
from ..ir.topology import Topology
from . import progress
from .algorithms import BIDIR_MAX_RANKS, RINGS_MAX_RANKS
from .cost import DEFAULT_MODEL, ChunkChoice, CostModel, chunk_candidates, choose_chunk, least_latency
from .program import CollectiveSpec, Program


class CompileError(HccError):
    """An internal inconsistency of the compiler (a plan faster than its lower bound, no
    applicable algorithm): a bug, reported with exit status 1, never bad input."""


# nccl-tests' bus-bandwidth factors (its doc/PERFORMANCE.md), as functions of n
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "neighbor_average": lambda n: 1.0,
}

TREE_KINDS = frozenset({"broadcast", "reduce", "gather", "scatter", "allgather", "reduce_scatter", "allreduce"})
# the NCCL-style baselines: a ring (or chain) exists for every tree kind; the double binary
# tree for the kinds NCCL runs on trees (algorithms.dbtree_plan falls back to the ring for others)
RING_KINDS = TREE_KINDS
DBTREE_KINDS = frozenset({"broadcast", "reduce", "allreduce"})
RD_KINDS = frozenset({"allgather", "reduce_scatter"})
# the NCCL-like baselines (compiler/baselines.py), lowered first and always searched fully
BASELINES = ("ring", "rings", "tree", "rd")
DIRECT_KINDS = TREE_KINDS | {"alltoall"}
ALGORITHMS = ("auto", "treepack", "ring", "tree", "direct")
# direct (every rank to every rank in one message each) puts n(n-1) messages per chunk on a
# topology; past 16 ranks it never won on the samples (32-rank cluster: 30 ms against 9 ms for
# the trees) and its chunk search alone took 10 s, so auto skips it there (forcing it works)
DIRECT_AUTO_MAX_RANKS = 16
EFFICIENCY_SLACK = 1e-9
# treepack-hier is priced when the narrowest rank cut nearly binds the allreduce floor
# (M / cut >= 0.95 x floor): the exchange helps where a cut is the bottleneck (two hosts: M / cut
# is the floor), and elsewhere only costs a chunk search that loses (DGX-1's 8 GPUs: the cut is
# one GPU's 100 GB/s against a floor of M / 85.7 GB/s, and its chains run at one link's rate)
HIER_CUT_SHARE = 0.95
# the chunk search of the treepack-bidir/-hier/-rings candidates stops at size / 256 (256 KiB
# for 64 MiB): on the netem-scaled DGX-1 fragment (20 MB/s links, where 1 us per message is
# nothing) the bidirectional trees went on to 8 KiB for 1.5% (2.2765 -> 2.2422 s) at 10 s of
# search on this loaded 2-core machine; at real NVLink rates the best chunks are 0.5-2 MiB
NEW_FORMS = frozenset({"treepack-bidir", "treepack-hier", "treepack-rings"})
NEW_FORMS_MAX_CHUNKS = 256


@dataclass(frozen=True)
class Candidate:
    algorithm: str
    choice: ChunkChoice

    @property
    def predicted_s(self) -> float:
        return self.choice.simulation.time


@dataclass(frozen=True)
class Unit:
    """The value the passes transform: one collective on its topology."""

    program: Program
    spec: CollectiveSpec
    topology: Topology
    model: CostModel = DEFAULT_MODEL
    bound_s: float = 0.0
    bound_rate_Bps: float = 0.0
    bandwidth_bound_s: float = 0.0  # the cut bound alone, without the latency term
    packings: tuple[tuple[str, object], ...] = ()  # (role, treepack.Packing)
    candidates: tuple[Candidate, ...] = ()
    chosen: Candidate | None = None
    plan: Plan | None = None

    def packing(self, role: str):
        for r, p in self.packings:
            if r == role:
                return p
        return None

    def candidate(self, algorithm: str) -> Candidate | None:
        for c in self.candidates:
            if c.algorithm == algorithm:
                return c
        return None


def _bound_size(spec: CollectiveSpec) -> int:
    """Bytes a bound must carry: compression shrinks what crosses the wire (fp16 halves
    4-byte elements, int8 is 1 byte per element; int8's per-chunk header only adds), so a
    compressed plan is compared with the bound of its compressed size — otherwise it could
    beat the "lower" bound."""
    itemsize = DTYPE_SIZES[spec.dtype]
    elems = spec.size_bytes // itemsize
    if spec.compress == "fp16":
        return elems * min(2, itemsize)
    if spec.compress == "int8":
        return elems
    return spec.size_bytes


def allreduce_floor(topo: Topology, ranks: tuple[str, ...], size: float) -> float:
    """A lower bound on any allreduce that holds for every schedule, reduce-then-broadcast
    trees included: every rank must receive and send ``M`` bytes of information (its result
    depends on all inputs, its input on all results), and every element needs at least
    ``2(n-1)`` one-way rank-to-rank messages (directed gossip needs ``2n - 2`` calls), each
    leaving a rank over one of its links. So ``t >= max(max_v M / min(B-(v), B+(v)),
    2(n-1) M / sum of the capacity leaving the ranks, M / min_S B+(S))``; the last term
    because the ranks on either side of any cut S need the other side's M bytes of partial
    reduction (two hosts joined by one slow link: the slow link carries at least M).

    design.md's "twice the allgather bound" is the bound of reduce-scatter + allgather
    schedules; Blink's reduce+broadcast trees can beat it (3 ranks with a 2 GB/s rank and two
    3 GB/s ranks: 2 x AG = 2.0 ms for 3 MB, trees take 1.76 ms in the cost model, this floor
    is 1.5 ms), so the pipeline uses ``min(2 x AG, floor)``: a true lower bound that equals
    2 x AG wherever 2 x AG is provably one.

    >>> from hcc.ir.topology import Link
    >>> tri = Topology("t", ("a", "b", "c"), links=tuple(Link(x, y, 1e9) for x in "abc" for y in "abc" if x != y))
    >>> allreduce_floor(tri, ("a", "b", "c"), 3e6)   # 4 x 3 MB over 6 GB/s
    0.002
    """
    sub = topo.restricted(ranks)
    rs = set(ranks)
    n = len(ranks)
    cin = {v: 0.0 for v in ranks}
    cout = {v: 0.0 for v in ranks}
    for l in sub.links:
        if l.src in rs:
            cout[l.src] += l.capacity
        if l.dst in rs:
            cin[l.dst] += l.capacity
    from .bounds import min_rank_cut_rate

    per_vertex = max(size / min(cin[v], cout[v]) for v in ranks)
    total = 2 * (n - 1) * size / sum(cout.values())
    cut = size / min_rank_cut_rate(topo, ranks)
    return max(per_vertex, total, cut)


@dataclass(frozen=True)
class Bounds:
    name: str = "bounds"

    def apply(self, u: Unit) -> Unit:
        from . import bounds

        spec = u.spec
        size = _bound_size(spec)
        if len(spec.ranks) < 2:
            return replace(u, bound_s=0.0, bound_rate_Bps=float("inf"), bandwidth_bound_s=0.0)
        t = float(bounds.time_bound(spec.kind, u.topology, spec.ranks, spec.root, size,
                                    peers=spec.peers or "ring"))
        if spec.kind == "allreduce":
            t = min(t, allreduce_floor(u.topology, spec.ranks, size))
        # every byte crosses at least one link after its last reserved byte (cost.py): adding
        # the smallest latency keeps t a lower bound of any simulated plan
        total = t + least_latency(u.topology, spec.ranks)
        rate = spec.size_bytes / t if t > 0 else float("inf")
        return replace(u, bound_s=total, bound_rate_Bps=rate, bandwidth_bound_s=t)


def candidates_for(spec: CollectiveSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(eligible, lowered)``: the candidates ``select`` may choose from, and every candidate
    to lower (the eligible ones plus the ring and double-binary-tree baselines the figures
    report). alltoall has only its direct form and neighbor_average only the relaxation
    lowering, whatever ``algorithm`` says (the plan's ``algorithm`` field tells what ran)."""
    kind, alg = spec.kind, spec.algorithm
    if kind == "neighbor_average":
        return ("relax",), ("relax",)
    if kind == "alltoall":
        return ("direct",), ("direct",)
    auto: list[str] = []
    # the rings and the two-level exchange first: their searches are short (a ring plan has
    # few messages per chunk size) and, when they win, the costlier tree searches after them
    # stop early against them (Lower: DGX-1 at netem scale, bidir's search 15 s -> <1 s)
    if kind == "allreduce" and 3 <= len(spec.ranks) <= RINGS_MAX_RANKS:
        auto.append("treepack-rings")
    if kind == "allreduce" and 2 <= len(spec.ranks) <= BIDIR_MAX_RANKS:
        auto.append("treepack-hier")
    if kind in TREE_KINDS:
        auto += ["treepack", "treepack-rsag"] if kind == "allreduce" else ["treepack"]
    if kind == "allreduce" and 2 <= len(spec.ranks) <= BIDIR_MAX_RANKS:
        auto.append("treepack-bidir")
    if kind in RING_KINDS:
        auto += ["ring", "rings"]
    if kind in DBTREE_KINDS:
        auto.append("tree")
    if kind in RD_KINDS:
        auto.append("rd")
    if kind in DIRECT_KINDS and (len(spec.ranks) <= DIRECT_AUTO_MAX_RANKS or kind == "alltoall"):
        auto.append("direct")
    if spec.compress != "none" and kind == "allreduce":
        auto.insert(0, "relax")  # compression only when the user allowed it
    if alg == "auto":
        eligible = tuple(auto)
    elif alg == "treepack":
        eligible = tuple(a for a in auto if a.startswith("treepack"))
    else:
        eligible = (alg,)
    baselines = tuple(b for b in BASELINES if b in auto and b not in eligible)
    return eligible, eligible + baselines


@dataclass(frozen=True)
class BidirPacking:
    """The trees of algorithms.bidir_packing, shaped like a treepack.Packing where the
    pipeline reads one: ``rate`` is the allreduce rate (bytes/s of the buffer) they sustain."""

    trees: tuple

    @property
    def rate(self) -> float:
        return sum(t.rate for t in self.trees)


@dataclass(frozen=True)
class Pack:
    name: str = "pack"

    def apply(self, u: Unit) -> Unit:
        spec = u.spec
        _, want = candidates_for(spec)
        out: list[tuple[str, object]] = []
        if "rings" in want and len(spec.ranks) >= 2:
            from .baselines import ring_channels

            channels = ring_channels(u.topology, spec.ranks)
            if channels:
                out.append(("channels", channels))
        if not any(w.startswith("treepack") for w in want) or len(spec.ranks) < 2:
            return replace(u, packings=tuple(out))
        from . import treepack

        kind, topo, ranks = spec.kind, u.topology, spec.ranks
        root = ranks[spec.root] if spec.root >= 0 else ranks[0]
        if kind in ("broadcast", "scatter"):
            out.append(("trees", treepack.pack_broadcast(topo, ranks, root)))
        elif kind in ("reduce", "gather"):
            out.append(("trees", treepack.pack_broadcast(topo, ranks, root, reverse=True)))
        elif kind == "allgather":
            out.append(("trees", treepack.pack_allgather(topo, ranks)))
        elif kind == "reduce_scatter":
            out.append(("trees", treepack.pack_allgather(topo, ranks, reverse=True)))
        elif kind == "allreduce":
            # Blink: reduce to rank 0 then broadcast over the same trees (they must exist in
            # both directions; every link in the samples is full duplex)
            out.append(("trees", treepack.pack_broadcast(topo, ranks, ranks[0])))
            out.append(("rsag", treepack.pack_allgather(topo, ranks)))
            if "treepack-bidir" in want:
                from .algorithms import bidir_packing

                trees = bidir_packing(topo, ranks)
                if trees:
                    out.append(("bidir", BidirPacking(trees)))
            if "treepack-rings" in want:
                from .algorithms import ring_packing

                rings = ring_packing(topo, ranks)
                if rings:
                    out.append(("rings", rings))
            if "treepack-hier" in want:
                from .algorithms import two_level_cut

                cut = two_level_cut(topo, ranks)
                floor = allreduce_floor(topo, ranks, 1.0)
                if cut is not None and cut[0] and cut[1] and 1.0 / cut[2] >= HIER_CUT_SHARE * floor:
                    out.append(("hier", cut))
        return replace(u, packings=tuple(out))


@dataclass(frozen=True)
class Lower:
    name: str = "lower"

    def _builder(self, alg: str, u: Unit) -> Callable[[int], Plan] | None:
        spec, topo = u.spec, u.topology
        if alg != "relax" and spec.kind == "allreduce" and spec.compress != "none":
            # the exact forms stay exact: compressing on every tree hop would quantize an
            # element once per hop, where the relaxation lowering bounds it to twice
            spec = replace(spec, compress="none")
        if alg == "treepack-bidir":
            p = u.packing("bidir")
            if p is None:
                return None
            from .algorithms import bidir_plan

            return lambda c: bidir_plan(spec, topo, p.trees, c, model=u.model)
        if alg == "treepack-rings":
            rings = u.packing("rings")
            if rings is None:
                return None
            from .algorithms import rings_plan

            return lambda c: rings_plan(spec, topo, rings, c)
        if alg == "treepack-hier":
            if u.packing("hier") is None:
                return None
            from .algorithms import hier_plan

            return lambda c: hier_plan(spec, topo, c, model=u.model)
        if alg in ("treepack", "treepack-rsag"):
            p = u.packing("trees" if alg == "treepack" else "rsag")
            if p is None:
                return None
            from .lower import lower

            # the timed schedule keeps each tree at its packed share of every link (lower.py,
            # "timed lowering"): DGX-1 allgather 0.63 -> 0.80 of the bound at 1 GB; the plain
            # order is kept where it simulates faster (lower_priced)
            from .lower import lower_priced

            return lambda c: lower_priced(spec, topo, p.trees, c, algorithm=alg, model=u.model)
        if alg == "relax":
            from .lower_relax import relax_plan

            return lambda c: relax_plan(spec, topo, c)
        if alg == "rings":
            channels = u.packing("channels")
            if channels is None or len(channels) < 2:
                return None  # one channel is the single ring, priced as ``ring`` already
            from .baselines import rings_plan

            return lambda c: rings_plan(spec, topo, channels, c)
        if alg == "rd":
            from .baselines import rd_plan

            return lambda c: rd_plan(spec, topo, c)
        from . import algorithms

        fn = {"ring": algorithms.ring_plan, "tree": algorithms.dbtree_plan,
              "direct": algorithms.direct_plan}[alg]
        return lambda c: fn(spec, topo, c)

    def apply(self, u: Unit) -> Unit:
        spec = u.spec
        itemsize = DTYPE_SIZES[spec.dtype]
        cands = (spec.chunk_bytes,) if spec.chunk_bytes else chunk_candidates(spec.size_bytes, itemsize)
        eligible, lowered = candidates_for(spec)
        # baselines first (their searches always run to the end: the figures report them),
        # then the others, each stopping once it cannot catch up with the best so far (auto
        # only: a forced algorithm is returned whatever its time, so it is searched fully)
        order = [a for a in lowered if a in BASELINES] + [a for a in lowered if a not in BASELINES]
        out = []
        best = float("inf")
        builders: dict[str, Callable[[int], Plan]] = {}
        dropped: dict[str, int] = {}  # algorithm -> ops of the programs it no longer holds
        for i, alg in enumerate(order):
            build = self._builder(alg, u)
            if build is None:
                continue
            progress.report("lower", alg, i + 1, len(order))
            build = builders[alg] = _reporting(build, alg)
            prune = spec.algorithm == "auto" and alg not in BASELINES
            mine = cands
            if alg in NEW_FORMS and not spec.chunk_bytes:
                mine = tuple(c for c in cands if c * NEW_FORMS_MAX_CHUNKS >= spec.size_bytes) or cands[:1]
            choice = choose_chunk(build, mine, model=u.model, incumbent=best if prune else float("inf"))
            out.append(Candidate(alg, choice))
            best = min(best, choice.simulation.time)
            _drop_large_programs(out, dropped)
        if not out:
            raise CompileError(f"{spec.name}: no algorithm could be lowered for a {spec.kind}")
        pool = [k for k, c in enumerate(out) if c.algorithm in eligible]
        if pool:  # the plan Select will take gets its programs back: lowered again, same chunk
            k = min(pool, key=lambda k: _select_key(out[k]))
            c = out[k]
            if c.algorithm in dropped:
                progress.report("lower", f"{c.algorithm} again, the plan selected")
                plan = builders[c.algorithm](c.choice.chunk_bytes)
                if isinstance(plan, tuple):  # a builder that prices its own plan: (plan, simulation)
                    plan = plan[0]
                if sum(len(p) for p in plan.programs) != dropped[c.algorithm]:
                    raise CompileError(f"{spec.name}: lowering {c.algorithm} again gave a different plan")
                out[k] = Candidate(c.algorithm, replace(c.choice, plan=replace(plan, figures=c.choice.plan.figures)))
        return replace(u, candidates=tuple(out))


@dataclass(frozen=True)
class Select:
    name: str = "select"

    def apply(self, u: Unit) -> Unit:
        eligible, _ = candidates_for(u.spec)
        pool = [c for c in u.candidates if c.algorithm in eligible]
        if not pool:
            raise CompileError(f"{u.spec.name}: algorithm {u.spec.algorithm} produced no plan")
        best = min(pool, key=_select_key)
        return replace(u, chosen=best, plan=best.choice.plan)


def _reporting(build: Callable[[int], Plan], alg: str) -> Callable[[int], Plan]:
    """``build`` that first reports which candidate it lowers at which chunk size."""
    def run(chunk: int) -> Plan:
        progress.report("lower", f"{alg} at {chunk} B chunks")
        return build(chunk)

    return run


def _select_key(c: Candidate) -> tuple:
    """Select's order: fastest first; on a tie the compiler's own schedule over a baseline
    (the same rings, say), then by name."""
    return (c.predicted_s, c.algorithm in BASELINES, c.algorithm)


# a lowered candidate of more than this many ops keeps its figures and trees but not its
# programs, and the one selected is lowered again at its chunk size: on the 1024-rank fat tree
# an allreduce candidate holds 5-6 million ops (1.2-1.4 GB), and keeping them all took a
# compile to 8.8 GB; lowering the winner twice costs less than holding two such plans
KEEP_PROGRAMS_OPS = 500_000


def _drop_large_programs(out: list[Candidate], dropped: dict[str, int]) -> None:
    """Empty the programs of every candidate in ``out`` above :data:`KEEP_PROGRAMS_OPS`
    ops, noting each one's op count in ``dropped``."""
    for k, c in enumerate(out):
        plan = c.choice.plan
        ops = sum(len(p) for p in plan.programs)
        if c.algorithm in dropped or ops <= KEEP_PROGRAMS_OPS:
            continue
        dropped[c.algorithm] = ops
        hollow = replace(plan, programs=tuple(() for _ in plan.programs))
        out[k] = Candidate(c.algorithm, replace(c.choice, plan=hollow))


@dataclass(frozen=True)
class FiguresPass:
    name: str = "figures"

    def apply(self, u: Unit) -> Unit:
        spec, c = u.spec, u.chosen
        plan, sim = c.choice.plan, c.choice.simulation
        n = len(spec.ranks)
        predicted = sim.time
        ring = u.candidate("ring")
        tree = u.candidate("tree")
        # efficiency = bound / predicted: a plan faster than its lower bound is a bug
        eff = u.bound_s / predicted if predicted > 0 else 1.0
        if eff > 1 + EFFICIENCY_SLACK:
            raise CompileError(
                f"{spec.name}: predicted {predicted:.6g} s beats the lower bound {u.bound_s:.6g} s "
                f"({c.algorithm}); the bound or the cost model is wrong"
            )
        rate = self._rate(u, plan, predicted)
        algbw = spec.size_bytes / predicted if predicted > 0 else float("inf")
        base = [b for b in (u.candidate(a) for a in BASELINES) if b is not None]
        best_base = min(base, key=lambda b: (b.predicted_s, BASELINES.index(b.algorithm))) if base else None
        rings = u.candidate("rings")
        rd = u.candidate("rd")
        cut = self._cut(u)
        parts = breakdown(sim, u.bandwidth_bound_s)
        figures = Figures(
            rate_Bps=rate,
            bound_rate_Bps=u.bound_rate_Bps,
            predicted_s=predicted,
            bound_s=u.bound_s,
            efficiency=eff,
            ring_predicted_s=ring.predicted_s if ring else 0.0,
            tree_predicted_s=tree.predicted_s if tree else 0.0,
            compile_s=0.0,
            wire_bytes=sim.wire_bytes,
            algbw_Bps=algbw,
            busbw_Bps=algbw * BUSBW_FACTOR[spec.kind](n) if n > 1 else algbw,
            exact_predicted_s=self._exact(u) if plan.compress != "none" else 0.0,
            baseline=best_base.algorithm if best_base else "",
            baseline_predicted_s=best_base.predicted_s if best_base else 0.0,
            rings_predicted_s=rings.predicted_s if rings else 0.0,
            ring_channels=len(u.packing("channels") or ()),
            rd_predicted_s=rd.predicted_s if rd else 0.0,
            pack_rate_Bps=self._pack_rate(u),
            cut_vertices=cut.vertices if cut else (),
            cut_links=cut.links if cut else (),
            cut_capacity_Bps=cut.capacity_Bps if cut else 0.0,
            cut_direction=cut.direction if cut else "",
            cut_note=cut.what if cut else "",
            **parts,
        )
        return replace(u, plan=replace(plan, figures=figures))

    @staticmethod
    def _cut(u: Unit):
        """The cut that sets the bandwidth bound, checked against it (bounds.binding_cut)."""
        from .bounds import binding_cut

        spec = u.spec
        if len(spec.ranks) < 2 or not u.bandwidth_bound_s > 0:
            return None
        cut = binding_cut(spec.kind, u.topology, spec.ranks, spec.root, _bound_size(spec),
                          peers=spec.peers or "ring")
        if cut is not None and abs(cut.time(_bound_size(spec)) - u.bandwidth_bound_s) > 1e-6 * u.bandwidth_bound_s:
            raise CompileError(f"{spec.name}: the named cut gives {cut.time(_bound_size(spec)):.6g} s, "
                               f"the bound is {u.bandwidth_bound_s:.6g} s")
        return cut

    @staticmethod
    def _pack_rate(u: Unit) -> float:
        """The rate the chosen algorithm's packing sustains (size / time at the LP's rates, in
        bound_rate_Bps's units), or, for an algorithm without one, the best of the packings
        computed; 0 when none was. Trees of an allreduce are loaded both ways."""
        chosen = u.chosen.algorithm
        algs = [chosen] if chosen.startswith("treepack") else [c.algorithm for c in u.candidates
                                                               if c.algorithm.startswith("treepack")]
        return max((pack_rate(u, a) for a in algs), default=0.0)

    @staticmethod
    def _exact(u: Unit) -> float:
        """The best predicted time among the uncompressed candidates (0 if none was lowered)."""
        times = [c.predicted_s for c in u.candidates if c.choice.plan.compress == "none"]
        return min(times) if times else 0.0

    @staticmethod
    def _rate(u: Unit, plan: Plan, predicted: float) -> float:
        """The schedule's steady-state rate in the bound's units (size / time): for packed
        trees, the bound rate scaled by the packing's own rate/bound ratio; for other
        algorithms, the algorithmic bandwidth of the simulated plan."""
        role = {"treepack": "trees", "treepack-rsag": "rsag"}.get(u.chosen.algorithm)
        p = u.packing(role) if role else None
        if u.chosen.algorithm == "treepack-bidir" and u.packing("bidir") is not None:
            # the undirected packing's rate is an allreduce rate already (bytes/s of buffer)
            return min(u.bound_rate_Bps, u.packing("bidir").rate)
        if u.chosen.algorithm == "treepack-rings" and u.packing("rings") is not None:
            # a ring allreduce moves 2(n-1)/n bytes over each ring per byte of buffer
            n = len(u.spec.ranks)
            ring_rate = sum(r for _, r in u.packing("rings"))
            return min(u.bound_rate_Bps, ring_rate * n / (2 * (n - 1)))
        if p is not None and getattr(p, "bound", 0) and u.bound_rate_Bps != float("inf"):
            return u.bound_rate_Bps * min(1.0, p.rate / p.bound)
        return u.spec.size_bytes / predicted if predicted > 0 else 0.0


def _link_factor(trees, both: bool, caps: dict[tuple[str, str], float]) -> float:
    """min over arcs of capacity / load when the trees carry their rates (``both``: every
    tree edge loaded in each direction, as reduce-then-broadcast does), orientation of a
    reversed packing taken either way; at most 1."""
    best = 0.0
    for flip in ((False,) if both else (False, True)):
        load: dict[tuple[str, str], float] = {}
        for t in trees:
            for edge in t.edges:
                path = tuple(edge[2]) if len(edge) > 2 else (edge[0], edge[1])
                arcs = list(zip(path, path[1:]))
                if flip:
                    arcs = [(b, a) for a, b in arcs]
                if both:
                    arcs += [(b, a) for a, b in arcs]
                for arc in arcs:
                    load[arc] = load.get(arc, 0.0) + t.rate
        best = max(best, min((1.0 if l <= 0 else caps.get(arc, 0.0) / l for arc, l in load.items()), default=1.0))
    return min(1.0, best)


def pack_rate(u: Unit, alg: str) -> float:
    """The rate of ``alg``'s packing in bound_rate_Bps's units (size / time), 0 if none."""
    n = len(u.spec.ranks)
    if alg == "treepack-bidir":
        p = u.packing("bidir")
        return p.rate if p is not None else 0.0
    if alg == "treepack-rings":
        rings = u.packing("rings")
        return sum(r for _, r in rings) * n / (2 * (n - 1)) if rings and n > 1 else 0.0
    role = {"treepack": "trees", "treepack-rsag": "rsag"}.get(alg)
    p = u.packing(role) if role else None
    if p is None or not p.trees:
        return 0.0
    if u.spec.kind in ("gather", "scatter"):
        return u.bound_rate_Bps * p.rate / p.bound if getattr(p, "bound", 0) else 0.0
    caps: dict[tuple[str, str], float] = {}
    for l in u.topology.restricted(tuple(u.spec.ranks)).links:
        caps[(l.src, l.dst)] = caps.get((l.src, l.dst), 0.0) + l.capacity
    f = _link_factor(p.trees, u.spec.kind == "allreduce", caps)
    return sum(t.rate for t in p.trees) * f


def breakdown(sim, bandwidth_bound_s: float) -> dict:
    """The predicted time ``sim.time`` as ``bandwidth_bound_s + load_s + fill_s + message_s
    + contention_s``, from the simulation's *bottleneck link* e: the link with the most bytes
    per capacity (the one that must be busy longest; ties: the busier).

    - ``load_s = bytes(e) / c(e) - bandwidth_bound_s``: how far the schedule's heaviest link
      load sits above the cut bound (0 when the packing reaches the bound and its shares round
      evenly; >= 0 always, since some link of the binding cut carries at least its share).
    - ``message_s = busy(e) - bytes(e) / c(e)``: the per-message charge of e's reservations,
      (latency + software cost per message) x its messages.
    - ``contention_s = (last(e) - first(e)) - busy(e)``: e idle between its first and its last
      reservation, waiting for chunks held up elsewhere (other links, dependencies).
    - ``fill_s = first(e) + (time - last(e))``: before e's first reservation and after its
      last: the pipeline filling and draining (every hop's latency and per-message cost
      elsewhere before the first chunk reaches e, and after the last leaves it).

    The parts sum to the predicted time exactly (up to rounding). A plan with no messages
    is all fill."""
    t = sim.time
    out = {"bandwidth_bound_s": bandwidth_bound_s, "load_s": 0.0, "fill_s": t - bandwidth_bound_s,
           "message_s": 0.0, "contention_s": 0.0, "bottleneck_link": ()}
    if not sim.links:
        return out
    e = max(sim.links, key=lambda l: (l.bytes / l.capacity, l.busy_s))
    data = e.bytes / e.capacity
    out.update(load_s=data - bandwidth_bound_s, message_s=e.busy_s - data,
               contention_s=(e.last_s - e.first_s) - e.busy_s,
               fill_s=e.first_s + (t - e.last_s), bottleneck_link=(e.src, e.dst))
    return out


@dataclass(frozen=True)
class Verify:
    name: str = "verify"

    def apply(self, u: Unit) -> Unit:
        from ..ir.verify import verify

        verify(u.plan, on_phase=lambda step, done, total: progress.report("verify", step, done, total))
        return u


PASSES: tuple = (Bounds(), Pack(), Lower(), Select(), FiguresPass(), Verify())

Hook = Callable[[str, float, Unit], None]


def run_passes(unit: Unit, passes: tuple = PASSES, hook: Hook | None = None) -> Unit:
    """Apply each pass in order; ``hook(name, seconds, unit)`` runs after each one."""
    for p in passes:
        t0 = time.perf_counter()
        progress.report(p.name)
        unit = p.apply(unit)
        if hook is not None:
            hook(p.name, time.perf_counter() - t0, unit)
    return unit


def resolve(program: Program, name: str | None) -> CollectiveSpec:
    """The collective to compile: ``name``, or the only one. Bad names are bad input."""
    names = [c.name for c in program.collectives]
    listing = ", ".join(names) if names else "none"
    if name is None:
        if len(names) == 1:
            return program.collectives[0]
        raise SourceError(
            Span(Source("<command line>", program.path), 1, 1, 1, 1 + len(program.path)),
            f"the program declares {len(names)} collectives ({listing}); name one with -c NAME",
        )
    for c in program.collectives:
        if c.name == name:
            return c
    text = f"-c {name}"
    import difflib

    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}?" if close else ""
    raise SourceError(
        Span(Source("<command line>", text), 1, 4, 1, 4 + len(name)),
        f"unknown collective {name!r} (collectives: {listing})",
        hint,
    )


def compile_unit(program: Program, name: str | None = None, *, model: CostModel = DEFAULT_MODEL,
                 hook: Hook | None = None) -> Unit:
    """Run the whole pipeline and return its final :class:`Unit` (plan, candidates, bounds)."""
    t0 = time.perf_counter()
    spec = resolve(program, name)
    unit = Unit(program=program, spec=spec, topology=program.topology_of(spec), model=model)
    # lowering and verifying allocate millions of small acyclic objects and free few until the
    # pass ends; the cyclic collector rescanned them all again and again (a second lowering
    # of the 1024-rank ring allgather took 20 s instead of 13 s of CPU with it on)
    enabled = gc.isenabled()
    gc.disable()
    try:
        with progress.collective(spec.name):
            unit = run_passes(unit, PASSES, hook)
    finally:
        if enabled:
            gc.enable()
    figures = replace(unit.plan.figures, compile_s=time.perf_counter() - t0)
    return replace(unit, plan=replace(unit.plan, figures=figures))


def compile_one(program: Program, name: str | None = None) -> Plan:
    """Compile one collective of ``program`` to a verified :class:`Plan` with its figures."""
    return compile_unit(program, name).plan
